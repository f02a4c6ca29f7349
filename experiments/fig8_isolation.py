"""Paper Fig. 8 ("Can Clockwork isolate performance?"): foreground SLO attainment with
and without background load.

6 workers x 1 GPU (``scenarios/slo_exp_2.toml``): 6 foreground copies of ResNet50 v2 at
Poisson 200 r/s in total with the stepped low SLO of Fig. 7 (2.9 ms x 1.5 every period),
beside 12 background copies in closed loop (16 each) with a relaxed 1 s SLO. The same run
without the background copies is the reference.

    python experiments/fig8_isolation.py [--quick | --full | --smoke] [--live] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from experiments import common  # noqa: E402
from experiments.fig7_tight_slo import STEPS, min_slo  # noqa: E402

NAME = "fig8_isolation"
PERIOD = {"smoke": 0.1, "quick": 5.0, "full": 30.0}
FOREGROUND = 6


def foreground(res, delay_s: float) -> tuple[list, dict]:
    """The foreground's (SLO, requests, attainment) points, and the background's figures:
    its goodput over the time it runs (from ``delay_s``, its ``background_delay_s``)."""
    r = common.requests(res)
    fg_models = {"resnet50_v2"} | {f"resnet50_v2:{k}" for k in range(1, FOREGROUND)}
    fg = np.fromiter((m in fg_models for m in r["model"]), dtype=bool, count=len(r["model"]))
    pts = []
    for slo in np.unique(r["slo"][fg]):
        sel = fg & (r["slo"] == slo)
        pts.append((round(float(slo) / 1e6, 3), int(sel.sum()), float(r["met"][sel].mean())))
    bg = ~fg
    runs_s = res.summary["duration_s"] - delay_s
    bgs = {"requests": int(bg.sum()), "goodput_rps": float(r["met"][bg].sum()) / runs_s,
           "attainment": float(r["met"][bg].mean()) if bg.any() else None, "seconds": runs_s}
    return pts, bgs


def main(argv=None) -> dict:
    args = common.parse_args(argv, " ".join(__doc__.split("\n\n")[0].split()))
    period = PERIOD[args.scale]
    delay = min(10.0, period)
    base = [f"duration_s={period * STEPS}", f"workloads.0.period_s={period}",
            f"workloads.0.background_delay_s={delay}"]
    rows, info = [], {}
    with common.Timer() as t:
        for label, extra in (("with_background", []),
                             ("without_background", ["models.0.copies=6",
                                                     "workloads.0.background=0"])):
            res = common.run("slo_exp_2", base + extra, live=args.live)
            pts, bgs = foreground(res, delay)
            for slo, n, att in pts:
                rows.append({"case": label, "slo_ms": slo, "requests": n,
                             "attainment": round(att, 6)})
            info[label] = {"min_slo_ms_at_0.99": min_slo(pts), "background": bgs}
    common.write_tsv(args.out / f"{NAME}.tsv", rows)
    common.write_json(args.out / f"{NAME}.json", {"scale": args.scale, "period_s": period, **info})

    fig, ax = common.figure()
    for label in info:
        pts = [(r["slo_ms"], r["attainment"]) for r in rows if r["case"] == label]
        ax[0][0].plot(*zip(*pts, strict=True), marker=".", label=f"foreground, {label.replace('_', ' ')}")
    ax[0][0].set(xscale="log", xlabel="foreground SLO (ms)", ylabel="SLO attainment",
                 ylim=(0, 1.02), title=f"6 GPUs, 200 r/s foreground ({args.scale})")
    ax[0][0].legend()
    common.save(fig, args.out / f"{NAME}.png")

    w, wo = info["with_background"], info["without_background"]
    line = common.compare(
        f"Fig. 8 foreground: smallest SLO with attainment >= 0.99 ({args.scale})",
        "foreground SLOs hold beside background batch load",
        f"{w['min_slo_ms_at_0.99']} ms with background (background goodput "
        f"{w['background']['goodput_rps']:,.0f} r/s), {wo['min_slo_ms_at_0.99']} ms without")
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "info": info,
            "rows": rows}


if __name__ == "__main__":
    common.script(main)
