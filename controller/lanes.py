"""Predicting when a worker's executor (EXEC lane, PCIe/LOAD lane) will be free.

The controller keeps, per lane, the actions it has sent and not yet heard back
about. The lane is predicted free at the end of that chain, each action starting
no earlier than its ``earliest``, nor than ``future`` after it was sent (it cannot
have reached the worker sooner), and taking its expected duration, anchored at
the last completion the worker reported. Work that is ``lag`` overdue is assumed
done, so one lost result cannot stall a GPU forever.

``WatchedLane`` (a lane's class can be switched to it and back) calls ``on_change`` after
every change of the prediction (work added, a result, a re-anchor); ``free_at`` and
``due`` are the prediction's raw figures, which ``available`` turns into a start time (see
``ClockworkScheduler``'s copy index, which keeps them ordered per model without asking
every lane on every request).
"""

from __future__ import annotations

from clockwork.actions import NEVER


class LaneTracker:
    __slots__ = ("future", "lag", "base", "_work", "_free_at", "_first", "on_change")

    def __init__(self, future: int, lag: int) -> None:
        self.future = future
        self.lag = lag
        self.base = 0  # last reported completion
        # id -> (earliest, its start bound, duration), in send order
        self._work: dict[int, tuple[int, int, int]] = {}
        self._free_at = 0
        self._first = 0  # duration of the oldest outstanding action (0: none)
        self.on_change = None  # WatchedLane: called after every change of the prediction

    def __len__(self) -> int:
        return len(self._work)

    @property
    def idle(self) -> bool:
        return not self._work

    @property
    def last_earliest(self) -> int:
        """``earliest`` of the newest outstanding action (0 when there is none)."""
        work = self._work
        return next(reversed(work.values()))[0] if work else 0

    @property
    def free_at(self) -> int:
        """The end of the predicted chain; ``available(now)`` is ``max(free_at, now +
        future)`` unless the lane is overdue at ``now`` (``due < now``)."""
        return self._free_at

    @property
    def due(self) -> int:
        """``available(now)`` re-anchors the lane (assumes its oldest action done) for
        any ``now`` after this; a huge number when the lane is empty."""
        first = self._first
        return self.base + first + self.lag if first else NEVER

    def available(self, now: int) -> int:
        """Predicted time the lane can start new work (never before ``now + future``)."""
        free = self._free_at
        first = self._first
        if first and self.base + first + self.lag < now:  # overdue: re-anchor
            self.base = now - self.lag - first
            self._recompute()
            free = self._free_at
            if self.on_change is not None:
                self.on_change()
        t = now + self.future
        return free if free > t else t

    def add(self, action_id: int, earliest: int, duration: int, now: int) -> int:
        """Record sent work; returns its predicted start."""
        start = self.available(now)
        if earliest > start:
            start = earliest
        if not self._work:
            self.base = start
            self._first = duration
        # (its start bound when the chain is replayed: never before it can have reached the
        # worker, ``now + future``, as here; replayed from ``earliest`` alone, the send
        # time, a result's re-anchor predicted the next actions up to ``future`` early,
        # and a batch predicted in time ran past its requests' deadlines)
        lo = now + self.future
        self._work[action_id] = (earliest, earliest if earliest > lo else lo, duration)
        self._free_at = start + duration
        return start

    def done(self, action_id: int, end: int) -> None:
        """The worker reported the action finished (or was rejected) at ``end``."""
        work = self._work
        if action_id not in work:
            return
        first = next(iter(work))
        del work[action_id]
        if action_id == first or end > self.base:
            self.base = end
        if not work:  # _recompute, written out for the commonest case: nothing left
            self._first = 0
            self._free_at = self.base
        else:
            self._recompute()

    def _recompute(self) -> None:
        self._first = next(iter(self._work.values()))[2] if self._work else 0
        t = self.base
        for _, lo, dur in self._work.values():
            if lo > t:
                t = lo
            t += dur
        self._free_at = t


class WatchedLane(LaneTracker):
    """A lane that reports every change of its prediction to ``on_change`` (set it
    first). ``watch``/``unwatch`` switch a ``LaneTracker`` to this class and back, so an
    unwatched lane pays nothing."""

    __slots__ = ()

    def add(self, action_id: int, earliest: int, duration: int, now: int) -> int:
        start = LaneTracker.add(self, action_id, earliest, duration, now)
        self.on_change()
        return start

    def done(self, action_id: int, end: int) -> None:
        if action_id in self._work:
            LaneTracker.done(self, action_id, end)
            self.on_change()


def watch(lane: LaneTracker, on_change) -> None:
    lane.on_change = on_change
    lane.__class__ = WatchedLane


def unwatch(lane: LaneTracker) -> None:
    lane.on_change = None
    lane.__class__ = LaneTracker
