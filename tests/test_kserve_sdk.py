"""The ``kserve`` SDK's clients (REST and gRPC) against a plain controller: health,
readiness, metadata and inference.

``kserve`` and ``tritonclient.grpc`` register the same protobuf package (``inference``), so
the SDK runs in a process of its own (as in tests/test_security_kserve.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytest.importorskip("grpc")

from tests.conftest import local_cluster  # noqa: E402

SCRIPT = """
import asyncio, sys
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

grpc_addr, http_addr = sys.argv[1:3]


def request():
    x = InferInput("data", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32), binary_data=False)
    return InferRequest(model_name="resnet50_v2", infer_inputs=[x],
                        parameters={"slo_ms": 1000})


async def main():
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    base = "http://" + http_addr
    print("rest live", await rest.is_server_live(base))
    print("rest ready", await rest.is_server_ready(base))
    print("rest model ready", await rest.is_model_ready(base, "resnet50_v2"))
    r = await rest.infer(base, request(), model_name="resnet50_v2")
    print("rest infer", r.outputs[0].shape)
    await rest.close()
    g = InferenceGRPCClient(grpc_addr, retries=0, timeout=30)
    print("grpc live", await g.is_server_live())
    print("grpc ready", await g.is_server_ready())
    print("grpc model ready", await g.is_model_ready("resnet50_v2"))
    r = await g.infer(request())
    print("grpc infer", r.outputs[0].shape)
    await g.close()

asyncio.run(main())
"""


def test_kserve_sdk_health_and_infer():
    if importlib.util.find_spec("kserve") is None:  # imported only in the child process
        pytest.skip("the kserve SDK is not installed")
    with local_cluster(models="resnet50_v2", http_port=0, kserve_port=0) as c:
        p = subprocess.run([sys.executable, "-c", SCRIPT, c.printed_address("kserve grpc"),
                            c.printed_address("http")],
                           capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr[-3000:]
    for line in ("rest live True", "rest ready True", "rest model ready True",
                 "rest infer [1, 1000]", "grpc live True", "grpc ready True",
                 "grpc model ready True", "grpc infer [1, 1000]"):
        assert line in out, out
