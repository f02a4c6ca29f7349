"""The simulator end to end: acceptance set-ups at short durations, determinism,
cold starts, logs and summary keys."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from clockwork.actions import ActionType, RequestStatus
from clockwork.cluster.sim import simulate
from clockwork.profiles import load_profile_set
from clockwork.scenario import ScenarioError, load_scenario
from clockwork.telemetry import REQUEST_COLUMNS
from clockwork.time import ms

_R50 = load_profile_set("v100-reference").get("resnet50_v2")
# the capacity bound that follows from the profile: the best batch size's throughput
CAPACITY = max(b / _R50.exec_ns[b] * 1e9 for b in _R50.batch_sizes)


def base(**kw):
    d = {
        "seed": 3,
        "duration_s": 2.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "v100-reference"},
        "models": [{"name": "resnet50_v2"}],
        "workloads": [{"kind": "poisson", "models": "resnet50_v2", "rate_rps": 200, "slo_ms": 100}],
    }
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return d


def check_conservation(res):
    s = res.summary
    rows = res.telemetry.requests
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == s["submitted"]
    assert s["slo_met"] <= s["succeeded"]


def test_overrides_of_a_loaded_scenario_keep_its_folder(tmp_path):
    """``simulate(Scenario, overrides)``: the scenario's relative paths (here a trace that
    only its folder has) are still looked up in its folder, as the command line does."""
    import shutil

    from clockwork.resources import find_data_path

    shutil.copy(find_data_path("traces/samples/invocations_per_function_md.anon.d01.csv.gz"),
                tmp_path / "only_here.csv.gz")
    (tmp_path / "sc.toml").write_text(
        'duration_s = 2\n[cluster]\nworkers = 1\n[[models]]\nname = "resnet50_v2"\n'
        'copies = 4\n[[workloads]]\nkind = "azure"\ntrace = "only_here.csv.gz"\n'
        "minutes = 2\ninterval_s = 1\n")
    sc = load_scenario(tmp_path / "sc.toml")
    got = simulate(sc, ["duration_s=1"]).summary
    assert got == simulate(str(tmp_path / "sc.toml"), ["duration_s=1"]).summary
    assert got["submitted"] > 0


def test_simulate_takes_one_override_as_a_string_and_names_bad_arguments():
    """``simulate``'s ``overrides`` may be one ``key=value`` string (it was read as a list
    of one-character overrides: "--set 'd': expected key=value"); another type, or no
    scenario at all (``None`` ran the defaults: "<dict>: models: must be at least one
    [[models]] table"), is a ScenarioError naming the parameter and what it takes."""
    one = simulate(base(), "duration_s=0.5").summary
    assert one == simulate(base(), ["duration_s=0.5"]).summary
    assert one["duration_s"] == 0.5
    assert simulate(base(), ("duration_s=0.5",)).summary == one
    for bad in ({"duration_s": 1}, 5, ["duration_s=1", 2]):
        with pytest.raises(ScenarioError, match="simulate: overrides must be None, a "
                           "'key=value' string or a list of them"):
            simulate(base(), bad)
    for bad in (None, 5, ["poisson_warm"]):
        with pytest.raises(ScenarioError, match="simulate: a scenario is needed: a "
                           "scenario file's path, a shipped scenario's name") as e:
            simulate(bad, ["duration_s=1"])
        assert f"got {bad!r}" in str(e.value)
    # TOML text for a path: said so, in one short line (the text was echoed twice)
    toml = "seed = 1\nduration_s = 0.5\n[cluster]\nworkers = 1\n" * 20
    with pytest.raises(ScenarioError, match="got TOML text") as e:
        simulate(toml)
    assert len(str(e.value)) < 200 and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ScenarioError, match="not a file's path"):  # (was an OSError)
        simulate("x" * 5000)
    # a spill_dir that cannot be one, refused as --spill-dir is, before anything is built
    # (FileExistsError, or pathlib's TypeError, from deep inside, after the set-up)
    for bad, said in ((__file__, "exists and is not a folder"), (3, "got 3"),
                      (b"/tmp", "a folder's path")):
        with pytest.raises(ScenarioError, match=f"^simulate: spill_dir.*{said}"):
            simulate(base(), "duration_s=0.5", spill_dir=bad)
    # the same rule in load_scenario, which simulate calls
    from clockwork.scenario import load_scenario

    one = load_scenario("poisson_warm", "duration_s=0.5")
    assert one.data["duration_s"] == 0.5 and one.overrides == ["duration_s=0.5"]
    with pytest.raises(ScenarioError, match="^load_scenario: overrides must be None"):
        load_scenario("poisson_warm", 5)


def test_a_scenario_changed_after_it_was_read_is_checked_again():
    """A script reads a scenario once and edits its ``data`` between runs: the edits are
    checked as a file's would be (``workers = 0`` ran into "min() arg is an empty
    sequence", a NaN latency into "cannot convert float NaN to integer", a misspelt key
    or ``workers = 2.7`` ran silently); the Scenario itself is left as it was."""
    from clockwork.cluster.sim import Simulation

    sc = load_scenario(data=base(), overrides="duration_s=0.5")
    for key, value, says in (("workers", 0, "cluster.workers: "),
                             ("workers", 2.7, "cluster.workers: "),
                             ("network_latency_ms", float("nan"),
                              "cluster.network_latency_ms: "),
                             ("wrokers", 2, "unknown setting 'cluster.wrokers' \\(did you mean")):
        edited = load_scenario(data=base(), overrides="duration_s=0.5")
        edited.data["cluster"][key] = value
        with pytest.raises(ScenarioError, match=f"^<dict>: {says}"):
            simulate(edited)
        with pytest.raises(ScenarioError, match=f"^<dict>: {says}"):
            Simulation(edited)
    plain = simulate(sc).summary
    assert sc.overrides == ["duration_s=0.5"] and plain["duration_s"] == 0.5
    with pytest.raises(ScenarioError, match="Simulation: a clockwork.scenario.Scenario is "
                       "needed"):
        Simulation(base())


def test_a_simulation_runs_once():
    """A Simulation run again ran on with the first run's policy, workloads and logs (a
    closed loop's clients sent again at time 0 into a later clock: 485,597 requests
    logged beside a first summary of 5,597, in the first result's logs too): refused."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(load_scenario(data=base(), overrides="duration_s=0.5"))
    first = sim.run().summary
    with pytest.raises(RuntimeError, match="has run already: make a new one"):
        sim.run()
    assert Simulation(load_scenario(data=base(), overrides="duration_s=0.5")).run().summary == first


def test_fig5_closed_loop_reaches_capacity():
    res = simulate("scenarios/fig5_1gpu.toml", ["duration_s=5"])
    s = res.summary
    check_conservation(res)
    assert s["goodput_rps"] >= 0.95 * CAPACITY
    # no request counted as met after its deadline
    for r in res.telemetry.requests:
        if r[6]:
            assert r[2] + r[4] <= r[3]


def test_poisson_half_capacity_meets_slo():
    res = simulate(base(duration_s=5.0, workloads=[
        {"kind": "poisson", "models": "resnet50_v2", "rate_rps": CAPACITY / 2, "slo_ms": 100}]))
    check_conservation(res)
    assert res.summary["slo_attainment"] >= 0.9999


def test_same_seed_same_summary_bytes(tmp_path):
    sc = base(cluster={"noise": 0.05, "jitter_ms": 0.2}, models=[{"name": "resnet50_v2", "copies": 4}])
    a = simulate(sc).write(tmp_path / "a")
    b = simulate(sc).write(tmp_path / "b")
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    assert (a / "requests.tsv").read_bytes() == (b / "requests.tsv").read_bytes()
    c = simulate(sc, ["seed=4"]).write(tmp_path / "c")
    assert (a / "summary.json").read_bytes() != (c / "summary.json").read_bytes()


def test_cold_starts_load_and_evict_within_capacity():
    # cache of 21 pages holds 3 ResNet50 copies; 8 copies are requested
    res = simulate(base(
        duration_s=5.0,
        cluster={"weights_cache_pages": 21},
        models=[{"name": "resnet50_v2", "copies": 8}],
        workloads=[{"kind": "poisson", "models": "resnet50_v2", "rate_rps": 40, "slo_ms": 100}],
    ))
    s = res.summary
    check_conservation(res)
    assert s["actions"]["load"] > 8 and s["actions"]["evict"] > 0
    assert s["max_pages_used"] <= s["cache_pages"] == 21
    assert s["cold_starts"] > 0
    # LOAD 8 ms + EXEC 2.9 ms fit easily in 100 ms: every request could make it, and does
    assert s["slo_attainment"] >= 0.999


def test_logs_and_summary_keys(tmp_path):
    out = simulate(base()).write(tmp_path / "run")
    s = orjson.loads((out / "summary.json").read_bytes())
    for k in ("submitted", "succeeded", "slo_met", "failed", "dropped", "goodput_rps",
              "throughput_rps", "slo_attainment", "latency_ms", "cold_starts", "actions",
              "duration_s"):
        assert k in s
    assert set(s["latency_ms"]) >= {"p50", "p90", "p99", "p999", "max"}
    assert set(s["actions"]) >= {"infer", "load", "evict", "rejected"}
    header = (out / "requests.tsv").read_text().splitlines()[0].split("\t")
    assert tuple(header) == REQUEST_COLUMNS
    lines = (out / "actions.tsv").read_text().splitlines()
    assert len(lines) == 1 + s["actions"]["infer"] + s["actions"]["load"] + s["actions"]["evict"]
    assert "wall_s" in orjson.loads((out / "run.json").read_bytes())


def test_admission_stops_at_duration_and_drains():
    res = simulate(base(duration_s=1.0, workloads=[
        {"kind": "closed_loop", "models": "resnet50_v2", "concurrency": 4, "slo_ms": 100}]))
    check_conservation(res)
    assert max(r[2] for r in res.telemetry.requests) < 1_000_000_000


def test_slo_factor_and_default_slo():
    res = simulate(base(workloads=[
        {"kind": "poisson", "models": "resnet50_v2", "rate_rps": 50, "slo_factor": 10},
        {"kind": "poisson", "models": "resnet50_v2", "rate_rps": 50},
    ]))
    slos = {r[3] - r[2] for r in res.telemetry.requests}
    assert slos == {29_000_000, 100_000_000}


def test_misprediction_noise_is_survived():
    res = simulate(base(duration_s=3.0, cluster={"noise": 0.2, "slow_prob": 0.01}, workloads=[
        {"kind": "poisson", "models": "resnet50_v2", "rate_rps": 300, "slo_ms": 50}]))
    check_conservation(res)
    assert res.summary["slo_attainment"] > 0.9


@pytest.mark.parametrize("override,msg", [
    ("cluster.workers=0", "cluster.workers"),
    ("cluster.profiles='nope'", "profile set 'nope' not found"),
    ("models.0.name='zzz'", "no profile for model 'zzz'"),
    ("workloads.0.kind='nope'", "unknown workload kind"),
    ("workloads.0.rate_rps=-1", r"^workloads\.0: rate_rps must be > 0"),
    # a misspelt workload key, with its hint, named as --set names it
    ("workloads.0.model='zzz'", r"^workloads\.0: poisson workload: unknown setting 'model' "
     r"\(did you mean 'models'\?\)$"),
    ("workloads.0.models='zzz'", "matches no model instance"),
    ("scheduler.bogus_ms=3", "unknown scheduler setting"),
    ("duration_s=0", "duration_s"),
    # a weights cache that no copy of a served model fits (every request would time out)
    ("cluster.weights_cache_pages=6", r"^cluster.weights_cache_pages: model 'resnet50_v2' "
     r"takes 7 pages, more than the 6 page\(s\) of each GPU's weights cache"),
    # faults at or after the end (they would happen after the run, to no effect)
    ("faults.kill=[{worker=0, at_s=2.0}]",
     r"^faults.kill.0.at_s: must be before the end \(duration_s 2\), got 2$"),
    ("faults.hang=[{worker=0, at_s=0.5, for_s=1}, {worker=0, at_s=500, for_s=1}]",
     r"^faults.hang.1.at_s: must be before the end \(duration_s 2\), got 500$"),
    ("faults.slow_network=[{worker=0, at_s=900, for_s=1, delay_ms=5}]",
     r"^faults.slow_network.0.at_s: must be before the end \(duration_s 2\), got 900$"),
])
def test_bad_scenarios_have_clear_errors(override, msg):
    with pytest.raises(ScenarioError, match=msg):
        simulate(base(), [override])


def test_a_profile_sets_cache_too_small_for_a_model_is_named(tmp_path):
    """The cache size from the profile set's set.json (not the scenario): the message
    names that file."""
    (tmp_path / "resnet50_v2.json").write_bytes(orjson.dumps(_R50.to_json()))
    (tmp_path / "set.json").write_bytes(b'{"weights_cache_pages": 3}')
    d = base(cluster={"profiles": str(tmp_path)})
    with pytest.raises(ScenarioError, match=r"weights_cache_pages of profile set .* takes 7 "
                       r"pages, more than the 3 page"):
        simulate(d)
    assert str(tmp_path / "set.json") in str(pytest.raises(ScenarioError, simulate, d).value)
    assert simulate(d, ["cluster.weights_cache_pages=7"]).summary["slo_met"] > 0  # fits
    # a set without set.json: the default is named, not a file that does not exist
    (tmp_path / "set.json").unlink()
    big = _R50.to_json() | {"weights_bytes": 10**13, "weights_pages": 596_047}
    (tmp_path / "resnet50_v2.json").write_bytes(orjson.dumps(big))
    with pytest.raises(ScenarioError) as e:
        simulate(d)
    assert str(e.value).startswith(f"the default weights_cache_pages (profile set "
                                   f"{tmp_path.name!r} has no set.json to set it; or set "
                                   "cluster.weights_cache_pages): model"), str(e.value)


def test_fault_times_are_checked_after_overrides():
    """``--set duration_s`` that ends the run before a fault: refused, as a fault in the
    file after its own end is."""
    d = base(faults={"kill": [{"worker": 0, "at_s": 1.5, "back_s": 1.8}]})
    assert simulate(d).summary["submitted"] > 0
    with pytest.raises(ScenarioError, match=r"faults.kill.0.at_s: must be before the end "
                       r"\(duration_s 1\), got 1.5"):
        simulate(d, ["duration_s=1"])
    sc = load_scenario(data=d)
    with pytest.raises(ScenarioError, match="faults.kill.0.at_s"):
        simulate(sc, ["duration_s=1.5"])


def test_override_parsing():
    sc = load_scenario("scenarios/fig5_1gpu.toml", ["cluster.workers=4", "workloads.0.slo_ms=25.5",
                                                    "name=\"x\""])
    assert sc.cluster["workers"] == 4
    assert sc.workloads[0]["slo_ms"] == 25.5
    with pytest.raises(ScenarioError, match="key=value"):
        load_scenario("scenarios/fig5_1gpu.toml", ["cluster.workers"])


def test_telemetry_flush_appends_and_forgets(tmp_path):
    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from clockwork.telemetry import Telemetry

    tel = Telemetry(0)
    for i in range(3):
        tel.reply(Reply(Request(i, "m", 10 * i, 100), RequestStatus.SUCCESS, 10 * i + 5))
        if i == 1:
            tel.flush(tmp_path)
            assert tel.requests == []
    tel.flush(tmp_path)
    lines = (tmp_path / "requests.tsv").read_text().splitlines()
    assert lines[0].startswith("request_id") and len(lines) == 4  # one header, 3 rows
    assert [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2"]
    assert (tmp_path / "actions.tsv").read_text().count("\n") == 1  # header only


def test_the_run_ends_once_every_action_sent_has_finished():
    """After the last answer the controller may still load copies for the demand it
    remembers: the run went on until they finished (the simulator stopped as soon as no
    request was left, and such a LOAD, its pages counted in max_pages_used and its EVICT
    logged, had no row in the action log nor in the summary's counts)."""
    from clockwork.actions import ActionType

    res = simulate("cold_starts", ["duration_s=10", "workloads.0.rate_rps=800"])
    assert res.telemetry.unfinished_actions() == 0
    acts = res.telemetry.action_columns()
    loads = int((acts["type"] == ActionType.LOAD).sum())
    assert res.summary["actions"]["load"] == loads


def test_a_result_dropped_frees_its_run_at_once(tmp_path):
    """A ``simulate`` result dropped is freed by reference counting, its rows with it,
    even with the cyclic collector off (as during the next run, which turns it off): the
    run's transports were classes made inside it, always in a reference cycle, whose
    methods held the run's rows (a loop of runs held two at a time). Its ``spill_dir``
    folder is gone already, as the run ended (the rows are maps of its removed files)."""
    import gc
    import weakref

    from clockwork.cluster.sim import simulate

    enabled = gc.isenabled()
    gc.disable()
    try:
        r = simulate("poisson_warm", ["duration_s=2"], spill_dir=tmp_path)
        assert list(tmp_path.iterdir()) == [] and r.summary["submitted"] > 0
        rows = weakref.ref(r.telemetry)
        del r
        assert rows() is None
    finally:
        if enabled:
            gc.enable()


def test_a_scenario_read_from_a_relative_path_runs_after_a_chdir(tmp_path, monkeypatch):
    """A scenario loaded by a relative path (``exp/s.toml``) whose trace sits beside it
    (``tr.csv.gz``), then the current folder changed (a notebook's ``os.chdir``) before
    it runs: its trace is still found in its own folder, as the docs say (the folder
    was the relative path's, from wherever the process was then: "trace file tr.csv.gz
    not found")."""
    import shutil
    from pathlib import Path

    from clockwork.cluster.sim import simulate
    from clockwork.scenario import load_scenario

    exp = tmp_path / "exp"
    exp.mkdir()
    repo = Path(__file__).resolve().parent.parent
    shutil.copy(repo / "traces" / "samples" / "invocations_per_function_md.anon.d01.csv.gz",
                exp / "tr.csv.gz")
    (exp / "s.toml").write_text(
        'seed = 1\nduration_s = 2.0\n[[models]]\nname = "resnet50_v2"\ncopies = 20\n'
        '[[workloads]]\nkind = "azure"\ntrace = "tr.csv.gz"\nmodels = "*"\n')
    monkeypatch.chdir(tmp_path)
    sc = load_scenario("exp/s.toml")
    here = simulate(sc).summary
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert simulate(sc).summary == here and here["submitted"] > 0
    assert simulate(sc, ["seed=1"]).summary == here  # (with overrides: loaded again)


def test_simulate_warns_as_clockwork_simulate_does():
    """``simulate()`` tells a script what ``clockwork simulate`` says on stderr: a network
    slower than the policy's windows (every action refused: 0 % attainment with no word
    of why), settings the policy ignores, a run without requests; and the faults as they
    played out (the Python API said none of it)."""
    import warnings

    from clockwork.cluster.sim import SimulationWarning

    cases = [
        (["cluster.network_latency_ms=20", "duration_s=1"], "cluster.network_latency_ms: "
         "actions take ~20 ms to reach the worker"),
        (["scheduler.policy='tfserving'", "scheduler.max_exec_ms=1", "duration_s=1"],
         "not used by policy 'tfserving'"),
        (["workloads.0.rate_rps=1e-9", "duration_s=1"], "no requests were submitted"),
    ]
    for sets, said in cases:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            res = simulate("poisson_warm", sets)
        texts = [str(w.message) for w in got if issubclass(w.category, SimulationWarning)]
        assert len(texts) == 1 and said in texts[0], (sets, texts)
        assert got[0].filename == __file__  # (the caller's line)
        assert res.warnings == [f"warning: {texts[0]}"], res.warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing to say: no warning)
        res = simulate("poisson_warm", "duration_s=1")
    assert res.warnings == [] and res.event_log == []
    res = simulate("faults", "duration_s=60")
    assert (20.0, "worker 1 killed") in res.event_log, res.event_log


def test_a_small_runs_result_holds_its_rows_not_a_chunks_slack():
    """A kept result holds about its rows' bytes: a run of ~150 requests kept ~570 KiB
    (each log's first chunk is made for 4,096 rows, and the columns were views of it), so
    a script keeping 2,000 small results held over 1 GiB. And its columns are read-only
    (written through, requests.tsv disagreed with summary.json)."""
    res = simulate("poisson_warm", ["duration_s=0.2"])
    cols = [*res.telemetry.request_columns().values(), *res.telemetry.action_columns().values()]
    rows = res.summary["submitted"]
    assert 0 < rows < 1000
    held = sum(c.base.nbytes if c.base is not None else c.nbytes for c in cols
               if isinstance(c, np.ndarray))
    assert held <= 2 * sum(c.nbytes for c in cols if isinstance(c, np.ndarray)), held
    lat = res.telemetry.request_columns()["latency"]
    with pytest.raises(ValueError, match="read-only"):
        lat[:] = 0


def test_a_run_whose_every_worker_is_killed_for_good_says_why_requests_wait():
    """tfserving keeps a request until a GPU serves it: with its only worker killed for
    good, those it held then (a queue, at 2,000 r/s) are answered ERROR no_worker once no
    worker has come back for no_worker_wait_ms (the later ones at once), and the run ends
    with every request answered. With no_worker_wait_ms = 0 they stay unanswered, and the
    run says why (it said to give drain_s longer, which could not help)."""
    sc = {"seed": 1, "duration_s": 1.0, "drain_s": 3.0,
          "cluster": {"workers": 1, "gpus_per_worker": 1},
          "scheduler": {"policy": "tfserving"},
          "models": [{"name": "resnet50_v2"}],
          "workloads": [{"kind": "poisson", "rate_rps": 2000, "slo_ms": 5000}],
          "faults": {"kill": [{"worker": 0, "at_s": 0.5}]}}
    res = simulate(sc)  # (5 s SLOs: the clients wait for the answers)
    rows = res.telemetry.request_columns()
    held = (rows["status"] == 1) & (rows["latency"] > 1_500_000_000)
    assert held.sum() > 10, int(held.sum())  # answered at the wait's end, 2.5 s
    assert rows["latency"].max() < 2_200_000_000
    assert res.summary["failed"] + res.summary["succeeded"] == res.summary["submitted"]
    with pytest.raises(RuntimeError, match="every worker was killed for good") as e:
        simulate({**sc, "scheduler": {"policy": "tfserving", "no_worker_wait_ms": 0}})
    assert "drain_s" not in str(e.value)


def test_a_run_ended_before_a_killed_worker_is_back_asks_for_more_drain():
    """Its only worker killed with a back_s after the run's end: the requests still
    unanswered at drain_s's end wait for it, so the run asks for a longer drain_s (it said
    every worker was killed for good, no back_s, and to give the kill one)."""
    sc = {"seed": 1, "duration_s": 0.5, "drain_s": 0.1,
          "cluster": {"workers": 1, "gpus_per_worker": 1},
          "scheduler": {"policy": "infaas"},
          "models": [{"name": "mobilenet_v2"}],
          "workloads": [{"kind": "fixed_rate", "rate_rps": 100.0}],
          "faults": {"kill": [{"worker": 0, "at_s": 0.3, "back_s": 5.0}]}}
    with pytest.raises(RuntimeError, match=r"at drain_s = 0\.1 s after duration_s"):
        simulate(sc)


def test_requests_that_come_together_share_a_batch_as_live():
    """A closed loop of 4 on one copy: the 4 answers of a batch come at one instant and
    the 4 requests they make reach the controller together, as a message of several does
    live (ControllerLoop.requests), and run as one INFER of 4. They reached it one at a
    time and the first went alone to the idle GPU: 689 INFERs of 1 and one of 2 in 2 s
    (live: batches of 4), 691 requests served against 1,684 now."""
    res = simulate({"seed": 1, "duration_s": 2.0,
                    "cluster": {"workers": 1, "gpus_per_worker": 1,
                                "network_latency_ms": 0.1},
                    "models": [{"name": "resnet50_v2"}],
                    "workloads": [{"kind": "closed_loop", "models": "resnet50_v2",
                                   "concurrency": 4, "slo_ms": 100}]})
    a = res.telemetry.action_columns()
    batches = a["batch_size"][a["type"] == ActionType.INFER]
    assert len(batches) > 100 and (batches == 4).all(), np.unique(batches, return_counts=True)
    assert res.summary["succeeded"] == res.summary["submitted"]


def test_open_arrivals_at_one_instant_share_a_batch_as_live():
    """Two fixed-rate workloads at the same instants on one copy: each pair reaches the
    controller together, as live (the replay sends the arrivals due together in one
    message), and runs as one INFER of 2 (300 INFERs of 1 before; live 150 of 2)."""
    res = simulate({"seed": 1, "duration_s": 3.0,
                    "cluster": {"workers": 1, "gpus_per_worker": 1},
                    "models": [{"name": "resnet50_v2"}],
                    "workloads": [{"kind": "fixed_rate", "models": "resnet50_v2",
                                   "rate_rps": 50, "slo_ms": 100}] * 2})
    a = res.telemetry.action_columns()
    batches = a["batch_size"][a["type"] == ActionType.INFER]
    assert len(batches) == 150 and (batches == 2).all(), np.unique(batches, return_counts=True)


def test_requests_while_no_worker_answers_are_answered_at_once_as_live():
    """The only worker killed: a request that comes while the controller has no worker
    connected and answering is answered at once, ERROR (the live intake's no_worker), not
    queued until its SLO runs out (307 TIMEOUT after 50 ms each, against ERROR live)."""
    res = simulate({"seed": 1, "duration_s": 1.0,
                    "cluster": {"workers": 1, "gpus_per_worker": 1},
                    "models": [{"name": "resnet50_v2"}],
                    "workloads": [{"kind": "poisson", "rate_rps": 400, "slo_ms": 50}],
                    "faults": {"kill": [{"worker": 0, "at_s": 0.3, "back_s": 0.5}],
                               "detect_ms": 1.0}})
    r = res.telemetry.request_columns()
    later = r["arrival"] > ms(301)  # the loss found; reconnected at 1.2 s, after the run
    assert later.sum() > 200
    assert (r["status"][later] == RequestStatus.ERROR).all()
    assert (r["latency"][later] == 0).all()


def test_requests_waiting_for_a_new_controller_are_not_failed_by_another_death():
    """A second controller restart before the first's new controller took the workers
    over: the requests waiting for a controller (which never reached one) were failed by
    the second death and handed to the next controller all the same, answered twice (the
    run ended with -106 unanswered). They wait on, and each is answered once."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 3.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1, "network_latency_ms": 0.1},
        "models": [{"name": "resnet50_v2"}],
        "workloads": [{"kind": "poisson", "rate_rps": 200, "slo_ms": 100}],
        "faults": {"controller_restart": [{"at_s": 1.0, "down_s": 0.5},
                                          {"at_s": 1.50001, "down_s": 0.2}]}}))
    res = sim.run()
    ids = res.telemetry.request_columns()["request_id"]
    assert len(ids) == len(set(ids.tolist())) == res.summary["submitted"] > 500
    assert any("152 request(s) waited for it" in what for _, what in sim.fault_log), \
        sim.fault_log


def test_a_loss_seen_late_is_seen_at_the_reconnection_not_after_it():
    """detect_ms longer than a killed worker's restart and reconnect_s: the controller
    sees the old connection gone as it reconnects (as live, where it reconnects only once
    it has), not at kill + detect_ms, which marked the worker, back and serving, lost for
    good (every request from then on answered ERROR, no worker)."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(load_scenario(data={
        "seed": 1, "duration_s": 4.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1},
        "models": [{"name": "resnet50_v2"}],
        "workloads": [{"kind": "poisson", "rate_rps": 200, "slo_ms": 100}],
        "faults": {"kill": [{"worker": 0, "at_s": 1.0, "back_s": 1.05}], "detect_ms": 1000,
                   "reconnect_s": 0.1}}))
    res = sim.run()
    said = [(t, what) for t, what in sim.fault_log if "lost worker 0" in what]
    assert [t for t, _ in said] == [ms(1150)], sim.fault_log
    r = res.telemetry.request_columns()
    later = r["arrival"] > ms(2000)
    assert later.sum() > 300 and (r["status"][later] == RequestStatus.SUCCESS).all()


def test_answers_past_the_slo_and_the_clients_grace_are_given_up_as_live():
    """A policy that keeps requests past their SLO under overload (infaas) answers some
    seconds late: the simulator's clients give each up at its SLO plus the client's
    grace (1 s), TIMEOUT no_answer, as a live replay's client does (the simulator
    counted them succeeded, over a throughput the GPU cannot reach, where live dropped
    them). Policies that answer in time are untouched (no ``no_answer`` key)."""
    from clockwork.time import CLIENT_GRACE_NS

    def run(policy):
        return simulate(load_scenario(data={
            "seed": 1, "duration_s": 12.0,
            "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "v100-reference"},
            "models": [{"name": "resnet50_v2"}],
            "scheduler": {"policy": policy, "max_batch": 1},
            "workloads": [{"kind": "poisson", "rate_rps": 400, "slo_ms": 100}]}))

    res = run("infaas")
    s = res.summary
    assert s["no_answer"] > 100, s
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"], s
    lat = REQUEST_COLUMNS.index("latency")
    st = REQUEST_COLUMNS.index("status")
    rows = res.telemetry.requests
    assert max(r[lat] for r in rows) <= ms(100) + CLIENT_GRACE_NS
    assert sum(1 for r in rows if r[st] == RequestStatus.TIMEOUT
               and r[lat] == ms(100) + CLIENT_GRACE_NS) == s["no_answer"]
    assert "no_answer" not in run("clockwork").summary
