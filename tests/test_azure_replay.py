"""The ``azure`` workload: mapping, arrival processes, laziness, limits, scenario entry."""

from __future__ import annotations

import numpy as np
import pytest

from clockwork.cluster.sim import simulate
from clockwork.workloads import WorkloadError, build_workload
from clockwork.workloads.azure import MINUTES, AzureTrace
from clockwork.workloads.azure_replay import AzureReplay, map_functions
from clockwork.workloads.base import SloSpec
from clockwork.workloads.synth import generate

S = 1_000_000_000


def _trace(counts) -> AzureTrace:
    counts = np.asarray(counts, dtype=np.uint32)
    n = len(counts)
    full = np.zeros((n, MINUTES), np.uint32)
    full[:, :counts.shape[1]] = counts
    ids = np.array([f"{i:064x}" for i in range(n)])
    return AzureTrace(ids, ids, ids, np.array(["http"] * n), full, 0, "test")


def _drain(w: AzureReplay, start=0, end=10**15, seed=1, exec1=None):
    w.bind(start, end, np.random.default_rng(seed), exec1 or {})
    out = []
    while (a := w.next_arrival()) is not None:
        out.append(a)
    return out


def _per_minute(arrivals, interval_ns, minutes, start=0):
    t = np.array([a[0] for a in arrivals], dtype=np.int64)
    return np.bincount((t - start) // interval_ns, minlength=minutes)[:minutes]


@pytest.fixture(scope="module")
def synthetic() -> AzureTrace:
    return generate(300, seed=5)[0]


def test_mapping_rules():
    assert map_functions(10, 5, "contiguous").tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert map_functions(10, 4, "stripe").tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert map_functions(3, 6, "contiguous").tolist() == [0, 2, 4]
    with pytest.raises(WorkloadError):
        map_functions(3, 2, "random")


def test_uniform_matches_trace_per_minute_exactly(synthetic):
    models = [f"m{i}" for i in range(synthetic.n_functions)]
    w = AzureReplay(models, synthetic, start_minute=600, minutes=20, interval_s=1.0,
                    arrivals="uniform", mapping="stripe")
    arr = _drain(w, start=5 * S)
    t = [a[0] for a in arr]
    assert t == sorted(t) and t[0] >= 5 * S and t[-1] < 25 * S
    got = _per_minute(arr, S, 20, start=5 * S)
    np.testing.assert_array_equal(got, synthetic.counts[:, 600:620].sum(axis=0))
    # per function (stripe with as many instances as functions: instance = rank)
    order = synthetic.rank_order()
    per_inst = {m: 0 for m in models}
    for _, m, _ in arr:
        per_inst[m] += 1
    want = synthetic.counts[order, 600:620].sum(axis=1)
    assert [per_inst[m] for m in models] == want.tolist()


def test_uniform_load_factor_keeps_fractions():
    tr = _trace([[1, 1, 1, 1, 1, 1, 1, 1], [3, 3, 3, 3, 3, 3, 3, 3]])
    w = AzureReplay(["a", "b"], tr, minutes=8, interval_s=1.0, arrivals="uniform",
                    load_factor=0.5, mapping="stripe")
    arr = _drain(w)  # the busier function ranks first, so it goes to "a"
    assert sum(1 for a in arr if a[1] == "a") == 12   # 8 * 1.5, nothing lost to rounding
    assert sum(1 for a in arr if a[1] == "b") == 4
    gaps = np.diff([a[0] for a in arr if a[1] == "a"])
    assert gaps.max() <= S  # evenly spread


def test_poisson_counts_within_sampling_error(synthetic):
    w = AzureReplay(["x", "y", "z"], synthetic, start_minute=700, minutes=60, interval_s=0.5)
    arr = _drain(w)
    want = synthetic.counts[:, 700:760].sum(axis=0).astype(np.float64)
    got = _per_minute(arr, S // 2, 60)
    assert abs(got.sum() - want.sum()) < 4 * np.sqrt(want.sum())
    chi2 = float((((got - want) ** 2) / want).sum())
    assert chi2 < 60 + 5 * np.sqrt(2 * 60)   # chi-square, 60 dof, far tail
    t = np.array([a[0] for a in arr])
    assert np.all(np.diff(t) >= 0)


def test_poisson_load_factor_scales_rate():
    tr = _trace(np.full((4, 30), 200))
    w = AzureReplay(["a"], tr, minutes=30, interval_s=1.0, load_factor=2.5)
    n = len(_drain(w))
    assert abs(n - 4 * 30 * 200 * 2.5) < 4 * np.sqrt(60000)
    assert w.mean_rate_rps() == pytest.approx(2000.0)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_mean_rate_and_cv(cv):
    tr = _trace(np.full((1, 300), 120))  # 120 per 1-s "minute" for 300 s
    w = AzureReplay(["a"], tr, minutes=300, interval_s=1.0, arrivals="gamma", cv=cv)
    t = np.array([a[0] for a in _drain(w, seed=3)], dtype=np.float64)
    gaps = np.diff(t)
    assert abs(len(t) - 36000) < 6 * cv * np.sqrt(36000) + 10
    assert gaps.mean() == pytest.approx(S / 120, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_gamma_follows_changing_counts():
    counts = np.zeros((2, 40), int)
    counts[0, :20] = 50
    counts[0, 20:] = 500
    counts[1, ::2] = 30
    w = AzureReplay(["a", "b"], _trace(counts), minutes=40, interval_s=1.0, arrivals="gamma",
                    cv=3.0, mapping="stripe")
    arr = _drain(w, seed=2)
    a = _per_minute([x for x in arr if x[1] == "a"], S, 40)
    b = _per_minute([x for x in arr if x[1] == "b"], S, 40)
    assert abs(a[20:].sum() - 10000) < 6 * 3 * np.sqrt(10000)
    assert abs(a[:20].sum() - 1000) < 6 * 3 * np.sqrt(1000) + 20
    assert b[1::2].sum() == 0                  # silent minutes stay silent


def test_contiguous_buckets_by_daily_total():
    counts = np.array([[1] * 5, [9] * 5, [4] * 5, [7] * 5])  # ranks: f1, f3, f2, f0
    w = AzureReplay(["p", "q"], _trace(counts), minutes=5, interval_s=1.0, arrivals="uniform")
    arr = _drain(w)
    n = {m: sum(1 for a in arr if a[1] == m) for m in ("p", "q")}
    assert n == {"p": 5 * (9 + 7), "q": 5 * (4 + 1)}
    w = AzureReplay(["p", "q"], _trace(counts), minutes=5, interval_s=1.0, arrivals="uniform",
                    mapping="stripe")
    arr = _drain(w)
    assert sum(1 for a in arr if a[1] == "p") == 5 * (9 + 4)


def test_rank_uses_whole_day_not_window():
    counts = np.zeros((2, MINUTES), int)
    counts[0, 0] = 1
    counts[0, 100:] = 5       # busiest over the day, quiet in minute 0
    counts[1, 0] = 50
    w = AzureReplay(["hot", "cold"], _trace(counts), minutes=1, interval_s=1.0,
                    arrivals="uniform")
    arr = _drain(w)
    assert sum(1 for a in arr if a[1] == "hot") == 1
    assert sum(1 for a in arr if a[1] == "cold") == 50


def test_top_keeps_busiest_functions(synthetic):
    w = AzureReplay(["a"], synthetic, minutes=30, interval_s=1.0, arrivals="uniform", top=10)
    arr = _drain(w)
    best = synthetic.rank_order()[:10]
    assert len(arr) == synthetic.counts[best, :30].sum()


def test_what_a_replay_does_otherwise_than_its_settings_say_is_noted(synthetic, tmp_path):
    """A ``top`` past the trace's functions, and rows that repeat another's ids (files
    joined: each is replayed as a function of its own), are said before the run, by the
    simulator as warnings and by ``clockwork trace info``; a plain replay says nothing."""
    assert AzureReplay(["a"], synthetic, top=300).notes == []
    w = AzureReplay(["a"], synthetic, top=301)
    assert w.notes == ["top = 301, but the trace holds 300 function(s): every one is replayed"]
    assert synthetic.repeated_ids() == 0
    quiet = synthetic.rank_order()[-2:]  # (repeated: the quietest rows, twice and once)
    twice = synthetic.select(np.r_[np.arange(300), [quiet[0], quiet[0], quiet[1]]])
    assert twice.repeated_ids() == 3
    assert "3 of the trace's rows replayed repeat the owner, app, function and trigger" \
        in AzureReplay(["a"], twice).notes[0]
    # (among the functions replayed: the busiest 10 hold none of the repeated rows)
    assert AzureReplay(["a"], twice, top=10).notes == []
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario
    from clockwork.workloads.trace_cli import format_info

    path = twice.save(tmp_path / "joined.csv")
    assert "; 3 row(s) repeat the ids of a row before them" in format_info(AzureTrace.load(path))
    sim = Simulation(load_scenario(data={
        "duration_s": 1.0, "cluster": {"workers": 1, "gpus_per_worker": 1},
        "models": [{"name": "resnet50_v2"}],
        "workloads": [{"kind": "azure", "trace": str(path), "minutes": 1, "interval_s": 1.0,
                       "top": 1000}]}))
    assert [w for w in sim.warnings if "workloads.0 (azure)" in w] == [
        "warning: workloads.0 (azure): top = 1,000, but the trace holds 303 function(s): "
        "every one is replayed",
        "warning: workloads.0 (azure): 3 of the trace's rows replayed repeat the owner, app, "
        "function and trigger of a row before them (files joined, or an extract cut wrong?): each row "
        "is replayed as a function of its own"]


def test_stops_at_end_and_at_window_end(synthetic):
    w = AzureReplay(["a"], synthetic, minutes=10, interval_s=1.0, arrivals="uniform")
    arr = _drain(w, start=2 * S, end=int(6.5 * S))
    assert arr and max(a[0] for a in arr) < 6.5 * S
    assert w._minute <= 5 and w._done  # nothing generated past the end
    w = AzureReplay(["a"], synthetic, minutes=10, interval_s=1.0, arrivals="uniform")
    arr = _drain(w, start=0, end=1000 * S)
    assert max(a[0] for a in arr) < 10 * S
    assert len(arr) == synthetic.counts[:, :10].sum()


def test_generated_lazily_minute_by_minute(synthetic):
    w = AzureReplay(["a"], synthetic, minutes=60, interval_s=60.0)
    w.bind(0, 3600 * S, np.random.default_rng(0), {})
    first = w.next_arrival()
    assert first is not None and w._minute == 1
    assert len(w._buf) < synthetic.counts[:, 0].sum() * 1.5


def test_randomise_start(synthetic):
    w = AzureReplay(["a"], synthetic, minutes=5, interval_s=10.0, arrivals="uniform",
                    randomise_start=True)
    arr = _drain(w, start=S, seed=9)
    off = w._offset
    assert 0 < off < 10 * S
    t = [a[0] for a in arr]
    assert t[0] >= S and t[-1] < S + 50 * S - off
    assert len(arr) < synthetic.counts[:, :5].sum()   # the part before the offset is skipped
    assert len(arr) >= synthetic.counts[:, 1:5].sum()


def test_slo_and_determinism(synthetic):
    w = AzureReplay(["a", "b"], synthetic, minutes=3, interval_s=1.0, slo=SloSpec(slo_ms=25))
    arr = _drain(w, seed=4)
    assert {a[2] for a in arr} == {25_000_000}
    w2 = AzureReplay(["a", "b"], synthetic, minutes=3, interval_s=1.0, slo=SloSpec(slo_ms=25))
    assert _drain(w2, seed=4) == arr
    w3 = AzureReplay(["a", "b"], synthetic, minutes=3, interval_s=1.0,
                     slo=SloSpec(slo_factor=10))
    arr = _drain(w3, exec1={"a": 2_000_000, "b": 3_000_000})
    assert {a[2] for a in arr} == {20_000_000, 30_000_000}


def test_parameter_errors(synthetic):
    for kw in [dict(interval_s=0), dict(load_factor=0), dict(arrivals="bursty"),
               dict(cv=2.0), dict(arrivals="gamma", cv=0), dict(mapping="x"),
               dict(minutes=2000), dict(start_minute=1440), dict(randomise_start="yes"),
               dict(top=0)]:
        with pytest.raises(WorkloadError):
            AzureReplay(["a"], synthetic, **kw)


# ------------------------------------------------------------------ scenario entry

@pytest.fixture
def trace_file(tmp_path, synthetic):
    return synthetic.save(tmp_path / "invocations_per_function_md.anon.d01.csv")


INSTANCES = {"resnet50_v2": "resnet50_v2", "resnet50_v2:1": "resnet50_v2",
             "resnet18_v2": "resnet18_v2"}


def test_build_from_spec(trace_file, tmp_path, monkeypatch):
    w = build_workload({"kind": "azure", "trace": str(trace_file), "minutes": 5,
                        "interval_s": 2.0, "load_factor": 0.5, "mapping": "stripe",
                        "slo_ms": 50, "arrivals": "gamma", "cv": 2.0}, INSTANCES)
    assert isinstance(w, AzureReplay) and w.models == list(INSTANCES)
    assert w.interval == 2 * S and w.arrivals == "gamma"
    monkeypatch.setenv("AZURE_TRACE_DIR", str(tmp_path))
    w = build_workload({"kind": "azure", "day": 1, "models": "resnet50_v2"}, INSTANCES)
    assert w.models == ["resnet50_v2", "resnet50_v2:1"] and w.minutes == MINUTES


@pytest.mark.parametrize("spec, words", [
    ({}, "exactly one of trace"),
    ({"trace": "x.csv", "day": 1}, "exactly one of trace"),
    ({"trace": "no/such/file.csv"}, "not found"),
    ({"day": 13}, "README"),
    ({"trace": "T", "rate_rps": 3}, "unknown setting 'rate_rps'"),
    ({"trace": "T", "start_minute": 1.5}, "integer"),
    ({"trace": "T", "start_minute": 2000}, "start_minute"),
    ({"trace": "T", "mapping": "round"}, "mapping"),
    # trace_dir is where day files are looked up: with a trace it was ignored, no word
    ({"trace": "T", "trace_dir": "/nonexistent/dir"}, "trace_dir goes with day"),
])
def test_spec_errors(trace_file, monkeypatch, tmp_path, spec, words):
    monkeypatch.setenv("AZURE_TRACE_DIR", str(tmp_path))
    spec = {k: (str(trace_file) if v == "T" else v) for k, v in spec.items()}
    with pytest.raises(WorkloadError, match=words):
        build_workload({"kind": "azure", **spec}, INSTANCES)


def test_malformed_trace_reported_through_workload(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("HashOwner,HashApp,HashFunction,Trigger\n")
    with pytest.raises(WorkloadError, match=r"azure workload: .*bad\.csv:1"):
        build_workload({"kind": "azure", "trace": str(bad)}, INSTANCES)


def test_simulated_end_to_end(trace_file):
    scenario = {
        "seed": 3, "duration_s": 20.0,  # ~200 r/s offered
        "models": [{"name": "resnet50_v2", "copies": 8}, {"name": "resnet18_v2", "copies": 4}],
        "workloads": [{"kind": "azure", "trace": str(trace_file), "start_minute": 720,
                       "minutes": 4, "interval_s": 5.0, "load_factor": 0.1, "slo_ms": 100}],
    }
    a = simulate(scenario).summary
    assert 3000 < a["submitted"] < 5000
    assert a["submitted"] == a["succeeded"] + a["failed"] + a["dropped"]
    assert a["slo_attainment"] > 0.5
    assert simulate(scenario).summary == a


@pytest.mark.parametrize("minutes,said", [(4, False), (3, True)])
def test_trace_minutes_shorter_than_the_run_are_said(trace_file, minutes, said):
    """Trace minutes that end before ``duration_s`` (no arrivals after, while goodput
    counts the whole run) are said in a warning naming where they end; minutes that
    fill the run (here 4 x 5 s = 20 s), nothing (a ``randomise_start`` offset, which ends
    them up to a minute early by design, not counted)."""
    import warnings

    from clockwork.cluster.sim import SimulationWarning

    scenario = {
        "seed": 3, "duration_s": 20.0,
        "models": [{"name": "resnet50_v2", "copies": 2}],
        "workloads": [{"kind": "azure", "trace": str(trace_file), "start_minute": 720,
                       "minutes": minutes, "interval_s": 5.0, "load_factor": 0.01,
                       "randomise_start": True}],
    }
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        res = simulate(scenario)
    said_here = [str(w.message) for w in got if issubclass(w.category, SimulationWarning)]
    line = ("workloads.0 (azure): its 3 trace minute(s) end at 15 s, before duration_s = "
            "20 s: no arrivals after, and goodput and throughput are over the whole run")
    assert said_here == ([line] if said else []), said_here
    assert [x for x in res.warnings if "trace minute" in x] == (
        [f"warning: {line}"] if said else [])
