"""Paper Fig. 6 ("Can Clockwork serve thousands?"): latency, goodput and cold starts over
time while a 1000 r/s major workload spreads over one more active model copy per second.

1 GPU, 100 ms SLO (``scenarios/bursty_experiment.toml``): a minor copy at 200 r/s all
along; from ``major_start_s`` the major load is spread evenly over the active major
copies. ``--full``: 3601 copies, 15 min warm-up, 20 min in all (the paper runs 75 min);
``--quick``: 401 copies, 20 s warm-up, 5 min of activation (the cache fills after ~200).

    python experiments/fig6_thousands.py [--quick | --full | --smoke] [--live] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402

NAME = "fig6_thousands"
# (copies, major_start_s, duration_s, bucket_s)
SCALE = {"smoke": (11, 0.5, 2.0, 0.5), "quick": (401, 20.0, 320.0, 5.0),
         "full": (3601, 900.0, 1200.0, 10.0)}


def main(argv=None) -> dict:
    args = common.parse_args(argv, " ".join(__doc__.split("\n\n")[0].split()))
    copies, start, dur, bucket = SCALE[args.scale]
    with common.Timer() as t:
        res = common.run("bursty_experiment", [f"models.0.copies={copies}",
                                               f"workloads.0.major_start_s={start}",
                                               f"duration_s={dur}"], live=args.live)
    # (cut to the run: a request or action that ends at duration_s opens a bucket
    # after it, with no load offered)
    tl = common.timeline(res, bucket)[:int(round(dur / bucket))]
    for row in tl:
        row["active_major"] = max(0, min(copies - 1, int((row["t_s"] - start) // 1 + 1)))
    common.write_tsv(args.out / f"{NAME}.tsv", tl)
    s = res.summary
    r = common.requests(res)
    met_max = float(r["latency"][r["met"]].max()) / 1e6 if r["met"].any() else 0.0
    late = int((r["ok"] & ~r["met"]).sum())
    info = {"scale": args.scale, "copies": copies, "major_start_s": start, "duration_s": dur,
            "goodput_rps": s["goodput_rps"], "attainment": s["slo_attainment"],
            "max_latency_met_ms": met_max, "completed_late": late,
            "cold_starts": s["cold_starts"], "loads": s["actions"]["load"],
            "evicts": s["actions"]["evict"], "wall_s": round(t.wall_s, 2)}
    common.write_json(args.out / f"{NAME}.json", info)

    fig, ax = common.figure(3, 1, size=(7.0, 2.2))
    x = [row["t_s"] for row in tl]
    ax[0][0].plot(x, [row["max_latency_met_ms"] for row in tl], label="max latency (met)")
    ax[0][0].axhline(100, color="red", lw=0.5, ls="--", label="SLO")
    ax[0][0].set(ylabel="ms")
    ax[0][0].legend(loc="lower right")
    ax[1][0].plot(x, [row["offered_rps"] for row in tl], label="offered")
    ax[1][0].plot(x, [row["goodput_rps"] for row in tl], label="goodput")
    ax[1][0].set(ylabel="r/s")
    ax[1][0].legend(loc="lower left")
    ax[2][0].plot(x, [row["cold_starts"] / bucket for row in tl], label="cold-start requests/s")
    ax2 = ax[2][0].twinx()
    ax2.plot(x, [row["active_major"] for row in tl], color="grey", ls=":", label="active copies")
    ax2.set(ylabel="active copies")
    ax[2][0].set(xlabel="time (s)", ylabel="cold starts/s")
    ax[2][0].legend(loc="upper left")
    ax[0][0].set_title(f"1 GPU, minor 200 r/s + major 1000 r/s, {copies} copies ({args.scale})")
    common.save(fig, args.out / f"{NAME}.png")

    line = common.compare(
        f"Fig. 6 ({args.scale}, {copies} copies, {dur - start:g} s of activation)",
        "max latency never exceeded the 100 ms SLO; ~201 models fill GPU memory after ~3.5 min,"
        " then PCIe runs at 100 % swapping",
        f"max latency of met requests {met_max:.1f} ms, {late} completed late; goodput "
        f"{s['goodput_rps']:,.0f} r/s, attainment {s['slo_attainment']:.3f}, "
        f"{s['cold_starts']:,} cold-start requests, {s['actions']['load']:,} LOADs")
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "info": info,
            "timeline": tl}


if __name__ == "__main__":
    common.script(main)
