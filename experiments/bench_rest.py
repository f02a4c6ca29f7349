"""Benchmark: throughput and latency of the controller's KServe v2 REST server.

A ``LocalCluster`` (one emulated worker, ``--gpus`` GPUs, a tiny model whose emulated
execution takes ``--exec-us`` µs, so that the REST front end and not the GPUs is the
bottleneck) serves ``--concurrency`` closed-loop clients: each sends a batch-1 inference
with ``tritonclient.http.aio`` (Triton's REST client, on aiohttp), waits for its answer
and sends the next one at once. The clients are spread over ``--procs`` processes. After
``--warmup`` seconds, for ``--duration`` seconds, it counts the answers and their
latencies and reads the controller's CPU time from /proc.

It prints requests/s, latency p50/p99 (ms, client-measured, from send to answer), the
controller's CPU time per request (µs: less noisy than wall figures on a shared machine)
and the number of failed requests, by error (must be 0).

To compare two versions of the code, run the same command with the other version first on
``PYTHONPATH`` (the cluster's processes take their packages from the folder the cluster
code was imported from)::

    python experiments/bench_rest.py --concurrency 8 --duration 10
    (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/experiments/bench_rest.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from clockwork.cluster.cli import argtypes as t

TICK = os.sysconf("SC_CLK_TCK")
MODEL = "tiny"


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid``, seconds (/proc/PID/stat fields 14, 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def write_profiles(d: Path, floats: int, exec_us: float) -> None:
    """A profile set with one model: ``floats`` float32 in, as many out, ``exec_us`` µs
    per batch of 1 (a little more for larger batches)."""
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    ns = int(exec_us * 1000)
    (d / f"{MODEL}.json").write_text(json.dumps({
        "model": MODEL, "device": "test", "weights_bytes": 1 << 20, "load_ns": 2_000_000,
        "exec_ns": {str(b): ns + 10_000 * (b - 1) for b in (1, 2, 4, 8, 16)},
        "inputs": [{"name": "x", "shape": [floats], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [floats], "dtype": "float32"}]}))


def client_proc(url: str, n: int, floats: int, start: float, warm_end: float, end: float,
                out) -> None:
    """``n`` closed-loop clients until ``end`` (time.time()); sends back (latencies in ms
    of the answers that arrived inside [warm_end, end), failures). Ctrl-C is the parent's
    to handle: it ends the benchmark, and with it this process (a daemon)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import tritonclient.http.aio as thttp

    async def main():
        cl = thttp.InferenceServerClient(url, conn_limit=n)
        x = thttp.InferInput("x", [1, floats], "FP32")
        x.set_data_from_numpy(np.ones((1, floats), np.float32), binary_data=True)
        out_y = [thttp.InferRequestedOutput("y", binary_data=True)]
        lat: list[float] = []
        fails: dict[str, int] = {}

        async def one_client():
            while (t0 := time.time()) < end:
                why = ""
                try:
                    r = await cl.infer(MODEL, [x], outputs=out_y)
                    if r.as_numpy("y") is None:
                        why = "no output"
                except Exception as e:  # noqa: BLE001 - counted, by kind
                    why = f"{type(e).__name__}: {str(e)[:80]}"
                t1 = time.time()
                if warm_end <= t1 < end:
                    if not why:
                        lat.append((t1 - t0) * 1e3)
                    else:
                        fails[why] = fails.get(why, 0) + 1

        await asyncio.sleep(max(0.0, start - time.time()))
        await asyncio.gather(*(one_client() for _ in range(n)))
        await cl.close()
        return lat, fails

    got = asyncio.run(main())
    try:
        out.send(got)
    except BrokenPipeError:  # (the parent is gone: stopped)
        return
    out.close()


def run(args) -> dict:
    from clockwork.cluster.local import LocalCluster

    with tempfile.TemporaryDirectory() as tmp:
        write_profiles(Path(tmp), args.floats, args.exec_us)
        cluster = LocalCluster(workers=1, gpus=args.gpus, profiles=tmp,
                               models=f"{MODEL}:{args.gpus}", http_port=0, timeout=60.0)
        with cluster:
            url = cluster.printed_address("http")
            pid = cluster.controller.proc.pid
            ctx = mp.get_context("spawn")
            now = time.time()
            start = now + 3.0  # the client processes import tritonclient meanwhile
            warm_end = start + args.warmup
            end = warm_end + args.duration
            per = [args.concurrency // args.procs + (i < args.concurrency % args.procs)
                   for i in range(args.procs)]
            procs, pipes = [], []
            for n in per:
                if not n:
                    continue
                rd, wr = ctx.Pipe(duplex=False)
                p = ctx.Process(target=client_proc, args=(url, n, args.floats, start,
                                                          warm_end, end, wr), daemon=True)
                p.start()
                procs.append(p)
                pipes.append(rd)
            time.sleep(max(0.0, warm_end - time.time()))
            c0 = cpu_s(pid)
            time.sleep(max(0.0, end - time.time()))
            c1 = cpu_s(pid)
            lat: list[float] = []
            why: dict[str, int] = {}
            for rd in pipes:
                got, f = rd.recv()
                lat += got
                for k, v in f.items():
                    why[k] = why.get(k, 0) + v
            for p in procs:
                p.join(30)
    a = np.array(lat) if lat else np.array([float("nan")])
    n = len(lat)
    return {"concurrency": args.concurrency, "duration_s": args.duration,
            "requests": n, "rps": n / args.duration,
            "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "ctl_cpu_us_per_req": (c1 - c0) / max(n, 1) * 1e6,
            "failed": sum(why.values()), "failures": why}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints one line: rps, p50/p99 latency, controller CPU µs per request, "
               "failures. Compare versions by running it alternately (see the module "
               "docstring).")
    ap.add_argument("--concurrency", type=t.positive_int, default=8,
                    help="closed-loop clients (outstanding requests at any time; >= 1)")
    ap.add_argument("--duration", type=t.positive_float, default=10.0,
                    help="seconds measured, after the warm-up (> 0)")
    ap.add_argument("--warmup", type=t.nonneg_float, default=2.0,
                    help="seconds of load before measuring (>= 0)")
    ap.add_argument("--procs", type=t.positive_int, default=1,
                    help="client processes the clients are spread over (>= 1)")
    ap.add_argument("--gpus", type=t.positive_int, default=2,
                    help="emulated GPUs (one copy on each; >= 1)")
    ap.add_argument("--floats", type=t.positive_int, default=16,
                    help="float32 elements of the input and of the output (>= 1)")
    ap.add_argument("--exec-us", type=t.positive_float, default=100.0,
                    help="emulated execution time of a batch of 1, µs (>= 0.001)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    if int(args.exec_us * 1000) < 1:  # the profile holds whole nanoseconds, at least 1
        ap.error(f"argument --exec-us: must be at least 0.001 (1 ns), got {args.exec_us:g}")
    import controller

    r = run(args)
    r["code"] = str(Path(controller.__file__).parent.parent)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"bench_rest ({r['code']}): concurrency {r['concurrency']}, "
              f"{r['duration_s']:g} s: {r['rps']:,.0f} requests/s, p50 {r['p50_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms, controller {r['ctl_cpu_us_per_req']:.0f} µs "
              f"CPU/request, {r['failed']} failed" + (f" {r['failures']}" if r["failed"] else ""))
    return 0 if r["failed"] == 0 and r["requests"] else 1


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
