"""Typed tensors (clockwork/tensors.py), their protobuf edge (clockwork/protocol/wire.py),
and what an emulated worker process sends back for an INFER: no output bytes."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from clockwork.profiles import TensorSpec
from clockwork.protocol.versions import PROTOCOL
from clockwork.tensors import Tensor, TensorError, batch_inputs, check_inputs, join_rows, zero_rows

SPECS = [TensorSpec("data", (2, 3), "float32")]


def _sample(seed: int, shape=(2, 3), dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_of_and_array_share_memory():
    a = _sample(0)
    t = Tensor.of("x", a)
    assert t.dtype == np.float32 and t.shape == (2, 3) and t.nbytes == a.nbytes
    assert t.array is a  # the array itself, no copy
    big = a.astype(">f4")  # big-endian: converted (a copy) to little-endian
    tb = Tensor.of("x", big)
    assert tb.dtype == np.dtype("<f4") and np.array_equal(tb.array, a)
    raw = a.tobytes()
    tr = Tensor("x", np.dtype(np.float32), (2, 3), raw)
    assert np.array_equal(tr.array, a) and not tr.array.flags.writeable
    assert tr.to_bytes() is raw  # bytes stay bytes
    assert np.shares_memory(tr.array, np.frombuffer(raw, np.uint8))
    # a 0-d array keeps its shape (), a strided one is made contiguous
    assert Tensor.of("x", np.float32(2.5)).shape == ()
    t = Tensor.of("x", a.T)
    assert t.shape == (3, 2) and t.array.flags.c_contiguous and np.array_equal(t.array, a.T)


def test_join_rows_and_zero_padding():
    xs = [_sample(k) for k in range(3)]
    rows = [Tensor.of("data", xs[0]), None, Tensor.of("", xs[2][None])]  # a leading 1 is fine
    batch = join_rows(rows, SPECS[0], 4)
    assert isinstance(batch.data, bytes)  # one allocation for the whole batch
    assert batch.shape == (4, 2, 3) and batch.dtype == np.float32
    a = batch.array
    assert np.array_equal(a[0], xs[0]) and np.array_equal(a[2], xs[2])
    assert not a[1].any() and not a[3].any()  # the missing row and the padding are zeros
    # a row whose buffer does not hold exactly one sample is a zero row
    short = Tensor("data", np.dtype(np.float32), (2, 3), b"\0" * 8)
    assert not join_rows([short], SPECS[0], 1).array.any()


def test_batch_inputs_matches_by_name_or_first():
    specs = [TensorSpec("a", (2,), "float32"), TensorSpec("b", (3,), "int64")]
    r0 = [Tensor.of("b", np.array([1, 2, 3])), Tensor.of("a", np.array([1.0, 2.0], np.float32))]
    r1 = [Tensor.of("", np.array([5.0, 6.0], np.float32))]  # unnamed: the first input
    out = batch_inputs([r0, None, r1], 4, specs)
    assert [t.name for t in out] == ["a", "b"]
    assert out[0].array.tolist() == [[1, 2], [0, 0], [5, 6], [0, 0]]
    assert out[1].array.tolist() == [[1, 2, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert batch_inputs([None, []], 2, specs) is None


def test_rows_of_a_batch_are_views():
    out = Tensor.of("output", np.arange(12, dtype=np.float32).reshape(4, 3))
    r = out.row(2)
    assert r.name == "output" and r.shape == (3,) and r.array.tolist() == [6, 7, 8]
    assert np.shares_memory(r.array, out.array)
    # a batch that arrived as bytes (from a ResultMsg): rows are views of those bytes
    raw = Tensor("output", np.dtype(np.float32), (4, 3), out.array.tobytes())
    keep = np.frombuffer(raw.data, np.uint8)
    for i in range(4):
        assert np.shares_memory(raw.row(i).array, keep)
        assert raw.row(i).array.tolist() == out.array[i].tolist()


def test_check_inputs_messages():
    specs = [TensorSpec("data", (3, 4), "float32")]
    ok = Tensor.of("data", np.zeros((3, 4), np.float32))
    assert check_inputs([ok], specs) is None
    assert check_inputs([Tensor.of("", np.zeros((1, 3, 4), np.float32))], specs) is None
    assert check_inputs([Tensor.of("x", np.zeros((3, 4), np.float32))], specs) == \
        "input 'x' is not one of ['data']"
    assert check_inputs([Tensor.of("data", np.zeros((3, 10), np.float32))], specs) == \
        "input 'data' has shape [3, 10], expected [3, 4]"
    assert check_inputs([Tensor.of("data", np.zeros((3, 4), np.float64))], specs) == \
        "input 'data' has dtype float64, expected float32"
    short = Tensor("data", np.dtype(np.float32), (3, 4), b"\0" * 40)
    assert check_inputs([short], specs) == "input 'data': 40 bytes, expected 48"
    two = [TensorSpec("a", (1,), "float32"), TensorSpec("b", (1,), "float32")]
    assert check_inputs([Tensor.of("", np.zeros(1, np.float32))], two) == \
        "input '' is not one of ['a', 'b']"
    # one input twice, by name or by name and as the only one: which would run is no rule
    assert check_inputs([ok, ok], specs) == "input 'data' is given twice"
    assert check_inputs([ok, Tensor.of("", np.zeros((3, 4), np.float32))], specs) == \
        "input 'data' is given twice"
    a = Tensor.of("a", np.zeros(1, np.float32))
    assert check_inputs([a, Tensor.of("b", np.zeros(1, np.float32))], two) is None
    assert check_inputs([a, a], two) == "input 'a' is given twice"


def test_zero_rows_are_cached_and_read_only():
    specs = [TensorSpec("output", (1000,), "float32"), TensorSpec("ids", (5,), "int64")]
    z = zero_rows(specs)
    assert zero_rows(specs) is z
    assert [(t.name, t.shape, t.dtype) for t in z] == [
        ("output", (1000,), np.float32), ("ids", (5,), np.int64)]
    assert not z[0].array.any() and not z[0].array.flags.writeable
    assert isinstance(z[0].data, bytes)


def test_protobuf_edge_round_trip():
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol.wire import array_to_msg, msg_to_array, msg_to_tensor, tensor_to_msg

    a = _sample(3, (2, 5), np.float64)
    m = array_to_msg("x", a)
    assert (m.name, list(m.shape), m.dtype, len(m.data)) == ("x", [2, 5], "float64", 80)
    t = msg_to_tensor(m)
    assert isinstance(t.data, bytes) and np.array_equal(t.array, a)
    assert np.array_equal(msg_to_array(tensor_to_msg(t.row(1))), a[1])
    assert array_to_msg("y", a.astype(">f8")).data == a.tobytes()  # always little-endian
    with pytest.raises(TensorError, match="input 'x': unknown dtype 'nope'"):
        msg_to_tensor(pb.Tensor(name="x", shape=[1], dtype="nope", data=b"\0"))


def test_emulated_worker_sends_no_output_bytes():
    """A real emulated worker process: an INFER that wants outputs is answered with a
    ResultMsg that carries no tensors (the controller fills the zeros itself)."""
    grpc = pytest.importorskip("grpc")
    from clockwork.cluster.local import _Child, _cli
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol import clockwork_pb2_grpc as pbg
    from clockwork.protocol.wire import INT64_MAX

    w = _Child("worker", _cli() + ["worker", "--port", "0", "--gpus", "1"])
    try:
        addr = w.wait_address(30.0)
        outbox: queue.Queue = queue.Queue()

        def messages():
            while (m := outbox.get()) is not None:
                yield m

        with grpc.insecure_channel(addr) as ch:
            call = pbg.WorkerStub(ch).Connect(messages(), timeout=30)
            outbox.put(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL,
                worker_id=0, reset=True,
                instances=[pb.Instance(name="resnet50_v2", profile="resnet50_v2")])))
            first = next(call)
            assert first.WhichOneof("kind") == "state" and not first.state.missing
            outbox.put(pb.ControllerMessage(actions=pb.ActionBatch(actions=[
                pb.ActionMsg(id=1, type=0, gpu=0, model="resnet50_v2", latest=INT64_MAX),
                pb.ActionMsg(id=2, type=2, gpu=0, model="resnet50_v2", latest=INT64_MAX,
                             batch_size=4, want_outputs=True)])))
            results = {}
            for msg in call:
                for r in msg.results.results:
                    results[r.id] = r
                if 2 in results:
                    break
            outbox.put(None)
        infer = results[2]
        assert infer.status == 0 and infer.batch_size == 4, infer.message
        assert len(infer.outputs) == 0  # no output tensors travel from an emulated worker
        assert infer.ByteSize() < 200  # timing fields only (4 x 1000 float32 zeros: 16 kB)
    finally:
        w.stop()
