"""The controller's KServe v2 REST server as HTTP/1.1 (aiohttp's server, configured by
``controller.kserve_rest.make_runner`` from the controller's limits), against a live
cluster on loopback with real clients: chunked and compressed request bodies, compressed
responses, ``Expect: 100-continue``, a compression bomb, 405 with ``Allow``, header
bounds, keep-alive, the idle and read timeouts, /metrics. The routes without sockets run
in a process of their own (``controller.kserve``'s protos clash with tritonclient's)."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

thttp = pytest.importorskip("tritonclient.http")

import clockwork  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402

MiB = 1 << 20
BODY_LIMIT = MiB  # rest_max_body_bytes of the cluster
HEADER_BYTES = 4096  # rest_max_header_bytes
MAX_HEADERS = 20  # rest_max_headers
HEAD_BYTES = 16384  # rest_max_head_bytes
INFER = "/v2/models/small/infer"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> Path:
    """``small`` (4 floats in and out) and ``big`` (4 in, 65,536 out: a 256 KiB answer)."""
    d = tmp_path_factory.mktemp("profiles")
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    for name, out in (("small", 4), ("big", 65536)):
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": MiB, "load_ns": 2_000_000,
            "exec_ns": {str(b): 500_000 + 50_000 * b for b in (1, 2, 4)},
            "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": [out], "dtype": "float32"}]}))
    return d


def _cluster(profiles: Path, *limits: str):
    argv = [x for lim in limits for x in ("--limit", lim)]
    return local_cluster(workers=1, gpus=1, profiles=str(profiles), controller_args=argv,
                         http_port=0)


@pytest.fixture(scope="module")
def cluster(profiles):
    with _cluster(profiles, f"rest_max_body_bytes={BODY_LIMIT}",
                  f"rest_max_header_bytes={HEADER_BYTES}",
                  f"rest_max_headers={MAX_HEADERS}",
                  f"rest_max_head_bytes={HEAD_BYTES}") as c:
        yield c


@pytest.fixture(scope="module")
def addr(cluster) -> tuple[str, int]:
    host, port = cluster.printed_address("http").rsplit(":", 1)
    return host, int(port)


def _json_body(model_input=(1.0, 2.0, 3.0, 4.0)) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "data": list(model_input)}]}).encode()


def _request(addr, method: str, path: str, body=None, headers=None, **kw):
    """One request on a new connection -> (status, headers, body)."""
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        conn.request(method, path, body, headers or {}, **kw)
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


def _head(sock: socket.socket) -> bytes:
    """Bytes from ``sock`` up to the end of one response head (or EOF)."""
    got = b""
    while b"\r\n\r\n" not in got:
        more = sock.recv(4096)
        if not more:
            break
        got += more
    return got


def _until_eof(sock: socket.socket) -> bytes:
    got = b""
    while more := sock.recv(65536):
        got += more
    return got


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _counters(cluster) -> dict:
    with clockwork.Client(cluster.address, timeout=10) as cl:
        return cl.stats()


# ---------------------------------------------------------------------- bodies


def test_chunked_body_is_accepted(addr):
    body = _json_body()
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]  # many small chunks
    status, headers, got = _request(addr, "POST", INFER, iter(pieces),
                                    {"Content-Type": "application/json"},
                                    encode_chunked=True)
    assert status == 200, got
    out = json.loads(got)["outputs"][0]
    assert out["name"] == "y" and out["shape"] == [1, 4] and len(out["data"]) == 4
    # a chunked body with binary tensors after the JSON header
    head = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}}],
                       "parameters": {"binary_data_output": True}}).encode()
    data = head + np.arange(4, dtype=np.float32).tobytes()
    status, headers, got = _request(
        addr, "POST", INFER, iter([data[:10], data[10:]]),
        {"Inference-Header-Content-Length": str(len(head))}, encode_chunked=True)
    assert status == 200, got
    assert headers["Content-Type"] == "application/octet-stream"
    n = int(headers["Inference-Header-Content-Length"])
    assert json.loads(got[:n])["outputs"][0]["parameters"]["binary_data_size"] == 16
    assert len(got) == n + 16


def test_empty_or_missing_json_header_is_named(addr):
    """A JSON header of length 0, a request without 'inputs', and a JSON null are each
    named as the client sent them (not as Python's None)."""
    cases = (
        (b"\x00" * 16, {"Inference-Header-Content-Length": "0"}, b"JSON header is empty"),
        (b"{}", {}, b"needs an 'inputs' list (it has none)"),
        (b'{"inputs": null}', {}, b"needs an 'inputs' list, got null"),
        (b'{"inputs": [true]}', {}, b"must be an object, got true"),
    )
    for body, headers, says in cases:
        status, _, got = _request(addr, "POST", INFER, body, headers)
        assert status == 400 and says in got, (body, got)


def test_json_beyond_strict_json(addr):
    """What Python's json reads beyond strict JSON is still read (NaN, Infinity, a
    byte-order mark), an integer beyond 64 bits is a number (a float, as Triton reads
    it), and a body that is not JSON, or holds a number beyond a double's range (read as
    an infinity, it was taken as sent), is the client's error."""
    status, _, got = _request(addr, "POST", INFER, _json_body((1.0, 2.0, 3.0, 4.0)).replace(
        b"4.0", b"1e400"), {"Content-Type": "application/json"})
    assert status == 400 and b"number 1e400 is beyond the range of a double" in got, got
    for data, head in ((b"[NaN, Infinity, -Infinity, 1e30]", b""),
                       (b"[1, 2, 3, 4]", b"\xef\xbb\xbf"),
                       (b"[1, 2, 3, 18446744073709551616]", b"")):
        body = head + (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
                       b'"data": ' + data + b"}]}")
        status, _, got = _request(addr, "POST", INFER, body,
                                  {"Content-Type": "application/json"})
        assert status == 200, got
        assert json.loads(got)["outputs"][0]["shape"] == [1, 4]
    status, _, got = _request(addr, "POST", INFER, b'{"inputs": [', {})
    assert status == 400 and b"request body is not JSON" in got, got


def test_bodies_that_once_were_answered_500(addr):
    """Malformed in ways the JSON readers or numpy take quietly or crash on: JSON nested
    deeper than any reader goes (in the body, in a tensor's data, in a model
    configuration), an integer SLO beyond a float's range, JSON true/false among the
    numbers of a float tensor: 400 with a message, never 500 or a quiet 1.0."""
    deep = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ' + (
        b"[" * 3000 + b"1" + b"]" * 3000) + b"}]}"
    huge = ('{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": '
            '[1, 2, 3, 4]}], "parameters": {"slo_ms": 1' + "0" * 400 + "}}").encode()
    mixed = _json_body((1.0, True, 3.0, 4.0))
    for path, body, says in ((INFER, b"[" * 100_000, b"nested more than 1024 levels"),
                             (INFER, deep, b"nested more than 1024 levels"),
                             (INFER, huge, b"'slo_ms' must be a finite number"),
                             (INFER, mixed, b"holds true/false"),
                             ("/v2/repository/models/small/load",
                              json.dumps({"parameters": {"config": "[" * 100_000}}).encode(),
                              b"nested more than 1024 levels")):
        status, _, got = _request(addr, "POST", path, body)
        assert status == 400 and says in got, (path, body[:60], got)
    status, _, got = _request(addr, "POST", INFER, _json_body((0.0, 1.0, 1, 0)))
    assert status == 200, got  # 0 and 1 as numbers are numbers


def test_chunked_body_over_the_limit_is_refused(addr):
    chunk = bytes(64 * 1024)
    status, headers, got = _request(addr, "POST", INFER,
                                    iter([chunk] * (BODY_LIMIT // len(chunk) + 2)),
                                    encode_chunked=True)
    assert status == 413 and b"rest_max_body_bytes" in got
    assert headers["Connection"] == "close"


def test_expect_100_continue(addr):
    body = _json_body()
    with socket.create_connection(addr, timeout=10) as s:
        # over the limit: 413 at once, before any body is sent; then the server closes
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {BODY_LIMIT + 1}\r\nExpect: 100-continue\r\n\r\n"
                  .encode())
        got = _until_eof(s)
        assert got.startswith(b"HTTP/1.1 413 "), got
        assert b"100 Continue" not in got
    with socket.create_connection(addr, timeout=10) as s:
        # within it: 100 Continue, then the body is sent and answered
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode())
        assert _head(s).startswith(b"HTTP/1.1 100 Continue\r\n")
        s.sendall(body)
        r = http.client.HTTPResponse(s)
        r.begin()
        assert r.status == 200 and json.loads(r.read())["outputs"][0]["shape"] == [1, 4]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses_with_tritonclient(addr, algorithm):
    cl = thttp.InferenceServerClient(f"{addr[0]}:{addr[1]}")
    try:
        for binary in (False, True):
            x = thttp.InferInput("x", [1, 4], "FP32")
            x.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=binary)
            want = [thttp.InferRequestedOutput("y", binary_data=binary)]
            for model, n in (("small", 4), ("big", 65536)):  # big: a compressed answer
                r = cl.infer(model, [x], outputs=want, request_compression_algorithm=algorithm,
                             response_compression_algorithm=algorithm)
                y = r.as_numpy("y")
                assert y.shape == (1, n) and y.dtype == np.float32
    finally:
        cl.close()


def test_response_compression_raw(addr):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "data": [0, 0, 0, 0]}]}).encode()
    for enc, decode in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        status, headers, got = _request(addr, "POST", "/v2/models/big/infer", body,
                                        {"Accept-Encoding": enc})
        assert status == 200 and headers["Content-Encoding"] == enc
        assert len(got) < 65536  # 65,536 zeros as JSON: ~262 KB before compression
        assert json.loads(decode(got))["outputs"][0]["shape"] == [1, 65536]
    status, headers, got = _request(addr, "POST", "/v2/models/big/infer", body)
    assert status == 200 and "Content-Encoding" not in headers and len(got) > 65536
    assert headers["Vary"] == "Accept-Encoding"  # (a cache must keep the two apart)
    # q=0 is "not acceptable" (RFC 9110): the answer comes as it is; the best rated wins
    for accept, want in (("identity, deflate;q=0", None), ("gzip;q=0, deflate", "deflate"),
                         ("gzip;q=0.5, deflate;q=0.8", "deflate"), ("*;q=0", None),
                         ("br, *", "gzip")):
        status, headers, got = _request(addr, "POST", "/v2/models/big/infer", body,
                                        {"Accept-Encoding": accept})
        assert status == 200 and headers.get("Content-Encoding") == want, accept
        assert headers["Vary"] == "Accept-Encoding"
    # a short answer is not worth compressing
    status, headers, got = _request(addr, "GET", "/v2/health/live", None,
                                    {"Accept-Encoding": "gzip"})
    assert status == 200 and "Content-Encoding" not in headers
    assert json.loads(got) == {"live": True}


def test_request_body_compressed_raw(addr):
    body = _json_body()
    for enc, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        status, _, got = _request(addr, "POST", INFER, data, {"Content-Encoding": enc})
        assert status == 200, got
    status, _, got = _request(addr, "POST", INFER, b"not gzip at all",
                              {"Content-Encoding": "gzip"})
    assert status == 400, got


def test_compression_bomb_is_refused_and_not_held(cluster, addr):
    """256 MiB of zeros, gzip-compressed to ~260 KB (16 members of 16 MiB): under the
    1 MiB body limit as sent, far over it decoded. Answered 413 once the decoded body
    passes the limit; the controller decodes no more of it (its peak memory does not
    grow by the decoded size) and answers the next request."""
    member = gzip.compress(bytes(16 * MiB), compresslevel=9)
    bomb = member * 16
    assert len(bomb) < BODY_LIMIT
    pid = cluster.controller.proc.pid
    before = _counters(cluster).get("http_413", 0)
    peak0 = _peak_rss_mb(pid)
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                  f"Content-Length: {len(bomb)}\r\n\r\n".encode() + bomb)
        got = _until_eof(s)  # answered, then closed (after rest_linger_timeout)
    peak1 = _peak_rss_mb(pid)
    assert got.startswith(b"HTTP/1.1 413 ") and b"once decoded" in got, got[:300]
    assert peak1 - peak0 < 64, f"the controller's peak memory grew {peak1 - peak0:.0f} MB"
    status, _, _ = _request(addr, "POST", INFER, _json_body())
    assert status == 200
    assert _counters(cluster).get("http_413", 0) == before + 1


def _rss_mb(pid: int) -> float:
    """The process's resident memory now (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_bodies_being_read_are_bounded_and_let_go_when_their_client_goes(profiles):
    """Uploads of 40 MB (each under the 64 MiB body limit) left unfinished: two are read
    while a third, taking the bodies being read past global_outstanding_bytes (100 MiB),
    is answered 503 with Retry-After (nothing bounded them all together); once their
    clients close, what was read of them is freed at once (the client's disconnection,
    kept by the request, held the body through a reference cycle until a full garbage
    collection: hundreds of MB stayed); and the controller serves on."""
    part = 40 * 10**6
    with _cluster(profiles, f"global_outstanding_bytes={100 * MiB}") as c:
        host, port = c.printed_address("http").rsplit(":", 1)
        addr = (host, int(port))
        pid = c.controller.proc.pid
        rss0 = _rss_mb(pid)
        head = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {part + 1}\r\n\r\n").encode()
        socks = [socket.create_connection(addr, timeout=10) for _ in range(2)]
        try:
            for s in socks:
                s.sendall(head + bytes(part))
            deadline = time.monotonic() + 20
            while _rss_mb(pid) < rss0 + 70 and time.monotonic() < deadline:
                time.sleep(0.05)  # (until the controller has read both)
            assert _rss_mb(pid) >= rss0 + 70, (rss0, _rss_mb(pid))
            with socket.create_connection(addr, timeout=10) as third:
                third.sendall(head)
                with contextlib.suppress(OSError):  # (answered, it may stop reading)
                    third.sendall(bytes(part))
                got = _head(third)
            assert got.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in got, got[:300]
            assert b"global_outstanding_bytes" in got, got[:400]
        finally:
            for s in socks:
                s.close()
        deadline = time.monotonic() + 20
        while _rss_mb(pid) > rss0 + 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rss_mb(pid) <= rss0 + 30, f"{_rss_mb(pid) - rss0:.0f} MB still held"
        status, _, _ = _request(addr, "POST", INFER, _json_body())
        assert status == 200
        counted = _counters(c)
        assert counted.get("rest_bodies_abandoned") == 2, counted
        assert counted.get("http_503") == 1, counted


# ---------------------------------------------------------------------- routes, heads


def test_an_unknown_version_is_cut_in_the_answer(addr):
    """A version of 3,000 characters is named cut to 130, as a model name is (REST
    echoed it whole: its answer as long as the request line allows)."""
    status, _, got = _request(addr, "GET", "/v2/models/small/versions/" + "a" * 3000)
    assert status == 404, got
    error = json.loads(got)["error"]
    assert "has no version 'aaa" in error and "..." in error and len(error) < 250, error


def test_wrong_method_is_405_with_allow(addr):
    for method, path, allow in (("GET", INFER, "POST"), ("DELETE", INFER, "POST"),
                                ("POST", "/v2/health/live", "GET, HEAD"),
                                ("PUT", "/v2/models/small", "GET, HEAD"),
                                ("GET", "/v2/repository/index", "POST"),
                                ("POST", "/metrics", "GET, HEAD")):
        status, headers, got = _request(addr, method, path)
        assert status == 405, (method, path, got)
        assert headers["Allow"] == allow
        assert "error" in json.loads(got)
    status, _, got = _request(addr, "GET", "/v2/no/such/path")
    assert status == 404 and "no route" in json.loads(got)["error"]
    status, headers, got = _request(addr, "HEAD", "/v2/models/small")
    assert status == 200 and got == b"" and int(headers["Content-Length"]) > 0


PROBES = ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready")


def test_probes_never_read_their_bodies(addr):
    """The probes, open without a token, answer without reading a body, let alone
    decoding it: another method than GET/HEAD is 405 with ``Allow``, a GET with a body
    is answered as without one (a body that is no gzip, or one over the body limit once
    decoded, changes nothing), the connection closing after the answer; a body still
    on its way is not waited for; ``Expect: 100-continue`` gets no 100 Continue."""
    bomb = zlib.compress(bytes(16 * MiB), 9)  # ~16 KB, over BODY_LIMIT decoded
    for path in PROBES:
        for method in ("POST", "PUT", "DELETE"):
            status, headers, got = _request(addr, method, path, bomb,
                                            {"Content-Encoding": "deflate"})
            assert status == 405, (method, path, got)
            assert headers["Allow"] == "GET, HEAD" and headers["Connection"] == "close"
        for body, coding in ((b"not gzip at all", "gzip"), (bomb, "deflate")):
            status, headers, got = _request(addr, "GET", path, body,
                                            {"Content-Encoding": coding})
            assert status == 200 and headers["Connection"] == "close", (path, got)
        # the head and a little of a body announced as 1 MB: answered at once
        for method, want in (("POST", b"405"), ("GET", b"200")):
            with socket.create_connection(addr, timeout=5) as s:
                s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
                          f"deflate\r\nContent-Length: {MiB}\r\n\r\n".encode() + bomb[:1000])
                got = _head(s)
                assert got.split(b" ", 2)[1] == want, (method, path, got)
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                      "Expect: 100-continue\r\n\r\n".encode())
            got = _until_eof(s)  # answered, then closed: the body is not asked for
            assert got.startswith(b"HTTP/1.1 200 ") and b"100 Continue" not in got, got
            # (said, as every answer that closes its connection says it)
            assert b"\r\nConnection: close\r\n" in got, got
    # a probe without a body keeps its connection alive (load balancers reuse it)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        socks = []
        for path in PROBES:
            conn.request("GET", path, headers={"Content-Length": "0"})
            r = conn.getresponse()
            assert r.status == 200 and r.read()
            socks.append(conn.sock)
        assert socks[0] is not None and all(x is socks[0] for x in socks)
    finally:
        conn.close()


def test_paths_with_line_breaks_are_answered_by_the_routes(addr):
    """A path holding an encoded line break (a model name with ``%0A``) is answered by
    the controller's routes, with a JSON error, not by aiohttp's plain-text "404: Not
    Found" (the catch-all route's ``.*`` stopped at the decoded line break; found by
    tests/test_rest_schemathesis.py)."""
    for method, path, want, why in (
            ("GET", "/v2/models/a%0Ab", 404, "unknown model"),
            ("GET", "/v2/models/a%0D%0Ab/ready", 404, "unknown model"),
            ("POST", "/v2/models/%0A/infer", 404, "unknown model"),
            ("GET", "/v2/models/small/versions/1%0A/ready", 404, "no version"),
            ("GET", "/v2/no%0Asuch", 404, "no route"),
            ("GET", "/v2/models/small%0A/infer", 405, "not allowed")):
        status, headers, got = _request(addr, method, path, b"{}" if method == "POST" else None)
        assert status == want, (path, status, got)
        assert headers["Content-Type"] == "application/json", (path, headers)
        assert why in json.loads(got)["error"], (path, got)


def test_a_head_is_bounded_in_all(cluster, addr):
    """Each header within ``rest_max_header_bytes`` and their count within
    ``rest_max_headers``, a head over ``rest_max_head_bytes`` in all is answered 400
    naming the bound, then the connection closes: one still arriving as soon as what
    came of it is over the bound (its end never sent: aiohttp held it, ~1.6 MB at the
    default bounds, until the idle timeout), a whole one however it arrived. Requests
    before it on the connection are answered first; a head within the bound is served."""
    says = {"error": f"request head over {HEAD_BYTES} bytes (rest_max_head_bytes)"}
    big = "".join(f"X-{i}: {'a' * 3000}\r\n" for i in range(6))  # (~18 KB)
    fits = "".join(f"X-{i}: {'a' * 3000}\r\n" for i in range(4))  # (~12 KB)
    before = _counters(cluster).get("http_400", 0)
    for data in (f"GET /v2 HTTP/1.1\r\nHost: x\r\n{big}",  # (no end: still arriving)
                 f"GET /v2 HTTP/1.1\r\nHost: x\r\n{big}\r\n"):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(data.encode())
            got = _until_eof(s)  # answered, then closed
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"400", got[:200]
        assert json.loads(body) == says
    # in pieces: the same
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")
        for line in big.split("\r\n")[:-1]:
            s.sendall(line.encode() + b"\r\n")
        got = _until_eof(s)
    assert got.split(b" ", 2)[1] == b"400" and json.loads(got.partition(b"\r\n\r\n")[2]) == says
    # a request before it on the connection is answered first, also when the head after
    # it is unfinished, in the same piece (what came after a head with no body counts)
    for data in (f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{fits}\r\n"
                 f"GET /v2 HTTP/1.1\r\nHost: x\r\n{big}\r\n",
                 f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                 f"GET /v2 HTTP/1.1\r\nHost: x\r\n{big}"):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(data.encode())
            got = _until_eof(s)
        first, _, rest = got.partition(b" 400 Bad Request\r\n")
        assert first.startswith(b"HTTP/1.1 200") and b'{"live":true}' in first, got[:300]
        assert json.loads(rest.partition(b"\r\n\r\n")[2]) == says
    status, _, _ = _request(addr, "GET", "/v2", None,
                            dict(line.split(": ") for line in fits.split("\r\n") if line))
    assert status == 200
    assert _counters(cluster).get("http_400", 0) == before + 5


def test_repository_routes_check_their_bodies(addr):
    for path, body in (("/v2/repository/index", b'{"ready": "yes"}'),
                       ("/v2/repository/index", b"[1, 2]"),
                       ("/v2/repository/index", b"{not json"),
                       ("/v2/repository/models/small/load", b'{"parameters": [1]}'),
                       ("/v2/repository/models/small/unload", b'"x"')):
        status, _, got = _request(addr, "POST", path, body)
        assert status == 400, (path, body, got)
        assert json.loads(got)["error"]


def test_head_bounds(cluster, addr):
    """A request head over the bounds, or not HTTP, is answered 400 with KServe's JSON
    error body naming what is wrong, as every other error (it was aiohttp's text/plain
    page, which tritonclient's HTTP client could not read: "Parse error at offset 0"),
    and the connection closes."""
    before = _counters(cluster).get("http_400", 0)
    many = "".join(f"X-{i}: y\r\n" for i in range(MAX_HEADERS + 5))
    long_header = f"X-Long: {'a' * (HEADER_BYTES + 10)}\r\n"
    long_line = f"GET /v2/{'a' * (HEADER_BYTES + 10)} HTTP/1.1\r\nHost: x\r\n\r\n"
    for data, says in (
            (f"GET /v2 HTTP/1.1\r\nHost: x\r\n{many}\r\n",
             f"more than {MAX_HEADERS} headers (rest_max_headers)"),
            (f"GET /v2 HTTP/1.1\r\nHost: x\r\n{long_header}\r\n",
             f"request line or header over {HEADER_BYTES} bytes (rest_max_header_bytes)"),
            (long_line,
             f"request line or header over {HEADER_BYTES} bytes (rest_max_header_bytes)"),
            ("\x16\x03\x01 TLS, not HTTP\r\n\r\n",
             "not an HTTP request (no HTTP method where one begins)")):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(data.encode())
            got = _until_eof(s)  # answered, then closed
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"400", got[:200]
        assert b"\r\ncontent-type: application/json" in head.lower(), head
        assert json.loads(body) == {"error": says}
    # tritonclient's HTTP client reads it as the server's error
    client = thttp.InferenceServerClient(f"{addr[0]}:{addr[1]}")
    try:
        with pytest.raises(thttp.InferenceServerException) as e:
            client.get_server_metadata(headers={"X-Big": "a" * (HEADER_BYTES + 10)})
        assert e.value.status() == "400"
        assert e.value.message() == (f"request line or header over {HEADER_BYTES} bytes "
                                     "(rest_max_header_bytes)")
    finally:
        client.close()
    # within the bounds: answered
    ok = "".join(f"X-{i}: y\r\n" for i in range(MAX_HEADERS - 2))
    status, _, _ = _request(addr, "GET", "/v2", None,
                            dict(line.split(": ") for line in ok.split("\r\n") if line))
    assert status == 200
    assert _counters(cluster).get("http_400", 0) == before + 5


def test_keep_alive(addr):
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        socks = []
        for _ in range(3):
            conn.request("POST", INFER, _json_body())
            r = conn.getresponse()
            assert r.status == 200 and r.read()
            socks.append(conn.sock)
        assert socks[0] is not None and socks[0] is socks[1] is socks[2]
    finally:
        conn.close()


def test_metrics_scrape(addr):
    from controller.metrics import parse_text

    for _ in range(3):
        assert _request(addr, "POST", INFER, _json_body())[0] == 200
    status, headers, got = _request(addr, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples = parse_text(got.decode())
    ok = {s[0]["model"]: s[1] for s in samples["nv_inference_request_success"]}
    assert ok["small"] >= 3 and "big" in ok
    assert samples["clockwork_workers_connected"][0][1] == 1
    # compressed for a scraper that asks
    status, headers, got = _request(addr, "GET", "/metrics", None,
                                    {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert parse_text(gzip.decompress(got).decode())["nv_inference_request_success"]
    status, _, got = _request(addr, "GET", "/healthz")
    assert (status, got) == (200, b"ok\n")


# ---------------------------------------------------------------------- timeouts


def test_idle_and_read_timeouts(profiles):
    with _cluster(profiles, "rest_idle_timeout_s=0.3", "rest_read_timeout_s=0.3") as c:
        host, port = c.printed_address("http").rsplit(":", 1)
        addr = (host, int(port))
        # a keep-alive connection left idle after an answer is closed by the server
        with socket.create_connection(addr, timeout=10) as s:
            body = _json_body()
            s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                      "\r\n\r\n".encode() + body)
            r = http.client.HTTPResponse(s)
            r.begin()
            assert r.status == 200 and r.read()
            t0 = time.monotonic()
            assert s.recv(1) == b""  # EOF: the server closed it
            assert 0.2 < time.monotonic() - t0 < 5.0
        # a connection that never sends is closed too; so is one whose head never ends
        for data in (b"", b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: "):
            with socket.create_connection(addr, timeout=10) as s:
                t0 = time.monotonic()
                s.sendall(data)
                assert _until_eof(s) == b""
                assert 0.2 < time.monotonic() - t0 < 5.0
        # a body that does not arrive in time: 408, then closed
        with socket.create_connection(addr, timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                      '{"inputs"'.encode())
            got = _until_eof(s)
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert 0.2 < time.monotonic() - t0 < 5.0
        assert _request(addr, "POST", INFER, _json_body())[0] == 200
        assert _counters(c).get("http_408") == 1


def test_token_is_checked_before_the_body(profiles):
    """With a client token, a request without it is answered 401 (``WWW-Authenticate``)
    before its body is read: with ``Expect: 100-continue`` before the client sends it,
    and without, while the body has not arrived. The probes stay open."""
    token = "rest-token-0123456789abcdef"
    with local_cluster(workers=1, gpus=1, profiles=str(profiles), http_port=0,
                       token=token) as c:
        host, port = c.printed_address("http").rsplit(":", 1)
        addr = (host, int(port))
        head = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n")
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall((head + "Expect: 100-continue\r\n\r\n").encode())
            got = _until_eof(s)
            assert got.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in got, got
            assert b'WWW-Authenticate: Bearer realm="clockwork"' in got
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall((head + "Authorization: Bearer nope\r\n\r\n").encode())
            got = _head(s)  # answered though none of the 1,000 bytes was sent
            assert got.startswith(b"HTTP/1.1 401 "), got
            assert b'error="invalid_token"' in got
        status, _, _ = _request(addr, "POST", INFER, _json_body(),
                                {"Authorization": f"Bearer {token}"})
        assert status == 200
        assert _request(addr, "GET", "/v2/health/ready")[0] == 200
        assert _request(addr, "GET", "/metrics")[0] == 401


def test_open_probes_hold_no_body(profiles):
    """With a client token (the probes are then the only paths open to anyone) and the
    default body limit of 64 MiB: connections posting gzip bodies that would decode to
    48 MiB each, and never end them, are answered 405 at once, and the controller's
    memory does not grow by what they would decode to; an authorised client is
    served meanwhile."""
    token = "rest-token-0123456789abcdef"
    co = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip, left unfinished (no trailer)
    bomb = co.compress(bytes(48 * MiB)) + co.flush(zlib.Z_SYNC_FLUSH)
    with local_cluster(workers=1, gpus=1, profiles=str(profiles), http_port=0,
                       token=token) as c:
        host, port = c.printed_address("http").rsplit(":", 1)
        addr = (host, int(port))
        pid = c.controller.proc.pid
        peak0 = _peak_rss_mb(pid)
        socks = []
        try:
            for path in PROBES:
                s = socket.create_connection(addr, timeout=5)
                socks.append(s)
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n".encode()
                          + b"%x\r\n" % len(bomb) + bomb + b"\r\n")
            for s in socks:
                got = _head(s)
                assert got.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in got, got
            status, _, _ = _request(addr, "POST", INFER, _json_body(),
                                    {"Authorization": f"Bearer {token}"})
            assert status == 200
            peak1 = _peak_rss_mb(pid)
            assert peak1 - peak0 < 48, f"the controller's peak memory grew {peak1 - peak0:.0f} MB"
        finally:
            for s in socks:
                s.close()


# ---------------------------------------------------------------------- without sockets

ROUTES = r"""
import asyncio, json, types
from controller.kserve_rest import KServeRest, Reply, _NonFinite, encode
from controller.limits import Limits

counted = []
node = types.SimpleNamespace(limits=Limits(), count=counted.append, profiles={},
                             unknown_model=lambda name: f"unknown model {name!r}")

async def main():
    rest = KServeRest(node, token="secret")
    r = await rest.route("DELETE", "/v2/models/m/infer?x=1", {}, b"")
    assert r.status == 405 and r.headers == {"Allow": "POST"}, r
    r = await rest.route("GET", "/v2/models/m", {}, b"")
    assert r.status == 404 and "unknown model" in r.payload["error"], r
    r = await rest.route("GET", "/nothing", {}, b"")
    assert r.status == 404, r
    r = await rest.route("GET", "/v2/health/live", {}, b"")
    assert r == Reply(200, {"live": True}), r
    r = await rest.route("POST", "/v2/repository/index", {}, b'{"ready": 1}')
    assert r.status == 400, r
    assert rest.authorized("/v2/health/ready", {})
    assert not rest.authorized("/v2", {"authorization": "Bearer wrong"})
    assert rest.authorized("/v2", {"authorization": "Bearer secret"})
    r = rest.unauthorized({"authorization": "Bearer wrong"})
    assert r.status == 401 and "invalid_token" in r.headers["WWW-Authenticate"], r
    assert counted == ["auth_refused"], counted
    body, headers = encode(Reply(200, {"a": 1}, b"\x00" * 8))
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Inference-Header-Content-Length"] == "7" and body == b'{"a":1}' + bytes(8)
    body, headers = encode(Reply(503, {"ready": False}))
    assert headers["Retry-After"] == "1" and headers["Content-Type"] == "application/json"
    body, headers = encode(Reply(200, b"ok\n"))
    assert body == b"ok\n" and headers["Content-Type"].startswith("text/plain")
    # JSON written by orjson, or by json where orjson would write otherwise: the same values
    for payload in ({"outputs": [{"data": [0.1, 1e-07, -0.0, 5e-324, 2**64 - 1]}], "id": "é"},
                    {"id": "\ud800"}, {"n": 2**70}):
        body, headers = encode(Reply(200, payload))
        assert json.loads(body) == payload and headers["Content-Type"] == "application/json"
    body, _ = encode(Reply(200, _NonFinite({"data": [float("nan"), float("inf"), 1.5]})))
    assert body == b'{"data":[NaN,Infinity,1.5]}', body
    print("routes ok")

asyncio.run(main())
"""


def test_routes_without_sockets():
    p = subprocess.run([sys.executable, "-c", ROUTES], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.strip() == "routes ok", p.stdout + p.stderr


ALL_STATS = r"""
import asyncio, json, types
import controller.kserve as ks
import controller.kserve_rest as kr
from controller.limits import Limits
from controller.metrics import ControllerMetrics

names = [f"m{i:03d}" for i in range(40)] + ["é"]
node = types.SimpleNamespace(limits=Limits(), count=lambda k: None, unloading={"m005"},
                             profiles=dict.fromkeys(names), policy=None, links=[])
node.metrics = ControllerMetrics(node)
for i, n in enumerate(names):
    node.metrics.reply(n, "success" if i % 3 else "timeout", (i + 1) * 1_000_000)
ks.STATS_SLICE = 7
log = []
real_dumps = kr._dumps

def dumps(payload):
    log.append(("dump", len(payload)))
    return real_dumps(payload)

kr._dumps = dumps

async def main():
    rest = kr.KServeRest(node)
    done = False

    async def other():
        while not done:
            log.append("other")
            await asyncio.sleep(0)

    t = asyncio.ensure_future(other())
    await asyncio.sleep(0)
    r = await rest.route("GET", "/v2/models/stats", {}, b"")
    done = True
    await t
    body, headers = kr.encode(r)
    assert r.status == 200 and headers["Content-Type"] == "application/json", headers
    served = [n for n in names if n != "m005"]
    want = {"model_stats": [rest.fe._stats_of(n) for n in served]}
    assert json.loads(body) == want
    assert body == real_dumps(want), (body[:200], real_dumps(want)[:200])
    dumped = [x for x in log if x != "other"]
    assert sum(n for _, n in dumped) == len(served) and max(n for _, n in dumped) <= 7, dumped
    i = [j for j, x in enumerate(log) if x != "other"]
    assert all(b - a > 1 for a, b in zip(i, i[1:])), log  # the loop ran between slices
    print("stats ok")

asyncio.run(main())
"""


def test_all_statistics_are_read_and_written_a_slice_at_a_time():
    """GET /v2/models/stats reads the instances' statistics and writes their JSON a slice
    (``STATS_SLICE``) at a time, with the event loop free between slices (the JSON of
    5,000 instances written at once held it ~4 ms, a slice of 1,024 read ~4 ms more); the
    body is the same bytes as the whole written at once. (In a process of its own: the
    KServe protos clash with tritonclient's, loaded here.)"""
    p = subprocess.run([sys.executable, "-c", ALL_STATS], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert p.stdout.strip() == "stats ok", p.stdout + p.stderr


def test_only_inference_answers_are_compressed_so_the_asyncio_client_reads_the_rest(addr):
    """Statistics, configurations, the repository index and errors of 1 KiB or more go
    uncompressed even to a client that accepts gzip, as Triton sends them:
    tritonclient.http.aio asks for gzip on every request (aiohttp's default header) but
    decodes only an inference's answer, so those came back as undecodable bytes ('utf-8'
    codec can't decode byte 0x8b). An inference's answer is still compressed
    (test_response_compression_raw)."""
    import asyncio

    from tritonclient.http import aio
    from tritonclient.utils import InferenceServerException

    for rows in (1, 2, 4):  # (statistics of each batch size run: a longer answer)
        body = json.dumps({"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32",
                                       "data": [0.0] * 4 * rows}]}).encode()
        assert _request(addr, "POST", INFER, body)[0] == 200
    long_name = "x" * 1100
    bad = json.dumps({"inputs": [{"name": long_name, "shape": [1, 4], "datatype": "FP32",
                                  "data": [0, 0, 0, 0]}]}).encode()
    for method, path, body, want in (("GET", "/v2/models/stats", None, 200),
                                     ("POST", INFER, bad, 400)):
        status, headers, got = _request(addr, method, path, body,
                                        {"Accept-Encoding": "gzip, deflate"})
        assert status == want and len(got) >= 1024, (path, status, len(got))
        assert "Content-Encoding" not in headers, path
        json.loads(got)

    async def main() -> None:
        c = aio.InferenceServerClient(f"{addr[0]}:{addr[1]}")
        try:
            stats = await c.get_inference_statistics()
            assert {m["name"] for m in stats["model_stats"]} >= {"small", "big"}
            assert {m["name"] for m in await c.get_model_repository_index()} >= {"small", "big"}
            assert (await c.get_model_config("big"))["name"] == "big"
            x = aio.InferInput(long_name, [1, 4], "FP32")
            x.set_data_from_numpy(np.zeros((1, 4), np.float32), binary_data=False)
            with pytest.raises(InferenceServerException) as e:
                await c.infer("small", [x])
            assert long_name[:100] in str(e.value) and "decod" not in str(e.value), e.value
        finally:
            await c.close()

    asyncio.run(main())


def test_no_answer_tells_the_servers_software_versions(addr):
    """Every answer, a probe's, a 404 and the 400 of a head aiohttp cannot parse (before
    the app sees it) alike, says ``Server: clockwork``: it said ``Python/3.11
    aiohttp/3.14.5`` to anyone, the probes' callers included, who need no token."""
    for raw in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /no/such/path HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(raw)
            head = _head(s).decode("latin-1")
        server = [ln for ln in head.split("\r\n") if ln.lower().startswith("server:")]
        assert server == ["Server: clockwork"], (raw, head)


def test_a_transfer_coding_other_than_chunked_is_501(addr):
    """``Transfer-Encoding: gzip, chunked``: the gzip transfer coding is not served, and is
    refused 501 naming it (the compressed bytes were read as the JSON body: "not JSON");
    plain chunked is served."""
    import gzip

    body = gzip.compress(_json_body())
    wire = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    for te, status in (("gzip, chunked", 501), ("chunked", 400)):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n"
                      "\r\n".encode() + wire)
            head = _head(s).decode("latin-1")
        assert head.startswith(f"HTTP/1.1 {status} "), (te, head)
    assert _request(addr, "POST", INFER, _json_body(), encode_chunked=True)[0] == 200


def test_an_error_quoting_a_huge_input_name_or_shape_is_cut(addr):
    """A REST error quoting what the client sent (an input of a 20,000-character name, a
    shape of 10,000 dimensions) is cut to 2,000 bytes, as gRPC's status messages are (the
    bodies were 20-30 KB, the whole name or shape echoed back)."""
    for t in ({"name": "x" * 20_000, "shape": [1, 4], "datatype": "FP32", "data": [0] * 4},
              {"name": "x", "shape": [1] * 10_000, "datatype": "FP32", "data": [0]}):
        status, _, body = _request(addr, "POST", INFER, json.dumps({"inputs": [t]}).encode())
        assert status == 400 and len(json.loads(body)["error"].encode()) <= 2000, \
            (status, len(body))
