"""A cluster on IPv6: ``--host ::1`` or ``[::1]`` for the controller and its workers."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request

import pytest

from clockwork.cluster.local import _Child, _cli
from tests.conftest import wait_output

TOKEN = "test-token-0123456789abcdef"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_cluster_on_ipv6_loopback_serves(tmp_path):
    """``--host ::1`` (or ``[::1]``) for a worker and a controller: they listen, print
    their addresses in brackets, connect (fast link too) and serve. Every listener failed
    (gRPC was given ``::1:0``; REST and the fast link ``[::1]``)."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    import clockwork

    w = _Child("worker", _cli() + ["worker", "--host", "::1", "--port", "0"])
    c = None
    try:
        waddr = w.wait_address(30.0)
        assert waddr.startswith("[::1]:"), waddr
        c = _Child("controller", _cli() + ["controller", "--host", "[::1]", "--workers", waddr,
                                           "--port", "0", "--http-port", "0",
                                           "--kserve-port", "-1", "--models", "resnet50_v2",
                                           "--token", TOKEN])
        caddr = c.wait_address(30.0)
        assert caddr.startswith("[::1]:"), caddr
        with clockwork.Client(caddr, timeout=30, token=TOKEN) as cl:
            assert cl.infer("resnet50_v2", slo_ms=2000).status == 0
            assert cl.stats().get("worker_fast_links", 0) == 1
        # a refused REST call's line names its caller as [ADDRESS]:PORT (it read
        # "::1:33040:0:0", the flow and scope fields as if a port)
        wait_output(c, "http listening on")
        http = c.announced("http")
        assert http.startswith("[::1]:"), http
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{http}/v2/models/resnet50_v2", timeout=30)
        assert e.value.code == 401
        line = wait_output(c, "refused an unauthenticated HTTP request")
        assert re.search(r"request GET /v2/models/resnet50_v2 from \[::1\]:\d+ "
                         r"\(no token\)", line), line
    finally:
        if c is not None:
            c.stop()
        w.stop()
