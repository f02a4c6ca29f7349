"""The one table of how a KServe v2 request fails: each outcome maps to one gRPC status,
one HTTP status and a stable message (``docs/contracts.md``, "Statuses and errors").

The controller answers every request once with a ``RequestStatus`` and, for some, a
``reason``; :func:`of_answer` turns such an answer into a :class:`KServeError` of one
:data:`KINDS` kind. What the front end refuses by itself (an unknown model or version, a
malformed request) raises ``KServeError`` directly.

Rules, in order (the first that applies):

==============================================================  =====================  ====
answer                                                          gRPC                   HTTP
==============================================================  =====================  ====
``TIMEOUT`` (the SLO cannot be met: turned away, expired,
left out of a batch)                                            ``DEADLINE_EXCEEDED``  504
``TIMEOUT`` from a worker's ``*_TOO_LATE`` (or ``*_TOO_EARLY``)
rejection, not retried in time                                  ``DEADLINE_EXCEEDED``  504
``INVALID_REQUEST`` ``unknown_model``                           ``NOT_FOUND``          404
``INVALID_REQUEST`` (``bad_input``, ``bad_slo``)                ``INVALID_ARGUMENT``   400
``ERROR`` ``overloaded`` / ``shutdown``; a baseline's full
queue; a worker lost or its weights gone (not retried in
time); a model that fits on no GPU, or whose LOADs were
refused again and again (caches full, a package missing)       ``UNAVAILABLE``        503
anything else (a bug: a worker refusing what the controller
sent, outputs that do not fit, an exception while admitting)    ``INTERNAL``           500
==============================================================  =====================  ====

A request of several rows (a KServe request's batch; each row is one controller request)
fails when any row fails, with the worst row's kind (:func:`worst`; :data:`SEVERITY`
orders them: a bug, then a request the client must change, then "not now", then
"too late").

Every 503 carries ``Retry-After`` (REST) / ``retry-after`` trailing metadata (gRPC). An
INTERNAL answer says ``internal error`` and nothing of the exception or the worker's
text (the controller logs and counts those); the other messages are the controller's
``STATUS: message`` (a worker error: its code, without the worker's free text).
"""

from __future__ import annotations

import grpc

from clockwork.actions import ErrorCode, RequestStatus
from clockwork.sizes import status_details
from controller.inflight import failed_code
from controller.policy import CANCELLED, NO_GPU_FITS, NO_GPU_LEFT, QUEUE_FULL

NOT_FOUND, INVALID, DEADLINE, UNAVAILABLE, INTERNAL = (
    "NOT_FOUND", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "UNAVAILABLE", "INTERNAL")
KINDS = (NOT_FOUND, INVALID, DEADLINE, UNAVAILABLE, INTERNAL)
# the kinds from worst to least bad (a request of many rows fails with its worst row's)
SEVERITY = (INTERNAL, INVALID, NOT_FOUND, UNAVAILABLE, DEADLINE)
GRPC_CODE = {NOT_FOUND: grpc.StatusCode.NOT_FOUND, INVALID: grpc.StatusCode.INVALID_ARGUMENT,
             DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
             UNAVAILABLE: grpc.StatusCode.UNAVAILABLE, INTERNAL: grpc.StatusCode.INTERNAL}
HTTP_CODE = {NOT_FOUND: 404, INVALID: 400, DEADLINE: 504, UNAVAILABLE: 503, INTERNAL: 500}
RETRY_AFTER_S = 1  # Retry-After of every 503 (seconds)
INTERNAL_MESSAGE = "internal error"

# reasons of ERROR answers that mean "not now": load shed, shutting down, no worker
# connected and answering
UNAVAILABLE_REASONS = frozenset({"overloaded", "shutdown", "no_worker"})
# ERROR messages of policies that mean the same (controller/baselines): a full batching
# queue is load shedding; a model too large for every GPU cannot be served here; every
# worker removed, no_worker (and a request withdrawn as its caller went away, CANCELLED:
# read by nobody, but it did not run, and trying again would be the answer)
UNAVAILABLE_MESSAGES = frozenset({QUEUE_FULL, NO_GPU_FITS, NO_GPU_LEFT, CANCELLED})
# worker errors that mean the request's copy was gone (a lost or reset worker, evicted
# weights): the infrastructure, not the request, and not retried in time
# (also a model whose LOADs were refused again and again: the GPUs' caches full, or a
# worker without its package -- nothing the client got wrong, nor a bug: not now)
UNAVAILABLE_CODES = frozenset({ErrorCode.WEIGHTS_NOT_PRESENT, ErrorCode.WEIGHTS_CHANGED,
                               ErrorCode.EXEC_WEIGHTS_MISSING, ErrorCode.WORKER_LOST,
                               ErrorCode.LOAD_INSUFFICIENT_CACHE, ErrorCode.UNKNOWN_MODEL})


class KServeError(Exception):
    """A KServe request's failure: ``kind`` (one of :data:`KINDS`) and its message."""

    def __init__(self, kind: str, message: str) -> None:
        # (cut as gRPC's status details are: a message naming a 20,000-character input,
        # or a shape of 10,000 dimensions, made REST bodies and stream errors of 20-30 KB)
        message = status_details(message)
        super().__init__(message)
        self.kind = kind
        self.message = message


def worker_kind(code: ErrorCode) -> str:
    """The kind of an ``ERROR`` answer caused by a worker's rejection ``code``."""
    if code.name.endswith(("_TOO_LATE", "_TOO_EARLY")):
        return DEADLINE  # it could not run inside its window, and no retry met the SLO
    if code in UNAVAILABLE_CODES:
        return UNAVAILABLE
    return INTERNAL  # the worker refused what we sent: a bug on one side


def of_answer(status: int, reason: str, message: str) -> KServeError:
    """The KServeError for a controller answer that is not SUCCESS."""
    try:
        name = RequestStatus(status).name
    except ValueError:
        return KServeError(INTERNAL, INTERNAL_MESSAGE)
    text = message or "request failed"
    if status == RequestStatus.TIMEOUT:
        code = failed_code(message)  # (a worker's window missed: its code, not its text)
        if code is not None:
            return KServeError(DEADLINE, f"{name}: SLO cannot be met (worker error "
                               f"{code.name})")
        return KServeError(DEADLINE, f"{name}: {text}")
    if status == RequestStatus.INVALID_REQUEST:
        if reason == "unknown_model":  # (as the front end says it: unloaded meanwhile)
            return KServeError(NOT_FOUND, text)
        return KServeError(INVALID, f"{name}: {text}")
    if status != RequestStatus.ERROR:
        return KServeError(INTERNAL, INTERNAL_MESSAGE)
    if reason in UNAVAILABLE_REASONS or message in UNAVAILABLE_MESSAGES:
        return KServeError(UNAVAILABLE, f"{name}: {text}")
    code = failed_code(message)
    if code is not None:
        kind = worker_kind(code)
        if kind == DEADLINE:
            return KServeError(DEADLINE, f"TIMEOUT: SLO cannot be met (worker error "
                               f"{code.name})")
        if kind == UNAVAILABLE:
            return KServeError(UNAVAILABLE, f"{name}: worker error {code.name}")
    return KServeError(INTERNAL, INTERNAL_MESSAGE)


def worst(errors) -> KServeError:
    """The worst of several rows' errors (by :data:`SEVERITY`; the first of a kind)."""
    best = None
    for e in errors:
        if best is None or SEVERITY.index(e.kind) < SEVERITY.index(best.kind):
            best = e
    if best is None:
        raise ValueError("worst() of no errors")
    return best
