"""The ``kserve`` SDK against a controller with a client token and TLS: its gRPC and REST
inference clients work with the token and the CA, and are refused without the token.

``kserve`` and ``tritonclient.grpc`` register the same protobuf package (``inference``), so
the SDK runs in a process of its own (as in tests/test_wheel.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from tests.conftest import local_cluster  # noqa: E402
from tests.pki import make_pki  # noqa: E402

TOKEN = "kserve-sdk-token-0123456789"

SCRIPT = """
import asyncio, sys
import numpy as np
import httpx
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

grpc_addr, http_addr, ca, token = sys.argv[1:5]
auth = "Bearer " + token


def request():
    x = InferInput("data", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32), binary_data=False)
    return InferRequest(model_name="resnet50_v2", infer_inputs=[x],
                        parameters={"slo_ms": 1000})


async def main():
    g = InferenceGRPCClient(grpc_addr, use_ssl=True, root_certificates=ca, retries=0)
    r = await g.infer(request(), headers=[("authorization", auth)])
    print("grpc ok", r.outputs[0].shape)
    try:
        await g.infer(request())
    except Exception as e:  # grpc.aio.AioRpcError
        print("grpc refused", e.code())
    await g.close()
    rest = InferenceRESTClient(RESTConfig(protocol="v2", verify=ca, retries=0))
    base = "https://" + http_addr
    r = await rest.infer(base, request(), model_name="resnet50_v2",
                         headers={"Authorization": auth})
    print("rest ok", r.outputs[0].shape)
    try:
        await rest.infer(base, request(), model_name="resnet50_v2")
    except httpx.HTTPStatusError as e:
        print("rest refused", e.response.status_code, e.response.headers["www-authenticate"])
    await rest.close()

asyncio.run(main())
"""


def test_kserve_sdk_with_token_and_tls(tmp_path):
    if importlib.util.find_spec("kserve") is None:  # imported only in the child process
        pytest.skip("the kserve SDK is not installed")
    pki = make_pki(tmp_path / "pki")
    with local_cluster(models="resnet50_v2", token=TOKEN, http_port=0, kserve_port=0,
                       controller_args=["--tls-cert", pki.cert, "--tls-key", pki.key]) as c:
        p = subprocess.run([sys.executable, "-c", SCRIPT, c.printed_address("kserve grpc"),
                            c.printed_address("http"), pki.ca, TOKEN],
                           capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr[-3000:]
    assert "grpc ok [1, 1000]" in out, out
    assert "grpc refused StatusCode.UNAUTHENTICATED" in out, out
    assert "rest ok [1, 1000]" in out, out
    assert 'rest refused 401 Bearer realm="clockwork"' in out, out
