"""An in-process cluster on a virtual clock (composition root): the controller's and the
workers' own drivers (``controller.loop``, ``worker.loop``) -- the code the live services
run -- joined by a simulated network in a discrete-event loop.

``simulate(scenario)`` runs a scenario and returns a ``SimResult`` whose
``summary`` holds the keys listed in docs/contracts.md. The same seed gives the same
summary.
"""

from __future__ import annotations

import copy
import gc
import heapq
import os
import platform
import sys
import time
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clockwork.actions import NEVER, RequestStatus
from clockwork.profiles import ProfileSet, load_profile_set
from clockwork.requests import Reply, Request
from clockwork.resources import scenario_folder
from clockwork.scenario import (
    Scenario,
    ScenarioError,
    cache_fit_error,
    cache_pages,
    clock_offsets_error,
    faults_error,
    in_time_order,
    instance_names,
    joining_workers,
    leaving_workers,
    load_scenario,
    override_list,
    repository_plan,
    restarts_error,
    validate,
)
from clockwork.sizes import PROGRESS_LOG_S
from clockwork.telemetry import Telemetry, format_summary, no_requests_warning, write_run
from clockwork.time import CLIENT_GRACE_NS, NS_PER_S, ms, sec
from clockwork.workloads import Workload, build_workload, end_note
from controller import (
    events_policy_error,
    make_policy,
    policy_class,
    split_settings,
    table_policy,
    unused_line,
)
from controller.config import SchedulerConfig, jitter_note, reach_note
from controller.loop import NO_WORKER_FOR_REQUEST, ControllerLoop, Liveness, LoopObserver
from controller.policy import GpuSpec, Policy
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor, held_weights, keep_weights
from worker.loop import WorkerLoop


class SimulationWarning(UserWarning):
    """What ``clockwork simulate`` warns of on stderr, from ``simulate()``: settings the
    policy does not use, a network slower than the policy's windows (every action
    refused), rows that stopped going to ``spill_dir``, a run that submitted no
    requests."""


@dataclass
class SimResult:
    summary: dict
    telemetry: Telemetry
    scenario: Scenario
    wall_s: float
    events: int
    # what ``clockwork simulate`` warns of (``SimulationWarning``'s texts), in its words
    warnings: list[str] = field(default_factory=list)
    # the scenario's faults and events as they played out: (seconds, what happened)
    event_log: list[tuple[float, str]] = field(default_factory=list)

    def write(self, out: str | Path, log_format: str | None = None) -> Path:
        """The run's files in ``out`` (``clockwork simulate --out``'s), the logs as
        ``log_format`` ("tsv" or "npz"; default the telemetry's, "tsv")."""
        return write_run(out, self.telemetry, self.summary,
                         run_info(self.wall_s, self.scenario, self.events),
                         log_format=log_format)

    def table(self) -> str:
        return format_summary(self.summary)


def run_info(wall_s: float, sc: Scenario, events: int | None = None) -> dict:
    """What a run's inputs do not determine (``run.json``); ``events``: the simulator's
    event count (a live run has none to count, and says nothing of it)."""
    import clockwork

    return {
        "wall_s": round(wall_s, 3),
        **({} if events is None else {"events": events}),
        "scenario": sc.source,
        "overrides": sc.overrides,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "clockwork": getattr(clockwork, "__version__", "0"),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor(),
    }


# event kinds (the two that are a request arriving first: ``kind <= _SUBMIT``)
_OPEN, _SUBMIT, _TO_WORKER, _WAKE, _TO_CTRL, _TICK, _FAULT = range(7)
_PROBE = "probe"  # a controller -> worker message that is not actions (nor a reset)
_RESET_DONE = "reset done"  # a worker's answer to a reset
_TAKEN_OVER = "taken over"  # a worker's answer to a new controller's reset
LOAD_RETRY_NS = 1_000_000  # a [[repository]] load waits for the unload's evictions in these steps


@dataclass(slots=True)
class _Reset:
    """The controller's reset of a worker it re-admits: the weights to keep, each
    (GPU, model, version); everything else is dropped. ``epoch`` > 0: a new controller
    (the ``epoch``-th) taking the worker over; ``keep`` None: keep every weights held."""

    keep: list[tuple[int, str, int]] | None
    epoch: int = 0


class Simulation:
    """A scenario on a virtual clock: one ``ControllerLoop`` and one ``WorkerLoop`` per
    worker -- the drivers the live services run -- joined by a simulated network (an
    event queue) instead of gRPC. ``[faults]`` are modelled here: a killed worker loses
    its state and the messages sent to it, and the controller sees its connection close
    ``detect_ms`` later; a hung worker handles nothing until it resumes; a slow link
    delays messages; a controller restart fails what the controller had not answered and
    starts a new ControllerLoop (a new policy) that takes the workers over. Messages
    between the controller and a worker stay in order (one connection each way)."""

    def __init__(self, sc: Scenario, progress: bool = False,
                 spill_dir: str | Path | None = None) -> None:
        """``spill_dir``: keep the request and action rows in files in a new folder
        inside it instead of in memory (a long run's memory stays flat; see
        ``Telemetry``). ``sc`` is checked again, as ``load_scenario`` checks it: a
        script may have changed its ``data`` since it was read. A Simulation runs once."""
        if not isinstance(sc, Scenario):
            raise ScenarioError("Simulation: a clockwork.scenario.Scenario is needed "
                                f"(load_scenario makes one), got {sc!r}")
        checked = Scenario(sc.data, sc.source, list(sc.overrides), sc.folder)
        validate(checked)  # (checked.data: the validated copy; sc is left as it is)
        self.sc = sc = checked
        self._ran = False
        self.progress = progress
        self.spill_dir = spill_dir
        c = sc.cluster
        try:
            self.pset: ProfileSet = load_profile_set(str(c["profiles"]),
                                                     scenario_folder(sc))
        except ValueError as e:
            raise ScenarioError(str(e)) from e
        self.instances = instance_names(sc.models)
        try:
            self.profiles = {i: self.pset.get(m).renamed(i) for i, m in self.instances.items()}
        except ValueError as e:
            raise ScenarioError(str(e)) from e
        pages = cache_pages(sc, self.pset)
        why = cache_fit_error(sc, self.pset)
        if why:
            raise ScenarioError(why)
        # the workers at the start, then those [[add_workers]] adds during the run
        self.joins = joining_workers(sc)
        W0, G = int(c["workers"]), int(c["gpus_per_worker"])
        W = W0 + len(self.joins)
        self.W, self.G = W, G
        self.specs = specs = [GpuSpec(w, g, pages) for w in range(W) for g in range(G)]
        self.start_specs = specs[:W0 * G]  # (the controller's at the start)
        policy, sched = table_policy(sc.scheduler)
        try:
            common, extra = split_settings(policy, sched)
            cfg = SchedulerConfig.from_ms(**common)
            # (kept: a controller that restarts builds its new policy from them)
            self._policy_args = (policy, list(self.profiles.values()), self.start_specs, cfg,
                                 extra)
            self.policy: Policy = make_policy(*self._policy_args)
        except (TypeError, ValueError) as e:
            # (a check across settings names its table itself: said once)
            raise ScenarioError(f"[scheduler]: {str(e).removeprefix('scheduler: ')}") from e
        self.cfg = cfg
        self._adopts = policy_class(policy).adopts_weights
        self.faults = sc.data.get("faults") or {}
        why = restarts_error(sc)
        if why:
            raise ScenarioError(why)
        self.repository = repository_plan(sc)
        self.leaves = leaving_workers(sc)
        why = events_policy_error(policy, bool(self.repository), bool(self.joins))
        if why:
            raise ScenarioError(why)
        why = faults_error(sc)
        if why:
            raise ScenarioError(why)
        root = np.random.SeedSequence(sc.seed)
        s_work, s_dev, s_net = root.spawn(3)
        self._dev_seeds = [int(s.generate_state(1)[0]) for s in s_dev.spawn(len(specs))]
        self._dev_args = (float(c["noise"]), float(c["slow_prob"]), float(c.get("slow_factor", 3.0)))
        self.pages = pages
        self.latency = ms(float(c["network_latency_ms"]))
        self.jitter = ms(float(c["jitter_ms"]))
        # a link slower than the policy's windows: every action refused (said, not refused:
        # a run may study it)
        timed = policy_class(policy).timed_windows
        self.reach_note = reach_note(cfg, self.latency) if timed else ""
        self.jitter_note = jitter_note(cfg, self.latency, self.jitter) if timed else ""
        self._net_rng = np.random.default_rng(s_net)
        # clocks: worker w's clock is the simulation's + offsets[w]; the controller
        # converts windows and result times with its estimate, off by up to clock_error_ms
        why = clock_offsets_error(sc)
        if why:
            raise ScenarioError(why)
        given = [ms(float(x)) for x in c.get("clock_offsets_ms", [])]
        given += [0] * (W - len(given))
        # the executors' times start at 0 (a simulated clock starts at 0; a live monotonic
        # clock is far from it): shift every worker clock so that none starts below 0
        lift = max(0, -min(given))
        self.offsets = [o + lift for o in given]
        err = ms(float(c.get("clock_error_ms", 0.0)))
        draws = np.random.default_rng(s_net.spawn(1)[0]).uniform(-1.0, 1.0, W)
        self.estimates = [o + round(err * d) for o, d in zip(self.offsets, draws, strict=True)]
        self._jit: list[int] = []
        self.duration = sec(sc.duration_s)
        exec1 = {i: p.exec_ns[p.batch_sizes[0]] for i, p in self.profiles.items()}
        self.workloads: list[Workload] = []
        notes: list[str] = []  # (workloads' warnings: arrivals that end early, ...)
        wseeds = s_work.spawn(len(sc.workloads))
        for i, spec in enumerate(sc.workloads):
            try:  # (what bind refuses too: the run's length and the entry's values)
                w = build_workload(spec, self.instances, scenario_folder(sc))
                w.bind(0, self.duration, np.random.default_rng(wseeds[i]), exec1)
            except ValueError as e:
                raise ScenarioError(f"workloads.{i}: {e}") from e
            self.workloads.append(w)
            # (a trace shorter than the run: said, the figures are the whole run's)
            said = [*getattr(w, "notes", ()), end_note(w, sc.duration_s)]
            notes += [f"warning: workloads.{i} ({w.kind}): {n}" for n in said if n]
        self.telemetry = Telemetry(0, spill_dir=spill_dir)
        self._executors: list[GpuExecutor] = []  # every one made, for their peak pages
        # (time, what happened): the faults, the [[repository]] events ("repository: ...")
        # and the workers that joined ("cluster: ...")
        self.fault_log: list[tuple[int, str]] = []
        # said before the run (``clockwork simulate``'s stderr lines, without its name)
        self.warnings: list[str] = list(notes)
        policy_name, policy_table = table_policy(sc.scheduler)
        line = unused_line(policy_name, policy_table)
        if line:
            self.warnings.append(line)
        if self.joins and policy_class(policy_name).places_once:
            self.warnings.append(
                f"warning: add_workers: policy {policy_name!r} keeps a model's copies where "
                "they were placed (until evicted), so the workers that join serve only the "
                "models placed after they join (scaling out may show no gain for it)")
        if self.reach_note:
            self.warnings.append(f"warning: cluster.network_latency_ms: {self.reach_note}")
        if self.jitter_note:
            self.warnings.append(f"warning: cluster.jitter_ms: {self.jitter_note}")

    def executors_of(self, w: int, restart: int = 0) -> list[GpuExecutor]:
        """Worker ``w``'s GPUs with empty caches (``restart``: how many times it restarted;
        a restarted worker's emulated devices draw new random numbers)."""
        noise, slow_prob, slow_factor = self._dev_args
        out = []
        for g in range(self.G):
            seed = self._dev_seeds[w * self.G + g] + 7919 * restart
            out.append(GpuExecutor(w, g, self.pages, self.profiles,
                                   EmulatedDevice(noise, seed, slow_prob, slow_factor)))
        self._executors.extend(out)
        return out

    @property
    def max_pages_used(self) -> int:
        """The most pages ever in use at once on one GPU."""
        return max((e.peak_pages for e in self._executors), default=0)

    # ------------------------------------------------------------------ network

    def _delay(self) -> int:
        if not self.jitter:
            return self.latency
        if not self._jit:
            self._jit = (self._net_rng.random(4096) * self.jitter).astype(np.int64).tolist()
        return self.latency + self._jit.pop()

    # ------------------------------------------------------------------ loop

    def run(self) -> SimResult:
        if self._ran:  # (its policy, workloads and logs are those of the first run)
            raise RuntimeError("this Simulation has run already: make a new one for "
                               "another run")
        self._ran = True
        # The loop allocates millions of short-lived, acyclic objects (requests, actions,
        # results); reference counting frees them, and the cyclic collector's scans of
        # the growing logs cost ~10 % of the run. Pause it for the run.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            self._release_transports()
            if gc_was_enabled:
                gc.enable()

    def _release_transports(self) -> None:
        """Empty the classes ``_run`` makes for its transports and observer, whose
        methods close over the run's state (its telemetry, event heap, workloads, this
        simulation): a class is always in a reference cycle, so they held the run's rows
        until the cyclic collector's next pass, which ``run`` turns off for the next run
        (a loop of ``simulate`` calls held two runs' rows at a time; a ``spill_dir``
        folder outlived its result, for good in a forked pool's worker)."""
        kinds = set()
        ctrl = getattr(self, "controller", None)
        if ctrl is not None:
            kinds |= {ctrl.transport, type(ctrl.observer)}
        kinds.update(type(wl.transport) for wl in getattr(self, "workers", None) or ())
        for cls in kinds:
            if isinstance(cls, type) and "<locals>" in cls.__qualname__:
                for name, v in list(vars(cls).items()):
                    if isinstance(v, staticmethod | types.FunctionType):
                        delattr(cls, name)

    def _run(self) -> SimResult:
        heap: list = []
        push, pop = heapq.heappush, heapq.heappop
        seq = 0
        tel = self.telemetry
        W = self.W
        workloads = self.workloads
        open_next: list = [None] * len(workloads)
        # the workloads that answer replies with new requests (closed loops)
        closed = [type(w).on_reply is not Workload.on_reply for w in workloads]
        # the virtual time, requests answered-pending and submitted (closure cells: the
        # transports below read them)
        now = outstanding = next_id = 0
        delay = self._delay
        fixed = None if self.jitter else self.latency  # the delay when it never varies
        # per worker: alive, hung until (0: not hung), restarts, extra delay,
        # the last arrival time each way (messages stay in order)
        alive = [True] * W
        hung = [0] * W
        restarts = [0] * W
        gen = [0] * W  # worker generation: a restart or a reset makes a new one
        # the controller's connection to each worker: since when (what was sent before
        # went down with an earlier connection), and whether a kill has cut it and the
        # controller not reconnected yet (what it sends meanwhile is lost)
        conn_at = [0] * W
        cut = [False] * W
        slow = [0] * W
        last_in = [0] * W  # controller -> worker
        last_out = [0] * W  # worker -> controller

        def arrival(w: int, now: int, last: list) -> int:
            t = now + delay() + slow[w]
            if t < last[w]:
                t = last[w]
            last[w] = t
            return t

        offsets, estimates = self.offsets, self.estimates

        def to_worker_clock(actions, est):
            """Copies of the actions with their windows on the worker's clock (as the
            live controller's wire conversion makes them)."""
            out = []
            for a in actions:
                b = copy.copy(a)
                if b.earliest:
                    b.earliest += est
                if b.latest < NEVER:
                    b.latest += est
                out.append(b)
            return out

        def to_worker(w, payload):
            """One message (actions, a probe or a reset) on the link to worker ``w``."""
            nonlocal seq
            seq += 1
            # arrival(w, now, last_in), inlined: once per message
            t = now + (delay() if fixed is None else fixed) + slow[w]
            if t < last_in[w]:
                t = last_in[w]
            last_in[w] = t
            push(heap, (t, seq, _TO_WORKER, (w, now, payload)))

        default_slo = self.cfg.default_slo
        no_answer = 0  # requests answered past their SLO and the client's grace

        def gave_up(r: Request, at: int) -> Reply:
            return Reply(r, RequestStatus.TIMEOUT, at, f"no answer {(at - r.arrival) / 1e6:.0f} "
                         f"ms after it was submitted (its SLO {r.slo / 1e6:g} ms plus "
                         f"{CLIENT_GRACE_NS / NS_PER_S:g} s)")

        class ToWorkers:  # the controller's side of the network
            @staticmethod
            def send(w, actions):
                if estimates[w]:
                    actions = to_worker_clock(actions, estimates[w])
                to_worker(w, actions)

            @staticmethod
            def probe(w):
                to_worker(w, _PROBE)

            @staticmethod
            def reset(w, keep):
                to_worker(w, _Reset(keep))
                log.append((now, f"controller resets worker {w}, keeping {len(keep)} "
                                 "cached model(s)"))

            @staticmethod
            def answer(replies):
                nonlocal seq, outstanding, no_answer
                reply = tel.reply
                outstanding -= len(replies)
                for rep in replies:
                    r = rep.request
                    if not r.slo:  # (one the policy answered before it took the default:
                        r.slo = default_slo  # its row's deadline, as live, from that)
                    given_up = r.arrival + r.slo + CLIENT_GRACE_NS
                    if rep.time > given_up:
                        # answered past the SLO and the client's grace (a policy that
                        # keeps requests, under overload): its client gave it up by then,
                        # TIMEOUT no_answer, as a live replay's does
                        rep = gave_up(r, given_up)
                        no_answer += 1
                    reply(rep)
                    if track:
                        unanswered.pop(r.id, None)
                    tag = r.tag
                    if tag is not None and closed[tag]:
                        for t, m, slo in workloads[tag].on_reply(r.model, rep.status == 0, now):
                            seq += 1
                            push(heap, (t, seq, _SUBMIT, (m, slo, tag)))

            @staticmethod
            def arm(at):
                nonlocal seq
                seq += 1
                push(heap, (at, seq, _TICK, None))

            @staticmethod
            def drained(w, failed):  # (its removal: an event at this instant, outside
                # the loop)
                drain_failed[w] = failed
                fault_at(now, "remove", w)

        class ToController:  # one worker's side of the network
            __slots__ = ("w", "restart")

            def __init__(self, w: int, restart: int) -> None:
                self.w, self.restart = w, restart

            def results(self, results):
                nonlocal seq
                w = self.w
                est = estimates[w]
                if est:  # to the controller's clock, with its estimate of the offset
                    for r in results:  # (0: a time the worker did not set, left so, as
                        if r.received:  # clockwork.protocol.wire.msg_to_result leaves it)
                            r.received -= est
                        if r.begin:
                            r.begin -= est
                        if r.end:
                            r.end -= est
                seq += 1
                # arrival(w, now, last_out), inlined
                t = now + (delay() if fixed is None else fixed) + slow[w]
                if t < last_out[w]:
                    t = last_out[w]
                last_out[w] = t
                push(heap, (t, seq, _TO_CTRL, (w, results)))

            def run(self, executor, action):  # emulated executors never start open actions
                raise AssertionError("the simulator's executors are emulated")

            def arm(self, at):
                nonlocal seq
                seq += 1
                push(heap, (at - offsets[self.w], seq, _WAKE, (self.w, self.restart)))

        log = self.fault_log

        class Observer(LoopObserver):
            def suspect(self, w, failed, reason=""):
                log.append((now, f"controller suspects worker {w}; {failed} "
                                          "action(s) failed"))

        ctrl = ControllerLoop(self.policy, ToWorkers, self.start_specs, tel, Observer(),
                              Liveness.of(self.cfg))
        self.controller = ctrl
        wloops = [WorkerLoop(w, self.executors_of(w), ToController(w, 0)) for w in range(W)]
        self.workers = wloops

        request = ctrl.request
        # controller restarts: the requests not answered yet (a controller that dies fails
        # them), whether a controller serves now, and the requests that wait for one
        ctrl_restarts = self.faults.get("controller_restart") or ()
        track = bool(ctrl_restarts)
        unanswered: dict[int, Request] = {}
        ctrl_up = True
        waiting: list[Request] = []

        def submit(model, slo, widx, at, into=None):
            """A request that came at ``at``, to the controller (or into the list ``into``
            of the requests that came with it, for ``submit_together``)."""
            nonlocal next_id, outstanding
            rid = next_id
            next_id += 1
            outstanding += 1
            r = Request(rid, model, at, slo, widx)
            if track:
                unanswered[rid] = r
                if not ctrl_up:  # the client's call waits for the new controller
                    waiting.append(r)
                    return
            if into is not None:
                into.append(r)
            elif ctrl.n_up or not ctrl.up:  # (not ctrl.no_worker(), without the call)
                request(r, at)
            else:
                turn_away([r], at)

        # the requests that arrived at this instant before the one being handled (the
        # event loop keeps them here while the next event is another arrival at it)
        together: list[tuple] = []

        def submit_together(model, slo, widx, at):
            """The last request of several that came at one instant (the others in
            ``together``): they reach the controller together (as a message of several
            does live: ``ControllerLoop.requests``), so that they can share a batch."""
            rs: list[Request] = []
            together.append((model, slo, widx))
            for m, s, w in together:
                submit(m, s, w, at, rs)
            together.clear()
            if rs:
                if ctrl.no_worker():
                    turn_away(rs, at)
                else:
                    ctrl.requests(rs, at)

        def turn_away(rs, at):
            """No worker is connected and answering (``ControllerLoop.no_worker``): each
            request answered at once, ERROR, as the live intake answers it (no_worker);
            but one for a model not served (unloaded, being unloaded) goes to the policy,
            which answers it INVALID_REQUEST, as the live intake does before that."""
            view = ctrl.policy.model_view
            away: list[Reply] = []
            unserved: list[Request] = []
            for r in rs:
                v = view(r.model)
                if v is None or v.removing:
                    unserved.append(r)
                else:
                    away.append(Reply(r, RequestStatus.ERROR, at, NO_WORKER_FOR_REQUEST))
            if away:
                ToWorkers.answer(away)
            if unserved:
                ctrl.requests(unserved, at)

        def fault_at(t, what, *args):
            nonlocal seq
            seq += 1
            push(heap, (t, seq, _FAULT, (what, args)))

        fl = self.faults
        for f in in_time_order(fl.get("kill")):
            fault_at(sec(f["at_s"]), "kill", f["worker"])
            if f.get("back_s") is not None:
                fault_at(sec(f["back_s"]), "restart", f["worker"])
        for f in in_time_order(fl.get("hang")):
            fault_at(sec(f["at_s"]), "hang", f["worker"], sec(f["at_s"] + f["for_s"]))
        for f in ctrl_restarts:
            fault_at(sec(f["at_s"]), "controller_dies", -1)
            fault_at(sec(f["at_s"] + f["down_s"]), "controller_starts", -1,
                     self._adopts and not f["fresh_caches"])
        # the new controller's epoch (a count of restarts); the workers whose messages go
        # to a controller that is gone; what each worker kept for the new one
        epoch = 0
        deaf = [False] * W
        taken: dict[int, dict[int, list[tuple[str, int]]]] = {}
        adopting = False
        adopted = 0  # copies the new controllers took over, all restarts together

        def controller_dies(now):
            nonlocal ctrl_up, epoch
            ctrl_up = False
            epoch += 1
            for i in range(W):
                deaf[i] = True
            # (those still waiting for a controller never reached one: they wait on)
            held = {r.id for r in waiting}
            lost = [r for r in unanswered.values() if r.id not in held]
            ToWorkers.answer([Reply(r, RequestStatus.ERROR, now, "the controller died")
                              for r in lost])
            n = tel.forget_unfinished()
            log.append((now, f"controller died: {len(lost)} request(s) failed, {n} "
                             "action(s) lost"))

        def controller_starts(now, adopt):
            nonlocal adopting
            adopting = adopt
            taken.clear()
            for i in range(W):  # its Hello to each worker: reset, keeping what it holds
                to_worker(i, _Reset(None if adopt else [], epoch))
            log.append((now, "a new controller starts and takes the workers over"
                             + (" (keeping their weights)" if adopt else
                                " (emptying their caches)")))

        def taken_over(now, w, held):
            """Worker ``w`` answered the new controller's Hello; once every worker has,
            the new controller serves (its policy adopts the weights kept)."""
            nonlocal ctrl, request, results, tick, ctrl_up, adopted
            deaf[w] = False
            taken[w] = held
            if len(taken) < W:
                return
            self.policy = make_policy(*self._policy_args)
            ctrl = ControllerLoop(self.policy, ToWorkers, self.start_specs, tel, Observer(),
                                  Liveness.of(self.cfg))
            self.controller = ctrl
            request, results, tick = ctrl.request, ctrl.results, ctrl.tick
            n = 0
            if adopting:
                for i in range(W):
                    if any(taken[i].values()):
                        ctrl.adopt(i, now, taken[i])
                        n += sum(len(c) for c in taken[i].values())
            ctrl_up = True
            adopted += n
            log.append((now, f"the new controller serves ({n} cached model(s) taken over, "
                             f"{len(waiting)} request(s) waited for it)"))
            if waiting:
                ctrl.requests(list(waiting), now)
                waiting.clear()

        for f in in_time_order(fl.get("slow_network")):
            fault_at(sec(f["at_s"]), "slow", f["worker"], ms(f["delay_ms"]))
            fault_at(sec(f["at_s"] + f["for_s"]), "slow", f["worker"], 0)
        for at, w in self.joins:
            fault_at(sec(at), "join", w)
        for at, w, drain in self.leaves:  # (after the joins at one time, before the
            fault_at(sec(at), "drain" if drain else "remove", w)  # repository)
        for k, (at, what, name, insts) in enumerate(self.repository):
            fault_at(sec(at), what, -1, name, insts, k)
        repo_next = [0]  # the [[repository]] event to play next: they go strictly in order
        detect = ms(float(fl.get("detect_ms", 1.0)))
        reconnect = sec(float(fl.get("reconnect_s", 0.7)))

        drain_failed: dict[int, int] = {}  # drained workers: their actions a loss failed
        kills = [0] * W  # each worker's kills so far
        seen = [0] * W  # ... of which the controller has seen the connection close

        def see_loss(w, now):
            seen[w] = kills[w]
            n = ctrl.worker_lost(w, now, "worker lost")
            log.append((now, f"controller lost worker {w}; {n} action(s) failed"))

        def on_fault(now, what, args):
            nonlocal seq
            w = args[0]
            if what == "controller_dies":
                controller_dies(now)
            elif what == "controller_starts":
                controller_starts(now, args[1])
            elif what == "kill":
                if alive[w]:
                    alive[w] = False
                    cut[w] = True
                    hung[w] = 0
                    kills[w] += 1
                    log.append((now, f"worker {w} killed"))
                    fault_at(now + detect, "lost", w, kills[w])
            elif what == "lost":
                if seen[w] < args[1] and not ctrl.removed[w]:  # (not seen at a reconnection
                    # already; a removed worker is not the controller's any more)
                    see_loss(w, now)
            elif what == "restart":
                if not alive[w]:
                    restarts[w] += 1
                    gen[w] += 1
                    alive[w] = True
                    wloops[w] = WorkerLoop(w, self.executors_of(w, gen[w]),
                                           ToController(w, gen[w]))
                    log.append((now, f"worker {w} restarted"))
                    fault_at(now + reconnect, "back", w, restarts[w])
            elif what == "back":
                if alive[w] and restarts[w] == args[1] and not ctrl.removed[w]:
                    if seen[w] < kills[w]:  # (reconnecting, it finds the connection gone:
                        see_loss(w, now)  # detect_ms longer than restart and reconnect_s)
                    cut[w] = False
                    conn_at[w] = now
                    ctrl.worker_back(w, now)
                    log.append((now, f"controller reconnected to worker {w}"))
            elif what == "hang":
                if alive[w] and args[1] > hung[w]:
                    hung[w] = args[1]
                    log.append((now, f"worker {w} hung until {args[1] / NS_PER_S:g} s"))
                    fault_at(args[1], "resume", w, args[1])
            elif what == "resume":
                if alive[w] and hung[w] == args[1]:
                    hung[w] = 0
                    log.append((now, f"worker {w} resumed"))
                    wloops[w].timer(now + offsets[w])
            elif what == "slow":
                slow[w] = args[1]
            elif what == "join":  # as Client.add_worker: the controller connects it now
                G = self.G
                got = ctrl.add_worker(self.specs[w * G:(w + 1) * G], now)
                if got != w:  # (joins go in index order: never)
                    raise RuntimeError(f"worker {w} joined as worker {got}")
                conn_at[w] = now
                log.append((now, f"cluster: worker {w} joined ({G} GPU(s))"))
            elif what == "remove":  # as Client.remove_worker: taken out, its link closed
                if ctrl.removed[w]:
                    return
                n = ctrl.remove_worker(w, now)
                cut[w] = True
                lost = drain_failed.pop(w, None)  # (None: not drained)
                log.append((now, f"cluster: worker {w} removed" + (
                    f"; {n} action(s) failed" if lost is None else " (drained)"
                    if not n + lost else f" (not drained: {n + lost} action(s) failed)")))
            elif what == "drain":  # as Client.remove_worker(drain=True): nothing more
                # placed there; taken out once its actions in flight are answered
                if not ctrl.up[w]:  # (lost or suspect: removed at once, as live)
                    n = ctrl.remove_worker(w, now)
                    cut[w] = True
                    log.append((now, f"cluster: worker {w} removed (not drained: {n} "
                                     "action(s) failed)"))
                    return
                n = ctrl.drain_worker(w, now)
                log.append((now, f"cluster: worker {w} draining ({n} action(s) in "
                                 "flight)"))
            elif what in ("unload", "load"):
                # one after another, as a live run's calls go: an event waits for the one
                # before it, and a load for an unload's copies still being evicted (as the
                # live repository's load does), looked at again a millisecond later
                _, name, insts, k = args
                if k != repo_next[0] or (what == "load" and any(
                        self.policy.model_view(i) is not None for i in insts)):
                    fault_at(now + LOAD_RETRY_NS, what, *args)
                    return
                repo_next[0] += 1
                if what == "load" and not ctrl.n_up:
                    # (the live repository refuses a load then: no worker to take it)
                    log.append((now, f"repository: load {name} failed: no worker is "
                                     "connected and answering"))
                    return
                # (as the live repository: what is served already is not loaded again, and
                # unloading what is not served, after a load that failed, does nothing)
                view = self.policy.model_view
                insts = [i for i in insts if (view(i) is None if what == "load" else
                                              view(i) is not None and not view(i).removing)]
                out = []
                for i in insts:
                    out += (self.policy.remove_model(i, now) if what == "unload"
                            else self.policy.add_model(i, self.profiles[i], now))
                ctrl.apply(out, now)
                log.append((now, f"repository: {what}ed {name} ({len(insts)} instance(s))"))

        for i, w in enumerate(workloads):
            for t, m, slo in w.initial(0):
                seq += 1
                push(heap, (t, seq, _SUBMIT, (m, slo, i)))
            nxt = w.next_arrival()
            if nxt is not None:
                open_next[i] = nxt
                seq += 1
                push(heap, (nxt[0], seq, _OPEN, i))

        wall0 = time.perf_counter()
        last_report = wall0
        events = 0
        hard_stop = self.duration + sec(float(self.sc.data.get("drain_s", 120.0)))
        results, tick = ctrl.results, ctrl.tick
        progress, duration = self.progress, self.duration
        # on a terminal a line redrawn every second; in a log file a line every 30 s
        tty = sys.stderr.isatty()
        every, end = (1.0, "\r") if tty else (PROGRESS_LOG_S, "\n")
        while heap:
            now, s, kind, a = pop(heap)
            if now > hard_stop:
                break
            events += 1
            if kind == _OPEN:  # the most frequent event first
                _, m, slo = open_next[a]
                nxt = workloads[a].next_arrival()
                open_next[a] = nxt
                if nxt is not None:
                    seq += 1
                    push(heap, (nxt[0], seq, _OPEN, a))
                if heap and heap[0][0] == now and heap[0][2] <= _SUBMIT:
                    together.append((m, slo, a))  # another arrives at this instant
                    continue
                if together:
                    submit_together(m, slo, a, now)
                else:
                    submit(m, slo, a, now)
            elif kind == _TO_CTRL:
                if track and deaf[a[0]]:  # to a controller that is gone: lost
                    if a[1] is _TAKEN_OVER and a[2] == epoch:
                        taken_over(now, a[0], a[3])
                elif a[1] is _PROBE:
                    ctrl.heard_from(a[0], now)
                elif a[1] is _RESET_DONE:
                    ctrl.reset_done(a[0], now, a[2])
                else:
                    results(a[0], a[1], now)
            elif kind == _TO_WORKER:
                w, sent, actions = a
                if not alive[w] or cut[w] or sent < conn_at[w]:
                    # the worker is dead, or this went on a connection its death cut (to
                    # it, or after it, before the controller reconnected to its restart)
                    pass
                elif hung[w] > now:
                    push(heap, (hung[w], s, kind, a))  # handled when it resumes, in order
                elif actions is _PROBE:  # answered at once
                    seq += 1
                    push(heap, (arrival(w, now, last_out), seq, _TO_CTRL, (w, _PROBE)))
                elif type(actions) is _Reset:  # nothing in flight, only the kept weights
                    gen[w] += 1
                    fresh = self.executors_of(w, gen[w])
                    old, keep = wloops[w].executors, actions.keep
                    kept = keep_weights(old, fresh, held_weights(old) if keep is None else keep,
                                        now + offsets[w])
                    wloops[w] = WorkerLoop(w, fresh, ToController(w, gen[w]))
                    seq += 1  # the answer says what it kept
                    if actions.epoch:  # to a new controller: each GPU's (model, version)s
                        answer = (w, _TAKEN_OVER, actions.epoch, {
                            e.gpu: [(n, e.weights[n].version) for n in e.loaded_models()]
                            for e in fresh})
                    else:
                        answer = (w, _RESET_DONE, dict(enumerate(kept)))
                    push(heap, (arrival(w, now, last_out), seq, _TO_CTRL, answer))
                else:
                    wloops[w].submit(actions, now + offsets[w])
            elif kind == _WAKE:
                w, g = a
                wl = wloops[w]
                wnow = now + offsets[w]
                if wl.armed == wnow and g == gen[w] and alive[w] and hung[w] <= now:
                    wl.timer(wnow)
            elif kind == _SUBMIT:  # (as _OPEN's tail: one branch each costs 0.2 % less
                m, slo, widx = a   # than a shared one, on a whole run's instructions)
                if heap and heap[0][0] == now and heap[0][2] <= _SUBMIT:
                    together.append(a)  # another arrives at this instant
                    continue
                if together:
                    submit_together(m, slo, widx, now)
                else:
                    submit(m, slo, widx, now)
            elif kind == _TICK:
                if ctrl.armed == now and ctrl_up:  # (no timer of a controller that died)
                    tick(now)
            else:  # _FAULT
                on_fault(now, *a)
            if progress and not events & 0x3FFF:
                wall = time.perf_counter()
                if wall - last_report >= every:
                    last_report = wall
                    self._report(now, wall - wall0, next_id, end)
            # (and no action still running: a LOAD sent after the last answer gets its
            # row in the action log, as the pages it holds are counted)
            if not outstanding and now >= duration and self._quiet(heap) \
                    and not tel.unfinished_actions():
                break
        wall_s = time.perf_counter() - wall0
        if self.progress:
            self._report(min(now, self.duration) if heap else self.duration, wall_s,
                         next_id, end="\n")
        if outstanding:
            # a worker still to come back or join after the end: more drain would help
            coming = any(e[2] == _FAULT and e[3][0] in ("restart", "join") for e in heap)
            if not any(alive) and not coming:  # (more drain would not help: say why)
                wait = self.cfg.no_worker_wait / 1e6  # (ms)
                raise RuntimeError(
                    f"simulation ended with {outstanding} unanswered request(s): every "
                    "worker was killed for good (no back_s), and policy "
                    f"{self.sc.scheduler.get('policy', 'clockwork')!r} keeps the requests "
                    "it held then for a GPU "
                    + ("for good (scheduler.no_worker_wait_ms = 0)" if not wait else
                       f"until {wait:g} ms after the last worker went (no_worker_wait_ms), "
                       "past drain_s here")
                    + " (later ones are answered ERROR, no worker, as the live controller "
                    "answers them); give a kill a back_s, or keep a worker")
            raise RuntimeError(
                f"simulation ended with {outstanding} unanswered request(s) at drain_s = "
                f"{self.sc.data.get('drain_s', 120.0):g} s after duration_s: give them "
                "longer (--set drain_s=...)")
        extra = {
            "seed": self.sc.seed,
            "policy": self.sc.scheduler.get("policy", "clockwork"),
            "gpus": len(self.specs),
            "model_instances": len(self.instances),
            "cache_pages": self.pages,
            "max_pages_used": self.max_pages_used,
        }
        if ctrl_restarts:
            extra["weights_adopted"] = adopted
        if no_answer:  # (as a live replay's summary says them)
            extra["no_answer"] = no_answer
        tel.seal()  # (--spill-dir: the rows' folder goes now, the rows stay readable)
        summary = tel.summary(self.sc.duration_s, extra)
        said = list(self.warnings)
        if tel.spill_error is not None:
            said.append(f"warning: rows stopped going to --spill-dir ({tel.spill_error}); "
                        "the rest were kept in memory")
        empty = no_requests_warning(summary, self.sc.duration_s)
        if empty:
            said.append(empty)
        return SimResult(summary, tel, self.sc, wall_s, events, said,
                         [(t / NS_PER_S, what) for t, what in self.fault_log])

    @staticmethod
    def _quiet(heap) -> bool:
        """Only timers left (no requests, worker traffic or faults pending)."""
        return all(k == _TICK or k == _WAKE for _, _, k, _ in heap) if len(heap) < 64 else False

    def _report(self, now: int, wall: float, n: int, end: str = "\r") -> None:
        pct = 100.0 * min(now, self.duration) / self.duration
        rate = n / wall if wall > 0 else 0.0
        sys.stderr.write(f"  simulated {now / NS_PER_S:8.1f} s / {self.duration / NS_PER_S:.1f} s "
                         f"({pct:5.1f} %)  {n:,} requests  {rate:,.0f} req/s wall{' ' * 6}{end}")
        sys.stderr.flush()




def simulate(scenario: Scenario | str | Path | dict, overrides: list[str] | str | None = None,
             progress: bool = False, spill_dir: str | Path | None = None) -> SimResult:
    """Run a scenario (a ``Scenario``, a TOML path or a shipped scenario's name, or a
    dict) in the simulator; ``overrides``: ``--set`` assignments, a list of them or one
    string (``spill_dir``: see ``Simulation``). Anything else raises ``ScenarioError``
    naming the parameter. What ``clockwork simulate`` warns of on stderr is a
    ``SimulationWarning`` (those about the settings before the run, the others after it),
    and is in the result's ``warnings``."""
    overrides = override_list(overrides, "simulate")
    if not isinstance(progress, bool):  # (progress="no" turned it on)
        raise ScenarioError(f"simulate: progress must be True or False, got {progress!r}")
    if spill_dir is not None:  # (as --spill-dir is checked: before anything is built)
        import argparse

        from clockwork.cluster.cli.argtypes import out_dir

        if not isinstance(spill_dir, str | os.PathLike):
            raise ScenarioError(f"simulate: spill_dir must be a folder's path (a str or a "
                                f"path), got {spill_dir!r}")
        try:
            out_dir(os.fspath(spill_dir))
        except argparse.ArgumentTypeError as e:
            raise ScenarioError(f"simulate: spill_dir: {e}") from None
    if not isinstance(scenario, Scenario | dict | str | os.PathLike):
        raise ScenarioError("simulate: a scenario is needed: a scenario file's path, a "
                            "shipped scenario's name (`clockwork scenarios` lists them), a "
                            f"dict or a clockwork.scenario.Scenario, got {scenario!r}")
    if isinstance(scenario, Scenario):
        if overrides:  # (the same file: its folder still finds the scenario's traces)
            sc = load_scenario(data=scenario.data, overrides=overrides, source=scenario.source,
                               folder=scenario.folder)
            sc.overrides = [*scenario.overrides, *overrides]
        else:
            sc = scenario
    elif isinstance(scenario, dict):
        sc = load_scenario(data=scenario, overrides=overrides)
    else:
        sc = load_scenario(scenario, overrides)
    sim = Simulation(sc, progress, spill_dir)
    for line in sim.warnings:
        warnings.warn(line.removeprefix("warning: "), SimulationWarning, stacklevel=2)
    res = sim.run()
    for line in res.warnings[len(sim.warnings):]:
        warnings.warn(line.removeprefix("warning: "), SimulationWarning, stacklevel=2)
    return res
