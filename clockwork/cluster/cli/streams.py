"""Standard output and error whose reader may go away.

``clockwork simulate ... --out DIR | less`` quit before the run ends, ``clockwork serve
2>&1 | tee log`` whose ``tee`` dies: the next write to the pipe fails (BrokenPipeError),
and the command stopped there -- a simulation's files never written, a cluster shut down
at its next log line -- and exited 0. Here the first such failure points the stream's file
descriptor at /dev/null: what is written to it after is dropped, and the command goes on
(its files written, its cluster serving, its exit status its own).
"""

from __future__ import annotations

import os


class ReaderSafe:
    """A text stream (``sys.stdout``, ``sys.stderr``) that outlives its reader."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
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
