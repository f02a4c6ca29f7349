"""Conversions between the core dataclasses and the ``clockwork.v1`` messages.

Shared by the controller and worker shells (neither imports the other). Window times
are converted between clocks by the caller; these functions copy fields as they are.

Tensors: inside the processes they are ``clockwork.tensors.Tensor``; ``pb.Tensor`` exists
only here and in the messages. Protobuf copies a bytes field on every read and write, so
each conversion reads or writes ``data`` exactly once: a ``pb.Tensor`` becomes a Tensor
over the one ``bytes`` object read out of it; a Tensor becomes a ``pb.Tensor`` by one
write of its data (after ``tobytes()`` when its buffer is not ``bytes`` already).
"""

from __future__ import annotations

import numpy as np

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, Result
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.tensors import Tensor, TensorError

INT64_MAX = (1 << 63) - 1


def action_to_msg(a: Action, offset: int = 0) -> pb.ActionMsg:
    """``offset`` = worker clock - controller clock, added to the window."""
    latest = a.latest
    return pb.ActionMsg(
        id=a.id, type=int(a.type), gpu=a.gpu, model=a.model,
        earliest=a.earliest + offset if a.earliest else 0,
        latest=INT64_MAX if latest >= NEVER else latest + offset,
        expected_duration=a.expected_duration, batch_size=a.batch_size, version=a.version,
    )


def msg_to_action(m: pb.ActionMsg, worker: int = 0) -> Action:
    return Action(id=m.id, type=ActionType(m.type), worker=worker, gpu=m.gpu, model=m.model,
                  earliest=m.earliest, latest=NEVER if m.latest >= INT64_MAX else m.latest,
                  expected_duration=m.expected_duration, batch_size=m.batch_size,
                  version=m.version)


def result_to_msg(r: Result, outputs: list[Tensor] | None = None) -> pb.ResultMsg:
    """``outputs``: the tensors to send with it (None: none, whatever ``r.outputs`` holds)."""
    m = pb.ResultMsg(id=r.id, type=int(r.type), status=int(r.status), gpu=r.gpu,
                     model=r.model, batch_size=r.batch_size, received=r.received,
                     begin=r.begin, end=r.end, duration=r.duration, message=r.message)
    if outputs:
        add_tensors(m.outputs, outputs)
    return m


def msg_to_result(m: pb.ResultMsg, worker: int, offset: int = 0) -> Result:
    """``offset`` = worker clock - controller clock, subtracted from the times."""
    try:
        status = ErrorCode(m.status)
    except ValueError:
        status = ErrorCode.INVALID_INPUT
    return Result(id=m.id, type=ActionType(m.type), status=status, worker=worker, gpu=m.gpu,
                  model=m.model, batch_size=m.batch_size,
                  received=m.received - offset if m.received else 0,
                  begin=m.begin - offset if m.begin else 0,
                  end=m.end - offset if m.end else 0,
                  duration=m.duration, message=m.message,
                  outputs=msgs_to_tensors(m.outputs) if m.outputs else None)


def tensor_to_msg(t: Tensor) -> pb.Tensor:
    return pb.Tensor(name=t.name, shape=t.shape, dtype=t.dtype.name, data=t.to_bytes())


def add_tensors(field, tensors) -> None:
    """Append ``tensors`` to a repeated ``pb.Tensor`` field, built in place (``append``
    would copy each message once more)."""
    for t in tensors:
        field.add(name=t.name, shape=t.shape, dtype=t.dtype.name, data=t.to_bytes())


def msg_to_tensor(m: pb.Tensor) -> Tensor:
    """A Tensor over the message's bytes. Its size is not checked against the shape
    (``clockwork.tensors.check_inputs`` does that for client inputs). Raises
    ``TensorError`` for a dtype name numpy does not know."""
    try:
        dtype = np.dtype(m.dtype)
    except TypeError:
        raise TensorError(f"input {m.name!r}: unknown dtype {m.dtype!r}") from None
    return Tensor(m.name, dtype, tuple(m.shape), m.data)


def msgs_to_tensors(msgs) -> list[Tensor]:
    return [msg_to_tensor(m) for m in msgs]


def array_to_msg(name: str, arr: np.ndarray) -> pb.Tensor:
    """A numpy array as a ``pb.Tensor`` (little-endian, C order)."""
    return tensor_to_msg(Tensor.of(name, arr))


def msg_to_array(t: pb.Tensor) -> np.ndarray:
    """A numpy view (read-only) over a ``pb.Tensor``'s bytes."""
    return msg_to_tensor(t).array
