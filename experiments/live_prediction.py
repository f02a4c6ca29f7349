"""How well a profile measured by ``clockwork profile`` predicts live EXEC and LOAD
durations on a live cluster of cpu workers.

Run a scenario on a live cluster of cpu workers (TVM-compiled zoo
models really executing on this host, more instances than the weights cache holds), then
read the controller's action log and compare every successful action's measured duration
(the time it held its lane on the worker: the device's work and the hand-over to the
device's thread and back, which a profile, measured on the device alone, leaves out)
with

* the **profile**'s figure for it (``profiles/cpu/<model>.json``: EXEC at that batch size,
  LOAD), and
* the scheduler's **online** estimate at send time (the ``expected_duration`` column:
  Clockwork's rolling p99 of recent measurements, seeded by the profile);

and the completion-time error (measured end - predicted end, which adds waiting). Writes
``live_prediction.json`` (percentiles per model and overall, CDF points) and
``live_prediction.png`` (CDFs) to ``--out`` and prints a table.

    python experiments/live_prediction.py [--duration S] [--rate R] [--scenario NAME] [--out DIR]

Needs TVM (``pip install -e .[tvm]``); missing packages are compiled first (``packages/cpu``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from experiments import common  # noqa: E402

NAME = "live_prediction"
PCTS = (1, 50, 90, 99, 99.9)


def _stats(err_ns: np.ndarray, base_ns: np.ndarray) -> dict:
    """Percentiles of the signed error (ms), of |error| (ms) and of |error| / prediction."""
    if not len(err_ns):
        return {"n": 0}
    e = err_ns / 1e6
    rel = np.abs(err_ns) / np.maximum(base_ns, 1)
    out = {"n": int(len(e))}
    out.update({f"p{p:g}_ms": round(float(np.percentile(e, p)), 4) for p in PCTS})
    out["abs_p50_ms"] = round(float(np.percentile(np.abs(e), 50)), 4)
    out["abs_p99_ms"] = round(float(np.percentile(np.abs(e), 99)), 4)
    out["abs_max_ms"] = round(float(np.abs(e).max()), 4)
    out["rel_p50"] = round(float(np.percentile(rel, 50)), 4)
    out["rel_p99"] = round(float(np.percentile(rel, 99)), 4)
    return out


def columns(rows: list[tuple]) -> dict[str, np.ndarray]:
    """The action log's rows (``clockwork.telemetry.ACTION_COLUMNS`` order) as columns."""
    from clockwork.telemetry import ACTION_COLUMNS

    cols = list(zip(*rows, strict=True)) if rows else [() for _ in ACTION_COLUMNS]
    out = {}
    for name, col in zip(ACTION_COLUMNS, cols, strict=True):
        out[name] = np.array(col, dtype=object if name in ("type", "status", "model")
                             else np.int64)
    return out


def analyse(actions: dict[str, np.ndarray], profiles) -> dict:
    """``actions``: columns of the action log; ``profiles``: model -> ModelProfile."""
    ok = actions["status"] == "SUCCESS"
    out: dict = {}
    for kind in ("INFER", "LOAD"):
        sel = ok & (actions["type"] == kind)
        models = [str(m).split(":")[0] for m in actions["model"][sel]]
        batch = actions["batch_size"][sel]
        measured = actions["measured_duration"][sel].astype(np.int64)
        online = actions["expected_duration"][sel].astype(np.int64)
        if kind == "INFER":
            prof = np.array([profiles[m].exec_ns[int(b)] for m, b in zip(models, batch,
                                                                          strict=True)],
                            dtype=np.int64)
        else:
            prof = np.array([profiles[m].load_ns for m in models], dtype=np.int64)
        done = actions["prediction_error"][sel].astype(np.int64)
        per_model = {}
        for m in sorted(set(models)):
            k = np.array([x == m for x in models])
            per_model[m] = {"profile": _stats(measured[k] - prof[k], prof[k]),
                            "online": _stats(measured[k] - online[k], online[k])}
        out[kind] = {"profile": _stats(measured - prof, prof),
                     "online": _stats(measured - online, online),
                     "completion": _stats(done, online),
                     "per_model": per_model,
                     "cdf_profile_ms": [list(map(float, c)) for c in
                                        common.cdf((measured - prof) / 1e6)],
                     "cdf_online_ms": [list(map(float, c)) for c in
                                       common.cdf((measured - online) / 1e6)]}
    return out


def _plot(res: dict, path: Path) -> None:
    fig, axes = common.figure(1, 2)
    for ax, kind in zip(axes[0], ("INFER", "LOAD"), strict=True):
        for key, label in (("cdf_profile_ms", "vs profile"), ("cdf_online_ms", "vs online estimate")):
            x, q = res[kind][key]
            ax.plot(x, q, label=label)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel(f"{'EXEC' if kind == 'INFER' else 'LOAD'} measured - predicted (ms)")
        ax.set_ylabel("CDF")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.legend()
    common.save(fig, path)


def main(argv=None) -> dict:
    from clockwork.cluster.cli import argtypes

    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--scenario", default="cpu_live", help="scenario (default cpu_live)")
    p.add_argument("--duration", type=argtypes.positive_float, default=30.0,
                   help="seconds (> 0, default 30)")
    p.add_argument("--rate", type=argtypes.positive_float, default=None,
                   help="override the Poisson rate (r/s, > 0)")
    p.add_argument("--packages", type=lambda v: Path(argtypes.out_dir(v)), default=None,
                   help="folder of compiled model packages (default: the scenario's, else "
                        "packages/DEVICE); missing ones are compiled there first")
    p.add_argument("--out", type=common.out_dir, default=common.FIGURES / NAME,
                   help=f"output directory (default experiments/figures/{NAME}/: the figures "
                        "kept in the repository, overwritten)")
    args = p.parse_args(argv)
    over = [f"duration_s={args.duration}"]
    if args.rate is not None:
        over.append(f"workloads.0.rate_rps={args.rate}")
    if args.packages:
        over.append(f"cluster.packages={args.packages}")
    sc = common.scenario(args.scenario, over)
    if sc.cluster.get("device", "emulated") == "emulated":
        p.error(f"scenario {args.scenario!r} uses emulated workers; this measures real ones")
    from clockwork.profiles import load_profile_set
    from clockwork.resources import scenario_folder

    # (the scenario itself, not its data: a set or trace beside its file is found there)
    pset = load_profile_set(str(sc.cluster["profiles"]), scenario_folder(sc))
    args.out.mkdir(parents=True, exist_ok=True)  # (after the checks: nothing made before)
    with common.Timer() as t:
        res = common.run_live(sc)
    out = analyse(columns(res.telemetry.actions), pset.profiles)
    out["run"] = {"scenario": args.scenario, "duration_s": args.duration,
                  "summary": {k: res.summary[k] for k in ("submitted", "slo_attainment",
                                                          "goodput_rps", "cold_starts",
                                                          "actions")},
                  "wall_s": round(t.wall_s, 1)}
    common.write_json(args.out / f"{NAME}.json", out)
    _plot(out, args.out / f"{NAME}.png")
    s = res.summary
    print(f"{args.scenario}: {s['submitted']:,} requests, attainment {s['slo_attainment']:.4f}, "
          f"actions {s['actions']}")
    print(f"{'':8} {'vs':8} {'n':>6} {'p1':>8} {'p50':>8} {'p99':>8} {'p99.9':>8} "
          f"{'|p99|':>8} {'rel p50':>8} {'rel p99':>8}  (ms; rel: |error| / prediction)")
    for kind in ("INFER", "LOAD"):
        for vs in ("profile", "online", "completion"):
            st = out[kind][vs]
            if not st["n"]:
                continue
            print(f"{kind:8} {vs:8} {st['n']:>6} {st['p1_ms']:>8.3f} {st['p50_ms']:>8.3f} "
                  f"{st['p99_ms']:>8.3f} {st['p99.9_ms']:>8.3f} {st['abs_p99_ms']:>8.3f} "
                  f"{st['rel_p50']:>8.3f} {st['rel_p99']:>8.3f}")
    return out


if __name__ == "__main__":
    common.script(main)
