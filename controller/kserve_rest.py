"""KServe v2 REST (HTTP/1.1) of the controller: the transport and the routes. The
protocol logic is ``controller.kserve.KServeFrontend``'s, shared with gRPC."""

from __future__ import annotations

import asyncio
import json
import urllib.parse

import numpy as np
from prometheus_client import generate_latest

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
    rest_request,
)

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
            414: "URI Too Long", 431: "Request Header Fields Too Large",
            500: "Internal Server Error",
            503: "Service Unavailable", 504: "Gateway Timeout"}
LINGER_S = 2.0  # after a 413, what the client is still sending is read and dropped this long


# with a token, every path but these needs "Authorization: Bearer <token>" (probes stay open)
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
# a refused request's body is read and dropped (64 KiB at a time, never kept) up to this
# size, so that the client, still sending, gets to read the 401; larger: the connection closes
DISCARD_BODY = 16 << 20


class KServeHttp:
    """A small HTTP/1.1 server (keep-alive, Content-Length bodies) on the controller's loop.
    With ``token``, a request without it is answered 401 before its body is read."""

    def __init__(self, node, token: str | None = None) -> None:
        self.fe = KServeFrontend(node)
        self.token = token.encode() if token else None
        self._refused = None

    def _authorized(self, target: str, headers: dict) -> bool:
        from clockwork.protocol.security import bearer_ok

        return (urllib.parse.urlsplit(target).path in OPEN_PATHS
                or bearer_ok(headers.get("authorization"), self.token))

    async def _unauthorized(self, reader, writer, headers: dict) -> None:
        """401 with ``WWW-Authenticate: Bearer``, then the connection closes. Nothing of the
        request runs; its body (up to DISCARD_BODY) is read and dropped first, so that the
        client sees the answer."""
        from clockwork.protocol.security import Refusals

        if self._refused is None:
            self._refused = Refusals("controller", self.fe.node.count)
        self._refused("an unauthenticated HTTP request")
        n = int(headers.get("content-length", "0") or 0)
        if 0 < n <= DISCARD_BODY:
            while n > 0:
                n -= len(await reader.readexactly(min(n, 64 << 10)))
        challenge = 'Bearer realm="clockwork"'
        if headers.get("authorization"):
            challenge += ', error="invalid_token"'
        await self._send(writer, 401, {"error": "authentication required: send the header "
                                       "'Authorization: Bearer <token>'"},
                         more_headers={"WWW-Authenticate": challenge, "Connection": "close"})

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = "rest:" + ":".join(str(x) for x in (writer.get_extra_info("peername") or ()))
        try:
            while True:
                head = await self._read_head(reader, writer)
                if head is None:
                    break
                method, target, headers, deadline = head
                if self.token is not None and not self._authorized(target, headers):
                    await self._unauthorized(reader, writer, headers)
                    break
                body = await self._read_body(reader, writer, headers, deadline)
                if body is None:
                    break
                status, payload, extra = await self.route(method, target, headers, body, peer)
                await self._send(writer, status, payload, extra)
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _read_head(self, reader: asyncio.StreamReader, writer):
        """The next request's line and headers -> (method, target, headers, deadline for
        the rest of the request), or None: close the connection (it was idle for
        ``rest_idle_timeout``, ended, or its head broke a limit and was answered)."""
        lim = self.fe.node.limits
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(reader.readline(), lim.rest_idle_timeout / 1e9)
        except TimeoutError:
            return None  # idle keep-alive connection
        except ValueError:  # longer than the stream's line limit (64 KiB)
            return await self._refuse(writer, 414, "request line too long")
        if not line:
            return None
        deadline = loop.time() + lim.rest_read_timeout / 1e9
        size = len(line)
        if size > lim.rest_max_header_bytes:
            return await self._refuse(writer, 414, "request line too long")
        parts = line.decode("latin-1").split()
        if len(parts) != 3:
            return await self._refuse(writer, 400, "malformed request line")
        method, target, _version = parts
        headers: dict[str, str] = {}
        count = 0
        while True:
            try:
                h = await asyncio.wait_for(reader.readline(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return await self._refuse(writer, 408, "request head not received in time")
            except ValueError:
                return await self._refuse(writer, 431, "header line too long")
            if h in (b"\r\n", b"\n", b""):
                break
            size += len(h)
            count += 1
            if size > lim.rest_max_header_bytes or count > lim.rest_max_headers:
                return await self._refuse(
                    writer, 431, f"request head over {lim.rest_max_header_bytes} bytes or "
                    f"{lim.rest_max_headers} header lines")
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return method, target, headers, deadline

    async def _read_body(self, reader: asyncio.StreamReader, writer, headers: dict,
                         deadline: float) -> bytes | None:
        """The request's body (Content-Length bytes), or None: close the connection (the
        request broke a limit and was answered: 400 a bad length, 411 a chunked body, 413
        too large, 408 too slow)."""
        lim = self.fe.node.limits
        loop = asyncio.get_running_loop()
        if "transfer-encoding" in headers:
            return await self._refuse(writer, 411, "send the body with a Content-Length "
                                      "(Transfer-Encoding is not supported)")
        try:
            n = int(headers.get("content-length", "0") or 0)
        except ValueError:
            n = -1
        if n < 0:
            return await self._refuse(writer, 400, "bad Content-Length")
        expect = headers.get("expect", "").lower() == "100-continue"
        if n > lim.rest_max_body_bytes:
            await self._refuse(writer, 413, f"request body of {n} bytes is over the limit "
                               f"of {lim.rest_max_body_bytes} (rest_max_body_bytes)")
            if not expect:  # the client may be sending it: read and drop it for a while,
                await self._drain(reader, n)  # so that it sees the answer
            return None
        if not n:
            return b""
        if expect:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            return await asyncio.wait_for(reader.readexactly(n),
                                          max(0.0, deadline - loop.time()))
        except TimeoutError:
            return await self._refuse(writer, 408, "request body not received in time")

    async def _drain(self, reader: asyncio.StreamReader, n: int) -> None:
        """Read and drop up to ``n`` bytes for at most ``LINGER_S`` (no memory kept)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + LINGER_S
        while n > 0:
            left = end - loop.time()
            if left <= 0:
                return
            try:
                chunk = await asyncio.wait_for(reader.read(min(n, 1 << 20)), left)
            except (TimeoutError, ConnectionError):
                return
            if not chunk:
                return
            n -= len(chunk)

    async def _refuse(self, writer, status: int, why: str) -> None:
        """Answer ``status`` with ``why`` and let the caller close the connection."""
        self.fe.node.count(f"http_{status}")
        await self._send(writer, status, {"error": why}, more_headers={"Connection": "close"})
        return None

    async def _send(self, writer, status: int, payload, extra: bytes = b"",
                    more_headers: dict | None = None) -> None:
        ctype = "application/json"
        if isinstance(payload, bytes):  # /metrics, /healthz, /readyz: plain text
            head, ctype = payload, "text/plain; version=0.0.4; charset=utf-8"
        else:
            head = json.dumps(payload, separators=(",", ":")).encode() if payload is not None else b""
        hdrs = {"Content-Type": ctype, "Content-Length": str(len(head) + len(extra))}
        if status == 503:  # unavailable now (shed, not ready, shutting down): try again
            hdrs["Retry-After"] = str(RETRY_AFTER_S)
        if extra:
            hdrs["Content-Type"] = "application/octet-stream"
            hdrs["Inference-Header-Content-Length"] = str(len(head))
        if more_headers:
            hdrs.update(more_headers)
        msg = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        writer.write(msg.encode("latin-1") + head + extra)
        await writer.drain()

    async def route(self, method: str, target: str, headers: dict, body: bytes,
                    peer: str = "rest"):
        path = urllib.parse.urlsplit(target).path
        segs = [urllib.parse.unquote(s) for s in path.strip("/").split("/")]
        fe = self.fe
        try:
            if method == "GET" and path in ("/metrics", "/healthz", "/readyz"):
                return self.ops(path)
            if not segs or segs[0] != "v2":
                raise KServeError(NOT_FOUND, f"no route {path}")
            rest = segs[1:]
            if method == "GET" and rest == []:
                return 200, fe.server_metadata(), b""
            if method == "GET" and rest == ["health", "live"]:
                return 200, {"live": True}, b""
            if method == "GET" and rest == ["health", "ready"]:
                ready = fe.server_ready()
                return (200 if ready else 503), {"ready": ready}, b""
            if method == "GET" and rest == ["models", "stats"]:
                return 200, fe.model_statistics(), b""
            if len(rest) >= 2 and rest[0] == "models":
                name, tail = rest[1], rest[2:]
                version = ""
                if len(tail) >= 2 and tail[0] == "versions":
                    version, tail = tail[1], tail[2:]
                fe.profile(name)  # NOT_FOUND: an unknown model, then an unknown version
                fe.check_version(name, version)
                if method == "GET" and tail == []:
                    return 200, fe.model_metadata(name), b""
                if method == "GET" and tail == ["config"]:
                    return 200, fe.model_config(name), b""
                if method == "GET" and tail == ["stats"]:
                    return 200, fe.model_statistics(name, version), b""
                if method == "GET" and tail == ["ready"]:
                    fe.profile(name)
                    ready = fe.model_ready(name)
                    return (200 if ready else 503), {"name": name, "ready": ready}, b""
                if method == "POST" and tail == ["infer"]:
                    return await self.infer(name, headers, body, peer)
            raise KServeError(NOT_FOUND, f"no route {method} {path}")
        except KServeError as e:
            return HTTP_CODE[e.kind], {"error": e.message}, b""
        except Exception as e:  # noqa: BLE001 - answer, never drop the connection
            return 500, {"error": _internal(f"http {method} {path}", e).message}, b""

    def ops(self, path: str):
        """Prometheus metrics (controller/metrics.py), liveness, readiness (every worker
        connected)."""
        node = self.fe.node
        if path == "/metrics":
            return 200, generate_latest(node.metrics.registry), b""
        if path == "/healthz":
            return 200, b"ok\n", b""
        ready = (node.policy is not None and not node._stopping
                 and all(lk.connected for lk in node.links))
        return (200, b"ready\n", b"") if ready else (503, b"not ready\n", b"")

    async def infer(self, name: str, headers: dict, body: bytes, peer: str = "rest"):
        hlen = headers.get("inference-header-content-length")
        try:
            n = int(hlen) if hlen else len(body)
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise KServeError(INVALID, f"Inference-Header-Content-Length {hlen!r} is not a "
                              f"length within the body of {len(body)} bytes")
        # a large JSON part is decoded on a worker thread, off the event loop
        offload = n > self.fe.node.limits.rest_json_offload_bytes
        try:
            if offload:
                req = await asyncio.get_running_loop().run_in_executor(
                    None, json.loads, body[:n] or b"{}")
            else:
                req = json.loads(body[:n] or b"{}")
        except ValueError as e:
            raise KServeError(INVALID, f"request body is not JSON: {e}") from None
        if not isinstance(req, dict):
            raise KServeError(INVALID, "request body must be a JSON object")
        binary = memoryview(body)[n:]
        if offload:  # JSON data lists become arrays there too
            inputs, params, requested, binary_of, binary_all = (
                await asyncio.get_running_loop().run_in_executor(
                    None, rest_request, req, binary))
        else:
            inputs, params, requested, binary_of, binary_all = rest_request(req, binary)
        outs = await self.fe.infer(name, inputs, params, requested, peer)
        resp = {"model_name": name, "model_version": VERSION, "outputs": []}
        if "id" in req:
            resp["id"] = req["id"]
        extra = []
        for o in outs:
            t = {"name": o.name, "datatype": o.datatype, "shape": o.shape}
            if binary_of.get(o.name, binary_all):
                t["parameters"] = {"binary_data_size": len(o.data)}
                extra.append(o.data)
            else:
                t["data"] = np.frombuffer(o.data, KS_TO_NP[o.datatype]).tolist()
            resp["outputs"].append(t)
        return 200, resp, b"".join(extra)


async def start_http(node, host: str, port: int, token: str | None = None,
                     ssl=None) -> asyncio.Server:
    """Serve KServe v2 REST on ``host:port`` (0: a free port) on the running loop; with
    ``token`` every path but the health probes needs it; with ``ssl`` (an
    ``ssl.SSLContext``) HTTPS only. No SO_REUSEPORT: the port is this listener's alone."""
    return await asyncio.start_server(KServeHttp(node, token).handle, host, port, ssl=ssl,
                                      reuse_port=False)
