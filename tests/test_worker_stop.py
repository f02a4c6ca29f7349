"""A worker stopped with SIGTERM while a controller is connected over the fast link stops
quietly: exit 0, no traceback (the live link's task was left to the loop's shutdown, and
asyncio's streams callback printed its CancelledError about half the time)."""

from __future__ import annotations

import signal
import time

import clockwork
from clockwork.errors import ClockworkError
from tests.conftest import local_cluster

ROUNDS = 6  # the race showed about every other stop


def _served(address: str, timeout: float = 30.0) -> dict[str, int]:
    """Once a request is answered SUCCESS (the controller has the worker again): the
    controller's counters."""
    deadline = time.monotonic() + timeout
    with clockwork.Client(address, timeout=10) as cl:
        while True:
            try:
                if cl.infer("mobilenet_v2", slo_ms=2000).status == 0:
                    return cl.stats()
            except ClockworkError:
                pass
            assert time.monotonic() < deadline, "the controller did not serve again"
            time.sleep(0.05)


def test_sigterm_with_a_live_fast_link_leaves_no_traceback():
    with local_cluster(workers=1, gpus=1, models="mobilenet_v2") as c:
        for i in range(ROUNDS):
            if i:
                c.restart_worker(0)
            # (each connection of the controller to the worker is over the fast link)
            assert _served(c.address).get("worker_fast_links") == i + 1
            w = c.workers[0]
            w.proc.send_signal(signal.SIGTERM)
            assert w.proc.wait(30) == 0
            w._t.join(10)  # (its output read to the end)
            out = "".join(w.output)
            assert "Traceback" not in out and "Exception in callback" not in out, \
                f"round {i}:\n{out}"
