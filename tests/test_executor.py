"""Worker semantics: windows, one EXEC at a time, pages, error codes."""

from __future__ import annotations

from clockwork.actions import NEVER, Action, ActionType, ErrorCode
from tests.conftest import make_profile
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor

MS = 1_000_000


def ex(pages=20, **models):
    profs = {n: make_profile(n, pages=p) for n, p in (models or {"a": 7, "b": 7}).items()}
    return GpuExecutor(0, 0, pages, profs, EmulatedDevice())


def load(aid, model, earliest=0, latest=NEVER, version=1):
    return Action(aid, ActionType.LOAD, 0, 0, model, earliest, latest, 8 * MS, version=version)


def infer(aid, model, earliest=0, latest=NEVER, b=1, version=0):
    return Action(aid, ActionType.INFER, 0, 0, model, earliest, latest, 0, batch_size=b,
                  version=version)


def evict(aid, model):
    return Action(aid, ActionType.EVICT, 0, 0, model, 0, NEVER, 0)


def run_until_idle(e, now=0):
    out = []
    while (t := e.next_time()) is not None:
        out += e.advance(t)
    return out


def test_load_then_infer_waits_for_earliest():
    e = ex()
    assert e.submit(load(1, "a"), 0) == []
    assert e.submit(infer(2, "a", earliest=20 * MS), 1 * MS) == []
    res = run_until_idle(e)
    assert [(r.id, r.status, r.begin, r.end) for r in res] == [
        (1, ErrorCode.SUCCESS, 0, 8 * MS),
        (2, ErrorCode.SUCCESS, 20 * MS, 20 * MS + 2_900_000),
    ]
    assert res[1].received == 1 * MS


def test_one_exec_at_a_time_in_earliest_order():
    e = ex()
    e.submit(load(1, "a"), 0)
    run_until_idle(e)
    e.submit(infer(3, "a", earliest=9 * MS, b=2), 8 * MS)
    e.submit(infer(2, "a", earliest=8 * MS, b=1), 8 * MS)
    res = run_until_idle(e)
    # 2 has the earlier window so it goes first; 3 waits for the lane, not just its earliest
    assert [(r.id, r.begin, r.end) for r in res] == [
        (2, 8 * MS, 10_900_000),
        (3, 10_900_000, 10_900_000 + 4_060_000),
    ]


def test_too_late_is_rejected_never_run_late():
    e = ex()
    e.submit(load(1, "a"), 0)
    run_until_idle(e)
    e.submit(infer(2, "a", earliest=8 * MS, latest=20 * MS, b=16), 8 * MS)  # runs 8..28.3 ms
    e.submit(infer(3, "a", earliest=8 * MS, latest=12 * MS), 8 * MS)
    res = run_until_idle(e)
    by_id = {r.id: r for r in res}
    assert by_id[2].ok
    assert by_id[3].status == ErrorCode.EXEC_TOO_LATE
    assert by_id[3].begin == by_id[2].end  # rejected when the lane came free, not run


def test_load_too_late_code():
    e = ex()
    e.submit(load(1, "a"), 0)
    e.submit(load(2, "b", latest=5 * MS), 0)
    res = run_until_idle(e)
    assert [(r.id, r.status) for r in res] == [(1, ErrorCode.SUCCESS), (2, ErrorCode.LOAD_TOO_LATE)]
    assert e.loaded_models() == ["a"]


def test_infer_without_weights_and_during_load():
    e = ex()
    (r,) = e.submit(infer(1, "a"), 0) + run_until_idle(e)
    assert r.status == ErrorCode.WEIGHTS_NOT_PRESENT
    e.submit(load(2, "a"), 10 * MS)
    e.submit(infer(3, "a", earliest=11 * MS, latest=15 * MS), 10 * MS)  # load ends at 18 ms
    res = run_until_idle(e)
    assert {x.id: x.status for x in res} == {2: ErrorCode.SUCCESS, 3: ErrorCode.WEIGHTS_NOT_PRESENT}


def test_insufficient_cache_and_evict_frees_pages():
    e = ex(pages=10)  # room for one 7-page model
    e.submit(load(1, "a"), 0)
    e.submit(load(2, "b"), 0)
    res = run_until_idle(e)
    assert [r.status for r in res] == [ErrorCode.SUCCESS, ErrorCode.LOAD_INSUFFICIENT_CACHE]
    assert e.pages_used == 7
    (r,) = e.submit(evict(3, "a"), 20 * MS)
    assert r.ok and e.pages_used == 0
    (r,) = e.submit(evict(4, "a"), 20 * MS)
    assert r.status == ErrorCode.EVICT_NOT_IN_CACHE
    e.submit(load(5, "b"), 20 * MS)
    assert [x.ok for x in run_until_idle(e)] == [True]
    assert e.pages_used == 7 and e.loaded_models() == ["b"]


def test_peak_pages_is_the_most_pages_ever_in_use_at_once():
    """``peak_pages`` rises as a LOAD takes pages, and an EVICT does not lower it (the
    simulator's ``max_pages_used`` is the highest over its executors)."""
    e = ex(pages=20, a=7, b=3)
    assert e.peak_pages == 0
    e.submit(load(1, "a"), 0)
    e.submit(load(2, "b"), 0)
    run_until_idle(e)
    assert e.pages_used == e.peak_pages == 10
    e.submit(evict(3, "a"), 20 * MS)
    assert e.pages_used == 3 and e.peak_pages == 10
    e.submit(load(4, "a", version=2), 20 * MS)
    run_until_idle(e)
    assert e.pages_used == e.peak_pages == 10


def test_weights_version_and_evict_during_exec():
    e = ex()
    e.submit(load(1, "a", version=3), 0)
    run_until_idle(e)
    e.submit(infer(2, "a", earliest=9 * MS, version=2), 8 * MS)
    (r,) = run_until_idle(e)
    assert r.status == ErrorCode.WEIGHTS_CHANGED
    e.submit(infer(3, "a", earliest=20 * MS, b=16, version=3), 20 * MS)
    assert e.submit(evict(4, "a"), 25 * MS)[0].ok  # while EXEC runs
    (r,) = run_until_idle(e)
    assert r.id == 3 and r.status == ErrorCode.WEIGHTS_CHANGED


def test_unknown_model_and_bad_batch():
    e = ex()
    (r,) = e.submit(infer(1, "zzz"), 0)
    assert r.status == ErrorCode.UNKNOWN_MODEL
    e.submit(load(2, "a"), 0)
    run_until_idle(e)
    (r,) = e.submit(infer(3, "a", earliest=9 * MS, b=3), 9 * MS) + run_until_idle(e)
    assert r.status == ErrorCode.INVALID_BATCH_SIZE


def test_load_and_exec_lanes_overlap():
    e = ex()
    e.submit(load(1, "a"), 0)
    run_until_idle(e)
    e.submit(load(2, "b"), 10 * MS)
    e.submit(infer(3, "a", earliest=10 * MS), 10 * MS)
    res = run_until_idle(e)
    assert {r.id: (r.begin, r.end) for r in res} == {
        2: (10 * MS, 18 * MS), 3: (10 * MS, 10 * MS + 2_900_000)}


def test_noise_is_seeded_and_bounded():
    prof = make_profile("a")
    a = infer(1, "a", b=1)
    d1 = [EmulatedDevice(0.05, seed=7).duration(a, prof) for _ in range(3)]
    dev = EmulatedDevice(0.05, seed=7)
    d2 = [dev.duration(a, prof) for _ in range(200)]
    assert d1[0] == d2[0]
    assert min(d2) > 0 and len(set(d2)) > 100
    assert abs(sum(d2) / len(d2) / 2_900_000 - 1) < 0.02


def test_infer_waits_for_a_load_in_progress_within_its_window():
    e = ex()
    e.submit(load(1, "a"), 0)  # weights ready at 8 ms
    e.submit(infer(2, "a", earliest=7 * MS, latest=12 * MS), 1 * MS)
    res = run_until_idle(e)
    assert [(r.id, r.status, r.begin) for r in res] == [
        (1, ErrorCode.SUCCESS, 0), (2, ErrorCode.SUCCESS, 8 * MS)]
    # but not beyond its window: then the weights are simply not there
    e2 = ex()
    e2.submit(load(1, "a"), 0)
    res = e2.submit(infer(2, "a", earliest=1 * MS, latest=5 * MS), 1 * MS) + run_until_idle(e2)
    assert {r.id: r.status for r in res}[2] == ErrorCode.WEIGHTS_NOT_PRESENT


def test_a_reset_keeps_only_the_named_weights_fully_loaded_at_their_version():
    """``keep_weights``: the executors after a reset take over the weights the controller
    names (GPU, model, version) that are loaded by then; not one still loading, not one
    at another version, not one on another GPU; nothing in flight goes with them."""
    from worker.executor import keep_weights
    old = ex(pages=30, a=7, b=7, c=7)
    old.submit(load(1, "a", version=4), 0)
    old.submit(load(2, "b", version=5), 0)
    run_until_idle(old)  # a and b loaded by 16 ms
    old.submit(load(3, "c", version=6), 20 * MS)  # loading until 28 ms
    old.submit(infer(4, "a", earliest=30 * MS), 20 * MS)  # in flight
    new = [GpuExecutor(0, 0, 30, old.models, EmulatedDevice())]  # the same models
    kept = keep_weights([old], new, [(0, "a", 4), (0, "b", 9), (0, "c", 6), (1, "a", 4)],
                        21 * MS)
    assert kept == [{"a"}]
    e = new[0]
    assert e.loaded_models() == ["a"] and e.pages_used == 7
    assert e.next_time() is None  # the INFER in flight was not taken over
    # the kept weights serve at once, at their version; the others need a LOAD
    e.submit(infer(5, "a", earliest=22 * MS, version=4), 21 * MS)
    e.submit(infer(6, "b", earliest=22 * MS), 21 * MS)
    res = {r.id: r.status for r in run_until_idle(e)}
    assert res == {5: ErrorCode.SUCCESS, 6: ErrorCode.WEIGHTS_NOT_PRESENT}
    # a kept copy is a copy like any other: EVICT frees its pages
    assert e.submit(evict(7, "a"), 40 * MS)[0].ok and e.pages_used == 0
    # an instance name that now runs another model keeps nothing
    other = GpuExecutor(0, 0, 30, {**old.models, "a": make_profile("a", pages=7)},
                        EmulatedDevice())
    assert keep_weights([old], [other], [(0, "a", 4)], 21 * MS) == [set()]


class _OpenInfer:
    """A device whose INFERs the shell runs for real (as cpu/cuda ones): no duration."""

    def duration(self, action, profile):
        return profile.load_ns if action.type == ActionType.LOAD else None


def test_an_action_is_never_started_after_its_latest_when_asked_late():
    # a real device's completion reaches the worker's loop late (busy loop): the next
    # INFER, whose window has passed by then, is answered too late, not handed over
    e = GpuExecutor(0, 0, 20, {"a": make_profile("a")}, _OpenInfer())
    e.submit(load(1, "a"), 0)
    e.advance(8 * MS)
    e.submit(infer(2, "a", 10 * MS, 20 * MS, version=1), 10 * MS)
    assert [a.id for a in e.take_started()] == [2]
    e.submit(infer(3, "a", 11 * MS, 21 * MS, version=1), 11 * MS)
    res = e.complete(2, now=40 * MS)
    assert [(r.id, r.status) for r in res] == [(2, ErrorCode.SUCCESS),
                                               (3, ErrorCode.EXEC_TOO_LATE)]
    assert e.take_started() == []
    # an emulated one advanced after the window (a late timer): too late, at that time
    e = ex()
    e.submit(load(1, "a"), 0)
    e.advance(8 * MS)
    e.submit(infer(2, "a", 10 * MS, 20 * MS), 9 * MS)
    (r,) = e.advance(30 * MS)
    assert (r.status, r.begin) == (ErrorCode.EXEC_TOO_LATE, 30 * MS)
    # advanced late but within the window: it begins then, not at the time it could have
    e.submit(load(3, "b"), 30 * MS)
    e.advance(38 * MS)
    e.submit(infer(4, "b", 40 * MS, 50 * MS), 39 * MS)
    assert e.advance(45 * MS) == []
    (r,) = run_until_idle(e)
    assert (r.status, r.begin) == (ErrorCode.SUCCESS, 45 * MS)


def test_completed_without_a_begin_spans_the_lane_from_its_start():
    """A live worker completes an action when its loop hears of it: the result spans the
    lane from when the executor started the action (the hand-over to the device's
    thread included) to then; duration is the device's work alone. The next action
    starts at that end, as the controller predicts from these times."""
    e = GpuExecutor(0, 0, 20, {"a": make_profile("a")}, _OpenInfer())
    e.submit(load(1, "a"), 0)
    e.advance(8 * MS)
    e.submit(infer(2, "a", 10 * MS, 40 * MS, version=1), 9 * MS)
    e.submit(infer(3, "a", 10 * MS, 40 * MS, version=1), 9 * MS)
    e.advance(10 * MS)
    assert [a.id for a in e.take_started()] == [2]
    (r,) = e.complete(2, now=14 * MS, duration=MS)
    assert (r.id, r.begin, r.end, r.duration, r.held) == (2, 10 * MS, 14 * MS, MS, 4 * MS)
    assert [a.id for a in e.take_started()] == [3]
    (r,) = e.complete(3, now=16 * MS, duration=MS)
    assert (r.begin, r.end) == (14 * MS, 16 * MS)


def test_a_window_that_closes_before_it_opens_is_too_late():
    e = ex()
    e.submit(load(1, "a"), 0)
    e.advance(8 * MS)
    e.submit(infer(2, "a", 20 * MS, 15 * MS), 9 * MS)
    (r,) = run_until_idle(e)
    assert r.status == ErrorCode.EXEC_TOO_LATE


def test_a_removed_models_queued_actions_are_answered_once_unknown_model():
    """``forget``: a model that leaves the worker takes its queued actions with it, each
    answered ``UNKNOWN_MODEL`` at once (left queued, the first to come due raised KeyError
    from ``_start`` in the worker's timer and was never answered); another model's queued
    actions and a running one go on as usual."""
    e = ex()
    e.submit(load(1, "a"), 0)  # running until 8 ms
    e.submit(load(2, "b", earliest=20 * MS), 1 * MS)
    e.submit(infer(3, "b", earliest=30 * MS), 1 * MS)
    e.submit(infer(4, "a", earliest=9 * MS), 1 * MS)
    e.submit(infer(5, "b", earliest=40 * MS), 1 * MS)
    del e.models["b"]
    res = e.forget("b", 2 * MS)
    assert [(r.id, r.status, r.received, r.end) for r in res] == [
        (2, ErrorCode.UNKNOWN_MODEL, 1 * MS, 2 * MS), (3, ErrorCode.UNKNOWN_MODEL, 1 * MS, 2 * MS),
        (5, ErrorCode.UNKNOWN_MODEL, 1 * MS, 2 * MS)]
    assert "removed" in res[0].message
    assert [(r.id, r.status) for r in run_until_idle(e)] == [
        (1, ErrorCode.SUCCESS), (4, ErrorCode.SUCCESS)]
    assert e.forget("b", 50 * MS) == [] and e.next_time() is None


def test_free_pages_hand_out_what_a_stack_of_every_page_would():
    """The cache's free pages are handed out in the order a stack holding every page
    number gives them (the order a real device's arena offsets follow), without holding
    one number per page: a cache of 10^12 pages costs what its pages in use do."""
    import random

    from worker.executor import FreePages

    rng = random.Random(7)
    free, stack, held = FreePages(50), list(range(49, -1, -1)), []
    for _ in range(2000):
        if held and (rng.random() < 0.5 or not len(free)):
            pages = held.pop(rng.randrange(len(held)))
            free.give(pages)
            stack.extend(reversed(pages))
        else:
            n = rng.randint(1, len(free))
            got = free.take(n)
            assert got == [stack.pop() for _ in range(n)]
            held.append(got)
        assert len(free) == len(stack)
    e = ex(pages=10**12, a=7)
    assert e.free_pages._back == [] and len(e.free_pages) == 10**12
    e.submit(load(1, "a"), 0)
    run_until_idle(e)
    assert e.weights["a"].pages == list(range(7)) and e.pages_used == 7


def test_two_actions_of_one_id_queued_together_are_both_answered():
    """Two queued actions with the same id and earliest (a controller's mistake): both
    are queued and answered in arrival order (their heap entries were compared down to
    the actions, TypeError, with the second already in the heap: the lane's later
    steps could fail on it too)."""
    e = ex()
    assert e.submit(load(1, "a", earliest=5 * MS), 0) == []
    assert e.submit(load(1, "b", earliest=5 * MS), 0) == []
    res = run_until_idle(e)
    assert [(r.id, r.model, r.status) for r in res] == [
        (1, "a", ErrorCode.SUCCESS), (1, "b", ErrorCode.SUCCESS)]


def test_a_clock_that_reads_below_zero_runs_actions_at_once():
    """A worker whose clock reads negative (``--clock-offset-ms`` below minus the host's
    uptime): its lanes were free only from 0, so every action waited for the clock to
    pass 0 -- for ever, in effect -- and every request failed. Now a LOAD and an INFER
    run as they would at any other time."""
    now = -10**12
    e = ex()
    assert e.submit(load(1, "a", earliest=now), now) == []
    assert e.submit(infer(2, "a", earliest=now), now) == []
    res = run_until_idle(e)
    assert [(r.id, r.status, r.begin - now) for r in res] == [
        (1, ErrorCode.SUCCESS, 0), (2, ErrorCode.SUCCESS, 8 * MS)]


def test_an_evict_runs_at_once_whatever_its_window():
    """EVICT runs as it arrives, whatever its window (the one action that does): the
    controller counts its pages free as it sends it, so a refused EVICT would leave
    weights it no longer counts -- a window check refused the baselines' EVICTs (stamped
    with the controller's now) on a worker clock slightly behind, and every EVICT of a
    worker whose clock reads below zero, and later LOADs found no room."""
    for now in (100 * MS, -10**12):
        e = ex()
        e.submit(load(1, "a", earliest=now), now)
        run_until_idle(e)
        early = Action(2, ActionType.EVICT, 0, 0, "a", now + MS, now + 2 * MS, 0)
        assert [r.status for r in e.submit(early, now)] == [ErrorCode.SUCCESS]
        assert e.loaded_models() == []


def test_actions_that_would_never_run_are_refused_not_queued(monkeypatch):
    """An action whose window opens more than a day ahead (one at the end of time was
    never answered), or one past MAX_PENDING waiting on its lane (300,000 such INFERs
    took a worker from 111 to 224 MB, nothing pushing back), is answered INVALID_INPUT at
    once and not queued; one a second ahead still waits for its window."""
    import worker.executor as executor

    monkeypatch.setattr(executor, "MAX_PENDING", 3)
    e = ex()
    end = NEVER - 10
    (r,) = e.submit(infer(1, "a", earliest=end, latest=NEVER - 1), 0)
    assert (r.status, r.message) == (ErrorCode.INVALID_INPUT,
                                     "its window opens more than a day ahead")
    for k in range(3):
        assert e.submit(load(10 + k, "a", earliest=1000 * MS), 0) == []
    (r,) = e.submit(load(20, "b", earliest=1000 * MS), 0)
    assert (r.status, r.message) == (ErrorCode.INVALID_INPUT,
                                     "3 actions wait on its lane already")
    assert e.submit(infer(21, "a", earliest=1000 * MS), 0) == []  # (the other lane)
    assert len(e.load_lane.pending) == 3 and len(e.exec_lane.pending) == 1
    # a window that opens at 0 ("at once", as the wire leaves it unset) is never refused,
    # however far below it the worker's clock reads (an offset of days back)
    e2 = ex()
    assert e2.submit(load(30, "a", earliest=0), -2 * 86_400_000 * MS) == []


class _Open:
    """A device whose LOADs and INFERs the shell runs for real (as cpu/cuda ones)."""

    def duration(self, action, profile):
        return None


def test_a_load_and_an_infer_with_the_same_id_each_get_their_own_result():
    """A controller that gives a LOAD and an INFER the same id (a bug, or not ours): both
    run at once, one on each lane, and each completion is matched by its lane too. By the
    id alone the LOAD's failure was the INFER's result, and the LOAD was answered SUCCESS
    with the INFER's outputs, its weights counted loaded while the device held none."""
    e = GpuExecutor(0, 0, 20, {"a": make_profile("a", pages=7), "b": make_profile("b", pages=7)},
                    _Open())
    e.submit(load(1, "a"), 0)
    e.take_started()
    e.complete(1, MS, kind=ActionType.LOAD)
    e.submit(load(7, "b"), 2 * MS)
    e.submit(infer(7, "a", version=1), 2 * MS)
    assert sorted(a.type for a in e.take_started()) == [ActionType.LOAD, ActionType.INFER]
    (r,) = e.complete(7, 3 * MS, ErrorCode.LOAD_INSUFFICIENT_CACHE, "device full",
                      kind=ActionType.LOAD)
    assert (r.type, r.status) == (ActionType.LOAD, ErrorCode.LOAD_INSUFFICIENT_CACHE)
    assert "b" not in e.weights and e.pages_used == 7
    (r,) = e.complete(7, 4 * MS, outputs=["out"], kind=ActionType.INFER)
    assert (r.type, r.status, r.outputs) == (ActionType.INFER, ErrorCode.SUCCESS, ["out"])


def test_weights_evicted_under_a_running_exec_free_their_pages_when_it_ends():
    """EVICT (or a removal) of the weights a running EXEC uses: the pages are given back
    when the EXEC ends, as a real device frees them; given back at once, a LOAD in
    between was counted room the device did not have, and failed there while the
    executor and the controller counted the pages free."""
    for remove in ("evict", "forget"):
        e = ex(pages=7)
        e.submit(load(1, "a"), 0)
        e.advance(10 * MS)
        e.submit(infer(2, "a", 10 * MS, b=16, version=1), 10 * MS)
        assert e.advance(10 * MS) == [] and e.exec_lane.running.action.id == 2
        if remove == "evict":
            (r,) = e.submit(evict(3, "a"), 11 * MS)
            assert r.status == ErrorCode.SUCCESS
        else:
            assert e.forget("a", 11 * MS) == []
        assert e.pages_used == 7, remove  # (under the EXEC still)
        (r,) = e.submit(load(4, "b"), 11 * MS) + e.advance(11 * MS)
        assert r.status == ErrorCode.LOAD_INSUFFICIENT_CACHE, (remove, r)
        (r,) = run_until_idle(e)
        assert (r.id, r.status) == (2, ErrorCode.WEIGHTS_CHANGED) and e.pages_used == 0
        e.submit(load(5, "b"), r.end)
        (r,) = run_until_idle(e)
        assert (r.id, r.status) == (5, ErrorCode.SUCCESS), remove
