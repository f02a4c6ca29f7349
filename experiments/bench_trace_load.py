"""Benchmark: generate a full-size synthetic Azure Functions day and load it back.

Prints generation and write time, file size, load time and peak memory of the load (in a
fresh process, so its ``ru_maxrss`` is the load's own; tracemalloc's peak of numpy and
Python allocations beside it), and how the day compares with the paper's figures.
The design goal: a real-size day (>= 40,000 rows x 1440 minutes) loads in <= 10 s and
<= 2 GiB on a 2-core machine.

    .venv/bin/python experiments/bench_trace_load.py [--functions 40000] [--seed 1]
    .venv/bin/python experiments/bench_trace_load.py --file traces/azure/...d01.csv
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from clockwork.cluster.cli import argtypes as t

_CHILD = r"""
import json, resource, sys, time, tracemalloc
from clockwork.workloads.azure import AzureTrace

def peak_kb():
    # VmHWM is this process's own peak RSS (ru_maxrss can carry the parent's over fork)
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base = peak_kb()
t0 = time.perf_counter()
tr = AzureTrace.load(sys.argv[1])
wall = time.perf_counter() - t0
hwm = peak_kb()
rows, minutes, invocations = tr.n_functions, tr.n_minutes, int(tr.totals().sum())
del tr
tracemalloc.start()
t0 = time.perf_counter()
AzureTrace.load(sys.argv[1])
wall2 = time.perf_counter() - t0
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"rows": rows, "minutes": minutes, "invocations": invocations,
                  "load_s": wall, "load2_s": wall2, "tracemalloc_peak": peak,
                  "maxrss_kb": hwm, "base_maxrss_kb": base}))
"""


def load_in_child(path: Path) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                         text=True, env=env)
    if out.returncode:  # (its last line says why: a file that is no trace, say)
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise SystemExit(f"bench_trace_load: loading {path} failed: {lines[-1]}")
    return json.loads(out.stdout)


def describe(path: Path) -> None:
    from clockwork.workloads.azure import AzureTrace
    from clockwork.workloads.synth import INVOCATION_SHARE, TRIGGER_SHARE

    tr = AzureTrace.load(path)
    tot = tr.totals()
    print(f"  daily counts: min {int(tot.min()):,}  median {int(np.median(tot)):,}  "
          f"max {int(tot.max()):,}  ({np.log10(tot.max() / max(tot.min(), 1)):.1f} orders)")
    print(f"  share invoked <= 1/hour {np.mean(tot <= 24):.1%} (paper, per app: 45 %), "
          f"<= 1/minute {np.mean(tot <= 1440):.1%} (paper: 81 %)")
    total = tot.sum()
    print(f"  {'trigger':<14}{'functions':>10}{'paper':>8}{'invocations':>13}{'paper':>8}")
    for trig, (nf, ni) in tr.trigger_summary().items():
        print(f"  {trig:<14}{nf / len(tr):>10.1%}{TRIGGER_SHARE.get(trig, 0):>8.0%}"
              f"{ni / total:>13.1%}{INVOCATION_SHARE.get(trig, 0):>8.0%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=t.positive_int, default=40_000,
                    help="functions (rows) of the synthetic day (>= 1, default 40,000)")
    ap.add_argument("--seed", type=t.nonneg_int, default=1,
                    help="the synthetic day's seed (>= 0, default 1)")
    ap.add_argument("--file", type=t.readable_file,
                    help="benchmark this day file instead of a synthetic one")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.file:
            path = Path(args.file)
        else:
            from clockwork.workloads.synth import generate

            t0 = time.perf_counter()
            (day,) = generate(args.functions, 1, args.seed)
            gen = time.perf_counter() - t0
            t0 = time.perf_counter()
            path = day.save(Path(tmp) / "invocations_per_function_md.anon.d01.csv")
            write = time.perf_counter() - t0
            del day
            print(f"generate {args.functions:,} functions x 1440 minutes: {gen:.2f} s; "
                  f"write CSV: {write:.2f} s")
        print(f"file: {path.name}, {path.stat().st_size / 2**20:.1f} MiB")
        r = load_in_child(path)
        print(f"load: {r['rows']:,} rows x {r['minutes']} minutes, {r['invocations']:,} "
              f"invocations in {r['load_s']:.2f} s (again, under tracemalloc: {r['load2_s']:.2f} s)")
        print(f"peak memory of the loading process: {r['maxrss_kb'] / 2**10:.0f} MiB RSS "
              f"(interpreter + imports before loading: {r['base_maxrss_kb'] / 2**10:.0f} MiB); "
              f"tracemalloc peak {r['tracemalloc_peak'] / 2**20:.0f} MiB")
        describe(path)
    return 0


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
