"""Benchmark: what reading the whole model repository costs the other clients, with many
instances served.

A cluster of one emulated worker serves ``--models`` models of ``--copies`` copies each
(20 x 1,024: 20,481 instances with the one it starts with) of a small profile. For each
read below, one client thread sends inferences of the small model one after another
(SLO 5 s) while another makes the read once; printed per read: how long the read took
and the worst and median latency of the inferences meanwhile (the controller's event
loop held by the read shows as the worst). Both clients are threads of this process: the
read's own decoding here holds Python's lock too, so a part of the worst is the client's.

    python experiments/bench_repository_reads.py [--models 20] [--copies 1024] [--repeat 1]

Reads: the controller's ``list_models`` and ``repository_index`` (``clockwork.Client``),
Triton's repository index over gRPC and REST, ``GET /metrics``, Triton's statistics of
every model over gRPC and REST.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20


def _profiles(d: Path) -> Path:
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    (d / "small.json").write_text(json.dumps({
        "model": "small", "device": "test", "weights_bytes": MiB, "load_ns": 2_000_000,
        "exec_ns": {str(b): 800_000 + 50_000 * b for b in (1, 2, 4, 8, 16)},
        "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [4], "dtype": "float32"}]}))
    return d


def _pinger(address: str, stop: threading.Event, out: list[float]) -> None:
    import clockwork

    with clockwork.Client(address, timeout=30) as c:
        while not stop.is_set():
            t = time.monotonic()
            try:
                c.infer("small", slo_ms=5000)
            except clockwork.errors.ClockworkError:
                pass
            out.append((time.monotonic() - t) * 1e3)
            time.sleep(0.002)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from clockwork.cluster.cli import argtypes as t

    ap.add_argument("--models", type=t.positive_int, default=20,
                    help="models loaded (>= 1, default 20)")
    ap.add_argument("--copies", type=t.positive_int, default=1024,
                    help="copies each (>= 1, default 1,024)")
    ap.add_argument("--repeat", type=t.positive_int, default=1,
                    help="rounds of every read (>= 1, default 1)")
    args = ap.parse_args(argv)

    import tritonclient.http as th

    import clockwork
    from clockwork.cluster.local import LocalCluster

    results: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cw-bench-repo-") as tmp, LocalCluster(
            workers=1, gpus=1, profiles=str(_profiles(Path(tmp))), models="small",
            http_port=0, timeout=60) as cl, clockwork.Client(cl.address, timeout=120) as c:
        for g in range(args.models):
            c.load_model(f"g{g}", copies=args.copies, profile="small")
        http = cl.printed_address("http")
        rest = th.InferenceServerClient(http, network_timeout=120)
        reads = {
            "list_models": c.list_models,
            "repository_index": c.repository_index,
            "REST index": rest.get_model_repository_index,
            "GET /metrics": lambda: urllib.request.urlopen(f"http://{http}/metrics",
                                                           timeout=120).read(),
            "REST statistics (all)": rest.get_inference_statistics,
        }
        if "controller.kserve" not in sys.modules:  # (tritonclient.grpc's protos clash
            # with the controller's KServe ones in one process: only where those are not)
            import tritonclient.grpc as tg

            grpc_client = tg.InferenceServerClient(cl.address)
            reads["gRPC index"] = grpc_client.get_model_repository_index
            reads["gRPC statistics (all)"] = grpc_client.get_inference_statistics
        print(f"{len(c.list_models()):,} instances served", flush=True)
        print(f"{'read':<24} {'call ms':>8} {'others worst ms':>16} {'others p50 ms':>14}")
        for _ in range(args.repeat):
            for name, read in reads.items():
                stop, lat = threading.Event(), []
                # (a daemon, stopped whatever happens: interrupted, it pinged a stopped
                # controller for ever and the process waited for it)
                t = threading.Thread(target=_pinger, args=(cl.address, stop, lat), daemon=True)
                t.start()
                try:
                    time.sleep(0.3)
                    t0 = time.monotonic()
                    read()
                    took = (time.monotonic() - t0) * 1e3
                    time.sleep(0.3)
                finally:
                    stop.set()
                    t.join()
                row = (took, max(lat), statistics.median(lat))
                results.setdefault(name, []).append(row)
                print(f"{name:<24} {row[0]:8.0f} {row[1]:16.0f} {row[2]:14.1f}", flush=True)
    return results


if __name__ == "__main__":
    from experiments.common import script

    script(main)
