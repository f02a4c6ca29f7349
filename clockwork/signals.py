"""The signals that stop a clockwork process as Ctrl-C does.

SIGINT (Ctrl-C), SIGTERM (``kill``, a service manager) and SIGHUP (the terminal it ran in
was closed) each end a command the same way: a cluster stopped with its children, a
simulation's spill folder removed, a controller's logs written, a replay's figures so far
kept. SIGHUP only where it is not ignored: under ``nohup`` (which ignores it) a process
keeps running when its terminal closes, as the user asked.
"""

from __future__ import annotations

import contextlib
import signal
import threading


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGINT, SIGTERM and, unless this process ignores it, SIGHUP."""
    out = [signal.SIGINT, signal.SIGTERM]
    hup = getattr(signal, "SIGHUP", None)  # (none on Windows)
    if hup is not None and signal.getsignal(hup) is not signal.SIG_IGN:
        out.append(hup)
    return tuple(out)


def stop_event_on_signals(loop, stop) -> None:
    """``stop`` (an ``asyncio.Event``) set by each of ``stop_signals()`` on ``loop``; the
    first one's name kept as ``stop.signal_name`` (``said_why`` says it)."""
    def on(sig: signal.Signals) -> None:
        if not stop.is_set():
            stop.signal_name = sig.name
        stop.set()

    for sig in stop_signals():
        loop.add_signal_handler(sig, on, sig)


def said_why(stop) -> str:
    """" (SIGTERM)": the signal that set ``stop`` (``stop_event_on_signals``); "" for
    another cause (its parent gone, a stop asked in code)."""
    name = getattr(stop, "signal_name", "")
    return f" ({name})" if name else ""


def run_until_signalled(coro):
    """``asyncio.run(coro)``, a stop signal cancelling ``coro`` on the loop, and then
    ``KeyboardInterrupt`` raised once the loop has ended: raised by a signal handler at
    any point of the loop's own code (as Ctrl-C, or ``term_as_ctrl_c``, does), it could
    leave a callback of gRPC's poller unrun and the loop's end then waited for ever for a
    call's cancellation (a --live experiment stopped by SIGTERM hung, ~1 run in 10 on a
    busy machine). The handlers before it are put back after. Outside the main thread
    (where no signal handler runs) just ``asyncio.run``."""
    import asyncio

    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    before = {s: signal.getsignal(s) for s in stop_signals()}
    got: list[signal.Signals] = []

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on(sig: signal.Signals) -> None:
            got.append(sig)
            task.cancel()

        for sig in before:
            loop.add_signal_handler(sig, on, sig)
        return await coro

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if got:
            raise KeyboardInterrupt from None
        raise
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)


def term_signals() -> tuple[signal.Signals, ...]:
    """``stop_signals()`` but SIGINT: those Python does not turn into KeyboardInterrupt."""
    return tuple(s for s in stop_signals() if s != signal.SIGINT)


@contextlib.contextmanager
def _handled(signals, handler):
    """Within it, ``handler`` handles ``signals``; the previous handlers are put back
    after. Nothing is changed outside the main thread (where Python runs signal
    handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def term_as_ctrl_c():
    """Within it, SIGTERM and SIGHUP (``term_signals``) raise KeyboardInterrupt as Ctrl-C
    does, so that the command they stop ends its own way (its children stopped, its
    temporary folders removed: they killed the process, leaving both behind). Only in the
    main thread (where Python runs signal handlers); the previous handlers are put back
    after."""
    def on_term(signum, frame):
        raise KeyboardInterrupt

    with _handled(term_signals(), on_term):
        yield


@contextlib.contextmanager
def stops_held():
    """Within it, a first stop signal (``stop_signals``) is held: KeyboardInterrupt is
    raised when it ends, not in the middle (a child process being started: one cut short
    left the child reading half its start message, a traceback of its own; a finished
    run's files being written: lost); a second one raises at once. Only in the main
    thread; the previous handlers are put back after."""
    got: list[int] = []

    def hold(signum, frame):
        if got:  # (asked twice: now)
            raise KeyboardInterrupt
        got.append(signum)

    with _handled(stop_signals(), hold):
        yield
    if got:
        raise KeyboardInterrupt
