"""``clockwork scenarios``: list the scenarios shipped with the package, or copy them out.

  clockwork scenarios                       # name and one-line description of each
  clockwork scenarios copy demo_live poisson_warm --to my-scenarios
  clockwork scenarios copy --all --to my-scenarios
  clockwork scenarios copy example --to my-sweeps  # a shipped sweep file, to edit

``copy`` writes ``DIR/NAME.toml`` unchanged, and the shipped data files a copied scenario
names (``trace = "traces/samples/..."``) under the same relative path in ``DIR``, so the
copy runs as it is from ``DIR`` or by path from anywhere (data paths are also looked up
relative to the scenario file's folder). Existing files that differ are not overwritten
without ``--force``: nothing is copied, one line, exit 2 (a usage error).
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import shutil
import sys
import tomllib
from pathlib import Path

from clockwork import resources


def cmd_scenarios(args: argparse.Namespace) -> int:
    if getattr(args, "scenarios_command", None) == "copy":
        return _copy(args)
    return _list()


def _list() -> int:
    items = resources.list_scenarios()
    if not items:
        print("clockwork scenarios: no shipped scenarios found in "
              f"{resources.scenarios_root()}", file=sys.stderr)
        return 1
    width = max(len(n) for n, _ in items)
    for name, desc in items:
        print(f"{name:<{width}}  {desc}".rstrip())
    print(f"\n{len(items)} scenarios in {resources.scenarios_root()}; run one with "
          "`clockwork simulate NAME`, copy it out with `clockwork scenarios copy NAME --to DIR`")
    return 0


def scenario_data_files(path: Path) -> list[str]:
    """The relative data paths a scenario names that ship with the package (its
    workloads' ``trace``), as written."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    out: list[str] = []
    for w in data.get("workloads", []) or []:
        v = w.get("trace") if isinstance(w, dict) else None
        if (isinstance(v, str) and v and not Path(v).is_absolute()
                and (resources.data_root() / v).is_file() and v not in out):
            out.append(v)
    return out


def _blocked(plan: list[tuple[Path, Path]], dest: Path) -> str | None:
    """Why a file of ``plan`` cannot be written whatever ``--force`` says, or None: a
    folder where the file goes, or something other than a folder where a folder on its
    way goes (``DIR/traces/samples`` a plain file)."""
    for _, d in plan:
        if d.is_dir():
            return f"{d} is a folder, where the file {d.name} goes"
        for a in reversed(d.parents):
            if (a == dest or dest in a.parents) and a.exists() and not a.is_dir():
                return f"{a} is not a folder, and {d} goes under it"
    return None


def _copy(args: argparse.Namespace) -> int:
    names = resources.shipped_scenario_names()
    sweep_names = resources.shipped_sweep_names()
    wanted = list(names) if getattr(args, "all", False) else []
    sweeps: list[Path] = []  # shipped sweep files named (copied as they are)
    for n in getattr(args, "names", None) or []:
        n = n[: -len(resources.SCENARIO_SUFFIX)] if n.endswith(resources.SCENARIO_SUFFIX) else n
        if n.startswith(f"{resources.SWEEPS}/") and n.count("/") == 1:
            n = n.split("/", 1)[1]
        else:
            n = n.removeprefix("scenarios/")
        if n not in names and n in sweep_names:  # (a shipped sweep: its scenarios by name)
            sweep = resources.sweeps_root() / f"{n}{resources.SCENARIO_SUFFIX}"
            if sweep not in sweeps:
                sweeps.append(sweep)
            continue
        if n not in names:
            close = difflib.get_close_matches(n, names + sweep_names, n=3, cutoff=0.5)
            close = [f"{c} (a sweep)" if c in sweep_names and c not in names else c
                     for c in close]
            hint = (f"closest: {', '.join(close)}" if close
                    else f"shipped: {', '.join(names) or '(none)'}")
            print(f"clockwork scenarios copy: no shipped scenario {n!r}; {hint}", file=sys.stderr)
            return 2
        if n not in wanted:
            wanted.append(n)
    if not wanted and not sweeps:
        print("clockwork scenarios copy: name one or more scenarios, or --all "
              "(clockwork scenarios lists them)", file=sys.stderr)
        return 2
    dest = Path(args.to)
    # (source, destination) of everything to write, decided before writing anything
    plan: list[tuple[Path, Path]] = [(src, dest / src.name) for src in sweeps]
    for n in wanted:
        src = resources.scenarios_root() / f"{n}{resources.SCENARIO_SUFFIX}"
        plan.append((src, dest / src.name))
        for rel in scenario_data_files(src):
            pair = (resources.data_root() / rel, dest / rel)
            if pair not in plan:
                plan.append(pair)
    blocked = _blocked(plan, dest)
    if blocked:  # (--force overwrites files; it does not replace a folder or a file's kind)
        print(f"clockwork scenarios copy: {blocked}; nothing copied", file=sys.stderr)
        return 2
    force = getattr(args, "force", False)
    clash = [d for s, d in plan if d.exists() and not (d.is_file() and filecmp.cmp(s, d, False))]
    if clash and not force:
        print(f"clockwork scenarios copy: {', '.join(map(str, clash))} already exist(s) and "
              "differ(s); nothing copied (--force overwrites)", file=sys.stderr)
        return 2  # a usage error: the user decides (another --to, or --force)
    try:
        for s, d in plan:
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(s, d)
    except OSError as e:
        print(f"clockwork scenarios copy: {e}", file=sys.stderr)
        return 1
    for _, d in plan:
        print(f"copied {d}")
    return 0
