"""What every workload is: a source of arrivals for model instances.

A workload is bound to the instance names it drives and to the run's end. Open
loops produce arrivals on their own (``next_arrival``), closed loops produce
them in reaction to answers (``on_reply``). Both are driven the same way by the
simulator and by a live replay, so one object serves both.

An arrival is ``(time_ns, instance_name, slo_ns)``; ``slo_ns`` 0 means the
controller's default.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence

import numpy as np

from clockwork.settings import count_text
from clockwork.sizes import MAX_CONCURRENCY, MAX_OFFERED_REQUESTS, MAX_OUTSTANDING
from clockwork.time import MAX_SLO_FACTOR, MAX_SLO_MS, MAX_SLO_NS

Arrival = tuple[int, str, int]


class WorkloadError(ValueError):
    """A workload's parameters are wrong (unknown model, bad rate, ...)."""


def check_concurrency(concurrency: int, instances: int, key: str = "concurrency") -> None:
    """A closed loop's ``concurrency`` (requests outstanding per instance) over
    ``instances`` instances: at least 1, and within the bounds per instance and in all
    (each outstanding request is held in memory from the start)."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise WorkloadError(f"{key} must be >= 1 and at most {MAX_CONCURRENCY:,}, "
                            f"got {concurrency}")
    if concurrency * instances > MAX_OUTSTANDING:
        raise WorkloadError(
            f"{key} x the {instances:,} instances selected must be at most "
            f"{MAX_OUTSTANDING:,} outstanding requests in all, got {concurrency:,} x "
            f"{instances:,} = {concurrency * instances:,}")


def check_offered(requests: float, what: str) -> None:
    """A workload that would offer ``requests`` (expected) over its run: at most
    ``MAX_OFFERED_REQUESTS``, else ``WorkloadError`` saying ``what`` offers them (checked
    in ``bind``, before the first arrival is drawn)."""
    if not requests <= MAX_OFFERED_REQUESTS:
        raise WorkloadError(f"{what} offers {count_text(requests)} requests, more than a "
                            f"run may offer ({MAX_OFFERED_REQUESTS:,})")


def check_resends(clients: int, gap_ns: int, secs: float, what: str) -> None:
    """A closed loop of ``clients`` that each send again at most every ``gap_ns`` (when
    every request fails: its ``retry_ms``, or ``think_ms`` if longer) over ``secs``: at
    most ``MAX_OFFERED_REQUESTS`` requests (a retry_ms of 1e-6 made 10^9 requests a
    simulated second, memory growing without end)."""
    check_offered(clients * secs * 1e9 / max(1, gap_ns),
                  f"{what}: {clients:,} client(s) sending again every {gap_ns / 1e6:g} ms "
                  f"(retry_ms, or think_ms if longer) for {secs:g} s")


def select_instances(spec: str | Sequence[str], instances: dict[str, str]) -> list[str]:
    """Pick instance names by model name, instance name or glob.

    ``instances`` maps instance name -> model (profile) name. ``"resnet50_v2"``
    selects every copy of that model; ``"resnet50_v2:3"`` one copy; ``"*"`` all. A
    model's first copy, named as the model, also answers to ``NAME:0`` (it could not be
    selected alone); a glob matches names as they are (``"resnet50_v2:*"``: every copy
    but the first)."""
    specs = [spec] if isinstance(spec, str) else (
        list(spec) if isinstance(spec, list | tuple) else None)
    if specs is None or not all(isinstance(s, str) for s in specs):
        raise WorkloadError(f"workload models must be a name or glob, or a list of them, "
                            f"got {spec!r}")  # (int, None: Python's TypeError, raw)
    out: list[str] = []
    seen = set()
    for s in specs:
        hit = [name for name, model in instances.items()
               if model == s or name == s or fnmatch.fnmatchcase(name, s)
               or (name == model and s == f"{name}:0")]
        if not hit:
            raise WorkloadError(f"workload selects {s!r}, which matches no model instance "
                                f"(known models: {', '.join(sorted(set(instances.values())))})")
        for h in hit:
            if h not in seen:
                seen.add(h)
                out.append(h)
    return out


class Workload:
    """Base class. Subclasses override what they need."""

    kind = "base"

    def __init__(self) -> None:
        self.end = 0
        self.rng: np.random.Generator = np.random.default_rng(0)

    def bind(self, start: int, end: int, rng: np.random.Generator,
             exec1: dict[str, int]) -> None:
        """Called once before the run: admission window and the batch-1 EXEC per instance
        (for SLOs given as a multiple of it)."""
        self.start = start
        self.end = end
        self.rng = rng
        self.exec1 = exec1

    def initial(self, now: int) -> list[Arrival]:
        return []

    def next_arrival(self) -> Arrival | None:
        """The next self-timed arrival (open loops), in time order; None when done."""
        return None

    def on_reply(self, model: str, ok: bool, now: int) -> list[Arrival]:
        """An answer for one of this workload's requests arrived (closed loops)."""
        return []


class SloSpec:
    """A workload's SLO: absolute (``slo_ms``), a multiple of the model's batch-1
    EXEC (``slo_factor``), or the controller's default (neither)."""

    def __init__(self, slo_ms: float | None = None, slo_factor: float | None = None, *,
                 keys: tuple[str, str] = ("slo_ms", "slo_factor")) -> None:
        # (keys: the entry's names for the two, slo_exp_2's background_slo_ms ...)
        k_ms, k_fac = keys
        if slo_ms is not None and slo_factor is not None:
            raise WorkloadError(f"give {k_ms} or {k_fac}, not both")
        if slo_ms is not None and not 0 < slo_ms <= MAX_SLO_MS:
            raise WorkloadError(f"{k_ms} must be > 0 and at most {MAX_SLO_MS:,.0f} (a day), "
                                f"got {slo_ms}")
        if slo_factor is not None and not 0 < slo_factor <= MAX_SLO_FACTOR:
            raise WorkloadError(f"{k_fac} must be > 0 and at most {MAX_SLO_FACTOR:,.0f}, "
                                f"got {slo_factor}")
        self.slo_ms = slo_ms
        self.slo_factor = slo_factor

    def resolve(self, model: str, exec1: dict[str, int]) -> int:
        if self.slo_ms is not None:  # (at least 1 ns: 0 means the controller's default)
            return max(1, round(self.slo_ms * 1e6))
        if self.slo_factor is not None:  # (at most a day, the most the controller takes:
            # a factor of a slow model's EXEC beyond it was served simulated, refused live)
            return max(1, min(MAX_SLO_NS, round(self.slo_factor * exec1[model])))
        return 0


class Params:
    """Typed, validated access to a ``[[workloads]]`` entry; errors name the key."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.kind = spec.get("kind", "?")

    def num(self, key: str, default: float | None = None) -> float:
        if key not in self.spec:
            if default is None:
                raise WorkloadError(f"{self.kind} workload needs {key}")
            return float(default)
        v = self.spec[key]
        try:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise OverflowError
            return float(v)
        except OverflowError:  # (an integer no float holds: beyond ~1.8e308)
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            raise WorkloadError(f"{key} must be a finite number, got {shown}") from None

    def opt_num(self, key: str) -> float | None:
        return self.num(key) if key in self.spec else None

    def integer(self, key: str, default: int) -> int:
        v = self.spec.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise WorkloadError(f"{key} must be an integer, got {v!r}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.spec.get(key, default)
        if not isinstance(v, bool):
            raise WorkloadError(f"{key} must be true or false, got {v!r}")
        return v

    def string(self, key: str, default: str) -> str:
        v = self.spec.get(key, default)
        if not isinstance(v, str):
            raise WorkloadError(f"{key} must be a string, got {v!r}")
        return v

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        v = self.spec.get(key, default)
        if v not in choices:
            raise WorkloadError(f"{key} must be one of {', '.join(choices)}, got {v!r}")
        return v

    def slo(self, prefix: str = "") -> SloSpec:
        ms, fac = f"{prefix}slo_ms", f"{prefix}slo_factor"
        return SloSpec(self.opt_num(ms), self.opt_num(fac), keys=(ms, fac))
