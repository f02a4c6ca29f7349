"""Property tests over random small scenarios: every request answered exactly once,
no success past its deadline without misprediction, pages within capacity, and
determinism per seed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clockwork.actions import RequestStatus
from clockwork.cluster.sim import simulate

MODELS = ["resnet50_v2", "resnet18_v2", "mobilenet_v2", "resnet152_v2"]


@st.composite
def scenarios(draw):
    n_models = draw(st.integers(1, 3))
    models = [{"name": MODELS[i], "copies": draw(st.integers(1, 6))} for i in range(n_models)]
    workloads = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["poisson", "closed_loop", "fixed_rate"]))
        w = {"kind": kind, "models": draw(st.sampled_from([m["name"] for m in models] + ["*"]))}
        if kind == "closed_loop":
            w["concurrency"] = draw(st.integers(1, 8))
        else:
            w["rate_rps"] = draw(st.floats(5, 1500))
        if draw(st.booleans()):
            w["slo_ms"] = draw(st.floats(3, 300))
        workloads.append(w)
    return {
        "seed": draw(st.integers(0, 2**31)),
        "duration_s": draw(st.floats(0.2, 2.0)),
        "cluster": {
            "workers": draw(st.integers(1, 2)),
            "gpus_per_worker": draw(st.integers(1, 2)),
            "profiles": "v100-reference",
            "weights_cache_pages": draw(st.integers(8, 60)),
            "network_latency_ms": draw(st.floats(0, 2)),
            "jitter_ms": draw(st.floats(0, 1)),
            "noise": draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        },
        "scheduler": {
            "max_batch": draw(st.sampled_from([1, 4, 16])),
            "schedule_ahead_ms": draw(st.sampled_from([2, 10, 20])),
        },
        "models": models,
        "workloads": workloads,
    }


# (a drawn scenario may submit no requests: simulate warns of it, and the invariants hold)
@pytest.mark.filterwarnings("ignore::clockwork.cluster.sim.SimulationWarning")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants(sc):
    res = simulate(sc)
    s = res.summary
    rows = res.telemetry.requests
    # every request answered exactly once
    assert s["submitted"] == len(rows) == s["succeeded"] + s["failed"] + s["dropped"]
    assert len({r[0] for r in rows}) == len(rows)
    # answers never precede arrivals; met means success within the SLO
    for _rid, _m, arrival, deadline, latency, status, met, *_ in rows:
        assert latency >= 0
        assert met == (status == RequestStatus.SUCCESS and arrival + latency <= deadline)
    # with exact predictions, nothing succeeds late unless the network round trip exceeds
    # the buffer the scheduler keeps off the SLO (5 ms, at most a tenth of the SLO: the
    # scheduler's ``buffer`` setting)
    c = sc["cluster"]
    if c["noise"] == 0:
        rtt = 2e6 * (c["network_latency_ms"] + c["jitter_ms"])
        late = [r for r in rows if r[5] == RequestStatus.SUCCESS and not r[6]
                and min(5e6, (r[3] - r[2]) // 10) > rtt]
        assert late == []
    # the weights cache is never over-committed
    assert s["max_pages_used"] <= s["cache_pages"]


@pytest.mark.filterwarnings("ignore::clockwork.cluster.sim.SimulationWarning")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_deterministic_per_seed(sc):
    a = simulate(sc).summary
    b = simulate(sc).summary
    assert a == b
