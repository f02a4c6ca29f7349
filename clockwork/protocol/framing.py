"""The worker link's data path: ``clockwork.v1`` messages as length-prefixed frames on a
plain TCP connection, instead of messages on the gRPC ``Worker.Connect`` stream.

Why: every message on a grpc.aio stream costs on the order of 100 µs of CPU on each side
(its poller thread, its callbacks on the event loop) and a round trip of ~0.6 ms on
loopback; a frame on an asyncio TCP connection costs a fraction of that (~0.2 ms round
trip). The controller and its workers exchange a message per batch of actions and per
batch of results, so this is most of what the link costs.

How it is set up (``controller.links`` and ``worker.service``): the controller opens
``Worker.Connect`` as before (clock sync and the cluster-secret proofs stay on
gRPC) and says in its ``Hello`` that it can take the fast link. A worker listening for
it (``clockwork worker --link-port``; over TLS on a TLS cluster) answers with its ``WorkerState``
carrying the port and a fresh random ticket. The controller connects to that port on
the worker's host and sends the ticket first; the worker checks it (once, in constant
time) against the ticket of the controller that owns it now and from then on reads
``ControllerMessage``s and writes ``WorkerMessage``s on the TCP connection, while the
gRPC stream stays open and idle: when either ends, both do. The ticket only travels on
the authenticated gRPC stream, so the fast link is as authenticated as the stream is.

A frame: 4 bytes little-endian length of the rest, 4 bytes little-endian length of the
message, the serialized message, then its *attachments*: the bytes of the tensors whose
``attached`` field is set, one after the other in the order of the message's tensors.
So an INFER's input rows go from the buffers they arrived in straight to the socket (no
joined batch, no copy into a protobuf field), and the worker's tensors are views into
the one buffer the frame was read into. A frame over ``MAX_FRAME`` bytes, like a
connection that ends mid-frame, ends the link.
"""

from __future__ import annotations

import asyncio
import secrets
import struct

from clockwork.protocol.keepalive import watch_tcp
from clockwork.sizes import MAX_MESSAGE_BYTES

MAX_FRAME = MAX_MESSAGE_BYTES  # bytes in one message, as the gRPC link's limit
TICKET_BYTES = 32
CONNECT_TIMEOUT_S = 2.0
_HIGH_WATER = 1 << 20  # buffered bytes above which a write waits for the socket
_HEAD = struct.Struct("<II")  # a frame's length (of the rest), its message's length


def new_ticket() -> bytes:
    return secrets.token_bytes(TICKET_BYTES)


def _bytes_of(buf) -> memoryview:
    """``buf`` (bytes, a memoryview, a C-contiguous array) as a flat view of its bytes.
    A transport counts what it has sent in ``len()`` of what it was given, which for a
    float32 array or its memoryview is its rows, not its bytes: Python 3.12's
    ``writelines`` then lost its place in its buffers (``IndexError: pop from an empty
    deque``, the link closed), and a short send could resume at the wrong byte."""
    m = memoryview(buf)
    if m.ndim == 1 and m.itemsize == 1:
        return m
    return m.cast("B") if m.nbytes else memoryview(b"")


class LinkClosed(ConnectionError):
    """A write on a link that the other side (or we) closed."""


class FrameStream:
    """One end of a framed link: ``write(msg, attachments)`` and ``read()`` (a message
    parsed with ``parse``, or None once the peer has gone; the frame's attachments are
    then ``tail``, a memoryview); ``close()``. One reader and one writer task at a
    time."""

    __slots__ = ("_r", "_w", "_parse", "tail")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 parse) -> None:
        self._r, self._w, self._parse = reader, writer, parse
        self.tail = memoryview(b"")
        # a peer that falls silent (dropped packets, a vanished host) ends the connection
        # within ~15 s, as gRPC's keepalive ends the stream beside it
        watch_tcp(writer.get_extra_info("socket"))

    async def write(self, msg, attachments=()) -> None:
        """``msg``, then ``attachments`` (buffers: bytes, memoryviews, C-contiguous
        arrays), written to the socket as they are."""
        w = self._w
        if w.is_closing():
            raise LinkClosed("the link is closed")
        data = msg.SerializeToString()
        n = len(data)
        total = 4 + n
        if attachments:
            attachments = [_bytes_of(a) for a in attachments]
            total += sum(len(a) for a in attachments)
        if total > MAX_FRAME:
            raise ConnectionError(f"a frame of {total} bytes (at most {MAX_FRAME})")
        if attachments:
            w.writelines((_HEAD.pack(total, n), data, *attachments))
        else:
            w.write(_HEAD.pack(total, n) + data)  # (writelines would join the parts too)
        if w.transport.get_write_buffer_size() > _HIGH_WATER:
            await w.drain()

    async def read_frame(self) -> bytes | None:
        """The next frame's bytes, or None at the end of the link (closed, reset, cut
        mid-frame). Raises ``ConnectionError`` for a frame over ``MAX_FRAME``."""
        try:
            head = await self._r.readexactly(4)
            n = int.from_bytes(head, "little")
            if n > MAX_FRAME:
                raise ConnectionError(f"a frame of {n} bytes (at most {MAX_FRAME})")
            return await self._r.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            return None

    async def read(self):
        frame = await self.read_frame()
        if frame is None:
            return None
        n = int.from_bytes(frame[:4], "little") if len(frame) >= 4 else -1
        if not 0 <= n <= len(frame) - 4:
            raise ConnectionError(f"a frame whose message length ({n}) does not fit it")
        view = memoryview(frame)
        self.tail = view[4 + n:]
        return self._parse(view[4:4 + n])

    def close(self) -> None:
        self._w.close()


async def dial(host: str, port: int, ticket: bytes, parse, tls=None) -> FrameStream:
    """Connect to a worker's link port and present ``ticket``; raises ``OSError`` /
    ``TimeoutError`` when it cannot connect (``ssl.SSLError``, an ``OSError``: the TLS
    handshake failed). ``tls``: an ``ssl.SSLContext`` for a worker whose link speaks TLS
    (its certificate is checked against ``host``)."""
    extra = {} if tls is None else {"ssl": tls, "server_hostname": host,
                                    "ssl_handshake_timeout": CONNECT_TIMEOUT_S}
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(host, port, **extra)
    writer.write(ticket)
    return FrameStream(reader, writer, parse)


__all__ = ["CONNECT_TIMEOUT_S", "MAX_FRAME", "TICKET_BYTES", "FrameStream", "dial", "new_ticket"]
