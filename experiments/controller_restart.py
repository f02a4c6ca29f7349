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

``--simulate``: the same in the simulator instead, once per mode (runs repeat exactly):
one run of ``--warm`` + ``--after`` seconds of load whose ``[faults]`` restart the
controller at ``--warm`` s, the new one starting ``--down`` s later. The figures "after"
are over the requests that arrive from then on and the LOADs sent from the restart on.

    python experiments/controller_restart.py [--instances 4026] [--workers 6] [--gpus 2]
        [--rate 1000] [--warm 15] [--after 15] [--repeats 2] [--json F]
        [--simulate [--down 1.0]]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import common, live_scale  # noqa: E402

MODES = ("adopt", "fresh")


def one(a: argparse.Namespace, mode: str) -> dict:
    import clockwork
    from clockwork.cluster.local import LocalCluster
    from clockwork.cluster.replay import replay
    from clockwork.cluster.serve import cluster_from_scenario

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


def one_sim(a: argparse.Namespace, mode: str) -> dict:
    from clockwork.cluster.sim import simulate
    from clockwork.time import sec

    data = live_scale.scenario(a.instances, a.workers, a.gpus, a.rate, a.warm + a.after,
                               a.slo_ms)
    data["faults"] = {"controller_restart": [{"at_s": a.warm, "down_s": a.down,
                                              "fresh_caches": mode == "fresh"}]}
    res = simulate(common.scenario(data))
    t0, t1 = sec(a.warm), sec(a.warm + a.down)
    rows = res.telemetry.requests  # (id, model, arrival, deadline, latency, status, met, cold, ..)
    after = [r for r in rows if r[2] >= t1]
    lat = sorted(r[4] for r in after if r[5] == 0)
    return {"mode": mode, "restart_s": a.down, "adopted": res.summary["weights_adopted"],
            "warm_cold_starts": sum(1 for r in rows if r[2] < t0 and r[7]),
            "requests": len(after),  # (none after the restart: nothing missed)
            "attainment": sum(r[6] for r in after) / len(after) if after else 1.0,
            "cold_starts": sum(1 for r in after if r[7]),
            "loads": sum(1 for x in res.telemetry.actions if x[1] == "LOAD" and x[7] >= t0),
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1e6 if lat else 0.0,
            "answered_once": True}  # (the simulator checks it)


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
    p.add_argument("--simulate", action="store_true",
                   help="run it in the simulator ([faults] controller_restart), once per mode")
    p.add_argument("--down", type=float, default=None,
                   help="--simulate: seconds until the new controller starts (default 1.0)")
    a = p.parse_args(argv)
    live_scale.check_shape_args(p, a)
    if min(a.instances, a.workers, a.gpus, a.repeats) < 1 or min(a.rate, a.warm, a.after) <= 0 \
            or not math.isfinite(a.warm + a.after):
        p.error("--instances, --workers, --gpus, --rate, --warm, --after and --repeats must "
                "be positive (--warm and --after finite)")
    if a.down is not None and not a.simulate:
        p.error("--down is for --simulate (a live restart starts the new controller at "
                "once; its start-up is the outage)")
    a.down = 1.0 if a.down is None else a.down
    if a.simulate and not 0 <= a.down < a.after:
        p.error("--down must be at least 0 and below --after")
    if a.simulate:
        a.repeats = 1  # (the same run again would give the same figures)
    else:
        common.check_live(a.workers, a.warm + a.after,
                          smaller="fewer --workers, shorter --warm and --after")
    print(f"controller_restart: {a.instances:,} instances, {a.workers} workers x {a.gpus} "
          f"GPUs, Poisson {a.rate:,.0f} r/s, SLO {a.slo_ms:g} ms; {a.warm:g} s of load, a "
          f"controller restart, {a.after:g} s of load", flush=True)
    rows = []
    for _ in range(a.repeats):
        for mode in MODES:
            r = one_sim(a, mode) if a.simulate else one(a, mode)
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
    common.script(main)
