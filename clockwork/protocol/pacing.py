"""Message pacing for streams: at most one message per interval.

Every gRPC stream message costs far more CPU than the few requests, actions or results
in it (tens of microseconds of grpc.aio machinery per message in Python). A stream writer
that sends whatever is pending, but no sooner than ``interval`` after its previous
message, sends the first message after a quiet spell at once (no added latency at low
rates) and, under load, one message per interval carrying everything that accumulated.
The added delay is at most one interval (asyncio sleeps have ~1 ms resolution, so
intervals below a millisecond still wait up to one).
"""

from __future__ import annotations

import asyncio
import time


class Pacer:
    __slots__ = ("interval", "last")

    def __init__(self, interval_us: float) -> None:
        if interval_us < 0:
            raise ValueError(f"pacing interval must be >= 0, got {interval_us}")
        self.interval = round(interval_us * 1000)  # ns
        self.last = 0

    async def wait(self) -> None:
        """Before sending: sleep out the rest of the interval since the last message."""
        if self.interval:
            delay = self.last + self.interval - time.monotonic_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            self.last = time.monotonic_ns()
