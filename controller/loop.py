"""The controller's driver: the one piece of glue between a scheduling policy (a pure
core) and whatever carries its messages.

The simulator and the gRPC controller service both run a ``ControllerLoop``; they differ
only in the ``ControllerTransport`` they hand it (an event queue on a virtual clock, or
gRPC streams and an asyncio timer on the real clock). The loop never reads a clock:
every call says what time it is (int ns, the controller's clock).

What it does, for every event:

- feeds the event to the policy (``request``/``requests``, ``results``, ``tick``,
  ``worker_lost``/``worker_back``, ``add_worker``, ``remove_worker``/``drain_worker``);
- sends the actions the policy returned, one batch per worker (``send``), remembering
  each as outstanding until its result comes back; an action for a worker that is not
  connected, or is being drained, fails at once;
- answers every reply the policy produced (``answer``);
- arms one timer (``arm``) for the policy's next wakeup or the next failure to feed.

A lost worker's outstanding actions fail back into the policy as results with status
``WORKER_LOST`` (an INFER's: the scheduler forgets the copy and retries or answers the
requests; a LOAD's: the copy is dropped from its view).
These failures are fed ``FAIL_DELAY`` later from the timer, never from inside the policy
call that produced the actions (no hot loop while a worker is gone).

Liveness: a worker can hang without its connection closing. Every action sent has a
bound -- its predicted end plus ``max(slack_min, slack_frac x expected duration)``. When
an action is still outstanding at its bound the loop probes its worker (``probe``: a
message the worker answers at once, which the transport reports with ``heard_from``);
unanswered within ``probe_timeout`` the worker is *suspect*: treated as lost (its
requests are re-planned elsewhere while they can still make their deadlines, and its
late results are dropped). The first message heard from a suspect worker starts its
re-admission: it is the same process, with the weights it had, so the loop asks the
transport to ``reset`` it -- keep the copies its GPUs held (``keep_list``, from
``Policy.held_copies``), drop every other weights and everything in flight. When the
worker has answered the reset (``reset_done``: it has caught up with everything sent
before it, and says which of those weights it had) its GPUs are the policy's again, with
those copies ready at once (``readmit_gpu``, no LOAD). A worker that reconnects is
handled alike (``worker_back`` with what it kept). A worker that is merely slow answers
the probe and is left alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Container
from dataclasses import dataclass
from typing import Protocol

from clockwork.actions import NEVER, Action, ErrorCode, Result
from clockwork.requests import Reply, Request
from clockwork.time import RESULT_SPAN_MAX_NS, ms
from controller.policy import GpuSpec, Policy

FAIL_DELAY = ms(2)  # a failed action's result reaches the policy this much later
# the answer to a request that came while no worker was connected and answering
NO_WORKER_FOR_REQUEST = ("no worker is available to serve the model (none is connected "
                         "and answering); try again once a worker is back")


@dataclass(frozen=True, slots=True)
class Liveness:
    """When an outstanding action makes the loop probe its worker, and how long the
    worker has to answer before it is suspect (int ns)."""

    slack_min: int = ms(10)
    slack_frac: float = 0.5
    probe_timeout: int = ms(50)
    enabled: bool = True
    # an action still unanswered this long after it was first found overdue (and at
    # least twice its expected duration), from a worker that answers its probes, makes
    # the worker suspect all the same: a device that hangs under a live process
    stuck_min: int = ms(1000)
    # every this long, a worker with nothing outstanding that was not heard from for as
    # long is probed (0: never): a worker that hangs while idle is found before work is
    # placed on it, not only once an action sent to it is overdue
    idle_probe: int = ms(500)
    # with no worker taking work this long, the requests queued are answered ``no_worker``
    # (``Policy.answer_queued``; 0: never)
    no_worker_wait: int = ms(2000)

    @classmethod
    def of(cls, cfg) -> Liveness:
        """From a ``SchedulerConfig`` (its ``probe_*``, ``liveness`` and ``no_worker_wait``
        settings)."""
        return cls(cfg.probe_slack, cfg.probe_slack_frac, cfg.probe_timeout, cfg.liveness,
                   idle_probe=cfg.probe_idle, no_worker_wait=cfg.no_worker_wait)


class ControllerTransport(Protocol):
    """What carries the loop's output. Every method is called from the loop's caller's
    thread, inside a loop call; none may call back into the loop."""

    def send(self, worker: int, actions: list[Action]) -> None:
        """Deliver these actions (one message) to ``worker``, which is connected."""

    def answer(self, replies: list[Reply]) -> None:
        """Answer these requests (each is answered exactly once, in one call or another)."""

    def arm(self, at: int) -> None:
        """Call ``loop.tick`` at or after ``at``. Replaces any timer armed for later; the
        loop never arms a time later than one still pending."""

    def probe(self, worker: int) -> None:
        """Ask ``worker`` for an immediate answer; report it with ``loop.heard_from``."""

    def reset(self, worker: int, keep: list[tuple[int, str, int]]) -> None:
        """Tell ``worker`` to drop everything in flight and every weights but
        ``keep``'s, each (its GPU on the worker, model, version): it is being re-admitted
        after it was suspect. Report its answer with ``loop.reset_done``, with the
        weights it kept."""

    def drained(self, worker: int, failed: int) -> None:
        """``worker``, being drained (``loop.drain_worker``), has no action outstanding
        any more: each answered, or ``failed`` of them failed when it was lost. Take it
        out now with ``loop.remove_worker`` (outside this call). Said once per drain."""


class LoopObserver:
    """Optional hooks for counters and metrics (the defaults do nothing)."""

    def sent(self, action: Action) -> None:
        pass

    def result(self, action: Action | None, result: Result) -> None:
        """A result reached the policy; ``action`` is None for a failure the loop made."""

    def unknown(self, worker: int, result: Result) -> None:
        """A result for no outstanding action (a duplicate, or from before a loss)."""

    def suspect(self, worker: int, failed: int, reason: str = "") -> None:
        """``worker`` is suspect (``reason``: no answer to a probe, or an action of its
        long overdue though it answers them); ``failed`` actions were failed."""

    def readmitted(self, worker: int) -> None:
        """A suspect worker was heard from again and is being reset and re-admitted."""


class ControllerLoop:
    """Drives ``policy`` through ``transport``. ``specs``: the GPUs, in the policy's
    index order. ``telemetry`` (optional) records every sent action and its result."""

    def __init__(self, policy: Policy, transport: ControllerTransport, specs: list[GpuSpec],
                 telemetry=None, observer: LoopObserver | None = None,
                 liveness: Liveness | None = None) -> None:
        self.policy = policy
        self.transport = transport
        self.telemetry = telemetry
        self.observer = observer or LoopObserver()
        # the hooks an observer overrides (a default, no-op hook is never called)
        kind = type(self.observer)
        self._obs_sent = None if kind.sent is LoopObserver.sent else self.observer.sent
        self._obs_result = None if kind.result is LoopObserver.result else self.observer.result
        n = 1 + max((s.worker for s in specs), default=-1)
        self.gpus_of: list[list[int]] = [[] for _ in range(n)]
        for i, s in enumerate(specs):
            self.gpus_of[s.worker].append(i)
        self.local = [s.gpu for s in specs]  # policy GPU index -> the GPU on its worker
        self.n_gpus = len(specs)
        self.up = [True] * n
        # up and not leaving (``drain_worker``): what the policy places is sent there
        self.takes = [True] * n
        self.n_up = n  # how many of ``takes`` are True: the workers up that take work
        self.outstanding: list[dict[int, Action]] = [{} for _ in range(n)]
        self.armed: int | None = None  # the time the transport's timer is set for
        self._failed: list[tuple[int, Result]] = []  # (due, result), due ascending
        self.liveness = liveness or Liveness()
        self._live = self.liveness.enabled
        # (bound, action id, worker, 0 = first look / 1 = the look for a stuck action) heap
        self._due: list[tuple[int, int, int, int]] = []
        self.probing: dict[int, int] = {}  # worker -> when its probe's answer is due
        # workers whose probe the transport has not yet said it wrote (``probe_sent``)
        self._unsent: set[int] = set()
        self.heard = [0] * n  # when each worker was last heard from
        # each worker's last idle probe: when it was sent (until answered), and the round
        # trip its answer took (a worker far away, or on a slow link, is given longer)
        self._idle_sent: dict[int, int] = {}
        self._idle_rtt = [0] * n
        # the next look for idle workers not heard from (``_probe_idle``; None: not yet
        # started, at the first event)
        self._idle_at: int | None = None
        self._again: set[int] = set()  # the workers on a second probe (``_check_liveness``)
        self.suspect = [False] * n
        self.resetting = [False] * n  # reset sent, its answer not yet heard
        self.removed = [False] * n  # left the cluster for good (``remove_worker``)
        # its GPUs left the policy at the start of a drain (``drain_worker``): nothing
        # more is placed there, and nothing takes them back; ``draining``: those whose
        # transport has not yet been told ``drained``
        self.leaving = [False] * n
        self.draining: set[int] = set()
        # the earliest of: the next failure to feed, the next liveness bound of an
        # outstanding action, the next probe deadline (NEVER: none). Recomputed when
        # ``_dirty`` (after any event that can change one of them but a new request)
        self._other = NEVER
        self._dirty = False
        # when the requests queued are answered ``no_worker`` if no worker takes work by
        # then (NEVER: one does; ``_none_up``)
        self._unserved_at = NEVER

    # ------------------------------------------------------------------ events

    def no_worker(self) -> bool:
        """Whether no worker is connected and answering and takes work (each lost,
        suspect, not yet re-admitted: its reset unanswered, or being drained): a request
        is then answered at once, ERROR
        ``no_worker`` (``NO_WORKER_FOR_REQUEST``), not handed to the policy to wait out
        its SLO for a GPU none can give it. False for a loop with no worker at all (its
        caller adds them later, or never serves)."""
        return not self.n_up and bool(self.up)

    def request(self, r: Request, now: int) -> None:
        self._after(self.policy.on_request(r, now), now)

    def requests(self, rs, now: int) -> None:
        """Several requests that arrived together: admitted at one ``now``, their actions
        sent and replies answered once."""
        self._after(self.policy.on_requests(list(rs), now), now)

    def cancel(self, rs, now: int) -> None:
        """The callers of these requests went away (``Policy.cancel``)."""
        self._after(self.policy.cancel(list(rs), now), now)

    def arrived_earlier(self, rs, by: int, now: int) -> None:
        """These requests were sent ``by`` ns earlier than they were admitted as
        (``Policy.arrived_earlier``)."""
        self._after(self.policy.arrived_earlier(list(rs), by, now), now)

    def results(self, worker: int, results: list[Result], now: int) -> None:
        """Results from ``worker``, their times already on the controller's clock. A
        result claiming to end after ``now`` (a clock-offset error) is clamped to ``now``.
        Those of a removed worker are dropped (its actions failed when it was removed)."""
        if self.removed[worker]:
            return
        self._dirty = True
        self.heard[worker] = now
        if worker in self.probing or self.suspect[worker]:
            self.heard_from(worker, now)
        outstanding = self.outstanding[worker]
        on_result = self.policy.on_result
        tel, obs = self.telemetry, self._obs_result
        out: list[Action] = []
        for r in results:
            a = outstanding.pop(r.id, None)
            if a is None:
                self.observer.unknown(worker, r)
                continue
            if r.end > now:  # the worker's clock ahead of ours: moved back, span and all
                r.begin -= r.end - now
                r.end = now
            if r.end - r.begin > RESULT_SPAN_MAX_NS:  # (a worker's begin far back: its
                r.begin = r.end - RESULT_SPAN_MAX_NS  # span would become an estimate)
            if obs is not None:
                obs(a, r)
            if tel is not None:
                tel.result(r, now)
            out.extend(on_result(r, now))
        self._after(out, now)
        if self.draining and worker in self.draining and not outstanding:
            self.draining.discard(worker)
            self.transport.drained(worker, 0)

    def tick(self, now: int) -> None:
        """The armed timer fired (the transport may call this early or late)."""
        lag = now - self.armed if self.armed is not None else 0  # how late we are
        self.armed = None
        self._dirty = True
        out: list[Action] = []
        failed = self._failed
        if failed and failed[0][0] <= now:
            k = 0
            while k < len(failed) and failed[k][0] <= now:
                k += 1
            due, self._failed = failed[:k], failed[k:]
            on_result, tel, obs = self.policy.on_result, self.telemetry, self._obs_result
            for _, r in due:
                r.received = r.begin = r.end = now
                if obs is not None:
                    obs(None, r)
                if tel is not None:
                    tel.result(r, now)
                out.extend(on_result(r, now))
        if self._live:
            self._check_liveness(now, lag)
            if self._idle_at is not None and now >= self._idle_at:
                self._probe_idle(now)
        if now >= self._unserved_at:
            self._unserved_at = NEVER
            if self.no_worker():
                out.extend(self.policy.answer_queued(now, NO_WORKER_FOR_REQUEST))
        nw = self.policy.next_wakeup()
        if nw is not None and nw <= now:
            out.extend(self.policy.on_tick(now))
        self._after(out, now)

    def probe_sent(self, worker: int, now: int) -> None:
        """The transport wrote a probe to ``worker`` at ``now``: a live link's writer runs
        some time after the probe was asked for (``transport.probe``), on a busy
        controller tens of milliseconds; the answer is waited for ``probe_timeout`` from
        the write (that wait counted against the worker: healthy workers of a controller
        under overload were found suspect, their work failed ``worker_lost``). A longer
        wait set already (an idle probe's) is kept. Only the first write after each ask
        counts."""
        if worker not in self._unsent:
            return  # (an echo written for the clock's sake, or a probe's again: the wait
            # was counted from its first write; moved on at each, a hung worker whose
            # socket still took the echoes was never found suspect)
        self._unsent.discard(worker)
        until = self.probing.get(worker)
        if until is not None and until < now + self.liveness.probe_timeout:
            self.probing[worker] = now + self.liveness.probe_timeout

    def heard_from(self, worker: int, now: int) -> None:
        """The transport got a message from ``worker`` (a result or a probe's answer)."""
        if self.removed[worker]:
            return
        self._dirty = True
        self.heard[worker] = now
        if self._idle_sent:
            sent = self._idle_sent.pop(worker, None)
            if sent is not None:
                self._idle_rtt[worker] = now - sent
        self.probing.pop(worker, None)
        self._unsent.discard(worker)
        self._again.discard(worker)
        if self.suspect[worker] and not self.leaving[worker]:  # (one drained is not
            # taken back: it is removed once the transport hears ``drained``)
            self.suspect[worker] = False
            self.resetting[worker] = True
            self.observer.readmitted(worker)
            self.transport.reset(worker, self.keep_list(worker))

    def keep_list(self, worker: int) -> list[tuple[int, str, int]]:
        """The weights a lost ``worker`` is asked to keep, each (its GPU on the worker,
        model, version): the copies its GPUs held (``Policy.held_copies``); none for a
        worker not (yet) added."""
        if not 0 <= worker < len(self.gpus_of):
            return []
        held = self.policy.held_copies
        return [(self.local[g], model, version) for g in self.gpus_of[worker]
                for model, version in held(g)]

    def reset_done(self, worker: int, now: int, kept: dict[int, Container[str]]) -> None:
        """``worker`` answered the reset sent when it was re-admitted, having kept
        ``kept`` (its GPU -> the models whose weights it kept): its GPUs are the policy's
        again, with those copies (``readmit_gpu``)."""
        if not self.resetting[worker] or self.removed[worker] or self.leaving[worker]:
            return  # lost, removed or drained meanwhile, or not ours
        self.resetting[worker] = False
        self._back(worker, now, kept)

    def _check_liveness(self, now: int, lag: int = 0) -> None:
        probing = self.probing
        if lag > self.liveness.probe_timeout // 2:
            # we ourselves ran this late (a saturated CPU): an answer may be waiting
            # unread; give every probe a fresh timeout instead of blaming the workers (an
            # idle probe's longer wait kept)
            fresh = now + self.liveness.probe_timeout
            for w, until in probing.items():
                if until < fresh:
                    probing[w] = fresh
            return
        if probing:
            for w in [w for w, until in probing.items() if until <= now]:
                del probing[w]
                self._unsent.discard(w)  # (its late answer, if it comes, is still the round
                # trip an idle probe's next wait is made of: a slow link's)
                if w not in self._again and self.up[w] and self.n_up == 1:
                    # the only worker up: found suspect, every request would be answered
                    # no_worker at once, and no work could move elsewhere; a process
                    # starved of CPU (a burst on a small host) misses one probe, so it
                    # gets a second before that
                    self._again.add(w)
                    self._ask(w, now + self.liveness.probe_timeout)
                    continue
                self._again.discard(w)
                self._suspect(w, now, "no answer to a probe")
        due, outstanding, up = self._due, self.outstanding, self.up
        while due and due[0][0] <= now:
            _, aid, w, again = heapq.heappop(due)
            a = outstanding[w].get(aid)
            if a is None or not up[w]:
                continue  # answered, or its worker is gone already
            if not again:  # overdue: is its worker alive? And look at it once more later
                if w not in probing:
                    self._ask(w, now + self.liveness.probe_timeout)
                elif w in self._idle_sent and probing[w] > now + self.liveness.probe_timeout:
                    probing[w] = now + self.liveness.probe_timeout  # (an idle probe's
                    # longer wait: cut; not one counted from its write, ``probe_sent``)
                wait = max(self.liveness.stuck_min, 2 * a.expected_duration)
                heapq.heappush(due, (now + wait, aid, w, 1))
            elif w in probing:  # the probe out decides first
                heapq.heappush(due, (probing[w] + 1, aid, w, 1))
            else:  # long overdue, and its worker answers: it will never finish there
                self._suspect(w, now, "an action long overdue, though the "
                                      "worker answers probes")

    def _probe_idle(self, now: int) -> None:
        """Probe each worker that takes work, has nothing outstanding, is not probed or
        being re-admitted already, and was not heard from for ``idle_probe``: one that
        does not answer within half that (at least ``probe_timeout``) is suspect
        (``_check_liveness``), before a request is placed on it. Next look
        ``idle_probe`` later."""
        every = self.liveness.idle_probe
        since = now - every
        # (no work waits on the answer: a worker starved of CPU on a busy host is given
        # half the look's interval, not the probe timeout; an action sent meanwhile and
        # overdue cuts the wait back to the probe timeout, ``_check_liveness``)
        wait = max(self.liveness.probe_timeout, every // 2)
        probing, heard, outstanding = self.probing, self.heard, self.outstanding
        rtt, sent = self._idle_rtt, self._idle_sent
        for w, takes in enumerate(self.takes):
            if takes and heard[w] <= since and not outstanding[w] and w not in probing \
                    and not self.resetting[w]:
                # (a worker whose last answer took longer is given twice that, up to four
                # looks' time: one on a link slower than the wait was found suspect at
                # every look; each answer's time counts, so one hang's is forgotten)
                sent[w] = now
                self._ask(w, now + max(wait, min(2 * rtt[w], 4 * every)))
        self._idle_at = now + every
        self._dirty = True

    def _ask(self, w: int, until: int) -> None:
        """Probe ``w``, its answer waited for until ``until`` (moved on once the transport
        writes the probe, ``probe_sent``)."""
        self.probing[w] = until
        self._unsent.add(w)
        self.transport.probe(w)

    def _forget_probe(self, worker: int) -> None:
        """``worker`` is back: a probe out before is no longer waited for, and an idle
        probe's send time kept would have been taken, at its next answer, for a round
        trip of the whole time away (its idle probes then waited 2 s, not 250 ms)."""
        self.probing.pop(worker, None)
        self._unsent.discard(worker)
        self._idle_sent.pop(worker, None)

    def _none_up(self, now: int) -> None:
        """A worker stopped taking work: with none left that does, the requests queued
        are answered ``no_worker`` once ``no_worker_wait`` has passed (``tick``) unless
        one is back by then (as a request that arrives meanwhile is, at once)."""
        wait = self.liveness.no_worker_wait
        if not self.n_up and wait and self._unserved_at == NEVER:
            self._unserved_at = now + wait
            self._dirty = True

    def _suspect(self, w: int, now: int, reason: str) -> None:
        """``w`` is suspect (``reason``): handled as lost (``worker_lost``) until it is
        heard from."""
        self.suspect[w] = True
        failed = self.worker_lost(w, now, f"worker suspect ({reason})")
        self.observer.suspect(w, failed, reason)
    def worker_lost(self, worker: int, now: int, why: str = "worker lost",
                    for_good: bool = False) -> int:
        """``worker`` went away: the policy places nothing on its GPUs until it is back
        (``for_good``: never, ``Policy.remove_gpu``), and its outstanding actions fail.
        A worker being drained (``drain_worker``) had its GPUs out of the policy already:
        its transport is told ``drained`` (with how many failed). Returns how many
        actions failed."""
        if self.takes[worker]:
            self.n_up -= 1
            self._none_up(now)
        self.up[worker] = self.takes[worker] = False
        self.resetting[worker] = False
        self._dirty = True
        self.probing.pop(worker, None)
        self._unsent.discard(worker)
        self._again.discard(worker)
        lost = list(self.outstanding[worker].values())
        self.outstanding[worker].clear()
        out: list[Action] = []
        policy = self.policy
        if not self.leaving[worker]:
            for g in self.gpus_of[worker]:
                out.extend(policy.remove_gpu(g, now) if for_good
                           else policy.set_gpu_available(g, False, now))
        self._fail(lost, why, now)
        self._after(out, now)
        if worker in self.draining:
            self.draining.discard(worker)
            self.transport.drained(worker, len(lost))
        return len(lost)

    def remove_worker(self, worker: int, now: int) -> int:
        """``worker`` leaves the cluster for good (an operator's ``remove_worker``): as
        for a lost worker (``worker_lost``), the policy places nothing more on its GPUs
        and its outstanding actions fail (their requests placed again elsewhere where
        their SLO allows, else answered), and nothing brings it back: what is still
        heard from it is ignored. Its index stays taken (a worker added later gets the
        next one). Returns how many actions failed; 0 for one removed already."""
        if self.removed[worker]:
            return 0
        self.removed[worker] = True
        self.suspect[worker] = False
        self.draining.discard(worker)  # (removed before its drain ended: nothing to say)
        return self.worker_lost(worker, now, "worker removed", for_good=True)

    def drain_worker(self, worker: int, now: int) -> int:
        """``worker`` is to leave the cluster gently: the policy places nothing more on
        its GPUs from now (``Policy.remove_gpu``: their queued work goes elsewhere, as for
        ``remove_worker``), but the actions it has in flight run to their end there and
        their results are the policy's as usual. When none is left outstanding (at once
        if none is), or the worker is lost before, the transport is told ``drained``,
        and its caller then removes it (``remove_worker``, which fails whatever is still
        outstanding: the caller's bound on the wait). A drained worker is not taken back
        on a reconnection. Returns how many actions were outstanding; 0 for one removed
        or drained already."""
        if self.removed[worker] or self.leaving[worker]:
            return 0
        self.leaving[worker] = True
        if self.takes[worker]:  # (first: work one of its GPUs leaves goes to no other of
            self.n_up -= 1  # them, and an action made for it fails back at once)
            self.takes[worker] = False
            self._none_up(now)
        self._dirty = True
        out: list[Action] = []
        for g in self.gpus_of[worker]:
            out.extend(self.policy.remove_gpu(g, now))
        self._after(out, now)
        n = len(self.outstanding[worker])
        if n and self.up[worker]:
            self.draining.add(worker)
        else:  # (nothing in flight, or lost: what it had in flight failed already)
            self.transport.drained(worker, 0)
        return n

    def add_worker(self, specs: list[GpuSpec], now: int) -> int:
        """A worker joins at run time with these GPUs (each spec's ``worker`` is the new
        worker's index: the number of workers so far, which this returns). The policy
        gets each GPU (``add_gpu``: the next GPU indices) and may place copies on them at
        once."""
        w = len(self.up)
        if any(s.worker != w for s in specs):
            raise ValueError(f"the new worker's GPUs must name worker {w}")
        self.gpus_of.append([])
        self.heard.append(now)
        self._idle_rtt.append(0)
        self.up.append(True)
        self.takes.append(True)
        self.n_up += 1
        self.outstanding.append({})
        self.suspect.append(False)
        self.resetting.append(False)
        self.removed.append(False)
        self.leaving.append(False)
        out: list[Action] = []
        for s in specs:
            try:
                got = self.policy.add_gpu(s, now)
            except NotImplementedError:
                if self.gpus_of[w]:
                    raise
                for per_worker in (self.gpus_of, self.up, self.takes, self.outstanding,
                                   self.suspect, self.resetting, self.removed, self.leaving,
                                   self.heard, self._idle_rtt):
                    per_worker.pop()  # (a policy that cannot grow: no worker was added)
                self.n_up -= 1
                raise
            out.extend(got)
            self.gpus_of[w].append(self.n_gpus)
            self.local.append(s.gpu)
            self.n_gpus += 1
        self._unserved_at = NEVER  # (a worker takes work: nothing waits for one)
        self._after(out, now)
        return w

    def adopt(self, worker: int, now: int, held: dict[int, list[tuple[str, int]]]) -> None:
        """At start, before any request: ``worker`` still holds ``held`` (its GPU -> the
        weights fully loaded there, each (model, version)) from an earlier controller,
        kept through this controller's Hello; the policy takes them over as its copies
        (``Policy.adopt_copies``; only a policy with ``adopts_weights``)."""
        out: list[Action] = []
        for g in self.gpus_of[worker]:
            copies = held.get(self.local[g])
            if copies:
                out.extend(self.policy.adopt_copies(g, now, copies))
        self._after(out, now)

    def worker_back(self, worker: int, now: int,
                    kept: dict[int, Container[str]] | None = None) -> None:
        """``worker`` is connected again, having kept ``kept`` (its GPU -> the models
        whose weights it kept, of ``keep_list``; None: an empty weights cache). A removed
        or drained worker is not taken back."""
        if self.removed[worker] or self.leaving[worker]:
            return
        self.suspect[worker] = False
        self.resetting[worker] = False
        self._back(worker, now, kept or {})

    def _back(self, worker: int, now: int, kept: dict[int, Container[str]]) -> None:
        if not self.takes[worker]:
            self.n_up += 1
            self._unserved_at = NEVER
        self.up[worker] = self.takes[worker] = True
        self._dirty = True
        self.heard[worker] = now
        self._forget_probe(worker)
        out: list[Action] = []
        for g in self.gpus_of[worker]:
            out.extend(self.policy.readmit_gpu(g, now, kept.get(self.local[g], ())))
        self._after(out, now)

    def apply(self, actions: list[Action], now: int) -> None:
        """What the policy produced when the caller changed it directly (a model added or
        removed by the operator): the actions are sent, the replies answered, the timer
        armed, as after any event."""
        self._after(actions, now)

    # ------------------------------------------------------------------ output

    def _after(self, actions: list[Action], now: int) -> None:
        """Send ``actions``, answer the policy's replies, arm the timer."""
        if actions:
            tel, sent = self.telemetry, self._obs_sent
            takes, outstanding = self.takes, self.outstanding
            batches: dict[int, list[Action]] = {}
            dead: list[Action] = []
            live, due, push = self._live, self._due, heapq.heappush
            lv = self.liveness
            slack_min, slack_frac = lv.slack_min, lv.slack_frac
            low = NEVER  # the earliest liveness bound pushed
            for a in actions:
                a.sent_at = now
                if sent is not None:
                    sent(a)
                if tel is not None:
                    tel.sent(a)
                w = a.worker
                if takes[w]:
                    outstanding[w][a.id] = a
                    if live:
                        slack = int(a.expected_duration * slack_frac)
                        end = a.expected_end if a.expected_end > now else now
                        bound = end + (slack if slack > slack_min else slack_min)
                        push(due, (bound, a.id, w, 0))
                        if bound < low:
                            low = bound
                    b = batches.get(w)
                    if b is None:
                        batches[w] = [a]
                    else:
                        b.append(a)
                else:
                    dead.append(a)
            send = self.transport.send
            for w, b in batches.items():
                send(w, b)
            if dead:
                leaving = self.leaving
                for why, acts in (("worker not connected", [a for a in dead
                                                            if not leaving[a.worker]]),
                                  ("worker leaving (drained)", [a for a in dead
                                                                if leaving[a.worker]])):
                    if acts:
                        self._fail(acts, why, now)
            if low < self._other and not self._dirty:
                self._other = low
        replies = self.policy.drain_replies()
        if replies:
            self.transport.answer(replies)
        if self._idle_at is None and self._live and self.liveness.idle_probe:
            self._idle_at = now + self.liveness.idle_probe  # (the first event: looks begin)
            self._dirty = True
        # arm the timer: the policy's next wakeup, the next failure to feed, the next
        # liveness bound, probe deadline or look at idle workers, whichever is first
        nw = self.policy.next_wakeup()
        if self._dirty:
            self._other = self._earliest_other()
            self._dirty = False
        other, armed = self._other, self.armed
        if armed is not None and nw is not None and armed <= nw and armed <= other:
            return  # most calls: the timer armed will do
        if nw is None or other < nw:
            if other == NEVER:
                return
            nw = other
        if nw < now:
            nw = now
        if armed is not None and armed <= nw:
            return
        self.armed = nw
        self.transport.arm(nw)

    def _earliest_other(self) -> int:
        at = self._failed[0][0] if self._failed else NEVER
        if self._unserved_at < at:
            at = self._unserved_at
        if self._live:
            due, outstanding = self._due, self.outstanding
            while due and due[0][1] not in outstanding[due[0][2]]:
                heapq.heappop(due)  # answered in time
            if due and due[0][0] < at:
                at = due[0][0]
            if self.probing:
                until = min(self.probing.values())
                if until < at:
                    at = until
            if self._idle_at is not None and self._idle_at < at:
                at = self._idle_at
        return at

    def _fail(self, actions: list[Action], why: str, now: int) -> None:
        self._dirty = True
        due = now + FAIL_DELAY
        for a in actions:
            self._failed.append((due, Result(id=a.id, type=a.type, status=ErrorCode.WORKER_LOST,
                                             worker=a.worker, gpu=a.gpu, model=a.model,
                                             batch_size=a.batch_size,
                                             received=due, begin=due, end=due, message=why)))
