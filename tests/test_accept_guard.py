"""A process out of file descriptors: its asyncio listeners (the controller's REST port,
the worker's fast link) wait a second and say so in one line a second, instead of
logging a traceback per accept and arming ever more retry timers (a flood of idle
connections made millions of log lines and a busy core)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import pytest

resource = pytest.importorskip("resource")

LIMIT = 64  # descriptors for the worker: a 150-connection flood runs it out


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def test_a_worker_out_of_descriptors_says_so_a_line_a_second_and_serves_on():
    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "worker", "--host",
                          "127.0.0.1", "--port", "0", "--link-port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=_limited)
    flood: list[socket.socket] = []
    try:
        first = p.stdout.readline()
        port = int(re.search(r"fast link on port (\d+)", first)[1])
        for _ in range(150):  # each taken connection holds one of its descriptors
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
        reader.start()
        time.sleep(3.0)  # (the window measured: three seconds out of descriptors)
    finally:
        for s in flood:
            s.close()
        p.terminate()
        p.wait(30)
    reader.join(30)
    said = [x for x in lines if "cannot accept a connection" in x]
    assert said, lines[:20]
    assert said[0].startswith("worker: cannot accept a connection: Too many open files "
                              f"(descriptors limit {LIMIT}); new connections wait"), said[0]
    # a line a second (it was thousands, growing), and no asyncio traceback per accept
    assert len(said) <= 8, (len(said), said[:3])
    assert not any("Traceback" in x or "socket.accept() out of system resource" in x
                   for x in lines), lines[:20]
