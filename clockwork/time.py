"""Clocks. Time inside the system is an ``int`` of nanoseconds everywhere.

``RealClock`` reads the monotonic clock; ``VirtualClock`` is advanced by a
discrete-event loop (the simulator, unit tests). Components take a clock or an
explicit ``now`` and never call ``time`` themselves, so the same code runs in
both.
"""

from __future__ import annotations

import time
from typing import Protocol

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def ms(x: float) -> int:
    """Milliseconds (float, at the edges) -> int nanoseconds."""
    return round(x * NS_PER_MS)


def sec(x: float) -> int:
    """Seconds (float, at the edges) -> int nanoseconds."""
    return round(x * NS_PER_S)


def to_ms(ns: int) -> float:
    return ns / NS_PER_MS


def to_s(ns: int) -> float:
    return ns / NS_PER_S


class Clock(Protocol):
    def now(self) -> int: ...


class RealClock:
    """Monotonic wall clock in int nanoseconds."""

    __slots__ = ()

    def now(self) -> int:
        return time.monotonic_ns()


class VirtualClock:
    """A clock that only moves when told to. Never goes backwards."""

    __slots__ = ("_now",)

    def __init__(self, start: int = 0) -> None:
        self._now = int(start)

    def now(self) -> int:
        return self._now

    def advance_to(self, t: int) -> None:
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back: {t} < {self._now}")
        self._now = int(t)

    def advance(self, dt: int) -> None:
        self.advance_to(self._now + dt)
