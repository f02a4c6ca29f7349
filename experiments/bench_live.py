"""Benchmark: the highest Poisson request rate the live controller sustains with SLO
attainment >= 0.999, everything on this machine (controller + emulated workers + load
generator).

Per rate a fresh ``LocalCluster`` (default 2 emulated workers x 8 GPUs, 16 MobileNet v2 instances:
~21,000 r/s at batch 1, ~87,000 at batch 16, so they are not the bottleneck), warmed up for
2 s at that rate, then a step
of ``--step-s`` seconds, rates rising, driven by ``clockwork.cluster.replay`` (the load generator
runs in this process), stopping after the first rate that fails. Per rate it prints:

- offered rate (requests actually sent / step), attainment, goodput;
- added latency p50/p99 = client-measured latency - EXEC (the profile's duration at the
  batch size the reply reports; the emulated device runs exactly that long);
- CPU seconds of the controller, the workers (together) and the load generator (this
  process), from /proc/PID/stat, and each as a share of one core;
- the GPUs' busy fraction over the step (from the controller's /metrics);
- late p99: how late the load generator sent its requests after their arrival times
  (it shares the machine; each request's latency and SLO count from its arrival time,
  so a generator that falls behind costs attainment, as it would a real client).

At the end: the CPU per request of each at the highest rate tried, and the rate at which
that cost would fill the cores this process may run on (and the controller's one core).
A request costs less at higher rates (a stream message carries more of them), so this is
the most hopeful such ceiling the run measured; no scheduling passes it without cheaper
requests. (The load generator's CPU also holds the replay's set-up and summary, a
visible share only at low rates.)

    python experiments/bench_live.py [--rates 1000,2000,...] [--step-s 10] [--py-spy]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import time
import urllib.request

import numpy as np

from clockwork.cluster.cli import argtypes as t
from clockwork.cluster.local import LocalCluster
from clockwork.cluster.replay import replay
from clockwork.profiles import load_profile_set
from clockwork.scenario import load_scenario
from controller.metrics import parse_text

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int | None = None) -> float:
    """utime + stime of a process (this one when ``pid`` is None), seconds."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14, 15 of stat(5)


def http_address(cluster: LocalCluster, timeout: float = 10.0) -> str | None:
    try:
        return "http://" + cluster.printed_address("http", timeout)
    except TimeoutError:
        return None


def busy_seconds(base: str | None) -> float:
    """Sum over GPUs of measured EXEC seconds so far (busy fraction x uptime)."""
    if base is None:
        return float("nan")
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        s = parse_text(r.read().decode())
    up = s["clockwork_uptime_seconds"][0][1]
    return sum(v for _, v in s.get("clockwork_gpu_busy_fraction", [])) * up


def scenario(rate: float, step_s: float, model: str, copies: int, workers: int, gpus: int,
             slo_ms: float, seed: int):
    return load_scenario(data={
        "seed": seed, "duration_s": step_s,
        "cluster": {"workers": workers, "gpus_per_worker": gpus, "profiles": "v100-reference"},
        "scheduler": {"default_slo_ms": slo_ms},
        "models": [{"name": model, "copies": copies}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": rate, "slo_ms": slo_ms}],
    })


def added_latency_ms(tel, exec_ns: dict[int, int]) -> tuple[float, float]:
    rows = [r for r in tel.requests if r[5] == 0]
    if not rows:
        return float("nan"), float("nan")
    lat = np.array([r[4] - exec_ns.get(r[8], 0) for r in rows], dtype=np.int64) / 1e6
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def py_spy(pid: int, seconds: float = 3.0) -> str:
    exe = shutil.which("py-spy")
    if exe is None:
        return "py-spy not on PATH"
    try:
        r = subprocess.run([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-f",
                            "raw", "-o", "/tmp/bench_live_pyspy.txt", "--nonblocking"],
                           capture_output=True, text=True, timeout=seconds + 20)
        if r.returncode != 0:
            return f"py-spy failed: {r.stderr.strip()[-300:]}"
        return top_frames("/tmp/bench_live_pyspy.txt")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"py-spy failed: {e!r}"


def top_frames(path: str, n: int = 15) -> str:
    """Own-time share of the leaf frames of a py-spy raw (collapsed) profile."""
    own: dict[str, int] = {}
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            c = int(count)
            total += c
            leaf = stack.split(";")[-1]
            own[leaf] = own.get(leaf, 0) + c
    top = sorted(own.items(), key=lambda kv: -kv[1])[:n]
    return "\n".join(f"  {100 * c / total:5.1f} %  {k}" for k, c in top)


def main() -> int:
    models = sorted(load_profile_set("v100-reference").profiles)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=t.comma_list(t.positive_float),
                    default="1000,2000,4000,6000,8000,10000,12000,14000,16000",
                    help="offered Poisson rates, r/s (each > 0), comma-separated, tried in "
                    "order (default %(default)s)")
    ap.add_argument("--step-s", type=t.positive_float, default=10.0,
                    help="seconds measured per rate, after a 2 s warm-up (> 0, default "
                    "%(default)s)")
    ap.add_argument("--workers", type=t.positive_int, default=2,
                    help="emulated worker processes (>= 1, default %(default)s)")
    ap.add_argument("--gpus", type=t.positive_int, default=8,
                    help="GPUs per worker (>= 1, default %(default)s)")
    ap.add_argument("--model", default="mobilenet_v2", choices=models, metavar="MODEL",
                    help=f"profile served: {', '.join(models)} (default %(default)s)")
    ap.add_argument("--copies", type=t.positive_int, default=16,
                    help="instances of it (>= 1, default %(default)s)")
    ap.add_argument("--slo-ms", type=t.positive_float, default=100.0,
                    help="every request's SLO (> 0, default %(default)s)")
    ap.add_argument("--target", type=t.probability, default=0.999,
                    help="stop at the first rate whose SLO attainment is below this, in "
                    "[0, 1] (0: run every rate; default %(default)s)")
    ap.add_argument("--seed", type=t.nonneg_int, default=1,
                    help="arrivals' seed (>= 0, default %(default)s)")
    ap.add_argument("--out", type=t.out_file, metavar="JSON", help="also write the rows here")
    ap.add_argument("--py-spy", action="store_true",
                   help="at the first failing rate, sample the busiest process with py-spy")
    args = ap.parse_args()
    rates = args.rates
    prof = load_profile_set("v100-reference").get(args.model)
    exec_ns = {int(b): int(v) for b, v in prof.exec_ns.items()}
    cap = args.workers * args.gpus * max(b / exec_ns[b] * 1e9 for b in exec_ns)
    print(f"bench_live: {args.workers} emulated worker(s) x {args.gpus} GPU(s), "
          f"{args.copies} x {args.model}, SLO {args.slo_ms:g} ms, {args.step_s:g} s per rate; "
          f"emulated GPU capacity at the best batch ~{cap:,.0f} r/s; {os.cpu_count()} CPU(s)",
          flush=True)
    rows = []
    best = None
    bottleneck = ""
    head = (f"{'rate':>7} {'sent/s':>8} {'attain':>8} {'goodput':>9} {'added p50':>9} "
            f"{'p99 ms':>7} {'ctl cpu':>8} {'wrk cpu':>8} {'gen cpu':>8} {'gpu busy':>8} "
            f"{'wall':>5} {'late p99':>8}")
    print(head, flush=True)
    for rate in rates:
        # A fresh cluster per rate, warmed up at that rate: the scheduler places one copy
        # of each instance by the demand it sees first and does not spread them again
        # later (a cluster warmed at 500 r/s keeps all 16 copies on 6 GPUs of one worker).
        cluster = LocalCluster(workers=args.workers, gpus=args.gpus,
                               models=f"{args.model}:{args.copies}", http_port=0, timeout=60.0)
        cluster.start()
        try:
            base = http_address(cluster)
            pids = {"controller": cluster.controller.proc.pid,
                    "workers": [w.proc.pid for w in cluster.workers]}
            asyncio.run(replay(scenario(rate, 2.0, args.model, args.copies, args.workers,
                                        args.gpus, args.slo_ms, args.seed + 1),
                               cluster.address, 200000, warn_late=False))
            sc = scenario(rate, args.step_s, args.model, args.copies, args.workers, args.gpus,
                          args.slo_ms, args.seed)
            c0 = (cpu_s(pids["controller"]), sum(cpu_s(p) for p in pids["workers"]), cpu_s())
            b0 = busy_seconds(base)
            t0 = time.monotonic()
            res = asyncio.run(replay(sc, cluster.address, 200000, warn_late=False))
            wall = time.monotonic() - t0
            c1 = (cpu_s(pids["controller"]), sum(cpu_s(p) for p in pids["workers"]), cpu_s())
            busy = (busy_seconds(base) - b0) / (wall * args.workers * args.gpus)
            s = res.summary
            p50, p99 = added_latency_ms(res.telemetry, exec_ns)
            cpu = [b - a for a, b in zip(c0, c1, strict=True)]
            row = {"rate": rate, "sent_rps": s["submitted"] / args.step_s,
                   "attainment": s["slo_attainment"], "goodput_rps": s["goodput_rps"],
                   "added_p50_ms": p50, "added_p99_ms": p99, "cpu_controller_s": cpu[0],
                   "cpu_workers_s": cpu[1], "cpu_loadgen_s": cpu[2], "gpu_busy": busy,
                   "wall_s": wall, "answered_once": res.answered_once,
                   "latency_p99_ms": s["latency_ms"]["p99"],
                   # (how late the load generator sent, p99: it shares the machine)
                   "send_lag_p99_ms": s["send_lag_ms"]["p99"]}
            # CPU per request sent, µs: controller, workers (together), load generator
            row["cpu_us_per_request"] = [round(c * 1e6 / max(1, s["submitted"]), 1)
                                         for c in cpu]
            rows.append(row)
            print(f"{rate:>7,.0f} {row['sent_rps']:>8,.0f} {row['attainment']:>8.4f} "
                  f"{row['goodput_rps']:>9,.0f} {p50:>9.2f} {p99:>7.2f} "
                  f"{cpu[0]:>5.1f} s {cpu[1]:>5.1f} s {cpu[2]:>5.1f} s {busy:>8.3f} "
                  f"{wall:>5.1f} {row['send_lag_p99_ms']:>6.1f} ms", flush=True)
            ok = (res.answered_once and s["slo_attainment"] >= args.target
                  and row["sent_rps"] >= 0.97 * rate)
            if ok:
                best = rate
                continue
            shares = {"controller": cpu[0] / wall, "load generator": cpu[2] / wall,
                      "workers (together)": cpu[1] / wall}
            who = max(shares, key=shares.get)
            bottleneck = (f"first failing rate {rate:,.0f} r/s (attainment "
                          f"{row['attainment']:.4f}, sent {row['sent_rps']:,.0f}/s); CPU "
                          "share of one core over the step: " + ", ".join(
                              f"{k} {v:.2f}" for k, v in shares.items()) + f"; busiest: {who}"
                          f"; all three {sum(shares.values()):.2f} of {os.cpu_count()} cores, "
                          f"1-min load average {os.getloadavg()[0]:.2f} (other users included)")
            if args.py_spy:
                pid = pids["controller"] if who == "controller" else (
                    os.getpid() if who == "load generator" else pids["workers"][0])
                print(f"py-spy on the {who} (pid {pid}) at {rate:,.0f} r/s:", flush=True)
                # load it again while sampling
                import threading

                again = scenario(rate, 4.0, args.model, args.copies, args.workers, args.gpus,
                                 args.slo_ms, args.seed)
                th = threading.Thread(target=asyncio.run, daemon=True,
                                      args=(replay(again, cluster.address, 200000),))
                th.start()
                time.sleep(0.5)
                bottleneck += "\n" + py_spy(pid, 3.0)
                th.join(30)
            break
        finally:
            cluster.stop()
    print()
    print(f"highest sustained rate with attainment >= {args.target}: "
          f"{f'{best:,.0f} r/s' if best else 'none of the rates tried'}")
    if rows:
        print(cpu_ceiling(max(rows, key=lambda r: r["rate"]), len(os.sched_getaffinity(0))))
    if bottleneck:
        print("bottleneck: " + bottleneck)
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "best_rps": best,
                       "bottleneck": bottleneck}, f, indent=2)
    return 0


def cpu_ceiling(row: dict, cores: int) -> str:
    """What one rate's CPU per request says of the highest rate this machine could carry
    at that cost: every process together on ``cores`` cores, and the controller on one
    (it is one event loop). (Printed for the highest rate tried: the cheapest per request.)"""
    ctl, wrk, gen = row["cpu_us_per_request"]
    total = ctl + wrk + gen
    return (f"CPU per request at {row['rate']:,.0f} r/s: controller {ctl:.0f} µs, workers "
            f"{wrk:.0f} µs, load generator {gen:.0f} µs ({total:.0f} µs); at that cost "
            f"{cores} core(s) carry at most ~{cores * 1e6 / total:,.0f} r/s, and the "
            f"controller's one core ~{1e6 / ctl:,.0f} r/s" if ctl > 0 and total > 0 else
            "CPU per request: not measured")


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
