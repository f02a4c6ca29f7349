"""Listening asyncio sockets that a process out of file descriptors stops for a second
instead of spinning, with one line a second saying so.

asyncio's selector loop (Python 3.11-3.13), when ``accept()`` fails for want of file
descriptors (EMFILE and its kind), logs the error with a traceback, takes the listener
off the loop and arms a timer to put it back in a second -- and then calls ``accept()``
again, up to its backlog (~100) times in the same round, doing all of that each time. So
one readable event armed ~100 timers, each of which put the listener back, each such
round armed ~100 more: a flood of idle connections to the controller's REST port made
millions of log lines (hundreds of MB) and kept a core busy for as long as it lasted and
some seconds after. ``guard`` makes the round end after its first such failure (the next
``accept()`` says "nothing waiting"), so asyncio arms one timer a second; ``quiet`` turns
asyncio's traceback into one line a second of our own.

gRPC's listeners are not asyncio's: they do this right themselves."""

from __future__ import annotations

import asyncio
import errno
import socket

from clockwork.protocol.ratelog import LogLimiter

OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# asyncio's words for it (selector_events), the exception handler's context "message"
ACCEPT_FAILED = "socket.accept() out of system resource"
SAY_EVERY_S = 1.0

_spent: set[int] = set()  # listening fds whose accept() ran out in the current round


class _Listener(socket.socket):
    """A listening socket whose ``accept()``, after one that failed for want of
    descriptors, says "nothing waiting" once (asyncio then ends its round of accepts)."""

    __slots__ = ()

    def accept(self):
        fd = self.fileno()
        if fd in _spent:
            _spent.discard(fd)
            raise BlockingIOError(errno.EAGAIN, "out of descriptors: asyncio retries later")
        try:
            return super().accept()
        except OSError as e:
            if e.errno in OUT_OF:
                _spent.add(fd)
            raise


def guard(server: asyncio.AbstractServer) -> None:
    """Make ``server``'s listening sockets (``loop.create_server``/``start_server``'s,
    before it serves) end a round of accepts at the first that runs out of descriptors."""
    for s in getattr(server, "_sockets", None) or ():
        if type(s) is socket.socket:
            s.__class__ = _Listener


def quiet(loop: asyncio.AbstractEventLoop, who: str) -> None:
    """Have ``loop`` say a listener out of descriptors in one line (``who: ...``) at most
    every ``SAY_EVERY_S``, with how many such refusals were not said; anything else goes
    to the handler it had (or the default)."""
    before = loop.get_exception_handler()
    if getattr(before, "accept_guard", False):
        return  # (set already: a process serving more than one listener on its loop)
    say = LogLimiter(who, SAY_EVERY_S)
    limit = _limit()  # (read now: with no descriptor left, nothing can be looked up)

    def handler(lp: asyncio.AbstractEventLoop, context: dict) -> None:
        if _late_retry(context):
            return
        if context.get("message") != ACCEPT_FAILED:
            if before is not None:
                before(lp, context)
            else:
                lp.default_exception_handler(context)
            return
        e = context.get("exception")
        say(f"cannot accept a connection: {getattr(e, 'strerror', None) or e}{limit}; new "
            "connections wait, tried again every second (raise the limit: ulimit -n)")

    handler.accept_guard = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


def _late_retry(context: dict) -> bool:
    """Whether ``context`` is asyncio's retry of an out-of-descriptors listener, put back a
    second later, failing because the listener closed meanwhile (the process stopping:
    a traceback of ``_start_serving`` on a socket of fd -1 at every such stop)."""
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    return (getattr(callback, "__name__", "") == "_start_serving"
            and isinstance(context.get("exception"), OSError | ValueError)
            and any(isinstance(a, _Listener) and a.fileno() == -1
                    for a in getattr(handle, "_args", None) or ()))


def _limit() -> str:
    """The descriptors limit in words for the line, or "" where it cannot be read."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return ""
    return "" if soft == resource.RLIM_INFINITY else f" (descriptors limit {soft})"
