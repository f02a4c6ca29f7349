"""Clockwork's named workloads: each one's defining property, parameter checks, and a
short run through the simulator."""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

import numpy as np
import pytest

from clockwork.cluster.sim import simulate
from clockwork.telemetry import REQUEST_COLUMNS
from clockwork.workloads import WorkloadError, build_workload
from clockwork.workloads.azure import MINUTES, AzureTrace
from clockwork.workloads.named import OnOff

S = 1_000_000_000
MS = 1_000_000
EXEC1 = 2_900_000


def instances(n: int, model: str = "resnet50_v2") -> dict[str, str]:
    return {(model if i == 0 else f"{model}:{i}"): model for i in range(n)}


def make(spec: dict, n: int = 4, end: float = 100.0, seed: int = 1, start: int = 0,
         inst: dict[str, str] | None = None):
    inst = inst or instances(n)
    w = build_workload(spec, inst)
    w.bind(start, start + round(end * S), np.random.default_rng(seed),
           {i: EXEC1 + 1000 * k for k, i in enumerate(inst)})
    return w


def drain(w) -> list[tuple[int, str, int]]:
    out = []
    while (a := w.next_arrival()) is not None:
        out.append(a)
    t = [a[0] for a in out]
    assert t == sorted(t)
    return out


def drive(w, service_ns: int = 5 * MS, fail_every: int = 0):
    """A fake server answering every request ``service_ns`` after it is sent. Returns the
    submissions ``(t, instance, slo)`` and the most outstanding per instance."""
    heap: list = []
    seq = 0

    def push(t, kind, a):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a))

    for a in w.initial(w.start):
        push(a[0], 0, a)
    nxt = w.next_arrival()
    if nxt is not None:
        push(nxt[0], 1, nxt)
    out: list = []
    outstanding: Counter = Counter()
    peak: Counter = Counter()
    while heap:
        t, _, kind, a = heapq.heappop(heap)
        if kind in (0, 1):
            assert a[0] == t < w.end
            out.append(a)
            outstanding[a[1]] += 1
            peak[a[1]] = max(peak[a[1]], outstanding[a[1]])
            push(t + service_ns, 2, a[1])
            if kind == 1:
                nxt = w.next_arrival()
                if nxt is not None:
                    assert nxt[0] >= t
                    push(nxt[0], 1, nxt)
        else:
            outstanding[a] -= 1
            ok = not (fail_every and len(out) % fail_every == 0)
            for b in w.on_reply(a, ok, t):
                assert b[0] >= t
                push(b[0], 0, b)
    return out, peak


def within(count: float, expected: float, sigmas: float = 5.0) -> bool:
    return abs(count - expected) <= sigmas * max(expected, 1.0) ** 0.5


# ---------------------------------------------------------------- slo_exp_1


def test_slo_exp_1_steps_at_period_boundaries_and_stops_past_the_maximum():
    w = make({"kind": "slo_exp_1", "rate_rps": 50}, n=3, end=1000.0)
    arr = drain(w)
    # Clockwork's artifact rule: 1 x EXEC, x1.5 every 30 s; 1.5**13 = 194.6 <= 200 < 1.5**14
    assert w.stop == 14 * 30 * S
    assert arr[-1][0] < 14 * 30 * S and arr[-1][0] > 13 * 30 * S
    seen = set()
    for t, m, slo in arr:
        k = t // (30 * S)
        seen.add(k)
        assert slo == round(1.5**k * w.exec1[m])
    assert seen == set(range(14))


def test_slo_exp_1_additive_absolute_and_fixed_rate():
    w = make({"kind": "slo_exp_1", "rate_rps": 20, "slo_ms_start": 10, "slo_ms_max": 100,
              "factor": 10, "op": "add", "period_s": 3, "process": "fixed"}, n=2, end=100.0)
    arr = drain(w)
    # 10, 20, ..., 100 ms, each for 3 s; 110 > 100 ends the run at 30 s
    assert len(arr) == 30 * 20  # fixed spacing of 50 ms, the first one at the start
    assert arr[0][0] == 0 and arr[1][0] == 50 * MS
    for t, _m, slo in arr:
        assert slo == (10 + 10 * (t // (3 * S))) * MS
    assert {a[1] for a in arr[:2]} == set(w.models)


@pytest.mark.parametrize("rate", [3, 6, 29, 58, 100, 0.7])
@pytest.mark.parametrize("seconds", [1.0, 17.0, 60.0])
def test_fixed_rate_sends_ceil_rate_times_duration_each_on_its_time(rate, seconds):
    """ceil(rate x D) arrivals for D seconds, the k-th at k / rate exactly (floored to the
    nanosecond): k * (1e9 / rate) came out a hair under a whole nanosecond, so truncated
    1 ns early: 30 arrivals at 29 r/s in 1 s (the last at 999,999,999 ns), and in a
    stepped SLO schedule an arrival due at a period's start went in the period before."""
    import math
    from fractions import Fraction

    arr = drain(make({"kind": "fixed_rate", "rate_rps": rate}, n=3, end=seconds))
    want = math.ceil(Fraction(rate) * Fraction(seconds))
    assert len(arr) == want, (len(arr), want)
    assert [a[0] for a in arr] == [int(Fraction(k * S) / Fraction(rate)) for k in range(want)]


def test_a_fixed_rate_slo_step_starts_with_its_period():
    w = make({"kind": "slo_exp_1", "rate_rps": 29, "slo_ms_start": 10, "slo_ms_max": 40,
              "factor": 10, "op": "add", "period_s": 1, "process": "fixed"}, n=1, end=10.0)
    per = Counter(slo for _t, _m, slo in drain(w))
    assert per == {s * MS: 29 for s in (10, 20, 30, 40)}, per


def test_a_step_reaching_the_maximum_but_for_rounding_is_kept():
    """slo_factor_max 1.21 with factor 1.1 from 1: 1.1 x 1.1 is 1.2100000000000002 in
    floats, and that step was dropped as above the maximum (the run ended a period
    short). Values just above by float rounding count as the maximum."""
    w = make({"kind": "slo_exp_1", "rate_rps": 20, "slo_factor_start": 1, "factor": 1.1,
              "slo_factor_max": 1.21, "period_s": 1}, n=1, end=10.0)
    assert w.stop == 3 * S
    w = make({"kind": "slo_exp_1", "rate_rps": 20, "slo_factor_start": 1, "factor": 1.1,
              "slo_factor_max": 1.2, "period_s": 1}, n=1, end=10.0)
    assert w.stop == 2 * S  # (1.21 is above 1.2: dropped)


def test_slo_exp_1_runs_to_the_end_without_a_maximum_reached():
    w = make({"kind": "slo_exp_1", "rate_rps": 100, "slo_factor_start": 2, "factor": 1.0},
             n=2, end=40.0)
    arr = drain(w)
    assert w.stop == 40 * S and arr[-1][0] > 39 * S
    assert {slo / w.exec1[m] for _t, m, slo in arr} == {2.0}
    assert within(len(arr), 4000)


@pytest.mark.parametrize("bad, key", [
    ({"rate_rps": 0}, "rate_rps"),
    ({}, "rate_rps"),
    ({"rate_rps": 10, "op": "pow"}, "op"),
    ({"rate_rps": 10, "factor": 0}, "factor"),
    ({"rate_rps": 10, "period_s": -1}, "period_s"),
    ({"rate_rps": 10, "slo_factor_start": 300}, "slo_factor_max"),
    ({"rate_rps": 10, "slo_ms_start": 5, "slo_factor_max": 10}, "slo_ms_start"),
    ({"rate_rps": "fast"}, "rate_rps"),
    ({"rate_rps": 10, "slo_ms": 100}, "slo_ms"),
])
def test_slo_exp_1_rejects_bad_parameters(bad, key):
    with pytest.raises(WorkloadError, match=key):
        build_workload({"kind": "slo_exp_1", **bad}, instances(2))


# ---------------------------------------------------------------- bursty


def test_bursty_rate_differs_between_on_and_off_periods():
    spec = {"kind": "bursty", "burst_rps": 1000, "rate_rps": 100, "on_s": 1, "off_s": 1,
            "periods": "fixed", "start": "on", "slo_ms": 50}
    w = make(spec, n=3, end=20.0)
    arr = drain(w)
    assert w.on_periods == [(2 * k * S, (2 * k + 1) * S) for k in range(10)]
    t = np.array([a[0] for a in arr])
    on = ((t // S) % 2 == 0).sum()
    off = len(t) - on
    assert within(on, 10 * 1000) and within(off, 10 * 100)
    per = Counter(a[1] for a in arr)
    assert set(per) == set(w.models) and all(within(c, 11000 / 3) for c in per.values())
    assert {a[2] for a in arr} == {50 * MS}
    # each instance on its own process: same total rate, 1/n each
    wi = make({**spec, "independent": True}, n=3, end=20.0)
    ti = np.array([a[0] for a in drain(wi)])
    assert within(((ti // S) % 2 == 0).sum(), 10 * 1000) and within(((ti // S) % 2 == 1).sum(), 1000)


@pytest.mark.parametrize("periods", ["exponential", "fixed"])
def test_a_random_start_is_a_random_instant_of_the_on_off_process(periods):
    """``start = "random"``: time 0 is on with probability on / (on + off) and what is
    left of its period is as long as the process makes it (exponential: a whole period
    again; fixed: half of one on average). With exponential periods it started on 39 %
    of the time with 7.1 s left of a 10 s mean, ~12 % more load in a 20 s run."""
    onoff = OnOff(on_s=10.0, off_s=20.0, periods=periods)
    rng = np.random.default_rng(11)
    firsts = [onoff.first(rng) for _ in range(20_000)]
    on_left = [n / S for on, n in firsts if on]
    assert abs(len(on_left) / len(firsts) - 1 / 3) < 0.01, len(on_left) / len(firsts)
    want = 10.0 if periods == "exponential" else 5.0
    assert abs(np.mean(on_left) - want) < 0.3, np.mean(on_left)


def test_bursty_exponential_periods_have_the_configured_means():
    onoff = OnOff(on_s=2.0, off_s=6.0)
    rng = np.random.default_rng(3)
    periods = list(onoff.schedule(rng, 0, 40_000 * S))
    on = [b - a for a, b, s in periods[1:] if s]
    off = [b - a for a, b, s in periods[1:] if not s]
    assert all(periods[i][1] == periods[i + 1][0] for i in range(len(periods) - 1))
    assert all(periods[i][2] != periods[i + 1][2] for i in range(len(periods) - 1))
    assert abs(np.mean(on) / S - 2.0) < 0.15 and abs(np.mean(off) / S - 6.0) < 0.45
    # off periods are idle (rate_rps 0), arrivals only inside on periods
    w = make({"kind": "bursty", "burst_rps": 200, "on_s": 0.5, "off_s": 1.5}, n=2, end=200.0)
    arr = drain(w)
    starts = np.array([a for a, _ in w.on_periods])
    ends = np.array([b for _, b in w.on_periods])
    t = np.array([a[0] for a in arr])
    i = np.searchsorted(starts, t, side="right") - 1
    assert (i >= 0).all() and (t < ends[i]).all()
    on_time = sum(min(b, 200 * S) - a for a, b in w.on_periods) / S
    assert within(len(arr), 200 * on_time)


def test_bursty_periods_do_not_depend_on_the_rates():
    """At one seed, the on/off schedule is the same whatever the rates (a sweep over
    burst_rps compares rates, not bursts): drawn from the arrivals' stream, its periods
    after the first followed how many arrivals each drew (burst_rps 400: 25.2 s of
    bursts in 60 s; 401: 34.6 s)."""
    schedules = []
    for rate in (400, 401, 800):
        w = make({"kind": "bursty", "on_s": 1, "off_s": 2, "burst_rps": rate}, n=4,
                 end=60.0, seed=11)
        arr = drain(w)
        assert within(len(arr), rate * sum(min(b, 60 * S) - a for a, b in w.on_periods) / S)
        schedules.append(w.on_periods)
    assert len(schedules[0]) > 10 and schedules[0] == schedules[1] == schedules[2]


def test_independent_bursts_of_many_instances_hold_little_before_the_first_arrival():
    """1,000 instances on their own on/off processes, 200,000 r/s in bursts of 10 s: the
    first arrival is read holding a few MiB. Each instance's process drew ``CHUNK``
    arrivals at a time, and the merge of them all held every instance's first chunk
    (~113 MiB here; ~3 GB at 10,000 instances and 10^6 r/s)."""
    import tracemalloc

    tracemalloc.start()
    try:
        w = make({"kind": "bursty", "burst_rps": 200_000, "on_s": 10, "off_s": 10,
                  "independent": True, "start": "on"}, n=1_000, end=20.0)
        assert w.next_arrival() is not None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak


def test_bursty_keeps_a_bounded_record_of_its_periods():
    """``on_periods`` holds the first ``ON_PERIODS_KEPT`` (it held every one: 500,000 in
    10 s of 10 us periods)."""
    from clockwork.workloads.named import ON_PERIODS_KEPT

    w = make({"kind": "bursty", "burst_rps": 1, "on_s": 2e-5, "off_s": 2e-5,
              "periods": "fixed", "start": "on"}, n=1, end=1.0)
    drain(w)
    assert len(w.on_periods) == ON_PERIODS_KEPT
    assert w.on_periods[:2] == [(0, 20_000), (40_000, 60_000)]


@pytest.mark.parametrize("bad, key", [
    ({"on_s": 1, "off_s": 1}, "burst_rps"),
    ({"burst_rps": 10, "on_s": 0, "off_s": 1}, "on_s"),
    ({"burst_rps": 10, "on_s": 1, "off_s": 1, "periods": "gamma"}, "periods"),
    ({"burst_rps": 10, "on_s": 1, "off_s": 1, "start": "late"}, "start"),
    ({"burst_rps": 10, "on_s": 1, "off_s": 1, "rate_rps": -1}, "rate_rps"),
    ({"burst_rps": 10, "on_s": 1, "off_s": 1, "independent": 1}, "independent"),
    ({"burst_rps": 10, "on_s": 1, "off_s": 1, "concurrency": 2}, "concurrency"),
])
def test_bursty_rejects_bad_parameters(bad, key):
    with pytest.raises(WorkloadError, match=key):
        build_workload({"kind": "bursty", **bad}, instances(2))


# ---------------------------------------------------------------- bursty_closed_loop


def test_bursty_closed_loop_keeps_concurrency_in_bursts_and_idles_between():
    w = make({"kind": "bursty_closed_loop", "concurrency": 3, "on_s": 0.1, "off_s": 0.2,
              "periods": "fixed", "start": "on", "slo_ms": 100}, n=2, end=3.0)
    subs, peak = drive(w, service_ns=10 * MS)
    assert peak == Counter({m: 3 for m in w.models})
    for m in w.models:
        t = sorted(a[0] for a in subs if a[1] == m)
        # bursts of 10 rounds of 3 (10 ms service in a 100 ms burst), then 200 ms idle
        # after the last answer (at 100 ms): the next burst begins at 300 ms, and so on
        bursts = [t[i:i + 30] for i in range(0, len(t), 30)]
        assert len(bursts) == 10
        for j, b in enumerate(bursts):
            assert b[0] == j * 300 * MS and b[-1] == j * 300 * MS + 90 * MS
    assert {a[2] for a in subs} == {100 * MS}


def test_bursty_closed_loop_never_exceeds_concurrency_with_random_periods_and_failures():
    w = make({"kind": "bursty_closed_loop", "concurrency": 4, "on_s": 0.05, "off_s": 0.05,
              "retry_ms": 2}, n=5, end=20.0, seed=7)
    subs, peak = drive(w, service_ns=3 * MS, fail_every=7)
    assert max(peak.values()) == 4 and set(peak) == set(w.models)
    assert all(w.outstanding[m] == 0 for m in w.models)


# ---------------------------------------------------------------- slo_exp_2


def test_slo_exp_2_background_closed_loop_and_stepped_foreground():
    w = make({"kind": "slo_exp_2", "foreground": 2, "foreground_rps": 100, "period_s": 2,
              "slo_factor_max": 10, "background_concurrency": 3, "background_slo_ms": 1000,
              "background_delay_s": 1}, n=6, end=60.0)
    fg, bg = w.models, w.background
    assert fg == ["resnet50_v2", "resnet50_v2:1"] and len(bg) == 4
    subs, peak = drive(w, service_ns=4 * MS)
    # 1.5**5 = 7.6 <= 10 < 1.5**6: six 2-s periods, the run ends at 12 s
    assert w.stop == 12 * S and max(a[0] for a in subs) < 12 * S
    f = [a for a in subs if a[1] in fg]
    b = [a for a in subs if a[1] in bg]
    assert within(len(f), 1200)
    for t, m, slo in f:
        assert slo == round(1.5 ** (t // (2 * S)) * w.exec1[m])
    assert {m for _, m, _ in b} == set(bg) and {s for *_, s in b} == {1000 * MS}
    assert min(a[0] for a in b) == 1 * S
    assert {peak[m] for m in bg} == {3}
    # closed loop: 3 outstanding, 4 ms each, from 1 s to 12 s
    assert all(abs(sum(1 for a in b if a[1] == m) - 3 * 11_000 / 4) <= 3 for m in bg)


def test_a_models_first_copy_can_be_selected_alone():
    """The first copy is named as the model, which selects every copy: ``NAME:0`` names
    it alone (an error before: no instance matched), also as an ``slo_exp_2`` foreground
    beside the other copies as background."""
    from clockwork.workloads.base import select_instances

    inst = instances(4)
    assert select_instances("resnet50_v2:0", inst) == ["resnet50_v2"]
    assert select_instances(["resnet50_v2:0", "resnet50_v2:2"], inst) == ["resnet50_v2",
                                                                        "resnet50_v2:2"]
    assert select_instances("resnet50_v2", inst) == list(inst)
    w = build_workload({"kind": "slo_exp_2", "foreground": "resnet50_v2:0",
                        "background": "resnet50_v2:*"}, inst)
    assert w.models == ["resnet50_v2"] and w.background == list(inst)[1:]
    with pytest.raises(WorkloadError, match="matches no model instance"):
        select_instances("resnet50_v2:4", inst)


def test_slo_exp_2_selectors_and_errors():
    inst = {**instances(2, "resnet18_v2"), **instances(3, "resnet50_v2")}
    w = build_workload({"kind": "slo_exp_2", "foreground": "resnet18_v2",
                        "background": "resnet50_v2:*"}, inst)
    assert w.models == ["resnet18_v2", "resnet18_v2:1"]
    assert w.background == ["resnet50_v2:1", "resnet50_v2:2"]
    w = build_workload({"kind": "slo_exp_2", "foreground": 1, "background": 0}, inst)
    assert w.models == ["resnet18_v2"] and w.background == [] and w.initial(0) == []
    for bad, key in [({}, "foreground"), ({"foreground": 9}, "foreground"),
                     ({"foreground": "vgg16"}, "foreground"),
                     ({"foreground": 2, "background": "resnet18_v2"}, "share"),
                     ({"foreground": 1, "background_concurrency": 0}, "concurrency"),
                     ({"foreground": 1, "background_slo_ms": -5}, "background_slo_ms"),
                     ({"foreground": 1, "background_delay_s": -1}, "background_delay_s")]:
        with pytest.raises(WorkloadError, match=key):
            build_workload({"kind": "slo_exp_2", **bad}, inst)


# ---------------------------------------------------------------- bursty_experiment


def test_bursty_experiment_activates_one_major_per_second_minor_steady():
    w = make({"kind": "bursty_experiment", "major_start_s": 5, "slo_ms": 100}, n=31, end=40.0)
    assert w.minor == ["resnet50_v2"] and len(w.major) == 30
    arr = drain(w)
    majors_in = defaultdict(set)
    minor_per_5s = Counter()
    for t, m, slo in arr:
        assert slo == 100 * MS
        if m in w.minor:
            minor_per_5s[t // (5 * S)] += 1
        else:
            majors_in[t // S].add(m)
            assert w.major.index(m) < w.active_majors(t)
    assert all(s >= 5 for s in majors_in)
    for s in range(5, 40):
        k = min(30, s - 5 + 1)
        assert majors_in[s] == set(w.major[:k]), s
        assert w.active_majors(s * S) == k
    assert all(within(minor_per_5s[i], 1000) for i in range(8))
    n_major = sum(1 for a in arr if a[1] in w.major)
    assert within(n_major, 35 * 1000)


def test_bursty_experiment_selectors_and_paper_default():
    inst = {**instances(1, "resnet18_v2"), **instances(4, "resnet50_v2")}
    w = build_workload({"kind": "bursty_experiment", "minor": "resnet18_v2"}, inst)
    assert w.minor == ["resnet18_v2"] and w.major == list(instances(4))
    assert w.major_start == 900 * S and w.every == S
    with pytest.raises(WorkloadError, match="major"):
        build_workload({"kind": "bursty_experiment"}, instances(1))
    with pytest.raises(WorkloadError, match="activate_every_s"):
        build_workload({"kind": "bursty_experiment", "activate_every_s": 0}, inst)


# ---------------------------------------------------------------- azure_scalability


@pytest.fixture(scope="module")
def flat_trace(tmp_path_factory):
    counts = np.zeros((20, MINUTES), np.uint32)
    counts[:, :10] = 300  # 20 functions x 300 per minute = 100 r/s at load factor 1
    ids = np.array([f"{i:064x}" for i in range(20)])
    tr = AzureTrace(ids, ids, ids, np.array(["http"] * 20), counts, 0, "test")
    return str(tr.save(tmp_path_factory.mktemp("trace") / "flat.csv"))


@pytest.mark.parametrize("period", [20.0, 25.0])
def test_azure_scalability_ramps_the_load_factor(flat_trace, period):
    spec = {"kind": "azure_scalability", "trace": flat_trace, "minutes": 10,
            "load_factor_start": 1.0, "load_factor_step": 2.0, "step_period_s": period,
            "load_factor_max": 8, "slo_ms": 100}
    w = make(spec, n=5, end=600.0)
    arr = drain(w)
    p = round(period * S)
    assert w.end == 4 * p and arr[-1][0] < 4 * p  # 16 > 8 ends the run
    got = np.bincount(np.array([a[0] for a in arr]) // p, minlength=4)
    for k in range(4):
        assert within(got[k], 100 * period * 2**k), (k, got)
    assert [w.load_factor_at(k * p) for k in range(4)] == [1, 2, 4, 8]
    assert {a[2] for a in arr} == {100 * MS}


def test_azure_scalability_worker_units_and_errors(flat_trace):
    w = make({"kind": "azure_scalability", "trace": flat_trace, "workers": 8,
              "load_factor_start": 1.0, "load_factor_max": 1.0}, n=2, end=120.0)
    # 8 workers x 0.125 = trace rate x 1; the maximum is reached at once: one period
    assert w.end == 60 * S and w.load_factor_at(0) == 1.0
    assert within(len(drain(w)), 6000)
    for bad, key in [({"load_factor": 2}, "load_factor"), ({"step_op": "exp"}, "step_op"),
                     ({"load_factor_step": -1}, "load_factor_step"),
                     ({"arrivals": "gamma"}, "Poisson"), ({"workers": 0}, "workers")]:
        with pytest.raises(WorkloadError, match=key):
            build_workload({"kind": "azure_scalability", "trace": flat_trace, **bad},
                           instances(2))


def test_azure_kinds_take_no_booleans_or_strings_for_numbers(flat_trace):
    for kind in ("azure", "azure_scalability"):
        for bad, key in [({"interval_s": True}, "interval_s"), ({"cv": True}, "cv"),
                         ({"top": True}, "top"), ({"randomise_start": 1}, "randomise_start"),
                         ({"mapping": 3}, "mapping"), ({"minutes": "2"}, "minutes")]:
            with pytest.raises(WorkloadError, match=key):
                build_workload({"kind": kind, "trace": flat_trace, **bad}, instances(2))
    with pytest.raises(WorkloadError, match="load_factor"):
        build_workload({"kind": "azure", "trace": flat_trace, "load_factor": "2"},
                       instances(2))


def test_stepped_and_tiny_slos_stay_within_what_they_mean():
    """An SLO that rounds to 0 ns is 1 ns (0 would mean the controller's default); a
    stepped SLO that grows without a maximum stops at a day, even past a float's range."""
    from clockwork.time import MAX_SLO_MS, ms

    w = make({"kind": "poisson", "rate_rps": 50, "slo_ms": 4e-7}, end=1.0)
    assert {a[2] for a in drain(w)} == {1}
    w = make({"kind": "poisson", "rate_rps": 50, "slo_factor": 1e-12}, end=1.0)
    assert {a[2] for a in drain(w)} == {1}
    down = make({"kind": "slo_exp_1", "rate_rps": 50, "slo_ms_start": 100, "factor": 0.5,
                 "period_s": 0.1}, end=4.0)
    assert min(a[2] for a in drain(down)) == 1  # halved 40 times: below 1 ns, kept at 1
    up = make({"kind": "slo_exp_1", "rate_rps": 5, "slo_ms_start": 5, "factor": 1e10,
               "period_s": 0.1}, end=100.0)
    slos = [a[2] for a in drain(up)]
    assert max(slos) == ms(MAX_SLO_MS) and slos[-1] == ms(MAX_SLO_MS)  # (1e10^k: inf soon)


def test_tiny_rates_send_nothing_rather_than_wrap_around():
    for spec in ({"kind": "poisson", "rate_rps": 1e-300},
                 {"kind": "bursty", "burst_rps": 1e-300, "on_s": 1, "off_s": 1}):
        assert drain(make(spec, end=2.0)) == [], spec
    # fixed spacing sends its first at the start; the next is ~300 years later
    assert [a[0] for a in drain(make({"kind": "fixed_rate", "rate_rps": 1e-10}, end=2.0))] == [0]


# ---------------------------------------------------------------- through the simulator


def _scenario(workload: dict, copies: int, duration: float) -> dict:
    return {"seed": 2, "duration_s": duration,
            "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "v100-reference"},
            "models": [{"name": "resnet50_v2", "copies": copies}], "workloads": [workload]}


def _max_concurrent(rows, models) -> dict[str, int]:
    col = {c: i for i, c in enumerate(REQUEST_COLUMNS)}
    ev = defaultdict(list)
    for r in rows:
        ev[r[col["model"]]].append((r[col["arrival"]], 1))
        ev[r[col["model"]]].append((r[col["arrival"]] + r[col["latency"]], -1))
    out = {}
    for m in models:
        cur = top = 0
        for _t, d in sorted(ev[m]):  # answers (-1) before sends at the same time
            cur += d
            top = max(top, cur)
        out[m] = top
    return out


@pytest.mark.parametrize("workload, copies, limit", [
    ({"kind": "bursty_closed_loop", "concurrency": 4, "on_s": 0.2, "off_s": 0.2}, 3, 4),
    ({"kind": "slo_exp_2", "foreground": 1, "foreground_rps": 100, "period_s": 0.5,
      "background_concurrency": 5, "background_delay_s": 0.2}, 4, 5),
])
def test_closed_loops_in_the_simulator_stay_within_concurrency(workload, copies, limit):
    res = simulate(_scenario(workload, copies, 2.0))
    s = res.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"] > 0
    models = list(instances(copies))
    if workload["kind"] == "slo_exp_2":
        models = models[1:]
    peak = _max_concurrent(res.telemetry.requests, models)
    assert max(peak.values()) == limit, peak


@pytest.mark.parametrize("rate, seconds", [(7, 3.0), (10_000, 2.0)])
def test_fixed_rate_sends_rate_times_duration_evenly_from_the_start(rate, seconds):
    # 10,000 r/s for 2 s spans several refills of the arrival buffer
    w = make({"kind": "fixed_rate", "rate_rps": rate}, n=3, end=seconds, start=5 * S)
    arr = drain(w)
    assert len(arr) == round(rate * seconds)
    assert [t for t, _m, _s in arr] == [5 * S + int(k * S / rate) for k in range(len(arr))]
    assert [m for _t, m, _s in arr[:6]] == list(w.models) * 2


@pytest.mark.parametrize("spec, words", [
    ({"kind": "closed_loop", "concurrency": 2.7}, "concurrency must be an integer, got 2.7"),
    ({"kind": "closed_loop", "think_ms": "5"}, "think_ms must be a finite number"),
    ({"kind": "poisson", "rate_rps": True}, "rate_rps must be a finite number, got True"),
    ({"kind": "fixed_rate", "rate_rps": float("nan")}, "rate_rps must be a finite number"),
])
def test_the_basic_kinds_types_are_as_strict_as_the_others(spec, words):
    """closed_loop, poisson and fixed_rate built directly (a Python caller; a scenario
    file's values are checked before) take no value of the wrong type (concurrency 2.7
    was 2, rate_rps true 1.0), as every other kind."""
    with pytest.raises(WorkloadError, match=words):
        build_workload(spec, {"m": "m"})


def test_an_slo_factor_of_a_slow_models_exec_is_at_most_a_day():
    """slo_factor x a model's batch-1 EXEC past a day (the most the controller takes):
    the simulator served such requests, the live controller refused them (bad_slo); the
    SLO is now a day, as the stepped SLOs' already are."""
    from clockwork.time import MAX_SLO_NS
    from clockwork.workloads.base import SloSpec

    assert SloSpec(slo_factor=10_000).resolve("slow", {"slow": 10**10}) == MAX_SLO_NS
    assert SloSpec(slo_factor=2).resolve("m", {"m": 10**6}) == 2 * 10**6
