"""The KServe v2 (Open Inference Protocol) required API, endpoint by endpoint, against the
JSON schemas and messages of the specification (kserve's docs/predict-api/v2:
required_api.md and rest_predict_v2.yaml): REST with a plain HTTP client (urllib), gRPC
with tritonclient.grpc (its messages are the protocol's).

Required: health (server live, server ready, model ready), server metadata, model
metadata, inference, with and without a version in the URL; a failure is an HTTP error
status whose body is ``{"error": $string}`` (gRPC: a status code and message)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("grpc")
tgrpc = pytest.importorskip("tritonclient.grpc")

import grpc  # noqa: E402
from tritonclient.grpc import service_pb2 as kpb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as kpbg  # noqa: E402

from clockwork.profiles import load_profile_set  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402

TIMEOUT = 10
MODEL = "mlp"  # of the cpu profile set, on an emulated GPU: input x [64], output [10]
PROFILE = load_profile_set("cpu").profiles[MODEL]
# the specification's tensor data types
DATATYPES = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"}

# ---------------------------------------------------------------------- the JSON schemas
# (rest_predict_v2.yaml's components, as small dicts: type, required and optional fields)

STR, INT, BOOL, OBJ = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, \
    {"type": "object"}


def _obj(required: dict, optional: dict | None = None, closed: bool = False) -> dict:
    return {"type": "object", "required": required, "optional": optional or {},
            "closed": closed}


def _arr(items: dict) -> dict:
    return {"type": "array", "items": items}


TENSOR_DATA = {"type": "tensor_data"}  # an array of numbers, strings, booleans or arrays
METADATA_TENSOR = _obj({"name": STR, "datatype": STR, "shape": _arr(INT)})
SERVER_METADATA = _obj({"name": STR, "version": STR, "extensions": _arr(STR)})
MODEL_METADATA = _obj({"name": STR, "platform": STR},
                      {"versions": _arr(STR), "inputs": _arr(METADATA_TENSOR),
                       "outputs": _arr(METADATA_TENSOR)})
RESPONSE_OUTPUT = _obj({"name": STR, "shape": _arr(INT), "datatype": STR, "data": TENSOR_DATA},
                       {"parameters": OBJ})
INFERENCE_RESPONSE = _obj({"model_name": STR, "outputs": _arr(RESPONSE_OUTPUT)},
                          {"model_version": STR, "id": STR, "parameters": OBJ})
ERROR = _obj({"error": STR}, closed=True)


def conforms(value, schema: dict, path: str = "$") -> None:
    """Assert that ``value`` has the shape ``schema`` describes."""
    kind = schema["type"]
    if kind == "string":
        assert isinstance(value, str), (path, value)
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), (path, value)
    elif kind == "boolean":
        assert isinstance(value, bool), (path, value)
    elif kind == "tensor_data":
        assert isinstance(value, list), (path, value)
        for i, v in enumerate(value):
            if isinstance(v, list):
                conforms(v, schema, f"{path}[{i}]")
            else:
                assert isinstance(v, int | float | str | bool), (f"{path}[{i}]", v)
    elif kind == "array":
        assert isinstance(value, list), (path, value)
        for i, v in enumerate(value):
            conforms(v, schema["items"], f"{path}[{i}]")
    else:
        assert isinstance(value, dict), (path, value)
        for k, sub in schema.get("required", {}).items():
            assert k in value, (path, f"missing {k!r}", value)
            conforms(value[k], sub, f"{path}.{k}")
        for k, sub in schema.get("optional", {}).items():
            if k in value:
                conforms(value[k], sub, f"{path}.{k}")
        if schema.get("closed"):
            assert set(value) == set(schema["required"]), (path, value)


# ---------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=1, gpus=1, profiles="cpu", models=MODEL, http_port=0,
                       kserve_port=0) as c:
        yield c


@pytest.fixture(scope="module")
def base(cluster) -> str:
    return "http://" + cluster.printed_address("http") + "/v2"


def _call(url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data
                                 else {})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _json(url: str, body: dict | None = None) -> tuple[int, object]:
    status, raw = _call(url, body)
    return status, json.loads(raw)


def _request(**over) -> dict:
    """The specification's example request, for this model: id, JSON data (flat), one
    requested output."""
    spec = PROFILE.inputs[0]
    n = int(np.prod(spec.shape))
    body = {"id": "42", "inputs": [{"name": spec.name, "shape": [1, *spec.shape],
                                    "datatype": "FP32", "data": [0.5] * n}],
            "outputs": [{"name": PROFILE.outputs[0].name}]}
    body.update(over)
    return body


# ---------------------------------------------------------------------- REST


def test_rest_health(base):
    """200 means true; a body, if any, says so in JSON (the Open Inference Protocol's
    ``{"live": true}`` / ``{"ready": true}``)."""
    for path, key in (("/health/live", "live"), ("/health/ready", "ready"),
                      (f"/models/{MODEL}/ready", "ready"),
                      (f"/models/{MODEL}/versions/1/ready", "ready")):
        status, raw = _call(base + path)
        assert status == 200, path
        if raw:
            assert json.loads(raw)[key] is True, (path, raw)
    for path in ("/models/no_such_model/ready", f"/models/{MODEL}/versions/9/ready"):
        status, _ = _call(base + path)
        assert 400 <= status < 500, (path, status)


def test_rest_server_metadata(base):
    status, md = _json(base)
    assert status == 200
    conforms(md, SERVER_METADATA)
    assert md["name"] and md["version"]


def test_rest_model_metadata(base):
    for url in (f"{base}/models/{MODEL}", f"{base}/models/{MODEL}/versions/1"):
        status, md = _json(url)
        assert status == 200, url
        conforms(md, MODEL_METADATA)
        assert md["name"] == MODEL and "1" in md["versions"]
        for got, specs in ((md["inputs"], PROFILE.inputs), (md["outputs"], PROFILE.outputs)):
            assert [t["name"] for t in got] == [s.name for s in specs]
            for t, s in zip(got, specs, strict=True):
                assert t["datatype"] in DATATYPES
                assert t["shape"] == [-1, *s.shape]  # -1: the variable batch dimension
    for url in (f"{base}/models/no_such_model", f"{base}/models/{MODEL}/versions/9"):
        status, err = _json(url)
        assert 400 <= status < 500, url
        conforms(err, ERROR)


def test_rest_infer(base):
    out = PROFILE.outputs[0]
    for url in (f"{base}/models/{MODEL}/infer", f"{base}/models/{MODEL}/versions/1/infer"):
        status, resp = _json(url, _request())
        assert status == 200, resp
        conforms(resp, INFERENCE_RESPONSE)
        assert resp["model_name"] == MODEL and resp["id"] == "42"
        assert [o["name"] for o in resp["outputs"]] == [out.name]
        o = resp["outputs"][0]
        assert o["datatype"] in DATATYPES and o["shape"] == [1, *out.shape]
        assert len(np.array(o["data"]).ravel()) == int(np.prod(o["shape"]))
    # no id asked, none given; no outputs named: every output
    body = _request()
    del body["id"], body["outputs"]
    status, resp = _json(f"{base}/models/{MODEL}/infer", body)
    assert status == 200
    conforms(resp, INFERENCE_RESPONSE)
    assert "id" not in resp and [o["name"] for o in resp["outputs"]] == [
        t.name for t in PROFILE.outputs]


def test_rest_infer_errors(base):
    for url, body, want in (
            (f"{base}/models/no_such_model/infer", _request(), 404),
            (f"{base}/models/{MODEL}/versions/9/infer", _request(), 404),
            (f"{base}/models/{MODEL}/infer", _request(inputs=[]), 400),
            (f"{base}/models/{MODEL}/infer", _request(outputs=[{"name": "nope"}]), 400)):
        status, err = _json(url, body)
        assert status == want, (url, status, err)
        conforms(err, ERROR)
    status, raw = _call(f"{base}/models/{MODEL}/infer", None)  # GET: no such route
    assert 400 <= status < 500


# ---------------------------------------------------------------------- gRPC


@pytest.fixture()
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as ch:
        yield kpbg.GRPCInferenceServiceStub(ch)


def test_grpc_health(stub, cluster):
    assert stub.ServerLive(kpb.ServerLiveRequest(), timeout=TIMEOUT).live is True
    assert stub.ServerReady(kpb.ServerReadyRequest(), timeout=TIMEOUT).ready is True
    for version in ("", "1"):
        r = stub.ModelReady(kpb.ModelReadyRequest(name=MODEL, version=version),
                            timeout=TIMEOUT)
        assert r.ready is True
    c = tgrpc.InferenceServerClient(cluster.address)
    try:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(MODEL)
        # an unknown model or version is not ready (Triton's answer), not an error
        assert not c.is_model_ready("no_such_model") and not c.is_model_ready(MODEL, "2")
        r = stub.ModelReady(kpb.ModelReadyRequest(name="no_such_model"), timeout=TIMEOUT)
        assert r.ready is False
    finally:
        c.close()


def test_grpc_metadata(stub):
    md = stub.ServerMetadata(kpb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert md.name and md.version and all(isinstance(x, str) for x in md.extensions)
    for version in ("", "1"):
        m = stub.ModelMetadata(kpb.ModelMetadataRequest(name=MODEL, version=version),
                               timeout=TIMEOUT)
        assert m.name == MODEL and "1" in m.versions and m.platform
        for got, specs in ((m.inputs, PROFILE.inputs), (m.outputs, PROFILE.outputs)):
            assert [(t.name, t.datatype in DATATYPES, list(t.shape)) for t in got] == [
                (s.name, True, [-1, *s.shape]) for s in specs]
    for name, version in (("no_such_model", ""), (MODEL, "9")):
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(kpb.ModelMetadataRequest(name=name, version=version),
                               timeout=TIMEOUT)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and e.value.details()


def _grpc_request(**over) -> kpb.ModelInferRequest:
    """The required form: typed contents; an id; one requested output."""
    spec = PROFILE.inputs[0]
    r = kpb.ModelInferRequest(**{"model_name": MODEL, "id": "42", **over})
    t = r.inputs.add(name=spec.name, datatype="FP32", shape=[1, *spec.shape])
    t.contents.fp32_contents.extend([0.5] * int(np.prod(spec.shape)))
    r.outputs.add(name=PROFILE.outputs[0].name)
    return r


def test_grpc_infer(stub):
    out = PROFILE.outputs[0]
    for version in ("", "1"):
        resp = stub.ModelInfer(_grpc_request(model_version=version), timeout=TIMEOUT)
        assert resp.model_name == MODEL and resp.model_version == "1" and resp.id == "42"
        assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
            (out.name, "FP32", [1, *out.shape])]
        # the data: raw_output_contents, one entry per output (its C-order bytes)
        assert len(resp.raw_output_contents) == len(resp.outputs)
        assert len(resp.raw_output_contents[0]) == 4 * int(np.prod(out.shape))


def test_grpc_infer_errors(stub):
    for r, code in ((_grpc_request(model_name="no_such_model"), grpc.StatusCode.NOT_FOUND),
                    (_grpc_request(model_version="9"), grpc.StatusCode.NOT_FOUND),
                    (kpb.ModelInferRequest(model_name=MODEL), grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(r, timeout=TIMEOUT)
        assert e.value.code() == code and e.value.details(), e.value
