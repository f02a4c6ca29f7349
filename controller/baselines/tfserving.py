"""TensorFlow-Serving-style serving (Olston et al., 2017, and its batching guide),
behind the Policy interface.

Modelled:

* **A batching queue per servable version** (one version per model here) with
  ``max_batch_size`` (default: the largest compiled size within ``max_batch``) and
  ``batch_timeout_us`` (default 2000 µs). Requests join the queue's open batch; a full
  batch closes and joins the queue's closed batches (at most ``max_enqueued_batches``,
  default 100; a request that finds the queue full is answered ERROR, like
  TF-Serving's UNAVAILABLE "queue is full"). The open batch may be taken once its
  oldest request has waited the timeout, but only by a GPU free to run it: while the
  GPU is busy it keeps growing, to a full batch under load (TF-Serving's shared batch
  scheduler: an open batch becomes schedulable after the timeout and is closed by the
  batch thread that takes it). A batch is padded to the next compiled size
  (``allowed_batch_sizes``).
* **Queues scheduled round-robin onto the shared GPU** (the shared batch scheduler):
  whenever the GPU has fewer than ``inflight_per_gpu`` (default 2) INFERs outstanding,
  the next queue in round-robin order with a schedulable batch (its oldest closed one,
  else its open one once timed out) sends it. EXEC runs one at a
  time on the worker; two outstanding keep it busy across the network round trip.
* **Load / unload on demand with separate load and inference threads.** A request for
  a model that is not loaded starts a LOAD (the worker's LOAD lane is separate from its
  EXEC lane, so loads do not stall inference); its batches wait for the LOAD. When
  pages are short, least-recently-used models with no queued or running batches are
  unloaded first (resource-preserving: the unload is sent before the load). With
  several GPUs, each GPU is one model server; a model is loaded on the GPU with the
  most free pages (fewest models on a tie) and is served there until unloaded.
* **No SLO awareness:** batches run however late; nothing is dropped. Actions carry
  ``earliest = 0`` (at once), ``latest = NEVER``.

Not modelled: the AspiredVersions lifecycle (sources, canary/rollback version policies),
several versions of a model, ``num_batch_threads`` beyond the outstanding-INFER limit,
batch splitting for large requests, RPC and TensorFlow session overheads.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from pydantic.dataclasses import dataclass

from clockwork.actions import Action, RequestStatus
from clockwork.requests import QUEUED, Request
from clockwork.settings import CONFIG, setting
from controller.baselines.common import BaselinePolicy, Copy, Gpu, parse_settings
from controller.policy import NO_GPU_FITS, QUEUE_FULL


@dataclass(frozen=True, slots=True, config=CONFIG)
class TfServingConfig:
    """The tfserving policy's own ``[scheduler]`` settings."""

    settings_name: ClassVar[str] = "tfserving"

    max_batch_size: int = setting(
        0, "Requests per batch (a batch is padded to the next compiled size), at most "
        "each model's largest compiled batch size within `max_batch` (a larger figure "
        "is that size); 0: that size.", ge=0)
    batch_timeout: int = setting(
        2_000_000, "An open batch may be taken by a free GPU once its oldest request has "
        "waited this long (a full one closes at once); it grows while the GPU is busy. 0: "
        "it may be taken at once.", units=("us", "ms"), ge=0)
    max_enqueued_batches: int = setting(
        100, "Closed batches a model's queue holds; a request that finds it full is "
        "answered ERROR.", ge=1)
    inflight_per_gpu: int = setting(
        2, "INFERs a GPU may have outstanding; the next batch (round-robin over the "
        "queues) is sent when fewer are.", ge=1)

    @classmethod
    def from_settings(cls, settings=None) -> TfServingConfig:
        return parse_settings(cls, settings, "tfserving")


class _Queue:
    __slots__ = ("name", "max_batch", "open", "opened", "closed")

    def __init__(self, name: str, max_batch: int) -> None:
        self.name = name
        self.max_batch = max_batch
        self.open: list[Request] = []
        self.opened = 0  # arrival of the open batch's first request
        self.closed: deque[list[Request]] = deque()

    def empty(self) -> bool:
        return not self.open and not self.closed


class TfServingPolicy(BaselinePolicy):
    name = "tfserving"
    places_once = True  # (a model stays where it was loaded until evicted)

    def __init__(self, profiles, gpus, config=None, settings=None) -> None:
        super().__init__(profiles, gpus, config)
        self.tcfg = t = settings if isinstance(settings, TfServingConfig) \
            else TfServingConfig.from_settings(settings)
        self.queues: dict[str, _Queue] = {}
        for n in self.profiles:
            cap = self.sizes[n][-1]
            self.queues[n] = _Queue(n, min(t.max_batch_size, cap) if t.max_batch_size else cap)
        self.rr: list[deque[str]] = [deque() for _ in self.gpus]  # ready models per GPU
        self._unplaced: set[str] = set()

    # ------------------------------------------------------------------ hooks

    def _added(self, model: str) -> None:
        cap = self.sizes[model][-1]
        t = self.tcfg
        self.queues[model] = _Queue(model, min(t.max_batch_size, cap) if t.max_batch_size else cap)

    def _gpu_added(self, g: Gpu) -> None:
        self.rr.append(deque())

    def _take_queued(self, model: str) -> list[Request]:
        q = self.queues[model]
        out = [r for b in q.closed for r in b] + q.open
        q.closed.clear()
        q.open = []
        self._unplaced.discard(model)
        return out

    def _forget(self, model: str) -> None:
        del self.queues[model]

    def _unqueue(self, model: str, r: Request) -> bool:
        q = self.queues[model]
        if r in q.open:
            q.open.remove(r)
            return True
        for i, b in enumerate(q.closed):
            if r in b:
                b.remove(r)
                if not b:
                    del q.closed[i]
                return True
        return False

    def _admit(self, r: Request, now: int, out: list[Action]) -> None:
        q = self.queues[r.model]
        if not self.fits_somewhere(r.model):
            self._answer(r, RequestStatus.ERROR, now, NO_GPU_FITS)
            return
        if len(q.open) >= q.max_batch:
            self._close(q)
        if len(q.open) >= q.max_batch or (not q.open and len(q.closed) >= self.tcfg.max_enqueued_batches):
            self._answer(r, RequestStatus.ERROR, now, QUEUE_FULL)
            return
        if not q.open:
            q.opened = now
            if self.tcfg.batch_timeout:
                self._wake(now + self.tcfg.batch_timeout)
        q.open.append(r)
        if len(q.open) >= q.max_batch:
            self._close(q)
        self._serve(q, now, out)

    def _open_due(self, q: _Queue, now: int) -> bool:
        """Whether ``q``'s open batch may be taken now: it holds requests, the oldest of
        which has waited the timeout."""
        return bool(q.open) and q.opened + self.tcfg.batch_timeout <= now

    def _close(self, q: _Queue) -> None:
        """The open batch is full: it joins the closed ones."""
        if q.open and len(q.closed) < self.tcfg.max_enqueued_batches:
            q.closed.append(q.open)
            q.open = []

    def _requeue(self, model: str, requests: list[Request], now: int, out: list[Action]) -> None:
        q = self.queues[model]
        for r in requests:
            r.state = QUEUED
        q.closed.appendleft(requests)
        self._serve(q, now, out)

    def _ready(self, copy: Copy, now: int, out: list[Action]) -> None:
        self.rr[copy.gpu.index].append(copy.model)
        self._schedule(copy.gpu, now, out)

    def _lost(self, model: str, gpu: Gpu, now: int, out: list[Action]) -> None:
        self._serve(self.queues[model], now, out)

    def _gpu_free(self, gpu: Gpu, now: int, out: list[Action]) -> None:
        self._schedule(gpu, now, out)
        if self._unplaced:
            with self._placing():
                for name in sorted(self._unplaced):
                    self._serve(self.queues[name], now, out)

    def _tick(self, now: int, out: list[Action]) -> None:
        with self._placing():
            for q in self.queues.values():
                if not q.open:  # (most, with many models: nothing to look at)
                    continue
                if self._open_due(q, now):
                    self._serve(q, now, out)  # schedulable now (taken if a GPU is free)
                else:
                    self._wake(q.opened + self.tcfg.batch_timeout)

    def _evictable(self, copy: Copy) -> bool:
        return self.queues[copy.model].empty()

    def _waiting(self, model: str) -> int:
        q = self.queues[model]
        return len(q.open) + sum(len(b) for b in q.closed)

    def _drop(self, c: Copy) -> None:
        super()._drop(c)
        ring = self.rr[c.gpu.index]
        if c.model in ring:
            ring.remove(c.model)

    # ------------------------------------------------------------------ rules

    def _serve(self, q: _Queue, now: int, out: list[Action]) -> None:
        """Make sure a model with queued work is loaded somewhere, then run its GPU."""
        copies = self.copies[q.name]
        if not copies:
            if q.empty():
                self._unplaced.discard(q.name)
                return
            gpus = sorted(self.in_service, key=lambda g: (-g.free_pages, len(g.copies), g.index))
            if self._try_load(q.name, gpus, now, out) is None:
                self._unplaced.add(q.name)
                return
            self._unplaced.discard(q.name)
            return
        self._unplaced.discard(q.name)
        if q.closed or self._open_due(q, now):
            for c in list(copies.values()):
                if not c.loading:
                    self._schedule(c.gpu, now, out)

    def _schedule(self, g: Gpu, now: int, out: list[Action]) -> None:
        """Round-robin over the GPU's queues with a schedulable batch: the oldest closed
        one, else the open one once it has waited the timeout (closed as it is taken)."""
        ring = self.rr[g.index]
        while g.outstanding < self.tcfg.inflight_per_gpu and ring:
            for _ in range(len(ring)):
                name = ring[0]
                ring.rotate(-1)
                q = self.queues[name]
                if q.closed:
                    self._send_infer(g.copies[name], q.closed.popleft(), now, out)
                    break
                if self._open_due(q, now):
                    batch, q.open = q.open, []
                    self._send_infer(g.copies[name], batch, now, out)
                    break
            else:
                return
