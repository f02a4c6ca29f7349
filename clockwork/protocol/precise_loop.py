"""An asyncio event loop whose timers fire on time to the microsecond, for the worker.

asyncio's default selector on Linux (epoll) rounds every wait up to a whole millisecond,
so a timer 100 µs away fires after 1 ms. A worker times each emulated action's end and
each action's ``earliest`` with loop timers; with that rounding a 100 µs INFER is
reported up to a millisecond late (its result waits, and so does its client), whatever
its measured duration says. ``select()`` takes its timeout in microseconds, so a loop on
``selectors.SelectSelector`` wakes when asked. ``select()`` handles file descriptors
below ``FD_SETSIZE`` (1024) only, which a worker (a listening socket or two and its
controller's connections) stays far below; a process that serves many clients (the
controller) keeps the default loop.
"""

from __future__ import annotations

import asyncio
import selectors


def precise_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def run_precise(main) -> object:
    """``asyncio.run(main)`` on a :func:`precise_loop`."""
    with asyncio.Runner(loop_factory=precise_loop) as runner:
        return runner.run(main)


__all__ = ["precise_loop", "run_precise"]
