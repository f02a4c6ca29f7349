"""Benchmark: how long the controller takes to answer control calls while clients load it
past what this machine's CPU can serve.

A ``LocalCluster`` (``--workers`` emulated workers, one GPU each, ResNet152 v2 and
MobileNet v2 served) with KServe gRPC on a port of its own and REST. One client process
runs ``--grpc`` ``tritonclient.grpc.aio`` and ``--http`` ``tritonclient.http.aio``
closed-loop clients in one event loop (as a load generator written the simple way does),
each sending ResNet152 v2 a ResNet-size input (602,112 bytes) again as soon as its answer
comes, SLOs 20 ms, 100 ms and none in turn, for ``--duration`` seconds. Meanwhile this
process asks, once a second, on the controller port with the Python client: ``ListWorkers``
(``workers()``), the repository index and ``Stats``; and over REST ``/v2/health/ready`` and
``/metrics``. It prints each control call's median and worst time (ms, the first and last
seconds left out) and the inferences answered.

To measure another version of our code, run it with that version first on ``PYTHONPATH``
(the cluster's processes take their packages from the folder the cluster code was
imported from)::

    (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/experiments/bench_control_calls.py)

    python experiments/bench_control_calls.py [--grpc 100] [--http 100] [--duration 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.cluster.cli import argtypes as t  # noqa: E402

MODEL = "resnet152_v2"
# the load: G gRPC and H REST closed-loop clients in one event loop for D seconds; prints
# a JSON line of outcome counts
_LOAD = r"""
import asyncio, collections, json, sys, time
import numpy as np
import tritonclient.grpc.aio as g
import tritonclient.http.aio as h
from tritonclient.utils import InferenceServerException

grpc_at, http_at, model = sys.argv[1], sys.argv[2], sys.argv[3]
n_grpc, n_http, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
data = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
SLOS = (20.0, 100.0, 0.0)
seen = collections.Counter()


async def client(mod, url, i, end):
    c = mod.InferenceServerClient(url)
    x = mod.InferInput("data", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(data) if mod is g else x.set_data_from_numpy(data, binary_data=True)
    n = i
    try:
        while time.monotonic() < end:
            slo = SLOS[n % 3]
            n += 1
            try:
                await c.infer(model, [x], parameters={"slo_ms": slo} if slo else None)
                seen[mod.__name__.split(".")[1] + " ok"] += 1
            except InferenceServerException as e:
                seen[mod.__name__.split(".")[1] + " " + str(e.status())] += 1
    finally:
        await c.close()


async def main():
    end = time.monotonic() + seconds
    await asyncio.gather(*[client(g, grpc_at, i, end) for i in range(n_grpc)],
                         *[client(h, http_at, i, end) for i in range(n_http)])

asyncio.run(main())
print(json.dumps(dict(seen)))
"""


def _timed(fn) -> float | str:
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- reported in the table
        return f"{type(e).__name__}"
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--grpc", type=t.nonneg_int, default=100,
                   help="gRPC clients (KServe port; default %(default)s)")
    p.add_argument("--http", type=t.nonneg_int, default=100,
                   help="REST clients (default %(default)s)")
    p.add_argument("--duration", type=t.positive_float, default=20.0,
                   help="seconds of load (default %(default)s)")
    p.add_argument("--workers", type=t.positive_int, default=2,
                   help="emulated workers, one GPU each (default %(default)s)")
    args = p.parse_args(argv)

    import clockwork
    from clockwork.cluster.local import LocalCluster

    with LocalCluster(workers=args.workers, gpus=1, models=f"{MODEL}:1,mobilenet_v2:1",
                      http_port=0, kserve_port=0, timeout=60.0) as c:
        grpc_at = c.printed_address("kserve grpc")
        http_at = c.printed_address("http")
        load = subprocess.Popen([sys.executable, "-c", _LOAD, grpc_at, http_at, MODEL,
                                 str(args.grpc), str(args.http), str(args.duration)],
                                stdout=subprocess.PIPE, text=True)
        calls: dict[str, list] = {k: [] for k in ("workers", "index", "stats", "ready",
                                                  "metrics")}
        with clockwork.Client(c.address, timeout=30) as cl:
            start = time.monotonic()
            while load.poll() is None:
                for k, fn in (("workers", cl.workers), ("index", cl.repository_index),
                              ("stats", cl.stats),
                              ("ready", lambda: urllib.request.urlopen(
                                  f"http://{http_at}/v2/health/ready", timeout=30).read()),
                              ("metrics", lambda: urllib.request.urlopen(
                                  f"http://{http_at}/metrics", timeout=30).read())):
                    calls[k].append((time.monotonic() - start, _timed(fn)))
                time.sleep(1.0)
        answered = json.loads(load.communicate()[0].strip().splitlines()[-1])
    print(f"# {args.grpc} gRPC + {args.http} REST clients, ResNet-size inputs, "
          f"{args.duration:g} s; control calls once a second on the controller port "
          "(REST: the http port)")
    print("| call | samples | median ms | worst ms | failed |")
    print("|---|--:|--:|--:|--:|")
    out: dict = {"answered": answered, "calls": {}}
    for k, rows in calls.items():
        # (the first and last seconds left out: the load starting and ending)
        inside = [ms for at, ms in rows if 1.0 <= at <= args.duration - 1.0]
        times = [ms for ms in inside if isinstance(ms, float)]
        failed = len(inside) - len(times)
        med = statistics.median(times) if times else float("nan")
        worst = max(times) if times else float("nan")
        out["calls"][k] = {"median_ms": med, "worst_ms": worst, "failed": failed}
        print(f"| {k} | {len(inside)} | {med:,.0f} | {worst:,.0f} | {failed} |")
    print("inferences:", ", ".join(f"{k} {v:,}" for k, v in sorted(answered.items())))
    return out


if __name__ == "__main__":
    main()
