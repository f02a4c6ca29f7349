"""Benchmark: what client authentication and TLS cost.

The same load against a live local cluster in three configurations, interleaved (none,
token, token+TLS, none, ...), each on a fresh ``LocalCluster`` (the cluster secret is on
in all three, as ``LocalCluster`` always makes one; it costs only at connect):

- ``none``: plaintext, no token;
- ``token``: the controller requires a bearer token (``--token-file``), clients send it;
- ``token+tls``: the same, and TLS on the controller's ports (test certificates from
  ``tests/pki.py``).

Per run, two loads, each measured at the client:

- ``stream``: a closed loop over one pipelined ``InferStream`` (``clockwork.cluster.replay``,
  ``--concurrency`` requests in flight per model instance): r/s answered successfully and
  p50 latency. The token is checked once per stream; TLS costs per byte.
- ``unary``: ``--callers`` concurrent ``AsyncClient.infer`` loops, one gRPC call per
  request (the token is checked on every call): r/s and p50 latency.

Both also report the controller's CPU time per request answered (µs, from
/proc/PID/stat), which other processes on a shared machine disturb less than r/s.

    python experiments/bench_security.py [--runs 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.client import AsyncClient  # noqa: E402
from clockwork.cluster.cli import argtypes as t  # noqa: E402
from clockwork.cluster.local import LocalCluster  # noqa: E402
from clockwork.cluster.replay import replay  # noqa: E402
from clockwork.errors import ClockworkError  # noqa: E402
from clockwork.profiles import load_profile_set  # noqa: E402
from clockwork.scenario import load_scenario  # noqa: E402
from experiments.bench_live import cpu_s  # noqa: E402
from tests.pki import make_pki  # noqa: E402

CONFIGS = ("none", "token", "token+tls")
TOKEN = "bench-security-token-0123456789"


def scenario(seconds: float, model: str, copies: int, concurrency: int, slo_ms: float,
             seed: int):
    return load_scenario(data={
        "seed": seed, "duration_s": seconds,
        "cluster": {"workers": 1, "gpus_per_worker": 4, "profiles": "v100-reference"},
        "scheduler": {"default_slo_ms": slo_ms},
        "models": [{"name": model, "copies": copies}],
        "workloads": [{"kind": "closed_loop", "models": "*", "concurrency": concurrency,
                       "slo_ms": slo_ms}],
    })


def client_kw(cfg: str, ca: str) -> dict:
    return {"token": TOKEN if cfg != "none" else "",
            "tls_ca": ca if cfg == "token+tls" else None}


async def unary(address: str, kw: dict, names: list[str], seconds: float, callers: int,
                slo_ms: float) -> tuple[float, float, int, int]:
    """(r/s answered successfully, p50 ms, errors, calls made) of ``callers`` concurrent
    Infer loops."""
    lat: list[float] = []
    errors = 0
    async with AsyncClient(address, timeout=10.0, **kw) as c:
        await c.infer(names[0], slo_ms=slo_ms)  # the channel is up (TLS handshake done)
        t_start = time.monotonic()
        stop = t_start + seconds

        async def loop(i: int) -> None:
            nonlocal errors
            m = names[i % len(names)]
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    await c.infer(m, slo_ms=slo_ms)
                except ClockworkError:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(loop(i) for i in range(callers)))
        wall = time.monotonic() - t_start
    return (len(lat) / wall, statistics.median(lat) * 1e3 if lat else float("nan"), errors,
            len(lat) + errors + 1)


def one_run(cfg: str, pki, args, seed: int) -> dict:
    kw = {"workers": 1, "gpus": 4, "models": f"{args.model}:{args.copies}", "timeout": 60.0}
    if cfg != "none":
        kw["token"] = TOKEN
    if cfg == "token+tls":
        kw["controller_args"] = ["--tls-cert", pki.cert, "--tls-key", pki.key]
    ckw = client_kw(cfg, pki.ca)
    names = [args.model] + [f"{args.model}:{k}" for k in range(1, args.copies)]
    with LocalCluster(**kw) as cluster:
        warm = scenario(1.0, args.model, args.copies, args.concurrency, args.slo_ms, seed + 1)
        asyncio.run(replay(warm, cluster.address, 200000, **ckw))
        sc = scenario(args.seconds, args.model, args.copies, args.concurrency, args.slo_ms,
                      seed)
        pid = cluster.controller.proc.pid
        c0 = cpu_s(pid)
        res = asyncio.run(replay(sc, cluster.address, 200000, **ckw))
        c1 = cpu_s(pid)
        s = res.summary
        u_rps, u_p50, u_err, u_n = asyncio.run(unary(cluster.address, ckw, names,
                                                     args.seconds, args.callers, args.slo_ms))
        c2 = cpu_s(pid)
    return {"config": cfg, "stream_rps": s["throughput_rps"],
            "stream_p50_ms": s["latency_ms"]["p50"],
            "stream_cpu_us": (c1 - c0) / max(1, s["submitted"]) * 1e6,
            "stream_failed": s["submitted"] - s["succeeded"], "unary_rps": u_rps,
            "unary_p50_ms": u_p50, "unary_cpu_us": (c2 - c1) / max(1, u_n) * 1e6,
            "unary_errors": u_err}


def main() -> int:
    models = sorted(load_profile_set("v100-reference").profiles)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=t.positive_int, default=2,
                    help="runs per configuration (>= 1, default 2)")
    ap.add_argument("--seconds", type=t.positive_float, default=5.0,
                    help="per load and run (> 0, default 5)")
    ap.add_argument("--model", default="mobilenet_v2", choices=models, metavar="MODEL",
                    help=f"profile served: {', '.join(models)} (default mobilenet_v2)")
    ap.add_argument("--copies", type=t.positive_int, default=8,
                    help="instances of it (>= 1, default 8)")
    ap.add_argument("--concurrency", type=t.positive_int, default=8,
                    help="stream: requests in flight per instance (>= 1, default 8)")
    ap.add_argument("--callers", type=t.positive_int, default=32,
                    help="unary: concurrent Infer loops (>= 1, default 32)")
    ap.add_argument("--slo-ms", type=t.positive_float, default=1000.0,
                    help="every request's SLO (> 0, default 1000)")
    ap.add_argument("--out", type=t.out_file, metavar="JSON", help="also write the rows here")
    args = ap.parse_args()
    print(f"bench_security: 1 emulated worker x 4 GPUs, {args.copies} x {args.model}, "
          f"{args.seconds:g} s per load; stream: closed loop, {args.concurrency} in flight "
          f"per instance; unary: {args.callers} callers; {os.cpu_count()} CPU(s), 1-min "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    head = (f"{'stream r/s':>10} {'p50 ms':>7} {'cpu µs':>7} {'unary r/s':>10} {'p50 ms':>7} "
            f"{'cpu µs':>7}")
    print(f"{'config':<10} {'run':>3} {head}  failed", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        pki = make_pki(d)
        for run in range(args.runs):
            for cfg in CONFIGS:
                r = one_run(cfg, pki, args, seed=1 + run)
                r["run"] = run + 1
                rows.append(r)
                print(f"{cfg:<10} {run + 1:>3} {r['stream_rps']:>10,.0f} "
                      f"{r['stream_p50_ms']:>7.2f} {r['stream_cpu_us']:>7.0f} "
                      f"{r['unary_rps']:>10,.0f} {r['unary_p50_ms']:>7.2f} "
                      f"{r['unary_cpu_us']:>7.0f}  {r['stream_failed']}+{r['unary_errors']}",
                      flush=True)
    print()
    print(f"{'mean':<10} {'':>3} {head}")
    for cfg in CONFIGS:
        mine = [r for r in rows if r["config"] == cfg]

        def mean(k, mine=mine):
            return statistics.fmean(r[k] for r in mine)

        print(f"{cfg:<10} {'':>3} {mean('stream_rps'):>10,.0f} {mean('stream_p50_ms'):>7.2f} "
              f"{mean('stream_cpu_us'):>7.0f} {mean('unary_rps'):>10,.0f} "
              f"{mean('unary_p50_ms'):>7.2f} {mean('unary_cpu_us'):>7.0f}")
    if args.out:
        import json

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
