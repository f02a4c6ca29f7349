"""Conversions between the core dataclasses and the ``clockwork.v1`` messages.

Shared by the controller and worker shells (neither imports the other). Window times
are converted between clocks by the caller; these functions copy fields as they are.
"""

from __future__ import annotations

import numpy as np

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, Result
from clockwork.protocol import clockwork_pb2 as pb

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


def batch_inputs(requests, batch_size: int, specs) -> list[pb.Tensor] | None:
    """One INFER's input tensors: each request's sample as a row, in order, zero rows
    after them. ``specs``: the model's input TensorSpecs. None if no request has inputs.
    A request's tensor is matched by name, or is the only input when unnamed."""
    if not any(r.inputs for r in requests):
        return None
    out = []
    for k, spec in enumerate(specs):
        row = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        parts = []
        for r in requests:
            data = b""
            for t in r.inputs or ():
                if t.name == spec.name or (not t.name and k == 0):
                    data = t.data
                    break
            parts.append(data if len(data) == row else bytes(row))
        parts.append(bytes(row * (batch_size - len(requests))))
        out.append(pb.Tensor(name=spec.name, shape=[batch_size, *spec.shape], dtype=spec.dtype,
                             data=b"".join(parts)))
    return out


def msg_to_action(m: pb.ActionMsg, worker: int = 0) -> Action:
    return Action(id=m.id, type=ActionType(m.type), worker=worker, gpu=m.gpu, model=m.model,
                  earliest=m.earliest, latest=NEVER if m.latest >= INT64_MAX else m.latest,
                  expected_duration=m.expected_duration, batch_size=m.batch_size,
                  version=m.version)


def result_to_msg(r: Result, outputs: list[pb.Tensor] | None = None) -> pb.ResultMsg:
    return pb.ResultMsg(id=r.id, type=int(r.type), status=int(r.status), gpu=r.gpu,
                        model=r.model, batch_size=r.batch_size, received=r.received,
                        begin=r.begin, end=r.end, duration=r.duration, message=r.message,
                        outputs=outputs or ())


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
                  outputs=list(m.outputs) if m.outputs else None)


def tensor_to_msg(name: str, arr: np.ndarray) -> pb.Tensor:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return pb.Tensor(name=name, shape=list(arr.shape), dtype=arr.dtype.name, data=arr.tobytes())


def msg_to_array(t: pb.Tensor) -> np.ndarray:
    return np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape))
