"""Client API of the controller (``clockwork.v1``): ``Client`` (blocking) and
``AsyncClient`` (asyncio).

    import clockwork
    c = clockwork.Client("127.0.0.1:12346")
    r = c.infer("resnet50_v2", np.zeros((3, 224, 224), np.float32), slo_ms=100)
    r.output.shape, r.latency_ms

Every non-success answer raises a subclass of ``clockwork.errors.ClockworkError``
(``InferenceTimeout``, ``InferenceError``, ``InvalidRequest``, ``UnknownModel`` ...).

The model repository: ``load_model(name, copies=None, profile=None)`` serves a profile of the
controller's set under ``name`` (instances ``name``, ``name:1``, ...) while it runs;
``unload_model(name)`` stops serving it (its waiting requests fail ``UnknownModel``, its
GPU memory is freed as its copies go idle); ``repository_index()`` lists every model
with its state (``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``, "" = not loaded).
``AsyncClient.stream()`` pipelines many requests over one stream, several per message,
for load generation.

Security (SECURITY.md): ``token=`` (else ``$CLOCKWORK_TOKEN``) is sent as ``authorization:
Bearer <token>`` with every call; ``tls=True``, ``tls_ca=`` or a client certificate
(``tls_cert=``/``tls_key=``, for a server that asks for one), or a ``grpcs://`` URL,
connects with TLS (one given empty, or holding no PEM block of its kind, raises
``SecurityError``). A refused token raises ``clockwork.errors.Unauthenticated``.

Mistakes the client sees itself raise before anything is sent: ``ValueError`` for an
argument of the wrong type or a bad timeout (a ``model`` that is not a string, an
``slo_ms`` that is not a number, a stream's ``interval_us`` outside 0 to a second),
``InvalidRequest`` for inputs that are not arrays (a nested list of numbers, or no
inputs at all: an empty list or mapping; only ``None`` sends none), a request too large
to send or a bad ``copies``; a call on a closed client raises ``RuntimeError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import math
import numbers
import operator
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import numpy as np

from clockwork.errors import (
    STARTING_MESSAGE,
    STOPPING_MESSAGE,
    ClockworkError,
    ControllerUnavailable,
    InvalidRequest,
    RepositoryUnavailable,
    Unauthenticated,
    UnknownModel,
    about,
    error_for,
)
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol import keepalive
from clockwork.protocol.pacing import Pacer
from clockwork.protocol.security import AUTHORIZATION, channel_credentials, client_token
from clockwork.protocol.wire import add_tensors, msg_to_array

# the largest gRPC message either way: the channel's limits, and what the controller
# accepts by default (its grpc_max_receive_bytes; a stream message counts whole)
from clockwork.sizes import (  # (MAX_MESSAGE_BYTES re-exported)
    INT32_MAX,
    MAX_LOAD_COPIES,
    MAX_MESSAGE_BYTES,
    STREAM_DEFAULT_SLO_KEY,
    STREAM_LIMIT_KEY,
)
from clockwork.tensors import Tensor
from clockwork.time import CLIENT_GRACE_NS, MAX_SLO_MS, NS_PER_S

# a stream message carries requests up to this many bytes (one larger goes alone): well
# under MAX_MESSAGE_BYTES, so the requests of one event-loop turn never add up to a
# message gRPC refuses (which ended the whole stream)
STREAM_MESSAGE_BYTES = 4 << 20
_BATCH_BYTES = 32  # at most, a stream message's own fields around one request
LIMIT_WAIT_S = 0.5  # how long after it opens a stream waits for the controller's limit
_MAX_REQUEST_BYTES = MAX_MESSAGE_BYTES - 64  # one request (room for a stream message's fields)
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # a controller back after an outage is reached within ~2 s: gRPC's own backoff
            # grows to 120 s between attempts, and the channels of a process share it
            # (a client used through a 150 s outage failed for 42 s after it was back)
            ("grpc.initial_reconnect_backoff_ms", 250),
            ("grpc.max_reconnect_backoff_ms", 2000),
            *keepalive.CHANNEL]  # a vanished controller fails the calls within ~15 s
GRACE_S = CLIENT_GRACE_NS / NS_PER_S  # past its SLO, the wait for an answer before giving up
# the stream's watchdog looks every 50 ms; a look this late after the last (the process,
# its event loop, was held up) gives up nothing: it comes again once the answers that
# arrived meanwhile are read
WATCH_STALL_NS = 250_000_000
MAX_TIMEOUT_S = 86_400.0  # a client's timeout beyond a day is taken as a day
CLOSE_POLL_S = 0.05  # InferStream.close(): how often it looks whether all are answered
# InferStream: after its call ends (the controller went away), the wait before a new call
# is opened, doubling from the first to the last while calls keep ending unanswered
REOPEN_FIRST_S, REOPEN_MAX_S = 0.05, 2.0
# what gRPC says of a stream's call that ended while a message was being sent on it (the
# write fails, and the status the server sent is lost)
CORE_INTERNAL = "Internal error from Core"
_CLOSED = "the client is closed"


@dataclass
class InferResult:
    model: str
    outputs: dict[str, np.ndarray]
    latency_ms: float  # as the client measured it
    server_latency_ms: float  # controller arrival -> answer
    batch_size: int = 0
    gpu: int = -1
    cold: bool = False
    status: int = 0

    @property
    def output(self) -> np.ndarray:
        """The first (usually only) output."""
        return next(iter(self.outputs.values()))

    def __repr__(self) -> str:
        """The outputs by name, shape and dtype, not their values (a ResNet result's repr
        was 4,590 characters of numbers: a log line of it flooded the log)."""
        outs = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.outputs.items())
        return (f"InferResult(model={self.model!r}, outputs={{{outs}}}, "
                f"latency_ms={self.latency_ms:.3f}, server_latency_ms="
                f"{self.server_latency_ms:.3f}, batch_size={self.batch_size}, gpu={self.gpu}, "
                f"cold={self.cold}, status={self.status})")


@dataclass
class ModelMeta:
    name: str
    profile: str
    inputs: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    outputs: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    weights_pages: int = 0
    state: str = ""  # READY, LOADING, UNLOADING, UNAVAILABLE, or "" (a profile not loaded)
    reason: str = ""  # why not READY (e.g. "unloaded")


DEFAULT_PORT = 12346  # the controller's (clockwork controller --port)


# a controller URL's scheme (any case) -> whether it means TLS
_SCHEMES = {"grpc": False, "http": False, "clockwork": False, "grpcs": True, "https": True}


def _either(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


# "grpc://, http:// or clockwork://, or grpcs:// or https:// (TLS)"
SCHEMES_WORDS = (_either([f"{s}://" for s, tls in _SCHEMES.items() if not tls]) + ", or "
                 + _either([f"{s}://" for s, tls in _SCHEMES.items() if tls]) + " (TLS)")


def controller_address(url: str) -> tuple[str, bool]:
    """``(HOST:PORT, tls)`` of a controller URL (``host:port``, ``[v6addr]:port``,
    optionally after a scheme of ``SCHEMES_WORDS``, in any case, and surrounding space):
    ``tls`` when its scheme says so. The one place that reads a URL, so that the address
    dialled and the TLS decision come from the same text (a ``grpcs://`` URL with a
    leading space was dialled without TLS). A missing or bad port, or an unknown scheme,
    raises ``ValueError``: gRPC would dial 443 for a bare host, and no controller
    listens there."""
    if not isinstance(url, str):
        raise TypeError(f"the controller's address is a string HOST:PORT, got {url!r}")
    given = url
    url = url.strip()
    tls = False
    scheme, sep, rest = url.partition("://")
    if sep:
        if scheme.lower() not in _SCHEMES:
            raise ValueError(f"controller address {given!r}: unknown scheme {scheme!r}: "
                             f"expected HOST:PORT, optionally after {SCHEMES_WORDS}")
        tls, url = _SCHEMES[scheme.lower()], rest
    url = url.rstrip("/")
    if url.startswith("["):  # [v6 address]:port
        host, bracket, rest = url.partition("]")
        host += bracket
        colon, port = rest[:1] == ":", rest[1:]
        if not bracket or (rest and not colon):
            raise ValueError(f"controller address {given!r}: expected [ADDRESS]:PORT")
    else:
        host, colon, port = url.rpartition(":")
        if ":" in host:
            raise ValueError(f"controller address {given!r}: an IPv6 address goes in "
                             f"brackets, [ADDRESS]:PORT (e.g. [::1]:{DEFAULT_PORT})")
    if colon and not host:
        raise ValueError(f"controller address {given!r} has no host: expected HOST:PORT, "
                         f"e.g. '127.0.0.1{url}'")
    if not colon:
        example = f"{url or '127.0.0.1'}:{DEFAULT_PORT}"
        raise ValueError(f"controller address {given!r} has no port: expected HOST:PORT, "
                         f"e.g. {example!r} ({DEFAULT_PORT} is the controller's default "
                         "port)")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"controller address {given!r}: the port must be 1-65535, got "
                         f"{port!r} (expected HOST:PORT)")
    return url, tls


def _seconds(timeout, what: str = "timeout") -> float | None:
    """A timeout as the client keeps it: None (no limit) or seconds > 0, at most
    ``MAX_TIMEOUT_S`` (gRPC cannot take a deadline ~300 years away: every call failed at
    once). Anything else (inf, nan, 0, a negative, a string, a bool) raises
    ``ValueError`` naming it, instead of every call failing with an unrelated error."""
    if timeout is None:
        return None
    if (isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
            and _finite(timeout) and timeout > 0):
        return MAX_TIMEOUT_S if timeout >= MAX_TIMEOUT_S else float(timeout)
    raise ValueError(f"{what} must be None (no limit) or a finite number of seconds > 0, "
                     f"got {timeout!r}")


def _finite(value) -> bool:
    """``math.isfinite``, for an int past any float too (finite: it raised
    OverflowError)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return True


MAX_INTERVAL_US = 1_000_000.0  # a stream's pacing interval: at most a second


def _interval_us(value) -> float:
    """A stream's ``interval_us``: a finite number of microseconds from 0 (no pacing) to
    ``MAX_INTERVAL_US``; anything else (nan, inf, a negative, a string, a bool) raises
    ``ValueError`` naming it."""
    if (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and _finite(value) and 0 <= value <= MAX_INTERVAL_US):
        return float(value)
    raise ValueError(f"interval_us must be a number of microseconds from 0 (no pacing) to "
                     f"{MAX_INTERVAL_US:,.0f} (a second), got {value!r}")


def _per_call(timeout, client_timeout: float | None) -> float | None:
    """A call's own ``timeout=``: None is the client's; 0 is refused, as in the client
    (it was taken as the client's)."""
    return client_timeout if timeout is None else _seconds(timeout)


def _index_request(ready_only) -> pb.ListModelsRequest:
    """The repository index's request. ``ready_only`` must be True or False (or 1 / 0):
    anything else raises ``ValueError`` naming it (protobuf raised its own TypeError)."""
    if not (isinstance(ready_only, (bool, np.bool_, numbers.Integral))
            and ready_only in (0, 1)):
        raise ValueError(f"ready_only must be True or False, got {ready_only!r}")
    return pb.ListModelsRequest(index=True, ready_only=bool(ready_only))


def _text(value, what: str) -> str:
    """``value``, which must be a string that UTF-8 can encode (protobuf would raise its
    own TypeError, or UnicodeEncodeError for a lone surrogate such as '\\udc80')."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be text UTF-8 can encode, got {value!r}") from None
    return value


def _request(model: str, inputs, slo_ms: float | None,
             client_id: int = 0) -> tuple[pb.InferRequest, int]:
    """The request message and a bound on its size in bytes (see ``_size``). A model
    that is not a string, or an SLO that is not a number (a bool, a string), raises
    ``ValueError``; a number the controller cannot take (negative, nan, inf) is its to
    refuse (``bad_slo``); a request too large to send raises ``InvalidRequest``."""
    _text(model, "model (a model instance name)")
    if slo_ms is not None and type(slo_ms) is not float and (
            isinstance(slo_ms, bool) or not isinstance(slo_ms, numbers.Real)):
        raise ValueError(f"slo_ms must be None (the controller's default) or a number of "
                         f"milliseconds, got {slo_ms!r}")
    try:
        slo = float(slo_ms or 0.0)
    except OverflowError:  # an int beyond any float: sent as +-inf, for the controller to refuse
        slo = math.inf if slo_ms > 0 else -math.inf
    req = pb.InferRequest(model=model, slo_ms=slo, client_id=client_id)
    if inputs is None:
        return req, _size(req, 0)
    items = _input_items(model, inputs)
    # (an array's bytes before it is copied into one buffer: a broadcast view of a few
    # bytes may stand for terabytes, which the copy would try to take)
    known = sum(a.nbytes for _, a in items if isinstance(a, np.ndarray))
    if known > _MAX_REQUEST_BYTES:
        raise InvalidRequest(f"{model}: the request is more than {known:,} bytes, too large "
                             f"to send: a gRPC message carries at most "
                             f"{MAX_MESSAGE_BYTES:,} (send smaller inputs)", 6, "bad_input",
                             model)
    _check_kinds(model, items)  # (an object array's bytes are pointers into this process)
    tensors = [Tensor.of(name, a) for name, a in items]
    # (and what an array-like with no dtype of its own became: a DataFrame of strings, an
    # object with __array__, sent the pointers and 'str96' bytes)
    _check_kinds(model, [(t.name, t) for t in tensors])
    add_tensors(req.inputs, tensors)  # (built in place: no copy of each message)
    return req, _size(req, sum(_TENSOR_BYTES + 4 * len(t.name) + 11 * len(t.shape)
                               + t.nbytes for t in tensors))


def _check_kinds(model: str, items) -> None:
    """``InvalidRequest`` for an input whose dtype is not numbers (objects, strings,
    bytes, times)."""
    for name, a in items:
        dtype = getattr(a, "dtype", None)
        kind = getattr(dtype, "kind", None)
        if kind is not None and kind in "OUSVMm":
            raise _bad_inputs(model, f"input {name or 0!r} has dtype {dtype}: not numbers "
                              f"a model takes; {_ONE_ARRAY}")


def _is_array(value) -> bool:
    """Whether ``value`` is an array numpy takes as it is (a numpy array or scalar, or an
    object with the array interface: a torch or cupy tensor, ...), with its own shape
    and dtype; a Python list, tuple, number or string is not (numpy would have to guess
    the dtype: float64, int64)."""
    return (isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__")
            or hasattr(value, "__array_interface__") or hasattr(value, "__array_struct__"))


def _bad_inputs(model: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{model}: {why}", 6, "bad_input", model)


_ONE_ARRAY = ("pass each input as a numpy array of the model's shape and dtype, e.g. "
              "np.asarray(x, dtype=np.float32)")


def _input_items(model: str, inputs) -> list[tuple[str, object]]:
    """``(name, array)`` of each input of ``inputs`` (not None): one array (unnamed), a
    mapping name -> array, or a list or tuple of arrays (one: unnamed; several:
    ``input0``, ``input1``, ...). No inputs at all (an empty list, tuple or mapping), an
    input that is not an array (a nested list of numbers is not read as one array: a
    list is a list of inputs) or a name that is not a string raise ``InvalidRequest``:
    only ``None`` sends none."""
    if isinstance(inputs, Mapping):
        items = list(inputs.items())
        if not items:
            raise _bad_inputs(model, "inputs is an empty mapping: pass None to send no "
                              "inputs (the worker runs zeros), or a mapping of input "
                              "name -> numpy array")
        for name, a in items:
            if not isinstance(name, str):
                raise _bad_inputs(model, f"input name {name!r} is not a string (inputs "
                                  "maps input name -> numpy array)")
            if not _is_array(a):
                raise _bad_inputs(model, f"input {name!r} is a {type(a).__name__}, not an "
                                  f"array: {_ONE_ARRAY}")
        return items
    if isinstance(inputs, list | tuple):
        kind = type(inputs).__name__
        if not inputs:
            raise _bad_inputs(model, f"inputs is an empty {kind}: pass None to send no "
                              "inputs (the worker runs zeros), or the input array(s)")
        for i, a in enumerate(inputs):
            if not _is_array(a):
                raise _bad_inputs(model, f"inputs is a {kind} whose item {i} is a "
                                  f"{type(a).__name__}, not an array: a {kind} holds one "
                                  f"array per input; {_ONE_ARRAY}")
        return [(f"input{i}" if len(inputs) > 1 else "", a) for i, a in enumerate(inputs)]
    if not _is_array(inputs):
        raise _bad_inputs(model, f"inputs is a {type(inputs).__name__}, not an array: "
                          f"{_ONE_ARRAY} (or None to send none: the worker runs zeros)")
    return [("", inputs)]


_TENSOR_BYTES = 64  # at most, a tensor's fields but its name, shape and data
_REQUEST_BYTES = 64  # at most, a request's fields but its model name and inputs


def _size(req: pb.InferRequest, inputs_bound: int) -> int:
    """A bound on the request's size in bytes, from ``inputs_bound`` (its inputs') and
    its model name, without serializing it (``ByteSize`` costs as much as the
    serialization gRPC does anyway: +33 % of a ResNet-size infer); exact when near the
    limit. One too large for any gRPC message raises ``InvalidRequest`` (the caller's
    input, not a transient failure: sent, gRPC refused it with RESOURCE_EXHAUSTED, which
    read as ControllerUnavailable, and on a stream it ended the whole call)."""
    n = _REQUEST_BYTES + 4 * len(req.model) + inputs_bound
    if n <= _MAX_REQUEST_BYTES:
        return n
    n = req.ByteSize()
    if n > _MAX_REQUEST_BYTES:
        raise InvalidRequest(f"{req.model}: the request is {n:,} bytes, too large to send: "
                             f"a request may be at most {_MAX_REQUEST_BYTES:,} (a gRPC "
                             f"message carries {MAX_MESSAGE_BYTES:,}, the message's own "
                             "fields included; send smaller inputs)", 6, "bad_input",
                             req.model)
    return n


def _meta(m: pb.ModelInfo) -> ModelMeta:
    return ModelMeta(m.name, m.profile,
                     [(t.name, tuple(t.shape), t.dtype) for t in m.inputs],
                     [(t.name, tuple(t.shape), t.dtype) for t in m.outputs],
                     list(m.batch_sizes), m.weights_pages, m.state, m.reason)


def _load_request(name: str, copies: int | None, profile: str | None,
                  package: str | None):
    """A load's message. ``copies`` is any integral number (``int``, numpy's) from 1 to
    the field's 2**31 - 1 (the controller has its own, lower bound), else
    ``InvalidRequest``; None leaves it out (1, or for a loaded model loaded again with no
    profile and package either, its own count)."""
    _text(name, "name")
    if profile is not None:
        _text(profile, "profile")
    if package is not None:
        _text(package, "package")
    if copies is None:  # with no profile and package either: a loaded model as it is
        return pb.LoadModelRequest(name=name, profile=profile or "", package=package or "")
    try:
        n = None if isinstance(copies, bool) else operator.index(copies)
    except TypeError:
        n = None
    if n is None or not 1 <= n <= INT32_MAX:
        # (in the controller's words: its bound, 1,024 a new load, more for a model
        # loaded so at start, is its own)
        raise InvalidRequest(f"{name}: copies must be an integer from 1 to "
                             f"{MAX_LOAD_COPIES}, got {copies!r}", 6, "bad_request", name)
    return pb.LoadModelRequest(name=name, copies=n, profile=profile or "",
                               package=package or "")


def _repository_error(e: grpc.RpcError, name: str, url: str = "") -> ClockworkError:
    """The typed error of a failed LoadModel / UnloadModel call (``url``: the
    controller's address)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if _unreachable(e):
        return RepositoryUnavailable(f"{name}: {_unreachable_text(e, url)}", 1,
                                     "unavailable", name)
    if code == grpc.StatusCode.NOT_FOUND:
        return UnknownModel(about(name, details), 6, "unknown_model", name)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(about(name, details), 6, "bad_request", name)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        why = details if code == grpc.StatusCode.UNAVAILABLE else (
            f"no answer within the client's timeout ({details}); the controller may still "
            "finish it: see repository_index")
        return RepositoryUnavailable(about(name, why), 1, "unavailable", name)
    return _unavailable(e, url=url)


def _removed(r: pb.RemoveWorkerResponse) -> dict:
    """``remove_worker``'s answer as its dict."""
    return {"worker": r.worker, "gpus": list(r.gpus), "removed": r.removed,
            "drained": r.drained, "failed": r.failed}


def _worker_error(e: grpc.RpcError, url: str = "", what: str = "add worker"
                  ) -> ClockworkError:
    """The typed error of a failed AddWorker (or RemoveWorker: ``what``) call."""
    code = e.code() if hasattr(e, "code") else None
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        return InvalidRequest(f"{what}: {e.details()}", 6, "bad_request", "")
    if code == grpc.StatusCode.FAILED_PRECONDITION or (
            code == grpc.StatusCode.UNAVAILABLE and not _unreachable(e)
            and "worker" in (e.details() or "")):
        # another controller holds the worker; the controller cannot reach the worker (its
        # answers name the worker: a connection to the controller that broke does not)
        return ControllerUnavailable(f"{what}: {e.details()}")
    return _unavailable(e, url=url)


def _worker_row(w: pb.WorkerRow) -> dict:
    return {"worker": w.worker, "address": w.address, "state": w.state, "gpus": list(w.gpus),
            "link": w.link, "rtt_ms": w.rtt_ms, "for_s": w.for_s, "detail": w.detail}


def _result(model: str, resp: pb.InferResponse, latency_ms: float,
            slo_ms: float | None = None) -> InferResult:
    if resp.status != 0:
        raise error_for(resp.status, resp.reason, resp.message, model, latency_ms)
    # the deadline as seen here, the network included; only an SLO the caller gave (one
    # sent without is the controller's to keep: docs/contracts.md, infer)
    if slo_ms and latency_ms > slo_ms:
        raise error_for(4, "late", f"answered {latency_ms:.1f} ms after it was sent, past its "
                        f"{slo_ms:g} ms SLO", model, latency_ms)
    return InferResult(model, {t.name: msg_to_array(t) for t in resp.outputs}, latency_ms,
                       resp.latency_ns / 1e6, resp.batch_size, resp.gpu, resp.cold, resp.status)


def _channel(target: str, tls: bool, tls_ca, tls_cert, tls_key, aio: bool):
    """A channel to ``target``: TLS when asked for (``tls``, which a grpcs:// URL sets,
    or a CA, or a client certificate: one given empty is refused by
    ``channel_credentials``, not taken as none, which sent the token in plain text)."""
    mod = grpc.aio if aio else grpc
    if not tls and tls_ca is None and tls_cert is None and tls_key is None:
        return mod.insecure_channel(target, options=_OPTIONS)
    return mod.secure_channel(target, channel_credentials(tls_ca, tls_cert, tls_key),
                              options=_OPTIONS)


class _WithToken:
    """A stub method that sends the bearer token with every call (also ``with_call`` and
    ``future``); metadata a caller passes is sent as well."""

    __slots__ = ("_method", "_metadata")

    def __init__(self, method, metadata: tuple) -> None:
        self._method = method
        self._metadata = metadata

    def _kw(self, kw: dict) -> dict:
        more = kw.get("metadata")
        kw["metadata"] = self._metadata + tuple(more) if more else self._metadata
        return kw

    def __call__(self, *args, **kw):
        return self._method(*args, **self._kw(kw))

    def __getattr__(self, name: str):
        attr = getattr(self._method, name)
        if not callable(attr):
            return attr
        return lambda *args, **kw: attr(*args, **self._kw(kw))


class _Closed:
    """A closed client's stub: every call raises ``RuntimeError`` before reaching gRPC
    (whose closed channels raise ``ValueError``, or ``UsageError`` for asyncio), so the
    two clients, and a stream, say the same."""

    __slots__ = ()

    def __getattr__(self, name: str):
        raise RuntimeError(_CLOSED)


_CLOSED_STUB = _Closed()


def _stub(channel, token: str | None) -> pbg.ClockworkStub:
    stub = pbg.ClockworkStub(channel)
    if token:
        md = ((AUTHORIZATION, f"Bearer {token}"),)
        for name, method in list(vars(stub).items()):
            setattr(stub, name, _WithToken(method, md))
    return stub


class _ClosedCall(grpc.RpcError):
    """What a call says whose channel ``close()`` closed (from another thread) between
    the call's reading the stub and its starting: gRPC raised a plain ``ValueError``
    ("Cannot invoke RPC on closed channel!"), which no caller takes for a closed
    client."""

    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return CLIENT_CLOSED


_FORKED = ("this Client was made in another process, which this one was forked from: "
           "gRPC's connections do not survive fork() (calls hung, or crashed the process); "
           "make a Client in this process (with multiprocessing, the 'spawn' or "
           "'forkserver' start methods fork no gRPC state)")


class _SyncCall:
    """A blocking client's stub method: refused with ``RuntimeError`` in a process
    forked from the one that made it; a closed channel's ``ValueError`` is
    ``_ClosedCall``; a call whose stream the controller refused unread (``_refused_stream``:
    a client shared by thousands of threads, the controller held up) made again, as an
    ``AsyncClient``'s, ``REFUSED_RETRIES`` times at most (they failed as if the controller
    could not be reached)."""

    __slots__ = ("_method", "_pid")

    def __init__(self, method, pid: int) -> None:
        self._method = method
        self._pid = pid

    def __call__(self, *args, **kw):
        if os.getpid() != self._pid:
            raise RuntimeError(_FORKED)
        tries = 0
        while True:
            try:
                return self._method(*args, **kw)
            except ValueError as e:
                if "closed" in str(e).lower():
                    raise _ClosedCall() from e
                raise
            except grpc.RpcError as e:
                tries += 1
                if tries == REFUSED_RETRIES or not _refused_stream(e):
                    raise
            time.sleep(0.001 * tries)  # (a stream ends meanwhile)


def _sync_stub(channel, token: str | None) -> pbg.ClockworkStub:
    stub = _stub(channel, token)
    pid = os.getpid()
    for name, method in list(vars(stub).items()):
        setattr(stub, name, _SyncCall(method, pid))
    return stub


CLIENT_CLOSED = "the client was closed while the call waited"
# (a copy shared the connection: closing it closed the original's)
_NOT_COPIED = ("a {} owns its connection and cannot be copied or pickled: make another "
               "with the same address and settings")
_NO_LOOP = ("make the AsyncClient inside a running event loop, in the async code that uses "
            "it: outside one (after an asyncio.run() ended, say) there is no loop to bind "
            "its connection to")
_OTHER_LOOP = ("this AsyncClient was made in another event loop (each asyncio.run() starts "
               "a new one; a thread runs its own): make the AsyncClient in the loop that "
               "uses it")
# the unary methods of clockwork.v1 (the stream's call is InferStream's own)
_UNARY = ("Infer", "ListModels", "LoadModel", "UnloadModel", "AddWorker", "RemoveWorker",
          "ListWorkers", "Stats", "ModelStatus")
# An AsyncClient's unary calls open at once, at most: the controller takes 4,096 streams
# a connection (limits.grpc_max_streams_per_connection) and refuses the others, which
# gRPC fails as UNAVAILABLE ("RST_STREAM ... 7") rather than queueing them, so with more
# in flight some failed as if the controller could not be reached. The rest wait in the
# client; a few streams are left for InferStreams on the same connection.
MAX_UNARY_CALLS = 4000
# Even so, under load the controller still counts streams the client has seen end, and
# refuses a few past its limit: a refused stream (HTTP/2 REFUSED_STREAM, "RST_STREAM ...
# error code 7") was never processed, so the call is made again, this many times at most.
REFUSED_RETRIES = 8


def _refused_stream(e: grpc.RpcError) -> bool:
    """Whether the server refused the call's stream before it read it (safe to repeat)."""
    return (hasattr(e, "code") and e.code() == grpc.StatusCode.UNAVAILABLE
            and "RST_STREAM with error code 7" in (e.details() or ""))


class _CloseAware:
    """An ``AsyncClient`` stub's unary method whose call, cancelled by ``close()`` from
    elsewhere while awaited, fails as a gRPC error (``CANCELLED``, ``CLIENT_CLOSED``:
    ``ControllerUnavailable`` for the caller) instead of cancelling the caller's task;
    a cancellation of the caller's own task stays one."""

    def __init__(self, method, client: AsyncClient) -> None:
        self.method = method
        self.client = client

    def __call__(self, *args, **kw):
        self.client._check_loop()
        return self._await(args, kw, time.monotonic_ns())

    async def _await(self, args, kw, called: int):
        try:
            async with self.client._calls:  # (more than the connection takes wait here)
                if self.client._closing:  # (closed while it waited for its slot)
                    raise _closed_call()
                if args and type(args[0]) is pb.InferRequest:
                    # its wait here counts in its SLO at the controller, as the client's
                    # own check of a late answer counts it
                    args[0].queued_ns = time.monotonic_ns() - called
                for attempt in range(REFUSED_RETRIES):
                    try:
                        return await self.method(*args, **kw)
                    except grpc.aio.AioRpcError as e:
                        if attempt + 1 == REFUSED_RETRIES or not _refused_stream(e):
                            raise
                    await asyncio.sleep(0.001 * (attempt + 1))  # (a stream ends meanwhile)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.client._closing and (task is None or not task.cancelling()):
                raise _closed_call() from None
            raise


def _closed_call() -> grpc.aio.AioRpcError:
    """A call ended by ``close()`` from elsewhere, as the gRPC error the callers map."""
    return grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), CLIENT_CLOSED)


def _deadline(timeout: float | None, slo_ms: float) -> tuple[float | None, bool]:
    """The gRPC deadline of one inference (the controller sees the remaining time and
    plans within it), and whether it is the SLO's: the SLO and a grace when that is
    sooner than the client's timeout (its passing is ``InferenceTimeout``), else the
    client's timeout (``ControllerUnavailable``)."""
    if not 0 < slo_ms < 1e9:  # none, or a nonsense SLO (the controller refuses it)
        return timeout, False
    t = slo_ms / 1e3 + GRACE_S
    return (t, True) if timeout is None or t < timeout else (timeout, False)


# how gRPC's own errors begin when it found no connection to the controller (refused,
# no route, a name that does not resolve): the call never reached it
_NO_CONNECTION = ("failed to connect to all addresses", "errors resolving",
                  "DNS resolution failed")


def _unreachable(e: grpc.RpcError) -> bool:
    """Whether a call failed for want of a connection to the controller (gRPC's own
    UNAVAILABLE; the controller's answers UNAVAILABLE carry its own messages)."""
    if not hasattr(e, "code") or e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = e.details() or ""
    return any(details.startswith(p) for p in _NO_CONNECTION)


# gRPC's words for a TLS handshake that failed (a host's name may hold "tls" or "ssl")
_TLS_FAILED = ("Tls handshake failed", "Ssl handshake failed", "SSL_ERROR",
               "CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER", "Handshake failed")


def _unreachable_text(e: grpc.RpcError, url: str) -> str:
    details = e.details() or ""
    if any(w in details for w in _TLS_FAILED):
        hint = ("the TLS handshake failed: TLS on one side only (a controller without "
                "--tls-cert takes no grpcs:// or --tls; one with it needs them), or its "
                "certificate is not trusted (tls_ca= / --tls-ca)")
    elif "Socket closed" in details:  # (what a plain client hears from a TLS listener,
        # and a client without the certificate a mutual-TLS controller asks for)
        hint = ("is it running, and listening there? A controller with --tls-cert takes "
                "only grpcs:// or --tls, and one with --tls-ca also a client certificate: "
                "tls_cert= and tls_key= in Python, --tls-cert and --tls-key for the "
                "clockwork commands")
    elif ("http1.x server" in details or "Failed parsing HTTP/2" in details
          or "missing selected ALPN" in details):  # (REST: 8000; over TLS, no h2 ALPN)
        hint = ("that port speaks HTTP/1.1, not gRPC: the controller's REST port? Give its "
                "gRPC port, --port (12346) or --kserve-port (8001)")
    else:
        hint = "is it running, and listening there?"
    return f"could not reach the controller at {url or 'its address'} ({hint}): {details}"


def _unavailable(e: grpc.RpcError, url: str = "", slo: pb.InferRequest | None = None,
                 waited_ms: float = 0.0, model: str | None = None) -> ClockworkError:
    """The typed error of a failed call. A deadline that passes is the client's timeout,
    ``ControllerUnavailable`` (as the controller not answering at all), unless it was
    the SLO's deadline of the inference ``slo`` (its SLO and a grace, sooner than the
    client's timeout): then ``InferenceTimeout`` with ``latency_ms`` ``waited_ms`` (how
    long the call waited). No connection to the controller at ``url`` (refused, an
    unknown host): ``ControllerUnavailable`` saying so. ``model``: the call was an
    inference of it (refused for the controller's calls open at once: ``Overloaded``)."""
    if _unreachable(e):
        return ControllerUnavailable(_unreachable_text(e, url))
    code = e.code() if hasattr(e, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if slo is not None:
            return error_for(4, "deadline", f"no answer within its {slo.slo_ms:g} ms SLO "
                             f"and {GRACE_S:g} s more: {e.details()}", slo.model, waited_ms)
        return ControllerUnavailable(f"no answer within the client's timeout: {e.details()}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"controller refused the call: {code}: {e.details()} "
                               "(the controller's client token: token= in Python; "
                               "--token-file, --token or $CLOCKWORK_TOKEN for the clockwork "
                               "commands)")
    details = e.details() if hasattr(e, "details") else ""
    if code == grpc.StatusCode.CANCELLED and details in (CLIENT_CLOSED, "Channel closed!"):
        return ControllerUnavailable(f"{CLIENT_CLOSED} (close() from elsewhere)")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (details or ""):
        # the controller's grpc_max_receive_bytes: sending it again cannot help
        return error_for(6, "bad_input", f"the request is larger than the controller "
                         f"takes in one message: {details}",
                         slo.model if slo else model or "")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in (details or ""):
        why = (f"the controller has as many calls open as it takes (its limit "
               f"grpc_max_calls): {details}")
        if model is not None:  # load shedding, as for its other bounds
            return error_for(1, "overloaded", why, model, waited_ms)
        return ControllerUnavailable(f"controller unavailable: {why}")
    if code == grpc.StatusCode.UNAVAILABLE and details == STOPPING_MESSAGE:
        return ControllerUnavailable(STOPPING_MESSAGE, reason="shutdown")  # (as its answers)
    if code == grpc.StatusCode.CANCELLED and "fork" in str(details).lower():
        # (gRPC ends the calls a fork() in this process interrupts: not the controller)
        return ControllerUnavailable(f"the call was ended by a fork() in this process: "
                                     f"{code}: {details}")
    if code == grpc.StatusCode.CANCELLED and not str(details).startswith("Locally"):
        # not this client's (its own cancels raise CancelledError, or say CLIENT_CLOSED):
        # gRPC's server ends so a call that reaches it while it stops
        return ControllerUnavailable(f"{STOPPING_MESSAGE} (it ended the call: {code}: "
                                     f"{details})", reason="shutdown")
    hint = (" (is that a clockwork controller's port? A worker's, or another gRPC "
            "server's, answers UNIMPLEMENTED)" if code == grpc.StatusCode.UNIMPLEMENTED
            else "")
    return ControllerUnavailable(f"controller unavailable: {code}: "
                                 f"{e.details() if hasattr(e, 'details') else e}{hint}")


class Client:
    """Blocking client. ``url`` is ``host:port`` (optionally ``grpc://host:port``, or
    ``grpcs://host:port`` for TLS; no port: ``ValueError``). ``timeout``: each call's,
    in seconds (None: no limit; beyond a day: a day; else ``ValueError``). ``token``: the
    controller's bearer token (default ``$CLOCKWORK_TOKEN``; "" sends none);
    ``tls``/``tls_ca``: TLS verified against the system's CAs / this CA (PEM file,
    bytes or text); ``tls_cert``/``tls_key``: a client certificate (TLS too). After ``close()`` every call
    raises ``RuntimeError``."""

    def __init__(self, url: str = "127.0.0.1:12346", timeout: float | None = 30.0, *,
                 token: str | None = None, tls: bool = False, tls_ca=None, tls_cert=None,
                 tls_key=None) -> None:
        self.url, tls_url = controller_address(url)
        self.timeout = _seconds(timeout)
        self._channel = _channel(self.url, tls or tls_url, tls_ca, tls_cert, tls_key,
                                 aio=False)
        self._stub = _sync_stub(self._channel, client_token(token))

    def infer(self, model: str, inputs=None, slo_ms: float | None = None) -> InferResult:
        req, _ = _request(model, inputs, slo_ms)
        deadline, slos = _deadline(self.timeout, req.slo_ms)
        t0 = time.perf_counter()
        try:
            resp = self._stub.Infer(req, timeout=deadline)
        except grpc.RpcError as e:
            raise _unavailable(e, self.url, req if slos else None,
                               (time.perf_counter() - t0) * 1e3, model) from e
        return _result(model, resp, (time.perf_counter() - t0) * 1e3, slo_ms)

    def list_models(self) -> list[ModelMeta]:
        try:
            r = self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_meta(m) for m in r.models]

    def model_status(self, model: str) -> pb.ModelStatusResponse:
        req = pb.ModelStatusRequest(model=_text(model, "model"))
        try:
            return self._stub.ModelStatus(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e

    def list_models_raw(self) -> pb.ListModelsResponse:
        """As ``AsyncClient.list_models_raw``: the controller's answer as it came."""
        try:
            return self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e

    def load_model(self, name: str, copies: int | None = None, profile: str | None = None,
                   package: str | None = None,
                   timeout: float | None = None) -> list[ModelMeta]:
        """Serve ``copies`` instances (default 1) of ``profile`` (default ``name``) as
        ``name``, ``name:1``, ...; returns them once they take requests. Loading what is
        loaded with the same arguments does nothing, and so does loading a loaded model
        with none of ``copies``, ``profile`` and ``package`` (it is as it was loaded). ``package``: cpu/cuda workers' model
        package (a directory inside each worker's package directory). Raises
        ``UnknownModel`` (no such profile or package), ``InvalidRequest`` (a bad name
        or count, or ``name`` loaded otherwise: unload it first) or
        ``RepositoryUnavailable``. ``timeout`` (default: the client's): a cuda worker
        builds a new package's kernels first, a minute or more the first time on a
        machine; a call that ends sooner loads nothing."""
        req = _load_request(name, copies, profile, package)
        timeout = _per_call(timeout, self.timeout)
        try:
            r = self._stub.LoadModel(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _repository_error(e, name, self.url) from e
        return [_meta(m) for m in r.models]

    def unload_model(self, name: str, timeout: float | None = None) -> list[str]:
        """Stop serving ``name`` (every instance loaded as ``name``, or that one
        instance); returns the instances unloaded once their waiting requests are
        answered (their copies leave the GPUs as they go idle). A model that is not
        loaded: ``[]``. Raises ``UnknownModel`` for a name the controller does not know."""
        req = pb.UnloadModelRequest(name=_text(name, "name"))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = self._stub.UnloadModel(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _repository_error(e, name, self.url) from e
        return list(r.instances)

    def repository_index(self, ready_only: bool = False) -> list[ModelMeta]:
        """Every model the controller can serve, with its ``state`` (and ``reason``):
        instances READY, LOADING, UNLOADING or UNAVAILABLE (``unloaded``), and profiles
        not loaded (state ""). ``ready_only``: the READY ones."""
        try:
            r = self._stub.ListModels(_index_request(ready_only), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_meta(m) for m in r.models]

    def add_worker(self, address: str, timeout: float | None = None) -> dict:
        """Have the controller connect the worker at ``address`` (``host:port``) while it
        serves: returns ``{"worker": index, "gpus": [controller-wide GPU indices],
        "added": False if it was connected already}``. Raises ``InvalidRequest`` (the
        worker cannot serve the models, or the policy cannot grow) or
        ``ControllerUnavailable`` (the worker or the controller cannot be reached,
        another controller held the worker for as long as the controller tried, or the
        worker is draining: add it again once it is removed)."""
        req = pb.AddWorkerRequest(address=_text(address, "address"))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = self._stub.AddWorker(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _worker_error(e, self.url) from e
        return {"worker": r.worker, "gpus": list(r.gpus), "added": r.added}

    def remove_worker(self, address: str, timeout: float | None = None,
                      drain: bool = False) -> dict:
        """Have the controller take the worker at ``address`` out of the cluster for good
        (scaled down, retired): nothing more is placed on its GPUs, the actions it has in
        flight fail at once (their requests served elsewhere where their SLO allows,
        else answered), its connection is closed and not made again; the worker process
        runs on. ``drain=True``: gently -- nothing more is placed on its GPUs at once,
        but the actions it has in flight run to their end there and their requests are
        answered from it; the call returns once none is left and the worker is out, or
        when ``timeout`` runs out (it is taken out then, what is still in flight
        failing). Returns ``{"worker": index (-1: one listed at the controller's start
        that never answered), "gpus": [its controller-wide GPU indices], "removed":
        False if it was removed already, "drained": True if every action it had in
        flight ran to its end there, "failed": how many failed, in flight when it
        was taken out or lost during the drain}``. A worker added again later gets a new index and empty GPUs. Raises
        ``InvalidRequest`` (no such worker, or not ``host:port``) or
        ``ControllerUnavailable``."""
        req = pb.RemoveWorkerRequest(address=_text(address, "address"), drain=bool(drain))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = self._stub.RemoveWorker(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _worker_error(e, self.url, "remove worker") from e
        return _removed(r)

    def workers(self) -> list[dict]:
        """The controller's workers, one dict each: ``worker`` (index; -1 for one listed
        at its start that has not answered yet), ``address``, ``state`` (``serving``,
        ``suspect``: missed a liveness probe, ``resetting``: heard again, its reset not
        answered yet, ``lost``: being reconnected to, ``held``: another controller holds
        it, ``awaited``, ``draining``: a drain waits for its actions in flight,
        ``removed``), ``gpus`` (controller-wide indices), ``link``
        (``fast`` or ``grpc`` while connected), ``rtt_ms`` (clock-sync round trip),
        ``for_s`` (seconds in this state) and ``detail`` (why it is
        lost, held or awaited)."""
        try:
            r = self._stub.ListWorkers(pb.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_worker_row(w) for w in r.workers]

    def stats(self, timeout: float | None = None) -> dict[str, int]:
        """The controller's counters (``timeout``: seconds, default the client's; another
        value than seconds > 0 raises ``ValueError``, as the other calls' ``timeout=``)."""
        timeout = _per_call(timeout, self.timeout)
        try:
            r = self._stub.Stats(pb.StatsRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return dict(r.counters)

    def close(self) -> None:
        self._stub = _CLOSED_STUB
        self._channel.close()

    def __reduce__(self):  # copy.copy, deepcopy and pickle
        raise TypeError(_NOT_COPIED.format(type(self).__name__))

    def __enter__(self) -> Client:
        if self._stub is _CLOSED_STUB:
            raise RuntimeError(_CLOSED)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """asyncio client; create it inside a running event loop, the one that uses it (a
    call from another loop, e.g. a later ``asyncio.run``, raises ``RuntimeError``).
    ``url``, ``timeout`` and the security keywords as ``Client``'s; after ``close()``
    every call raises ``RuntimeError``."""

    def __init__(self, url: str = "127.0.0.1:12346", timeout: float | None = 30.0, *,
                 token: str | None = None, tls: bool = False, tls_ca=None, tls_cert=None,
                 tls_key=None) -> None:
        self.url, tls_url = controller_address(url)
        self.timeout = _seconds(timeout)
        try:
            self._channel = _channel(self.url, tls or tls_url, tls_ca, tls_cert, tls_key,
                                     aio=True)
        except RuntimeError as e:  # (gRPC's own, from deep inside it: no loop to bind to)
            if "event loop" not in str(e):
                raise
            raise RuntimeError(_NO_LOOP) from None
        self._stub = _stub(self._channel, client_token(token))
        self._closing = False
        self._streams: weakref.WeakSet[InferStream] = weakref.WeakSet()  # (ended at close)
        self._pid = os.getpid()  # (a process forked from this one cannot use it)
        self._calls = asyncio.Semaphore(MAX_UNARY_CALLS)
        try:  # its channel is bound to this loop (grpc.aio)
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made outside a loop: grpc.aio took the thread's loop (a
            # later asyncio.run's is another: its calls failed with gRPC's own errors)
            self._loop = getattr(self._channel, "_loop", None)
        for name in _UNARY:
            setattr(self._stub, name, _CloseAware(getattr(self._stub, name), self))

    async def infer(self, model: str, inputs=None, slo_ms: float | None = None) -> InferResult:
        req, _ = _request(model, inputs, slo_ms)
        deadline, slos = _deadline(self.timeout, req.slo_ms)
        t0 = time.perf_counter()
        try:
            resp = await self._stub.Infer(req, timeout=deadline)
        except grpc.RpcError as e:
            raise _unavailable(e, self.url, req if slos else None,
                               (time.perf_counter() - t0) * 1e3, model) from e
        return _result(model, resp, (time.perf_counter() - t0) * 1e3, slo_ms)

    async def list_models(self) -> list[ModelMeta]:
        try:
            r = await self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_meta(m) for m in r.models]

    async def list_models_raw(self) -> pb.ListModelsResponse:
        try:
            return await self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e

    async def model_status(self, model: str) -> pb.ModelStatusResponse:
        """As ``Client.model_status``."""
        req = pb.ModelStatusRequest(model=_text(model, "model"))
        try:
            return await self._stub.ModelStatus(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e

    async def load_model(self, name: str, copies: int | None = None,
                         profile: str | None = None, package: str | None = None,
                         timeout: float | None = None) -> list[ModelMeta]:
        """As ``Client.load_model``."""
        req = _load_request(name, copies, profile, package)
        timeout = _per_call(timeout, self.timeout)
        try:
            r = await self._stub.LoadModel(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _repository_error(e, name, self.url) from e
        return [_meta(m) for m in r.models]

    async def unload_model(self, name: str, timeout: float | None = None) -> list[str]:
        """As ``Client.unload_model``."""
        req = pb.UnloadModelRequest(name=_text(name, "name"))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = await self._stub.UnloadModel(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _repository_error(e, name, self.url) from e
        return list(r.instances)

    async def add_worker(self, address: str, timeout: float | None = None) -> dict:
        """As ``Client.add_worker``."""
        req = pb.AddWorkerRequest(address=_text(address, "address"))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = await self._stub.AddWorker(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _worker_error(e, self.url) from e
        return {"worker": r.worker, "gpus": list(r.gpus), "added": r.added}

    async def remove_worker(self, address: str, timeout: float | None = None,
                            drain: bool = False) -> dict:
        """As ``Client.remove_worker``."""
        req = pb.RemoveWorkerRequest(address=_text(address, "address"), drain=bool(drain))
        timeout = _per_call(timeout, self.timeout)
        try:
            r = await self._stub.RemoveWorker(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _worker_error(e, self.url, "remove worker") from e
        return _removed(r)

    async def repository_index(self, ready_only: bool = False) -> list[ModelMeta]:
        """As ``Client.repository_index``."""
        try:
            r = await self._stub.ListModels(_index_request(ready_only), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_meta(m) for m in r.models]

    async def workers(self) -> list[dict]:
        """As ``Client.workers``."""
        try:
            r = await self._stub.ListWorkers(pb.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return [_worker_row(w) for w in r.workers]

    async def stats(self) -> dict[str, int]:
        try:
            r = await self._stub.Stats(pb.StatsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _unavailable(e, url=self.url) from e
        return dict(r.counters)

    def _check_loop(self) -> None:
        """A call from another event loop than the client's (a second ``asyncio.run``,
        another thread's loop) raises ``RuntimeError`` saying so; gRPC's own errors there
        are 'Event loop is closed' or a future attached to a different loop. In a
        process forked from the one that made the client, the ``RuntimeError`` says that
        instead (it said "another event loop": the child's loop is another, but the cause
        is the fork)."""
        if os.getpid() != self._pid:
            raise RuntimeError(_FORKED.replace("this Client", "this AsyncClient")
                               .replace("make a Client", "make an AsyncClient"))
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(_OTHER_LOOP)

    def stream(self, interval_us: float = 0.0, answer_times: bool = False,
               reconnect: bool = True) -> InferStream:
        """A pipelined stream: ``submit`` many, replies resolve their futures.
        ``interval_us``: send at most one message per interval (requests submitted in
        between share it; for load generators, see clockwork.protocol.pacing): 0 (no
        pacing) to ``MAX_INTERVAL_US`` (a second), else ``ValueError``.
        ``answer_times``: keep when each answer was read (``InferStream.answered_ns``).
        ``reconnect``: when the controller goes away, open a new call once it is back
        (see ``InferStream``); False: the stream ends with its call."""
        self._check_loop()
        st = InferStream(self._stub, _interval_us(interval_us), self.url, answer_times,
                         self, reconnect=bool(reconnect))
        self._streams.add(st)
        return st

    async def close(self) -> None:
        """Close the channel; calls still waiting fail with ``ControllerUnavailable``."""
        self._closing = True
        self._stub = _CLOSED_STUB
        for st in list(self._streams):  # (one waiting to open its next call has none for
            st._reader.cancel()  # the channel's close to end)
        await self._channel.close()

    def __reduce__(self):  # copy.copy, deepcopy and pickle
        raise TypeError(_NOT_COPIED.format(type(self).__name__))

    async def __aenter__(self) -> AsyncClient:
        if self._closing:
            raise RuntimeError(_CLOSED)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _Callback:
    """What ``InferStream`` keeps for a request submitted with ``on_answer``, in place of
    its future: the first of ``set_result`` / ``set_exception`` calls ``on_answer(response,
    None)`` / ``on_answer(None, error)`` at once (a future would schedule its callbacks
    for a later round of the event loop); what it raises (``CancelledError`` too, as
    asyncio's own callbacks) goes to the event loop's exception handler, so that the task
    that answered it (the stream's reader, its watchdog, its sender) goes on."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def done(self) -> bool:
        return self.fn is None

    def set_result(self, response) -> None:
        self._call(response, None)

    def set_exception(self, error: BaseException) -> None:
        self._call(None, error)

    def _call(self, response, error) -> None:
        fn, self.fn = self.fn, None
        if fn is None:
            return
        try:
            fn(response, error)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - the caller's: said, the stream goes on
            asyncio.get_running_loop().call_exception_handler({
                "message": f"InferStream: exception in the on_answer callback {fn!r}",
                "exception": e})

    def later(self, response, error) -> None:
        """Answer in a later round of the event loop (a request failed inside ``submit``:
        a callback that submits again on failure would otherwise recurse)."""
        asyncio.get_running_loop().call_soon(self._call, response, error)


def _took(said: dict) -> bool:
    """Whether a stream call's initial metadata ``said`` is the controller's as it takes
    the call (its limit or default SLO: a refusal says neither)."""
    return STREAM_LIMIT_KEY in said or STREAM_DEFAULT_SLO_KEY in said


class InferStream:
    """Many requests over one ``InferStream`` call. ``submit`` returns a future of the raw
    ``InferResponse`` (no exception for non-success: load generators count statuses), or
    calls the ``on_answer`` given it.
    Requests submitted in one event-loop iteration go together, in messages of up to
    ``STREAM_MESSAGE_BYTES`` (a larger request alone; one too large for any message
    raises ``InvalidRequest`` at its submit, and the stream carries on).

    Deadlines as the client sees them, from each request's submit: each message carries
    the client's send time and each request its wait here for that message (the
    controller charges a request both: its message's delay, and ``queued_ns``); an
    answer that arrives after the request's SLO (measured here) is reported as status TIMEOUT (reason ``late``), and a
    request unanswered ``GRACE_S`` after its SLO is resolved here with status TIMEOUT
    (reason ``no_answer``) -- a stalled, stuck or vanished controller is noticed within
    the SLO plus a second. A request without an SLO of its own has the controller's
    default, which the controller says as the stream opens, for both (one that does not
    say it: such requests are neither given up nor found late here). The later answer,
    if any, is ignored.

    When its call ends because the controller went away (it stopped or died, or the
    connection broke: a vanished controller is noticed within ~15 s, keepalive), the
    requests sent on it and still unanswered fail ``ControllerUnavailable`` (they may have
    run; only a call the controller refused as it starts, or one that found no
    connection, took none in: its requests go on the next call, so each runs at most
    once), and with ``reconnect`` (the default; once the controller has answered on the
    stream, or refused a call as it starts: one never reached fails at once, as before) a
    new call is opened on the same channel ``REOPEN_FIRST_S`` later (doubling to
    ``REOPEN_MAX_S`` while calls keep ending before the controller answers on them), once
    the channel is connected again: it waits for the controller to be back, and the
    requests submitted meanwhile wait in the stream -- each given up at its SLO plus
    ``GRACE_S`` as any other -- and go on it. A refused token (``Unauthenticated``), a
    closed client, or a stream made with ``reconnect=False`` ends for good instead: what
    is unanswered fails, and so does every later ``submit``.

    ``close()`` sends what was submitted and waits for the answers still due: it returns
    once every request is answered or given up (its SLO, or the default, plus ``GRACE_S``), or the call
    ends -- a stalled or vanished controller within ~15 s (keepalive), what is
    unanswered then failing ``ControllerUnavailable``. Cancel it to abandon the rest.

    ``answered_ns`` (made with ``answer_times``; else None): client id -> the
    ``time.monotonic_ns()`` at which its answer was read, the instant the ``late`` check
    used (a future's callbacks run later, after the event loop's other work): a load
    generator that logs latencies pops each as it takes the answer, so that its log and
    the statuses agree."""

    def __init__(self, stub: pbg.ClockworkStub, interval_us: float = 0.0,
                 url: str = "", answer_times: bool = False,
                 owner: AsyncClient | None = None, reconnect: bool = True) -> None:
        self._stub = stub
        self._owner = owner  # its client: closed, submit raises RuntimeError
        self._url = url  # the controller's address, for messages
        self._pacer = Pacer(_interval_us(interval_us))
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future | _Callback] = {}
        self._sent: dict[int, tuple[int, float]] = {}  # client id -> (submit time, SLO ms; 0: the default)
        self._due: list[tuple[int, int]] = []  # (give-up time, client id) heap
        self._queue: list[pb.InferRequest] = []  # submitted, not yet sent
        self._sizes: list[int] = []  # their sizes in bytes
        self._wake = asyncio.Event()
        self._closed = False
        self._error: Exception | None = None  # what ended the call, for later submits
        self._limit: int | None = None  # the controller's largest message (0: not said)
        # the controller's default SLO (ns; 0: not said); until it is known, the requests
        # that take it, by client id, given their give-up time when it comes
        self._default_slo = 0
        self._undated: list[int] | None = []
        self.answered_ns: dict[int, int] | None = {} if answer_times else None
        self._reconnect = reconnect
        self._away: str | None = None  # why the last call ended, until a new one answers
        # the requests sent on the current call and not yet answered, by client id (sent
        # again on the next call if the controller never took the call: it was starting)
        self._carried: dict[int, pb.InferRequest] = {}
        self._gen = 0  # the calls opened so far (the current one's number)
        self._open()
        self._reader = asyncio.create_task(self._run())
        self._watch = asyncio.create_task(self._watchdog())

    def _open(self) -> None:
        """A new call on the stream's channel (the first, or one after the last ended,
        once the channel is connected again); its sender takes from the queue, and the
        controller's limit is read from it again."""
        self._gen += 1
        self._call = self._stub.InferStream(self._requests(self._gen))
        self._opened = time.monotonic()
        self._limit = None
        self._took = self._answered = False  # the controller took it; answered on it
        self._said = asyncio.ensure_future(self._read_limit(self._call))

    def _took_call(self) -> None:
        """The controller took the current call (it said its limit, or answered): what
        was sent on it is not sent again, so its messages are not kept."""
        self._took = True
        self._carried = {}

    async def _watchdog(self) -> None:
        """Resolve requests whose SLO and grace have passed without an answer (ends with
        the reader: the call's end fails whatever still waits)."""
        last, skipped = time.monotonic_ns(), False
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic_ns()
            held, last = now - last > WATCH_STALL_NS, now
            if held and not skipped:  # (this process was held up: the answers that came
                skipped = True  # meanwhile are read first, not given up unread; one
                continue  # look skipped, not every look of a loop always this late)
            skipped = False
            due = self._due
            gave_up = False
            while due and due[0][0] <= now:
                _, cid = heapq.heappop(due)
                gave_up = True
                self._carried.pop(cid, None)
                fut = self._waiting.pop(cid, None)
                sent = self._sent.pop(cid, None)
                if fut is not None and not fut.done():
                    waited = (now - sent[0]) / 1e6 if sent else 0.0
                    slo = (f"its SLO {sent[1]:g} ms" if sent and sent[1] else
                           f"the controller's default SLO {self._default_slo / 1e6:g} ms")
                    away = (f"; the stream's call ended ({self._away}) and no controller "
                            "has taken a new one since" if self._away else "")
                    fut.set_result(pb.InferResponse(
                        status=4, reason="no_answer", client_id=cid, gpu=-1,
                        message=f"no answer {waited:.0f} ms after it was submitted ({slo} "
                                f"plus {GRACE_S:g} s){away}"))
            queue = self._queue
            if gave_up and len(queue) > 2 * len(self._sent) + 64:
                # (given up while waiting to be sent, as during an outage: their messages,
                # inputs included, go now, not once a call is open to skip them)
                sent = self._sent
                keep = [k for k, r in enumerate(queue) if r.client_id in sent]
                sizes = self._sizes
                self._queue = [queue[k] for k in keep]
                self._sizes = [sizes[k] for k in keep]

    async def _requests(self, gen: int):
        """Call ``gen``'s messages: what was submitted, up to ``STREAM_MESSAGE_BYTES`` a
        message (one larger request alone), until the stream is closed and all sent, or
        a later call took over."""
        while gen == self._gen:
            if not self._queue:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._pacer.wait()  # under load: one message per interval
            if gen != self._gen or not self._queue:  # (the call ended meanwhile)
                continue
            sizes = self._sizes
            n, size = 1, sizes[0]
            while n < len(sizes) and size + sizes[n] <= STREAM_MESSAGE_BYTES:
                size += sizes[n]
                n += 1
            batch, taken = self._queue[:n], sizes[:n]
            self._queue, self._sizes = self._queue[n:], sizes[n:]
            try:
                if size > STREAM_MESSAGE_BYTES and await self._too_large(batch[0]):
                    continue  # (answered: not sent, where it would end the whole stream)
            except asyncio.CancelledError:  # (the call ended: they go on the next)
                self._put_back(batch, taken)
                raise
            sent = self._sent
            # (one the watchdog gave up while it waited here is answered: not sent, where
            # the controller would run it with no wait counted and its answer be dropped)
            batch = [req for req in batch if req.client_id in sent]
            if not batch:
                continue
            self._pacer.note(len(batch))
            now = time.monotonic_ns()
            if gen != self._gen:  # (the call ended while one too large was looked at:
                self._put_back(batch, taken)  # these go on the next)
                return
            # (kept to be sent again only until the controller takes the call: it may
            # refuse it as it starts; a stream that does not reconnect keeps none)
            carried = self._carried if self._reconnect and not self._took else None
            for req in batch:  # the wait here counts against its SLO (at the controller too)
                t = sent[req.client_id]
                if now > t[0]:
                    req.queued_ns = now - t[0]
                if carried is not None:
                    carried[req.client_id] = req
            yield pb.InferRequestBatch(requests=batch, client_time_ns=now)

    def _put_back(self, reqs: list[pb.InferRequest], sizes: list[int]) -> None:
        """``reqs`` (their ``sizes``), taken from the queue for a call that ended, go
        first on the next."""
        self._queue[:0] = reqs
        self._sizes[:0] = sizes

    async def _read_limit(self, call) -> None:
        """The controller's largest message and default SLO, from the call's initial
        metadata, which it sends as the call opens (a controller that does not: none,
        0; requests without an SLO of their own are then not given up here)."""
        try:
            with contextlib.suppress(grpc.RpcError, ValueError, TypeError):
                said = dict(await call.initial_metadata() or ())
                if call is self._call and _took(said):
                    self._took_call()
                limit = said.get(STREAM_LIMIT_KEY)
                self._limit = int(limit) if limit else 0
                slo = int(said.get(STREAM_DEFAULT_SLO_KEY) or 0)
                if 0 < slo <= MAX_SLO_MS * 1e6:
                    self._default_slo = slo
                    for cid in self._undated or ():
                        sent = self._sent.get(cid)
                        if sent is not None:
                            self._give_up_at(sent[0] + slo, cid)
        finally:
            self._undated = None  # (known, or never to be)

    def _give_up_at(self, t: int, cid: int) -> None:
        """The watchdog answers ``cid`` TIMEOUT (no_answer) at ``t`` plus ``GRACE_S``."""
        due = self._due
        if len(due) > 2 * len(self._sent) + 64:  # answered ones (SLOs up to a day)
            due = self._due = [e for e in due if e[1] in self._sent]
            heapq.heapify(due)
        heapq.heappush(due, (t + int(GRACE_S * 1e9), cid))

    async def _too_large(self, req: pb.InferRequest) -> bool:
        """Whether ``req`` (a request that goes alone) is larger than the controller takes
        in one message (its limit, from the stream's initial metadata): then it is
        answered here, INVALID_REQUEST (reason ``bad_input``), and not sent. Sent, gRPC
        ended the whole stream with RESOURCE_EXHAUSTED, and every request on it failed
        (as InvalidRequest). The limit is waited for only in the stream's first
        ``LIMIT_WAIT_S`` (it comes as the stream opens; a controller that does not say it
        sends no metadata before its first reply, and the sender must not wait for that):
        unknown, False."""
        if self._limit is None:
            wait = self._opened + LIMIT_WAIT_S - time.monotonic()
            if wait > 0:
                try:
                    async with asyncio.timeout(wait):
                        await asyncio.shield(self._said)
                except TimeoutError:
                    pass
                except asyncio.CancelledError:  # (its call ended: the look was called off)
                    if asyncio.current_task().cancelling():
                        raise
        limit = self._limit
        if not limit:
            return False
        n = req.ByteSize() + _BATCH_BYTES
        if n <= limit:
            return False
        cid = req.client_id
        self._sent.pop(cid, None)
        fut = self._waiting.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_result(pb.InferResponse(
                status=6, reason="bad_input", client_id=cid, gpu=-1,
                message=f"the request is {n:,} bytes, more than the controller takes in "
                        f"one message ({limit:,}: its grpc_max_receive_bytes); send "
                        "smaller inputs"))
        return True

    async def _run(self) -> None:
        """Each call's answers read (``_read``); when a call ends, what it carried
        unanswered fails, and with ``reconnect`` the next call is opened (the class
        says when); otherwise, or for an error a new call cannot mend, everything
        unanswered fails and the stream has ended."""
        wait, ever = REOPEN_FIRST_S, False
        try:
            while True:
                err, heard, unread = await self._read(self._call)
                self._gen += 1  # (its sender takes nothing more: the next call's will)
                self._said.cancel()
                # (a controller that refused the call as it starts was reached too)
                ever = ever or heard or STARTING_MESSAGE in str(err)
                owner = self._owner
                if (not self._reconnect or not ever  # (never reached: no controller
                        # there, as the first call says at once)
                        or type(err) is not ControllerUnavailable
                        or owner is not None and owner._closing):
                    self._fail_waiting(err)
                    return
                self._call.cancel()
                self._away = str(err)
                carried, self._carried = self._carried, {}
                queued = {r.client_id for r in self._queue}
                sent = [c for c in self._waiting if c not in queued]
                back = [carried[c] for c in sent if c in carried] if unread else []
                if back:  # the controller never read them (starting, or no connection):
                    # sent again. A call that ended otherwise before the controller said
                    # it took it may have been taken: its requests fail, as run or not
                    self._put_back(back, [r.ByteSize() for r in back])
                    resent = {r.client_id for r in back}
                    sent = [c for c in sent if c not in resent]
                # (taken in: they may have run)
                self._fail_waiting(err, sent)
                if self._closed and not self._waiting:  # (closed: nothing left to send)
                    return
                if self._answered:  # (a call that ends before any answer: the wait grows)
                    wait = REOPEN_FIRST_S
                await asyncio.sleep(wait)
                wait = min(2 * wait, REOPEN_MAX_S)
                if owner is not None and not owner._closing:
                    # the controller back (a call made before it is, with wait_for_ready,
                    # could hang on a channel connected again meanwhile)
                    await owner._channel.channel_ready()
                if owner is not None and owner._closing:
                    self._fail_waiting(err)
                    return
                self._open()  # (closed meanwhile: it sends what waits, then ends)
        except asyncio.CancelledError:  # the channel closed under it (client.close())
            self._fail_waiting(ControllerUnavailable("the client was closed with requests "
                                                     "on its stream unanswered"))
        finally:
            self._watch.cancel()  # nothing is left to watch (it woke 20 times a second)
            self._said.cancel()

    async def _read(self, call) -> tuple[ClockworkError, bool, bool]:
        """``call``'s answers, each resolving its request, until the call ends: (why it
        ended, whether the controller said anything on it, whether it surely read none of
        the call's requests: it refused the call as it starts, or none was connected)."""
        heard = False
        try:
            async for batch in call:
                if not heard:
                    heard = self._answered = True
                    self._away = None
                    self._took_call()
                now = time.monotonic_ns()
                times = self.answered_ns
                carried = self._carried
                for resp in batch.responses:
                    carried.pop(resp.client_id, None)
                    fut = self._waiting.pop(resp.client_id, None)
                    sent = self._sent.pop(resp.client_id, None)
                    if fut is not None and not fut.done():
                        if times is not None:
                            times[resp.client_id] = now
                        # (its SLO, or the controller's default once said: 0 before)
                        slo = sent and (sent[1] or self._default_slo / 1e6)
                        if resp.status == 0 and slo and now - sent[0] > slo * 1e6:
                            resp.status, resp.reason = 4, "late"  # past its SLO as seen here
                            resp.message = (f"answered {(now - sent[0]) / 1e6:.1f} ms after "
                                            f"it was submitted, past its {slo:g} ms SLO"
                                            + ("" if sent[1] else " (the controller's "
                                               "default)"))
                        fut.set_result(resp)
        except grpc.RpcError as e:
            if not heard:  # (the controller took the call: it said its limit as it opened)
                with contextlib.suppress(grpc.RpcError, ValueError, TypeError):
                    said = dict(await call.initial_metadata() or ())
                    heard = _took(said)
            err = _unavailable(e, self._url)
            if e.code() == grpc.StatusCode.INTERNAL and e.details() == CORE_INTERNAL:
                # gRPC's words for a call that ended while a message was being sent on
                # it, whatever status the controller ended it with (stopping: UNAVAILABLE)
                err = ControllerUnavailable(
                    "the stream's call ended while a message was being sent on it (the "
                    "controller ended it, as it does when it stops; gRPC: INTERNAL: "
                    f"{CORE_INTERNAL})")
            if isinstance(err, InvalidRequest):  # (a message too large ended the call: the
                # requests still waiting are lost with it, not invalid)
                err = ControllerUnavailable(f"the stream ended, a message on it larger than "
                                            f"the controller takes: {e.details()}")
            unread = not heard and (_unreachable(e) or _refused_stream(e) or (
                e.code() == grpc.StatusCode.UNAVAILABLE and e.details() == STARTING_MESSAGE))
            return err, heard, unread
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else ends the call: none waits on
            # (e.g. the client made on another event loop than the one using it)
            return ControllerUnavailable(f"the stream's call failed: {e!r}"), heard, False
        # the controller ended the call (it stops, or closed it): none is lost
        return ControllerUnavailable("controller stream closed"), True, False

    def _fail_waiting(self, err: ClockworkError, ids: list[int] | None = None) -> None:
        """The requests ``ids`` (None: every one still waiting, and every later submit:
        the stream has ended) fail with ``err``."""
        if ids is None:
            self._error = err
            waiting = list(self._waiting.values())  # (an ``on_answer`` runs as it fails)
            self._waiting.clear()
            self._sent.clear()
            self._carried.clear()
        else:
            waiting = [self._waiting.pop(c) for c in ids]
            for c in ids:
                self._sent.pop(c, None)
        for fut in waiting:
            if not fut.done():
                fut.set_exception(err)

    def submit(self, model: str, inputs=None, slo_ms: float | None = None,
               skip_outputs: bool = False, since_ns: int | None = None,
               on_answer=None) -> asyncio.Future | None:
        """``skip_outputs``: the answer carries status and timing but no output tensors
        (load generators; saves copying outputs through the controller). ``since_ns``:
        the ``time.monotonic_ns()`` instant the request counts from (default: now; a load
        generator's arrival time for a request it sends late): its wait since then counts
        against its SLO, here and at the controller, as a wait in the stream does; one
        whose SLO has ended already is answered TIMEOUT (reason ``late``) at once, not
        sent.

        ``on_answer``: instead of a future (``submit`` then returns None), a callable
        ``on_answer(response, error)`` called once, as the answer is read (``error`` None)
        or the request fails (``response`` None, ``error`` what the future would raise).
        It saves a future and an event-loop round a request (load generators at tens of
        thousands a second). It runs inside the stream's own tasks (its reader, or its
        watchdog or sender for a request given up or refused here), never inside
        ``submit`` (a request refused at once is answered in a later round of the event
        loop), so it must not block; what it raises is reported to the event loop's
        exception handler, and the stream goes on."""
        if self._closed:
            raise RuntimeError("stream is closed")
        if self._owner is not None and self._owner._closing:
            raise RuntimeError(_CLOSED)
        if since_ns is not None:  # (a float raised inside the stream's writer: the whole
            # stream ended, every request said "the client was closed")
            if type(since_ns) is not int and (isinstance(since_ns, bool)
                                              or not isinstance(since_ns, numbers.Integral)):
                raise ValueError(f"since_ns must be an integer (time.monotonic_ns()), got "
                                 f"{since_ns!r}")
            if not 0 <= since_ns < 1 << 63:
                raise ValueError(f"since_ns must be a time.monotonic_ns() reading (0 to "
                                 f"2^63 - 1), got {since_ns}")
            since_ns = int(since_ns)
        if on_answer is not None and not callable(on_answer):  # (else lost at its answer)
            raise TypeError(f"on_answer must be a callable (response, error), got "
                            f"{on_answer!r}")
        cid = next(self._ids)
        if on_answer is None:
            fut = asyncio.get_running_loop().create_future()
            answer_now = fut.set_result
        else:
            fut = _Callback(on_answer)
            answer_now = functools.partial(fut.later, error=None)
        if self._error is not None or self._reader.done():  # the call has ended: say why,
            # if the controller said
            err = self._error or ControllerUnavailable("controller stream closed")
            if on_answer is None:
                fut.set_exception(err)
                return fut
            fut.later(None, err)
            return None
        req, size = _request(model, inputs, slo_ms, cid)  # (raises: nothing kept)
        if skip_outputs:
            req.skip_outputs = True
        slo = req.slo_ms
        t = now = time.monotonic_ns()
        if since_ns is not None and since_ns < t:
            t = since_ns
            if 0 < slo < 1e9 and now - t > slo * 1e6:  # (sending it would waste the GPU)
                answer_now(pb.InferResponse(
                    status=4, reason="late", client_id=cid, gpu=-1,
                    message=f"its {slo:g} ms SLO ended before it was sent "
                            f"({(now - t) / 1e6:.1f} ms after it arrived)"))
                return fut if on_answer is None else None
        self._waiting[cid] = fut
        if not 0 < slo < 1e9:  # the default SLO (or a nonsense one: the controller refuses it)
            self._sent[cid] = (t, 0.0)  # (its wait here still counts: queued_ns)
            if self._default_slo:
                self._give_up_at(t + self._default_slo, cid)
            elif self._undated is not None:  # (until the controller says its default)
                self._undated.append(cid)
        else:
            self._sent[cid] = (t, slo)
            self._give_up_at(t + int(slo * 1e6), cid)
        self._queue.append(req)
        self._sizes.append(size)
        self._wake.set()
        return fut if on_answer is None else None

    @property
    def outstanding(self) -> int:
        return len(self._waiting)

    async def close(self) -> None:
        """End the stream (see the class): wait for the answers still due, each no longer
        than the watchdog gives it (its SLO plus ``GRACE_S``), or until the call ends (a
        stalled or vanished controller: keepalive, ~15 s); then the call is cancelled.
        Cancelling ``close()`` abandons what is unanswered (it fails
        ``ControllerUnavailable``)."""
        self._closed = True
        self._wake.set()
        try:
            # (nothing waiting: every request answered or given up by the watchdog; the
            # reader also ends when the controller ends the call, answered or not)
            while self._waiting and not self._reader.done():
                await asyncio.wait({self._reader}, timeout=CLOSE_POLL_S)
        except asyncio.CancelledError:
            if self._waiting:
                self._fail_waiting(ControllerUnavailable(
                    f"the stream was closed with {len(self._waiting)} request(s) "
                    "unanswered (its close() was cancelled)"))
            raise
        finally:
            self._call.cancel()
            self._reader.cancel()  # (waiting to open the next call: no more)
            self._watch.cancel()
            self._said.cancel()
        await asyncio.wait({self._reader}, timeout=1.0)  # (the cancel ends it at once)
