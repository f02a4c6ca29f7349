"""A controller restarted on running workers, at the paper's instance count: what the
restart costs the requests after it, with the workers' weights taken over (the default)
and with ``--fresh-caches`` (every cache emptied, as before the takeover existed).

The scenario is ``live_scale.py``'s: 4,026 instances of the nine ``v100-reference``
profiles, 6 emulated workers x 2 GPUs, Poisson ``--rate`` r/s over all instances, SLO
100 ms. Each run starts a fresh cluster (``LocalCluster``: workers and controller as
processes on this machine), replays ``--warm`` seconds of load so the caches fill, stops
the controller (SIGTERM), starts a new one on the same port and workers, and replays
``--after`` seconds of the same load (another seed). Printed per run: the restart's wall
time (SIGTERM to the new controller listening, which includes connecting to every
worker), the copies it took over (``weights_adopted``), and over the load after it: SLO
attainment, cold-start requests (no copy of their model loaded when they arrived),
LOADs the new controller sent, and p99 latency. The two modes alternate
(``--repeats`` rounds), as the machine's other load moves single runs.

    python experiments/controller_restart.py [--instances 4026] [--workers 6] [--gpus 2]
        [--rate 1000] [--warm 15] [--after 15] [--repeats 2] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import common, live_scale  # noqa: E402

MODES = ("adopt", "fresh")


def one(a: argparse.Namespace, mode: str) -> dict:
    import clockwork
    from clockwork.cluster.replay import replay
    from clockwork.cluster.serve import LocalCluster, cluster_from_scenario

    def load(duration: float, seed: int):
        data = live_scale.scenario(a.instances, a.workers, a.gpus, a.rate, duration, a.slo_ms)
        return common.scenario({**data, "seed": seed})

    warm, after = load(a.warm, 1), load(a.after, 2)
    kw, _ = cluster_from_scenario(warm)
    with LocalCluster(**kw, echo=False, http_port=-1, timeout=60.0) as cluster:
        before = asyncio.run(replay(warm, cluster.address, 20000, False)).summary
        t0 = time.perf_counter()
        cluster.controller.stop(timeout=60.0)
        cluster.restart_controller(["--fresh-caches"] if mode == "fresh" else [])
        restart_s = time.perf_counter() - t0
        res = asyncio.run(replay(after, cluster.address, 20000, False))
        with clockwork.Client(cluster.address, timeout=30) as cl:
            stats = cl.stats()
    s = res.summary
    return {"mode": mode, "restart_s": round(restart_s, 2),
            "adopted": stats.get("weights_adopted", 0),
            "warm_cold_starts": before["cold_starts"],
            "requests": s["submitted"], "attainment": s["slo_attainment"],
            "cold_starts": s["cold_starts"], "loads": stats.get("load_ok", 0),
            "p99_ms": s["latency_ms"]["p99"], "answered_once": res.answered_once}


def show(r: dict) -> str:
    return (f"  {r['mode']:<5}  restart {r['restart_s']:5.2f} s  adopted {r['adopted']:>5,}  "
            f"after: {r['requests']:>6,} requests, attainment {r['attainment']:.4f}, "
            f"cold starts {r['cold_starts']:>5,}, LOADs {r['loads']:>5,}, "
            f"p99 {r['p99_ms']:.1f} ms  (warm-up cold starts {r['warm_cold_starts']:,})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Each run takes --warm + --after seconds plus two "
                                       "start-ups (~5-10 s each) and drains.")
    live_scale.add_shape_args(p)
    p.add_argument("--warm", type=float, default=15.0,
                   help="seconds of load before the restart (default 15)")
    p.add_argument("--after", type=float, default=15.0,
                   help="seconds of load after it (default 15)")
    p.add_argument("--repeats", type=int, default=2,
                   help="rounds of both modes, alternating (default 2)")
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    a = p.parse_args(argv)
    if min(a.instances, a.workers, a.gpus, a.repeats) < 1 or min(a.rate, a.warm, a.after) <= 0:
        p.error("--instances, --workers, --gpus, --rate, --warm, --after and --repeats must "
                "be positive")
    common.check_live(a.workers, a.warm + a.after)
    print(f"controller_restart: {a.instances:,} instances, {a.workers} workers x {a.gpus} "
          f"GPUs, Poisson {a.rate:,.0f} r/s, SLO {a.slo_ms:g} ms; {a.warm:g} s of load, a "
          f"controller restart, {a.after:g} s of load", flush=True)
    rows = []
    for _ in range(a.repeats):
        for mode in MODES:
            r = one(a, mode)
            rows.append(r)
            print(show(r), flush=True)
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        print(f"{mode}: median cold starts {statistics.median(r['cold_starts'] for r in rs):,.0f}, "
              f"LOADs {statistics.median(r['loads'] for r in rs):,.0f}, attainment "
              f"{statistics.median(r['attainment'] for r in rs):.4f} after the restart")
    if a.json:
        live_scale.write_runs(a.json, a, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
