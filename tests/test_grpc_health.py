"""gRPC's standard health service (``grpc.health.v1.Health``) on the controller's gRPC
ports, asked with grpcio-health-checking's own client: what Kubernetes' ``grpc`` probes
and ``grpc_health_probe`` call. Like the REST probes it needs no token."""

from __future__ import annotations

import grpc
import pytest

health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
from grpc_health.v1 import health_pb2_grpc  # noqa: E402

from tests.conftest import local_cluster  # noqa: E402

TOKEN = "test-token-0123456789abcdef"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TIMEOUT = 10


def test_health_check_and_watch_follow_the_controller_without_a_token():
    with local_cluster(models="mobilenet_v2", token=TOKEN, http_port=-1, kserve_port=0) as c:
        ports = [c.address, c.printed_address("kserve grpc")]
        for addr in ports:
            with grpc.insecure_channel(addr) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                for service in ("", "inference.GRPCInferenceService", "clockwork.v1.Clockwork"):
                    got = stub.Check(health_pb2.HealthCheckRequest(service=service),
                                     timeout=TIMEOUT)
                    assert got.status == SERVING, (addr, service)
                with pytest.raises(grpc.RpcError) as e:
                    stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"),
                               timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.NOT_FOUND
                # Watch of an unknown service: SERVICE_UNKNOWN, and the call stays open
                # (it ended OK, which makes clients call again in a loop)
                watch = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"),
                                   timeout=2)
                assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                with pytest.raises(grpc.RpcError) as e:
                    next(watch)
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with grpc.insecure_channel(c.address) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(),
                                                         timeout=60)
            assert next(watch).status == SERVING
            c.workers[0].proc.kill()  # its only worker gone: not serving, said at once
            assert next(watch).status == NOT_SERVING
            watch.cancel()
            got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                       timeout=TIMEOUT)
            assert got.status == NOT_SERVING


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probes_answer_while_the_controller_waits_for_its_workers():
    """A controller waiting for a worker that is not there yet (up to --connect-timeout):
    the probes answer (``/healthz`` 200, ``/readyz`` and ``/v2/health/ready`` 503, gRPC
    health ``NOT_SERVING``, KServe's ``ServerLive`` true), and every other call is
    refused UNAVAILABLE (REST 503) "controller is starting" at once. Before, the REST
    port took no connection and gRPC calls hung until the workers answered: a liveness
    probe killed a controller waiting for slow workers."""
    import http.client
    import subprocess

    from clockwork.errors import STARTING_MESSAGE
    from tests.conftest import cli_command

    port, http_port, kserve_port, nobody = (_free_port() for _ in range(4))
    p = subprocess.Popen(cli_command("controller", "--port", str(port), "--http-port",
                                     str(http_port), "--kserve-port", str(kserve_port),
                                     "--workers", f"127.0.0.1:{nobody}",
                                     "--connect-timeout", "60"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()  # it says it waits (after 0.5 s without an answer)
        assert "not answering yet; waiting up to 60 s" in line, line

        def get(path: str, method: str = "GET", body=None) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=TIMEOUT)
            try:
                conn.request(method, path, body)
                r = conn.getresponse()
                return r.status, r.read()
            finally:
                conn.close()

        assert get("/healthz")[0] == 200 and get("/v2/health/live")[0] == 200
        assert get("/readyz")[0] == 503 and get("/v2/health/ready")[0] == 503
        status, body = get("/v2/models/resnet50_v2/infer", "POST", b"{}")
        assert status == 503 and STARTING_MESSAGE.encode() in body, (status, body)
        import tritonclient.grpc as tgrpc

        for addr in (f"127.0.0.1:{port}", f"127.0.0.1:{kserve_port}"):
            with grpc.insecure_channel(addr) as ch:
                got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=TIMEOUT)
                assert got.status == NOT_SERVING
            t = tgrpc.InferenceServerClient(addr)
            try:  # (KServe's liveness, readiness and server metadata answer too)
                assert t.is_server_live(client_timeout=TIMEOUT)
                assert not t.is_server_ready(client_timeout=TIMEOUT)
                assert t.get_server_metadata(client_timeout=TIMEOUT).name == "clockwork"
            finally:
                t.close()
        import clockwork

        with clockwork.Client(f"127.0.0.1:{port}", timeout=TIMEOUT) as c:
            with pytest.raises(clockwork.errors.ControllerUnavailable, match=STARTING_MESSAGE):
                c.stats()
        p.send_signal(2)  # (SIGINT: it still stops at once, exit 130)
        rest = p.communicate(timeout=20)[1]
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130 and "Traceback" not in rest, (p.returncode, rest)


def test_the_open_health_service_is_bounded_for_peers_without_the_token():
    """The health service answers without the token, so what a peer can make of it is
    bounded: a request over 1 KiB is refused INVALID_ARGUMENT as it is decoded (a 50 MiB
    service name was decoded, kept by its Watch and echoed back: ~120 MiB a call), an
    unknown name is echoed cut short, and Watch calls past a small share of the server's
    call slots are refused RESOURCE_EXHAUSTED while the clients with the token are served
    (20,000 open Watches took every slot: every client was refused)."""
    import clockwork
    from controller.grpc_health import REQUEST_MAX_BYTES, WATCH_PER_ADDRESS

    with local_cluster(models="mobilenet_v2", token=TOKEN, http_port=-1,
                       controller_args=["--limit", "grpc_max_calls=64"]) as c:
        with grpc.insecure_channel(c.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.Check(health_pb2.HealthCheckRequest(service="x" * (REQUEST_MAX_BYTES + 1)),
                           timeout=TIMEOUT)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
            with pytest.raises(grpc.RpcError) as e:
                stub.Check(health_pb2.HealthCheckRequest(service="y" * 1000), timeout=TIMEOUT)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND and len(e.value.details()) < 200
            cap = 64 // 8  # (a server of 64 call slots: an eighth of them)
            assert cap < WATCH_PER_ADDRESS
            watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
                       for _ in range(cap)]
            assert all(next(w).status == SERVING for w in watches)  # (open, each)
            with pytest.raises(grpc.RpcError) as e:
                next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
            with clockwork.Client(c.address, token=TOKEN, timeout=TIMEOUT) as cl:
                assert cl.infer("mobilenet_v2", slo_ms=1000).status == 0
            watches[0].cancel()  # one ends: another may open
            deadline = __import__("time").monotonic() + TIMEOUT
            while True:
                w = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
                try:
                    assert next(w).status == SERVING
                    break
                except grpc.RpcError as err:  # (until the server has seen the cancel)
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert __import__("time").monotonic() < deadline
            for x in [*watches, w]:
                x.cancel()


def test_health_calls_that_never_send_their_request_take_no_call_slots():
    """A health call is answered only once its request has come: calls that never sent
    it held a call slot each for good (as many as the server has took them all: every
    client with the token was refused RESOURCE_EXHAUSTED, nothing said). Now a call waits
    for its request ``REQUEST_WAIT_S`` at most (then DEADLINE_EXCEEDED; an address's
    requests are read one at a time: its others, not reached, RESOURCE_EXHAUSTED), and
    past a share of the slots such calls are refused at once; the clients with the token
    are served."""
    import asyncio

    import clockwork
    from controller.grpc_health import REQUEST_WAIT_S

    async def never():
        await asyncio.Event().wait()
        yield b""  # (never reached)

    async def hold(address: str, n: int) -> list:
        async with grpc.aio.insecure_channel(address) as ch:
            check = ch.stream_unary("/grpc.health.v1.Health/Check")
            watch = ch.stream_stream("/grpc.health.v1.Health/Watch")
            calls = [check(never()) if i % 2 else watch(never()) for i in range(n)]
            t0 = asyncio.get_running_loop().time()
            with clockwork.Client(address, token=TOKEN, timeout=TIMEOUT) as cl:
                served = await asyncio.to_thread(cl.infer, "mobilenet_v2", slo_ms=1000)
            assert served.status == 0
            codes = []
            for i, call in enumerate(calls):
                try:
                    if i % 2:
                        await call
                    else:
                        async for _ in call:
                            pass
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as e:
                    codes.append(e.code())
            return codes, asyncio.get_running_loop().time() - t0

    with local_cluster(models="mobilenet_v2", token=TOKEN, http_port=-1,
                       controller_args=["--limit", "grpc_max_calls=64"]) as c:
        # (bounded: on the code before, the calls held every slot and the client waited)
        codes, took = asyncio.run(asyncio.wait_for(hold(c.address, 80), 60))
    assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED,
                          grpc.StatusCode.RESOURCE_EXHAUSTED}, set(codes)
    # (at most the 8 let wait, each read in turn while its own second lasts: on a quiet
    # host the first, the others then past their second unread)
    assert 1 <= codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) <= 64 // 8, codes
    assert len(codes) == 80
    assert took < REQUEST_WAIT_S + TIMEOUT
