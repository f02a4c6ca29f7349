"""A ``[faults]`` scenario in the simulator and on a live local cluster, second by second.

Runs the scenario twice in the simulator (the two runs must be byte-identical: summary
and request log) and once live (``clockwork serve SCENARIO --replay``: worker processes
really killed, restarted, stopped and resumed), then prints the per-second goodput and
SLO attainment of both side by side, and how far apart they are: per second (mean
absolute difference, relative to the mean goodput) and per phase of the fault plan.

    python experiments/faults_timeline.py                       # scenarios/faults.toml
    python experiments/faults_timeline.py --live-dir runs/x     # reuse a live run
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.cluster.cli import argtypes  # noqa: E402
from clockwork.resources import resolve_scenario  # noqa: E402
from clockwork.scenario import ScenarioError, load_scenario  # noqa: E402
from clockwork.telemetry import timeline  # noqa: E402
from experiments import common  # noqa: E402


def _cli(*args: str) -> None:
    """A clockwork command, run to its end; stopped (SIGTERM: it stops as on Ctrl-C) when
    this script is (a live cluster was left running when only this script was told to
    stop); one that fails ends this script with one line, exit 1."""
    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", *args],
                         stdout=subprocess.DEVNULL)
    try:
        rc = p.wait()
    except BaseException:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
        raise
    if rc:
        raise SystemExit(f"{Path(sys.argv[0]).name}: clockwork {args[0]} failed (exit {rc})")


def _digest(run: Path) -> str:
    h = hashlib.sha256()
    for name in ("summary.json", "requests.tsv", "actions.tsv"):
        text = (run / name).read_bytes()
        if name == "summary.json":  # wall time is the only thing allowed to differ
            text = b"\n".join(x for x in text.splitlines() if b"wall" not in x)
        h.update(text)
    return h.hexdigest()


def phases(sc) -> list[tuple[str, float, float]]:
    """The scenario's time split at every fault boundary."""
    cuts = {0.0, sc.duration_s}
    for f in sc.faults.get("kill", ()):
        cuts.add(float(f["at_s"]))
        if f.get("back_s") is not None:
            cuts.add(float(f["back_s"]))
    for f in sc.faults.get("hang", ()):
        cuts |= {float(f["at_s"]), float(f["at_s"]) + float(f["for_s"])}
    cuts = sorted(c for c in cuts if 0 <= c <= sc.duration_s)
    return [(f"{a:g}-{b:g} s", a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="faults",
                    help="a scenario with [faults]: a shipped name or a .toml (default faults)")
    ap.add_argument("--out", type=argtypes.out_dir, default=None,
                    help="keep the runs here (default: a temporary folder, removed at the "
                    "end)")
    ap.add_argument("--live-dir", default=None, help="use this live run instead of a new one")
    a = ap.parse_args()
    try:
        path = resolve_scenario(a.scenario)
        sc = load_scenario(str(path))
    except ScenarioError as e:
        ap.error(str(e))
    if a.live_dir and not (Path(a.live_dir) / "summary.json").is_file():
        ap.error(f"--live-dir {a.live_dir}: no run there (no summary.json)")
    if a.live_dir:  # (a run stopped early covers part of the plan: its seconds ran out)
        import json

        stopped = json.loads((Path(a.live_dir) / "summary.json").read_bytes()).get("stopped")
        if stopped:
            ap.error(f"--live-dir {a.live_dir}: a run stopped early ({stopped}), not the "
                     "whole scenario")
    if a.out is None:
        with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
            return _compare(a, path, sc, Path(tmp), kept=False)
    return _compare(a, path, sc, Path(a.out), kept=True)


def _compare(a, path: Path, sc, out: Path, kept: bool) -> int:
    """The two simulated runs and the live one (in ``out``), compared second by second
    and phase by phase; 0 when the simulated runs are byte-identical."""
    s1, s2 = out / "sim1", out / "sim2"
    for d in (s1, s2):
        _cli("simulate", str(path), "--out", str(d), "--quiet")
    same = _digest(s1) == _digest(s2)
    print(f"simulator, two runs: {'byte-identical' if same else 'DIFFERENT'} "
          f"(summary without wall time, requests.tsv, actions.tsv)")
    live = Path(a.live_dir) if a.live_dir else out / "live"
    if not a.live_dir:
        _cli("serve", str(path), "--replay", "--out", str(live), "--quiet")
    ts = timeline(s1, 1.0)
    tl = timeline(live, 1.0)
    n = int(sc.duration_s)
    gs = np.array([r["goodput_rps"] for r in ts[:n]] + [0.0] * (n - len(ts[:n])))
    gl = np.array([r["goodput_rps"] for r in tl[:n]] + [0.0] * (n - len(tl[:n])))
    ats = [r["slo_attainment"] for r in ts[:n]]
    atl = [r["slo_attainment"] for r in tl[:n]] + [0.0] * (n - len(tl[:n]))
    print(f"\n{'second':>6} {'sim goodput':>12} {'live goodput':>13} {'diff %':>7} "
          f"{'sim SLO %':>10} {'live SLO %':>11}")
    for i in range(n):
        d = 100 * (gl[i] - gs[i]) / gs[i] if gs[i] else 0.0
        print(f"{i:>6} {gs[i]:>12,.0f} {gl[i]:>13,.0f} {d:>+7.1f} {100 * ats[i]:>10.2f} "
              f"{100 * atl[i]:>11.2f}")
    mean = gs.mean()
    per_s = np.abs(gl - gs).mean() / mean
    print(f"\nper second: mean |live - sim| goodput = {np.abs(gl - gs).mean():,.1f} r/s "
          f"= {100 * per_s:.2f} % of the mean goodput ({mean:,.1f} r/s); "
          f"seconds off by more than 5 %: {int((np.abs(gl - gs) > 0.05 * gs).sum())} of {n}")
    print(f"\n{'phase':>12} {'sim goodput':>12} {'live goodput':>13} {'diff %':>7} "
          f"{'sim SLO %':>10} {'live SLO %':>11}")
    worst = 0.0
    for name, lo, hi in phases(sc):
        i, j = int(lo), int(hi)
        a_s, a_l = gs[i:j].mean(), gl[i:j].mean()
        met_s = sum(r["slo_attainment"] * r["requests"] for r in ts[i:j])
        met_l = sum(r["slo_attainment"] * r["requests"] for r in tl[i:j])
        req_s = sum(r["requests"] for r in ts[i:j]) or 1
        req_l = sum(r["requests"] for r in tl[i:j]) or 1
        d = 100 * (a_l - a_s) / a_s if a_s else 0.0
        worst = max(worst, abs(d))
        print(f"{name:>12} {a_s:>12,.1f} {a_l:>13,.1f} {d:>+7.2f} {100 * met_s / req_s:>10.2f} "
              f"{100 * met_l / req_l:>11.2f}")
    print(f"\nlargest phase difference in goodput: {worst:.2f} %"
          + (f"; runs in {out}" if kept else " (--out DIR keeps the runs)"))
    return 0 if same else 1


if __name__ == "__main__":
    common.script(main)
