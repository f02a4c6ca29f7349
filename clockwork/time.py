"""Time units. Time inside the system is an ``int`` of nanoseconds everywhere.

Components never read a clock: every call takes an explicit ``now`` (the pure cores),
and only the shells read one (the live services ``time.monotonic_ns()``, the simulator
its event times). ``ms``/``sec`` convert the float figures of settings and files at the
edges.
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
