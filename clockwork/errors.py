"""Typed errors: every non-success answer of the client API, and a bad scenario."""

from __future__ import annotations

# the controller's words when it stops: the message of the requests it answers then (reason
# ``shutdown``), and the details of the calls it ends (UNAVAILABLE)
STOPPING_MESSAGE = "controller is shutting down"
# a call while the controller waits for its workers at start (only the probes answer)
STARTING_MESSAGE = "controller is starting: it waits for its workers"


class ClockworkError(Exception):
    """Base class. ``status`` is the RequestStatus code, ``reason`` the controller's tag."""

    def __init__(self, message: str, status: int = 1, reason: str = "", model: str = "",
                 latency_ms: float = 0.0) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.model = model
        self.latency_ms = latency_ms


class InferenceError(ClockworkError):
    """A worker error that could not be retried in time (status ERROR)."""


class WorkerLost(InferenceError):
    """The worker running the request went away."""


class ServerShutdown(InferenceError):
    """The controller is shutting down."""


class Overloaded(InferenceError):
    """Turned away at once, never queued: too many requests outstanding on its stream, its
    connection or the whole controller (reason ``overloaded``; see the controller's
    ``--limit``). Retrying later, or with fewer requests in flight, can succeed."""


class InferenceTimeout(ClockworkError):
    """Dropped: the SLO could no longer be met (status TIMEOUT)."""


class InvalidRequest(ClockworkError):
    """Bad input or SLO (status INVALID_REQUEST)."""


class UnknownModel(InvalidRequest):
    """The controller serves no model of that name (never loaded, or unloaded; for
    ``load_model``: no such profile, or a worker lacks its package)."""


class ControllerUnavailable(ClockworkError):
    """The controller could not be reached (connection refused, closed, deadline)."""


class RepositoryUnavailable(ControllerUnavailable):
    """A model could not be loaded or unloaded now (gRPC UNAVAILABLE): a worker did not
    take it in time, an unload of the same name is still finishing, the controller is
    stopping, or it could not be reached. Retrying later can succeed."""


class Unauthenticated(ControllerUnavailable):
    """The controller refused the call: no token, or not its token (gRPC UNAUTHENTICATED).
    Nothing was run."""


def about(model: str, message: str) -> str:
    """``message`` about ``model``, for an exception's text: prefixed with the model's name
    (``"NAME: ..."``), unless it names the model itself (quoted, as the controller's
    messages do: ``unknown model 'NAME' (did you mean ...)``)."""
    if not model or repr(model) in message or (
            len(model) > 100 and repr(model)[:100] in message):
        return message  # (it names it: whole, or cut as the controller cuts a long one)
    if len(model) > NAME_SHOWN:  # (a name of a megabyte was said whole)
        model = model[:NAME_SHOWN - 3] + "..."
    return f"{model}: {message}"


NAME_SHOWN = 200  # the most of a model's name an exception's text repeats


def error_for(status: int, reason: str, message: str, model: str = "",
              latency_ms: float = 0.0) -> ClockworkError:
    """The exception for a non-success answer."""
    if status == 4:
        cls: type[ClockworkError] = InferenceTimeout
    elif status == 6:
        cls = UnknownModel if reason == "unknown_model" else InvalidRequest
    elif reason == "worker_lost":
        cls = WorkerLost
    elif reason == "shutdown":
        cls = ServerShutdown
    elif reason == "overloaded":
        cls = Overloaded
    else:
        cls = InferenceError
    return cls(about(model, message), status, reason, model, latency_ms)


class ScenarioError(ValueError):
    """A scenario file or override is wrong; the message (one line) says where and why."""
