"""The Python client's own contract (``clockwork/client.py``) and the keepalive its
channels use. Real processes and real gRPC on loopback; a stalled peer is a SIGSTOPped
process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

grpc = pytest.importorskip("grpc")


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once the kernel shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "tT":
        time.sleep(0.001)


# ---------------------------------------------------------------- keepalive

_QUIET_SERVER = r"""
import grpc
from concurrent.futures import ThreadPoolExecutor
from clockwork.protocol import keepalive
s = grpc.server(ThreadPoolExecutor(2), options=keepalive.SERVER)
port = s.add_insecure_port("127.0.0.1:0")
s.start()
print(port, flush=True)
s.wait_for_termination()
"""


def test_keepalive_gives_up_on_a_silent_peer_within_its_ping_timeout():
    """The channels' keepalive settings, ten times faster (ping after 1 s of silence,
    give up 0.5 s later): a call to a server that stopped (SIGSTOP) fails UNAVAILABLE
    within ~1.5 s, not after gRPC's 60 s ping timeout (``grpc.http2.ping_timeout_ms``,
    which a keepalive ping obeys too). At full scale: ~15 s (checked by hand)."""
    from clockwork.protocol import keepalive

    options = [(k, v // 10 if k.endswith("_ms") else v) for k, v in keepalive.CHANNEL]
    p = subprocess.Popen([sys.executable, "-c", _QUIET_SERVER], stdout=subprocess.PIPE,
                         text=True)
    try:
        port = p.stdout.readline().strip()
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
            call = ch.unary_unary("/clockwork.test/Nothing")
            with pytest.raises(grpc.RpcError) as first:
                call(b"", timeout=10)
            assert first.value.code() == grpc.StatusCode.UNIMPLEMENTED  # connected
            _stop(p.pid)
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as stalled:
                call(b"", timeout=8)
            took = time.monotonic() - t0
        assert stalled.value.code() == grpc.StatusCode.UNAVAILABLE, stalled.value
        assert took < 4.0
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()
