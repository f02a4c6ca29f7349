"""Time units. Time inside the system is an ``int`` of nanoseconds everywhere.

Components never read a clock: every call takes an explicit ``now`` (the pure cores),
and only the shells read one (the live services ``time.monotonic_ns()``, the simulator
its event times). ``ms``/``sec`` convert the float figures of settings and files at the
edges. ``VirtualClock`` is a clock that only moves when told to.
"""

from __future__ import annotations

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
