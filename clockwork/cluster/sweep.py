"""``clockwork sweep``: a grid of simulations declared in a TOML file, run in parallel,
resumable, gathered into one table.

A sweep file::

    name = "rate-vs-slo"                  # optional title
    scenarios = ["poisson_warm", "bursty"]  # shipped names or paths (relative to this file
                                          # first, then to the current folder)
    seeds = [1, 2]                        # optional: each point once per seed (--set seed=S);
                                          # without it, the scenario's own seed
    overrides = ["duration_s=20"]         # optional: --set overrides applied to every point
    out = "sweeps/rate-vs-slo"            # optional: the output folder (relative to the
                                          # current folder; --out wins; default sweeps/<stem>)
    logs = false                          # optional: keep each point's requests.tsv and
                                          # actions.tsv (they can be large)

    [grid]                                # key -> values; every combination is a point
    "workloads.0.slo_ms" = [25, 50, 100]  # a dotted key is quoted, or written as a table:
    cluster.workers = [1, 2]              # this is [grid.cluster] workers = [1, 2]

The points are scenarios x grid combinations x seeds, in that order (the first grid key
varies slowest). Each is ``clockwork simulate SCENARIO --set K=V ...`` with the fixed
overrides first, then the grid's, then the seed: its ``summary.json`` is byte for byte
the one that command writes. Points run as parallel tasks (``clockwork.cluster.parallel``);
each writes ``OUT/points/<name>/`` (``point.json``: what it is and the command that runs
it alone; ``run.json``; ``summary.json`` last), and a point whose ``summary.json`` exists
and whose files are as it ran on (``clockwork.cluster.parallel.done_summary``; with
``logs = true``, whose logs are there too) is not run again. ``OUT/results.tsv`` and
``OUT/results.json`` hold one row per point in the order above; ``--plot`` draws SLO
attainment and goodput against the first grid key into ``OUT/sweep.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import annotated_types as at

from clockwork.cluster.parallel import (
    BackendUnavailable,
    FolderBusy,
    Outcome,
    Point,
    Runner,
    check_parts,
    default_jobs,
    done_summary,
    label_value,
    locked,
    point_digests,
    point_folder,
    toml_value,
)
from clockwork.resources import (
    SWEEPS,
    not_a_file,
    shipped_name,
    shipped_sweep_names,
    sweeps_root,
)
from clockwork.settings import Settings, setting, validate
from clockwork.signals import term_as_ctrl_c
from clockwork.sizes import MAX_POINTS, MAX_SEED


class SweepError(ValueError):
    """A bad sweep file; the message is one line."""


class SweepFile(Settings):
    """A sweep file (top level)."""

    settings_name: ClassVar[str] = "sweep"

    name: str | None = setting(None, "Title shown in reports (default: the file's name).")
    description: str | None = setting(None, "Free text.")
    scenarios: list[Annotated[str, at.MinLen(1)]] = setting(
        description="Scenarios: shipped names or TOML paths.", min_length=1,
        expected="an array of at least one scenario name or path")
    seeds: list[Annotated[int, at.Ge(0), at.Le(MAX_SEED)]] | None = setting(
        None, "Seeds: every point runs once per seed (`--set seed=S`).", min_length=1,
        expected="an array of at least one integer in [0, 2^63 - 1]")
    overrides: list[Annotated[str, at.MinLen(1)]] = setting(
        default_factory=list, description="`--set` overrides (`key=value`) for every point.",
        expected="an array of key=value strings")
    grid: dict[str, Annotated[list[Any], at.MinLen(1)]] = setting(
        default_factory=dict, description="Scenario key -> values; every combination of "
        "values is a point.", expected="a table of key = [values]")
    out: str | None = setting(None, "Output folder.", min_length=1)
    logs: bool = setting(False, "Keep every point's requests.tsv and actions.tsv.")


@dataclass
class Sweep:
    """A sweep file, read and checked: its points in order."""

    path: Path
    name: str
    spec: SweepFile
    grid: dict[str, list[Any]]
    points: list[Point]
    grid_of: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed_of: dict[str, int | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # each once, said before it runs

    @property
    def keys(self) -> list[str]:
        return list(self.grid)


def resolve_sweep(name_or_path: str) -> Path:
    """An existing file, else a shipped sweep by name (``clockwork/data/sweeps``): ``x``,
    ``x.toml`` or ``sweeps/x.toml``. Raises ``SweepError`` naming the closest shipped
    sweeps."""
    import difflib

    p = Path(name_or_path)
    if p.is_file():
        return p
    name = shipped_name(p, SWEEPS)
    if name:
        shipped = sweeps_root() / f"{name}.toml"
        if shipped.is_file():
            return shipped
    names = shipped_sweep_names()
    stem = p.name[:-5] if p.name.endswith(".toml") else p.name
    close = difflib.get_close_matches(name or stem, names, n=3, cutoff=0.5)
    hint = (f"closest shipped sweeps: {', '.join(close)}" if close else
            f"shipped sweeps: {', '.join(names) or '(none)'}")
    raise SweepError(not_a_file("sweep", name_or_path)
                     + (f" and no shipped sweep {name!r}" if name else "") + f"; {hint}")


def _flatten(grid: Any, prefix: str = "") -> Any:
    """``[grid.cluster] workers = [...]`` -> ``{"cluster.workers": [...]}``. A key given
    in both forms (``"cluster.workers" = [...]`` and ``[grid.cluster] workers = [...]``)
    is a ``SweepError`` (one would have hidden the other)."""
    if not isinstance(grid, dict):
        return grid
    out: dict[str, Any] = {}
    for k, v in grid.items():
        key = f"{prefix}{k}"
        for kk, vv in (_flatten(v, f"{key}.") if isinstance(v, dict) else {key: v}).items():
            if kk in out:
                raise SweepError(f"grid.{kk}: listed twice (as \"{kk}\" and in a [grid.*] "
                                 "table; give it in one place)")
            out[kk] = vv
    return out


def _scenario_path(entry: str, base: Path, where: str) -> Path:
    from clockwork.resources import resolve_scenario
    from clockwork.scenario import ScenarioError

    p = Path(entry)
    if not p.is_absolute():
        # next to the sweep file first: the file named, or a scenario's name there (a
        # shipped scenario copied next to it and edited, as the shipped example invites:
        # the shipped one was run instead)
        for near in [base / p] + ([] if p.suffix == ".toml" else [base / f"{entry}.toml"]):
            if near.is_file():
                return near
    try:
        return resolve_scenario(entry)
    except ScenarioError as e:
        raise SweepError(f"{where}: scenarios: {e}") from None


def _same_as(v: Any) -> Any:
    """A hashable stand-in for a grid value, equal for two values that are ``==`` and
    both booleans or neither (1 and 1.0 are one point, true and 1 are not), so that
    duplicates are found with one set lookup each (comparing each value with every
    other took minutes for 50,000 values)."""
    def plain(x: Any) -> Any:  # (== as the value's: a tuple, a frozenset of items)
        if isinstance(x, list):
            return tuple(plain(y) for y in x)
        if isinstance(x, dict):
            return frozenset((k, plain(y)) for k, y in x.items())
        return x

    return isinstance(v, bool), plain(v)


def _key_parts(key: str) -> tuple:
    """A dotted key as the setting it names: list indexes as numbers (``workloads.00``
    is ``workloads.0``)."""
    return tuple(int(p) if p.isascii() and p.isdigit() and len(p) <= 18 else p
                 for p in key.strip().split("."))  # (5,000 digits: int() refuses them)


def _check_scheduler(table, grid_keys: list[str]) -> str | None:
    """A point's ``[scheduler]`` table as the policy will check it (an unknown policy,
    key or value: ``SettingsError``), before anything runs: a misspelt key in the grid
    passed ``--list`` and then failed every point. Returns the warning ``clockwork
    simulate`` gives for settings the policy takes but does not use (None if none),
    saying so of the grid keys among them: their values give the same rows."""
    from controller import split_settings, table_policy, unused_line, unused_settings

    name, rest = table_policy(table)
    split_settings(name, rest)
    line = unused_line(name, rest)
    if line is None:
        return None
    unused = {("scheduler", k) for k in unused_settings(name, rest)}
    varied = [f"grid.{k}" for k in grid_keys if _key_parts(k) in unused]
    if varied:
        one = len(varied) == 1
        line += (f"; with policy {name!r}, {' and '.join(varied)} give{'s' if one else ''} "
                 f"the same rows whatever {'its value' if one else 'their values'}")
    return line


def _check_overlaps(grid_keys: list[str], fixed_keys: list[str], bad) -> None:
    """A grid key or override that names the same setting as another grid key or
    override, or a table holding it (``cluster`` and ``cluster.workers``), is refused:
    one of them silently won, and rows showed values that were not simulated."""
    named = [(f"grid.{k}", _key_parts(k)) for k in grid_keys]
    named += [(f"overrides' {k}", _key_parts(k)) for k in fixed_keys]
    for i, (a, pa) in enumerate(named):
        for b, pb in named[i + 1:]:
            n = min(len(pa), len(pb))
            if pa[:n] == pb[:n]:
                if len(pa) == len(pb):
                    how = "set the same setting"
                else:
                    outer, inner = (a, b) if len(pa) < len(pb) else (b, a)
                    how = f"overlap ({outer.split(' ')[-1].removeprefix('grid.')} is a " \
                          f"table holding {inner.split(' ')[-1].removeprefix('grid.')})"
                raise bad(f"{a} and {b} {how}: give each setting in one place")


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file: the schema, then every point's scenario with its
    overrides (as ``clockwork simulate`` would load it). Raises ``SweepError``."""
    from clockwork.scenario import ScenarioError, load_scenario, parse_toml, parse_value

    path = resolve_sweep(str(path))
    where = str(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SweepError(f"{where}: cannot read it ({e.strerror or e})") from None
    raw = parse_toml(text, where, SweepError)
    if isinstance(raw.get("grid"), dict):
        try:
            raw["grid"] = _flatten(raw["grid"])
        except SweepError as e:
            raise SweepError(f"{where}: {e}") from None
    spec = validate(SweepFile, raw, where=where, error=SweepError)

    def bad(line: str) -> SweepError:
        return SweepError(f"{where}: {line}")

    for i, o in enumerate(spec.overrides):
        k, eq, _ = o.partition("=")
        if not eq or not k.strip():
            raise bad(f"overrides.{i}: expected key=value, got {o!r}")
    fixed_keys = {o.partition("=")[0].strip() for o in spec.overrides}
    sizes = [len(spec.scenarios), *(len(v) for v in spec.grid.values()),
             len(spec.seeds or [None])]
    n = math.prod(sizes)
    if n > MAX_POINTS:  # (counted: itertools.product of 10^10 ran out of memory)
        what = " x ".join([f"{len(spec.scenarios):,} scenario"
                           + ("s" if len(spec.scenarios) != 1 else ""),
                           *(f"{len(v):,}" for v in spec.grid.values())]
                          + ([f"{len(spec.seeds):,} seeds"] if spec.seeds else []))
        raise bad(f"{n:,} points ({what}): a sweep runs at most {MAX_POINTS:,}; split it "
                  "into several sweeps")
    grid: dict[str, list[Any]] = {}
    for key, values in spec.grid.items():
        if not all(key.split(".")):
            raise bad(f"grid: key {key!r} has an empty part")
        if _key_parts(key) == ("seed",):  # (" seed" too: the scenario's seed was run)
            raise bad(f"grid.{key}: give the seeds as seeds = [...]")
        if key in fixed_keys:
            raise bad(f"grid.{key}: also set in overrides (give it in one place)")
        seen: set = set()
        for v in values:
            try:
                t = toml_value(v)
            except ValueError:
                raise bad(f"grid.{key}: values must be numbers, booleans, strings, arrays or "
                          f"tables, got {v!r}") from None
            if parse_value(t) != v:
                raise bad(f"grid.{key}: value {v!r} does not survive --set (write it "
                          "differently)")
            same = _same_as(v)  # (1 and 1.0 too: the same simulation)
            if same in seen:
                raise bad(f"grid.{key}: value {t} is listed twice")
            seen.add(same)
        grid[key] = list(values)
    _check_overlaps(list(grid), [o.partition("=")[0].strip() for o in spec.overrides], bad)
    if spec.seeds is not None and len(set(spec.seeds)) != len(spec.seeds):
        raise bad("seeds: a seed is listed twice")
    if "seed" in fixed_keys and spec.seeds is not None:
        raise bad("overrides: seed is set there and by seeds = [...] (give it in one place)")
    base = path.parent
    paths = [_scenario_path(e, base, where) for e in spec.scenarios]
    found = {str(Path(p).resolve()) for p in paths}
    if len(set(spec.scenarios)) != len(spec.scenarios) or len(found) != len(paths):
        raise bad("scenarios: a scenario is listed twice (by name or by path)")

    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys)))
    points: list[Point] = []
    sweep = Sweep(path, spec.name or path.stem, spec, grid, points)
    checked: set[tuple] = set()  # (scenario, grid key, value) built into a simulation
    for entry, scen in zip(spec.scenarios, paths, strict=True):
        for combo in combos:
            sets = [*spec.overrides, *(f"{k}={toml_value(v)}" for k, v in zip(keys, combo,
                                                                             strict=True))]
            try:
                sc = load_scenario(scen, sets)
                # (the table is checked by the policy; a setting it ignores is said once)
                unused = _check_scheduler(sc.scheduler, keys)
                # what only the simulator checks -- workloads, faults, profiles, events --
                # as clockwork simulate does before it runs (building it runs nothing),
                # with the first point of each scenario and grid value: values wrong only
                # together are the point's error row (one build a point took a minute
                # for 500 points of an Azure grid)
                seen = {(entry,), *((entry, k, sets[len(spec.overrides) + i])
                                    for i, k in enumerate(keys))}
                if not seen <= checked:
                    _simulatable(sc)
                    checked |= seen
            except (ScenarioError, ValueError, OSError) as e:
                what = " ".join(f"{k}={label_value(v)}" for k, v in zip(keys, combo,
                                                                       strict=True))
                raise bad(f"scenario {entry}" + (f" with {what}" if what else "")
                          + f": {e}") from None
            if unused is not None and unused not in sweep.warnings:
                sweep.warnings.append(unused)
            labels = tuple(zip(keys, combo, strict=True))
            for seed in spec.seeds if spec.seeds is not None else [None]:
                p = Point(entry, str(scen), tuple(sets + ([f"seed={seed}"] if seed is not None
                                                          else [])),
                          labels + ((("seed", seed),) if seed is not None else ()))
                points.append(p)
                sweep.grid_of[p.name] = dict(zip(keys, combo, strict=True))
                sweep.seed_of[p.name] = seed if seed is not None else sc.seed
    return sweep


def _simulatable(sc) -> None:
    """Raise what ``clockwork simulate`` would refuse ``sc`` for before running it (its
    workloads, faults, profiles and events are checked as the simulation is built; its
    warnings are said by the point's own run)."""
    import warnings

    from clockwork.cluster.sim import Simulation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Simulation(sc)


# ----------------------------------------------------------------------------- results


FIGURES = (  # column, path in summary.json
    ("submitted", ("submitted",)),
    ("succeeded", ("succeeded",)),
    ("slo_met", ("slo_met",)),
    ("dropped", ("dropped",)),
    ("failed", ("failed",)),
    ("goodput_rps", ("goodput_rps",)),
    ("throughput_rps", ("throughput_rps",)),
    ("slo_attainment", ("slo_attainment",)),
    ("p50_ms", ("latency_ms", "p50")),
    ("p99_ms", ("latency_ms", "p99")),
    ("p999_ms", ("latency_ms", "p999")),
    ("max_ms", ("latency_ms", "max")),
    ("cold_starts", ("cold_starts",)),
    ("loads", ("actions", "load")),
    ("evicts", ("actions", "evict")),
    ("gpus", ("gpus",)),
)


LATENCY = ("p50_ms", "p99_ms", "p999_ms", "max_ms")  # None where no request succeeded
# None at a point that submitted no requests (and LATENCY): "n/a" in the table, and no
# point of the plot's attainment line
UNDEFINED = (*LATENCY, "slo_attainment")


def figure(summary: dict, path: tuple[str, ...]) -> Any:
    v: Any = summary
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v


def rows(sweep: Sweep, outcomes: list[Outcome]) -> list[dict]:
    """One row per point, in the sweep's order: what it is and its main figures."""
    out = []
    for o in outcomes:
        p = o.point
        s = o.summary or {}
        seed = s.get("seed", sweep.seed_of.get(p.name))
        row: dict[str, Any] = {
            "point": p.name,
            "scenario": p.scenario,
            "seed": seed,
            "overrides": [x for x in p.overrides if not x.startswith("seed=")],
            **{k: v for k, v in sweep.grid_of.get(p.name, {}).items()},
            "status": "ok" if o.ok else "error",
        }
        for col, path in FIGURES:
            row[col] = figure(s, path) if o.ok else None
        if o.ok and s.get("succeeded") == 0:  # no latency: the summary's 0.0 is not one
            for col in LATENCY:
                row[col] = None
        if o.ok and s.get("submitted") == 0:  # no attainment either (0 of 0: "n/a")
            row["slo_attainment"] = None
        row["error"] = o.error or ""
        out.append(row)
    return out


def _cell(v: Any, words: bool = False) -> str:
    """A table's cell: None empty, a string as it is, ``words`` (the overrides column's
    list of strings) joined by spaces, any other value as TOML writes it (an empty list
    ``[]``)."""
    if v is None:
        return ""
    if words and isinstance(v, list):
        text = " ".join(v)
    elif isinstance(v, str):
        text = v
    else:
        text = label_value(v)
    return text.replace("\t", " ").replace("\n", " ")


def write_results(out: Path, sweep: Sweep, outcomes: list[Outcome],
                  table: list[dict] | None = None) -> list[dict]:
    """``results.tsv`` and ``results.json`` in ``out`` (``table``: the rows, made here if
    not given), each written whole or not at all (an ``OSError`` names the file);
    returns the rows."""
    from clockwork.telemetry import write_atomic

    if table is None:
        table = rows(sweep, outcomes)
    cols = list(table[0]) if table else []
    lines = ["\t".join(cols)]
    lines += ["\t".join(_cell(r[c], c == "overrides") for c in cols) for r in table]
    write_atomic(out / "results.tsv", ("\n".join(lines) + "\n").encode())
    doc = {
        "sweep": sweep.name,
        "file": str(sweep.path),
        "scenarios": sweep.spec.scenarios,
        "seeds": sweep.spec.seeds,
        "overrides": sweep.spec.overrides,
        "grid": sweep.grid,
        "points": [{**r, "summary": o.summary} for r, o in zip(table, outcomes, strict=True)],
    }
    write_atomic(out / "results.json", doc)
    return table


def format_rows(sweep: Sweep, table: list[dict]) -> str:
    """The results as an aligned text table (the main columns)."""
    cols = ["scenario", *sweep.keys, "seed", "submitted", "goodput_rps", "slo_attainment",
            "p99_ms", "cold_starts", "status"]
    head = {"goodput_rps": "goodput r/s", "slo_attainment": "attainment", "p99_ms": "p99 ms",
            "cold_starts": "cold"}

    def fmt(c: str, v: Any, ok: bool) -> str:
        if v is None:
            return "n/a" if ok and c in UNDEFINED else "-"
        if c == "slo_attainment":
            return f"{v:.6f}"
        if c in ("goodput_rps", "p99_ms"):
            return f"{v:,.1f}" if c == "goodput_rps" else f"{v:.2f}"
        if isinstance(v, int) and not isinstance(v, bool) and c not in sweep.keys:
            return f"{v:,}"
        return _cell(v)

    cells = [[head.get(c, c) for c in cols]]
    cells += [[fmt(c, r.get(c), r["status"] == "ok") for c in cols] for r in table]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def plot(out: Path, sweep: Sweep, table: list[dict]) -> Path:
    """SLO attainment and goodput against the first grid key: one line per scenario and
    combination of the other keys, the mean over seeds with their min..max as bars."""
    import os

    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, others = sweep.keys[0], sweep.keys[1:]
    xs = sweep.grid[key]
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
    pos = {toml_value(x): (x if numeric else i) for i, x in enumerate(xs)}
    lines: dict[str, dict[Any, list[dict]]] = {}
    for r in table:
        if r["status"] != "ok":
            continue
        label = " ".join([r["scenario"], *(f"{k}={label_value(r[k])}" for k in others)])
        lines.setdefault(label, {}).setdefault(pos[toml_value(r[key])], []).append(r)
    fig, axes = plt.subplots(2, 1, figsize=(7.0, 6.0), sharex=True)
    for k, (label, by_x) in enumerate(lines.items()):
        x = sorted(by_x)
        color = f"C{k % 10}"  # (one per line on both panels, whichever points it has)
        for ax, col in zip(axes, ("slo_attainment", "goodput_rps"), strict=True):
            # (a point with no requests has no attainment: left out of the mean)
            xv = [(v, got) for v in x if (got := [r[col] for r in by_x[v]
                                                  if r[col] is not None])]
            if not xv:
                continue
            mean = [sum(got) / len(got) for _, got in xv]
            lo = [m - min(got) for m, (_, got) in zip(mean, xv, strict=True)]
            hi = [max(got) - m for m, (_, got) in zip(mean, xv, strict=True)]
            ax.errorbar([v for v, _ in xv], mean, yerr=[lo, hi], marker="o", capsize=3,
                        label=label, color=color)
    axes[0].set(ylabel="SLO attainment", title=f"sweep {sweep.name}")
    axes[1].set(ylabel="goodput (r/s)", xlabel=key)
    if not numeric:
        axes[1].set_xticks(range(len(xs)), [label_value(x) for x in xs])
    seen: dict = {}  # (a line with no attainment at all is on the goodput panel alone)
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    axes[0].legend(list(seen.values()), list(seen), fontsize="small", loc="best")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- command


def cmd_sweep(args: argparse.Namespace) -> int:
    def fail(msg: str) -> int:
        print(f"clockwork sweep: {msg}", file=sys.stderr)
        return 2

    try:
        sweep = load_sweep(args.file)
    except SweepError as e:
        return fail(str(e))
    if args.plot and not sweep.keys:
        return fail("--plot draws against the first [grid] key; this sweep has no [grid]")
    if (why := check_parts(args)) is not None:
        return fail(why)
    # --out, the file's out or the default, checked before anything runs (--list only
    # reads it: it may be read-only, or not there yet)
    from clockwork.cluster.cli.argtypes import out_dir

    text = args.out if args.out is not None else (sweep.spec.out
                                                  or str(Path(SWEEPS) / sweep.path.stem))
    try:
        out = Path(out_dir(text, write=not args.list))
    except argparse.ArgumentTypeError as e:
        where = ("argument --out" if args.out is not None
                 else f"{sweep.path}: out" if sweep.spec.out
                 else "the default output folder (give another with --out)")
        return fail(f"{where}: {e}")
    for line in sweep.warnings:  # (as clockwork simulate says them: once each)
        print(f"clockwork sweep: {line}", file=sys.stderr)
    if args.list:
        points = sweep.points
        done = _done(sweep, out)
        for p, d in zip(points, done, strict=True):
            print(f"{'done  ' if d else 'to run'}  {p.name}  {p.command()}")
        print(f"{len(points)} points, {sum(done)} done, in {out}", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked(out):
            return _run_sweep(args, sweep, out)
    except FolderBusy as e:
        return fail(str(e))


def _done(sweep: Sweep, out: Path) -> list[bool]:
    """Whether each of the sweep's points is done in ``out`` (``done_summary``)."""
    points = sweep.points
    return [done_summary(point_folder(out, p), d, sweep.spec.logs) is not None
            for p, d in zip(points, point_digests(points), strict=True)]


def _run_sweep(args: argparse.Namespace, sweep: Sweep, out: Path) -> int:
    points = sweep.points
    done = _done(sweep, out)
    jobs = args.jobs or default_jobs()
    todo = len(points) - sum(done)
    quiet = args.quiet
    if not quiet:
        at_once = ("as many at a time as the Ray cluster has CPUs" if args.backend == "ray"
                   else f"{min(jobs, max(todo, 1))} at a time")
        print(f"sweep {sweep.name}: {len(points)} points ({sum(done)} done, {todo} to run), "
              f"{at_once} ({args.backend}), out {out}", file=sys.stderr)
    if todo:  # (the tables of an earlier run, until this one ends: one stopped left them
        for name in ("results.tsv", "results.json"):  # looking current, a point short)
            with contextlib.suppress(IsADirectoryError, PermissionError):  # (its write
                # says so, at the end; a folder there: EISDIR on Linux, EPERM elsewhere)
                (out / name).unlink(missing_ok=True)
    try:
        with term_as_ctrl_c(), Runner(jobs, args.backend, sweep.spec.logs, progress=False
                                      if quiet else (True if args.progress else None)) as runner:
            outcomes = runner.run(points, out, desc=f"sweep {sweep.name}")
    except BackendUnavailable as e:
        print(f"clockwork sweep: {e}", file=sys.stderr)
        return 2
    table = rows(sweep, outcomes)
    failed = [o for o in outcomes if not o.ok]
    print(format_rows(sweep, table))  # (first: a results file that cannot be written
    sys.stdout.flush()  # loses nothing else)
    unwritten = []
    try:
        write_results(out, sweep, outcomes, table)
        wrote = f"; wrote {out / 'results.tsv'}, {out / 'results.json'}"
    except OSError as e:
        unwritten.append(f"cannot write {e.filename or out}: {e.strerror or e}")
        wrote = ""
    if args.plot:
        try:
            png = plot(out, sweep, table)
            if not quiet:
                print(f"wrote {png}", file=sys.stderr)
        except OSError as e:
            unwritten.append(f"cannot write {e.filename or out / 'sweep.png'}: "
                             f"{e.strerror or e}")
    if not quiet:
        ran = sum(1 for o in outcomes if not o.reused)
        print(f"{len(points)} points: {ran - len(failed)} run, "
              f"{sum(o.reused for o in outcomes)} already done, {len(failed)} failed{wrote}",
              file=sys.stderr)
    empty = [r["point"] for r in table if r["status"] == "ok" and r["submitted"] == 0]
    if empty:  # (as simulate says it: a warning, not an error)
        print(f"clockwork sweep: warning: {len(empty)} point(s) submitted no requests (rates "
              f"too low or the run too short; their attainment is n/a): "
              f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}", file=sys.stderr)
    for o in failed:
        print(f"clockwork sweep: point {o.point.name} failed: {o.error}", file=sys.stderr)
    for line in unwritten:
        print(f"clockwork sweep: {line}", file=sys.stderr)
    return 1 if failed or unwritten else 0
