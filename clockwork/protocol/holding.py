"""Which controller a worker belongs to: the one whose connection is live.

A worker serves one controller at a time (each believes it owns the worker's GPUs, their
memory and timeline). The controller that holds it is the one whose ``Connect`` stream
is open; a ``Connect`` from another controller meanwhile is refused with
``FAILED_PRECONDITION`` and a message that starts with ``HELD`` and says which controller
holds it, from where and since when (``Holder.refusal``). The refused controller keeps
trying and gets the worker once the holder's connection ends: its process exits (the
kernel closes the connection) or stops answering (the worker's gRPC keepalive pings it,
``clockwork.protocol.keepalive.WORKER_SERVER``, and closes the connection ~15 s after it
went silent). Two controllers given one worker used to take it from each other every
few seconds, for ever, both schedules wrong.

What tells "the same controller reconnecting" (its stream broke, the worker has not seen
the end yet) from "another controller": ``Hello.controller_id``, a random id each
controller process makes once (``new_controller_id``) and sends in every ``Hello``. A
``Connect`` that carries the holder's id replaces the holder's stale session at once. The
id is never shown (the refusal names the holder by ``Hello.controller``, its words: pid,
host, port), so a refused controller cannot learn it and pass for the holder. A ``Hello``
without an id is another controller's (it cannot be told from one). A ``Connect`` with
the holder's id but another worker index (``Hello.worker_id``) is the same controller
reaching the worker under a second address (listed twice): refused too (``TWICE``), or
the controller's two links would take the worker from each other.

The rule itself is ``Holder.refuses``, applied by ``worker.service.WorkerServicer``
only; the controller reads a refusal with ``is_held`` / ``is_twice``.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import time
from dataclasses import dataclass
from urllib.parse import unquote

HELD = "worker is held by another controller"
TWICE = "worker is connected to this controller already"
LABEL_CHARS = 200  # of a controller's words (Hello.controller) a worker keeps


def new_controller_id() -> str:
    """A controller process's id (``Hello.controller_id``): 128 random bits."""
    return secrets.token_hex(16)


def controller_label(port: int | None = None) -> str:
    """A controller in words, for a worker's refusal of another: ``pid P on HOST[, port N]``."""
    where = f", port {port}" if port else ""
    return f"pid {os.getpid()} on {socket.gethostname()}{where}"


def peer_address(peer: str) -> str:
    """A gRPC peer (``ipv4:A:P``, ``ipv6:[A]:P``, percent-encoded by some gRPC versions) as
    ``A:P``."""
    kind, sep, rest = unquote(peer).partition(":")
    return rest if sep and kind in ("ipv4", "ipv6") else peer


def printable(text: str, limit: int = LABEL_CHARS, more: str = "") -> str:
    """Words a peer sent, as a log line shows them: at most ``limit`` characters (cut to
    end with ``more`` when longer), each that would move the terminal as "?"."""
    if len(text) > limit:
        text = text[:limit - len(more)] + more
    return "".join(c if c.isprintable() else "?" for c in text)


@dataclass(frozen=True)
class Holder:
    """The controller a worker session belongs to, from its first ``Hello``."""

    controller_id: str  # Hello.controller_id ("" if it said none)
    worker_id: int  # Hello.worker_id: the controller's index for the worker
    label: str  # Hello.controller, printable, at most LABEL_CHARS
    peer: str  # where its connection came from (HOST:PORT)
    since: float  # when it connected (time.time())

    @classmethod
    def of(cls, hello, peer: str) -> Holder:
        return cls(hello.controller_id, hello.worker_id, printable(hello.controller),
                   peer_address(peer), time.time())

    def same_controller(self, controller_id: str) -> bool:
        """Whether ``controller_id`` is this holder's (never for an empty one)."""
        return bool(controller_id and self.controller_id) and hmac.compare_digest(
            controller_id.encode(), self.controller_id.encode())

    def refuses(self, other: Holder, live: bool) -> str:
        """The rule: why a new connection (``other``, from its first Hello) may not take
        the worker from this holder, or "" if it may -- the holder's session is no longer
        ``live``, or it is the holder's own reconnection (the same controller, the same
        worker index: its stale session is to be replaced at once)."""
        if not live:
            return ""
        if not self.same_controller(other.controller_id):
            return self.refusal()
        if other.worker_id != self.worker_id:
            return (f"{TWICE}, as its worker {self.worker_id} (connected from {self.peer}): "
                    "one worker listed under two addresses")
        return ""

    def refusal(self) -> str:
        """What another controller is told (the gRPC status details)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.since))
        who = self.label or "a controller that does not say which"
        return f"{HELD} ({who}; connected from {self.peer} since {when} UTC)"


def is_held(e) -> bool:
    """Whether a gRPC error (``AioRpcError``) is a worker's refusal because another
    controller holds it."""
    return _refused(e, HELD)


def is_twice(e) -> bool:
    """Whether a gRPC error is a worker's refusal because this controller holds it
    already, under another worker index (another address)."""
    return _refused(e, TWICE)


def _refused(e, prefix: str) -> bool:
    import grpc

    return (e.code() == grpc.StatusCode.FAILED_PRECONDITION
            and (e.details() or "").startswith(prefix))
