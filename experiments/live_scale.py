"""Live at the paper's instance count: the live cluster against the simulator.

The paper serves thousands of model instances from one controller (Figs. 9-10: 4,026
instances on 12 GPUs). This runs a scenario of that shape live -- emulated workers, the
controller and the load generator as processes on this machine, real clocks, real
sockets -- and the same scenario in the simulator, and prints them side by side: SLO
attainment, latency, cold starts, failed requests, rejected actions, and how often the
controller found a worker suspect (no answer to a probe within ``probe_timeout_ms``;
each time the worker's in-flight actions fail and, when it answers again, it is reset:
nothing in flight, only the weights it had loaded kept).

    python experiments/live_scale.py [--instances 4026] [--workers 6] [--gpus 2]
                                     [--rate 1000] [--duration 20] [--repeats 3]
                                     [--hang-s S] [--json F]

``--hang-s S`` makes each worker in turn hang for S seconds once during the run (a
``[faults]`` hang: SIGSTOP and SIGCONT live, the same in the simulator), spread evenly
over it, so every worker is found suspect once and re-admitted.

Instances are copies of the nine ``v100-reference`` profiles, as many of each; the
Poisson workload spreads ``--rate`` evenly over them (at 1,000 r/s each instance sees a
request every four seconds, so most requests find their model cold: the LOAD path and
the weights caches are what this exercises). The live runs are repeated (the machine's
other load moves them); the simulator's run is deterministic and done once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.cluster.cli import argtypes  # noqa: E402
from experiments import common  # noqa: E402

PROFILES = ("mobilenet_v2", "resnet18_v2", "resnet34_v2", "resnet50_v2", "resnet101_v2",
            "resnet152_v2", "inception_v3", "densenet121", "vgg16")


def scenario(instances: int, workers: int, gpus: int, rate: float, duration: float,
             slo_ms: float, hang_s: float = 0.0) -> dict:
    k, extra = divmod(instances, len(PROFILES))
    faults = {"hang": [{"worker": w, "at_s": round(duration * (w + 1) / (workers + 1), 3),
                        "for_s": hang_s} for w in range(workers)]} if hang_s > 0 else {}
    return {"faults": faults,
        "name": f"live-scale-{instances}", "seed": 1, "duration_s": duration,
        "cluster": {"workers": workers, "gpus_per_worker": gpus, "profiles": "v100-reference"},
        "models": [{"name": p, "copies": k + (i < extra)} for i, p in enumerate(PROFILES)
                   if k + (i < extra)],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": rate, "slo_ms": slo_ms}],
    }


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The scenario's shape as flags (``--instances``, ``--workers``, ``--gpus``,
    ``--rate``, ``--slo-ms``), with the paper's figures as defaults."""
    p.add_argument("--instances", type=int, default=4026,
                   help="model instances (default 4,026, the paper's)")
    p.add_argument("--workers", type=int, default=6, help="emulated worker processes (default 6)")
    p.add_argument("--gpus", type=int, default=2, help="GPUs per worker (default 2)")
    p.add_argument("--rate", type=float, default=1000.0,
                   help=f"Poisson r/s over all instances (default 1,000; at most {MAX_RATE:,})")
    p.add_argument("--slo-ms", type=argtypes.slo_ms, default=100.0,
                   help="every request's SLO in ms (default 100; at most a day)")
    p.add_argument("--json", type=common.out_file, help="also write every run's figures here")


MAX_RATE = 1_000_000  # r/s: more would run for hours here, silently


def check_shape_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """``add_shape_args``' rate in range (``--slo-ms`` and ``--json`` are checked as they
    are read: a file or folder in the way was found after every run had ended)."""
    if not 0 < a.rate <= MAX_RATE:
        p.error(f"--rate must be > 0 and at most {MAX_RATE:,} r/s, got {a.rate:g}")


def write_runs(path: Path, a: argparse.Namespace, rows: list[dict]) -> None:
    """The flags and every run's figures, as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    common.write_json(path, {"args": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in vars(a).items()}, "runs": rows})


def row(mode: str, res) -> dict:
    s = res.summary
    lat = s.get("latency_ms", {})
    acts = s.get("actions", {})
    return {
        "mode": mode, "requests": s["submitted"], "attainment": s["slo_attainment"],
        "p50_ms": lat.get("p50", 0.0), "p99_ms": lat.get("p99", 0.0),
        "cold_starts": s.get("cold_starts", 0), "failed": s["failed"],
        "rejected_actions": acts.get("rejected", 0), "loads": acts.get("load", 0),
        "workers_suspected": s.get("workers_suspected", 0) if mode == "live" else None,
        "controller_cpu_s": getattr(res, "controller_cpu_s", None),
        "workers_cpu_s": getattr(res, "workers_cpu_s", None),
        "wall_s": round(res.wall_s, 2),
    }


def show(r: dict) -> str:
    sus = "-" if r["workers_suspected"] is None else f"{r['workers_suspected']:,}"
    cpu = ("" if r["controller_cpu_s"] is None else
           f"  CPU s controller {r['controller_cpu_s']:.1f} workers {r['workers_cpu_s']:.1f}")
    return (f"{r['mode']:<9} {r['requests']:>7,} requests  attainment {r['attainment']:.4f}  "
            f"p50 {r['p50_ms']:6.2f} p99 {r['p99_ms']:6.2f} ms  cold {r['cold_starts']:>6,}  "
            f"failed {r['failed']:>4,}  loads {r['loads']:>6,}  "
            f"rejected actions {r['rejected_actions']:>4,}  "
            f"workers suspected {sus}{cpu}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                epilog="Each live run takes --duration seconds plus start-up "
                                       "(~5 s) and drain.")
    add_shape_args(p)
    p.add_argument("--duration", type=argtypes.positive_float, default=20.0,
                   help="seconds of load per run (> 0, default 20)")
    p.add_argument("--repeats", type=int, default=3, help="live runs (default 3)")
    p.add_argument("--hang-s", type=float, default=0.0,
                   help="each worker in turn hangs this long once (default 0: none)")
    a = p.parse_args(argv)
    check_shape_args(p, a)
    if a.instances < 1 or a.workers < 1 or a.gpus < 1 or a.rate <= 0 or a.duration <= 0 \
            or a.repeats < 1 or not 0 <= a.hang_s < a.duration:
        p.error("--instances, --workers, --gpus, --rate, --duration and --repeats must be "
                "positive, and --hang-s from 0 to below --duration")
    common.check_live(a.workers, a.duration, smaller="fewer --workers, a shorter --duration")
    sc = scenario(a.instances, a.workers, a.gpus, a.rate, a.duration, a.slo_ms, a.hang_s)
    hangs = f", each worker hangs {a.hang_s:g} s once" if a.hang_s else ""
    print(f"live_scale: {a.instances:,} instances, {a.workers} workers x {a.gpus} GPUs, "
          f"Poisson {a.rate:,.0f} r/s, SLO {a.slo_ms:g} ms, {a.duration:g} s per run{hangs}",
          flush=True)
    rows = [row("simulator", common.run(sc))]
    print(show(rows[0]), flush=True)
    for _ in range(a.repeats):
        r = row("live", common.run(sc, live=True))
        rows.append(r)
        print(show(r), flush=True)
    live = [r for r in rows if r["mode"] == "live"]
    att = [r["attainment"] for r in live]
    print(f"live attainment median {statistics.median(att):.4f} (min {min(att):.4f}, max "
          f"{max(att):.4f}) against the simulator's {rows[0]['attainment']:.4f}; workers "
          f"suspected per run: {', '.join(str(r['workers_suspected']) for r in live)}")
    if a.json:
        write_runs(a.json, a, rows)
    return 0


if __name__ == "__main__":
    common.script(main)
