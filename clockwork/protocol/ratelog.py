"""Rate-limited log lines: a peer that keeps sending malformed messages (or a flood of
refused requests) must not flood the log or spend the process's time writing it."""

from __future__ import annotations

import sys
import time
import traceback
from collections import deque


class LogLimiter:
    """Log lines of one kind at most ``burst`` times per ``every`` seconds (a line is said
    if fewer than ``burst`` were said in the ``every`` seconds before it), saying how many
    were left out in between (a misbehaving peer must not flood the log). With
    ``changes``, a line unlike the last one said is said at once (a reason that changed
    is news)."""

    def __init__(self, prefix: str, every: float = 1.0, burst: int = 1,
                 changes: bool = False) -> None:
        self.prefix = prefix
        self.every = every
        self._said: deque[float] = deque(maxlen=burst)  # when the last ``burst`` were said
        self._skipped = 0
        self._line: str | None = "" if changes else None  # the last line said

    def __call__(self, line: str, exc: BaseException | None = None) -> None:
        t = time.monotonic()
        said = self._said
        if (len(said) == said.maxlen and t - said[0] < self.every
                and (self._line is None or line == self._line)):
            self._skipped += 1
            return
        more = f" ({self._skipped} more like it not shown)" if self._skipped else ""
        said.append(t)
        self._skipped = 0
        if self._line is not None:
            self._line = line
        text = f"{self.prefix}: {line}{more}"
        if exc is not None and not isinstance(exc, ValueError):  # a bug: say where
            text += "\n" + "".join(traceback.format_exception(exc)).rstrip()
        print(text, file=sys.stderr, flush=True)


class KeyedLog:
    """Lines about many things (packages, say), each thing's said when it is new or says
    something else than its last line, and at most once per ``every`` seconds otherwise:
    a burst about several things says each (``LogLimiter`` said the first only), a thing
    failing again and again is not a flood. Remembers at most ``keep`` things."""

    def __init__(self, prefix: str, every: float = 60.0, keep: int = 256) -> None:
        self.prefix = prefix
        self.every = every
        self.keep = keep
        self._last: dict = {}  # key -> (line, when said)

    def __call__(self, key, line: str, text: str | None = None) -> None:
        """Say ``text`` (default ``line``) about ``key`` unless ``line`` was said of it
        within ``every`` seconds (``text`` may add what differs each time, such as which
        of many users of the thing asked)."""
        t = time.monotonic()
        said = self._last.get(key)
        if said is not None and said[0] == line and t - said[1] < self.every:
            return
        self._last.pop(key, None)
        self._last[key] = (line, t)
        while len(self._last) > self.keep:
            self._last.pop(next(iter(self._last)))
        print(f"{self.prefix}: {text or line}", file=sys.stderr, flush=True)
