"""The two drivers (controller.loop, worker.loop), the simulator's fault model, and
the rule that the simulator and the services drive the cores only through them."""

from __future__ import annotations

import ast
import csv
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clockwork.actions import Action, ActionType, ErrorCode
from clockwork.cluster.sim import simulate
from clockwork.profiles import load_profile_set
from clockwork.requests import Request
from clockwork.time import ms, sec
from controller import make_policy
from controller.loop import FAIL_DELAY, ControllerLoop
from controller.policy import NO_GPU_LEFT, GpuSpec
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor
from worker.loop import WorkerLoop

ROOT = Path(__file__).resolve().parents[1]
PSET = load_profile_set("v100-reference")
R50 = PSET.get("resnet50_v2")


class Recorder:
    """A transport that records what the loop hands it."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[Action]]] = []
        self.answers = []
        self.armed: list[int] = []
        self.results = []
        self.probes: list[int] = []
        self.resets: list[int] = []
        self.kept: list[list[tuple[int, str, int]]] = []  # what each reset keeps
        self.drains: list[tuple[int, int]] = []  # each ``drained``: (worker, failed)

    def send(self, worker, actions):
        self.sent.append((worker, list(actions)))

    def answer(self, replies):
        self.answers.extend(replies)

    def arm(self, at):
        self.armed.append(at)

    def probe(self, worker):
        self.probes.append(worker)

    def reset(self, worker, keep):
        self.resets.append(worker)
        self.kept.append(list(keep))

    def drained(self, worker, failed):
        self.drains.append((worker, failed))

    # worker side
    def run(self, executor, action):
        raise AssertionError("emulated")


def controller(workers: int = 2):
    specs = [GpuSpec(w, 0, 100) for w in range(workers)]
    policy = make_policy("clockwork", [R50], specs)
    t = Recorder()
    return ControllerLoop(policy, t, specs), t


def test_controller_loop_sends_batches_per_worker_and_arms():
    loop, t = controller()
    loop.requests([Request(i, "resnet50_v2", 0, ms(100)) for i in range(4)], 0)
    assert t.sent, "a cold model gets a LOAD"
    for w, acts in t.sent:
        assert all(a.worker == w for a in acts)
        assert all(a.id in loop.outstanding[w] for a in acts)
    assert len({w for w, _ in t.sent}) == len(t.sent)  # one message per worker per event
    assert t.armed and t.armed[-1] == loop.armed


def test_lost_worker_fails_its_actions_later_and_requests_are_answered():
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    sent = [a for _, acts in t.sent for a in acts]
    assert sent and loop.outstanding[0]
    n = loop.worker_lost(0, ms(1))
    assert n == len(sent) and not loop.outstanding[0] and loop.up == [False]
    # the failures are fed from the timer FAIL_DELAY later, not from inside worker_lost
    assert loop.armed is not None and loop.armed <= ms(1) + FAIL_DELAY
    t_fail = ms(1) + FAIL_DELAY
    now = t_fail
    while not t.answers and now < sec(1):
        loop.tick(now)
        now = loop.armed if loop.armed is not None else now + ms(1)
    assert [r.request.id for r in t.answers] == [1]
    assert t.answers[0].status != 0  # no GPU left: the request fails, it is not lost
    # nothing is ever sent to the lost worker
    n_sent = len(t.sent)
    loop.request(Request(2, "resnet50_v2", now, ms(100)), now)
    assert len(t.sent) == n_sent


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "infaas", "tfserving"])
def test_requests_queued_when_every_worker_is_gone_are_answered_no_worker(policy):
    """Every worker lost: a request queued then waits ``no_worker_wait`` (2 s) for one to
    come back, then is answered ERROR no_worker, as one arriving meanwhile is (it was held
    until its SLO ended: a day, with a 1-day SLO; with a baseline, for ever)."""
    from controller.loop import NO_WORKER_FOR_REQUEST

    specs = [GpuSpec(0, 0, 100)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    day = sec(86_400)
    loop.requests([Request(i, "resnet50_v2", 0, day) for i in range(3)], 0)
    loop.worker_lost(0, ms(1))  # (its LOAD and any INFER fail back: queued again)
    _run_until(loop, t, ms(1) + sec(2) - 1)
    assert t.answers == [] and loop.policy.queued() == 3
    _run_until(loop, t, sec(3))
    assert sorted(r.request.id for r in t.answers) == [0, 1, 2]
    assert {(r.status, r.message) for r in t.answers} == {(1, NO_WORKER_FOR_REQUEST)}
    assert loop.policy.queued() == 0


def test_a_worker_back_within_the_wait_serves_the_requests_queued():
    loop, t = controller(workers=1)
    day = sec(86_400)
    loop.requests([Request(i, "resnet50_v2", 0, day) for i in range(3)], 0)
    loop.worker_lost(0, ms(1))
    _run_until(loop, t, sec(1))
    loop.worker_back(0, sec(1))
    _run_until(loop, t, sec(4), serving=(0,))  # (it answers what it is sent)
    assert sorted(r.request.id for r in t.answers) == [0, 1, 2]
    assert {r.status for r in t.answers} == {0}


def test_worker_back_makes_its_gpus_usable_again():
    loop, t = controller(workers=1)
    loop.worker_lost(0, 0)
    loop.worker_back(0, ms(10))
    assert loop.up == [True]
    loop.request(Request(1, "resnet50_v2", ms(10), ms(100)), ms(10))
    assert t.sent and t.sent[-1][0] == 0


def test_an_overdue_action_probes_its_worker_and_silence_makes_it_suspect():
    loop, t = controller(workers=2)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    a = acts[0]  # a LOAD: expected to end after its LOAD time
    bound = a.expected_end + max(ms(10), a.expected_duration // 2)
    assert loop.armed <= bound
    loop.tick(bound)
    assert t.probes == [w] and w in loop.probing
    while loop.armed is not None and loop.armed <= bound + ms(50):  # the timer, on time
        loop.tick(loop.armed)  # no answer within the probe timeout
    assert loop.suspect[w] and not loop.up[w] and not loop.outstanding[w]
    # heard from again: reset first; once the worker answered it, its GPUs are the
    # policy's again
    n = len(t.sent)
    loop.heard_from(w, bound + ms(60))
    assert t.resets == [w] and not loop.suspect[w] and not loop.up[w] and len(t.sent) == n
    loop.reset_done(w, bound + ms(61), {})  # it kept nothing
    assert loop.up[w]


def test_a_probes_wait_counts_from_when_the_transport_wrote_it():
    """A live link writes the probe some time after the loop asked for it (its writer
    task runs later on a busy controller): the worker's answer is waited for the probe
    timeout from the write, not from the ask (healthy workers of an overloaded
    controller were found suspect, their work failed ``worker_lost``)."""
    loop, t = controller(workers=2)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    a = acts[0]
    bound = a.expected_end + max(ms(10), a.expected_duration // 2)
    loop.tick(bound)
    assert t.probes == [w] and loop.probing[w] == bound + loop.liveness.probe_timeout
    loop.probe_sent(w, bound + ms(40))  # written 40 ms later
    timeout = loop.liveness.probe_timeout
    while loop.armed is not None and loop.armed <= bound + timeout + ms(1):
        loop.tick(loop.armed)  # (the timer, on time: the timeout from the ask passes)
    assert not loop.suspect[w] and loop.probing[w] == bound + ms(40) + timeout
    for k in range(2, 40):  # (the clock's echoes written after it, once a second say:
        loop.probe_sent(w, bound + ms(40 * k))  # they do not move the wait on: a hung
    assert loop.probing[w] == bound + ms(40) + timeout  # worker's socket takes them)
    while loop.armed is not None and loop.armed <= bound + ms(40) + timeout:
        loop.tick(loop.armed)
    assert loop.suspect[w]  # (no answer from the write on: suspect, as before)
    loop.probe_sent(1 - w, bound)  # (a worker not probed: nothing)
    assert 1 - w not in loop.probing


def test_a_worker_lost_while_idle_probed_keeps_no_round_trip_of_its_time_away():
    """An idle probe out as the worker's connection closed, and the worker back seconds
    later: its next answer is not taken for the idle probe's round trip (5 s: its next
    idle probe then waited 2 s, not 250 ms, and an overdue action's probe was taken for
    an idle one)."""
    loop, t = controller(workers=2)
    loop.tick(0)
    while not t.probes:
        loop.tick(loop.armed)
    w, now = t.probes[-1], loop.armed
    assert w in loop._idle_sent and w in loop.probing
    rtt = loop._idle_rtt[w]
    loop.worker_lost(w, now + ms(1))
    loop.worker_back(w, now + sec(5))
    loop.heard_from(w, now + sec(5) + ms(1))
    assert loop._idle_rtt[w] == rtt and w not in loop._idle_sent and w not in loop.probing


def test_a_worker_silent_while_idle_is_probed_and_suspect_before_work_reaches_it():
    """A worker with nothing outstanding that was not heard from for ``idle_probe`` is
    probed, and suspect if it does not answer within the probe timeout (a worker that
    hung while idle was listed serving, and the first request placed on it waited for
    its action to be overdue first). One that answers is left alone; a worker that is
    heard from (its results, echoes) is not probed."""
    loop, t = controller(workers=3)
    assert loop.liveness.idle_probe == ms(500)
    loop.apply([], 0)  # (the first event: the looks begin)
    assert loop.armed == ms(500)
    loop.heard_from(2, ms(300))  # (an echo: heard within the last 500 ms)
    loop.tick(ms(500))
    assert t.probes == [0, 1] and set(loop.probing) == {0, 1}
    loop.heard_from(0, ms(510))  # 0 answers, 1 stays silent
    # (nothing waits on the answer: it is given half the interval, not the 50 ms)
    assert loop.probing == {1: ms(750)}
    while loop.armed is not None and loop.armed <= ms(750):
        loop.tick(loop.armed)
    assert loop.suspect == [False, True, False] and loop.up == [True, False, True]
    # requests go to the workers that answer
    loop.request(Request(1, "resnet50_v2", ms(600), ms(100)), ms(600))
    assert t.sent and {w for w, _ in t.sent} <= {0, 2}
    # the next look, 500 ms on: a worker with work outstanding is left to the overdue
    # check, the suspect one is not probed again (its next message re-admits it)
    busy = {w for w, _ in t.sent}
    probes = len(t.probes)
    loop.tick(ms(1000))
    assert not set(t.probes[probes:]) & (busy | {1}), t.probes


def test_a_late_controller_keeps_an_idle_probes_longer_wait():
    """A tick that runs late renews the probes out, as before, but never shortens an
    idle probe's wait (it was cut to the 50 ms probe timeout: an idle worker whose
    answer was read late on a busy host was suspect)."""
    loop, t = controller(workers=2)
    loop.apply([], 0)
    loop.tick(ms(500))
    assert loop.probing == {0: ms(750), 1: ms(750)}
    loop.heard_from(0, ms(510))
    loop.armed = ms(560)  # (a timer armed for 560 ms fires 30 ms late)
    loop.tick(ms(590))
    assert loop.probing == {1: ms(750)} and loop.up == [True, True]


def test_an_idle_worker_on_a_slow_link_is_not_suspect_at_every_look():
    """Simulated: a worker mostly idle on a link 150 ms each way (a round trip past the
    250 ms an idle probe waits): suspect once, then its probes wait twice the round trip
    its last answer took (it was suspect and reset at every look: 10 times in 15 s)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 20.0,
        "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "network_latency_ms": 0.1},
        "models": [{"name": "resnet18_v2", "copies": 2}],
        "workloads": [{"kind": "fixed_rate", "rate_rps": 2, "slo_ms": 1000}],
        "faults": {"slow_network": [{"worker": 1, "at_s": 1.0, "for_s": 15.0,
                                     "delay_ms": 150}]}}))
    s = sim.run().summary
    said = [t for t, what in sim.fault_log if "suspects worker 1" in what]
    assert 1 <= len(said) <= 2, sim.fault_log
    assert s["submitted"] == s["succeeded"], s


def test_idle_probes_off():
    from controller.loop import Liveness

    specs = [GpuSpec(w, 0, 100) for w in range(2)]
    t = Recorder()
    loop = ControllerLoop(make_policy("clockwork", [R50], specs), t, specs,
                          liveness=Liveness(idle_probe=0))
    loop.apply([], 0)
    assert loop.armed is None  # nothing to look at
    loop.tick(sec(10))
    assert t.probes == [] and loop.up == [True, True]


def test_the_simulator_finds_a_worker_hung_while_idle_before_the_next_request():
    """Simulated: one request a second; worker 1 hangs at 0.1 s, idle. It is suspect
    within the idle probe and its timeout (before the request at 1 s), not only once a
    request's action on it is overdue; every request is served."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 4.0,
        "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet18_v2"}],
        "workloads": [{"kind": "fixed_rate", "rate_rps": 1, "slo_ms": 1000}],
        "faults": {"hang": [{"worker": 1, "at_s": 0.1, "for_s": 2.0}]}}))
    s = sim.run().summary
    said = [t for t, what in sim.fault_log if "suspects worker 1" in what]
    assert said and said[0] < sec(1), sim.fault_log
    assert s["submitted"] == s["succeeded"] == 4, s


def _overdue_and_probe_answered():
    """One worker, one request: its first action overdue at its bound, the probe that
    makes answered 1 ms later. -> (loop, transport, the action, its bound)."""
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    a = t.sent[0][1][0]
    bound = a.expected_end + max(ms(10), a.expected_duration // 2)
    loop.tick(bound)
    assert t.probes == [0]
    loop.heard_from(0, bound + ms(1))  # the probe is answered: alive
    return loop, t, a, bound


def test_an_answered_probe_leaves_a_slow_worker_alone():
    loop, t, a, bound = _overdue_and_probe_answered()
    loop.tick(bound + ms(100))
    assert not loop.suspect[0] and loop.up[0] and a.id in loop.outstanding[0]
    assert t.resets == []


def test_an_action_a_live_worker_never_finishes_makes_it_suspect():
    """A worker that answers its probes but never reports an action (a device hung under
    a live process): once the action is long overdue (stuck_min, or twice its expected
    duration), the worker is suspect and the action fails, so its requests are answered
    instead of waiting for good. The observer is told why (the controller's log said
    "does not answer a probe" of a worker that answered every one)."""
    loop, t, a, bound = _overdue_and_probe_answered()
    said: list[str] = []
    loop.observer.suspect = lambda w, failed, reason="": said.append(reason)
    stuck = bound + max(loop.liveness.stuck_min, 2 * a.expected_duration)
    while loop.armed is not None and loop.armed < stuck:  # the timer, on time
        now = loop.armed
        loop.tick(now)
        if 0 in loop.probing:  # (the INFER behind the LOAD is overdue too) answered
            loop.heard_from(0, now + 1)
        assert not loop.suspect[0] and a.id in loop.outstanding[0]  # not yet
    assert loop.armed == stuck  # it comes back for the action
    loop.tick(stuck)
    assert loop.suspect[0] and not loop.up[0] and not loop.outstanding[0]
    assert said == ["an action long overdue, though the worker answers probes"]
    now = stuck
    while not t.answers and now < stuck + sec(1):
        now = loop.armed if loop.armed is not None else now + ms(1)
        loop.tick(now)
    assert [r.request.id for r in t.answers] == [1] and t.answers[0].status != 0


def test_a_returning_gpu_gets_its_copies_back():
    """A GPU lost and back: the models it held (still in use) are loaded on it again at
    once, not left to the other GPUs until they saturate."""
    from clockwork.actions import Result
    loop, t = controller(workers=2)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    load = acts[0]
    assert load.type == ActionType.LOAD
    loop.results(w, [Result(id=load.id, type=ActionType.LOAD, status=ErrorCode.SUCCESS,
                            worker=w, gpu=0, model=load.model, batch_size=0, received=0,
                            begin=0, end=load.expected_end)], load.expected_end)
    now = load.expected_end + ms(1)
    loop.worker_lost(w, now)
    loop.tick(now + FAIL_DELAY)  # its INFER fails back: the request is re-planned
    n = len(t.sent)
    loop.worker_back(w, now + ms(5))
    again = [a for ww, acts in t.sent[n:] for a in acts if ww == w]
    assert [a.type for a in again][:1] == [ActionType.LOAD] and again[0].model == "resnet50_v2"


def _loaded_then_suspect(loop, t):
    """A request loads resnet50_v2 on a worker and runs; the worker then hangs (its next
    INFER is never answered) until the loop finds it suspect. Returns (worker, the LOAD,
    the time it was found suspect). (An SLO of a second: the only worker up is found
    suspect after a second probe, past a 100 ms SLO.)"""
    from clockwork.actions import Result
    loop.request(Request(1, "resnet50_v2", 0, ms(1000)), 0)
    (w, acts), = t.sent
    load, infer = acts
    assert (load.type, infer.type) == (ActionType.LOAD, ActionType.INFER)
    end = load.expected_end
    loop.results(w, [Result(id=load.id, type=ActionType.LOAD, status=ErrorCode.SUCCESS,
                            worker=w, gpu=0, model=load.model, received=0,
                            begin=end - load.expected_duration, end=end)], end)
    now = end
    while not loop.suspect[w]:  # the INFER is overdue, the probe goes unanswered
        now = loop.armed
        loop.tick(now)
    return w, load, now


def test_a_readmitted_worker_keeps_the_copies_it_held():
    """A worker found suspect and heard from again is the same process, with the weights
    it had: the reset keeps them (GPU, model, the LOAD's version); once the worker has
    answered it the copy is ready at once, and the next request runs on it with no LOAD."""
    loop, t = controller(workers=1)
    w, load, now = _loaded_then_suspect(loop, t)
    loop.tick(now + FAIL_DELAY)  # the failed INFER: its request has no GPU left
    n = len(t.sent)
    back = now + ms(20)
    loop.heard_from(w, back)
    assert t.resets == [w] and t.kept == [[(0, "resnet50_v2", load.version)]]
    assert not loop.up[w] and len(t.sent) == n  # nothing until the worker answers the reset
    loop.reset_done(w, back, {0: {"resnet50_v2"}})
    loop.reset_done(w, back, {})  # a second answer changes nothing
    assert loop.up[w] and not loop.suspect[w]
    assert not [a for _, acts in t.sent[n:] for a in acts if a.type == ActionType.LOAD]
    assert loop.policy.model_view("resnet50_v2").loading_on == ()
    loop.request(Request(2, "resnet50_v2", back, ms(100)), back)
    (ww, acts), = t.sent[-1:]
    assert ww == w and [a.type for a in acts] == [ActionType.INFER]
    assert acts[0].version == load.version


def test_a_copy_the_worker_did_not_keep_is_loaded_again():
    """The reset asked the worker to keep a copy, but its answer says it did not have it
    (a LOAD that had not finished, say): the copy is loaded again at once, as for a worker
    that comes back empty, and is not counted ready before that LOAD."""
    loop, t = controller(workers=1)
    w, load, now = _loaded_then_suspect(loop, t)
    back = now + FAIL_DELAY
    loop.tick(back)
    loop.heard_from(w, back)
    assert t.kept == [[(0, "resnet50_v2", load.version)]]
    n = len(t.sent)
    loop.reset_done(w, back, {0: set()})
    again = [a for _, acts in t.sent[n:] for a in acts]
    assert [a.type for a in again][:1] == [ActionType.LOAD] and again[0].model == "resnet50_v2"
    assert loop.policy.model_view("resnet50_v2").loading_on == (0,)


def test_a_reconnected_worker_keeps_what_it_says_it_kept():
    """A worker lost and reconnected (its stream broke; the process may have lived on) is
    asked to keep the copies its GPUs held (``keep_list``); what its answer says it kept
    is ready at once, with no LOAD."""
    from clockwork.actions import Result
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, (load, infer)), = t.sent
    end = load.expected_end
    loop.results(w, [Result(id=load.id, type=ActionType.LOAD, status=ErrorCode.SUCCESS,
                            worker=w, gpu=0, model=load.model, received=0,
                            begin=end - load.expected_duration, end=end)], end)
    loop.worker_lost(w, end + ms(1))
    assert loop.keep_list(w) == [(0, "resnet50_v2", load.version)]
    loop.tick(end + ms(1) + FAIL_DELAY)
    n = len(t.sent)
    loop.worker_back(w, end + ms(5), {0: {"resnet50_v2"}})
    assert not [a for _, acts in t.sent[n:] for a in acts if a.type == ActionType.LOAD]
    assert loop.policy.model_view("resnet50_v2").loaded_on == (0,)
    assert loop.policy.model_view("resnet50_v2").loading_on == ()
    assert loop.keep_list(w) == []  # back: nothing held for a loss any more


def test_a_new_controller_adopts_the_weights_its_workers_hold():
    """At start, a worker still holds weights loaded for an earlier controller: the loop
    hands them to the policy (``adopt``), the next request runs on them at once with the
    version the worker has and no LOAD, and a later LOAD of that model carries a higher
    version than any adopted. The baselines do not adopt."""
    from clockwork.actions import Result
    from controller import policy_class

    specs = [GpuSpec(0, 0, 100), GpuSpec(0, 1, 100)]
    loop = ControllerLoop(make_policy("clockwork", [R50], specs), t := Recorder(), specs)
    loop.adopt(0, 0, {1: [("resnet50_v2", 7)], 5: [("resnet50_v2", 2)]})  # (no GPU 5)
    assert loop.policy.model_view("resnet50_v2").loaded_on == (1,)
    assert t.sent == []
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    assert [(a.type, a.gpu, a.version) for a in acts] == [(ActionType.INFER, 1, 7)]
    assert loop.keep_list(0) == []  # adopted copies are ordinary ones
    # lose the copy: the model is loaded again, with a version above the adopted one
    loop.results(0, [Result(id=acts[0].id, type=ActionType.INFER,
                            status=ErrorCode.WEIGHTS_NOT_PRESENT, worker=0, gpu=1,
                            model="resnet50_v2", batch_size=1, received=0, begin=0,
                            end=ms(1))], ms(1))
    loop.request(Request(2, "resnet50_v2", ms(2), ms(100)), ms(2))
    loop.tick(ms(5))
    loads = [a for _, acts in t.sent[1:] for a in acts if a.type == ActionType.LOAD]
    assert loads and all(a.version > 7 for a in loads)
    assert policy_class("clockwork").adopts_weights
    assert not any(policy_class(p).adopts_weights for p in ("clipper", "tfserving", "infaas"))


def test_a_kept_copy_the_worker_does_not_have_is_forgotten_and_its_request_served():
    """The reset named a copy the worker no longer has: its first INFER fails
    WEIGHTS_NOT_PRESENT, the copy is forgotten, a LOAD follows and the request is
    still served within its deadline."""
    from clockwork.actions import Result
    loop, t = controller(workers=1)
    w, load, now = _loaded_then_suspect(loop, t)
    back = now + FAIL_DELAY
    loop.tick(back)
    loop.heard_from(w, back)
    loop.reset_done(w, back, {0: {"resnet50_v2"}})  # it says so, but is wrong
    loop.request(Request(2, "resnet50_v2", back, ms(100)), back)
    (ww, (infer,)), = t.sent[-1:]
    loop.results(w, [Result(id=infer.id, type=ActionType.INFER,
                            status=ErrorCode.WEIGHTS_NOT_PRESENT, worker=w, gpu=0,
                            model=infer.model, batch_size=1, received=back, begin=back,
                            end=back)], back + ms(1))
    assert loop.policy.model_view("resnet50_v2").loaded_on == ()  # forgotten
    n = len(t.sent)
    while len(t.sent) == n:
        loop.tick(loop.armed)  # the next LOAD check
    again = t.sent[-1][1]
    assert [a.type for a in again] == [ActionType.LOAD, ActionType.INFER]
    assert again[1].expected_end < back + ms(100)


def test_a_result_from_a_clock_ahead_is_moved_back_whole():
    """A worker's clock ahead of the controller's: its result's end is moved back to now
    and its begin with it, so the lane's time the estimates learn is the worker's."""
    from clockwork.actions import Result
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    load = acts[0]
    now, ahead, held = ms(40), ms(5), ms(30)
    loop.results(w, [Result(id=load.id, type=ActionType.LOAD, status=ErrorCode.SUCCESS,
                            worker=w, gpu=0, model=load.model, received=0,
                            begin=now + ahead - held, end=now + ahead)], now)
    assert loop.policy.models["resnet50_v2"].est.load == held


def test_a_result_whose_span_is_past_a_year_is_cut_to_one():
    """A LOAD result whose begin is ~2^63 ns back (a broken or hostile worker): the
    estimate learns at most a year. It learned the whole span, and every later LOAD's
    expected duration left int64: no worker could be written to."""
    from clockwork.actions import Result
    from clockwork.time import RESULT_SPAN_MAX_NS
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    (w, acts), = t.sent
    load = acts[0]
    now = ms(40)
    loop.results(w, [Result(id=load.id, type=ActionType.LOAD, status=ErrorCode.SUCCESS,
                            worker=w, gpu=0, model=load.model, received=0,
                            begin=-(2**63) + 1, end=now)], now)
    assert loop.policy.models["resnet50_v2"].est.load == RESULT_SPAN_MAX_NS


def test_unknown_results_are_ignored():
    loop, t = controller(workers=1)
    from clockwork.actions import Result
    r = Result(id=999, type=ActionType.INFER, status=ErrorCode.SUCCESS, worker=0, gpu=0,
               model="resnet50_v2", batch_size=1, received=0, begin=0, end=0)
    seen = []
    loop.observer.unknown = lambda w, res: seen.append(res.id)
    loop.results(0, [r], 0)
    assert seen == [999]


class WorkerRecorder:
    def __init__(self) -> None:
        self.calls: list[list] = []
        self.armed: list[int] = []

    def results(self, res):
        self.calls.append(list(res))

    def run(self, executor, action):
        raise AssertionError("emulated executors start nothing open")

    def arm(self, at):
        self.armed.append(at)


def test_worker_loop_invalid_gpu_and_timer():
    t = WorkerRecorder()
    ex = [GpuExecutor(0, 0, 100, {"resnet50_v2": R50}, EmulatedDevice())]
    loop = WorkerLoop(0, ex, t)
    bad = Action(id=1, type=ActionType.LOAD, worker=0, gpu=3, model="resnet50_v2",
                 earliest=0, latest=sec(1), expected_duration=R50.load_ns)
    load = Action(id=2, type=ActionType.LOAD, worker=0, gpu=0, model="resnet50_v2",
                  earliest=0, latest=sec(1), expected_duration=R50.load_ns)
    loop.submit([bad, load], 0)
    assert [r.status for r in t.calls[0]] == [ErrorCode.INVALID_GPU]
    assert t.armed == [loop.armed] and loop.armed > 0
    loop.timer(loop.armed)
    assert [(r.id, r.status) for r in t.calls[1]] == [(2, ErrorCode.SUCCESS)]
    assert loop.armed is None


FAULTY = {
    "seed": 2, "duration_s": 6.0,
    "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference"},
    "models": [{"name": "resnet50_v2", "copies": 4}, {"name": "resnet18_v2", "copies": 4}],
    "workloads": [{"kind": "poisson", "rate_rps": 1600, "slo_ms": 100}],
    "faults": {"kill": [{"worker": 1, "at_s": 2.0, "back_s": 3.5}],
               "hang": [{"worker": 0, "at_s": 4.5, "for_s": 0.5}]},
}


def test_faults_are_deterministic_and_take_effect():
    a, b = simulate(FAULTY), simulate(FAULTY)
    assert a.telemetry.requests == b.telemetry.requests
    assert a.telemetry.actions == b.telemetry.actions
    s = a.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]  # all answered
    rows = a.telemetry.requests
    detect, reconnect = ms(1), sec(0.7)
    # nothing is served by worker 1's GPU while it is dead (answers are when they end)
    on_dead = [r for r in rows if r[9] == 1 and sec(2.0) + detect < r[2] + r[4] < sec(3.5)]
    assert on_dead == []
    # it serves again once the controller has reconnected
    assert any(r[9] == 1 and r[2] + r[4] > sec(3.5) + reconnect for r in rows)
    # one GPU cannot keep up with 1,600 r/s of these models, and a hang costs requests
    def attainment(lo, hi):
        sel = [r for r in rows if lo <= r[2] < hi]
        return sum(r[6] for r in sel) / len(sel)
    assert attainment(0, sec(2)) == 1.0
    assert attainment(sec(2.1), sec(3.4)) < 0.995
    # the hung worker is suspected within ~60 ms and its work re-planned on the other
    hung = attainment(sec(4.5), sec(5.0))
    assert hung > 0.99
    # without liveness probes the requests sent to it wait out their SLO (only the
    # requests turned away show that its copies cannot serve, and more copies are loaded
    # on the other GPU for that demand)
    blind = simulate({**FAULTY, "scheduler": {"liveness": False}})
    blind_rows = blind.telemetry.requests
    sel = [r for r in blind_rows if sec(4.5) <= r[2] < sec(5.0)]
    assert sum(r[6] for r in sel) / len(sel) < hung - 0.01
    # without faults the same load is fully met
    clean = simulate({**FAULTY, "faults": {}})
    assert clean.summary["slo_attainment"] > s["slo_attainment"]


def test_actions_failed_for_a_lost_worker_are_logged_as_such():
    """The actions outstanding on a killed worker and on a hung one (found suspect) are
    failed by the controller with WORKER_LOST: the action log tells them apart from
    anything a worker said (they were logged WEIGHTS_NOT_PRESENT, a copy found missing)."""
    from collections import Counter
    failed = Counter((r[2], r[3]) for r in simulate(FAULTY).telemetry.actions
                     if r[2] != "SUCCESS")
    assert failed[("WORKER_LOST", 1)] > 0 and failed[("WORKER_LOST", 0)] > 0  # killed, hung
    assert set(failed) <= {("WORKER_LOST", 0), ("WORKER_LOST", 1)}, failed


def test_a_hung_worker_comes_back_with_its_weights():
    """Simulated: worker 0 hangs 0.5 s and is re-admitted with the weights it had. No
    LOAD is sent to it after the hang, and every INFER it gets from then succeeds."""
    rows = simulate(FAULTY).telemetry.actions  # (id, type, status, worker, gpu, model, .., sent, ..)
    held = {a[5] for a in rows if a[:4] == (a[0], "LOAD", "SUCCESS", 0) and a[7] < sec(4.5)}
    assert len(held) == 8  # both models' 4 instances
    assert not [a for a in rows if a[1] == "LOAD" and a[3] == 0 and a[7] > sec(4.5)]
    after = [a for a in rows if a[1] == "INFER" and a[3] == 0 and a[7] > sec(5.0)]
    assert len(after) > 100 and {a[2] for a in after} == {"SUCCESS"}
    assert {a[5] for a in after} <= held


def test_what_the_controller_sends_a_worker_before_reconnecting_to_its_restart_is_lost():
    """A worker killed and restarted before the controller notices (back within
    ``detect_ms``): what the controller sent it meanwhile went on the connection the kill
    cut, and is lost. The simulator delivered it to the restarted worker, which loaded
    what the controller counted as failed; every LOAD after was refused
    WEIGHTS_ALREADY_LOADED and sent again, ~3,300 a second, the model never served."""
    from collections import Counter
    res = simulate("faults", ["duration_s=3", "faults.hang=[]",
                              "faults.kill=[{worker=0,at_s=0,back_s=0.0001},"
                              "{worker=1,at_s=0}]"])
    acts = Counter((r[1], r[2]) for r in res.telemetry.actions)
    assert acts[("LOAD", "WEIGHTS_ALREADY_LOADED")] == 0, acts
    assert acts[("LOAD", "SUCCESS")] < 50, acts
    served = {r[1] for r in res.telemetry.requests if r[5] == 0}  # (SUCCESS)
    assert served == {r[1] for r in res.telemetry.requests}  # every instance served


def _planted(monkeypatch, plant, policy: str, workers: int, duration_s: float, rate: float):
    """Simulate resnet18_v2 alone (Poisson ``rate``, SLO 100 ms) on ``workers`` one-GPU
    workers under ``policy``, after ``plant(sim, w, executors)`` changed each worker's
    GPUs as first made (state the controller does not know of)."""
    from clockwork.cluster.sim import Simulation

    made = Simulation.executors_of

    def planted(self, w, restart=0):
        out = made(self, w, restart)
        if restart == 0:
            plant(self, w, out)
        return out

    monkeypatch.setattr(Simulation, "executors_of", planted)
    return simulate({"seed": 1, "duration_s": duration_s, "scheduler": {"policy": policy},
                     "cluster": {"workers": workers, "gpus_per_worker": 1,
                                 "profiles": "v100-reference"},
                     "models": [{"name": "resnet18_v2"}],
                     "workloads": [{"kind": "poisson", "rate_rps": rate, "slo_ms": 100}]})


@pytest.mark.parametrize("policy", ["clockwork", "tfserving", "infaas", "clipper"])
def test_weights_on_a_gpu_the_controller_does_not_count_are_evicted_then_loaded(
        policy, monkeypatch):
    """A worker's GPU holds a model's weights the controller does not count (left by a
    LOAD it counted as failed, or by an earlier controller): the controller's LOAD there is
    refused WEIGHTS_ALREADY_LOADED. It was sent again at every look (4,317 times in 2 s
    under the Clockwork scheduler, every INFER failing WEIGHTS_CHANGED and no request
    served; the baselines never answered their requests at all); now the controller
    EVICTs those weights once, loads the model again, and serves every request."""
    from collections import Counter

    from worker.executor import Weights

    def stale_weights(sim, w, executors):
        if w == 0:  # (version 99: not one this controller sends)
            e = executors[0]
            pages = e.free_pages.take(sim.profiles["resnet18_v2"].weights_pages)
            e.weights["resnet18_v2"] = Weights(pages, 99, 0)

    res = _planted(monkeypatch, stale_weights, policy, workers=1, duration_s=2.0, rate=100)
    acts = Counter((r[1], r[2]) for r in res.telemetry.actions)
    assert acts[("LOAD", "WEIGHTS_ALREADY_LOADED")] == 1, acts
    assert acts[("EVICT", "SUCCESS")] == 1 and acts[("LOAD", "SUCCESS")] == 1, acts
    assert res.summary["submitted"] == res.summary["succeeded"] > 150, res.summary


@pytest.mark.parametrize("policy", ["clockwork", "tfserving", "infaas", "clipper"])
@pytest.mark.parametrize("lacking", [(0,), (0, 1)])
def test_a_gpu_that_refuses_a_models_load_is_passed_over_for_another(
        policy, lacking, monkeypatch):
    """Worker 0 cannot load a model (its package missing: UNKNOWN_MODEL; a device failing
    the copy is alike), worker 1 can. The model's LOAD went to worker 0 again and again:
    the Clockwork scheduler answered every request ERROR, the baselines sent ~5,000 LOADs
    a second there and never answered (clipper: TIMEOUT), worker 1 never tried. Now the
    refusing GPU is passed over and worker 1 serves every request. When no worker can
    load it, its requests are answered ERROR with the worker's reason, a few LOADs a
    second at most."""
    from collections import Counter

    def without_the_package(sim, w, executors):
        if w in lacking:
            for e in executors:
                e.models = {k: v for k, v in e.models.items() if k != "resnet18_v2"}

    res = _planted(monkeypatch, without_the_package, policy, workers=2, duration_s=3.0,
                   rate=200)
    refused = Counter(r[3] for r in res.telemetry.actions
                      if r[1] == "LOAD" and r[2] == "UNKNOWN_MODEL")
    s = res.summary
    if lacking == (0,):
        assert refused == {0: 1}, refused
        assert s["submitted"] == s["succeeded"] > 500, s
    else:
        assert sum(refused.values()) <= 12 and set(refused) == {0, 1}, refused
        assert {r[5] for r in res.telemetry.requests} == {1}  # ERROR, each answered
        assert s["submitted"] == s["failed"] > 500, s


@pytest.mark.parametrize("workers, hang_s, suspected", [(1, 0.08, False), (1, 0.5, True),
                                                         (2, 0.08, True)])
def test_the_only_worker_up_gets_a_second_probe_before_it_is_suspect(workers, hang_s,
                                                                      suspected):
    """A worker silent for 80 ms (a process starved of CPU by a burst on a small host)
    missed its 50 ms probe and was suspect: when it is the only worker up, every request
    was then answered no_worker at once, though nothing could move elsewhere. The only
    worker up now gets a second probe first; one that stays silent (0.5 s) is still
    suspect, and with another worker up the first probe decides, as before. (The
    simulator answers no_worker as the live intake does: while the only worker is
    suspect, a request is answered ERROR at once.)"""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 3.0,
        "cluster": {"workers": workers, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet18_v2"}],
        "workloads": [{"kind": "poisson", "rate_rps": 200, "slo_ms": 1000}],
        "faults": {"hang": [{"worker": 0, "at_s": 1.0, "for_s": hang_s}]}}))
    s = sim.run().summary
    said = [what for _, what in sim.fault_log if "suspects worker 0" in what]
    assert bool(said) == suspected, sim.fault_log
    if suspected and workers == 1:  # no worker answering for a while: those turned away
        assert s["failed"] > 0 and s["submitted"] == s["succeeded"] + s["failed"], s
    else:
        assert s["submitted"] == s["succeeded"], s


def test_fault_settings_are_checked():
    from clockwork.scenario import ScenarioError
    bad = {**FAULTY, "faults": {"kill": [{"worker": 5, "at_s": 1.0}]}}
    with pytest.raises(ScenarioError, match=r"faults.kill.0.worker: 5 is not one of the 2"):
        simulate(bad)
    bad = {**FAULTY, "faults": {"hang": [{"worker": 0, "at_s": 1.0, "for_s": 0}]}}
    with pytest.raises(ScenarioError, match=r"faults.hang.0.for_s"):
        simulate(bad)


def test_slow_network_delays_answers():
    d = {**FAULTY, "faults": {"slow_network": [{"worker": 0, "at_s": 1.0, "for_s": 1.0,
                                                "delay_ms": 30.0}]}}
    d["cluster"] = {**d["cluster"], "workers": 1}
    d["workloads"] = [{"kind": "poisson", "rate_rps": 200, "slo_ms": 1000}]
    rows = simulate(d).telemetry.requests
    slow = [r[4] for r in rows if sec(1.1) <= r[2] < sec(1.9) and r[5] == 0]
    fast = [r[4] for r in rows if r[2] < sec(0.9) and r[5] == 0]
    # 30 ms each way; actions arrive after their windows, are turned away and re-planned
    assert len(slow) > 100 and min(slow) >= ms(60) > max(fast)


@pytest.mark.parametrize("kind,spells", [
    ("slow_network", [{"worker": 0, "at_s": 1.0, "for_s": 0.5, "delay_ms": 30.0},
                      {"worker": 0, "at_s": 0.5, "for_s": 0.5, "delay_ms": 30.0}]),
    ("kill", [{"worker": 0, "at_s": 1.0}, {"worker": 0, "at_s": 0.5, "back_s": 1.0}]),
    ("hang", [{"worker": 0, "at_s": 1.0, "for_s": 0.5}, {"worker": 0, "at_s": 0.5,
                                                        "for_s": 0.5}])])
def test_spells_that_follow_one_another_play_the_same_in_any_order(kind, spells):
    """A worker's faults that follow one another at an instant (one ends as the next
    starts) are played as in time order whatever the order listed: listed the other way
    round, the end was played after the start at that instant and undid it (the second
    slow spell never slowed the link; the second kill was lost, its worker served on)."""
    d = {**FAULTY, "faults": {kind: spells}}
    d["cluster"] = {**d["cluster"], "workers": 1}
    d["workloads"] = [{"kind": "poisson", "rate_rps": 200, "slo_ms": 1000}]
    listed, ordered = simulate(d), simulate({**d, "faults": {kind: spells[::-1]}})
    assert listed.telemetry.requests == ordered.telemetry.requests
    assert listed.telemetry.actions == ordered.telemetry.actions


RESTART_AT, DOWN = 3.0107, 0.5
RESTART = {**FAULTY, "faults": {"controller_restart": [{"at_s": RESTART_AT, "down_s": DOWN}]}}


def _restart(**fault):
    return {**RESTART, "faults": {"controller_restart": [
        {"at_s": RESTART_AT, "down_s": DOWN, **fault}]}}


def test_a_restarted_controller_takes_over_the_workers_weights_in_the_simulator():
    """[faults] controller_restart: the controller dies; what it had not answered fails
    then, once; what arrives while none serves waits for the new one, which takes over
    the weights the workers hold: no LOAD, no cold start after it. With fresh_caches (or
    a baseline policy) every model is loaded again. Runs repeat exactly."""
    a, b = simulate(RESTART), simulate(RESTART)
    assert a.telemetry.requests == b.telemetry.requests
    assert a.telemetry.actions == b.telemetry.actions
    s = a.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]  # all answered
    rows, acts = a.telemetry.requests, a.telemetry.actions  # (id, model, arrival, ., latency,
    t0, t1 = sec(RESTART_AT), sec(RESTART_AT + DOWN)        # status, met, cold, ...)
    died = [r for r in rows if r[2] + r[4] == t0]
    assert died and {r[5] for r in died} == {1} and s["failed"] == len(died)  # ERROR
    waited = [r for r in rows if t0 < r[2] < t1]
    assert len(waited) > 500 and min(r[2] + r[4] for r in waited) >= t1
    assert sum(r[6] for r in waited) > 0  # the last ones still make their SLO
    def copies(actions, before):  # (worker, gpu, model) of the LOADs sent before/after t0
        return {x[3:6] for x in actions
                if x[1] == "LOAD" and x[2] == "SUCCESS" and (x[7] < t0) == before}
    held = copies(acts, True)
    assert len(held) >= 8 and not [x for x in acts if x[1] == "EVICT"]
    assert not held & copies(acts, False)  # the copies held are not loaded again
    assert not [r for r in rows if r[2] > t0 and r[7]]  # no cold start
    after = [r for r in rows if r[2] > t1 + sec(0.2)]
    assert sum(r[6] for r in after) / len(after) > 0.99
    fresh = simulate(_restart(fresh_caches=True))
    assert len([r for r in fresh.telemetry.requests if r[2] > t0 and r[7]]) > 500  # cold
    for run in (fresh, simulate({**RESTART, "scheduler": {"policy": "clipper"}})):
        again = copies(run.telemetry.actions, False)
        assert len(again) >= 8 and again & copies(run.telemetry.actions, True)


def test_controller_restart_settings_are_checked():
    from clockwork.cluster.faults import LiveFaults
    from clockwork.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="not together with faults.kill"):
        simulate({**FAULTY, "faults": {**FAULTY["faults"], **RESTART["faults"]}})
    with pytest.raises(ScenarioError, match="must start before the end"):
        simulate(_restart(down_s=FAULTY["duration_s"]))
    twice = {"controller_restart": [{"at_s": 2.0, "down_s": 1.0}, {"at_s": 2.5}]}
    with pytest.raises(ScenarioError, match=r"controller_restart.1.at_s: 2.5 is not after"):
        simulate({**FAULTY, "faults": twice})
    with pytest.raises(ValueError, match="slow_network has no live form"):
        LiveFaults(None, {"slow_network": [{"worker": 0, "at_s": 1.0, "for_s": 1.0,
                                            "delay_ms": 5.0}]}, 10.0)
    # (live: tests/test_faults_live.py; the same checks before a replay starts)
    from clockwork.scenario import Scenario, restarts_error

    assert "not together with faults.kill" in restarts_error(Scenario({
        **FAULTY, "faults": {**FAULTY["faults"], **RESTART["faults"]}}))
    # live as in the simulator: a fault at or after the end would never happen

    class Cluster:
        workers = [None, None]

    with pytest.raises(ValueError, match=r"faults.hang.0.at_s: must be before the end"):
        LiveFaults(Cluster(), {"hang": [{"worker": 1, "at_s": 10.0, "for_s": 1.0}]}, 10.0)
    assert LiveFaults(Cluster(), {"hang": [{"worker": 1, "at_s": 9.0, "for_s": 1.0}]},
                      10.0).plan == [(9.0, 0, "stop", 1), (10.0, 1, "resume", 1)]
    # a worker's spells that follow one another, listed the other way round: played in
    # time order, the first one's end before the next one's start (the worker was
    # resumed at 2 s and ran on; a kill at another's restart was lost)
    hangs = [{"worker": 1, "at_s": 2.0, "for_s": 1.0}, {"worker": 1, "at_s": 1.0, "for_s": 1.0}]
    assert [p[2:] for p in LiveFaults(Cluster(), {"hang": hangs}, 10.0).plan] == [
        ("stop", 1), ("resume", 1), ("stop", 1), ("resume", 1)]
    kills = [{"worker": 1, "at_s": 2.0}, {"worker": 1, "at_s": 1.0, "back_s": 2.0}]
    assert [p[2:] for p in LiveFaults(Cluster(), {"kill": kills}, 10.0).plan] == [
        ("kill", 1), ("restart", 1), ("kill", 1)]


# ------------------------------------------------------------------ one driver per core

_CORE_CALLS = {"on_request", "on_result", "on_tick", "drain_replies", "next_wakeup",
               "set_gpu_available", "advance", "take_started", "complete"}


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _CORE_CALLS:
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if name in ("policy", "e", "ex", "executor", "executors") or "polic" in name:
                out.add(f"{name}.{node.attr}")
    return out


@pytest.mark.parametrize("shell", ["clockwork/cluster/sim.py", "controller/service.py",
                                   "controller/links.py", "controller/grpc_api.py",
                                   "controller/command.py", "worker/service.py"])
def test_shells_drive_the_cores_only_through_the_loops(shell):
    assert _calls(ROOT / shell) == set()


# ------------------------------------------------------------------ live faults

def test_live_faults_kill_restart_and_hang(tmp_path):
    """``clockwork serve --replay`` with [faults]: a worker process is killed, restarted on
    its port and reconnected; another is stopped and resumed; every request is answered
    exactly once and the restarted worker serves again."""
    sc = tmp_path / "f.toml"
    sc.write_text("""
seed = 1
duration_s = 8.0
[cluster]
workers = 2
gpus_per_worker = 1
[[models]]
name = "resnet50_v2"
copies = 4
[[models]]
name = "resnet18_v2"
copies = 4
[[workloads]]
kind = "poisson"
rate_rps = 1600
slo_ms = 100
[faults]
kill = [{ worker = 1, at_s = 1.5, back_s = 3.0 }]
hang = [{ worker = 0, at_s = 4.5, for_s = 0.5 }]
""")
    out = tmp_path / "live"
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(sc),
                        "--replay", "--quiet", "--out", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    for what in ("kill worker 1", "restart worker 1", "stop worker 0", "resume worker 0"):
        assert f"fault: {what}" in p.stderr
    assert "every request answered exactly once: True" in p.stdout + p.stderr
    with open(out / "requests.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    def served(gpu, lo, hi):
        return sum(1 for r in rows if r["gpu"] == gpu and r["status"] == "SUCCESS"
                   and lo <= int(r["arrival"]) + int(r["latency"]) < hi)

    def when(what):  # the time the fault was really played (a busy machine delays it)
        line = next(x for x in p.stderr.splitlines() if f"fault: {what}" in x)
        return sec(float(line.split("fault:")[0].split()[-2]))
    killed, back, stopped = when("kill worker 1"), when("restart worker 1"), when("stop worker 0")
    assert served("1", 0, sec(1.5)) > 100  # both GPUs serve the load that needs both
    assert served("1", killed + sec(0.1), back) == 0  # dead
    # (to the end of the run: a busy machine can play the restart seconds late)
    assert served("1", back + sec(1.0), sec(8.0)) > 100, "the restarted worker serves again"
    assert served("0", stopped + sec(0.1), sec(5.0)) == 0  # stopped


def test_live_faults_due_during_a_restart_are_played_on_time():
    """A worker's restart (a new process: ~0.3 s until it listens, here held 1.5 s) runs
    beside the plan: another worker's hang due meanwhile is played at its time, not once
    the restart is done (events due during a restart were played up to its length late,
    and a live replay then differed from the simulator); a worker's own events keep their
    order."""
    from clockwork.cluster.faults import LiveFaults

    def proc():
        return subprocess.Popen(["sleep", "60"])

    class Worker:
        def __init__(self):
            self.proc = proc()

    class Cluster:
        workers = [Worker(), Worker()]

        def restart_worker(self, w):
            threading.Event().wait(1.5)  # (a slow restart, not a synchronisation)
            self.workers[w] = Worker()

    cluster = Cluster()
    faults = {"kill": [{"worker": 1, "at_s": 0.05, "back_s": 0.1}],
              "hang": [{"worker": 0, "at_s": 0.2, "for_s": 0.2}]}
    lf = LiveFaults(cluster, faults, 5.0)
    try:
        lf.start(time.monotonic_ns())
        deadline = time.monotonic() + 20
        while len(lf.log) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        lf.stop()
        when = {what: t for t, what in lf.log}
        assert set(when) == {"kill worker 1", "restart worker 1", "stop worker 0",
                             "resume worker 0"}, lf.log
        assert when["stop worker 0"] < 1.0 and when["resume worker 0"] < 1.2, lf.log
        assert when["restart worker 1"] >= 1.5, lf.log
        assert not lf.failed, lf.failed
    finally:
        for w in cluster.workers:
            w.proc.kill()
            w.proc.wait()


def test_clock_offsets_are_converted_both_ways():
    """Workers on clocks far from the controller's: with exact estimates the run is the
    same as without offsets; with estimates off by up to 2 ms it still meets its SLOs
    (windows are wide enough) and nothing ends in the controller's future."""
    d = {**FAULTY, "faults": {}}
    d["workloads"] = [{"kind": "poisson", "rate_rps": 800, "slo_ms": 100}]
    base = simulate(d)
    shifted = simulate({**d, "cluster": {**d["cluster"], "clock_offsets_ms": [5000.0, -3000.0]}})
    assert shifted.telemetry.requests == base.telemetry.requests
    assert shifted.telemetry.actions == base.telemetry.actions
    off = simulate({**d, "cluster": {**d["cluster"], "clock_offsets_ms": [5000.0, -3000.0],
                                     "clock_error_ms": 2.0}})
    assert off.telemetry.requests != base.telemetry.requests
    assert off.summary["slo_attainment"] >= 0.99
    for row in off.telemetry.actions:  # sent <= measured completion, on the controller clock
        assert row[13] >= row[7]


def test_simulate_cli_reports_the_fault_plan(tmp_path):
    sc = tmp_path / "f.toml"
    sc.write_text("""
duration_s = 3.0
[cluster]
workers = 2
[[models]]
name = "resnet18_v2"
[[workloads]]
kind = "poisson"
rate_rps = 100
[faults]
kill = [{ worker = 1, at_s = 1.0, back_s = 2.0 }]
""")
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "simulate", str(sc)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [x.split("fault: ")[1] for x in p.stderr.splitlines() if "fault: " in x]
    assert lines == ["worker 1 killed", "controller lost worker 1; 0 action(s) failed",
                     "worker 1 restarted", "controller reconnected to worker 1"]


def test_a_late_timer_does_not_blame_the_workers():
    """The controller's own timer fired far too late (a saturated CPU): answers may be
    waiting unread, so the probes get a fresh timeout instead of making workers suspect."""
    loop, t = controller(workers=1)
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    a = t.sent[0][1][0]
    bound = a.expected_end + max(ms(10), a.expected_duration // 2)
    loop.tick(bound)
    assert t.probes == [0]
    armed = loop.armed
    loop.tick(armed + ms(500))  # 500 ms late
    assert not loop.suspect[0] and 0 in loop.probing
    # on time now, and still no answer: suspect (the only worker up: after a second probe)
    until = loop.probing[0] + loop.liveness.probe_timeout
    while not loop.suspect[0] and loop.armed is not None and loop.armed <= until:
        loop.tick(loop.armed)
    assert loop.suspect[0] and t.probes == [0, 0]


def test_fault_runs_repeat_exactly_across_processes(tmp_path):
    """Two `clockwork simulate` processes with different string hashing give the same
    bytes (summary, request and action logs) for a run with faults."""
    import os
    import tomllib  # noqa: F401 - the scenario is written as TOML below

    sc = tmp_path / "f.toml"
    sc.write_text("""
seed = 2
duration_s = 4.0
[cluster]
workers = 2
[[models]]
name = "resnet50_v2"
copies = 4
[[models]]
name = "resnet18_v2"
copies = 4
[[workloads]]
kind = "poisson"
rate_rps = 1600
slo_ms = 100
[faults]
kill = [{ worker = 1, at_s = 1.0, back_s = 2.5 }]
hang = [{ worker = 0, at_s = 3.0, for_s = 0.5 }]
""")
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"run{seed}"
        subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "simulate", str(sc),
                        "--out", str(out), "--quiet"], check=True, capture_output=True,
                       env=dict(os.environ, PYTHONHASHSEED=seed), timeout=120)
        outs.append(out)
    for name in ("requests.tsv", "actions.tsv", "summary.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_the_count_of_workers_up_follows_every_change():
    """``n_up`` (what ``no_worker`` reads) is the count of ``up`` after a loss, a loss
    seen twice, a suspect worker, its reset answered, a worker back, a worker added and
    an add the policy refuses."""
    loop, t = controller(3)

    def check():
        assert loop.n_up == sum(loop.up), (loop.n_up, loop.up)

    check()
    loop.worker_lost(0, 0)
    loop.worker_lost(0, 1)  # (seen twice)
    check()
    loop._suspect(1, 2, "test")
    check()
    loop.heard_from(1, 3)  # re-admission: reset sent, not up until it is answered
    check()
    assert loop.up[1] is False and t.resets == [1]
    loop.reset_done(1, 4, {})
    check()
    loop.worker_back(0, 5)
    loop.worker_back(0, 6)  # (back twice)
    check()
    assert loop.n_up == 3 and not loop.no_worker()
    assert loop.add_worker([GpuSpec(3, 0, 100)], 7) == 3
    check()
    for w in range(4):
        loop.worker_lost(w, 8)
    check()
    assert loop.no_worker()

    def refuse(spec, now):  # a policy that cannot grow: the add refused, none counted
        raise NotImplementedError
    loop.policy.add_gpu = refuse
    with pytest.raises(NotImplementedError):
        loop.add_worker([GpuSpec(4, 0, 100)], 9)
    check()
    assert len(loop.up) == 4


def test_a_removed_worker_takes_nothing_and_is_never_taken_back():
    loop, t = controller(workers=2)
    loop.requests([Request(i, "resnet50_v2", 0, ms(100)) for i in range(4)], 0)
    (w, acts), = t.sent
    other = 1 - w
    failed = loop.remove_worker(w, ms(1))
    assert failed == len(acts) and not loop.outstanding[w]
    assert loop.removed[w] and not loop.up[w] and not loop.no_worker()
    assert loop.remove_worker(w, ms(1)) == 0  # (removed already)
    # nothing brings it back: a late result, a probe's answer, a reconnection, a reset
    loop.results(w, [], ms(2))
    loop.heard_from(w, ms(2))
    loop.worker_back(w, ms(2))
    loop.reset_done(w, ms(2), {})
    assert not loop.up[w] and t.resets == []
    # the requests its failed actions held are served on the other worker, as every later one
    now = ms(2)
    while loop.armed is not None and loop.armed <= ms(50):
        now = loop.armed
        loop.tick(now)
        for x, sent in list(t.sent):
            assert x == other or sent is acts
    loop.request(Request(9, "resnet50_v2", now, ms(100)), now)
    assert t.sent[-1][0] == other
    # removing the last worker leaves none: requests are answered no_worker at once
    loop.remove_worker(other, now)
    assert loop.no_worker()


def _answer_all(loop, w: int, now: int) -> None:
    """Every action outstanding at worker ``w`` ends well, in the order sent, by ``now``."""
    from clockwork.actions import Result
    rs = [Result(id=a.id, type=a.type, status=ErrorCode.SUCCESS, worker=w, gpu=a.gpu,
                 model=a.model, batch_size=a.batch_size, received=now,
                 begin=min(a.earliest, now), end=min(max(a.expected_end, a.earliest), now))
          for a in sorted(loop.outstanding[w].values(), key=lambda a: a.id)]
    loop.results(w, rs, now)


def _run_until(loop, t, end: int, serving: tuple[int, ...] = ()) -> int:
    """Until ``end``: the actions sent to the ``serving`` workers each end well at its
    expected end, and the loop is ticked at its armed times; the last time reached."""
    now = 0
    while True:
        due = [a.expected_end for w in serving for a in loop.outstanding[w].values()]
        at = min([x for x in (loop.armed, min(due, default=None)) if x is not None],
                 default=end + 1)
        if at > end:
            return now
        now = max(now, at)
        for w in serving:
            _answer_due(loop, w, now)
        if loop.armed is not None and loop.armed <= now:
            loop.tick(now)


def _answer_due(loop, w: int, now: int) -> None:
    """The actions outstanding at worker ``w`` expected to end by ``now`` end well then."""
    from clockwork.actions import Result
    rs = [Result(id=a.id, type=a.type, status=ErrorCode.SUCCESS, worker=w, gpu=a.gpu,
                 model=a.model, batch_size=a.batch_size, received=now,
                 begin=min(a.earliest, now), end=a.expected_end)
          for a in sorted(loop.outstanding[w].values(), key=lambda a: a.id)
          if a.expected_end <= now]
    if rs:
        loop.results(w, rs, now)


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_a_drained_worker_finishes_what_it_has_in_flight_and_takes_nothing_new(policy):
    """Worker ``w`` is drained with actions in flight: nothing more is sent to it, its
    actions' results reach the policy as usual (none fails), the transport hears
    ``drained`` once, with the last of them, and every request is answered once and
    well (those it was serving from it, the others on the other worker); nothing brings
    it back, and its removal then fails nothing."""
    specs = [GpuSpec(0, 0, 100), GpuSpec(1, 0, 100)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    loop.requests([Request(i, "resnet50_v2", 0, sec(2)) for i in range(4)], 0)
    (w, acts), = t.sent
    other = 1 - w
    n = loop.drain_worker(w, ms(1))
    assert n == len(acts) == len(loop.outstanding[w]) and t.drains == []
    assert loop.drain_worker(w, ms(1)) == 0  # (draining already)
    sent = len(t.sent)
    loop.requests([Request(i, "resnet50_v2", ms(1), sec(2)) for i in range(4, 8)], ms(1))
    loop.heard_from(w, ms(2))
    loop.worker_back(w, ms(2))
    assert t.drains == []
    _answer_all(loop, w, ms(40))
    assert t.drains == [(w, 0)] and not loop.outstanding[w]
    now = _run_until(loop, t, sec(3), (other,))
    assert all(x == other for x, _ in t.sent[sent:]), t.sent[sent:]
    assert sorted(r.request.id for r in t.answers) == list(range(8))
    assert all(r.status == 0 for r in t.answers), [r.message for r in t.answers]
    assert loop.remove_worker(w, now) == 0 and t.drains == [(w, 0)] and t.resets == []


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_a_draining_worker_with_two_gpus_is_sent_nothing_new(policy):
    """Worker 0 has two GPUs: the work its first GPU gives back as it leaves the policy
    goes to the other worker, not to its second GPU (which left just after: its LOAD and
    INFER were sent to the draining worker); and a draining worker is not one that takes
    work: with the other worker lost, a request is answered no_worker at once."""
    specs = [GpuSpec(w, g, 100) for w in range(2) for g in range(2)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    loop.requests([Request(i, "resnet50_v2", 0, sec(2)) for i in range(64)], 0)
    assert any(w == 0 for w, _ in t.sent)
    sent = len(t.sent)
    loop.drain_worker(0, ms(1))
    assert all(w == 1 for w, _ in t.sent[sent:]), [(w, [a.type for a in acts])
                                                   for w, acts in t.sent[sent:]]
    assert not loop.no_worker()
    loop.worker_lost(1, ms(2))
    assert loop.no_worker() and loop.n_up == 0


def test_a_worker_lost_while_draining_is_said_drained_and_not_taken_back():
    """Lost before its actions in flight end: they fail back (their requests go to the
    other worker), the transport hears ``drained`` then, and neither a reconnection nor
    a probe's answer takes it back."""
    loop, t = controller(workers=2)
    loop.requests([Request(i, "resnet50_v2", 0, sec(2)) for i in range(4)], 0)
    (w, acts), = t.sent
    assert loop.drain_worker(w, ms(1)) == len(acts)
    assert loop.worker_lost(w, ms(2)) == len(acts) and t.drains == [(w, len(acts))]
    loop.worker_back(w, ms(3))
    loop.heard_from(w, ms(3))
    assert not loop.up[w] and t.resets == []
    _run_until(loop, t, sec(3), (1 - w,))
    assert sorted(r.request.id for r in t.answers) == list(range(4))
    assert all(r.status == 0 for r in t.answers)
    assert loop.remove_worker(w, ms(5)) == 0 and t.drains == [(w, len(acts))]


def test_a_worker_drained_with_nothing_in_flight_is_said_drained_at_once():
    loop, t = controller(workers=2)
    assert loop.drain_worker(1, 0) == 0 and t.drains == [(1, 0)]
    loop.request(Request(1, "resnet50_v2", 0, ms(100)), 0)
    assert [w for w, _ in t.sent] == [0]


def test_a_worker_added_after_a_removal_gets_the_next_index():
    loop, _ = controller(workers=1)
    loop.remove_worker(0, 0)
    assert loop.add_worker([GpuSpec(1, 0, 100)], ms(1)) == 1
    assert loop.removed == [True, False] and loop.up == [False, True]


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_a_model_that_fit_only_on_a_removed_gpu_fits_nowhere(policy):
    """The only GPU large enough for the model was a removed worker's: each request is
    answered that it fits on no GPU, those that arrive later at once (they waited out
    their SLO for that GPU), and those queued for it then too (tfserving and infaas,
    which keep a request until it is served, never answered them); a lost GPU still
    counts (it may come back)."""
    specs = [GpuSpec(0, 0, 5), GpuSpec(1, 0, 100)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    loop.worker_lost(1, 0)
    loop.request(Request(1, "resnet50_v2", ms(1), ms(100)), ms(1))
    assert not t.answers  # (waits for the lost GPU to come back)
    loop.remove_worker(1, ms(2))
    loop.request(Request(2, "resnet50_v2", ms(3), ms(100)), ms(3))
    assert sorted((r.request.id, r.message) for r in t.answers) == [
        (1, "model does not fit on any GPU"), (2, "model does not fit on any GPU")]


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_requests_whose_load_was_on_a_removed_gpu_are_answered(policy):
    """Requests wait for a LOAD (and, with clockwork, an INFER sent behind it) on the only
    GPU that can hold their model when its worker is removed: every one is answered at
    once that it fits on no GPU (the baselines kept them for ever; clockwork's in that
    INFER, failed back, waited out their SLO)."""
    specs = [GpuSpec(0, 0, 5), GpuSpec(1, 0, 100)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    loop.requests([Request(i, "resnet50_v2", ms(1), sec(5)) for i in range(3)], ms(1))
    assert [(w, acts[0].type) for w, acts in t.sent] == [(1, ActionType.LOAD)]
    loop.remove_worker(1, ms(2))
    _all_answered_unfit_by(loop, t, ms(2) + 2 * FAIL_DELAY)


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_requests_queued_while_every_gpu_is_removed_are_answered_no_worker_at_once(
        policy):
    """Every GPU removed while requests wait for their model: nothing is left to serve
    them, so they are answered at once, as the shell answers those that come then
    (``no_worker``: they waited out their SLO, and tfserving and infaas kept them until a
    worker joined); a worker that joins then whose GPU cannot hold the model has the
    requests that come after answered that it fits on no GPU."""
    specs = [GpuSpec(0, 0, 100)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50], specs), t, specs)
    loop.requests([Request(i, "resnet50_v2", 0, sec(5)) for i in range(3)], 0)
    loop.remove_worker(0, ms(1))
    while loop.armed is not None and loop.armed <= ms(50):  # (its LOAD failed back)
        loop.tick(loop.armed)
    # (one whose LOAD or INFER was in flight: once it failed back, FAIL_DELAY after)
    assert sorted((r.request.id, r.message) for r in t.answers) == [
        (i, NO_GPU_LEFT) for i in range(3)]
    assert max(r.time for r in t.answers) <= ms(1) + FAIL_DELAY
    t.answers.clear()
    loop.add_worker([GpuSpec(1, 0, 5)], ms(60))
    loop.requests([Request(i, "resnet50_v2", ms(61), sec(5)) for i in range(3)], ms(61))
    _all_answered_unfit_by(loop, t, ms(61) + 2 * FAIL_DELAY)


def _all_answered_unfit_by(loop, t, by: int) -> None:
    """Ticks the loop on its timer (up to 6 s) until requests 0, 1 and 2 are answered:
    each that its model fits on no GPU, the last of them by ``by``."""
    now = 0
    while loop.armed is not None and loop.armed <= sec(6) and len(t.answers) < 3:
        now = loop.armed
        loop.tick(now)
    assert sorted((r.request.id, r.message) for r in t.answers) == [
        (i, "model does not fit on any GPU") for i in range(3)]
    assert now <= by, now
