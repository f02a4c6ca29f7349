"""Benchmark: simulator cost per request across cluster shapes (GPUs x copies per GPU x
models), each cell a whole ``clockwork simulate`` process with its logs written.

The grid: 10 / 100 / 400 GPUs (one per worker) x 1 / 4 / 16 model copies per GPU x
1 / 1,000 models. A copy is a model instance of the scenario (``[[models]] copies``):
to the scheduler each is a model of its own, with its own queue, loaded on demand.

* 1 model: the GPUs x copies instances are all copies of ResNet50 v2 (the set-up of
  ``bench_scheduler.py --per-gpu``).
* 1,000 models: as many instances as that, but at least 1,000, spread evenly over six
  profiles (MobileNet v2, ResNet18/34/50 v2, DenseNet121, Inception v3), so that the
  scheduler juggles 1,000 (or more) queues of different sizes and speeds.
* hot: a single instance of ResNet50 v2 takes all the load; the scheduler copies it onto
  (nearly) every GPU, so each request has one model with as many copies as GPUs. Run
  with 1 copy per GPU only (its copies per GPU are 1 by construction).

One Poisson workload spreads its requests evenly over every instance, 100 ms SLO, at 80 %
of what the shape can carry: the rate X at which the GPU time needed per second, with
each instance running the largest batch its own arrivals fill in its SLO window
(100 ms - 5 ms buffer - 10 ms schedule-ahead - the batch's duration; batch sizes whose
duration exceeds 25 ms are not used), equals the number of GPUs. Every cell simulates
the same number of requests (``--requests``, default 150,000; ``--quick``: 30,000), so
the virtual duration is requests / rate (the cold start, when every copy is loaded, is
part of it). Where a 1,000-model cell has the same scenario as another (fewer than
1,000 copies in all), it is run once and shown on both rows.

Each cell is ``python -m clockwork.cluster.cli simulate CELL.toml --out TMP --json`` in a
fresh process; the figures are the whole process's wall and CPU time (imports, the
simulation, writing requests.tsv / actions.tsv). Prints per cell the simulated requests
per wall second and per CPU second, the ratio of its CPU rate to the best cell's, the SLO
attainment and the loop's own wall time (run.json). With ``--repeat N`` the cells run N
times, interleaved (cell 1, 2, ..., 1, 2, ...), and the table shows the best run and the
median of the CPU rate.

    python experiments/bench_grid.py [--quick] [--requests N] [--repeat N]
        [--gpus 10,100,400] [--copies 1,4,16] [--models 1,1000,hot] [--keep DIR] [--json FILE]
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
sys.path.insert(0, str(ROOT))

from clockwork.cluster.cli import argtypes as t  # noqa: E402
from clockwork.profiles import load_profile_set  # noqa: E402

PROFILES = "v100-reference"
ONE = "resnet50_v2"
MANY = ["mobilenet_v2", "resnet18_v2", "densenet121", "resnet34_v2", "resnet50_v2",
        "inception_v3"]
SLO_MS = 100.0
BUFFER_MS, AHEAD_MS, MAX_EXEC_MS, MAX_BATCH = 5.0, 10.0, 25.0, 16
LOAD = 0.8


def instances(gpus: int, copies: int, models: int | str) -> dict[str, int]:
    """Profile name -> instance count for a cell."""
    if models == "hot":
        return {ONE: 1}
    total = gpus * copies
    if models == 1:
        return {ONE: total}
    total = max(total, models)
    k = len(MANY)
    return {name: total // k + (1 if i < total % k else 0) for i, name in enumerate(MANY)}


def gpu_seconds_per_second(rate: float, counts: dict[str, int]) -> float:
    """GPU time needed per second at ``rate`` r/s spread evenly over the instances, each
    running the largest batch its arrivals fill within its SLO window."""
    ps = load_profile_set(PROFILES)
    n = sum(counts.values())
    per = rate / n
    need = 0.0
    for name, c in counts.items():
        p = ps.get(name)
        best = p.exec_ns[p.batch_sizes[0]] / p.batch_sizes[0]
        for b in p.batch_sizes:
            e_ms = p.exec_ns[b] / 1e6
            if b > MAX_BATCH or (b > 1 and e_ms > MAX_EXEC_MS):
                break
            window_s = (SLO_MS - BUFFER_MS - AHEAD_MS - e_ms) / 1e3
            if b == p.batch_sizes[0] or per * window_s >= b:
                best = p.exec_ns[b] / b
        need += c * per * best / 1e9
    return need


def capacity(gpus: int, counts: dict[str, int]) -> float:
    """The largest rate (r/s, a multiple of 1 r/s per GPU) whose GPU time fits the GPUs.
    Scanned down from the best-batch rate: the GPU time needed is not monotone in the
    rate (it drops where the instances' batches grow)."""
    ps = load_profile_set(PROFILES)
    top = max(b / ps.get(name).exec_ns[b] * 1e9 for name in counts
              for b in ps.get(name).batch_sizes)
    x = int(top) + 1
    while x > 1 and gpu_seconds_per_second(x * gpus, counts) > gpus:
        x -= 1
    return float(x * gpus)


TARGET_RPS = 100_000  # simulated requests per CPU-second that every shape should reach
TARGET_SPREAD = 1.5  # the best shape's rate over the worst's, at most


def cell_toml(gpus: int, copies: int, models: int, requests: int, seed: int) -> tuple[str, float, float]:
    counts = instances(gpus, copies, models)
    rate = LOAD * capacity(gpus, counts)
    duration = requests / rate
    lines = [f'name = "grid-{gpus}x{copies}x{models}"', f"seed = {seed}",
             f"duration_s = {duration!r}", "", "[cluster]", f"workers = {gpus}",
             "gpus_per_worker = 1", f'profiles = "{PROFILES}"', ""]
    for name, c in counts.items():
        lines += ["[[models]]", f'name = "{name}"', f"copies = {c}", ""]
    lines += ["[[workloads]]", 'kind = "poisson"', 'models = "*"', f"rate_rps = {rate!r}",
              f"slo_ms = {SLO_MS!r}", ""]
    return "\n".join(lines), rate, duration


def compile_sources() -> None:
    """Compile the project's modules into their ``__pycache__`` once, before any cell, so
    that each cell's process times running, not compiling. Python does this on first
    import anyway, but not where ``PYTHONDONTWRITEBYTECODE`` is set: there every process
    would compile every module again (~0.1 s of CPU, a few % of a cell)."""
    import compileall

    for pkg in ("clockwork", "controller", "worker"):
        compileall.compile_dir(ROOT / pkg, quiet=2)


def run_cell(toml: str, work: Path, keep: Path | None, tag: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    sc = work / f"{tag}.toml"
    sc.write_text(toml)
    out = (keep / tag) if keep else work / f"{tag}-out"
    cmd = [sys.executable, "-m", "clockwork.cluster.cli", "simulate", str(sc), "--out",
           str(out), "--json", "--quiet"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # (stopped meanwhile, Ctrl-C or SIGTERM: the simulation is killed and waited for, so
    # that none runs on once this script has ended; subprocess.run killed it unwaited)
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as p:
        try:
            stdout, stderr = p.communicate()
        except BaseException:
            p.kill()
            p.wait()
            raise
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"{tag}: {' '.join(cmd)} failed:\n{stderr}")
    s = json.loads(stdout)
    run = json.loads((out / "run.json").read_text())
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if not keep:
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    return {"requests": s["submitted"], "wall_s": wall, "cpu_s": cpu,
            "sim_wall_s": run["wall_s"], "attainment": s["slo_attainment"],
            "loads": s["actions"]["load"], "infers": s["actions"]["infer"]}


def model_count(text: str) -> int | str:
    """A ``--models`` item: a number of models (>= 1), or ``hot``."""
    if text == "hot":
        return text
    try:
        return t.positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number of models >= 1 or hot, got {text!r}") from None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30,000 requests per cell")
    ap.add_argument("--requests", type=t.positive_int, default=None,
                    help="requests simulated per cell, >= 1 (default 150,000)")
    ap.add_argument("--repeat", type=t.positive_int, default=1,
                    help="runs per cell, interleaved (>= 1, default 1)")
    ap.add_argument("--gpus", type=t.comma_list(t.positive_int), default="10,100,400",
                    help="GPU counts, each >= 1 (comma-separated)")
    ap.add_argument("--copies", type=t.comma_list(t.positive_int), default="1,4,16",
                    help="copies per GPU, each >= 1 (comma-separated)")
    ap.add_argument("--models", type=t.comma_list(model_count), default="1,1000,hot",
                    help="model counts (each >= 1), or hot (comma-separated)")
    ap.add_argument("--seed", type=t.nonneg_int, default=1, help="seed, >= 0 (default 1)")
    ap.add_argument("--keep", type=t.out_dir, default=None, metavar="DIR",
                    help="keep each cell's logs in DIR/G-C-M (default: a temp dir, removed)")
    ap.add_argument("--json", type=t.out_file, default=None, metavar="FILE",
                    help="also write the figures here")
    a = ap.parse_args(argv)
    n = a.requests or (30_000 if a.quick else 150_000)
    shape = [(g, c, m) for m in a.models for g in a.gpus for c in a.copies
             if m != "hot" or c == 1]
    if not shape:
        ap.error("--models hot runs with 1 copy per GPU only: add 1 to --copies")
    keep = Path(a.keep).resolve() if a.keep else None  # (the cells run in the repository)
    cells: dict[tuple, dict] = {}
    same: dict[tuple, tuple] = {}  # a cell whose scenario is another's (1,000 models)
    by_toml: dict[str, tuple] = {}
    for g, c, m in shape:
        toml, rate, dur = cell_toml(g, c, m, n, a.seed)
        key = toml.split("\n", 1)[1]
        if key in by_toml:
            same[(g, c, m)] = by_toml[key]
            continue
        by_toml[key] = (g, c, m)
        cells[(g, c, m)] = {"toml": toml, "rate": rate, "duration": dur, "runs": []}
    compile_sources()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_grid-") as tmp:
        for rep in range(a.repeat):
            for (g, c, m), cell in cells.items():
                tag = f"{g}-{c}-{m}"
                r = run_cell(cell["toml"], Path(tmp), keep, tag)
                r["load"] = os.getloadavg()[0]
                cell["runs"].append(r)
                print(f"  [{rep + 1}/{a.repeat}] {g:>4} GPUs x {c:>2} copies x {m:>4} models: "
                      f"{r['requests']:,} requests, cpu {r['cpu_s']:.2f} s, wall "
                      f"{r['wall_s']:.2f} s, load {r['load']:.2f}", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    rows = []
    for g, c, m in shape:
        cell = cells[same.get((g, c, m), (g, c, m))]
        runs = cell["runs"]
        best = min(runs, key=lambda r: r["cpu_s"])
        cpu_rates = [r["requests"] / r["cpu_s"] for r in runs]
        rows.append({"gpus": g, "copies": c, "models": m,
                     "instances": sum(instances(g, c, m).values()),
                     "rate_rps": round(cell["rate"], 1), "virtual_s": round(cell["duration"], 3),
                     "requests": best["requests"],
                     "wall_rps": best["requests"] / min(r["wall_s"] for r in runs),
                     "cpu_rps": max(cpu_rates), "cpu_rps_median": statistics.median(cpu_rates),
                     "sim_wall_s": min(r["sim_wall_s"] for r in runs),
                     "attainment": best["attainment"], "loads": best["loads"],
                     "us_per_request": 1e6 / max(cpu_rates),
                     "same_as": "x".join(map(str, same[(g, c, m)])) if (g, c, m) in same else ""})
    top = max(r["cpu_rps"] for r in rows)
    print(f"# {n:,} requests per cell, best of {a.repeat}; {platform.node()} "
          f"({os.cpu_count()} CPUs, Python {platform.python_version()}); load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after")
    print("| GPUs | copies/GPU | models | instances | offered r/s | virtual s | requests "
          f"| r/s wall | r/s CPU{' (median)' if a.repeat > 1 else ''} | CPU µs/request "
          "| vs best | loop wall s | attainment | run as |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        r["vs_best"] = r["cpu_rps"] / top
        print(f"| {r['gpus']} | {r['copies']} | {r['models']} | {r['instances']:,} "
              f"| {r['rate_rps']:,.0f} | {r['virtual_s']:.2f} | {r['requests']:,} "
              f"| {r['wall_rps']:,.0f} | {r['cpu_rps']:,.0f}"
              + (f" ({r['cpu_rps_median']:,.0f})" if a.repeat > 1 else "")
              + f" | {r['us_per_request']:.1f} "
              f"| {r['vs_best']:.2f} | {r['sim_wall_s']:.2f} | {r['attainment']:.4f} "
              f"| {r['same_as'] + ' cell' if r['same_as'] else ''} |")
    worst = min(r["cpu_rps"] for r in rows)
    short = [r for r in rows if r["cpu_rps"] < TARGET_RPS]
    met = not short and top / worst <= TARGET_SPREAD
    print(f"target: every shape >= {TARGET_RPS:,} simulated requests per CPU-second (one "
          f"core) and within {TARGET_SPREAD:g}x of the best shape: "
          f"{len(rows) - len(short)} of {len(rows)} shapes reach the rate; best/worst "
          f"{top / worst:.2f}x ({top:,.0f} / {worst:,.0f} r/s): {'met' if met else 'NOT met'}")
    info = {"requests_per_cell": n, "repeat": a.repeat, "load_before": load0[0],
            "load_after": load1[0], "cells": rows}
    if a.json:
        out = Path(a.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(info, indent=2) + "\n")
    return info


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
