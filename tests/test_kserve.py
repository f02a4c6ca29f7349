"""KServe v2 / Open Inference Protocol front end, driven by the stock ``tritonclient``."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("grpc")
tgrpc = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.conftest import local_cluster  # noqa: E402

MODELS = "resnet50_v2,mobilenet_v2"
TIMEOUT = 10  # seconds, per client call


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=1, gpus=1, models=MODELS, kserve_port=0,
                       controller_args=["--http-port", "0"]) as c:
        yield c


@pytest.fixture()
def client(cluster):
    c = tgrpc.InferenceServerClient(cluster.address)
    try:
        yield c
    finally:
        c.close()


def _input(shape=(1, 3, 224, 224), dtype="FP32", name="data"):
    x = tgrpc.InferInput(name, list(shape), dtype)
    x.set_data_from_numpy(np.zeros(shape, {"FP32": np.float32, "FP64": np.float64}[dtype]))
    return x


def test_health_and_metadata(client):
    assert client.is_server_live(client_timeout=TIMEOUT)
    assert client.is_server_ready(client_timeout=TIMEOUT)
    assert client.is_model_ready("resnet50_v2", client_timeout=TIMEOUT)
    md = client.get_model_metadata("resnet50_v2", as_json=True, client_timeout=TIMEOUT)
    assert md["name"] == "resnet50_v2"
    assert md["inputs"] == [{"name": "data", "datatype": "FP32", "shape": ["-1", "3", "224", "224"]}]
    assert md["outputs"] == [{"name": "output", "datatype": "FP32", "shape": ["-1", "1000"]}]
    assert client.get_server_metadata(as_json=True, client_timeout=TIMEOUT)["name"] == "clockwork"


def test_infer(client):
    r = client.infer("resnet50_v2", [_input()], parameters={"slo_ms": 100},
                     client_timeout=TIMEOUT)
    out = r.as_numpy("output")
    assert out.shape == (1, 1000) and out.dtype == np.float32 and not out.any()
    # no batch dimension in, none out; Triton's timeout parameter (µs) as the SLO
    r = client.infer("resnet50_v2", [_input((3, 224, 224))], timeout=200_000,
                     client_timeout=TIMEOUT)
    assert r.as_numpy("output").shape == (1000,)
    # float SLO, requested output
    r = client.infer("mobilenet_v2", [_input()], parameters={"slo_ms": 150.5},
                     outputs=[tgrpc.InferRequestedOutput("output")], client_timeout=TIMEOUT)
    assert r.as_numpy("output").shape == (1, 1000)


def test_typed_contents(cluster):
    # raw gRPC with typed fp32_contents instead of raw_input_contents (tritonclient's own
    # messages: ours and its register the same inference.* names, so not both per process)
    import grpc
    from tritonclient.grpc import service_pb2 as kpb
    from tritonclient.grpc import service_pb2_grpc as kpbg

    with grpc.insecure_channel(cluster.address) as ch:
        stub = kpbg.GRPCInferenceServiceStub(ch)
        req = kpb.ModelInferRequest(model_name="mobilenet_v2", inputs=[
            kpb.ModelInferRequest.InferInputTensor(
                name="data", datatype="FP32", shape=[1, 3, 224, 224],
                contents=kpb.InferTensorContents(fp32_contents=[0.0] * (3 * 224 * 224)))])
        req.parameters["slo_ms"].int64_param = 100
        resp = stub.ModelInfer(req, timeout=TIMEOUT)
        assert list(resp.outputs[0].shape) == [1, 1000]
        assert len(resp.raw_output_contents[0]) == 4000


def test_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", [_input()], client_timeout=TIMEOUT)
    assert "unknown model" in e.value.message()
    assert "NOT_FOUND" in e.value.status()
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50_v2", [_input((1, 3, 10, 10))], client_timeout=TIMEOUT)
    assert "shape [1, 3, 10, 10], expected [n, 3, 224, 224] with 1 <= n <= 16 rows, or " \
        "[3, 224, 224]" in e.value.message()
    assert "INVALID_ARGUMENT" in e.value.status()
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50_v2", [_input(dtype="FP64")], client_timeout=TIMEOUT)
    assert "datatype FP64, expected FP32" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50_v2", [_input(name="x")], client_timeout=TIMEOUT)
    assert "no input 'x'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50_v2", [_input()], parameters={"slo_ms": -1},
                     client_timeout=TIMEOUT)
    assert "INVALID_ARGUMENT" in e.value.status()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("no_such_model", client_timeout=TIMEOUT)
    assert "NOT_FOUND" in e.value.status()


def _agrees(config: dict, metadata: dict) -> None:
    """What Triton's tools derive from the two must match: a batch dimension (-1) in the
    metadata exactly when max_batch_size > 0, the same names, dims and datatypes."""
    batch = [-1] if int(config["max_batch_size"]) > 0 else []
    for kind, ckey in (("inputs", "input"), ("outputs", "output")):
        got = [(t["name"], t["data_type"], [*batch, *map(int, t["dims"])])
               for t in config[ckey]]
        want = [(t["name"], "TYPE_" + t["datatype"], [int(d) for d in t["shape"]])
                for t in metadata[kind]]
        assert got == want, (kind, got, want)


def test_model_config_grpc(client, cluster):
    cfg = client.get_model_config("resnet50_v2", client_timeout=TIMEOUT, as_json=True)["config"]
    assert cfg["name"] == "resnet50_v2"
    assert cfg["platform"] == "clockwork" and cfg["backend"] == "clockwork"
    assert cfg["max_batch_size"] == 16  # the profile's largest batch size
    assert cfg["input"] == [{"name": "data", "data_type": "TYPE_FP32", "dims": ["3", "224", "224"]}]
    assert cfg["output"] == [{"name": "output", "data_type": "TYPE_FP32", "dims": ["1000"]}]
    assert cfg["dynamic_batching"] == {}
    assert cfg["instance_group"] == [{"name": "resnet50_v2", "kind": "KIND_GPU", "count": 1,
                                      "gpus": [0]}]
    assert cfg["parameters"]["execution_batch_sizes"]["string_value"] == "1,2,4,8,16"
    _agrees(cfg, client.get_model_metadata("resnet50_v2", as_json=True, client_timeout=TIMEOUT))
    # a version: "1" is the model's, another is unknown
    assert client.get_model_config("resnet50_v2", "1", client_timeout=TIMEOUT).config.name
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("resnet50_v2", "2", client_timeout=TIMEOUT)
    assert "NOT_FOUND" in e.value.status() and "no version '2'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("no_such_model", client_timeout=TIMEOUT)
    assert "NOT_FOUND" in e.value.status()
    # what the configuration says is what inference accepts: up to max_batch_size rows ...
    for n in (1, 16):
        r = client.infer("resnet50_v2", [_input((n, 3, 224, 224))],
                         parameters={"slo_ms": 1000}, client_timeout=TIMEOUT)
        assert r.as_numpy("output").shape == (n, 1000)
    # ... and not more
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50_v2", [_input((17, 3, 224, 224))], client_timeout=TIMEOUT)
    assert "INVALID_ARGUMENT" in e.value.status()
    assert "batch of 17 rows is over the model's max_batch_size 16" in e.value.message()


def test_unknown_version_grpc(client):
    # (not ready, as Triton answers ModelReady for a version it does not have)
    assert not client.is_model_ready("resnet50_v2", "7", client_timeout=TIMEOUT)
    for call in (lambda: client.get_model_metadata("resnet50_v2", "7", client_timeout=TIMEOUT),
                 lambda: client.infer("resnet50_v2", [_input()], model_version="7",
                                      client_timeout=TIMEOUT)):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert "NOT_FOUND" in e.value.status(), e.value
        assert "no version '7'" in e.value.message()
    r = client.infer("resnet50_v2", [_input()], model_version="1", client_timeout=TIMEOUT)
    assert r.get_response().model_version == "1"


def test_errors_that_echo_a_huge_name_still_reach_the_client(client):
    """An error message quoting what the client sent (an input, output, version or model
    name of 20,000 characters; 5,000 emoji, 4 bytes each, percent-encoded to 12 each in
    the header) is cut to fit gRPC's header: the client gets the error
    (INVALID_ARGUMENT / NOT_FOUND), not RESOURCE_EXHAUSTED for a header it dropped."""
    long = "x" * 20_000
    calls = [
        (lambda: client.infer("resnet50_v2", [_input(name="\U0001f600" * 5000)],
                              client_timeout=TIMEOUT),
         "StatusCode.INVALID_ARGUMENT", "has no input '\U0001f600"),  # (4 bytes each)
        (lambda: client.infer("resnet50_v2", [_input(name=long)], client_timeout=TIMEOUT),
         "StatusCode.INVALID_ARGUMENT", "has no input 'xxx"),
        (lambda: client.infer("resnet50_v2", [_input()], model_version=long,
                              client_timeout=TIMEOUT),
         "StatusCode.NOT_FOUND", "has no version 'xxx"),
        (lambda: client.infer("resnet50_v2", [_input()],
                              outputs=[tgrpc.InferRequestedOutput(long)],
                              client_timeout=TIMEOUT),
         "StatusCode.INVALID_ARGUMENT", "has no output 'xxx"),
        (lambda: client.get_model_metadata("resnet50_v2", long, client_timeout=TIMEOUT),
         "StatusCode.NOT_FOUND", "has no version 'xxx"),
        (lambda: client.load_model(long, client_timeout=TIMEOUT),
         "StatusCode.INVALID_ARGUMENT", "bad model name 'xxx"),
    ]
    for call, status, text in calls:
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == status, e.value
        assert text in e.value.message() and len(e.value.message().encode()) <= 2000


def test_stream_infer(cluster):
    """ModelStreamInfer with tritonclient's stream API: one response per request, in
    any order, matched by id; bad requests in the middle (shape, unknown model, unknown
    version, an SLO that cannot be met) are answered with an error and the stream goes
    on."""
    import queue

    c = tgrpc.InferenceServerClient(cluster.address)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        sent = 0
        for i in range(30):
            c.async_stream_infer("resnet50_v2" if i % 2 else "mobilenet_v2",
                                 [_input() if i % 3 else _input((3, 224, 224))],
                                 request_id=f"r{i}", parameters={"slo_ms": 1000})
            sent += 1
            if i == 10:
                c.async_stream_infer("resnet50_v2", [_input((1, 3, 10, 10))],
                                     request_id="bad-shape")
                c.async_stream_infer("no_such_model", [_input()], request_id="bad-model")
                c.async_stream_infer("resnet50_v2", [_input()], model_version="3",
                                     request_id="bad-version")
                c.async_stream_infer("resnet50_v2", [_input()], request_id="too-tight",
                                     parameters={"slo_ms": 0.001})
                sent += 4
        results, errors = {}, []
        for _ in range(sent):
            result, error = got.get(timeout=TIMEOUT)
            if error is not None:
                errors.append(str(error))
            else:
                results[result.get_response().id] = result
        assert got.empty()
    finally:
        c.stop_stream()
        c.close()
    assert sorted(results) == sorted(f"r{i}" for i in range(30))
    for i in range(30):
        shape = (1, 1000) if i % 3 else (1000,)
        assert results[f"r{i}"].as_numpy("output").shape == shape
    assert len(errors) == 4, errors
    # each names its request, which the stock client's callback is not told otherwise
    errs = {re.search(r"\[request id: ([^\]]*)\] ", e).group(1): e for e in errors}
    assert errs.keys() == {"bad-shape", "bad-model", "bad-version", "too-tight"}, errors
    assert errs["bad-shape"].startswith("INVALID_ARGUMENT: [request id: bad-shape] input "
                                        "'data'") and "shape [1, 3, 10, 10]" in errs["bad-shape"]
    assert errs["bad-model"].startswith("NOT_FOUND: ") and "unknown model" in errs["bad-model"]
    assert errs["bad-version"].startswith("NOT_FOUND: ") and "no version '3'" in \
        errs["bad-version"]
    assert errs["too-tight"].startswith("DEADLINE_EXCEEDED: [request id: too-tight] TIMEOUT")


def test_stream_errors_name_their_request(cluster):
    """On the wire an error response carries the request's id (raw gRPC, tritonclient's
    messages), and a client that sends nothing and closes gets an empty stream."""
    import grpc
    from tritonclient.grpc import service_pb2 as kpb
    from tritonclient.grpc import service_pb2_grpc as kpbg

    def reqs():
        for i, shape in enumerate(([1, 4], [1, 3, 224, 224], [7])):
            r = kpb.ModelInferRequest(model_name="mobilenet_v2", id=f"q{i}", inputs=[
                kpb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32",
                                                       shape=shape)])
            r.raw_input_contents.append(np.zeros(shape, np.float32).tobytes())
            yield r

    with grpc.insecure_channel(cluster.address) as ch:
        stub = kpbg.GRPCInferenceServiceStub(ch)
        out = {r.infer_response.id: r for r in stub.ModelStreamInfer(reqs(), timeout=TIMEOUT)}
        assert list(stub.ModelStreamInfer(iter(()), timeout=TIMEOUT)) == []
    assert sorted(out) == ["q0", "q1", "q2"]
    assert out["q1"].error_message == "" and list(out["q1"].infer_response.outputs[0].shape) \
        == [1, 1000]
    for k in ("q0", "q2"):
        assert out[k].error_message.startswith("INVALID_ARGUMENT: ")
        assert out[k].infer_response.model_name == "mobilenet_v2"
    for r in out.values():  # each is its request's last, as Triton marks it
        assert r.infer_response.parameters["triton_final_response"].bool_param is True


def test_stream_responses_are_final_for_clients_that_wait_for_it(cluster):
    """tritonclient's decoupled pattern: ``enable_empty_final_response`` and reading
    ``triton_final_response`` to know a request is done."""
    import queue

    c = tgrpc.InferenceServerClient(cluster.address)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for i in range(3):
            c.async_stream_infer("mobilenet_v2", [_input()], request_id=f"f{i}",
                                 enable_empty_final_response=True)
        for _ in range(3):
            result, error = got.get(timeout=TIMEOUT)
            assert error is None, error
            params = result.get_response().parameters
            assert params["triton_final_response"].bool_param is True
    finally:
        c.stop_stream()
        c.close()


def _ints(d):
    """gRPC JSON writes uint64 as strings: back to ints, throughout."""
    if isinstance(d, dict):
        return {k: v if k in ("name", "version") else _ints(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_ints(v) for v in d]
    return int(d) if isinstance(d, str) and d.isdigit() else d


def _stat(stats: dict, *path: str) -> int:
    for p in path:
        stats = stats.get(p, {}) if isinstance(stats, dict) else {}
    return int(stats or 0)


def test_statistics(client, cluster):
    """Triton's statistics extension, gRPC and REST, from what the controller saw: the
    deltas over 5 successes (one at a time: batches of 1) and 1 request whose SLO cannot
    be met."""
    import time

    thttp = pytest.importorskip("tritonclient.http")

    def grpc_stats():
        s = _ints(client.get_inference_statistics("mobilenet_v2", as_json=True,
                                                  client_timeout=TIMEOUT))
        assert [m["name"] for m in s["model_stats"]] == ["mobilenet_v2"]
        return s["model_stats"][0]

    before = grpc_stats()
    t0_ms = time.time() * 1000
    for _ in range(5):
        client.infer("mobilenet_v2", [_input()], parameters={"slo_ms": 1000},
                     client_timeout=TIMEOUT)
    with pytest.raises(InferenceServerException, match="DEADLINE_EXCEEDED"):
        client.infer("mobilenet_v2", [_input()], parameters={"slo_ms": 0.001},
                     client_timeout=TIMEOUT)
    after = grpc_stats()

    def delta(*path):
        return _stat(after, *path) - _stat(before, *path)

    assert after["version"] == "1"
    assert delta("inference_count") == 5 and delta("execution_count") == 5
    assert delta("inference_stats", "success", "count") == 5
    assert delta("inference_stats", "fail", "count") == 1
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert delta("inference_stats", part, "count") == 5, part
    infer_ns = delta("inference_stats", "compute_infer", "ns")
    exec1 = 768_293  # mobilenet_v2's batch-1 EXEC in v100-reference, emulated exactly
    assert infer_ns == 5 * exec1
    assert delta("inference_stats", "success", "ns") > infer_ns
    assert delta("inference_stats", "queue", "ns") >= 0
    batch1 = lambda s: next((b for b in s.get("batch_stats", []) if b["batch_size"] == 1), {})  # noqa: E731
    assert _stat(batch1(after), "compute_infer", "count") - \
        _stat(batch1(before), "compute_infer", "count") == 5
    assert _stat(batch1(after), "compute_infer", "ns") - \
        _stat(batch1(before), "compute_infer", "ns") == infer_ns
    assert t0_ms - 1000 <= after["last_inference"] <= time.time() * 1000 + 1000
    # every model, unknown names and versions
    every = _ints(client.get_inference_statistics(as_json=True, client_timeout=TIMEOUT))
    assert sorted(m["name"] for m in every["model_stats"]) == ["mobilenet_v2", "resnet50_v2"]
    for args in (("no_such_model",), ("mobilenet_v2", "2")):
        with pytest.raises(InferenceServerException) as e:
            client.get_inference_statistics(*args, client_timeout=TIMEOUT)
        assert "NOT_FOUND" in e.value.status()
    # REST: the same figures, numbers as numbers
    c = thttp.InferenceServerClient(_http_address(cluster), connection_timeout=TIMEOUT,
                                    network_timeout=TIMEOUT)
    try:
        rest = c.get_inference_statistics("mobilenet_v2")["model_stats"][0]
        assert rest["inference_count"] == after["inference_count"]
        assert rest["inference_stats"]["compute_infer"] == after["inference_stats"][
            "compute_infer"]
        assert c.get_inference_statistics("mobilenet_v2", "1")["model_stats"][0]["name"] \
            == "mobilenet_v2"
        assert len(c.get_inference_statistics()["model_stats"]) == 2
        with pytest.raises(InferenceServerException) as e:
            c.get_inference_statistics("mobilenet_v2", "2")
        assert e.value.status() == "404"
    finally:
        c.close()


def test_requests_the_front_end_refuses_count_as_failures(client, cluster):
    """A request refused by the KServe checks (a bad shape, a bad parameter, a bad
    tensor), over gRPC, its stream and REST, is a failure in the statistics and in
    /metrics, as one the controller refuses is."""
    import queue
    import re
    import urllib.request

    thttp = pytest.importorskip("tritonclient.http")

    def fails():
        s = _ints(client.get_inference_statistics("mobilenet_v2", as_json=True,
                                                  client_timeout=TIMEOUT))
        return _stat(s["model_stats"][0], "inference_stats", "fail", "count")

    def metric():
        text = urllib.request.urlopen(f"http://{_http_address(cluster)}/metrics",
                                      timeout=TIMEOUT).read().decode()
        m = re.search(r'^nv_inference_request_failure\{model="mobilenet_v2"[^}]*\} (\S+)$',
                      text, re.M)
        return float(m.group(1))

    before, before_metric = fails(), metric()
    bad = 0
    for inputs, params in (([_input((1, 3, 224, 225))], {}),
                           ([_input()], {"slo_ms": "soon"}),
                           ([_input((1, 3, 224, 224), "FP64")], {})):
        with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT"):
            client.infer("mobilenet_v2", inputs, parameters=params, client_timeout=TIMEOUT)
        bad += 1
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error))
    try:
        client.async_stream_infer("mobilenet_v2", [_input((2, 3, 224, 225))])
        assert "INVALID_ARGUMENT" in str(got.get(timeout=TIMEOUT))
        bad += 1
    finally:
        client.stop_stream()
    h = thttp.InferenceServerClient(_http_address(cluster), connection_timeout=TIMEOUT,
                                    network_timeout=TIMEOUT)
    try:
        x = thttp.InferInput("data", [1, 3, 224, 225], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 224, 225), np.float32), binary_data=True)
        with pytest.raises(InferenceServerException) as e:
            h.infer("mobilenet_v2", [x])
        assert e.value.status() == "400"
        bad += 1
    finally:
        h.close()
    assert fails() - before == bad
    assert metric() - before_metric == bad


def _http_address(cluster, timeout: float = 10.0) -> str:
    return cluster.printed_address("http", timeout)


def test_http(cluster):
    thttp = pytest.importorskip("tritonclient.http")
    url = _http_address(cluster)
    c = thttp.InferenceServerClient(url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)
    try:
        assert c.is_server_live() and c.is_server_ready()
        assert c.is_model_ready("resnet50_v2") and not c.is_model_ready("no_such_model")
        md = c.get_model_metadata("resnet50_v2")
        assert md["inputs"] == [{"name": "data", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
        x = thttp.InferInput("data", [1, 3, 224, 224], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))  # binary extension
        r = c.infer("resnet50_v2", [x], parameters={"slo_ms": 100})
        out = r.as_numpy("output")
        assert out.shape == (1, 1000) and out.dtype == np.float32 and not out.any()
        x = thttp.InferInput("data", [3, 224, 224], "FP32")
        x.set_data_from_numpy(np.zeros((3, 224, 224), np.float32), binary_data=False)  # JSON
        r = c.infer("mobilenet_v2", [x], outputs=[thttp.InferRequestedOutput("output")],
                    timeout=200_000)
        assert r.as_numpy("output").shape == (1000,)
        with pytest.raises(InferenceServerException, match="unknown model"):
            c.infer("no_such_model", [x])
        bad = thttp.InferInput("data", [1, 3, 10, 10], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3, 10, 10), np.float32))
        with pytest.raises(InferenceServerException, match=r"shape \[1, 3, 10, 10\], expected"):
            c.infer("resnet50_v2", [bad])
    finally:
        c.close()


def test_tensors_in_shared_memory_are_refused(client, cluster):
    """Triton's shared-memory extension is not served: an input or a requested output
    placed in a region (``set_shared_memory`` of the stock clients, gRPC and REST) is
    refused INVALID_ARGUMENT / 400, saying so. Before, such an output was answered in the
    response as if it had not been (its client would read a region never written) and
    such an input was said to have no data."""
    thttp = pytest.importorskip("tritonclient.http")
    h = thttp.InferenceServerClient(_http_address(cluster), connection_timeout=TIMEOUT,
                                    network_timeout=TIMEOUT)
    try:
        for lib, c, code in ((tgrpc, client, "StatusCode.INVALID_ARGUMENT"), (thttp, h, "400")):
            x = lib.InferInput("data", [1, 3, 224, 224], "FP32")
            x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
            o = lib.InferRequestedOutput("output")
            o.set_shared_memory("no_such_region", 4000)
            with pytest.raises(InferenceServerException) as e:
                c.infer("resnet50_v2", [x], outputs=[o])
            assert e.value.status() == code, e.value
            assert "output 'output': parameter 'shared_memory_region'" in e.value.message()
            assert "no shared-memory extension" in e.value.message()
            y = lib.InferInput("data", [1, 3, 224, 224], "FP32")
            y.set_shared_memory("no_such_region", 602_112)
            with pytest.raises(InferenceServerException) as e:
                c.infer("resnet50_v2", [y])
            assert e.value.status() == code, e.value
            assert "input 'data': parameter 'shared_memory_region'" in e.value.message()
            assert "send the tensor in the request" in e.value.message()
            if lib is tgrpc:  # beside an input sent in the request (its raw contents only)
                with pytest.raises(InferenceServerException) as e:
                    c.infer("resnet50_v2", [x, y])
                assert "shared_memory_region" in e.value.message(), e.value
            assert c.infer("resnet50_v2", [x]).as_numpy("output").shape == (1, 1000)
    finally:
        h.close()


def test_unserved_extensions_are_named(client, cluster):
    """Triton's shared-memory, trace and logging calls (perf_analyzer's first calls with
    ``--shared-memory`` or ``--trace-*``) are refused saying which extension is not
    served: gRPC UNIMPLEMENTED, REST 404 (a bare "Method not found!" / "no route"
    before)."""
    thttp = pytest.importorskip("tritonclient.http")
    h = thttp.InferenceServerClient(_http_address(cluster), connection_timeout=TIMEOUT,
                                    network_timeout=TIMEOUT)
    calls = {
        "shared-memory": [
            lambda c: c.register_system_shared_memory("r", "/k", 64),
            lambda c: c.unregister_system_shared_memory(),
            lambda c: c.get_system_shared_memory_status(),
            lambda c: c.register_cuda_shared_memory("r", b"\0" * 64, 0, 64),
            lambda c: c.get_cuda_shared_memory_status()],
        "trace": [lambda c: c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}),
                  lambda c: c.get_trace_settings(model_name="resnet50_v2")],
        "logging": [lambda c: c.get_log_settings()],
    }
    try:
        for c, code in ((client, "StatusCode.UNIMPLEMENTED"), (h, "404")):
            for extension, each in calls.items():
                for call in each:
                    with pytest.raises(InferenceServerException) as e:
                        call(c)
                    assert e.value.status() == code, e.value
                    assert f"Triton's {extension} extension is not served" in str(e.value)
        # the served calls are unchanged beside them
        assert client.is_model_ready("resnet50_v2", client_timeout=TIMEOUT)
    finally:
        h.close()


def _get(url: str):
    """GET -> (status, JSON body or None), with the standard library."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    return status, (json.loads(body) if body else None)


def test_http_health_bodies(cluster):
    base = "http://" + _http_address(cluster)
    assert _get(base + "/v2/health/live") == (200, {"live": True})
    assert _get(base + "/v2/health/ready") == (200, {"ready": True})
    assert _get(base + "/v2/models/resnet50_v2/ready") == (200, {"name": "resnet50_v2",
                                                                 "ready": True})
    status, md = _get(base + "/v2")
    assert status == 200 and md["name"] == "clockwork"
    assert "binary_tensor_data" in md["extensions"]
    # (a client that looks for "parameters" before it sends slo_ms finds it, as on Triton)
    assert "parameters" in md["extensions"]


def test_model_config_http(cluster):
    thttp = pytest.importorskip("tritonclient.http")
    url = _http_address(cluster)
    c = thttp.InferenceServerClient(url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)
    try:
        cfg = c.get_model_config("mobilenet_v2")
        assert cfg["name"] == "mobilenet_v2" and cfg["max_batch_size"] == 16
        assert cfg["backend"] == "clockwork"
        assert cfg["input"] == [{"name": "data", "data_type": "TYPE_FP32",
                                 "format": "FORMAT_NONE", "dims": [3, 224, 224]}]
        assert cfg["output"][0]["dims"] == [1000]
        assert cfg["dynamic_batching"] == {}
        assert cfg["instance_group"] == [{"name": "mobilenet_v2", "kind": "KIND_GPU",
                                          "count": 1, "gpus": [0]}]
        _agrees(cfg, c.get_model_metadata("mobilenet_v2"))
        assert c.get_model_config("mobilenet_v2", "1") == cfg
        for call in (lambda: c.get_model_config("mobilenet_v2", "2"),
                     lambda: c.get_model_metadata("mobilenet_v2", "2"),
                     lambda: c.get_model_config("no_such_model")):
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "404", e.value
        x = thttp.InferInput("data", [1, 3, 224, 224], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
        with pytest.raises(InferenceServerException, match="no version '2'") as e:
            c.infer("mobilenet_v2", [x], model_version="2")
        assert e.value.status() == "404"
        assert not c.is_model_ready("mobilenet_v2", "2")
        assert c.infer("mobilenet_v2", [x], model_version="1").get_response()[
            "model_version"] == "1"
    finally:
        c.close()


def test_kserve_grpc_on_its_own_port(cluster):
    addr = cluster.printed_address("kserve grpc")
    assert addr != cluster.address
    c = tgrpc.InferenceServerClient(addr)
    try:
        assert c.is_server_ready(client_timeout=TIMEOUT)
        r = c.infer("mobilenet_v2", [_input()], client_timeout=TIMEOUT)
        assert r.as_numpy("output").shape == (1, 1000)
    finally:
        c.close()


_STATS_MESSAGES = r"""
from google.protobuf import json_format

from clockwork.protocol import kserve_pb2 as kpb
from controller.kserve import statistics_message

parts = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
         "cache_hit", "cache_miss")
stats = {"model_stats": [
    {"name": f"m{i}", "version": "1", "last_inference": 1_700_000_000_000 + i,
     "inference_count": 10 + i, "execution_count": 7 + i,
     "inference_stats": {p: {"count": i + k, "ns": 1000 * (i + k) + 2**40}
                         for k, p in enumerate(parts)},
     "batch_stats": [{"batch_size": b, "compute_input": {"count": b, "ns": 0},
                      "compute_infer": {"count": b + i, "ns": 5 * b + 2**35},
                      "compute_output": {"count": b, "ns": 1}} for b in (1, 4, 16)][:i]}
    for i in range(4)]}
got = statistics_message(stats)
assert got == json_format.ParseDict(stats, kpb.ModelStatisticsResponse()), got
last = json_format.MessageToDict(got, preserving_proto_field_name=True)["model_stats"][3]
assert last["batch_stats"][2]["compute_infer"] == {"count": "19", "ns": str(80 + 2**35)}, last
print("same")
"""


_REFUSED_CALLS = r"""
import asyncio, gc, tracemalloc, types
import grpc
from clockwork.protocol import kserve_pb2 as kpb
from controller.kserve import NOT_FOUND, KServeError, KServeGrpcServicer

node = types.SimpleNamespace(profiles={}, unloading=set(), count=lambda *a: None,
                             unknown_model=lambda n: f"unknown model {n!r}",
                             metrics=types.SimpleNamespace(reply=lambda *a: None),
                             log_refused=lambda *a, **k: None,
                             cfg=types.SimpleNamespace(default_slo=100_000_000),
                             model_state=lambda n: None)
sv = KServeGrpcServicer(node)

class Ctx:
    async def abort(self, code, details, trailer=()):
        self.code = code
        self.kept = err = grpc.aio.AbortError()  # (gRPC keeps it with the call: a cycle)
        raise err
    def done(self): return False
    def time_remaining(self): return None
    def peer(self): return "ipv4:127.0.0.1:1"

async def refused(call, req):  # (NOT_FOUND: the call aborted, as gRPC's server runs it)
    ctx = Ctx()
    try:
        await call(req, ctx)
    except grpc.aio.AbortError:
        pass
    assert ctx.code == grpc.StatusCode.NOT_FOUND, ctx.code

async def one(i):
    req = kpb.ModelInferRequest(model_name=f"nosuch{i}")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 150528])
    req.raw_input_contents.append(bytes(602112))
    await refused(sv.ModelInfer, req)

async def load(node, name, params):  # (an error raised while handling another)
    try:
        raise KeyError(name)
    except KeyError:
        raise KServeError(NOT_FOUND, "no such model") from None

sv._repository = lambda request: types.SimpleNamespace(load=load)

async def refused_load():
    req = kpb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["config"].string_param = "y" * 1_000_000
    await refused(sv.RepositoryModelLoad, req)

async def main():
    gc.disable()
    tracemalloc.start()
    await one(-1)
    await refused_load()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(30):
        await one(i)
    for _ in range(10):
        await refused_load()
    print(round((tracemalloc.get_traced_memory()[0] - base) / 1e6, 1))
asyncio.run(main())
"""


def test_a_refused_grpc_call_lets_go_of_its_request_at_once():
    """A KServe gRPC call refused (here 30 for an unknown model, each with a 600 KB input,
    and 10 repository loads of a 1 MB config refused with an error raised while handling
    another) holds nothing of its request once answered: gRPC keeps the abort's exception with the
    call, in a cycle through its traceback that only a full collection frees, and each
    kept its request (18 MB for these, ~260 MB swings under a stream of refusals). (In a
    process of its own: the KServe protos clash with tritonclient's, loaded here.)"""
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.run([sys.executable, "-c", _REFUSED_CALLS], capture_output=True,
                       text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert float(p.stdout.strip()) < 3.0, p.stdout  # MB held with no collection


def test_statistics_messages_are_their_json_forms_parsed():
    """The gRPC statistics are built field by field (json_format.ParseDict took 0.8 s for
    20,000 models): the same message as parsing the REST form, every field set. (In a
    process of its own: the KServe protos clash with tritonclient's, loaded here.)"""
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.run([sys.executable, "-c", _STATS_MESSAGES], capture_output=True,
                       text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0 and p.stdout.strip() == "same", p.stdout + p.stderr


def test_requests_that_do_not_decode_are_invalid_argument_not_a_failure_here(cluster):
    """A request whose bytes are not its message (a model name that is not UTF-8, bytes of
    nothing) is INVALID_ARGUMENT naming the message type, on KServe's and clockwork.v1's
    unary calls (gRPC's UNKNOWN with the decoder's exception text); on ModelStreamInfer an
    error response, the stream serving on (it ended INTERNAL, a traceback in the log);
    on clockwork.v1's InferStream the stream ends INVALID_ARGUMENT."""
    import grpc
    from tritonclient.grpc import service_pb2 as kpb

    good = kpb.ModelInferRequest(model_name="mobilenet_v2", id="ok", inputs=[
        kpb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32",
                                               shape=[1, 3, 224, 224])])
    good.raw_input_contents.append(np.zeros((1, 3, 224, 224), np.float32).tobytes())
    not_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (model_name), two bytes that are not UTF-8
    same = {"request_serializer": None, "response_deserializer": None}
    with grpc.insecure_channel(cluster.address) as ch:
        for method, kind in (("/inference.GRPCInferenceService/ModelInfer",
                              "inference.ModelInferRequest"),
                             ("/inference.GRPCInferenceService/ModelMetadata",
                              "inference.ModelMetadataRequest"),
                             ("/clockwork.v1.Clockwork/Infer", "clockwork.v1.InferRequest")):
            for data in (not_utf8, b"\xff" * 7):
                with pytest.raises(grpc.RpcError) as e:
                    ch.unary_unary(method, **same)(data, timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.value)
                assert f"not a message of type {kind}" in e.value.details(), e.value.details()
        stream = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", **same)
        got = [kpb.ModelStreamInferResponse.FromString(b) for b in stream(
            iter([not_utf8, good.SerializeToString(), b"\xff" * 7]), timeout=TIMEOUT)]
        assert len(got) == 3, got
        bad = [r for r in got if r.error_message]
        assert len(bad) == 2 and all(r.error_message.startswith("INVALID_ARGUMENT: malformed")
                                     for r in bad), bad
        assert [r.infer_response.id for r in got if not r.error_message] == ["ok"]
        v1 = ch.stream_stream("/clockwork.v1.Clockwork/InferStream", **same)
        with pytest.raises(grpc.RpcError) as e:
            list(v1(iter([b"\xff" * 7]), timeout=TIMEOUT))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value


def test_a_stream_errors_message_quotes_a_long_request_id_cut_short(cluster):
    """A stream error quotes its request's id in the message (tritonclient's callback sees
    the message alone): a 50,000-character id is cut there (the response's own id keeps
    it whole), so the message stays near gRPC's 2,000-byte status size (it was 52 KB)."""
    import grpc
    from tritonclient.grpc import service_pb2 as kpb
    from tritonclient.grpc import service_pb2_grpc as kpbg

    rid = "i" * 50_000
    r = kpb.ModelInferRequest(model_name="mobilenet_v2", id=rid, inputs=[
        kpb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32", shape=[7])])
    r.raw_input_contents.append(np.zeros(7, np.float32).tobytes())
    with grpc.insecure_channel(cluster.address) as ch:
        (got,) = kpbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(iter([r]), timeout=TIMEOUT)
    assert got.error_message.startswith("INVALID_ARGUMENT: [request id: iii")
    assert len(got.error_message) < 2500 and got.infer_response.id == rid
