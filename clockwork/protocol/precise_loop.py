"""An asyncio event loop whose timers fire on time to the microsecond, for the worker.

asyncio's default selector on Linux (epoll) rounds every wait up to a whole millisecond
(``epoll_wait`` takes milliseconds), so a timer 100 µs away fires after 1 ms. A worker
times each emulated action's end and each action's ``earliest`` with loop timers; with
that rounding a 100 µs INFER is reported up to a millisecond late (its result waits, and
so does its client), whatever its measured duration says.

:class:`PreciseEpollSelector` keeps epoll for the sockets (any number of them) and waits
on the epoll descriptor itself with ``select()``, whose timeout is in microseconds: the
epoll descriptor is readable as soon as any registered socket is ready, and a timeout
ends the wait when asked; then epoll is polled without waiting. One more system call per
wait. (``select()`` needs a descriptor below ``FD_SETSIZE``, 1,024; the epoll descriptor
is made when the loop starts, so it is; were it not, the wait falls back to epoll's
rounding.)
"""

from __future__ import annotations

import asyncio
import select
import selectors

FD_SETSIZE = 1024


class PreciseEpollSelector(selectors.EpollSelector):
    def select(self, timeout: float | None = None):
        if timeout is not None and timeout > 0:
            fd = self._selector.fileno()
            if fd < FD_SETSIZE:
                select.select([fd], [], [], timeout)  # readable: some socket is ready
                timeout = 0
        return super().select(timeout)


def precise_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(PreciseEpollSelector())


def run_precise(main) -> object:
    """``asyncio.run(main)`` on a :func:`precise_loop`."""
    with asyncio.Runner(loop_factory=precise_loop) as runner:
        return runner.run(main)


__all__ = ["PreciseEpollSelector", "precise_loop", "run_precise"]
