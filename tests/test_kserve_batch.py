"""KServe v2 requests of several rows, driven by the stock clients (tritonclient grpc,
http and grpc.aio): 1 to ``max_batch_size`` rows (the profile's largest batch size), each
row a controller request, the outputs' rows in order; over the limit INVALID_ARGUMENT /
400; streaming; a request counted once and its rows as inferences (statistics and
/metrics, as Triton), every row in the connection's bound; the SLO cut to a
gRPC call's deadline; and every malformed request refused over REST and gRPC with a 4xx /
INVALID_ARGUMENT (never a 5xx), the next good request served."""

from __future__ import annotations

import asyncio
import json
import math
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("grpc")
tgrpc = pytest.importorskip("tritonclient.grpc")
thttp = pytest.importorskip("tritonclient.http")
aio = pytest.importorskip("tritonclient.grpc.aio")

import grpc  # noqa: E402
from tritonclient.grpc import service_pb2 as kpb  # noqa: E402 - tritonclient's messages
from tritonclient.grpc import service_pb2_grpc as kpbg  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.conftest import local_cluster  # noqa: E402

TIMEOUT = 10  # seconds, per client call
BATCH_SIZES = (1, 2, 4, 8)  # the profile of model "m"
MAX = max(BATCH_SIZES)  # its max_batch_size
IN, OUT = 64, 10  # its input and output row lengths
GLACIAL_S = 2.0  # "glacial": one EXEC takes this long
SLO = {"slo_ms": 5000}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiles")
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    for name, exec_ns, n_in, n_out in (
            ("m", {str(b): 100_000 * b for b in BATCH_SIZES}, IN, OUT),
            ("glacial", {"1": int(GLACIAL_S * 1e9)}, 4, 4)):
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": 1 << 20,
            "load_ns": 1_000_000, "exec_ns": exec_ns,
            "inputs": [{"name": "x", "shape": [n_in], "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": [n_out], "dtype": "float32"}]}))
    return d


@pytest.fixture(scope="module")
def cluster(profiles):
    # a connection may have MAX rows outstanding: a full batch fits, one more row does not
    with local_cluster(workers=1, gpus=1, profiles=str(profiles), models="m,glacial",
                       http_port=0, kserve_port=0,
                       controller_args=["--limit", f"connection_outstanding={MAX}"]) as c:
        yield c


@pytest.fixture()
def client(cluster):
    c = tgrpc.InferenceServerClient(cluster.address)
    try:
        yield c
    finally:
        c.close()


def _http(cluster) -> str:
    return cluster.printed_address("http")


def _rows(n: int | None, width: int = IN) -> np.ndarray:
    """``n`` distinct rows (None: one row without the batch dimension)."""
    x = np.arange((n or 1) * width, dtype=np.float32).reshape(n or 1, width) / 7
    return x if n is not None else x[0]


def _ginput(x: np.ndarray, name: str = "x"):
    t = tgrpc.InferInput(name, list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return t


def _hinput(x: np.ndarray, binary: bool = True):
    t = thttp.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=binary)
    return t


def _counts(client, cluster, model: str = "m") -> np.ndarray:
    """Triton's figures of ``model``: [successful requests, failed requests, inferences
    (rows of successful requests), successful requests in queue and compute, in the
    /metrics ``nv_inference_request_success`` and ``nv_inference_count``]."""
    from controller.metrics import parse_text

    s = client.get_inference_statistics(model, as_json=True, client_timeout=TIMEOUT)
    m = s["model_stats"][0]
    st = m.get("inference_stats", {})

    def count(k: str) -> int:
        return int(st.get(k, {}).get("count", 0))

    url = f"http://{_http(cluster)}/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        text = r.read().decode()
    samples = parse_text(text)
    prom = {name: v for name in ("nv_inference_request_success", "nv_inference_count")
            for lb, v in samples[name] if lb.get("model") == model}
    return np.array([count("success"), count("fail"), int(m.get("inference_count", 0)),
                     count("queue"), count("compute_infer"),
                     prom["nv_inference_request_success"], prom["nv_inference_count"]])


def _executions(client, model: str = "m") -> int:
    s = client.get_inference_statistics(model, as_json=True, client_timeout=TIMEOUT)
    return int(s["model_stats"][0].get("execution_count", 0))


def _successful(requests: int, rows: int) -> list[int]:
    """What ``_counts`` grows by for ``requests`` successful requests of ``rows`` rows
    in all."""
    return [requests, 0, rows, requests, requests, requests, rows]


# ---------------------------------------------------------------------- configuration


def test_config_says_what_inference_accepts(client, cluster):
    cfg = client.get_model_config("m", as_json=True, client_timeout=TIMEOUT)["config"]
    assert int(cfg["max_batch_size"]) == MAX
    assert cfg["parameters"]["execution_batch_sizes"]["string_value"] == \
        ",".join(map(str, BATCH_SIZES))
    md = client.get_model_metadata("m", as_json=True, client_timeout=TIMEOUT)
    assert [int(d) for d in md["inputs"][0]["shape"]] == [-1, IN]
    assert [int(d) for d in md["outputs"][0]["shape"]] == [-1, OUT]
    h = thttp.InferenceServerClient(_http(cluster), network_timeout=TIMEOUT)
    try:
        assert h.get_model_config("m")["max_batch_size"] == MAX
        assert h.get_model_metadata("m")["inputs"][0]["shape"] == [-1, IN]
    finally:
        h.close()


# ---------------------------------------------------------------------- batches


@pytest.mark.parametrize("n", [1, 2, MAX, None])
def test_batch_grpc(client, cluster, n):
    before, runs = _counts(client, cluster), _executions(client)
    r = client.infer("m", [_ginput(_rows(n))], parameters=SLO, client_timeout=TIMEOUT)
    out = r.as_numpy("y")
    assert out.shape == ((n, OUT) if n is not None else (OUT,)) and out.dtype == np.float32
    assert r.get_response().model_version == "1"
    # one request, its rows the inferences (as Triton counts a batched request), run in
    # one execution (its rows are queued together: the first no longer goes alone)
    assert list(_counts(client, cluster) - before) == _successful(1, n or 1)
    assert _executions(client) - runs == 1


@pytest.mark.parametrize("n", [1, 2, MAX, None])
@pytest.mark.parametrize("binary", [True, False])
def test_batch_http(cluster, client, n, binary):
    h = thttp.InferenceServerClient(_http(cluster), network_timeout=TIMEOUT)
    try:
        before = _counts(client, cluster)
        r = h.infer("m", [_hinput(_rows(n), binary)], parameters=SLO,
                    outputs=[thttp.InferRequestedOutput("y", binary_data=binary)])
        out = r.as_numpy("y")
        assert out.shape == ((n, OUT) if n is not None else (OUT,))
        assert list(_counts(client, cluster) - before) == _successful(1, n or 1)
    finally:
        h.close()


def test_batch_aio(cluster, client):
    sizes = (1, 2, MAX - 3)  # at once on one channel: MAX rows, its bound

    async def main():
        c = aio.InferenceServerClient(cluster.address)
        try:
            # several requests of several sizes at once: each answered with its own rows
            rs = await asyncio.gather(*(
                c.infer("m", [_ginput(_rows(n))], parameters=SLO, request_id=str(n),
                        client_timeout=TIMEOUT) for n in sizes))
            rs.append(await c.infer("m", [_ginput(_rows(MAX))], parameters=SLO,
                                    request_id=str(MAX), client_timeout=TIMEOUT))
            return [(r.get_response().id, r.as_numpy("y").shape) for r in rs]
        finally:
            await c.close()

    before = _counts(client, cluster)
    assert asyncio.run(main()) == [(str(n), (n, OUT)) for n in (*sizes, MAX)]
    assert list(_counts(client, cluster) - before) == _successful(len(sizes) + 1,
                                                                   sum(sizes) + MAX)


def test_over_max_batch_size(cluster, client):
    n = MAX + 1
    message = f"batch of {n} rows is over the model's max_batch_size {MAX}"
    with pytest.raises(InferenceServerException) as e:
        client.infer("m", [_ginput(_rows(n))], parameters=SLO, client_timeout=TIMEOUT)
    assert "INVALID_ARGUMENT" in e.value.status() and message in e.value.message()
    h = thttp.InferenceServerClient(_http(cluster), network_timeout=TIMEOUT)
    try:
        with pytest.raises(InferenceServerException) as e:
            h.infer("m", [_hinput(_rows(n))], parameters=SLO)
        assert e.value.status() == "400" and message in e.value.message()
    finally:
        h.close()

    async def main():
        c = aio.InferenceServerClient(cluster.address)
        try:
            with pytest.raises(InferenceServerException) as e:
                await c.infer("m", [_ginput(_rows(n))], client_timeout=TIMEOUT)
            return e.value
        finally:
            await c.close()

    err = asyncio.run(main())
    assert "INVALID_ARGUMENT" in err.status() and message in err.message()


def test_every_row_counts_in_the_connection_bound(cluster, client):
    """With ``connection_outstanding`` = MAX and one request (``glacial``, one EXEC of
    GLACIAL_S) outstanding on the channel, a request of MAX rows is shed at once
    (UNAVAILABLE): its rows count one each; MAX - 1 rows still fit. In Triton's figures
    the shed request is one failure."""
    from clockwork.client import AsyncClient

    async def main():
        c = aio.InferenceServerClient(cluster.address)
        try:
            async with AsyncClient(cluster.address) as cw:
                before = (await cw.stats()).get("requests", 0)
                slow = asyncio.ensure_future(c.infer(
                    "glacial", [_ginput(np.zeros((1, 4), np.float32))],
                    parameters={"slo_ms": 10_000}, client_timeout=TIMEOUT))
                # until the controller has admitted it (its request counter says so)
                while (await cw.stats()).get("requests", 0) == before:
                    assert not slow.done(), slow.result()
            with pytest.raises(InferenceServerException) as e:
                await c.infer("m", [_ginput(_rows(MAX))], parameters=SLO,
                              client_timeout=TIMEOUT)
            fits = await c.infer("m", [_ginput(_rows(MAX - 1))], parameters=SLO,
                                 client_timeout=TIMEOUT)
            await slow
            return e.value, fits.as_numpy("y").shape
        finally:
            await c.close()

    before = _counts(client, cluster)
    err, shape = asyncio.run(main())
    assert "UNAVAILABLE" in err.status(), err
    assert "connection_outstanding" in err.message()
    assert shape == (MAX - 1, OUT)
    assert list(_counts(client, cluster) - before) == [1, 1, MAX - 1, 1, 1, 1, MAX - 1]


def test_slo_cut_to_the_call_deadline(client):
    """An SLO of 10 s on a call with a 1 s deadline, for a model whose EXEC takes 2 s: the
    controller turns it away at once (TIMEOUT: the SLO cannot be met), rather than run it
    past the client's deadline; with a 6 s deadline it runs."""
    x = [_ginput(np.zeros((1, 4), np.float32))]
    with pytest.raises(InferenceServerException) as e:
        client.infer("glacial", x, parameters={"slo_ms": 10_000}, client_timeout=GLACIAL_S / 2)
    assert "DEADLINE_EXCEEDED" in e.value.status()
    assert e.value.message().startswith("TIMEOUT"), e.value.message()  # the server's answer
    # (the call's deadline, not the SLO, made it too late: said, as clockwork.v1 says it;
    # it was told "SLO cannot be met", its 10 s SLO feasible)
    assert "within the call's deadline" in e.value.message(), e.value.message()
    assert "give the client a longer timeout" in e.value.message()
    r = client.infer("glacial", x, parameters={"slo_ms": 10_000}, client_timeout=3 * GLACIAL_S)
    assert r.as_numpy("y").shape == (1, 4)


# ---------------------------------------------------------------------- streaming


def test_stream_batches(cluster, client):
    """ModelStreamInfer: one response per request with all its rows; a request over
    max_batch_size is answered INVALID_ARGUMENT and the stream goes on. One request at a
    time (the connection bound is MAX rows). Each request counts once in Triton's
    figures, its rows as inferences."""
    before = _counts(client, cluster)
    c = tgrpc.InferenceServerClient(cluster.address)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for n in (1, 3, MAX, None, MAX + 1, 2):
            c.async_stream_infer("m", [_ginput(_rows(n))], request_id=f"r{n}",
                                 parameters=SLO)
            result, error = got.get(timeout=TIMEOUT)
            if n is not None and n > MAX:
                assert result is None and "INVALID_ARGUMENT" in str(error)
                assert f"over the model's max_batch_size {MAX}" in str(error)
                continue
            assert error is None, error
            assert result.get_response().id == f"r{n}"
            assert result.as_numpy("y").shape == ((n, OUT) if n else (OUT,))
    finally:
        c.stop_stream()
        c.close()
    rows = 1 + 3 + MAX + 1 + 2  # (the request over max_batch_size: one failure)
    assert list(_counts(client, cluster) - before) == [5, 1, rows, 5, 5, 5, rows]


def test_stream_batches_aio(cluster):
    async def main():
        c = aio.InferenceServerClient(cluster.address)

        async def requests():
            for n in (2, MAX - 2):  # at once: MAX rows, the connection's bound
                yield {"model_name": "m", "inputs": [_ginput(_rows(n))],
                       "request_id": str(n), "parameters": SLO}

        try:
            out = {}
            async for result, error in c.stream_infer(requests(), stream_timeout=TIMEOUT):
                assert error is None, str(error)
                out[result.get_response().id] = result.as_numpy("y").shape
                if len(out) == 2:
                    break
            return out
        finally:
            await c.close()

    assert asyncio.run(main()) == {"2": (2, OUT), str(MAX - 2): (MAX - 2, OUT)}


# ---------------------------------------------------------------------- rows in order


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory, cpu_package):
    """A cpu worker running the zoo's mlp (outputs depend on inputs). Needs TVM."""
    from clockwork.models.package import read_package, reference_weights

    root = tmp_path_factory.mktemp("cpu-packages")
    cpu_package("mlp", root)
    meta = read_package(root / "mlp")
    with local_cluster(workers=1, gpus=1, profiles="cpu", models="mlp", device="cpu",
                       packages=str(root), http_port=0) as c:
        yield c, reference_weights(meta, root / "mlp")


def test_rows_in_order(real_cluster):
    """Each output row is its own input row's, over gRPC, REST and grpc.aio (a real
    model; rows of one request may run in different batches)."""
    from clockwork.models.zoo import get_model

    cluster, weights = real_cluster
    model = get_model("mlp")
    rng = np.random.default_rng(5)

    def check(x, y):
        np.testing.assert_allclose(y, model.reference(x, weights), rtol=1e-4, atol=1e-4)

    c = tgrpc.InferenceServerClient(cluster.address)
    h = thttp.InferenceServerClient(_http(cluster), network_timeout=TIMEOUT)
    try:
        cfg = c.get_model_config("mlp", as_json=True, client_timeout=TIMEOUT)["config"]
        limit = int(cfg["max_batch_size"])
        for n in (1, 3, limit):
            x = rng.standard_normal((n, 64)).astype(np.float32)
            check(x, c.infer("mlp", [_ginput(x)], parameters=SLO,
                             client_timeout=TIMEOUT).as_numpy("output"))
            check(x, h.infer("mlp", [_hinput(x)], parameters=SLO).as_numpy("output"))
            check(x, h.infer("mlp", [_hinput(x, binary=False)],
                             parameters=SLO).as_numpy("output"))
    finally:
        c.close()
        h.close()

    xs = [rng.standard_normal((n, 64)).astype(np.float32) for n in (2, 5, limit)]

    async def main():
        a = aio.InferenceServerClient(cluster.address)
        try:
            return await asyncio.gather(*(a.infer("mlp", [_ginput(x)], parameters=SLO,
                                                  client_timeout=TIMEOUT) for x in xs))
        finally:
            await a.close()

    for x, r in zip(xs, asyncio.run(main()), strict=True):
        check(x, r.as_numpy("output"))


# ---------------------------------------------------------------------- malformed: REST


def _post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return status, json.loads(raw)


def _good(**over) -> dict:
    t = {"name": "x", "datatype": "FP32", "shape": [2, IN], "data": _rows(2).ravel().tolist()}
    t.update(over)
    return {"inputs": [t]}


def _binary(size, shape=(1, IN), extra: bytes = b"", **params):
    """A REST body: JSON header, then ``size`` bytes of binary data (and ``extra``)."""
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(shape),
                                   "parameters": {"binary_data_size": size, **params}}]})
    n = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0
    return head.encode(), bytes(n) + extra


# (what, body, a piece of the error message naming the field / value)
REST_BAD = [
    ("no inputs", {"inputs": []}, "needs input(s) ['x']"),
    ("inputs missing", {"parameters": {}}, "'inputs' list"),
    ("inputs not a list", {"inputs": {"name": "x"}}, "'inputs' list"),
    ("input not an object", {"inputs": ["x"]}, "each of 'inputs' must be an object"),
    ("unknown input", _good(name="z"), "no input 'z'"),
    ("input twice", {"inputs": _good()["inputs"] * 2}, "input 'x' given twice"),
    ("input name not a string", _good(name=7), "non-empty string 'name'"),
    ("datatype mismatch", _good(datatype="FP64"), "datatype FP64, expected FP32"),
    ("unknown datatype", _good(datatype="FLOAT"), "unsupported datatype 'FLOAT'"),
    ("BYTES", _good(datatype="BYTES"), "unsupported datatype 'BYTES'"),
    ("too few elements", _good(data=[0.0] * (2 * IN - 1)), f"{2 * IN - 1} elements"),
    ("too many elements", _good(data=[0.0] * (2 * IN + 1)), f"{2 * IN + 1} elements"),
    ("null element", _good(data=[None] + [0.0] * (2 * IN - 1)), "'data' holds null"),
    ("string element", _good(data=["1"] + [0.0] * (2 * IN - 1)), "'data' holds '1'"),
    ("ragged nesting", _good(data=[[0.0] * IN, [0.0] * (IN - 1)]), "nested lists of equal"),
    ("bool elements", _good(data=[True] * (2 * IN)), "FP32 'data' must be numbers"),
    ("data not a list", _good(data=1.5), "'data' must be a list"),
    ("no data", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN]}]},
     "has no data"),
    ("negative shape", _good(shape=[-2, IN]), "'shape' must be a list of non-negative"),
    ("float shape", _good(shape=[2.0, IN]), "'shape' must be a list of non-negative"),
    ("string shape", _good(shape=["2", IN]), "'shape' must be a list of non-negative"),
    ("bool shape", _good(shape=[True, IN]), "'shape' must be a list of non-negative"),
    ("shape not a list", _good(shape=2), "'shape' must be a list of non-negative"),
    ("wrong shape", _good(shape=[2, IN // 2, 2]), "expected [n, 64]"),
    ("zero rows", _good(shape=[0, IN], data=[]), "a batch of 0 rows"),
    ("over max_batch_size", _good(shape=[MAX + 1, IN], data=[0.0] * ((MAX + 1) * IN)),
     f"over the model's max_batch_size {MAX}"),
    ("slo_ms true", {**_good(), "parameters": {"slo_ms": True}}, "'slo_ms' must be a finite"),
    ("slo_ms string", {**_good(), "parameters": {"slo_ms": "100"}}, "got '100'"),
    ("slo_ms negative", {**_good(), "parameters": {"slo_ms": -1}}, "got -1.0"),
    ("slo_ms object", {**_good(), "parameters": {"slo_ms": {}}}, "'slo_ms' must be a finite"),
    ("timeout true", {**_good(), "parameters": {"timeout": True}}, "'timeout' must be a finite"),
    ("timeout null", {**_good(), "parameters": {"timeout": None}}, "'timeout' must be a finite"),
    ("parameters a list", {**_good(), "parameters": [1]}, "'parameters' must be an object"),
    ("parameters a string", {**_good(), "parameters": "x"}, "'parameters' must be an object"),
    ("input parameters a list", _good(parameters=[1]), "'parameters' must be an object"),
    ("outputs not a list", {**_good(), "outputs": {"name": "y"}}, "'outputs' must be a list"),
    ("output not an object", {**_good(), "outputs": ["y"]}, "must be an object with a 'name'"),
    ("output name a number", {**_good(), "outputs": [{"name": 5}]}, "non-empty string 'name'"),
    ("unknown output", {**_good(), "outputs": [{"name": "z"}]}, "no output 'z'"),
    ("output twice", {**_good(), "outputs": [{"name": "y"}] * 2}, "output 'y' requested twice"),
    ("binary_data not a bool", {**_good(), "outputs": [{"name": "y", "parameters": {
        "binary_data": "yes"}}]}, "'binary_data' must be true or false"),
    ("id a number", {**_good(), "id": 42}, "'id' must be a string"),
    ("data and binary", _good(parameters={"binary_data_size": 0}), "both 'data' and"),
]
REST_BAD_BINARY = [
    ("binary_data_size negative", _binary(-1), "'binary_data_size' must be a non-negative"),
    ("binary_data_size a string", _binary("256"), "'binary_data_size' must be a non-negative"),
    ("binary_data_size true", _binary(True), "'binary_data_size' must be a non-negative"),
    ("binary_data_size a float", _binary(256.0), "'binary_data_size' must be a non-negative"),
    ("binary_data_size over the body", (_binary(4 * IN)[0], bytes(10)), "more than the 10"),
    ("binary data of the wrong size", _binary(4 * IN - 4), f"{4 * IN - 4} bytes of data"),
    ("binary data left over", _binary(4 * IN, extra=b"1234"), "add up to 256"),
]


def _binary_post(url: str, head: bytes, tail: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, head + tail, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head))})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return status, json.loads(raw)  # (a 200 too: the outputs are JSON unless asked)


def test_malformed_rest(cluster):
    base = f"http://{_http(cluster)}/v2/models/m"
    for what, body, says in REST_BAD:
        status, resp = _post(base + "/infer", body)
        assert status == 400, (what, status, resp)
        assert isinstance(resp.get("error"), str) and says in resp["error"], (what, resp)
        assert set(resp) == {"error"}, what
    for what, (head, tail), says in REST_BAD_BINARY:
        status, resp = _binary_post(base + "/infer", head, tail)
        assert status == 400, (what, status, resp)
        assert says in resp["error"], (what, resp)
    # non-finite SLOs (Python's json writes and reads NaN / Infinity)
    for v in (math.nan, math.inf):
        status, resp = _post(base + "/infer", {**_good(), "parameters": {"slo_ms": v}})
        assert status == 400 and "'slo_ms' must be a finite number" in resp["error"], resp
    status, resp = _post(base + "/versions/2/infer", _good())
    assert status == 404 and "no version '2'" in resp["error"]
    # then good requests: nested data, a flat list, binary data
    nested = _good(data=_rows(2).tolist())
    for body in (nested, _good()):
        status, resp = _post(base + "/infer", {**body, "id": "ok", "parameters": SLO})
        assert status == 200, resp
        assert resp["id"] == "ok" and resp["outputs"][0]["shape"] == [2, OUT]
    status, _ = _binary_post(base + "/infer", *_binary(4 * IN))
    assert status == 200


# ---------------------------------------------------------------------- malformed: gRPC


def _req(n=2, raw=True, **over) -> kpb.ModelInferRequest:
    r = kpb.ModelInferRequest(model_name="m", id="g")
    t = r.inputs.add(name="x", datatype="FP32", shape=[n, IN])
    x = _rows(n) if n else np.zeros((0, IN), np.float32)
    if raw:
        r.raw_input_contents.append(x.tobytes())
    else:
        t.contents.fp32_contents.extend(x.ravel().tolist())
    for k, v in over.items():
        setattr(r, k, v)
    return r


def _grpc_bad():
    """(what, request, status, a piece of the message)."""
    out = []

    def case(what, r, says, code=grpc.StatusCode.INVALID_ARGUMENT):
        out.append((what, r, code, says))

    r = _req()
    del r.inputs[:]
    del r.raw_input_contents[:]
    case("no inputs", r, "needs input(s) ['x']")
    r = _req()
    r.inputs[0].contents.fp32_contents.extend([0.0] * 2 * IN)
    case("raw and typed contents", r, "send one or the other")
    r = _req()
    r.raw_input_contents.append(b"")
    case("raw count", r, "2 raw_input_contents for 1 inputs")
    r = _req(raw=False)
    r.inputs[0].contents.fp32_contents.append(0.0)
    case("typed count", r, f"{2 * IN + 1} elements in contents.fp32_contents")
    r = _req(raw=False)
    r.inputs[0].contents.int_contents.append(1)
    case("typed contents in another field", r, "carries int_contents")
    r = _req(raw=False)
    r.inputs[0].ClearField("contents")
    case("no data", r, "has no data")
    r = _req()
    r.inputs[0].datatype = "FP64"
    r.raw_input_contents[0] = _rows(2).astype(np.float64).tobytes()
    case("datatype mismatch", r, "datatype FP64, expected FP32")
    r = _req()
    r.inputs[0].datatype = "BYTES"
    case("BYTES", r, "unsupported datatype 'BYTES'")
    r = _req()
    r.raw_input_contents[0] = r.raw_input_contents[0][:-4]
    case("raw size", r, f"{8 * IN - 4} bytes of data, expected {8 * IN}")
    r = _req()
    r.inputs[0].shape[0] = -2
    case("negative shape", r, "'shape' must be a list of non-negative")
    r = _req()
    r.inputs.add(name="x", datatype="FP32", shape=[2, IN])
    r.raw_input_contents.append(_rows(2).tobytes())
    case("input twice", r, "input 'x' given twice")
    r = _req()
    r.inputs[0].name = ""
    case("empty input name", r, "non-empty string 'name'")
    r = _req(n=MAX + 1)
    case("over max_batch_size", r, f"batch of {MAX + 1} rows is over the model's "
                                   f"max_batch_size {MAX}")
    r = _req(n=0)
    case("zero rows", r, "a batch of 0 rows")
    for key, field, value, says in (
            ("slo_ms", "bool_param", True, "'slo_ms' must be a finite"),
            ("slo_ms", "string_param", "100", "got '100'"),
            ("slo_ms", "double_param", -1.0, "got -1.0"),
            ("slo_ms", "double_param", math.nan, "got nan"),
            ("slo_ms", "double_param", math.inf, "got inf"),
            ("timeout", "bool_param", True, "'timeout' must be a finite"),
            ("timeout", "int64_param", -5, "got -5")):
        r = _req()
        setattr(r.parameters[key], field, value)
        case(f"{key} {field} {value}", r, says)
    r = _req()
    r.parameters["slo_ms"].CopyFrom(kpb.InferParameter())  # none of its fields set
    case("slo_ms unset", r, "got null")
    r = _req()
    r.outputs.add(name="z")
    case("unknown output", r, "no output 'z'")
    r = _req()
    r.outputs.add(name="y")
    r.outputs.add(name="y")
    case("output twice", r, "output 'y' requested twice")
    r = _req()
    r.outputs.add(name="y").parameters["classification"].int64_param = 3
    case("classification", r, "'classification' is not supported")
    case("unknown version", _req(model_version="2"), "no version '2'",
         grpc.StatusCode.NOT_FOUND)
    return out


def test_malformed_grpc(cluster):
    with grpc.insecure_channel(cluster.address) as ch:
        stub = kpbg.GRPCInferenceServiceStub(ch)
        for what, r, code, says in _grpc_bad():
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(r, timeout=TIMEOUT)
            assert e.value.code() == code, (what, e.value.code(), e.value.details())
            assert says in e.value.details(), (what, e.value.details())
        # the same requests on one stream: each answered with its error, the stream goes on
        bad = _grpc_bad()
        good = _req(raw=False, id="good")
        good.parameters["slo_ms"].int64_param = 5000
        answers = list(stub.ModelStreamInfer(iter([r for _, r, _, _ in bad] + [good]),
                                             timeout=TIMEOUT))
        assert len(answers) == len(bad) + 1
        errors = [a.error_message for a in answers if a.error_message]
        assert len(errors) == len(bad), errors
        for (what, _, code, says), e in zip(bad, errors, strict=True):
            assert e.startswith(code.name + ": ") and says in e, (what, e)
        ok = [a for a in answers if not a.error_message]
        assert ok[0].infer_response.id == "good"
        # then good requests: typed contents, raw contents, no batch dimension
        for r in (_req(raw=False), _req(), _req(n=MAX)):
            resp = stub.ModelInfer(r, timeout=TIMEOUT)
            assert list(resp.outputs[0].shape) == [r.inputs[0].shape[0], OUT]
            assert len(resp.raw_output_contents[0]) == r.inputs[0].shape[0] * OUT * 4
        r = _req(n=1)
        r.inputs[0].shape[:] = [IN]
        assert list(stub.ModelInfer(r, timeout=TIMEOUT).outputs[0].shape) == [OUT]
