"""The model repository extension over gRPC (``RepositoryIndex``, ``RepositoryModelLoad``,
``RepositoryModelUnload`` of ``KServeGrpcServicer``), driven by tritonclient.grpc: what
reaches ``controller/repository.py`` (here a stand-in recording its calls) and how its
answers and errors come back. The repository itself is tested end to end with it.

The servicer runs in a child process: its ``inference.*`` messages clash with
tritonclient's in one process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("grpc")
tgrpc = pytest.importorskip("tritonclient.grpc")

import grpc  # noqa: E402
from tritonclient.grpc import service_pb2 as kpb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as kpbg  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

TIMEOUT = 10

SERVER = r"""
import asyncio, json, sys, types

import grpc

import controller
from controller import kserve

MODELS = [{"name": "a", "version": "1", "state": "READY", "reason": ""},
          {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
NODE = object()


def record(*call):
    print(json.dumps(call), flush=True)


def index(node, ready_only=False):
    assert node is NODE
    record("index", ready_only)
    return [m for m in MODELS if m["state"] == "READY" or not ready_only]


async def load(node, name, params):
    assert node is NODE
    record("load", name, {k: v.hex() if isinstance(v, bytes) else v for k, v in params.items()})
    if name == "missing":
        raise kserve.KServeError(kserve.NOT_FOUND, "no model 'missing' in the repository")


async def unload(node, name, params):
    record("unload", name, params)
    if name == "boom":
        raise RuntimeError("secret detail")
    if name == "oom":
        raise MemoryError()


repository = types.ModuleType("controller.repository")
repository.index, repository.load, repository.unload = index, load, unload
sys.modules["controller.repository"] = controller.repository = repository


async def main():
    server = grpc.aio.server()
    kserve.add_kserve_grpc(NODE, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    record("port", port)
    await server.wait_for_termination()

asyncio.run(main())
"""


@pytest.fixture()
def server():
    """(address, the calls the repository got so far: a function)."""
    p = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first, p.stderr.read()
        kind, port = json.loads(first)
        assert kind == "port"
        calls = []

        def read(n: int) -> list:
            while len(calls) < n:
                line = p.stdout.readline()
                assert line, p.stderr.read()
                calls.append(json.loads(line))
            return calls

        yield f"127.0.0.1:{port}", read
    finally:
        p.kill()
        p.communicate(timeout=30)


def test_repository_over_grpc(server):
    address, calls = server
    c = tgrpc.InferenceServerClient(address)
    try:
        idx = c.get_model_repository_index(as_json=True, client_timeout=TIMEOUT)
        assert idx["models"] == [
            {"name": "a", "version": "1", "state": "READY"},  # (JSON leaves out empty fields)
            {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        c.load_model("a", config='{"backend": "x"}', files={"file:1/model.bin": b"\x00\x01"},
                     client_timeout=TIMEOUT)
        c.unload_model("a", unload_dependents=True, client_timeout=TIMEOUT)
        with pytest.raises(InferenceServerException) as e:
            c.load_model("missing", client_timeout=TIMEOUT)
        assert "NOT_FOUND" in e.value.status() and "no model 'missing'" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.unload_model("boom", client_timeout=TIMEOUT)
        assert "INTERNAL" in e.value.status() and e.value.message() == "internal error"
        # out of memory: to try again, not a bug (it was INTERNAL "internal error")
        with pytest.raises(InferenceServerException) as e:
            c.unload_model("oom", client_timeout=TIMEOUT)
        assert "UNAVAILABLE" in e.value.status() and "ran out of memory" in e.value.message()
    finally:
        c.close()
    with grpc.insecure_channel(address) as ch:
        stub = kpbg.GRPCInferenceServiceStub(ch)
        ready = stub.RepositoryIndex(kpb.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
        assert [m.name for m in ready.models] == ["a"]
        for call in (lambda: stub.RepositoryIndex(kpb.RepositoryIndexRequest(
                         repository_name="other"), timeout=TIMEOUT),
                     lambda: stub.RepositoryModelLoad(kpb.RepositoryModelLoadRequest(
                         repository_name="other", model_name="a"), timeout=TIMEOUT)):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            assert "unknown repository 'other'" in e.value.details()
    assert calls(7) == [
        ["index", False],
        ["load", "a", {"config": '{"backend": "x"}', "file:1/model.bin": "0001"}],
        ["unload", "a", {"unload_dependents": True}],
        ["load", "missing", {}],
        ["unload", "boom", {"unload_dependents": False}],  # (tritonclient always sends it)
        ["unload", "oom", {"unload_dependents": False}],
        ["index", True]]
