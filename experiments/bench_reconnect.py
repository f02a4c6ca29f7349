"""Benchmark: how soon a client used through a controller outage reaches the controller
once it is back.

A cluster of one emulated worker; a ``clockwork.Client`` calls ``stats`` once, the
controller is stopped, the client keeps calling every 2 s for ``--down`` seconds (each
call fails), the controller is started again on the same port, and the time from then
to the client's first successful call is printed (gRPC's reconnect backoff, which grows
while the controller is away, decides it).

    python experiments/bench_reconnect.py [--down 90]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BACK_WAIT_S = 120.0  # how long the client is given to reach the controller once it is back


def main(argv: list[str] | None = None) -> float:
    """The seconds from the controller's return to the client's first success;
    ``ControllerUnavailable`` (exit 1 as a command) if none came within ``BACK_WAIT_S``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from clockwork.cluster.cli import argtypes as t

    ap.add_argument("--down", type=t.float_in(0.0, 86400.0), default=90.0,
                    help="seconds the controller is away, 0 to a day (default 90)")
    args = ap.parse_args(argv)

    import clockwork
    from clockwork.cluster.local import LocalCluster

    with LocalCluster(workers=1, gpus=1, models="resnet50_v2", http_port=-1,
                      timeout=60) as cl, clockwork.Client(cl.address, timeout=5) as c:
        c.stats()
        cl.controller.stop(timeout=30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.down:
            try:
                c.stats()
            except clockwork.errors.ClockworkError:
                pass
            time.sleep(min(2.0, max(0.0, args.down - (time.monotonic() - t0))))
        cl.restart_controller()
        t1 = time.monotonic()
        while time.monotonic() - t1 < BACK_WAIT_S:
            try:
                c.stats()
            except clockwork.errors.ClockworkError:
                time.sleep(0.1)
                continue
            took = time.monotonic() - t1
            print(f"controller away {args.down:g} s: the client's first success "
                  f"{took:.2f} s after it was back")
            return took
    raise clockwork.errors.ControllerUnavailable(
        f"the client had no success within {BACK_WAIT_S:g} s of the controller's return")


if __name__ == "__main__":
    from experiments.common import script

    script(main)
