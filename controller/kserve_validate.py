"""The one validator of KServe v2 inference requests, shared by gRPC and REST.

Each field of a request is checked here, once, and a bad one raises
``KServeError(INVALID_ARGUMENT)`` (``NOT_FOUND`` for an unknown model version) with a
message naming the field and the value; nothing a client sends reaches the controller
unchecked, and no malformed request is answered 500. Two steps:

1. The wire: :func:`grpc_request` (a ``ModelInferRequest``) and :func:`rest_request` (a
   REST body's JSON header and the binary data after it) decode a request into
   :class:`InTensor` inputs, its parameters and the outputs asked for. Checked there:
   the types of every field (``id`` a string, ``parameters`` an object, ``outputs`` a list
   of objects with string names, shape entries non-negative integers,
   ``binary_data_size`` a non-negative integer, ...); a known datatype; input and output
   names non-empty and not given twice; data for every input, in exactly one form (gRPC:
   ``raw_input_contents`` for every input or typed ``contents`` for every input, never
   both; REST: ``data`` or ``binary_data_size``, never both), whose element count is the
   shape's (raw bytes: the shape's elements times the datatype's size; JSON ``data``: a
   flat or nested list of numbers, no ``null``, no strings); integer values within their
   datatype's range; ``slo_ms`` / ``timeout`` finite non-negative numbers (not ``true``);
   and that the binary data after a REST header is exactly what the inputs take.
   :func:`grpc_request` reads the message by its field names only, so it takes any
   ``ModelInferRequest`` class (ours or tritonclient's).
2. The model: :func:`check_inputs` matches the inputs with the model's profile: every
   input the model has, no other, the datatype of its spec, and a shape that is the
   spec's (one row, no batch dimension) or ``[n, *spec]`` with ``1 <= n <=
   max_batch_size`` (the profile's largest batch size), the same ``n`` for every input;
   and the outputs asked for exist. It splits the inputs into ``n`` rows, each a list of
   Tensors over a slice of what arrived (no copy).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import chain

import numpy as np
import orjson

from clockwork.tensors import Tensor, row_nbytes
from clockwork.time import MAX_SLO_MS
from controller.kserve_status import INVALID, NOT_FOUND, KServeError

# KServe datatype <-> numpy dtype name
KS_TO_NP = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
            "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
            "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
NP_TO_KS = {v: k for k, v in KS_TO_NP.items()}
# KServe datatype -> InferTensorContents field holding it (FP16 has none: raw only)
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                  "UINT16": "uint_contents", "UINT32": "uint_contents",
                  "UINT64": "uint64_contents", "FP32": "fp32_contents",
                  "FP64": "fp64_contents"}
# InferTensorContents field -> the numpy dtype of its elements
FIELD_DTYPE = {"bool_contents": "bool", "int_contents": "int32", "int64_contents": "int64",
               "uint_contents": "uint32", "uint64_contents": "uint64",
               "fp32_contents": "float32", "fp64_contents": "float64"}
ALL_FIELDS = (*FIELD_DTYPE, "bytes_contents")
# numpy kinds a JSON data list may decode to, per datatype family
_JSON_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}
KS_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in KS_TO_NP.items()}  # bytes per element
VERSION = "1"  # every model's only version
SLO_PARAMS = (("slo_ms", 1.0), ("timeout", 1e-3))  # (parameter, to ms): Triton's timeout is µs


@dataclass
class InTensor:
    """One decoded input: name, datatype (KServe), shape (as sent), its elements in C
    order (``bytes``, a ``memoryview`` of the request body, or a numpy array); its size
    has been checked against the shape."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | np.ndarray


def _bad(message: str) -> KServeError:
    return KServeError(INVALID, message)


_JSON_WORDS = {None: "null", True: "true", False: "false"}


def _short(v, limit: int = 60) -> str:
    """``repr(v)``, cut to ``limit`` characters (a message never echoes a whole tensor);
    ``null``, ``true`` and ``false`` spelled as the protocol's JSON spells them."""
    s = _JSON_WORDS[v] if v is None or isinstance(v, bool) else repr(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------- versions, SLOs

def check_version(name: str, version: str) -> None:
    """NOT_FOUND unless ``version`` is the model's (``"1"``, also written with leading
    zeros, as Triton reads a version as an integer) or empty (the default)."""
    if version not in ("", VERSION) and not (
            version.isascii() and version.isdigit() and int(version) == int(VERSION)):
        raise KServeError(NOT_FOUND, f"model {name!r} has no version {_short(version, 130)} "
                          f"(its only version is {VERSION!r})")  # (cut, as a name is)


def slo_from_params(params: dict) -> float:
    """``slo_ms`` (ms) or else Triton's ``timeout`` (µs) -> the SLO in ms; 0 = the
    default. Each present must be a finite number >= 0 (``true`` is not a number);
    ``slo_ms`` at most a day, ``timeout`` any (Triton takes any: beyond a day, a day)."""
    slo = None
    for key, to_ms in SLO_PARAMS:
        if key not in params:
            continue
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _bad(f"parameter {key!r} must be a finite number >= 0, got {_short(v)}")
        try:
            v = float(v)
        except OverflowError:  # an integer beyond a float's range (read by ``json``)
            raise _bad(f"parameter {key!r} must be a finite number >= 0, got "
                       f"{_short(v)}") from None
        if not math.isfinite(v) or v < 0:
            raise _bad(f"parameter {key!r} must be a finite number >= 0, got {v}")
        if key == "slo_ms" and v > MAX_SLO_MS:
            raise _bad(f"parameter 'slo_ms' must be at most {MAX_SLO_MS:.0f} (a day), got "
                       f"{_short(params[key])}")
        if slo is None:
            slo = min(v * to_ms, MAX_SLO_MS)
    return slo or 0.0


def _check_params(params: dict) -> dict:
    slo_from_params(params)
    return params


NO_SHARED_MEMORY = ("parameter 'shared_memory_region' names a shared-memory region, but this "
                    "server has no shared-memory extension")


def _no_shared_memory(what: str, params, instead: str) -> None:
    """Refuse a tensor placed in shared memory (Triton's extension, not served): read as
    if it were not, an input would have no data and an output would come in the
    response while its client read the region."""
    if "shared_memory_region" in params:
        raise _bad(f"{what}: {NO_SHARED_MEMORY} ({instead})")


def _output_params(name: str, params) -> None:
    """An output's parameters: ``binary_data`` a bool; no classification (unsupported);
    not in shared memory (no such extension)."""
    _no_shared_memory(f"output {name!r}", params, "its data comes in the response")
    if "binary_data" in params and not isinstance(params["binary_data"], bool):
        raise _bad(f"output {name!r}: parameter 'binary_data' must be true or false, got "
                   f"{_short(params['binary_data'])}")
    c = params.get("classification")
    if c is not None and c is not False and c != 0:
        raise _bad(f"output {name!r}: parameter 'classification' is not supported "
                   f"(got {_short(c)})")


def _requested(names: list) -> list[str]:
    seen: set[str] = set()
    for n in names:
        _requested_one(n, seen)
        seen.add(n)
    return list(names)


def _requested_one(n, seen) -> None:
    """A requested output's name: a non-empty string not in ``seen`` (those before it)."""
    if not isinstance(n, str) or not n:
        raise _bad(f"each requested output needs a non-empty string 'name', got {_short(n)}")
    if n in seen:
        raise _bad(f"output {n!r} requested twice")


def _shape(name: str, shape) -> list[int]:
    if not isinstance(shape, list | tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _bad(f"input {name!r}: 'shape' must be a list of non-negative integers, got "
                   f"{_short(shape)}")
    return [int(d) for d in shape]


def _datatype(name: str, datatype) -> str:
    if not isinstance(datatype, str) or datatype not in KS_TO_NP:
        raise _bad(f"input {name!r}: unsupported datatype {_short(datatype)} (one of "
                   f"{', '.join(KS_TO_NP)})")
    return datatype


def _sized(name: str, datatype: str, shape: list[int], data) -> None:
    """Raw data must hold exactly the shape's elements (and ``BOOL`` data bytes 0 or 1:
    numpy's bools read other bytes inconsistently, true to one operation and not to
    another)."""
    want = _count(shape) * KS_ITEMSIZE[datatype]
    have = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
    if have != want:
        raise _bad(f"input {name!r}: {have} bytes of data, expected {want} for shape "
                   f"{shape} {datatype}")
    if datatype == "BOOL" and have:
        b = np.frombuffer(data, np.uint8)
        if b.max() > 1:
            raise _bad(f"input {name!r}: BOOL data must be bytes 0 (false) or 1 (true), "
                       f"got {int(b[b > 1][0])}")


def _in_range(name: str, arr: np.ndarray, np_name: str) -> None:
    """Integer elements fit ``np_name`` (before a narrowing cast)."""
    if arr.size == 0 or arr.dtype.kind not in "iu" or np.dtype(np_name).kind not in "iu":
        return
    info = np.iinfo(np_name)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise _bad(f"input {name!r}: value {bad} is out of range for {NP_TO_KS[np_name]}")


class _Names:
    """Input names: non-empty strings, each once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, name) -> str:
        if not isinstance(name, str) or not name:
            raise _bad(f"each input needs a non-empty string 'name', got {_short(name)}")
        if name in self.seen:
            raise _bad(f"input {name!r} given twice")
        self.seen.add(name)
        return name


# ---------------------------------------------------------------------- gRPC

def param_value(p):
    """An ``InferParameter``'s value (None when none of its fields is set)."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def grpc_params(parameters) -> dict:
    """A protobuf ``map<string, InferParameter>`` as a dict."""
    if not parameters:
        return {}
    return {k: param_value(v) for k, v in parameters.items()}


def grpc_request(request) -> tuple[list[InTensor], dict, list[str]]:
    """A ``ModelInferRequest`` -> (inputs, parameters, requested output names)."""
    check_version(request.model_name, request.model_version)
    params = _check_params(grpc_params(request.parameters))
    wanted = request.outputs
    requested: list[str] = []
    if wanted:
        names = []
        for o in wanted:
            name = o.name
            if o.parameters:
                _output_params(name, grpc_params(o.parameters))
            names.append(name)
        requested = _requested(names)
    raw = request.raw_input_contents
    tensors = request.inputs
    for t in tensors:  # (first: such an input has no raw_input_contents of its own)
        if t.parameters:
            _no_shared_memory(f"input {t.name!r}", t.parameters, "send the tensor in the "
                              "request")
    if raw and len(raw) != len(tensors):
        raise _bad(f"{len(raw)} raw_input_contents for {len(tensors)} inputs "
                   "(send one per input, in order, or none)")
    names = _Names()
    out = []
    for i, t in enumerate(tensors):
        name = names(t.name)
        datatype = _datatype(name, t.datatype)
        shape = list(t.shape)  # int64s: only the sign is left to check
        if shape and min(shape) < 0:
            _shape(name, shape)  # raises
        if raw:
            if t.HasField("contents"):
                raise _bad(f"input {name!r} has typed contents and the request has "
                           "raw_input_contents: send one or the other")
            data = raw[i]
            _sized(name, datatype, shape, data)
        else:
            data = _typed_contents(name, datatype, shape, t.contents if t.HasField(
                "contents") else None)
        out.append(InTensor(name, datatype, shape, data))
    return out, params, requested


def _typed_contents(name: str, datatype: str, shape: list[int], contents) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise _bad(f"input {name!r}: datatype {datatype} cannot be sent as typed contents "
                   "(send raw_input_contents)")
    if contents is None:
        raise _bad(f"input {name!r} has no data (neither contents nor raw_input_contents)")
    for other in ALL_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise _bad(f"input {name!r} of datatype {datatype} carries {other}; its "
                       f"elements go in {field}")
    values = getattr(contents, field)
    want = _count(shape)
    if len(values) != want:
        raise _bad(f"input {name!r}: {len(values)} elements in contents.{field}, expected "
                   f"{want} for shape {shape}")
    np_name = KS_TO_NP[datatype]
    arr = _packed_array(contents, field, want) if field in _PACKED else None
    if arr is None:
        arr = np.array(values, dtype=FIELD_DTYPE[field])
    if arr.dtype != np_name:
        _in_range(name, arr, np_name)
        arr = arr.astype(np_name)
    return arr


# typed-contents fields whose elements have one width on the wire (packed: floats
# little-endian, a bool one byte of 0 or 1), read as one buffer rather than one by one
_PACKED = {"fp32_contents": np.dtype("<f4"), "fp64_contents": np.dtype("<f8"),
           "bool_contents": np.dtype("?")}


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _packed_array(contents, field: str, n: int) -> np.ndarray | None:
    """The ``n`` elements of ``field`` (the only field set in ``contents``) as an array over
    the bytes of the message serialised again, a copy made in C: reading a repeated
    field element by element builds a Python object each (~0.1 us each, 0.27 s for 16
    ResNet images). None where the bytes are not the one packed field expected (e.g.
    unknown fields the client added): the caller then reads the elements."""
    dt = _PACKED[field]
    size = n * dt.itemsize
    head = _varint(contents.DESCRIPTOR.fields_by_name[field].number << 3 | 2) + _varint(size)
    raw = contents.SerializeToString()
    if not n or len(raw) != len(head) + size or not raw.startswith(head):
        return None
    return np.frombuffer(raw, dt, offset=len(head))


# ---------------------------------------------------------------------- REST

JSON_DEPTH = 1024  # orjson's limit: a body nested deeper is refused (json's stack would run out)


def json_loads(body: bytes | memoryview | str):
    """A JSON body as Python values: read by orjson (4-5x faster than the standard library
    on tensor data lists), and by the standard library's ``json`` where orjson refuses
    it, so that what ``json`` reads beyond strict JSON is still read (NaN and Infinity,
    a byte-order mark, lone surrogates) and a body neither reads gets ``json``'s
    message. One difference: an integer beyond 64 bits is read as a float, as Triton's
    own server reads it. ValueError for a body that is not JSON, holds a number beyond
    a double's range (``1e400``: it would be read as an infinity; the ``Infinity``
    literal is read), or is nested more than ``JSON_DEPTH`` levels deep."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if str(e).startswith("depth limit exceeded"):  # (orjson's words, at 1,024 levels)
            raise ValueError(f"nested more than {JSON_DEPTH} levels deep") from None
    try:
        v = json.loads(bytes(body) if isinstance(body, memoryview) else body,
                       parse_float=_finite_float)
    except RecursionError:  # json runs out of stack (Python 3.11: at ~1,000 levels)
        raise ValueError(f"nested more than {JSON_DEPTH} levels deep") from None
    if _deeper_than(v, JSON_DEPTH):  # (Python 3.12's json reads thousands of levels)
        raise ValueError(f"nested more than {JSON_DEPTH} levels deep")
    return v


class BeyondDouble(ValueError):
    """A JSON number beyond a double's range: JSON, but not taken."""


def json_problem(what: str, e: ValueError) -> str:
    """``json_loads``' refusal of ``what`` (a request body, a parameter), in words."""
    return f"{what}: {e}" if isinstance(e, BeyondDouble) else f"{what} is not JSON: {e}"


def _finite_float(text: str) -> float:
    """A JSON number's text as a float; ``BeyondDouble`` where it is beyond a double's
    range (Python reads it as an infinity)."""
    v = float(text)
    if v in (math.inf, -math.inf):
        raise BeyondDouble(f"number {text[:40]}{'...' if len(text) > 40 else ''} is beyond "
                           "the range of a double")
    return v


def _deeper_than(v, limit: int) -> bool:
    """Whether the lists and objects of ``v`` nest more than ``limit`` levels deep."""
    level = [v] if isinstance(v, list | dict) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [c for x in level for c in (x.values() if isinstance(x, dict) else x)
                 if isinstance(c, list | dict)]
    return False


def _object(where: str, v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _bad(f"{where} must be an object, got {_short(v)}")
    return v


def rest_request(req: dict, binary: bytes | memoryview):
    """A REST request's JSON header (``req``) and the binary data after it ->
    (inputs, parameters, requested output names, {output: binary?}, binary by default).
    Binary inputs are views of ``binary`` (no copy), JSON ones arrays."""
    if not isinstance(req, dict):
        raise _bad("the request body must be a JSON object")
    if "id" in req and not isinstance(req["id"], str):
        raise _bad(f"'id' must be a string, got {_short(req['id'])}")
    params = _check_params(_object("'parameters'", req.get("parameters")))
    binary_all = params.get("binary_data_output", False)
    if not isinstance(binary_all, bool):
        raise _bad("parameter 'binary_data_output' must be true or false, got "
                   f"{_short(binary_all)}")
    wanted = req.get("outputs", [])
    if not isinstance(wanted, list):
        raise _bad(f"'outputs' must be a list of objects, got {_short(wanted)}")
    names, binary_of = [], {}
    for o in wanted:
        if not isinstance(o, dict):
            raise _bad(f"each of 'outputs' must be an object with a 'name', got {_short(o)}")
        _requested_one(o.get("name"), binary_of)
        names.append(o["name"])
        oparams = _object(f"output {o['name']!r}: 'parameters'", o.get("parameters"))
        _output_params(o["name"], oparams)
        binary_of[o["name"]] = oparams.get("binary_data", binary_all)
    return _rest_inputs(req, binary), params, names, binary_of, binary_all


def _rest_inputs(body: dict, binary: bytes | memoryview) -> list[InTensor]:
    binary = memoryview(binary)
    if binary.format != "B" or binary.ndim != 1:
        binary = binary.cast("B")
    pos = 0
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        got = f", got {_short(inputs)}" if "inputs" in body else " (it has none)"
        raise _bad(f"the request needs an 'inputs' list{got}")
    names = _Names()
    out = []
    for t in inputs:
        if not isinstance(t, dict):
            raise _bad(f"each of 'inputs' must be an object, got {_short(t)}")
        name = names(t.get("name"))
        datatype = _datatype(name, t.get("datatype"))
        shape = _shape(name, t.get("shape"))
        params = _object(f"input {name!r}: 'parameters'", t.get("parameters"))
        _no_shared_memory(f"input {name!r}", params, "send the tensor in the request")
        if "binary_data_size" in params:
            n = params["binary_data_size"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _bad(f"input {name!r}: 'binary_data_size' must be a non-negative "
                           f"integer, got {_short(n)}")
            if "data" in t:
                raise _bad(f"input {name!r} has both 'data' and 'binary_data_size': send "
                           "one or the other")
            if pos + n > len(binary):
                raise _bad(f"input {name!r}: binary_data_size {n} is more than the "
                           f"{len(binary) - pos} bytes of binary data left")
            data = binary[pos:pos + n]
            pos += n
            _sized(name, datatype, shape, data)
        elif "data" in t:
            data = _json_data(name, datatype, shape, t["data"])
        else:
            raise _bad(f"input {name!r} has no data (neither 'data' nor a "
                       "'binary_data_size' parameter)")
        out.append(InTensor(name, datatype, shape, data))
    if pos != len(binary):
        raise _bad(f"{len(binary)} bytes of binary data after the JSON header, but the "
                   f"inputs' binary_data_size add up to {pos}")
    return out


def _first_odd(data) -> tuple[bool, object]:
    """(found, the first element of a nested list that is neither a number, a bool nor a
    list), for the message about it."""
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(reversed(v))
        elif v is None or not isinstance(v, int | float | bool):
            return True, v
    return False, None


def _all_ints(data) -> bool:
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif type(v) is not int:
            return False
    return True


def _json_data(name: str, datatype: str, shape: list[int], data) -> np.ndarray:
    """JSON ``data`` (a flat or nested list of numbers) -> a flat array of the datatype,
    its element count the shape's."""
    if not isinstance(data, list):
        raise _bad(f"input {name!r}: 'data' must be a list, got {_short(data)}")
    np_name = KS_TO_NP[datatype]
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError):  # ragged nesting
        arr = None
    if (np.dtype(np_name).kind in "iu" and arr is not None and arr.dtype.kind in "fO"
            and _all_ints(data)):
        # integers numpy read as float64 (a mix of int64 and larger values, as UINT64 takes)
        # or as objects (beyond 64 bits): read as the datatype, or out of its range
        try:
            arr = np.array(data, dtype=np_name)
        except OverflowError:
            raise _bad(f"input {name!r}: a value is out of range for {datatype}") from None
    if arr is None or arr.dtype.kind in "OUS":
        found, odd = _first_odd(data)
        if found:
            kind = np.dtype(np_name).kind
            raise _bad(f"input {name!r}: 'data' holds {_short(odd)}; {datatype} data must "
                       f"be {'true/false' if kind == 'b' else 'numbers'}")
        raise _bad(f"input {name!r}: 'data' must be a flat list, or nested lists of equal "
                   "lengths (or a number too large for any datatype)")
    want = _count(shape)
    if arr.size != want:
        raise _bad(f"input {name!r}: {arr.size} elements in 'data', expected {want} for "
                   f"shape {shape}")
    kinds = _JSON_KINDS[np.dtype(np_name).kind]
    if arr.size and arr.dtype.kind not in kinds:
        what = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}
        raise _bad(f"input {name!r}: {datatype} 'data' must be "
                   f"{what[np.dtype(np_name).kind]}, got {arr.dtype.name} values")
    if arr.dtype.kind != "b" and _bools_among(data, arr):
        raise _bad(f"input {name!r}: 'data' holds true/false; {datatype} data must be "
                   f"{'numbers' if np.dtype(np_name).kind == 'f' else 'integers'}")
    _in_range(name, arr, np_name)
    flat = arr.reshape(-1)
    with np.errstate(over="ignore"):  # (found below, said as the request's error)
        out = np.ascontiguousarray(flat, dtype=np_name)
    if out.dtype.kind == "f" and flat.dtype != out.dtype and out.size:
        grew = np.isinf(out) & ~np.isinf(flat)  # finite values past the datatype's range
        if grew.any():
            raise _bad(f"input {name!r}: value {flat[grew][0].item()!r} is out of range "
                       f"for {datatype}")
    return out


def _bools_among(data: list, arr: np.ndarray) -> bool:
    """Whether JSON ``true``/``false`` sits among the numbers of ``data`` (``arr`` is
    numpy's reading of it, which turns them into 1 and 0 silently). The elements are
    looked at only when some value is 0 or 1: a scan of every element costs about as
    much as reading them."""
    if not arr.size or not ((arr == 0) | (arr == 1)).any():
        return False
    leaves = data
    for _ in range(arr.ndim - 1):  # (regular nesting: numpy read it as ndim levels)
        leaves = chain.from_iterable(leaves)
    return bool in set(map(type, leaves))  # (a set of types: ~15 ns an element)


# ---------------------------------------------------------------------- the model

def max_batch_size(profile) -> int:
    """Rows one request may carry: the profile's largest batch size."""
    return max(profile.batch_sizes)


def _row_slices(data, n: int, row_bytes: int, row_elems: int) -> list:
    """``n`` equal rows of ``data``, each a view (no copy)."""
    if n == 1:
        return [data]
    if isinstance(data, np.ndarray):
        flat = data.reshape(-1)
        return [flat[i * row_elems:(i + 1) * row_elems] for i in range(n)]
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return [mv[i * row_bytes:(i + 1) * row_bytes] for i in range(n)]


class _Plan:
    """What the front end reads of a profile, worked out once per profile object
    (:func:`profile_plan`): its input specs by name, (name, numpy dtype, shape, elements)
    of each in order, its ``max_batch_size``, its output names and (name, KServe
    datatype, bytes in a row, shape) of each output in order."""

    __slots__ = ("profile", "specs", "inputs", "limit", "outputs", "out_rows")

    def __init__(self, profile) -> None:
        self.profile = profile
        self.specs = {t.name: t for t in profile.inputs}
        self.inputs = [(t.name, np.dtype(t.dtype), tuple(t.shape), _count(t.shape))
                       for t in profile.inputs]
        self.limit = max_batch_size(profile)
        self.outputs = frozenset(t.name for t in profile.outputs)
        self.out_rows = [(t.name, NP_TO_KS.get(t.dtype, t.dtype.upper()), row_nbytes(t),
                          tuple(t.shape)) for t in profile.outputs]


_plans: dict[str, _Plan] = {}  # model instance -> the plan of its current profile
_PLANS_MAX = 4096  # then the cache starts over


def profile_plan(profile) -> _Plan:
    """The plan of ``profile``; made again when the instance's profile object is another
    (a model loaded again; profiles are not changed in place)."""
    p = _plans.get(profile.model)
    if p is None or p.profile is not profile:
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        p = _plans[profile.model] = _Plan(profile)
    return p


def check_inputs(model: str, profile, inputs: list[InTensor],
                 requested: list[str]) -> tuple[list[list[Tensor]], bool]:
    """The inputs against the model -> (its rows: per row, one Tensor per input of the
    profile, in the profile's order; whether the inputs had a batch dimension)."""
    plan = profile_plan(profile)
    specs = plan.specs
    limit = plan.limit
    got: dict[str, InTensor] = {}
    form = None  # (rows, batched, the input that set them)
    for t in inputs:
        spec = specs.get(t.name)
        if spec is None:
            raise _bad(f"model {model!r} has no input {t.name!r}; inputs: {sorted(specs)}")
        if KS_TO_NP[t.datatype] != spec.dtype:
            raise _bad(f"input {t.name!r} of model {model!r} has datatype {t.datatype}, "
                       f"expected {NP_TO_KS.get(spec.dtype, spec.dtype.upper())}")
        shape, dims = tuple(t.shape), tuple(spec.shape)
        if shape == dims:
            rows, batched = 1, False
        elif len(shape) == len(dims) + 1 and shape[1:] == dims:
            rows, batched = shape[0], True
        else:
            raise _bad(f"input {t.name!r} of model {model!r} has shape {list(shape)}, "
                       f"expected [{', '.join(['n', *map(str, dims)])}] with 1 <= n <= {limit} "
                       f"rows, or {list(dims)}")
        if batched and rows < 1:
            raise _bad(f"input {t.name!r} of model {model!r} has a batch of 0 rows "
                       f"(shape {list(shape)}); send 1 to {limit}")
        if rows > limit:
            raise _bad(f"input {t.name!r} of model {model!r}: a batch of {rows} rows is "
                       f"over the model's max_batch_size {limit}")
        if form is None:
            form = (rows, batched, t)
        elif form[:2] != (rows, batched):
            first = form[2]
            raise _bad(f"inputs disagree on the batch: {first.name!r} has shape "
                       f"{list(first.shape)}, {t.name!r} has shape {list(shape)}")
        got[t.name] = t
    if len(got) != len(specs):
        missing = [s for s in specs if s not in got]
        raise _bad(f"model {model!r} needs input(s) {missing}; the request has "
                   f"{sorted(got) or 'none'}")
    outs = plan.outputs
    for r in requested:
        if r not in outs:
            raise _bad(f"model {model!r} has no output {r!r}; outputs: {sorted(outs)}")
    n, batched = (form[0], form[1]) if form is not None else (1, False)
    if n == 1:  # one row: each input's data as it is
        return [[Tensor(name, dtype, shape, got[name].data)
                 for name, dtype, shape, _ in plan.inputs]], batched
    rows: list[list[Tensor]] = [[] for _ in range(n)]
    for name, dtype, shape, elems in plan.inputs:
        for i, part in enumerate(_row_slices(got[name].data, n, elems * dtype.itemsize,
                                             elems)):
            rows[i].append(Tensor(name, dtype, shape, part))
    return rows, batched
