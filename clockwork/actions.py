"""The vocabulary controller and workers speak: actions, results, codes.

Codes have the numbers of Clockwork's C++ API (``include/clockwork/api/worker_api.h``
for ``ErrorCode``, ``api_common.h`` for ``RequestStatus``) where the meaning is the
same; the names are ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

NEVER = (1 << 63) - 1  # "no upper bound" for a window's latest time


class ActionType(IntEnum):
    LOAD = 0
    EVICT = 1
    INFER = 2


class ErrorCode(IntEnum):
    """Result status of a worker action. ``SUCCESS`` is 0."""

    SUCCESS = 0
    UNKNOWN_MODEL = 10
    INVALID_GPU = 13
    WEIGHTS_NOT_PRESENT = 20
    WEIGHTS_ALREADY_LOADED = 21
    WEIGHTS_IN_USE = 22
    WEIGHTS_CHANGED = 23
    INVALID_INPUT = 30
    INVALID_BATCH_SIZE = 31
    NETWORK_SEND_TOO_LATE = 45
    LOAD_TOO_EARLY = 50
    LOAD_TOO_LATE = 51
    LOAD_INSUFFICIENT_CACHE = 53
    EVICT_TOO_EARLY = 60
    EVICT_TOO_LATE = 61
    EVICT_NOT_IN_CACHE = 63
    INPUT_TOO_EARLY = 70
    INPUT_TOO_LATE = 71
    EXEC_TOO_EARLY = 80
    EXEC_TOO_LATE = 81
    EXEC_WEIGHTS_MISSING = 82
    OUTPUT_TOO_EARLY = 90
    OUTPUT_TOO_LATE = 91
    # ours, not Clockwork's: the controller failed the action itself, its worker lost
    # (connection closed) or suspect (unanswered probes) before the result came back
    WORKER_LOST = 100


TOO_LATE = {
    ActionType.LOAD: ErrorCode.LOAD_TOO_LATE,
    ActionType.EVICT: ErrorCode.EVICT_TOO_LATE,
    ActionType.INFER: ErrorCode.EXEC_TOO_LATE,
}


class RequestStatus(IntEnum):
    """Status of a client request's answer (Clockwork's client API codes)."""

    SUCCESS = 0
    ERROR = 1  # a worker error that could not be retried in time
    TIMEOUT = 4  # dropped: could no longer meet its deadline
    INVALID_REQUEST = 6  # unknown model, bad input, bad SLO


@dataclass(slots=True)
class Action:
    """One timestamped instruction for one GPU of one worker.

    The worker starts it no earlier than ``earliest`` and rejects it with the
    matching ``*_TOO_LATE`` code if it cannot start by ``latest``.
    """

    id: int
    type: ActionType
    worker: int
    gpu: int
    model: str
    earliest: int
    latest: int
    expected_duration: int
    batch_size: int = 0  # INFER only
    version: int = 0  # weights version (LOAD sets it, INFER expects it)
    expected_end: int = 0  # controller's predicted completion (telemetry)
    sent_at: int = 0  # controller clock (telemetry)
    requests: list | None = None  # INFER: the requests it serves, in batch-row order


@dataclass(slots=True)
class Result:
    """What a worker reports for an action. Times are the worker's clock.

    ``outputs`` (a successful INFER on a real device): a ``list`` of
    ``clockwork.tensors.Tensor``, one per model output, each with the batch as its
    leading dimension; on the controller only when some request of the batch wanted
    them. None otherwise (an emulated INFER computes none).
    """

    id: int
    type: ActionType
    status: ErrorCode
    worker: int
    gpu: int
    model: str
    batch_size: int = 0
    received: int = 0  # when the worker got the action
    begin: int = 0  # when its lane took it up (or rejected it)
    end: int = 0  # when its lane was free again
    duration: int = 0  # measured duration of the main phase (EXEC / copy) alone
    message: str = ""
    outputs: object = None  # INFER: list[clockwork.tensors.Tensor] (batch-first) or None

    @property
    def ok(self) -> bool:
        return self.status == ErrorCode.SUCCESS

    @property
    def held(self) -> int:
        """How long the action held its lane: ``end - begin``, never less than
        ``duration``. What the scheduler predicts. A real device's work is the smaller
        ``duration``; the rest is handing the action to the device's thread and back."""
        d = self.end - self.begin
        return d if d > self.duration else self.duration
