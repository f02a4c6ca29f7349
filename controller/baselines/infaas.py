"""INFaaS-style serving (Romero et al., "INFaaS: Automated Model-less Inference
Serving", USENIX ATC 2021), behind the Policy interface.

INFaaS picks a model variant per query from the user's latency/accuracy needs, routes
the query to a worker that hosts the variant (loading it if none does), and lets each
worker's model-autoscaler react to load: replicate a variant that is overloaded,
remove replicas that load no longer needs, and evict least-recently-used variants
when memory is needed. GPU variants batch dynamically up to the largest profiled
batch size that meets the latency target. It predicts nothing about execution start
times and drops nothing. Here every model has one variant (its profile), so variant
selection reduces to choosing the batch size.

Modelled, at the granularity of our actions:

* **Batch size from the profile and the SLO:** ``b_max`` = the largest compiled batch
  size (within ``max_batch``) whose profiled EXEC time is at most
  ``batch_slo_fraction`` (default 0.5) of the request's SLO (at least the smallest
  size); INFaaS's profiled-variant choice, with half the SLO left for queueing.
* **Routing:** a request goes to the copy of its model with the shortest queue
  (loaded copies before loading ones), skipping copies being scaled down.
* **Dynamic batching on the worker (Triton-like, no queue delay):** whenever a GPU has
  fewer than ``inflight_per_gpu`` (default 2) INFERs outstanding, the copy on it with
  the oldest queued request sends up to ``b_max`` of its queued requests.
* **Cold start:** a request for a model with no copy starts a LOAD on the GPU with
  the lowest estimated utilisation where it fits (evicting least-recently-used idle
  copies with empty queues); its requests wait for the LOAD.
* **Autoscaling** every ``monitor_interval_ms`` (default 1000): per model, the arrival
  rate λ over the interval gives its load L = λ · EXEC(b_max) / b_max (GPU-seconds per
  second at its batch size); a GPU's utilisation is the sum of L / copies of the models
  it holds. *Scale up* (replicate) when L / copies > ``scale_up_util`` (0.8) or any GPU
  holding the model is over ``scale_up_util``: add a copy on the least-utilised GPU
  without one, if that GPU is below ``scale_up_util``. *Scale down* one copy when
  L <= ``scale_down_util`` (0.3) · (copies − 1) for ``scale_down_intervals`` (3)
  intervals in a row: the copy stops taking new requests and is evicted once its queue
  is empty and nothing runs on it. The last copy stays until memory forces an LRU
  eviction.
* **No execution-window control or SLO-aware dropping:** actions carry
  ``earliest = 0`` (at once), ``latest = NEVER``; requests run however late.

Not modelled: variant selection across architectures/frameworks/hardware (CPU
variants, "upgrade" to a faster variant), accuracy requirements, the VM-level
autoscaler (the cluster is fixed), the metadata store and its monitoring delays,
INFaaS's model-profiler.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import ClassVar

from pydantic import model_validator
from pydantic.dataclasses import dataclass

from clockwork.actions import Action, RequestStatus
from clockwork.requests import QUEUED, Request
from clockwork.settings import CONFIG, setting
from controller.baselines.common import BaselinePolicy, Copy, Gpu, parse_settings
from controller.policy import NO_GPU_FITS


@dataclass(frozen=True, slots=True, config=CONFIG)
class InfaasConfig:
    """The infaas policy's own ``[scheduler]`` settings."""

    settings_name: ClassVar[str] = "infaas"

    monitor_interval: int = setting(
        1_000_000_000, "Time between autoscaler decisions.", units=("ms",),
        ge=1_000_000)  # at least 1 ms: a shorter tick only spins the simulator
    batch_slo_fraction: float = setting(
        0.5, "A request's batch size is the largest whose profiled EXEC is at most this "
        "fraction of its SLO.", gt=0, le=1)
    scale_up_util: float = setting(
        0.8, "Add a copy of a model when its load per copy, or the utilisation of a GPU "
        "holding it, exceeds this (and a GPU below it has room).", gt=0)
    scale_down_util: float = setting(
        0.3, "Remove a copy when the model's load would stay at most this per copy "
        "without it; must be below `scale_up_util`.", ge=0)
    scale_down_intervals: int = setting(
        3, "Consecutive monitor intervals the scale-down condition must hold.", ge=1)
    inflight_per_gpu: int = setting(
        2, "INFERs a GPU may have outstanding; the copy on it with the oldest queued "
        "request sends a batch when fewer are.", ge=1)

    @model_validator(mode="after")
    def _utils_ordered(self) -> InfaasConfig:
        if not self.scale_down_util < self.scale_up_util:
            raise ValueError(f"scale_down_util must be below scale_up_util, got "
                             f"{self.scale_down_util:g} and {self.scale_up_util:g}")
        return self

    @classmethod
    def from_settings(cls, settings=None) -> InfaasConfig:
        return parse_settings(cls, settings, "infaas")


class _Replica:
    __slots__ = ("copy", "queue", "draining")

    def __init__(self, copy: Copy) -> None:
        self.copy = copy
        self.queue: deque[Request] = deque()
        self.draining = False


class _Model:
    __slots__ = ("name", "pending", "arrivals", "load", "low", "slo")

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: deque[Request] = deque()  # no copy could be placed yet
        self.arrivals = 0  # in the current monitoring interval
        self.load = 0.0  # GPU-seconds per second, from the last interval
        self.low = 0  # consecutive intervals with load for fewer copies
        self.slo = 0  # SLO of the last request (sets b_max)


class InfaasPolicy(BaselinePolicy):
    name = "infaas"

    def __init__(self, profiles, gpus, config=None, settings=None) -> None:
        super().__init__(profiles, gpus, config)
        self.icfg = settings if isinstance(settings, InfaasConfig) else InfaasConfig.from_settings(settings)
        self.models = {n: _Model(n) for n in self.profiles}
        self._monitor_at = 0  # next autoscaler decision (0: not started)
        self._unplaced: set[str] = set()
        # while _gpu_free places waiting requests: each GPU's gpu_util, kept until a copy
        # is loaded or evicted (a walk over the GPU's copies per GPU per request otherwise:
        # 47 ms a finished action with 20,000 models waiting for room)
        self._utils: dict[int, float] | None = None

    # ------------------------------------------------------------------ rules

    def b_max(self, model: str, slo: int) -> int:
        """The largest batch size whose profiled EXEC meets the batching share of the SLO."""
        sizes = self.sizes[model]
        ex = self.profiles[model].exec_ns
        budget = slo * self.icfg.batch_slo_fraction
        ok = [b for b in sizes if ex[b] <= budget]
        return ok[-1] if ok else sizes[0]

    def model_load(self, model: str, rate: float) -> float:
        """GPU-seconds per second that ``rate`` requests/s of ``model`` need."""
        m = self.models[model]
        b = self.b_max(model, m.slo or self.cfg.default_slo)
        return rate * self.profiles[model].exec_ns[b] / b / 1e9

    def gpu_util(self, g: Gpu) -> float:
        kept = self._utils
        if kept is not None and g.index in kept:
            return kept[g.index]
        total = 0.0
        for name in g.copies:
            n = len(self.copies[name])
            total += self.models[name].load / n
        if kept is not None:
            kept[g.index] = total
        return total

    def _route(self, r: Request, now: int, out: list[Action]) -> None:
        copies = [c for c in self.copies[r.model].values() if not c.data.draining]
        if not copies:
            copies = [c for c in self.copies[r.model].values()]
        if not copies:
            c = self._cold_load(r.model, now, out)
            if c is None:
                self.models[r.model].pending.append(r)
                self._unplaced.add(r.model)
                return
            copies = [c]
        best = min(copies, key=lambda c: (c.loading, len(c.data.queue), c.gpu.index))
        best.data.queue.append(r)
        if not best.loading:
            self._schedule(best.gpu, now, out)

    def _cold_load(self, model: str, now: int, out: list[Action], exclude=()) -> Copy | None:
        gpus = sorted((g for g in self.in_service if g not in exclude),
                      key=lambda g: (self.gpu_util(g), -g.free_pages, g.index))
        c = self._try_load(model, gpus, now, out)
        if c is not None:
            c.data = _Replica(c)
        return c

    @contextlib.contextmanager
    def _placing(self):
        """As ``BaselinePolicy._placing``, each GPU's ``gpu_util`` kept for the pass too."""
        self._utils = {}
        try:
            with super()._placing():
                yield
        finally:
            self._utils = None

    def _room_changed(self) -> None:
        super()._room_changed()
        if self._utils:
            self._utils.clear()

    def _schedule(self, g: Gpu, now: int, out: list[Action]) -> None:
        """Triton-like dynamic batching: the oldest queued request's copy runs next."""
        while g.outstanding < self.icfg.inflight_per_gpu:
            best = None
            for c in g.copies.values():
                if c.loading or not c.data.queue:
                    continue
                head = c.data.queue[0]
                if best is None or (head.arrival, head.id) < best[0]:
                    best = ((head.arrival, head.id), c)
            if best is None:
                return
            c = best[1]
            q = c.data.queue
            b = self.b_max(c.model, q[0].slo)
            batch = [q.popleft() for _ in range(min(b, len(q)))]
            self._send_infer(c, batch, now, out)

    def autoscale(self, now: int, out: list[Action]) -> None:
        """The model-autoscaler's periodic decision."""
        cfg = self.icfg
        secs = cfg.monitor_interval / 1e9
        for m in self.models.values():
            m.load = self.model_load(m.name, m.arrivals / secs)
            m.arrivals = 0
        for name in sorted(self.models):
            if name not in self.serving:
                continue  # removed: its copies go as they become idle
            m = self.models[name]
            copies = self.copies[name]
            live = [c for c in copies.values() if not c.data.draining]
            if not live:
                m.low = 0
                continue
            n = len(live)
            hot = m.load / n > cfg.scale_up_util or any(
                self.gpu_util(c.gpu) > cfg.scale_up_util for c in live)
            if hot:
                m.low = 0
                cands = [g for g in self.in_service if name not in g.copies
                         and self.gpu_util(g) < cfg.scale_up_util]
                cands.sort(key=lambda g: (self.gpu_util(g), -g.free_pages, g.index))
                c = self._try_load(name, cands, now, out)
                if c is not None:
                    c.data = _Replica(c)
                continue
            if n > 1 and m.load <= cfg.scale_down_util * (n - 1):
                m.low += 1
                if m.low >= cfg.scale_down_intervals:
                    m.low = 0
                    victim = max(live, key=lambda c: (self.gpu_util(c.gpu), c.gpu.index))
                    victim.data.draining = True
                    self._retire(victim, now, out)
            else:
                m.low = 0

    def _retire(self, c: Copy, now: int, out: list[Action]) -> None:
        """Evict a draining copy once nothing is queued or running on it."""
        if c.data.draining and not c.loading and not c.inflight and not c.data.queue \
                and c.gpu.copies.get(c.model) is c:
            self._send_evict(c, now, out)

    # ------------------------------------------------------------------ hooks

    def _added(self, model: str) -> None:
        self.models[model] = _Model(model)

    def _take_queued(self, model: str) -> list[Request]:
        m = self.models[model]
        out = list(m.pending)
        m.pending.clear()
        for c in self.copies[model].values():
            if c.data is not None:
                out.extend(c.data.queue)
                c.data.queue.clear()
        self._unplaced.discard(model)
        out.sort(key=lambda r: (r.arrival, r.id))
        return out

    def _forget(self, model: str) -> None:
        del self.models[model]

    def _unqueue(self, model: str, r: Request) -> bool:
        queues = [self.models[model].pending] + [
            c.data.queue for c in self.copies[model].values() if c.data is not None]
        for q in queues:
            if r in q:
                q.remove(r)
                return True
        return False

    def _admit(self, r: Request, now: int, out: list[Action]) -> None:
        if not self.fits_somewhere(r.model):
            self._answer(r, RequestStatus.ERROR, now, NO_GPU_FITS)
            return
        m = self.models[r.model]
        m.arrivals += 1
        m.slo = r.slo
        if not self._monitor_at:
            self._monitor_at = now + self.icfg.monitor_interval
            self._wake(self._monitor_at)
        self._route(r, now, out)

    def _requeue(self, model: str, requests: list[Request], now: int, out: list[Action]) -> None:
        for r in requests:
            r.state = QUEUED
            self._route(r, now, out)

    def _ready(self, copy: Copy, now: int, out: list[Action]) -> None:
        self._schedule(copy.gpu, now, out)

    def _lost(self, model: str, gpu: Gpu, now: int, out: list[Action]) -> None:
        pass  # the copy's queue is re-routed in _drop

    def _drop(self, c: Copy) -> None:
        super()._drop(c)
        if c.data is not None and c.data.queue:
            m = self.models[c.model]
            m.pending.extendleft(reversed(c.data.queue))
            c.data.queue.clear()
            self._unplaced.add(c.model)

    def _gpu_free(self, gpu: Gpu, now: int, out: list[Action]) -> None:
        for c in list(gpu.copies.values()):
            if c.data.draining:
                self._retire(c, now, out)
        if self._unplaced:
            with self._placing():
                for name in sorted(self._unplaced):
                    m = self.models[name]
                    self._unplaced.discard(name)
                    pending, m.pending = m.pending, deque()
                    for r in pending:
                        self._route(r, now, out)
        self._schedule(gpu, now, out)

    def _tick(self, now: int, out: list[Action]) -> None:
        if self._monitor_at and now >= self._monitor_at:
            self.autoscale(now, out)
            busy = any(self.models[n].arrivals or self.copies[n] for n in self.models)
            self._monitor_at = now + self.icfg.monitor_interval if busy else 0
            if self._monitor_at:
                self._wake(self._monitor_at)

    def _evictable(self, copy: Copy) -> bool:
        return not copy.data.queue

    def _waiting(self, model: str) -> int:
        # requests routed to a copy, and those waiting for one to be placed
        return len(self.models[model].pending) + sum(
            len(c.data.queue) for c in self.copies[model].values() if c.data is not None)
