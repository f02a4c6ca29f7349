"""Benchmark: what workers that join and leave cost the simulated controller.

A removed worker keeps its index (a worker added later takes the next one), so the
controller loop and the policy keep a few entries per worker that ever joined. This runs
one scenario -- 2 workers of 1 GPU serving 4 copies of ResNet50 v2 at 1,000 r/s, SLO
100 ms -- with N more workers that each join (``[[add_workers]]``) and leave 0.2 s later
(``[[remove_workers]]``), spread over the run, for each N given, and prints per N the
process's CPU time, peak memory and SLO attainment, and the extra CPU and memory per
churned worker against N = 0. Each run is ``clockwork simulate`` in a fresh process;
with ``--repeat`` the runs are interleaved and the table shows the minimum and median
CPU.

    python experiments/bench_churn.py [--churn 0,1000,3000] [--repeat 2]
        [--duration 60] [--rate 1000] [--json FILE]

``--live N`` measures the live controller instead: a local cluster of two emulated
workers serving ResNet50 v2, the controller's CPU time per request (``/proc``) over
``--requests`` inferences from 16 concurrent callers (and its resident memory after
them), then N remove + add cycles, each of
the worker that has been in the cluster longer (a rolling replacement: each removed
worker keeps its index, ahead of the two in service), the same inferences again, and so
on for ``--rounds`` rounds: what the removed workers cost each request afterwards
(nothing, if nothing walks the removed ones per request).

    python experiments/bench_churn.py --live 1000 [--rounds 3] [--requests 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clockwork.cluster.cli import argtypes as t  # noqa: E402
from experiments.common import out_file, script  # noqa: E402

# the child: one simulation, its own CPU time and peak RSS (VmHWM: its own, not the
# parent's carried over fork) as JSON on the last line
_CHILD = r"""
import json, resource, sys
from clockwork.cluster.sim import simulate
res = simulate(sys.argv[1])
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "peak_mb": hwm / 1024,
                  "submitted": res.summary["submitted"],
                  "attainment": res.summary["slo_attainment"]}))
"""


def scenario(churn: int, duration_s: float, rate: float) -> str:
    """The scenario's TOML: ``churn`` workers each join and leave 0.2 s later, their
    joins spread evenly over the run (the last ones well before its end)."""
    lines = ['name = "churn"', "seed = 1", f"duration_s = {duration_s}", "",
             "[cluster]", "workers = 2", "gpus_per_worker = 1", "",
             "[[models]]", 'name = "resnet50_v2"', "copies = 4", "",
             "[[workloads]]", 'kind = "poisson"', 'models = "*"', f"rate_rps = {rate}",
             "slo_ms = 100", ""]
    span = max(0.0, duration_s - 1.5)
    for k in range(churn):
        at = 0.5 + span * k / churn
        lines += ["[[add_workers]]", f"at_s = {at:.6f}", "",
                  "[[remove_workers]]", f"at_s = {at + 0.2:.6f}", f"worker = {2 + k}", ""]
    return "\n".join(lines)


def run_one(path: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                       text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"simulate {path.name} failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU time so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    """A process's resident memory now, MB (``/proc/PID/status`` VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def live(cycles: int, rounds: int, requests: int) -> list[dict]:
    """``--live``: per round, the controller's CPU per request over ``requests``
    inferences and its resident memory after them, then ``cycles`` remove + add cycles of
    the older of its two workers."""
    import asyncio

    import numpy as np

    from clockwork.client import AsyncClient, Client
    from clockwork.cluster.local import LocalCluster

    async def load(address: str) -> None:
        x = np.zeros((3, 224, 224), np.float32)
        async with AsyncClient(address) as k:
            async def caller(n: int) -> None:
                for _ in range(n):
                    await k.infer("resnet50_v2", x, slo_ms=1000)
            await asyncio.gather(*(caller(requests // 16) for _ in range(16)))

    out = []
    with LocalCluster(workers=2, models="resnet50_v2") as c, Client(c.address) as k:
        pid = c.controller.proc.pid
        asyncio.run(load(c.address))  # (warm: the model loaded, the estimates made)
        removed = 0
        for r in range(rounds + 1):
            cpu0 = _cpu_s(pid)
            asyncio.run(load(c.address))
            per_ms = (_cpu_s(pid) - cpu0) / (requests // 16 * 16) * 1e3
            rss = _rss_mb(pid)
            out.append({"removed_workers": removed, "cpu_ms_per_request": per_ms,
                        "controller_rss_mb": rss})
            print(f"  {removed:>6,} workers removed: {per_ms:.3f} ms of controller CPU a "
                  f"request, {rss:.1f} MB resident", file=sys.stderr, flush=True)
            if r == rounds:
                break
            for _ in range(cycles):
                oldest = c.worker_addresses[removed % 2]
                k.remove_worker(oldest)
                k.add_worker(oldest)
                removed += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--churn", type=t.comma_list(t.nonneg_int), default=[0, 1000, 3000],
                    help="how many workers join and leave, one run each (default "
                    "0,1000,3000)")
    ap.add_argument("--repeat", type=t.positive_int, default=2,
                    help="runs of each, interleaved (default 2)")
    ap.add_argument("--duration", type=t.positive_float, default=60.0,
                    help="virtual seconds of each run (default 60; at least 2)")
    ap.add_argument("--rate", type=t.positive_float, default=1000.0,
                    help="requests per second (default 1000)")
    ap.add_argument("--json", type=out_file, metavar="FILE", help="write the runs here")
    ap.add_argument("--live", type=t.positive_int, metavar="N",
                    help="measure the live controller instead: N remove + add cycles of a "
                    "worker between rounds of inferences")
    ap.add_argument("--rounds", type=t.positive_int, default=3,
                    help="--live: rounds of churn (default 3)")
    ap.add_argument("--requests", type=t.positive_int, default=3000,
                    help="--live: inferences per measure (default 3,000; at least 16)")
    args = ap.parse_args(argv)
    if args.live:
        if args.requests < 16:
            ap.error("--requests: at least 16 (16 concurrent callers)")
        rows = live(args.live, args.rounds, args.requests)
        print("workers removed   controller CPU ms per request   vs none removed   "
              "controller MB resident   KB per worker removed")
        for row in rows:
            n = row["removed_workers"]
            per = (row["controller_rss_mb"] - rows[0]["controller_rss_mb"]) * 1024 / n \
                if n else float("nan")
            print(f"{n:>15,}   {row['cpu_ms_per_request']:>29.3f}   "
                  f"{row['cpu_ms_per_request'] / rows[0]['cpu_ms_per_request']:>15.2f}   "
                  f"{row['controller_rss_mb']:>22.1f}   {per:>21.1f}")
        if args.json:
            args.json.write_text(json.dumps({"live": rows}, indent=1))
        return 0
    args.churn = list(dict.fromkeys(args.churn))  # (each count once, in the order given)
    if args.duration < 2:
        ap.error("--duration: at least 2 (the workers join from 0.5 s on, 1.5 s before "
                 "the end)")
    runs: dict[int, list[dict]] = {n: [] for n in args.churn}
    with tempfile.TemporaryDirectory(prefix="bench-churn-") as tmp:
        paths = {}
        for n in args.churn:
            paths[n] = Path(tmp) / f"churn{n}.toml"
            paths[n].write_text(scenario(n, args.duration, args.rate))
        for r in range(args.repeat):
            for n in args.churn:
                runs[n].append(run_one(paths[n]))
                print(f"  run {r + 1}/{args.repeat}, {n:,} churned: "
                      f"{runs[n][-1]['cpu_s']:.2f} s CPU", file=sys.stderr, flush=True)
    base = runs.get(0)
    base_cpu = min(x["cpu_s"] for x in base) if base else None
    base_mb = min(x["peak_mb"] for x in base) if base else None
    print(f"{args.duration:g} s at {args.rate:g} r/s on 2 GPUs; workers that join and leave "
          "0.2 s later; CPU min / median of the runs")
    print(f"{'churned':>8} {'CPU min s':>10} {'median s':>9} {'peak MB':>8} "
          f"{'attainment':>10} {'CPU ms/worker':>14} {'KB/worker':>10}")
    for n in args.churn:
        cpu = [x["cpu_s"] for x in runs[n]]
        mb = min(x["peak_mb"] for x in runs[n])
        per_cpu = per_kb = "-"
        if n and base_cpu is not None:  # (a cost below the runs' noise is said so, not
            # printed negative)
            extra_cpu, extra_mb = min(cpu) - base_cpu, mb - base_mb
            per_cpu = f"{extra_cpu / n * 1e3:.2f}" if extra_cpu >= 0 else "<noise"
            per_kb = f"{extra_mb / n * 1024:.1f}" if extra_mb >= 0 else "<noise"
        print(f"{n:>8,} {min(cpu):>10.2f} {statistics.median(cpu):>9.2f} {mb:>8.1f} "
              f"{runs[n][0]['attainment']:>10.4f} {per_cpu:>14} {per_kb:>10}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items()},
                                         "runs": {str(n): v for n, v in runs.items()}},
                                        indent=1))
    return 0


if __name__ == "__main__":
    script(main)
