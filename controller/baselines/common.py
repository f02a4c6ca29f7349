"""What the baseline policies share: the controller's view of GPUs and model copies,
sending LOAD / EVICT / INFER, answering every request exactly once, timers.

Baselines do not control execution windows: every action is sent with
``earliest = 0`` (at once when the worker has it) and ``latest = NEVER``, so a worker
never holds one back or rejects one for lateness; it runs actions in arrival order on
its LOAD and EXEC lanes. An INFER is
only sent once its model's LOAD has been reported done (the baselines have no
predicted schedule to place it behind the LOAD). Pages are tracked like
``controller/state.py`` does: a LOAD takes its pages in our view when it is sent, an
EVICT gives them back when it is sent, and only copies that are neither loading nor
running anything are evicted, so the worker's cache is never over-committed.

The book of actions sent and not answered, and what a failed result means, are
``controller/inflight.py``'s (shared with the Clockwork scheduler). A request runs in at
most ``MAX_ATTEMPTS`` INFERs: a rejected INFER returns its requests to the policy
(``_requeue``), and the last rejection answers them ``ERROR``; one rejected because the
weights were missing also drops the copy (``_lost``).

Models come and go at run time (``add_model`` / ``remove_model``): an added model gets
the same per-model state as one the policy was built with (the ``_added`` hook); a
removed one leaves ``serving`` at once (its requests are refused like an unknown
model's), its queued requests are answered (the subclass hands them over in
``_take_queued``), its copies are EVICTed as each becomes idle, and its state is
forgotten (``_forget``) when the last copy is gone. An INFER of it may still be out
then (sent to a copy lost meanwhile): if it fails, its requests are answered like the
queued ones, never retried, even if the name was added again (``_serves``).

A GPU reported lost (``set_gpu_available(..., False)``) loses every copy, each as a
lost copy (``_drop``, ``_lost``), and gets no LOAD (``_try_load``, through which every
placement goes, skips it: ``Gpu.up``) until it is back, empty (the baselines keep no weights through a loss: ``held_copies`` is empty,
so the shell's ``readmit_gpu`` is ``set_gpu_available(..., True)``).

A subclass supplies the policy in the hooks below, and ``_waiting`` (how many requests
of a model its queues hold) for the read-only views.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterable, Mapping

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.profiles import ModelProfile
from clockwork.requests import DONE, EXECUTING, QUEUED, WITHDRAWN, Reply, Request
from clockwork.settings import from_table
from controller.config import SchedulerConfig, usable_batch_sizes
from controller.inflight import (
    COPY_FAULTED,
    COPY_GONE,
    LOAD_REFUSED,
    REFUSED_AS_SENT,
    REFUSED_FOR_NS,
    WEIGHTS_UNCOUNTED,
    Inflight,
    error_message,
    failed_status,
)
from controller.policy import (
    CANCELLED,
    MODEL_UNLOADED,
    NO_GPU_FITS,
    NO_GPU_LEFT,
    GpuSpec,
    ModelView,
    Policy,
)

MAX_ATTEMPTS = 3  # INFERs a request may be part of before a worker error is final
# every action's earliest start: 0, at once when the worker has it (the systems these
# policies model give no start times; one on the controller's clock, moved to the
# worker's by the estimate of its offset, made each action wait out that estimate's error:
# p50 latency 3.1 -> 10.0 ms at 50 ms of clock error, Clockwork's own 3.1 -> 3.75 ms)
AT_ONCE = 0


def parse_settings(cls, settings: Mapping[str, object] | None, policy: str = ""):
    """Build a baseline's config (a frozen pydantic dataclass with
    ``clockwork.settings.CONFIG``, time settings in int ns) from its ``[scheduler]`` keys
    (time settings in the units of their keys, e.g. ``batch_wait_ms``); a bad key or
    value raises ``SettingsError`` (a ``ValueError``) with one line. ``policy`` is
    unused: the schema names itself."""
    return from_table(cls, settings)


class Copy:
    """A model's weights on one GPU (loading or loaded), as the controller believes."""

    __slots__ = ("model", "gpu", "pages", "loading", "inflight", "last_used", "data", "group")

    def __init__(self, model: str, gpu: Gpu, pages: int = 0,
                 group: dict[int, Copy] | None = None) -> None:
        self.model = model
        self.gpu = gpu
        self.pages = pages  # its weights' pages on the GPU
        # its model's copies (``BaselinePolicy.copies[model]``) when it was made: a model
        # removed and added again under the same name has a new one
        self.group = group
        self.loading = True
        self.inflight = 0  # INFERs sent and not answered
        self.last_used = 0
        self.data: object = None  # policy-specific (a container, a queue, ...)


class Gpu:
    __slots__ = ("index", "worker", "gpu", "total_pages", "free_pages", "copies", "outstanding",
                 "loads", "up", "exec_end", "load_end")

    def __init__(self, index: int, spec: GpuSpec) -> None:
        self.index = index
        self.worker = spec.worker
        self.gpu = spec.gpu
        self.total_pages = spec.pages
        self.free_pages = spec.pages
        self.copies: dict[str, Copy] = {}
        self.outstanding = 0  # INFERs sent to this GPU and not answered
        self.loads = 0  # LOADs sent and not answered
        self.up = True  # False while its worker is lost (``set_gpu_available``): nothing goes there
        # when the work sent to its EXEC and PCIe lanes is predicted to end: each lane runs
        # one action at a time, so one sent behind others ends after them (predicted from
        # its send time alone, the last of 28 LOADs sent at once was "long overdue" on a
        # healthy worker, which was reset, its loaded copies dropped)
        self.exec_end = 0
        self.load_end = 0


class BaselinePolicy(Policy):
    """Bookkeeping shared by the baselines; subclasses supply the policy in hooks."""

    name = "baseline"

    def __init__(self, profiles: Iterable[ModelProfile], gpus: Iterable[GpuSpec],
                 config: SchedulerConfig | None = None) -> None:
        self.cfg = config or SchedulerConfig()
        # every model with state here (served, or removed with copies left); ``serving``:
        # those that take requests
        self.profiles: dict[str, ModelProfile] = {p.model: p for p in profiles}
        self.serving: set[str] = set(self.profiles)
        self._removing: set[str] = set()  # removed, some copy not yet evicted
        self.sizes: dict[str, list[int]] = {n: self._sizes(p) for n, p in self.profiles.items()}
        self.gpus: list[Gpu] = [Gpu(i, s) for i, s in enumerate(gpus)]
        # the GPUs not removed for good (``remove_gpu``), in index order: what the walks
        # over GPUs read (a removed one keeps its place in ``gpus``, never up again; some
        # were removed while this is shorter than ``gpus``)
        self.in_service: list[Gpu] = list(self.gpus)
        # the largest weights cache of a GPU not removed (``fits_somewhere``)
        self._fit_pages = max((g.total_pages for g in self.gpus), default=0)
        self.copies: dict[str, dict[int, Copy]] = {n: {} for n in self.profiles}
        self._replies: list[Reply] = []
        self._sent = Inflight()  # actions sent, not answered (gpu: a Gpu, copy: a Copy)
        self._attempts: dict[int, int] = {}
        self._timers: list[int] = []
        self._timer_set: set[int] = set()
        self._use_seq = 0
        # while waiting work is placed (``_placing``): for each GPU the fewest pages no
        # eviction could make room for; more cannot be made either until a copy is loaded
        # or evicted (requests queued and INFERs sent meanwhile only make fewer copies
        # evictable). None outside: a result may free a copy at any time
        self._no_room: dict[int, int] | None = None
        # LOADs a worker refused for the model itself (LOAD_REFUSED): (model, GPU) -> until
        # when that GPU is passed over for it; model -> (until, why) while every GPU that
        # could hold it refused it (its requests answered ERROR meanwhile)
        self._refused_on: dict[tuple[str, int], int] = {}
        self._refused: dict[str, tuple[int, str]] = {}

    def _sizes(self, p: ModelProfile) -> list[int]:
        return usable_batch_sizes(p.batch_sizes, self.cfg.max_batch)

    # ------------------------------------------------------------------ hooks

    def _added(self, model: str) -> None:
        """``add_model``: make the policy's own state for a new model (as ``__init__``
        does for the models it is built with)."""
        raise NotImplementedError

    def _take_queued(self, model: str) -> list[Request]:
        """``remove_model``: empty every queue of ``model`` and return its requests (they
        are answered by the caller), oldest first."""
        raise NotImplementedError

    def _forget(self, model: str) -> None:
        """A removed model's last copy is gone: drop the policy's own state of it."""

    def _unqueue(self, model: str, r: Request) -> bool:
        """``cancel``: take queued ``r`` out of ``model``'s queues; whether it was there."""
        raise NotImplementedError

    def _moved(self, model: str, moved: list[Request], now: int) -> None:
        """``arrived_earlier``: ``moved``, queued for ``model``, now count from earlier
        (their ``arrival`` and ``deadline`` moved): reorder what depends on them."""

    def _admit(self, r: Request, now: int, out: list[Action]) -> None:
        raise NotImplementedError

    def _requeue(self, model: str, requests: list[Request], now: int, out: list[Action]) -> None:
        """Requests of a rejected INFER that may be retried."""
        raise NotImplementedError

    def _infer_done(self, copy: Copy, action: Action, result: Result, requests: list[Request],
                    now: int, out: list[Action]) -> None:
        """A successful INFER (its requests are answered already)."""

    def _ready(self, copy: Copy, now: int, out: list[Action]) -> None:
        """A LOAD finished: the copy can take INFERs."""

    def _lost(self, model: str, gpu: Gpu, now: int, out: list[Action]) -> None:
        """A copy disappeared (a failed LOAD, or the worker lacked the weights)."""

    def _gpu_free(self, gpu: Gpu, now: int, out: list[Action]) -> None:
        """An action on ``gpu`` finished: the policy may send more work."""

    def _tick(self, now: int, out: list[Action]) -> None:
        """A timer set with ``_wake`` fired."""

    def _evictable(self, copy: Copy) -> bool:
        """Whether the policy lets this (idle, loaded) copy be evicted for memory."""
        return True

    def _waiting(self, model: str) -> int:
        """Requests of ``model`` in the policy's queues (accepted, not answered, not in
        an INFER in flight)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Policy

    def on_request(self, request: Request, now: int) -> list[Action]:
        out: list[Action] = []
        if request.model not in self.serving:
            self._answer(request, RequestStatus.INVALID_REQUEST, now,
                         MODEL_UNLOADED if request.model in self._removing
                         else f"unknown model {request.model!r}")
            return out
        slo = request.slo or self.cfg.default_slo
        if slo <= 0:
            self._answer(request, RequestStatus.INVALID_REQUEST, now, "SLO must be positive")
            return out
        request.slo = slo
        refused = self._refused.get(request.model)
        if refused is not None:
            if now < refused[0]:
                self._answer(request, RequestStatus.ERROR, now, refused[1])
                return out
            del self._refused[request.model]  # (tried again)
        request.deadline = request.arrival + slo
        # a cold start: no copy of its model loaded when it arrived (as the Clockwork
        # scheduler records it)
        request.cold = all(c.loading for c in self.copies[request.model].values())
        self._admit(request, now, out)
        return out

    def on_result(self, result: Result, now: int) -> list[Action]:
        out: list[Action] = []
        s = self._sent.resolve(result)
        if s is None:
            return out  # unknown or duplicate result: nothing to do
        g, c, a = s.gpu, s.copy, s.action
        if a.type == ActionType.INFER:
            g.outstanding -= 1
            c.inflight -= 1
            if not result.status:
                for r in s.requests:
                    self._attempts.pop(r.id, None)
                    self._answer(r, RequestStatus.SUCCESS, now, "", g.index, a.batch_size,
                                 result.outputs)
                self._infer_done(c, a, result, s.requests, now, out)
            else:
                retry = []
                for r in s.requests:
                    if r.state == WITHDRAWN:  # its caller went away (cancel): not again
                        self._attempts.pop(r.id, None)
                        self._answer(r, RequestStatus.ERROR, now, CANCELLED)
                        continue
                    # (refused for what it carried: no copy would do better)
                    n = MAX_ATTEMPTS if result.status in REFUSED_AS_SENT else (
                        self._attempts.get(r.id, 0) + 1)
                    if n >= MAX_ATTEMPTS:
                        self._attempts.pop(r.id, None)
                        self._answer(r, failed_status(result), now, error_message(result))
                    else:
                        self._attempts[r.id] = n
                        retry.append(r)
                if result.status in COPY_GONE and not c.loading and g.copies.get(c.model) is c:
                    if result.status == ErrorCode.WEIGHTS_CHANGED:
                        self._send_evict(c, now, out)  # (other weights of it are there)
                    else:
                        self._drop(c)
                    self._lost(c.model, g, now, out)
                elif result.status in COPY_FAULTED and g.copies.get(c.model) is c:
                    self._faulted(c, now, out)
                if retry and not self._serves(c):
                    for r in retry:  # removed: nowhere to run them any more
                        self._attempts.pop(r.id, None)
                        self._answer(r, RequestStatus.INVALID_REQUEST, now, MODEL_UNLOADED)
                elif retry:
                    self._requeue(c.model, retry, now, out)
        elif a.type == ActionType.LOAD:
            g.loads -= 1
            current = g.copies.get(c.model) is c
            if current and not result.status:
                c.loading = False
                self._ready(c, now, out)
            elif current:
                if result.status == WEIGHTS_UNCOUNTED:
                    self._send_evict(c, now, out)  # (its _lost may LOAD it again: after)
                else:
                    self._drop(c)
                if result.status in LOAD_REFUSED:
                    self._load_refused(c.model, g, result, now)
                self._lost(c.model, g, now, out)
        if result.status and len(self.in_service) < len(self.gpus):
            self._answer_unfit((c.model,), now)  # (retried, or waiting for a copy)
        if self._removing:
            self._sweep(now, out)
        self._gpu_free(g, now, out)
        return out

    def cancel(self, requests: list[Request], now: int) -> list[Action]:
        for r in requests:
            if r.state == QUEUED:  # (one answered stays so)
                if r.model in self.profiles and self._unqueue(r.model, r):
                    self._attempts.pop(r.id, None)
                    self._answer(r, RequestStatus.ERROR, now, CANCELLED)
            elif r.state == EXECUTING:  # runs on; should its INFER fail, not again
                r.state = WITHDRAWN
        return []

    def answer_queued(self, now: int, why: str) -> list[Action]:
        for name in sorted(self.serving):
            self._answer_all(name, RequestStatus.ERROR, now, why)
        return []

    def arrived_earlier(self, requests: list[Request], by: int, now: int) -> list[Action]:
        moved: dict[str, list[Request]] = {}
        for r in requests:
            if r.state == QUEUED and r.model in self.profiles:
                r.arrival -= by
                r.deadline -= by
                moved.setdefault(r.model, []).append(r)
        for name in sorted(moved):
            self._moved(name, moved[name], now)
        return []

    def on_tick(self, now: int) -> list[Action]:
        out: list[Action] = []
        t = self._timers
        fired = False
        while t and t[0] <= now:
            self._timer_set.discard(heapq.heappop(t))
            fired = True
        if fired:
            self._tick(now, out)
        return out

    def next_wakeup(self) -> int | None:
        return self._timers[0] if self._timers else None

    def drain_replies(self) -> list[Reply]:
        out, self._replies = self._replies, []
        return out

    # ------------------------------------------------------------------ models coming and going

    def add_model(self, name: str, profile: ModelProfile, now: int) -> list[Action]:
        if name in self.profiles:
            raise ValueError(f"model {name!r} is already known"
                             + (" (its copies are being evicted)" if name in self._removing else ""))
        if profile.model != name:
            profile = profile.renamed(name)
        self.profiles[name] = profile
        self.sizes[name] = self._sizes(profile)
        self.copies[name] = {}
        self._added(name)
        self.serving.add(name)
        return []  # loaded on demand, like any model without a copy

    def remove_model(self, name: str, now: int) -> list[Action]:
        if name not in self.serving:
            raise KeyError(name)
        out: list[Action] = []
        self.serving.discard(name)
        self._removing.add(name)
        self._refused.pop(name, None)  # (the name added again starts afresh)
        for k in [k for k in self._refused_on if k[0] == name]:
            del self._refused_on[k]
        self._answer_all(name, RequestStatus.INVALID_REQUEST, now, MODEL_UNLOADED)
        freed = {c.gpu.index: c.gpu for c in self.copies[name].values()}
        self._sweep(now, out)
        for g in freed.values():  # pages freed: the policy may place waiting work
            self._gpu_free(g, now, out)
        return out

    def _sweep(self, now: int, out: list[Action]) -> None:
        """EVICT the idle copies of removed models; forget a model whose copies are gone."""
        for name in sorted(self._removing):
            copies = self.copies[name]
            for c in list(copies.values()):
                if not c.loading and not c.inflight and c.gpu.copies.get(name) is c:
                    self._send_evict(c, now, out)
            if not copies:
                self._removing.discard(name)
                self._forget(name)
                del self.profiles[name], self.sizes[name], self.copies[name]

    # ------------------------------------------------------------------ helpers

    def _serves(self, c: Copy) -> bool:
        """Whether ``c``'s model is still served: not removed since ``c`` was made (its
        state may even be forgotten already, or the name added again, while an INFER
        sent to ``c`` was still out)."""
        return c.model in self.serving and self.copies.get(c.model) is c.group

    def _wake(self, t: int) -> None:
        if t not in self._timer_set:
            self._timer_set.add(t)
            heapq.heappush(self._timers, t)

    def _answer(self, r: Request, status: RequestStatus, now: int, message: str = "",
                gpu: int = -1, batch_size: int = 0, outputs: object = None) -> None:
        if r.state == DONE:
            raise AssertionError(f"request {r.id} answered twice")
        r.state = DONE
        self._replies.append(Reply(r, status, now, message, gpu, batch_size, outputs))

    def _padded(self, model: str, n: int) -> int:
        """The compiled batch size that holds ``n`` requests (``n`` <= the largest)."""
        for b in self.sizes[model]:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds {model}'s largest batch size")

    def _send_infer(self, c: Copy, batch: list[Request], now: int, out: list[Action]) -> Action:
        g = c.gpu
        b = self._padded(c.model, len(batch))
        e = self.profiles[c.model].exec_ns[b]
        aid = self._sent.new_id()
        g.exec_end = (g.exec_end if g.exec_end > now else now) + e
        a = Action(aid, ActionType.INFER, g.worker, g.gpu, c.model, AT_ONCE, NEVER, e,
                   batch_size=b, expected_end=g.exec_end, sent_at=now, requests=batch)
        for r in batch:
            r.state = EXECUTING
        c.inflight += 1
        g.outstanding += 1
        self._use_seq += 1
        c.last_used = self._use_seq
        self._sent.add(a, g, c, batch)
        out.append(a)
        return a

    @contextlib.contextmanager
    def _placing(self):
        """A pass over the waiting work that may try LOADs for many models (a GPU freed, a
        timer): a GPU found without room for some pages is not searched again for as many
        or more until a copy is loaded or evicted (each search sorts the GPU's copies: with
        20,000 models waiting for room, tens of milliseconds a pass)."""
        self._no_room = {}
        try:
            yield
        finally:
            self._no_room = None

    def _room_changed(self) -> None:
        """A copy loaded or evicted: what ``_placing`` found of the GPUs' room is stale."""
        if self._no_room:
            self._no_room.clear()

    def _victims(self, g: Gpu, pages: int) -> list[Copy] | None:
        """Least recently used idle copies to evict so ``pages`` fit on ``g``."""
        need = pages - g.free_pages
        if need <= 0:
            return []
        no_room = self._no_room
        if no_room is not None and pages >= no_room.get(g.index, pages + 1):
            return None
        chosen = self._lru_idle(g, need)
        if chosen is None and no_room is not None:
            no_room[g.index] = pages
        return chosen

    def _lru_idle(self, g: Gpu, need: int) -> list[Copy] | None:
        """The least recently used idle copies on ``g`` whose pages add up to ``need``,
        or None if all of them do not."""
        cands = sorted((c for c in g.copies.values()
                        if not c.loading and not c.inflight and self._evictable(c)),
                       key=lambda c: (c.last_used, c.model))
        chosen = []
        for c in cands:
            chosen.append(c)
            need -= c.pages
            if need <= 0:
                return chosen
        return None

    def _load_refused(self, model: str, g: Gpu, result: Result, now: int) -> None:
        """``g``'s worker refused a LOAD of ``model`` for the model itself (a package it
        lacks, a device failing the copy): ``g`` is passed over for it (``_try_load``) for
        ``REFUSED_FOR_NS``, so that another GPU takes it at once (it was offered the same
        GPU again at once, thousands of times a second, its requests never answered).
        When no GPU that could hold it is left and no copy of it is loaded, its queued
        requests, and those arriving until then, are answered ERROR with the worker's
        reason."""
        refused = self._refused_on
        if len(refused) > 4 * len(self.gpus) + 64:
            for k in [k for k, until in refused.items() if until <= now]:
                del refused[k]
        refused[(model, g.index)] = now + REFUSED_FOR_NS
        if any(not c.loading for c in self.copies[model].values()) or any(
                self._may_load(model, h, now) for h in self.in_service):
            return
        why = error_message(result)
        self._refused[model] = (now + REFUSED_FOR_NS, why)
        self._answer_all(model, RequestStatus.ERROR, now, why)

    def _faulted(self, c: Copy, now: int, out: list[Action]) -> None:
        """An INFER on copy ``c`` failed on its device (``COPY_FAULTED``): failing at
        once, it would stay the copy free first and take every retry, each request failing
        ``MAX_ATTEMPTS`` times there while another GPU could serve it. The copy is EVICTed
        (its INFERs still out there fail then, and are retried as for a copy gone) and its
        GPU passed over for the model for ``REFUSED_FOR_NS`` (``_try_load``), so that the
        policy places the model elsewhere (``_lost``) -- when there is an elsewhere:
        another copy loaded, or another GPU that may take one. Else the copy stays and the
        requests are tried on it again, up to ``MAX_ATTEMPTS`` (evicted, the model's
        queue waited for the pass-over to end, with no timer to end it)."""
        g = c.gpu
        if c.loading or not (
                any(o is not c and not o.loading for o in self.copies[c.model].values())
                or any(h is not g and self._may_load(c.model, h, now)
                       for h in self.in_service)):
            return
        self._refused_on[(c.model, g.index)] = now + REFUSED_FOR_NS
        self._send_evict(c, now, out)
        self._lost(c.model, g, now, out)

    def _may_load(self, model: str, g: Gpu, now: int) -> bool:
        """Whether ``g`` could take a copy of ``model``: up, without one, big enough, and
        not one that refused it lately."""
        return (g.up and model not in g.copies and self.profiles[model].weights_pages <= g.total_pages
                and self._refused_on.get((model, g.index), 0) <= now)

    def _try_load(self, model: str, gpus: Iterable[Gpu], now: int, out: list[Action]) -> Copy | None:
        """LOAD ``model`` on the first of ``gpus`` where it fits (evicting LRU idle copies)."""
        pages = self.profiles[model].weights_pages
        refused = self._refused_on
        for g in gpus:
            if not g.up or model in g.copies or pages > g.total_pages:
                continue
            if refused and refused.get((model, g.index), 0) > now:
                continue  # it refused this model lately (_load_refused)
            victims = self._victims(g, pages)
            if victims is None:
                continue
            for v in victims:
                self._send_evict(v, now, out)
            return self._send_load(g, model, now, out)
        return None

    def _send_load(self, g: Gpu, model: str, now: int, out: list[Action]) -> Copy:
        self._room_changed()
        p = self.profiles[model]
        aid = self._sent.new_id()
        g.load_end = (g.load_end if g.load_end > now else now) + p.load_ns
        a = Action(aid, ActionType.LOAD, g.worker, g.gpu, model, AT_ONCE, NEVER, p.load_ns,
                   expected_end=g.load_end, sent_at=now)
        c = Copy(model, g, p.weights_pages, self.copies[model])
        self._use_seq += 1
        c.last_used = self._use_seq
        g.copies[model] = c
        g.free_pages -= p.weights_pages
        g.loads += 1
        self.copies[model][g.index] = c
        self._sent.add(a, g, c, [])
        out.append(a)
        return c

    def _send_evict(self, c: Copy, now: int, out: list[Action]) -> None:
        g = c.gpu
        aid = self._sent.new_id()
        a = Action(aid, ActionType.EVICT, g.worker, g.gpu, c.model, AT_ONCE, NEVER, 0,
                   expected_end=now, sent_at=now)
        self._drop(c)
        self._sent.add(a, g, c, [])
        out.append(a)

    def _drop(self, c: Copy) -> None:
        self._room_changed()
        g = c.gpu
        del g.copies[c.model]
        del self.copies[c.model][g.index]
        g.free_pages += c.pages

    # ------------------------------------------------------------------ GPUs coming and going

    def add_gpu(self, spec: GpuSpec, now: int) -> list[Action]:
        """A new, empty GPU: used at once as when a GPU frees up (``_gpu_free``), so work
        waiting for a GPU (a model left without a copy when every GPU was lost) goes there;
        later copies are placed on it by the policy's rules as demand asks."""
        g = Gpu(len(self.gpus), spec)
        self.gpus.append(g)
        self.in_service.append(g)
        self._fit_pages = max(self._fit_pages, g.total_pages)
        self._gpu_added(g)
        self._may_take_refused(g, now)
        out: list[Action] = []
        self._gpu_free(g, now, out)
        if len(self.in_service) < len(self.gpus):  # (work queued while every GPU was
            # removed: this one may not fit)
            self._answer_unfit(self.serving, now)
        return out

    def _gpu_added(self, g: Gpu) -> None:
        """Hook: per-GPU state of a subclass for a GPU added at run time."""

    def _may_take_refused(self, g: Gpu, now: int) -> None:
        """``g`` joined or came back: the models every GPU refused that ``g`` may take are
        tried again (their requests were answered ERROR until ``REFUSED_FOR_NS`` ran
        out); one too big for it stays refused."""
        for model in [m for m in self._refused if self._may_load(m, g, now)]:
            del self._refused[model]

    def fits_somewhere(self, model: str) -> bool:
        """Whether a GPU not removed for good is large enough for ``model``'s weights."""
        return self.profiles[model].weights_pages <= self._fit_pages

    def remove_gpu(self, gpu_index: int, now: int) -> list[Action]:
        """As lost, for good: the requests queued for a model no other GPU can hold are
        answered so at once (none could ever serve them), with ``NO_GPU_LEFT`` when no
        GPU is left (they waited out their SLO)."""
        self.in_service = [g for g in self.in_service if g.index != gpu_index]
        self._fit_pages = max((g.total_pages for g in self.in_service), default=0)
        out = self.set_gpu_available(gpu_index, False, now)
        self._answer_unfit(self.serving, now)
        return out

    def _answer_all(self, model: str, status: RequestStatus, now: int, why: str) -> None:
        """Answer every request queued for ``model`` (``status``, ``why``), oldest first."""
        for r in self._take_queued(model):
            self._attempts.pop(r.id, None)
            self._answer(r, status, now, why)

    def _answer_unfit(self, models, now: int) -> None:
        """Answer every request queued for each of ``models`` (served) that no GPU left
        can hold (the baselines keep a request until it is served: these would wait for
        ever)."""
        why = NO_GPU_FITS if self.in_service else NO_GPU_LEFT
        for name in [n for n in models if n in self.serving and not self.fits_somewhere(n)]:
            self._answer_all(name, RequestStatus.ERROR, now, why)

    def set_gpu_available(self, gpu_index: int, available: bool, now: int) -> list[Action]:
        """Lost (False): every copy on the GPU is forgotten, each as a lost copy is
        (``_drop``, then ``_lost``: the policy re-places queued work of a model left
        without a copy elsewhere, by its rules), and nothing is placed there until it is
        back (``Gpu.up``). Its actions in flight are failed back by the shell through
        ``on_result``, which retries their requests elsewhere. Back (True): an empty GPU,
        used again as when a GPU frees up (``_gpu_free``). The baselines keep no weights
        through a loss (``held_copies`` is empty), so ``readmit_gpu`` comes here."""
        g = self.gpus[gpu_index]
        out: list[Action] = []
        if g.up == available:
            return out
        g.up = available
        if available:  # back, empty: it forgets what it refused, and may take those
            # every GPU refused
            for k in [k for k in self._refused_on if k[1] == gpu_index]:
                del self._refused_on[k]
            self._may_take_refused(g, now)
        else:
            g.exec_end = g.load_end = 0  # (its work failed back: nothing queued there)
            for name in sorted(g.copies):
                self._drop(g.copies[name])
                self._lost(name, g, now, out)
            if self._removing:
                self._sweep(now, out)
        self._gpu_free(g, now, out)
        return out

    # ------------------------------------------------------------------ read-only views

    def pages_used(self, gpu_index: int) -> int:
        """Pages of the GPU's weights cache taken in our view (LOADs sent count)."""
        g = self.gpus[gpu_index]
        return g.total_pages - g.free_pages

    def queued(self) -> int:
        return sum(self._waiting(n) for n in self.serving)

    def model_view(self, model: str) -> ModelView | None:
        if model not in self.profiles:
            return None
        copies = self.copies[model]
        on = tuple(sorted(copies))
        removing = model in self._removing
        return ModelView(on, tuple(i for i in on if copies[i].loading),
                         0 if removing else self._waiting(model), removing)

    def stats(self) -> dict[str, int]:
        return self._sent.counts()
