"""Benchmark: the live system on real execution past its capacity. One cpu worker (the
zoo's four tiny models compiled with TVM, really computing on this machine's cores; or,
with ``--device cuda``, on a GPU) serves 36 instances, every one cached, under open-loop
Poisson load at rising rates with a 10 ms SLO. Clockwork's promise is that overload costs only the requests it cannot
serve: the controller plans each GPU's lane from the workers' measured times, runs what
can finish in time and turns the rest away early. When its plan is wrong (lane times
underestimated) the worker runs work whose answers come too late, and goodput falls as
load rises.

Per rate (a fresh cluster each, ``experiments.common.run_live``): offered and answered
rates, goodput and attainment, successful INFERs from the controller's action log, and
the useful share: requests that met their SLO per successful INFER (1.0 at batch 1 with
no answer late; below it, INFERs ran for answers that came too late).

    python experiments/live_overload.py [--rates 1000,1600,2400] [--duration 10] [--repeat 1]
        [--device cpu|cuda] [--pacing HOP=US ...]

Needs TVM (``pip install -e .[tvm]``); missing packages are compiled first
(``packages/DEVICE``, or ``--packages``; a GPU machine without TVM's compiler needs them
made elsewhere: ``experiments/gpu_check``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.cluster.cli import argtypes as t  # noqa: E402
from experiments import common  # noqa: E402

MODELS = ("mlp", "resnet_tiny", "mobilenet_tiny", "transformer_tiny")
COPIES = 9


def scenario(rate: float, duration_s: float, slo_ms: float, packages: Path | None,
             seed: int, device: str = "cpu") -> dict:
    cluster = {"workers": 1, "gpus_per_worker": 1, "profiles": device, "device": device,
               "weights_cache_pages": 64}
    if packages is not None:
        cluster["packages"] = str(packages)
    return {"name": "live-overload", "seed": seed, "duration_s": duration_s,
            "cluster": cluster,
            "scheduler": {"policy": "clockwork", "default_slo_ms": slo_ms},
            "models": [{"name": m, "copies": COPIES} for m in MODELS],
            "workloads": [{"kind": "poisson", "models": "*", "rate_rps": rate,
                           "slo_ms": slo_ms}]}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rates", type=t.comma_list(t.positive_float), default="1000,1600,2400",
                   help="offered Poisson rates, r/s, comma-separated (default %(default)s)")
    p.add_argument("--duration", type=t.positive_float, default=10.0,
                   help="seconds of load per rate (default %(default)s)")
    p.add_argument("--slo-ms", type=t.positive_float, default=10.0,
                   help="every request's SLO, ms (default %(default)s)")
    p.add_argument("--repeat", type=t.positive_int, default=1,
                   help="runs per rate, interleaved over the rates (default %(default)s)")
    p.add_argument("--packages", type=lambda v: Path(t.out_dir(v)), default=None,
                   help="folder of compiled packages (default packages/DEVICE); missing "
                        "ones are compiled there first")
    p.add_argument("--seed", type=t.seed, default=1, help="workload seed (default 1)")
    p.add_argument("--pacing", action="append", default=[], metavar="HOP=US",
                   help="a stream's pacing interval under load, microseconds (0: none; "
                        "repeatable); HOP: requests, actions, results, replies, or all "
                        "(default: each command's own, 2,000)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the worker's device and the shipped profile set it plans with "
                        "(default %(default)s; cuda needs a GPU and packages compiled for "
                        "it, see experiments/gpu_check)")
    args = p.parse_args(argv)
    try:
        pacing = common.pacing_intervals(args.pacing)
    except ValueError as e:
        p.error(f"--pacing {e}")
    rows = []
    print(f"{'rate':>7} {'run':>3} {'answered':>9} {'goodput':>8} {'attain':>7} "
          f"{'INFERs ok':>9} {'useful':>7}  (r/s; useful = met SLO / INFER ok)", flush=True)
    for k in range(args.repeat):
        for rate in args.rates:
            sc = common.scenario(scenario(rate, args.duration, args.slo_ms, args.packages,
                                          args.seed + k, args.device))
            res = common.run_live(sc, pacing=pacing)
            s = res.summary
            ok = sum(1 for a in res.telemetry.actions if a[1] == "INFER" and a[2] == "SUCCESS")
            row = {"rate": rate, "run": k + 1, "answered_rps": s["submitted"] / args.duration,
                   "goodput_rps": s["goodput_rps"], "attainment": s["slo_attainment"],
                   "infer_ok": ok, "useful": s["slo_met"] / ok if ok else float("nan")}
            rows.append(row)
            print(f"{rate:>7,.0f} {k + 1:>3} {row['answered_rps']:>9,.0f} "
                  f"{row['goodput_rps']:>8,.0f} {row['attainment']:>7.3f} {ok:>9,} "
                  f"{row['useful']:>7.3f}", flush=True)
    return rows


if __name__ == "__main__":
    common.script(main)
