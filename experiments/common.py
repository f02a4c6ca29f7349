"""Shared helpers for the Section 6 experiment scripts (``experiments/fig*.py``).

Every script has ``main(argv) -> dict`` and takes the same arguments:
``--quick`` (default: minutes of simulated time, seconds of wall time), ``--full`` (the
paper's scale; run by hand), ``--smoke`` (a second or two, for the test suite),
``--out DIR`` (default ``experiments/figures``, or ``experiments/figures/full`` with
``--full``) and ``--live`` (not yet supported: the scripts run in the simulator only).

Each writes ``<name>.tsv`` and/or ``<name>.json`` (data) and ``<name>.png`` (figure) into
the output directory and prints ``paper: ... / ours: ...`` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
FIGURES = Path(__file__).resolve().parent / "figures"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clockwork.sim import SimResult, simulate  # noqa: E402

POLICIES = ("clockwork", "clipper", "tfserving", "infaas")


class LiveNotSupported(SystemExit):
    pass


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="scale", action="store_const", const="quick",
                   help="small scale (default)")
    g.add_argument("--full", dest="scale", action="store_const", const="full",
                   help="the paper's scale (long; run by hand)")
    g.add_argument("--smoke", "--tiny", dest="scale", action="store_const", const="smoke",
                   help="a second or two of simulated time (tests)")
    p.add_argument("--out", type=Path, default=None, help="output directory")
    p.add_argument("--live", action="store_true",
                   help="run against the live system (not yet supported)")
    p.set_defaults(scale="quick")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.live:
        print("--live: not yet supported; the experiments run in the simulator only")
        raise LiveNotSupported(2)
    if args.out is None:
        args.out = FIGURES / "full" if args.scale == "full" else FIGURES
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def run(scenario: str | Path | dict, overrides: Sequence[str] = ()) -> SimResult:
    """Run a scenario (a name under ``scenarios/``, a path or a dict) in the simulator."""
    if isinstance(scenario, str) and not scenario.endswith(".toml"):
        scenario = SCENARIOS / f"{scenario}.toml"
    return simulate(scenario, list(overrides))


def requests(res: SimResult) -> dict[str, np.ndarray]:
    """The request log as columns (times in ns)."""
    rows = res.telemetry.requests
    n = len(rows)
    cols = {}
    for i, key, dt in ((1, "model", object), (2, "arrival", np.int64), (3, "deadline", np.int64),
                       (4, "latency", np.int64), (5, "status", np.int64), (6, "met", bool),
                       (7, "cold", bool), (8, "batch", np.int64)):
        cols[key] = np.fromiter((r[i] for r in rows), dtype=dt, count=n)
    cols["ok"] = cols["status"] == 0
    cols["slo"] = cols["deadline"] - cols["arrival"]
    return cols


def actions(res: SimResult) -> dict[str, np.ndarray]:
    rows = res.telemetry.actions
    n = len(rows)
    return {
        "type": np.array([r[1] for r in rows], dtype=object),
        "status": np.array([r[2] for r in rows], dtype=object),
        "model": np.array([r[5] for r in rows], dtype=object),
        "batch": np.fromiter((r[6] for r in rows), dtype=np.int64, count=n),
        "completion": np.fromiter((r[13] for r in rows), dtype=np.int64, count=n),
        "error": np.fromiter((r[14] for r in rows), dtype=np.int64, count=n),
    }


def timeline(res: SimResult, bucket_s: float) -> list[dict]:
    """Per-bucket figures: offered load, goodput, max latency of met requests, mean batch,
    cold-start requests, distinct cold models, LOADs, EVICTs."""
    r = requests(res)
    a = actions(res)
    w = int(bucket_s * 1e9)
    rb = r["arrival"] // w
    ab = a["completion"] // w
    n = int(max(rb.max(initial=-1), ab.max(initial=-1))) + 1
    out = []
    for i in range(n):
        s = rb == i
        k = int(s.sum())
        met = s & r["met"]
        inf = (ab == i) & (a["type"] == "INFER") & (a["status"] == "SUCCESS")
        cold = s & r["cold"]
        out.append({
            "t_s": round(i * bucket_s, 3),
            "offered_rps": round(k / bucket_s, 3),
            "goodput_rps": round(int(met.sum()) / bucket_s, 3),
            "attainment": round(int(met.sum()) / k, 6) if k else 1.0,
            "max_latency_met_ms": round(float(r["latency"][met].max()) / 1e6, 3) if met.any() else 0.0,
            "mean_batch": round(float(a["batch"][inf].mean()), 3) if inf.any() else 0.0,
            "cold_starts": int(cold.sum()),
            "cold_models": len(set(r["model"][cold])),
            "loads": int(((ab == i) & (a["type"] == "LOAD")).sum()),
            "evicts": int(((ab == i) & (a["type"] == "EVICT")).sum()),
        })
    return out


def cdf(values: np.ndarray, points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) at up to ``points`` quantiles (small enough for a data file)."""
    v = np.sort(np.asarray(values, dtype=float))
    if not len(v):
        return np.zeros(0), np.zeros(0)
    q = np.linspace(0, 1, min(points, len(v)))
    return np.quantile(v, q), q


def write_tsv(path: Path, rows: list[dict]) -> Path:
    with path.open("w") as f:
        if rows:
            keys = list(rows[0])
            f.write("\t".join(keys) + "\n")
            for r in rows:
                f.write("\t".join(str(r[k]) for k in keys) + "\n")
    return path


def read_tsv(path: Path) -> list[dict]:
    lines = Path(path).read_text().splitlines()
    keys = lines[0].split("\t")
    out = []
    for line in lines[1:]:
        row = {}
        for k, v in zip(keys, line.split("\t"), strict=True):
            try:
                row[k] = float(v)
            except ValueError:
                row[k] = v
        out.append(row)
    return out


def write_json(path: Path, data: dict) -> Path:
    def default(o):
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(type(o))

    path.write_text(json.dumps(data, indent=1, default=default) + "\n")
    return path


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 3.6)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows),
                             squeeze=False)
    return fig, axes


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def compare(what: str, paper: str, ours: str) -> str:
    line = f"{what}\n  paper: {paper}\n  ours:  {ours}"
    print(line)
    return line


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.perf_counter() - self.t0
