"""Benchmark: requests simulated per wall-clock second on one core.

Default set-up (the scheduler's throughput target): 100 emulated GPUs (100 workers x 1 GPU), 200
ResNet50 v2 instances (2 per GPU), Poisson arrivals at 80 % of the cluster's
best-batch capacity (16 / 11.06 ms = 1,447 r/s per GPU), 100 ms SLO, 10 s virtual.

Prints one line with the rate, and with --profile the top functions by own time.

    python experiments/bench_scheduler.py [--gpus 100] [--load 0.8] [--duration 10] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

from clockwork.cluster.cli import argtypes as t
from clockwork.cluster.sim import Simulation
from clockwork.profiles import load_profile_set
from clockwork.scenario import load_scenario


def scenario(gpus: int, load: float, duration: float, per_gpu: int, seed: int) -> dict:
    prof = load_profile_set("v100-reference").get("resnet50_v2")
    best = max(b / prof.exec_ns[b] * 1e9 for b in prof.batch_sizes)
    rate = load * best * gpus
    return {
        "seed": seed,
        "duration_s": duration,
        "cluster": {"workers": gpus, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet50_v2", "copies": gpus * per_gpu}],
        "workloads": [{"kind": "poisson", "models": "resnet50_v2", "rate_rps": rate,
                       "slo_ms": 100}],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=t.positive_int, default=100,
                    help="GPUs, one per worker (>= 1, default %(default)s)")
    ap.add_argument("--load", type=t.positive_float, default=0.8,
                    help="offered load, a fraction of the best-batch capacity "
                    "(> 0, default %(default)s)")
    ap.add_argument("--duration", type=t.positive_float, default=10.0,
                    help="simulated seconds (> 0, default %(default)s)")
    ap.add_argument("--per-gpu", type=t.positive_int, default=2,
                    help="model instances per GPU (>= 1, default %(default)s)")
    ap.add_argument("--seed", type=t.nonneg_int, default=1,
                    help="arrivals' seed (>= 0, default %(default)s)")
    ap.add_argument("--profile", action="store_true", help="cProfile the run")
    a = ap.parse_args()
    sim = Simulation(load_scenario(data=scenario(a.gpus, a.load, a.duration, a.per_gpu, a.seed)))
    prof = cProfile.Profile() if a.profile else None
    t0 = time.process_time()
    w0 = time.perf_counter()
    if prof:
        prof.enable()
    res = sim.run()
    if prof:
        prof.disable()
    cpu = time.process_time() - t0
    wall = time.perf_counter() - w0
    s = res.summary
    n = s["submitted"]
    print(f"gpus={a.gpus} load={a.load} virtual={a.duration}s requests={n:,} "
          f"actions={s['actions']['infer']:,} infer / {s['actions']['load']:,} load  "
          f"slo_attainment={s['slo_attainment']:.5f} goodput={s['goodput_rps']:,.0f} r/s")
    print(f"simulated requests per wall second: {n / wall:,.0f}  (cpu {n / cpu:,.0f}/s, "
          f"wall {wall:.2f} s, {res.events / wall:,.0f} events/s, "
          f"mean batch {s['succeeded'] / max(1, s['actions']['infer']):.2f}, pid {os.getpid()})")
    if prof:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
