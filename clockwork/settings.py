"""Typed, validated settings: what every settings schema shares, and the schemas of a
scenario file's tables and of a profile file.

A schema is a pydantic model derived from ``Settings``, or, for settings read in a hot
path (``SchedulerConfig``, the baselines' configs), a frozen pydantic dataclass with
slots and ``CONFIG``: reading an attribute of a ``BaseModel`` instance takes several
times longer than of a plain dataclass (``BaseModel`` defines ``__getattr__``, which
turns off CPython's specialised attribute reads), while a slotted pydantic dataclass
reads as fast as a plain one. Either way unknown keys are refused, types are strict (``true`` is
not a number, ``"abc"`` is not an integer), numbers must be finite, and each field has a
range and a ``description``. The description is the one
place where a setting is documented: ``docs/settings.md`` is rendered from the schemas
(``python -m clockwork.cluster.settings_doc``).

A bad value is refused with one line that names the key, the value and what is
expected (``validate`` / ``error_line``)::

    cluster.noise: must be a finite number in [0, 10], got nan
    unknown setting 'cluster.wokers' (did you mean 'cluster.workers'?)

Time settings of the scheduler and the baselines are stored as int nanoseconds but
written in a unit in a table (``default_slo_ms = 100``): such a field is declared with
``setting(..., units=("ms",))`` and ``from_table`` reads the table form. Those schemas
live beside their code (``controller/config.py``, ``controller/baselines/``) and use
this module; this module imports nothing from ``controller/`` or ``worker/``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

import annotated_types as at
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from clockwork.names import BASE_NAME, BASE_NAME_RULE
from clockwork.sizes import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_COPIES,
    MAX_GPUS,
    MAX_GPUS_PER_WORKER,
    MAX_INSTANCES,
    MAX_NOISE,
    MAX_OFFERED_REQUESTS,
    MAX_PAGES,
    MAX_SEED,
    MAX_SLOW_FACTOR,
    MAX_TENSOR_ROW_BYTES,
    MAX_WORKERS,
    PAGE_SIZE,
)
from clockwork.time import MAX_SLO_FACTOR, MAX_SLO_MS, MAX_TIME_S, NS_PER_S

# ----------------------------------------------------------------------------- base


class SettingsError(ValueError):
    """A setting is unknown or has a bad value; the message is one line."""


CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
# a schema names its table in messages ("unknown <settings_name> setting 'x'") with a
# ``settings_name: ClassVar[str]``


class Settings(BaseModel):
    """Base class of every settings schema."""

    model_config = CONFIG
    settings_name: ClassVar[str] = ""  # names the table in "unknown <name> setting 'x'"


M = TypeVar("M")
S = TypeVar("S")


# time units of table keys (``<field>_<unit>``) -> nanoseconds per unit
UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000}
UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}


def setting(default: Any = PydanticUndefined, description: str = "", *,
            units: Sequence[str] = (), expected: str | None = None,
            default_text: str | None = None, type_text: str | None = None,
            allowed_text: str | None = None, **constraints: Any) -> Any:
    """A ``Field`` with a description and what this module needs to know about it:
    ``units``, a time setting stored in int ns and written ``<name>_<unit>`` in a table
    (the first unit is the documented one); ``expected``, the error text for a bad value
    when the type and range say too little; ``default_text``, ``type_text`` and
    ``allowed_text``, what the docs should state where the schema says too little (a
    ``None`` default that means "computed", a free-form type). A time setting with
    ``units`` and no upper bound of its own is at most a year (``MAX_TIME_S``)."""
    extra: dict[str, Any] = {}
    if units:
        extra["units"] = list(units)
        if "le" not in constraints and "lt" not in constraints:
            constraints["le"] = MAX_TIME_S * NS_PER_S  # (int ns) at most a year
    if expected:
        extra["expected"] = expected
    for k, v in (("default_text", default_text), ("type_text", type_text),
                 ("allowed_text", allowed_text)):
        if v:
            extra[k] = v
    return Field(default, description=description, json_schema_extra=extra or None,
                 **constraints)


def _extra(info: FieldInfo | None) -> dict:
    e = info.json_schema_extra if info is not None else None
    return e if isinstance(e, dict) else {}


def units_of(info: FieldInfo) -> list[str]:
    return list(_extra(info).get("units", ()))


# ----------------------------------------------------------------------------- messages


def show(value: Any) -> str:
    """A value as the message shows it (TOML words for booleans and non-finite floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _unwrap(tp: Any) -> tuple[Any, list]:
    """Strip ``Annotated`` and ``| None``; return the type and its constraint metadata."""
    meta: list = []
    while True:
        if typing.get_origin(tp) is Annotated:
            args = typing.get_args(tp)
            tp = args[0]
            for m in args[1:]:
                if isinstance(m, FieldInfo):
                    meta.extend(m.metadata)
                    meta.append(m)
                else:
                    meta.append(m)
            continue
        if typing.get_origin(tp) in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp, meta


def _is_model(tp: Any) -> bool:
    """A schema: a pydantic model or a pydantic dataclass."""
    return isinstance(tp, type) and (issubclass(tp, BaseModel) or (
        dataclasses.is_dataclass(tp) and hasattr(tp, "__pydantic_fields__")))


def fields_of(cls: Any) -> dict[str, FieldInfo]:
    """A schema's fields (a pydantic model's or a pydantic dataclass's)."""
    f = cls.__dict__.get("__pydantic_fields__") if isinstance(cls, type) else None
    return f if f is not None else cls.model_fields


def _resolve(model: type[BaseModel], loc: Sequence[Any]) -> tuple[Any, list, FieldInfo | None] | None:
    """The type, constraints and field of the value at ``loc`` (None when unknown, e.g.
    a free-form key)."""
    tp: Any = model
    meta: list = []
    info: FieldInfo | None = None
    for i, part in enumerate(loc):
        tp, m = _unwrap(tp)
        if _is_model(tp):
            f = fields_of(tp).get(part) if isinstance(part, str) else None
            if f is None:
                return None
            tp, meta, info = f.annotation, list(f.metadata) + [f], f
            continue
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (list, tuple, Sequence) and isinstance(part, int) and args:
            tp, meta, info = args[0], [], None
        elif origin in (dict, Mapping) and len(args) == 2:
            if i + 1 < len(loc) and loc[i + 1] == "[key]":
                return (*_unwrap(args[0]), None)
            tp, meta, info = args[1], [], None
        elif part == "[key]":
            return None
        else:
            return None
    tp, m = _unwrap(tp)
    return tp, meta + m, info


def _bounds(meta: list, scale: float = 1.0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in meta:
        for k in ("ge", "gt", "le", "lt"):
            v = getattr(m, k, None)
            if v is not None and not isinstance(m, FieldInfo):
                out[k] = v / scale if scale != 1.0 else v
    return out


# the time bounds (``clockwork.time``) in each unit a setting is written or kept in, and
# their words: a range up to one of them reads "(at most a day)" instead of the number
_TIME_WORDS = {v * k: words for v, words in ((MAX_SLO_MS / 1e3, "a day"),
                                             (MAX_TIME_S, "a year"))
               for k in (1, 1e3, 1e6, 1e9)}


def range_text(meta: list, scale: float = 1.0) -> str:
    """``">= 0"``, ``"in (0, 1]"``, ``">= 0 (at most a year)"``, ... from the
    constraints; "" when unbounded."""
    b = _bounds(meta, scale)
    lo = ("[", b["ge"]) if "ge" in b else ("(", b["gt"]) if "gt" in b else None
    hi = ("]", b["le"]) if "le" in b else (")", b["lt"]) if "lt" in b else None
    if hi and hi[0] == "]" and hi[1] in _TIME_WORDS:
        below = range_text([m for m in meta if getattr(m, "le", None) is None], scale)
        return f"{below} (at most {_TIME_WORDS[hi[1]]})".lstrip()
    if lo and hi:
        return f"in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}"
    if hi:
        return f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}"
    return ""


def _min_len(meta: list) -> int:
    return max([m.min_length for m in meta if isinstance(m, at.MinLen)] or [0])


def expected(tp: Any, meta: list, info: FieldInfo | None = None, scale: float = 1.0) -> str:
    """What a value must be, as words: "an integer >= 1", "a finite number in [0, 1]"."""
    override = _extra(info).get("expected")
    if override:
        return override
    for m in meta:
        if isinstance(m, FieldInfo) and _extra(m).get("expected"):
            return _extra(m)["expected"]
    rng = range_text(meta, scale)
    if tp is bool:
        return "true or false"
    if tp is int:
        return f"an integer {rng}".rstrip()
    if tp is float:
        return f"a finite number {rng}".rstrip()
    if tp is str:
        return "a non-empty string" if _min_len(meta) else "a string"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if _is_model(tp) or typing.get_origin(tp) in (dict, Mapping) or tp is dict:
        return "a table"
    if typing.get_origin(tp) in (list, tuple, Sequence) or tp in (list, tuple):
        return "a non-empty list" if _min_len(meta) else "a list"
    return "a valid value"


def _key(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts)


def unknown_key_line(key: Sequence[Any], known: Sequence[str], name: str = "",
                     note: str = "") -> str:
    """``unknown scheduler setting 'max_batc' (did you mean 'max_batch'?)``: ``key`` is the
    full location; ``known`` the valid names beside it; ``name`` names the table when the
    key is a bare name."""
    *parent, last = list(key)
    what = f"unknown {name} setting" if name and not parent else "unknown setting"
    # (the keys that begin with the one given first: 'load_factor' -> 'load_factor_max',
    # 'load_factor_start' or 'load_factor_step', not the closer-spelled 'slo_factor')
    begun = sorted(k for k in known if str(last) and k.startswith(str(last))
                   and k != str(last))
    close = begun if 0 < len(begun) <= 4 else \
        difflib.get_close_matches(str(last), list(known), n=1, cutoff=0.6)
    if close:
        names = [repr(_key([*parent, k])) for k in close]
        hint = (f" (did you mean {names[0]}?)" if len(names) == 1 else
                f" (did you mean {', '.join(names[:-1])} or {names[-1]}?)")
    elif known:
        hint = f" (known: {', '.join(sorted(known))})"
    else:
        hint = ""
    return f"{what} {_key(key)!r}{hint}{note}"


def _table_keys(model: Any) -> list[str]:
    return list(fields_of(model)) if _is_model(model) else []


def error_line(exc: ValidationError, model: type[BaseModel], prefix: Sequence[Any] = (),
               name: str | None = None) -> str:
    """One line for the first error of ``exc`` (raised validating ``model``): the key
    (``prefix`` + the error's location, dotted), the bad value and what is expected."""
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc).splitlines()[0]
    # an unknown key first: a misspelt key is what makes the others wrong, and its line
    # has the hint ([[models]] nmae = ...: "models.0.name: required setting missing", and
    # [[model]]: "models: must be at least one [[models]] table", lost "did you mean")
    err = next((e for e in errors if e.get("type") in ("extra_forbidden",
                                                        "unexpected_keyword_argument")),
               errors[0])
    loc = tuple(err.get("loc", ()))
    typ = err.get("type", "")
    value = err.get("input")
    name = model.__dict__.get("settings_name", "") if name is None else name
    msg = str(err.get("msg", "invalid value")).replace("\n", " ")
    if typ in ("extra_forbidden", "unexpected_keyword_argument"):
        parent = _resolve(model, loc[:-1]) if loc[:-1] else (model, [], None)
        known = _table_keys(parent[0]) if parent else []
        return unknown_key_line((*prefix, *loc), known, name)
    if loc and loc[-1] == "[key]":
        where = _key((*prefix, *loc[:-2])) or name or "table"
        found = _resolve(model, loc)
        want = expected(*found) if found else "a valid key"
        return f"{where}: key {show(loc[-2])} must be {want}"
    key = _key((*prefix, *loc))
    found = _resolve(model, loc)
    if found is not None:
        want = expected(*found)
    elif msg.startswith("Input should be "):
        want = msg[len("Input should be "):]
    else:
        want = ""
    if typ == "missing":
        # a table that takes other keys too (a workload's): a key given that is close to
        # the missing one, and not a setting of the table itself, is named ([[workloads]]
        # knid = ...; not back_s for a kill's missing at_s)
        parent = _resolve(model, loc[:-1]) if loc[:-1] else (model, [], None)
        known = set(_table_keys(_unwrap(parent[0])[0])) if parent else set()
        close = difflib.get_close_matches(str(loc[-1]) if loc else "", [
            k for k in value if isinstance(k, str) and k not in known]
            if isinstance(value, Mapping) else [], n=1, cutoff=0.6)
        hint = f"; {close[0]!r} is given: misspelt?" if close else ""
        return f"{key}: required setting missing (must be {want or 'given'}{hint})"
    if typ in ("value_error", "assertion_error"):
        text = msg.split(", ", 1)[1] if msg.startswith(("Value error, ", "Assertion failed, ")) \
            else msg
        where = key or name
        return f"{where}: {text}" if where else text
    if want:
        return f"{key or name or 'value'}: must be {want}, got {show(value)}"
    return f"{key or name or 'value'}: {msg[:1].lower()}{msg[1:]}, got {show(value)}"


def validate(model: type[M], data: Any, *, prefix: Sequence[Any] = (), where: str = "",
             error: type[Exception] = SettingsError,
             explain: Callable[[ValidationError], str | None] | None = None) -> M:
    """``data`` (a table) as an instance of the schema ``model`` (a pydantic model, or a
    pydantic dataclass built with ``model(**data)``); a bad value raises ``error`` with
    one line (``where``, e.g. a file name, goes first): ``explain``'s for the error, if it
    gives one, else ``error_line``'s."""
    try:
        if issubclass(model, BaseModel):
            return model.model_validate(data)
        if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
            line = (f"{_key(prefix) or model.__dict__.get('settings_name') or 'value'}: "
                    f"must be a table, got {show(data)}")
            raise error(f"{where}: {line}" if where else line)
        return model(**data)
    except ValidationError as e:
        line = (explain(e) if explain is not None else None) or error_line(e, model, prefix)
        raise error(f"{where}: {line}" if where else line) from None


# ----------------------------------------------------------------------------- tables


_TABLES: dict[type, type[BaseModel]] = {}


def table_model(cls: type[Settings]) -> type[BaseModel]:
    """The schema of ``cls``'s table form: each time field ``x`` (int ns, ``units``)
    becomes the keys ``x_<unit>`` (finite numbers in that unit, same range)."""
    if cls in _TABLES:
        return _TABLES[cls]
    fields: dict[str, Any] = {}
    for fname, f in fields_of(cls).items():
        units = units_of(f)
        if not units:
            fields[fname] = (f.annotation, f)
            continue
        for u in units:
            b = _bounds(f.metadata, UNITS[u])
            fields[f"{fname}_{u}"] = (float | None, Field(None, description=f.description, **b))
    tm = create_model(f"{cls.__name__}Table", __config__=CONFIG, **fields)
    tm.settings_name = cls.settings_name  # type: ignore[attr-defined]
    _TABLES[cls] = tm
    return tm


def table_keys(cls: type[Settings]) -> list[str]:
    """The keys ``cls`` takes in a table (time fields under their unit names)."""
    return list(fields_of(table_model(cls)))


def from_table(cls: type[S], table: Mapping[str, Any] | None, *, prefix: Sequence[Any] = (),
               where: str = "", error: type[Exception] = SettingsError) -> S:
    """Build ``cls`` from its table form (time settings in their units, converted to int
    ns with ``round``); any bad key or value raises ``error`` with one line."""
    t = validate(table_model(cls), {} if table is None else table, prefix=prefix, where=where,
                 error=error)
    data: dict[str, Any] = {}
    unit_of: dict[str, str] = {}  # time field -> the unit it was given in
    for fname, f in fields_of(cls).items():
        units = units_of(f)
        if not units:
            if fname in t.model_fields_set:
                data[fname] = getattr(t, fname)
            continue
        given = [u for u in units if getattr(t, f"{fname}_{u}") is not None]
        if len(given) > 1:
            keys = " and ".join(_key((*prefix, f"{fname}_{u}")) for u in given)
            line = f"{keys}: give one of them, not both"
            raise error(f"{where}: {line}" if where else line)
        if given:
            data[fname] = round(getattr(t, f"{fname}_{given[0]}") * UNITS[given[0]])
            unit_of[fname] = given[0]

    def as_written(e: ValidationError) -> str | None:
        """A value the table's range took that its rounding to int ns does not (1e-9 ms
        > 0 is 0 ns): named as written, key and value."""
        err = (e.errors(include_url=False) or [{}])[0]
        loc = tuple(err.get("loc", ()))
        if len(loc) != 1 or loc[0] not in unit_of:
            return None
        fname, u = loc[0], unit_of[loc[0]]
        f = fields_of(cls)[fname]
        want = expected(float, list(f.metadata), f, UNITS[u])
        return (f"{_key((*prefix, f'{fname}_{u}'))}: must be {want}, got "
                f"{show(getattr(t, f'{fname}_{u}'))} (rounds to {data[fname]} ns)")

    return validate(cls, data, prefix=prefix, where=where, error=error, explain=as_written)


# ----------------------------------------------------------------------------- docs


def _type_word(tp: Any) -> str:
    if tp is bool:
        return "boolean"
    if tp is int:
        return "integer"
    if tp is float:
        return "number"
    if tp is str or typing.get_origin(tp) is Literal:
        return "string"
    if typing.get_origin(tp) in (list, tuple, Sequence):
        args = typing.get_args(tp)
        inner = _unwrap(args[0])[0] if args else Any
        return "array of tables" if _is_model(inner) else f"array of {_type_word(inner)}s"
    if _is_model(tp) or typing.get_origin(tp) in (dict, Mapping):
        return "table"
    return "any"


def _default_word(f: FieldInfo, scale: float = 1.0) -> str:
    text = _extra(f).get("default_text")
    if text:
        return text
    if f.is_required():
        return "required"
    d = f.get_default(call_default_factory=True)
    if d is None:
        return "not set"
    if isinstance(d, BaseModel):
        return "see below"
    if isinstance(d, bool):
        return f"`{'true' if d else 'false'}`"
    if isinstance(d, int | float):
        return f"`{_num(d / scale if scale != 1.0 else d)}`"
    if isinstance(d, str):
        return f'`"{d}"`'
    if isinstance(d, list) and not d:
        return "`[]`"
    return f"`{d!r}`"


def _allowed(tp: Any, meta: list, scale: float = 1.0) -> str:
    if typing.get_origin(tp) is Literal:
        return ", ".join(f'`"{a}"`' for a in typing.get_args(tp))
    if tp in (int, float):
        r = range_text(meta, scale)
        return r.removeprefix("in ") if r else "any"
    if tp is str:
        return "non-empty" if _min_len(meta) else ""
    if typing.get_origin(tp) in (list, tuple, Sequence) and _min_len(meta):
        return f"at least {_min_len(meta)}"
    return ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(cls: type[BaseModel], skip: Sequence[str] = ()) -> str:
    """The schema as a Markdown table: key (as written in a table), type, default,
    allowed values, description. Time fields are shown under their unit keys."""
    rows = ["| Key | Type | Default | Allowed | Description |",
            "|---|---|---|---|---|"]
    for fname, f in fields_of(cls).items():
        if fname in skip:
            continue
        tp, meta = _unwrap(f.annotation)
        meta = list(f.metadata) + meta
        units = units_of(f)
        if units:
            u = units[0]
            scale = float(UNITS[u])
            key = f"`{fname}_{u}`"
            if len(units) > 1:
                key += " (or " + ", ".join(f"`{fname}_{v}`" for v in units[1:]) + ")"
            typ = f"number ({UNIT_WORDS[u]})"
        else:
            scale = 1.0
            key, typ = f"`{fname}`", _extra(f).get("type_text") or _type_word(tp)
        allowed = _extra(f).get("allowed_text") or _allowed(tp if not units else float, meta,
                                                             scale)
        rows.append("| " + " | ".join(_cell(c) for c in (
            key, typ, _default_word(f, scale), allowed, f.description or "")) + " |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- scenario


class ClusterSettings(Settings):
    """``[cluster]``: the machines, the profile set and the emulation's noise."""

    settings_name: ClassVar[str] = "cluster"

    workers: int = setting(1, "Worker processes (machines).", ge=1, le=MAX_WORKERS)
    gpus_per_worker: int = setting(1, "GPUs on each worker.", ge=1, le=MAX_GPUS_PER_WORKER)
    profiles: str = setting(
        "v100-reference", "Profile set (its name, or a folder path) giving each model's "
        "LOAD and EXEC durations and the weights-cache size.", min_length=1)
    weights_cache_pages: int | None = setting(
        None, "Pages (16 MiB each) of each GPU's weights cache.", ge=1, le=MAX_PAGES,
        default_text="the profile set's")
    network_latency_ms: float = setting(
        0.1, "Simulator: one-way latency of every message between controller and worker, "
        "in milliseconds.", ge=0)
    jitter_ms: float = setting(
        0.0, "Simulator: uniform random extra delay added to each message, up to this many "
        "milliseconds (not emulated by live runs).", ge=0)
    noise: float = setting(
        0.0, "Emulated GPUs: relative standard deviation of each action's duration around "
        "its profile figure (0.05 = 5 %).", ge=0, le=MAX_NOISE)
    slow_prob: float = setting(
        0.0, "Emulated GPUs: probability that an action (an EXEC or a LOAD) is a "
        "straggler.", ge=0, le=1)
    slow_factor: float = setting(
        3.0, "Emulated GPUs: a straggler takes this many times its profile figure.", ge=1,
        le=MAX_SLOW_FACTOR)
    clock_offsets_ms: list[float] = setting(
        default_factory=list, description="Each worker's clock minus the controller's, in "
        "milliseconds (worker 0 first; missing workers: 0). Live runs start the emulated "
        "workers with `--clock-offset-ms`; the controller estimates the offsets from round "
        "trips.", expected="an array of numbers", type_text="array of numbers")
    clock_error_ms: float = setting(
        0.0, "Simulator: the controller's estimate of each worker's clock offset is off by "
        "up to this many milliseconds (drawn once per worker).", ge=0)
    device: Literal["emulated", "cpu", "cuda"] = setting(
        "emulated", "Live runs (`clockwork serve`, `--live`): what the workers execute on. "
        "`emulated` sleeps for the profile figures; `cpu` and `cuda` run compiled model "
        "packages. The simulator always emulates.")
    packages: str | None = setting(
        None, "Live runs on `cpu`/`cuda`: folder of compiled model packages.",
        default_text="`packages/<device>`", min_length=1)
    backend: Literal["local", "ray"] = setting(
        "local", "Live runs (`clockwork serve`): where the workers run. `local`: `workers` "
        "child processes on this machine; `ray`: one worker per Ray node, a Ray actor "
        "holding that node's GPUs (`workers` and `gpus_per_worker` then come from the Ray "
        "cluster: the one `$RAY_ADDRESS` names, else one started on this machine; needs "
        "the `ray` extra). `clockwork serve --ray [ADDRESS]` picks `ray` too. The "
        "simulator ignores it.")


class ModelEntry(Settings):
    """One ``[[models]]`` entry."""

    settings_name: ClassVar[str] = "model"

    name: str = setting(description="Model name: a profile of the profile set.", min_length=1,
                        pattern=rf"^{BASE_NAME.pattern}$", expected=f"a model name: {BASE_NAME_RULE}")
    copies: int = setting(
        1, "Instances of the model; copy k > 0 is named `name:k` and has its own weights "
        "and requests.", ge=1, le=MAX_COPIES)


def _has_nonfinite(value: Any) -> bool:
    """Whether ``value`` holds nan or an infinity, or an integer no float can hold
    (beyond ~1.8e308: each number is used as a float)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return not _fits_float(value)
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def _fits_float(v: int) -> bool:
    """Whether the integer ``v`` converts to a float (|v| below ~1.8e308)."""
    try:
        float(v)
    except OverflowError:
        return False
    return True


def _selector(value: Any) -> Any:
    ok = (isinstance(value, str) and value) or (
        isinstance(value, list) and value and all(isinstance(v, str) and v for v in value))
    if value is not None and not ok:
        raise PydanticCustomError("selector", "Input should be a model name or glob, or a "
                                  "list of them")
    return value


class WorkloadEntry(Settings):
    """One ``[[workloads]]`` entry. The keys below mean the same in every kind that takes
    them and are type-checked here; their ranges, and the other keys, depend on the kind
    and are checked when the workload is built (``clockwork.workloads``). Every number
    must be finite."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    settings_name: ClassVar[str] = "workload"
    kind: str = setting(
        description="Arrival process: `poisson`, `fixed_rate`, `closed_loop`, `azure` or a "
        "named workload; the other keys of the entry depend on it.", min_length=1)
    models: Annotated[Any, AfterValidator(_selector)] = setting(
        None, "Which model instances get requests: a model name (all its copies), an "
        "instance name (`m:1`) or a glob, or a list of them.", default_text='`"*"` (all)',
        expected="a model name or glob, or a list of them",
        type_text="string or array of strings", allowed_text="non-empty")
    rate_rps: float | None = setting(
        None, "Open-loop kinds: requests per second in total, spread over the selected "
        "instances (for `bursty`, the rate between bursts); `fixed_rate` sends them evenly "
        "spaced, the first at the start. With every other `*_rps` key, times `duration_s`, "
        "at most the requests a run may offer (above).")
    slo_ms: float | None = setting(
        None, "SLO of each request, in milliseconds.",
        default_text="the scheduler's `default_slo_ms`")
    slo_factor: float | None = setting(
        None, "SLO as a multiple of the model's batch-1 EXEC time (instead of `slo_ms`); at most a day, as `slo_ms`.",
        le=MAX_SLO_FACTOR)
    concurrency: int | None = setting(
        None, "Closed-loop kinds: requests kept outstanding per instance.",
        default_text="`1`", le=MAX_CONCURRENCY)
    think_ms: float | None = setting(
        None, "Closed-loop kinds: pause after a reply before the next request, in "
        "milliseconds.", default_text="`0`")
    retry_ms: float | None = setting(
        None, "Closed-loop kinds: pause after a failed request before the next one, in "
        "milliseconds (the longer of it and `think_ms`).", default_text="`1`")


class SchedulerTable(Settings):
    """``[scheduler]`` as a scenario file holds it: the policy, and that policy's settings
    (checked by the policy's schema where the policy is built)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    settings_name: ClassVar[str] = "scheduler"

    policy: str = setting("clockwork", "Scheduling policy: `clockwork`, or a baseline: "
                          "`clipper`, `tfserving`, `infaas`.", min_length=1)


# a length of time in seconds (a float, as written) that must not round to 0 ns: 1e-12 s
# was taken (a run of no time, a hang resumed as it began) where a setting in ns said
# "(rounds to 0 ns)"
AT_LEAST_A_NS: dict[str, Any] = {
    "ge": 1e-9, "expected": "a number of seconds >= 1e-9 (1 ns)",
    "allowed_text": ">= 1e-9 (1 ns)"}


class KillFault(Settings):
    """One ``[[faults.kill]]`` entry: a worker process dies and later restarts."""

    settings_name: ClassVar[str] = "faults.kill"

    worker: int = setting(description="Index of the worker (0-based).", ge=0)
    at_s: float = setting(description="When it dies, in seconds from the start.", ge=0)
    back_s: float | None = setting(
        None, "When it is restarted (an empty weights cache), in seconds from the start; "
        "after `at_s`.", default_text="never", gt=0)

    @model_validator(mode="after")
    def _back_after_death(self) -> KillFault:
        if self.back_s is not None and self.back_s <= self.at_s:
            raise ValueError(f"back_s ({self.back_s:g}) must be after at_s ({self.at_s:g})")
        return self


class HangFault(Settings):
    """One ``[[faults.hang]]`` entry: a worker stops (SIGSTOP) and resumes (SIGCONT)."""

    settings_name: ClassVar[str] = "faults.hang"

    worker: int = setting(description="Index of the worker (0-based).", ge=0)
    at_s: float = setting(description="When it stops, in seconds from the start.", ge=0)
    for_s: float = setting(description="How long it stays stopped, in seconds.",
                           **AT_LEAST_A_NS)


class SlowNetworkFault(Settings):
    """One ``[[faults.slow_network]]`` entry: messages to and from a worker take longer."""

    settings_name: ClassVar[str] = "faults.slow_network"

    worker: int = setting(description="Index of the worker (0-based).", ge=0)
    at_s: float = setting(description="When it starts, in seconds from the start.", ge=0)
    for_s: float = setting(description="How long it lasts, in seconds.", **AT_LEAST_A_NS)
    delay_ms: float = setting(description="Extra one-way delay of each message, in "
                              "milliseconds.", gt=0)


class ControllerRestartFault(Settings):
    """One ``[[faults.controller_restart]]`` entry: the controller dies, a new one starts.

    The new controller takes the workers over."""

    settings_name: ClassVar[str] = "faults.controller_restart"

    at_s: float = setting(description="When the controller dies, in seconds from the start. "
                          "Every request it had not answered fails then.", ge=0)
    down_s: float = setting(
        1.0, "How long until the new controller starts, in seconds (process start-up); "
        "requests that arrive meanwhile wait for it (their clients retry), and those that "
        "can no longer meet their SLO then time out.", ge=0)
    fresh_caches: bool = setting(
        False, "The new controller empties the workers' weights caches (as "
        "`clockwork controller --fresh-caches`); by default it takes over the weights "
        "they hold (the clockwork policy only).")


def _overlap(spells: list[tuple[float, float, str]]):
    """The first of ``spells`` (start, end, name) to start before an earlier one has
    ended, with the one it overlaps (the latest-ending before it), or None."""
    last = None
    for spell in sorted(spells):
        if last is not None and spell[0] < last[1]:
            return spell, last
        if last is None or spell[1] > last[1]:
            last = spell
    return None


class FaultSettings(Settings):
    """``[faults]``: faults injected into a run. The simulator models each one in its
    network and workers, deterministically; a live run (`clockwork serve --replay`)
    kills, restarts, stops and resumes the worker processes, and kills and restarts the
    controller, at the same times (`slow_network` is simulator-only)."""

    settings_name: ClassVar[str] = "faults"

    kill: list[KillFault] = setting(default_factory=list, description="Workers that die "
                                    "(and perhaps restart): `{worker, at_s, back_s}`.")
    hang: list[HangFault] = setting(default_factory=list, description="Workers that stop "
                                    "for a while: `{worker, at_s, for_s}`. A worker's kills "
                                    "and hangs may not overlap.")
    slow_network: list[SlowNetworkFault] = setting(
        default_factory=list, description="Slow links: `{worker, at_s, for_s, delay_ms}` "
        "(simulator only).")
    controller_restart: list[ControllerRestartFault] = setting(
        default_factory=list, description="Controller restarts: `{at_s, down_s, "
        "fresh_caches}` (not with `kill` or `hang`, nor with `[[repository]]`, "
        "`[[add_workers]]` or `[[remove_workers]]` entries: a new controller starts from "
        "the `[[models]]` list and the workers at the start).")
    detect_ms: float = setting(
        1.0, "Simulator: how long after a worker dies the controller sees its connection "
        "close, in milliseconds.", ge=0)
    reconnect_s: float = setting(
        0.7, "Simulator: how long after a worker restarts the controller is connected to it "
        "again (process start-up and the controller's retry), in seconds.", ge=0)

    @model_validator(mode="after")
    def _one_fault_at_a_time(self) -> FaultSettings:
        """A worker's kills (until their back_s, or the end) and hangs do not overlap:
        what two at once mean is not defined (the simulator merged overlapping hangs
        while a live run resumed at the first one's end; a second kill of a dead worker
        made the live restart fail)."""
        spans: dict[int, list[tuple[float, float, str]]] = {}
        for i, f in enumerate(self.kill):
            end = f.back_s if f.back_s is not None else math.inf
            spans.setdefault(f.worker, []).append((f.at_s, end, f"kill.{i}"))
        for i, f in enumerate(self.hang):
            spans.setdefault(f.worker, []).append((f.at_s, f.at_s + f.for_s, f"hang.{i}"))
        for w, ws in sorted(spans.items()):
            if hit := _overlap(ws):
                (start, _, name), (_, end, last) = hit
                until = "the end" if end == math.inf else f"{end:g} s"
                raise ValueError(f"{name} of worker {w} (at {start:g} s) overlaps {last} "
                                 f"(until {until}): one kill or hang of a worker at a time")
        # a worker's slow links do not overlap either (the first to end set the link fast
        # again: a short slow spell inside a long one cancelled the long one's rest)
        slow: dict[int, list[tuple[float, float, str]]] = {}
        for i, f in enumerate(self.slow_network):
            slow.setdefault(f.worker, []).append((f.at_s, f.at_s + f.for_s,
                                                  f"slow_network.{i}"))
        for w, ws in sorted(slow.items()):
            if hit := _overlap(ws):
                (start, _, name), (_, end, first) = hit
                raise ValueError(f"{name} of worker {w} (at {start:g} s) overlaps {first} "
                                 f"(until {end:g} s): one slow link of a worker at a "
                                 "time (split them into spells that follow one another)")
        return self


class RepositoryEvent(Settings):
    """One ``[[repository]]`` entry: a model unloaded, or loaded again, while the run goes
    on, as the model repository's unload and load calls do on a live controller."""

    settings_name: ClassVar[str] = "repository"

    at_s: float = setting(description="When, in seconds from the start.", ge=0)
    unload: str | None = setting(
        None, "Stop serving this: a `[[models]]` name (every copy of it still served) or "
        "one copy's instance name (`name:k`, k >= 1: the first copy goes by the model's "
        "name, which unloads every copy). Its queued requests are answered at once, "
        "`INVALID_REQUEST` (reason `unknown_model`), and so are those that arrive while it "
        "is not served; what runs finishes; its copies are evicted.",
        default_text="none", pattern=r"^\S+$", expected="a model or instance name")
    load: str | None = setting(
        None, "Serve this again, as `[[models]]` lists it: a model name (its copies not "
        "served then, at least one), or one copy's instance name unloaded alone (some other "
        "copy of its model still served). Loaded on demand, as at the start. A load when no "
        "worker is connected and answering fails (said on stderr), as the live repository "
        "refuses it.",
        default_text="none", pattern=r"^\S+$", expected="a model or instance name")

    @model_validator(mode="after")
    def _one_of(self) -> RepositoryEvent:
        if (self.unload is None) == (self.load is None):
            raise ValueError("give one of unload or load")
        return self


class AddWorkersEvent(Settings):
    """One ``[[add_workers]]`` entry: workers that join the cluster while the run goes on,
    as ``clockwork.Client.add_worker`` adds them to a live controller."""

    settings_name: ClassVar[str] = "add_workers"

    at_s: float = setting(description="When they join, in seconds from the start.", ge=0)
    count: int = setting(1, "How many workers join (each with `cluster.gpus_per_worker` "
                         "GPUs and empty weights caches); they take the next worker indices "
                         "after `cluster.workers` and the workers that joined before.",
                         ge=1, le=MAX_WORKERS)


class RemoveWorkersEvent(Settings):
    """One ``[[remove_workers]]`` entry: a worker that leaves the cluster for good while
    the run goes on, as ``clockwork.Client.remove_worker`` takes one out of a live
    controller."""

    settings_name: ClassVar[str] = "remove_workers"

    at_s: float = setting(description="When it leaves, in seconds from the start.", ge=0)
    worker: int = setting(description="Which worker: its index (those at the start are 0 "
                          "... `cluster.workers` - 1; those `[[add_workers]]` adds follow, "
                          "and must have joined by `at_s`).", ge=0, le=MAX_WORKERS)
    drain: bool = setting(False, "Leave gently: from `at_s` nothing more is placed on the "
                          "worker's GPUs, but the actions it has in flight run to their "
                          "end there (their requests answered as usual); it is taken out "
                          "once none is left. False: taken out at once, its actions in "
                          "flight failed and their requests placed again elsewhere or "
                          "answered.")


class ScenarioSettings(Settings):
    """A scenario file (top level)."""

    settings_name: ClassVar[str] = "top-level"

    name: str | None = setting(None, "Title shown in reports (default: the file's name).",
                               pattern=r"^[^\x00-\x1f\x7f]*$",
                               expected="one line of text (no control characters)")
    description: str | None = setting(None, "Free text.")
    seed: int = setting(1, "Seed of every random choice; the same seed gives the same run.",
                        ge=0, le=MAX_SEED, allowed_text="[0, 2^63 - 1]",
                        expected="an integer in [0, 2^63 - 1]")
    duration_s: float = setting(60.0, "Seconds of (virtual) time during which requests "
                                "are submitted.", **AT_LEAST_A_NS)
    drain_s: float = setting(120.0, "Simulator: seconds after `duration_s` to wait for "
                             "outstanding requests before the run stops.", ge=0)
    cluster: ClusterSettings = setting(
        default_factory=ClusterSettings, description="The `[cluster]` table.")
    scheduler: SchedulerTable = setting(
        default_factory=SchedulerTable, description="The `[scheduler]` table.")
    models: list[ModelEntry] = setting(
        description="The `[[models]]` entries: which models are served.", min_length=1,
        expected="at least one [[models]] table")
    workloads: list[WorkloadEntry] = setting(
        description="The `[[workloads]]` entries: who sends requests.", min_length=1,
        expected="at least one [[workloads]] table")
    faults: FaultSettings = setting(
        default_factory=FaultSettings, description="The `[faults]` table.")
    add_workers: list[AddWorkersEvent] = setting(
        default_factory=list, description="The `[[add_workers]]` entries: workers that join "
        "the cluster during the run (`{at_s, count}`; `cluster.workers` are those at the "
        "start). The simulator plays them, and so does `clockwork serve --replay`, which "
        "starts their processes before the run and has the controller connect them then.")
    remove_workers: list[RemoveWorkersEvent] = setting(
        default_factory=list, description="The `[[remove_workers]]` entries: workers that "
        "leave the cluster for good during the run (`{at_s, worker}`). The simulator plays "
        "them, and so does `clockwork serve --replay`, through the controller.")
    repository: list[RepositoryEvent] = setting(
        default_factory=list, description="The `[[repository]]` entries: models unloaded "
        "and loaded again during the run (`{at_s, unload}` or `{at_s, load}`). The "
        "simulator plays them, and so does `clockwork serve --replay`, through the "
        "controller's model repository.")


def scenario_defaults() -> dict[str, Any]:
    """The defaults a scenario starts from (before the file and the overrides)."""
    d = ScenarioSettings.model_construct(models=[], workloads=[])
    return d.model_dump(exclude_none=True)


def check_scenario(data: Any, where: str = "", error: type[Exception] = SettingsError) -> dict:
    """Validate a scenario's merged data; return it as plain values, defaults filled."""
    sc = validate(ScenarioSettings, data, where=where, error=error)
    for i, w in enumerate(sc.workloads):  # the kind's own keys: numbers must be finite
        for key, value in (w.model_extra or {}).items():
            if _has_nonfinite(value):
                want = ("a finite number" if isinstance(value, float) else
                        "a number a float can hold (at most ~1.8e308)"
                        if isinstance(value, int) else "free of nan and inf")
                line = f"workloads.{i}.{key}: must be {want}, got {show(value)}"
                raise error(f"{where}: {line}" if where else line)
    out = sc.model_dump(exclude_none=True)
    line = _time_too_long(out, ()) or _too_big(sc) or _offers_too_many(sc)
    if line:
        raise error(f"{where}: {line}" if where else line)
    return out


def _too_big(sc: ScenarioSettings) -> str | None:
    """The message for a scenario whose GPUs or instances in all exceed their bound."""
    c = sc.cluster
    if c.workers * c.gpus_per_worker > MAX_GPUS:
        return (f"cluster: workers x gpus_per_worker must be at most {MAX_GPUS:,} GPUs in "
                f"all, got {c.workers:,} x {c.gpus_per_worker} = "
                f"{c.workers * c.gpus_per_worker:,}")
    total = sum(m.copies for m in sc.models)
    if total > MAX_INSTANCES:
        return (f"models: the copies of all entries must be at most {MAX_INSTANCES:,} "
                f"instances in all, got {total:,} ({len(sc.models)} entries)")
    return None


def count_text(n: float) -> str:
    """A count of requests in a message: ``1,200,000,000``; ``2e+300`` when the digits
    would say nothing more."""
    return f"{n:,.0f}" if n < 1e15 else f"{n:.3g}"


def _offers_too_many(sc: ScenarioSettings) -> str | None:
    """The message for a scenario whose open-loop rates (every ``*_rps`` key of every
    ``[[workloads]]`` entry) x ``duration_s`` offer more than ``MAX_OFFERED_REQUESTS``
    requests in all (each workload checks its own figure again when it is built, with its
    default rates and trace)."""
    total, most = 0.0, None
    for i, w in enumerate(sc.workloads):
        rates = {"rate_rps": w.rate_rps, **{k: v for k, v in (w.model_extra or {}).items()
                                            if k.endswith("_rps")}}
        for key, v in rates.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                n = float(v) * sc.duration_s
                total += n
                if most is None or n > most[0]:
                    most = (n, f"workloads.{i}.{key}", v)
    if most is None or total <= MAX_OFFERED_REQUESTS:
        return None
    n, key, v = most
    if n > MAX_OFFERED_REQUESTS:
        return (f"{key}: {v:g} r/s x duration_s {sc.duration_s:g} offers "
                f"{count_text(n)} requests, more than a run may offer "
                f"({MAX_OFFERED_REQUESTS:,})")
    return (f"workloads: the rates of all entries x duration_s {sc.duration_s:g} offer "
            f"{count_text(total)} requests (the most: {key}, {v:g} r/s), more than a run "
            f"may offer ({MAX_OFFERED_REQUESTS:,})")


def time_bound(key: str) -> tuple[float, str] | None:
    """The most a setting named ``key`` may be, by its name, and that bound in words: an
    SLO (``slo_ms``, ``slo_ms_start``, ``default_slo_ms``, ...) a day, an SLO factor (``slo_factor...``)
    10,000, any other time (a name ending in ``_s``, ``_ms`` or ``_us``) a year; None for
    a setting that is neither."""
    if key in ("slo_ms", "default_slo_ms") or key.startswith("slo_ms_"):
        return MAX_SLO_MS, "a day"  # (slo_ms_start, slo_ms_max, the scheduler's default)
    if key.startswith("slo_factor"):
        return MAX_SLO_FACTOR, "the most an SLO factor may be"
    if key.endswith("_s"):
        return MAX_TIME_S, "a year"
    if key.endswith("_ms"):
        return MAX_TIME_S * 1e3, "a year"
    if key.endswith("_us"):
        return MAX_TIME_S * 1e6, "a year"
    return None


def _time_too_long(v: Any, path: tuple, key: str = "") -> str | None:
    """The message for the first time in a scenario's data ``v`` (tables, arrays; an
    array's numbers go by the array's name) beyond its ``time_bound`` either way (clock
    offsets may be negative), or None."""
    if isinstance(v, dict):
        for k, x in v.items():
            line = _time_too_long(x, (*path, k), k if isinstance(k, str) else "")
            if line:
                return line
    elif isinstance(v, list):
        for j, x in enumerate(v):
            line = _time_too_long(x, (*path, j), key)
            if line:
                return line
    elif isinstance(v, int | float) and not isinstance(v, bool):
        bound = time_bound(key)
        if bound is not None and abs(v) > bound[0] and (
                isinstance(v, int) or math.isfinite(v)):  # (inf: the schema of its table
            # says what is expected there; an integer of any size is too long here)
            side = f"at most {bound[0]:,.0f}" if v > 0 else f"at least {-bound[0]:,.0f}"
            return f"{_key(path)}: must be {side} ({bound[1]}), got {show(v)}"
    return None


# ----------------------------------------------------------------------------- profiles


def _batch_key(k: Any) -> Any:
    # (a batch size as written: "01" is not 1, as two keys "1" and "01" were one)
    if isinstance(k, str) and k.isdigit() and k.isascii() and str(int(k)) == k:
        return int(k)
    return k


BatchSize = Annotated[int, BeforeValidator(_batch_key),
                     Field(ge=1, le=MAX_BATCH_SIZE, json_schema_extra={
                         "expected": f"a batch size (an integer, 1 to {MAX_BATCH_SIZE:,})"})]
Positive = Annotated[int, Field(ge=1)]
# a duration in ns a profile states: at most a year (a LOAD of 2**63 ns was taken, and
# could never fit a window; the simulator dropped every request of the model)
DurationNs = Annotated[int, Field(ge=1, le=MAX_TIME_S * NS_PER_S)]


# The element types a model's tensors may have: those the KServe v2 protocol carries
# (BOOL, UINT8 ... FP64), by their numpy names.
TENSOR_DTYPES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
                 "int64", "float16", "float32", "float64")


def _tensor_dtype(v: str) -> str:
    """A tensor's element type by its numpy name (``float`` -> ``float64``); one of
    ``TENSOR_DTYPES`` (a type clients cannot send or read was served, and failed at the
    first request)."""
    import numpy as np

    try:
        name = np.dtype(v).name
    except (TypeError, ValueError):
        name = None
    if name not in TENSOR_DTYPES:
        raise ValueError(f"{v!r} is not an element type a model may have; one of "
                         f"{', '.join(TENSOR_DTYPES)}")
    return name


class TensorEntry(Settings):
    """An input or output tensor of a profile file."""

    settings_name: ClassVar[str] = "tensor"

    name: str = setting(description="Tensor name.", min_length=1)
    shape: list[Positive] = setting(description="Dimensions, without the batch dimension.",
                                    allowed_text="each >= 1")
    dtype: Annotated[str, AfterValidator(_tensor_dtype)] = setting(
        description="Element type: a numpy dtype name of a type the KServe v2 protocol "
        "carries (bool, uint8/16/32/64, int8/16/32/64, float16/32/64; another spelling of "
        "one, such as `float`, is read as its name).", min_length=1)

    @model_validator(mode="after")
    def _a_row_fits_a_message(self) -> TensorEntry:
        """One row (the shape's elements, of the dtype) at most ``MAX_TENSOR_ROW_BYTES``."""
        import math

        import numpy as np

        size = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if size > MAX_TENSOR_ROW_BYTES:
            raise ValueError(f"tensor {self.name!r}: a row of shape {self.shape} of "
                             f"{self.dtype} is {size:,} bytes, more than a message carries "
                             f"({MAX_TENSOR_ROW_BYTES:,})")
        return self


class ProfileSetFile(Settings):
    """A profile set's ``set.json`` (``profiles/<set>/set.json``): the set's defaults."""

    settings_name: ClassVar[str] = "profile set"

    name: str | None = setting(None, "Title of the set (free text; the set is named by its "
                               "folder).")
    description: str | None = setting(None, "Free text.")
    device: str | None = setting(None, "Device kind of the set's figures (free text).")
    source: str | None = setting(None, "How the set's defaults were obtained (free text).")
    weights_cache_pages: int = setting(
        1376, "Pages (16 MiB each) of each GPU's weights cache, unless the scenario's "
        "`cluster.weights_cache_pages` says otherwise (1376: Clockwork's on a 32 GB V100).",
        ge=1, le=MAX_PAGES)


class ProfileFile(Settings):
    """A profile file (``profiles/<set>/<model>.json``)."""

    settings_name: ClassVar[str] = "profile"

    model: str = setting(description="Model name.", min_length=1,
                         pattern=rf"^{BASE_NAME.pattern}$", expected=f"a model name: {BASE_NAME_RULE}")
    device: str = setting("unknown", "Device kind the figures were measured or modelled on.")
    weights_bytes: int = setting(description="Size of the weights in bytes.", ge=1)
    weights_pages: int = setting(
        0, "Weights-cache pages (16 MiB) the weights take; 0 computes them from "
        "`weights_bytes`.", ge=0)
    load_ns: int = setting(description="Duration of a LOAD (weights to the GPU), ns.", ge=1,
                           le=MAX_TIME_S * NS_PER_S)
    exec_ns: dict[BatchSize, DurationNs] = setting(
        description="Duration of an INFER, ns, per compiled batch size (keys: batch sizes).",
        min_length=1, expected="a non-empty table of batch size -> ns",
        allowed_text="keys: batch sizes 1 to 65,536; values >= 1 (at most a year); at least "
        "one")
    inputs: list[TensorEntry] = setting(default_factory=list, description="Input tensors.")
    outputs: list[TensorEntry] = setting(default_factory=list, description="Output tensors.")
    source: dict[str, str] = setting(
        default_factory=dict, description="Per figure, how it was obtained (measured: how, "
        "where; or modelled: the formula).")

    @model_validator(mode="after")
    def _pages_hold_the_weights(self) -> ProfileFile:
        """``weights_pages``, when given, at least what ``weights_bytes`` fills (a 46.7 MB
        model said to take 1 page ran in a cache 2 pages too small)."""
        least = -(-self.weights_bytes // PAGE_SIZE)
        if self.weights_pages and self.weights_pages < least:
            raise ValueError(f"weights_pages is {self.weights_pages}, fewer than the "
                             f"{least} pages of {PAGE_SIZE >> 20} MiB that weights_bytes "
                             f"({self.weights_bytes:,}) takes (0 computes them)")
        return self
