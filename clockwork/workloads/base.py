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
from collections.abc import Sequence

import numpy as np

from clockwork.time import MAX_SLO_FACTOR, MAX_SLO_MS

Arrival = tuple[int, str, int]


class WorkloadError(ValueError):
    """A workload's parameters are wrong (unknown model, bad rate, ...)."""


def select_instances(spec: str | Sequence[str], instances: dict[str, str]) -> list[str]:
    """Pick instance names by model name, instance name or glob.

    ``instances`` maps instance name -> model (profile) name. ``"resnet50_v2"``
    selects every copy of that model; ``"resnet50_v2:3"`` one copy; ``"*"`` all.
    """
    specs = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    seen = set()
    for s in specs:
        hit = [name for name, model in instances.items()
               if model == s or name == s or fnmatch.fnmatchcase(name, s)]
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

    def __init__(self, slo_ms: float | None = None, slo_factor: float | None = None) -> None:
        if slo_ms is not None and slo_factor is not None:
            raise WorkloadError("give slo_ms or slo_factor, not both")
        if slo_ms is not None and not 0 < slo_ms <= MAX_SLO_MS:
            raise WorkloadError(f"slo_ms must be > 0 and at most {MAX_SLO_MS:,.0f} (a day), "
                                f"got {slo_ms}")
        if slo_factor is not None and not 0 < slo_factor <= MAX_SLO_FACTOR:
            raise WorkloadError(f"slo_factor must be > 0 and at most {MAX_SLO_FACTOR:,.0f}, "
                                f"got {slo_factor}")
        self.slo_ms = slo_ms
        self.slo_factor = slo_factor

    def resolve(self, model: str, exec1: dict[str, int]) -> int:
        if self.slo_ms is not None:
            return round(self.slo_ms * 1e6)
        if self.slo_factor is not None:
            return round(self.slo_factor * exec1[model])
        return 0
