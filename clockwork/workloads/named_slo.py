"""Clockwork's stepped experiments: a quantity that changes every period until it passes a
bound, and the workload's arrivals end there (the run goes on to ``duration_s``, and its
rates are over that: the shipped scenarios set ``duration_s`` to where the steps end).

Clockwork's client drives these with timers (``AdjustSLO``, ``AdjustScaleFactor`` in its
``workload.h``): every ``period`` seconds the value becomes ``update(value)`` (``value *
step`` or ``value + step``); the first value above the maximum terminates the whole client
engine instead of being applied. So the values used are ``v0, v1, ..., vK`` with ``vK <=
max < v(K+1)``, value ``k`` during ``[k * period, (k + 1) * period)``, and nothing is sent
from ``(K + 1) * period`` on. ``StepSchedule`` is that rule; the workloads here follow it:

``SloExperiment1`` (``slo_exp_1``, paper Fig. 7, ``slo.h: slo_experiment_1``)
    A Poisson (or fixed-rate) open loop over the instances whose per-request SLO is the
    stepped value times the instance's batch-1 EXEC (or, with ``slo_ms_start``, the
    stepped value in milliseconds).
``SloExperiment2`` (``slo_exp_2``, paper Fig. 8, ``slo.h: slo_experiment_2``)
    The same for foreground instances, plus background instances in closed loop
    (``ClosedLoop`` semantics) that start after a delay (Clockwork: 10 s of jitter) and
    carry a fixed, relaxed SLO (the artifact uses the controller default).
``AzureScalability`` (``azure_scalability``, paper Fig. 11, ``scalability.h:
azure_scalability_exp``)
    The ``azure`` replay with the load factor stepped. Per trace minute the replay draws
    Poisson arrivals at the highest factor in force during that minute and keeps each
    arrival at time ``t`` with probability ``factor(t) / highest`` (thinning, exact for a
    Poisson process), so the rate changes at the step times, not at minute boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clockwork.sizes import MAX_STEPS
from clockwork.time import MAX_SLO_NS
from clockwork.workloads.azure_replay import AzureReplay
from clockwork.workloads.base import Arrival, SloSpec, Workload, WorkloadError, check_concurrency
from clockwork.workloads.basic import ClosedLoop, OpenLoop

OPS = ("mul", "add")
MAX_TIE = 1e-9  # a step's value within this fraction above the maximum counts as equal to it


class StepSchedule:
    """``value(k)`` for period ``k``: ``start`` updated ``k`` times by ``op`` with ``step``.

    ``stop_period(limit)``: the first period whose value exceeds ``maximum`` (Clockwork
    terminates there; by more than float rounding, ``MAX_TIE``), or None if that is not
    before period ``limit``.
    """

    def __init__(self, start: float, step: float, op: str, period_s: float,
                 maximum: float | None, names: tuple[str, str, str, str, str]) -> None:
        k_start, k_step, k_op, k_period, k_max = names
        if op not in OPS:
            raise WorkloadError(f"{k_op} must be one of {', '.join(OPS)}, got {op!r}")
        if not start > 0:
            raise WorkloadError(f"{k_start} must be > 0, got {start}")
        if not step > 0:
            raise WorkloadError(f"{k_step} must be > 0, got {step}")
        if not period_s > 0:
            raise WorkloadError(f"{k_period} must be > 0, got {period_s}")
        if maximum is not None and not maximum >= start:
            raise WorkloadError(f"{k_max} ({maximum}) must be >= {k_start} ({start})")
        self.start, self.step, self.op, self.maximum = float(start), float(step), op, maximum
        self.period = max(1, round(period_s * 1e9))
        self.names = names
        self._values = [self.start]

    def _next(self, v: float) -> float:
        return v * self.step if self.op == "mul" else v + self.step

    def value(self, k: int) -> float:
        vals = self._values
        while len(vals) <= k:
            vals.append(self._next(vals[-1]))
        return vals[k]

    def values(self, n: int) -> np.ndarray:
        self.value(max(n - 1, 0))
        return np.array(self._values[:n])

    def stop_period(self, limit: int) -> int | None:
        if self.maximum is None:
            return None
        if self.op == "mul" and self.step <= 1.0:
            return None  # never grows past the maximum
        # (a value the steps reach only but for float rounding, 1.1 x 1.1 against a
        # maximum of 1.21, is the maximum: it was dropped, a step short)
        over = self.maximum * (1 + MAX_TIE)
        for k in range(1, limit + 1):
            if self.value(k) > over:
                return k
        return None

    def stop_time(self, start: int, end: int) -> int:
        """When the schedule ends the run, within ``[start, end]``. A schedule that would
        take more than ``MAX_STEPS`` steps before that raises ``WorkloadError``."""
        limit = -(-(end - start) // self.period)  # periods that begin before end
        k = self.stop_period(min(limit, MAX_STEPS))
        if k is None and limit > MAX_STEPS:
            k_period, k_max = self.names[3], self.names[4]
            why = f" ({k_max} does not end it sooner)" if self.maximum is not None else ""
            raise WorkloadError(
                f"{k_period} {self.period / 1e9:g} s: {limit:,} steps in the "
                f"{(end - start) / 1e9:g} s run{why}, more than the {MAX_STEPS:,} a schedule "
                "may take")
        return end if k is None else min(end, start + k * self.period)


class SteppedSlo:
    """A per-request SLO that follows a ``StepSchedule``: a multiple of the instance's
    batch-1 EXEC (``absolute = False``) or milliseconds (``absolute = True``)."""

    def __init__(self, schedule: StepSchedule, absolute: bool = False) -> None:
        self.schedule = schedule
        self.absolute = absolute

    def bind(self, start: int, exec1: dict[str, int]) -> None:
        self.t0 = start
        self.exec1 = exec1

    def period_at(self, t: int) -> int:
        return max(0, (t - self.t0) // self.schedule.period)

    def slo_ns(self, k: int, instance: str) -> int:
        """Period ``k``'s SLO, in ns: at least 1 ns (0 would mean the controller's
        default) and at most a day (a schedule that grows without a maximum stops there)."""
        v = self.schedule.value(k)
        ns = v * 1e6 if self.absolute else v * self.exec1[instance]
        if not ns < MAX_SLO_NS:  # (grown past a day, to infinity even)
            return MAX_SLO_NS
        return max(1, round(ns))

    def at(self, t: int, instance: str) -> int:
        return self.slo_ns(self.period_at(t), instance)


class SloExperiment1(Workload):
    """``slo_exp_1``: open loop at ``rate_rps`` over ``models`` with a stepped SLO."""

    kind = "slo_exp_1"

    def __init__(self, models: Sequence[str], rate_rps: float, slo: SteppedSlo,
                 process: str = "poisson", rate_key: str = "rate_rps") -> None:
        super().__init__()
        if not models:
            raise WorkloadError(f"{self.kind} selects no model instances")
        self.models = list(models)
        self.open = OpenLoop(self.models, rate_rps, None, process, rate_key)
        self.slo = slo

    def bind(self, start, end, rng, exec1) -> None:
        super().bind(start, end, rng, exec1)
        self.slo.bind(start, exec1)
        self.stop = self.slo.schedule.stop_time(start, end)
        self._bind_parts(rng)

    def _bind_parts(self, rng: np.random.Generator) -> None:
        self.open.bind(self.start, self.stop, rng, self.exec1)

    def next_arrival(self) -> Arrival | None:
        a = self.open.next_arrival()
        if a is None:
            return None
        t, m, _ = a
        return t, m, self.slo.at(t, m)


class SloExperiment2(SloExperiment1):
    """``slo_exp_2``: ``slo_exp_1`` on the foreground instances plus a closed loop of
    ``concurrency`` per background instance, started ``delay_s`` after the run."""

    kind = "slo_exp_2"

    def __init__(self, foreground: Sequence[str], foreground_rps: float, slo: SteppedSlo,
                 background: Sequence[str], concurrency: int = 16,
                 background_slo: SloSpec | None = None, delay_s: float = 10.0,
                 retry_ms: float = 1.0, process: str = "poisson") -> None:
        super().__init__(foreground, foreground_rps, slo, process, "foreground_rps")
        overlap = set(foreground) & set(background)
        if overlap:
            raise WorkloadError(f"foreground and background share instances {sorted(overlap)}")
        if delay_s < 0:
            raise WorkloadError(f"background_delay_s must be >= 0, got {delay_s}")
        check_concurrency(concurrency, len(background), "background_concurrency")
        self.background = list(background)
        self._bg_set = set(self.background)
        self.delay = round(delay_s * 1e9)
        self.bg = ClosedLoop(self.background, concurrency, background_slo,
                             retry_ms=retry_ms) if self.background else None

    def _bind_parts(self, rng: np.random.Generator) -> None:
        r_fg, r_bg = rng.spawn(2)
        self.open.bind(self.start, self.stop, r_fg, self.exec1)
        if self.bg is not None:
            self.bg.bind(self.start, self.stop, r_bg, self.exec1)

    def initial(self, now: int) -> list[Arrival]:
        t = now + self.delay
        if self.bg is None or t >= self.stop:
            return []
        return self.bg.initial(t)

    def on_reply(self, model: str, ok: bool, now: int) -> list[Arrival]:
        if self.bg is None or model not in self._bg_set:
            return []
        return self.bg.on_reply(model, ok, now)


class AzureScalability(AzureReplay):
    """``azure_scalability``: an ``AzureReplay`` whose load factor follows a
    ``StepSchedule`` (times ``scale``, Clockwork's ``0.125 x num_workers``, when given)."""

    kind = "azure_scalability"

    @classmethod
    def adopt(cls, replay: AzureReplay, schedule: StepSchedule,
              scale: float = 1.0) -> AzureScalability:
        """Take over a configured (validated) ``AzureReplay``'s state."""
        if replay.arrivals != "poisson":
            raise WorkloadError("azure_scalability ramps Poisson arrivals only "
                                f"(arrivals = \"poisson\"), got {replay.arrivals!r}")
        if not scale > 0:
            raise WorkloadError(f"load scale must be > 0, got {scale}")
        obj = cls.__new__(cls)
        obj.__dict__.update(replay.__dict__)
        obj.schedule = schedule
        obj.scale = float(scale)
        obj.load_factor = schedule.start * obj.scale
        return obj

    def bind(self, start, end, rng, exec1) -> None:
        # (the factors first: the replay's bind checks the minutes it will draw at them)
        stop = self.schedule.stop_time(start, end)
        n = max(1, -(-(stop - start) // self.schedule.period))
        self._factors = self.schedule.values(n) * self.scale
        super().bind(start, stop, rng, exec1)

    def load_factor_at(self, t: int) -> float:
        """The trace multiplier in force at time ``t`` (ns)."""
        k = min(max(0, (t - self.start) // self.schedule.period), len(self._factors) - 1)
        return float(self._factors[k])

    def _span(self, m: int) -> tuple[int, int, float]:
        """The factor periods trace minute ``m`` spans (first, last) and the highest factor
        among them, which its arrivals are drawn at."""
        period, f = self.schedule.period, self._factors
        t0 = self.start + m * self.interval - self._offset
        lo = max(t0, self.start)
        hi = max(lo + 1, min(t0 + self.interval, self.end))
        k0 = min((lo - self.start) // period, len(f) - 1)
        k1 = min((hi - 1 - self.start) // period, len(f) - 1)
        return k0, k1, float(f[k0:k1 + 1].max())

    def _draw_factor(self, m: int) -> float:
        return self._span(m)[2]

    def _minute_arrivals(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        period, f = self.schedule.period, self._factors
        k0, k1, top = self._span(m)
        saved = self.load_factor
        self.load_factor = top
        try:
            times, rows = super()._minute_arrivals(m)
        finally:
            self.load_factor = saved
        if k0 == k1 or not times.size:
            return times, rows
        k = np.clip((times - self.start) // period, 0, len(f) - 1)
        keep = self.rng.random(times.size) * top < f[k]
        return times[keep], rows[keep]
