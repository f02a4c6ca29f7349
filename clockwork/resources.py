"""The data shipped inside the package, and how names and paths find it.

The package carries ``clockwork/data/``: ``profiles/<set>/*.json`` (profile sets),
``scenarios/*.toml`` and ``traces/samples/`` (the sample Azure-format trace). A source
checkout keeps its old paths (``scenarios/``, ``profiles/<set>/``, ``traces/samples/``) as
symlinks into that folder, so both an installed wheel and a checkout read the same files.

- ``data_root()``: the shipped data folder (found with ``importlib.resources``).
- ``resolve_scenario(name_or_path)``: an existing file, else a shipped scenario by name
  (``demo_live``, ``demo_live.toml`` or ``scenarios/demo_live.toml``).
- ``list_scenarios()``: the shipped scenarios with a one-line description each.
- ``resolve_data_path(path, base)``: a path written inside a scenario file
  (``trace = "traces/samples/..."``): as given, then relative to ``base`` (the scenario's
  folder), then relative to the shipped data, then relative to a source checkout.
- ``profiles_root()``: where shipped profile sets live (``clockwork.profiles`` looks there
  after ``$CLOCKWORK_PROFILES`` and ``./profiles``).

Standard library only; this module imports nothing else from the project at import time.
"""

from __future__ import annotations

import difflib
import errno
import tomllib
from importlib import resources
from pathlib import Path

SCENARIO_SUFFIX = ".toml"
DESCRIPTION_WIDTH = 100  # characters of a description built from comments


def data_root() -> Path:
    """The package's ``data`` folder (a real folder: the package must be installed
    unzipped, as pip does)."""
    root = resources.files("clockwork").joinpath("data")
    if not isinstance(root, Path):  # a zipped install: no filesystem path to hand out
        raise RuntimeError(f"clockwork's data is not on the filesystem ({root!r}); "
                           "install the package unzipped (pip does)")
    return root


def scenarios_root() -> Path:
    return data_root() / "scenarios"


SWEEPS = "sweeps"  # the shipped sweep files: data/sweeps/<name>.toml


def sweeps_root() -> Path:
    return data_root() / SWEEPS


def profiles_root() -> Path:
    """The folder of the shipped profile sets (``<root>/<set>/*.json``)."""
    return data_root() / "profiles"


def checkout_root() -> Path | None:
    """The source checkout this package is imported from, or None for an installed copy."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").is_file() and (here / "clockwork").is_dir() else None


# ------------------------------------------------------------------ scenarios

def shipped_scenario_names() -> list[str]:
    root = scenarios_root()
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob(f"*{SCENARIO_SUFFIX}") if p.is_file())


def shipped_sweep_names() -> list[str]:
    return sorted(p.stem for p in sweeps_root().glob(f"*{SCENARIO_SUFFIX}"))


def shipped_name(p: Path, folder: str = "scenarios") -> str | None:
    """The shipped-file name a path may stand for: ``x``, ``x.toml`` or
    ``FOLDER/x.toml`` (``scenarios``, or ``SWEEPS``; nothing else: other paths are only
    ever files)."""
    if p.is_absolute() or len(p.parts) > 2 or (len(p.parts) == 2 and p.parts[0] != folder):
        return None
    if not p.parts or p.name in (".", ".."):
        return None
    name = p.name
    return name[: -len(SCENARIO_SUFFIX)] if name.endswith(SCENARIO_SUFFIX) else name


def not_a_file(kind: str, name_or_path: str | Path) -> str:
    """Why ``name_or_path``, not a regular file, is no ``kind`` file (the start of an
    error): none given, a folder, something else (a device, a pipe), or not there."""
    p = Path(name_or_path)
    if not str(name_or_path):
        return f"no {kind} file given (an empty name)"
    if p.is_dir():
        return f"{name_or_path} is a folder, not a {kind} file"
    if p.exists():
        return f"{name_or_path} is not a regular file, not a {kind} file"
    return f"{kind} file {name_or_path} not found"


def resolve_scenario(name_or_path: str | Path) -> Path:
    """The scenario file ``name_or_path`` means: an existing file wins; otherwise a shipped
    scenario by name. Raises ``ScenarioError`` naming the closest shipped scenarios."""
    from clockwork.errors import ScenarioError

    p = Path(name_or_path)
    try:
        if p.is_file():
            return p
        unusable = None
    except OSError as e:  # (a name too long for a path: ENAMETOOLONG, not False; other
        # errors, a folder it may not enter, are said where the file is read)
        if e.errno != errno.ENAMETOOLONG:
            return p
        unusable = e.strerror or str(e)
    text = str(name_or_path)
    if "\n" in text and "=" in text:  # (TOML text given for a path: the whole text was
        # echoed twice as a file's and a scenario's name)
        raise ScenarioError(f"a scenario file's path or a shipped scenario's name is "
                            f"needed, got TOML text ({text[:40]!r}...): give its dict, "
                            "tomllib.loads(text), or write it to a file")
    if unusable:
        raise ScenarioError(f"scenario {text[:40]!r}{'...' if len(text) > 40 else ''}: "
                            f"not a file's path ({unusable})")
    name = shipped_name(p)
    if name:
        shipped = scenarios_root() / f"{name}{SCENARIO_SUFFIX}"
        if shipped.is_file():
            return shipped
    names = shipped_scenario_names()
    close = difflib.get_close_matches(name or p.stem, names, n=3, cutoff=0.5)
    if close:
        hint = f"closest shipped scenarios: {', '.join(close)}"
    else:
        hint = f"shipped scenarios: {', '.join(names) or '(none)'}"
    what = not_a_file("scenario", name_or_path)
    if name:
        what += f" and no shipped scenario {name!r}"
    raise ScenarioError(f"{what}; {hint} (list them with `clockwork scenarios`)")


def scenario_description(path: Path) -> str:
    """The TOML's ``description`` key, else its first comment line, else ``name``."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        data = {}
    if isinstance(data.get("description"), str) and data["description"].strip():
        return " ".join(data["description"].split())
    words: list[str] = []
    for line in text.splitlines():  # the leading comment block, shortened to one line
        s = line.strip()
        if not s.startswith("#") or (words and not s.lstrip("#").strip()):
            break
        words += s.lstrip("#").split()
    if words:
        return _shorten(" ".join(words))
    return str(data.get("name", ""))


def _shorten(text: str, width: int = DESCRIPTION_WIDTH) -> str:
    if len(text) <= width:
        return text
    cut = text[: width - 3].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "..."


def list_scenarios() -> list[tuple[str, str]]:
    """``(name, description)`` of every shipped scenario, by name."""
    root = scenarios_root()
    return [(n, scenario_description(root / f"{n}{SCENARIO_SUFFIX}"))
            for n in shipped_scenario_names()]


def scenario_folder(source) -> Path | None:
    """The folder of a scenario's file: of a ``Scenario`` (its ``folder``, taken when it
    was read), or of a file's path (``Scenario.source``); None when it came from a dict
    (``"<dict>"``) or the file is gone."""
    folder = getattr(source, "folder", None)
    if folder is not None:
        return Path(folder) if Path(folder).is_dir() else None
    source = getattr(source, "source", source)
    if source is None or str(source).startswith("<"):
        return None
    p = Path(source)
    return p.parent if p.is_file() else None


# ------------------------------------------------------------------ data paths

def data_path_candidates(path: str | Path, base: str | Path | None = None) -> list[Path]:
    """Where ``path`` (written in a scenario file) is looked for, in order."""
    p = Path(path)
    if p.is_absolute():
        return [p]
    out = [p]
    if base is not None:
        out.append(Path(base) / p)
    out.append(data_root() / p)
    if (co := checkout_root()) is not None:
        out.append(co / p)
    return list(dict.fromkeys(out))  # (each once, in order)


def find_data_path(path: str | Path, base: str | Path | None = None) -> Path | None:
    """The first of ``data_path_candidates`` that exists, or None."""
    for c in data_path_candidates(path, base):
        if c.exists():
            return c
    return None


def resolve_data_path(path: str | Path, base: str | Path | None = None) -> Path:
    """A path written inside a scenario file: as given (absolute, or relative to the
    current folder), then relative to ``base`` (the scenario file's folder), then relative
    to the shipped data (``clockwork/data``), then to a source checkout. Raises
    ``FileNotFoundError`` naming the places tried."""
    found = find_data_path(path, base)
    if found is None:
        tried = ", ".join(str(c) for c in data_path_candidates(path, base))
        raise FileNotFoundError(f"{path} not found (tried {tried})")
    return found
