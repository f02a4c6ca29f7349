"""The book of actions a policy has sent and not yet seen answered.

Every policy keeps the same record: each action it sends takes the next id and is
noted with the GPU and model copy it concerns and, for an INFER, the requests it
carries; when a result arrives the entry is looked up and forgotten. A result whose id
is not in the book (a duplicate, or an action already resolved) resolves to None and
must be ignored. The book also counts what was sent and what was rejected: the
policy's ``stats()``.

What a failed result means is the same for every policy too:

* a failed INFER's requests did not run; the policy retries them or answers them
  ``ERROR`` with ``error_message(result)``;
* if the status is one of ``COPY_GONE`` (the worker did not have the weights the
  INFER expected), the policy's view of that copy was wrong: it forgets the copy,
  unless it knows better (the copy was replaced, or was still loading);
* a failed LOAD leaves no copy; a failed EVICT needs nothing (the pages were given
  back in the policy's view when it was sent).

When a worker is lost the shell fails its outstanding actions back through
``on_result`` with ``WORKER_LOST`` (one of ``COPY_GONE``), so this is also how a policy
learns which requests a lost worker held.

The GPU and copy objects are the policy's own; the book only holds them.
"""

from __future__ import annotations

from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result

# A failed INFER with one of these statuses means the copy it was sent to is not there.
COPY_GONE = frozenset((ErrorCode.WEIGHTS_NOT_PRESENT, ErrorCode.WEIGHTS_CHANGED,
                       ErrorCode.EXEC_WEIGHTS_MISSING, ErrorCode.WORKER_LOST))

# A failed INFER with one of these statuses failed on the copy's device (its kernels
# failed, or the worker does not know the model or GPU): not its timing, and not for
# what it carried. Retried at once, its requests would go to the same copy, free first
# since it fails at once, again and again until their deadlines while another GPU could
# serve them; so the copy sits out ``FAULT_PAUSE_NS``, doubling with each such failure
# in a row up to ``FAULT_PAUSE_MAX_NS`` (a broken GPU: about one try a second), and the
# retries go to the other copies meanwhile. (10 ms: the default schedule_ahead, so
# that a GPU free now is asked first; 1 ms was the 1 ms every start is ahead anyway.)
COPY_FAULTED = frozenset((ErrorCode.INVALID_INPUT, ErrorCode.UNKNOWN_MODEL,
                          ErrorCode.INVALID_GPU))
FAULT_PAUSE_NS = 10_000_000
FAULT_PAUSE_MAX_NS = 1_000_000_000
# Such failures in a row of every copy of a model (none loading, no other GPU that could
# take a copy) after which the model's INFERs are taken to fail wherever they run (a
# package whose kernels fail): its requests, queued, retried and arriving, are answered
# ERROR with the worker's reason until a copy's pause ends, instead of each waiting out
# its SLO to TIMEOUT as if the cluster were overloaded. The try at the pause's end
# decides again.
FAULTS_FAILING = 3

# A failed INFER with one of these statuses was refused for what it carried (a batch size
# the model's package is not compiled for): no copy would run it better, so its requests
# are answered at once (``ERROR``, a bug: the error table) instead of retried until their
# deadline. (Not ``INVALID_INPUT``: a device's failure while it runs the kernels is
# answered that too, and another copy may run the batch.)
REFUSED_AS_SENT = frozenset((ErrorCode.INVALID_BATCH_SIZE,))

# A failed LOAD with one of these statuses was refused by the worker for the model itself
# (a package it cannot load, too few contiguous free pages, a device that failed the copy)
# and counts towards ``LOAD_REFUSALS``; the others (its timing, a worker lost while it
# ran) do not.
LOAD_REFUSED = frozenset((ErrorCode.UNKNOWN_MODEL, ErrorCode.LOAD_INSUFFICIENT_CACHE,
                          ErrorCode.INVALID_INPUT))
# A LOAD refused with this status found the model's weights on the GPU already: weights
# the controller does not count (left by a LOAD it counted as failed, or by an earlier
# controller). The LOAD again would be refused again, at every look (thousands a second,
# the model never served there, its INFERs failing WEIGHTS_CHANGED), so the policy
# EVICTs them instead, and its demand places a copy again as on an empty GPU.
WEIGHTS_UNCOUNTED = ErrorCode.WEIGHTS_ALREADY_LOADED
# LOADs of a model refused in a row after which, while it has no copy ready, its
# requests, queued and arriving, are answered ERROR with the worker's reason for
# ``REFUSED_FOR_NS`` (instead of LOADs again and again, hundreds a second, until each
# request's deadline); then it is tried again.
LOAD_REFUSALS = 3
REFUSED_FOR_NS = 1_000_000_000
# A LOAD of an extra copy (of a model with a copy ready, which goes on serving it) refused
# by a GPU: that GPU is not offered the model again for a back-off, LOAD_BACKOFF_NS after
# the model's first refusal in a row, doubling with each further one up to
# LOAD_BACKOFF_MAX_NS (instead of the same LOAD again at once, thousands a second); its
# next successful LOAD starts the doubling over. The first retry comes sooner than a
# model without a copy is tried again (REFUSED_FOR_NS), the last ones are rarer: an
# extra copy is wanted less than a first one.
LOAD_BACKOFF_NS = REFUSED_FOR_NS // 10
LOAD_BACKOFF_MAX_NS = 10 * REFUSED_FOR_NS

_COUNTER = {ActionType.INFER: "infer", ActionType.LOAD: "load", ActionType.EVICT: "evict"}


WORKER_ERROR = "worker error "


def error_message(result: Result) -> str:
    """The message of a request answered ``ERROR`` because its INFER failed:
    ``worker error CODE: the worker's message`` (``failed_code`` reads CODE back)."""
    return f"{WORKER_ERROR}{result.status.name}: {result.message}"


def failed_status(result: Result) -> RequestStatus:
    """How a request whose INFER failed is answered when it is not tried again: TIMEOUT
    when the worker could not run it inside its window (``*_TOO_LATE``, ``*_TOO_EARLY``:
    its SLO cannot be met), as every front end reports it (one error table); else ERROR.
    The message is ``error_message``'s either way."""
    return (RequestStatus.TIMEOUT if result.status.name.endswith(WINDOW_MISSED)
            else RequestStatus.ERROR)


WINDOW_MISSED = ("_TOO_LATE", "_TOO_EARLY")  # the worker codes of an action outside its window


def failed_code(message: str) -> ErrorCode | None:
    """The worker's ``ErrorCode`` in a message made by ``error_message``; None if the
    message is not one (the KServe front end maps answers by it)."""
    if not message.startswith(WORKER_ERROR):
        return None
    name = message[len(WORKER_ERROR):].partition(":")[0]
    return ErrorCode.__members__.get(name)


class Sent:
    """One action in the book: the action, the policy's GPU and copy objects, and the
    requests it carries (an INFER's batch; empty for LOAD and EVICT)."""

    __slots__ = ("action", "gpu", "copy", "requests")

    def __init__(self, action: Action, gpu: object, copy: object, requests: list) -> None:
        self.action = action
        self.gpu = gpu
        self.copy = copy
        self.requests = requests


class Inflight:
    """Actions sent and not answered, by id, with the ids to use and the counters."""

    __slots__ = ("_sent", "_next_id", "_counts")

    def __init__(self) -> None:
        self._sent: dict[int, Sent] = {}
        self._next_id = 1
        self._counts = {"infer": 0, "load": 0, "evict": 0, "rejected": 0}

    def new_id(self) -> int:
        """The id of the next action to send (1, 2, ...)."""
        aid = self._next_id
        self._next_id = aid + 1
        return aid

    def add(self, action: Action, gpu: object, copy: object, requests: list) -> None:
        """Note an action as sent (its id from ``new_id``)."""
        self._sent[action.id] = Sent(action, gpu, copy, requests)
        self._counts[_COUNTER[action.type]] += 1

    def resolve(self, result: Result) -> Sent | None:
        """The entry a result answers, taken out of the book; None if the result's id is
        unknown or was answered already (the result must then be ignored). A failed
        result counts as ``rejected``."""
        s = self._sent.pop(result.id, None)
        if s is not None and result.status:
            self._counts["rejected"] += 1
        return s

    def __len__(self) -> int:
        return len(self._sent)

    def __contains__(self, action_id: int) -> bool:
        return action_id in self._sent

    def counts(self) -> dict[str, int]:
        """A copy of the counters: ``infer``, ``load``, ``evict`` sent, ``rejected``."""
        return dict(self._counts)
