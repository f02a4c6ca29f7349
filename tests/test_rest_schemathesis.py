"""The controller's KServe v2 REST server fuzzed with schemathesis against KServe's own
OpenAPI document.

The document is not a copy of KServe's published spec: it is what FastAPI makes, at test
time, of the ``kserve`` package's v2 endpoint definitions (``register_v2_endpoints`` of
``kserve.protocol.rest.v2_endpoints`` on a bare ``FastAPI`` app, with a dummy data plane:
only ``app.openapi()`` is read, kserve's server never runs). ``kserve`` registers the same
protobuf package (``inference``) as ``tritonclient.grpc``, so the document is built in a
process of its own and handed over as JSON.

What is taken of it, and changed:

- the paths the controller serves (``docs/contracts.md``, "KServe v2"): server metadata,
  the health probes, model metadata, model readiness (with and without a version),
  inference and the repository's load and unload. ``GET /v2/models`` (kserve's own
  model list; the controller does not serve it) is left out.
- inference's 200 answer: kserve's route declares none (``response_model=None``, its
  handler returns either ``InferenceResponse`` or a raw body), so its ``content`` is set
  to kserve's own ``InferenceResponse`` model (JSON) and to
  ``application/octet-stream`` (the binary tensor data extension: a JSON header, then
  the tensors).
- ``InferenceResponse.id``: kserve's pydantic model requires it, but the protocol's REST
  schema (as tests/test_kserve_conformance.py transcribes it) has it optional, "the id
  given in the request, if any", and the controller, as Triton, omits it when the request
  has none (tested there, ``test_rest_infer``). The document drops ``id`` from
  ``required``; everything else of kserve's response models is checked as is.

Checks (``case.call_and_validate``): ``not_a_server_error`` (no 5xx, ever),
``response_schema_conformance`` (an answer whose status the document lists conforms to
kserve's schema for it: every 200) and ``content_type_conformance``.
``status_code_conformance`` is left out on purpose: kserve's routes document 200 and
FastAPI's 422 (its request-validation error) only, while the controller answers a bad
request as the KServe error table of docs/contracts.md says (400 malformed, 404 an
unknown model, version or path, 405, 413, ...), so every refusal would be an
"undocumented status" by construction. Those statuses are asserted where they are
specified (tests/test_kserve_conformance.py, test_rest_http.py, test_kserve_validate.py);
here :func:`_refusal_ok` only asks every answer other than 200 to be a 4xx with the
protocol's error object ``{"error": $string}`` (schemathesis checks no schema for a
status the document does not list). The cluster is ready and the SLOs generous, so the
documented 503 and 504 answers cannot occur.

Requests:

- schemathesis's generation from kserve's request models (positive data, and negative
  data where there is a body or query string to break), once with any model name and
  once with the served model's name (so that fuzzed bodies reach the controller's
  validation);
- a Hypothesis strategy of valid inference requests of the served model (its input
  name, shape and datatype; one row without the batch dimension or 1 to max_batch_size
  rows; flat or nested data; optional id, outputs and SLO): each must succeed, so each
  went through the scheduler;
- the same requests with one part broken (name, shape, datatype, data,
  ``binary_data_size``, parameters, outputs, id, inputs): the validation past the
  datatype, which schemathesis's bodies rarely reach.

Each runs derandomized with a bounded number of examples: the file is deterministic and
takes about 30 s (most of it starting the cluster and generating data). schemathesis's
pytest integration (``schema.parametrize()``) is not used: its lazy form
(``schemathesis.pytest.from_fixture``) fails on pytest 9.2 (it sets
``request.node._nodeid``, which pytest 9.2 no longer has), and the eager form needs the
document at collection time, i.e. importing kserve in a subprocess whenever the suite is
collected. The tests draw schemathesis's cases with ``APIOperation.as_strategy`` under
plain ``hypothesis.given`` instead, and call ``case.call_and_validate`` as the
integration would.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis")
# (not imported here: kserve's protobuf package clashes with tritonclient's)
if importlib.util.find_spec("kserve") is None or importlib.util.find_spec("fastapi") is None:
    pytest.skip("needs kserve and fastapi (the [test] extra)", allow_module_level=True)

import requests  # noqa: E402  (schemathesis's transport)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)

from clockwork.profiles import load_profile_set  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402

MODEL = "mlp"  # of the cpu profile set, on an emulated GPU: input x [64] FP32, output [10]
PROFILE = load_profile_set("cpu").profiles[MODEL]
MAX_BATCH = max(PROFILE.batch_sizes)
CHECKS = [schemathesis.checks.not_a_server_error, response_schema_conformance,
          content_type_conformance]
# the paths of kserve's document that the controller serves
SERVED = ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model_name}",
          "/v2/models/{model_name}/ready",
          "/v2/models/{model_name}/versions/{model_version}/ready",
          "/v2/models/{model_name}/infer", "/v2/repository/models/{model_name}/load",
          "/v2/repository/models/{model_name}/unload")
SETTINGS = settings(
    derandomize=True, database=None, deadline=None, max_examples=25, print_blob=False,
    # a live server over HTTP is slow next to in-process generation; kserve's request
    # models make large inputs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example])

# kserve's document, as FastAPI makes it of kserve's v2 routes (in a process of its own)
OPENAPI_SCRIPT = r"""
import json, sys
from fastapi import FastAPI
from kserve.protocol.rest.v2_datamodels import InferenceResponse
from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

app = FastAPI(title="kserve v2")
register_v2_endpoints(app, dataplane=object(), model_repository_extension=object())
doc = app.openapi()
resp = InferenceResponse.model_json_schema(ref_template="#/components/schemas/{model}")
defs = resp.pop("$defs", {})
json.dump({"openapi": doc, "InferenceResponse": resp, "defs": defs}, sys.stdout)
"""


def kserve_openapi() -> dict:
    """KServe's v2 OpenAPI document (see the module's docstring for what is changed)."""
    out = subprocess.run([sys.executable, "-c", OPENAPI_SCRIPT], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    got = json.loads(out)
    doc = got["openapi"]
    schemas = doc["components"]["schemas"]
    schemas.update(got["defs"])
    resp = got["InferenceResponse"]
    resp["required"] = [k for k in resp["required"] if k != "id"]  # see the docstring
    schemas["InferenceResponse"] = resp
    missing = set(SERVED) - set(doc["paths"])
    assert not missing, f"kserve's document lacks {sorted(missing)}"
    doc["paths"] = {p: doc["paths"][p] for p in SERVED}
    ok = doc["paths"]["/v2/models/{model_name}/infer"]["post"]["responses"]["200"]
    ok["content"] = {"application/json": {
                         "schema": {"$ref": "#/components/schemas/InferenceResponse"}},
                     "application/octet-stream": {"schema": {}}}
    return doc


@pytest.fixture(scope="module")
def openapi_doc() -> dict:
    return kserve_openapi()


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=1, gpus=1, profiles="cpu", models=MODEL, http_port=0) as c:
        yield c


@pytest.fixture(scope="module")
def base_url(cluster) -> str:
    return "http://" + cluster.printed_address("http")


@pytest.fixture(scope="module")
def session():
    with requests.Session() as s:
        yield s


@pytest.fixture(scope="module")
def schema(openapi_doc):
    """schemathesis's view of the document, with an explicit configuration (no
    schemathesis.toml is read): a fixed seed."""
    return schemathesis.openapi.from_dict(openapi_doc,
                                          config=SchemathesisConfig.from_dict({"seed": 1}))


def _refusal_ok(case, response) -> None:
    """An answer that is not a 200: a client error with the protocol's error object
    ``{"error": $string}`` (a 5xx fails not_a_server_error first)."""
    if response.status_code == 200:
        return
    why = f"{response.status_code} {response.text[:200]!r} for\n{case.as_curl_command()}"
    assert 400 <= response.status_code < 500, why
    try:
        body = response.json()
    except ValueError:
        body = None
    assert isinstance(body, dict) and isinstance(body.get("error"), str), why


def _call(case, base_url: str, session):
    response = case.call_and_validate(base_url=base_url, session=session, checks=CHECKS,
                                      timeout=10)
    _refusal_ok(case, response)
    return response


# every served operation, with generated model names; and those that take a model name
# with the served model's (so that fuzzed bodies reach the controller's validation and,
# valid, the scheduler), but not its unload (the other requests need it loaded). Negative
# data only where there is something to break: a body or a query string (path parameters
# are strings, whatever is generated).
NEGATABLE = ("/v2/models/{model_name}", "/v2/models/{model_name}/ready",
             "/v2/models/{model_name}/infer")
FUZZED = [(path, model, mode)
          for model in (None, MODEL) for path in SERVED for mode in ("positive", "negative")
          if (model is None or "{model_name}" in path and not path.endswith("/unload"))
          and (mode == "positive" or path in NEGATABLE)]


@pytest.mark.parametrize(("path", "model", "mode"), FUZZED,
                         ids=[f"{p}-{m or 'any'}-{g}" for p, m, g in FUZZED])
def test_fuzz(schema, base_url, session, path, model, mode):
    (op,) = schema[path].values()
    fixed = {}
    if model is not None:
        fixed["model_name"] = model
        if "{model_version}" in path:
            fixed["model_version"] = "1"
    strategy = op.as_strategy(generation_mode=GenerationMode(mode),
                              path_parameters=fixed or None)

    @SETTINGS
    @given(case=strategy)
    def run(case):
        _call(case, base_url, session)

    run()


# ---------------------------------------------------------------------- valid requests


@st.composite
def valid_inference(draw) -> dict:
    """A valid inference request of the served model: 1 to max_batch_size rows (or one
    row without the batch dimension), data flat or nested, finite float32 values;
    optionally an id, the output named, and a generous SLO."""
    (inp,) = PROFILE.inputs
    width = int(np.prod(inp.shape))
    rows = draw(st.integers(0, MAX_BATCH))  # 0: one row, no batch dimension
    shape = [rows, *inp.shape] if rows else list(inp.shape)
    n = max(rows, 1) * width
    data = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=n, max_size=n))
    if rows and draw(st.booleans()):
        data = [data[i * width:(i + 1) * width] for i in range(rows)]
    body = {"inputs": [{"name": inp.name, "shape": shape, "datatype": "FP32",
                        "data": data}]}
    if draw(st.booleans()):
        body["id"] = draw(st.text(max_size=8))
    if draw(st.booleans()):
        body["outputs"] = [{"name": PROFILE.outputs[0].name}]
    if draw(st.booleans()):
        body["parameters"] = {"slo_ms": 60_000}
    return body


DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]
# (JSON has no NaN or infinity: requests refuses to send them, and a failing example's
# shrinking that reached one reported that instead of the failure)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | FLOATS | st.text(max_size=4)
    | st.integers(-(1 << 70), 1 << 70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=12)
# SLO parameters that are invalid or leave time to spare (a tiny one is a documented 504)
SLO = st.one_of(JSON.filter(lambda v: not isinstance(v, int | float) or isinstance(v, bool)),
                st.floats(max_value=-1e-9, allow_infinity=False),
                st.floats(min_value=10_000, allow_infinity=False))


@st.composite
def near_valid_inference(draw) -> dict:
    """A valid request of the served model with one part broken (or, rarely, still
    valid): the input's name, shape, datatype or data, a parameter, an output, the id,
    an extra or repeated input. What the controller's validation sees past the
    datatype, which schemathesis's generated bodies rarely reach."""
    body = draw(valid_inference())
    inp = body["inputs"][0]
    part = draw(st.sampled_from(["name", "shape", "datatype", "data", "binary_data_size",
                                 "input_param", "param", "output", "id", "inputs"]))
    if part == "name":
        inp["name"] = draw(JSON | st.sampled_from(["output", "", "x "]))
    elif part == "shape":
        inp["shape"] = draw(JSON | st.lists(st.integers(-2, 1 << 40), max_size=4)
                            | st.lists(st.integers(-1, 2 * MAX_BATCH + 1), max_size=3))
    elif part == "datatype":
        inp["datatype"] = draw(st.sampled_from(DATATYPES) | JSON)
    elif part == "data":
        inp["data"] = draw(JSON | st.lists(FLOATS | st.integers(-(1 << 70), 1 << 70)
                                           | st.booleans() | st.none(), max_size=70))
    elif part == "binary_data_size":  # with or without the data: no binary part follows
        if draw(st.booleans()):
            del inp["data"]
        inp["parameters"] = {"binary_data_size": draw(JSON | st.integers(-1, 1 << 40))}
    elif part == "input_param":
        inp["parameters"] = draw(JSON)
    elif part == "param":
        key = draw(st.sampled_from(["slo_ms", "timeout", "binary_data_output",
                                    "classification", draw(st.text(max_size=4))]))
        value = draw(SLO) if key in ("slo_ms", "timeout") else draw(JSON)
        body["parameters"] = draw(st.just({key: value}) | JSON)
    elif part == "output":
        body["outputs"] = draw(JSON | st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from([PROFILE.outputs[0].name, "x", ""]) | JSON},
            optional={"parameters": st.fixed_dictionaries(
                {}, optional={"binary_data": JSON, "classification": JSON})}), max_size=3))
    elif part == "id":
        body["id"] = draw(JSON)
    else:
        body["inputs"] = draw(st.sampled_from([[], [inp, inp], [inp, {**inp, "name": "y"}],
                                               [inp, None]]))
    return body


@SETTINGS
@given(body=near_valid_inference())
def test_near_valid_inference_is_answered(schema, base_url, session, body):
    """Broken requests of the served model: answered 200 (conforming to kserve's
    InferenceResponse) or a 4xx with an error object, never a 5xx."""
    op = schema["/v2/models/{model_name}/infer"]["POST"]
    case = op.Case(path_parameters={"model_name": MODEL}, body=body,
                   media_type="application/json")
    _call(case, base_url, session)


@SETTINGS
@given(body=valid_inference())
def test_valid_inference_succeeds(schema, base_url, session, body):
    op = schema["/v2/models/{model_name}/infer"]["POST"]
    case = op.Case(path_parameters={"model_name": MODEL}, body=body,
                   media_type="application/json")
    response = _call(case, base_url, session)
    assert response.status_code == 200, response.text
    got = response.json()
    (out,) = got["outputs"]
    rows = body["inputs"][0]["shape"][0] if len(body["inputs"][0]["shape"]) > 1 else None
    assert out["shape"] == ([rows] if rows else []) + list(PROFILE.outputs[0].shape)
    assert got.get("id") == body.get("id")
