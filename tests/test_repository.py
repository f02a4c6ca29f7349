"""The model repository: models added to and removed from a running controller.

Pure cores first (``Policy.add_model`` / ``remove_model``, event by event, every
policy), then the worker's side (a hot-added instance is executable), then live
clusters driven by ``clockwork.Client`` and the stock ``tritonclient`` (gRPC and HTTP).

Test profile: LOAD 8 ms, EXEC b=1 2.9 ms, b=2 4.06, b=4 6.38 ms, 7 pages.
"""

from __future__ import annotations

import pytest

from clockwork.actions import ActionType, ErrorCode, RequestStatus, Result
from clockwork.requests import Request
from controller import make_policy
from controller.config import SchedulerConfig
from controller.policy import MODEL_UNLOADED, GpuSpec, ModelView
from controller.scheduler import ClockworkScheduler
from tests.conftest import make_profile

MS = 1_000_000
POLICIES = ["clockwork", "clipper", "tfserving", "infaas"]


def ok(a, end: int) -> Result:
    d = a.expected_duration
    return Result(a.id, a.type, ErrorCode.SUCCESS, a.worker, a.gpu, a.model, a.batch_size,
                  end - d, end - d, end, d)


def fail(a, at: int, code: ErrorCode) -> Result:
    return Result(a.id, a.type, code, a.worker, a.gpu, a.model, a.batch_size, at, at, at, 0)


def req(i: int, model: str = "a", t: int = 0, slo: int = 100 * MS) -> Request:
    return Request(i, model, t, slo)


def of(actions, t: ActionType, model: str | None = None):
    return [a for a in actions if a.type == t and (model is None or a.model == model)]


class Driver:
    """Runs a policy against a perfect worker: every action finishes after its expected
    duration (an EVICT at once), in the order they end; timers fire when due."""

    def __init__(self, policy) -> None:
        self.p = policy
        self.t = 0
        self.pending: list = []  # actions sent, not yet answered
        self.replies: dict[int, object] = {}  # request id -> Reply
        self.sent: list = []

    def take(self, actions) -> None:
        self.sent += actions
        self.pending += actions
        for rep in self.p.drain_replies():
            assert rep.request.id not in self.replies, "answered twice"
            self.replies[rep.request.id] = rep

    def request(self, r: Request) -> None:
        self.take(self.p.on_request(r, self.t))

    def end_of(self, a) -> int:
        if a.type == ActionType.EVICT:
            return a.sent_at
        return max(a.earliest, a.sent_at) + a.expected_duration

    def step(self, only=None) -> bool:
        """Finish the action that ends first (of those ``only`` accepts); False if none."""
        cands = [a for a in self.pending if only is None or only(a)]
        w = self.p.next_wakeup()
        if not cands:
            if w is None or w > self.t + 500 * MS:
                return False
            self.t = max(self.t, w)
            self.take(self.p.on_tick(self.t))
            return True
        a = min(cands, key=lambda a: (self.end_of(a), a.id))
        end = max(self.t, self.end_of(a))
        if w is not None and w < end:
            self.t = max(self.t, w)
            self.take(self.p.on_tick(self.t))
            return True
        self.t = end
        self.pending.remove(a)
        self.take(self.p.on_result(ok(a, self.t), self.t))
        return True

    def run(self, only=None, limit: int = 2000) -> None:
        for _ in range(limit):
            if not self.step(only):
                return
        raise AssertionError("the policy never settled")


def policy(name: str, models=("a",), gpus: int = 1, pages: int = 1376):
    return make_policy(name, [make_profile(m) for m in models],
                       [GpuSpec(0, g, pages) for g in range(gpus)], SchedulerConfig())


# ---------------------------------------------------------------------------- every policy


@pytest.mark.parametrize("name", POLICIES)
def test_an_added_model_is_served_at_once_and_others_are_untouched(name):
    p = policy(name)
    d = Driver(p)
    d.request(req(1, "a"))
    d.run()
    assert d.replies[1].status == RequestStatus.SUCCESS
    pages_a = p.pages_used(0)
    assert p.add_model("b", make_profile("some_profile", exec1=1_000_000), d.t) == []
    assert p.model_view("b") == ModelView((), (), 0)
    assert p.model_view("a").loaded_on == (0,)  # nothing happened to a
    assert p.pages_used(0) == pages_a
    for i in range(2, 6):
        d.request(req(i, "b", d.t))
        d.request(req(100 + i, "a", d.t))
    d.run()
    assert all(d.replies[i].status == RequestStatus.SUCCESS for i in range(2, 6))
    assert all(d.replies[100 + i].status == RequestStatus.SUCCESS for i in range(2, 6))
    # b was loaded by the usual rule, under its own name, with the profile's EXEC time
    b_infers = of(d.sent, ActionType.INFER, "b")
    assert of(d.sent, ActionType.LOAD, "b") and b_infers
    assert b_infers[0].expected_duration == round(1_000_000 * (0.6 + 0.4 * b_infers[0].batch_size))
    assert not of(d.sent, ActionType.EVICT)
    with pytest.raises(ValueError, match="already known"):
        p.add_model("b", make_profile("b"), d.t)


@pytest.mark.parametrize("name", POLICIES)
def test_remove_answers_the_queue_lets_inflight_finish_then_evicts(name):
    p = policy(name, models=("a", "b"))
    d = Driver(p)
    d.request(req(1, "b"))
    d.request(req(2, "a"))
    d.run()
    assert p.model_view("b").loaded_on == (0,) and p.pages_used(0) == 14
    # a burst for b: some INFERs go out, the rest wait in the policy's queues
    t = d.t
    for i in range(10, 60):
        d.request(req(i, "b", t))
    for i in range(200, 205):
        d.request(req(i, "a", t))
    inflight_b = {r.id for a in of(d.pending, ActionType.INFER, "b") for r in a.requests}
    waiting = {r.id for r in (req(i) for i in range(10, 60))} - inflight_b - set(d.replies)
    assert inflight_b and waiting and p.model_view("b").queued == len(waiting)
    out = p.remove_model("b", t)
    d.take(out)
    # every waiting request of b is answered now, and only those
    unloaded = {i for i, rep in d.replies.items() if rep.message == MODEL_UNLOADED}
    assert unloaded == waiting
    assert all(d.replies[i].status == RequestStatus.INVALID_REQUEST for i in unloaded)
    assert not of(out, ActionType.EVICT)  # INFERs of b still run
    v = p.model_view("b")
    assert v.removing and v.loaded_on == (0,) and v.queued == 0
    # refused from now on, never queued
    d.request(req(99, "b", t))
    assert d.replies[99].status == RequestStatus.INVALID_REQUEST
    with pytest.raises(ValueError):
        p.add_model("b", make_profile("b"), t)  # not before its copies are gone
    with pytest.raises(KeyError):
        p.remove_model("b", t)
    d.run()
    # the INFERs in flight finished and their requests succeeded; then one EVICT of b
    assert all(d.replies[i].status == RequestStatus.SUCCESS for i in inflight_b)
    evicts = of(d.sent, ActionType.EVICT)
    assert [a.model for a in evicts] == ["b"]
    last_b_infer = max(a.sent_at for a in of(d.sent, ActionType.INFER, "b"))
    assert evicts[0].sent_at >= last_b_infer
    assert p.model_view("b") is None and p.pages_used(0) == 7
    # a was served throughout; every request answered exactly once
    assert all(d.replies[i].status == RequestStatus.SUCCESS for i in range(200, 205))
    assert set(d.replies) == {1, 2, 99, *range(10, 60), *range(200, 205)}
    assert p.queued() == 0
    # the name can be used again
    p.add_model("b", make_profile("b"), d.t)
    d.request(req(300, "b", d.t))
    d.run()
    assert d.replies[300].status == RequestStatus.SUCCESS


@pytest.mark.parametrize("name", POLICIES)
def test_remove_an_idle_model_evicts_it_at_once(name):
    p = policy(name, models=("a", "b"))
    d = Driver(p)
    d.request(req(1, "a"))
    d.request(req(2, "b"))
    d.run()
    out = p.remove_model("a", d.t)
    assert [(a.type, a.model) for a in out] == [(ActionType.EVICT, "a")]
    assert p.pages_used(0) == 7 and p.model_view("a") is None
    assert p.model_view("b").loaded_on == (0,)
    d.take(out)
    d.request(req(3, "a", d.t))
    assert d.replies[3].status == RequestStatus.INVALID_REQUEST
    with pytest.raises(KeyError):
        p.remove_model("nope", d.t)


@pytest.mark.parametrize("name", POLICIES)
def test_a_failed_inflight_infer_of_a_removed_model_is_not_retried(name):
    p = policy(name)
    d = Driver(p)
    d.request(req(1, "a"))
    d.run()
    d.request(req(2, "a", d.t))
    while not of(d.pending, ActionType.INFER):  # (tfserving: its batch timeout first)
        assert d.step()
    (infer,) = of(d.pending, ActionType.INFER)
    d.take(p.remove_model("a", d.t))
    d.pending.remove(infer)
    out = p.on_result(fail(infer, d.t + MS, ErrorCode.EXEC_TOO_LATE), d.t + MS)
    d.take(out)
    assert d.replies[2].status == RequestStatus.INVALID_REQUEST
    assert d.replies[2].message == MODEL_UNLOADED
    assert [(a.type, a.model) for a in out] == [(ActionType.EVICT, "a")]
    assert p.pages_used(0) == 0 and p.model_view("a") is None


# ---------------------------------------------------------------------------- Clockwork


def test_clockwork_removal_during_load_evicts_after_the_load_and_its_infer():
    s = ClockworkScheduler([make_profile("a")], [GpuSpec(0, 0, 1376)])
    acts = s.on_request(req(1), 0)
    load, infer = acts  # LOAD, and the INFER placed behind it
    assert s.remove_model("a", 0) == []  # the request is in the INFER: not answered
    assert s.drain_replies() == []
    assert s.model_view("a") == ModelView((0,), (0,), 0, True)
    assert s.on_result(ok(load, 8 * MS), 8 * MS) == []  # loaded, but its INFER is still to run
    out = s.on_result(ok(infer, 9 * MS + infer.expected_duration), 12 * MS)
    assert [(a.type, a.model, a.version) for a in out] == [(ActionType.EVICT, "a", 1)]
    (rep,) = s.drain_replies()
    assert rep.status == RequestStatus.SUCCESS
    assert s.pages_used(0) == 0 and s.model_view("a") is None and s.next_wakeup() is None


def test_clockwork_freed_pages_take_the_load_that_waited_for_them():
    # room for one model: b cannot load while a runs; removing a lets b in
    s = ClockworkScheduler([make_profile("a"), make_profile("b")], [GpuSpec(0, 0, 10)])
    d = Driver(s)
    d.request(req(1, "a"))
    d.run()
    t = d.t
    d.request(req(2, "a", t))
    d.request(req(3, "b", t, slo=500 * MS))
    assert not of(d.pending, ActionType.LOAD, "b")  # a's INFER holds the GPU's pages
    d.take(s.remove_model("a", t))
    d.run(only=lambda a: a.model == "a")
    evict = of(d.sent, ActionType.EVICT, "a")
    (load_b,) = of(d.sent, ActionType.LOAD, "b")
    assert evict and load_b.sent_at == evict[0].sent_at  # in the same call
    d.run()
    assert d.replies[2].status == RequestStatus.SUCCESS
    assert d.replies[3].status == RequestStatus.SUCCESS


def test_clockwork_removal_leaves_other_models_queues_and_schedules_alone():
    s = ClockworkScheduler([make_profile(m) for m in "abc"], [GpuSpec(0, 0, 1376)])
    d = Driver(s)
    for i, m in enumerate("abc"):
        d.request(req(i, m))
    d.run()
    t = d.t
    for i in range(10, 40):
        d.request(req(i, "abc"[i % 3], t))
    before = {m: s.model_view(m) for m in "ac"}
    pending = [a.id for a in d.pending]
    out = s.remove_model("b", t)
    d.take(out)
    assert {m: s.model_view(m) for m in "ac"} == before
    assert [a.id for a in d.pending] == pending  # nothing sent or taken back
    d.run()
    assert all(d.replies[i].status == RequestStatus.SUCCESS for i in range(10, 40) if i % 3 != 1)
