"""The controller's global view: models (queues, estimates, demand) and GPUs
(pages, lanes, which models they hold)."""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappush

from clockwork.actions import NEVER, Result
from clockwork.profiles import ModelProfile
from clockwork.requests import QUEUED, Request
from controller.config import SchedulerConfig, usable_batch_sizes
from controller.estimator import Estimator
from controller.lanes import LaneTracker


class Instance:
    """A model's weights on one GPU (loading or loaded), as the controller believes."""

    __slots__ = ("model", "gpu", "version", "ready_at", "loading", "inflight", "last_used",
                 "seq", "faults", "load_missed")

    def __init__(self, model: ModelState, gpu: GpuState, version: int, ready_at: int) -> None:
        self.model = model
        self.gpu = gpu
        self.version = version
        self.ready_at = ready_at  # predicted until the LOAD result arrives
        self.loading = True
        self.inflight = 0  # INFER actions sent and not answered
        self.last_used = 0
        self.seq = 0  # order of creation (a model's ``instances`` dict is in this order)
        self.faults = 0  # INFERs failed in a row on its device (``COPY_FAULTED``)
        # its LOAD's result when the worker refused it outside its window (``*_TOO_LATE``):
        # the INFERs sent after it then fail for want of its weights, and what they answer
        # is that their SLO could not be met (TIMEOUT), not an error of the cluster
        self.load_missed: Result | None = None


class CopyIndex:
    """A model's copies ordered by when their GPUs' EXEC lanes come free, for a model
    with many copies: ``on_request`` then looks only at the copies that matter instead
    of asking every lane (``ClockworkScheduler`` keeps it; ``LaneTracker.on_change``
    reports every change of a lane).

    Three heaps of (key, copy seq, gpu index); an entry is current while that copy (same
    ``seq``) is still there and its key equals the figure now; stale entries are skipped
    when met. Every copy has a current entry in each heap (``by_due``: while its lane has
    work).

    * ``by_start``: max(lane ``free_at``, copy ``ready_at``); the soonest any copy could
      start is max(now + future, the smallest key), once no lane is overdue;
    * ``by_free``: lane ``free_at``: the copies whose lane is free before a horizon;
    * ``by_due``: lane ``due``: the lanes ``available(now)`` would re-anchor;
    * ``unwoken``: gpu indices of the copies whose GPU has no wake pending.
    """

    __slots__ = ("by_start", "by_free", "by_due", "unwoken")

    def __init__(self) -> None:
        self.by_start: list[tuple[int, int, int]] = []
        self.by_free: list[tuple[int, int, int]] = []
        self.by_due: list[tuple[int, int, int]] = []
        self.unwoken: set[int] = set()

    def push(self, inst: Instance) -> None:
        """Record ``inst``'s current figures."""
        g = inst.gpu
        lane = g.exec
        free = lane._free_at
        ready = inst.ready_at
        seq, gi = inst.seq, g.index
        heappush(self.by_start, (free if free > ready else ready, seq, gi))
        heappush(self.by_free, (free, seq, gi))
        due = lane.due
        if due != NEVER:
            heappush(self.by_due, (due, seq, gi))

    def rebuild(self, instances: dict[int, Instance]) -> None:
        """Drop the stale entries: one current entry per copy and heap."""
        start, free_l, due_l = [], [], []
        for gi, inst in instances.items():
            lane = inst.gpu.exec
            free = lane._free_at
            ready = inst.ready_at
            start.append((free if free > ready else ready, inst.seq, gi))
            free_l.append((free, inst.seq, gi))
            due = lane.due
            if due != NEVER:
                due_l.append((due, inst.seq, gi))
        for h in (start, free_l, due_l):
            heapify(h)
        self.by_start, self.by_free, self.by_due = start, free_l, due_l

    def size(self) -> int:
        return max(len(self.by_start), len(self.by_free), len(self.by_due))


class ModelState:
    """Per model: a FIFO request queue, estimates, demand and where its copies are."""

    __slots__ = ("name", "profile", "est", "queue", "live", "outstanding", "instances",
                 "ready_copies", "versions", "batch_sizes", "pages", "item_cost",
                 "monotone", "last_deadline", "slo_cache", "removed", "wide", "dirty",
                 "big_at", "qver", "memo", "load_refusals", "extra_refusals", "refused_until",
                 "refused_why", "failing_until", "failing_why", "load_blocked", "missed",
                 "missed_at")

    def __init__(self, profile: ModelProfile, cfg: SchedulerConfig) -> None:
        self.name = profile.model
        self.profile = profile
        self.est = Estimator(profile, cfg.estimate_window, cfg.estimate_percentile,
                             cfg.estimate_stale)
        self.queue: deque[Request] = deque()
        self.live = 0  # QUEUED requests in ``queue`` (it may also hold answered ones)
        self.outstanding = 0.0  # LOAD demand of queued requests, in GPUs
        self.instances: dict[int, Instance] = {}  # gpu index -> instance
        self.ready_copies = 0
        self.monotone = True  # queued deadlines are nondecreasing (the common case)
        self.last_deadline = 0
        self.slo_cache = None  # ((slo, exec1, load), slo - buffer, demand) of the last SLO seen
        self.versions = 0
        self.removed = False  # removed at run time: its copies are evicted once idle
        self.wide: CopyIndex | None = None  # kept while the model has many copies
        self.dirty = False  # demand or copies changed since the scheduler last looked
        self.big_at = float("inf")  # outstanding from which rounding matters (ROUNDING)
        self.qver = 0  # bumped whenever a request joins or leaves the queue
        # the scheduler's last batch choice, reused while nothing it read has changed:
        # (qver, est.version, lowest start, highest start, choice) (Scheduler._choose_batch)
        self.memo: tuple | None = None
        self.load_refusals = 0  # LOADs refused in a row (inflight.LOAD_REFUSED), no copy ready
        self.extra_refusals = 0  # ... of extra copies, while one was ready (its back-offs)
        self.refused_until = 0  # after LOAD_REFUSALS of them: answered ERROR until then
        self.refused_why = ""  # (with this reason: the last refusal's)
        # every copy's INFERs failed on its device FAULTS_FAILING times in a row: its
        # requests are answered ERROR until then (Scheduler._failing), with this reason
        self.failing_until = 0
        self.failing_why = ""
        # GPU index -> until when that GPU is not offered an extra copy of this model (it
        # refused one while a copy was ready: Scheduler._load_refused); None: no GPU
        self.load_blocked: dict[int, int] | None = None
        # GPU time (ns) of the requests its busy copies turned away, decayed with time
        # (Scheduler._warm_miss), as of ``missed_at``
        self.missed = 0.0
        self.missed_at = 0
        self.pages = profile.weights_pages
        self.batch_sizes = usable_batch_sizes(profile.batch_sizes, cfg.max_batch)
        # GPU time per request at the most efficient allowed batch size (demand accounting)
        self.item_cost = min(
            profile.exec_ns[b] / b for b in self.batch_sizes
            if b == self.batch_sizes[0] or profile.exec_ns[b] <= cfg.max_exec
        )

    def head(self, n: int) -> list[Request]:
        """The first ``n`` queued requests, discarding answered ones at the front."""
        q = self.queue
        while q and q[0].state != QUEUED:
            q.popleft()
        out = []
        for r in q:
            if r.state == QUEUED:
                out.append(r)
                if len(out) == n:
                    break
        return out


class GpuState:
    __slots__ = ("index", "worker", "gpu", "total_pages", "free_pages", "exec", "pcie",
                 "instances", "active", "wake_at", "available", "held",
                 "wide", "share", "gone")

    def __init__(self, index: int, worker: int, gpu: int, pages: int, cfg: SchedulerConfig) -> None:
        self.index = index
        self.worker = worker
        self.gpu = gpu
        self.total_pages = pages
        self.free_pages = pages
        self.exec = LaneTracker(cfg.future, cfg.lag)
        self.pcie = LaneTracker(cfg.future, cfg.lag)
        self.instances: dict[str, Instance] = {}
        # the models here with queued requests -> their copy here (a dict: ordered, so runs
        # repeat exactly whatever the process's string hashing)
        self.active: dict[str, Instance] = {}
        self.wake_at = 0  # a pending on_tick for this GPU's EXEC lane (0: none)
        self.available = True  # False while its worker is gone: nothing is placed here
        # the copies (model, version) it held when it was lost (restored on return)
        self.held: list[tuple[str, int]] = []
        self.wide: list[ModelState] = []  # models with a CopyIndex that have a copy here
        self.share = 0.0  # load_share() when the scheduler last looked (see _refresh_shares)
        self.gone = False  # removed for good (its worker was removed): never back

    def load_share(self) -> float:
        """Queued demand this GPU is expected to absorb, in GPUs (1.0 = saturated)."""
        insts = self.instances
        active = self.active
        if len(active) * 4 < len(insts):
            # only the models with queued requests have demand: those, in the order of
            # ``instances`` (creation order, ``seq``), so the sum is the same float
            copies = sorted(active.values(), key=by_seq)
        else:
            copies = insts.values()
        total = 0.0
        for inst in copies:
            m = inst.model
            if m.outstanding:
                total += m.outstanding / len(m.instances)
        return total


def by_seq(inst: Instance) -> int:
    """Sort key: copies in order of creation."""
    return inst.seq
