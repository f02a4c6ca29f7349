"""Benchmark: what large REST bodies with JSON tensors do to the other clients' latency.

A cluster of one emulated worker (ResNet50 v2's reference profile) serves two clients at
once: one calls ``ModelInfer`` over gRPC (``tritonclient.grpc``, one ResNet-size image,
binary, one call after another) and measures each call; the other posts REST inference
bodies whose tensor is a JSON list (``--rows`` ResNet-size images, 46 MB of JSON for 16),
one after another. Reading such a body holds Python's lock for as long as it takes; the
controller decodes it in a decoding process (``--limit rest_json_processes=N``, default
2) or, with 0, on a worker thread of its own. Each setting gets a fresh cluster; they run
interleaved, ``--repeat`` times each. Printed per run: the gRPC calls' p50 / p99 / max
latency alone and while the JSON bodies arrive, and the JSON requests answered.

    python experiments/bench_json_stall.py [--processes 0,2] [--rows 16] [--seconds 8]
"""

from __future__ import annotations

import argparse
import http.client
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "resnet50_v2"
SHAPE = (3, 224, 224)


def _items(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: integers >= 0")
    return out


def _positive(kind):
    def parse(text: str):
        v = kind(text)
        if not (v > 0 and math.isfinite(v)):  # (inf: a run that never ended)
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number > 0")
        return v
    return parse


def json_body(rows: int) -> bytes:
    x = np.random.default_rng(1).random((rows, *SHAPE), dtype=np.float32)
    return orjson.dumps({"inputs": [{"name": "data", "datatype": "FP32",
                                     "shape": list(x.shape), "data": x.ravel().tolist()}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
                         "parameters": {"slo_ms": 10_000}})


def grpc_calls(address: str, seconds: float) -> np.ndarray:
    """Latencies (ms) of one gRPC client calling one after another for ``seconds``."""
    import tritonclient.grpc as tc

    c = tc.InferenceServerClient(address)
    x = tc.InferInput("data", [1, *SHAPE], "FP32")
    x.set_data_from_numpy(np.zeros((1, *SHAPE), np.float32))
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        c.infer(MODEL, [x], parameters={"slo_ms": 100})
        lat.append(1e3 * (time.perf_counter() - t0))
    c.close()
    return np.array(lat)


def poster(http_address: str, body: bytes, stop: threading.Event, got: list,
           first: threading.Event) -> None:
    """Post ``body`` one request after another until ``stop``: each status in ``got``
    (``first`` set at the first)."""
    host, port = http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    while not stop.is_set():
        conn.request("POST", f"/v2/models/{MODEL}/infer", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        got.append(r.status)
        first.set()
    conn.close()


def one_run(processes: int, body: bytes, seconds: float) -> dict:
    from clockwork.cluster.local import LocalCluster

    cluster = LocalCluster(workers=1, gpus=1, models=MODEL, http_port=0, timeout=60.0,
                           controller_args=["--limit", f"rest_json_processes={processes}"])
    cluster.start()
    try:
        http_address = cluster.printed_address("http")
        grpc_calls(cluster.address, 1.0)  # warm-up
        alone = grpc_calls(cluster.address, seconds)
        stop, first, got = threading.Event(), threading.Event(), []
        t = threading.Thread(target=poster, args=(http_address, body, stop, got, first),
                             daemon=True)
        t.start()
        try:
            if not first.wait(120):  # the first body answered: the decoders are up
                raise RuntimeError("no JSON body was answered in 120 s")
            during = grpc_calls(cluster.address, seconds)
        finally:
            stop.set()
            t.join()
    finally:
        cluster.stop()
    return {"processes": processes, "alone": alone, "during": during, "json": got}


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--processes", type=_items, default=[0, 2],
                    help="rest_json_processes settings to compare (default 0,2)")
    ap.add_argument("--rows", type=_positive(int), default=16,
                    help="ResNet-size images per JSON body (default 16)")
    ap.add_argument("--seconds", type=_positive(float), default=8.0,
                    help="gRPC calls measured alone and with the JSON bodies (default 8)")
    ap.add_argument("--repeat", type=_positive(int), default=2,
                    help="runs per setting, interleaved (default 2)")
    args = ap.parse_args(argv)
    body = json_body(args.rows)
    print(f"JSON body: {args.rows} image(s), {len(body) / 1e6:.1f} MB", flush=True)
    runs = []
    for rep in range(args.repeat):
        order = args.processes if rep % 2 == 0 else args.processes[::-1]
        for p in order:
            r = one_run(p, body, args.seconds)
            runs.append(r)
            a, d = r["alone"], r["during"]
            ok = sum(s == 200 for s in r["json"])
            print(f"rest_json_processes={p}: gRPC alone p50/p99/max "
                  f"{pct(a, 50):.1f}/{pct(a, 99):.1f}/{a.max():.1f} ms ({len(a)} calls); "
                  f"with JSON bodies {pct(d, 50):.1f}/{pct(d, 99):.1f}/{d.max():.1f} ms "
                  f"({len(d)} calls); JSON requests answered {len(r['json'])} ({ok} 200)",
                  flush=True)
    print("medians over runs:")
    for p in args.processes:
        mine = [r for r in runs if r["processes"] == p]
        p99 = statistics.median(pct(r["during"], 99) for r in mine)
        mx = statistics.median(float(r["during"].max()) for r in mine)
        alone = statistics.median(pct(r["alone"], 99) for r in mine)
        print(f"  rest_json_processes={p}: gRPC p99 alone {alone:.1f} ms, with JSON bodies "
              f"{p99:.1f} ms (max {mx:.1f} ms)")
    return 0


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
