"""Benchmark: what the run logs cost -- no logs, TSV logs, npz logs.

The set-up: ``bench_scheduler.py``'s cluster with 4 instances per GPU -- 100 emulated GPUs,
400 ResNet50 v2 instances, Poisson arrivals at 80 % of the cluster's best-batch capacity
(115,775 r/s), SLO 100 ms -- for 10 s of virtual time: ~1.16 M requests. Each run is a
new process that simulates the scenario and then writes nothing (``none``: the rows are
still collected, the summary needs them), ``requests.tsv``/``actions.tsv`` (``tsv``) or
``requests.npz``/``actions.npz`` (``npz``), as ``clockwork simulate --out DIR
[--log-format npz]`` does. Reported per mode: wall and CPU time of the whole run (simulate
+ summary + write), the write alone, peak RSS of the process (``getrusage``), and the
bytes of the two log files. The modes alternate (none, tsv, npz, none, ...) so that other
load on the machine falls on all of them; the load average is read before each run.

``--baseline DIR`` adds the modes ``none`` and ``tsv`` run on the code of another
checkout (e.g. a ``git worktree`` of the commit before the columnar telemetry, which kept
one Python tuple per row) to the rotation, as ``base-none`` and ``base-tsv``.

    python experiments/bench_logs.py [--repeat 3] [--duration 10] [--modes none,tsv,npz]
                                     [--baseline DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "tsv", "npz")


def scenario(gpus: int, per_gpu: int, load: float, duration: float, seed: int) -> dict:
    from clockwork.profiles import load_profile_set

    prof = load_profile_set("v100-reference").get("resnet50_v2")
    best = max(b / prof.exec_ns[b] * 1e9 for b in prof.batch_sizes)
    return {
        "seed": seed,
        "duration_s": duration,
        "cluster": {"workers": gpus, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet50_v2", "copies": gpus * per_gpu}],
        "workloads": [{"kind": "poisson", "models": "resnet50_v2", "rate_rps": load * best * gpus,
                       "slo_ms": 100}],
    }


def child(a: argparse.Namespace) -> None:
    """One run in this process; prints its figures as one JSON line."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sc = load_scenario(data=scenario(a.gpus, a.per_gpu, a.load, a.duration, a.seed))
    w0, c0 = time.perf_counter(), time.process_time()
    res = Simulation(sc).run()
    w1, c1 = time.perf_counter(), time.process_time()
    size = 0
    if a.child != "none":
        out = Path(a.out)
        res.telemetry.log_format = a.child
        res.write(out)
        size = sum(p.stat().st_size for p in out.iterdir()
                   if p.name.startswith(("requests.", "actions.")))
    w2, c2 = time.perf_counter(), time.process_time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    s = res.summary
    print(json.dumps({
        "mode": a.child, "requests": s["submitted"], "infers": s["actions"]["infer"],
        "wall_s": w2 - w0, "cpu_s": c2 - c0, "write_wall_s": w2 - w1, "write_cpu_s": c2 - c1,
        "sim_wall_s": w1 - w0, "peak_rss_mb": ru.ru_maxrss / 1024, "log_bytes": size,
        "summary": s,
    }))


def run_one(a: argparse.Namespace, mode: str, out: Path) -> dict:
    tree = ROOT
    if mode.startswith("base-"):
        tree, mode = Path(a.baseline).resolve(), mode[5:]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--out", str(out),
           "--gpus", str(a.gpus), "--per-gpu", str(a.per_gpu), "--load", str(a.load),
           "--duration", str(a.duration), "--seed", str(a.seed)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(cmd, check=True, cwd=tree, env=env, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def child_args(argv: list[str]) -> argparse.Namespace:
    """The arguments of a run (``--child MODE ...``, from ``run_one``, which checked their
    values). Plain types: a ``--baseline`` run imports that checkout's ``clockwork``, which
    may not have the argument types ``main`` uses."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=MODES, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--per-gpu", type=int, required=True)
    ap.add_argument("--load", type=float, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    return ap.parse_args(argv)


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        child(child_args(argv))
        return None
    from clockwork.cluster.cli import argtypes as t

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=t.positive_int, default=3,
                    help="runs per mode (>= 1, default 3)")
    ap.add_argument("--modes", type=t.comma_list(t.one_of(*MODES)), default=",".join(MODES),
                    help=f"comma-separated, of {', '.join(MODES)} (default all)")
    ap.add_argument("--gpus", type=t.positive_int, default=100, help="GPUs (>= 1, default 100)")
    ap.add_argument("--per-gpu", type=t.positive_int, default=4,
                    help="model instances per GPU (>= 1, default 4)")
    ap.add_argument("--load", type=t.positive_float, default=0.8,
                    help="offered load, a fraction of the best-batch capacity (> 0, "
                    "default 0.8)")
    ap.add_argument("--duration", type=t.positive_float, default=10.0,
                    help="virtual seconds (> 0, default 10)")
    ap.add_argument("--seed", type=t.nonneg_int, default=1, help="seed (>= 0, default 1)")
    ap.add_argument("--baseline", type=t.in_dir, default=None, metavar="DIR",
                    help="also run none and tsv on the code of this checkout")
    ap.add_argument("--json", type=t.out_file, default=None, metavar="FILE",
                    help="also write the figures here")
    a = ap.parse_args(argv)
    modes = list(a.modes)
    if a.baseline:
        modes += ["base-none", "base-tsv"]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    loads = []
    summaries = set()
    with tempfile.TemporaryDirectory(prefix="bench-logs-") as tmp:
        for r in range(a.repeat):
            for m in modes:
                out = Path(tmp) / f"{m}-{r}"
                load = os.getloadavg()[0]
                loads.append(load)
                res = run_one(a, m, out)
                res["load_avg"] = load
                summaries.add(json.dumps(res.pop("summary"), sort_keys=True))
                runs[m].append(res)
                print(f"run {r + 1}/{a.repeat} {m:>9}: wall {res['wall_s']:6.1f} s, cpu "
                      f"{res['cpu_s']:6.1f} s, write {res['write_wall_s']:5.2f} s, peak RSS "
                      f"{res['peak_rss_mb']:6.0f} MB, logs {res['log_bytes'] / 1e6:6.1f} MB "
                      f"(load {load:.2f})", file=sys.stderr, flush=True)

    def stat(m: str, key: str) -> tuple[float, float]:
        v = [x[key] for x in runs[m]]
        return min(v), statistics.median(v)

    first = runs[modes[0]][0]
    print(f"{first['requests']:,} requests, {first['infers']:,} INFERs; {a.repeat} run(s) per "
          f"mode; load average {min(loads):.2f}-{max(loads):.2f}; summaries identical: "
          f"{len(summaries) == 1}")
    print(f"{'mode':>9} {'wall s (min/med)':>17} {'cpu s (min/med)':>16} {'r/s wall (max)':>15} "
          f"{'write s (min/med)':>18} {'peak RSS MB (min/med)':>22} {'log MB':>8}")
    table = {}
    for m in modes:
        w, c, wr, rss = (stat(m, k) for k in ("wall_s", "cpu_s", "write_wall_s", "peak_rss_mb"))
        size = runs[m][0]["log_bytes"]
        rate = first["requests"] / w[0]
        table[m] = {"wall_s": w, "cpu_s": c, "write_s": wr, "peak_rss_mb": rss,
                    "log_bytes": size, "rps_wall_best": rate}
        print(f"{m:>9} {w[0]:8.1f}/{w[1]:<8.1f} {c[0]:7.1f}/{c[1]:<8.1f} {rate:15,.0f} "
              f"{wr[0]:8.2f}/{wr[1]:<9.2f} {rss[0]:10.0f}/{rss[1]:<11.0f} {size / 1e6:8.1f}")
    result = {
        "requests": first["requests"], "repeat": a.repeat, "modes": table, "runs": runs,
        "summaries_identical": len(summaries) == 1, "load_avg": [min(loads), max(loads)],
        "baseline": a.baseline, "machine": cpu_model(), "cores": os.cpu_count(),
        "python": platform.python_version(),
        "args": {k: getattr(a, k) for k in ("gpus", "per_gpu", "load", "duration", "seed")},
    }
    if a.json:
        out = Path(a.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
