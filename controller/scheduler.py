"""The Clockwork scheduler (INFER5, in our words) as a pure core.

Rules (explained in docs/scheduling.md), each in one place below:

* ``on_request``  deadline = arrival + SLO - buffer; answer at once if already
  infeasible; queue it; kick the GPUs holding the model; ask for a LOAD if none does.
* ``_schedule_infer``  while a GPU is predicted free before now + schedule_ahead,
  pick the most urgent model on it (smallest latest-start = oldest deadline -
  estimate), drop its requests that cannot finish, take the largest batch size
  whose estimate lets every request in it meet its deadline, send INFER.
* ``_schedule_loads``  when a GPU's PCIe lane is free, load the model with the
  highest unmet demand, evicting least-recently-used models without demand first.
* ``on_result``  feed measured durations into the estimates, answer requests,
  return the requests of a rejected INFER to their queue if they can still make it.
* ``_load_refused``  a model whose LOADs workers refuse: with no copy ready, its
  requests are answered ERROR for a while; with one, the GPU that refused an extra
  copy is not offered it again for a growing back-off.
* ``_pause_copy`` / ``_failing``  a copy whose INFERs fail on its device sits out a
  growing pause; when every copy of a model fails so, in a row, its requests are
  answered ERROR (the worker's reason) until a pause ends.
* ``on_tick``  answer requests that can no longer start in time; wake GPUs whose
  schedule-ahead window opened; re-examine unmet demand for LOADs.
* ``add_model`` / ``remove_model``  the set of models changes at run time: a new model
  is an empty queue like any other; a removed one answers its queue, leaves
  ``self.models`` (so no request reaches it) and waits in ``_removed`` until each copy
  is idle and EVICTed.
* ``cancel``  a queued request whose caller went away leaves its queue, answered
  ERROR ``CANCELLED``; one in an INFER runs on (``WITHDRAWN``: answered so too if the
  INFER fails).
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Container, Iterable, Sequence

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.profiles import ModelProfile
from clockwork.requests import DONE, EXECUTING, QUEUED, WITHDRAWN, Reply, Request
from controller.config import SchedulerConfig
from controller.idle_gpus import IdleGpus, least_loaded
from controller.inflight import (
    COPY_FAULTED,
    COPY_GONE,
    FAULT_PAUSE_MAX_NS,
    FAULT_PAUSE_NS,
    FAULTS_FAILING,
    LOAD_BACKOFF_MAX_NS,
    LOAD_BACKOFF_NS,
    LOAD_REFUSALS,
    LOAD_REFUSED,
    REFUSED_AS_SENT,
    REFUSED_FOR_NS,
    WEIGHTS_UNCOUNTED,
    WINDOW_MISSED,
    Inflight,
    error_message,
    failed_status,
)
from controller.lanes import unwatch, watch
from controller.policy import (
    CANCELLED,
    MODEL_UNLOADED,
    NO_GPU_FITS,
    NO_GPU_LEFT,
    GpuSpec,
    ModelView,
    Policy,
)
from controller.state import CopyIndex, GpuState, Instance, ModelState

MISS_MEMORY = 1_000_000_000  # how long a request rejected for a cold model keeps asking for a LOAD
# requests turned away by a model's busy copies ask for another copy once the GPU time
# they needed, over about the last MISS_MEMORY (decayed), is this fraction of a GPU
WARM_MISS_GPU = 0.005
REPLICA_DEMAND = 0.5  # queued demand per copy (in GPUs, see ModelState.outstanding) that asks for a look at adding a copy
# A model with k copies, all on GPUs with load_share <= 1, has LOAD priority
# outstanding - k * (outstanding / k), which rounding keeps within (k + 2) * outstanding
# * 2**-53 of 0: at most 1e-9 (not wanted) while (k + 2) * outstanding < 9e6. Models above
# ROUNDING (a ninth of that) are kept in ``_big`` and have their priority computed
# (``ModelState.big_at`` = ROUNDING / (k + 2)).
ROUNDING = 1e6


def _second(e: tuple) -> int:
    return e[1]


def _asked_at(inst: Instance, now: int) -> int:
    """When ``inst``'s GPU is asked about its model (``_ask_copies``): when its lane is
    free, or, for a copy sitting out a fault (``_pause_copy``), when its pause ends."""
    free = inst.gpu.exec.available(now)
    return inst.ready_at if inst.faults and inst.ready_at > free else free


class ClockworkScheduler(Policy):
    scan_extra = 64  # queued requests looked at beyond max batch when forming a batch
    wide_copies = 8  # a model with this many copies gets a CopyIndex (dropped below half)
    def __init__(self, profiles: Iterable[ModelProfile], gpus: Iterable[GpuSpec],
                 config: SchedulerConfig | None = None) -> None:
        self.cfg = cfg = config or SchedulerConfig()
        self.models: dict[str, ModelState] = {p.model: ModelState(p, cfg) for p in profiles}
        self.gpus: list[GpuState] = [
            GpuState(i, s.worker, s.gpu, s.pages, cfg) for i, s in enumerate(gpus)
        ]
        # the largest weights cache of a GPU: a model larger could never be loaded
        self._pages_max = max((g.total_pages for g in self.gpus), default=0)
        self._replies: list[Reply] = []
        self._sent = Inflight()  # actions sent, not answered (copy: the Instance)
        # (drop_at, id, request) of queued requests; answered ones leave it from the top,
        # or all at once when they outnumber the queued ones (``_push_expiry``)
        self._expiry: list[tuple[int, int, Request]] = []
        self._live = 0  # queued requests, over every model (the sum of their ``live``)
        self._wakes: list[tuple[int, int]] = []  # (time, gpu index)
        self._use_seq = 0
        self._unserved: set[str] = set()  # models with queued requests and no copy
        self._queued: set[str] = set()  # models with queued requests
        self._misses: dict[str, tuple[int, float]] = {}  # cold model -> (last miss, demand)
        # model with copies on fewer than all GPUs -> (last miss, demand in GPUs): requests
        # turned away by its busy copies that a copy loaded on another GPU could have
        # served, at least WARM_MISS_GPU of them (_warm_miss)
        self._warm_misses: dict[str, tuple[int, float]] = {}
        self._last_now = 0
        self._next_load_check = 0
        self._load_check_put_off = False  # it is a back-off's end (_arm_load_check)
        self._removed: dict[str, ModelState] = {}  # removed, copies not yet all evicted
        self._copy_seq = 0  # numbers the copies in order of creation (Instance.seq)
        # LOAD demand, kept up to date between looks (see _schedule_loads):
        self._cold: list[tuple[float, str]] = []  # heap (-outstanding, name) over _unserved, stale entries too
        self._cold_hold: list[tuple[float, str]] | None = None  # pushes held during a look
        self._cold_skip: set[str] = set()  # models that lost their last copy during a look
        self._dirty_models: list[ModelState] = []  # outstanding or copies changed (m.dirty)
        # on_requests: the GPUs an INFER decision is due on once every request is queued
        self._held: dict[int, GpuState] | None = None
        self._dirty_gpus: set[int] = set()  # instances changed
        self._over: set[int] = set()  # GPUs with share > 1.0 (as of the last look)
        self._big: set[str] = set()  # queued models with copies and outstanding >= big_at
        self._held_back: set[ModelState] = set()  # the models with a load_blocked dict
        # (the scheduler's attributes stay below 30: past that CPython 3.11 keeps them in a
        # plain dict, and every self.x read costs more: +2 % instructions per request)
        self._idle = IdleGpus(self.gpus)  # the GPUs whose PCIe lane is idle, in order
        for g in self.gpus:
            watch(g.pcie, self._idle.hook(g))

    # ------------------------------------------------------------------ events

    def on_request(self, request: Request, now: int) -> list[Action]:
        out: list[Action] = []
        m = self.models.get(request.model)
        if m is None:
            self._answer(request, RequestStatus.INVALID_REQUEST, now,
                         MODEL_UNLOADED if request.model in self._removed
                         else f"unknown model {request.model!r}")
            return out
        if m.refused_until:  # its LOADs were refused (_load_refused)
            if now < m.refused_until and not m.ready_copies:
                self._answer(request, RequestStatus.ERROR, now, m.refused_why)
                return out
            m.refused_until = m.load_refusals = 0
        if m.failing_until:  # its INFERs fail on every copy's device (_failing)
            if now < m.failing_until:
                self._answer(request, RequestStatus.ERROR, now, m.failing_why)
                return out
            m.failing_until = 0
        if m.pages > self._pages_max and self._pages_max:
            # never loaded anywhere (as the baselines say it): not queued until its SLO
            self._answer(request, RequestStatus.ERROR, now, NO_GPU_FITS)
            return out
        cfg = self.cfg
        slo = request.slo or cfg.default_slo
        if slo <= 0:
            self._answer(request, RequestStatus.INVALID_REQUEST, now, "SLO must be positive")
            return out
        request.slo = slo
        est = m.est
        b1 = est.exec_ns[m.batch_sizes[0]]
        key = (slo, b1, est.load)
        cached = m.slo_cache
        if cached is None or cached[0] != key:
            buffer = cfg.buffer if cfg.buffer * 10 <= slo else slo // 10
            # demand for LOADs: the fraction of a GPU a request needs within its load window
            load_slo = slo - (est.load + b1 + buffer + cfg.schedule_ahead)
            load_slo = max(min(cfg.max_load_slo, load_slo), cfg.schedule_ahead + buffer)
            cached = m.slo_cache = (key, slo - buffer, m.item_cost / load_slo)
        deadline = request.deadline = request.arrival + cached[1]
        drop_at = request.drop_at = deadline - b1
        request.demand = cached[2]
        request.cold = m.ready_copies == 0
        insts = m.instances
        ix = m.wide
        if ix is not None:
            # many copies: the index knows the soonest without asking every lane
            soonest = self._soonest(m, ix, now)
        elif insts:
            # the soonest any copy could start it if it were next in line
            gpus = self.gpus
            frees = []
            soonest = NEVER
            for gi, inst in insts.items():
                g = gpus[gi]
                free = g.exec.available(now)
                if inst.ready_at > free:
                    # (a copy sitting out a fault is asked in the order of its pause's end)
                    frees.append((g, inst.ready_at if inst.faults else free))
                    free = inst.ready_at
                else:
                    frees.append((g, free))
                if free < soonest:
                    soonest = free
        else:
            soonest = now + cfg.future + est.load
        if (drop_at < soonest and est.inflated
                and now - est.measured_at > cfg.estimate_stale
                and deadline - m.profile.exec_ns[m.batch_sizes[0]] >= soonest):
            # the estimate may be a straggler's, and nothing has run since to correct it
            # (only for a request the profile's figure would let in: one infeasible
            # either way says nothing of the estimate, and its measurements are kept)
            est.forget_exec()
            drop_at = request.drop_at = deadline - est.exec_ns[m.batch_sizes[0]]
        if drop_at < soonest:
            self._answer(request, RequestStatus.TIMEOUT, now, "SLO cannot be met")
            if not insts:
                # too late for this one, but the model is wanted: load it for the next ones
                self._misses[m.name] = (now, self._misses.get(m.name, (0, 0.0))[1] + request.demand)
                self._check_loads_by(now)
                self._schedule_loads(now, out, only_idle=True)
            else:
                self._warm_miss(m, request, now, now)
            return out
        request.state = QUEUED
        live = m.live
        if live and deadline < m.last_deadline:
            m.monotone = False
        m.last_deadline = deadline
        m.queue.append(request)
        m.live = live + 1
        self._live += 1
        m.qver += 1
        m.outstanding += request.demand
        if insts:
            if not m.dirty:
                m.dirty = True
                self._dirty_models.append(m)
        else:
            self._push_cold(m)
        if ((not self._next_load_check or (self._load_check_put_off and m.load_blocked is None))
                and insts and len(insts) < self._idle.up
                and m.outstanding > REPLICA_DEMAND * len(insts)):
            # queued demand outgrows this model's copies: consider another one soon
            # (``_arm_load_check`` keeps looking while such demand lasts; a look put off
            # to a back-off's end is not brought forward by the model held back itself)
            self._check_loads_by(now + cfg.load_check_interval)
        if not live:
            self._queued.add(m.name)
            for gi, inst in insts.items():
                self.gpus[gi].active[m.name] = inst
        if ix is not None:
            self._kick_copies(m, ix, now, out)
        elif insts:
            self._ask_copies(m, frees, now, out)
        else:
            if not self._unserved:
                self._next_load_check = now
                self._load_check_put_off = False
            self._unserved.add(m.name)
            self._schedule_loads(now, out, only_idle=True)
        if request.state == QUEUED:  # (one sent at once needs no expiry)
            self._push_expiry(drop_at, request)
        return out

    def _push_expiry(self, drop_at: int, r: Request) -> None:
        exp = self._expiry
        if len(exp) > 2 * self._live + 64:
            # answered requests (with their inputs) would otherwise stay until their
            # drop time, up to a day, whenever an earlier one is still queued
            exp = self._expiry = [e for e in exp if e[2].state == QUEUED]
            heapq.heapify(exp)
        heapq.heappush(exp, (drop_at, r.id, r))

    def on_result(self, result: Result, now: int) -> list[Action]:
        out: list[Action] = []
        inf = self._sent.resolve(result)
        if inf is None:
            return out  # unknown or duplicate result: nothing to do
        g = inf.gpu
        t = inf.action.type
        if t == ActionType.INFER:
            g.exec.done(result.id, result.end)
            inst = inf.copy
            inst.inflight -= 1
            m = inst.model
            if not result.status:
                if inst.faults:
                    inst.faults = 0
                    m.failing_until = 0
                m.est.add_exec(inf.action.batch_size, result.held, now)
                for r in inf.requests:
                    self._answer(r, RequestStatus.SUCCESS, now, "", g.index, inf.action.batch_size,
                                 result.outputs)
            elif result.status in REFUSED_AS_SENT:
                for r in inf.requests:
                    self._answer(r, RequestStatus.ERROR, now, error_message(result))
            else:
                if (result.status in COPY_FAULTED and not inst.loading
                        and g.instances.get(m.name) is inst):
                    self._pause_copy(inst, now)
                    self._failing(m, result, now)
                why, late = result, False
                if result.status == ErrorCode.WEIGHTS_NOT_PRESENT:
                    # its copy's LOAD came too late (its code said), or has not finished
                    # (its result, refused or not, may come after this one: the lanes
                    # run apart): what a request with no time left misses is its deadline
                    if inst.load_missed is not None:
                        why = inst.load_missed
                    late = inst.load_missed is not None or (
                        inst.loading and g.instances.get(m.name) is inst)  # (unanswered)
                self._requeue(m, inf.requests, why, now, late)
                # our view was wrong: forget the copy. Not when the INFER was turned away
                # before its LOAD finished (a real LOAD that ran long): the weights are there.
                if result.status in COPY_GONE and not inst.loading and g.instances.get(m.name) is inst \
                        and (result.end >= inst.ready_at or inst.faults):
                    if result.status == ErrorCode.WEIGHTS_CHANGED:
                        # other weights of it are there: out, or their pages stay taken
                        # with none of our copies counting them
                        self._send_evict(inst, now, out)
                    else:
                        self._drop_instance(inst, now)
                elif (inst.loading and inst.ready_at <= now
                      and result.status == ErrorCode.WEIGHTS_NOT_PRESENT):
                    # its LOAD runs past its predicted end: not ready before another LOAD's
                    # length from now, or before the LOAD's result says so (which makes it
                    # ready at once); else each retry, refused in turn, was re-sent at once
                    inst.ready_at = now + m.est.load
                    if m.wide is not None:
                        m.wide.push(inst)
            if m.removed and self._retire(inst, now, out) and (self._unserved or self._misses):
                self._schedule_loads(now, out, only_idle=False)  # its pages may take a LOAD
            if result.status and m.live and result.status not in REFUSED_AS_SENT:
                # put back: offered to every copy, soonest free first, before this GPU
                # decides alone (it timed out a request it could no longer start in
                # time that another GPU, idle, could still serve)
                self._offer(m, now, out)
            self._schedule_infer(g, now, out)
        elif t == ActionType.LOAD:
            g.pcie.done(result.id, result.end)
            inst = inf.copy
            current = g.instances.get(inst.model.name) is inst
            if not result.status:
                inst.model.load_refusals = inst.model.extra_refusals = 0  # (back-offs too)
                inst.model.failing_until = 0  # (a copy it has not tried)
                inst.model.est.add_load(result.held)
                if current:
                    inst.loading = False
                    inst.ready_at = result.end
                    inst.model.ready_copies += 1
                    if inst.model.wide is not None:
                        inst.model.wide.push(inst)
                    if inst.model.removed:
                        self._retire(inst, now, out)
            else:
                if result.status.name.endswith(WINDOW_MISSED):
                    inst.load_missed = result
                if current and result.status == WEIGHTS_UNCOUNTED:
                    self._send_evict(inst, now, out)  # (then placed again: below)
                elif current:
                    self._drop_instance(inst, now)
                if result.status in LOAD_REFUSED:
                    self._load_refused(inst.model, g, result, now)
            self._schedule_infer(g, now, out)
            self._schedule_loads(now, out, only_idle=True)
        # EVICT results need nothing: pages were freed in our view when it was sent
        return out

    def on_tick(self, now: int) -> list[Action]:
        out: list[Action] = []
        exp = self._expiry
        while exp and exp[0][0] < now:
            _, _, r = heapq.heappop(exp)
            if r.state == QUEUED:
                m = self.models[r.model]
                drop_at = r.deadline - m.est.exec_ns[m.batch_sizes[0]]
                if drop_at >= now:
                    # the estimate came down since its drop time was set (a straggler's
                    # measurement left the window, or was forgotten): it can still finish
                    r.drop_at = drop_at
                    heapq.heappush(exp, (drop_at, r.id, r))
                else:
                    self._time_out(m, r, now)
        wakes = self._wakes
        while wakes and wakes[0][0] <= now:
            top = heapq.heappop(wakes)
            # the same wake again (a stale one replaced by an earlier one re-pushes it)
            # would run the same GPU at the same instant again, finding nothing to do
            while wakes and wakes[0] == top:
                heapq.heappop(wakes)
            gi = top[1]
            g = self.gpus[gi]
            g.wake_at = 0
            if g.wide:
                for wm in g.wide:
                    wm.wide.unwoken.add(gi)
            self._schedule_infer(g, now, out)
        if self._next_load_check and now >= self._next_load_check:
            self._schedule_loads(now, out, only_idle=False)
        return out

    def next_wakeup(self) -> int | None:
        t = NEVER
        exp = self._expiry
        while exp and exp[0][2].state != QUEUED:
            heapq.heappop(exp)  # answered already
        if exp:
            t = self._expiry[0][0] + 1
        if self._wakes and self._wakes[0][0] < t:
            t = self._wakes[0][0]
        if self._next_load_check and self._next_load_check < t:
            t = self._next_load_check
        return None if t == NEVER else t

    def drain_replies(self) -> list[Reply]:
        out = self._replies
        if not out:
            return []  # most calls: nothing to hand over, keep the buffer
        self._replies = []
        return out

    # ------------------------------------------------------------------ INFER

    def _schedule_infer(self, g: GpuState, now: int, out: list[Action]) -> None:
        horizon = now + self.cfg.schedule_ahead
        while g.active:
            t = g.exec.available(now)
            if t >= horizon:
                self._wake(g, t - self.cfg.schedule_ahead + 1)
                return
            cands = []
            for name, inst in list(g.active.items()):
                m = inst.model
                start = t if inst.ready_at <= t else inst.ready_at
                if start >= horizon:
                    if not inst.loading:  # (a copy sitting out a fault: _pause_copy)
                        self._wake(g, start - self.cfg.schedule_ahead + 1)
                    continue
                if m.live == 1:
                    # a lone request (the common case with many models) runs alone, if it
                    # can still finish in time; if not, it is dropped unless its copy is
                    # still loading. (_choose_batch's rule for one request, inlined: most
                    # candidates are lone requests.)
                    r = m.queue[0]
                    if r.state != QUEUED:
                        r = m.head(1)[0]  # (lets go of the answered ones in front)
                    b1 = m.batch_sizes[0]
                    p = r.deadline - m.est.exec_ns[b1]
                    if p < start:
                        if not inst.loading and not inst.faults:
                            # (one paused by a fault: another copy may serve it)
                            self._time_out(m, r, now)
                        continue
                    cands.append((p, -b1, name, m, inst, start, r))  # (its batch: below)
                    continue
                choice = self._choose_batch(m, start, not inst.loading and not inst.faults,
                                            now)
                if choice is not None:
                    cands.append((choice[0], -choice[1], name, m, inst, start, choice))
            if not cands:
                # nothing runnable now; models still loading are woken by their LOAD result
                return
            best = cands[0] if len(cands) == 1 else self._pick(cands)
            _, neg_b, _, m, inst, start, choice = best
            if type(choice) is tuple:
                _, b, batch, skipped = choice
                for r in skipped:  # too urgent for the batch chosen: they cannot be served now
                    self._time_out(m, r, now)
            else:  # a lone request (its batch is built only if it is the one chosen)
                b, batch = -neg_b, [choice]
            self._send_infer(g, m, inst, start, b, batch, now, out)

    def _pick(self, cands: list) -> tuple:
        """Which candidate batch runs next on a GPU.

        Clockwork's rule is the most urgent (smallest latest-start). Two refinements
        (``batch_first``), both only when batches conflict:

        * a larger batch that can run first and still leave the most urgent one
          time to start runs first (the urgent one loses nothing);
        * if running the urgent batch first would end after a more efficient
          model's priority (more requests per second of GPU time; its priority is
          the smallest latest start over its sizes, possibly its head request's,
          which its batch may leave behind), the efficient one runs. Under overload
          this keeps the GPU at its best batch size instead of splitting every queue
          into small late batches. (Against the efficient batch's own latest start
          instead, the Fig. 5 set-up served fewer: 28,916 against 28,960 of 54,4xx
          requests in 20 s.)
        """
        urgent = min(cands)
        if len(cands) == 1 or not self.cfg.batch_first:
            return urgent
        neg_ub = urgent[1]
        larger = [c for c in cands if c[1] < neg_ub]  # the candidates with a larger batch
        if not larger:
            return urgent  # none to weigh (e.g. only lone requests)
        u_start, u_b = urgent[5], -neg_ub
        u_exec = urgent[3].est.exec(u_b)
        u_rate = u_b / u_exec
        u_latest = urgent[0]
        best = None
        larger.sort()
        for c in larger:
            b = -c[1]
            e = c[3].est.exec(b)
            if c[5] + e <= u_latest:
                if best is None or b > -best[1]:
                    best = c  # fits before the urgent one
            elif best is None and b / e > u_rate and u_start + u_exec > c[0]:
                best = c  # the urgent one first would cost this better batch its deadline
        return best or urgent

    def _choose_batch(self, m: ModelState, start: int, drop: bool, now: int):
        """INFER5's choice for one model on a GPU that can start at ``start``.

        For each allowed batch size b, the candidate batch is the first b queued
        requests that can all finish by their deadlines if a batch of b starts at
        ``start``; its priority is its oldest deadline - estimate(b). The model's
        priority is the smallest over the sizes it can fill, and it runs the
        largest size it can fill. Requests ahead of that batch which are too urgent
        for it are returned as ``skipped`` (they are dropped if it runs).
        With ``drop``, requests that cannot finish even alone are answered first.
        (``_schedule_infer`` decides a lone request's case itself, without calling this:
        the same answer, it runs alone if it can finish in time.)

        Returns (priority, batch size, batch, skipped) or None.

        The choice depends on ``start`` only through which deadlines each size's
        ``start + estimate`` passes, so it holds for a range of starts; it is kept
        (``m.memo``) with that range and returned again while the queue and the
        estimates are as they were and ``start`` is in the range (no request would be
        dropped there either). Same answers, computed once.
        """
        est = m.est
        memo = m.memo
        if (memo is not None and memo[0] == m.qver and memo[1] == est.version
                and memo[2] <= start <= memo[3]):
            return memo[4]
        sizes = m.batch_sizes
        e1 = est.exec(sizes[0])
        q = m.queue
        if drop:
            while q:
                r = q[0]
                if r.state != QUEUED:
                    q.popleft()
                    continue
                if r.deadline >= start + e1:
                    break
                self._time_out(m, r, now)
        if not m.live:
            return None
        head = m.head(sizes[-1] + self.scan_extra)
        n = len(head)
        deadlines = [r.deadline for r in head]
        ordered = m.monotone
        ex = est.exec_ns
        max_exec = self.cfg.max_exec
        prio = None
        chosen = None
        # the starts for which every size's split of ``deadlines`` stays where it is
        lo, hi = -NEVER, deadlines[0] - e1
        # fewer requests than the smallest size (a model compiled for 4 and 8 only) run
        # as a batch of it, padded, as a lone request does: else 2 or 3 queued requests
        # waited for a fourth and were all dropped, the GPU idle
        pad = sizes[0] if n < sizes[0] else 0
        for b in sizes:
            if b > n and b != pad:
                break
            e = ex[b]
            if b > 1 and e > max_exec and b != sizes[0]:
                break
            want = 1 if b == pad else b  # (the fewest rows a batch of b takes)
            th = start + e
            if ordered:
                j = bisect_left(deadlines, th)
                if j < n and deadlines[j] - e < hi:
                    hi = deadlines[j] - e
                if j and deadlines[j - 1] - e >= lo:
                    lo = deadlines[j - 1] - e + 1
                if n - j < want:
                    continue
                idx = range(j, n if b == pad else j + b)
            else:
                idx = [i for i in range(n) if deadlines[i] >= th][:b]
                if len(idx) < want:
                    continue
            # the batch's oldest deadline (its first request's when the queue is in order)
            p = (deadlines[idx[0]] if ordered else min([deadlines[i] for i in idx])) - e
            if prio is None or p < prio:
                prio = p
            chosen = (b, idx)
        if chosen is None:
            if ordered and lo <= start <= hi:
                m.memo = (m.qver, est.version, lo, hi, None)
            return None
        b, idx = chosen
        if ordered:
            j = idx[0]
            res = prio, b, head[j:j + b], head[:j]
            if lo <= start <= hi:
                m.memo = (m.qver, est.version, lo, hi, res)
            return res
        last = idx[-1]
        picked = set(idx)
        batch = [head[i] for i in idx]
        skipped = [head[i] for i in range(last) if i not in picked]
        return prio, b, batch, skipped

    def _send_infer(self, g: GpuState, m: ModelState, inst: Instance, start: int, b: int,
                    batch: list[Request], now: int, out: list[Action]) -> None:
        cfg = self.cfg
        e = m.est.exec(b)
        aid = self._sent.new_id()
        earliest = inst.ready_at if inst.ready_at > now else now
        # workers run a lane in ``earliest`` order; never let a later INFER overtake an
        # outstanding one (e.g. one waiting for its LOAD), or the predicted chain breaks.
        # (Not one already answered: one failed back before its start holds nothing up.)
        last = g.exec.last_earliest
        if earliest < last:
            earliest = last
        start = g.exec.add(aid, earliest, e, now)
        latest = max(now + cfg.future + cfg.latest_delta, start + cfg.latest_delta)
        a = Action(aid, ActionType.INFER, g.worker, g.gpu, m.name, earliest, latest, e,
                   batch_size=b, version=inst.version, expected_end=start + e, sent_at=now,
                   requests=batch)
        for r in batch:
            self._unqueue(m, r, EXECUTING)
        inst.inflight += 1
        self._use_seq += 1
        inst.last_used = self._use_seq
        self._sent.add(a, g, inst, batch)
        out.append(a)

    def _answer_queued(self, m: ModelState, status: RequestStatus, now: int,
                       message: str) -> None:
        """Answer every request queued for ``m`` (``status``, ``message``): none of them
        can be served (its model unloaded, its LOADs refused, its INFERs failing, no GPU
        left that holds it)."""
        for r in list(m.queue):
            if r.state == QUEUED:
                self._unqueue(m, r)
                self._answer(r, status, now, message)

    def _requeue(self, m: ModelState, requests: list[Request], result: Result, now: int,
                 late: bool = False) -> None:
        """Queue again the requests of a failed INFER that can still make their deadline;
        answer the others as ``result`` says (TIMEOUT for a window missed, or ``late``:
        the weights were not there in time; else ERROR)."""
        if m.removed:  # nowhere to run them any more
            for r in requests:
                self._answer(r, RequestStatus.INVALID_REQUEST, now, MODEL_UNLOADED)
            return
        why = (m.refused_why if m.refused_until > now and not m.ready_copies  # LOADs refused
               else m.failing_why if m.failing_until > now  # INFERs fail on every copy
               # (the only GPUs that could hold it removed for good)
               else NO_GPU_FITS if m.pages > self._pages_max and self._pages_max
               else NO_GPU_LEFT if not self._pages_max  # (every GPU removed)
               else None)
        if why is not None:  # (answered at once: a caller gone, as such)
            for r in requests:
                self._answer(r, RequestStatus.ERROR, now,
                             CANCELLED if r.state == WITHDRAWN else why)
            return
        keep = []
        e1 = m.est.exec(m.batch_sizes[0])
        for r in requests:
            if r.state == WITHDRAWN:  # its caller went away (cancel)
                self._answer(r, RequestStatus.ERROR, now, CANCELLED)
            elif now + self.cfg.future + e1 <= r.deadline:
                keep.append(r)
            else:  # (TIMEOUT when the worker found it too late: its SLO is out of reach)
                self._answer(r, RequestStatus.TIMEOUT if late else failed_status(result), now,
                             error_message(result))
        if not keep:
            return
        keep.sort(key=lambda r: (r.arrival, r.id))
        was_empty = m.live == 0
        # drop stale entries (answered, or these very requests from before they ran)
        m.queue = deque(r for r in m.queue if r.state == QUEUED)
        m.monotone = False
        m.qver += 1
        for r in reversed(keep):
            r.state = QUEUED
            m.queue.appendleft(r)
            m.live += 1
            self._live += 1
            m.outstanding += r.demand
            self._push_expiry(r.drop_at, r)
        self._demand_changed(m)
        if was_empty:
            self._queued.add(m.name)
            for gi, inst in m.instances.items():
                self.gpus[gi].active[m.name] = inst
        if not m.instances:
            self._unserved.add(m.name)
            self._check_loads_by(now)

    def _pause_copy(self, inst: Instance, now: int) -> None:
        """``inst``'s INFER failed on its device (``COPY_FAULTED``): it is not offered
        work for ``FAULT_PAUSE_NS``, doubling with each such failure in a row up to
        ``FAULT_PAUSE_MAX_NS`` (its ``ready_at`` moved on: every start time reads it), so
        that its requests, put back, go to the other copies."""
        inst.faults += 1
        pause = min(FAULT_PAUSE_MAX_NS, FAULT_PAUSE_NS << min(inst.faults - 1, 30))
        if now + pause > inst.ready_at:
            inst.ready_at = now + pause
            if inst.model.wide is not None:
                inst.model.wide.push(inst)
            self._wake(inst.gpu, inst.ready_at - self.cfg.schedule_ahead + 1)

    def _failing(self, m: ModelState, result: Result, now: int) -> None:
        """After an INFER of ``m`` failed on its copy's device (``COPY_FAULTED``, the copy
        paused): when every copy of ``m`` (none loading) has failed ``FAULTS_FAILING``
        times in a row and no other GPU could take a copy (``_first_copy_elsewhere``: a
        failing device's requests may yet be served there), ``m``'s INFERs fail wherever
        they run, so its requests (queued, retried, arriving) are answered ERROR with the
        worker's reason until the first copy's pause ends; the try then decides again (a
        success, or a new copy loaded, ends it)."""
        insts = m.instances.values()
        if not insts or any(i.loading or i.faults < FAULTS_FAILING for i in insts) \
                or self._first_copy_elsewhere(m, now):
            return
        m.failing_until = min(i.ready_at for i in insts)
        m.failing_why = error_message(result)
        self._answer_queued(m, RequestStatus.ERROR, now, m.failing_why)

    def _load_refused(self, m: ModelState, g: GpuState, result: Result, now: int) -> None:
        """A LOAD of ``m`` refused by ``g``'s worker (``LOAD_REFUSED``).

        With no copy of ``m`` ready: after ``LOAD_REFUSALS`` in a row its requests
        (queued, retried, arriving) are answered ERROR with the worker's reason for
        ``REFUSED_FOR_NS``.

        With a copy ready (it goes on serving them), the refused LOAD was of an extra
        copy, which the demand would ask for again at once, thousands of times a second:
        instead ``g`` is not offered an extra copy of ``m`` (``_place_loads``) for a
        back-off, ``LOAD_BACKOFF_NS`` doubled with each refusal of an extra copy of ``m``
        in a row (on any GPU; ``extra_refusals``) up to ``LOAD_BACKOFF_MAX_NS``. A
        successful LOAD of ``m`` starts the doubling over; back-offs in force run out (one GPU's success says nothing of
        another's cache). Held back is the GPU, not the model: a worker refuses for its
        own reasons (too few contiguous free pages in its cache, a failing device), and
        another GPU with room should still take the copy at once. The length follows the
        model's streak, not the GPU's, so a model that every GPU refuses (a package no
        worker can load) is tried ever more rarely over all of them, each GPU at most
        once per ``LOAD_BACKOFF_MAX_NS`` in the end.

        A model without a copy ready: ``g`` is passed over for its first copy for
        ``REFUSED_FOR_NS`` while another GPU could take it (up, no copy of it, room for
        it, not one that refused it lately): one worker without the package, or one
        device failing its copies, would otherwise hold the model's LOADs, and its
        requests, for the whole cluster. Its requests are answered ERROR only when no
        such GPU is left."""
        if m.ready_copies:
            m.extra_refusals += 1
            backoff = min(LOAD_BACKOFF_MAX_NS, LOAD_BACKOFF_NS << min(m.extra_refusals - 1, 62))
            if m.load_blocked is None:
                m.load_blocked = {}
                self._held_back.add(m)
            m.load_blocked[g.index] = now + backoff
            return
        if m.load_blocked is None:
            m.load_blocked = {}
            self._held_back.add(m)
        m.load_blocked[g.index] = now + REFUSED_FOR_NS
        m.load_refusals += 1  # (those of extra copies before the copy was lost: not these)
        if m.load_refusals < LOAD_REFUSALS or self._first_copy_elsewhere(m, now):
            return
        m.refused_until = now + REFUSED_FOR_NS
        m.refused_why = error_message(result)
        self._answer_queued(m, RequestStatus.ERROR, now, m.refused_why)

    def _first_copy_elsewhere(self, m: ModelState, now: int,
                              memo: dict[str, bool] | None = None) -> bool:
        """Whether some GPU up, without a copy of ``m``, with room for it and not holding
        it back (``load_blocked``) could take ``m``'s copy (``memo``: the answers of one
        look; a look does not change them)."""
        if memo is not None:
            known = memo.get(m.name)
            if known is not None:
                return known
        bl, insts, pages = m.load_blocked or {}, m.instances, m.pages
        found = any(g.available and g.index not in insts and pages <= g.total_pages
                    and bl.get(g.index, 0) <= now for g in self._idle.in_service)
        if memo is not None:
            memo[m.name] = found
        return found

    def _unqueue(self, m: ModelState, r: Request, state: int = DONE) -> None:
        """A queued request leaves the queue (to execute, or answered)."""
        r.state = state
        m.live -= 1
        self._live -= 1
        m.qver += 1
        m.outstanding -= r.demand
        if m.instances:
            if not m.dirty:
                m.dirty = True
                self._dirty_models.append(m)
        elif m.live:
            self._push_cold(m)
        if m.live == 0:
            m.outstanding = 0.0
            m.queue.clear()
            m.monotone = True
            for gi in m.instances:
                self.gpus[gi].active.pop(m.name, None)
            self._unserved.discard(m.name)
            self._queued.discard(m.name)
        elif m.queue and m.queue[0] is r:
            m.queue.popleft()

    def _wake(self, g: GpuState, t: int) -> None:
        if g.wake_at and g.wake_at <= t:
            return
        if g.wide and not g.wake_at:
            for wm in g.wide:
                wm.wide.unwoken.discard(g.index)
        g.wake_at = t
        heapq.heappush(self._wakes, (t, g.index))

    # ------------------------------------------------------------------ many copies

    def _soonest(self, m: ModelState, ix: CopyIndex, now: int) -> int:
        """The soonest any copy of ``m`` could start a request (what ``on_request``'s loop
        over the copies finds): lanes that are overdue are re-anchored first, as asking
        them would; every other lane's ``available(now)`` is max(free_at, now + future)."""
        insts = m.instances
        if ix.size() > 4 * len(insts) + 64:
            ix.rebuild(insts)
        due = ix.by_due
        if due and due[0][0] < now:
            lanes = []
            while due and due[0][0] < now:
                d, seq, gi = heapq.heappop(due)
                inst = insts.get(gi)
                if inst is not None and inst.seq == seq and inst.gpu.exec.due == d:
                    lanes.append(inst.gpu.exec)
            for lane in lanes:
                lane.available(now)  # re-anchors it; its on_change records the new figures
        h = ix.by_start
        pop = heapq.heappop
        while True:
            key, seq, gi = h[0]
            inst = insts.get(gi)
            if inst is not None and inst.seq == seq:
                free = inst.gpu.exec._free_at
                ready = inst.ready_at
                if key == (free if free > ready else ready):
                    break
            pop(h)
        t = now + self.cfg.future
        return key if key > t else t

    def _offer(self, m: ModelState, now: int, out: list[Action]) -> None:
        """What ``on_request`` does for a new request, for ``m``'s queue as it stands: an
        INFER decision on each GPU with a copy whose lane is free before the horizon, a
        wake for each other one."""
        ix = m.wide
        if ix is not None:
            self._kick_copies(m, ix, now, out)
            return
        self._ask_copies(m, [(inst.gpu, _asked_at(inst, now))
                             for inst in m.instances.values()], now, out)

    def _ask_copies(self, m: ModelState, frees: list, now: int, out: list[Action]) -> None:
        """The GPUs of ``m``'s copies, ``frees`` ((gpu, when its lane is free)), each asked
        in turn: an INFER decision on each free before the horizon while ``m`` has
        requests queued, a wake for each other one."""
        sa = self.cfg.schedule_ahead
        horizon = now + sa
        if len(frees) > 1:
            # soonest free first (the copies' order on a tie): a GPU asked first may
            # turn away a request only a GPU free sooner can still serve
            frees.sort(key=_second)
        for g, free in frees:
            if free < horizon:
                if m.live:  # (not once taken: as _kick_copies)
                    self._infer_soon(g, now, out)
            elif not g.wake_at:
                self._wake(g, free - sa + 1)

    def _kick_copies(self, m: ModelState, ix: CopyIndex, now: int, out: list[Action]) -> None:
        """``on_request``'s look at the copies, from the index: a wake for each GPU that
        is not free before the horizon and has none; then an INFER decision on each GPU
        free before it, soonest free first (then the oldest copy), until nothing of ``m``
        is left queued. A hot model's request taken by the first idle copy asks that one
        GPU, not all of them (thousands, on an idle cluster)."""
        cfg = self.cfg
        sa = cfg.schedule_ahead
        horizon = now + sa
        t = now + cfg.future
        insts = m.instances
        if ix.unwoken:
            gpus = self.gpus
            for gi in [gi for gi in ix.unwoken
                       if not (t < horizon and gpus[gi].exec._free_at < horizon)]:
                g = gpus[gi]
                f = g.exec._free_at
                self._wake(g, (f if f > t else t) - sa + 1)
        if t >= horizon:
            return
        h = ix.by_free
        free: dict[int, int] = {}  # gpu index -> the free time its entry had
        back = []
        try:
            while h and h[0][0] < horizon and m.live:
                e = heapq.heappop(h)
                key, seq, gi = e
                inst = insts.get(gi)
                if inst is None or inst.seq != seq or inst.gpu.exec._free_at != key:
                    continue  # stale
                seen = free.get(gi)
                if seen is not None:
                    if seen != key:
                        back.append(e)  # its GPU's figure since its decision: kept
                    continue
                free[gi] = key
                back.append(e)
                self._infer_soon(inst.gpu, now, out)
        finally:
            for e in back:
                heapq.heappush(h, e)

    def _infer_soon(self, g: GpuState, now: int, out: list[Action]) -> None:
        """An INFER decision on ``g`` now, or, while ``on_requests`` queues several
        requests, once they are all queued."""
        held = self._held
        if held is None:
            self._schedule_infer(g, now, out)
        elif g.index not in held:
            held[g.index] = g

    def on_requests(self, requests: list[Request], now: int) -> list[Action]:
        """Requests that arrived together are all queued before any INFER is decided, so
        that they can share a batch (a KServe request of 8 rows ran as 8 INFERs of one
        row on an idle GPU: the first was sent before the second was queued)."""
        if len(requests) <= 1:
            return self.on_request(requests[0], now) if requests else []
        out: list[Action] = []
        held: dict[int, GpuState] = {}
        self._held = held
        try:
            for r in requests:
                out.extend(self.on_request(r, now))
        finally:
            self._held = None
        for g in held.values():  # (in the order their first request asked)
            self._schedule_infer(g, now, out)
        return out

    def _index_copy(self, m: ModelState, inst: Instance) -> None:
        g = inst.gpu
        g.wide.append(m)
        if g.exec.on_change is None:
            watch(g.exec, lambda: self._lane_changed(g))
        m.wide.push(inst)
        if not g.wake_at:
            m.wide.unwoken.add(g.index)

    def _lane_changed(self, g: GpuState) -> None:
        gi = g.index
        for m in g.wide:
            m.wide.push(m.instances[gi])

    def _unindex_copy(self, m: ModelState, g: GpuState) -> None:
        g.wide.remove(m)
        if not g.wide:
            unwatch(g.exec)

    # ------------------------------------------------------------------ LOAD / EVICT

    def _schedule_loads(self, now: int, out: list[Action], only_idle: bool) -> None:
        """Give each GPU whose PCIe lane is free the most under-served model.

        The models wanted (``_load_priorities``' order) come from indexes kept up to date
        between looks, in three parts: cold ones (queued, no copy: priority = their
        demand, a heap read in order only as far as needed), warm ones (a copy on a GPU
        with load_share > 1; a model whose copies all sit on GPUs with share <= 1 has
        priority <= 1e-9, see ROUNDING) and recent misses. A saturated GPU takes only
        models without a copy, so it looks only at the cold ones and the misses."""
        self._last_now = now
        if only_idle:
            # which GPUs could take a LOAD does not depend on the demand: look first
            if not self._idle:
                self._forget_misses()  # as reading the demand would have
                self._arm_load_check(now)
                return
        self._forget_misses()
        self._refresh_shares()
        warm = self._warm_wanted()  # (-priority, name), sorted: warm models and misses
        self._cold_hold = []  # the heap is read in order below: pushes wait until the end
        skip = self._cold_skip
        cold = self._cold_order(skip)  # (-priority, name) in order, read lazily
        first = next(cold, None)
        try:
            if warm or first is not None:
                self._place_loads(only_idle, warm, cold, first, now, out)
        finally:
            held, self._cold_hold = self._cold_hold, None
            skip.clear()
            for e in held:
                heapq.heappush(self._cold, e)
        self._arm_load_check(now)

    def _place_loads(self, only_idle, warm, cold, first, now, out) -> None:
        # the GPUs in placement_key order, read as far as needed
        if only_idle:
            gpus = self._idle.ordered()
        else:
            # (asked only when something is wanted: ``pcie.available`` may re-anchor a lane)
            horizon = now + self.cfg.schedule_ahead
            gpus = least_loaded([g for g in self._idle.in_service
                                 if g.available and g.pcie.available(now) < horizon])
        try:
            self._place_on(gpus, warm, cold, first, now, out)
        finally:
            gpus.close()

    def _place_on(self, gpus, warm, cold, first, now, out) -> None:
        cold_seen = [] if first is None else [first]  # the cold ones read so far, in order
        at = [cold_seen, 0]  # the list the entry yielded last sits in, and its index there
        cold_left = [True]  # whether ``cold`` may yield more

        def merged(left):  # ``left`` (sorted) and the cold ones, in order
            i, n, k = 0, len(left), 0
            while True:
                if k < len(cold_seen):
                    c = cold_seen[k]
                else:
                    c = next(cold, None) if cold_left[0] else None
                    if c is None:
                        cold_left[0] = False
                        break
                    cold_seen.append(c)
                while i < n and left[i] < c:
                    at[0], at[1] = left, i
                    yield left[i]
                    i += 1
                at[0], at[1] = cold_seen, k
                yield c
                k += 1
            while i < n:
                at[0], at[1] = left, i
                yield left[i]
                i += 1

        misses = [e for e in warm if not self.models[e[1]].instances]
        models = self.models
        evicted = False
        open_elsewhere: dict[str, bool] = {}  # (_first_copy_elsewhere's, for this look)
        for g in gpus:
            if not (warm or cold_seen or cold_left[0]):  # nothing left (misses are in warm)
                break
            spare = g.share < 1.0
            # without a spare share only models without a copy qualify: the cold ones and
            # the misses (unless an EVICT took some model's last copy)
            for e in merged(warm if spare or evicted else misses):
                negp, name = e
                if name in g.instances:
                    continue
                m = models[name]
                if m.pages > g.total_pages:
                    continue
                if m.instances and not spare:
                    continue  # another copy on a saturated GPU would relieve nobody
                bl = m.load_blocked
                if bl is not None and bl.get(g.index, 0) > now and (
                        m.ready_copies or self._first_copy_elsewhere(m, now, open_elsewhere)):
                    continue  # this GPU refused it lately (_load_refused)
                victims = self._victims(g, m, -negp, now)
                if victims is None:
                    continue
                for inst in victims:
                    self._send_evict(inst, now, out)
                    evicted = True
                self._send_load(g, m, now, out)
                # taken: out of every list, so the next GPUs do not read past it again
                # (a miss sits in ``warm`` and in ``misses``)
                src, idx = at
                del src[idx]
                if src is misses:
                    warm.remove(e)
                elif src is warm and misses and e in misses:
                    misses.remove(e)
                break

    def _arm_load_check(self, now: int) -> None:
        """Re-examine demand soon if some queued or lately missed model could use another
        copy; a model that every GPU without a copy of it holds back (``_load_refused``)
        only when the first of those back-offs ends (not every interval while none can
        end)."""
        soon = now + self.cfg.load_check_interval
        self._load_check_put_off = False
        if self._unserved or self._misses:
            self._next_load_check = soon
            return
        n = self._idle.up
        models = self.models
        at = 0
        for name in (self._queued if not self._warm_misses
                     else itertools.chain(self._queued, self._warm_misses)):
            m = models[name]
            if len(m.instances) < n:
                if m.load_blocked is None or not m.ready_copies:
                    at = soon
                    break
                t = self._unblocked_at(m, now)
                if t <= soon:
                    at = soon
                    break
                if not at or t < at:
                    at = t
        self._next_load_check = at
        self._load_check_put_off = at > soon

    def _check_loads_by(self, t: int) -> None:
        """Look at the LOAD demand again by ``t``: unless a look is due already (at most
        an interval away, ``_arm_load_check``), or one put off to a back-off's end that
        ``t`` comes before (new demand is not held back by another model's back-off)."""
        nlc = self._next_load_check
        if not nlc or (self._load_check_put_off and t < nlc):
            self._next_load_check = t
            self._load_check_put_off = False

    def _unblocked_at(self, m: ModelState, now: int) -> int:
        """When some GPU without a copy of ``m`` will no longer hold it back (``now`` if
        one does not); back-offs that have ended are forgotten."""
        bl = m.load_blocked
        for gi, until in list(bl.items()):
            if until <= now:
                del bl[gi]
        if not bl:
            m.load_blocked = None
            self._held_back.discard(m)
            return now
        insts = m.instances
        # the GPUs that could take a copy now: up, without one; held back or not
        could = [g.index for g in self._idle.in_service
                 if g.available and g.index not in insts]
        held = [bl[gi] for gi in could if gi in bl]
        if not held or len(held) < len(could):
            return now
        return min(held)

    # ------------------------------------------------------------------ LOAD demand, kept up to date

    def _push_cold(self, m: ModelState) -> None:
        """``m`` is queued without a copy and its demand changed: record it."""
        e = (-m.outstanding, m.name)
        if self._cold_hold is not None:
            self._cold_hold.append(e)  # read in order right now: added after
        else:
            heapq.heappush(self._cold, e)

    def _demand_changed(self, m: ModelState) -> None:
        """``m``'s outstanding demand or its copies changed."""
        if m.instances:
            if not m.dirty:
                m.dirty = True
                self._dirty_models.append(m)
            m.big_at = ROUNDING / (len(m.instances) + 2)
        elif m.live:
            self._push_cold(m)

    def _refresh_shares(self) -> None:
        """``g.share = g.load_share()`` for every GPU whose figure may have changed, and
        ``_over`` the GPUs with a share above 1."""
        dirty = self._dirty_gpus
        if self._dirty_models:
            big = self._big
            for m in self._dirty_models:
                m.dirty = False
                dirty.update(m.instances)
                if m.live and m.instances and m.outstanding >= m.big_at:
                    big.add(m.name)
            self._dirty_models.clear()
        if dirty:
            gpus, over, idle = self.gpus, self._over, self._idle
            for gi in dirty:
                g = gpus[gi]
                old = g.share
                s = g.share = g.load_share()
                if s != old:
                    idle.changed(g)
                if s > 1.0:
                    over.add(gi)
                else:
                    over.discard(gi)
            dirty.clear()

    def _warm_wanted(self) -> list[tuple[float, str]]:
        """The models with a copy whose demand is not met (queued beyond what their
        copies' GPUs carry, plus the recent warm misses), and the recent cold misses:
        (-priority, name), most unmet first (``_refresh_shares`` first)."""
        models, gpus, queued = self.models, self.gpus, self._queued
        out = []
        if self._misses:
            out = [(-demand, name) for name, (_, demand) in self._misses.items()
                   if name not in queued]
        names = set()
        for gi in self._over:
            for name, inst in gpus[gi].instances.items():
                if inst.model.live:
                    names.add(name)
        if self._big:
            for name in list(self._big):
                m = models.get(name)
                if (m is None or not m.live or not m.instances
                        or m.outstanding < m.big_at):
                    self._big.discard(name)
                else:
                    names.add(name)
        warm_misses = self._warm_misses
        if warm_misses:
            names.update(n for n in warm_misses if models[n].instances)
        up = self._idle.up
        for name in names:
            m = models[name]
            if len(m.instances) >= up:
                continue  # a copy on every GPU up (loading or loaded): none could take one
            miss = warm_misses.get(name) if warm_misses else None
            if m.outstanding <= 0 and miss is None:
                continue
            prio = m.outstanding
            if prio > 0:
                per_copy = prio / len(m.instances)
                for gi in m.instances:
                    s = gpus[gi].share
                    prio -= per_copy * (1.0 if s <= 1.0 else 1.0 / s)
            else:
                prio = 0.0
            if miss is not None:
                prio += miss[1]
            if prio > 1e-9:
                out.append((-prio, name))
        out.sort()  # most unmet first; ties by name
        return out

    def _cold_order(self, skip: set[str]):
        """The cold models (queued, no copy) by priority = demand, most first:
        (-priority, name), read from the heap in order without taking it apart. As of
        the start of the read: models in ``skip`` (without a copy only since) are left
        out."""
        h = self._cold
        unserved = self._unserved
        if len(h) > 2 * len(unserved) + 64:
            models = self.models
            h = self._cold = [(-models[n].outstanding, n) for n in unserved]
            heapq.heapify(h)
        models = self.models
        pop, push = heapq.heappop, heapq.heappush
        while h:  # stale entries on top (models loaded since, or with less demand now) go
            negp, name = h[0]
            if name in unserved and name not in skip and models[name].outstanding == -negp:
                break
            pop(h)
        if not h:
            return
        seen = set()
        front = [(h[0], 0)]
        n = len(h)
        while front:
            e, i = pop(front)
            j = 2 * i + 1
            if j < n:
                push(front, (h[j], j))
                if j + 1 < n:
                    push(front, (h[j + 1], j + 1))
            negp, name = e
            if name in seen or name not in unserved or name in skip:
                continue
            m = models[name]
            if m.outstanding != -negp or m.instances:
                continue
            seen.add(name)
            if m.outstanding > 1e-9:
                yield e

    def _forget_misses(self) -> None:
        """Forget the cold misses that are too old, or whose model has a copy now, and
        the warm ones that are too old, or whose model has a copy on every GPU."""
        horizon = self._last_now - MISS_MEMORY
        models = self.models
        if self._misses:
            for name, (t, _) in list(self._misses.items()):
                if t < horizon or models[name].instances:
                    del self._misses[name]
        if self._warm_misses:
            n = self._idle.up
            for name, (t, _) in list(self._warm_misses.items()):
                if t < horizon or len(models[name].instances) >= n:
                    del self._warm_misses[name]

    def _victims(self, g: GpuState, m: ModelState, prio: float, now: int) -> list[Instance] | None:
        """Instances to evict so ``m`` fits on ``g``; None if it cannot fit."""
        need = m.pages - g.free_pages
        if need <= 0:
            return []
        cands = []
        for inst in g.instances.values():
            if inst.loading or inst.inflight:
                continue
            vm = inst.model
            share = vm.outstanding / len(vm.instances) if vm.live else 0.0
            if share and share >= prio:
                continue  # as needed here as the model we would load
            cands.append((share > 0, inst.last_used, vm.name, inst))
        cands.sort(key=lambda c: c[:3])
        chosen = []
        for c in cands:
            chosen.append(c[3])
            need -= c[3].model.pages
            if need <= 0:
                return chosen
        return None

    def _send_load(self, g: GpuState, m: ModelState, now: int, out: list[Action]) -> None:
        cfg = self.cfg
        aid = self._sent.new_id()
        m.versions += 1
        e = m.est.load
        start = g.pcie.add(aid, now, e, now)
        latest = max(now + cfg.future + cfg.latest_delta, start + cfg.latest_delta)
        inst = self._place_copy(g, m, m.versions, start + e, loading=True)
        a = Action(aid, ActionType.LOAD, g.worker, g.gpu, m.name, now, latest, e,
                   version=m.versions, expected_end=start + e, sent_at=now)
        self._sent.add(a, g, inst, [])
        out.append(a)
        if m.live:
            g.active[m.name] = inst
            self._infer_soon(g, now, out)  # (after every request of on_requests is queued)

    def _place_copy(self, g: GpuState, m: ModelState, version: int, ready_at: int,
                    loading: bool) -> Instance:
        """A copy of ``m`` on ``g`` in our view: its pages taken, the indexes told."""
        inst = Instance(m, g, version, ready_at)
        inst.loading = loading
        if not loading:
            m.ready_copies += 1
        self._use_seq += 1
        inst.last_used = self._use_seq
        g.instances[m.name] = inst
        self._idle.changed(g)
        g.free_pages -= m.pages
        m.instances[g.index] = inst
        self._copy_seq += 1
        inst.seq = self._copy_seq
        self._demand_changed(m)
        if m.wide is not None:
            self._index_copy(m, inst)
        elif len(m.instances) >= self.wide_copies:
            m.wide = CopyIndex()
            for i in m.instances.values():
                self._index_copy(m, i)
        self._unserved.discard(m.name)
        return inst

    def _send_evict(self, inst: Instance, now: int, out: list[Action]) -> None:
        g = inst.gpu
        aid = self._sent.new_id()
        a = Action(aid, ActionType.EVICT, g.worker, g.gpu, inst.model.name, 0, NEVER, 0,
                   version=inst.version, expected_end=now, sent_at=now)
        self._drop_instance(inst, now)
        self._sent.add(a, g, inst, [])
        out.append(a)

    def _drop_instance(self, inst: Instance, now: int) -> None:
        g, m = inst.gpu, inst.model
        del g.instances[m.name]
        self._idle.changed(g)
        del m.instances[g.index]
        g.active.pop(m.name, None)
        self._dirty_gpus.add(g.index)
        self._demand_changed(m)
        if self._cold_hold is not None and not m.instances:
            self._cold_skip.add(m.name)
        if m.wide is not None:
            self._unindex_copy(m, g)
            m.wide.unwoken.discard(g.index)
            if len(m.instances) < max(1, self.wide_copies // 2):
                for i in m.instances.values():
                    self._unindex_copy(m, i.gpu)
                m.wide = None
        g.free_pages += m.pages
        if not inst.loading:
            m.ready_copies -= 1
        if m.removed and not m.instances:
            self._removed.pop(m.name, None)  # its last copy is gone: forget it
        elif m.live and not m.instances:
            self._unserved.add(m.name)
            self._check_loads_by(now)  # place a new copy at the next tick
        elif self._load_check_put_off and m.load_blocked:
            self._check_loads_by(now)  # its GPU may take a copy now: not after a back-off

    # ------------------------------------------------------------------ models coming and going

    def add_model(self, name: str, profile: ModelProfile, now: int) -> list[Action]:
        if name in self.models or name in self._removed:
            raise ValueError(f"model {name!r} is already known"
                             + (" (its copies are being evicted)" if name in self._removed else ""))
        if profile.model != name:
            profile = profile.renamed(name)
        self.models[name] = ModelState(profile, self.cfg)
        return []  # loaded on demand, like any model without a copy

    def remove_model(self, name: str, now: int) -> list[Action]:
        m = self.models.pop(name, None)
        if m is None:
            raise KeyError(name)
        out: list[Action] = []
        m.removed = True
        self._misses.pop(name, None)
        self._warm_misses.pop(name, None)
        self._held_back.discard(m)  # (its back-offs mean nothing now)
        if m.instances:
            self._removed[name] = m
        self._answer_queued(m, RequestStatus.INVALID_REQUEST, now, MODEL_UNLOADED)
        for inst in list(m.instances.values()):
            self._retire(inst, now, out)
        if out and (self._unserved or self._misses):
            self._schedule_loads(now, out, only_idle=False)  # the freed pages may take a LOAD
        return out

    def cancel(self, requests: list[Request], now: int) -> list[Action]:
        models = self.models
        for r in requests:
            if r.state == QUEUED:  # (one answered stays so)
                m = models.get(r.model)
                if m is not None:
                    self._unqueue(m, r)
                    self._answer(r, RequestStatus.ERROR, now, CANCELLED)
            elif r.state == EXECUTING:  # runs on; should its INFER fail, not again
                r.state = WITHDRAWN
        return []

    def answer_queued(self, now: int, why: str) -> list[Action]:
        for name in sorted(self._queued):
            m = self.models.get(name)
            if m is not None:
                self._answer_queued(m, RequestStatus.ERROR, now, why)
        return []

    def arrived_earlier(self, requests: list[Request], by: int, now: int) -> list[Action]:
        models = self.models
        for r in requests:
            if r.state != QUEUED:
                continue
            m = models.get(r.model)
            if m is None:
                continue
            r.arrival -= by
            r.deadline -= by
            r.drop_at -= by
            m.monotone = False  # (its queue's deadlines in order no more, and its batch
            m.qver += 1  # choice memo out of date)
            self._push_expiry(r.drop_at, r)  # (timed out at the next tick if past it)
        return []

    def _retire(self, inst: Instance, now: int, out: list[Action]) -> bool:
        """EVICT a removed model's copy if nothing runs or loads on it; whether it did."""
        if inst.loading or inst.inflight or inst.gpu.instances.get(inst.model.name) is not inst:
            return False
        self._send_evict(inst, now, out)
        return True

    # ------------------------------------------------------------------ answers

    def _time_out(self, m: ModelState, r: Request, now: int) -> None:
        """Queued ``r`` of ``m`` can no longer finish in time: answered TIMEOUT."""
        self._unqueue(m, r)
        self._answer(r, RequestStatus.TIMEOUT, now, "SLO cannot be met")
        if m.instances:
            self._warm_miss(m, r, r.arrival, now)

    def _warm_miss(self, m: ModelState, r: Request, came: int, now: int) -> None:
        """``r`` of ``m``, which has copies, was turned away: its copies were too busy
        for it. If a copy loaded on another GPU when it came (``came``: its arrival, or,
        turned away on admission, then: a request that comes too late for any GPU, as
        after a controller restart, says nothing of the copies) would have been ready for
        it, its demand asks for that copy (``_warm_wanted``): queued demand alone does not
        show it, as requests are sent to the copies' lanes or turned away rather than
        queued."""
        if (len(m.instances) < self._idle.up
                and r.drop_at >= came + self.cfg.future + m.est.load):
            # the GPU time turned away over about the last MISS_MEMORY, in GPUs: a few
            # requests turned away now and then (a burst, a straggler) ask for nothing
            missed = m.missed
            if missed:
                missed *= math.exp((m.missed_at - now) / MISS_MEMORY)
            missed = m.missed = missed + m.item_cost
            m.missed_at = now
            gpus = missed / MISS_MEMORY
            if gpus < WARM_MISS_GPU:
                return
            self._warm_misses[m.name] = (now, gpus)
            if not self._next_load_check or (self._load_check_put_off
                                             and m.load_blocked is None):
                self._check_loads_by(now + self.cfg.load_check_interval)

    def _answer(self, r: Request, status: RequestStatus, now: int, message: str = "",
                gpu: int = -1, batch_size: int = 0, outputs: object = None) -> None:
        r.state = DONE
        self._replies.append(Reply(r, status, now, message, gpu, batch_size, outputs))

    # ------------------------------------------------------------------ GPUs coming and going

    def set_gpu_available(self, gpu_index: int, available: bool, now: int) -> list[Action]:
        """Lost (False): forget every copy on the GPU and place nothing there; queued
        requests of models left without a copy get new ones elsewhere. Back (True): an
        empty GPU (``readmit_gpu`` with nothing kept)."""
        g = self.gpus[gpu_index]
        if available:
            return self.readmit_gpu(gpu_index, now, ())
        out: list[Action] = []
        if not g.available:
            return out
        g.available = False
        self._idle.up -= 1
        g.held = [(i.model.name, i.version)
                  for i in sorted(g.instances.values(), key=lambda i: -i.last_used)
                  if not i.loading]
        for inst in list(g.instances.values()):
            self._drop_instance(inst, now)
        g.active.clear()
        if self._unserved:
            self._schedule_loads(now, out, only_idle=False)
        return out

    def readmit_gpu(self, gpu_index: int, now: int, kept: Container[str]) -> list[Action]:
        """Back, its worker having kept the weights named in ``kept`` of those it held
        when it was lost (``held_copies``, at their versions): those are its copies
        again at once, ready, for every model still served, and no LOAD is sent for them.
        The other copies it held are loaded again, in the order it last used them, for
        every model still in use (with a copy elsewhere or requests queued) -- returning
        capacity takes its share of the load back at once instead of waiting until the
        other GPUs saturate."""
        g = self.gpus[gpu_index]
        out: list[Action] = []
        if g.available:
            return out
        g.available = True
        self._idle.up += 1
        self._idle.changed(g)
        g.free_pages = g.total_pages - sum(i.model.pages for i in g.instances.values())
        for m in self._held_back:  # what its worker refused before says nothing now
            m.load_blocked.pop(gpu_index, None)
        if self._load_check_put_off:
            self._check_loads_by(now)  # the GPU may take what others hold back at once
        held, g.held = g.held, []
        if kept:  # least recently used first: the same order as before the loss
            self._take_over(g, [(n, v) for n, v in reversed(held) if n in kept], now, out)
        for name, _ in held:
            m = self.models.get(name)
            if (m is not None and name not in g.instances and m.pages <= g.free_pages
                    and (m.instances or m.live)):
                self._send_load(g, m, now, out)
        if self._unserved:
            self._schedule_loads(now, out, only_idle=False)
        return out

    adopts_weights = True
    timed_windows = True

    def adopt_copies(self, gpu_index: int, now: int,
                     copies: Sequence[tuple[str, int]]) -> list[Action]:
        out: list[Action] = []
        self._take_over(self.gpus[gpu_index], copies, now, out)
        return out

    def _take_over(self, g: GpuState, copies: Iterable[tuple[str, int]], now: int,
                   out: list[Action]) -> None:
        """Weights ``g``'s worker holds, each (model, version), become ready copies at
        once, with no LOAD (a model no longer served, already placed there or too large
        for the free pages is skipped; later LOADs of a model carry higher versions);
        then the GPU's queued work is scheduled."""
        for name, version in copies:
            m = self.models.get(name)
            if m is None or name in g.instances or m.pages > g.free_pages:
                continue
            if version > m.versions:
                m.versions = version
            inst = self._place_copy(g, m, version, now, loading=False)
            if m.live:
                g.active[m.name] = inst
        self._schedule_infer(g, now, out)

    def remove_gpu(self, gpu_index: int, now: int) -> list[Action]:
        """Lost for good: no copies kept for its return, and the largest GPU that may
        hold a model is looked for among the others; the requests queued for a model no
        other GPU can hold are answered so at once (none could ever serve them), and with
        no GPU left every request queued is (``NO_GPU_LEFT``: they waited out their SLO)."""
        g = self.gpus[gpu_index]
        g.gone = True
        self._idle.remove(g)
        self._pages_max = max((h.total_pages for h in self._idle.in_service), default=0)
        out = self.set_gpu_available(gpu_index, False, now)
        g.held = []
        for m in self.models.values():
            if not self._pages_max:
                self._answer_queued(m, RequestStatus.ERROR, now, NO_GPU_LEFT)
            elif m.pages > self._pages_max:
                self._answer_queued(m, RequestStatus.ERROR, now, NO_GPU_FITS)
        return out

    def add_gpu(self, spec: GpuSpec, now: int) -> list[Action]:
        g = GpuState(len(self.gpus), spec.worker, spec.gpu, spec.pages, self.cfg)
        self.gpus.append(g)
        self._pages_max = max(self._pages_max, g.total_pages)
        # the LOAD placement's indexes (as for the GPUs at start): an idle PCIe lane
        self._idle.up += 1
        self._idle.add(g)
        watch(g.pcie, self._idle.hook(g))
        self._dirty_gpus.add(g.index)
        out: list[Action] = []
        if self._unserved:  # models waiting for a copy may get one here at once
            self._schedule_loads(now, out, only_idle=False)
        return out

    # ------------------------------------------------------------------ read-only views

    def held_copies(self, gpu_index: int) -> list[tuple[str, int]]:
        g = self.gpus[gpu_index]
        return [] if g.available else [(n, v) for n, v in g.held if n in self.models]

    def pages_used(self, gpu_index: int) -> int:
        """Pages of the GPU's weights cache taken in our view (loaded, loading, or
        promised to a LOAD already sent)."""
        g = self.gpus[gpu_index]
        return g.total_pages - g.free_pages

    def queued(self) -> int:
        return self._live

    def model_view(self, model: str) -> ModelView | None:
        m = self.models.get(model) or self._removed.get(model)
        if m is None:
            return None
        on = tuple(sorted(m.instances))
        return ModelView(on, tuple(i for i in on if m.instances[i].loading), m.live, m.removed)

    def stats(self) -> dict[str, int]:
        return self._sent.counts()
