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
