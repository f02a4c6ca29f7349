"""Clipper-style serving (Crankshaw et al., NSDI 2017), behind the Policy interface.

Modelled (paper §4.3 and the open-source ModelQueue / container loop):

* **One queue per model, containers pull batches from it.** Each model is deployed as
  ``replicas`` containers (default 1), each a copy of its weights on one GPU. A
  container sends one batch and waits for its reply before taking the next (Clipper's
  container RPC loop), so there is at most one INFER per container in flight; the
  containers of different models on a GPU contend in the worker's EXEC lane (FIFO in
  send order). Queues are earliest-deadline first (deadline = arrival + SLO).
* **Adaptive batching by AIMD, per container.** The container's maximum batch size
  grows by ``aimd_step`` (default 1) after every batch whose measured latency (the
  container round trip, send to reply) met the SLO, and shrinks by 10 %
  (``aimd_backoff`` 0.9) after one that did not. It is capped by the largest compiled
  batch size (``max_batch``). A batch is padded up to the next compiled size, and the
  padded slots are filled from the queue (Clipper has no compiled sizes: a batch of 12
  costs 12 there; here it costs 16 either way, so it carries up to 16).
* **Delayed batching** (§4.3.2, like Nagle's algorithm): with ``batch_wait_ms`` > 0 a
  container that is ready while its queue holds fewer requests than its batch size
  waits up to that long for more (from when it became ready, or from its oldest
  request's arrival if the queue was empty then), or until the batch fills.
* **SLOs:** Clipper does not predict whether a request will miss; it runs it. A queued
  request whose deadline passes is answered TIMEOUT then (Clipper's frontend answers it
  with the default output at its deadline) and removed from the queue, as its ModelQueue
  removes such requests (``remove_tasks_with_elapsed_deadlines``); one already in a batch
  runs to the end. ``drop_expired = false`` runs them all. Everything runs with
  ``earliest = 0`` (at once), ``latest = NEVER``.
* **Placement (our choice; Clipper deploys containers statically):** a model's
  containers are started (LOAD) on its first request, each on a GPU without a copy of
  it, fewest containers first, then most free pages. They stay there; only when a LOAD
  does not fit are least-recently-used containers with an empty queue and no batch in
  flight evicted (their model is re-placed on its next request).

Not modelled: model selection (Exp3/Exp4 bandits), ensembles and straggler mitigation,
the prediction cache, container RPC/serialisation costs, quantile-regression batching,
and Clipper's exploration/estimation batch-size modes of later releases. No global
view: a container knows only its own queue and measured latencies.
"""

from __future__ import annotations

import heapq
from typing import ClassVar

from pydantic.dataclasses import dataclass

from clockwork.actions import Action, RequestStatus, Result
from clockwork.requests import QUEUED, Request
from clockwork.settings import CONFIG, setting
from controller.baselines.common import BaselinePolicy, Copy, Gpu, parse_settings
from controller.policy import NO_GPU_FITS

SETTINGS = ("batch_wait_ms", "aimd_step", "aimd_backoff", "initial_batch", "drop_expired",
            "replicas")


@dataclass(frozen=True, slots=True, config=CONFIG)
class ClipperConfig:
    """The clipper policy's own ``[scheduler]`` settings."""

    settings_name: ClassVar[str] = "clipper"

    batch_wait: int = setting(
        0, "Delayed batching: a container ready while its queue holds less than its batch "
        "size waits up to this long for more (from when it became ready, or from its "
        "oldest request's arrival if later; 0: no waiting).",
        units=("ms",), ge=0)
    aimd_step: float = setting(
        1.0, "AIMD additive increase of a container's batch size after a batch that met "
        "the SLO.", gt=0)
    aimd_backoff: float = setting(
        0.9, "AIMD multiplicative decrease of a container's batch size after a batch that "
        "missed the SLO.", gt=0, lt=1)
    initial_batch: float = setting(1.0, "A new container's batch size.", ge=1)
    drop_expired: bool = setting(
        True, "Answer TIMEOUT at its deadline, instead of running it, a request still "
        "queued then.")
    replicas: int = setting(1, "Containers per model, each on a different GPU (so at "
                            "most as many as there are GPUs, and as memory allows).", ge=1)

    @classmethod
    def from_settings(cls, settings=None) -> ClipperConfig:
        return parse_settings(cls, settings, "clipper")


class Container:
    __slots__ = ("copy", "batch_size", "busy", "ready_at")

    def __init__(self, copy: Copy, batch_size: float) -> None:
        self.copy = copy
        self.batch_size = batch_size  # AIMD's current maximum batch size
        self.busy = False  # a batch is in flight
        self.ready_at = 0  # when its last batch's reply came (delayed batching waits from it)


class _Model:
    __slots__ = ("name", "queue", "containers", "seq")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: list[tuple[int, int, Request]] = []  # (deadline, id, request)
        self.containers: list[Container] = []
        self.seq = 0


class ClipperPolicy(BaselinePolicy):
    name = "clipper"
    places_once = True  # (a model's containers stay where they started)

    def __init__(self, profiles, gpus, config=None, settings=None) -> None:
        super().__init__(profiles, gpus, config)
        self.ccfg = settings if isinstance(settings, ClipperConfig) else ClipperConfig.from_settings(settings)
        self.models = {n: _Model(n) for n in self.profiles}
        self._unplaced: set[str] = set()  # models short of containers, with queued work
        self._delayed: set[str] = set()  # models a container waits on (delayed batching)
        # (deadline, request id, model) of the requests queued (drop_expired): each is
        # answered at its deadline if still queued then
        self._deadlines: list[tuple[int, int, str]] = []

    # ------------------------------------------------------------------ hooks

    def _added(self, model: str) -> None:
        self.models[model] = _Model(model)

    def _take_queued(self, model: str) -> list[Request]:
        m = self.models[model]
        out = [e[2] for e in sorted(m.queue)]
        m.queue = []
        self._unplaced.discard(model)
        return out

    def _forget(self, model: str) -> None:
        del self.models[model]

    def _unqueue(self, model: str, r: Request) -> bool:
        q = self.models[model].queue
        for i, e in enumerate(q):
            if e[2] is r:
                q[i] = q[-1]
                q.pop()
                heapq.heapify(q)
                return True
        return False

    def _moved(self, model: str, moved: list[Request], now: int) -> None:
        m = self.models[model]
        m.queue = [(r.deadline, r.id, r) for _, _, r in m.queue]  # (earlier deadlines)
        heapq.heapify(m.queue)
        if self.ccfg.drop_expired:
            for r in moved:
                heapq.heappush(self._deadlines, (r.deadline, r.id, model))
                self._wake(max(now, r.deadline))

    def _admit(self, r: Request, now: int, out: list[Action]) -> None:
        m = self.models[r.model]
        if not self.fits_somewhere(r.model):
            self._answer(r, RequestStatus.ERROR, now, NO_GPU_FITS)
            return
        self._enqueue(m, r)
        if len(m.containers) < self.ccfg.replicas:
            self._place(m, now, out)
        for c in m.containers:
            self._dispatch(m, c, now, out)

    def _enqueue(self, m: _Model, r: Request) -> None:
        heapq.heappush(m.queue, (r.deadline, r.id, r))
        if self.ccfg.drop_expired:
            heapq.heappush(self._deadlines, (r.deadline, r.id, m.name))
            self._wake(r.deadline)

    def _requeue(self, model: str, requests: list[Request], now: int, out: list[Action]) -> None:
        m = self.models[model]
        for r in requests:
            r.state = QUEUED
            self._enqueue(m, r)
        if len(m.containers) < self.ccfg.replicas:
            self._place(m, now, out)
        for c in m.containers:
            self._dispatch(m, c, now, out)

    def _infer_done(self, copy: Copy, action: Action, result: Result, requests: list[Request],
                    now: int, out: list[Action]) -> None:
        c: Container = copy.data
        if not self._serves(copy):
            return  # removed: no more batches
        slo = min(r.slo for r in requests)
        self.aimd(c, now - action.sent_at, slo)

    def aimd(self, c: Container, latency: int, slo: int) -> None:
        """Clipper's AIMD rule for one measured batch latency."""
        cap = self.sizes[c.copy.model][-1]
        if latency <= slo:
            c.batch_size = min(cap, c.batch_size + self.ccfg.aimd_step)
        else:
            c.batch_size = max(1.0, c.batch_size * self.ccfg.aimd_backoff)

    def _ready(self, copy: Copy, now: int, out: list[Action]) -> None:
        self._dispatch(self.models[copy.model], copy.data, now, out)

    def _lost(self, model: str, gpu: Gpu, now: int, out: list[Action]) -> None:
        m = self.models[model]
        m.containers = [c for c in m.containers if c.copy.gpu is not gpu]
        if m.queue:
            self._place(m, now, out)

    def _gpu_free(self, gpu: Gpu, now: int, out: list[Action]) -> None:
        for c in [c.data for c in gpu.copies.values()]:
            self._dispatch(self.models[c.copy.model], c, now, out)
        if self._unplaced:
            for name in sorted(self._unplaced):
                self._place(self.models[name], now, out)

    def _tick(self, now: int, out: list[Action]) -> None:
        dl = self._deadlines
        if dl and dl[0][0] <= now:
            due = set()
            while dl and dl[0][0] <= now:
                due.add(heapq.heappop(dl)[2])
            for name in sorted(due):  # (those since sent or answered: nothing to do)
                m = self.models.get(name)
                if m is not None:
                    self._expire(m, now)
        if self._delayed:
            delayed, self._delayed = self._delayed, set()
            for name in sorted(delayed):
                m = self.models.get(name)
                if m is not None and m.queue:
                    for c in m.containers:
                        self._dispatch(m, c, now, out)

    def _evictable(self, copy: Copy) -> bool:
        return not self.models[copy.model].queue

    def _waiting(self, model: str) -> int:
        return len(self.models[model].queue)

    def _drop(self, c: Copy) -> None:
        super()._drop(c)
        m = self.models[c.model]
        m.containers = [k for k in m.containers if k.copy is not c]

    # ------------------------------------------------------------------ rules

    def _place(self, m: _Model, now: int, out: list[Action]) -> None:
        """Start containers for ``m`` until it has ``replicas`` (where memory allows)."""
        while len(m.containers) < self.ccfg.replicas:
            gpus = sorted((g for g in self.in_service if m.name not in g.copies),
                          key=lambda g: (len(g.copies), -g.free_pages, g.index))
            if not gpus:
                break
            copy = self._try_load(m.name, gpus, now, out)
            if copy is None:
                break
            # capped by the largest compiled size within max_batch, as aimd() caps it
            c = Container(copy, min(self.sizes[m.name][-1], self.ccfg.initial_batch))
            copy.data = c
            m.containers.append(c)
        if m.containers or not m.queue:
            self._unplaced.discard(m.name)
        else:
            self._unplaced.add(m.name)

    def _expire(self, m: _Model, now: int) -> None:
        """The queued requests of ``m`` whose deadline has passed: answered TIMEOUT."""
        q = m.queue
        while q and q[0][0] <= now:
            _, _, r = heapq.heappop(q)
            self._attempts.pop(r.id, None)
            self._answer(r, RequestStatus.TIMEOUT, now, "deadline elapsed in Clipper's queue")

    def _dispatch(self, m: _Model, c: Container, now: int, out: list[Action]) -> None:
        """An idle container takes its next batch from the model's queue."""
        if c.busy and c.copy.inflight:
            return
        if c.busy:
            c.busy = False
            c.ready_at = now
        if c.copy.loading or c.copy.gpu.copies.get(m.name) is not c.copy:
            return
        q = m.queue
        if self.ccfg.drop_expired:
            self._expire(m, now)
        if not q:
            return
        size = int(c.batch_size)
        if len(q) < size and self.ccfg.batch_wait:
            since = max(c.ready_at, min(e[2].arrival for e in q))
            if now < since + self.ccfg.batch_wait:
                self._wake(since + self.ccfg.batch_wait)
                self._delayed.add(m.name)
                return
        # (the padded slots filled: they cost the same run empty)
        n = min(self._padded(m.name, min(size, len(q))), len(q))
        batch = [heapq.heappop(q)[2] for _ in range(n)]
        self._send_infer(c.copy, batch, now, out)
        c.busy = True
