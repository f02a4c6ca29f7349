"""Paper Fig. 11 ("Can Clockwork scale?"): peak goodput vs number of emulated workers.

An Azure replay (``scenarios/azure_scalability.toml``, the shipped 500-function sample
onto 550 instances) whose load factor ramps x1.5 every step from 2 x N (~34 x N after 8 steps) for N
emulated workers of 1 GPU each (so offered load passes what N GPUs can serve). The peak
goodput is the best step. Beside it: the simulator's wall time per simulated second and
simulated requests per wall second -- the simulator runs the production controller
(scheduler) code on one core, so its request rate is the controller's CPU limit; on a
virtual clock the controller's cost does not slow the cluster down, so simulated goodput
keeps growing with N and the bottleneck shows as wall time instead.

``--quick``: N = 1, 2, 4, 8 steps of 4 s; ``--full``: N = 10 ... 150, 60 s steps (long).

    python experiments/fig11_scale.py [--quick | --full | --smoke] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402

NAME = "fig11_scale"
# (workers list, step period s, steps, copies multiplier)
SCALE = {"smoke": ((1, 2), 0.5, 3, 1), "quick": ((1, 2, 4), 4.0, 8, 1),
         "full": ((10, 20, 40, 80, 110, 150), 60.0, 10, 8)}
BASE_COPIES = (300, 100, 50, 50, 50)
PAPER = "linear to ~110 workers, then the controller is the bottleneck; peak 103,387 r/s"


def main(argv=None) -> dict:
    args = common.parse_args(argv, __doc__.splitlines()[0])
    workers_list, period, steps, mult = SCALE[args.scale]
    rows = []
    with common.Timer() as t:
        for w in workers_list:
            start = 2.0 * w
            over = [f"cluster.workers={w}", "cluster.gpus_per_worker=1",
                    f"duration_s={period * steps}", f"workloads.0.step_period_s={period}",
                    "workloads.0.interval_s=60", f"workloads.0.minutes={int(period * steps // 60) + 1}",
                    f"workloads.0.load_factor_start={start}",
                    f"workloads.0.load_factor_max={start * 1.5 ** (steps - 1) * 1.01}"]
            over += [f"models.{i}.copies={c * mult}" for i, c in enumerate(BASE_COPIES)]
            with common.Timer() as tw:
                res = common.run("azure_scalability", over)
            tl = common.timeline(res, period)[:steps]
            best = max(tl, key=lambda row: row["goodput_rps"])
            n = res.summary["submitted"]
            rows.append({"workers": w, "peak_goodput_rps": best["goodput_rps"],
                         "offered_at_peak_rps": best["offered_rps"],
                         "attainment_at_peak": best["attainment"],
                         "peak_per_worker_rps": round(best["goodput_rps"] / w, 1),
                         "requests": n, "sim_s": period * steps,
                         "wall_s": round(tw.wall_s, 3),
                         "wall_per_sim_s": round(tw.wall_s / (period * steps), 4),
                         "sim_requests_per_wall_s": round(n / tw.wall_s)})
    common.write_tsv(args.out / f"{NAME}.tsv", rows)
    ctl = min(r["sim_requests_per_wall_s"] for r in rows)
    common.write_json(args.out / f"{NAME}.json", {"scale": args.scale, "rows": rows,
                                                  "controller_rps_one_core": ctl})

    fig, ax = common.figure(1, 2, size=(4.2, 3.2))
    ws = [r["workers"] for r in rows]
    ax[0][0].plot(ws, [r["peak_goodput_rps"] for r in rows], marker="o")
    ax[0][0].set(xlabel="emulated workers (1 GPU each)", ylabel="peak goodput (r/s)",
                 title=f"Azure ramp ({args.scale})")
    ax[0][1].plot(ws, [r["wall_per_sim_s"] for r in rows], marker="o")
    ax[0][1].axhline(1.0, color="grey", ls="--", lw=0.5)
    ax[0][1].set(xlabel="emulated workers", ylabel="wall s per simulated s",
                 title="simulator / controller cost")
    common.save(fig, args.out / f"{NAME}.png")

    grow = [b["peak_goodput_rps"] / a["peak_goodput_rps"] for a, b in zip(rows, rows[1:], strict=False)]
    line = common.compare(
        f"Fig. 11 peak goodput vs workers ({args.scale})", PAPER,
        ", ".join(f"N={r['workers']}: {r['peak_goodput_rps']:,.0f} r/s "
                  f"({r['peak_per_worker_rps']:,.0f}/worker, {r['wall_per_sim_s']:.2f} wall s per sim s)"
                  for r in rows)
        + f"; growth per step x{', x'.join(f'{g:.2f}' for g in grow)}; the simulator ran >= "
          f"{ctl:,} simulated r/s per wall s (start-up included; the controller alone: "
          f"experiments/bench_scheduler.py)")
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "rows": rows}


if __name__ == "__main__":
    main()
