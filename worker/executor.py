"""Worker semantics for one GPU, as a pure state machine.

A GPU has a weights cache of fixed-size pages and one executor ("lane") per
action kind: LOAD (host -> device copy) and EXEC (INFER). EVICT is immediate.
Each lane takes actions in ``earliest`` order, runs one at a time, waits until
``earliest`` ("too early" is waited out) and rejects an action it cannot start
by ``latest`` with that kind's ``*_TOO_LATE`` code, never running it late.

No clocks, threads or sleeps here: a shell calls ``submit(action, now)`` when an
action arrives and ``advance(now)`` at ``next_time()``; both return the results
finished by ``now``. How long an action takes comes from a ``Device``.

A device that really computes cannot say in advance how long an action takes: its
``duration`` returns ``None``. Such an action starts "open": the executor hands it to
the shell (``take_started()``), the shell runs it and reports ``complete(...)`` with the
measured times. A LOAD in progress leaves its weights pending, and an INFER that needs
them waits in its lane until the LOAD completes (and is rejected then if its window has
passed).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from clockwork.actions import NEVER, TOO_LATE, Action, ActionType, ErrorCode, Result
from clockwork.profiles import ModelProfile


class Device(Protocol):
    """Tells how long an action takes on this GPU: a figure (emulated), or ``None``
    when the shell runs it for real and reports the measured times."""

    def duration(self, action: Action, profile: ModelProfile) -> int | None: ...


PENDING = NEVER  # Weights.ready_at while a real LOAD is still running
# an action whose window opens further ahead than this, or one more than MAX_PENDING
# waiting on its lane, is refused INVALID_INPUT: a controller plans milliseconds ahead,
# and actions that would never run (a window at the end of time) queued without bound
MAX_AHEAD_NS = 86_400 * 10**9  # (a day)
MAX_PENDING = 100_000


@dataclass(slots=True)
class Weights:
    pages: list[int]
    version: int
    ready_at: int  # LOAD's end; INFER before this finds no weights


@dataclass(slots=True)
class _Running:
    action: Action
    received: int
    begin: int
    end: int | None  # None: open (a real device is running it)
    status: ErrorCode = ErrorCode.SUCCESS
    message: str = ""
    duration: int | None = None  # measured main phase (EXEC), when it differs from end - begin
    outputs: object = None


class Lane:
    """One executor: a queue ordered by ``earliest`` and at most one running action."""

    __slots__ = ("pending", "running", "free_at")

    def __init__(self) -> None:
        # (earliest, id, arrival number, action, received): the arrival number keeps two
        # actions of one id (a controller's mistake) from being compared
        self.pending: list[tuple[int, int, int, Action, int]] = []
        self.running: _Running | None = None
        # (free since forever: a worker's clock may read below 0 -- an offset, a clock
        # with an early epoch -- and nothing waits for it to pass 0)
        self.free_at = -(1 << 62)


class FreePages:
    """The free page numbers of a weights cache of ``total`` pages, handed out as a stack
    of every page would (lowest first; pages given back are taken again first, the last
    given back first), without holding a number per page: its memory grows with the
    pages ever in use, not with the cache's size."""

    __slots__ = ("total", "_fresh", "_back")

    def __init__(self, total: int) -> None:
        self.total = total
        self._fresh = 0  # pages never taken: _fresh .. total - 1
        self._back: list[int] = []  # pages given back, the next to take last

    def __len__(self) -> int:
        return len(self._back) + self.total - self._fresh

    def take(self, n: int) -> list[int]:
        """``n`` free pages (at most ``len(self)``), taken."""
        back = self._back
        out = [back.pop() for _ in range(min(n, len(back)))]
        if len(out) < n:
            start = self._fresh
            self._fresh = start + n - len(out)
            out.extend(range(start, self._fresh))
        return out

    def give(self, pages: list[int]) -> None:
        """Pages free again (taken again first, the first of ``pages`` first)."""
        self._back.extend(reversed(pages))


@dataclass
class GpuExecutor:
    worker: int
    gpu: int
    total_pages: int
    models: dict[str, ModelProfile]
    device: Device
    weights: dict[str, Weights] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free_pages = FreePages(self.total_pages)
        self.load_lane = Lane()
        self.exec_lane = Lane()
        # the running EXEC -> the pages of the weights evicted under it (EVICT, ``forget``):
        # given back when it ends, as a real device frees them (a LOAD in between was
        # counted room here the device did not have, and failed there)
        self._evicted_while_running: dict[int, list] = {}
        self._started: list[Action] = []  # open actions the shell has not taken yet
        self.peak_pages = 0  # the most pages ever in use at once (set as pages are taken)
        self._arrivals = 0  # actions queued so far (their order among equal keys)

    # -- queries -----------------------------------------------------------------

    @property
    def pages_used(self) -> int:
        return self.total_pages - len(self.free_pages)

    def loaded_models(self) -> list[str]:
        return sorted(self.weights)

    def next_time(self) -> int | None:
        """When ``advance`` next has something to do: the end of a lane's running action,
        else when its first queued one can begin (asked after every event of the worker);
        None: nothing to do until a new action or ``complete``."""
        lane = self.load_lane
        r = lane.running
        if r is not None:
            a = r.end  # None while open: complete() moves things on
        elif lane.pending:
            earliest, _, _, _, received = lane.pending[0]
            a = max(lane.free_at, received, earliest)
        else:
            a = None
        lane = self.exec_lane
        r = lane.running
        if r is not None:
            b = r.end
        elif lane.pending:
            earliest, _, _, action, received = lane.pending[0]
            free = lane.free_at
            consider = free if free > received else received
            if consider <= action.latest:
                b = self._begin(action, consider, earliest)
                if b >= NEVER:
                    b = None  # waits for a real LOAD; complete() moves things on
            else:  # too late already: the next step answers it
                b = consider if consider > earliest else earliest
        else:
            return a
        if a is None:
            return b
        if b is None:
            return a
        return a if a < b else b

    # -- stimuli -----------------------------------------------------------------

    def submit(self, action: Action, now: int) -> list[Result]:
        """An action arrives at ``now``. EVICT runs at once, whatever its window: the
        controller frees the pages in its view as it sends one (an EVICT sent with a
        window, which a worker clock a little behind would refuse), so a refused EVICT
        would leave weights the controller no longer counts. Others are queued."""
        out: list[Result] = []
        if action.gpu != self.gpu:
            out.append(self._error(action, now, now, ErrorCode.INVALID_GPU, "wrong gpu"))
        elif action.model not in self.models:
            out.append(
                self._error(action, now, now, ErrorCode.UNKNOWN_MODEL, f"unknown model {action.model!r}")
            )
        elif action.type == ActionType.EVICT:
            out.append(self._evict(action, now))
        else:
            lane = self.exec_lane if action.type == ActionType.INFER else self.load_lane
            ahead = action.earliest and action.earliest - now > MAX_AHEAD_NS  # (0: at once)
            if ahead or len(lane.pending) >= MAX_PENDING:
                out.append(self._error(action, now, now, ErrorCode.INVALID_INPUT,
                                       "its window opens more than a day ahead" if ahead
                                       else f"{MAX_PENDING} actions wait on its lane already"))
            else:
                self._arrivals += 1
                heapq.heappush(lane.pending,
                               (action.earliest, action.id, self._arrivals, action, now))
        out.extend(self.advance(now))
        return out

    def advance(self, now: int) -> list[Result]:
        """Finish and start whatever is due by ``now``; return finished results."""
        out: list[Result] = []
        load, ex, step = self.load_lane, self.exec_lane, self._step
        while True:  # a step of each lane per round (an idle lane, or one whose running
            # action ends after ``now``, is not asked: its step would do nothing)
            r = load.running
            if r is None:
                p = step(load, now, out) if load.pending else False
            else:
                end = r.end
                p = end is not None and end <= now and step(load, now, out)
            r = ex.running
            if r is None:
                if ex.pending and step(ex, now, out):
                    continue
            else:
                end = r.end
                if end is not None and end <= now and step(ex, now, out):
                    continue
            if not p:
                return out

    def forget(self, model: str, now: int) -> list[Result]:
        """``model`` leaves this worker at ``now`` (the controller's model repository
        removed it, or gave its name another model): its weights, if still cached, are
        dropped and their pages freed (as EVICT does; an EXEC running on them fails
        ``WEIGHTS_CHANGED``), and its actions still queued here are taken out and answered
        ``UNKNOWN_MODEL``, as an action for a model the worker does not serve is at
        ``submit`` (each once: left queued, one would reach ``_start`` for a model no
        longer in ``models``). One running goes on and is answered as usual. Returns those
        answers. The caller removes it from ``models``."""
        out: list[Result] = []
        for lane in (self.load_lane, self.exec_lane):
            gone = [p for p in lane.pending if p[3].model == model]
            if gone:
                lane.pending = [p for p in lane.pending if p[3].model != model]
                heapq.heapify(lane.pending)
                gone.sort(key=lambda p: p[:3])  # (in the order they would have run)
                out.extend(self._error(a, received, now, ErrorCode.UNKNOWN_MODEL,
                                       f"model {model!r} was removed")
                           for _, _, _, a, received in gone)
        w = self.weights.pop(model, None)
        if w is None:
            return out
        self._free_when_done(model, w.pages)
        return out

    def _free_when_done(self, model: str, pages) -> None:
        """``model``'s weights, ``pages``, are evicted: the pages are free now, or, under
        an EXEC of it running, when it ends (it fails ``WEIGHTS_CHANGED``)."""
        er = self.exec_lane.running
        if er is not None and er.action.model == model:
            self._evicted_while_running.setdefault(er.action.id, []).append(pages)
        else:
            self.free_pages.give(pages)

    def take_weights(self, old: GpuExecutor, keep: dict[str, int], now: int) -> set[str]:
        """A reset that keeps some weights: this new executor for the same GPU takes over
        from ``old`` (the one it replaces) the weights ``keep`` names (model -> version)
        that are fully loaded there by ``now`` at that version, for models it serves with
        the same profile as ``old`` did (an instance name given another model in between
        keeps nothing). Nothing in flight is taken over. Returns the names taken."""
        taken: set[str] = set()
        models = self.models
        for name, version in keep.items():
            w = old.weights.get(name)
            if (w is None or w.version != version or w.ready_at > now
                    or name not in models or models[name] is not old.models.get(name)
                    or name in self.weights or len(w.pages) > len(self.free_pages)):
                continue
            pages = self.free_pages.take(len(w.pages))
            self.weights[name] = Weights(pages, version, w.ready_at)
            taken.add(name)
        self._note_peak()
        return taken

    def take_started(self) -> list[Action]:
        """Open actions started since the last call, for the shell to run for real."""
        out, self._started = self._started, []
        return out

    def complete(self, action_id: int, now: int, status: ErrorCode = ErrorCode.SUCCESS,
                 message: str = "", duration: int | None = None,
                 outputs: object = None, kind: ActionType | None = None) -> list[Result]:
        """The shell hears at ``now`` that an open action finished: its lane was held from
        when this executor started it until now (the hand-over to the device and back
        included); ``duration`` is the device's own figure for the work. ``kind``: its
        type, which picks its lane (a LOAD and an INFER a controller gave the same id may
        run at once, one on each: the id alone gave one's result to the other). Returns
        its result and whatever else finished or started by ``now``."""
        for lane in (self.exec_lane, self.load_lane):
            r = lane.running
            if (r is not None and r.end is None and r.action.id == action_id
                    and (kind is None or r.action.type == kind)):
                break
        else:
            raise KeyError(f"action {action_id} is not running open here")
        r.end, r.duration, r.outputs = now, duration, outputs
        if status != ErrorCode.SUCCESS and r.status == ErrorCode.SUCCESS:
            r.status, r.message = status, message
        a = r.action
        if a.type == ActionType.LOAD:
            w = self.weights.get(a.model)
            if w is not None and w.ready_at == PENDING:
                if r.status == ErrorCode.SUCCESS:
                    w.ready_at = now
                else:  # the device could not load it: give the pages back
                    del self.weights[a.model]
                    self.free_pages.give(w.pages)
        return self.advance(now)

    # -- lanes -------------------------------------------------------------------

    def _step(self, lane: Lane, now: int, out: list[Result]) -> bool:
        r = lane.running
        if r is not None:
            if r.end is None or r.end > now:
                return False
            lane.running = None
            lane.free_at = r.end
            out.append(self._finish(r))
            return True
        if not lane.pending:
            return False
        earliest, _, _, action, received = lane.pending[0]
        if max(lane.free_at, received) > now:
            return False
        # the lane can take it now (not at an earlier time it could have, had this been
        # asked then: a late timer or a late completion is time really lost)
        if now > action.latest:
            heapq.heappop(lane.pending)
            lane.free_at = now
            late_by = (now - action.latest) / 1e6
            out.append(
                self._error(action, received, now, TOO_LATE[action.type], f"late by {late_by:.3f} ms")
            )
            return True
        begin = self._begin(action, now, earliest)
        if begin > now:
            return False  # (asked again then: past ``latest``, it is answered as above)
        heapq.heappop(lane.pending)
        lane.running = self._start(action, received, begin)
        return True

    def _begin(self, action: Action, consider: int, earliest: int) -> int:
        """When a lane that can take ``action`` at ``consider`` begins it. An INFER whose
        weights are still being loaded here waits for the LOAD to finish, if that is
        within its window (LOAD and EXEC are separate lanes: a LOAD that started a
        little late must not make an INFER scheduled right behind it fail)."""
        begin = consider if consider > earliest else earliest
        if action.type == ActionType.INFER:
            w = self.weights.get(action.model)
            if w is not None:
                if w.ready_at == PENDING:
                    return NEVER  # a real LOAD is running: wait for it
                if begin < w.ready_at <= action.latest:
                    begin = w.ready_at
        return begin

    def _start(self, action: Action, received: int, begin: int) -> _Running:
        profile = self.models[action.model]
        if action.type == ActionType.INFER:
            w = self.weights.get(action.model)
            if action.batch_size not in profile.exec_ns:
                return _Running(action, received, begin, begin, ErrorCode.INVALID_BATCH_SIZE,
                                f"batch size {action.batch_size} not in {profile.batch_sizes}")
            if w is None or w.ready_at > begin:
                return _Running(action, received, begin, begin, ErrorCode.WEIGHTS_NOT_PRESENT,
                                "weights not in the cache")
            if action.version and w.version != action.version:
                return _Running(action, received, begin, begin, ErrorCode.WEIGHTS_CHANGED,
                                f"weights version {w.version}, action expects {action.version}")
            d = self.device.duration(action, profile)
            if d is None:
                self._started.append(action)
                return _Running(action, received, begin, None)
            return _Running(action, received, begin, begin + d)
        # LOAD
        if action.model in self.weights:
            return _Running(action, received, begin, begin, ErrorCode.WEIGHTS_ALREADY_LOADED,
                            "weights already loaded")
        need = profile.weights_pages
        if need > len(self.free_pages):
            return _Running(action, received, begin, begin, ErrorCode.LOAD_INSUFFICIENT_CACHE,
                            f"needs {need} pages, {len(self.free_pages)} free")
        d = self.device.duration(action, profile)
        end = None if d is None else begin + d
        pages = self.free_pages.take(need)
        self._note_peak()
        self.weights[action.model] = Weights(pages, action.version, PENDING if end is None else end)
        if end is None:
            self._started.append(action)
        return _Running(action, received, begin, end)

    def _note_peak(self) -> None:
        used = self.total_pages - len(self.free_pages)
        if used > self.peak_pages:
            self.peak_pages = used

    def _finish(self, r: _Running) -> Result:
        a = r.action
        status, message = r.status, r.message
        freed = self._evicted_while_running.pop(a.id, None) if a.type == ActionType.INFER else None
        if freed is not None:
            if status == ErrorCode.SUCCESS:
                status, message = ErrorCode.WEIGHTS_CHANGED, "weights evicted during EXEC"
            for pages in freed:
                self.free_pages.give(pages)
        return Result(
            id=a.id, type=a.type, status=status, worker=self.worker, gpu=self.gpu, model=a.model,
            batch_size=a.batch_size, received=r.received, begin=r.begin, end=r.end,
            duration=r.end - r.begin if r.duration is None else r.duration, message=message,
            outputs=r.outputs if status == ErrorCode.SUCCESS else None,
        )

    def _evict(self, action: Action, now: int) -> Result:
        w = self.weights.get(action.model)
        if w is None:
            return self._error(action, now, now, ErrorCode.EVICT_NOT_IN_CACHE, "weights not in the cache")
        lr = self.load_lane.running
        if lr is not None and lr.action.model == action.model and lr.status == ErrorCode.SUCCESS:
            return self._error(action, now, now, ErrorCode.WEIGHTS_IN_USE, "weights are being loaded")
        del self.weights[action.model]
        self._free_when_done(action.model, w.pages)
        return Result(id=action.id, type=action.type, status=ErrorCode.SUCCESS, worker=self.worker,
                      gpu=self.gpu, model=action.model, received=now, begin=now, end=now)

    def _error(self, action: Action, received: int, at: int, code: ErrorCode, message: str) -> Result:
        return Result(id=action.id, type=action.type, status=code, worker=self.worker, gpu=self.gpu,
                      model=action.model, batch_size=action.batch_size, received=received,
                      begin=at, end=at, message=message)


def held_weights(executors: Iterable[GpuExecutor]) -> list[tuple[int, str, int]]:
    """Every weights cached on these GPUs, each (GPU, model, version): what a reset that
    takes the worker over for a new controller asks ``keep_weights`` to keep (it keeps
    those fully loaded, for models served with the same profile)."""
    return [(e.gpu, name, w.version) for e in executors for name, w in e.weights.items()]


def keep_weights(old: list[GpuExecutor], new: list[GpuExecutor],
                 keep: Iterable[tuple[int, str, int]], now: int) -> list[set[str]]:
    """A worker's reset that keeps the weights ``keep`` names, each (GPU, model,
    version): ``new`` (the GPUs' executors after it) take them over from ``old`` (those
    before it; ``take_weights``). Returns, per GPU of ``new``, the names kept."""
    per: dict[int, dict[str, int]] = {}
    for gpu, model, version in keep:
        per.setdefault(gpu, {})[model] = version
    out: list[set[str]] = []
    for ex in new:
        want = per.get(ex.gpu)
        before = old[ex.gpu] if want and ex.gpu < len(old) else None
        out.append(ex.take_weights(before, want, now) if before is not None else set())
    return out


__all__ = ["Device", "GpuExecutor", "Lane", "Weights", "NEVER", "PENDING", "held_weights",
           "keep_weights"]
