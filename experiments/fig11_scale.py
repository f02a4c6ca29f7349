"""Paper Fig. 11 ("Can Clockwork scale?"): peak goodput vs number of emulated workers.

An Azure replay (``scenarios/azure_scalability.toml``, the shipped 500-function sample
onto 550 instances, x8 at full scale) whose load factor ramps x1.5 every step from
k x N (k = 2 quick, 6 full) for N emulated workers of 1 GPU each, so that the offered load
passes what N GPUs can serve. Peak goodput = the best step.

The controller's cost: on the simulator's virtual clock the controller's CPU time does
not slow the cluster, so simulated goodput keeps growing with N. Every call into the
scheduling policy (the controller's work) is timed, per step of simulated time; the
policy's CPU seconds (its thread's) per simulated second is the CPU the controller needs to keep up in
real time (> 1: more than one core, i.e. a single-threaded controller is the
bottleneck). Reported per N at the largest step served with attainment >= 0.99 (and at the
peak step, which is overloaded). With ``--live`` it is the controller process's CPU time
per second of the run.

``--quick``: N = 1, 2, 4; 8 steps of 4 s. ``--full``: N = 10, 20, 40, 80, 110, 150, 6 steps of
10 s from 6 x N (the paper's N; shorter steps than its runs, see experiments/README.md).

    python experiments/fig11_scale.py [--quick | --full | --smoke] [--live] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402

NAME = "fig11_scale"
# (workers list, step period s, steps, copies multiplier, first load factor per worker)
SCALE = {"smoke": ((1, 2), 0.5, 3, 1, 2.0), "quick": ((1, 2, 4), 4.0, 8, 1, 2.0),
         "full": ((10, 20, 40, 80, 110, 150), 10.0, 6, 8, 6.0)}
BASE_COPIES = (300, 100, 50, 50, 50)
PAPER = "linear to ~110 workers, then the controller is the bottleneck; peak 103,387 r/s"


def _check_live(args) -> None:
    """Refuse a --live scale this machine cannot hold (before the --out folder is made)."""
    if args.live:
        workers_list, period, steps, *_ = SCALE[args.scale]
        common.check_live(max(workers_list), period * steps, f"fig11 --{args.scale}")


def _live_cost(r: dict) -> str:
    """A live row's summary after its peak: what was measured (the controller process's
    CPU over the whole run; the attainment at the peak step; the largest load served at
    >= 99 %, if any step was)."""
    served = ("no step served at >= 99 %" if r["served_rps"] is None else
              f"{r['served_rps']:,.0f} r/s served at >= 99 %")
    return (f"attainment {r['attainment_at_peak']:.2f} at the peak, {served}; controller "
            f"process {r['ctl_cpu_per_s']:.2f} CPU s per s over the run, not measured per "
            "step)")


def main(argv=None) -> dict:
    args = common.parse_args(argv, " ".join(__doc__.split("\n\n")[0].split()),
                             check=_check_live)
    workers_list, period, steps, mult, per_worker = SCALE[args.scale]
    rows = []
    with common.Timer() as t:
        for w in workers_list:
            start = per_worker * w
            over = [f"cluster.workers={w}", "cluster.gpus_per_worker=1",
                    f"duration_s={period * steps}", f"workloads.0.step_period_s={period}",
                    "workloads.0.interval_s=60", f"workloads.0.minutes={int(period * steps // 60) + 1}",
                    f"workloads.0.load_factor_start={start}",
                    f"workloads.0.load_factor_max={start * 1.5 ** (steps - 1) * 1.01}"]
            over += [f"models.{i}.copies={c * mult}" for i, c in enumerate(BASE_COPIES)]
            with common.Timer() as tw:
                res = common.run("azure_scalability", over, live=args.live,
                                 time_policy=None if args.live else period)
            tl = common.timeline(res, period)[:steps]
            ib, best = max(enumerate(tl), key=lambda it: it[1]["goodput_rps"])
            n = res.summary["submitted"]
            row = {"workers": w, "peak_goodput_rps": best["goodput_rps"],
                   "offered_at_peak_rps": best["offered_rps"],
                   "attainment_at_peak": best["attainment"],
                   "peak_per_worker_rps": round(best["goodput_rps"] / w, 1),
                   "requests": n}
            # (live: the run's own seconds, not simulated ones)
            run = "run" if args.live else "sim"
            row.update({f"{run}_s": period * steps, "wall_s": round(tw.wall_s, 3),
                        f"wall_per_{run}_s": round(tw.wall_s / (period * steps), 4),
                        f"{'' if args.live else 'sim_'}requests_per_wall_s":
                            round(n / tw.wall_s)})
            if args.live:
                # the largest step served with attainment >= 0.99, as in the simulator
                # (None: no step was); the controller process's CPU is known only for
                # the whole run (all steps), not per step
                served = [i for i, b in enumerate(tl) if b["attainment"] >= 0.99]
                js = max(served, key=lambda i: tl[i]["offered_rps"]) if served else None
                row["served_rps"] = tl[js]["goodput_rps"] if js is not None else None
                row["ctl_cpu_per_s"] = round(res.controller_cpu_s / res.wall_s, 4)
            else:
                # the policy's (controller's) wall time per simulated second: over the
                # run, and in the peak step; > 1 = a live controller would need > 1 core
                by = res.policy_wall_by_bucket
                row["ctl_cpu_per_s"] = round(res.policy_wall_s / (period * steps), 4)
                row["ctl_cpu_per_s_at_peak"] = round(by[ib] / period if ib < len(by) else 0.0, 4)
                # the largest step served with attainment >= 0.99: the controller's cost
                # of carrying the load the cluster can serve
                served = [i for i, b in enumerate(tl) if b["attainment"] >= 0.99 and i < len(by)]
                js = max(served, key=lambda i: tl[i]["offered_rps"]) if served else ib
                row["served_rps"] = tl[js]["goodput_rps"]
                row["ctl_cpu_per_s_at_served"] = round(by[js] / period, 4)
                row["ctl_us_per_request"] = round(1e6 * res.policy_wall_s / max(1, n), 2)
                row["ctl_cpu_per_s_max_step"] = round(max(by[:steps], default=0.0) / period, 4)
            rows.append(row)
            del res
    common.write_tsv(args.out / f"{NAME}.tsv", rows)
    rate = "requests_per_wall_s" if args.live else "sim_requests_per_wall_s"
    ctl = min(r[rate] for r in rows)
    # (live: the whole run's figure, the only one measured)
    at_served = "ctl_cpu_per_s" if args.live else "ctl_cpu_per_s_at_served"
    over_one = [r["workers"] for r in rows if r[at_served] > 1.0]
    bottleneck = over_one[0] if over_one else None
    common.write_json(args.out / f"{NAME}.json", {
        # (the slowest whole run, requests per wall second: the simulator's rate, or live
        # the cluster's, not the controller's; the simulated controller's cost is
        # ctl_us_per_request per row)
        "scale": args.scale, "live": args.live, "rows": rows, f"{rate}_min": ctl,
        "period_s": period, "steps": steps, "instances": sum(BASE_COPIES) * mult,
        "first_N_controller_over_one_core": bottleneck, "wall_s": round(t.wall_s, 1)})

    fig, ax = common.figure(1, 2, size=(4.2, 3.2))
    ws = [r["workers"] for r in rows]
    ax[0][0].plot(ws, [r["peak_goodput_rps"] for r in rows], marker="o")
    ax[0][0].set(xlabel="emulated workers (1 GPU each)", ylabel="peak goodput (r/s)",
                 title=f"Azure ramp ({args.scale})")
    if args.live:
        ax[0][1].plot(ws, [r["ctl_cpu_per_s"] for r in rows], marker="o",
                      label="controller process, run mean")
    else:
        ax[0][1].plot(ws, [r["ctl_cpu_per_s_at_served"] for r in rows], marker="o",
                      label="controller, largest load served >= 99 %")
        ax[0][1].plot(ws, [r["ctl_cpu_per_s_at_peak"] for r in rows], marker="x", ls="--",
                      label="controller, peak-goodput step")
        ax[0][1].plot(ws, [r["wall_per_sim_s"] for r in rows], marker=".", ls=":",
                      label="whole simulator, run mean")
    ax[0][1].axhline(1.0, color="grey", ls="--", lw=0.5)
    ax[0][1].set(xlabel="emulated workers", ylabel="CPU s per second",
                 title="controller cost (> 1: needs > 1 core)")
    ax[0][1].legend(loc="upper left", fontsize="small")
    common.save(fig, args.out / f"{NAME}.png")

    grow = [b["peak_goodput_rps"] / a["peak_goodput_rps"] for a, b in zip(rows, rows[1:], strict=False)]
    line = common.compare(
        f"Fig. 11 peak goodput vs workers ({args.scale})", PAPER,
        ", ".join(f"N={r['workers']}: {r['peak_goodput_rps']:,.0f} r/s "
                  f"({r['peak_per_worker_rps']:,.0f}/worker; "
                  + (_live_cost(r) if args.live else
                     f"controller {r['ctl_cpu_per_s_at_served']:.2f} CPU s per s serving "
                     f"{r['served_rps']:,.0f} r/s at >= 99 %, "
                     f"{r['ctl_cpu_per_s_at_peak']:.2f} at the peak)")
                  for r in rows)
        + f"; growth per step x{', x'.join(f'{g:.2f}' for g in grow)}; "
        + (f"the controller needs > 1 core from N = {bottleneck}" if bottleneck else
           "the controller stays under one core at every N run"))
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "rows": rows}


if __name__ == "__main__":
    common.script(main)
