"""Closed-loop and open-loop (Poisson, fixed-rate) workloads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clockwork.workloads.base import (
    Arrival,
    SloSpec,
    Workload,
    WorkloadError,
    check_concurrency,
    check_offered,
    check_resends,
)


class ClosedLoop(Workload):
    """``concurrency`` outstanding requests per instance; each answer sends the next
    after ``think_ms``. After a failure (timeout, error) a client waits at least
    ``retry_ms`` (the longer of it and ``think_ms``), so an SLO that can never be met
    does not become a busy loop of instantly rejected requests."""

    kind = "closed_loop"

    def __init__(self, models: Sequence[str], concurrency: int = 1, slo: SloSpec | None = None,
                 think_ms: float = 0.0, retry_ms: float = 1.0) -> None:
        super().__init__()
        if retry_ms <= 0:
            raise WorkloadError(f"retry_ms must be > 0, got {retry_ms}")
        check_concurrency(concurrency, len(models), "closed_loop concurrency")
        if think_ms < 0:
            raise WorkloadError(f"think_ms must be >= 0, got {think_ms}")
        self.models = list(models)
        self.concurrency = concurrency
        self.slo = slo or SloSpec()
        self.think = round(think_ms * 1e6)
        self.retry = max(1, round(retry_ms * 1e6))
        self.outstanding: dict[str, int] = {}

    def bind(self, start, end, rng, exec1) -> None:
        check_resends(self.concurrency * len(self.models), max(self.retry, self.think),
                      max(0, end - start) / 1e9, "closed_loop workload")
        super().bind(start, end, rng, exec1)

    def initial(self, now: int) -> list[Arrival]:
        out = []
        for m in self.models:
            slo = self.slo.resolve(m, self.exec1)
            self.outstanding[m] = self.concurrency
            out.extend((now, m, slo) for _ in range(self.concurrency))
        return out

    def on_reply(self, model: str, ok: bool, now: int) -> list[Arrival]:
        self.outstanding[model] -= 1
        t = now + (self.think if ok else max(self.think, self.retry))
        if t >= self.end:
            return []
        self.outstanding[model] += 1
        return [(t, model, self.slo.resolve(model, self.exec1))]


class OpenLoop(Workload):
    """Arrivals at ``rate_rps`` in total, spread evenly over the instances.

    ``process = "poisson"`` draws exponential gaps; ``"fixed"`` spaces them evenly, the first
    at the start, so ``rate_rps`` for D seconds is ``ceil(rate_rps * D)`` arrivals.
    """

    kind = "poisson"
    CHUNK = 8192

    def __init__(self, models: Sequence[str], rate_rps: float, slo: SloSpec | None = None,
                 process: str = "poisson", rate_key: str = "rate_rps") -> None:
        super().__init__()
        # (rate_key: the entry's name for the rate, slo_exp_2's foreground_rps)
        if not rate_rps > 0:
            raise WorkloadError(f"{rate_key} must be > 0, got {rate_rps}")
        if process not in ("poisson", "fixed"):
            raise WorkloadError(f"unknown arrival process {process!r} (poisson, fixed)")
        self.models = list(models)
        self.rate = float(rate_rps)
        self.slo = slo or SloSpec()
        self.process = process
        self.rate_key = rate_key
        self.kind = process if process == "poisson" else "fixed_rate"
        self._t = 0.0
        self._buf: list[Arrival] = []

    def bind(self, start, end, rng, exec1) -> None:
        secs = max(0, end - start) / 1e9
        check_offered(self.rate * secs, f"{self.kind} workload: {self.rate_key} {self.rate:g} "
                      f"for {secs:g} s")
        super().bind(start, end, rng, exec1)
        self._t = float(start)
        self._k = 0
        self._slos = [self.slo.resolve(m, exec1) for m in self.models]

    def _refill(self) -> None:
        n = self.CHUNK
        gap = 1e9 / self.rate
        if self.process == "poisson":
            times = self._t + np.cumsum(self.rng.exponential(gap, n))
            self._t = float(times[-1])
        else:
            # the k-th arrival at start + k gaps (k from 0), not a running sum of gaps; as
            # k * 1e9 / rate (k * 1e9 is exact, then one rounding), not k * (1e9 / rate),
            # which came out a hair under a whole nanosecond and so, truncated, 1 ns early
            # (rate 29: arrival 29 at 999,999,999 ns, inside a 1 s run: 30 arrivals)
            # (a tiny rate overflows to inf past the first arrival: far past the end, so
            # clipped to it below and not used, not a warning)
            k0 = self._k
            with np.errstate(over="ignore"):
                times = self.start + (np.arange(k0, k0 + n) * 1e9 / self.rate)
            self._k = k0 + n
            self._t = float(times[-1]) + gap
        k = len(self.models)
        idx = self.rng.integers(0, k, n) if self.process == "poisson" else \
            (np.arange(n) + getattr(self, "_rr", 0)) % k
        self._rr = (getattr(self, "_rr", 0) + n) % k
        models, slos, end = self.models, self._slos, self.end
        buf = []
        # (a time past the end is not used: clipped there, it cannot wrap around int64)
        for t, i in zip(np.minimum(times, end).astype(np.int64).tolist(), idx.tolist(),
                        strict=True):
            if t >= end:
                break
            buf.append((t, models[i], slos[i]))
        buf.reverse()
        self._buf = buf
        if not buf:
            self._t = float("inf")

    def next_arrival(self) -> Arrival | None:
        if not self._buf:
            if self._t >= self.end:
                return None
            self._refill()
            if not self._buf:
                return None
        return self._buf.pop()
