"""The worker's driver: the one piece of glue between a worker's ``GpuExecutor``s (pure
cores, one per GPU) and whatever carries its messages.

The simulator and the gRPC worker service both run a ``WorkerLoop``; they differ only in
the ``WorkerTransport`` (an event queue on a virtual clock, or a gRPC stream, an asyncio
timer and device threads on the real clock). The loop never reads a clock: every call
says what time it is (int ns, this worker's clock).

For every event (actions arrive, the timer fires, a real device finishes an action) the
loop feeds the executors, hands the finished results to ``results`` (one call per event),
hands the actions a real device must now run to ``run``, and arms one timer for the
earliest time an executor wants to be advanced.
"""

from __future__ import annotations

from typing import Protocol

from clockwork.actions import Action, ActionType, ErrorCode, Result
from worker.executor import GpuExecutor


class WorkerTransport(Protocol):
    def results(self, results: list[Result]) -> None:
        """Send these results (one message) to the controller."""

    def run(self, executor: GpuExecutor, action: Action) -> None:
        """A real device must run this open action now; the transport reports back with
        ``loop.complete``. Never called for emulated executors."""

    def arm(self, at: int) -> None:
        """Call ``loop.timer`` at or after ``at``; replaces any timer armed for later."""


class WorkerLoop:
    def __init__(self, worker: int, executors: list[GpuExecutor], transport: WorkerTransport,
                 real: bool = False) -> None:
        self.worker = worker
        self.executors = executors
        self.transport = transport
        self.real = real  # executors start actions open (take_started / complete)
        self.armed: int | None = None

    def reset(self, worker: int, executors: list[GpuExecutor]) -> None:
        """New executors (a controller said Hello with a reset); the timer stays armed."""
        self.worker = worker
        self.executors = executors

    # ------------------------------------------------------------------ events

    def submit(self, actions, now: int) -> None:
        """Actions arrived (``Action`` objects, windows on this worker's clock). One the
        executor raises on (values it cannot take) is answered ``INVALID_INPUT``; the
        others go on."""
        out: list[Result] = []
        executors = self.executors
        n = len(executors)
        for a in actions:
            g = a.gpu
            if 0 <= g < n:
                try:
                    out.extend(executors[g].submit(a, now))
                except Exception as e:  # noqa: BLE001 - one action the executor cannot take
                    out.append(Result(id=a.id, type=a.type, status=ErrorCode.INVALID_INPUT,
                                      worker=self.worker, gpu=g, model=a.model,
                                      batch_size=a.batch_size, received=now, begin=now,
                                      end=now, message=f"action refused: {e!r}"))
            else:
                out.append(Result(id=a.id, type=a.type, status=ErrorCode.INVALID_GPU,
                                  worker=self.worker, gpu=g, model=a.model,
                                  batch_size=a.batch_size, received=now, begin=now, end=now,
                                  message=f"no gpu {g} (worker has {n})"))
        self._after(out, now)

    def timer(self, now: int) -> None:
        """The armed timer fired: advance every executor to ``now``."""
        self.armed = None
        out: list[Result] = []
        for e in self.executors:
            out.extend(e.advance(now))
        self._after(out, now)

    def complete(self, executor: GpuExecutor, action_id: int, now: int,
                 status: ErrorCode = ErrorCode.SUCCESS, message: str = "",
                 duration: int | None = None, outputs: object = None,
                 kind: ActionType | None = None) -> None:
        """A real device finished an open action; the worker hears of it at ``now``
        (``GpuExecutor.complete``)."""
        if not any(e is executor for e in self.executors):  # (not ``in``: dataclass ==)
            return  # an action of executors replaced by a reset
        res = executor.complete(action_id, now, status, message, duration, outputs, kind)
        self._after(res, now)

    def forget(self, model: str, now: int) -> None:
        """Instance ``model`` left the worker (the caller takes it out of the executors'
        ``models``): every GPU drops its weights and answers its queued actions
        (``GpuExecutor.forget``)."""
        out: list[Result] = []
        for e in self.executors:
            out.extend(e.forget(model, now))
        self._after(out, now)

    # ------------------------------------------------------------------ output

    def _after(self, out: list[Result], now: int) -> None:
        t = self.transport
        if out:
            t.results(out)
        if self.real:
            for e in self.executors:
                for a in e.take_started():
                    t.run(e, a)
        nt = None
        for e in self.executors:
            x = e.next_time()
            if x is not None and (nt is None or x < nt):
                nt = x
        if nt is None:
            return
        armed = self.armed
        if armed is not None and now <= armed <= nt:
            return  # the timer armed will do (one that is overdue is replaced)
        self.armed = nt
        t.arm(nt)
