"""Message pacing for streams: under load, at most one message per interval.

Every gRPC stream message costs far more CPU than the few requests, actions or results
in it (on the order of 100 us of grpc.aio machinery per message in Python, measured in
experiments/bench_live.py). A busy stream therefore sends whatever is pending no sooner
than ``interval`` after its previous message: one message per interval, carrying
everything that accumulated. A quiet stream sends at once, so pacing adds no latency at
low rates. "Busy" = more than ``busy_rate`` items (requests, actions, results) per second
over the last ``WINDOW`` *and* this process using more than ``CPU_BUSY`` of a core over
that window (with a little hysteresis): pacing trades latency for CPU, so it is only
worth it when CPU is short. The added delay is at most one interval (asyncio sleeps have
~1 ms resolution). The controller's reply writer (``controller.intake``) and a worker's
result writer (``worker.service``) use ``slot``/``sent`` to send sooner a reply or result
that is due (one interval before its SLO ends, or its batch's deadline), and the
controller's action writer (``controller.links``) an action one interval before its
latest start; requests are paced as they come.
"""

from __future__ import annotations

import time

WINDOW = 100_000_000  # ns over which the stream's item rate is measured
CPU_BUSY = 0.5  # share of one core this process must be using for pacing to start

# Default intervals (microseconds; 0 turns pacing off), the command-line defaults too.
ACTION_INTERVAL_US = 2000.0  # controller -> worker actions (paced only when busy)
REPLY_INTERVAL_US = 2000.0  # controller -> client InferStream replies
RESULT_INTERVAL_US = 2000.0  # worker -> controller results


def _cpu_share(since_wall: int, since_cpu: int, now_wall: int, now_cpu: int) -> float:
    return (now_cpu - since_cpu) / max(1, now_wall - since_wall)


async def doze(at: int, wake) -> bool:
    """Sleep until ``at`` (``time.monotonic_ns``) unless ``wake`` (an ``asyncio.Event``)
    is set sooner: whether it was (False: ``at`` came, or had come already)."""
    delay = at - time.monotonic_ns()
    if delay <= 0:
        return False
    import asyncio  # (see Pacer.wait)

    try:
        async with asyncio.timeout(delay / 1e9):
            await wake.wait()
    except TimeoutError:
        return False
    return True


class Pacer:
    __slots__ = ("interval", "busy_rate", "last", "busy", "_count", "_since", "_cpu_since")

    def __init__(self, interval_us: float, busy_rate: float = 1500.0) -> None:
        if interval_us < 0 or busy_rate < 0:
            raise ValueError(f"pacing interval and rate must be >= 0, got {interval_us}, "
                             f"{busy_rate}")
        self.interval = round(interval_us * 1000)  # ns
        self.busy_rate = busy_rate
        self.last = 0  # when the previous message went
        self.busy = busy_rate == 0  # 0: always pace
        self._count = 0
        self._since = time.monotonic_ns()
        self._cpu_since = time.process_time_ns()

    def note(self, items: int) -> None:
        """``items`` more are about to be sent (updates the busy/quiet state)."""
        self._count += items
        now = time.monotonic_ns()
        elapsed = now - self._since
        if elapsed >= WINDOW and self.busy_rate:
            rate = self._count * 1e9 / elapsed
            cpu = time.process_time_ns()
            share = _cpu_share(self._since, self._cpu_since, now, cpu)
            # hysteresis: quiet again only well below the thresholds
            k = 0.7 if self.busy else 1.0
            self.busy = rate > k * self.busy_rate and share > k * CPU_BUSY
            self._count, self._since, self._cpu_since = 0, now, cpu

    def slot(self, due: int = 0) -> int:
        """When the next message may go (``time.monotonic_ns``): the end of the interval
        after the previous one on a busy stream, or ``due`` if that is sooner (when an
        item waiting must go at the latest; 0: none); 0 (now) on a quiet stream or
        without pacing. The sender calls ``sent`` as it sends."""
        if not (self.interval and self.busy):
            return 0
        at = self.last + self.interval
        return due if due and due < at else at

    def sent(self) -> None:
        self.last = time.monotonic_ns()

    async def wait(self) -> None:
        """Before sending: on a busy stream, sleep out the rest of the interval."""
        delay = self.slot() - time.monotonic_ns()
        if delay > 0:
            # imported here, not at the top: the CLI reads this module's defaults,
            # and a simulation should not pay for importing asyncio (~0.1 s)
            import asyncio

            await asyncio.sleep(delay / 1e9)
        self.sent()
