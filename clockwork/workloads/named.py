"""Clockwork's named workloads: the client workloads of the paper's experiments.

Each follows a class or experiment of Clockwork's client (``src/clockwork/workload/``);
the stepped ones (``slo_exp_1``, ``slo_exp_2``, ``azure_scalability``) live in
``named_slo``. Rates are totals over the selected instances, as for ``poisson``.

``bursty`` (``BurstyPoissonOpenLoop``)
    Poisson arrivals at ``burst_rps`` during "on" periods and at ``rate_rps`` (default 0,
    Clockwork's idle) during "off" periods. Period lengths are exponential with means
    ``on_s`` / ``off_s`` as in Clockwork (``periods = "fixed"``: exactly those lengths).
    ``start = "random"`` begins at a random instant of the on/off process (what
    Clockwork's ``Start`` intends; its ``minstd_rand() / UINT64_MAX`` makes the point ~0,
    i.e. it always starts "on": ``start = "on"``): with exponential periods, "on" with
    probability ``on_s / (on_s + off_s)`` for a fresh period; with fixed ones, at a
    uniform point of a first on+off cycle. One on/off process for all instances,
    arrivals spread evenly; ``independent = true`` gives each instance its own process
    (Clockwork creates one workload per model), at ``1 / n`` of the rates.
``bursty_closed_loop`` (``BurstyPoissonClosedLoop``)
    Per instance: during an "on" period ``concurrency`` requests are kept outstanding
    (each answer sends the next); when the period ends answers are not replaced, and once
    the last one is back the instance stays idle for an "off" period, then the next burst
    sends ``concurrency`` at once. (Clockwork draws that idle time from its burst
    distribution; we use ``off_s``.) Each answer's next request waits ``think_ms``; a
    failure is retried after ``retry_ms``, as in ``closed_loop``.
``bursty_experiment`` (paper Fig. 6, ``example.h: bursty_experiment2``)
    A "minor" instance at ``minor_rps`` (200) for the whole run; from ``major_start_s``
    (900: the paper's and artifact's 15 minutes; Clockwork's source leads in 300 s) a
    "major" load of ``major_rps`` (1000) spread evenly (Poisson, uniform instance choice)
    over the active major instances, the ``k``-th major instance active from
    ``major_start_s + (k - 1) * activate_every_s`` (1 s) on.

Sub-selections (``foreground``/``background`` of ``slo_exp_2``, ``minor``/``major`` of
``bursty_experiment``) are either a count (the first N of the workload's ``models``
selection, in order, after the other group for the second one) or a selector (model
name, instance name or glob, as ``models``) applied within that selection.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter

import numpy as np

from clockwork.settings import count_text
from clockwork.sizes import MAX_PERIODS, MAX_WORKERS
from clockwork.workloads.azure_replay import AZURE_KEYS, build_azure
from clockwork.workloads.base import (
    Arrival,
    Params,
    SloSpec,
    Workload,
    WorkloadError,
    check_concurrency,
    check_offered,
    check_resends,
    select_instances,
)
from clockwork.workloads.named_slo import (
    OPS,
    AzureScalability,
    SloExperiment1,
    SloExperiment2,
    SteppedSlo,
    StepSchedule,
)

CHUNK = 8192
ON_PERIODS_KEPT = 10_000  # BurstyOpenLoop.on_periods
INSTANCE_CHUNK_MIN = 64  # arrivals drawn at a time by each instance's own process
PERIODS = ("exponential", "fixed")
STARTS = ("random", "on", "off")


def poisson_times(rng: np.random.Generator, t0: int, t1: int,
                  rate_rps: float, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """Sorted arrival times (ns) of a Poisson process of ``rate_rps`` on ``[t0, t1)``, in
    chunks of about ``chunk`` arrivals."""
    if not rate_rps > 0 or t1 <= t0:
        return
    step = max(1, int(min(chunk / rate_rps * 1e9, t1 - t0)))  # (a tiny rate: one chunk)
    a = t0
    while a < t1:
        b = min(t1, a + step)
        n = int(rng.poisson(rate_rps * (b - a) / 1e9))
        if n:
            ts = a + np.sort(rng.random(n)) * (b - a)
            yield np.minimum(ts.astype(np.int64), b - 1)
        a = b


def segment(rng: np.random.Generator, t0: int, t1: int, rate_rps: float,
            models: Sequence[str], slos: Sequence[int],
            chunk: int = CHUNK) -> Iterator[Arrival]:
    """Poisson arrivals on ``[t0, t1)``, each to a uniformly chosen instance (drawn
    ``chunk`` or so at a time)."""
    k = len(models)
    for ts in poisson_times(rng, t0, t1, rate_rps, chunk):
        idx = rng.integers(0, k, ts.size).tolist() if k > 1 else [0] * ts.size
        for t, i in zip(ts.tolist(), idx, strict=True):
            yield t, models[i], slos[i]


class StreamWorkload(Workload):
    """An open loop defined by a generator of arrivals in time order."""

    def bind(self, start, end, rng, exec1) -> None:
        super().bind(start, end, rng, exec1)
        self._it = self.stream()

    def stream(self) -> Iterator[Arrival]:
        raise NotImplementedError

    def next_arrival(self) -> Arrival | None:
        return next(self._it, None)


class OnOff:
    """Alternating on/off period lengths (ns): exponential with the given means, or fixed."""

    def __init__(self, on_s: float, off_s: float, periods: str = "exponential",
                 start: str = "random") -> None:
        for key, v in (("on_s", on_s), ("off_s", off_s)):
            if not (v > 0 and math.isfinite(v)):
                raise WorkloadError(f"{key} must be > 0, got {v}")
        if periods not in PERIODS:
            raise WorkloadError(f"periods must be one of {', '.join(PERIODS)}, got {periods!r}")
        if start not in STARTS:
            raise WorkloadError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        self.on, self.off = on_s * 1e9, off_s * 1e9
        self.periods, self.start = periods, start

    def draw(self, rng: np.random.Generator, on: bool) -> int:
        mean = self.on if on else self.off
        return max(1, round(rng.exponential(mean) if self.periods == "exponential" else mean))

    def first(self, rng: np.random.Generator) -> tuple[bool, int]:
        """The state at time 0 and how long it lasts."""
        if self.start == "on":
            return True, self.draw(rng, True)
        if self.start == "off":
            return False, self.draw(rng, False)
        if self.periods == "exponential":
            # an instant of the on/off process falls in an on period with probability
            # on / (on + off), and what is left of an exponential period is exponential
            # again (a point in one drawn cycle favoured short cycles: more load, ~12 %
            # in 20 s with the 10 s / 20 s periods of scenarios/bursty.toml)
            on = rng.random() * (self.on + self.off) < self.on
            return on, self.draw(rng, on)
        on, off = self.draw(rng, True), self.draw(rng, False)
        s = int(rng.random() * (on + off))
        return (True, on - s) if s < on else (False, on + off - s)

    def check_periods(self, secs: float, schedules: int, what: str) -> None:
        """The periods ``schedules`` schedules over ``secs`` take (expected): at most
        ``MAX_PERIODS``, else ``WorkloadError``."""
        n = schedules * secs * 1e9 * 2 / (self.on + self.off)
        if not n <= MAX_PERIODS:
            raise WorkloadError(
                f"{what}: on_s {self.on / 1e9:g} and off_s {self.off / 1e9:g} over {secs:g} s"
                + (f" for each of {schedules:,} instances" if schedules > 1 else "")
                + f" take ~{count_text(n)} on and off periods, more than a run may take "
                f"({MAX_PERIODS:,}): give longer periods")

    def schedule(self, rng: np.random.Generator, t: int, end: int) -> Iterator[tuple[int, int, bool]]:
        """``(t0, t1, on)`` periods from ``t`` until ``end``."""
        state, length = self.first(rng)
        while t < end:
            yield t, t + length, state
            t += length
            state = not state
            length = self.draw(rng, state)


class BurstyOpenLoop(StreamWorkload):
    kind = "bursty"

    def __init__(self, models: Sequence[str], burst_rps: float, onoff: OnOff,
                 rate_rps: float = 0.0, independent: bool = False,
                 slo: SloSpec | None = None) -> None:
        super().__init__()
        if not models:
            raise WorkloadError("bursty selects no model instances")
        if not burst_rps > 0:
            raise WorkloadError(f"burst_rps must be > 0, got {burst_rps}")
        if not rate_rps >= 0:
            raise WorkloadError(f"rate_rps must be >= 0, got {rate_rps}")
        self.models = list(models)
        self.burst_rps, self.rate_rps = float(burst_rps), float(rate_rps)
        self.onoff = onoff
        self.independent = independent
        self.slo = slo or SloSpec()
        # the first ON_PERIODS_KEPT on periods of the shared process, as generated (to
        # look at; all of them grew without bound: 500,000 in 10 s of 10 us periods)
        self.on_periods: list[tuple[int, int]] = []

    def bind(self, start, end, rng, exec1) -> None:
        secs = max(0, end - start) / 1e9  # (at most: bursts throughout)
        check_offered(max(self.burst_rps, self.rate_rps) * secs,
                      f"bursty workload: burst_rps {self.burst_rps:g} for {secs:g} s")
        self.onoff.check_periods(secs, len(self.models) if self.independent else 1,
                                 "bursty workload")
        super().bind(start, end, rng, exec1)

    def _one(self, rng, models, slos, share: float, log: bool,
             chunk: int = CHUNK) -> Iterator[Arrival]:
        # the on/off schedule from a stream of its own: drawn from the arrivals' stream,
        # every period after the first depended on how many arrivals the rates drew (at
        # one seed, burst_rps 400 and 401 had 25 s and 35 s of bursts in 60 s)
        periods, arrivals = rng.spawn(2)
        kept = self.on_periods if log else None
        for t0, t1, on in self.onoff.schedule(periods, self.start, self.end):
            if on and kept is not None and len(kept) < ON_PERIODS_KEPT:
                kept.append((t0, t1))
            rate = (self.burst_rps if on else self.rate_rps) * share
            yield from segment(arrivals, t0, min(t1, self.end), rate, models, slos, chunk)

    def stream(self) -> Iterator[Arrival]:
        slos = [self.slo.resolve(m, self.exec1) for m in self.models]
        if not self.independent:
            return self._one(self.rng, self.models, slos, 1.0, True)
        n = len(self.models)
        rngs = self.rng.spawn(n)
        # each instance's process drawn in its share of a chunk: merged, every one holds
        # its next chunk (2,000 instances of CHUNK arrivals each held 324 MiB)
        chunk = max(INSTANCE_CHUNK_MIN, CHUNK // n)
        parts = [self._one(r, [m], [s], 1.0 / n, False, chunk)
                 for r, m, s in zip(rngs, self.models, slos, strict=True)]
        return heapq.merge(*parts, key=itemgetter(0))


class BurstyClosedLoop(Workload):
    kind = "bursty_closed_loop"

    def __init__(self, models: Sequence[str], concurrency: int, onoff: OnOff,
                 slo: SloSpec | None = None, think_ms: float = 0.0,
                 retry_ms: float = 1.0) -> None:
        super().__init__()
        if not models:
            raise WorkloadError("bursty_closed_loop selects no model instances")
        check_concurrency(concurrency, len(models), "concurrency")
        if think_ms < 0:
            raise WorkloadError(f"think_ms must be >= 0, got {think_ms}")
        if not retry_ms > 0:
            raise WorkloadError(f"retry_ms must be > 0, got {retry_ms}")
        self.models = list(models)
        self.concurrency = concurrency
        self.onoff = onoff
        self.slo = slo or SloSpec()
        self.think = round(think_ms * 1e6)
        self.retry = max(1, round(retry_ms * 1e6))
        self.outstanding: dict[str, int] = {}
        self.burst_end: dict[str, int] = {}

    def bind(self, start, end, rng, exec1) -> None:
        secs = max(0, end - start) / 1e9
        check_resends(self.concurrency * len(self.models), max(self.retry, self.think), secs,
                      "bursty_closed_loop workload")
        self.onoff.check_periods(secs, len(self.models), "bursty_closed_loop workload")
        super().bind(start, end, rng, exec1)
        self._slo = {m: self.slo.resolve(m, exec1) for m in self.models}
        self._rng = dict(zip(self.models, rng.spawn(len(self.models)), strict=True))
        self.outstanding = dict.fromkeys(self.models, 0)

    def _burst(self, m: str, t: int, length: int) -> list[Arrival]:
        self.burst_end[m] = t + length
        if t >= self.end:
            return []
        self.outstanding[m] += self.concurrency
        return [(t, m, self._slo[m])] * self.concurrency

    def initial(self, now: int) -> list[Arrival]:
        out: list[Arrival] = []
        for m in self.models:
            rng = self._rng[m]
            on, length = self.onoff.first(rng)
            if on:
                out += self._burst(m, now, length)
            else:
                out += self._burst(m, now + length, self.onoff.draw(rng, True))
        return out

    def on_reply(self, model: str, ok: bool, now: int) -> list[Arrival]:
        if model not in self.outstanding:
            return []
        self.outstanding[model] -= 1
        if now < self.burst_end[model]:
            t = now + (self.think if ok else max(self.think, self.retry))
            if t >= self.end:
                return []
            self.outstanding[model] += 1
            return [(t, model, self._slo[model])]
        if self.outstanding[model] == 0:
            rng = self._rng[model]
            idle = self.onoff.draw(rng, False)
            return self._burst(model, now + idle, self.onoff.draw(rng, True))
        return []


class BurstyExperiment(StreamWorkload):
    kind = "bursty_experiment"

    def __init__(self, minor: Sequence[str], major: Sequence[str], minor_rps: float = 200.0,
                 major_rps: float = 1000.0, major_start_s: float = 900.0,
                 activate_every_s: float = 1.0, slo: SloSpec | None = None) -> None:
        super().__init__()
        if not major:
            raise WorkloadError("bursty_experiment: major selects no model instances")
        overlap = set(minor) & set(major)
        if overlap:
            raise WorkloadError(f"bursty_experiment: minor and major share {sorted(overlap)}")
        for key, v in (("minor_rps", minor_rps), ("major_start_s", major_start_s)):
            if not v >= 0:
                raise WorkloadError(f"{key} must be >= 0, got {v}")
        for key, v in (("major_rps", major_rps), ("activate_every_s", activate_every_s)):
            if not v > 0:
                raise WorkloadError(f"{key} must be > 0, got {v}")
        if minor_rps > 0 and not minor:
            raise WorkloadError("bursty_experiment: minor selects no model instances")
        self.minor, self.major = list(minor), list(major)
        self.minor_rps, self.major_rps = float(minor_rps), float(major_rps)
        self.major_start = round(major_start_s * 1e9)
        self.every = max(1, round(activate_every_s * 1e9))
        self.slo = slo or SloSpec()

    def bind(self, start, end, rng, exec1) -> None:
        secs = max(0, end - start) / 1e9
        major = max(0, end - start - self.major_start) / 1e9
        check_offered(self.minor_rps * secs + self.major_rps * major,
                      f"bursty_experiment workload: minor_rps {self.minor_rps:g} for {secs:g} s "
                      f"and major_rps {self.major_rps:g} for {major:g} s")
        super().bind(start, end, rng, exec1)

    def active_majors(self, t: int) -> int:
        """How many major instances receive requests at time ``t``."""
        if t < self.start + self.major_start:
            return 0
        return min(len(self.major), 1 + (t - self.start - self.major_start) // self.every)

    def _majors(self, rng: np.random.Generator, slos: list[int]) -> Iterator[Arrival]:
        t0 = self.start + self.major_start
        n = len(self.major)
        for k in range(1, n + 1):
            a = t0 + (k - 1) * self.every
            if a >= self.end:
                return
            b = self.end if k == n else min(self.end, a + self.every)
            yield from segment(rng, a, b, self.major_rps, self.major[:k], slos[:k])

    def stream(self) -> Iterator[Arrival]:
        r_minor, r_major = self.rng.spawn(2)
        res = self.slo.resolve
        minor = segment(r_minor, self.start, self.end, self.minor_rps, self.minor,
                        [res(m, self.exec1) for m in self.minor])
        major = self._majors(r_major, [res(m, self.exec1) for m in self.major])
        return heapq.merge(minor, major, key=itemgetter(0))


# ---------------------------------------------------------------- scenario entries

def _onoff(p: Params) -> OnOff:
    """An entry's on/off periods (``on_s``, ``off_s``, ``periods``, ``start``)."""
    return OnOff(p.num("on_s"), p.num("off_s"), p.choice("periods", "exponential", PERIODS),
                 p.choice("start", "random", STARTS))


def _base_model(instance: str) -> str:
    head, sep, tail = instance.rpartition(":")
    return head if sep and tail.isdigit() else instance


def subselect(value, pool: list[str], key: str) -> list[str]:
    """A count (first N of ``pool``) or a selector applied within ``pool``."""
    if isinstance(value, bool):
        raise WorkloadError(f"{key} must be a count or a model selector, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise WorkloadError(f"{key} must be >= 0, got {value}")
        if value > len(pool):
            raise WorkloadError(f"{key} = {value}, but only {len(pool)} instances are left "
                                "in the workload's selection")
        return pool[:value]
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        try:
            return select_instances(value, {n: _base_model(n) for n in pool})
        except WorkloadError as e:
            raise WorkloadError(f"{key}: {e}") from None
    raise WorkloadError(f"{key} must be a count or a model selector, got {value!r}")


def _groups(spec: dict, models: list[str], first: str, second: str,
            first_default: int | None) -> tuple[list[str], list[str]]:
    if first in spec:
        a = subselect(spec[first], models, first)
    elif first_default is not None:
        a = models[:first_default]
    else:
        raise WorkloadError(f"{spec.get('kind')} workload needs {first} (a count or a selector)")
    taken = set(a)
    rest = [m for m in models if m not in taken]
    v = spec.get(second)
    if v is None:
        b = rest
    elif isinstance(v, int) and not isinstance(v, bool):
        b = subselect(v, rest, second)
    else:
        b = subselect(v, models, second)
    return a, b


def _stepped_slo(p: Params) -> SteppedSlo:
    absolute = "slo_ms_start" in p.spec or "slo_ms_max" in p.spec
    if absolute and ("slo_factor_start" in p.spec or "slo_factor_max" in p.spec):
        raise WorkloadError("give slo_ms_start/slo_ms_max or slo_factor_start/slo_factor_max, "
                            "not both")
    unit = "slo_ms" if absolute else "slo_factor"
    if absolute and "slo_ms_start" not in p.spec:
        raise WorkloadError(f"{p.kind} workload needs slo_ms_start with slo_ms_max")
    mx = p.opt_num(f"{unit}_max") if f"{unit}_max" in p.spec else (None if absolute else 200.0)
    sched = StepSchedule(p.num(f"{unit}_start", 1.0), p.num("factor", 1.5),
                         p.choice("op", "mul", OPS), p.num("period_s", 30.0), mx,
                         (f"{unit}_start", "factor", "op", "period_s", f"{unit}_max"))
    return SteppedSlo(sched, absolute)


def build_bursty(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    return BurstyOpenLoop(models, p.num("burst_rps"), _onoff(p), p.num("rate_rps", 0.0),
                          p.flag("independent", False), p.slo())


def build_bursty_closed(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    return BurstyClosedLoop(models, p.integer("concurrency", 1), _onoff(p), p.slo(),
                            p.num("think_ms", 0.0), p.num("retry_ms", 1.0))


def build_slo_exp_1(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    return SloExperiment1(models, p.num("rate_rps"), _stepped_slo(p),
                          p.choice("process", "poisson", ("poisson", "fixed")))


def build_slo_exp_2(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    fg, bg = _groups(spec, models, "foreground", "background", None)
    if not fg:
        raise WorkloadError("slo_exp_2: foreground selects no model instances")
    return SloExperiment2(fg, p.num("foreground_rps", 200.0), _stepped_slo(p), bg,
                          p.integer("background_concurrency", 16), p.slo("background_"),
                          p.num("background_delay_s", 10.0), p.num("retry_ms", 1.0),
                          p.choice("process", "poisson", ("poisson", "fixed")))


def build_bursty_experiment(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    minor, major = _groups(spec, models, "minor", "major", 1)
    return BurstyExperiment(minor, major, p.num("minor_rps", 200.0), p.num("major_rps", 1000.0),
                            p.num("major_start_s", 900.0), p.num("activate_every_s", 1.0),
                            p.slo())


_RAMP_KEYS = {"load_factor_start", "load_factor_step", "step_op", "step_period_s",
              "load_factor_max", "workers"}


def build_azure_scalability(spec: dict, models: list[str]) -> Workload:
    p = Params(spec)
    mx = p.opt_num("load_factor_max") if "load_factor_max" in spec else 4.0
    sched = StepSchedule(p.num("load_factor_start", 0.1), p.num("load_factor_step", 1.5),
                         p.choice("step_op", "mul", OPS), p.num("step_period_s", 60.0), mx,
                         ("load_factor_start", "load_factor_step", "step_op",
                          "step_period_s", "load_factor_max"))
    scale = 1.0
    if "workers" in spec:
        w = p.integer("workers", 1)
        if not 1 <= w <= MAX_WORKERS:  # (as cluster.workers)
            raise WorkloadError(f"workers must be in [1, {MAX_WORKERS}], got {w}")
        scale = 0.125 * w
    base = {k: v for k, v in spec.items() if k in AZURE_KEYS and k != "load_factor"}
    base["kind"] = "azure"
    return AzureScalability.adopt(build_azure(base, models), sched, scale)


_COMMON = {"kind", "models", "slo_ms", "slo_factor"}
_ONOFF = {"on_s", "off_s", "periods", "start"}
_STEPPED = {"slo_factor_start", "slo_factor_max", "slo_ms_start", "slo_ms_max", "factor", "op",
            "period_s", "process"}

NAMED_KINDS: dict[str, Callable[[dict, list[str]], Workload]] = {
    "bursty": build_bursty,
    "bursty_closed_loop": build_bursty_closed,
    "slo_exp_1": build_slo_exp_1,
    "slo_exp_2": build_slo_exp_2,
    "bursty_experiment": build_bursty_experiment,
    "azure_scalability": build_azure_scalability,
}

NAMED_KEYS: dict[str, set[str]] = {
    "bursty": _COMMON | _ONOFF | {"rate_rps", "burst_rps", "independent"},
    "bursty_closed_loop": _COMMON | _ONOFF | {"concurrency", "think_ms", "retry_ms"},
    "slo_exp_1": {"kind", "models", "rate_rps"} | _STEPPED,
    "slo_exp_2": {"kind", "models", "foreground", "background", "foreground_rps",
                  "background_concurrency", "background_slo_ms", "background_slo_factor",
                  "background_delay_s", "retry_ms"} | _STEPPED,
    "bursty_experiment": _COMMON | {"minor", "major", "minor_rps", "major_rps", "major_start_s",
                                    "activate_every_s"},
    # (no load_factor: stepped; no cv: it goes with gamma arrivals, which cannot be)
    "azure_scalability": (AZURE_KEYS - {"load_factor", "cv"}) | _RAMP_KEYS,
}
