"""Duration estimates from measurements: the scheduler's view of how long LOAD and EXEC
take on a GPU, seeded from the profile and moved by every result."""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType

from clockwork.profiles import ModelProfile


def _rank(p: float, n: int) -> int:
    """The index of the ``p`` percentile of ``n`` sorted values, nearest rank: the smallest
    value with at least ``p`` of them at or below it (ceil(p n), 1-based). ``int(p n)``
    was one rank high where p n is whole: the 99th of 100 values gave the largest."""
    return min(n - 1, max(0, math.ceil(p * n - 1e-9) - 1))  # (p n a hair over a whole: it)


class SlidingWindow:
    """The last ``size`` measurements, with an order-statistic percentile.

    Clockwork estimates a duration as the 99th percentile of the last 10
    measurements (with 10 values that is the maximum).
    """

    __slots__ = ("size", "_fifo", "_sorted")

    def __init__(self, size: int = 10, seed: int | None = None) -> None:
        self.size = size
        self._fifo: deque[int] = deque()
        self._sorted: list[int] = []
        if seed is not None:
            self.insert(seed)

    def insert(self, value: int) -> None:
        self.push(value, 0.0)

    def push(self, value: int, p: float) -> int:
        """``insert(value)``, then the ``percentile(p)`` of the window."""
        value = int(value)
        fifo, srt = self._fifo, self._sorted
        if len(fifo) == self.size:
            srt.remove(fifo.popleft())
        fifo.append(value)
        insort(srt, value)
        return srt[_rank(p, len(srt))]

    def percentile(self, p: float) -> int:
        if not self._sorted:
            raise ValueError("empty window")
        return self._sorted[_rank(p, len(self._sorted))]

    def __len__(self) -> int:
        return len(self._fifo)


class Estimator:
    """Per-model duration estimates: EXEC per batch size and LOAD.

    Seeded from the profile; every measurement moves the estimate to the
    ``percentile`` of the last ``window`` measurements.
    """

    __slots__ = ("profile", "percentile", "_exec", "exec_ns", "_exec_w", "_load_w", "load",
                 "batch_sizes", "window", "measured_at", "inflated", "version", "stale",
                 "_measured", "_aged_at")

    def __init__(self, profile: ModelProfile, window: int = 10, percentile: float = 0.99,
                 stale: int | None = None) -> None:
        self.profile = profile
        self.percentile = percentile
        self.window = window
        self.measured_at = 0  # when the last EXEC was measured (ns)
        # an inflated EXEC estimate of a batch size not measured for this long (ns) is set
        # to its window's median (``_age``); None: never
        self.stale = stale
        self._measured: dict[int, int] = {}  # batch size -> when it was last measured
        self._aged_at = 0  # when ``_age`` last looked
        self.inflated = False  # some EXEC estimate is above the profile's figure
        self.version = 0  # bumped whenever an EXEC estimate changes
        self.batch_sizes = profile.batch_sizes
        # a batch size's window, seeded with the profile's figure, is made at its first
        # measurement: most sizes of most models are never measured
        self._exec_w: dict[int, SlidingWindow] = {}
        self._exec = dict(profile.exec_ns)
        # the current EXEC estimate per batch size (ns): a read-only live view, for hot
        # loops that look up many sizes (``exec(b)`` is the same figure)
        self.exec_ns: Mapping[int, int] = MappingProxyType(self._exec)
        self._load_w = SlidingWindow(window, profile.load_ns)
        self.load = profile.load_ns  # the current LOAD estimate (ns)

    def exec(self, batch_size: int) -> int:
        """The current EXEC estimate for ``batch_size`` (ns)."""
        return self._exec[batch_size]

    def add_exec(self, batch_size: int, duration: int, now: int = 0) -> None:
        w = self._exec_w.get(batch_size)
        if w is None:
            seed = self.profile.exec_ns.get(batch_size)
            if seed is None:
                return
            w = self._exec_w[batch_size] = SlidingWindow(self.window, seed)
        e = w.push(duration, self.percentile)
        if e != self._exec[batch_size]:
            self._exec[batch_size] = e
            self.version += 1
        self.measured_at = self._measured[batch_size] = now
        if e > self.profile.exec_ns[batch_size]:
            self.inflated = True
        elif self.inflated:
            prof = self.profile.exec_ns
            self.inflated = any(v > prof[b] for b, v in self._exec.items())
        if self.inflated and self.stale is not None and now - self._aged_at > self.stale:
            self._aged_at = now
            self._age(now)

    def _age(self, now: int) -> None:
        """The inflated EXEC estimates of the batch sizes not measured for ``stale`` made
        the median of their windows: one straggler at a batch size made that size look
        too slow for every batch, so it never ran, so nothing measured it again (the
        model then ran at its smaller sizes for good, short of the rate it was offered);
        the median leaves a straggler out and keeps what the size usually takes (on a
        live worker, more than the profile's figure). Looked at as the model's other
        sizes are measured, at most once per ``stale``."""
        prof = self.profile.exec_ns
        for b, v in list(self._exec.items()):
            w = self._exec_w.get(b)
            if v > prof[b] and w is not None and now - self._measured.get(b, 0) > self.stale:
                mid = w.percentile(0.5)
                if mid != v:
                    self._exec_w[b] = SlidingWindow(self.window, mid)
                    self._exec[b] = mid
                    self.version += 1
        self.inflated = any(v > prof[b] for b, v in self._exec.items())

    def forget_exec(self) -> None:
        """Back to the profile's EXEC figures. For an estimate that a straggler pushed past
        every SLO: with no EXEC run, no measurement would ever bring it down again."""
        self._exec_w = {}
        self._exec.clear()
        self._exec.update(self.profile.exec_ns)
        self.version += 1
        self.inflated = False

    def add_load(self, duration: int) -> None:
        self.load = self._load_w.push(duration, self.percentile)
