"""A scenario's ``[[repository]]`` events: models unloaded and loaded again during a run,
in the simulator and, the same scenario, on a live cluster (``clockwork serve --replay``,
through the controller's model repository)."""

from __future__ import annotations

import collections
import csv
import subprocess
import sys

import pytest

from clockwork.cluster.sim import Simulation, simulate
from clockwork.scenario import ScenarioError, load_scenario, repository_plan
from tests.conftest import replay_with_no_controller

SCENARIO = """
name = "repository-events"
seed = 3
duration_s = 6.0

[cluster]
workers = 2
gpus_per_worker = 1

[[models]]
name = "resnet50_v2"
copies = 2

[[models]]
name = "mobilenet_v2"

[[workloads]]
kind = "poisson"
models = "*"
rate_rps = 300
slo_ms = 100

[[repository]]
at_s = 2.0
unload = "resnet50_v2"

[[repository]]
at_s = 4.0
load = "resnet50_v2"
"""


def _scenario(tmp_path, text: str = SCENARIO, overrides=()):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_scenario(path, list(overrides))


def _by_second(rows) -> dict:
    """(instance, whole second of arrival, status) -> requests."""
    out: collections.Counter = collections.Counter()
    for r in rows:
        out[(r["model"], int(float(r["arrival"]) // 1e9), r["status"])] += 1
    return dict(out)


def _rows(folder) -> list[dict]:
    with open(folder / "requests.tsv") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_a_model_unloaded_and_loaded_again_in_the_simulator(tmp_path):
    """While unloaded (2-4 s) every request for either copy is answered INVALID_REQUEST,
    the other model is untouched, both copies are EVICTed at the unload (one as soon as
    its last INFER ends) and LOADed cold again after the load; two runs are identical."""
    res = Simulation(_scenario(tmp_path)).run()
    res.write(tmp_path / "a")
    counts = _by_second(_rows(tmp_path / "a"))
    for inst in ("resnet50_v2", "resnet50_v2:1"):
        for sec in (0, 1, 4, 5):
            assert counts.get((inst, sec, "SUCCESS"), 0) > 50, (inst, sec, counts)
            assert (inst, sec, "INVALID_REQUEST") not in counts
        for sec in (2, 3):
            assert counts.get((inst, sec, "INVALID_REQUEST"), 0) > 50, (inst, sec, counts)
            assert (inst, sec, "SUCCESS") not in counts
    assert not any(k[0] == "mobilenet_v2" and k[2] != "SUCCESS" for k in counts), counts
    with open(tmp_path / "a" / "actions.tsv") as f:
        acts = [r for r in csv.DictReader(f, delimiter="\t") if r["model"].startswith("resnet")]
    evicts = [int(r["sent"]) for r in acts if r["type"] == "EVICT"]
    loads = sorted(int(r["sent"]) for r in acts if r["type"] == "LOAD")
    assert len(evicts) == 2 and all(2e9 <= t < 2.1e9 for t in evicts), evicts
    assert len(loads) == 4 and all(t >= 4e9 for t in loads[2:]), loads
    again = simulate(_scenario(tmp_path))
    assert again.summary == res.summary


def test_one_copy_unloaded_alone_and_loaded_back(tmp_path):
    """An instance name unloads and loads that copy alone; the model's other copy goes on
    serving."""
    text = SCENARIO.replace('unload = "resnet50_v2"', 'unload = "resnet50_v2:1"').replace(
        'load = "resnet50_v2"', 'load = "resnet50_v2:1"')
    res = Simulation(_scenario(tmp_path, text)).run()
    res.write(tmp_path / "a")
    counts = _by_second(_rows(tmp_path / "a"))
    assert not any(k[0] == "resnet50_v2" and k[2] != "SUCCESS" for k in counts), counts
    assert counts.get(("resnet50_v2:1", 3, "INVALID_REQUEST"), 0) > 50, counts
    assert counts.get(("resnet50_v2:1", 5, "SUCCESS"), 0) > 50, counts


@pytest.mark.parametrize("events,error", [
    ([("unload", "nosuch")], "repository.0.unload: 'nosuch' is not a [[models]] name"),
    ([("unload", "resnet50_v2"), ("unload", "resnet50_v2")],
     "repository.1.unload: no copy of model 'resnet50_v2' is served then (unloaded already)"),
    ([("load", "resnet50_v2")],
     "repository.0.load: no copy of model 'resnet50_v2' is unloaded then"),
    ([("unload", "resnet50_v2:1"), ("unload", "resnet50_v2:1")],
     "repository.1.unload: 'resnet50_v2:1' is not served then"),
    ([("unload", "resnet50_v2"), ("load", "resnet50_v2:1")],
     "repository.1.load: 'resnet50_v2:1' is a copy of model 'resnet50_v2', none of whose"),
    ([("load", "mobilenet_v2:1")], "'mobilenet_v2:1' is not a [[models]] name"),
    # the first copy goes by the model's name (it was only "not a [[models]] name")
    ([("unload", "resnet50_v2:0")], "repository.0.unload: 'resnet50_v2:0': the first copy "
     "of 'resnet50_v2' goes by the model's name, which unloads every copy; a copy alone is "
     "resnet50_v2:1 and up"),
])
def test_repository_events_are_checked_in_time_order(tmp_path, events, error):
    """Each event against what is served at its time (every instance at the start),
    refused before anything runs, in one line naming the entry."""
    lines = [f'[[repository]]\nat_s = {1.0 + i}\n{what} = "{name}"\n'
             for i, (what, name) in enumerate(events)]
    text = SCENARIO.split("[[repository]]")[0] + "\n".join(lines)
    with pytest.raises(ScenarioError) as e:
        Simulation(_scenario(tmp_path, text))
    assert error in str(e.value), str(e.value)


def test_repository_event_times_and_shape(tmp_path):
    """One of unload/load; before the end; entries at one time keep the file's order."""
    with pytest.raises(ScenarioError, match="repository.0: give one of unload or load"):
        _scenario(tmp_path, overrides=['repository=[{at_s=1}]'])
    with pytest.raises(ScenarioError, match=r"repository.1.at_s: must be before the end "
                                            r"\(duration_s 6\), got 6"):
        repository_plan(_scenario(tmp_path, overrides=["repository.1.at_s=6"]))
    sc = _scenario(tmp_path, overrides=["repository.1.at_s=2"])
    assert [(at, what) for at, what, _, _ in repository_plan(sc)] == [(2.0, "unload"),
                                                                      (2.0, "load")]
    # (at one time, a load after an unload waits for the unload's copies to be evicted)
    res = Simulation(sc).run()
    assert res.summary["submitted"] == res.summary["succeeded"] + res.summary["failed"] \
        + res.summary["dropped"]


def test_events_at_one_time_go_in_order_each_after_the_one_before(tmp_path):
    """Unload, load and unload again at one time: the load waits for the unload's copies to
    be evicted, and the second unload for that load (it found the model not served yet,
    KeyError in the policy); every request answered once."""
    more = """
[[repository]]
at_s = 2.0
load = "resnet50_v2"

[[repository]]
at_s = 2.0
unload = "resnet50_v2"
"""
    text = SCENARIO.replace('at_s = 4.0\nload = "resnet50_v2"',
                            'at_s = 4.0\nload = "resnet50_v2"\n' + more)
    sim = Simulation(_scenario(tmp_path, text))
    res = sim.run()
    said = [what for _, what in sim.fault_log]
    assert said == [f"repository: {w} resnet50_v2 (2 instance(s))"
                    for w in ("unloaded", "loaded", "unloaded", "loaded")], said
    times = [t for t, _ in sim.fault_log]
    assert times == sorted(times) and 2e9 <= times[2] < 2.1e9 and times[3] >= 4e9, times
    s = res.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]


COPY_THEN_MODEL = SCENARIO.replace('unload = "resnet50_v2"', 'unload = "resnet50_v2:1"')


def _serve(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                           "--replay", "--quiet", "--out", str(tmp_path / "live")],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.faults
@pytest.mark.parametrize("text,said", [
    (SCENARIO, ["repository: unloaded resnet50_v2 (2 instance(s))",
                "repository: loaded resnet50_v2 (2 instance(s))"]),
    # one copy unloaded alone, then the model: the copy not served comes back (the live
    # load asks for the model's copies as listed; the controller loads those not served)
    (COPY_THEN_MODEL, ["repository: unloaded resnet50_v2:1 (1 instance(s))",
                       "repository: loaded resnet50_v2 (1 instance(s))"]),
])
def test_the_same_events_live_and_simulated(tmp_path, text, said):
    """``clockwork serve --replay`` plays the events through the controller's repository at
    the same times: the requests each instance had answered, by second and status, are
    those the simulator answered (the same arrivals; the windows' edges may move a few
    requests, ~3 ms each, on a host the suite's other processes load). Run or timed out
    count as one here: on such a host a cluster process starved for tens of ms turns a
    burst of each instance's requests, in one second or another, from SUCCESS to TIMEOUT
    (up to ~20 of an instance's ~100 a second, seen with the machine's load at 4.5); those
    are bounded apart, at 5 % of the requests over the simulator's, while an event played
    at the wrong time moves INVALID_REQUEST answers against the others."""
    p = _serve(tmp_path, text)
    assert p.returncode == 0, p.stderr[-3000:]
    for line in said:
        assert line in p.stderr, p.stderr[-3000:]
    sim = Simulation(_scenario(tmp_path, text))
    sim.run().write(tmp_path / "sim")
    assert [what for _, what in sim.fault_log] == said
    live, simd = _by_second(_rows(tmp_path / "live")), _by_second(_rows(tmp_path / "sim"))
    ran = {"SUCCESS": "ran", "TIMEOUT": "ran"}
    both = [collections.Counter(), collections.Counter()]
    for counts, merged in ((live, both[0]), (simd, both[1])):
        for (model, sec, status), n in counts.items():
            merged[(model, sec, ran.get(status, status))] += n
    for k in set(both[0]) | set(both[1]):
        # (requests that ran: a worker found suspect on a starved host turns some of a
        # second's into ERROR, 14 of 99 seen at a load average of 8; the answers an event
        # decides, INVALID_REQUEST, within 10 whatever the load)
        slack = max(10, 0.15 * both[1][k]) if k[2] == "ran" else 10
        assert abs(both[0][k] - both[1][k]) <= slack, (k, both[0][k], both[1][k], live, simd)
    timeouts = [sum(n for (_, _, st), n in c.items() if st == "TIMEOUT") for c in (live, simd)]
    assert timeouts[0] - timeouts[1] <= 0.05 * sum(simd.values()), (timeouts, live)
    # (the windows themselves: most of each one's requests answered as in the simulator)
    assert live.get(("resnet50_v2:1", 3, "INVALID_REQUEST"), 0) > 50, live
    assert live.get(("resnet50_v2:1", 5, "SUCCESS"), 0) > 50, live


NO_WORKER = SCENARIO.replace("[[repository]]", """[faults]
kill = [{worker = 0, at_s = 1.0, back_s = 5.5}, {worker = 1, at_s = 1.0, back_s = 5.5}]

[[repository]]""", 1)


def test_requests_answered_before_the_default_slo_is_taken_log_it_as_live(tmp_path):
    """A request with the default SLO (no slo_ms) for an unloaded model is answered
    INVALID_REQUEST before the policy takes the default: its requests.tsv row had its
    deadline at its arrival; live (and now simulated) the default SLO's."""
    res = simulate(_scenario(tmp_path, SCENARIO.replace("slo_ms = 100\n", ""),
                             ["scheduler.default_slo_ms=70"]))
    res.write(tmp_path / "a")
    rows = [r for r in _rows(tmp_path / "a") if r["status"] == "INVALID_REQUEST"]
    assert len(rows) > 100
    assert {int(r["deadline"]) - int(r["arrival"]) for r in rows} == {70_000_000}


def test_a_load_with_no_worker_to_take_it_fails_as_live(tmp_path):
    """Both workers dead from 1 s: the load at 4 s fails, as the live repository refuses
    it (no worker connected and answering), said in the log; the model stays unloaded, and
    the run goes on, every request answered once: those for the unloaded model
    INVALID_REQUEST, as the live intake answers them before it looks for a worker, the
    others ERROR (no worker)."""
    sim = Simulation(_scenario(tmp_path, NO_WORKER))
    res = sim.run()
    said = [what for _, what in sim.fault_log if what.startswith("repository")]
    assert said == ["repository: unloaded resnet50_v2 (2 instance(s))",
                    "repository: load resnet50_v2 failed: no worker is connected and "
                    "answering"], said
    res.write(tmp_path / "a")
    counts = _by_second(_rows(tmp_path / "a"))
    assert counts.get(("resnet50_v2", 5, "INVALID_REQUEST"), 0) > 50, counts
    assert counts.get(("resnet50_v2", 3, "INVALID_REQUEST"), 0) > 50, counts
    assert counts.get(("mobilenet_v2", 3, "ERROR"), 0) > 50, counts
    assert not any(k[2] == "ERROR" for k in counts if k[0] == "resnet50_v2" and k[1] >= 2)
    s = res.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]


@pytest.mark.faults
def test_serve_exits_1_naming_an_event_it_could_not_play(tmp_path):
    """Live, the same scenario: the controller refuses the load; serve says so as it
    happens and again at the end, and exits 1 (the run is not the scenario's)."""
    p = _serve(tmp_path, NO_WORKER)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "repository: load resnet50_v2 failed:" in p.stderr, p.stderr[-3000:]
    assert "could not be played, so this run is not the scenario's" in p.stderr
    last = [x for x in p.stderr.splitlines() if "could not be played" in x]
    assert len(last) == 1 and "repository: load resnet50_v2: " in last[0], last


def test_serve_without_replay_says_the_events_are_not_played(tmp_path):
    from clockwork.cluster.serve import live_ignored

    assert "repository (played by --replay only)" in live_ignored(_scenario(tmp_path),
                                                                  replay=False)
    assert live_ignored(_scenario(tmp_path), replay=True) == []


def test_replay_against_a_running_controller_refuses_them(tmp_path):
    """``clockwork replay`` starts no cluster of its own: it says so, before connecting."""
    p = replay_with_no_controller(tmp_path, SCENARIO)
    assert p.returncode == 2 and "[[repository]] events" in p.stderr, p.stderr
    assert "clockwork serve SCENARIO --replay plays them" in p.stderr
