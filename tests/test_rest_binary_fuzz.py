"""The KServe v2 REST inference path with binary bodies (Triton's binary tensor data
extension: a JSON header, then the tensors' raw bytes, ``Inference-Header-Content-Length``
saying where the header ends; the body chunked or not, gzip or deflate or not), against a
live controller over real HTTP on loopback: the defects fuzzing it found, each on its own.
Every request is answered, never 5xx, and the controller prints no traceback.
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

thttp = pytest.importorskip("tritonclient.http")

from tests.conftest import local_cluster  # noqa: E402

KiB = 1 << 10
BODY_LIMIT = 256 * KiB  # rest_max_body_bytes of the cluster
OFFLOAD = 2 * KiB  # rest_json_offload_bytes: larger JSON headers are read off the loop
TIMEOUT_S = 10.0  # no answer within this is a hang
NP = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
      "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
      "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
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
    """A body in a Content-Encoding other than gzip, deflate or identity (any case), or
    in several, is refused 400 naming it. aiohttp passes any name but gzip, deflate, br
    and zstd through undecoded: a body that said "foo", "x-gzip", "gzip, gzip" was
    served as if it said nothing. (br and zstd: the next test.)"""
    body, headers = _image_body()
    for enc in ("foo", "x-gzip", "gzip, gzip", "compress"):
        answer = server.request("POST", IMAGE, body, {**headers, "Content-Encoding": enc})
        check_refused(*answer, 400, ("Content-Encoding",))
    for enc, data in (("identity", body), ("GZip", gzip.compress(body)),
                      ("DEFLATE", zlib.compress(body))):
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
        check_refused(*answer, 400, ("Content-Encoding",))
    members = gzip.compress(body[:100]) + gzip.compress(body[100:])
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for enc, data in (("gzip", members), ("deflate", raw.compress(body) + raw.flush())):
        _image_ok(server, server.request("POST", IMAGE, data,
                                         {**headers, "Content-Encoding": enc}))
    time.sleep(0.2)  # (the controller's output is read by a thread)
    server.healthy()
