"""Property tests of the wire decoders (clockwork/protocol/wire.py): whatever a message
holds, a decoder returns a value the rest of the process can use or raises ``WireError``,
never anything else."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from clockwork.actions import ActionType, ErrorCode  # noqa: E402
from clockwork.protocol import clockwork_pb2 as pb  # noqa: E402
from clockwork.protocol.wire import (  # noqa: E402
    DURATION_SLACK_NS,
    WireError,
    msg_to_action,
    msg_to_result,
    msg_to_tensor,
    msgs_to_tensors,
)
from clockwork.tensors import TensorError  # noqa: E402
from clockwork.time import RESULT_SPAN_MAX_NS  # noqa: E402

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64 = st.integers(0, (1 << 64) - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)  # valid UTF-8
# dtype names: the ones clients send, numpy's odd ones, and anything at all
DTYPES = st.one_of(
    st.sampled_from(["float32", "float16", "float64", "int8", "int64", "uint8", "bool",
                     "complex64", ">f4", "<i2", "object", "O", "S5", "U3", "V8", "M8[ns]",
                     "f4,i4", "(2,3)f4", "[('a', '<f4')]", "", "float", "int", "nope"]),
    TEXT)
TYPES = st.one_of(st.sampled_from([int(t) for t in ActionType]), INT32)
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw) -> pb.Tensor:
    shape = draw(st.one_of(st.lists(st.integers(-2, 6), max_size=4),
                           st.lists(INT64, max_size=3),
                           st.lists(st.integers(0, 2), min_size=30, max_size=40)))
    dtype = draw(DTYPES)
    if draw(st.booleans()):  # bytes that fit the shape, when it can be computed
        try:
            n = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        except Exception:  # noqa: BLE001
            n = 0
        data = bytes(n) if 0 <= n <= 4096 else b""
    else:
        data = draw(st.binary(max_size=64))
    return pb.Tensor(name=draw(TEXT), shape=shape, dtype=dtype, data=data)


@st.composite
def results(draw) -> pb.ResultMsg:
    return pb.ResultMsg(
        id=draw(UINT64), type=draw(TYPES), status=draw(INT32), gpu=draw(INT32),
        model=draw(TEXT), batch_size=draw(st.one_of(st.integers(-2, 8), INT32)),
        received=draw(INT64), begin=draw(INT64), end=draw(INT64),
        duration=draw(INT64), message=draw(TEXT),
        outputs=draw(st.lists(tensors(), max_size=3)))


@st.composite
def actions(draw) -> pb.ActionMsg:
    return pb.ActionMsg(
        id=draw(UINT64), type=draw(TYPES), gpu=draw(INT32), model=draw(TEXT),
        earliest=draw(INT64), latest=draw(INT64), expected_duration=draw(INT64),
        batch_size=draw(INT32), version=draw(INT64),
        inputs=draw(st.lists(tensors(), max_size=2)), want_outputs=draw(st.booleans()))


@SETTINGS
@given(results(), st.integers(0, 4), INT64)
def test_msg_to_result_returns_a_usable_result_or_raises_wire_error(m, worker, offset):
    try:
        r = msg_to_result(m, worker, offset)
    except WireError:
        return
    assert isinstance(r.type, ActionType) and isinstance(r.status, ErrorCode)
    assert r.gpu >= 0 and r.batch_size >= 0 and 0 <= r.duration <= RESULT_SPAN_MAX_NS
    # times on the worker's clock from its start, an end no earlier than its begin
    assert min(m.received, m.begin, m.end) >= 0
    assert not (m.begin and m.end) or m.end >= m.begin
    assert not (m.begin and m.end) or m.duration <= m.end - m.begin + DURATION_SLACK_NS
    for t in r.outputs or ():
        a = t.array  # the bytes fit the shape: no ValueError downstream
        assert a.shape == t.shape and a.shape[0] >= r.batch_size
        for i in range(r.batch_size):
            t.row(i)


@SETTINGS
@given(actions())
def test_msg_to_action_returns_an_action_or_raises_wire_error(m):
    try:
        a = msg_to_action(m, 0)
    except WireError:
        return
    assert isinstance(a.type, ActionType) and a.batch_size >= 0 and a.expected_duration >= 0


@SETTINGS
@given(st.lists(tensors(), max_size=4))
def test_msgs_to_tensors_raise_only_wire_errors(ms):
    try:
        ts = msgs_to_tensors(ms)
    except WireError as e:
        assert isinstance(e, TensorError)  # client inputs: answered bad_input
        return
    for t in ts:
        assert t.dtype.kind in "biufc" and all(d >= 0 for d in t.shape)


@SETTINGS
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decoded_then_converted(data):
    """Whatever protobuf makes of arbitrary bytes goes through the decoders safely."""
    for cls, conv in ((pb.ResultMsg, lambda m: msg_to_result(m, 0)),
                      (pb.ActionMsg, lambda m: msg_to_action(m, 0)),
                      (pb.Tensor, msg_to_tensor)):
        try:
            m = cls.FromString(data)
        except Exception:  # noqa: BLE001 - not a message at all: gRPC refuses it earlier
            continue
        try:
            conv(m)
        except WireError:
            pass


def test_typed_errors_name_the_problem():
    with pytest.raises(WireError, match="unknown action type 7"):
        msg_to_result(pb.ResultMsg(id=3, type=7), 0)
    with pytest.raises(WireError, match="unknown action type -1"):
        msg_to_action(pb.ActionMsg(id=3, type=-1))
    with pytest.raises(TensorError, match="input 'x': unknown dtype 'nope'"):
        msg_to_tensor(pb.Tensor(name="x", shape=[1], dtype="nope"))
    with pytest.raises(TensorError, match="not a little-endian number type"):
        msg_to_tensor(pb.Tensor(name="x", shape=[1], dtype="object"))
    with pytest.raises(WireError, match="does not hold a batch of 2"):
        msg_to_result(pb.ResultMsg(id=1, type=2, batch_size=2, outputs=[
            pb.Tensor(name="o", shape=[1, 3], dtype="float32", data=bytes(12))]), 0)
    r = msg_to_result(pb.ResultMsg(id=1, type=2, status=12345, batch_size=2, outputs=[
        pb.Tensor(name="o", shape=[2, 3], dtype="float32", data=bytes(24))]), 0)
    assert r.status == ErrorCode.INVALID_INPUT and r.outputs[0].array.shape == (2, 3)
    # the controller's own code is not a worker's to send (it was taken as one)
    r = msg_to_result(pb.ResultMsg(id=1, type=2, status=int(ErrorCode.WORKER_LOST)), 0)
    assert r.status == ErrorCode.INVALID_INPUT


@SETTINGS
@given(st.sampled_from(list(ActionType)), st.integers(0, 7), st.integers(0, 1 << 40),
       st.integers(0, 1 << 40), st.booleans(), st.integers(-(1 << 20), 1 << 20), TEXT)
def test_actions_and_results_built_in_place_round_trip(kind, gpu, earliest, span, never,
                                                       offset, model):
    """``add_action`` / ``add_result`` (built inside a batch) make the messages
    ``action_to_msg`` / ``result_to_msg`` make, and they decode to what was encoded."""
    from clockwork.actions import NEVER, Action, Result
    from clockwork.protocol.wire import action_to_msg, add_action, add_result, result_to_msg

    a = Action(id=span + 1, type=kind, worker=0, gpu=gpu, model=model, earliest=earliest,
               latest=NEVER if never else earliest + span, expected_duration=span,
               batch_size=gpu, version=3)
    batch = pb.ControllerMessage()
    m = add_action(batch.actions.actions, a, offset)
    assert m == action_to_msg(a, offset) and batch.actions.actions[0] == m
    b = msg_to_action(m, 0)
    assert (b.id, b.type, b.gpu, b.model, b.expected_duration, b.batch_size, b.version) == (
        a.id, a.type, a.gpu, a.model, a.expected_duration, a.batch_size, a.version)
    assert b.earliest == (earliest + offset if earliest else 0)
    assert b.latest == (NEVER if never else earliest + span + offset)
    r = Result(id=a.id, type=kind, status=ErrorCode.SUCCESS if never else ErrorCode.INVALID_GPU,
               worker=0, gpu=gpu, model=model, batch_size=gpu, received=earliest,
               begin=earliest + 1, end=earliest + span + 1, duration=span, message=model)
    out = pb.WorkerMessage()
    m = add_result(out.results.results, r)
    assert m == result_to_msg(r) and out.WhichOneof("kind") == "results"
    back = msg_to_result(pb.ResultMsg.FromString(m.SerializeToString()), 0, 0)
    assert back == r


def test_an_action_with_a_model_name_past_the_limit_is_malformed():
    """A model name longer than any instance's is refused as the action is read (it was
    echoed back twice in its result: a 33 MiB name made a result past gRPC's message
    limit, which ended the session with the other results of its message)."""
    from clockwork.protocol.wire import ACTION_MODEL_CHARS, WireError, msg_to_action

    ok = pb.ActionMsg(id=1, type=int(ActionType.LOAD), model="m" * ACTION_MODEL_CHARS)
    assert msg_to_action(ok).model == ok.model
    with pytest.raises(WireError, match="model name of 257 characters"):
        msg_to_action(pb.ActionMsg(id=2, type=int(ActionType.LOAD),
                                   model="m" * (ACTION_MODEL_CHARS + 1)))
