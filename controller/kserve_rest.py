"""KServe v2 REST (HTTP/1.1) of the controller, in two layers:

- :class:`KServeRest`, the routes, independent of the transport: ``route(method, target,
  headers, body, peer)`` -> :class:`Reply` (status, JSON payload or plain text, binary
  tensor data after the JSON, more headers). The protocol logic is
  ``controller.kserve.KServeFrontend``'s, shared with gRPC. Tests drive it without
  sockets.
- the HTTP server: aiohttp's (``aiohttp.web``), on the controller's event loop, configured
  in one place, :func:`make_runner`, from ``node.limits``: chunked and compressed
  (``gzip``, ``deflate``) request bodies, ``Expect: 100-continue``, keep-alive, bounds on
  the request line, the headers and the body (the decoded body too), the idle and read
  timeouts, response compression for clients that accept it. Its handler
  (:class:`_Handler`) only checks the token, reads the body and writes the Reply; it
  answers a request without the token, and any request to a probe, without reading its
  body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web import ContentCoding
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_urldispatcher import _default_expect_handler

from clockwork.errors import STARTING_MESSAGE
from clockwork.protocol import accept_guard
from clockwork.protocol.addresses import join
from clockwork.protocol.security import Refusals, one_bearer_ok, token_refused_how
from controller.body_decoding import BodyDecoder
from controller.json_offload import JsonDecoders
from controller.json_offload import decode as decode_body
from controller.kserve import (
    HTTP_CODE,
    INVALID,
    KS_TO_NP,
    NOT_FOUND,
    RETRY_AFTER_S,
    VERSION,
    KServeError,
    KServeFrontend,
    _internal,
)
from controller.kserve_status import UNAVAILABLE
from controller.kserve_unserved import rest_message
from controller.kserve_validate import _short, json_loads, json_problem

# with a token, every path but these needs "Authorization: Bearer <token>" (probes stay
# open); their requests are answered without reading (or decoding) a body, which they never
# need: GET/HEAD by the probe, any other method 405
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # /metrics, /healthz, /readyz
BINARY_TYPE = "application/octet-stream"  # JSON header + binary tensor data
SERVER_HEADER = "clockwork"  # every answer's Server header: no versions
# the Content-Encodings of request bodies served ("identity": as it is; "x-gzip" is gzip,
# as HTTP says); any other name is refused 415 with Accept-Encoding, as Triton and HTTP
# (RFC 9110) answer (aiohttp would pass an unknown one through undecoded, and decode br and
# zstd only where their packages happen to be installed)
CODINGS = frozenset({"identity", "gzip", "x-gzip", "deflate"})
ACCEPTED_CODINGS = "identity, gzip, deflate"
# a response body at least this long is compressed when the client accepts gzip or
# deflate (a shorter one gains nothing worth the CPU; aiohttp compresses bodies over 4 KiB
# on a worker thread)
COMPRESS_MIN_BYTES = 1024
# at shutdown, requests being handled get this long to finish (then they are cancelled)
SHUTDOWN_GRACE_S = 1.0

GET, POST = frozenset({"GET", "HEAD"}), frozenset({"POST"})


class Reply(NamedTuple):
    """A route's answer. ``payload``: a dict or list (JSON), ``JsonText`` (JSON written
    already), bytes (plain text: /metrics and the probes) or None (an empty body);
    ``extra``: binary tensor data after the JSON (the binary tensor extension);
    ``headers``: more response headers; ``compress``: may be compressed for a client that
    accepts it (an inference's outputs and /metrics only: Triton compresses nothing else,
    and its asyncio client, whose requests all say
    ``Accept-Encoding: gzip, deflate``, decodes no other answer -- statistics, a
    configuration, the index or an error gzipped read as garbage there)."""

    status: int
    payload: object = None
    extra: bytes = b""
    headers: dict | None = None
    compress: bool = False


def _error(e: KServeError) -> Reply:
    return Reply(HTTP_CODE[e.kind], {"error": e.message})


def _unrouted(method: str, path: str) -> str:
    """NOT_FOUND's message for a path with no route: what is not served, for the paths of
    Triton's extensions this server lacks."""
    segs = [urllib.parse.unquote(s) for s in path.strip("/").split("/")]
    told = rest_message(segs[1:]) if segs[0] == "v2" else None
    return f"{told} ({method} {path})" if told else f"no route {method} {path}"


def _resolve(path: str) -> tuple[str, list[str], frozenset[str]] | None:
    """A request path -> (route, its arguments, the methods it takes), or None: no such
    path."""
    if path in ("/metrics", "/healthz", "/readyz"):
        return "ops", [path], GET
    segs = [urllib.parse.unquote(s) for s in path.strip("/").split("/")]
    if segs[0] != "v2":
        return None
    rest = segs[1:]
    if rest == []:
        return "server", [], GET
    if rest in (["health", "live"], ["health", "ready"]):
        return "health_" + rest[1], [], GET
    if rest == ["models", "stats"]:
        return "all_stats", [], GET
    if rest == ["repository", "index"]:
        return "repo_index", [], POST
    if len(rest) == 4 and rest[:2] == ["repository", "models"] and rest[3] in ("load",
                                                                                 "unload"):
        return "repo_" + rest[3], [rest[2]], POST
    if len(rest) >= 2 and rest[0] == "models":
        name, tail = rest[1], rest[2:]
        version = ""
        if len(tail) >= 2 and tail[0] == "versions":
            version, tail = tail[1], tail[2:]
        if tail == []:
            return "model", [name, version], GET
        if len(tail) == 1 and tail[0] in ("config", "stats", "ready"):
            return tail[0], [name, version], GET
        if tail == ["infer"]:
            return "infer", [name, version], POST
    return None


class KServeRest:
    """The REST routes of one controller (``node``); with ``token``, :meth:`authorized`
    says whether a request carries it."""

    def __init__(self, node, token: str | None = None) -> None:
        self.fe = KServeFrontend(node)
        self.node = node
        self.decoders = JsonDecoders(node.limits.rest_json_processes)
        self.token = token.encode() if token else None
        self._refused = None

    # ------------------------------------------------------------------ authentication

    @staticmethod
    def is_open(target: str) -> bool:
        """Whether the request target's path is one of ``OPEN_PATHS`` (the probes)."""
        return urllib.parse.urlsplit(target).path in OPEN_PATHS

    def authorized(self, target: str, headers) -> bool:
        """Whether the request may run: no token is needed, its path is open (the
        probes), or it carries ``Authorization: Bearer <token>`` (one such header)."""
        return (self.token is None or self.is_open(target)
                or one_bearer_ok(_authorization(headers), self.token))

    def unauthorized(self, headers, peer: str = "", what: str = "") -> Reply:
        """401 with ``WWW-Authenticate: Bearer`` (counted, logged at most once a second,
        with ``what`` was asked (method and path, its first 200 characters, those that
        cannot be printed as '?'), ``peer``, the caller's address, and whether it sent no
        token or a wrong one); nothing of the request runs and its body is not read."""
        if self._refused is None:
            self._refused = Refusals("controller", self.node.count)
        given = _authorization(headers)
        sent = bool(given)
        how = token_refused_how(given, "Authorization headers")
        what = "".join(c if c.isprintable() else "?" for c in what[:200])
        self._refused("an unauthenticated HTTP request" + (f" {what}" if what else "")
                      + (f" from {peer}" if peer else "") + f" ({how})")
        challenge = 'Bearer realm="clockwork"'
        if sent:
            challenge += ', error="invalid_token"'
            why = ("authentication failed: the token sent is not this controller's (send "
                   "its token as 'Authorization: Bearer <token>')")
        else:
            why = "authentication required: send the header 'Authorization: Bearer <token>'"
        return Reply(401, {"error": why}, headers={"WWW-Authenticate": challenge})

    # ------------------------------------------------------------------ routes

    async def route(self, method: str, target: str, headers, body: bytes,
                    peer: str = "rest",
                    waiting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> Reply:
        """Answer one request. ``target``: the request target (path and query, as
        sent); ``headers``: a mapping whose ``get`` takes lower-case names (aiohttp's
        headers, or a dict with lower-case keys); ``body``: the whole (decoded) body;
        ``peer``: the client connection (its outstanding requests are bounded);
        ``waiting()``: the context of an inference's wait for its answer, which the
        transport cancels when the client's connection is lost (the call's requests
        still queued are then withdrawn). Every
        failure is an answer: the kserve_status table's status, 405 with ``Allow`` for
        a method the path does not take, 500 "internal error" for a bug."""
        path = urllib.parse.urlsplit(target).path
        try:
            found = _resolve(path)
            if found is None:
                raise KServeError(NOT_FOUND, _unrouted(method, path))
            what, args, methods = found
            if method not in methods:
                return Reply(405, {"error": f"{method} is not allowed on {path}"},
                             headers={"Allow": ", ".join(sorted(methods))})
            if what == "ops":
                return await self.ops(path)
            if getattr(self.node, "starting", False) and what not in _WHILE_STARTING:
                raise KServeError(UNAVAILABLE, STARTING_MESSAGE)
            fe = self.fe
            if what == "server":
                return Reply(200, fe.server_metadata())
            if what == "health_live":
                return Reply(200, {"live": True})
            if what == "health_ready":
                ready = fe.server_ready()
                return Reply(200 if ready else 503, {"ready": ready})
            if what == "all_stats":
                return Reply(200, await self.all_statistics())
            if what.startswith("repo_"):
                return await self.repository(what[5:], args, body)
            name, version = args
            if what == "ready" and fe.node.model_state(name) is not None:
                # a name the repository knows (loading, unloading, unloaded): 503 until
                # it is served, as gRPC's ModelReady answers ready=false
                fe.check_version(name, version)
                ready = fe.model_ready(name)
                return Reply(200 if ready else 503, {"name": name, "ready": ready})
            if what == "infer":  # (checks its model and version, counting a refusal)
                return await self.infer(name, headers, body, peer, version, waiting)
            fe.described(name)  # NOT_FOUND: an unknown or unloading model, then version
            fe.check_version(name, version)
            if what == "model":
                return Reply(200, fe.model_metadata(name))
            if what == "config":
                return Reply(200, fe.model_config(name))
            if what == "stats":
                return Reply(200, fe.model_statistics(name, version))
            raise AssertionError(f"route {what!r}")  # (every route is answered above)
        except KServeError as e:
            return _error(e)
        except Exception as e:  # noqa: BLE001 - answer, never drop the connection
            return _error(_internal(f"http {method} {path}", e))

    async def all_statistics(self) -> JsonText:
        """``GET /v2/models/stats``: every instance's statistics, each slice of them
        written as JSON in the turn of the event loop it is read in (the JSON of 5,000
        at once held the loop ~4 ms); the same bytes as the whole written at once."""
        parts = []
        async for some in self.fe.statistics_slices():
            if some:
                parts.append(_dumps(some)[1:-1])  # (the entries, without the list's [])
        return JsonText(b'{"model_stats":[' + b",".join(parts) + b"]}")

    async def ops(self, path: str) -> Reply:
        """Prometheus metrics (controller/metrics.py), liveness, readiness (every worker
        connected). What the metrics read of the controller's state is copied on the event
        loop (the only place that may touch it) a slice of model instances at a time; the
        text is written from the copy on a worker thread
        (``ControllerMetrics.render_async``)."""
        node = self.node
        if path == "/metrics":
            return Reply(200, await node.metrics.render_async(), compress=True)
        if path == "/healthz":
            return Reply(200, b"ok\n")
        # (every worker in service available; one removed counts no more, but with every
        # one removed there is none to serve)
        kept = node.in_service()
        ready = (node.policy is not None and not node._stopping and not node.awaited
                 and all(node.available(lk) for lk in kept)
                 and (bool(kept) or not node.links))
        return Reply(200, b"ready\n") if ready else Reply(503, b"not ready\n")

    async def _json(self, body: bytes | memoryview, what: str = "request body"):
        """``body`` decoded as JSON (``json_loads``); on a worker thread, off the event loop,
        when larger than ``rest_json_offload_bytes``; INVALID_ARGUMENT when it is not
        JSON."""
        try:
            if len(body) > self.node.limits.rest_json_offload_bytes:
                return await asyncio.get_running_loop().run_in_executor(None, json_loads,
                                                                        body)
            return json_loads(body)
        except ValueError as e:
            raise KServeError(INVALID, json_problem(what, e)) from None

    async def repository(self, op: str, args: list[str], body: bytes) -> Reply:
        """Triton's model repository extension: ``index`` (body ``{"ready": bool}``,
        optional) answers the list of models; ``load`` / ``unload`` of ``args[0]`` (body
        ``{"parameters": {...}}``, optional) answer ``{}`` once done."""
        req = await self._json(body) if body.strip() else {}
        if not isinstance(req, dict):
            raise KServeError(INVALID, "request body must be a JSON object")
        if op == "index":
            ready = req.get("ready", False)
            if not isinstance(ready, bool):
                raise KServeError(INVALID, f"'ready' must be true or false, got {_short(ready)}")
            from controller import repository

            return Reply(200, repository.index(self.node, ready))
        params = req.get("parameters") or {}
        if not isinstance(params, dict):
            raise KServeError(INVALID, "'parameters' must be a JSON object")
        from controller import repository

        await (repository.load if op == "load" else repository.unload)(self.node, args[0],
                                                                        params)
        return Reply(200, {})

    async def infer(self, name: str, headers, body: bytes, peer: str = "rest",
                    version: str = "",
                    waiting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> Reply:
        """An inference request. A refusal (an unknown or unloaded model, an unknown
        version, a bad body) is counted once, here or in ``fe.infer``, as gRPC's are.
        ``waiting``: as ``route``'s."""
        try:
            self.fe.profile(name)  # NOT_FOUND: an unknown model, then an unknown version
            self.fe.check_version(name, version)
            inputs, params, requested, req, binary_of, binary_all = await self._infer_request(
                headers, body)
        except KServeError:
            self.fe.refused(name)
            raise
        with waiting():
            outs = await self.fe.infer(name, inputs, params, requested, peer)
        resp = {"model_name": name, "model_version": VERSION, "outputs": []}
        if "id" in req:
            resp["id"] = req["id"]
        extra = []
        finite = True
        for o in outs:
            t = {"name": o.name, "datatype": o.datatype, "shape": o.shape}
            if binary_of.get(o.name, binary_all):
                t["parameters"] = {"binary_data_size": len(o.data)}
                extra.append(o.data)
            else:
                arr = np.frombuffer(o.data, KS_TO_NP[o.datatype])
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    finite = False
                t["data"] = arr.tolist()
            resp["outputs"].append(t)
        return Reply(200, resp if finite else _NonFinite(resp), b"".join(extra),
                     compress=True)

    async def _infer_request(self, headers, body: bytes):
        """An inference request's body, read and checked: (inputs, parameters, requested
        outputs, ``{"id": ...}`` or ``{}``, binary_data per output, binary_data for all).
        ``Inference-Header-Content-Length``, when sent, is ASCII digits, as HTTP's
        Content-Length (``int()`` alone would read "+5", "1_0" as 10, other scripts'
        digits; an empty value is not a length either)."""
        hlen = headers.get("inference-header-content-length")
        n = len(body)
        if hlen is not None:  # (more than 19 digits is beyond any body)
            n = int(hlen) if hlen.isascii() and hlen.isdigit() and len(hlen) < 20 else -1
        if not 0 <= n <= len(body):
            raise KServeError(INVALID, f"Inference-Header-Content-Length {_short(hlen)} is "
                              f"not a length within the body of {len(body)} bytes")
        if n == 0 and hlen is not None:
            raise KServeError(INVALID, "Inference-Header-Content-Length 0: the request's JSON "
                              "header is empty (it comes first, before any binary data); a "
                              "raw binary request, the body one input's bytes alone, is "
                              "not served: send a JSON header naming the input first")
        view = memoryview(body)
        if n > self.node.limits.rest_json_offload_bytes:  # JSON data lists become arrays:
            # in a decoding process (json_offload), where they hold up no other request
            decoded = await self.decoders.decode(view[:n], view[n:])
        else:  # (the same rule, here)
            decoded = decode_body(view[:n] if n else b"{}", view[n:])
        inputs, params, requested, binary_of, binary_all, head = decoded
        return inputs, params, requested, head, binary_of, binary_all


def _authorization(headers) -> list:
    """A request's ``Authorization`` header values (aiohttp's headers: each; a dict: its
    one)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return getall("authorization", [])
    value = headers.get("authorization")
    return [value] if value else []


class JsonText(bytes):
    """A payload already written as JSON (sent as ``application/json``)."""


class _NonFinite(dict):
    """A JSON payload holding NaN or an infinity (in an output's data), which only
    Python's ``json`` writes as such (orjson would write null)."""


def _dumps(payload) -> bytes:
    """JSON text of a payload: by orjson (20x faster than Python's ``json`` on an output's
    numbers), by ``json`` where orjson cannot write it as ``json`` does (``_NonFinite``; a
    string with a lone surrogate; an integer beyond 64 bits). Both write the same
    values; orjson writes non-ASCII characters as UTF-8, not ``\\u`` escapes."""
    if type(payload) is not _NonFinite:
        try:
            return orjson.dumps(payload)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(payload, separators=(",", ":")).encode()


def encode(reply: Reply) -> tuple[bytes, dict[str, str]]:
    """A Reply's body and headers: JSON (``application/json``), plain text, or the JSON
    header followed by binary tensor data (``application/octet-stream`` with
    ``Inference-Header-Content-Length``); every 503 says ``Retry-After``."""
    status, payload, extra, more = reply.status, reply.payload, reply.extra, reply.headers
    if type(payload) is JsonText:
        head, ctype = payload, JSON_TYPE
    elif isinstance(payload, bytes):
        head, ctype = payload, TEXT_TYPE
    elif payload is None:
        head, ctype = b"", JSON_TYPE
    else:
        head, ctype = _dumps(payload), JSON_TYPE
    headers = {"Content-Type": ctype}
    if extra:
        headers["Content-Type"] = BINARY_TYPE
        headers["Inference-Header-Content-Length"] = str(len(head))
        head += extra
    if status == 503:  # unavailable now (shed, not ready, shutting down): try again
        headers["Retry-After"] = str(RETRY_AFTER_S)
    if more:
        headers.update(more)
    return head, headers


# ---------------------------------------------------------------------- the HTTP server

_ROUTED = "clockwork.routed"  # set on a request that reached _Handler
# the routes answered while the controller waits for its workers at start (besides the
# probes of ``ops``); any other is 503 STARTING_MESSAGE
_WHILE_STARTING = frozenset({"server", "health_live", "health_ready"})

# connection -> the handler task of its request waiting for the controller's answer:
# cancelled when the connection is lost (JsonErrors.connection_lost), so that the call's
# queued requests are withdrawn (intake.answer_or_withdraw). Only that wait: aiohttp's
# handler_cancellation would also cancel a body being read or decoded, a model load or
# an unload half-way.
_ANSWER_WAITS: dict[RequestHandler, asyncio.Task] = {}


@contextlib.contextmanager
def _answer_wait(conn: RequestHandler):
    """The wait of an inference on ``conn`` for its answer: cancelled if the connection
    is lost meanwhile, or at once if it was lost already (its body was being read or
    decoded)."""
    task = asyncio.current_task()
    if conn.transport is None:
        task.cancel()  # (its requests are withdrawn at the wait's first await)
    _ANSWER_WAITS[conn] = task
    try:
        yield
    finally:
        _ANSWER_WAITS.pop(conn, None)


def _peer(request: web.Request) -> str:
    """The caller's address as ``HOST:PORT`` (``[ADDRESS]:PORT`` for IPv6; empty once its
    connection is gone)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return join(str(peer[0]), peer[1]) if peer and len(peer) >= 2 else ""


class _Handler:
    """aiohttp's side: one catch-all route whose handler checks the token, reads the body
    within the bounds and answers the Reply of :meth:`KServeRest.route`; and its
    ``Expect: 100-continue`` handler, which answers before the client sends the body
    (401, a probe, 413) or asks for it (100 Continue). A request without the token, or
    to a probe, is answered without reading its body (:meth:`_unread`)."""

    def __init__(self, rest: KServeRest) -> None:
        self.rest = rest
        self.limits = rest.node.limits
        self.reading = 0  # bytes of the request bodies being read, every connection's

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        request[_ROUTED] = True
        reply = await self._unread(request)
        if reply is not None:  # no 100 Continue: answered, and the body is never sent
            resp = self._reply(request, reply)
            resp.force_close()  # (said: Connection: close, as every 401 says it)
            return await self._closing(request, resp)
        n = request.content_length
        if n is not None and n > self.limits.rest_max_body_bytes:
            return await self._closing(request, self._too_large(n))
        return await _default_expect_handler(request)  # 100 Continue

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request[_ROUTED] = True
        reply = await self._unread(request)
        if reply is not None:
            resp = self._reply(request, reply)
            if reply.status == 401 or request.body_exists:
                resp.force_close()  # (a 401 always closes its connection)
                return self._drop_rest(request, resp)  # its body is not read
            return resp
        body = b""
        if request.body_exists:
            body = await self._read_body(request)
            if isinstance(body, web.StreamResponse):
                return body
        reply = await self.rest.route(request.method, request.raw_path, request.headers,
                                      body, "rest:" + _peer(request),
                                      lambda: _answer_wait(request.protocol))
        return self._reply(request, reply)

    async def _unread(self, request: web.Request) -> Reply | None:
        """The answer to a request that is answered without reading its body, or None:
        401 without the token; for a probe (an open path), ``route``'s answer with no
        body: the probe's to GET and HEAD, 405 with ``Allow`` to any other method. Such
        a body is never read into memory nor decoded: when there is one, the connection
        closes after the answer and what arrives of it is dropped (``_drop_rest``)."""
        rest = self.rest
        target, headers = request.raw_path, request.headers
        if not rest.authorized(target, headers):
            return rest.unauthorized(headers, _peer(request),
                                     f"{request.method} {urllib.parse.urlsplit(target).path}")
        if rest.is_open(target):
            return await rest.route(request.method, target, headers, b"")
        return None

    async def _read_body(self, request: web.Request) -> bytes | web.StreamResponse:
        """The request's whole body, decoded (chunked, gzip, deflate), or the response
        that refuses it: 413 over ``rest_max_body_bytes`` (announced or decoded), 408 not
        received within ``rest_read_timeout``, 400 malformed, 415 in a Content-Encoding
        not in ``CODINGS`` (one coding, in any case; several are refused too), 501 in a
        Transfer-Encoding other than chunked."""
        lim = self.limits
        cap = lim.rest_max_body_bytes
        n = request.content_length
        if n is not None and n > cap:
            return self._drop_rest(request, self._too_large(n))
        coding = ", ".join(request.headers.getall("Content-Encoding", ())).lower()
        if coding and coding not in CODINGS:
            refusal = self._refuse(
                415, f"Content-Encoding {_short(coding)} is not supported: send the body "
                "as it is, or gzip or deflate")
            refusal.headers["Accept-Encoding"] = ACCEPTED_CODINGS
            return self._drop_rest(request, refusal)
        # a transfer coding but chunked (aiohttp reads chunked and passes the others on
        # undecoded: "gzip, chunked" was read as JSON): 501, as HTTP says for a transfer
        # coding not implemented
        transfer = [c.strip().lower() for v in request.headers.getall("Transfer-Encoding", ())
                    for c in v.split(",") if c.strip()]
        if any(c != "chunked" for c in transfer):
            return self._drop_rest(request, self._refuse(
                501, f"Transfer-Encoding {_short(', '.join(transfer))} is not supported: "
                "send the body as it is or chunked (compressed: Content-Encoding gzip or "
                "deflate)"))
        coding = "gzip" if coding == "x-gzip" else coding
        decoder = BodyDecoder(coding) if coding in ("gzip", "deflate") else None
        # the body as it arrives: its first part as it is, then parts appended to one
        # buffer (a part at a time: joining 46 MB at the end held the event loop ~20 ms
        # here; nothing is taken before the data comes, whatever the length announced)
        body: bytes | bytearray = b""
        size = 0
        # the bodies being read, all connections together, are bounded as the inputs
        # admitted are (global_outstanding_bytes): each connection's own bound alone let
        # a few hundred connections hold 64 MiB each
        room = lim.global_outstanding_bytes
        try:
            async with asyncio.timeout(lim.rest_read_timeout / 1e9):
                while chunk := await request.content.readany():
                    for part in decoder.feed(chunk) if decoder else (chunk,):
                        size += len(part)
                        self.reading += len(part)
                        if size > cap:  # (a compression bomb: decode no more of it)
                            return self._drop_rest(request, self._refuse(
                                413, f"request body over the limit of {cap} bytes "
                                "(rest_max_body_bytes) once decoded"))
                        if self.reading > room and self.reading > size:
                            return self._drop_rest(request, self._busy())
                        if not body:
                            body = part
                        else:
                            if type(body) is not bytearray:
                                body = bytearray(body)
                            body += part
                if decoder:
                    decoder.end()
        except TimeoutError:
            return await self._closing(request, self._refuse(
                408, "request body not received in time (rest_read_timeout_s)"))
        except (ValueError, web.RequestPayloadError) as e:  # not decoding; bad chunks
            return self._drop_rest(request, self._refuse(400, f"malformed request body: {e}"))
        except ConnectionError as e:  # the client went away before its body's end
            # (the request keeps this exception, whose traceback holds this frame and the
            # part of the body read: through the cycle back to the request, until a full
            # garbage collection, rare here: hundreds of MB of abandoned uploads stayed)
            e.__traceback__ = None
            body = b""
            self.rest.node.count("rest_bodies_abandoned")
            return web.Response(status=400)  # (no one to read it)
        finally:
            self.reading -= size
        return body

    def _busy(self) -> web.Response:
        """503 (Retry-After): the request bodies being read would take more memory than
        ``global_outstanding_bytes``."""
        resp = self._refuse(
            503, "the controller is reading more request bodies than it takes at once "
            f"({self.limits.global_outstanding_bytes} bytes, global_outstanding_bytes): "
            "try again")
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
        return resp

    def _too_large(self, n: int) -> web.Response:
        return self._refuse(413, f"request body of {n} bytes is over the limit of "
                            f"{self.limits.rest_max_body_bytes} (rest_max_body_bytes)")

    def _refuse(self, status: int, why: str) -> web.Response:
        """A refusal by the transport (counted ``http_<status>``); the connection closes
        after it."""
        self.rest.node.count(f"http_{status}")
        body, headers = encode(Reply(status, {"error": why}))
        resp = web.Response(status=status, body=body, headers=headers)
        resp.force_close()
        return resp

    @staticmethod
    def _drop_rest(request: web.Request, resp: web.Response) -> web.Response:
        """Answer ``resp`` (which closes the connection) without reading the rest of the
        body: what the client still sends is read from the socket and dropped, unparsed
        and not decoded, for up to ``rest_linger_timeout`` (so that it sees the answer: a
        socket closed with data unread resets the connection), then it closes."""
        if request.content.is_eof():
            return resp  # the whole body is in already
        proto = request.protocol
        proto.close()  # aiohttp drops, unparsed, what arrives from now on
        proto.resume_reading()  # and reads the socket again if the body had paused it
        return resp

    @staticmethod
    async def _closing(request: web.Request, resp: web.Response) -> web.Response:
        """Send ``resp``, then close the connection at once: nothing more of the request
        is read (the client is not sending it, or it is not worth reading)."""
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()
        return resp

    @staticmethod
    def _reply(request: web.Request, reply: Reply) -> web.Response:
        body, headers = encode(reply)
        resp = web.Response(status=reply.status, body=body, headers=headers)
        if reply.compress and len(body) >= COMPRESS_MIN_BYTES:
            # (a cache must know the answer depends on it)
            resp.headers["Vary"] = "Accept-Encoding"
            coding = response_coding(request.headers.get("Accept-Encoding", ""))
            if coding is not None:
                resp.enable_compression(coding)
        return resp


def response_coding(accept: str) -> ContentCoding | None:
    """The coding to compress an answer in for a request's ``Accept-Encoding``: gzip or
    deflate, whichever it rates higher (``q``, 1 when not said; ``*`` stands for those
    it does not name), gzip on a tie; None when it rates both 0 (RFC 9110 12.5.3: not
    acceptable) or names neither."""
    rated: dict[str, float] = {}
    for part in accept.split(","):
        token, *params = part.split(";")
        token = token.strip().lower()
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # (nan too)
                    q = 0.0
        if token:
            rated[token] = q
    best, best_q = None, 0.0
    for coding in (ContentCoding.gzip, ContentCoding.deflate):
        q = rated.get(coding.value, rated.get("*", 0.0))
        if q > best_q:
            best, best_q = coding, q
    return best


class _Quiet(logging.Filter):
    """aiohttp logs a traceback for every malformed request; those are the client's
    (counted ``http_400``), not ours: left out. Anything else is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError | ConnectionError)


_log = logging.getLogger("controller.http")
_log.addFilter(_Quiet())


def _access_counter(count):
    """An aiohttp access logger that counts, as ``http_<status>``, the answers aiohttp
    gives by itself to requests that never reached the handler (400: a malformed
    request line or header, one too long, too many headers)."""

    class Counter(AbstractAccessLogger):
        def log(self, request, response, time) -> None:
            if _ROUTED not in request and response.status >= 400:
                count(f"http_{response.status}")

    return Counter


def make_runner(node, token: str | None = None) -> web.AppRunner:
    """The REST server of ``node`` (aiohttp's, not started): every bound is
    ``node.limits``' (``rest_*``):

    - the request line and each header (name and value) at most
      ``rest_max_header_bytes``, at most ``rest_max_headers`` headers, the whole head at
      most ``rest_max_head_bytes`` (``_HeadBound``): else 400;
    - the body (Content-Length or chunked; after decoding ``gzip``/``deflate``, which
      ``BodyDecoder`` does in slices as it is read) at most ``rest_max_body_bytes``: else 413,
      before reading it when its length is announced (with ``Expect: 100-continue``
      before the client sends it); within ``rest_read_timeout`` of the head: else 408;
    - a keep-alive connection idle (or whose next request head does not arrive) for
      ``rest_idle_timeout`` is closed;
    - a body in another Content-Encoding: 415 (with ``Accept-Encoding``); one that does
      not decode whole: 400;
    - a request without the token (401), or to a probe (``OPEN_PATHS``: GET and HEAD
      answered, any other method 405), is answered without reading its body, and with
      ``Expect: 100-continue`` without 100 Continue;
    - after an answer given without reading the whole body (401, a probe, 413, 400 a
      body that does not decode), what the client still sends is read and dropped (not parsed or
      decoded) for up to ``rest_linger_timeout``, then the connection closes.

    An inference's answer (or /metrics) of at least ``COMPRESS_MIN_BYTES`` is compressed
    when the client sends ``Accept-Encoding: gzip`` (or ``deflate``); nothing else is. A path that exists answers 405 with
    ``Allow`` for another method."""
    lim = node.limits
    rest = KServeRest(node, token)
    handler = _Handler(rest)
    app = web.Application(client_max_size=lim.rest_max_body_bytes, logger=_log)

    async def close_decoders(_app) -> None:
        await rest.decoders.close()

    app.on_cleanup.append(close_decoders)
    # every answer's Server header, not aiohttp's "Python/3.11 aiohttp/3.x" (versions told
    # to anyone, the probes' callers included): its default is a name of its module, read
    # as each answer is made, those it gives before a request reaches the app (a head it
    # cannot parse) included; set for the whole process (the controller's, which serves
    # no other). A release without that name: set on the app's answers.
    from aiohttp import web_response

    if hasattr(web_response, "SERVER_SOFTWARE"):
        web_response.SERVER_SOFTWARE = SERVER_HEADER
    else:
        async def plain_server(_request, response) -> None:
            response.headers["Server"] = SERVER_HEADER

        app.on_response_prepare.append(plain_server)
    # every path is the handler's: [\s\S], not ".", which stops at a line break (the
    # path aiohttp matches is percent-decoded: "/v2/models/a%0Ab" would get aiohttp's
    # plain-text 404)
    app.router.add_route("*", r"/{path:[\s\S]*}", handler.handle,
                         expect_handler=handler.expect)
    return web.AppRunner(
        app, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S,
        auto_decompress=False,  # (request bodies are decoded by _read_body: BodyDecoder)
        access_log_class=_access_counter(node.count), access_log=_log, logger=_log,
        keepalive_timeout=lim.rest_idle_timeout / 1e9,
        lingering_time=lim.rest_linger_timeout / 1e9,
        max_line_size=lim.rest_max_header_bytes, max_field_size=lim.rest_max_header_bytes,
        max_headers=lim.rest_max_headers)


class HeadTooLarge(HttpProcessingError):
    """A REST request head over ``rest_max_head_bytes`` (``_HeadBound``)."""

    code = 400


def _head_bytes(msg) -> int:
    """The bytes of a parsed request head: its request line and headers with their
    separators (the whitespace around header values not counted)."""
    n = len(msg.method) + len(msg.path) + 14  # (" ", " HTTP/1.1\r\n", the last "\r\n")
    for k, v in msg.raw_headers:
        n += len(k) + len(v) + 4  # (": " and "\r\n")
    return n


class _HeadBound:
    """A connection's HTTP parser (aiohttp's), with a bound on each request head in all:
    the bytes of a head still arriving (since the end of the last head, when that
    request had no body; else from the read after the one that ended its body, so that
    such a head holds at most the bound plus one read) and of each head parsed. Over
    ``limit``, the parser's own refusal path answers 400 (``HeadTooLarge``): the
    requests parsed before it are served, the rest of the connection's bytes are not
    read. aiohttp bounds each line and the number of headers only."""

    __slots__ = ("_parser", "_limit", "_pending", "_body", "_refused")

    def __init__(self, parser, limit: int) -> None:
        self._parser, self._limit = parser, limit
        self._pending = 0  # bytes of the head arriving
        self._body = None  # the payload of the last request parsed
        self._refused = False

    def __getattr__(self, name: str):
        return getattr(self._parser, name)

    def _too_large(self) -> HeadTooLarge:
        self._refused = True
        return HeadTooLarge(message=f"request head over {self._limit} bytes "
                                    "(rest_max_head_bytes)")

    def feed_data(self, data):
        if self._refused:  # (answered 400; the connection closes after it)
            return (), False, b""
        body = self._body
        in_head = body is None or body.is_eof()
        messages, upgraded, tail = self._parser.feed_data(data)
        if messages:
            limit = self._limit
            for i, (msg, payload) in enumerate(messages):
                if hasattr(msg, "raw_headers") and _head_bytes(msg) > limit:
                    # the requests before it answered first, then its 400 (as aiohttp
                    # refuses what its parser cannot read)
                    e = self._too_large()
                    return [*messages[:i], (_ErrInfo(status=400, exc=e, message=e.message),
                                            EMPTY_PAYLOAD)], False, b""
                self._body = payload
            # what follows the last head in this read, when it had no body: the start of
            # the next head, counted (after a body, that read's rest is not counted)
            end = data.rfind(b"\r\n\r\n") if payload is EMPTY_PAYLOAD else -1
            self._pending = len(data) - end - 4 if end >= 0 else 0
            if self._pending > self._limit:
                e = self._too_large()
                return [*messages, (_ErrInfo(status=400, exc=e, message=e.message),
                                    EMPTY_PAYLOAD)], False, b""
        elif in_head:
            self._pending += len(data)
            if self._pending > self._limit:
                raise self._too_large()
        return messages, upgraded, tail


def head_refusal(exc: BaseException | None, status: int, limits) -> str:
    """What is wrong with a request aiohttp's parser refused before our handler saw it
    (or, 500 and 504, one whose handling failed there), in the words of the limits."""
    if isinstance(exc, HeadTooLarge):
        return exc.message
    if isinstance(exc, LineTooLong):
        return (f"request line or header over {limits.rest_max_header_bytes} bytes "
                "(rest_max_header_bytes)")
    if isinstance(exc, BadHttpMethod):
        return "not an HTTP request (no HTTP method where one begins)"
    if isinstance(exc, BadHttpMessage):
        if exc.message.startswith("Too many headers"):
            return f"more than {limits.rest_max_headers} headers (rest_max_headers)"
        return f"malformed HTTP request: {_short(exc.message, 200)}"
    return "request handling timed out" if status == 504 else "internal error"


def _json_errors(limits) -> type[RequestHandler]:
    """aiohttp's connection handler, whose own answers (to a request head over the
    limits, too many headers, malformed HTTP: what its parser refuses before our
    handler runs) carry KServe's JSON error body, as every other error does, instead of
    its text/plain page, which tritonclient's HTTP clients cannot read ("Parse error at
    offset 0"). Same status; the connection still closes after it. A connection lost
    while its request waits for the controller's answer cancels that wait
    (``_answer_wait``)."""

    class JsonErrors(RequestHandler):
        __slots__ = ()  # (the same layout: a handler aiohttp made becomes one)

        def handle_error(self, request, status=500, exc=None, message=None):
            plain = super().handle_error(request, status, exc, message)  # (logs it)
            body, headers = encode(Reply(plain.status, {
                "error": head_refusal(exc, plain.status, limits)}))
            resp = web.Response(status=plain.status, body=body, headers=headers)
            resp.force_close()
            return resp

        def connection_lost(self, exc) -> None:
            waiting = _ANSWER_WAITS.pop(self, None)
            super().connection_lost(exc)
            if waiting is not None:
                waiting.cancel()  # (the call's queued requests are withdrawn)

    return JsonErrors


class _BoundSite(web.TCPSite):
    """aiohttp's TCPSite whose ``start`` binds its sockets without accepting connections
    (``start_serving=False``); ``serve`` starts accepting them. A controller binds
    every port before it contacts a worker, and serves once it has them. Its
    connections' handlers answer aiohttp's own refusals in JSON (``_json_errors``)."""

    def __init__(self, runner: web.AppRunner, *args, limits, **kw) -> None:
        super().__init__(runner, *args, **kw)
        self._handler_class = _json_errors(limits)
        self._handshake_s = limits.rest_idle_timeout / 1e9  # (TLS: asyncio's own is 60 s)
        self._head_bytes = limits.rest_max_head_bytes

    def _handler(self) -> RequestHandler:
        h = self._runner.server()
        h.__class__ = self._handler_class
        parser = getattr(h, "_parser", None)  # (aiohttp's; tests/test_rest_http.py
        if parser is not None:                # checks the bound is there)
            h._parser = _HeadBound(parser, self._head_bytes)
        return h

    async def start(self) -> None:
        await web.BaseSite.start(self)  # (registers the site with its runner)
        self._server = await asyncio.get_running_loop().create_server(
            self._handler, self._host, self._port, ssl=self._ssl_context,
            ssl_handshake_timeout=self._handshake_s if self._ssl_context else None,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port, start_serving=False)
        self._bound_port = self._server.sockets[0].getsockname()[1]
        # (out of descriptors: a line a second, no spinning)
        accept_guard.guard(self._server)
        accept_guard.quiet(asyncio.get_running_loop(), "controller")

    async def serve(self) -> None:
        await self._server.start_serving()


class RestServer:
    """A REST server, bound: ``port`` (the bound one), ``await serve()`` (accept
    connections; ``start_http`` has), ``await close()``."""

    def __init__(self, runner: web.AppRunner, site: _BoundSite) -> None:
        self.runner = runner
        self.site = site

    async def serve(self) -> None:
        await self.site.serve()

    @property
    def addresses(self) -> list:
        return self.runner.addresses

    @property
    def port(self) -> int:
        return self.runner.addresses[0][1]

    async def close(self) -> None:
        """Stop listening, close idle connections; requests being handled get
        ``SHUTDOWN_GRACE_S`` to finish."""
        await self.runner.cleanup()


async def bind_http(node, host: str, port: int, token: str | None = None,
                    ssl=None) -> RestServer:
    """KServe v2 REST on ``host:port`` (0: a free port), bound but accepting no
    connection until ``await serve()``; with ``token`` every path but the health
    probes needs it; with ``ssl`` (an ``ssl.SSLContext``) HTTPS only. No SO_REUSEPORT:
    the port is this listener's alone. Raises OSError when it cannot bind."""
    runner = make_runner(node, token)
    await runner.setup()
    site = _BoundSite(runner, host, port, ssl_context=ssl, reuse_port=False,
                      limits=node.limits)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return RestServer(runner, site)


async def start_http(node, host: str, port: int, token: str | None = None,
                     ssl=None) -> RestServer:
    """Serve KServe v2 REST on ``host:port`` (``bind_http``, then ``serve``) on the
    running loop. Raises OSError when it cannot listen."""
    http = await bind_http(node, host, port, token, ssl)
    try:
        await http.serve()
    except BaseException:
        await http.close()
        raise
    return http
