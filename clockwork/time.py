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

# Bounds on times a user gives (settings, requests): beyond them a value is a mistake (a
# unit error, a stand-in for infinity), and its nanoseconds would not fit the int64
# columns of the logs.
MAX_SLO_MS = 86_400_000.0  # an SLO: at most a day
MAX_SLO_FACTOR = 10_000.0  # an SLO as a multiple of the batch-1 EXEC: at most this
MAX_TIME_S = 365 * 86_400  # any other time setting: at most a year
# the longest an action may have taken, as a worker's result says (its duration, and its
# span on the controller's clock): a year, as any time setting
RESULT_SPAN_MAX_NS = MAX_TIME_S * NS_PER_S
# past its SLO, how long a client waits for an answer before giving it up (TIMEOUT,
# reason no_answer): ``clockwork.Client``'s and a live replay's, and the simulator's
# clients' too, so that a policy that answers later (tfserving, infaas under overload)
# counts the same in both
CLIENT_GRACE_NS = NS_PER_S


def ms(x: float) -> int:
    """Milliseconds (float, at the edges) -> int nanoseconds."""
    return round(x * NS_PER_MS)


def sec(x: float) -> int:
    """Seconds (float, at the edges) -> int nanoseconds."""
    return round(x * NS_PER_S)


MAX_SLO_NS = ms(MAX_SLO_MS)


def to_ms(ns: int) -> float:
    return ns / NS_PER_MS


def to_s(ns: int) -> float:
    return ns / NS_PER_S
