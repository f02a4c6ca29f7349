"""Security of the live system (SECURITY.md), with real processes on loopback and the real
clients: client tokens on every front end (clockwork.v1, KServe gRPC, REST), TLS on every
listener (tritonclient grpc/http with their ssl options, clockwork.Client), the
controller-worker handshake under the cluster secret (a fake controller cannot drive a
worker, a fake worker is refused), the package directory of a worker, exclusive
listening ports, and the refusal to listen off loopback without credentials."""

from __future__ import annotations

import asyncio
import errno
import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("cryptography")
tgrpc = pytest.importorskip("tritonclient.grpc")
thttp = pytest.importorskip("tritonclient.http")

from tritonclient.utils import InferenceServerException  # noqa: E402

import clockwork  # noqa: E402
from clockwork.cluster.local import _Child, _cli  # noqa: E402
from clockwork.errors import ControllerUnavailable, Unauthenticated  # noqa: E402
from clockwork.protocol import clockwork_pb2 as pb  # noqa: E402
from clockwork.protocol import clockwork_pb2_grpc as pbg  # noqa: E402
from clockwork.protocol.security import (  # noqa: E402
    SECRET_ENV,
    TOKEN_ENV,
    WORKER_CLOCK_SYNC,
    WORKER_CONNECT,
    WORKER_LOAD,
    ClusterAuth,
    answers_to,
    bearer_ok,
    is_loopback,
    listener_covers,
    peer_is_local,
)
from clockwork.protocol.versions import PROTOCOL  # noqa: E402
from tests.conftest import local_cluster, wait_output  # noqa: E402
from tests.pki import make_pki  # noqa: E402

TOKEN = "test-token-0123456789abcdef"
MODEL = "resnet50_v2"
TIMEOUT = 10  # seconds, per client call
X = np.zeros((1, 3, 224, 224), np.float32)
# a readable file of PEM blocks that hold no certificate or key (a file that is not PEM at
# all is refused as the command line is read)
NOT_PEM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "not_a_certificate.pem")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(pki):
    """Token and TLS on every port of the controller (main, KServe gRPC, REST)."""
    with local_cluster(models=MODEL, token=TOKEN, http_port=0, kserve_port=0,
                       controller_args=["--tls-cert", pki.cert, "--tls-key", pki.key]) as c:
        yield c


@pytest.fixture(scope="module")
def addresses(cluster):
    return {"grpc": cluster.address, "kserve": cluster.printed_address("kserve grpc"),
            "http": cluster.printed_address("http")}


def stats(cluster, pki) -> dict[str, int]:
    with clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=pki.ca) as c:
        return c.stats()


def _triton_grpc(addr, pki, **kw):
    return tgrpc.InferenceServerClient(addr, ssl=True, root_certificates=pki.ca, **kw)


def _triton_http(addr, pki):
    return thttp.InferenceServerClient(addr, ssl=True, ssl_options={"ca_certs": pki.ca},
                                       connection_timeout=TIMEOUT, network_timeout=TIMEOUT)


def _grpc_input():
    x = tgrpc.InferInput("data", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    return x


def _http_input():
    x = thttp.InferInput("data", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    return x


# ---------------------------------------------------------------------- client token + TLS


def test_a_ca_given_as_pem_text_is_taken_as_such(cluster, pki):
    """tls_ca as the PEM text itself (not a file's name) works as its bytes do (it was
    read as a file name: "-----BEGIN CERTIFICATE----- ...: cannot read it", the whole
    certificate repeated)."""
    from pathlib import Path

    text = Path(pki.ca).read_text()
    with clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=text) as c:
        assert c.infer(MODEL, slo_ms=1000).status == 0


def test_tls_settings_given_empty_or_not_pem_are_refused_not_dropped(cluster, pki):
    """A CA given empty (``tls_ca=""``, an unset environment variable read as "") is
    refused: it turned TLS off, and the token went in plain text. A client certificate
    alone asks for TLS (it was ignored). A CA that is not a certificate (a key, a token
    file, the pair swapped) is refused naming it, before any call: it was said as a
    controller that could not be reached."""
    from pathlib import Path

    from clockwork.protocol.security import SecurityError

    key = Path(pki.ca).with_name("token")
    key.write_text(TOKEN)
    for ca in (b"", "", str(key)):
        with pytest.raises(SecurityError) as e:
            clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=ca)
        assert "tls_ca" in str(e.value) and "not a PEM certificate" in str(e.value), e.value
    with pytest.raises(SecurityError, match="tls_key: .*not a PEM private key"):
        clockwork.Client(cluster.address, tls_cert=pki.ca, tls_key=pki.ca)
    # PEM text with lines before its BEGIN line (a bundle's comments, "Bag Attributes")
    # is taken as text, and text refused is not echoed (a key's is secret)
    bundle = "# Issuer: a comment\n" + Path(pki.ca).read_text()
    with clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=bundle) as c:
        assert c.infer(MODEL, slo_ms=1000).status == 0
    secret = "Bag Attributes\n    friendlyName: k\nMIGHAgEAMBMGsecretbase64\n"
    with pytest.raises(SecurityError) as e:
        clockwork.Client(cluster.address, tls_cert=pki.ca, tls_key=secret)
    assert "tls_key: not a PEM private key" in str(e.value) and "secret" not in str(e.value)
    # a client certificate alone asks for TLS, and so for its key too (it was ignored)
    with pytest.raises(SecurityError, match="tls_cert and tls_key go together"):
        clockwork.Client(cluster.address, tls_cert=pki.ca)


def test_an_empty_token_file_is_refused_not_taken_as_no_token(tmp_path, monkeypatch):
    """``--token-file`` of an empty file: refused naming it (it sent no token, and the
    server's "authentication required" did not say the file was empty); no file at all
    still falls back to $CLOCKWORK_TOKEN."""
    from clockwork.protocol.security import SecurityError, client_token

    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(SecurityError, match=r"--token-file .*token: empty"):
        client_token(None, str(empty))
    monkeypatch.setenv("CLOCKWORK_TOKEN", TOKEN)
    assert client_token(None, None) == TOKEN


def test_a_credential_file_others_can_read_is_warned_of(tmp_path, capsys):
    """A ``--token-file`` or ``--cluster-secret-file`` that group or others may read is
    taken, with a warning naming it, its mode and the chmod (it was taken silently: any
    local user could act as a client or as the controller); one only its owner reads,
    or one refused anyway, says nothing more."""
    from clockwork.protocol.security import (
        SecurityError,
        client_token,
        cluster_secret,
        server_token,
    )

    token, secret = tmp_path / "token", tmp_path / "secret"
    token.write_text(TOKEN + "\n")
    secret.write_text("s" * 40)
    for f in (token, secret):
        f.chmod(0o644)
    assert server_token(None, str(token)) == TOKEN
    assert cluster_secret(str(secret)) == b"s" * 40
    assert client_token(None, str(token)) == TOKEN  # (a client's: warned of as well)
    said = capsys.readouterr().err.splitlines()
    assert said == [f"clockwork: warning: {flag} {f} can be read by other users (mode 644): "
                    f"chmod 600 {f}" for flag, f in (("--token-file", token),
                                                      ("--cluster-secret-file", secret),
                                                      ("--token-file", token))]
    for f in (token, secret):
        f.chmod(0o600)
    assert server_token(None, str(token)) == TOKEN and cluster_secret(str(secret))
    assert client_token(None, str(token)) == TOKEN
    short = tmp_path / "short"
    short.write_text("x")
    short.chmod(0o644)
    with pytest.raises(SecurityError):
        server_token(None, str(short))
    assert capsys.readouterr().err == ""


def test_an_own_certificate_out_of_its_dates_is_warned_of(tmp_path, capsys, pki):
    """A ``--tls-cert`` that has expired, is not valid yet, or ends within a week is
    taken with one warning line naming it and why every client will refuse it (the
    server listened, and only its clients learnt it); one well within its dates, the
    usual test certificate among them, says nothing; a short-lived one is said to end soon
    only within a quarter of its lifetime (one of a day, not at every start)."""
    import datetime

    from clockwork.protocol.security import TlsFiles
    from tests.pki import dated_server_cert

    day, hour = datetime.timedelta(days=1), datetime.timedelta(hours=1)
    cases = [("expired", (-10 * day, -day)), ("not yet valid", (day, 30 * day)),
             ("expires on", (-30 * day, 2 * day)), (None, (-day, 30 * day)),
             # a certificate of a day (renewed daily): soon is within a quarter of that
             (None, (-4 * hour, 20 * hour)), ("expires on", (-21 * hour, 3 * hour))]
    for i, (said, (since, until)) in enumerate(cases):
        cert, key = dated_server_cert(tmp_path / str(i), since, until)
        assert TlsFiles.from_flags(cert, key, None) == TlsFiles(cert, key)
        lines = capsys.readouterr().err.splitlines()
        if said is None:
            assert lines == [], lines
            continue
        assert len(lines) == 1 and lines[0].startswith(
            f"clockwork: warning: --tls-cert {cert}: certificate "), lines
        assert said in lines[0] and "every client will refuse" in lines[0], lines
        TlsFiles.from_flags(cert, key, None, warn=False)  # (serve's check: its controller says it)
        assert capsys.readouterr().err == ""
    assert TlsFiles.from_flags(pki.cert, pki.key, pki.ca) is not None  # (30 days left)
    assert capsys.readouterr().err == ""
    cert, key = dated_server_cert(tmp_path / "ca", -30 * day, 2 * day)  # a server that asks for
    assert TlsFiles.from_flags(cert, key, pki.ca) is not None  # client certificates: the same
    assert "expires on" in capsys.readouterr().err


def test_authenticated_clients_work_over_tls(cluster, addresses, pki):
    with clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=pki.ca) as c:
        assert c.infer(MODEL, slo_ms=1000).output.shape == (1000,)
        assert [m.name for m in c.list_models()] == [MODEL]
    auth = {"authorization": f"Bearer {TOKEN}"}
    for addr in (addresses["grpc"], addresses["kserve"]):
        g = _triton_grpc(addr, pki)
        try:
            r = g.infer(MODEL, [_grpc_input()], headers=auth, client_timeout=TIMEOUT)
            assert r.as_numpy("output").shape == (1, 1000)
            assert g.is_server_ready(headers=auth, client_timeout=TIMEOUT)
        finally:
            g.close()
    h = _triton_http(addresses["http"], pki)
    try:
        r = h.infer(MODEL, [_http_input()], headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.as_numpy("output").shape == (1, 1000)
        # the scheme is case-insensitive (RFC 6750); the token is not
        assert h.get_server_metadata(headers={"authorization": f"bearer {TOKEN}"})["name"]
    finally:
        h.close()


def test_async_client_and_stream_with_token(cluster, pki):
    async def main():
        async with clockwork.AsyncClient(f"grpcs://{cluster.address}", timeout=TIMEOUT,
                                         token=TOKEN, tls_ca=pki.ca) as c:
            r = await c.infer(MODEL, slo_ms=1000)
            assert r.output.shape == (1000,)
            s = c.stream()
            resps = await asyncio.wait_for(asyncio.gather(
                *(s.submit(MODEL, slo_ms=1000) for _ in range(10))), TIMEOUT)
            await s.close()
            assert [x.status for x in resps] == [0] * 10
        async with clockwork.AsyncClient(cluster.address, timeout=TIMEOUT, token="",
                                         tls_ca=pki.ca) as c:
            with pytest.raises(Unauthenticated):
                await c.infer(MODEL)
            s = c.stream()
            with pytest.raises(Unauthenticated):
                await asyncio.wait_for(s.submit(MODEL), TIMEOUT)
            await s.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_every_refused_stream_says_unauthenticated(cluster, pki):
    """A stream without the token is refused after its first message has arrived, so the
    refusal reaches the client as UNAUTHENTICATED every time (refused at once, grpc's
    asyncio client reported INTERNAL in ~1 % of calls: its write, still on its way, failed
    and overwrote the status); a submit after the refusal says it again."""
    async def main():
        for _ in range(100):
            async with clockwork.AsyncClient(cluster.address, timeout=TIMEOUT, token="",
                                             tls_ca=pki.ca) as c:
                s = c.stream()
                with pytest.raises(Unauthenticated):
                    await asyncio.wait_for(s.submit(MODEL), TIMEOUT)
                with pytest.raises(Unauthenticated):  # the call has ended: same reason
                    await asyncio.wait_for(s.submit(MODEL), TIMEOUT)
                await s.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_unauthenticated_calls_with_large_requests_are_refused_unread(cluster, pki):
    """24 calls of 40 MB without the token: each refused, none read, and the controller's
    memory about as it was (it read each refused call's first message before refusing it,
    and the memory stayed taken: 36 such calls left it 1.1 GB larger)."""
    import grpc

    pid = cluster.controller.proc.pid
    before = _vm_kb(pid, "VmRSS", reset_peak=True)
    creds = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    with grpc.secure_channel(cluster.address, creds,
                             options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        codes = _large_calls(ch, "/clockwork.v1.Clockwork/Infer")
    assert "OK" not in codes and "UNAUTHENTICATED" in codes, codes
    grew_mb = (_vm_kb(pid, "VmHWM") - before) / 1024
    # (read, the 24 would take ~960 MB; refused unread, what gRPC's flow control lets in
    # before the refusal: ~40-140 MB here, 207 MB once with the machine's two cores busy)
    assert grew_mb < 10 * 40, f"the controller's memory grew {grew_mb:.0f} MB"
    with clockwork.Client(cluster.address, timeout=TIMEOUT, token=TOKEN, tls_ca=pki.ca) as c:
        assert c.infer(MODEL, slo_ms=1000).status == 0


def test_an_unauthenticated_call_that_never_sends_its_request_is_refused(cluster, pki):
    """A unary method called without the token and without its request (a stream that
    never writes): refused UNAUTHENTICATED at once (REFUSE_AFTER_S). It waited for the
    request without end, holding one of the controller's grpc_max_calls for as long as
    its client liked (enough of them turned every authenticated client away)."""
    import time

    import grpc

    from clockwork.client import _channel

    async def never():
        await asyncio.sleep(3600)
        yield b""

    async def main():
        ch = _channel(cluster.address, True, pki.ca, None, None, aio=True)
        try:
            for method in ("/clockwork.v1.Clockwork/Stats",
                           "/inference.GRPCInferenceService/ServerLive"):
                t0 = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await ch.stream_unary(method)(never(), timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value
                assert time.monotonic() - t0 < 5, method
        finally:
            await ch.close()

    asyncio.run(main())


def test_unauthenticated_calls_are_refused_and_nothing_runs(cluster, addresses, pki):
    before = stats(cluster, pki)
    for token in ("", "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x"):
        with clockwork.Client(cluster.address, timeout=TIMEOUT, token=token,
                              tls_ca=pki.ca) as c:
            for call in (lambda: c.infer(MODEL), c.list_models, c.stats):
                with pytest.raises(Unauthenticated) as e:
                    call()
                assert isinstance(e.value, ControllerUnavailable)  # a subclass of it
                # none sent, or one that is not the controller's: said apart
                assert ("the token sent is not this controller's" if token else
                        "authentication required") in str(e.value), (token, e.value)
    for addr in (addresses["grpc"], addresses["kserve"]):
        g = _triton_grpc(addr, pki)
        try:
            for headers in (None, {"authorization": "Bearer nope"},
                            {"authorization": TOKEN}):  # no scheme
                with pytest.raises(InferenceServerException) as e:
                    g.infer(MODEL, [_grpc_input()], headers=headers, client_timeout=TIMEOUT)
                assert e.value.status() == "StatusCode.UNAUTHENTICATED", e.value
            for call, args in ((g.get_model_metadata, (MODEL,)),
                               (g.get_inference_statistics, ())):
                with pytest.raises(InferenceServerException) as e:
                    call(*args, client_timeout=TIMEOUT)
                assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        finally:
            g.close()
    # a refused call's body is not parsed: bytes that are no protobuf are refused just the
    # same (parsed, they failed as INTERNAL "Exception deserializing request")
    with open(pki.ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    kserve_infer = "/inference.GRPCInferenceService/ModelInfer"
    for addr, method in ((addresses["grpc"], kserve_infer), (addresses["kserve"], kserve_infer),
                         (addresses["grpc"], "/clockwork.v1.Clockwork/Infer")):
        with grpc.secure_channel(addr, creds) as ch:
            call = ch.unary_unary(method)  # no serializer: the body as given
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff" * 64 + b"\x0a\xff\xff\xff\xff\x0f", timeout=TIMEOUT)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (addr, method, e.value)
    h = _triton_http(addresses["http"], pki)
    try:
        for headers in (None, {"Authorization": "Bearer nope"}):
            with pytest.raises(InferenceServerException) as e:
                h.infer(MODEL, [_http_input()], headers=headers)
            assert e.value.status() == "401", e.value
        for call, args in ((h.get_model_metadata, (MODEL,)), (h.get_inference_statistics, ())):
            with pytest.raises(InferenceServerException) as e:
                call(*args)
            assert e.value.status() == "401"
    finally:
        h.close()
    after = stats(cluster, pki)
    # the one authenticated Stats call is not a request; nothing was admitted
    assert after.get("requests", 0) == before.get("requests", 0)
    assert after["auth_refused"] >= before.get("auth_refused", 0) + 4 * 3 + 2 * 4 + 3
    # each line says who knocked, and how (the first of each surface is always written)
    line = wait_output(cluster.controller, "refused an unauthenticated call to /")
    assert re.search(r" from ipv[46]:\S+ \((no token|a token that is not this controller's)\)",
                     line), line
    line = wait_output(cluster.controller, "refused an unauthenticated HTTP request")
    assert re.search(r"request (GET|POST) /\S* from [0-9a-f.:]+:\d+ \((no token|a token "
                     r"that is not this controller's)\)", line), line


def test_a_refused_call_is_logged_with_its_peer_and_whether_a_token_came(capsys):
    """The controller's line for a refused gRPC call names the caller's address and
    whether it sent no token or another one (it said neither: an operator could not tell
    a misconfigured client from someone guessing, nor where either was)."""
    from clockwork.protocol.security import TokenInterceptor

    async def one(metadata) -> str:
        server = grpc.aio.server(interceptors=[TokenInterceptor(TOKEN)])  # its own log
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                try:
                    await ch.unary_unary("/t.T/Echo")(b"x", metadata=metadata, timeout=TIMEOUT)
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await server.stop(None)
        return capsys.readouterr().err

    none = asyncio.run(one(None))
    assert re.fullmatch(r"controller: refused an unauthenticated call to /t.T/Echo from "
                        r"ipv4:127\.0\.0\.1:\d+ \(no token\)\n", none), none
    wrong = asyncio.run(one((("authorization", "Bearer guess"),)))
    assert re.fullmatch(r"controller: refused an unauthenticated call to /t.T/Echo from "
                        r"ipv4:127\.0\.0\.1:\d+ \(a token that is not this controller's\)\n",
                        wrong), wrong
    assert asyncio.run(one((("authorization", f"Bearer {TOKEN}"),))) == ""  # answered


def _https(addresses, pki) -> http.client.HTTPSConnection:
    host, port = addresses["http"].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=pki.ca)
    return http.client.HTTPSConnection(host, int(port), context=ctx, timeout=TIMEOUT)


def test_rest_401_challenge_and_open_health_probes(addresses, pki):
    for path, headers, want in [
            ("/v2/models/resnet50_v2/infer", {}, 'Bearer realm="clockwork"'),
            ("/v2/models/resnet50_v2/infer", {"Authorization": "Bearer nope"},
             'Bearer realm="clockwork", error="invalid_token"'),
            ("/metrics", {}, 'Bearer realm="clockwork"'),
            ("/v2", {}, 'Bearer realm="clockwork"')]:
        conn = _https(addresses, pki)
        method = "POST" if path.endswith("infer") else "GET"
        conn.request(method, path, body=b'{"inputs": []}' if method == "POST" else None,
                     headers=headers)
        r = conn.getresponse()
        assert r.status == 401, (path, r.status)
        assert r.getheader("WWW-Authenticate") == want
        assert (b"the token sent is not this controller's" if headers else
                b"authentication required") in r.read()
        conn.close()
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        conn = _https(addresses, pki)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert r.status == 200, (path, r.status)
        conn.close()
    conn = _https(addresses, pki)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    r = conn.getresponse()
    assert r.status == 200 and b"clockwork_" in r.read()
    conn.close()


def test_several_authorization_values_are_refused_whichever_holds_the_token(addresses, pki):
    """Two ``Authorization`` headers (REST) or two ``authorization`` metadata entries
    (gRPC, both ports): refused 401 / UNAUTHENTICATED in either order (the first one
    counted, so the right token first passed and second failed); one is served."""
    right, wrong = f"Bearer {TOKEN}", "Bearer nope"
    for pair in ((right, wrong), (wrong, right)):
        conn = _https(addresses, pki)
        conn.putrequest("GET", "/metrics")
        for value in pair:
            conn.putheader("Authorization", value)
        conn.endheaders()
        r = conn.getresponse()
        r.read()
        conn.close()
        assert r.status == 401, pair
    creds = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    for addr, call in ((addresses["grpc"], "/clockwork.v1.Clockwork/Stats"),
                       (addresses["kserve"], "/inference.GRPCInferenceService/ServerMetadata")):
        with grpc.secure_channel(addr, creds) as ch:
            stats = ch.unary_unary(call, request_serializer=lambda m: b"",
                                   response_deserializer=lambda b: b)
            for pair in ((right, wrong), (wrong, right)):
                with pytest.raises(grpc.RpcError) as e:
                    stats(None, metadata=[("authorization", v) for v in pair], timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (addr, pair)
            assert stats(None, metadata=[("authorization", right)], timeout=TIMEOUT) is not None


def test_tls_is_verified_and_required(cluster, addresses, pki):
    # a CA that did not sign the controller's certificate: the handshake fails
    with clockwork.Client(cluster.address, timeout=3, token=TOKEN, tls_ca=pki.other_ca) as c:
        with pytest.raises(ControllerUnavailable) as e:
            c.stats()
        assert not isinstance(e.value, Unauthenticated)
    # plaintext against a TLS port
    with clockwork.Client(cluster.address, timeout=3, token=TOKEN) as c:
        with pytest.raises(ControllerUnavailable):
            c.stats()
    h = thttp.InferenceServerClient(addresses["http"], connection_timeout=3, network_timeout=3)
    try:
        with pytest.raises(Exception):  # noqa: B017 - plaintext HTTP to an HTTPS port
            h.is_server_live()
    finally:
        h.close()
    conn = _https(addresses, pki)  # and HTTPS to it still works
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_a_connection_that_never_starts_its_handshake_is_closed(pki):
    """A TCP connection to a TLS port that sends nothing: the REST port closes it after
    ``rest_idle_timeout_s`` (0.5 s here; asyncio's own TLS handshake timeout, 60 s, held
    it whatever the setting), the gRPC ports (the controller's two, a worker's) after
    ``HANDSHAKE_TIMEOUT_MS`` (gRPC's own default held it 120 s)."""
    import concurrent.futures

    from clockwork.protocol.listen import HANDSHAKE_TIMEOUT_MS

    limit = HANDSHAKE_TIMEOUT_MS / 1000
    with local_cluster(models=MODEL, token=TOKEN, http_port=0, kserve_port=0,
                       controller_args=["--tls-cert", pki.cert, "--tls-key", pki.key,
                                        "--limit", "rest_idle_timeout_s=0.5"]) as c:
        ports = {"http": c.printed_address("http"), "grpc": c.address,
                 "kserve": c.printed_address("kserve grpc"), "worker": c.worker_addresses[0]}

        def silent(addr: str) -> float:
            host, port = addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=limit + 10) as s:
                t0 = time.monotonic()
                while s.recv(4096):  # (the server closes it: recv gives b"")
                    pass
                return time.monotonic() - t0

        with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
            took = dict(zip(ports, pool.map(silent, ports.values()), strict=True))
    assert took["http"] < 5, took
    assert all(limit - 1 < took[k] < limit + 5 for k in ("grpc", "kserve", "worker")), took


def test_token_from_the_environment(cluster, pki, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with clockwork.Client(cluster.address, timeout=TIMEOUT, tls_ca=pki.ca) as c:
        assert c.infer(MODEL, slo_ms=1000).output.shape == (1000,)
    with clockwork.Client(cluster.address, timeout=TIMEOUT, tls_ca=pki.ca, token="") as c:
        with pytest.raises(Unauthenticated):
            c.stats()  # token="" overrides the environment: none is sent


def test_cli_infer_with_token(cluster, pki, tmp_path):
    base = [sys.executable, "-m", "clockwork.cluster.cli", "infer", MODEL, "--controller",
            cluster.address, "--tls-ca", pki.ca, "--timeout", "10"]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    p = subprocess.run(base + ["--token", TOKEN], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 0 and f"{MODEL}: ok" in p.stdout, p.stderr
    (tmp_path / "token").write_text(TOKEN + "\n")
    p = subprocess.run(base + ["--token-file", str(tmp_path / "token")], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(base, capture_output=True, text=True, timeout=60,
                       env={**env, TOKEN_ENV: TOKEN})
    assert p.returncode == 0, p.stderr
    # refused: the user's to correct, exit 2 as clockwork replay's (it was 1, as for a
    # controller that could not be reached)
    p = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "Unauthenticated" in p.stderr, p.stderr
    p = subprocess.run([*base[:4], "no_such_model", *base[5:], "--token", TOKEN],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "UnknownModel" in p.stderr, p.stderr


def test_the_clockwork_commands_present_a_client_certificate_to_a_mutual_tls_controller(
        pki):
    """A controller with --tls-ca takes only clients with a certificate its CA signed:
    clockwork infer and clockwork workers present one with --tls-cert and --tls-key (they
    had no way to: every command failed, 'is it running?'); without one, the error says
    what the controller wants."""
    with local_cluster(models=MODEL, controller_args=[
            "--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]) as c:
        tls = ["--controller", c.address, "--tls-ca", pki.ca, "--timeout", "10"]
        cert = ["--tls-cert", pki.client_cert, "--tls-key", pki.client_key]
        for verb in (["infer", MODEL], ["workers"]):
            p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *verb, *tls,
                                *cert], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            assert (f"{MODEL}: ok" if verb[0] == "infer" else "serving") in p.stdout, p.stdout
            p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *verb, *tls],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 1, p.stderr
            assert "--tls-cert and --tls-key" in p.stderr, p.stderr
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "workers", *tls,
                            "--tls-cert", pki.client_cert], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and "--tls-cert and --tls-key go together" in p.stderr, p.stderr


def test_a_client_at_the_tls_rest_port_is_told_it_is_the_rest_port(addresses, pki):
    """Over TLS the REST port's refusal is gRPC's 'missing selected ALPN property': the
    client said 'is it running?' there, and the REST port's hint only without TLS."""
    with clockwork.Client(addresses["http"], timeout=TIMEOUT, token=TOKEN,
                          tls_ca=pki.ca) as c, pytest.raises(ControllerUnavailable) as e:
        c.stats()
    assert "that port speaks HTTP/1.1, not gRPC" in str(e.value), e.value


def test_listeners_are_exclusive(cluster, addresses):
    """No listener sets SO_REUSEPORT, so not even a socket that asks for it can share a
    port with the controller (every port) or a worker."""
    ports = [int(a.rsplit(":", 1)[1]) for a in (*addresses.values(), *cluster.worker_addresses)]
    assert len(set(ports)) == 4  # main, KServe gRPC, REST, the worker
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with pytest.raises(OSError) as e:
                s.bind(("127.0.0.1", port))
            assert e.value.errno == errno.EADDRINUSE


REST_TWICE = """
import asyncio, types
from controller.kserve_rest import start_http
from controller.limits import Limits

async def main():
    node = types.SimpleNamespace(limits=Limits(), count=lambda key: None)
    first = await start_http(node, "127.0.0.1", 0)
    port = first.port
    for kw in ({}, {"reuse_port": True}):  # ours again; one that asks for SO_REUSEPORT
        try:
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", port, **kw)
        except OSError as e:
            print("refused", e.errno)
    try:
        await start_http(node, "127.0.0.1", port)
    except OSError as e:
        print("refused", e.errno)
    await first.close()

asyncio.run(main())
"""


def test_rest_listener_refuses_a_second_one():
    # a process of its own: controller.kserve's inference.* protos clash with tritonclient's
    p = subprocess.run([sys.executable, "-c", REST_TWICE], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.split() == ["refused", str(errno.EADDRINUSE)] * 3, p.stdout + p.stderr


# ---------------------------------------------------------------------- cluster secret


@pytest.fixture(scope="module")
def plain_cluster():
    """A LocalCluster as tests and experiments use it: loopback, no token, a cluster
    secret made for it."""
    with local_cluster(models=MODEL) as c:
        yield c


def _secret(cluster) -> bytes:
    return cluster.cluster_secret.encode()


def test_local_cluster_uses_a_secret_it_keeps_off_the_command_line(plain_cluster):
    secret = plain_cluster.cluster_secret
    assert len(secret) == 64
    assert "cluster secret" in wait_output(plain_cluster.controller, "listening on")
    for ch in (plain_cluster.controller, *plain_cluster.workers):
        with open(f"/proc/{ch.proc.pid}/cmdline", "rb") as f:
            assert secret.encode() not in f.read()
    with clockwork.Client(plain_cluster.address, timeout=TIMEOUT) as c:
        assert c.infer(MODEL, slo_ms=1000).output.shape == (1000,)


def _other_local_addresses() -> list[str]:
    """Addresses of this machine other than 127.0.0.1 that a process can listen on: ::1
    and the address the host name resolves to, where they exist (bracketed if IPv6)."""
    out = []
    names = {"::1"}
    try:
        names |= {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None,
                                                      proto=socket.IPPROTO_TCP)}
    except OSError:
        pass
    for a in sorted(names - {"127.0.0.1"}):
        try:
            with socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET) as s:
                s.bind((a, 0))
        except OSError:
            continue
        out.append(f"[{a}]" if ":" in a else a)
    return out


def _large_calls(ch, method: str, n: int = 24, mb: int = 40) -> list[str]:
    """``n`` calls of ``method`` at once on channel ``ch``, each with ``mb`` MB of bytes
    as its request: how each ended (``OK`` or its status code's name)."""
    big = b"\x00" * (mb << 20)
    futures = [ch.unary_unary(method).future(big, timeout=60) for _ in range(n)]
    codes = []
    for f in futures:
        try:
            f.result()
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)
    return codes


def _vm_kb(pid: int, key: str, reset_peak: bool = False) -> int:
    """A /proc/PID/status figure in kB; ``reset_peak``: VmHWM starts again from now."""
    if reset_peak:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for process {pid}")


def test_a_call_without_the_secret_is_refused_before_its_request_is_read(plain_cluster):
    """A worker with a cluster secret refuses a call without the controller's proof
    before it reads its request: bytes that are no message are UNAUTHENTICATED, not a
    parse error, and 24 calls of 40 MB leave the worker's memory about as it was (20
    calls of 60 MB took it to 2 GB: each request was read whole, before the proof was
    looked at, and the memory stayed taken)."""
    addr = plain_cluster.worker_addresses[0]
    pid = plain_cluster.workers[0].proc.pid
    _vm_kb(pid, "VmRSS", reset_peak=True)
    with grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)]
                               ) as ch:
        for method in (WORKER_LOAD, WORKER_CLOCK_SYNC):
            call = ch.unary_unary(method)  # raw bytes in and out
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff\xff\xff not a message", timeout=TIMEOUT)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value

        before = _vm_kb(pid, "VmRSS", reset_peak=True)
        codes = _large_calls(ch, WORKER_LOAD)
        # (a refusal that came while the call's message was still being sent can reach
        # grpc's client as another code: the worker does not wait for big messages)
        assert "OK" not in codes and "UNAUTHENTICATED" in codes, codes
    grew_mb = (_vm_kb(pid, "VmHWM") - before) / 1024
    # (read whole, the calls would take ~960 MB; gRPC's own buffers under a busy machine
    # took 228 MB once, as the controller's below: the same bound)
    assert grew_mb < 10 * 40, f"the worker's memory grew {grew_mb:.0f} MB"
    with clockwork.Client(plain_cluster.address, timeout=TIMEOUT) as c:  # still serving
        assert c.infer(MODEL, slo_ms=1000).status == 0


def test_fake_controller_cannot_drive_a_worker(plain_cluster):
    addr = plain_cluster.worker_addresses[0]
    wrong = ClusterAuth(b"not-the-cluster-secret-0123456789")
    right = ClusterAuth(_secret(plain_cluster))
    host, port = addr.rsplit(":", 1)
    other = f"{host}:{int(port) + 1}"  # another worker's address, on this machine
    with grpc.insecure_channel(addr) as ch:
        stub = pbg.WorkerStub(ch)
        for md in (None, wrong.call_metadata(WORKER_CONNECT, addr)[0],
                   right.call_metadata(WORKER_CLOCK_SYNC, addr)[0],  # a proof for another call
                   # the right secret, made for another worker: what a process the
                   # controller dialled at that address (AddWorker, a port taken over)
                   # would relay here
                   right.call_metadata(WORKER_CONNECT, other)[0],
                   right.call_metadata(WORKER_CONNECT, "192.0.2.7:" + port)[0],
                   # ... or at an address of this machine the worker does not listen on
                   # (it listens on 127.0.0.1 only: any local user may listen on the same
                   # port there, have the controller dial it and relay its proof)
                   *[right.call_metadata(WORKER_CONNECT, f"{a}:{port}")[0]
                     for a in _other_local_addresses()]):
            call = stub.Connect(iter([pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL, worker_id=0,
                                                                          reset=True))]),
                                metadata=md, timeout=TIMEOUT)
            with pytest.raises(grpc.RpcError) as e:
                next(call)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for method, rpc, req in ((WORKER_CLOCK_SYNC, stub.ClockSync, pb.ClockSyncRequest()),
                                 (WORKER_LOAD, stub.LoadModelFromDisk,
                                  pb.LoadModelFromDiskRequest(name="x", path="mlp"))):
            for md in (None, wrong.call_metadata(method, addr)[0],
                       right.call_metadata(method, other)[0]):
                with pytest.raises(grpc.RpcError) as e:
                    rpc(req, metadata=md, timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # with the secret: answered, and the worker proves it back
        md, nonce = right.call_metadata(WORKER_CLOCK_SYNC, addr)
        r, call = stub.ClockSync.with_call(pb.ClockSyncRequest(), metadata=md, timeout=TIMEOUT)
        assert r.worker_time > 0
        assert right.worker_proved(WORKER_CLOCK_SYNC, nonce, call.initial_metadata(), addr)
        assert not wrong.worker_proved(WORKER_CLOCK_SYNC, nonce, call.initial_metadata(), addr)
        # its proof is for this address only: no good for a call made to another one
        assert not right.worker_proved(WORKER_CLOCK_SYNC, nonce, call.initial_metadata(),
                                       other)
        # the same worker by a name of this machine that resolves to its address only
        # (where localhost also names ::1, a connection to it may reach another listener)
        names = {i[4][0] for i in socket.getaddrinfo("localhost", None,
                                                    proto=socket.IPPROTO_TCP)}
        assert listener_covers(host, "localhost") == (names == {host})
        md, _ = right.call_metadata(WORKER_CLOCK_SYNC, f"localhost:{port}")
        if listener_covers(host, "localhost"):
            assert stub.ClockSync(pb.ClockSyncRequest(), metadata=md,
                                  timeout=TIMEOUT).worker_time
        else:
            with pytest.raises(grpc.RpcError):
                stub.ClockSync(pb.ClockSyncRequest(), metadata=md, timeout=TIMEOUT)
        # the same metadata again: a replay
        with pytest.raises(grpc.RpcError) as e:
            stub.ClockSync(pb.ClockSyncRequest(), metadata=md, timeout=TIMEOUT)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    line = wait_output(plain_cluster.workers[0], "worker: refused")
    assert "no cluster credentials" in line or "wrong cluster credentials" in line
    assert re.search(r"refused (Connect|ClockSync|LoadModelFromDisk) from ipv[46]:", line), line
    with clockwork.Client(plain_cluster.address, timeout=TIMEOUT) as c:  # still serving
        assert c.infer(MODEL, slo_ms=1000).status == 0
        assert c.stats().get("worker_losses", 0) == 0


def test_fake_worker_on_a_dead_workers_port_is_refused():
    with local_cluster(models=MODEL) as c:
        port = c.worker_addresses[0].rsplit(":", 1)[1]
        with clockwork.Client(c.address, timeout=TIMEOUT) as cl:
            connects = cl.stats()["worker_connects"]
            c.workers[0].proc.send_signal(signal.SIGKILL)
            c.workers[0].proc.wait(10)
            wait_output(c.controller, "lost worker")
            # a worker that does not know the secret (it would obey anyone) takes the port
            fake = _Child("fake", _cli() + ["worker", "--port", port, "--gpus", "1"],
                          extra_env={SECRET_ENV: None})
            try:
                fake.wait_address(30)
                line = wait_output(c.controller, "did not prove the cluster secret")
                assert f"refused worker 127.0.0.1:{port}" in line
                s = cl.stats()
                assert s["worker_connects"] == connects and s["worker_auth_refused"] >= 1
                assert cl.list_models()  # the controller serves on, with no worker
                with pytest.raises(clockwork.errors.ClockworkError):
                    cl.infer(MODEL, slo_ms=50)  # no worker: nothing can run it
            finally:
                fake.stop()
            c.restart_worker(0)  # the real one, with the secret: taken back
            wait_output(c.controller, "reconnected")
            assert cl.stats()["worker_connects"] == connects + 1
            assert cl.infer(MODEL, slo_ms=1000).status == 0


def test_worker_tls_with_client_certificates(pki):
    """Workers speak TLS and require the controller's certificate (mutual TLS); the
    controller verifies them against the CA. The fast link speaks TLS with the same
    rule: a plaintext connection or one without a client certificate gets nowhere."""
    wargs = ["--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]
    with local_cluster(models=MODEL, worker_args=[wargs],
                       controller_args=["--tls-cert", pki.cert, "--tls-key", pki.key,
                                        "--worker-tls-ca", pki.ca]) as c:
        line = wait_output(c.workers[0], "listening on")
        link_port = int(line.split("fast link on port ")[1].split()[0].rstrip(",)"))
        with clockwork.Client(c.address, timeout=TIMEOUT, tls_ca=pki.ca) as cl:
            for _ in range(10):
                assert cl.infer(MODEL, slo_ms=1000).status == 0
            st = cl.stats()
            assert st["worker_fast_links"] == 1 and st["worker_connects"] == 1
        with socket.create_connection(("127.0.0.1", link_port), timeout=10) as s:
            s.sendall(bytes(64))  # plaintext: not a TLS handshake
            try:
                data = s.recv(64)
            except ConnectionError:
                data = b""
            assert data == b"" or data[0] == 0x15  # closed, or a TLS alert record
        no_cert = ssl.create_default_context(cafile=pki.ca)  # verifies the worker; no cert
        # (TLS 1.2: the handshake itself fails; with 1.3 the refusal comes after it)
        no_cert.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", link_port), timeout=10) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                no_cert.wrap_socket(raw, server_hostname="127.0.0.1").close()
        with_cert = ssl.create_default_context(cafile=pki.ca)  # the same, with a certificate:
        with_cert.maximum_version = ssl.TLSVersion.TLSv1_2
        with_cert.load_cert_chain(pki.client_cert, pki.client_key)
        with socket.create_connection(("127.0.0.1", link_port), timeout=10) as raw:
            with with_cert.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(bytes(32))  # in, but the ticket is still checked
                assert s.recv(1) == b""
        wait_output(c.workers[0], "no valid ticket")
        with clockwork.Client(c.address, timeout=TIMEOUT, tls_ca=pki.ca) as cl:
            assert cl.infer(MODEL, slo_ms=1000).status == 0  # the link serves on
            st = cl.stats()
            assert st.get("worker_losses", 0) == 0 and st["worker_fast_links"] == 1
        auth = ClusterAuth(_secret(c))
        addr = c.worker_addresses[0]
        for ch in (grpc.insecure_channel(addr),  # plaintext
                   grpc.secure_channel(addr, grpc.ssl_channel_credentials(  # no client cert
                       _read(pki.ca)))):
            with ch:
                with pytest.raises(grpc.RpcError) as e:
                    pbg.WorkerStub(ch).ClockSync(
                        pb.ClockSyncRequest(),
                        metadata=auth.call_metadata(WORKER_CLOCK_SYNC, addr)[0], timeout=3)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        creds = grpc.ssl_channel_credentials(_read(pki.ca), _read(pki.client_key),
                                             _read(pki.client_cert))
        with grpc.secure_channel(addr, creds) as ch:  # a client certificate and the secret
            r = pbg.WorkerStub(ch).ClockSync(
                pb.ClockSyncRequest(), metadata=auth.call_metadata(WORKER_CLOCK_SYNC, addr)[0],
                timeout=TIMEOUT)
            assert r.worker_time > 0


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------- package directory


def _fake_package(d) -> None:
    from clockwork.models.package import FORMAT, LIBRARY, METADATA, WEIGHTS

    d.mkdir(parents=True)
    t = '[{"name": "x", "shape": [4], "dtype": "float32"}]'
    (d / METADATA).write_text(f'{{"format": {FORMAT}, "weights_pages": 0, '
                              f'"page_size": 16777216, "page_runs": [], "params": [], '
                              f'"inputs": {t}, "outputs": {t}, "functions": {{"1": "f"}}}}')
    (d / LIBRARY).write_bytes(b"")
    (d / WEIGHTS).write_bytes(b"")


def test_packages_load_only_from_the_package_directory(tmp_path):
    root, outside = tmp_path / "packages", tmp_path / "outside"
    _fake_package(root / "inside")
    _fake_package(outside / "pkg")
    (root / "escape").symlink_to(outside / "pkg")
    (root / "alias").symlink_to(root / "inside")
    secret = "package-test-secret-0123456789"
    w = _Child("worker", _cli() + ["worker", "--port", "0", "--packages", str(root)],
               extra_env={SECRET_ENV: secret})
    try:
        addr = w.wait_address(30)
        auth = ClusterAuth(secret.encode())
        with grpc.insecure_channel(addr) as ch:
            stub = pbg.WorkerStub(ch)

            def load(path: str) -> grpc.RpcError:
                with pytest.raises(grpc.RpcError) as e:
                    stub.LoadModelFromDisk(pb.LoadModelFromDiskRequest(name="m", path=path),
                                           metadata=auth.call_metadata(WORKER_LOAD, addr)[0],
                                           timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                return e.value.details()

            refused = {load(p) for p in (
                str(outside / "pkg"),  # a real package, outside
                str(outside / "nothing"),  # nothing there
                "/etc", "/etc/passwd", "/", "",
                "../outside/pkg", "inside/../../outside/pkg", "inside/../inside",
                "escape", str(root / "escape"),  # a symlink out of the directory
                "missing", str(root / "missing"), "inside/model.json")}
            assert len(refused) == 1, refused  # one answer: existing or not, it says nothing
            (msg,) = refused
            assert "outside" not in msg and str(tmp_path) not in msg
            # inside (by name, by path, through a symlink that stays inside): accepted; an
            # emulated worker then says it runs profiles, not packages
            for p in ("inside", str(root / "inside"), "alias", "./inside"):
                assert "emulated device" in load(p), p
        wait_output(w, "LoadModelFromDisk '/etc' refused")  # reasons: the worker's own log
    finally:
        w.stop()


def test_confined_package_references(tmp_path):
    from worker.service import WorkerNode

    root = tmp_path / "pk"
    (root / "a").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (root / "up").symlink_to(tmp_path / "out")
    node = WorkerNode(1, None, packages=str(root))
    assert node.confined("a") == (root / "a").resolve()
    assert node.confined(str(root / "a")) == (root / "a").resolve()
    for bad in ("", ".", "..", "../out", "a/../../out", str(tmp_path / "out"), "up",
                "up/x", "/", "a\0b"):
        assert node.confined(bad) is None, bad
    # a Hello instance's package outside the directory is not used (the instance is missing)
    assert node.package_for("m", "mlp", str(tmp_path / "out")) is None


# ---------------------------------------------------------------------- the default rule


def _cli_run(args, env=None, timeout=60) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, TOKEN_ENV)}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=e)


@pytest.mark.parametrize("args, env, fragment", [
    (["controller", "--host", "0.0.0.0", "--workers", "127.0.0.1:1", "--port", "0"], None,
     "--token-file"),
    (["controller", "--host", "0.0.0.0", "--workers", "127.0.0.1:1", "--port", "0",
      "--token", "short"], None, "at least 16"),
    # (an empty token on loopback: refused, not taken as "no token")
    (["controller", "--workers", "127.0.0.1:1", "--port", "0", "--token", ""], None,
     "--token: empty"),
    # (one past what a call's header carries: it started, then every call was refused
    # RESOURCE_EXHAUSTED, said as the controller unavailable)
    (["controller", "--workers", "127.0.0.1:1", "--port", "0", "--token", "t" * 15000], None,
     "--token: 15,000 characters; a token has at most 4,096"),
    (["controller", "--workers", "192.0.2.1:5000", "--port", "0"], None,
     "--cluster-secret-file"),
    (["worker", "--host", "0.0.0.0", "--port", "0"], None, "--cluster-secret-file"),
    (["worker", "--port", "0"], {SECRET_ENV: "too-short"}, "at least 16"),
    (["worker", "--port", "0", "--tls-cert", NOT_PEM], None, "--tls-key"),
    (["worker", "--port", "0", "--tls-cert", NOT_PEM, "--tls-key", NOT_PEM], None,
     "cannot use"),
    (["controller", "--workers", "127.0.0.1:1", "--tls-ca", NOT_PEM], None, "--tls-cert"),
])
def test_refuses_to_start_without_credentials_off_loopback(args, env, fragment):
    p = _cli_run(args, env)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_serve_on_ray_with_tls_is_refused_naming_the_way_to_tls_everywhere(pki, tmp_path):
    """``serve --ray --tls-cert``: the worker actors listen on their nodes' addresses
    with no certificate, so TLS would cover the controller's ports only (the docs said
    every port): refused before anything starts, naming the way to TLS everywhere."""
    pytest.importorskip("ray")
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)  # (one others may read is warned of: a second line)
    p = _cli_run(["serve", "--ray", "--port", "0", "--http-port", "-1", "--kserve-port", "-1",
                  "--token-file", str(token), "--tls-cert", pki.cert, "--tls-key", pki.key])
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tls-cert with --ray" in lines[0], p.stderr
    assert "--worker-tls-ca" in lines[0] and "listening" not in p.stdout + p.stderr


def test_serve_off_loopback_needs_a_token(tmp_path):
    p = _cli_run(["serve", "--host", "0.0.0.0", "--port", "0", "--http-port", "-1",
                  "--kserve-port", "-1"], timeout=90)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "is not a loopback address, so clients must authenticate" in p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def test_off_loopback_starts_with_a_secret_or_when_told_to(tmp_path):
    (tmp_path / "secret").write_text("s" * 32 + "\n")
    (tmp_path / "secret").chmod(0o600)
    for extra, env in ((["--insecure-no-auth"], None),
                       (["--cluster-secret-file", str(tmp_path / "secret")], None),
                       ([], {SECRET_ENV: "e" * 32})):
        w = _Child("worker", _cli() + ["worker", "--host", "0.0.0.0", "--port", "0", *extra],
                   extra_env={SECRET_ENV: None, **(env or {})})
        try:
            assert w.wait_address(30).startswith("0.0.0.0:")
        finally:
            assert w.stop() == 0


def test_helpers():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.3.4.5") and is_loopback("[::1]")
    # an IPv4 loopback address mapped into IPv6 is one (it asked for the cluster secret)
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("[::ffff:7f00:1]")
    assert not is_loopback("::ffff:192.0.2.7")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("")
    assert not is_loopback("192.0.2.7")
    t = b"a" * 20
    assert bearer_ok("Bearer " + "a" * 20, t) and bearer_ok(b"BEARER  " + t, t)
    assert not bearer_ok(None, t) and not bearer_ok("Basic " + "a" * 20, t)
    assert not bearer_ok("Bearer " + "a" * 19, t) and not bearer_ok("a" * 20, t)
    a, b = ClusterAuth(b"k" * 20), ClusterAuth(b"k" * 20)
    w = "10.0.0.5:12345"
    md, nonce = a.call_metadata(WORKER_CONNECT, w)
    assert b.check_controller(WORKER_CONNECT, md) == (None, nonce, w)
    assert b.check_controller(WORKER_CONNECT, md)[0] == "replayed cluster credentials"
    md, _ = a.call_metadata(WORKER_CONNECT, w)
    assert b.check_controller(WORKER_LOAD, md)[0] == "wrong cluster credentials"
    md, _ = a.call_metadata(WORKER_CONNECT, w)  # the target cannot be changed on the way
    forged = tuple((k, "10.0.0.6:12345" if k == "x-clockwork-target" else v) for k, v in md)
    assert b.check_controller(WORKER_CONNECT, forged)[0] == "wrong cluster credentials"
    md, _ = a.call_metadata(WORKER_CONNECT, w)  # a proof for another worker: refused there
    why = b.check_controller(WORKER_CONNECT, md, lambda t: t == "10.0.0.6:12345")[0]
    assert "made for another worker" in why and f"--advertise {w}" in why, why
    late = ClusterAuth(b"k" * 20, clock=lambda: time.time() + 3600)
    md, _ = a.call_metadata(WORKER_CONNECT, w)
    assert "stale" in late.check_controller(WORKER_CONNECT, md)[0]
    assert a.worker_proved(WORKER_CONNECT, nonce, b.worker_metadata(WORKER_CONNECT, nonce, w),
                           w)
    assert not a.worker_proved(WORKER_CONNECT, nonce,
                               b.worker_metadata(WORKER_CONNECT, nonce, w), "10.0.0.6:1")
    assert not a.worker_proved(WORKER_CONNECT, nonce, (), w)
    # which addresses a worker answers to: its port on a name or address of this machine,
    # or an address it was told it is reached at (--advertise)
    here = "ipv4:127.0.0.1:40000"  # the gRPC peer of a call from this machine
    assert answers_to("127.0.0.1:7000", 7000, here) and answers_to("localhost:7000", 7000, here)
    assert answers_to("[::1]:7000", 7000, "ipv6:[::1]:4000") or not socket.has_ipv6
    assert not answers_to("127.0.0.1:7001", 7000, here)
    # ... and reaches the listener: not another address of the machine on the same port
    assert not answers_to("[::1]:7000", 7000, "ipv6:[::1]:4000", bound="127.0.0.1")
    assert not answers_to("127.0.0.2:7000", 7000, here, bound="127.0.0.1")
    assert answers_to("127.0.0.1:7000", 7000, here, bound="127.0.0.1")
    # a wildcard address dialled reaches its family's loopback one (refused before,
    # though the docs name 0.0.0.0:P among the worker's own)
    assert answers_to("0.0.0.0:7000", 7000, here, bound="127.0.0.1")
    assert answers_to("0:7000", 7000, here, bound="127.0.0.1")
    assert not answers_to("[::]:7000", 7000, here, bound="127.0.0.1")
    assert answers_to("[::]:7000", 7000, "ipv6:[::1]:4000", bound="::1") or not socket.has_ipv6
    for wildcard in ("0.0.0.0", "::"):  # (gRPC listens on every address then)
        assert answers_to("127.0.0.2:7000", 7000, here, bound=wildcard)
    assert not answers_to("192.0.2.7:7000", 7000, here)
    assert not answers_to("no-such-host.invalid:7000", 7000, here)
    assert not answers_to("x", 7000, here)
    assert answers_to("gateway.example:80", 7000, "ipv4:192.0.2.1:5", ("gateway.example:80",))


@pytest.mark.parametrize("target", ["127.0.0.1:7000", "localhost:7000", "0.0.0.0:7000",
                                    "127.0.0.2:7000",
                                    # other spellings of the same addresses (taken from
                                    # any machine: AddWorker("[::ffff:127.0.0.1]:P") made
                                    # the controller dial a relay on its own machine)
                                    "[::ffff:127.0.0.1]:7000", "[::ffff:7f00:1]:7000",
                                    "[::ffff:0.0.0.0]:7000", "127.1:7000", "0:7000",
                                    "0x0:7000"])
@pytest.mark.parametrize("peer", ["ipv4:192.0.2.9:40000", "ipv6:[2001:db8::1]:40000",
                                  "ipv6:%5B2001:db8::1%5D:40000", "ipv4:10.1.2.3:1"])
def test_a_proof_for_a_loopback_worker_relayed_from_another_machine_is_refused(target, peer):
    # Every machine has 127.0.0.1 (and 0.0.0.0): a proof the controller made for a worker
    # on its own machine, relayed by whoever took that port over to a worker on another
    # machine listening on the same port, must not be taken there as its own
    assert not answers_to(target, 7000, peer)
    assert answers_to(target, 7000, "ipv4:127.0.0.1:40000")
    assert answers_to(target, 7000, "ipv6:[::ffff:127.0.0.1]:40000")
    # (an address it was told it is reached at stays its own, from anywhere: --advertise)
    assert answers_to(target, 7000, peer, (target,))


def test_the_peer_of_a_real_loopback_call_is_local():
    """peer_is_local reads the peer as this gRPC version writes it (IPv6 brackets are
    percent-encoded by some versions)."""
    hosts = ["127.0.0.1"] + (["[::1]"] if socket.has_ipv6 else [])

    async def main():
        seen = []

        def echo(request, context):
            seen.append(context.peer())
            return request

        handler = grpc.method_handlers_generic_handler(
            "t.T", {"E": grpc.unary_unary_rpc_method_handler(echo)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        ports = [(h, server.add_insecure_port(f"{h}:0")) for h in hosts]
        await server.start()
        try:
            for h, port in ports:
                if port == 0:  # (no IPv6 loopback here)
                    continue
                async with grpc.aio.insecure_channel(f"{h}:{port}") as ch:
                    await ch.unary_unary("/t.T/E")(b"x", timeout=10)
        finally:
            await server.stop(None)
        return seen

    seen = asyncio.run(main())
    assert seen and all(peer_is_local(p) for p in seen), seen
    assert not peer_is_local("ipv4:192.0.2.9:1") and not peer_is_local("garbage")



def test_worker_forgets_old_nonces_without_letting_them_replay(monkeypatch):
    from clockwork.protocol import security

    monkeypatch.setattr(security, "MAX_NONCES", 3)
    now = [1_000_000.0]
    ctl, wrk = ClusterAuth(b"k" * 20, clock=lambda: now[0]), ClusterAuth(b"k" * 20,
                                                                          clock=lambda: now[0])
    sent = []
    for _ in range(5):
        now[0] += 0.01
        md, _ = ctl.call_metadata(WORKER_CLOCK_SYNC, "w:1")
        sent.append(md)
        assert wrk.check_controller(WORKER_CLOCK_SYNC, md)[0] is None
    assert len(wrk._seen) == 3  # bounded: the two oldest were forgotten ...
    for md in sent:  # ... and still cannot be replayed, nor can the remembered ones
        assert wrk.check_controller(WORKER_CLOCK_SYNC, md)[0] == "replayed cluster credentials"
    now[0] += 10 * security.FRESH_S  # all expire; a fresh call is accepted
    md, _ = ctl.call_metadata(WORKER_CLOCK_SYNC, "w:1")
    assert wrk.check_controller(WORKER_CLOCK_SYNC, md)[0] is None and len(wrk._seen) == 1


def test_a_private_file_replaces_a_link_planted_at_its_path(tmp_path):
    """write_private (the token file a LocalCluster hands its controller) replaces a
    symbolic link at its path with a new 0600 file; it wrote the token through the link
    into the link's target. A file already there is replaced too, 0600 whatever it was."""
    import stat

    from clockwork.protocol.security import write_private

    target = tmp_path / "theirs"
    target.write_text("")
    os.chmod(target, 0o644)
    link = tmp_path / "token"
    link.symlink_to(target)
    write_private(link, "s3cret\n")
    assert target.read_text() == "" and not link.is_symlink()
    assert link.read_text() == "s3cret\n"
    assert stat.S_IMODE(link.stat().st_mode) == 0o600
    os.chmod(link, 0o644)
    write_private(link, "again\n")
    assert link.read_text() == "again\n" and stat.S_IMODE(link.stat().st_mode) == 0o600


def test_a_host_name_that_is_also_a_loopback_address_is_this_machine_alone(monkeypatch):
    """A worker's host name that resolves to a loopback address and to its own address
    (/etc/hosts' 127.0.1.1 beside DNS's): a proof made for it is the worker's from any
    machine, as the controller dials it by that name; a name resolving to loopback alone
    (localhost) is every machine's, taken only from this one."""
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if host.endswith(".example") and kw.get("flags", 0) & socket.AI_NUMERICHOST:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host == "worker-7.example":
            return real("127.0.1.1", *a, **kw) + real("192.0.2.2", *a, **kw)
        if host == "only-loopback.example":
            return real("127.0.1.1", *a, **kw)
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    remote = "ipv4:10.1.2.3:5555"
    assert answers_to("worker-7.example:7000", 7000, remote)
    assert not answers_to("only-loopback.example:7000", 7000, remote)
    assert answers_to("only-loopback.example:7000", 7000, "ipv4:127.0.0.1:5555")


def test_a_controller_without_the_secret_a_worker_wants_is_told_so(plain_cluster, capsys):
    """A worker started with a cluster secret, a controller with none: it was told the
    worker 'refused our cluster credentials (give both the same cluster secret)', though
    it had sent none. It now says the worker wants a secret this controller lacks, and
    where to give it."""
    import asyncio

    from controller.service import ControllerNode

    addr = plain_cluster.worker_addresses[0]

    async def main():
        node = ControllerNode([addr], "v100-reference", models=MODEL, connect_timeout=2)
        with pytest.raises(Exception) as e:  # noqa: PT011 - what it says is the test
            await node.start()
        await node.stop()
        return str(e.value)

    said = asyncio.run(main()) + capsys.readouterr().err
    assert (f"worker {addr}: it wants a cluster secret and this controller has none (give "
            "it the worker's: --cluster-secret-file, or CLOCKWORK_CLUSTER_SECRET)") in said, said
    assert "refused our cluster credentials" not in said


def test_tls_clients_with_plaintext_links_to_far_workers_are_warned_of():
    """Clients on TLS and the links to workers off this machine in the clear (allowed) is
    said in a warning naming those workers (it was said nowhere, and the start line said
    TLS); loopback workers, no client TLS, or TLS to the workers: nothing said."""
    from clockwork.protocol.security import plaintext_workers_warning as line

    tls, worker_tls = True, object()
    said = line(tls, None, ["10.0.0.5:12345", "127.0.0.1:1", "[::1]:2"])
    assert said is not None and "10.0.0.5:12345" in said and "127.0.0.1" not in said
    assert "--worker-tls-ca" in said
    assert line(tls, None, ["127.0.0.1:1", "localhost:2"]) is None
    assert line(False, None, ["10.0.0.5:1"]) is None
    assert line(tls, worker_tls, ["10.0.0.5:1"]) is None


def _this_hosts_address() -> str | None:
    """An address of this machine off loopback (the one a packet out would leave by),
    or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # (nothing is sent: a route is chosen)
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_a_far_worker_added_in_the_clear_to_a_tls_controller_is_warned_of(pki):
    """The warning said at start for workers off this machine linked in the clear while
    the clients speak TLS is said too for one added while serving (``AddWorker``): it was
    said for the workers at start only."""
    ip = _this_hosts_address()
    if ip is None:
        pytest.skip("this machine has no address off loopback")
    with local_cluster(models=MODEL,
                       controller_args=["--tls-cert", pki.cert, "--tls-key", pki.key]) as c:
        w = _Child("worker", _cli() + ["worker", "--host", ip, "--port", "0"],
                   extra_env={SECRET_ENV: c.cluster_secret})
        try:
            addr = w.wait_address(30)
            with clockwork.Client(c.address, timeout=30, tls_ca=pki.ca) as cl:
                assert cl.add_worker(addr)["added"]
            line = wait_output(c.controller, "clients speak TLS")
            assert f"the links to {addr} do not" in line and "--worker-tls-ca" in line, line
            assert not [x for x in c.controller.output if "clients speak TLS" in x
                        and "127.0.0.1" in x]  # (its loopback worker: nothing said)
        finally:
            w.stop()


def test_a_refusal_held_back_by_the_line_a_second_is_said_when_its_second_is_over(capsys):
    """Refusals are logged at most a line a second; those that come within the second
    are said once it is over (the latest, with how many more), not only when another
    refusal follows (when none did, they were never said)."""
    import asyncio

    from clockwork.protocol.security import Refusals

    async def main():
        r = Refusals("worker")
        r.said("ClockSync from A: no cluster credentials")
        r.said("ClockSync from B: wrong cluster credentials")
        r.said("ClockSync from C: wrong cluster credentials")
        first = capsys.readouterr().err
        await asyncio.sleep(1.2)
        return first, capsys.readouterr().err

    first, later = asyncio.run(main())
    assert first == "worker: refused ClockSync from A: no cluster credentials\n", first
    assert later == ("worker: refused ClockSync from C: wrong cluster credentials (and 1 "
                     "more since the last line)\n"), later
