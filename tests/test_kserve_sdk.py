"""The ``kserve`` SDK's clients (REST and gRPC) against a plain controller: health,
readiness, inference of 1, 2 (tensors as JSON / typed contents) and max_batch_size rows
(binary data), and a malformed request answered as the client's error (never a server
error) with the next request served.

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


def request(n=1, dtype="FP32"):
    # 1 or 2 rows as JSON lists, more as binary data (a JSON list of 16 images costs the
    # SDK seconds to build)
    x = InferInput("data", [n, 3, 224, 224], dtype)
    x.set_data_from_numpy(np.zeros((n, 3, 224, 224), np.float32 if dtype == "FP32"
                                   else np.float64), binary_data=n > 2)
    return InferRequest(model_name="resnet50_v2", infer_inputs=[x],
                        parameters={"slo_ms": 2000})


async def bad(call):
    try:
        await call
    except Exception as e:  # the SDK's error for a 400 / INVALID_ARGUMENT
        return type(e).__name__ + " " + str(e).replace(chr(10), " ")[:300]
    return "no error"


async def main():
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    base = "http://" + http_addr
    print("rest live", await rest.is_server_live(base))
    print("rest ready", await rest.is_server_ready(base))
    print("rest model ready", await rest.is_model_ready(base, "resnet50_v2"))
    r = await rest.infer(base, request(), model_name="resnet50_v2")
    print("rest infer", r.outputs[0].shape)
    for n in (2, 16):
        r = await rest.infer(base, request(n), model_name="resnet50_v2")
        print("rest infer", n, r.outputs[0].shape)
    print("rest bad", await bad(rest.infer(base, request(1, "FP64"), model_name="resnet50_v2")))
    print("rest over", await bad(rest.infer(base, request(17), model_name="resnet50_v2")))
    r = await rest.infer(base, request(), model_name="resnet50_v2")
    print("rest after", r.outputs[0].shape)
    await rest.close()
    g = InferenceGRPCClient(grpc_addr, retries=0, timeout=30)
    print("grpc live", await g.is_server_live())
    print("grpc ready", await g.is_server_ready())
    print("grpc model ready", await g.is_model_ready("resnet50_v2"))
    r = await g.infer(request())
    print("grpc infer", r.outputs[0].shape)
    for n in (2, 16):
        r = await g.infer(request(n))
        print("grpc infer", n, r.outputs[0].shape)
    print("grpc bad", await bad(g.infer(request(1, "FP64"))))
    print("grpc over", await bad(g.infer(request(17))))
    r = await g.infer(request())
    print("grpc after", r.outputs[0].shape)
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
                 "rest infer [1, 1000]", "rest infer 2 [2, 1000]", "rest infer 16 [16, 1000]",
                 "rest after [1, 1000]", "grpc live True", "grpc ready True",
                 "grpc model ready True", "grpc infer [1, 1000]", "grpc infer 2 [2, 1000]",
                 "grpc infer 16 [16, 1000]", "grpc after [1, 1000]"):
        assert line in out, out
    lines = {}
    for ln in out.splitlines():
        who, what, rest = (ln.split(" ", 2) + ["", ""])[:3]
        if what in ("bad", "over"):
            lines[f"{who} {what}"] = rest
    # refused as the client's mistake, saying what is wrong; never a server error
    assert "FP64" in lines["rest bad"] and "400" in lines["rest bad"], lines
    assert "max_batch_size 16" in lines["rest over"] and "400" in lines["rest over"], lines
    assert "FP64" in lines["grpc bad"] and "INVALID_ARGUMENT" in lines["grpc bad"], lines
    assert "max_batch_size 16" in lines["grpc over"], lines
    assert "INVALID_ARGUMENT" in lines["grpc over"], lines
