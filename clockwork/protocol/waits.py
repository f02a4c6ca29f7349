"""Waiting on an ``asyncio.Event`` for at most a while: the one way the package does it.

Not ``asyncio.wait_for(evt.wait(), s)``: on Python 3.11 it drops a cancellation that
arrives in the same turn of the loop as the event is set (it returns the wait's result
instead), so a task cancelled then runs on (a replay cancelled by Ctrl-C while answers
set its event ran to its end). The project's lint refuses ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio


async def wait_set(evt: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``evt`` is set or ``timeout_s`` has passed, whichever is first; a
    cancellation passes through."""
    try:
        async with asyncio.timeout(timeout_s):
            await evt.wait()
    except TimeoutError:
        pass


__all__ = ["wait_set"]
