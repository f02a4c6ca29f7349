"""The settings schemas: bad values give one line naming the key, the value and what is
expected (unknown keys: the closest valid one); good values round-trip; every shipped
scenario and profile still loads; docs/settings.md is what the schemas give."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from clockwork.profiles import ModelProfile, ProfileError, load_profile, load_profile_set
from clockwork.scenario import ScenarioError, load_scenario
from clockwork.settings import (
    ClusterSettings,
    ModelEntry,
    ProfileFile,
    ProfileSetFile,
    ScenarioSettings,
    SchedulerTable,
    SettingsError,
    TensorEntry,
    WorkloadEntry,
    fields_of,
    table_keys,
)
from controller import make_policy, split_settings
from controller.baselines.clipper import ClipperConfig
from controller.baselines.infaas import InfaasConfig
from controller.baselines.tfserving import TfServingConfig
from controller.command import parse_settings
from controller.config import SchedulerConfig
from controller.service import parse_models

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = str(ROOT / "scenarios" / "poisson_warm.toml")
MS = 1_000_000


def one_line(msg: str) -> str:
    assert "\n" not in msg, msg
    assert "Traceback" not in msg and "validation error" not in msg and "pydantic" not in msg
    return msg


def raises(exc: type[Exception], fn, *args, **kw) -> str:
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    return one_line(str(info.value))


# ----------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("override,msg", [
    ("cluster.noise=nan", "cluster.noise: must be a finite number in [0, 10], got nan"),
    ("cluster.noise=-0.5", "cluster.noise: must be a finite number in [0, 10], got -0.5"),
    ("cluster.workers=0", "cluster.workers: must be an integer in [1, 10000], got 0"),
    ("cluster.workers=true", "cluster.workers: must be an integer in [1, 10000], got true"),
    ("cluster.workers=2.0", "cluster.workers: must be an integer in [1, 10000], got 2.0"),
    ("cluster.workers='2'", "cluster.workers: must be an integer in [1, 10000], got '2'"),
    ("cluster.slow_prob=1.5", "cluster.slow_prob: must be a finite number in [0, 1], got 1.5"),
    ("cluster.jitter_ms=inf", "cluster.jitter_ms: must be a finite number >= 0, got inf"),
    ("cluster.device='gpu'",
     "cluster.device: must be one of 'emulated', 'cpu', 'cuda', got 'gpu'"),
    ("cluster.profiles=3", "cluster.profiles: must be a non-empty string, got 3"),
    ("cluster.wokers=2", "unknown setting 'cluster.wokers' (did you mean 'cluster.workers'?)"),
    ("cluster=3", "cluster: must be a table, got 3"),
    ("duration_s=0", "duration_s: must be a number of seconds >= 1e-9 (1 ns), got 0"),
    # (1e-12 s rounds to 0 ns: a run of no time was taken)
    ("duration_s=1e-12", "duration_s: must be a number of seconds >= 1e-9 (1 ns), got 1e-12"),
    ("faults.hang=[{worker=0,at_s=1,for_s=1e-12}]",
     "faults.hang.0.for_s: must be a number of seconds >= 1e-9 (1 ns), got 1e-12"),
    ("duration_s=-inf", "duration_s: must be a number of seconds >= 1e-9 (1 ns), got -inf"),
    ("seed=-1", "seed: must be an integer in [0, 2^63 - 1], got -1"),
    ("seed=1.5", "seed: must be an integer in [0, 2^63 - 1], got 1.5"),
    ("drain_s=nan", "drain_s: must be a finite number >= 0, got nan"),
    ("nosuch=1", "unknown top-level setting 'nosuch' (known: add_workers, cluster, "
                 "description, drain_s, duration_s, faults, models, name, remove_workers, "
                 "repository, scheduler, seed, workloads)"),
    ("seeed=1", "unknown top-level setting 'seeed' (did you mean 'seed'?)"),
    ("models.0.copies=0", "models.0.copies: must be an integer in [1, 100000], got 0"),
    ("models.0.copis=2", "unknown setting 'models.0.copis' (did you mean 'models.0.copies'?)"),
    ("models.0.name=''", "models.0.name: must be a model name: letters, digits, '_', '.' "
     "and '-' (at most 128, not starting with '.' or '-'), got ''"),
    # (a tab or a newline in a name broke the TSV logs that report reads)
    ('models.0.name="tab\\tname"', "models.0.name: must be a model name: letters, digits, "
     "'_', '.' and '-' (at most 128, not starting with '.' or '-'), got 'tab\\tname'"),
    ("models=[]", "models: must be at least one [[models]] table, got []"),
    ("workloads.0.rate_rps=nan", "workloads.0.rate_rps: must be a finite number, got nan"),
    ("workloads.0.rate_rps=true", "workloads.0.rate_rps: must be a finite number, got true"),
    ("workloads.0.slo_ms=inf", "workloads.0.slo_ms: must be a finite number, got inf"),
    ("workloads.0.slo_factor='x'",
     "workloads.0.slo_factor: must be a finite number <= 10000, got 'x'"),
    # times: an SLO at most a day, any other time at most a year (int64 nanoseconds)
    ("workloads.0.slo_ms=1e8",
     "workloads.0.slo_ms: must be at most 86,400,000 (a day), got 100000000.0"),
    ("duration_s=1e300", "duration_s: must be at most 31,536,000 (a year), got 1e+300"),
    # (a straggler 1e300 times slower: the run ended asking for a longer drain)
    ("cluster.slow_factor=1e300", "cluster.slow_factor: must be a finite number in [1, 1000], "
     "got 1e+300"),
    ("scheduler.default_slo_ms=4e10", "scheduler.default_slo_ms: must be at most 86,400,000 "
     "(a day), got 40000000000.0"),  # (it said: at most ... (a year))
    # one kill or hang of a worker at a time (a live run's restart of a worker killed
    # twice raised in its thread; the simulator merged overlapping hangs, a live run not)
    ("faults.kill=[{worker=0,at_s=1.2,back_s=1.8},{worker=0,at_s=1.0,back_s=1.5}]",
     "faults: kill.0 of worker 0 (at 1.2 s) overlaps kill.1 (until 1.5 s): one kill or "
     "hang of a worker at a time"),
    ("faults.hang=[{worker=1,at_s=1,for_s=0.5},{worker=1,at_s=1.2,for_s=0.1}]",
     "faults: hang.1 of worker 1 (at 1.2 s) overlaps hang.0 (until 1.5 s): one kill or "
     "hang of a worker at a time"),
    ("faults={kill=[{worker=0,at_s=1}],hang=[{worker=0,at_s=3,for_s=1}]}",
     "faults: hang.0 of worker 0 (at 3 s) overlaps kill.0 (until the end): one kill or "
     "hang of a worker at a time"),
    # a worker's slow links do not overlap (the first to end made the link fast again)
    ("faults.slow_network=[{worker=0,at_s=0.1,for_s=0.8,delay_ms=60},"
     "{worker=0,at_s=0.15,for_s=0.01,delay_ms=1}]",
     "faults: slow_network.1 of worker 0 (at 0.15 s) overlaps slow_network.0 (until 0.9 s): "
     "one slow link of a worker at a time (split them into spells that follow one another)"),
    ("faults.kill=[{worker=0,at_s=1e13}]",
     "faults.kill.0.at_s: must be at most 31,536,000 (a year), got 10000000000000.0"),
    ("cluster.clock_offsets_ms=[0,-1e12]", "cluster.clock_offsets_ms.1: must be at least "
     "-31,536,000,000 (a year), got -1000000000000.0"),
    ("workloads.0.think_ms=1e11",
     "workloads.0.think_ms: must be at most 31,536,000,000 (a year), got 100000000000.0"),
    ("workloads.0.on_s=1e9", "workloads.0.on_s: must be at most 31,536,000 (a year), "
     "got 1000000000.0"),
    ("workloads.0.burst=nan", "workloads.0.burst: must be a finite number, got nan"),
    ("workloads.0.models=3",
     "workloads.0.models: must be a model name or glob, or a list of them, got 3"),
    ("workloads.0.concurrency=1.5", "workloads.0.concurrency: must be an integer <= 100000, got 1.5"),
    ("scheduler.policy=3", "scheduler.policy: must be a non-empty string, got 3"),
    # sizes beyond what a run can build (memory): refused before anything is built
    ("cluster.workers=1000000", "cluster.workers: must be an integer in [1, 10000], got 1000000"),
    ("cluster.gpus_per_worker=65",
     "cluster.gpus_per_worker: must be an integer in [1, 64], got 65"),
    ("models.0.copies=10000000",
     "models.0.copies: must be an integer in [1, 100000], got 10000000"),
    ("workloads.0.concurrency=100000000",
     "workloads.0.concurrency: must be an integer <= 100000, got 100000000"),
    # integers no float holds (a traceback: OverflowError, exit 1)
    ("workloads.0.on_s=1" + "0" * 400, "workloads.0.on_s: must be a number a float can hold "
     "(at most ~1.8e308), got 1" + "0" * 56 + "..."),
    ("scheduler.default_slo_ms=1" + "0" * 400, "scheduler.default_slo_ms: must be at most "
     "86,400,000 (a day), got 1" + "0" * 56 + "..."),
])
def test_bad_scenario_values_give_one_line(override, msg):
    """A bad value an override gave is named as the override's (the file did not say
    it: it said "poisson_warm.toml: seed: ..." for --set seed=-1)."""
    got = raises(ScenarioError, load_scenario, SCENARIO, [override])
    k, key = override.partition("=")[0], msg.partition(": ")[0]
    unknown = re.match(r"unknown (?:top-level )?setting '([^']+)'", msg)
    if unknown:
        key = unknown[1]
    by_override = key == k or key.startswith(k + ".")
    within = k.startswith(key + ".")  # (a table the override set something in)
    assert got == (f"--set{':' if unknown else ''} {msg}" if by_override
                   else f"{SCENARIO} with --set {k}: {msg}" if within
                   else f"{SCENARIO}: {msg}")


@pytest.mark.parametrize("text, msg", [
    # a misspelt key is said with its hint, not the required key it left missing
    ('[[models]]\nnmae = "resnet50_v2"\n[[workloads]]\nkind = "poisson"\nrate_rps = 1\n',
     "unknown setting 'models.0.nmae' (did you mean 'models.0.name'?)"),
    ('[[model]]\nname = "resnet50_v2"\n[[workloads]]\nkind = "poisson"\nrate_rps = 1\n',
     "unknown top-level setting 'model' (did you mean 'models'?)"),
    # a workload entry takes other keys: the one close to the missing kind is named
    ('[[models]]\nname = "resnet50_v2"\n[[workloads]]\nknid = "poisson"\nrate_rps = 1\n',
     "workloads.0.kind: required setting missing (must be a non-empty string; 'knid' is "
     "given: misspelt?)"),
    # ... but not a setting of the table given rightly (back_s beside a missing at_s)
    ('[[models]]\nname = "resnet50_v2"\n[[workloads]]\nkind = "poisson"\nrate_rps = 1\n'
     '[faults]\nkill = [{ worker = 0, back_s = 4.0 }]\n',
     "faults.kill.0.at_s: required setting missing (must be a finite number >= 0)"),
])
def test_a_misspelt_key_is_named_with_its_hint(text, msg, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(text)
    assert raises(ScenarioError, load_scenario, str(f)) == f"{f}: {msg}"


def test_set_into_a_list_the_scenario_does_not_have_says_so():
    """``--set faults.kill.0.worker=0`` where the scenario has no faults.kill: said as
    such (a table {"0": ...} was made, then refused as "must be a list", blamed on the
    file)."""
    for key in ("faults.kill.0.worker", "cluster.clock_offsets_ms.0"):
        where = key.rsplit(".", 2)[0] if key.endswith("worker") else key.rsplit(".", 1)[0]
        got = raises(ScenarioError, load_scenario, SCENARIO, [f"{key}=0"])
        assert got == (f"--set {key}: {where} is not in the scenario, so it has no item 0: "
                       f"give the whole list (--set '{where}=[...]')"), got
    sc = load_scenario(SCENARIO, ["cluster.clock_offsets_ms=[0, 1]",
                                  "cluster.clock_offsets_ms.1=5"])  # (there: set)
    assert sc.cluster["clock_offsets_ms"] == [0, 5]
    # a misspelt list's name is said as such (it was advised to give the misspelt list)
    got = raises(ScenarioError, load_scenario, SCENARIO, ["worklods.0.slo_ms=5"])
    assert got == ("--set worklods.0.slo_ms: unknown setting 'worklods' (did you mean "
                   "'workloads'?)"), got


def test_a_value_edited_after_an_override_is_not_blamed_on_it():
    """A ``Scenario``'s data edited in Python after ``load_scenario`` applied an override
    of that key: the bad value is the edit's, said as the scenario's (it was "--set
    duration_s: ... got -1" for ``duration_s=3``); a bad value the override itself gave
    (nan too, not equal to itself; a table setting it) is still the override's."""
    from clockwork.scenario import validate

    sc = load_scenario(SCENARIO, ["duration_s=3", "cluster.noise=0.1"])
    sc.data["duration_s"] = -1
    got = raises(ScenarioError, validate, sc)
    assert got.startswith(f"{SCENARIO}: duration_s: "), got
    sc = load_scenario(SCENARIO, ["cluster.noise=0.1"])
    sc.data["cluster"]["noise"] = 11
    got = raises(ScenarioError, validate, sc)
    assert got.startswith(f"{SCENARIO}: cluster.noise: "), got
    for override in ("cluster.noise=nan", "cluster={noise=nan}"):
        got = raises(ScenarioError, load_scenario, SCENARIO, [override])
        assert got.startswith("--set cluster.noise: "), got


def test_the_largest_sizes_still_load():
    sc = load_scenario(SCENARIO, ["cluster.workers=1024", "cluster.gpus_per_worker=64",
                                  "models.0.copies=100000"])
    assert (sc.cluster["workers"], sc.models[0]["copies"]) == (1024, 100000)
    sc = load_scenario(SCENARIO, ["cluster.workers=10000", "cluster.gpus_per_worker=6"])
    assert sc.cluster["workers"] == 10000


def test_sizes_are_bounded_in_all_too(tmp_path):
    """Each entry within its bound can still add up to more than memory holds: the GPUs,
    the instances and a closed loop's outstanding requests are bounded in all."""
    from clockwork.workloads import ClosedLoop, WorkloadError

    got = raises(ScenarioError, load_scenario, SCENARIO,
                 ["cluster.workers=1025", "cluster.gpus_per_worker=64"])
    assert got == (f"{SCENARIO} with --set cluster.workers: cluster: workers x "
                   "gpus_per_worker must be at most 65,536 GPUs in all, got 1,025 x 64 = "
                   "65,600")
    entries = '[[models]]\nname = "resnet50_v2"\ncopies = 100000\n' * 10
    path = tmp_path / "big.toml"
    path.write_text(entries + '[[workloads]]\nkind = "poisson"\nrate_rps = 10\n')
    assert len(load_scenario(str(path)).models) == 10  # 1,000,000: the bound itself
    path.write_text(entries + '[[models]]\nname = "resnet18_v2"\n'
                    '[[workloads]]\nkind = "poisson"\nrate_rps = 10\n')
    assert raises(ScenarioError, load_scenario, str(path)) == (
        f"{path}: models: the copies of all entries must be at most 1,000,000 instances in "
        "all, got 1,000,001 (11 entries)")
    assert ClosedLoop([f"m{i}" for i in range(10)], 100_000).concurrency == 100_000
    with pytest.raises(WorkloadError, match=r"^closed_loop concurrency x the 11 instances "
                       r"selected must be at most 1,000,000 outstanding requests in all, got "
                       r"100,000 x 11 = 1,100,000$"):
        ClosedLoop([f"m{i}" for i in range(11)], 100_000)


def test_closed_loops_bound_their_concurrency():
    """The kinds check it too: a named kind's own key (background_concurrency), and a
    closed loop made in code."""
    from clockwork.cluster.sim import Simulation
    from clockwork.workloads import ClosedLoop, WorkloadError

    with pytest.raises(ScenarioError, match=r"background_concurrency must be >= 1 and at "
                       r"most 100,000, got 1000000$"):
        Simulation(load_scenario("slo_exp_2", ["workloads.0.background_concurrency=1000000"]))
    with pytest.raises(WorkloadError, match="at most 100,000, got 100001"):
        ClosedLoop(["m"], 100_001)
    assert ClosedLoop(["m"], 100_000).concurrency == 100_000


FOUR = {"resnet50_v2": "resnet50_v2", **{f"resnet50_v2:{k}": "resnet50_v2" for k in (1, 2, 3)}}
SLO2 = {"kind": "slo_exp_2", "foreground": 2}
BURSTY = {"kind": "bursty_experiment"}


@pytest.mark.parametrize("spec,msg", [
    # a key a kind hands on to an inner part under another name is named as given (it
    # said "rate_rps must be > 0" for foreground_rps, "slo_ms" for background_slo_ms)
    ({**SLO2, "foreground_rps": 0}, "foreground_rps must be > 0, got 0.0"),
    ({**SLO2, "background_slo_ms": -1},
     "background_slo_ms must be > 0 and at most 86,400,000 (a day), got -1.0"),
    ({**SLO2, "background_slo_factor": 0},
     "background_slo_factor must be > 0 and at most 10,000, got 0.0"),
    ({**SLO2, "background_slo_ms": 5, "background_slo_factor": 2},
     "give background_slo_ms or background_slo_factor, not both"),
    ({"kind": "slo_exp_1", "rate_rps": 0}, "rate_rps must be > 0, got 0.0"),
    # a negative group count is out of its range, not more than the selection has
    ({**SLO2, "foreground": -1}, "foreground must be >= 0, got -1"),
    ({**SLO2, "background": -1}, "background must be >= 0, got -1"),
    ({**BURSTY, "minor": -1}, "minor must be >= 0, got -1"),
    ({**BURSTY, "major": -1}, "major must be >= 0, got -1"),
    ({**SLO2, "foreground": 5},
     "foreground = 5, but only 4 instances are left in the workload's selection"),
    # the value given, as every other refusal says it
    ({"kind": "closed_loop", "think_ms": -1}, "think_ms must be >= 0, got -1.0"),
    ({"kind": "closed_loop", "retry_ms": 0}, "retry_ms must be > 0, got 0.0"),
    ({**SLO2, "retry_ms": 0}, "retry_ms must be > 0, got 0.0"),
])
def test_workload_refusals_name_the_key_given_and_the_value(spec, msg):
    from clockwork.workloads import WorkloadError, build_workload

    assert raises(WorkloadError, build_workload, spec, FOUR) == msg


def test_slo_exp_2_foreground_rps_is_named_when_simulating_too():
    from clockwork.cluster.sim import Simulation
    from clockwork.workloads import WorkloadError, build_workload

    with pytest.raises(ScenarioError) as e:
        Simulation(load_scenario("slo_exp_2", ["workloads.0.foreground_rps=0"]))
    assert one_line(str(e.value)) == "workloads.0: foreground_rps must be > 0, got 0.0"
    w = build_workload({**SLO2, "foreground_rps": 1e12}, FOUR)
    with pytest.raises(WorkloadError, match=r"^poisson workload: foreground_rps 1e\+12 for "):
        w.bind(0, 3 * 10**9, np.random.default_rng(0), dict.fromkeys(FOUR, MS))


def test_a_tiny_fixed_rate_sends_once_without_an_overflow_warning():
    """fixed_rate's arrival k comes at k / rate_rps: at rate_rps 1e-300 each past the
    first overflows a float, far past the end and not used; numpy's warning leaked."""
    import warnings

    from clockwork.workloads import build_workload

    w = build_workload({"kind": "fixed_rate", "rate_rps": 1e-300}, FOUR)
    w.bind(0, 3 * 10**9, np.random.default_rng(0), dict.fromkeys(FOUR, MS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [w.next_arrival() for _ in range(2)]
    assert got == [(0, "resnet50_v2", 0), None]


REPOSITORY = """duration_s = 2
[[models]]
name = "resnet50_v2"
[[models]]
name = "resnet18_v2"
[[workloads]]
kind = "poisson"
rate_rps = 200
[[repository]]
at_s = 0.5
unload = "resnet18_v2"
[[repository]]
at_s = 1.0
load = "resnet18_v2"
"""


@pytest.mark.parametrize("override,msg", [
    # an unload moved to the end is named for that, not the load at 1 s it leaves with
    # nothing to load ("repository.1.load: no copy of model ... is unloaded then")
    ("repository.0.at_s=2", "repository.0.at_s: must be before the end (duration_s 2), got 2"),
    ("repository.1.at_s=3", "repository.1.at_s: must be before the end (duration_s 2), got 3"),
])
def test_a_repository_event_at_the_end_is_named_before_the_events_are_checked(
        override, msg, tmp_path):
    from clockwork.scenario import repository_plan

    path = tmp_path / "rep.toml"
    path.write_text(REPOSITORY)
    assert [e[:3] for e in repository_plan(load_scenario(str(path)))] == [
        (0.5, "unload", "resnet18_v2"), (1.0, "load", "resnet18_v2")]
    assert raises(ScenarioError, repository_plan, load_scenario(str(path), [override])) == msg


@pytest.mark.parametrize("override", ["workloads.-1.rate_rps=10", "workloads.+0.rate_rps=10",
                                      "workloads.1.rate_rps=10", "models.-1={name='x'}"])
def test_set_takes_list_items_by_index_from_0_only(override):
    """``--set workloads.-1....`` is refused (it edited the last item, as Python does)."""
    key = override.partition("=")[0]
    item = key.split(".")[1]
    got = raises(ScenarioError, load_scenario, SCENARIO, [override])
    assert got.startswith(f"--set {key}: no list item {item!r}") and "(items 0 ... 0)" in got


def test_missing_required_key_and_dict_source():
    got = raises(ScenarioError, load_scenario, data={
        "models": [{"copies": 2}], "workloads": [{"kind": "poisson", "rate_rps": 1}]})
    assert got == ("<dict>: models.0.name: required setting missing (must be a model name: "
                   "letters, digits, '_', '.' and '-' (at most 128, not starting with '.' or "
                   "'-'))")
    got = raises(ScenarioError, load_scenario, data={"models": [{"name": "a"}]})
    assert got == "<dict>: workloads: must be at least one [[workloads]] table, got []"


def test_a_table_from_python_takes_numpy_numbers_and_paths():
    """A scenario given as a dict from a script: numpy integers (a seed from np.arange,
    copies from an array) and a pathlib.Path (the profile set's folder) are taken as
    TOML's integers and strings (refused: "must be an integer", "must be a non-empty
    string"; numpy floats passed), and kept as plain values."""
    import numpy as np

    from clockwork.profiles import find_profile_set

    folder = Path(find_profile_set("v100-reference"))
    sc = load_scenario(data={
        "seed": np.arange(3, 4)[0], "duration_s": np.float32(1.5),
        "cluster": {"workers": np.int8(2), "profiles": folder},
        "models": [{"name": "resnet50_v2", "copies": np.array(2)}],
        "workloads": [{"kind": "poisson", "rate_rps": np.int64(100), "slo_ms": 50}]})
    assert (sc.seed, sc.data["duration_s"], sc.cluster["workers"]) == (3, 1.5, 2)
    assert sc.cluster["profiles"] == str(folder) and sc.models[0]["copies"] == 2
    assert type(sc.seed) is int and type(sc.models[0]["copies"]) is int
    with pytest.raises(ScenarioError, match="seed: must be an integer"):
        load_scenario(data={"seed": np.float64(1.5), "models": [{"name": "a"}],
                            "workloads": [{"kind": "poisson", "rate_rps": 1}]})
    # a numpy array as TOML's array (it was refused: "must be an array of numbers")
    sc = load_scenario("poisson_warm", data={"cluster": {"clock_offsets_ms": np.array([0.5])}})
    assert sc.cluster["clock_offsets_ms"] == [0.5]
    assert type(sc.cluster["clock_offsets_ms"][0]) is float


@pytest.mark.parametrize("kw,fragment", [
    ({"path": {"seed": 1}}, "path must be a scenario file's path or a shipped scenario's "
                            "name (str or os.PathLike), got dict (a scenario's tables go "
                            "as data=...)"),
    ({"path": 5}, "got int"),
    ({"data": [1]}, "data must be a dict of the scenario's tables, got list")])
def test_load_scenario_of_the_wrong_type_is_a_scenario_error(kw, fragment):
    """A dict given as the path, or data that is not a dict: a ScenarioError naming the
    parameter (a TypeError from pathlib, an AttributeError from deep inside)."""
    with pytest.raises(ScenarioError) as e:
        load_scenario(**kw)
    assert fragment in str(e.value), e.value


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_and_round_trips(path):
    sc = load_scenario(path)
    d = sc.data
    # defaults filled, plain values
    assert set(fields_of(ClusterSettings)) - {"weights_cache_pages", "packages"} <= set(
        d["cluster"])
    assert d["scheduler"]["policy"] and d["seed"] >= 0 and d["duration_s"] > 0
    assert all(isinstance(m, dict) and m["copies"] >= 1 for m in d["models"])
    assert all(isinstance(w, dict) and w["kind"] for w in d["workloads"])
    # validating the validated data changes nothing
    assert load_scenario(data=d).data == d
    # and its [scheduler] table passes the policy's schemas
    sched = dict(d["scheduler"])
    split_settings(sched.pop("policy"), sched)


def test_defaults_are_the_schemas():
    sc = load_scenario(data={"models": [{"name": "resnet50_v2"}],
                             "workloads": [{"kind": "poisson", "rate_rps": 10}]})
    assert sc.seed == 1 and sc.duration_s == 60.0 and sc.data["drain_s"] == 120.0
    assert sc.cluster == ClusterSettings().model_dump(exclude_none=True)
    assert sc.scheduler == {"policy": "clockwork"}
    assert sc.models == [{"name": "resnet50_v2", "copies": 1}]
    assert sc.workloads == [{"kind": "poisson", "rate_rps": 10.0}]
    assert "weights_cache_pages" not in sc.cluster  # the profile set's default applies


# ----------------------------------------------------------------------------- scheduler


@pytest.mark.parametrize("table,msg", [
    ({"max_batch": "abc"}, "max_batch: must be an integer >= 1, got 'abc'"),
    ({"max_batch": True}, "max_batch: must be an integer >= 1, got true"),
    ({"max_batch": 0}, "max_batch: must be an integer >= 1, got 0"),
    ({"default_slo_ms": float("inf")},
     "default_slo_ms: must be a finite number > 0 (at most a day), got inf"),
    ({"default_slo_ms": 0}, "default_slo_ms: must be a finite number > 0 (at most a day), got 0"),
    ({"default_slo_ms": 1e8},
     "default_slo_ms: must be a finite number > 0 (at most a day), got 100000000.0"),
    ({"schedule_ahead_ms": -1},
     "schedule_ahead_ms: must be a finite number >= 0 (at most a year), got -1"),
    # a plan no longer than an idle GPU's predicted start never sent an INFER (0.5 ms),
    # or froze the run in 1 ns steps (1 ms); an interval of 0 re-examined LOAD demand
    # without end at one instant
    ({"schedule_ahead_ms": 0.5}, "scheduler: schedule_ahead_ms (0.5) must be more than "
                                 "future_ms (1)"),
    ({"schedule_ahead_ms": 5, "future_ms": 5}, "scheduler: schedule_ahead_ms (5) must be "
                                               "more than future_ms (5)"),
    ({"load_check_interval_ms": 0}, "load_check_interval_ms: must be a finite number >= 0.1 "
                                    "(at most a year), got 0"),
    ({"future_ms": 1e13},
     "future_ms: must be a finite number >= 0 (at most a year), got 10000000000000.0"),
    ({"max_exec_ms": float("nan")},
     "max_exec_ms: must be a finite number >= 0 (at most a year), got nan"),
    ({"estimate_percentile": 1.5},
     "estimate_percentile: must be a finite number in (0, 1], got 1.5"),
    ({"estimate_window": 0}, "estimate_window: must be an integer in [1, 10000], got 0"),
    ({"batch_first": 1}, "batch_first: must be true or false, got 1"),
    ({"batch_first": "false"}, "batch_first: must be true or false, got 'false'"),
    ({"max_batc": 3}, "unknown scheduler setting 'max_batc' (did you mean 'max_batch'?)"),
    ({"default_slo": 5}, "unknown scheduler setting 'default_slo' (did you mean "
                         "'default_slo_ms'?)"),
    # in range as written, 0 ns once rounded: named as written, not as kept (default_slo)
    ({"default_slo_ms": 1e-9}, "default_slo_ms: must be a finite number > 0 (at most a day), "
                               "got 1e-09 (rounds to 0 ns)"),
    ({"probe_timeout_ms": 4e-7}, "probe_timeout_ms: must be a finite number > 0 (at most a "
                                 "year), got 4e-07 (rounds to 0 ns)"),
])
def test_scheduler_config_bad_values(table, msg):
    assert raises(SettingsError, SchedulerConfig.from_ms, **table) == msg


def test_scheduler_config_round_trip_and_frozen():
    assert SchedulerConfig.from_ms() == SchedulerConfig()
    c = SchedulerConfig.from_ms(schedule_ahead_ms=2.5, default_slo_ms=50, max_batch=8,
                                batch_first=False, estimate_percentile=0.5, lag_ms=0)
    assert (c.schedule_ahead, c.default_slo, c.max_batch, c.batch_first) == (
        2_500_000, 50 * MS, 8, False)
    assert c.estimate_percentile == 0.5 and c.lag == 0 and c.max_exec == 25 * MS
    assert type(c.schedule_ahead) is int and type(c.default_slo) is int
    assert c == SchedulerConfig(schedule_ahead=2_500_000, default_slo=50 * MS, max_batch=8,
                                batch_first=False, estimate_percentile=0.5, lag=0)
    assert len({c, SchedulerConfig.from_ms(**{"default_slo_ms": 50.0, "max_batch": 8,
                                              "schedule_ahead_ms": 2.5, "lag_ms": 0,
                                              "batch_first": False,
                                              "estimate_percentile": 0.5})}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_batch = 4  # type: ignore[misc]
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch=0)
    assert "default_slo_ms" in table_keys(SchedulerConfig)


@pytest.mark.parametrize("cls,table,msg", [
    (ClipperConfig, {"aimd_backoff": 1}, "aimd_backoff: must be a finite number in (0, 1), got 1"),
    (ClipperConfig, {"batch_wait_ms": float("nan")},
     "batch_wait_ms: must be a finite number >= 0 (at most a year), got nan"),
    (ClipperConfig, {"replicas": 0}, "replicas: must be an integer >= 1, got 0"),
    (ClipperConfig, {"drop_expired": "yes"}, "drop_expired: must be true or false, got 'yes'"),
    (ClipperConfig, {"batch_wiat_ms": 1},
     "unknown clipper setting 'batch_wiat_ms' (did you mean 'batch_wait_ms'?)"),
    (TfServingConfig, {"batch_timeout_us": -5},
     "batch_timeout_us: must be a finite number >= 0 (at most a year), got -5"),
    (TfServingConfig, {"batch_timeout_us": 500, "batch_timeout_ms": 1},
     "batch_timeout_us and batch_timeout_ms: give one of them, not both"),
    (TfServingConfig, {"max_enqueued_batches": True},
     "max_enqueued_batches: must be an integer >= 1, got true"),
    (InfaasConfig, {"monitor_interval_ms": 0},
     "monitor_interval_ms: must be a finite number >= 1 (at most a year), got 0"),
    (InfaasConfig, {"scale_down_util": 0.9},
     "infaas: scale_down_util must be below scale_up_util, got 0.9 and 0.8"),
    (InfaasConfig, {"batch_slo_fraction": float("inf")},
     "batch_slo_fraction: must be a finite number in (0, 1], got inf"),
])
def test_baseline_configs_bad_values(cls, table, msg):
    assert raises(SettingsError, cls.from_settings, table) == msg


def test_baseline_configs_round_trip():
    assert ClipperConfig.from_settings(None) == ClipperConfig()
    c = ClipperConfig.from_settings({"batch_wait_ms": 2, "initial_batch": 4, "replicas": 2})
    assert (c.batch_wait, c.initial_batch, c.replicas) == (2 * MS, 4.0, 2)
    assert TfServingConfig.from_settings({"batch_timeout_us": 500}).batch_timeout == 500_000
    assert TfServingConfig.from_settings({"batch_timeout_ms": 0.5}).batch_timeout == 500_000
    i = InfaasConfig.from_settings({"monitor_interval_ms": 100, "scale_down_intervals": 2})
    assert (i.monitor_interval, i.scale_down_intervals) == (100 * MS, 2)
    assert hash(c) == hash(ClipperConfig(batch_wait=2 * MS, initial_batch=4, replicas=2))


def test_split_settings_checks_the_whole_table():
    from controller import POLICY_SETTINGS  # derived from the baselines' schemas

    assert POLICY_SETTINGS["tfserving"] == ("max_batch_size", "batch_timeout_us",
                                            "batch_timeout_ms", "max_enqueued_batches",
                                            "inflight_per_gpu")
    assert set(POLICY_SETTINGS) == {"clipper", "tfserving", "infaas"}
    common, own = split_settings("tfserving", {"max_batch": 8, "batch_timeout_us": 100})
    assert common == {"max_batch": 8} and own == {"batch_timeout_us": 100}
    assert raises(SettingsError, split_settings, "clipper", {"batch_wiat_ms": 1}) == (
        "unknown scheduler setting 'batch_wiat_ms' (did you mean 'batch_wait_ms'?)")
    assert raises(SettingsError, split_settings, "clockwork", {"batch_wait_ms": 1}) == (
        "unknown scheduler setting 'batch_wait_ms' for policy 'clockwork' "
        "(it is a setting of clipper)")
    assert raises(SettingsError, split_settings, "clipper", {"aimd_step": float("nan")}) == (
        "aimd_step: must be a finite number > 0, got nan")
    assert raises(SettingsError, split_settings, "infaas", {"max_batch": "x"}) == (
        "max_batch: must be an integer >= 1, got 'x'")
    assert raises(SettingsError, split_settings, "clipr", {}) == (
        "unknown scheduler policy 'clipr' (did you mean 'clipper'?); known: clipper, "
        "clockwork, infaas, tfserving")
    assert raises(ValueError, make_policy, "nope", [], []).startswith(
        "unknown scheduler policy 'nope'")


@pytest.mark.parametrize("override,msg", [
    ("scheduler.max_batch=abc", "max_batch: must be an integer >= 1, got 'abc'"),
    ("scheduler.max_batc=3", "unknown scheduler setting 'max_batc' (did you mean 'max_batch'?)"),
    ("scheduler.default_slo_ms=inf", "default_slo_ms: must be a finite number > 0 (at most a day), got inf"),
    # the policy's own key, misspelt, is hinted at too (it was listed with every other key
    # but policy)
    ("scheduler.polcy=clipper", "unknown scheduler setting 'polcy' (did you mean 'policy'?)"),
    # (1e308 times an action's duration overflowed: a traceback in the simulator, every
    # tick's in a live controller, and no request answered)
    ("scheduler.probe_slack_frac=1e308",
     "probe_slack_frac: must be a finite number in [0, 1000], got 1e+308"),
])
def test_scenario_scheduler_table_checked_where_the_policy_is_built(override, msg):
    from clockwork.cluster.sim import Simulation

    sc = load_scenario(SCENARIO, [override])  # the scenario schema leaves [scheduler] open
    got = raises(ScenarioError, Simulation, sc)
    assert got.endswith(msg)


# ----------------------------------------------------------------------------- controller


def test_controller_parse_settings_and_models():
    assert parse_settings(["max_batch=abc", "x=nan", "b=true"])["max_batch"] == "abc"
    assert raises(ValueError, parse_settings, ["oops"]) == "--set wants KEY=VALUE, got 'oops'"
    profiles = load_profile_set("v100-reference").profiles
    assert parse_models("resnet50_v2:2, vgg16", profiles) == {
        "resnet50_v2": "resnet50_v2", "resnet50_v2:1": "resnet50_v2", "vgg16": "vgg16"}
    assert raises(ValueError, parse_models, "resnet50_v2:0", profiles) == (
        "--models resnet50_v2:0: copies: must be an integer in [1, 100000], got 0")
    assert raises(ValueError, parse_models, "resnet50_v2:x", profiles) == (
        "--models resnet50_v2:x: copies: must be an integer in [1, 100000], got 'x'")
    assert raises(ValueError, parse_models, "resnet50_v3", profiles).startswith(
        "--models resnet50_v3: no profile for model 'resnet50_v3' (did you mean "
        "'resnet50_v2'?); known: densenet121,")
    assert raises(ValueError, parse_models, "vgg16,vgg16", profiles) == (
        "--models vgg16: model instance 'vgg16' is listed twice")
    many = {f"m{i}": None for i in range(11)}  # (only their names are read)
    assert len(parse_models(",".join(f"m{i}:100000" for i in range(10)), many)) == 1_000_000
    assert raises(ValueError, parse_models, ",".join(f"m{i}:100000" for i in range(11)),
                  many) == "--models m10:100000: at most 1,000,000 instances in all, got " \
        "1,100,000 with this item"


@pytest.mark.parametrize("args,text", [
    (["--set", "max_batch=abc"], "max_batch: must be an integer >= 1, got 'abc'"),
    (["--set", "nosuch=1"], "unknown scheduler setting 'nosuch'"),
    (["--set", "default_slo_ms=inf"], "default_slo_ms: must be a finite number > 0 (at most a day), got inf"),
    (["--models", "resnet50_v2:0"], "copies: must be an integer in [1, 100000], got 0"),
    (["--models", "nosuchmodel"], "no profile for model 'nosuchmodel'"),
    (["--set", "policy=clipper"], "--set policy=clipper: the policy is given with --policy "
     "clipper"),
    # a flag and --set of the same setting with two values (--set won, unsaid)
    (["--default-slo-ms", "500", "--set", "default_slo_ms=5"],
     "--set default_slo_ms=5 and --default-slo-ms 500 give it two values"),
    (["--max-batch", "4", "--set", "max_batch=8"], "--max-batch 4 give it two values"),
    # items all empty: it served nothing ("" serves every profile)
    (["--models", ",,"], "--models ',,': names no model"),
    # a window kept per estimate, sorted at each measurement: bounded
    (["--set", "estimate_window=100000000"], "estimate_window: must be an integer in [1, "
     "10000]"),
])
def test_controller_command_refuses_bad_settings(args, text, capsys):
    from clockwork.cluster.cli import main

    assert main(["controller", "--workers", "127.0.0.1:1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert one_line(err).startswith("clockwork controller: ") and text in err


# ----------------------------------------------------------------------------- profiles


GOOD_PROFILE = {"model": "m", "device": "test", "weights_bytes": 100, "load_ns": 5,
                "exec_ns": {"1": 10, "4": 20},
                "inputs": [{"name": "data", "shape": [3, 8], "dtype": "float32"}]}


@pytest.mark.parametrize("change,msg", [
    ({"load_ns": -5}, "load_ns: must be an integer >= 1 (at most a year), got -5"),
    ({"load_ns": 5.5}, "load_ns: must be an integer >= 1 (at most a year), got 5.5"),
    ({"weights_bytes": True}, "weights_bytes: must be an integer >= 1, got true"),
    ({"exec_ns": {"1": 10, "x": 3}}, "exec_ns: key 'x' must be a batch size (an integer, 1 to 65,536)"),
    ({"exec_ns": {"0": 3}}, "exec_ns: key '0' must be a batch size (an integer, 1 to 65,536)"),
    ({"exec_ns": {"1": None}}, "exec_ns.1: must be an integer >= 1 (at most a year), got None"),
    ({"exec_ns": {}}, "exec_ns: must be a non-empty table of batch size -> ns, got {}"),
    ({"inputs": [{"name": "d", "shape": [3, 0], "dtype": "f"}]},
     "inputs.0.shape.1: must be an integer >= 1, got 0"),
    ({"inputs": [{"name": "d", "shape": [3]}]},
     "inputs.0.dtype: required setting missing (must be a non-empty string)"),
    ({"exec": {}}, "unknown profile setting 'exec' (did you mean 'exec_ns'?)"),
    ({"model": "a\nb"}, "model: must be a model name: letters, digits, '_', '.' and '-' (at "
     "most 128, not starting with '.' or '-'), got 'a\\nb'"),
    # (an element type no KServe client can send or read: served, it failed at the first
    # request, or its configuration could not be answered)
    ({"outputs": [{"name": "o", "shape": [3], "dtype": "complex64"}]},
     "outputs.0.dtype: 'complex64' is not an element type a model may have; one of bool, "),
    ({"inputs": [{"name": "d", "shape": [3], "dtype": "bogus"}]},
     "inputs.0.dtype: 'bogus' is not an element type a model may have; one of bool, "),
    # a batch size as written ("01" and "1" were one key: the later figure taken), and
    # pages that cannot hold the weights (a 46.7 MB model in 1 page ran in a cache 2
    # pages too small)
    ({"exec_ns": {"1": 10, "01": 50}}, "exec_ns: key '01' must be a batch size (an "
     "integer, 1 to 65,536)"),
    # a batch size past what a message's int32 holds (simulate took it; the controller's
    # start ended "Value out of range: 1099511627776"), and a row no message could carry
    # (every request failed "internal error", a MemoryError building its answer)
    ({"exec_ns": {"1": 10, "1099511627776": 50}}, "exec_ns: key '1099511627776' must be a "
     "batch size (an integer, 1 to 65,536)"),
    ({"outputs": [{"name": "o", "shape": [1048576, 1048576, 1048576], "dtype": "float32"}]},
     "outputs.0: tensor 'o': a row of shape [1048576, 1048576, 1048576] of float32 is "
     "4,611,686,018,427,387,904 bytes, more than a message carries (2,147,483,647)"),
    ({"weights_bytes": 46_758_048, "weights_pages": 1}, "profile: weights_pages is 1, fewer "
     "than the 3 pages of 16 MiB that weights_bytes (46,758,048) takes (0 computes them)"),
])
def test_bad_profiles_give_one_line(change, msg, tmp_path):
    f = tmp_path / "m.json"
    f.write_bytes(orjson.dumps({**GOOD_PROFILE, **change}))
    got = raises(ProfileError, load_profile, f)
    assert got == f"{f}: {msg}" or msg.endswith(" ") and got.startswith(f"{f}: {msg}"), got


def test_a_key_given_twice_in_a_profile_or_set_file_is_refused(tmp_path):
    """JSON whose object holds a key twice (orjson, as most readers, took the last one
    with no word: a second load_ns of 1 s beside the measured one was used)."""
    from clockwork.profiles import _load_set_file

    f = tmp_path / "m.json"
    f.write_text(orjson.dumps(GOOD_PROFILE).decode()[:-1] + ', "load_ns": 999999999}')
    assert raises(ProfileError, load_profile, f) == \
        f"{f}: key 'load_ns' is given twice in one object"
    nested = tmp_path / "n.json"
    nested.write_text(orjson.dumps(GOOD_PROFILE).decode().replace(
        '"4":20', '"4":20,"4":25'))
    assert raises(ProfileError, load_profile, nested) == \
        f"{nested}: key '4' is given twice in one object"
    s = tmp_path / "set.json"
    s.write_text('{"weights_cache_pages": 10, "weights_cache_pages": 20}')
    assert raises(ProfileError, _load_set_file, s) == \
        f"{s}: key 'weights_cache_pages' is given twice in one object"
    assert load_profile(_good(tmp_path)).load_ns == 5


def _good(tmp_path):
    f = tmp_path / "good.json"
    f.write_bytes(orjson.dumps(GOOD_PROFILE))
    return f


def test_a_profiles_element_types_are_read_by_their_numpy_names(tmp_path):
    """Another numpy spelling of a type the protocol carries is read as its name
    (``float`` was kept as written, and a REST answer of such an output failed with an
    internal error)."""
    f = tmp_path / "m.json"
    f.write_bytes(orjson.dumps({**GOOD_PROFILE, "inputs": [
        {"name": "d", "shape": [3], "dtype": "f4"}], "outputs": [
        {"name": "o", "shape": [3], "dtype": "float"}, {"name": "b", "shape": [1],
                                                         "dtype": "?"}]}))
    p = load_profile(f)
    assert [t.dtype for t in p.inputs + p.outputs] == ["float32", "float64", "bool"]


@pytest.mark.parametrize("text,msg", [
    (b"[1]", "profile set: must be a table, got [1]"),
    (b'{"weights_cache_pages": 0}', "weights_cache_pages: must be an integer in [1, 2147483647], got 0"),
    (b'{"weights_cache_pages": -5}', "weights_cache_pages: must be an integer in [1, 2147483647], got -5"),
    (b'{"weights_cache_pages": "many"}',
     "weights_cache_pages: must be an integer in [1, 2147483647], got 'many'"),
    (b'{"weights_cache_pages": 8.5}', "weights_cache_pages: must be an integer in [1, 2147483647], got 8.5"),
    (b'{"weight_cache_pages": 8}', "unknown profile set setting 'weight_cache_pages' (did you "
                                   "mean 'weights_cache_pages'?)"),
    (b"{not json", "not valid JSON"),
])
def test_bad_set_json_gives_one_line_naming_the_file(text, msg, tmp_path):
    (tmp_path / "m.json").write_bytes(orjson.dumps(GOOD_PROFILE))
    (tmp_path / "set.json").write_bytes(text)
    got = raises(ProfileError, load_profile_set, str(tmp_path))
    assert got.startswith(f"{tmp_path / 'set.json'}: ") and msg in got


def test_set_json_defaults_and_its_cache_size(tmp_path):
    (tmp_path / "m.json").write_bytes(orjson.dumps(GOOD_PROFILE))
    assert load_profile_set(str(tmp_path)).weights_cache_pages == 1376  # no set.json
    (tmp_path / "set.json").write_bytes(b'{"device": "test", "weights_cache_pages": 64}')
    assert load_profile_set(str(tmp_path)).weights_cache_pages == 64
    assert load_profile_set("v100-reference").weights_cache_pages == 1376
    assert load_profile_set("cpu").weights_cache_pages == 32


def test_two_profile_files_of_one_model_are_refused_naming_both(tmp_path):
    (tmp_path / "m.json").write_bytes(orjson.dumps(GOOD_PROFILE))
    (tmp_path / "m_copy.json").write_bytes(orjson.dumps({**GOOD_PROFILE, "load_ns": 9}))
    got = raises(ProfileError, load_profile_set, str(tmp_path))
    assert got == (f"{tmp_path / 'm_copy.json'}: model 'm' already has a profile in this "
                   f"set, {tmp_path / 'm.json'}: one profile file per model")


def test_profiles_round_trip():
    bad = {**GOOD_PROFILE, "exec_ns": {"1": float("nan")}}  # JSON has no nan; a dict may
    assert raises(ProfileError, ModelProfile.from_json, bad, "x") == (
        "x: exec_ns.1: must be an integer >= 1 (at most a year), got nan")
    p = ModelProfile.from_json(GOOD_PROFILE)
    assert p.exec_ns == {1: 10, 4: 20} and p.weights_pages == 1
    assert p.inputs[0].shape == (3, 8)
    for name in ("v100-reference", "cpu"):
        for prof in load_profile_set(name).profiles.values():
            assert ModelProfile.from_json(prof.to_json()) == prof


# ----------------------------------------------------------------------------- schemas, docs


SCHEMAS: list[type] = [
    ScenarioSettings, ClusterSettings, ModelEntry, WorkloadEntry, SchedulerTable,
    SchedulerConfig, ClipperConfig, TfServingConfig, InfaasConfig, ProfileFile, TensorEntry,
    ProfileSetFile]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_setting_is_documented(schema):
    for name, f in fields_of(schema).items():
        assert f.description and len(f.description) > 8, f"{schema.__name__}.{name}"


def test_docs_settings_md_is_current():
    from clockwork.cluster.settings_doc import DEFAULT_OUT, render

    assert DEFAULT_OUT == ROOT / "docs" / "settings.md"
    assert DEFAULT_OUT.read_text() == render(), (
        "docs/settings.md is out of date: run python -m clockwork.cluster.settings_doc")


def test_the_scheduling_docs_table_names_keys_a_scenario_takes():
    """docs/scheduling.md's table of the main scheduler settings names each as a scenario
    writes it (``default_slo_ms``; it said ``default_slo``, which a scenario refuses)."""
    import re

    text = (ROOT / "docs" / "scheduling.md").read_text()
    table = text.split("## Settings and defaults", 1)[1].split("\n\n|", 1)[1].split("\n\n")[0]
    keys = re.findall(r"^\| `([a-z_]+)` \|", "|" + table, re.M)
    assert len(keys) >= 10, keys
    documented = (ROOT / "docs" / "settings.md").read_text()
    assert [k for k in keys if f"| `{k}` |" not in documented] == []


def test_the_settings_doc_writer_outside_a_checkout_wants_out(tmp_path, monkeypatch, capsys):
    """Run from an installed package (no pyproject.toml above it) it writes nothing
    unless given --out (it wrote a docs/ folder into site-packages)."""
    from clockwork.cluster import settings_doc

    monkeypatch.setattr(settings_doc, "ROOT", tmp_path / "site-packages")
    assert settings_doc.main([]) == 2
    assert "not run from a source checkout" in capsys.readouterr().err
    assert not (tmp_path / "site-packages").exists()
    assert settings_doc.main(["--out", str(tmp_path / "s.md")]) == 0
    assert (tmp_path / "s.md").read_text() == settings_doc.render()


# ----------------------------------------------------------------------------- the CLI


CLI = [sys.executable, "-c", "import sys; from clockwork.cluster.cli import main; sys.exit(main())"]


def test_clockwork_settings_prints_the_reference_or_a_topics_sections():
    """An installed package has no docs/ folder: ``clockwork settings`` prints the same
    page from the schemas, ``clockwork settings TOPIC`` the sections a word names (a
    ``##`` section with its parts, else a ``###`` part), and an unknown topic lists them."""
    from clockwork.cluster.settings_doc import render

    def run(*args):
        return subprocess.run([*CLI, "settings", *args], capture_output=True, text=True,
                              timeout=60)

    p = run()
    assert p.returncode == 0 and p.stdout == render(), p.stderr
    p = run("limits")
    heads = [line for line in p.stdout.splitlines() if line.startswith("#")]
    assert p.returncode == 0 and heads == ["## Controller limits"], heads
    assert "| `stream_outstanding` | integer | `50000` |" in p.stdout
    p = run("faults")
    heads = [line for line in p.stdout.splitlines() if line.startswith("#")]
    assert heads[0] == "## `[faults]`" and "### `kill` entries" in heads, heads
    p = run("KILL")
    heads = [line for line in p.stdout.splitlines() if line.startswith("#")]
    assert heads == ["### `kill` entries"] and "`back_s`" in p.stdout, heads
    p = run("clipper")
    assert p.stdout.startswith('### `policy = "clipper"`') and "batch_wait_ms" in p.stdout
    # a word begins a heading's word (model: models), a part is named with its section's
    # words too, and a key's underscore is a space as in the heading
    for topic, head in [("model", "## `[[models]]`"), ("limit", "## Controller limits"),
                        ("faults kill", "### `kill` entries"),
                        ("slow network", "### `slow_network` entries"),
                        ("slow_network", "### `slow_network` entries")]:
        p = run(*topic.split())  # (several words as they are typed: one topic)
        heads = [line for line in p.stdout.splitlines() if line.startswith("#")]
        assert p.returncode == 0 and heads == [head], (topic, heads, p.stderr)
        p = run(topic)
        heads = [line for line in p.stdout.splitlines() if line.startswith("#")]
        assert p.returncode == 0 and heads == [head], (topic, heads, p.stderr)
    p = run("nonsense")
    assert p.returncode == 2 and p.stdout == ""
    assert "no section 'nonsense'; the sections: top level; cluster; models" in p.stderr
    # (the help that named docs/settings.md names the command)
    h = subprocess.run([*CLI, "simulate", "--help"], capture_output=True, text=True,
                       timeout=60).stdout
    assert "clockwork settings" in " ".join(h.split()) and "docs/settings.md" not in h


@pytest.mark.parametrize("override,text", [
    ("cluster.noise=nan", "cluster.noise: must be a finite number in [0, 10], got nan"),
    ("cluster.workers=true", "cluster.workers: must be an integer in [1, 10000], got true"),
    ("cluster.wokers=2", "(did you mean 'cluster.workers'?)"),
    ("scheduler.max_batch=abc", "max_batch: must be an integer >= 1, got 'abc'"),
    ("workloads.0.rate_rps=nan", "workloads.0.rate_rps: must be a finite number, got nan"),
])
def test_simulate_command_prints_one_line_and_exits_2(override, text):
    r = subprocess.run([*CLI, "simulate", SCENARIO, "--set", override, "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("key,value", [("load_ns", 2**63 + 5), ("exec_ns", {"1": 2**62})])
def test_a_profile_duration_past_a_year_is_refused(key, value):
    """A profile's LOAD or INFER duration is at most a year (a LOAD of 2**63 ns was
    taken and could never fit a window: every request of the model was dropped)."""
    from clockwork.settings import ProfileFile, SettingsError, validate

    fig = {"model": "m", "weights_bytes": 10**8, "load_ns": 10**7, "exec_ns": {"1": 10**6}}
    fig[key] = value
    with pytest.raises(SettingsError, match="year"):
        validate(ProfileFile, fig, where="m.json")
    validate(ProfileFile, {**fig, "load_ns": 10**7, "exec_ns": {"1": 10**6}}, where="m.json")


def test_a_settings_file_named_json_in_capitals_is_read_as_json(tmp_path):
    """``--settings s.JSON`` is JSON (it was read as TOML: "not valid TOML")."""
    from controller.command import read_settings_file

    f = tmp_path / "s.JSON"
    f.write_text('{"scheduler": {"policy": "clockwork", "max_batch": 4}}')
    assert read_settings_file(str(f)) == {"policy": "clockwork", "max_batch": 4}


def test_a_flag_and_set_of_one_setting_agreeing_are_taken(capsys):
    """``--default-slo-ms 500 --set default_slo_ms=500``: one value, taken (only two
    different values are refused)."""
    import argparse

    from controller.command import scheduler_settings

    args = argparse.Namespace(policy=None, settings=None, schedule_ahead_ms=None,
                              default_slo_ms=500.0, max_batch=None,
                              set=["default_slo_ms=500"])
    _, cfg, _ = scheduler_settings(args)
    assert cfg.default_slo == 500_000_000
