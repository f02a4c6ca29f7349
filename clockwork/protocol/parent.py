"""A child process that outlives the process that started it stops.

``clockwork serve`` (``LocalCluster``) starts its controller and workers in sessions of
their own, so Ctrl-C in a terminal reaches only the parent, which stops them. If the
parent dies without doing so (SIGKILL, the OOM killer, a crash), the children would serve
on, holding their ports. The parent names itself in ``PARENT_ENV``; a child that finds it
has been handed to another parent stops as on SIGTERM.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

PARENT_ENV = "CLOCKWORK_PARENT_PID"
CHECK_EVERY_S = 0.5


def parent_env() -> dict[str, str]:
    """What a parent puts in a child's environment to name itself."""
    return {PARENT_ENV: str(os.getpid())}


async def stop_when_orphaned(stop: asyncio.Event, who: str) -> None:
    """Set ``stop`` once the parent named in ``PARENT_ENV`` is no longer this process's
    parent; returns at once when none is named (a process started by hand)."""
    # (here: a parent that only names itself does not load asyncio)
    from clockwork.protocol.waits import wait_set

    text = os.environ.pop(PARENT_ENV, "")  # (not passed on to processes started here)
    if not text.isdigit():
        return
    parent = int(text)
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            try:  # (its output may have gone with it: a pipe nobody reads)
                print(f"clockwork {who}: the process that started it ({parent}) is gone; "
                      "stopping", file=sys.stderr, flush=True)
            except OSError:
                pass
            return
        await wait_set(stop, CHECK_EVERY_S)
