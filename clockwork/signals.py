"""The signals that stop a clockwork process as Ctrl-C does.

SIGINT (Ctrl-C), SIGTERM (``kill``, a service manager) and SIGHUP (the terminal it ran in
was closed) each end a command the same way: a cluster stopped with its children, a
simulation's spill folder removed, a controller's logs written, a replay's figures so far
kept. SIGHUP only where it is not ignored: under ``nohup`` (which ignores it) a process
keeps running when its terminal closes, as the user asked.
"""

from __future__ import annotations

import signal


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGINT, SIGTERM and, unless this process ignores it, SIGHUP."""
    out = [signal.SIGINT, signal.SIGTERM]
    hup = getattr(signal, "SIGHUP", None)  # (none on Windows)
    if hup is not None and signal.getsignal(hup) is not signal.SIG_IGN:
        out.append(hup)
    return tuple(out)


def term_signals() -> tuple[signal.Signals, ...]:
    """``stop_signals()`` but SIGINT: those Python does not turn into KeyboardInterrupt."""
    return tuple(s for s in stop_signals() if s != signal.SIGINT)
