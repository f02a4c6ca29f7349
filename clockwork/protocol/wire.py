"""Conversions between the core dataclasses and the ``clockwork.v1`` messages.

Shared by the controller and worker shells (neither imports the other). Window times
are converted between clocks by the caller; these functions copy fields as they are.

Tensors: inside the processes they are ``clockwork.tensors.Tensor``; ``pb.Tensor`` exists
only here and in the messages. Protobuf copies a bytes field on every read and write, so
each conversion reads or writes ``data`` exactly once: a ``pb.Tensor`` becomes a Tensor
over the one ``bytes`` object read out of it; a Tensor becomes a ``pb.Tensor`` by one
write of its data (after ``tobytes()`` when its buffer is not ``bytes`` already).

Decoding checks what the message says and raises :class:`WireError` (a ``ValueError``)
for anything the rest of the process could not handle: an unknown action type, a
negative batch size or duration, a dtype numpy does not know or that is not a plain
number type, a negative or absurd shape, a result's output tensor whose bytes do not fit
its shape. That is the only exception a decoder raises, whatever the message holds
(``tests/test_wire_fuzz.py``), so a shell can drop or answer one bad message and carry on.
"""

from __future__ import annotations

import warnings

import numpy as np

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, Result
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.tensors import Tensor, TensorError
from clockwork.time import RESULT_SPAN_MAX_NS

# how much longer than its span (end - begin) a result's duration may be: a device's own
# timer against the worker's clock (a duration of 10^15 ns in a span of milliseconds made
# every request of the model TIMEOUT, the estimate a percentile of what came)
DURATION_SLACK_NS = 1_000_000

INT64_MAX = (1 << 63) - 1
MAX_DIMS = 32  # a tensor with more dimensions is refused
_NUMERIC_KINDS = frozenset("biufc")  # bool, int, uint, float, complex


class WireError(ValueError):
    """A message field that cannot be decoded; the text says which and why."""


class TensorWireError(WireError, TensorError):
    """A ``pb.Tensor`` that cannot be read (both a ``WireError`` and a ``TensorError``)."""


_ACTION_TYPES = {int(t): t for t in ActionType}
# a worker's result statuses: every code but the controller's own (a worker saying
# WORKER_LOST is a worker saying something it cannot mean: a bug, as an unknown code)
_ERROR_CODES = {int(c): c for c in ErrorCode if c != ErrorCode.WORKER_LOST}
_dtypes: dict[str, np.dtype] = {}


def _dtype(name: str, what: str) -> np.dtype:
    """A plain little-endian number dtype from its name (cached)."""
    dt = _dtypes.get(name)
    if dt is not None:
        return dt
    try:
        with warnings.catch_warnings():  # (a deprecated alias, "a": refused below anyway,
            warnings.simplefilter("ignore", DeprecationWarning)  # not a warning in a log)
            dt = np.dtype(name)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError, SyntaxError...
        raise TensorWireError(f"{what}: unknown dtype {name!r}") from None
    if dt.kind not in _NUMERIC_KINDS or dt.shape != () or dt.byteorder == ">":
        raise TensorWireError(f"{what}: dtype {name!r} is not a little-endian number type")
    if len(_dtypes) < 256:
        _dtypes[name] = dt
    return dt


def action_to_msg(a: Action, offset: int = 0) -> pb.ActionMsg:
    """``offset`` = worker clock - controller clock, added to the window."""
    m = pb.ActionMsg()
    _fill_action(m, a, offset)
    return m


def add_action(field, a: Action, offset: int = 0) -> pb.ActionMsg:
    """:func:`action_to_msg`, appended to a repeated ``ActionMsg`` field (``ActionBatch
    .actions``) and built there (a message built apart is copied once more when added)."""
    m = field.add()
    _fill_action(m, a, offset)
    return m


def _fill_action(m: pb.ActionMsg, a: Action, offset: int) -> None:
    m.id = a.id
    m.type = a.type
    m.gpu = a.gpu
    m.model = a.model
    if a.earliest:
        m.earliest = a.earliest + offset
    latest = a.latest
    m.latest = INT64_MAX if latest >= NEVER else latest + offset
    m.expected_duration = a.expected_duration
    m.batch_size = a.batch_size
    m.version = a.version
    reqs = a.requests
    if reqs:  # (its requests' deadlines, as the scheduler set them: 0 where none did)
        by = min(r.deadline for r in reqs)
        if by > 0:
            m.answer_by = by + offset


# the longest model name an action may carry: every instance name is far shorter
# (``clockwork.names``: 128 characters and a copy's ":K"); a longer one is refused, not
# echoed back in its result (a 33 MiB name made a result past the message limit, which
# ended the session and lost the other results of its message)
ACTION_MODEL_CHARS = 256


def msg_to_action(m: pb.ActionMsg, worker: int = 0) -> Action:
    """Raises ``WireError`` for an unknown type, a negative batch size or duration, or a
    model name past ``ACTION_MODEL_CHARS`` (a GPU the worker does not have is the
    worker's to answer: ``INVALID_GPU``)."""
    t = _ACTION_TYPES.get(m.type)
    if t is None:
        raise WireError(f"action {m.id}: unknown action type {m.type}")
    if len(m.model) > ACTION_MODEL_CHARS:
        raise WireError(f"action {m.id}: a model name of {len(m.model):,} characters (at "
                        f"most {ACTION_MODEL_CHARS})")
    if m.batch_size < 0 or m.expected_duration < 0:
        raise WireError(f"action {m.id}: negative batch size or expected duration "
                        f"({m.batch_size}, {m.expected_duration})")
    return Action(id=m.id, type=t, worker=worker, gpu=m.gpu, model=m.model,
                  earliest=m.earliest, latest=NEVER if m.latest >= INT64_MAX else m.latest,
                  expected_duration=m.expected_duration, batch_size=m.batch_size,
                  version=m.version)


def result_to_msg(r: Result, outputs: list[Tensor] | None = None) -> pb.ResultMsg:
    """``outputs``: the tensors to send with it (None: none, whatever ``r.outputs`` holds)."""
    m = pb.ResultMsg()
    _fill_result(m, r)
    if outputs:
        add_tensors(m.outputs, outputs)
    return m


def add_result(field, r: Result) -> pb.ResultMsg:
    """:func:`result_to_msg` without outputs, appended to a repeated ``ResultMsg`` field
    (``ResultBatch.results``) and built there (no copy); the caller adds the outputs."""
    m = field.add()
    _fill_result(m, r)
    return m


def _fill_result(m: pb.ResultMsg, r: Result) -> None:
    m.id = r.id
    m.type = r.type
    m.status = r.status
    m.gpu = r.gpu
    m.model = r.model
    m.batch_size = r.batch_size
    m.received = r.received
    m.begin = r.begin
    m.end = r.end
    m.duration = r.duration
    m.message = r.message


def msg_to_result(m: pb.ResultMsg, worker: int, offset: int = 0, attached=None) -> Result:
    """``offset`` = worker clock - controller clock, subtracted from the times;
    ``attached``: the outputs' attached bytes (:func:`split_attachments`). An
    unknown status code reads as ``INVALID_INPUT`` (the action failed, reason unknown).
    Raises ``WireError`` for an unknown type, a negative GPU, batch size or duration, a
    duration past ``RESULT_SPAN_MAX_NS`` or longer than its span (``DURATION_SLACK_NS``
    aside: the work is timed inside the span), times before the worker's clock began or an
    end before its begin, or an output tensor that is unreadable, has no batch dimension of
    at least ``batch_size`` rows, or whose bytes do not fit its shape."""
    t = _ACTION_TYPES.get(m.type)
    if t is None:
        raise WireError(f"result {m.id}: unknown action type {m.type}")
    gpu, batch, duration = m.gpu, m.batch_size, m.duration
    if gpu < 0 or batch < 0 or duration < 0:
        raise WireError(f"result {m.id}: negative gpu, batch size or duration "
                        f"({gpu}, {batch}, {duration})")
    received, begin, end = m.received, m.begin, m.end
    if duration > RESULT_SPAN_MAX_NS or received < 0 or begin < 0 or end < 0 or (
            begin and end and (end < begin or duration > end - begin + DURATION_SLACK_NS)):
        # (taken, a LOAD's span of 2^63 ns became the model's LOAD estimate, and every
        # later LOAD's expected duration left int64: no worker could be written to)
        raise WireError(f"result {m.id}: times that cannot be (received {received}, begin "
                        f"{begin}, end {end}, duration {duration})")
    status = _ERROR_CODES.get(m.status, ErrorCode.INVALID_INPUT)
    outputs = None
    if m.outputs:
        outputs = msgs_to_tensors(m.outputs, attached)
        for o in outputs:
            if not o.shape or o.shape[0] < batch or o.nbytes != _nbytes(o):
                raise TensorWireError(f"result {m.id}: output {o.name!r} of shape "
                                      f"{list(o.shape)} ({o.nbytes} bytes) does not hold a "
                                      f"batch of {batch}")
    return Result(id=m.id, type=t, status=status, worker=worker, gpu=gpu, model=m.model,
                  batch_size=batch, received=received - offset if received else 0,
                  begin=begin - offset if begin else 0, end=end - offset if end else 0,
                  duration=duration, message=m.message, outputs=outputs)


def _nbytes(t: Tensor) -> int:
    """Bytes the tensor's shape and dtype call for."""
    n = t.dtype.itemsize
    for d in t.shape:
        n *= d
    return n


def tensor_to_msg(t: Tensor) -> pb.Tensor:
    return pb.Tensor(name=t.name, shape=t.shape, dtype=t.dtype.name, data=t.to_bytes())


def add_tensors(field, tensors) -> None:
    """Append ``tensors`` to a repeated ``pb.Tensor`` field, built in place (``append``
    would copy each message once more)."""
    for t in tensors:
        field.add(name=t.name, shape=t.shape, dtype=t.dtype.name, data=t.to_bytes())


def msg_to_tensor(m: pb.Tensor, attached=None) -> Tensor:
    """A Tensor over the message's bytes, or over ``attached`` (its bytes from the
    frame's attachments, see :func:`split_attachments`) when the message says its data
    is attached. Its size is not checked against the shape
    (``clockwork.tensors.check_inputs`` does that for client inputs). Raises
    ``TensorWireError`` (a ``TensorError``) for a dtype name numpy does not know, one
    that is not a little-endian number type, a negative dimension or more than
    ``MAX_DIMS`` dimensions, or attached data that did not come."""
    what = f"input {m.name!r}"
    dtype = _dtype(m.dtype, what)
    shape = tuple(m.shape)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise TensorWireError(f"{what}: bad shape {list(shape[:MAX_DIMS + 1])}")
    if m.attached:
        if attached is None:
            raise TensorWireError(f"{what}: {m.attached} attached bytes that did not come")
        return Tensor(m.name, dtype, shape, attached)
    return Tensor(m.name, dtype, shape, m.data)


def msgs_to_tensors(msgs, attached=None) -> list[Tensor]:
    """``attached``: the tensors' attached bytes, one entry per message (None: none)."""
    if attached is None:
        return [msg_to_tensor(m) for m in msgs]
    return [msg_to_tensor(m, a) for m, a in zip(msgs, attached, strict=True)]


def split_attachments(msgs, tail, field: str = "inputs") -> list[list] | None:
    """A frame's attachments (``tail``, a memoryview) cut per message (actions: their
    ``inputs``; results, ``field="outputs"``) and tensor, in order (``[i][k]``: message
    i's tensor k, a view; None where not attached), or None when the frame has none. Cut
    for every tensor before any is decoded, so that one malformed message cannot shift
    its neighbours' bytes; raises ``WireError`` when the sizes the messages give do not
    add up to the attachments."""
    if not len(tail):
        return None
    out, off, n = [], 0, len(tail)
    for m in msgs:
        cuts = []
        for t in getattr(m, field):
            k = t.attached
            if k:
                if off + k > n:
                    raise WireError(f"attachments: {n} bytes, the tensors say more")
                cuts.append(tail[off:off + k])
                off += k
            else:
                cuts.append(None)
        out.append(cuts)
    if off != n:
        raise WireError(f"attachments: {n} bytes, the tensors account for {off}")
    return out


def cut_attachments(msgs, tail, field: str = "inputs") -> tuple[list[list] | None,
                                                                   WireError | None]:
    """``split_attachments`` for a frame that may have come without a tail (``tail`` None:
    the gRPC stream): (the cuts or None, None), or (None, the error) when the sizes do not
    add up -- every message of that frame is then malformed, each answered on its own."""
    if tail is None:
        return None, None
    try:
        return split_attachments(msgs, tail, field), None
    except WireError as e:
        return None, e


def attach_tensor(field, name: str, shape, dtype, buffers, attachments: list) -> None:
    """Append a tensor to a repeated ``pb.Tensor`` field whose data travels as
    ``buffers`` (its rows, in order) among a frame's ``attachments``, not in the
    message. ``dtype``: a numpy dtype or its name."""
    field.add(name=name, shape=shape, dtype=np.dtype(dtype).name,
              attached=sum(memoryview(b).nbytes for b in buffers))
    attachments.extend(buffers)


def array_to_msg(name: str, arr: np.ndarray) -> pb.Tensor:
    """A numpy array as a ``pb.Tensor`` (little-endian, C order)."""
    return tensor_to_msg(Tensor.of(name, arr))


def msg_to_array(t: pb.Tensor) -> np.ndarray:
    """A numpy view (read-only) over a ``pb.Tensor``'s bytes."""
    return msg_to_tensor(t).array
