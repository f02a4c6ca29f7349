"""Standard output and error whose reader may go away.

``clockwork simulate ... --out DIR | less`` quit before the run ends, ``clockwork serve
2>&1 | tee log`` whose ``tee`` dies: the next write to the pipe fails (BrokenPipeError),
and the command stopped there -- a simulation's files never written, a cluster shut down
at its next log line -- and exited 0. Here the first such failure points the stream's file
descriptor at /dev/null: what is written to it after is dropped, and the command goes on
(its files written, its cluster serving, its exit status its own).

Standard error also outlives a write that fails otherwise (a full disk, an I/O error:
``serve 2>>log`` on a disk that filled up): what goes there says what happens, and a
server stopped by its own log line -- or a line that raised in the middle of its work --
is worse than lines lost. Standard output does not: a simulation's report written to a
full disk is an error the command says (exit 1).

``standard_streams`` gives a process started with a standard descriptor closed
(``>&-``, ``2>&-``, a daemon's closed fds: Python's ``sys.stdout`` is then None, and
every print failed) /dev/null in its place, so that the first file or socket it opens
does not become its stdout either.
"""

from __future__ import annotations

import datetime
import os
import sys


def standard_streams() -> None:
    """Descriptors 0, 1 and 2 open (/dev/null where one was closed), and ``sys.stdin``,
    ``sys.stdout``, ``sys.stderr`` streams on them where Python left None."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    # (not on descriptors 0-2 themselves: with Python's stream None, one may be a file
    # something opened since, not ours to write)
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's, never closed
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


class ReaderSafe:
    """A text stream (``sys.stdout``, ``sys.stderr``) that outlives its reader; with
    ``any_error`` (standard error) any failed write too."""

    def __init__(self, stream, any_error: bool = False, stamp: bool = False) -> None:
        self._stream = stream
        self._lost = OSError if any_error else BrokenPipeError
        self._stamp = stamp  # each line begins with the UTC time (``stamped``)
        self._line_start = True

    def write(self, text: str) -> int:
        n = len(text)
        if self._stamp and text:
            text = self._stamped(text)
        try:
            self._stream.write(text)
            return n
        except BlockingIOError:
            if self._lost is BrokenPipeError:
                raise
            return n  # (a non-blocking stream full now: this line lost, not all)
        except self._lost:
            self._gone()
            return n

    def _stamped(self, text: str) -> str:
        """``text`` with the time before each line that begins in it."""
        now = datetime.datetime.now(datetime.UTC)
        t = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z "
        lines = text.split("\n")
        out = [(t if self._line_start else "") + lines[0]]
        out += [(t + ln) if ln else ln for ln in lines[1:]]
        self._line_start = text.endswith("\n")
        return "\n".join(out)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BlockingIOError:
            if self._lost is BrokenPipeError:
                raise
        except self._lost:
            self._gone()

    def _gone(self) -> None:
        """The reader went away: later writes (and the flush of what is buffered) go to
        /dev/null."""
        try:
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            os.dup2(null, self._stream.fileno())
        except (OSError, ValueError):  # (a stream without a descriptor: a test's capture)
            pass
        finally:
            os.close(null)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
