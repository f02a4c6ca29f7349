"""An in-process cluster on a virtual clock: the production scheduler and the
worker semantics wired by a discrete-event loop (composition root).

``simulate(scenario)`` runs a scenario and returns a ``SimResult`` whose
``summary`` holds the keys listed in docs/contracts.md. The same seed gives the same
summary.
"""

from __future__ import annotations

import gc
import heapq
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clockwork.profiles import ProfileSet, load_profile_set
from clockwork.requests import Request
from clockwork.resources import scenario_folder
from clockwork.scenario import Scenario, ScenarioError, instance_names, load_scenario
from clockwork.telemetry import Telemetry, format_summary, write_run
from clockwork.time import NS_PER_S, VirtualClock, ms, sec
from clockwork.workloads import Workload, build_workload
from controller import make_policy, split_settings
from controller.config import SchedulerConfig
from controller.policy import GpuSpec, Policy
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor

# event kinds
_OPEN, _SUBMIT, _TO_WORKER, _WAKE, _TO_CTRL, _TICK = range(6)


@dataclass
class SimResult:
    summary: dict
    telemetry: Telemetry
    scenario: Scenario
    wall_s: float
    events: int

    def write(self, out: str | Path) -> Path:
        return write_run(out, self.telemetry, self.summary,
                         run_info(self.wall_s, self.scenario, self.events))

    def table(self) -> str:
        return format_summary(self.summary)


def run_info(wall_s: float, sc: Scenario, events: int = 0) -> dict:
    import clockwork

    return {
        "wall_s": round(wall_s, 3),
        "events": events,
        "scenario": sc.source,
        "overrides": sc.overrides,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "clockwork": getattr(clockwork, "__version__", "0"),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor(),
    }


class Simulation:
    def __init__(self, sc: Scenario, progress: bool = False) -> None:
        self.sc = sc
        self.progress = progress
        c = sc.cluster
        try:
            self.pset: ProfileSet = load_profile_set(str(c["profiles"]))
        except ValueError as e:
            raise ScenarioError(str(e)) from e
        self.instances = instance_names(sc.models)
        try:
            self.profiles = {i: self.pset.get(m).renamed(i) for i, m in self.instances.items()}
        except ValueError as e:
            raise ScenarioError(str(e)) from e
        pages = int(c.get("weights_cache_pages", self.pset.weights_cache_pages))
        W, G = int(c["workers"]), int(c["gpus_per_worker"])
        self.G = G
        specs = [GpuSpec(w, g, pages) for w in range(W) for g in range(G)]
        sched = dict(sc.scheduler)
        policy = sched.pop("policy", "clockwork")
        try:
            common, extra = split_settings(policy, sched)
            cfg = SchedulerConfig.from_ms(**common)
            self.policy: Policy = make_policy(policy, list(self.profiles.values()), specs, cfg,
                                              extra)
        except (TypeError, ValueError) as e:
            raise ScenarioError(f"[scheduler]: {e}") from e
        self.cfg = cfg
        root = np.random.SeedSequence(sc.seed)
        s_work, s_dev, s_net = root.spawn(3)
        dev_seeds = s_dev.spawn(len(specs))
        self.executors = [
            GpuExecutor(s.worker, s.gpu, pages, self.profiles,
                        EmulatedDevice(float(c["noise"]), int(dev_seeds[i].generate_state(1)[0]),
                                       float(c["slow_prob"]), float(c.get("slow_factor", 3.0))))
            for i, s in enumerate(specs)
        ]
        self.pages = pages
        self.latency = ms(float(c["network_latency_ms"]))
        self.jitter = ms(float(c["jitter_ms"]))
        self._net_rng = np.random.default_rng(s_net)
        self._jit: list[int] = []
        self.duration = sec(sc.duration_s)
        exec1 = {i: p.exec_ns[p.batch_sizes[0]] for i, p in self.profiles.items()}
        self.workloads: list[Workload] = []
        wseeds = s_work.spawn(len(sc.workloads))
        for i, spec in enumerate(sc.workloads):
            try:
                w = build_workload(spec, self.instances, scenario_folder(sc.source))
            except ValueError as e:
                raise ScenarioError(f"workloads[{i}]: {e}") from e
            w.bind(0, self.duration, np.random.default_rng(wseeds[i]), exec1)
            self.workloads.append(w)
        self.telemetry = Telemetry(0)
        self.clock = VirtualClock(0)  # the run's time; every component is handed clock.now()
        self.max_pages_used = 0

    # ------------------------------------------------------------------ network

    def _delay(self) -> int:
        if not self.jitter:
            return self.latency
        if not self._jit:
            self._jit = (self._net_rng.random(4096) * self.jitter).astype(np.int64).tolist()
        return self.latency + self._jit.pop()

    # ------------------------------------------------------------------ loop

    def run(self) -> SimResult:
        # The loop allocates millions of short-lived, acyclic objects (requests, actions,
        # results); reference counting frees them, and the cyclic collector's scans of
        # the growing logs cost ~10 % of the run. Pause it for the run.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if gc_was_enabled:
                gc.enable()

    def _run(self) -> SimResult:
        heap: list = []
        push, pop = heapq.heappush, heapq.heappop
        seq = 0
        policy = self.policy
        tel = self.telemetry
        executors = self.executors
        G = self.G
        workloads = self.workloads
        wake_at: list[int | None] = [None] * len(executors)
        open_next: list = [None] * len(workloads)
        state = {"tick": None, "outstanding": 0, "next_id": 0}
        on_request, on_result, on_tick = policy.on_request, policy.on_result, policy.on_tick
        drain, next_wakeup = policy.drain_replies, policy.next_wakeup
        delay = self._delay

        def after_policy(actions, now):
            nonlocal seq
            for a in actions:
                tel.sent(a)
                seq += 1
                push(heap, (now + delay(), seq, _TO_WORKER, (a.worker * G + a.gpu, a)))
            for rep in drain():
                tel.reply(rep)
                state["outstanding"] -= 1
                r = rep.request
                w = workloads[r.tag] if r.tag is not None else None
                if w is not None:
                    for t, m, slo in w.on_reply(r.model, rep.status == 0, now):
                        seq += 1
                        push(heap, (t, seq, _SUBMIT, (m, slo, r.tag)))
            nw = next_wakeup()
            if nw is not None:
                tick = state["tick"]
                if tick is None or nw < tick:
                    if nw < now:
                        nw = now
                    state["tick"] = nw
                    seq += 1
                    push(heap, (nw, seq, _TICK, None))

        def submit(model, slo, widx, now):
            rid = state["next_id"]
            state["next_id"] = rid + 1
            state["outstanding"] += 1
            after_policy(on_request(Request(rid, model, now, slo, widx), now), now)

        def worker_results(idx, results, now):
            nonlocal seq
            ex = executors[idx]
            used = ex.pages_used
            if used > self.max_pages_used:
                self.max_pages_used = used
            for res in results:
                seq += 1
                push(heap, (now + delay(), seq, _TO_CTRL, res))
            nt = ex.next_time()
            if nt is not None:
                cur = wake_at[idx]
                if cur is None or nt < cur:
                    wake_at[idx] = nt
                    seq += 1
                    push(heap, (nt, seq, _WAKE, idx))

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
        advance = self.clock.advance_to
        while heap:
            now, _, kind, a = pop(heap)
            if now > hard_stop:
                break
            advance(now)
            events += 1
            if kind == _TO_CTRL:
                tel.result(a, now)
                after_policy(on_result(a, now), now)
            elif kind == _TO_WORKER:
                idx, action = a
                worker_results(idx, executors[idx].submit(action, now), now)
            elif kind == _WAKE:
                if wake_at[a] == now:
                    wake_at[a] = None
                    worker_results(a, executors[a].advance(now), now)
            elif kind == _OPEN:
                _, m, slo = open_next[a]
                nxt = workloads[a].next_arrival()
                open_next[a] = nxt
                if nxt is not None:
                    seq += 1
                    push(heap, (nxt[0], seq, _OPEN, a))
                submit(m, slo, a, now)
            elif kind == _SUBMIT:
                m, slo, widx = a
                submit(m, slo, widx, now)
            else:  # _TICK
                if state["tick"] == now:
                    state["tick"] = None
                    after_policy(on_tick(now), now)
            if self.progress and not events & 0x3FFF:
                wall = time.perf_counter()
                if wall - last_report >= 1.0:
                    last_report = wall
                    self._report(now, wall - wall0, state["next_id"])
            if not state["outstanding"] and now >= self.duration and self._quiet(heap):
                break
        wall_s = time.perf_counter() - wall0
        if self.progress:
            self._report(min(now, self.duration) if heap else self.duration, wall_s,
                         state["next_id"], end="\n")
        if state["outstanding"]:
            raise RuntimeError(f"simulation ended with {state['outstanding']} unanswered requests")
        extra = {
            "seed": self.sc.seed,
            "policy": self.sc.scheduler.get("policy", "clockwork"),
            "gpus": len(executors),
            "model_instances": len(self.instances),
            "cache_pages": self.pages,
            "max_pages_used": self.max_pages_used,
        }
        summary = tel.summary(self.sc.duration_s, extra)
        return SimResult(summary, tel, self.sc, wall_s, events)

    @staticmethod
    def _quiet(heap) -> bool:
        """Only timers left (no requests or worker traffic pending)."""
        return all(k == _TICK or k == _WAKE for _, _, k, _ in heap) if len(heap) < 64 else False

    def _report(self, now: int, wall: float, n: int, end: str = "\r") -> None:
        pct = 100.0 * min(now, self.duration) / self.duration
        rate = n / wall if wall > 0 else 0.0
        sys.stderr.write(f"  simulated {now / NS_PER_S:8.1f} s / {self.duration / NS_PER_S:.1f} s "
                         f"({pct:5.1f} %)  {n:,} requests  {rate:,.0f} req/s wall{' ' * 6}{end}")
        sys.stderr.flush()


def simulate(scenario: Scenario | str | Path | dict, overrides: list[str] | None = None,
             progress: bool = False) -> SimResult:
    """Run a scenario (a ``Scenario``, a TOML path or a dict) in the simulator."""
    if isinstance(scenario, Scenario):
        sc = scenario if not overrides else load_scenario(data=scenario.data, overrides=overrides)
    elif isinstance(scenario, dict):
        sc = load_scenario(data=scenario, overrides=overrides)
    else:
        sc = load_scenario(scenario, overrides)
    return Simulation(sc, progress).run()
