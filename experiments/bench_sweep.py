"""Benchmark: one 8-point ``clockwork sweep`` with ``--jobs 1`` and with ``--jobs 2``.

The sweep: the shipped Azure sample (its first six trace minutes, each compressed into
10 s, load factor 5: ~1,500 r/s onto 550 model instances, with cold starts), 1 or 2 GPUs
x SLO 50 or 100 ms x seeds 1 and 2 -- eight simulations of ~90,000 requests (2-4 s of
wall time) each. Each run is the
command itself (``python -m clockwork.cluster.cli sweep ... --quiet``, a new process)
into an empty output folder, so every point is simulated; the two settings alternate
(1, 2, 1, 2, ...) so that other load on the machine falls on both. Prints the wall times
(min and median per setting), the ratio wall(jobs 2) / wall(jobs 1) (target <= 0.6 on two
cores), the load average before each run, and checks that both settings wrote the same
results.

    python experiments/bench_sweep.py [--repeat 2] [--jobs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clockwork.cluster.cli import argtypes as t

ROOT = Path(__file__).resolve().parent.parent

SWEEP = """
name = "bench8"
scenarios = ["azure_sample"]
seeds = [1, 2]
overrides = ["duration_s=60", "workloads.0.minutes=6", "workloads.0.interval_s=10",
             "workloads.0.load_factor=5"]

[grid]
"cluster.workers" = [1, 2]
"workloads.0.slo_ms" = [50, 100]
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def run(sweep: Path, out: Path, jobs: int) -> float:
    cmd = [sys.executable, "-m", "clockwork.cluster.cli", "sweep", str(sweep), "--jobs",
           str(jobs), "--out", str(out), "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=t.positive_int, default=2,
                    help="runs per setting (>= 1, default 2)")
    ap.add_argument("--jobs", type=t.positive_int, default=2,
                    help="the parallel setting, compared with --jobs 1 (>= 2, default 2)")
    ap.add_argument("--json", type=t.out_file, default=None, metavar="FILE",
                    help="also write the figures here")
    a = ap.parse_args(argv)
    if a.jobs < 2:  # (1 against 1: one list, and a meaningless ratio)
        ap.error("--jobs: the parallel setting must be at least 2")
    walls: dict[int, list[float]] = {1: [], a.jobs: []}
    loads: list[float] = []
    tables: dict[int, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        sweep = Path(tmp) / "bench8.toml"
        sweep.write_text(SWEEP)
        for r in range(a.repeat):
            for jobs in (1, a.jobs):
                out = Path(tmp) / f"out-{jobs}-{r}"
                loads.append(os.getloadavg()[0])
                w = run(sweep, out, jobs)
                walls[jobs].append(w)
                table = (out / "results.json").read_bytes()
                if tables.setdefault(jobs, table) != table or tables[1] != table:
                    raise SystemExit("the results differ between runs")
                print(f"run {r + 1}: --jobs {jobs}: {w:6.2f} s  (load average before "
                      f"{loads[-1]:.2f})", flush=True)
    s1, s2 = walls[1], walls[a.jobs]
    res = {
        "points": 8,
        "repeat": a.repeat,
        "jobs": a.jobs,
        "wall_jobs1_s": [round(x, 2) for x in s1],
        f"wall_jobs{a.jobs}_s": [round(x, 2) for x in s2],
        "min_ratio": round(min(s2) / min(s1), 3),
        "median_ratio": round(statistics.median(s2) / statistics.median(s1), 3),
        "load_average_before": [round(x, 2) for x in loads],
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()} {cpu_model()}".strip(),
        "python": platform.python_version(),
    }
    print(f"--jobs 1: min {min(s1):.2f} s, median {statistics.median(s1):.2f} s; "
          f"--jobs {a.jobs}: min {min(s2):.2f} s, median {statistics.median(s2):.2f} s")
    print(f"ratio wall(jobs {a.jobs}) / wall(jobs 1): min {res['min_ratio']:.3f}, median "
          f"{res['median_ratio']:.3f} (target <= 0.6); load average before the runs "
          f"{min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} CPUs ({res['machine']})")
    if a.json:
        out = Path(a.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
