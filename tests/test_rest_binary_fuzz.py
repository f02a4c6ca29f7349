"""The KServe v2 REST inference path with binary bodies (Triton's binary tensor data
extension: a JSON header, then the tensors' raw bytes, ``Inference-Header-Content-Length``
saying where the header ends, ``binary_data_size`` on inputs, ``binary_data`` and
``binary_data_output`` for outputs), fuzzed with Hypothesis against a live controller over
real HTTP on loopback. tests/test_rest_schemathesis.py fuzzes the JSON bodies; this file
fuzzes what schemathesis cannot describe: the bytes after the header, the header's length,
the transfer (Content-Length or chunked) and the body's Content-Encoding.

The cluster serves two models whose metadata (``GET /v2/models/M``, ``max_batch_size``
from ``/config``) drives the generation: ``mixed`` has an input of every datatype the
extension carries as raw bytes (BOOL, the eight integer types, FP16, FP32, FP64) and
outputs of five datatypes; ``image`` one UINT8 input, as an image model has.

- Valid requests: stock ``tritonclient.http`` makes the body
  (``InferInput.set_data_from_numpy`` with ``binary_data`` true or false per input,
  ``InferenceServerClient.generate_request_body``): one row without the batch dimension
  or 1 to ``max_batch_size`` rows, any values, inputs in any order, binary and JSON inputs
  mixed; outputs all (``binary_data_output`` true, false or absent) or some, each with
  ``binary_data`` true, false or absent; an optional id. Sent plain, gzip or deflate,
  with Content-Length or chunked, asking for a compressed answer or not. Each must be
  answered 200 with every output asked for, of the metadata's datatype and shape, binary
  where asked (the ``binary_data_size``\\ s adding up to the bytes after the header) and
  zeros (an emulated cluster answers zeros), as tritonclient's own parser reads it too.
- Broken requests (one test per kind of breakage, ``KINDS``, so that each is tried as
  often): the same requests with one thing broken: the header length (malformed,
  negative, huge, beyond the body, off by some bytes, missing), a ``binary_data_size``
  (another number, a sum that wraps 64 bits, not an integer), bytes missing or extra,
  another datatype or shape, a BYTES tensor (with good or bad length prefixes: the
  controller serves no BYTES input), data both ways or none, an input twice, an output's
  ``binary_data`` not a bool, a garbage header, a Content-Encoding that lies or is not
  served, a gzip/deflate body cut short or with bytes after it, a body over
  ``rest_max_body_bytes`` (as sent, or once decoded). Each must be answered 400 (413 for
  the size bound) with the protocol's ``{"error": "..."}`` naming the problem. A few
  breakages may leave a request valid (a byte flipped in the JSON header or in the
  compressed data): those are answered 200 consistently with the metadata, or refused.

Always: every request is answered (no dropped connection, no answer later than
``TIMEOUT_S``: a hang fails), never 5xx, no traceback in the controller's output, and
``/v2/health/ready`` answers ready after each. The defects the fuzzing found are tested
on their own too ("defects found"). Runs derandomized (no example database): the same
examples every run, about 15 s here (a third of it starting the cluster).
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

thttp = pytest.importorskip("tritonclient.http")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from tests.conftest import local_cluster  # noqa: E402

KiB = 1 << 10
BODY_LIMIT = 256 * KiB  # rest_max_body_bytes of the cluster
OFFLOAD = 2 * KiB  # rest_json_offload_bytes: larger JSON headers are read off the loop
TIMEOUT_S = 10.0  # no answer within this is a hang
NP = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
      "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
      "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
DATATYPES = [*NP, "BYTES"]
# the served models: (name, shape, numpy dtype) of inputs and outputs, batch sizes
MODELS = {
    "mixed": ([("b", [3], "bool"), ("u8", [2, 2], "uint8"), ("u16", [3], "uint16"),
               ("u32", [2], "uint32"), ("u64", [2], "uint64"), ("i8", [5], "int8"),
               ("i16", [3], "int16"), ("i32", [2], "int32"), ("i64", [2], "int64"),
               ("f16", [4], "float16"), ("f32", [2, 3], "float32"), ("f64", [2], "float64")],
              [("y", [7], "float32"), ("yi", [3], "int64"), ("yb", [2], "bool"),
               ("yh", [5], "float16"), ("yu", [4], "uint8")], (1, 2, 4, 8)),
    "image": ([("x", [3, 4, 4], "uint8")], [("probs", [10], "float32"), ("label", [1], "int32")],
              (1, 2, 4, 8, 16)),
}
SLO = {"slo_ms": 60_000}  # generous: a busy machine must not turn a valid request into a 504
SETTINGS = settings(
    derandomize=True, database=None, deadline=None, print_blob=False,
    # each example is a few HTTP requests to a live server
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example])
# what must never appear in the controller's output
TRACEBACK = re.compile(r"Traceback|Unhandled exception|Error handling request")


@dataclass(frozen=True)
class Meta:
    """A served model as its metadata says: (name, datatype, dims without the batch
    dimension) of each input and output, ``max_batch_size``."""

    name: str
    inputs: tuple
    outputs: tuple
    max_batch: int


# ---------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("profiles")
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    for name, (ins, outs, batches) in MODELS.items():
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": 1 << 20, "load_ns": 2_000_000,
            "exec_ns": {str(b): 200_000 + 20_000 * b for b in batches},
            "inputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in ins],
            "outputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in outs]}))
    return d


class Server:
    """The live controller: its REST address, the models' metadata, one keep-alive
    connection for requests and one for the readiness probe, and what of the
    controller's output has been looked at."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        host, port = cluster.printed_address("http").rsplit(":", 1)
        self.addr = (host, int(port))
        self.conn: http.client.HTTPConnection | None = None
        self.probe = http.client.HTTPConnection(*self.addr, timeout=TIMEOUT_S)
        self.seen = 0
        self.metas = [self._meta(name) for name in MODELS]

    def _meta(self, name: str) -> Meta:
        status, _, body = self.request("GET", f"/v2/models/{name}")
        assert status == 200, body
        md = json.loads(body)
        status, _, body = self.request("GET", f"/v2/models/{name}/config")
        assert status == 200, body

        def tensors(key):
            out = []
            for t in md[key]:
                assert t["shape"][0] == -1, t  # the batch dimension
                out.append((t["name"], t["datatype"], tuple(t["shape"][1:])))
            return tuple(out)

        return Meta(name, tensors("inputs"), tensors("outputs"),
                    json.loads(body)["max_batch_size"])

    def request(self, method: str, path: str, body=None, headers=None,
                chunked: bool = False) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request on the keep-alive connection (a new one after the server closed
        it) -> (status, headers, body as received). A connection that breaks, or no answer
        within ``TIMEOUT_S``, fails the test."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(*self.addr, timeout=TIMEOUT_S)
        try:
            self.conn.request(method, path, body, headers or {}, encode_chunked=chunked)
            r = self.conn.getresponse()
            got = r.read()
        except (OSError, http.client.HTTPException) as e:  # TimeoutError is an OSError
            self.conn.close()
            self.conn = None
            raise AssertionError(f"no answer to {method} {path}: {e!r}") from None
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return r.status, r.headers, got

    def healthy(self) -> None:
        """Ready, and nothing like a traceback printed since the last look."""
        self.probe.request("GET", "/v2/health/ready")
        r = self.probe.getresponse()
        assert (r.status, json.loads(r.read())) == (200, {"ready": True})
        self.quiet()

    def quiet(self) -> None:
        lines = self.cluster.controller.output
        new, self.seen = lines[self.seen:], len(lines)
        bad = [line for line in new if TRACEBACK.search(line)]
        assert not bad, "the controller printed:\n" + "".join(new)

    def close(self) -> None:
        for c in (self.conn, self.probe):
            if c is not None:
                c.close()


@pytest.fixture(scope="module")
def server(profiles):
    limits = (f"rest_max_body_bytes={BODY_LIMIT}", f"rest_json_offload_bytes={OFFLOAD}")
    with local_cluster(workers=1, gpus=1, profiles=str(profiles), http_port=0,
                       controller_args=[x for lim in limits for x in ("--limit", lim)]) as c:
        s = Server(c)
        yield s
        s.close()
        time.sleep(0.2)  # (the output is read by a thread)
        s.quiet()


# ---------------------------------------------------------------------- answers


def _split(headers, body: bytes) -> tuple[dict, bytes]:
    """An answer's JSON header and the binary data after it."""
    hlen = headers.get("Inference-Header-Content-Length")
    if hlen is None:
        assert headers["Content-Type"] == "application/json", headers
        return json.loads(body), b""
    assert headers["Content-Type"] == "application/octet-stream", headers
    n = int(hlen)
    assert 0 < n <= len(body), (hlen, len(body))
    return json.loads(body[:n]), body[n:]


def _itemsize(datatype: str) -> int:
    return np.dtype(NP[datatype]).itemsize


def check_consistent(meta: Meta, status: int, headers, body: bytes) -> dict:
    """A 200 answer that agrees with the metadata: known outputs, each once, the
    metadata's datatype, its shape with the same rows for all (1 to max_batch_size, or no
    batch dimension), binary sizes that are the shapes' and add up to the binary data
    after the header, JSON data of the shape's elements. -> the JSON header."""
    assert status == 200, body[:300]
    got, extra = _split(headers, body)
    assert got["model_name"] == meta.name and got["model_version"] == "1", got
    spec = {n: (dt, dims) for n, dt, dims in meta.outputs}
    forms, pos = set(), 0
    names = [o["name"] for o in got["outputs"]]
    assert len(set(names)) == len(names) and set(names) <= set(spec), names
    for o in got["outputs"]:
        datatype, dims = spec[o["name"]]
        assert o["datatype"] == datatype, o
        shape = tuple(o["shape"])
        assert shape[-len(dims):] == dims and len(shape) - len(dims) in (0, 1), o
        forms.add(shape[:-len(dims)])
        count = int(np.prod(shape))
        if "parameters" in o and "binary_data_size" in o["parameters"]:
            size = o["parameters"]["binary_data_size"]
            assert "data" not in o and size == count * _itemsize(datatype), o
            pos += size
        else:
            assert len(np.asarray(o["data"]).reshape(-1)) == count, o
    assert pos == len(extra), (pos, len(extra))
    assert len(forms) == 1, forms
    (form,) = forms
    assert form == () or 1 <= form[0] <= meta.max_batch, form
    return got


def check_valid(req: Request, status: int, headers, body: bytes) -> None:
    """The answer to a valid request: 200 with exactly the outputs asked for, of the
    request's rows, binary as asked, zeros (an emulated cluster's); tritonclient's parser
    reads the same."""
    meta = req.meta
    got = check_consistent(meta, status, headers, body)
    want = req.expected_outputs()
    assert {o["name"] for o in got["outputs"]} == set(want), (got, want)
    assert got.get("id") == req.header.get("id"), got
    spec = {n: dims for n, _, dims in meta.outputs}
    _, extra = _split(headers, body)
    pos = 0
    for o in got["outputs"]:
        assert o["shape"] == ([req.rows] if req.rows else []) + list(spec[o["name"]]), o
        if want[o["name"]]:
            size = o["parameters"]["binary_data_size"]
            assert extra[pos:pos + size] == bytes(size), o  # zeros
            pos += size
        else:
            assert "parameters" not in o, o
            assert not np.asarray(o["data"]).any(), o
    hlen = headers.get("Inference-Header-Content-Length")
    result = thttp.InferenceServerClient.parse_response_body(
        body, header_length=int(hlen) if hlen else None)
    for o in got["outputs"]:
        arr = result.as_numpy(o["name"])
        assert arr.shape == tuple(o["shape"]) and arr.dtype == NP[o["datatype"]], o
        assert not arr.any()


def check_refused(status: int, headers, body: bytes, want: int, says: tuple[str, ...]) -> None:
    """A refusal: ``want`` with the protocol's ``{"error": "..."}``, the message naming
    the problem (one of ``says``, in any case; none: any message), not echoing much."""
    assert status == want, (status, body[:300])
    assert headers["Content-Type"] == "application/json", (headers, body[:300])
    err = json.loads(body)
    assert isinstance(err, dict) and isinstance(err.get("error"), str) and err["error"], err
    msg = err["error"]
    assert not says or any(s.lower() in msg.lower() for s in says), (says, msg)
    assert len(msg) < 1000, msg


# ---------------------------------------------------------------------- defects found
# (found by the fuzzing, each reproduced here on its own; each test failed before its fix)

IMAGE = "/v2/models/image/infer"


def _image_body() -> tuple[bytes, dict]:
    """A valid binary request of ``image`` (2 rows), made by tritonclient: the body and its
    Inference-Header-Content-Length header."""
    x = thttp.InferInput("x", [2, 3, 4, 4], "UINT8")
    x.set_data_from_numpy(np.arange(96, dtype=np.uint8).reshape(2, 3, 4, 4))
    body, n = thttp.InferenceServerClient.generate_request_body([x], parameters=dict(SLO))
    return body, {"Inference-Header-Content-Length": str(n)}


def _image_ok(server: Server, answer) -> None:
    (meta,) = [m for m in server.metas if m.name == "image"]
    got = check_consistent(meta, *answer)
    assert [o["shape"][0] for o in got["outputs"]] == [2, 2], got


def test_header_length_is_ascii_digits(server):
    """Inference-Header-Content-Length is a length in ASCII digits, as HTTP's
    Content-Length; anything else is refused 400 naming it. Python's int() read "+N", N
    with an underscore in it ("15_6" as 156) and other scripts' digits (fullwidth
    "１５６"), so such requests were served as if the header said N; an empty value was
    taken as no header at all."""
    body, headers = _image_body()
    n = headers["Inference-Header-Content-Length"]
    fullwidth = "".join(chr(0xFF10 + int(d)) for d in n).encode()  # (sent as UTF-8)
    for value in (f"+{n}", f"{n[:-1]}_{n[-1]}", fullwidth, ""):
        answer = server.request("POST", IMAGE, body, {"Inference-Header-Content-Length": value})
        check_refused(*answer, 400, ("Inference-Header-Content-Length",))
    _image_ok(server, server.request("POST", IMAGE, body, headers))
    server.healthy()


def test_content_encodings_not_served_are_refused(server):
    """A body in a Content-Encoding other than gzip (or x-gzip, the same), deflate or
    identity (any case), or in several, is refused 415 naming it, with the codings served
    in Accept-Encoding, as Triton and HTTP answer. aiohttp passes any name but gzip,
    deflate, br and zstd through undecoded: a body that said "foo" or "gzip, gzip" was
    served as if it said nothing. (br and zstd: the next test.)"""
    body, headers = _image_body()
    for enc in ("foo", "gzip, gzip", "compress"):
        answer = server.request("POST", IMAGE, body, {**headers, "Content-Encoding": enc})
        check_refused(*answer, 415, ("Content-Encoding",))
        assert answer[1]["Accept-Encoding"] == "identity, gzip, deflate", answer[1]
    for enc, data in (("identity", body), ("GZip", gzip.compress(body)),
                      ("x-gzip", gzip.compress(body)), ("DEFLATE", zlib.compress(body))):
        _image_ok(server, server.request("POST", IMAGE, data,
                                         {**headers, "Content-Encoding": enc}))
    server.healthy()


def test_compressed_bodies_must_decode_whole(server):
    """A gzip or deflate body that does not decode whole (cut short, even by the gzip
    trailer alone; bytes after its end; not compressed at all) is refused 400 with the
    protocol's JSON error, every time, and the controller logs nothing; a body in zstd
    or br is refused as any coding not served (aiohttp decoded those itself where their
    package was installed: here br, logging a traceback for a body that was not br; and
    answered zstd in plain text). Several gzip members one after another, and raw
    deflate, are served. With aiohttp's decoding, a gzip body cut short was served as
    what of it decoded (200 without its trailer, its CRC never checked), a deflate body
    that did not end was answered in plain text ("deflate") and, on a keep-alive
    connection, now and then not at all (7 of 1,200), and each body that did not decode
    logged a traceback."""
    body, headers = _image_body()
    gz, df = gzip.compress(body), zlib.compress(body)
    broken = [("gzip", gz[:-8], "ends early"), ("gzip", gz[:-1], "ends early"),
              ("gzip", gz[:20], "ends early"), ("gzip", gz + b"\0", "gzip"),
              ("gzip", gz + b"junk" * 4, "does not decode"), ("gzip", body, "does not decode"),
              ("deflate", df[:-3], "ends early"), ("deflate", df + b"x", "after the end"),
              ("deflate", body, "deflate")]
    for _ in range(10):  # (the answer that never came was a race)
        for enc, data, says in broken:
            answer = server.request("POST", IMAGE, data, {**headers, "Content-Encoding": enc})
            check_refused(*answer, 400, (says,))
    for enc in ("zstd", "br"):
        answer = server.request("POST", IMAGE, body, {**headers, "Content-Encoding": enc})
        check_refused(*answer, 415, ("Content-Encoding",))
    members = gzip.compress(body[:100]) + gzip.compress(body[100:])
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for enc, data in (("gzip", members), ("deflate", raw.compress(body) + raw.flush())):
        _image_ok(server, server.request("POST", IMAGE, data,
                                         {**headers, "Content-Encoding": enc}))
    time.sleep(0.2)  # (the controller's output is read by a thread)
    server.healthy()


# ---------------------------------------------------------------------- requests


@dataclass
class Request:
    """An inference request before it is sent: its JSON header, the binary data after it,
    its rows (0: no batch dimension), and where each binary input's bytes are."""

    meta: Meta
    header: dict
    binary: bytes
    rows: int
    slots: list[tuple[int, int, int]] = field(default_factory=list)  # (input, offset, size)
    send_length: bool = True  # send Inference-Header-Content-Length without binary data

    def head(self) -> bytes:
        return json.dumps(self.header, separators=(",", ":")).encode()

    def body(self) -> tuple[bytes, dict]:
        """The body and its Inference-Header-Content-Length header (when it needs one)."""
        head = self.head()
        if self.binary or self.send_length:
            return head + self.binary, {"Inference-Header-Content-Length": str(len(head))}
        return head, {}

    def expected_outputs(self) -> dict[str, bool]:
        """Output name -> whether it is to be answered binary."""
        default = self.header.get("parameters", {}).get("binary_data_output", False)
        asked = self.header.get("outputs")
        if not asked:
            return {name: default for name, _, _ in self.meta.outputs}
        return {o["name"]: o.get("parameters", {}).get("binary_data", default) for o in asked}


def _slots(header: dict) -> list[tuple[int, int, int]]:
    out, pos = [], 0
    for i, t in enumerate(header["inputs"]):
        n = t.get("parameters", {}).get("binary_data_size")
        if n is not None:
            out.append((i, pos, n))
            pos += n
    return out


@st.composite
def valid_requests(draw, meta: Meta, min_binary: int = 0) -> Request:
    """A valid request of ``meta``'s model, its body made by tritonclient: one row without
    the batch dimension or 1 to max_batch_size rows, any values, inputs in any order, each
    binary or JSON (at least ``min_binary`` binary), outputs all or some, binary or not."""
    rows = draw(st.integers(0, meta.max_batch))
    binary = draw(st.lists(st.booleans(), min_size=len(meta.inputs),
                           max_size=len(meta.inputs)))
    if sum(binary) < min_binary:
        binary[draw(st.integers(0, len(binary) - 1))] = True
    ins = []
    for (name, datatype, dims), b in zip(meta.inputs, binary, strict=True):
        shape = [rows, *dims] if rows else list(dims)
        x = thttp.InferInput(name, shape, datatype)
        x.set_data_from_numpy(draw(hnp.arrays(NP[datatype], shape)), binary_data=b)
        ins.append(x)
    ins = draw(st.permutations(ins))
    rid = draw(st.none() | st.text(max_size=6))
    body, hlen = thttp.InferenceServerClient.generate_request_body(
        ins, request_id=rid or "", parameters=dict(SLO))
    header = json.loads(body[:hlen] if hlen else body)
    names = [n for n, _, _ in meta.outputs]
    params = dict(SLO)
    flag = st.sampled_from([True, False, None])
    if (default := draw(flag)) is not None:
        params["binary_data_output"] = default
    header["parameters"] = params
    if draw(st.booleans()):  # some outputs, by name (else every output)
        header["outputs"] = []
        for name in draw(st.lists(st.sampled_from(names), min_size=1, unique=True)):
            o = {"name": name}
            if (b := draw(flag)) is not None:
                o["parameters"] = {"binary_data": b}
            header["outputs"].append(o)
    if rid is not None:
        header["id"] = rid
    return Request(meta, header, body[hlen:] if hlen else b"", rows, _slots(header),
                   draw(st.booleans()))


@dataclass
class Wire:
    """How a body travels: Content-Encoding (None: as it is), chunked or not (with how many
    chunks), the Accept-Encoding asked for the answer."""

    encoding: str | None = None
    chunks: int = 0
    accept: str | None = None


WIRES = st.builds(Wire, st.sampled_from([None, None, "gzip", "deflate", "identity", "GZip"]),
                  st.sampled_from([0, 0, 1, 2, 7]), st.sampled_from([None, "gzip", "deflate"]))


def _compress(data: bytes, encoding: str) -> bytes:
    return gzip.compress(data, mtime=0) if encoding.lower() == "gzip" else zlib.compress(data)


def send(server: Server, path: str, body: bytes, headers: dict, wire: Wire):
    """``body`` sent as ``wire`` says (compressed as its encoding says, unless the headers
    name one already) -> (status, headers, the answer's body decoded)."""
    headers = dict(headers)
    if wire.encoding and "Content-Encoding" not in headers:
        headers["Content-Encoding"] = wire.encoding
        if wire.encoding != "identity":
            body = _compress(body, wire.encoding)
    if wire.accept:
        headers["Accept-Encoding"] = wire.accept
    data = body
    if wire.chunks:
        step = max(1, -(-len(body) // wire.chunks))
        data = iter([body[i:i + step] for i in range(0, len(body), step)] or [b""])
    status, rh, got = server.request("POST", path, data, headers, chunked=bool(wire.chunks))
    enc = rh.get("Content-Encoding")
    if enc == "gzip":
        got = gzip.decompress(got)
    elif enc == "deflate":
        got = zlib.decompress(got)
    else:
        assert enc is None, enc
    return status, rh, got


# ---------------------------------------------------------------------- valid requests


@settings(SETTINGS, max_examples=100)
@given(data=st.data())
def test_valid_binary_requests_are_answered(server, data):
    """Valid requests of every served datatype, binary and JSON inputs and outputs
    mixed, sent in every way the server takes: 200, exactly as asked."""
    meta = data.draw(st.sampled_from(server.metas), "model")
    req = data.draw(valid_requests(meta), "request")
    wire = data.draw(WIRES, "wire")
    body, headers = req.body()
    status, rh, got = send(server, f"/v2/models/{meta.name}/infer", body, headers, wire)
    check_valid(req, status, rh, got)
    server.healthy()


# ---------------------------------------------------------------------- broken requests

# the outcome of a breakage that may leave the request valid: 200, or a refusal (400; or
# 504 should the breakage have made the SLO tiny or dropped it)
EITHER = -1

HLEN = ("Inference-Header-Content-Length",)
# (bytes shifted into a BOOL input of the right size: not its 0 and 1 bytes)
SIZE = ("binary_data_size", "binary data", "bytes of data", "BOOL data must be bytes")
# (``{a}_{b}`` is the length with an underscore in it: Python's int() reads it)
MALFORMED_HLEN = ["-1", "-{n}", "+{n}", "{n}.0", "0x{n:x}", "{a}_{b}", "", " ", "abc", "1e3",
                  "{n} {n}", "{n},{n}", "9" * 30, "-" + "9" * 30]
UNSERVED_ENCODINGS = ["br", "zstd", "compress", "x-compress", "gzip, gzip",
                      "deflate, gzip", "foo", "*", "gzip;q=1"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)
KINDS = ["hlen_malformed", "hlen_beyond", "hlen_off", "hlen_absent", "size_value",
         "size_type", "size_overflow", "bytes_missing", "bytes_extra", "datatype", "shape",
         "bytes_tensor", "both_data", "no_data", "input_twice", "output_flag",
         "garbage_header", "encoding_lie", "encoding_unserved", "truncated", "trailing",
         "too_large", "header_flip", "compressed_flip"]


@dataclass
class Broken:
    """A broken request: its body and headers as sent (``wire`` for the rest), and the
    answer expected: a status (``EITHER``: 200 or 400) and words one of which the error
    names."""

    kind: str
    meta: Meta
    body: bytes
    headers: dict
    wire: Wire
    status: int = 400
    says: tuple[str, ...] = ()


def _with_header(req: Request, header: dict | None = None, binary: bytes | None = None,
                 head: bytes | None = None) -> tuple[bytes, dict]:
    head = head if head is not None else json.dumps(
        req.header if header is None else header, separators=(",", ":")).encode()
    binary = req.binary if binary is None else binary
    return head + binary, {"Inference-Header-Content-Length": str(len(head))}


def _copy(header: dict) -> dict:
    return json.loads(json.dumps(header))


@st.composite
def broken_requests(draw, meta: Meta, kind: str) -> Broken:
    """A valid request of ``meta``'s model (at least one input binary) broken as ``kind``
    says, and the answer it must get."""
    req = draw(valid_requests(meta, min_binary=1))
    wire = draw(WIRES)
    head, binary = req.head(), req.binary
    n = len(head)
    slot = draw(st.sampled_from(req.slots))
    i, off, size = slot
    header = _copy(req.header)
    t = header["inputs"][i]

    def broken(body_headers, says=(), status=400, w=wire):
        body, headers = body_headers
        return Broken(kind, meta, body, headers, w, status, says)

    if kind == "hlen_malformed":
        value = draw(st.sampled_from(MALFORMED_HLEN)).format(n=n, a=n // 10, b=n % 10)
        return broken((head + binary, {"Inference-Header-Content-Length": value}), HLEN)
    if kind == "hlen_beyond":
        value = len(head) + len(binary) + draw(st.integers(1, 1 << 70))
        return broken((head + binary, {"Inference-Header-Content-Length": str(value)}), HLEN)
    if kind == "hlen_off":  # within the body: the JSON cut short, or binary bytes in it
        delta = draw(st.integers(-n, len(binary)).filter(bool))
        return broken((head + binary, {"Inference-Header-Content-Length": str(n + delta)}),
                      ("JSON", "binary data", "binary_data_size", "inputs"))
    if kind == "hlen_absent":  # the whole body read as JSON
        return broken((head + binary, {}), ("JSON", "binary_data_size"))
    if kind == "size_value":
        t["parameters"]["binary_data_size"] = draw(st.integers(0, 1 << 70).filter(
            lambda v: v != size))
        return broken(_with_header(req, header), SIZE)
    if kind == "size_type":
        t["parameters"]["binary_data_size"] = draw(st.sampled_from(
            [-1, -size - 1, float(size), str(size), True, False, None, [size], {"n": size},
             (1 << 64) + size, 1e300, -(1 << 63)]))
        return broken(_with_header(req, header), ("binary_data_size",))
    if kind == "size_overflow":  # sizes whose sum wraps 64 bits to the binary data's length
        huge = (1 << 63) + draw(st.integers(0, (1 << 62)))
        if len(req.slots) > 1:
            j = req.slots[1][0] if req.slots[0][0] == i else req.slots[0][0]
            rest = len(binary) - size - header["inputs"][j]["parameters"]["binary_data_size"]
            t["parameters"]["binary_data_size"] = huge
            header["inputs"][j]["parameters"]["binary_data_size"] = (
                len(binary) - rest - huge) % (1 << 64)
        else:
            t["parameters"]["binary_data_size"] = (1 << 64) + size
        return broken(_with_header(req, header), ("binary_data_size",))
    if kind == "bytes_missing":
        k = draw(st.integers(1, len(binary)))
        p = draw(st.integers(0, len(binary) - k))
        return broken(_with_header(req, binary=binary[:p] + binary[p + k:]), SIZE)
    if kind == "bytes_extra":
        junk = draw(st.binary(min_size=1, max_size=64))
        p = draw(st.integers(0, len(binary)))
        return broken(_with_header(req, binary=binary[:p] + junk + binary[p:]), SIZE)
    if kind == "datatype":
        t["datatype"] = draw(st.sampled_from([d for d in DATATYPES if d != t["datatype"]])
                             | JSON_VALUES.filter(lambda v: v not in DATATYPES))
        return broken(_with_header(req, header), ("datatype", "bytes of data",
                                                  "BOOL data must be bytes"))
    if kind == "shape":
        (dims,) = [d for name, _, d in meta.inputs if name == t["name"]]
        valid_forms = [list(dims)] + [[r, *dims] for r in range(1, meta.max_batch + 1)]
        t["shape"] = draw(st.lists(st.integers(0, 40), max_size=4).filter(
            lambda s: s != t["shape"] and (len(meta.inputs) > 1 or s not in valid_forms))
            | JSON_VALUES.filter(lambda v: not isinstance(v, list)))
        return broken(_with_header(req, header), ("shape", "bytes of data", "batch"))
    if kind == "bytes_tensor":  # Triton's BYTES: 4-byte little-endian lengths, each right or not
        strings = draw(st.lists(st.binary(max_size=8), min_size=1, max_size=4))
        data = b"".join(draw(st.sampled_from([len(s), len(s) + 1, 1 << 31, 0xFFFFFFFF]))
                        .to_bytes(4, "little") + s for s in strings)
        t["datatype"] = "BYTES"
        t["shape"] = [len(strings)]
        t["parameters"]["binary_data_size"] = len(data)
        return broken(_with_header(req, header, binary[:off] + data + binary[off + size:]),
                      ("BYTES",))
    if kind == "both_data":
        t["data"] = [0] * int(np.prod(t["shape"]))
        return broken(_with_header(req, header), ("both",))
    if kind == "no_data":
        del t["parameters"]["binary_data_size"]
        return broken(_with_header(req, header), ("no data", "binary data"))
    if kind == "input_twice":
        header["inputs"].insert(i, _copy(t))
        return broken(_with_header(req, header, binary[:off] + binary[off:off + size]
                                   + binary[off:]), ("twice",))
    if kind == "output_flag":
        value = draw(st.sampled_from([1, 0, "true", None, [True], {}]))
        if draw(st.booleans()):
            header["outputs"] = [{"name": meta.outputs[0][0],
                                  "parameters": {"binary_data": value}}]
            return broken(_with_header(req, header), ("binary_data",))
        header["parameters"]["binary_data_output"] = value
        return broken(_with_header(req, header), ("binary_data_output",))
    if kind == "garbage_header":
        garbage = draw(st.binary(max_size=40) | JSON_VALUES.map(
            lambda v: json.dumps(v).encode()))
        return broken(_with_header(req, head=garbage))
    body, headers = head + binary, {"Inference-Header-Content-Length": str(n)}
    plain = Wire(chunks=wire.chunks, accept=wire.accept)
    if kind == "encoding_lie":  # says compressed, is not (or the other one)
        enc = draw(st.sampled_from(["gzip", "deflate"]))
        if draw(st.booleans()):
            body = _compress(body, "deflate" if enc == "gzip" else "gzip")
        return broken((body, {**headers, "Content-Encoding": enc}), w=plain)
    if kind == "encoding_unserved":
        enc = draw(st.sampled_from(UNSERVED_ENCODINGS))
        if draw(st.booleans()):
            body = _compress(body, "gzip")
        return broken((body, {**headers, "Content-Encoding": enc}), ("Content-Encoding",),
                      status=415, w=plain)
    if kind in ("truncated", "trailing"):
        enc = draw(st.sampled_from(["gzip", "deflate"]))
        data = _compress(body, enc)
        if kind == "truncated":
            data = data[:draw(st.integers(1, len(data) - 1))]
        else:
            data += draw(st.binary(min_size=1, max_size=16))
        return broken((data, {**headers, "Content-Encoding": enc}), (enc,), w=plain)
    if kind == "too_large":  # over rest_max_body_bytes as sent, or once decoded
        pad = bytes(BODY_LIMIT + 1 - len(body) + draw(st.integers(0, 1000)))
        data, w = body + pad, plain
        if draw(st.booleans()):
            data = _compress(data, "gzip")
            headers = {**headers, "Content-Encoding": "gzip"}
        return broken((data, headers), ("rest_max_body_bytes",), 413, w)
    if kind == "header_flip":  # may still be valid (a letter of the id, a digit of a value)
        pos = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
        flipped = bytearray(head)
        for p in pos:
            flipped[p] ^= 1 << draw(st.integers(0, 7))
        return broken(_with_header(req, head=bytes(flipped)), status=EITHER)
    assert kind == "compressed_flip", kind  # may still decode (the gzip header's mtime)
    enc = draw(st.sampled_from(["gzip", "deflate"]))
    data = bytearray(_compress(body, enc))
    data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    return broken((bytes(data), {**headers, "Content-Encoding": enc}), status=EITHER, w=plain)


@pytest.mark.parametrize("kind", KINDS)
@settings(SETTINGS, max_examples=20)
@given(data=st.data())
def test_broken_binary_requests_are_refused(server, kind, data):
    """Each broken request: 400 (413 over the size bound) naming the problem; one that a
    breakage may have left valid: 200 consistent with the metadata, or 400. Never 5xx, a
    dropped connection, a hang or a traceback; ready after."""
    meta = data.draw(st.sampled_from(server.metas), "model")
    b = data.draw(broken_requests(meta, kind), "broken")
    status, rh, got = send(server, f"/v2/models/{meta.name}/infer", b.body, b.headers, b.wire)
    if b.status == EITHER and status == 200:
        check_consistent(meta, status, rh, got)
    else:
        want = status if b.status == EITHER and status in (400, 504) else b.status
        check_refused(status, rh, got, 400 if want == EITHER else want, b.says)
    server.healthy()


def test_raw_deflate_ending_at_a_slice_boundary_decodes_whole():
    """Raw deflate (no zlib header or trailer) whose last input byte zlib takes while its
    decoded bytes still fill the step's slice: the rest sat inside zlib and the body was
    refused as cut short (15 of 650 lengths near 256 KiB). Every length decodes whole,
    in one piece or fed in parts."""
    import random

    from controller.body_decoding import BodyDecoder

    rnd = random.Random(1)
    slice_ = BodyDecoder.SLICE
    for length in range(slice_ - 600, slice_ + 50):
        data = (bytes(rnd.choice(b"ab") for _ in range(64)) * (length // 64 + 1))[:length]
        c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        body = c.compress(data) + c.flush()
        for parts in ((body,), (body[:len(body) // 2], body[len(body) // 2:])):
            d = BodyDecoder("deflate")
            got = b"".join(out for part in parts for out in d.feed(part))
            d.end()
            assert got == data, (length, len(got))
