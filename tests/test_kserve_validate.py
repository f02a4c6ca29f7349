"""The KServe request validator (controller/kserve_validate.py) on its own: rows split
without copying, inputs that disagree on the batch, datatypes' ranges, SLO parameters,
and the worst of several rows' errors (controller/kserve_status.py). gRPC requests are
tritonclient's messages (the validator reads fields by name; ours cannot be imported
beside tritonclient's)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clockwork.profiles import ModelProfile, TensorSpec
from controller.kserve_status import (
    DEADLINE,
    INTERNAL,
    INVALID,
    NOT_FOUND,
    UNAVAILABLE,
    KServeError,
    worst,
)
from controller.kserve_validate import (
    InTensor,
    check_inputs,
    check_version,
    grpc_request,
    json_loads,
    max_batch_size,
    profile_plan,
    rest_request,
    slo_from_params,
)

# a model of two inputs (different dtypes) and one output, batch sizes up to 4
TWO = ModelProfile(model="two", device="test", weights_bytes=1, load_ns=1,
                   exec_ns={1: 1, 2: 2, 4: 4},
                   inputs=[TensorSpec("a", (2, 3), "float32"), TensorSpec("b", (5,), "int8")],
                   outputs=[TensorSpec("y", (7,), "float32")])


def _invalid(call, *says: str, kind: str = INVALID) -> str:
    with pytest.raises(KServeError) as e:
        call()
    assert e.value.kind == kind, e.value.message
    for s in says:
        assert s in e.value.message, e.value.message
    return e.value.message


_SAME = object()


def _inputs(n: int | None, nb=_SAME):
    """Inputs of TWO with n rows (None: no batch dimension); ``nb``: b's rows, if not n."""
    nb = n if nb is _SAME else nb
    a = np.arange((n or 1) * 6, dtype=np.float32).tobytes()
    b = np.arange((nb or 1) * 5, dtype=np.int8)
    return [InTensor("a", "FP32", [n, 2, 3] if n is not None else [2, 3], a),
            InTensor("b", "INT8", [nb, 5] if nb is not None else [5], b)]


def test_rows_are_views_in_order():
    ins = _inputs(3)
    rows, batched = check_inputs("two", TWO, ins, [])
    assert batched and len(rows) == 3 and max_batch_size(TWO) == 4
    a_all = np.frombuffer(ins[0].data, np.float32).reshape(3, 2, 3)
    for i, (a, b) in enumerate(rows):
        assert (a.name, a.shape, b.name, b.shape) == ("a", (2, 3), "b", (5,))
        np.testing.assert_array_equal(a.array, a_all[i])
        np.testing.assert_array_equal(b.array, ins[1].data.reshape(3, 5)[i])
        assert isinstance(a.data, memoryview) and a.data.obj is ins[0].data  # no copy
        assert np.shares_memory(b.data, ins[1].data)
    rows, batched = check_inputs("two", TWO, _inputs(None), ["y"])
    assert not batched and len(rows) == 1 and rows[0][0].shape == (2, 3)


def test_batch_form_checks():
    _invalid(lambda: check_inputs("two", TWO, _inputs(2, 3), []), "inputs disagree",
             "'a' has shape [2, 2, 3], 'b' has shape [3, 5]")
    _invalid(lambda: check_inputs("two", TWO, _inputs(1, None), []), "inputs disagree")
    _invalid(lambda: check_inputs("two", TWO, _inputs(5), []),
             "batch of 5 rows is over the model's max_batch_size 4")
    _invalid(lambda: check_inputs("two", TWO, _inputs(0), []), "a batch of 0 rows")
    _invalid(lambda: check_inputs("two", TWO, _inputs(2)[:1], []),
             "model 'two' needs input(s) ['b']; the request has ['a']")
    _invalid(lambda: check_inputs("two", TWO, [], []), "needs input(s) ['a', 'b']",
             "has none")
    _invalid(lambda: check_inputs("two", TWO, _inputs(2), ["z"]), "no output 'z'")
    bad = _inputs(2)
    bad[1].datatype = "UINT8"
    _invalid(lambda: check_inputs("two", TWO, bad, []), "datatype UINT8, expected INT8")
    # a model whose rows are scalars (input [n]): its form said "[n, ]"
    scalar = ModelProfile(model="ids", device="test", weights_bytes=1, load_ns=1,
                          exec_ns={1: 1, 4: 4}, inputs=[TensorSpec("x", (), "int64")],
                          outputs=[TensorSpec("y", (3,), "float32")])
    x = InTensor("x", "INT64", [2, 1], np.arange(2, dtype=np.int64).tobytes())
    _invalid(lambda: check_inputs("ids", scalar, [x], []),
             "has shape [2, 1], expected [n] with 1 <= n <= 4 rows, or []")
    _invalid(lambda: check_inputs("two", TWO, [InTensor("a", "FP32", [1, 3, 3], b"")], []),
             "expected [n, 2, 3] with 1 <= n <= 4 rows, or [2, 3]")


def test_profile_read_again_when_replaced():
    """What is worked out of a profile once (``profile_plan``) is worked out again when the
    instance's profile object is another (a model loaded again under the same name)."""
    check_inputs("two", TWO, _inputs(2), [])
    assert profile_plan(TWO) is profile_plan(TWO)
    other = ModelProfile(model="two", device="test", weights_bytes=1, load_ns=1,
                         exec_ns={1: 1, 2: 2},
                         inputs=[TensorSpec("a", (2, 3), "float32")],
                         outputs=[TensorSpec("z", (4,), "float64")])
    assert profile_plan(other).out_rows == [("z", "FP64", 32, (4,))]
    _invalid(lambda: check_inputs("two", other, _inputs(2), []), "has no input 'b'")
    _invalid(lambda: check_inputs("two", other, _inputs(4)[:1], []),
             "over the model's max_batch_size 2")
    rows, _ = check_inputs("two", other, _inputs(2)[:1], ["z"])
    assert len(rows) == 2 and [t.name for t in rows[0]] == ["a"]
    rows, _ = check_inputs("two", TWO, _inputs(4), ["y"])  # and back
    assert len(rows) == 4 and [t.name for t in rows[0]] == ["a", "b"]


def test_versions():
    check_version("m", "")
    check_version("m", "1")
    _invalid(lambda: check_version("m", "2"), "no version '2'", kind=NOT_FOUND)
    # Triton reads a version as an integer: "01" is version 1; "-1", "+1", " 1", "1.0",
    # "１" (a full-width digit) are not a version of this model
    check_version("m", "01")
    check_version("m", "0001")
    for v in ("-1", "+1", " 1", "1 ", "1.0", "\uff11", "0", "10"):
        _invalid(lambda v=v: check_version("m", v), "no version", kind=NOT_FOUND)


def test_slo_parameters():
    assert slo_from_params({}) == 0.0
    assert slo_from_params({"slo_ms": 12.5}) == 12.5
    assert slo_from_params({"timeout": 250_000}) == 250.0  # µs
    assert slo_from_params({"slo_ms": 3, "timeout": 250_000}) == 3.0
    for params, says in (({"slo_ms": True}, "'slo_ms'"), ({"slo_ms": "5"}, "got '5'"),
                         ({"slo_ms": None}, "got null"), ({"slo_ms": -0.5}, "got -0.5"),
                         ({"slo_ms": math.nan}, "got nan"), ({"slo_ms": math.inf}, "got inf"),
                         ({"slo_ms": 5, "timeout": False}, "'timeout'"),
                         ({"timeout": [1]}, "'timeout'"),
                         ({"slo_ms": 10**400}, "'slo_ms'")):  # (JSON's integers have no bound)
        _invalid(lambda p=params: slo_from_params(p), says, "finite number >= 0")
    # at most a day: slo_ms beyond it is refused, named as sent; Triton's timeout (any
    # value, for Triton) is taken as a day
    assert slo_from_params({"slo_ms": 86_400_000}) == 86_400_000
    _invalid(lambda: slo_from_params({"slo_ms": 86_400_001}), "'slo_ms'", "86400001",
             "at most 86400000")
    assert slo_from_params({"timeout": 2 * 86_400 * 10**6}) == 86_400_000
    assert slo_from_params({"timeout": 2**64 - 1}) == 86_400_000


def _rest(inputs, **body):
    return rest_request({"inputs": inputs, **body}, b"")


def test_rest_json_data():
    def one(datatype, data, shape=(2,)):
        return _rest([{"name": "x", "datatype": datatype, "shape": list(shape),
                       "data": data}])[0][0].data

    assert one("INT8", [[1], [-2]]).tolist() == [1, -2]  # nested, of its shape
    assert one("FP32", [1, 2.5]).dtype == np.float32  # integers are numbers
    assert one("BOOL", [True, False]).tolist() == [True, False]
    assert one("UINT64", [0, 2**64 - 1]).tolist() == [0, 2**64 - 1]
    _invalid(lambda: one("INT8", [1, 300]), "value 300 is out of range for INT8")
    _invalid(lambda: one("UINT16", [1, -1]), "value -1 is out of range for UINT16")
    _invalid(lambda: one("INT32", [1, 2.5]), "INT32 'data' must be integers")
    _invalid(lambda: one("BOOL", [1, 0]), "BOOL 'data' must be true/false")
    # strings among booleans: said as such (not "must be numbers")
    _invalid(lambda: one("BOOL", ["true", False]), "'data' holds 'true'",
             "BOOL data must be true/false")
    # integers past the datatype's range that numpy reads as floats or objects (from
    # 2**63, or beyond 64 bits): out of range, not "must be integers" or "a flat list"
    _invalid(lambda: one("INT64", [2**63, 0]), "a value is out of range for INT64")
    _invalid(lambda: one("INT64", [1, 2**70]), "a value is out of range for INT64")
    _invalid(lambda: one("INT8", [2**63, 1]), "a value is out of range for INT8")
    _invalid(lambda: one("UINT64", [2**64, 1]), "a value is out of range for UINT64")
    assert one("INT64", [2**63 - 1, -(2**63)]).tolist() == [2**63 - 1, -(2**63)]
    # numbers past a float datatype's range became inf (and a RuntimeWarning in the
    # controller's log); its largest values and an inf sent as such are taken
    _invalid(lambda: one("FP16", [70000.0, 1]), "value 70000.0 is out of range for FP16")
    _invalid(lambda: one("FP16", [1, 70000]), "value 70000 is out of range for FP16")
    _invalid(lambda: one("FP32", [0.5, -1e300]), "value -1e+300 is out of range for FP32")
    assert one("FP16", [65504.0, -65504]).tolist() == [65504.0, -65504.0]
    assert one("FP32", [float("inf"), 1e38]).tolist()[0] == float("inf")
    assert one("FP64", [1e300, 1]).tolist() == [1e300, 1]
    _invalid(lambda: one("FP32", [1, None]), "'data' holds null")
    _invalid(lambda: one("FP32", [1, {}]), "'data' holds {}")
    # JSON true/false among numbers (numpy would read them as 1 and 0)
    _invalid(lambda: one("FP32", [2.5, True]), "'data' holds true/false", "must be numbers")
    _invalid(lambda: one("INT32", [[7], [False]]), "'data' holds true/false", "integers")
    _invalid(lambda: one("FP32", [True, True]), "FP32 'data' must be numbers")
    assert one("FP32", [[0.0, 1.0], [1, 0]], (2, 2)).tolist() == [0, 1, 1, 0]


def test_json_bodies_read_as_the_standard_library_reads_them():
    """``json_loads`` (orjson, then ``json`` where orjson refuses): the same values as
    ``json.loads``, beyond strict JSON too, and ``json``'s message for a body that is not
    JSON; an integer beyond 64 bits is a float."""
    import json

    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    tensor = json.dumps({"inputs": [{"name": "x", "shape": [5000], "datatype": "FP32",
                                     "data": x.tolist()}], "id": "\u00e9"}).encode()
    for body in (tensor, b'{"a":[1,2.5,-0.0,1e-400,-0,1E5],"a":3}', b'{"x": NaN}',
                 b"[Infinity, -Infinity]", b"\xef\xbb\xbf{}", b'"\\ud800"',
                 b"[18446744073709551615, -9223372036854775808]"):
        assert repr(json_loads(body)) == repr(json.loads(body)), body[:40]
        assert repr(json_loads(memoryview(body))) == repr(json.loads(body)), body[:40]
    for bad in (b"{", b"{}x", b"", b'"\xff"'):
        with pytest.raises(ValueError) as ours:
            json_loads(bad)
        with pytest.raises(ValueError) as theirs:
            json.loads(bad)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))
    assert json_loads(b"[18446744073709551616]") == [float(2**64)]
    # a number beyond a double's range (json reads it as an infinity, which the checks
    # of a float datatype's range then took as sent): refused; the Infinity literal and
    # numbers that underflow to 0 are read
    for body in (b"[1e400]", b'{"x": NaN, "y": -1e999}', b"[1" + b"0" * 400 + b".5]"):
        with pytest.raises(ValueError, match="is beyond the range of a double"):
            json_loads(body)
    assert json_loads(b"[1e-400, Infinity]") == [0.0, math.inf]
    # nesting: orjson reads 1,024 levels; deeper is refused with a ValueError (json
    # itself would run out of stack: RecursionError)
    v, depth = json_loads(b"[" * 1024 + b"]" * 1024), 1
    while v:
        v, depth = v[0], depth + 1
    assert v == [] and depth == 1024
    for n in (1025, 2000, 100_000):
        with pytest.raises(ValueError, match="nested more than 1024 levels deep"):
            json_loads(b"[" * n + b"]" * n)
        # (past a NaN, which orjson refuses first: json reads it, on Python 3.12 to
        # thousands of levels)
        with pytest.raises(ValueError, match="nested more than 1024 levels deep"):
            json_loads(b"[NaN," + b"[" * n + b"]" * n + b"]")


def test_rest_request_fields():
    good = [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]
    inputs, params, requested, binary_of, binary_all = _rest(
        good, id="q", parameters={"binary_data_output": True, "slo_ms": 5},
        outputs=[{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}])
    assert params["slo_ms"] == 5 and requested == ["y", "z"]
    assert binary_of == {"y": True, "z": False} and binary_all is True
    _invalid(lambda: rest_request([], b""), "must be a JSON object")
    _invalid(lambda: _rest(good, parameters={"binary_data_output": 1}),
             "'binary_data_output' must be true or false")
    _invalid(lambda: _rest(good, outputs=[{"name": "y", "parameters": {
        "classification": 2}}]), "'classification' is not supported")
    _invalid(lambda: _rest(good, outputs=[{"name": "y"}, {"name": "z"}, {"name": "y"}]),
             "output 'y' requested twice")
    _invalid(lambda: _rest(good, outputs=[{"name": "y"}, {"name": 3}]),
             "non-empty string 'name', got 3")
    # each name checked once against those before it (this took ~30 s when every name
    # checked the whole list again)
    many = [{"name": f"o{i}"} for i in range(30_000)]
    assert _rest(good, outputs=many)[2] == [o["name"] for o in many]
    # binary data: views of what follows the header, exactly all of it
    body = np.arange(6, dtype=np.float32).tobytes()
    inputs = rest_request({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "w", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
    ]}, memoryview(body))[0]
    assert [np.frombuffer(t.data, np.float32).tolist() for t in inputs] == [[0, 1], [2, 3, 4, 5]]
    assert all(t.data.obj is body for t in inputs)


def test_raw_bool_data_is_bytes_0_or_1():
    """Raw BOOL data (REST binary, gRPC raw_input_contents) is checked as JSON's is:
    bytes other than 0 and 1 are refused (numpy's bools read them inconsistently)."""
    spec = {"name": "c", "datatype": "BOOL", "shape": [3], "parameters": {"binary_data_size": 3}}
    assert rest_request({"inputs": [spec]}, b"\x01\x00\x01")[0][0].data is not None
    _invalid(lambda: rest_request({"inputs": [spec]}, b"\x01\x02\xff"),
             "input 'c': BOOL data must be bytes 0 (false) or 1 (true), got 2")
    kpb, r = _grpc()
    r.inputs.add(name="c", datatype="BOOL", shape=[3])
    r.raw_input_contents.append(b"\x00\x00\x07")
    _invalid(lambda: grpc_request(r), "BOOL data must be bytes 0 (false) or 1 (true), got 7")


def _grpc(**kw):
    from tritonclient.grpc import service_pb2 as kpb

    r = kpb.ModelInferRequest(model_name="two", **kw)
    return kpb, r


def test_grpc_typed_contents():
    kpb, r = _grpc()
    r.inputs.add(name="a", datatype="INT8", shape=[3]).contents.int_contents.extend([1, -2, 3])
    r.inputs.add(name="u", datatype="UINT16", shape=[1]).contents.uint_contents.append(65535)
    r.inputs.add(name="f", datatype="BOOL", shape=[2]).contents.bool_contents.extend([1, 0])
    inputs, params, requested = grpc_request(r)
    assert [(t.data.dtype.name, t.data.tolist()) for t in inputs] == [
        ("int8", [1, -2, 3]), ("uint16", [65535]), ("bool", [True, False])]
    kpb, r = _grpc()
    r.inputs.add(name="a", datatype="INT8", shape=[1]).contents.int_contents.append(128)
    _invalid(lambda: grpc_request(r), "value 128 is out of range for INT8")
    kpb, r = _grpc()
    r.inputs.add(name="a", datatype="FP16", shape=[1]).contents.fp32_contents.append(1)
    _invalid(lambda: grpc_request(r), "FP16 cannot be sent as typed contents")
    kpb, r = _grpc(model_version="3")
    _invalid(lambda: grpc_request(r), "no version '3'", kind=NOT_FOUND)


def test_grpc_packed_contents_read_as_one_buffer():
    """FP32, FP64 and BOOL typed contents are read from the serialised field as one buffer
    (``_packed_array``): bit for bit what reading them element by element gives, special
    values included; a message with a field the validator does not know is read element
    by element, with the same result."""
    from controller.kserve_validate import _packed_array

    rng = np.random.default_rng(1)
    tiny = np.finfo(np.float32).smallest_subnormal
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, tiny, np.finfo(np.float32).max]
    cases = [("FP32", "fp32_contents", np.float32), ("FP64", "fp64_contents", np.float64),
             ("BOOL", "bool_contents", np.bool_)]
    for datatype, field, dtype in cases:
        x = (rng.random(1001) < 0.5 if dtype is np.bool_
             else np.concatenate([rng.standard_normal(1000), specials]).astype(dtype))
        for unknown in (False, True):
            kpb, r = _grpc()
            c = r.inputs.add(name="x", datatype=datatype, shape=[len(x)]).contents
            getattr(c, field).extend(x.tolist())
            if unknown:
                c.MergeFromString(b"\xf8\x07\x01")  # field 127 (varint 1): not in the proto
            assert (_packed_array(c, field, len(x)) is None) == unknown
            one_by_one = np.array(getattr(c, field), dtype=dtype)
            got = grpc_request(r)[0][0].data
            assert got.dtype == dtype and got.tobytes() == one_by_one.tobytes()
            assert got.tobytes() == x.tobytes()


def test_worst_of_several_rows():
    e = {k: KServeError(k, k.lower()) for k in (DEADLINE, UNAVAILABLE, INVALID, INTERNAL)}
    assert worst([e[DEADLINE], e[UNAVAILABLE]]) is e[UNAVAILABLE]
    assert worst([e[DEADLINE], e[INTERNAL], e[INVALID]]) is e[INTERNAL]
    assert worst([e[DEADLINE]]) is e[DEADLINE]
    first = KServeError(DEADLINE, "first")
    assert worst([first, e[DEADLINE]]) is first
