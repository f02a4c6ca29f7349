"""A controller binds every port it listens on before it contacts a worker: one whose
port is taken exits 2 naming it and leaves the workers to the controller that has
them."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import local_cluster

MODEL = "resnet50_v2"


@pytest.mark.parametrize("flag", ["--http-port", "--port", "--kserve-port"])
def test_a_controller_whose_port_is_taken_leaves_the_workers_alone(flag):
    """A second controller on the first's worker, one of its ports the first's: it
    exits 2 naming the port before it says Hello to the worker (with --http-port taken
    it took the worker over first, evicting the first controller's session, printed
    'listening', and only then exited)."""
    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL, kserve_port=0) as c:
        taken = {"--http-port": c.printed_address("http"),
                 "--kserve-port": c.printed_address("kserve grpc"),
                 "--port": c.address}[flag].rpartition(":")[2]
        argv = list(c._controller_argv)
        for f, v in (("--port", "0"), ("--http-port", "0"), ("--kserve-port", "0")):
            argv[argv.index(f) + 1] = v
        argv[argv.index(flag) + 1] = taken
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           env={**os.environ, **{k: v for k, v in c._env.items() if v}})
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert f"cannot listen on 127.0.0.1:{taken} ({flag})" in p.stderr, p.stderr
        assert "listening" not in p.stdout, p.stdout
        with clockwork.Client(c.address, timeout=20) as cl:
            assert cl.infer(MODEL, slo_ms=2000).status == 0
            st = cl.stats()
        assert st.get("worker_losses", 0) == 0 and st["worker_connects"] == 1, st


_HOLD = r"""
import asyncio, sys
import grpc
from clockwork.protocol import clockwork_pb2 as pb, clockwork_pb2_grpc as pbg


async def main():
    hold = asyncio.Event()

    async def idle():
        yield pb.InferRequestBatch(requests=[pb.InferRequest(model="nowhere", client_id=1)])
        await hold.wait()

    async with grpc.aio.insecure_channel(sys.argv[2]) as k, \
            grpc.aio.insecure_channel(sys.argv[1]) as c:
        busy, main_port = pbg.ClockworkStub(k), pbg.ClockworkStub(c)
        streams = [busy.InferStream(idle()) for _ in range(2)]
        for s in streams:
            await asyncio.wait_for(s.read(), 10)
        for stub, port in ((busy, "kserve port"), (main_port, "controller port")):
            try:
                await stub.Stats(pb.StatsRequest(), timeout=5.0)
                print(port, "answered")
            except grpc.aio.AioRpcError as e:
                print(port, e.code().name)
        hold.set()


asyncio.run(main())
"""


def test_calls_open_on_the_kserve_port_leave_the_controller_port_its_own_room():
    """Each gRPC port is a server of its own, with ``grpc_max_calls`` of its own: calls
    held open on the KServe port (here the 2 allowed) do not keep the controller port's
    control calls out (one server for both ports refused them RESOURCE_EXHAUSTED; and
    under load, a server takes up one new call per turn or two of the event loop, so its
    control calls waited 1-3 s behind the KServe port's inferences)."""
    import sys

    with local_cluster(workers=1, gpus=1, models=MODEL, kserve_port=0,
                       controller_args=["--limit", "grpc_max_calls=2"]) as c:
        out = subprocess.run([sys.executable, "-c", _HOLD, c.address,
                              c.printed_address("kserve grpc")],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.splitlines() == ["kserve port RESOURCE_EXHAUSTED",
                                           "controller port answered"], out.stdout + out.stderr
