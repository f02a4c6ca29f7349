"""Scheduler rules with hand-fed events and exact expected actions.

Defaults: schedule_ahead 10 ms, future 1 ms, latest_delta 10 ms, buffer 5 ms.
Test profile: LOAD 8 ms, EXEC b=1 2.9 ms, b=2 4.06, b=4 6.38, b=8 11.02, b=16 20.3 ms,
7 pages.
"""

from __future__ import annotations

import heapq
from itertools import pairwise

import pytest

from clockwork.actions import NEVER, Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.requests import QUEUED, Request
from controller.config import SchedulerConfig
from controller.inflight import FAULT_PAUSE_NS
from controller.lanes import LaneTracker, WatchedLane
from controller.policy import GpuSpec
from controller.scheduler import ClockworkScheduler
from tests.conftest import make_profile

MS = 1_000_000
E = {1: 2_900_000, 2: 4_060_000, 4: 6_380_000, 8: 11_020_000, 16: 20_300_000}


def sched(models=("a",), gpus=1, pages=1376, **cfg):
    return ClockworkScheduler([make_profile(m) for m in models],
                              [GpuSpec(0, g, pages) for g in range(gpus)], SchedulerConfig(**cfg))


def ok(a: Action, begin: int, duration: int | None = None) -> Result:
    d = a.expected_duration if duration is None else duration
    return Result(a.id, a.type, ErrorCode.SUCCESS, a.worker, a.gpu, a.model, a.batch_size,
                  begin, begin, begin + d, d)


def fail(a: Action, at: int, code: ErrorCode) -> Result:
    return Result(a.id, a.type, code, a.worker, a.gpu, a.model, a.batch_size, at, at, at, 0)


def req(i, model="a", t=0, slo=100 * MS):
    return Request(i, model, t, slo)


def brief(actions):
    return [(a.type.name, a.model, a.batch_size, a.earliest, a.latest, a.expected_duration)
            for a in actions]


def warm(s, model="a", gpu=0, now=0):
    """Load ``model`` via a first request and finish everything; returns the time."""
    acts = s.on_request(req(10_000 + gpu, model, now), now)
    load = next(a for a in acts if a.type == ActionType.LOAD)
    t = now + 8 * MS + 100_000
    s.on_result(ok(load, now + 100_000), t)
    for a in acts:
        if a.type == ActionType.INFER:
            s.on_result(ok(a, t), t + a.expected_duration)
    s.drain_replies()
    return t + 3 * MS


def test_cold_request_loads_then_infers_after_load():
    s = sched()
    acts = s.on_request(req(1), 0)
    assert brief(acts) == [
        # LOAD predicted to start at now + future (1 ms) and take 8 ms
        ("LOAD", "a", 0, 0, 11 * MS, 8 * MS),
        # INFER may start when the LOAD is predicted to end (9 ms)
        ("INFER", "a", 1, 9 * MS, 19 * MS, E[1]),
    ]
    assert acts[1].expected_end == 9 * MS + E[1]
    assert acts[1].version == acts[0].version == 1
    s.on_result(ok(acts[0], 100_000), 8_200_000)
    s.on_result(ok(acts[1], 9 * MS), 12 * MS)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.SUCCESS and rep.time == 12 * MS and rep.request.cold


def occupy(s, now, duration, gpu=0):
    """Make the controller believe the GPU has ``duration`` of work outstanding."""
    s.gpus[gpu].exec.add(999_999, now, duration, now)


def test_window_fills_on_arrival_then_batches():
    s = sched()
    t = warm(s)
    sent = []
    for i in range(1, 7):
        sent += s.on_request(req(i, t=t), t)
    # the GPU is predicted free at t+1, 3.9, 6.8, 9.7 ms: four batch-1 INFERs start inside
    # the 10 ms schedule-ahead window; then it is full and requests 5 and 6 queue
    assert [(a.batch_size, a.expected_end - t) for a in sent] == [
        (1, 3_900_000), (1, 6_800_000), (1, 9_700_000), (1, 12_600_000)]
    assert s.queued() == 2
    wake = s.next_wakeup()
    assert wake == t + 12_600_000 - 10 * MS + 1
    acts = s.on_tick(wake)
    assert [(a.batch_size, a.expected_duration) for a in acts] == [(2, E[2])]


def test_batch_formed_when_gpu_window_opens():
    s = sched()
    t = warm(s)
    occupy(s, t, 30 * MS)  # predicted free at t+31 ms
    acts = []
    for i in range(1, 7):
        acts += s.on_request(req(i, t=t), t)
    assert acts == []
    wake = s.next_wakeup()
    assert wake == t + 31 * MS - 10 * MS + 1
    acts = s.on_tick(wake)
    # six queued: the largest batch they fill is 4; the next (2) starts after it, outside
    # the window, so it waits for the next wake
    assert [(a.batch_size, a.expected_end - t) for a in acts] == [(4, 31 * MS + E[4])]
    acts = s.on_tick(s.next_wakeup())
    assert [a.batch_size for a in acts] == [2]


def test_requests_that_cannot_finish_are_answered_at_once():
    s = sched()
    t = warm(s)
    occupy(s, t, 50 * MS)  # GPU busy until t+51 ms
    s.on_request(req(1, t=t, slo=20 * MS), t)  # deadline t+15 ms: impossible on any GPU
    s.on_request(req(2, t=t, slo=100 * MS), t)
    (rep,) = s.drain_replies()
    assert rep.request.id == 1 and rep.status == RequestStatus.TIMEOUT and rep.time == t
    acts = s.on_tick(s.next_wakeup())
    assert [a.batch_size for a in acts] == [1]


def test_expired_request_answered_by_tick():
    s = sched()
    t = warm(s)
    occupy(s, t, 80 * MS)  # free at t+81: request 1 could still start at t+81 < t+92.1
    s.on_request(req(1, t=t, slo=100 * MS), t)
    assert s.drain_replies() == []
    s.gpus[0].exec.add(999_998, t, 40 * MS, t)  # more work arrives ahead of it
    drop_at = t + 95 * MS - E[1]  # deadline t+95 ms minus batch-1 EXEC
    gpu_wake = s.next_wakeup()
    assert gpu_wake == t + 71 * MS + 1  # the window was to open at t+81-10 ms
    assert s.on_tick(gpu_wake) == []  # now busy until t+121 ms
    wake = s.next_wakeup()
    assert wake == drop_at + 1
    s.on_tick(wake)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.TIMEOUT and rep.time == drop_at + 1


def test_skipped_urgent_requests_dropped_for_full_batch():
    """INFER5 runs the largest batch it can fill; requests ahead of it that are too
    urgent for that batch are dropped (Clockwork's queue catch-up)."""
    s = sched()
    t = warm(s)
    occupy(s, t, 30 * MS)
    s.on_request(req(1, t=t, slo=50 * MS), t)  # deadline t+45: at start t+31 only b<=8 fits
    for i in range(2, 18):
        s.on_request(req(i, t=t, slo=100 * MS), t)
    acts = s.on_tick(t + 21 * MS + 1)
    assert [a.batch_size for a in acts] == [16]
    reps = s.drain_replies()
    assert [(r.request.id, r.status) for r in reps] == [(1, RequestStatus.TIMEOUT)]
    assert sorted(r.id for r in acts[0].requests) == list(range(2, 18))


def test_most_urgent_model_first():
    s = sched(models=("a", "b"))
    t = warm(s, "a")
    t = warm(s, "b", now=t)
    occupy(s, t, 30 * MS)
    s.on_request(req(1, "a", t=t, slo=200 * MS), t)
    s.on_request(req(2, "b", t=t, slo=100 * MS), t)
    first = s.on_tick(s.next_wakeup())
    second = s.on_tick(s.next_wakeup())
    assert [a.model for a in first + second] == ["b", "a"]


def test_lru_eviction_prefers_models_without_demand():
    s = sched(models=("a", "b", "c"), pages=14)  # room for two 7-page models
    t = warm(s, "a")
    t = warm(s, "b", now=t)  # b used more recently than a
    acts = s.on_request(req(1, "c", t=t), t)
    assert [(a.type.name, a.model) for a in acts][:2] == [("EVICT", "a"), ("LOAD", "c")]
    assert acts[0].earliest == 0 and acts[0].latest == NEVER
    assert s.pages_used(0) == 14


def test_no_eviction_of_model_in_use():
    s = sched(models=("a", "b"), pages=7)
    t = warm(s, "a")
    busy = s.on_request(req(1, "a", t=t), t)
    assert [a.type for a in busy] == [ActionType.INFER]
    acts = s.on_request(req(2, "b", t=t), t)
    assert acts == []  # a has an INFER in flight: not evictable yet
    s.on_result(ok(busy[0], t + MS), t + 4 * MS)
    acts = s.on_tick(s.next_wakeup())
    assert [(a.type.name, a.model) for a in acts][:2] == [("EVICT", "a"), ("LOAD", "b")]


def test_rejected_infer_requeued_then_retried():
    s = sched()
    t = warm(s)
    (a,) = s.on_request(req(1, t=t), t)
    acts = s.on_result(fail(a, t + MS, ErrorCode.EXEC_TOO_LATE), t + 2 * MS)
    # it can still make its deadline: sent again at once
    assert s.drain_replies() == []
    assert s.queued() == 0
    retry = [x for x in acts if x.type == ActionType.INFER]
    assert len(retry) == 1 and retry[0].id != a.id and retry[0].batch_size == 1
    assert [r.id for r in retry[0].requests] == [1]
    assert s.stats() == {"infer": 3, "load": 1, "evict": 0, "rejected": 1}  # warm ran one


def test_rejected_infer_too_late_to_retry_answers_timeout_other_failures_error():
    """An INFER the worker turned away as too late, with no time left to try again: its
    request is answered TIMEOUT (its SLO cannot be met: one error table for every front
    end; it was ERROR, which the metrics and summaries counted as failed while KServe
    clients got DEADLINE_EXCEEDED), the worker's code in the message. Another failure
    with no time left (the worker lost): ERROR."""
    for code, status in ((ErrorCode.EXEC_TOO_LATE, RequestStatus.TIMEOUT),
                         (ErrorCode.EXEC_TOO_EARLY, RequestStatus.TIMEOUT),
                         (ErrorCode.WEIGHTS_NOT_PRESENT, RequestStatus.ERROR)):
        s = sched()
        t = warm(s)
        (a,) = s.on_request(req(1, t=t, slo=20 * MS), t)
        s.on_result(fail(a, t + 16 * MS, code), t + 16 * MS)
        (rep,) = s.drain_replies()
        assert rep.status == status and code.name in rep.message, (code, rep)


def test_infers_behind_a_load_refused_too_late_answer_timeout_not_error():
    """A cold request's LOAD refused as too late (a burst: it reached the worker past its
    window), then its INFER, sent behind it, refused for want of the weights: with no
    time left the request is answered TIMEOUT, the LOAD's code in the message (it was
    ERROR "weights not in the cache": a cluster fault to the caller, 503/UNAVAILABLE,
    for what was a deadline missed). A LOAD refused otherwise (no room) stays ERROR. The
    INFER's result may come first (the LOAD and EXEC lanes run apart): its LOAD not
    answered yet, TIMEOUT too."""
    for load_code, status in ((ErrorCode.LOAD_TOO_LATE, RequestStatus.TIMEOUT),
                              (ErrorCode.LOAD_INSUFFICIENT_CACHE, RequestStatus.ERROR)):
        s = sched()
        load, inf = s.on_request(req(1, slo=20 * MS), 0)
        assert (load.type, inf.type) == (ActionType.LOAD, ActionType.INFER)
        s.on_result(fail(load, MS, load_code), MS)
        s.on_result(fail(inf, 17 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 17 * MS)
        (rep,) = s.drain_replies()
        assert rep.status == status, (load_code, rep)
        said = load_code if status == RequestStatus.TIMEOUT else ErrorCode.WEIGHTS_NOT_PRESENT
        assert said.name in rep.message, (load_code, rep)
    s = sched()
    load, inf = s.on_request(req(1, slo=20 * MS), 0)
    s.on_result(fail(inf, 17 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 17 * MS)  # (first)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.TIMEOUT and "WEIGHTS_NOT_PRESENT" in rep.message, rep
    s.on_result(fail(load, 18 * MS, ErrorCode.LOAD_TOO_LATE), 18 * MS)
    assert s.drain_replies() == []


def test_max_batch_below_every_compiled_size_runs_the_smallest():
    """A model compiled for batches of 4 and 8 only, ``max_batch`` 2: its requests run
    in batches of 4, the smallest it has, as the baselines run them (the scheduler took
    batch size 1, which the model has no function for: KeyError, the run crashed)."""
    s = ClockworkScheduler([make_profile("a", batches=(4, 8))], [GpuSpec(0, 0, 1376)],
                           SchedulerConfig(max_batch=2))
    acts = s.on_request(req(1), 0)
    load = next(a for a in acts if a.type == ActionType.LOAD)
    t = 8 * MS + 100_000
    acts = s.on_result(ok(load, 100_000), t) + [a for a in acts if a.type == ActionType.INFER]
    infer = next(a for a in acts if a.type == ActionType.INFER)
    assert infer.batch_size == 4
    s.on_result(ok(infer, t), t + infer.expected_duration)
    assert [r.status for r in s.drain_replies()] == [RequestStatus.SUCCESS]


def test_estimates_follow_measurements():
    s = sched()
    t = warm(s)
    for i in range(10):
        (a,) = s.on_request(req(100 + i, t=t), t)
        s.on_result(ok(a, t, duration=4 * MS), t + 4 * MS)
        t += 5 * MS
    (a,) = s.on_request(req(200, t=t), t)
    assert a.expected_duration == 4 * MS  # p99 of the last 10 measurements


def test_estimates_are_the_time_the_lane_was_held_not_the_work_alone():
    """A live worker's result spans the hand-over to its device thread and back (begin ..
    end); duration is the device's work alone. The lane is busy for all of it, so the
    estimates (EXEC and LOAD) follow end - begin: with the work alone, a GPU's small
    models were planned back to back several times faster than the worker ran them."""
    s = sched()
    acts = s.on_request(req(1), 0)
    load = next(a for a in acts if a.type == ActionType.LOAD)
    lr = Result(load.id, load.type, ErrorCode.SUCCESS, 0, 0, "a", 0, 0, 0, 9 * MS, 3 * MS)
    s.on_result(lr, 9 * MS)
    assert s.models["a"].est.load == 9 * MS
    t = 20 * MS
    for i in range(10):
        (a,) = s.on_request(req(100 + i, t=t), t)
        r = ok(a, t, duration=MS)
        r.end = t + 3 * MS  # the device worked 1 ms of the 3 the lane was held
        s.on_result(r, t + 3 * MS)
        t += 5 * MS
    (a,) = s.on_request(req(200, t=t), t)
    assert a.expected_duration == 3 * MS


def test_unknown_model_and_bad_slo_are_invalid():
    s = sched()
    assert s.on_request(req(1, "nope"), 0) == []
    assert s.on_request(Request(2, "a", 0, -5), 0) == []
    reps = s.drain_replies()
    assert [r.status for r in reps] == [RequestStatus.INVALID_REQUEST] * 2
    assert "nope" in reps[0].message


def test_load_spreads_over_gpus_by_demand():
    s = sched(models=("a", "b"), gpus=2)
    acts = s.on_request(req(1, "a"), 0) + s.on_request(req(2, "b"), 0)
    loads = [(a.model, a.gpu) for a in acts if a.type == ActionType.LOAD]
    assert sorted(loads) == [("a", 0), ("b", 1)]


def test_failed_load_forgets_copy_and_retries():
    s = sched()
    acts = s.on_request(req(1), 0)
    load = acts[0]
    s.on_result(fail(load, MS, ErrorCode.LOAD_INSUFFICIENT_CACHE), 2 * MS)
    s.on_result(fail(acts[1], 9 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 9 * MS)
    again = s.on_tick(s.next_wakeup())
    assert [a.type.name for a in again][:1] == ["LOAD"]


def test_cold_models_spread_over_idle_gpus():
    s = sched(models=("a", "b", "c", "d"), gpus=2)
    acts = []
    done = set()
    t = 0
    for i, m in enumerate("abcd"):
        acts += s.on_request(req(i, m, t=t), t)
        # the previous LOADs finished: PCIe lanes are idle again, demand is served
        for a in [x for x in acts if x.type == ActionType.LOAD and x.id not in done]:
            done.add(a.id)
            s.on_result(ok(a, t), t + 8 * MS)
        t += 20 * MS
    loads = sorted((a.model, a.gpu) for a in acts if a.type == ActionType.LOAD)
    assert [g for _, g in loads].count(0) == 2 and [g for _, g in loads].count(1) == 2


def test_infer_turned_away_during_a_long_load_keeps_the_copy_and_retries():
    # a real LOAD ran far longer than predicted: the worker turned the INFER (and its
    # retry) away before the weights were there; the copy is fine once the LOAD is done
    s = sched()
    load, inf = s.on_request(req(1, slo=500 * MS), 0)
    (inf2,) = s.on_result(fail(inf, 9 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 9 * MS + 100_000)
    assert inf2.type == ActionType.INFER
    assert s.on_result(ok(load, 1 * MS, 70 * MS), 72 * MS) == []  # the retry is in flight
    (inf3,) = s.on_result(fail(inf2, 60 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 72 * MS)
    assert inf3.type == ActionType.INFER and inf3.model == "a"  # no new LOAD: weights are there
    s.on_result(ok(inf3, 73 * MS), 76 * MS)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.SUCCESS


def test_infer_turned_away_by_a_load_past_its_prediction_is_retried_a_load_later():
    """An INFER turned away (WEIGHTS_NOT_PRESENT) because its copy's LOAD runs past its
    predicted end: the retry may start no sooner than a LOAD's length later. It was sent
    to start at once, turned away again, and so on every round trip until the LOAD's
    result came (57 INFERs against one LOAD in a noisy run)."""
    s = sched()
    load, inf = s.on_request(req(1, slo=500 * MS), 0)
    assert inf.earliest == 9 * MS  # the LOAD's predicted end
    sent, now = [inf], 9 * MS
    while now < 40 * MS:  # the LOAD ends at 40 ms: each INFER is turned away at its start
        a = sent[-1]
        now = max(now, a.earliest) + 100_000  # (a round trip)
        if now >= 40 * MS:
            break
        (retry,) = s.on_result(fail(a, now - 50_000, ErrorCode.WEIGHTS_NOT_PRESENT), now)
        assert retry.type == ActionType.INFER and retry.earliest == now + 8 * MS
        sent.append(retry)
    assert len(sent) <= 5, len(sent)  # (one every 0.1 ms before: ~300)
    s.on_result(ok(load, 1 * MS, 39 * MS), 40 * MS)
    s.on_result(ok(sent[-1], sent[-1].earliest), sent[-1].earliest + E[1])
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.SUCCESS


def test_infer_refused_for_what_it_carried_is_answered_at_once_not_retried():
    # the worker refused the batch itself (a batch size the package was not compiled
    # for): no copy would do better, so no retry until the deadline (a storm of INFERs,
    # then TIMEOUT): ERROR at once, with the worker's message
    s = sched()
    t = warm(s)
    (inf,) = s.on_request(req(1, t=t, slo=500 * MS), t)
    assert s.on_result(fail(inf, t + MS, ErrorCode.INVALID_BATCH_SIZE), t + 2 * MS) == []
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.ERROR and "INVALID_BATCH_SIZE" in rep.message, rep
    assert s.on_tick(t + 3 * MS) == [] and s.next_wakeup() is None
    # INVALID_INPUT is also a device's failure while it runs the kernels: retried, once
    # the copy has sat out its pause (FAULT_PAUSE_NS: the only copy, so on it again)
    (inf,) = s.on_request(req(2, t=t + 3 * MS, slo=500 * MS), t + 3 * MS)
    again = s.on_result(fail(inf, t + 4 * MS, ErrorCode.INVALID_INPUT), t + 5 * MS)
    while not again:
        again = s.on_tick(s.next_wakeup())
    assert s.drain_replies() == [] and [a.type for a in again] == [ActionType.INFER], again
    assert again[0].earliest >= t + 5 * MS + FAULT_PAUSE_NS


class Driven:
    """The scheduler ``s`` driven in virtual time against a device whose ``outcome(action,
    sent_at)`` says when each action ends and its ``Result``: ``request`` and ``until``
    play arrivals and everything due up to a time, in order."""

    def __init__(self, s, outcome) -> None:
        self.s, self.outcome = s, outcome
        self.pending: list = []
        self.seq = 0

    def send(self, actions, now: int) -> None:
        for a in actions:
            self.seq += 1
            at, res = self.outcome(a, now)
            heapq.heappush(self.pending, (at, self.seq, res))

    def request(self, r, now: int) -> None:
        self.until(now)
        self.send(self.s.on_request(r, now), now)

    def until(self, t: int) -> None:
        s, pending = self.s, self.pending
        while True:
            wake = s.next_wakeup()
            due = pending[0][0] if pending else None
            if due is not None and due <= t and (wake is None or due <= wake):
                at, _, res = heapq.heappop(pending)
                self.send(s.on_result(res, at), at)
            elif wake is not None and wake <= t:
                self.send(s.on_tick(wake), wake)
            else:
                return


def test_a_copy_whose_device_fails_its_infers_sits_out_and_the_other_copy_serves():
    """Two GPUs with a copy each; GPU 0's device fails every INFER (INVALID_INPUT: its
    kernels fail) from 50 ms on, at once. Each failed batch goes back to the queue and,
    without a pause, to the copy free first -- the failing one again, about 4,000 times
    for 374 requests of 100 ms SLO, and some requests answered TIMEOUT or ERROR while GPU
    1 sat idle. The failing copy sits out 1 ms, then 2, 4, ... (up to 1 s) after each
    failure in a row, so the other copy serves: every request succeeds, a few dozen
    failures in all."""
    tried = {0: 0, 1: 0}

    def outcome(a, now):
        if a.type == ActionType.INFER:
            tried[a.gpu] += 1
            if a.gpu == 0 and now > 50 * MS:
                return now + 200_000, fail(a, now + 200_000, ErrorCode.INVALID_INPUT)
        begin = max(now, a.earliest)
        return begin + a.expected_duration + 100_000, ok(a, begin)

    s = sched(gpus=2)
    d = Driven(s, outcome)
    for k in range(400):  # 500 r/s: both GPUs get a copy before 50 ms
        d.request(req(k, t=2 * k * MS), 2 * k * MS)
    d.until(2_000 * MS)
    assert not d.pending and s.next_wakeup() is None
    late = [r for r in s.drain_replies() if r.request.arrival > 50 * MS]
    assert len(late) == 374 and {r.status for r in late} == {RequestStatus.SUCCESS}
    assert s.model_view("a").loaded_on == (0, 1)
    assert tried[1] > 300 and tried[0] < 60, tried


def test_a_request_failed_on_a_paused_copy_goes_to_the_other_copy_not_timed_out():
    """Two GPUs with a copy each, both idle; the request's INFER goes to GPU 0, whose
    device fails it. Put back, it goes to GPU 1 at once: it went to GPU 0 again (asked
    first, its lane free first, its pause short), four times, then was timed out by GPU
    0's decision though GPU 1's lane was free the whole time."""
    s = sched(gpus=2)
    s.adopt_copies(0, 0, [("a", 1)])
    s.adopt_copies(1, 0, [("a", 1)])
    t = 100 * MS
    (a,) = [x for x in s.on_request(req(1, t=t, slo=20 * MS), t) if x.type == ActionType.INFER]
    assert a.gpu == 0
    at = t + 200_000
    (b,) = [x for x in s.on_result(fail(a, at, ErrorCode.INVALID_INPUT), at)
            if x.type == ActionType.INFER]
    assert b.gpu == 1 and b.earliest <= at + MS, b
    s.on_result(ok(b, b.earliest), b.earliest + b.expected_duration)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.SUCCESS and rep.gpu == 1


def test_a_model_whose_infers_fail_on_every_copy_is_answered_error_not_timeout():
    """One GPU, the model's only copy; its device fails every INFER (INVALID_INPUT: a
    package whose kernels fail) from the start, until 3 s. Requests of 2 s SLO, one each
    10 ms. Before, each waited out its SLO, tried every pause's end, and was answered
    TIMEOUT "SLO cannot be met", as if the cluster were overloaded; the worker's reason
    reached nobody. After 3 failures in a row the queued and arriving requests are
    answered ERROR with the worker's message at once, and the copy is tried again at
    each pause's end: once the device works again, the requests succeed."""
    heal = 3_000 * MS

    def outcome(a, now):
        begin = max(now, a.earliest)
        return begin + a.expected_duration, (
            ok(a, begin) if begin >= heal else fail(a, begin, ErrorCode.INVALID_INPUT))

    s = sched()
    s.adopt_copies(0, 0, [("a", 1)])
    d = Driven(s, outcome)
    for k in range(500):
        t = 10 * MS + 10 * k * MS
        d.request(req(k, t=t, slo=2_000 * MS), t)
    d.until(10_000 * MS)
    answered = {r.request.id: (r.status, r.time - r.request.arrival, r.message)
                for r in s.drain_replies()}
    assert len(answered) == 500
    failing = [answered[k] for k in range(5, 250)]  # (from the 3rd failure to 2.5 s)
    assert {st for st, _, _ in failing} == {RequestStatus.ERROR}, failing[:3]
    assert all("INVALID_INPUT" in msg for _, _, msg in failing)
    assert max(waited for _, waited, _ in failing) < 1_100 * MS  # (not their 2 s SLO)
    healed = [answered[k][0] for k in range(420, 500)]  # (past the last pause after 3 s)
    assert set(healed) == {RequestStatus.SUCCESS}


def test_a_cancelled_request_in_the_infer_that_finds_every_copy_failing_is_cancelled():
    """A request cancelled while its INFER runs, that INFER the copy's third failure in a
    row (the model's every copy failing: its requests answered at once): it is answered
    CANCELLED, as a withdrawn request of a failed INFER is. It was answered the worker's
    error, and not counted cancelled."""
    from controller.policy import CANCELLED

    s = sched()
    s.adopt_copies(0, 0, [("a", 1)])
    t = 100 * MS
    r = req(1, t=t, slo=2_000 * MS)
    acts = s.on_request(r, t)
    for k in range(3):
        while not [a for a in acts if a.type == ActionType.INFER]:
            t = s.next_wakeup()
            acts = s.on_tick(t)
        (a,) = [a for a in acts if a.type == ActionType.INFER]
        t = max(t, a.earliest) + MS
        if k == 2:
            assert s.cancel([r], t) == [] and s.drain_replies() == []  # (it runs on)
        acts = s.on_result(fail(a, t, ErrorCode.INVALID_INPUT), t)
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.ERROR and rep.message == CANCELLED, rep
    assert s.models["a"].failing_until > t  # (the model's requests answered at once)


def test_a_copy_found_gone_while_it_sits_out_a_fault_is_forgotten():
    """Two INFERs out on the only copy: the first fails on the device (the copy sits out
    a pause), the second finds the weights gone (the worker was reset): the copy is
    forgotten at once (its pause, kept in its predicted ready time, made it look like an
    INFER turned away before its LOAD finished, and the copy was kept)."""
    s = sched()
    s.adopt_copies(0, 0, [("a", 1)])
    t = 100 * MS
    (a1,) = [a for a in s.on_request(req(1, t=t), t) if a.type == ActionType.INFER]
    acts = s.on_request(req(2, t=t), t)
    while not [a for a in acts if a.type == ActionType.INFER]:
        acts = s.on_tick(s.next_wakeup())
    (a2,) = [a for a in acts if a.type == ActionType.INFER]
    s.on_result(fail(a1, t + MS, ErrorCode.INVALID_INPUT), t + MS)
    assert s.models["a"].instances[0].ready_at > t + 2 * MS  # (sitting out its pause)
    s.on_result(fail(a2, t + 2 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), t + 2 * MS)
    assert s.model_view("a").loaded_on == ()


def test_loads_refused_in_a_row_answer_the_queue_instead_of_loading_on():
    # a worker that cannot load the model (a broken package, too few contiguous pages):
    # each refused LOAD (and the INFER sent behind it) was followed by another at once,
    # hundreds a second until each request's deadline, which then answered TIMEOUT. After
    # LOAD_REFUSALS in a row the queued requests are answered ERROR with the worker's
    # reason; a refusal for its timing does not count
    from controller.inflight import LOAD_REFUSALS, REFUSED_FOR_NS

    s = sched()
    pending = s.on_request(req(1, slo=5000 * MS), 0) + s.on_request(req(2, slo=5000 * MS), 0)
    codes = [ErrorCode.LOAD_INSUFFICIENT_CACHE, ErrorCode.LOAD_TOO_LATE]
    t, loads = 0, 0
    while pending and t < 1000 * MS:
        t += MS
        a = pending.pop(0)
        if a.type == ActionType.LOAD:
            loads += 1
            code = codes.pop() if codes else ErrorCode.LOAD_INSUFFICIENT_CACHE
        else:
            code = ErrorCode.WEIGHTS_NOT_PRESENT
        pending += s.on_result(fail(a, t, code), t)
        pending += s.on_tick(t)
    reps = s.drain_replies()
    assert [r.status for r in reps] == [RequestStatus.ERROR] * 2, reps
    assert all("LOAD_INSUFFICIENT_CACHE" in r.message for r in reps), reps
    assert loads <= LOAD_REFUSALS + 2 and not pending, loads  # (+1 timing, +1 in flight)
    assert s.on_tick(t + MS) == [] and s.next_wakeup() is None
    # for REFUSED_FOR_NS a request is answered so at once; then it is tried again
    assert s.on_request(req(3, t=t + MS), t + MS) == []
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.ERROR and rep.message == reps[0].message
    later = t + REFUSED_FOR_NS
    assert ActionType.LOAD in [a.type for a in s.on_request(req(4, t=later), later)]


def test_loads_refused_while_a_copy_is_ready_or_lost_with_a_worker_block_nothing():
    # LOADs of a second copy refused on another GPU, or failed because their worker was
    # lost (NETWORK_SEND_TOO_LATE): the ready copy goes on serving the model's requests
    from controller.inflight import LOAD_REFUSALS

    for code in (ErrorCode.LOAD_INSUFFICIENT_CACHE, ErrorCode.NETWORK_SEND_TOO_LATE):
        s = sched(gpus=4)
        t = warm(s)  # a copy ready on GPU 0
        assert s.models["a"].ready_copies == 1
        for i in range(LOAD_REFUSALS + 1):
            s._send_load(s.gpus[1 + i % 3], s.models["a"], t, out := [])
            (load,) = out
            s.on_result(fail(load, t + MS, code), t + MS)
        t += 2 * MS
        s.drain_replies()
        acts = s.on_request(req(99, t=t, slo=100 * MS), t)
        assert s.drain_replies() == [] and ActionType.INFER in [a.type for a in acts], code


def overload(s, t, end, refuse, pending, held, step=MS // 2):
    """Requests for "a" (SLO 200 ms), one every ``step`` from ``t`` to ``end`` (more than
    one GPU serves: a second copy is wanted), each action answered at its predicted end,
    as workers would: a LOAD with ``refuse(action)``'s status, an INFER as SUCCESS on the
    GPUs in ``held`` (those that hold "a", LOADs add to it), WEIGHTS_NOT_PRESENT on the
    others; ``on_tick`` when ``next_wakeup`` asks. ``pending`` (a heap of (due, id,
    action)) carries the unanswered actions from one call to the next. Returns the LOADs
    sent, (time, action), and how many times the LOAD demand was looked at."""
    looks = n = 0
    schedule_loads = s._schedule_loads

    def counted(*args, **kw):
        nonlocal looks
        looks += 1
        schedule_loads(*args, **kw)

    s._schedule_loads = counted
    loads = []
    try:
        while t < end:
            t += step
            n += 1
            acts = s.on_request(req(n, t=t, slo=200 * MS), t)
            while pending and pending[0][0] <= t:
                due, _, a = heapq.heappop(pending)
                if a.type == ActionType.LOAD:
                    code = refuse(a)
                    if not code:
                        held.add(a.gpu)
                elif a.type == ActionType.INFER and a.gpu not in held:
                    code = ErrorCode.WEIGHTS_NOT_PRESENT
                else:
                    code = ErrorCode.SUCCESS
                acts += s.on_result(fail(a, due, code) if code
                                    else ok(a, due - a.expected_duration), t)
            nw = s.next_wakeup()
            if nw is not None and nw <= t:
                acts += s.on_tick(t)
            for a in acts:
                if a.type == ActionType.LOAD:
                    loads.append((t, a))
                heapq.heappush(pending, (max(a.earliest, t) + a.expected_duration, a.id, a))
    finally:
        del s._schedule_loads
    return loads, looks


def test_extra_copy_refused_while_one_is_ready_is_retried_after_a_growing_back_off():
    # a copy of "a" serves it on GPU 0, more requests come than it serves, and GPU 1's
    # worker refuses every LOAD of a second copy: each refusal was followed by the same
    # LOAD at once, thousands a second. Now GPU 1 is offered "a" again only after a
    # back-off that doubles with each refusal up to its cap, and the demand for LOADs is
    # not looked at every load_check_interval meanwhile, only when a back-off ends
    from controller.inflight import LOAD_BACKOFF_MAX_NS, LOAD_BACKOFF_NS

    s = sched(gpus=2)
    t = warm(s)
    loads, looks = overload(s, t, t + 24_000 * MS,
                            lambda a: ErrorCode.LOAD_INSUFFICIENT_CACHE, [], {0})
    assert {a.gpu for _, a in loads} == {1}
    sent = [at for at, _ in loads]
    gaps = [b - a for a, b in pairwise(sent)]
    backoffs = [min(LOAD_BACKOFF_MAX_NS, LOAD_BACKOFF_NS << i) for i in range(len(gaps))]
    assert backoffs[-1] == LOAD_BACKOFF_MAX_NS, (len(loads), gaps)  # up to the cap
    # (each retry follows its refusal, a LOAD's 8 ms later, by the back-off and a tick)
    for gap, backoff in zip(gaps, backoffs, strict=True):
        assert backoff + 8 * MS <= gap <= backoff + 12 * MS, (gaps, backoffs)
    assert looks <= 3 * len(loads), looks  # (every 2 ms: thousands)
    # the ready copy served all along; the refusals answered nothing
    replies = s.drain_replies()
    assert sum(r.status == RequestStatus.SUCCESS for r in replies) > len(replies) // 3
    assert not [r for r in replies if "LOAD_INSUFFICIENT_CACHE" in r.message]


def test_a_successful_load_ends_the_back_off():
    # GPU 1 refuses a second copy of "a" three times (back-offs of 100, 200, 400 ms), then
    # loads it; when that copy is lost later (its worker restarted), the next refusal
    # holds GPU 1 back for the first back-off again (100 ms), not the fourth (800 ms)
    from controller.inflight import LOAD_BACKOFF_NS

    s = sched(gpus=2)
    t = warm(s)
    count = [0]

    def refuse(a):
        count[0] += 1
        return ErrorCode.SUCCESS if count[0] == 4 else ErrorCode.LOAD_INSUFFICIENT_CACHE

    pending, held = [], {0}
    loads, _ = overload(s, t, t + 1000 * MS, refuse, pending, held)
    assert len(loads) == 4 and held == {0, 1}, loads
    held.discard(1)
    more, _ = overload(s, t + 1000 * MS, t + 2000 * MS, refuse, pending, held)
    sent = [at for at, _ in loads + more]
    assert len(sent) >= 6, sent
    gaps = [b - a for a, b in pairwise(sent)]
    assert [g // LOAD_BACKOFF_NS for g in gaps[:3]] == [1, 2, 4], gaps  # 100, 200, 400 ms
    # the sixth LOAD (the fifth, refused, replaced the lost copy) after the first back-off
    assert LOAD_BACKOFF_NS <= gaps[4] < 2 * LOAD_BACKOFF_NS, gaps


def test_an_extra_copy_refused_by_one_gpu_goes_to_another_at_once():
    # the back-off holds back the GPU that refused, not the model: GPU 1's cache has no
    # room for a second copy of "a", GPU 2's has, and takes it as soon as GPU 1 refuses
    from controller.inflight import LOAD_BACKOFF_NS

    s = sched(gpus=3)
    t = warm(s)

    def refuse(a):
        return ErrorCode.LOAD_INSUFFICIENT_CACHE if a.gpu == 1 else ErrorCode.SUCCESS

    loads, _ = overload(s, t, t + 200 * MS, refuse, [], {0})
    (t1, first), (t2, second) = loads[:2]
    assert (first.gpu, second.gpu) == (1, 2), loads
    # (as soon as "a" is wanted again: the INFERs sent behind the refused LOAD fail back
    # first), not after a back-off of the model (100 ms after the refusal, 8 ms in)
    assert t2 - t1 < LOAD_BACKOFF_NS, loads
    assert sorted(s.models["a"].instances) == [0, 2]

def _refusing_a(a):
    return ErrorCode.LOAD_INSUFFICIENT_CACHE if a.model == "a" else ErrorCode.SUCCESS


def test_another_models_new_copy_is_not_held_back_by_a_back_off():
    # GPU 2 refuses every extra copy of "a" (on GPU 0) for 3 s: the LOAD demand is then
    # looked at when the back-off ends, up to seconds ahead. "b" (on GPU 1) losing its
    # only copy, with a request queued and no other arriving, is loaded again at once
    # (it waited for "a"'s back-off to end: 1 s and more)
    s = sched(models=("a", "b"), gpus=3)
    t = warm(s, "a")
    t = warm(s, "b", gpu=1, now=t)
    pending, held = [], {0}
    overload(s, t, t + 3200 * MS, _refusing_a, pending, held)
    t += 3200 * MS
    assert s.models["a"].load_blocked, "no back-off: nothing was tested"
    pending.clear()
    acts = s.on_request(req(5_000_000, "b", t=t, slo=5000 * MS), t)
    (inf,) = [a for a in acts if a.type == ActionType.INFER]  # to b's copy, which is gone
    acts = s.on_result(fail(inf, t + MS, ErrorCode.WEIGHTS_NOT_PRESENT), t + MS)
    end = t + 50 * MS
    while not any(a.type == ActionType.LOAD and a.model == "b" for a in acts):
        nw = s.next_wakeup()
        assert nw is not None and nw <= end, (nw - t) / MS if nw else None
        acts = s.on_tick(nw)


def test_a_back_off_with_a_gpu_down_does_not_look_every_interval():
    # GPU 1 refuses every extra copy of "a", GPU 2 is down: no GPU can take one before
    # the back-off ends, so the demand is looked at then, not every load_check_interval
    s = sched(gpus=3)
    t = warm(s)
    s.set_gpu_available(2, False, t)
    loads, looks = overload(s, t, t + 4000 * MS,
                            lambda a: ErrorCode.LOAD_INSUFFICIENT_CACHE, [], {0})
    assert loads and {a.gpu for _, a in loads} == {1}
    assert looks <= 100, (looks, len(loads))  # (every 2 ms: ~2,000)


def test_the_scheduler_keeps_its_attributes_in_cpythons_fast_layout():
    """Under 30 instance attributes, after a run as before it: past that, CPython 3.11
    keeps them in a plain dict and every attribute read of the scheduler costs more (one
    attribute more cost 2 % of the instructions per request of a whole simulation)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data=_churn_scenario()))
    assert len(vars(sim.policy)) < 30, sorted(vars(sim.policy))
    sim.run()
    assert len(vars(sim.policy)) < 30, sorted(vars(sim.policy))


def test_a_model_removed_leaves_no_back_off_behind():
    # GPU 1 refuses extra copies of "a" (on GPU 0): "a" is held back there; removed, it
    # was kept among the models held back (walked at every GPU's return) for good
    s = sched(models=("a", "b"), gpus=3)
    t = warm(s)
    overload(s, t, t + 200 * MS, _refusing_a, [], {0})
    assert s._held_back == {s.models["a"]}, "no back-off: nothing was tested"
    s.remove_model("a", t + 200 * MS)
    assert not s._held_back
    check_idle_index(s)


def test_a_gpu_back_takes_a_held_back_copy_at_once():
    # GPU 1 refuses every extra copy of "a" (on GPU 0) and GPU 2 is down: the look is
    # put off to the back-off's end. GPU 2 coming back takes the copy at once (it
    # waited for the back-off to end: up to 10 s)
    s = sched(gpus=3)
    t = warm(s)
    s.set_gpu_available(2, False, t)
    pending, held = [], {0}

    def refuse(a):
        return ErrorCode.LOAD_INSUFFICIENT_CACHE if a.gpu == 1 else ErrorCode.SUCCESS

    overload(s, t, t + 3000 * MS, refuse, pending, held)
    t += 3000 * MS
    assert s._load_check_put_off, "no look put off: nothing was tested"
    s.readmit_gpu(2, t, ())
    loads, _ = overload(s, t, t + 50 * MS, refuse, pending, held)
    assert [a.gpu for _, a in loads][:1] == [2], loads


def test_a_model_held_back_that_loses_its_ready_copy_is_loaded_at_once_then_answered_error():
    # the back-off is for extra copies only: when the ready copy is lost (its GPU with
    # it), the model is loaded at once on the GPU that holds it back, and LOADs refused
    # in a row answer its queue ERROR as before (LOAD_REFUSALS of them since the copy
    # was lost), not a back-off later
    from controller.inflight import LOAD_REFUSALS

    s = sched(gpus=2)
    t = warm(s)  # a copy ready on GPU 0
    for _ in range(LOAD_REFUSALS):  # extra copies refused, more than once: held back
        s._send_load(s.gpus[1], s.models["a"], t, out := [])
        (load,) = out
        s.on_result(fail(load, t + MS, ErrorCode.LOAD_INSUFFICIENT_CACHE), t + MS)
        t += 2 * MS
    acts = s.on_request(req(1, t=t, slo=5000 * MS), t)  # sent to GPU 0's copy
    (inf,) = [a for a in acts if a.type == ActionType.INFER]
    assert inf.gpu == 0 and s.set_gpu_available(0, False, t) == []
    # the lost worker's INFER fails back: its request is queued again, for a new copy
    pending = s.on_result(fail(inf, t, ErrorCode.WEIGHTS_NOT_PRESENT), t) + s.on_tick(t)
    assert [(a.type, a.gpu) for a in pending][:1] == [(ActionType.LOAD, 1)], pending
    loads = 0
    while pending:
        a = pending.pop(0)
        if a.type == ActionType.LOAD:
            loads += 1
            code = ErrorCode.LOAD_INSUFFICIENT_CACHE
        else:
            code = ErrorCode.WEIGHTS_NOT_PRESENT
        pending += s.on_result(fail(a, t, code), t) + s.on_tick(t)  # answered at once
        assert loads <= LOAD_REFUSALS, loads
    # LOAD_REFUSALS of its own: the extra copies' refusals before do not count
    assert loads == LOAD_REFUSALS
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.ERROR and "LOAD_INSUFFICIENT_CACHE" in rep.message, rep


def test_copy_found_missing_is_replaced_by_a_new_load():
    s = sched()
    t = warm(s)
    (inf,) = s.on_request(req(1, t=t, slo=500 * MS), t)
    assert s.on_result(fail(inf, t + MS, ErrorCode.WEIGHTS_NOT_PRESENT), t + 2 * MS) == []
    assert s.next_wakeup() is not None and s.next_wakeup() <= t + 2 * MS
    acts = s.on_tick(t + 2 * MS)
    assert [a.type for a in acts] == [ActionType.LOAD, ActionType.INFER]


def test_lost_gpu_gets_nothing_and_its_models_move():
    s = sched(gpus=2)
    t = warm(s, gpu=0)  # "a" loaded on one GPU
    (g,) = [i for i in (0, 1) if "a" in s.gpus[i].instances]
    other = 1 - g
    acts = s.set_gpu_available(g, False, t)
    assert not s.gpus[g].instances and s.pages_used(g) == 0
    acts += s.on_request(req(1, t=t, slo=200 * MS), t)
    acts += s.on_tick(t + 1)
    assert acts and all(a.gpu == other for a in acts)  # LOAD (and INFER) elsewhere
    assert ActionType.LOAD in {a.type for a in acts}
    # back, with an empty cache: the copy it held ("a", still in use) is loaded again
    back = s.set_gpu_available(g, True, t + 2 * MS)
    assert [(a.type, a.gpu, a.model) for a in back][:1] == [(ActionType.LOAD, g, "a")]
    pages = s.models["a"].pages
    assert s.gpus[g].available and s.gpus[g].free_pages == s.gpus[g].total_pages - pages


def test_a_burst_on_one_copy_asks_for_another():
    s = sched(gpus=2)
    t = warm(s)
    acts = []
    for i in range(300):  # far more than one GPU serves within the SLO
        acts += s.on_request(req(1000 + i, t=t, slo=200 * MS), t)
    nw = s.next_wakeup()
    assert nw is not None and nw <= t + s.cfg.load_check_interval
    acts += s.on_tick(nw)
    loads = [a for a in acts if a.type == ActionType.LOAD]
    assert len(loads) == 1 and len(s.models["a"].instances) == 2  # a copy on the other GPU


def test_a_queued_request_is_timed_out_by_the_estimate_of_now_not_of_its_arrival():
    """A straggler (20 ms for a 2.9 ms batch) sets the estimate, and 2 s pass with nothing
    measured. Request 2 is queued behind 70 ms of work: its drop time is its deadline
    less the 20 ms estimate then. Request 3 finds the estimate stale and forgets it (back
    to the profile's 2.9 ms). Request 2 was timed out at its old drop time though it
    could finish: now both run as a batch of 2 when the lane comes free, before
    request 2's deadline."""
    s = sched()
    t = warm(s)
    (a,) = s.on_request(req(1, t=t), t)
    s.on_result(ok(a, t + MS, 20 * MS), t + 21 * MS)
    s.drain_replies()
    T = t + 2_000 * MS
    occupy(s, T, 69 * MS)
    assert s.on_request(req(2, t=T), T) == []
    assert s.models["a"].queue[0].drop_at == T + 75 * MS  # (deadline T+95 ms)
    s.gpus[0].exec.add(999_998, T, 16 * MS, T)  # (the lane free at T+86 ms)
    assert s.on_request(req(3, t=T), T) == []
    assert s.models["a"].est.exec(1) == E[1]
    sent = []
    while (w := s.next_wakeup()) is not None and w < T + 200 * MS:
        sent += [a for a in s.on_tick(w) if a.type == ActionType.INFER]
    assert s.drain_replies() == []
    (inf,) = sent
    assert [r.id for r in inf.requests] == [2, 3] and inf.expected_end <= T + 95 * MS


def test_a_stragglers_estimate_does_not_lock_a_model_out_for_ever():
    """One straggler pushes the EXEC estimate past every SLO; with no EXEC run nothing
    would correct it. Requests are refused while the measurement is fresh; once it is
    estimate_stale old, the estimate goes back to the profile and requests run again."""
    s = sched(gpus=1)
    t = warm(s)
    m = s.models["a"]
    m.est.add_exec(m.batch_sizes[0], 500 * MS, t)  # a 500 ms straggler
    acts = s.on_request(req(1, t=t + 100 * MS, slo=100 * MS), t + 100 * MS)
    assert [r.status for r in s.drain_replies()] == [RequestStatus.TIMEOUT] and not acts
    later = t + s.cfg.estimate_stale + 200 * MS
    acts = s.on_request(req(2, t=later, slo=100 * MS), later)
    acts += s.on_tick(later + 1)
    assert not s.drain_replies() and any(a.type == ActionType.INFER for a in acts)
    assert m.est.exec(m.batch_sizes[0]) == m.est.profile.exec_ns[m.batch_sizes[0]]


def test_a_request_infeasible_even_at_the_profiles_figure_keeps_the_estimate():
    """The stale-estimate reset is for a request only the inflated estimate keeps out: one
    that the profile's figure cannot serve either (a 1 ms SLO against 2.9 ms) is
    answered TIMEOUT and the model's measurements are kept (they were thrown away, and
    the next INFERs planned with the profile's too-short figures)."""
    s = sched(gpus=1)
    t = warm(s)
    m = s.models["a"]
    for _ in range(10):
        m.est.add_exec(1, 3 * E[1], t)  # every EXEC really takes 3x the profile's
    later = t + s.cfg.estimate_stale + 200 * MS
    s.on_request(req(1, t=later, slo=1 * MS), later)
    assert [r.status for r in s.drain_replies()] == [RequestStatus.TIMEOUT]
    assert m.est.exec(1) == 3 * E[1] and m.est.inflated


def test_a_simulated_straggler_does_not_turn_batching_off_for_good():
    from clockwork.cluster.sim import simulate

    res = simulate("poisson_warm", ["duration_s=6", "cluster.slow_prob=0.01",
                                    "cluster.slow_factor=20"])
    cols = res.telemetry.request_columns()
    late = (cols["arrival"] > 3 * 10**9) & (cols["status"] == RequestStatus.SUCCESS)
    assert (cols["batch_size"][late] > 1).sum() > 100  # (batches of 2 and more again)


# ---------------------------------------------------------------- the copy index (CopyIndex)


def _hot_scenario(duration=3.0):
    """One model on 6 GPUs at 80 % of their capacity; 5 workers killed and back (the
    model drops to one copy and returns), then a hang (overdue lanes)."""
    return {
        "seed": 3, "duration_s": duration,
        "cluster": {"workers": 6, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "network_latency_ms": 0.1, "jitter_ms": 0.05},
        "models": [{"name": "resnet50_v2"}, {"name": "resnet18_v2", "copies": 2}],
        "workloads": [{"kind": "poisson", "models": "resnet50_v2", "rate_rps": 6900.0,
                       "slo_ms": 100},
                      {"kind": "poisson", "models": "resnet18_v2", "rate_rps": 300.0,
                       "slo_ms": 50}],
        "faults": {"kill": [{"worker": w, "at_s": 1.0, "back_s": 1.6} for w in range(1, 6)],
                   "hang": [{"worker": 0, "at_s": 2.2, "for_s": 0.2}]},
    }


def check_copy_index(s: ClockworkScheduler) -> None:
    """Every copy of an indexed model has a current entry in each heap; ``unwoken`` and
    the GPUs' ``wide`` lists mirror the copies; copies are numbered in dict order."""
    models = list(s.models.values()) + list(s._removed.values())
    for m in models:
        seqs = [i.seq for i in m.instances.values()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        ix = m.wide
        if ix is None:
            assert all(m not in g.wide for g in s.gpus)
            continue
        assert len(m.instances) >= max(1, s.wide_copies // 2)
        for gi, inst in m.instances.items():
            g = s.gpus[gi]
            lane = g.exec
            assert g.wide.count(m) == 1 and isinstance(lane, WatchedLane)
            assert (max(lane.free_at, inst.ready_at), inst.seq, gi) in ix.by_start
            assert (lane.free_at, inst.seq, gi) in ix.by_free
            if lane.due != NEVER:
                assert (lane.due, inst.seq, gi) in ix.by_due
        assert ix.unwoken == {gi for gi in m.instances if not s.gpus[gi].wake_at}
        assert ix.size() <= 4 * len(m.instances) + 64 + 3 * len(m.instances) + 3
    for g in s.gpus:
        for m in g.wide:
            assert m.wide is not None and m.instances[g.index].gpu is g
        assert (g.exec.on_change is None) == (not g.wide) == (type(g.exec) is LaneTracker)


def _simulate(wide_copies, tmp, check=False):
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data=_hot_scenario()))
    pol = sim.policy
    assert isinstance(pol, ClockworkScheduler)
    pol.wide_copies = wide_copies
    if check:
        events = [0]

        def checked(f):
            def call(*a):
                out = f(*a)
                events[0] += 1
                check_copy_index(pol)
                return out
            return call

        for name in ("on_request", "on_result", "on_tick", "set_gpu_available"):
            setattr(pol, name, checked(getattr(pol, name)))
    res = sim.run()
    res.write(tmp)
    return res, pol


def test_a_request_taken_by_an_idle_copy_asks_no_other_gpu():
    """A hot model copied onto every GPU of a lightly loaded cluster: a request is taken
    by the first idle copy; the scheduler looked at every idle copy's GPU for each
    request (48 INFER decisions per request here, thousands on a large cluster)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 2.0,
        "cluster": {"workers": 48, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "mobilenet_v2"}],
        "workloads": [{"kind": "poisson", "models": "mobilenet_v2", "rate_rps": 3000.0,
                       "slo_ms": 5}]}))  # (a tight SLO: turned-away requests ask for copies)
    pol = sim.policy
    calls = {"decisions": 0, "requests": 0}
    decide, request = pol._schedule_infer, pol.on_request

    def counted_decide(*a):
        calls["decisions"] += 1
        return decide(*a)

    def counted_request(*a):
        calls["requests"] += 1
        return request(*a)

    pol._schedule_infer, pol.on_request = counted_decide, counted_request
    res = sim.run()
    assert len(pol.models["mobilenet_v2"].instances) == 48
    assert res.summary["slo_attainment"] > 0.99  # (lightly loaded: most GPUs idle)
    assert calls["decisions"] < 3 * calls["requests"], calls  # (one per request, one per result)


def test_a_model_on_every_gpu_up_asks_for_no_more_copies_while_one_is_down():
    """A model with a copy on each of the 3 GPUs up, a fourth GPU's worker dead for 3 s,
    requests turned away by its busy copies (a tight SLO): it asked for another copy,
    which no GPU up could take, and the LOAD demand was looked at every
    load_check_interval until the worker came back (1,855 looks; now 7)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 4.0,
        "cluster": {"workers": 4, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "mobilenet_v2"}],
        "workloads": [{"kind": "poisson", "models": "mobilenet_v2", "rate_rps": 6000.0,
                       "slo_ms": 6}],
        "faults": {"kill": [{"worker": 3, "at_s": 0.5, "back_s": 3.5}]}}))
    pol = sim.policy
    looks = [0]
    look = pol._schedule_loads

    def counted(*a, **k):
        looks[0] += 1
        return look(*a, **k)

    pol._schedule_loads = counted
    res = sim.run()
    assert res.summary["actions"]["load"] >= 4  # (on every GPU, the fourth again once back)
    assert looks[0] < 100, looks


def test_copy_index_keeps_its_invariants(tmp_path):
    res, pol = _simulate(4, tmp_path, check=True)
    assert res.summary["actions"]["load"] >= 10  # copies went away and came back
    assert pol.models["resnet50_v2"].wide is not None


def test_copy_index_changes_no_decision(tmp_path):
    """The same run with every model indexed (from 1 copy), from 4 copies, and never:
    byte-identical logs (the index only answers what the loop over the copies did)."""
    outs = []
    for w in (1, 4, 10**9):
        d = tmp_path / str(w)
        _simulate(w, d)
        outs.append([(d / f).read_bytes() for f in ("summary.json", "requests.tsv",
                                                     "actions.tsv")])
    assert outs[0] == outs[2] and outs[1] == outs[2]


class _KickEveryFreeCopy(ClockworkScheduler):
    """A request's look at a model's copies as first written: every copy free before the
    horizon asked for an INFER decision, soonest free first, even once one took it."""

    def _kick_copies(self, m, ix, now, out):
        sa = self.cfg.schedule_ahead
        horizon, t = now + sa, now + self.cfg.future
        free = {gi: inst for gi, inst in m.instances.items()
                if t < horizon and inst.gpu.exec._free_at < horizon}
        for gi in [gi for gi in ix.unwoken if gi not in free]:
            g = self.gpus[gi]
            f = g.exec._free_at
            self._wake(g, (f if f > t else t) - sa + 1)
        for inst in sorted(free.values(), key=lambda i: (i.gpu.exec._free_at, i.seq)):
            self._infer_soon(inst.gpu, now, out)


def _bursty_wide_scenario():
    """Two models on 24 GPUs in bursts of 30,000 r/s, two workers killed and back: the
    busier model is copied onto most GPUs, each burst finds most of them idle."""
    return {
        "seed": 4, "duration_s": 10.0,
        "cluster": {"workers": 6, "gpus_per_worker": 4, "profiles": "v100-reference",
                    "network_latency_ms": 0.1},
        "models": [{"name": "resnet50_v2"}, {"name": "resnet18_v2"}],
        "workloads": [{"kind": "bursty", "models": "*", "burst_rps": 30000.0,
                       "rate_rps": 300.0, "on_s": 2.0, "off_s": 2.0,
                       "periods": "exponential", "start": "random", "independent": True,
                       "slo_ms": 50}],
        "faults": {"kill": [{"worker": 2, "at_s": 3.0, "back_s": 7.0},
                            {"worker": 4, "at_s": 5.0, "back_s": 9.0}]},
    }


def test_a_request_taken_asks_no_more_copies_and_changes_no_decision(tmp_path):
    """Asking the free copies only until one takes the request: byte-identical logs to
    asking every free copy (the copies left unasked had nothing new to decide; the busy
    ones are woken as before)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    outs = []
    for plain in (False, True):
        sim = Simulation(load_scenario(data=_bursty_wide_scenario()))
        if plain:
            sim.policy.__class__ = _KickEveryFreeCopy
        res = sim.run()
        res.write(tmp_path / str(plain))
        outs.append([(tmp_path / str(plain) / f).read_bytes()
                     for f in ("summary.json", "requests.tsv", "actions.tsv")])
        assert len(sim.policy.models["resnet50_v2"].instances) >= 16  # (indexed: wide)
    assert outs[0] == outs[1]


# ---------------------------------------------------------------- LOAD demand, kept up to date


def _churn_scenario():
    """Thirty models on 3 GPUs whose caches hold a few of them: cold starts, misses (a
    40 ms SLO cannot wait for a VGG16 LOAD), EVICTs, saturated GPUs; a worker killed and
    back."""
    return {
        "seed": 5, "duration_s": 2.0,
        "cluster": {"workers": 3, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "network_latency_ms": 0.1, "weights_cache_pages": 40},
        "models": [{"name": "mobilenet_v2", "copies": 10}, {"name": "resnet50_v2", "copies": 12},
                   {"name": "vgg16", "copies": 3}, {"name": "resnet18_v2", "copies": 5}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 2500.0, "slo_ms": 100},
                      {"kind": "poisson", "models": "mobilenet_v2", "rate_rps": 3000.0,
                       "slo_ms": 30},
                      {"kind": "poisson", "models": "vgg16", "rate_rps": 300.0, "slo_ms": 40}],
        "faults": {"kill": [{"worker": 2, "at_s": 0.8, "back_s": 1.2}]},
    }


def _wide_churn_scenario():
    """The same on 40 GPUs: each look offers a model to many GPUs with an idle PCIe lane,
    in the order of their shares; two workers killed and back."""
    return {
        "seed": 7, "duration_s": 0.6,
        "cluster": {"workers": 40, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "network_latency_ms": 0.1, "weights_cache_pages": 40},
        "models": [{"name": "mobilenet_v2", "copies": 60}, {"name": "resnet50_v2", "copies": 60},
                   {"name": "vgg16", "copies": 10}, {"name": "resnet18_v2", "copies": 40}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 50000.0, "slo_ms": 100},
                      {"kind": "poisson", "models": "vgg16", "rate_rps": 600.0, "slo_ms": 40}],
        "faults": {"kill": [{"worker": 5, "at_s": 0.2, "back_s": 0.35},
                            {"worker": 17, "at_s": 0.3, "back_s": 0.45}]},
    }


def share_of_every_copy(g) -> float:
    """A GPU's load share summed over every copy it holds (``load_share`` may read only
    the copies with queued requests): the same float, summed in the same order."""
    total = 0.0
    for inst in g.instances.values():
        m = inst.model
        if m.outstanding:
            total += m.outstanding / len(m.instances)
    return total


def reference_wanted(s: ClockworkScheduler) -> list[tuple[float, str]]:
    """The LOAD priorities recomputed from scratch (every queued model, every GPU's
    load_share): what the scheduler's indexes must give, in the same order."""
    from controller.scheduler import MISS_MEMORY

    out = [(-d, n) for n, (t, d) in s._misses.items()
           if t >= s._last_now - MISS_MEMORY and not s.models[n].instances
           and n not in s._queued]
    # requests of models with copies turned away since the last prune ask for more copies
    warm_misses = {n: d for n, (_, d) in s._warm_misses.items() if s.models[n].instances}
    up = sum(g.available for g in s.gpus)
    for name in sorted(s._queued | set(warm_misses)):
        m = s.models[name]
        if m.outstanding <= 0 and name not in warm_misses:
            continue
        if m.instances and len(m.instances) >= up:
            continue  # a copy on every GPU up: no GPU could take another
        prio = 0.0
        if m.outstanding > 0:
            prio = m.outstanding
            if m.instances:
                per_copy = m.outstanding / len(m.instances)
                for gi in m.instances:
                    sh = share_of_every_copy(s.gpus[gi])
                    assert s.gpus[gi].load_share() == sh
                    prio -= per_copy * (1.0 if sh <= 1.0 else 1.0 / sh)
        prio += warm_misses.get(name, 0.0)
        if prio > 1e-9:
            out.append((-prio, name))
    return sorted(out)


def check_idle_index(s: ClockworkScheduler) -> None:
    assert s._idle.up == sum(g.available for g in s.gpus)
    assert s._held_back == {m for m in s.models.values() if m.load_blocked is not None}
    idle = s._idle
    assert idle.idle == {g.index for g in s.gpus if g.pcie.idle}
    # every idle, available GPU has a current entry in the LOAD placement's heap, or is
    # noted as changed (it gets one when the heap is next read)
    assert {(g.share, len(g.instances), g.index) for g in s.gpus
            if g.index in idle.idle and g.available and g.index not in idle.dirty} \
        <= set(idle.heap)
    assert len(idle.heap) <= 2 * len(s.gpus) + 65  # (stale entries: bounded)


def check_demand_index(s: ClockworkScheduler) -> None:
    from controller.scheduler import MISS_MEMORY, ROUNDING

    assert s._cold_hold is None and not s._cold_skip
    assert s._queued == {n for n, m in s.models.items() if m.live}
    assert s._unserved == {n for n in s._queued if not s.models[n].instances}
    check_idle_index(s)
    for n in s._unserved:
        assert (-s.models[n].outstanding, n) in s._cold
    for n in s._queued:
        m = s.models[n]
        if m.instances:
            assert m.big_at == ROUNDING / (len(m.instances) + 2)
            if m.outstanding >= m.big_at and not m.dirty:  # (dirty ones: at the next look)
                assert n in s._big
    assert len(s._dirty_models) == len(set(map(id, s._dirty_models)))
    assert all(m.dirty for m in s._dirty_models)
    assert not any(m.dirty for m in s.models.values() if m not in s._dirty_models)
    # a GPU whose figure is not marked as changed holds its load_share
    dirty = set(s._dirty_gpus)
    for m in s._dirty_models:
        dirty.update(m.instances)
    for g in s.gpus:
        assert g.load_share() == share_of_every_copy(g)
        assert set(g.active) == {n for n, i in g.instances.items() if i.model.live}
        assert all(g.active[n] is g.instances[n] for n in g.active)  # (each its copy here)
        if g.index not in dirty:
            assert g.share == g.load_share()
            assert (g.index in s._over) == (g.share > 1.0)
    # the wanted order
    s._refresh_shares()
    horizon = s._last_now - MISS_MEMORY
    got = [e for e in s._warm_wanted() + list(s._cold_order(set()))
           if e[1] not in s._misses or e[1] in s._queued  # (misses are pruned first)
           or e[0] != -s._misses[e[1]][1]  # (a warm miss of the same model)
           or (s._misses[e[1]][0] >= horizon and not s.models[e[1]].instances)]
    assert sorted(got) == reference_wanted(s)


@pytest.mark.parametrize("scenario", [_churn_scenario, _wide_churn_scenario])
def test_load_demand_indexes_keep_their_invariants(scenario):
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data=scenario()))
    pol = sim.policy
    calls = [0]

    every = 1 if scenario is _churn_scenario else 20  # (the whole check is slow at 40 GPUs)

    def checked(f):
        def call(*a):
            out = f(*a)
            calls[0] += 1
            if calls[0] % every:
                check_idle_index(pol)
            else:
                check_demand_index(pol)
            return out
        return call

    for name in ("on_request", "on_result", "on_tick", "set_gpu_available"):
        setattr(pol, name, checked(getattr(pol, name)))
    res = sim.run()
    s = res.summary
    assert s["actions"]["evict"] > 20 and s["actions"]["load"] > 50
    if scenario is _churn_scenario:
        assert s["slo_attainment"] < 0.9  # saturated: warm models are wanted too
    else:
        assert s["actions"]["evict"] > 500 and s["actions"]["load"] > 1000


class _PlainLoads(ClockworkScheduler):
    """LOAD placement as first written: every wanted model recomputed from scratch at
    every look, every GPU with a free PCIe lane tried against all of them in order."""

    def _schedule_loads(self, now, out, only_idle):
        self._last_now = now
        horizon = now + self.cfg.schedule_ahead
        self._forget_misses()
        wanted = [(-p, n) for p, n in reference_wanted(self)]
        gpus = [g for g in self.gpus if g.available
                and (g.pcie.idle if only_idle else g.pcie.available(now) < horizon)] \
            if wanted else []
        shares = {g.index: g.load_share() for g in gpus}
        gpus.sort(key=lambda g: (shares[g.index], len(g.instances), g.index))
        taken = set()
        for g in gpus:
            spare = shares[g.index] < 1.0
            for prio, name in wanted:
                if name in taken or name in g.instances:
                    continue
                m = self.models[name]
                if m.pages > g.total_pages or (m.instances and not spare):
                    continue
                victims = self._victims(g, m, prio, now)
                if victims is None:
                    continue
                for inst in victims:
                    self._send_evict(inst, now, out)
                self._send_load(g, m, now, out)
                taken.add(name)
                break
        self._arm_load_check(now)


@pytest.mark.parametrize("scenario", [_churn_scenario, _wide_churn_scenario])
def test_load_demand_indexes_change_no_decision(tmp_path, scenario):
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    logs = []
    for plain in (False, True):
        sim = Simulation(load_scenario(data=scenario()))
        if plain:
            sim.policy.__class__ = _PlainLoads
        sim.run().write(tmp_path / str(plain))
        logs.append([(tmp_path / str(plain) / f).read_bytes()
                     for f in ("summary.json", "requests.tsv", "actions.tsv")])
    assert logs[0] == logs[1]


# ---------------------------------------------------------------- the batch choice, memoised


def _noisy_hot_scenario():
    sc = _hot_scenario(duration=2.5)
    sc["cluster"].update(noise=0.05, slow_prob=0.01)  # estimates move: their version too
    return sc


def test_memoised_batch_choice_is_the_fresh_one():
    """Every time ``_choose_batch`` answers from its memo, the choice computed from
    scratch at that instant is the same batch (and would have answered nobody)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data=_noisy_hot_scenario()))
    pol = sim.policy
    choose = pol._choose_batch
    seen = {"hits": 0, "calls": 0}

    def ids(choice):
        if choice is None:
            return None
        prio, b, batch, skipped = choice
        return prio, b, [r.id for r in batch], [r.id for r in skipped]

    def checked(m, start, drop, now):
        seen["calls"] += 1
        memo = m.memo
        got = choose(m, start, drop, now)
        if m.memo is memo and memo is not None and memo[2] <= start <= memo[3] \
                and got is memo[4]:
            seen["hits"] += 1
            replies = len(pol._replies)
            m.memo = None
            fresh = choose(m, start, drop, now)
            assert len(pol._replies) == replies  # nobody would have been dropped
            assert ids(fresh) == ids(got)
        return got

    pol._choose_batch = checked
    res = sim.run()
    assert res.summary["submitted"] > 10_000 and res.summary["dropped"] > 1_000
    assert seen["hits"] >= 100, seen


def test_memoised_batch_choice_changes_no_decision(tmp_path):
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    logs = []
    for memo in (True, False):
        sim = Simulation(load_scenario(data=_noisy_hot_scenario()))
        pol = sim.policy
        if not memo:
            choose = pol._choose_batch

            def fresh(m, start, drop, now, choose=choose):
                m.memo = None
                return choose(m, start, drop, now)

            pol._choose_batch = fresh
        sim.run().write(tmp_path / str(memo))
        logs.append([(tmp_path / str(memo) / f).read_bytes()
                     for f in ("summary.json", "requests.tsv", "actions.tsv")])
    assert logs[0] == logs[1]


# ---------------------------------------------------------------- GPU wakes


class _EveryWake(ClockworkScheduler):
    """on_tick as it was before repeated wakes were skipped: every heap entry runs."""

    def on_tick(self, now):
        out = []
        exp = self._expiry
        while exp and exp[0][0] < now:
            _, _, r = heapq.heappop(exp)
            if r.state == QUEUED:
                self._unqueue(self.models[r.model], r)
                self._answer(r, RequestStatus.TIMEOUT, now, "SLO cannot be met")
        wakes = self._wakes
        while wakes and wakes[0][0] <= now:
            _, gi = heapq.heappop(wakes)
            g = self.gpus[gi]
            g.wake_at = 0
            if g.wide:
                for wm in g.wide:
                    wm.wide.unwoken.add(gi)
            if wakes and wakes[0] == (_, gi):
                self.repeats += 1
            self._schedule_infer(g, now, out)
        if self._next_load_check and now >= self._next_load_check:
            self._schedule_loads(now, out, only_idle=False)
        return out


def test_repeated_wakes_change_no_decision(tmp_path):
    """A stale wake (replaced by an earlier one) used to re-push the GPU's current wake
    each time it ran, so the same (time, GPU) piled up in the heap and ran again and
    again at the same instant; skipping the repeats gives byte-identical logs."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sc = {"seed": 5, "duration_s": 3.0,
          "cluster": {"workers": 3, "gpus_per_worker": 2, "profiles": "v100-reference",
                      "noise": 0.02, "jitter_ms": 0.1},
          "models": [{"name": "resnet50_v2", "copies": 60}, {"name": "mobilenet_v2",
                                                             "copies": 60}],
          "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 4000.0,
                         "slo_ms": 100}]}
    logs, repeats = [], 0
    for every in (False, True):
        sim = Simulation(load_scenario(data=sc))
        if every:
            sim.policy.__class__ = _EveryWake
            sim.policy.repeats = 0
        sim.run().write(tmp_path / str(every))
        if every:
            repeats = sim.policy.repeats
        logs.append([(tmp_path / str(every) / f).read_bytes()
                     for f in ("summary.json", "requests.tsv", "actions.tsv")])
    assert repeats > 100  # the case arises
    assert logs[0] == logs[1]


def test_requests_put_back_after_a_failed_infer_go_to_another_copy_at_once():
    # a has copies on GPUs 0 and 1; GPU 0 is lost with the INFER and fails it back: the
    # request runs on GPU 1 now, not answered TIMEOUT once its drop time has passed
    s = sched(gpus=2)
    s.adopt_copies(0, 0, [("a", 1)])
    s.adopt_copies(1, 0, [("a", 1)])
    (inf,) = s.on_request(req(1, t=MS), MS)
    assert inf.gpu == 0
    assert s.set_gpu_available(0, False, 2 * MS) == []
    again = s.on_result(fail(inf, 2 * MS, ErrorCode.WEIGHTS_NOT_PRESENT), 2 * MS)
    assert [(a.type, a.gpu, [r.id for r in a.requests]) for a in again] == [
        (ActionType.INFER, 1, [1])]
    assert s.queued() == 0 and s.drain_replies() == []


def test_an_infer_failed_back_before_its_start_holds_no_later_one_back():
    # a's INFER waits for its LOAD (earliest 9 ms); the worker is lost at 2 ms and comes
    # back at 3 ms with b's weights: b's INFER may start at once, its window not pushed
    # to 9 ms (predicted to end after its deadline)
    s = sched(models=("a", "b"))
    s.adopt_copies(0, 0, [("b", 1)])
    acts = s.on_request(req(1, "a", 0, slo=14 * MS), 0)
    assert [(a.type, a.earliest) for a in acts] == [(ActionType.LOAD, 0),
                                                    (ActionType.INFER, 9 * MS)]
    s.set_gpu_available(0, False, 2 * MS)
    for a in acts:
        code = (ErrorCode.WEIGHTS_NOT_PRESENT if a.type == ActionType.INFER
                else ErrorCode.NETWORK_SEND_TOO_LATE)
        s.on_result(fail(a, 2 * MS, code), 2 * MS)
    s.drain_replies()
    s.readmit_gpu(0, 3 * MS, {"b"})
    r = req(2, "b", 3 * MS, slo=8 * MS)
    (inf,) = [a for a in s.on_request(r, 3 * MS) if a.type == ActionType.INFER]
    assert inf.earliest == 3 * MS and inf.expected_end <= r.deadline


def test_a_batch_from_a_queue_out_of_order_ranks_by_its_oldest_deadline():
    # a's queue holds deadlines 95 then 18 ms (its SLOs differ): the batch of both is as
    # urgent as 18 ms - EXEC(2) and goes before b's lone request (21.6 ms - EXEC(1)); ranked
    # by its first request (95 ms) it went after, and a's 18 ms request missed
    s = sched(models=("a", "b"), batch_first=False)
    s.adopt_copies(0, 0, [("a", 1), ("b", 1)])
    occupy(s, 0, 12 * MS)
    s.on_request(Request(1, "a", 0, 100 * MS), 0)
    s.on_request(Request(2, "a", 0, 20 * MS), 0)
    s.on_request(Request(3, "b", 0, 24 * MS), 0)
    s.gpus[0].exec.done(999_999, 12 * MS)
    sent = [(a.model, [r.id for r in a.requests]) for a in s.on_tick(12 * MS)
            if a.type == ActionType.INFER]
    assert sent == [("a", [1, 2]), ("b", [3])]
    assert s.drain_replies() == []


def test_answered_requests_do_not_pile_up_behind_a_queued_one():
    # one model kept busy by 80 clients, half of them with a day's SLO: a queued request
    # with a short SLO is nearly always at the top of the expiry heap; the heap holds
    # about the queued requests, not every answered one until its own drop time (with
    # its inputs)
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 3.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet50_v2"}],
        "workloads": [{"kind": "closed_loop", "models": "resnet50_v2", "concurrency": 40,
                       "slo_ms": 86_400_000},
                      {"kind": "closed_loop", "models": "resnet50_v2", "concurrency": 40,
                       "slo_ms": 100}]}))
    pol = sim.policy
    most = [0]
    on_request = pol.on_request

    def watched(r, now):
        out = on_request(r, now)
        assert pol.queued() == sum(m.live for m in pol.models.values())
        most[0] = max(most[0], len(pol._expiry) - 2 * pol.queued())
        return out

    pol.on_request = watched
    res = sim.run()
    assert res.summary["submitted"] > 3000
    assert most[0] <= 65


def test_requests_that_arrive_together_share_a_batch():
    """Eight requests of one instant (a KServe request of 8 rows, a stream message) on an
    idle warm GPU: one INFER of 8 (each ran as an INFER of one: the first was sent before
    the second was queued). One at a time, the first still goes alone; the baseline
    policies' default takes each as it comes."""
    s = sched()
    now = warm(s)
    acts = s.on_requests([req(i, t=now) for i in range(8)], now)
    assert [(a.type.name, a.batch_size, len(a.requests)) for a in acts] == [("INFER", 8, 8)]
    one = sched()
    now = warm(one)
    acts = []
    for i in range(8):
        acts += one.on_request(req(i, t=now), now)
    assert acts[0].batch_size == 1 and len(acts) > 1
    assert s.on_requests([], now) == []
    # cold: the LOAD, then one INFER of all 8 once it is loaded (its first row went alone)
    cold = sched()
    acts = cold.on_requests([req(i) for i in range(8)], 0)
    assert [(a.type.name, a.batch_size) for a in acts] == [("LOAD", 0), ("INFER", 8)]


def test_requests_turned_away_by_busy_copies_ask_for_a_copy_on_an_idle_gpu():
    """One model on two GPUs, more requests than one GPU serves within a tight SLO: its
    requests were turned away (on arrival, or from the queue before a batch) without ever
    counting as demand, which is queued demand only, so the second GPU stayed idle the
    whole run and 28 % of the requests timed out. Each request turned away that a copy
    loaded elsewhere on its arrival could have served now asks for that copy."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario

    def run(slo_ms):
        return Simulation(load_scenario(data={
            "seed": 1, "duration_s": 2.0,
            "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference"},
            "models": [{"name": "resnet50_v2"}],
            "workloads": [{"kind": "poisson", "models": "resnet50_v2", "rate_rps": 1000,
                           "slo_ms": slo_ms}]})).run()

    res = run(20)
    loads = {a[3] for a in res.telemetry.actions if a[1] == "LOAD"}
    infers = {a[3] for a in res.telemetry.actions if a[1] == "INFER"}
    assert loads == infers == {0, 1}
    assert res.summary["slo_attainment"] > 0.97
    # an SLO no copy could meet, however idle, asks for nothing
    res = run(3)
    assert {a[3] for a in res.telemetry.actions if a[1] == "LOAD"} == {0}
    assert res.summary["slo_attainment"] == 0


@pytest.mark.parametrize("wide", [False, True], ids=["walk", "index"])
def test_a_request_goes_to_the_copy_free_soonest_not_the_oldest(wide):
    """GPU 0 is busy for 7 ms, GPU 1 idle, both hold a copy of "a"; a request of "a"
    that must start within ~4 ms: the GPUs were asked in the order of the copies, and
    GPU 0's decision turned it away before GPU 1, which could serve it, was asked."""
    s = ClockworkScheduler([make_profile("a"), make_profile("b")],
                           [GpuSpec(0, 0, 1376), GpuSpec(1, 0, 1376)], SchedulerConfig())
    if wide:
        s.wide_copies = 2  # (the index kept for models of many copies)
    s.adopt_copies(0, 0, [("a", 1), ("b", 1)])
    s.adopt_copies(1, 0, [("a", 1)])
    assert (s.models["a"].wide is not None) == wide
    busy = s.on_requests([Request(100 + i, "b", 0, 100 * MS) for i in range(4)], 0)
    assert [(a.model, a.gpu, a.worker) for a in busy] == [("b", 0, 0)]
    assert s.gpus[0].exec.available(0) > 7 * MS > s.gpus[1].exec.available(0)
    acts = s.on_request(Request(1, "a", 0, 8 * MS), 0)
    assert [(a.type, a.worker) for a in acts] == [(ActionType.INFER, 1)]
    assert s.drain_replies() == []


def test_a_model_larger_than_every_gpus_cache_is_answered_at_once():
    """A model whose weights take more pages than any GPU's cache (a live controller's
    workers have smaller caches than the profile set assumes; the simulator refuses such
    a scenario up front): each request waited out its SLO and timed out, with no LOAD
    and no word why. Now answered ERROR at once, as the baselines answer it; a GPU
    added with a cache large enough serves it."""
    from controller.policy import NO_GPU_FITS

    pages = make_profile("a").weights_pages
    s = sched(gpus=2, pages=pages - 1)
    assert s.on_request(req(1), 0) == []
    (rep,) = s.drain_replies()
    assert (rep.status, rep.message, rep.time) == (RequestStatus.ERROR, NO_GPU_FITS, 0)
    assert s.queued() == 0
    acts = s.add_gpu(GpuSpec(1, 0, pages), MS)
    acts += s.on_request(req(2, t=MS), MS)
    assert [(a.type, a.worker) for a in acts] == [(ActionType.LOAD, 1), (ActionType.INFER, 1)]
    assert s.drain_replies() == []


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_fewer_requests_than_the_smallest_batch_size_run_padded(n):
    """A model compiled for batch sizes 4 and 8 only: 2 or 3 queued requests run as one
    batch of 4, padded, as a lone request does (they waited for a fourth and were all
    dropped at their drop time, the GPU idle); 6 run as 4, then 2 padded."""
    s = ClockworkScheduler([make_profile("a", batches=(4, 8))], [GpuSpec(0, 0, 1376)],
                           SchedulerConfig())
    t = warm(s)
    occupy(s, t, 20 * MS)  # (busy: the requests queue up before any decision)
    for i in range(1, n + 1):
        assert s.on_request(req(i, t=t), t) == []
    infers: list[Action] = []
    while s.queued() and (wake := s.next_wakeup()) is not None:
        for a in s.on_tick(wake):
            assert a.type == ActionType.INFER and a.batch_size == 4, brief([a])
            infers.append(a)
            s.on_result(ok(a, a.earliest), a.earliest + a.expected_duration)
    replies = s.drain_replies()
    assert len(infers) == (1 if n <= 4 else 2), brief(infers)
    assert sorted(r.request.id for r in replies if r.status == RequestStatus.SUCCESS) == \
        list(range(1, n + 1)), [(r.request.id, r.status.name) for r in replies]


def test_a_rejected_request_goes_to_another_copy_that_can_still_serve_it():
    """An INFER turned away (EXEC_TOO_LATE) on a GPU now busy with other work: its request
    is offered to every copy, soonest free first, before that GPU decides alone. It timed
    the request out there (it could no longer start in time) while the other GPU, idle
    with a ready copy, could still serve it."""
    s = sched(models=("a", "b"), gpus=2)
    s.adopt_copies(0, 0, [("a", 1), ("b", 1)])
    s.adopt_copies(1, 0, [("a", 1)])
    t = 100 * MS
    (x,) = s.on_request(req(1, "a", t=t, slo=12 * MS), t)
    assert x.gpu == 0
    for i in range(2, 5):  # GPU 0 fills up behind it
        assert all(a.gpu == 0 for a in s.on_request(req(i, "b", t=t, slo=100 * MS), t))
    now = t + 2 * MS
    out = s.on_result(fail(x, now, ErrorCode.EXEC_TOO_LATE), now)
    assert [(a.type, a.gpu, a.model) for a in out] == [(ActionType.INFER, 1, "a")], brief(out)
    assert s.drain_replies() == []


def test_a_lane_replayed_after_a_result_keeps_each_actions_start_bound():
    """A result re-anchors a lane and its outstanding chain is replayed: each action from
    no earlier than it was predicted to start when sent (``now + future``: it cannot have
    reached the worker sooner), as ``add`` predicted it. Replayed from ``earliest`` alone
    (the send time), the next action was predicted up to ``future`` early."""
    lane = LaneTracker(future=1_000_000, lag=10_000_000)
    assert lane.add(1, 0, 500_000, now=0) == 1_000_000  # idle: starts a future after now
    assert lane.add(2, 1_200_000, 500_000, now=1_200_000) == 2_200_000
    lane.done(1, end=1_300_000)  # the first ended; the second cannot start before 2.2 ms
    assert lane.free_at == 2_700_000


def test_no_success_past_its_slo_with_a_network_below_the_buffer():
    """Clockwork's promise, with no noise: a request is answered in time or turned away.
    One-way network 0.3 ms under an SLO of 4.5 ms (a buffer of 0.45 ms): 7 of 556
    successes came up to 132 us late, each batch's start predicted from a chain replayed
    from send times after a result came."""
    from clockwork.cluster.sim import simulate

    res = simulate({"seed": 1, "duration_s": 2.0,
                    "cluster": {"workers": 1, "gpus_per_worker": 1, "network_latency_ms": 0.3},
                    "models": [{"name": "resnet34_v2"}],
                    "workloads": [{"kind": "poisson", "rate_rps": 600, "slo_ms": 4.5}]})
    s = res.summary
    assert s["succeeded"] > 400 and s["slo_met"] == s["succeeded"], s
