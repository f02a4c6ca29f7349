"""Scenario files (TOML): parsing, ``--set`` overrides, validation.

A scenario says which cluster, which scheduler settings, which models (and how
many copies) and which workloads. The keys, their defaults and ranges are the
schemas of ``clockwork.settings`` (``ScenarioSettings``); ``docs/settings.md`` lists
them. ``[scheduler]`` is checked against the policy's schema where the policy is
built (``controller.split_settings``), each ``[[workloads]]`` entry by its kind
(``clockwork.workloads``).
"""

from __future__ import annotations

import bisect
import copy
import json
import os
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clockwork.errors import ScenarioError  # noqa: F401 - re-exported
from clockwork.settings import (
    ScenarioSettings,
    check_scenario,
    scenario_defaults,
    table_keys,
    unknown_key_line,
)
from clockwork.sizes import MAX_TOML_DEPTH

# what a scenario starts from, from the schema's defaults (ScenarioSettings)
DEFAULTS: dict[str, Any] = scenario_defaults()


@dataclass
class Scenario:
    data: dict
    source: str = "<scenario>"
    overrides: list[str] = field(default_factory=list)
    # the absolute folder of its file, taken when it was read: its relative paths (a
    # trace, a profile set) are looked up there whatever the current folder is later (a
    # notebook's chdir between loading and running it lost the trace); None for a dict
    folder: str | None = field(default=None, compare=False)

    @property
    def seed(self) -> int:
        return int(self.data["seed"])

    @property
    def duration_s(self) -> float:
        return float(self.data["duration_s"])

    @property
    def cluster(self) -> dict:
        return self.data["cluster"]

    @property
    def scheduler(self) -> dict:
        return self.data["scheduler"]

    @property
    def models(self) -> list[dict]:
        return self.data["models"]

    @property
    def workloads(self) -> list[dict]:
        return self.data["workloads"]

    @property
    def faults(self) -> dict:
        return self.data["faults"]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _nodes(value: Any):
    """``value`` and every value inside it, each with its depth (``value``'s is 0),
    walked without recursion (the point may be a value too deep to recurse through); a
    table's or array's items are reached only when the walk goes on past it."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        yield v, depth
        if isinstance(v, dict | list):
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def _too_deep(value: Any, levels: int) -> bool:
    """Whether ``value`` holds arrays or tables nested more than ``levels`` deep."""
    return any(depth >= levels for v, depth in _nodes(value) if isinstance(v, dict | list))


def _too_long_int(value: Any) -> bool:
    """Whether ``value`` (already no deeper than ``MAX_TOML_DEPTH``) holds an integer of
    more decimal digits than Python writes (tomllib reads ``0x``/``0o``/``0b`` ones of any
    length; every message that names the value then failed with Python's own line)."""
    bits = int(sys.get_int_max_str_digits() * 3.3219)  # (log2(10): the digits' bits)
    return any(isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > bits
               for v, _ in _nodes(value))


def _plain(value: Any) -> Any:
    """A scenario table given from Python, its values as TOML would give them: numpy
    scalars (a seed from ``np.arange``) as Python numbers, numpy arrays as lists, paths
    (``pathlib.Path``) as strings; dicts and lists copied, anything else as it is."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # (TOML's arrays: a namedtuple's fields too)
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) is not None:
        # (a numpy scalar, or an array of none, as a number; an array as TOML's array)
        return value.item() if value.shape == () else _plain(value.tolist())
    return value


def _nested_line(where: str = "") -> str:
    line = f"nested too deeply (at most {MAX_TOML_DEPTH} levels of arrays and tables)"
    return f"{where}: {line}" if where else line


def _digits_line(where: str = "") -> str:
    """What Python's ``int()`` refuses (a plain ValueError out of tomllib, not its
    TOMLDecodeError: a traceback for a file, a line naming no key for ``--set``)."""
    line = f"a number of more than {sys.get_int_max_str_digits():,} digits"
    return f"{where}: {line}" if where else line


def parse_toml(raw: bytes | str, where: str, error: type[Exception] = ScenarioError) -> dict:
    """A TOML document (a file's bytes, or text): UTF-8, valid TOML, arrays and tables
    nested at most ``MAX_TOML_DEPTH`` levels; otherwise ``error`` with one line that starts
    with ``where`` (the file)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}); a TOML file is UTF-8") from None
    # a byte-order mark, as some editors save UTF-8 with: not TOML, but no doubt meant
    # (it was "Invalid statement (at line 1, column 1)")
    raw = raw.removeprefix("\ufeff")
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{where}: not valid TOML: {e}") from None
    except RecursionError:  # (far deeper than the bound: the parser ran out of stack)
        raise error(_nested_line(where)) from None
    except ValueError:
        raise error(_digits_line(where)) from None
    if any(_too_deep(v, MAX_TOML_DEPTH) for v in data.values()):
        raise error(_nested_line(where))
    if _too_long_int(data):
        raise error(_digits_line(where))
    return data


def parse_json(raw: bytes, where: str, error: type[Exception] = ScenarioError) -> Any:
    """A JSON document (a file's bytes) under the same rules as ``parse_toml``: valid
    JSON, nested at most ``MAX_TOML_DEPTH`` levels; otherwise ``error`` with one line that
    starts with ``where``."""
    try:
        data = json.loads(raw)
    except ValueError as e:  # (UnicodeDecodeError too)
        raise error(f"{where}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(_nested_line(where)) from None
    if _too_deep(data, MAX_TOML_DEPTH + 1):  # (the document itself is one level)
        raise error(_nested_line(where))
    return data


def parse_value(text: str) -> Any:
    """A ``--set`` value: TOML syntax if it parses (numbers, booleans, strings,
    arrays), else the raw string. One nested more than ``MAX_TOML_DEPTH`` levels raises
    ``ScenarioError``."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ScenarioError(_nested_line()) from None
    except ValueError:
        raise ScenarioError(_digits_line()) from None
    if _too_deep(value, MAX_TOML_DEPTH):
        raise ScenarioError(_nested_line())
    if _too_long_int(value):
        raise ScenarioError(_digits_line())
    return value


def toml_string(text: str, ascii_only: bool = False) -> str:
    """``text`` as a TOML basic string (``"..."``), the form ``parse_value`` reads back
    as ``text``. It is JSON's spelling (``ascii_only``: with every non-ASCII character
    escaped, as table keys have been written), which sweep points' names hash, so a point
    keeps its name from version to version; except where JSON's is no TOML: DEL as
    ``\\u007f``, and a character outside the BMP as ``\\UXXXXXXXX`` where JSON writes a
    surrogate pair. A lone surrogate (an undecodable byte in a file name) has no TOML
    form: ``ValueError``."""
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise ValueError(f"{text!r} cannot be written as a TOML string (a lone "
                         "surrogate: an undecodable character)")
    out = json.dumps(text, ensure_ascii=ascii_only).replace("\x7f", "\\u007f")
    if ascii_only:
        out = _PAIR.sub(lambda m: "\\U%08X" % (0x10000 + ((int(m[1], 16) - 0xD800) << 10)
                                                + int(m[2], 16) - 0xDC00), out)
    return out


_PAIR = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def _index(part: str) -> int:
    """A list index of a ``--set`` key: 0, 1, ... (no sign: ``-1`` would count from the
    end); anything else raises ``ValueError``."""
    if not (part.isascii() and part.isdigit()):
        raise ValueError(part)
    return int(part)


def _items(items: list) -> str:
    return f" (items 0 ... {len(items) - 1})" if items else " (the list is empty)"


def apply_override(data: dict, assignment: str) -> None:
    """Apply ``a.b.c=value``; list items by index (``workloads.0.rate_rps=100``)."""
    if "=" not in assignment:
        raise ScenarioError(f"--set {assignment!r}: expected key=value")
    key, _, raw = assignment.partition("=")
    if not all(key.strip().split(".")):
        raise ScenarioError(f"--set {assignment!r}: empty key part")
    try:
        value = parse_value(raw.strip())
    except ScenarioError as e:
        raise ScenarioError(f"--set {key.strip()}: {e}") from None
    set_value(data, key, value)


def set_value(data: dict, key: str, value: Any) -> None:
    """Set the dotted ``key`` (list items by index: ``workloads.0.trace``) to ``value``
    as it is (``apply_override`` with the value already read: no TOML text between)."""
    key = key.strip()
    parts = key.split(".")
    if not all(parts):
        raise ScenarioError(f"--set {key!r}: empty key part")
    node: Any = data
    for i, p in enumerate(parts[:-1]):
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            try:
                node = node[_index(p)]
            except (ValueError, IndexError):
                raise ScenarioError(f"--set {key}: no list item {p!r} at {where}"
                                    f"{_items(node)}") from None
        elif isinstance(node, dict):
            if p not in node and parts[i + 1].isdigit():  # (an item of a list not there:
                # a table {"0": ...} was made, refused later as "must be a list")
                if i == 0 and p not in table_keys(ScenarioSettings):  # (misspelt?)
                    raise ScenarioError(f"--set {key}: " + unknown_key_line(
                        (p,), table_keys(ScenarioSettings)))
                raise ScenarioError(f"--set {key}: {where} is not in the scenario, so it "
                                    f"has no item {parts[i + 1]}: give the whole list "
                                    f"(--set '{where}=[...]')")
            node = node.setdefault(p, {})
        else:  # (node is the value at parts[:i], not at parts[:i + 1])
            raise ScenarioError(f"--set {key}: {'.'.join(parts[:i])} is not a table")
    last = parts[-1]
    if isinstance(node, list):
        try:
            node[_index(last)] = value
        except (ValueError, IndexError):
            raise ScenarioError(f"--set {key}: no list item {last!r}{_items(node)}") from None
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ScenarioError(f"--set {key}: {'.'.join(parts[:-1])} is not a table")


def fault_time_error(kind: str, i: int, fault: dict, duration_s: float) -> str | None:
    """The message for a kill, hang or slow_network fault that starts at or after the end
    of the run (it would never happen: the run has ended), as for a controller restart;
    None when it starts before. One rule for the simulator and for live replays."""
    return event_time_error(f"faults.{kind}.{i}", fault["at_s"], duration_s)


def in_time_order(faults) -> list[dict]:
    """A fault kind's entries in the order they start (entries that start together in the
    file's order), as the simulator and a live replay play them: a worker's spells may
    follow one another at an instant (one ends as the next starts), and listed the other
    way round the end was played after the start and undid it (a slow link fast again, a
    kill at another's restart lost). One rule for the simulator and for live replays."""
    return sorted(faults or (), key=lambda f: float(f["at_s"]))


def event_time_error(where: str, at_s: float, duration_s: float) -> str | None:
    """The message for a scenario event (entry ``where``) at or after the end of the run
    (it would never happen); None when it comes before."""
    if at_s >= duration_s:
        return f"{where}.at_s: must be before the end (duration_s {duration_s:g}), got {at_s:g}"
    return None


def override_list(overrides, who: str = "load_scenario") -> list[str]:
    """``overrides`` of ``load_scenario`` / ``simulate``: None, one ``key=value`` string,
    or a list or tuple of them; anything else raises ``ScenarioError`` naming the
    parameter (a string was read as a list of one-character overrides: "--set 'd':
    expected key=value")."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, list | tuple) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise ScenarioError(f"{who}: overrides must be None, a 'key=value' string or a list "
                        f"of them (as --set takes), got {overrides!r}")


def load_scenario(path: str | Path | None = None, overrides: list[str] | str | None = None,
                  data: dict | None = None, source: str | None = None,
                  pinned: Sequence[tuple[str, Any]] = (), folder: str | None = None
                  ) -> Scenario:
    """Read a TOML file (or take ``data``), apply overrides, fill defaults, validate.
    ``source``: with ``data``, the file it came from (its folder, or ``folder`` when
    given, is where the scenario's relative paths, e.g. a trace, are looked up).
    ``pinned``: ``(key, value)`` pairs set after the overrides, values as they are
    (``pinned_paths``); not in ``overrides``."""
    from clockwork.resources import scenario_folder

    if path is not None and not isinstance(path, str | os.PathLike):
        raise ScenarioError(
            "load_scenario: path must be a scenario file's path or a shipped scenario's "
            f"name (str or os.PathLike), got {type(path).__name__}"
            + (" (a scenario's tables go as data=...)" if isinstance(path, dict) else ""))
    if data is not None and not isinstance(data, dict):
        raise ScenarioError("load_scenario: data must be a dict of the scenario's tables, "
                            f"got {type(data).__name__}")
    src = source or "<dict>"
    if folder is None and source is not None:
        found = scenario_folder(source)
        folder = str(found.resolve()) if found is not None else None
    raw: dict = {}
    if path is not None:
        from clockwork.resources import resolve_scenario  # a file, else a shipped name

        p = resolve_scenario(path)
        src = str(p)
        folder = str(p.resolve().parent)
        try:
            text = p.read_bytes()
        except FileNotFoundError:
            raise ScenarioError(f"scenario file {p} not found") from None
        except OSError as e:
            raise ScenarioError(f"{p}: cannot read it ({e.strerror or e})") from None
        raw = parse_toml(text, str(p))
    if data is not None:
        if isinstance(data, dict) and any(_too_deep(v, MAX_TOML_DEPTH) for v in data.values()):
            raise ScenarioError(_nested_line(src))
        raw = _merge(raw, _plain(data))
    overrides = override_list(overrides)
    for o in overrides:
        apply_override(raw, o)
    for key, value in pinned:
        set_value(raw, key, value)
    merged = _merge(DEFAULTS, raw)
    sc = Scenario(merged, src, overrides, folder)
    validate(sc)
    return sc


def pinned_paths(sc: Scenario) -> list[tuple[str, str]]:
    """``(key, path)`` pairs naming the files ``sc`` uses (its profile set, its workloads'
    traces, the folder an azure ``day``'s file was found in) as this process finds them (for ``load_scenario(..., pinned=...)``: the
    paths as they are, never through ``--set`` text), for a process with another working folder or
    environment (a Ray task) to use the same ones: found in the package's shipped data,
    by their path there (each install has its own copy); found elsewhere, by their
    absolute path. A path found nowhere, or already written so, gets none."""
    from clockwork.profiles import find_profile_set
    from clockwork.resources import data_root, find_data_path, scenario_folder
    from clockwork.workloads import DATA_PATH_KEYS
    from clockwork.workloads import data_files as workload_files

    shipped = data_root().resolve()
    out: list[tuple[str, str]] = []

    def pin(key: str, written: str, found: Path | None) -> None:
        if found is None:
            return
        try:
            value = str(found.resolve().relative_to(shipped))
        except ValueError:
            value = os.path.abspath(found)
        if value != written:
            out.append((key, value))

    base = scenario_folder(sc)
    profiles = sc.cluster.get("profiles")
    if isinstance(profiles, str) and profiles:
        pin("cluster.profiles", profiles, find_profile_set(profiles, base))
    for i, spec in enumerate(sc.workloads):
        for key in DATA_PATH_KEYS:
            v = spec.get(key)
            if isinstance(v, str) and v:
                pin(f"workloads.{i}.{key}", v, find_data_path(v, base))
        if spec.get("kind") == "azure" and "day" in spec:
            # a day file is looked for in trace_dir, then $AZURE_TRACE_DIR and the usual
            # folders: the folder it was found in here becomes the trace_dir
            found = workload_files(spec, base)
            if found:
                key = f"workloads.{i}.trace_dir"
                out = [(k, v) for k, v in out if k != key]
                written = spec.get("trace_dir")
                pin(key, written if isinstance(written, str) else "", found[0].parent)
    return out


def data_files(sc: Scenario) -> list[Path]:
    """The files besides its own that running ``sc`` reads, as this process finds them:
    its profile set's files and its workloads' trace files (``workloads.data_files``);
    one found nowhere is left out (the run says why)."""
    from clockwork.profiles import find_profile_set
    from clockwork.resources import scenario_folder
    from clockwork.workloads import data_files as workload_files

    base = scenario_folder(sc)
    out: list[Path] = []
    profiles = sc.cluster.get("profiles")
    if isinstance(profiles, str) and profiles:
        folder = find_profile_set(profiles, base)
        if folder is not None:
            out += sorted(folder.glob("*.json"))
    for spec in sc.workloads:
        out += workload_files(spec, base)
    return out


def validate(sc: Scenario) -> None:
    """Check ``sc.data`` against the scenario schema and replace it by the validated
    values (defaults filled); a bad key or value raises ``ScenarioError`` with one line
    naming it, e.g. ``cluster.noise: must be a finite number in [0, 10], got nan``."""
    try:
        sc.data = check_scenario(sc.data, sc.source, ScenarioError)
    except ScenarioError as e:
        raise ScenarioError(_blame_override(str(e), sc.source, sc.overrides, sc.data)) from None


def _still_set(data: dict, assignment: str, key: str) -> bool:
    """Whether the override ``assignment`` (``K=value``, ``K`` being ``key`` or a table
    holding it) is what ``data`` holds at ``key`` (False when the value there was changed
    since, e.g. a ``Scenario``'s ``data`` edited in Python: the override did not make it).
    """
    k, _, raw = assignment.partition("=")
    k = k.strip()
    try:
        value = parse_value(raw.strip())
        for p in key[len(k):].split(".")[1:]:  # (the part of key inside the override's)
            value = value[_index(p)] if isinstance(value, list) else value[p]
        node: Any = data
        for p in key.split("."):
            node = node[_index(p)] if isinstance(node, list) else node[p]
    except (KeyError, ValueError, IndexError, TypeError, ScenarioError):
        return True  # (not found where it was set: as before, the override is named)
    return _holds(node, value)


def _holds(node: Any, value: Any) -> bool:
    """Whether ``node`` is ``value`` (tables: what it gives, defaults filled beside it)."""
    if isinstance(value, dict):
        return isinstance(node, dict) and all(k in node and _holds(node[k], v)
                                              for k, v in value.items())
    if isinstance(value, list):
        return (isinstance(node, list) and len(node) == len(value)
                and all(_holds(n, v) for n, v in zip(node, value, strict=True)))
    return node == value or repr(node) == repr(value)  # (nan: not equal to itself)


def _blame_override(line: str, source: str, overrides, data: dict | None = None) -> str:
    """``line`` (``SOURCE: KEY: ...``) as ``--set KEY: ...`` when ``KEY`` (or the table
    it is in) was given by an override still holding there (``data``): the file did not
    say it; as ``SOURCE with --set K: KEY: ...`` when an override ``K`` set something
    inside table ``KEY`` (both made what is wrong there: two faults that overlap, one of
    them from the override)."""
    head = f"{source}: "
    if not line.startswith(head):
        return line
    key = line[len(head):].partition(": ")[0]
    unknown = re.match(r"unknown (?:top-level )?setting '([^']+)'", line[len(head):])
    if unknown:  # ("unknown setting 'cluster.wokers' (did you mean ...)")
        key = unknown[1]
    sets = [(k, str(o)) for o in overrides or () if (k := str(o).partition("=")[0].strip())]
    for k, o in sets:
        if (key == k or key.startswith(k + ".")) and (data is None or _still_set(data, o, key)):
            return f"--set{':' if unknown else ''} {line[len(head):]}"
    within = [k for k, o in sets if k.startswith(key + ".")
              and (data is None or _still_set(data, o, k))]
    if within:  # a table an override set something in: the file and the override both
        if unknown:  # (a table the file does not have: made by the override)
            return f"--set: {line[len(head):]}"
        return f"{source} with --set {within[0]}: {line[len(head):]}"
    return line


def instance_names(models: list[dict]) -> dict[str, str]:
    """Instance name -> model name: copies of ``m`` are ``m``, ``m:1``, ``m:2``, ..."""
    out: dict[str, str] = {}
    for m in models:
        name = m["name"]
        for k in range(int(m.get("copies", 1))):
            inst = name if k == 0 else f"{name}:{k}"
            if inst in out:
                raise ScenarioError(f"model instance {inst!r} is listed twice")
            out[inst] = name
    return out


def repository_plan(sc: Scenario) -> list[tuple[float, str, str, list[str]]]:
    """The scenario's ``[[repository]]`` events in time order (those at one time in the
    file's order): (at_s, "unload" | "load", the name given, the instances it unloads or
    loads), checked against what is served at that point (every instance at the start):
    an unload names a ``[[models]]`` name (every copy of it still served) or one copy's
    instance name ``name:k`` (served); a load names a model (every copy of it not served:
    at least one) or a copy unloaded alone (another copy of its model served, as the
    live repository takes it back). Raises ``ScenarioError`` naming the entry."""
    events = sc.data.get("repository") or []
    if not events:
        return []
    groups: dict[str, list[str]] = {}
    for inst, model in instance_names(sc.models).items():
        groups.setdefault(model, []).append(inst)
    served = {i for insts in groups.values() for i in insts}
    order = sorted(enumerate(events), key=lambda ie: (float(ie[1]["at_s"]), ie[0]))
    # every time first: an entry at or after the end is named for that, not an earlier one
    # that moving it there made wrong (a load at 1 s of what an unload at the end unloads)
    for i, e in order:
        why = event_time_error(f"repository.{i}", float(e["at_s"]), sc.duration_s)
        if why:
            raise ScenarioError(why)
    out = []
    for i, e in order:
        at = float(e["at_s"])
        what = "unload" if e.get("unload") is not None else "load"
        name = e[what]
        where = f"repository.{i}"
        base = name.partition(":")[0]
        if name in groups:
            insts = [x for x in groups[name] if (x in served) == (what == "unload")]
            if not insts:
                raise ScenarioError(f"{where}.{what}: no copy of model {name!r} is "
                                    + ("served then (unloaded already)" if what == "unload"
                                       else "unloaded then (every copy is served)"))
        elif base in groups and name in groups[base]:
            insts = [name]
            if what == "unload" and name not in served:
                raise ScenarioError(f"{where}.unload: {name!r} is not served then (unloaded "
                                    "already)")
            if what == "load":
                if name in served:
                    raise ScenarioError(f"{where}.load: {name!r} is served then")
                if not any(x in served for x in groups[base]):
                    raise ScenarioError(f"{where}.load: {name!r} is a copy of model {base!r}, "
                                        f"none of whose copies is served then: load "
                                        f"{base!r} (every copy)")
        elif base in groups and name == f"{base}:0":
            raise ScenarioError(f"{where}.{what}: {name!r}: the first copy of {base!r} goes "
                                f"by the model's name, which {what}s every copy; a copy alone "
                                f"is {base}:1 and up"
                                + ("" if len(groups[base]) > 1 else
                                   f" ({base!r} has one copy: {what} {base!r})"))
        else:
            known = sorted(groups)
            raise ScenarioError(f"{where}.{what}: {name!r} is not a [[models]] name or one of "
                                f"their copies' names ({', '.join(known[:5])}"
                                f"{' ...' if len(known) > 5 else ''}; a copy k >= 1 is "
                                "name:k)")
        if what == "unload":
            served.difference_update(insts)
        else:
            served.update(insts)
        out.append((at, what, name, insts))
    return out


def joining_workers(sc: Scenario) -> list[tuple[float, int]]:
    """The workers the scenario's ``[[add_workers]]`` entries add: (at_s, worker index) in
    the order they join (by time, then the file's order), indices from ``cluster.workers``
    on. Raises ``ScenarioError`` for one at or after the end, or more workers in all than
    a cluster may have, or more GPUs in all (``cluster.gpus_per_worker`` each)."""
    from clockwork.sizes import MAX_GPUS, MAX_WORKERS

    events = sc.data.get("add_workers") or []
    out: list[tuple[float, int]] = []
    w = int(sc.cluster["workers"])
    total = w + sum(int(e.get("count", 1)) for e in events)  # (checked before any is made)
    if total > MAX_WORKERS:
        raise ScenarioError(f"add_workers: {total:,} workers in all with cluster.workers, "
                            f"more than a cluster may have ({MAX_WORKERS:,})")
    g = int(sc.cluster["gpus_per_worker"])
    if total * g > MAX_GPUS:
        raise ScenarioError(f"add_workers: {total:,} workers of {g} GPU(s) in all with "
                            f"cluster.workers, {total * g:,} GPUs: more than a cluster may "
                            f"have ({MAX_GPUS:,})")
    for i, e in sorted(enumerate(events), key=lambda ie: (float(ie[1]["at_s"]), ie[0])):
        at = float(e["at_s"])
        why = event_time_error(f"add_workers.{i}", at, sc.duration_s)
        if why:
            raise ScenarioError(why)
        for _ in range(int(e.get("count", 1))):
            out.append((at, w))
            w += 1
    return out


def leaving_workers(sc: Scenario) -> list[tuple[float, int, bool]]:
    """The workers the scenario's ``[[remove_workers]]`` entries take out: (at_s, worker
    index, drain) by time, then the file's order. Raises ``ScenarioError`` for one at or after
    the end, a worker not in the cluster by then (past ``cluster.workers`` and not joined
    at or before ``at_s``), one removed twice, or a removal that leaves no worker."""
    events = sc.data.get("remove_workers") or []
    if not events:
        return []
    w0 = int(sc.cluster["workers"])
    joined = {w: at for at, w in joining_workers(sc)}
    join_times = sorted(joined.values())  # (how many joined by a time: a bisection)
    out: list[tuple[float, int, bool]] = []
    gone: set[int] = set()
    for i, e in sorted(enumerate(events), key=lambda ie: (float(ie[1]["at_s"]), ie[0])):
        at, w = float(e["at_s"]), int(e["worker"])
        where = f"remove_workers.{i}"
        why = event_time_error(where, at, sc.duration_s)
        if why:
            raise ScenarioError(why)
        if w >= w0 and (w not in joined or joined[w] > at):
            raise ScenarioError(
                f"{where}.worker: {w} is not in the cluster at {at:g} s (the {w0} at the start "
                f"are 0 ... {w0 - 1}" + (f"; those [[add_workers]] adds follow, each from its "
                                          f"at_s: {_join_times(joined)}" if joined else "")
                + ")")
        if w in gone:
            raise ScenarioError(f"{where}.worker: {w} is removed already")
        gone.add(w)
        if len(gone) >= w0 + bisect.bisect_right(join_times, at):
            raise ScenarioError(f"{where}: removes the last worker in the cluster at {at:g} s "
                                "(keep at least one to serve the run)")
        out.append((at, w, bool(e.get("drain", False))))
    return out


def _join_times(joined: dict[int, float]) -> str:
    shown = [f"worker {w} at {at:g} s" for w, at in sorted(joined.items())[:4]]
    return ", ".join(shown) + (", ..." if len(joined) > 4 else "")


def clock_offsets_error(sc: Scenario) -> str | None:
    """More ``cluster.clock_offsets_ms`` than the scenario has workers (those at the start
    and those ``[[add_workers]]`` adds), in one line; None if not. The simulator's and a
    live run's check."""
    n = len(sc.cluster.get("clock_offsets_ms") or [])
    w0 = int(sc.cluster["workers"])
    w = w0 + len(joining_workers(sc))
    if n <= w:
        return None
    return (f"cluster.clock_offsets_ms: {n} offsets for {w} worker(s)"
            + (f" ({w0} at the start and {w - w0} that join)" if w > w0 else ""))


def fault_worker_error(sc: Scenario) -> str | None:
    """A kill, hang or slow_network fault naming a worker that is not there at the start
    (past ``cluster.workers``: one that joins later, ``[[add_workers]]``, or none), in one
    line; None if every fault names one of them. The simulator's and a live run's check."""
    w0 = int(sc.cluster["workers"])
    for kind in ("kill", "hang", "slow_network"):
        for i, f in enumerate(sc.faults.get(kind, ()) if sc.faults else ()):
            if f["worker"] >= w0:
                return (f"faults.{kind}.{i}.worker: {f['worker']} is not one of the {w0} "
                        f"worker(s) at the start (0 ... {w0 - 1}; faults name those, not the "
                        "workers that join)")
    return None


def faults_error(sc: Scenario) -> str | None:
    """What is wrong with the scenario's kill, hang and slow_network faults (a worker not
    there at the start, a time at or after the end), in one line; None if nothing. Asked
    by the simulator and by a live replay before anything runs."""
    why = fault_worker_error(sc)
    if why:
        return why
    for kind in ("kill", "hang", "slow_network"):
        for i, f in enumerate(sc.faults.get(kind, ()) if sc.faults else ()):
            why = fault_time_error(kind, i, f, sc.duration_s)
            if why:
                return why
    return None


def restarts_error(sc: Scenario) -> str | None:
    """What is wrong with the scenario's ``faults.controller_restart`` entries (with a
    kill or hang fault, or with ``[[repository]]``, ``[[add_workers]]`` or
    ``[[remove_workers]]`` events; one that starts before the last one's new controller,
    or whose new controller starts at or after the end), in one line; None if nothing.
    Asked by the simulator and by a live replay before anything runs."""
    faults = sc.data.get("faults") or {}
    restarts = faults.get("controller_restart") or []
    if not restarts:
        return None
    if faults.get("kill") or faults.get("hang"):
        return ("faults.controller_restart: not together with faults.kill or faults.hang "
                "(the simulator models them apart)")
    end = -1.0
    for i, f in enumerate(restarts):
        if f["at_s"] <= end:
            return (f"faults.controller_restart.{i}.at_s: {f['at_s']:g} is not after the "
                    f"previous restart's end ({end:g} s)")
        end = f["at_s"] + f["down_s"]
        if end >= sc.duration_s:
            return (f"faults.controller_restart.{i}: the new controller must start before "
                    f"the end ({end:g} s >= duration_s {sc.duration_s:g})")
    if sc.data.get("repository"):
        return ("repository: not together with faults.controller_restart (a new controller "
                "starts from the [[models]] list)")
    for key in ("add_workers", "remove_workers"):
        if sc.data.get(key):
            return (f"{key}: not together with faults.controller_restart (a new controller "
                    "starts from the workers at the start)")
    return None


def cache_pages(sc: Scenario, pset) -> int:
    """The pages of each GPU's weights cache: the scenario's
    ``cluster.weights_cache_pages``, else its profile set's (``pset``)."""
    return int(sc.cluster.get("weights_cache_pages", pset.weights_cache_pages))


def cache_fit_error(sc: Scenario, pset) -> str | None:
    """Whether every model the scenario serves fits in a GPU's weights cache (one that
    does not could never be loaded: each of its requests would fail), for its profile
    set ``pset`` (``clockwork.profiles.ProfileSet``): None, or why not in one line."""
    names = {m["name"] for m in sc.models}
    if not names:
        return None
    pages = cache_pages(sc, pset)
    biggest = max(names, key=lambda m: (pset.get(m).weights_pages, m))
    need = pset.get(biggest).weights_pages
    if need <= pages:
        return None
    given = pset.path / "set.json"
    where = ("cluster.weights_cache_pages" if "weights_cache_pages" in sc.cluster else
             f"weights_cache_pages of profile set {pset.name!r} ({given})" if given.exists()
             else f"the default weights_cache_pages (profile set {pset.name!r} has no "
                  "set.json to set it; or set cluster.weights_cache_pages)")
    return (f"{where}: model {biggest!r} takes {need} pages, more than the {pages} page(s) "
            "of each GPU's weights cache: it could never be loaded")
