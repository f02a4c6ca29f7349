"""A child process that outlives the process that started it stops.

``clockwork serve`` (``LocalCluster``) starts its controller and workers in sessions of
their own, so Ctrl-C in a terminal reaches only the parent, which stops them. If the
parent dies without doing so (SIGKILL, the OOM killer, a crash), the children would serve
on, holding their ports. The parent names itself in ``PARENT_ENV``; a child that finds it
has been handed to another parent stops as on SIGTERM, and removes the parent's temporary
run folder if it was given it (``PARENT_DIR_ENV``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

PARENT_ENV = "CLOCKWORK_PARENT_PID"
# the parent's private run folder (``LocalCluster``'s temporary one: the settings and the
# client token it hands its controller), which an orphaned child removes: the parent,
# killed, could not (a token in plain text was left behind, a folder per killed run)
PARENT_DIR_ENV = "CLOCKWORK_PARENT_RUN_DIR"
PARENT_DIR_PREFIX = "clockwork-cluster-"  # its name's start (only such a folder is removed)
CHECK_EVERY_S = 0.5


def parent_env() -> dict[str, str]:
    """What a parent puts in a child's environment to name itself (its own temporary
    run folder, named ``PARENT_DIR_PREFIX...``, goes in ``PARENT_DIR_ENV`` beside)."""
    return {PARENT_ENV: str(os.getpid())}


def _remove_run_dir(folder: str) -> None:
    """The dead parent's run folder removed (one of ours by its name only)."""
    import shutil

    if folder and os.path.basename(os.path.normpath(folder)).startswith(PARENT_DIR_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


async def stop_when_orphaned(stop: asyncio.Event, who: str) -> None:
    """Set ``stop`` once the parent named in ``PARENT_ENV`` is no longer this process's
    parent; returns at once when none is named (a process started by hand)."""
    # (here: a parent that only names itself does not load asyncio)
    from clockwork.protocol.waits import wait_set

    text = os.environ.pop(PARENT_ENV, "")  # (not passed on to processes started here)
    run_dir = os.environ.pop(PARENT_DIR_ENV, "")
    if not text.isdigit():
        return
    parent = int(text)
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            _remove_run_dir(run_dir)
            try:  # (its output may have gone with it: a pipe nobody reads)
                print(f"clockwork {who}: the process that started it ({parent}) is gone; "
                      "stopping", file=sys.stderr, flush=True)
            except OSError:
                pass
            return
        await wait_set(stop, CHECK_EVERY_S)
