"""Paper Fig. 5: Clockwork vs Clipper-, TF-Serving- and INFaaS-style scheduling.

1 worker, 1 GPU, 15 copies of ResNet50 v2, 16 closed-loop clients per copy
(``scenarios/fig5_1gpu.toml``); the controller's default SLO (and the clients' SLO) is
swept from 10 to 500 ms. Goodput per policy and SLO, and the latency CDF of completed
requests per policy at one SLO.

    python experiments/fig5_compare.py [--quick | --full | --smoke] [--live] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from experiments import common  # noqa: E402

NAME = "fig5_compare"
SLOS = {"smoke": [100], "quick": [10, 25, 50, 100, 250, 500], "full": [10, 15, 25, 50, 100, 200, 300, 500]}
DURATION = {"smoke": 1.0, "quick": 5.0, "full": 60.0}
CDF_SLO = 100


def main(argv=None) -> dict:
    args = common.parse_args(argv, " ".join(__doc__.split("\n\n")[0].split()))
    slos, dur = SLOS[args.scale], DURATION[args.scale]
    rows, cdfs = [], {}
    with common.Timer() as t:
        for slo in slos:
            for pol in common.POLICIES:
                res = common.run("fig5_1gpu", [f"duration_s={dur}", f"scheduler.policy={pol}",
                                               f"scheduler.default_slo_ms={slo}",
                                               f"workloads.0.slo_ms={slo}"],
                                 live=args.live)
                s = res.summary
                rows.append({"slo_ms": slo, "policy": pol, "goodput_rps": s["goodput_rps"],
                             "throughput_rps": s["throughput_rps"],
                             "attainment": s["slo_attainment"],
                             "p99_ms": s["latency_ms"]["p99"], "max_ms": s["latency_ms"]["max"],
                             "submitted": s["submitted"]})
                if slo == CDF_SLO or (CDF_SLO not in slos and slo == slos[-1]):
                    r = common.requests(res)
                    x, q = common.cdf(r["latency"][r["ok"]] / 1e6)
                    cdfs[pol] = {"latency_ms": np.round(x, 3), "F": np.round(q, 4)}
    common.write_tsv(args.out / f"{NAME}.tsv", rows)
    common.write_json(args.out / f"{NAME}_cdf.json", {"slo_ms": CDF_SLO, "cdf": cdfs})

    fig, ax = common.figure(1, 2)
    for pol in common.POLICIES:
        pts = [(r["slo_ms"], r["goodput_rps"]) for r in rows if r["policy"] == pol]
        ax[0][0].plot(*zip(*pts, strict=True), marker="o", label=pol)
        if pol in cdfs:
            ax[0][1].plot(cdfs[pol]["latency_ms"], cdfs[pol]["F"], label=pol)
    ax[0][0].set(xscale="log", xlabel="SLO (ms)", ylabel="goodput (r/s)",
                 title=f"1 GPU, 15 x ResNet50, 240 clients ({args.scale})")
    ax[0][1].set(xscale="log", xlabel="latency (ms)", ylabel="CDF",
                 title=f"completed requests, SLO {CDF_SLO} ms")
    ax[0][0].legend()
    ax[0][1].legend()
    common.save(fig, args.out / f"{NAME}.png")

    def g(pol, slo):
        return next(r["goodput_rps"] for r in rows if r["policy"] == pol and r["slo_ms"] == slo)

    shown = sorted({slos[0], 25, 100, 500} & set(slos))
    ours = "; ".join(f"{slo} ms: " + ", ".join(f"{p} {g(p, slo):,.0f}" for p in common.POLICIES)
                     for slo in shown)
    line = common.compare(
        f"Fig. 5 goodput by SLO, r/s ({args.scale}, {dur:g} s per point)",
        "Clockwork meets tight SLOs with comparable or better goodput than Clipper and INFaaS",
        ours)
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "rows": rows}


if __name__ == "__main__":
    common.script(main)
