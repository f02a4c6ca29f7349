"""Client requests as the controller sees them, and their answers."""

from __future__ import annotations

from clockwork.actions import RequestStatus

# Request.state; WITHDRAWN: in an INFER sent, its caller gone (``Policy.cancel``): answered
# as usual if the INFER runs, not queued again if it fails
QUEUED, EXECUTING, DONE, WITHDRAWN = 0, 1, 2, 3


class Request:
    """One inference request. Times are int ns on the controller's clock.

    ``slo`` 0 means "the scheduler's default". The scheduler fills ``deadline``
    (arrival + slo - buffer), ``drop_at`` (last moment a batch-1 EXEC could start)
    and its own bookkeeping fields.

    ``inputs`` (live system): the client's input tensors, a ``list`` of
    ``clockwork.tensors.Tensor`` checked against the model's input specs (each of the
    spec's shape, or with a leading batch dimension of 1), or None (the worker runs
    zeros). ``row`` is the request's row in the INFER batch that serves it. ``typed``
    (live system): its answer is an :class:`Answer` (for a front end in the controller's
    process), not a ``clockwork.v1`` message.
    """

    __slots__ = ("id", "model", "arrival", "slo", "deadline", "drop_at", "state", "demand",
                 "cold", "tag", "inputs", "row", "want_outputs", "typed")

    def __init__(self, id: int, model: str, arrival: int, slo: int = 0, tag: object = None,
                 inputs: object = None) -> None:
        self.id = id
        self.model = model
        self.arrival = arrival
        self.slo = slo
        self.deadline = 0
        self.drop_at = 0
        self.state = QUEUED
        self.demand = 0.0
        self.cold = False
        self.tag = tag  # whoever submitted it (workload index, client stream, ...)
        self.inputs = inputs  # list[Tensor] from the client (live system), or None
        self.row = 0  # its row in the INFER batch that serves it (set when sent)
        self.want_outputs = True  # live system: the client wants output tensors back
        self.typed = False  # live system: answered with an Answer (see the class docstring)

    def __repr__(self) -> str:
        return f"Request(id={self.id}, model={self.model!r}, arrival={self.arrival}, slo={self.slo})"


class Reply:
    """The one answer to a request. ``time`` is when the controller answered.

    ``outputs``: the output tensors of the whole INFER batch that served the request (a
    ``list`` of ``clockwork.tensors.Tensor`` with a leading batch dimension, shared by
    the batch's replies; the request's own row is ``outputs[k].row(request.row)``, a
    view), or None: no tensors came back (the emulated device, or nobody wanted them).
    """

    __slots__ = ("request", "status", "time", "message", "gpu", "batch_size", "outputs")

    def __init__(self, request: Request, status: RequestStatus, time: int, message: str = "",
                 gpu: int = -1, batch_size: int = 0, outputs: object = None) -> None:
        self.request = request
        self.status = status
        self.time = time
        self.message = message
        self.gpu = gpu
        self.batch_size = batch_size
        self.outputs = outputs

    @property
    def latency(self) -> int:
        return self.time - self.request.arrival

    @property
    def slo_met(self) -> bool:
        r = self.request
        return self.status == RequestStatus.SUCCESS and self.time <= r.arrival + r.slo

    def __repr__(self) -> str:
        return (f"Reply(request={self.request.id}, status={self.status.name}, time={self.time}, "
                f"message={self.message!r})")


class Answer:
    """A live request's answer for a front end inside the controller's process (KServe v2):
    the fields of a ``clockwork.v1`` ``InferResponse``, with ``outputs`` the request's
    own output rows as ``clockwork.tensors.Tensor`` views into the batch's outputs (or
    the cached zero rows of an emulated device), so that the front end copies each row
    once, into its own response, instead of into a message and out of it again."""

    __slots__ = ("status", "reason", "message", "client_id", "outputs", "latency_ns",
                 "batch_size", "gpu", "cold")

    def __init__(self, status: int, message: str = "", reason: str = "", outputs=(),
                 latency_ns: int = 0, batch_size: int = 0, gpu: int = -1,
                 cold: bool = False) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.client_id = 0
        self.outputs = outputs
        self.latency_ns = latency_ns
        self.batch_size = batch_size
        self.gpu = gpu
        self.cold = cold
