"""Arrival processes. ``build_workload`` turns a scenario's ``[[workloads]]`` entry
into an object; ``KINDS`` lists what exists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from clockwork.resources import find_data_path
from clockwork.settings import unknown_key_line
from clockwork.workloads.azure import resolve_trace_path
from clockwork.workloads.azure_replay import AZURE_KEYS, build_azure
from clockwork.workloads.base import (
    Arrival,
    Params,
    SloSpec,
    Workload,
    WorkloadError,
    select_instances,
)
from clockwork.workloads.basic import ClosedLoop, OpenLoop
from clockwork.workloads.named import NAMED_KEYS, NAMED_KINDS

__all__ = ["Arrival", "ClosedLoop", "OpenLoop", "SloSpec", "Workload", "WorkloadError",
           "KINDS", "build_workload", "select_instances"]


def _closed(spec: dict, models: list[str]) -> Workload:
    # (types as strict as every other kind's: a direct call's concurrency 2.7 was 2, and
    # rate_rps true 1.0; a scenario file's are checked before)
    p = Params(spec)
    return ClosedLoop(models, p.integer("concurrency", 1), p.slo(), p.num("think_ms", 0.0),
                      p.num("retry_ms", 1.0))


def _open(process: str) -> Callable[[dict, list[str]], Workload]:
    def make(spec: dict, models: list[str]) -> Workload:
        if "rate_rps" not in spec:
            raise WorkloadError(f"{process} workload needs rate_rps")
        p = Params(spec)
        return OpenLoop(models, p.num("rate_rps"), p.slo(), process)
    return make


KINDS: dict[str, Callable[[dict, list[str]], Workload]] = {
    "closed_loop": _closed,
    "poisson": _open("poisson"),
    "fixed_rate": _open("fixed"),
    "azure": build_azure,
    **NAMED_KINDS,
}

_COMMON = {"kind", "models", "slo_ms", "slo_factor"}
_KEYS = {
    "closed_loop": _COMMON | {"concurrency", "think_ms", "retry_ms"},
    "poisson": _COMMON | {"rate_rps"},
    "fixed_rate": _COMMON | {"rate_rps"},
    "azure": AZURE_KEYS,
    **NAMED_KEYS,
}


def build_workload(spec: dict, instances: dict[str, str],
                   base_dir: str | Path | None = None) -> Workload:
    """``instances``: instance name -> model name (see ``scenario.instance_names``).
    ``base_dir``: the scenario file's folder; file paths in the entry (``trace``,
    ``trace_dir``) are looked for as given, then there, then in the shipped data
    (``clockwork.resources.resolve_data_path``)."""
    kind = spec.get("kind")
    if kind not in KINDS:
        raise WorkloadError(f"unknown workload kind {kind!r}; known: {', '.join(sorted(KINDS))}")
    allowed = _KEYS.get(kind)
    if allowed is not None:
        bad = sorted(set(spec) - allowed)
        if bad:  # (the first, with its hint; how many more)
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise WorkloadError(f"{kind} workload: "
                                f"{unknown_key_line((bad[0],), sorted(allowed))}{more}")
    models = select_instances(spec.get("models", "*"), instances)
    for key in DATA_PATH_KEYS:  # (a number there was Python's "expected str, bytes or
        v = spec.get(key)       # os.PathLike object, not int")
        if key in spec and not (isinstance(v, str) and v.strip()):
            raise WorkloadError(f"{kind} workload: {key} must be a path (a non-empty "
                                f"string), got {v!r}")
    try:
        spec = _with_data_paths(spec, base_dir)
        return KINDS[kind](spec, models)
    except (TypeError, ValueError) as e:
        if isinstance(e, WorkloadError):
            raise
        raise WorkloadError(f"{kind} workload: {e}") from e


DATA_PATH_KEYS = ("trace", "trace_dir")  # workload keys naming files or folders


def end_note(w: Workload, duration_s: float) -> str | None:
    """What to say of a bound workload whose arrivals stop before the run's end (a trace
    shorter than ``duration_s``), or None: one line for the simulator and a replay."""
    ends = getattr(w, "arrivals_end", None)
    end = ends() if ends is not None else None
    if end is None:
        return None
    return (f"its {w.minutes} trace minute(s) end at {end / 1e9:g} s, before duration_s = "
            f"{duration_s:g} s: no arrivals after, and goodput and throughput are over the "
            "whole run")


def data_files(spec: dict, base_dir: str | Path | None = None) -> list[Path]:
    """The files workload entry ``spec`` reads, as ``build_workload`` finds them: its
    ``trace`` file, or the day file an ``azure`` entry's ``day`` names (in its
    ``trace_dir``, then the usual folders). One found nowhere is left out (building the
    workload says why)."""
    from clockwork.workloads.azure import TraceError, find_trace_file

    try:
        spec = _with_data_paths(spec, base_dir if base_dir is not None else ".")
        if isinstance(spec.get("trace"), str):
            return [Path(spec["trace"])]
        if spec.get("kind") == "azure" and "day" in spec:
            return [find_trace_file(spec["day"], spec.get("trace_dir"))]
    except (TraceError, TypeError, ValueError):
        pass
    return []


def _with_data_paths(spec: dict, base_dir: str | Path | None) -> dict:
    """``spec`` with its data paths found by ``clockwork.resources.find_data_path`` (as
    given, then under ``base_dir``, then in the shipped data) made explicit. A ``trace``
    file found nowhere raises ``TraceError`` naming every place tried, ``base_dir``
    among them; a ``trace_dir`` found nowhere stays as written (it is one of the
    folders a day file is looked for in)."""
    if base_dir is None:
        return spec
    out = spec
    for key in DATA_PATH_KEYS:
        v = spec.get(key)
        if not isinstance(v, str) or not v:
            continue
        found = resolve_trace_path(v, base_dir) if key == "trace" else find_data_path(v, base_dir)
        if found is not None:
            out = {**out, key: str(found)}
    return out
