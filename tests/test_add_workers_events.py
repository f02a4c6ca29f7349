"""A scenario's ``[[add_workers]]`` events: workers that join the cluster during a run, in
the simulator (``ControllerLoop.add_worker``, as the live controller's AddWorker) and, the
same scenario, on a live cluster (``clockwork serve --replay``: the joining workers'
processes start before the run, and the controller connects each at its time)."""

from __future__ import annotations

import collections
import csv
import re
import subprocess
import sys

import pytest

from clockwork.cluster.sim import Simulation, simulate
from clockwork.scenario import ScenarioError, joining_workers, load_scenario
from tests.conftest import replay_with_no_controller

# one GPU cannot carry the load (requests time out); a second joins at 3 s
SCENARIO = """
name = "add-workers"
seed = 2
duration_s = 8.0

[cluster]
workers = 1
gpus_per_worker = 1

[[models]]
name = "resnet50_v2"
copies = 4

[[workloads]]
kind = "poisson"
models = "*"
rate_rps = 1800
slo_ms = 100

[[add_workers]]
at_s = 3.0
"""


def _scenario(tmp_path, text: str = SCENARIO, overrides=()):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_scenario(path, list(overrides))


def _rows(folder, name: str = "requests.tsv") -> list[dict]:
    with open(folder / name) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _by_second(rows) -> dict:
    """(whole second of arrival, status) -> requests."""
    return dict(collections.Counter((int(float(r["arrival"]) // 1e9), r["status"])
                                    for r in rows))


def test_a_worker_that_joins_takes_work_from_its_time_on(tmp_path):
    """No action goes to worker 1 before it joins at 3 s; from then on it serves about
    half the requests and none times out; two runs are identical."""
    sim = Simulation(_scenario(tmp_path))
    res = sim.run()
    assert sim.fault_log == [(3_000_000_000, "cluster: worker 1 joined (1 GPU(s))")]
    res.write(tmp_path / "a")
    acts = _rows(tmp_path / "a", "actions.tsv")
    on1 = [int(a["sent"]) for a in acts if a["worker"] == "1"]
    assert on1 and min(on1) >= 3e9, on1[:5]
    counts = _by_second(_rows(tmp_path / "a"))
    assert counts.get((1, "TIMEOUT"), 0) > 100, counts  # (one GPU: overloaded)
    for sec in (4, 5, 6, 7):
        assert (sec, "TIMEOUT") not in counts and counts[(sec, "SUCCESS")] > 1700, counts
    gpu1 = [r for r in _rows(tmp_path / "a") if r["gpu"] == "1"]
    assert len(gpu1) > 4000 and res.summary["gpus"] == 2
    assert simulate(_scenario(tmp_path)).summary == res.summary


def test_joining_workers_count_in_the_gpus_a_cluster_may_have(tmp_path):
    """Workers added past the GPUs a cluster may have (65,536) are refused, as a cluster
    that large at the start is (the run went ahead with 128,064 GPUs)."""
    with pytest.raises(ScenarioError, match=r"add_workers: 1,101 workers of 64 GPU\(s\) in "
                       r"all with cluster.workers, 70,464 GPUs: more than a cluster may "
                       r"have \(65,536\)"):
        joining_workers(_scenario(tmp_path, overrides=[
            "cluster.gpus_per_worker=64", "add_workers=[{at_s=1, count=1100}]"]))


def test_joining_workers_take_the_next_indices_in_time_order(tmp_path):
    sc = _scenario(tmp_path, overrides=[
        "cluster.workers=2", "add_workers=[{at_s=5, count=2}, {at_s=1}]"])
    assert joining_workers(sc) == [(1.0, 2), (5.0, 3), (5.0, 4)]


@pytest.mark.parametrize("overrides,error", [
    (["add_workers.0.at_s=8"], "add_workers.0.at_s: must be before the end (duration_s 8)"),
    (["add_workers.0.count=0"], "add_workers.0.count: must be an integer in [1, 10000]"),
    (["faults.kill=[{worker=1, at_s=5}]"],
     "faults.kill.0.worker: 1 is not one of the 1 worker(s) at the start"),
    (["faults.controller_restart=[{at_s=5}]"],
     "add_workers: not together with faults.controller_restart"),
    (["cluster.workers=10000"], "add_workers: 10,001 workers in all with cluster.workers"),
])
def test_add_workers_are_checked_before_anything_runs(tmp_path, overrides, error):
    with pytest.raises(ScenarioError) as e:
        Simulation(_scenario(tmp_path, overrides=overrides))
    assert error in str(e.value), str(e.value)


@pytest.mark.faults
def test_a_worker_joins_a_live_run_at_its_time(tmp_path):
    """``clockwork serve --replay``: the joining worker's process is started before the
    run and the controller connects it at 3 s: no request is answered on its GPU before
    then, the timeouts end, and from two seconds after it the requests are answered as
    in the simulator (within 1 % a second, or 3 % in all with one second of a host's
    hiccup)."""
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--replay", "--quiet", "--out", str(tmp_path / "live")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "cluster: worker 1 joined (1 GPU(s))" in p.stderr, p.stderr[-3000:]
    rows = _rows(tmp_path / "live")
    # played at its time; the join itself (connect, clock, Hello) takes longer on a
    # loaded host, so its first answer is measured from when the join was done
    joined = float(re.search(r"clockwork serve: +([\d.]+) s  cluster: worker 1 joined",
                             p.stderr)[1])
    assert 3.0 <= joined < 4.0, joined
    first = min(int(r["arrival"]) + int(r["latency"]) for r in rows if r["gpu"] == "1")
    # (answered at arrival + latency, ns from the start)
    assert 3e9 <= first < (joined + 0.5) * 1e9, (first, joined)
    on1 = collections.Counter(int(r["arrival"]) // 10**9 for r in rows
                              if r["gpu"] == "1" and r["status"] == "SUCCESS")
    simulate(_scenario(tmp_path)).write(tmp_path / "sim")
    live, sim = _by_second(rows), _by_second(_rows(tmp_path / "sim"))
    # before the join both are overloaded (how many time out moves with the host's load:
    # the test processes share it)
    for sec in (0, 1):
        assert live.get((sec, "TIMEOUT"), 0) > 100 and sim.get((sec, "TIMEOUT"), 0) > 100
    # once the backlog is gone (two seconds after the join) both answer (nearly)
    # everything. A host that the suite's other processes load as well can starve this
    # cluster's processes for tens of ms (a burst of TIMEOUTs answered at one instant, or
    # a worker found suspect for a probe it answered late, its actions failed): one such
    # second is allowed, as long as the three together stay within 3 %. A worker that
    # does not take work leaves one GPU for 1,800 requests a second: ~300 of them fail
    # in each second; one that takes it late (the backlog of a join at 4 s is gone by 5 s)
    # answers nothing in the first second after its time, or too few after that.
    assert all((sec, "TIMEOUT") not in sim for sec in (5, 6, 7)), sim
    ok = {sec: sim[(sec, "SUCCESS")] for sec in (5, 6, 7)}
    failed = {sec: ok[sec] - live.get((sec, "SUCCESS"), 0) for sec in ok}
    assert sum(1 for sec in ok if failed[sec] > 0.01 * ok[sec]) <= 1, (failed, live)
    assert sum(failed.values()) <= 0.03 * sum(ok.values()), (failed, live)
    for sec in (4, 5, 6, 7):  # (and the joined GPU takes its share of them)
        assert on1[sec] >= 0.3 * live[(sec, "SUCCESS")], (sec, on1, live)


def test_serve_without_replay_and_replay_refuse_or_say_so(tmp_path):
    from clockwork.cluster.serve import live_ignored

    assert "add_workers (played by --replay only)" in live_ignored(_scenario(tmp_path),
                                                                   replay=False)
    p = replay_with_no_controller(tmp_path, SCENARIO)
    assert p.returncode == 2 and "[[add_workers]] events" in p.stderr, p.stderr
    assert "--set add_workers=[]" in p.stderr


CLOSED = """
name = "closed-join"
seed = 1
duration_s = 6.0

[cluster]
workers = 1
gpus_per_worker = 1

[[models]]
name = "resnet50_v2"

[[workloads]]
kind = "closed_loop"
models = "*"
concurrency = 4
slo_ms = 100

[faults]
kill = [{worker = 0, at_s = 1.0}]

[[add_workers]]
at_s = 2.0
"""


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_a_worker_that_joins_after_every_gpu_was_lost_serves_again(tmp_path, policy):
    """The only worker dies at 1 s; one joins at 2 s: every policy serves there from then
    on (the baselines left the model without a copy waiting for a GPU to free up, and a
    GPU added at run time never did: requests unanswered at the end, or none served)."""
    sc = _scenario(tmp_path, CLOSED, [f"scheduler.policy={policy}"])
    res = Simulation(sc).run()
    s = res.summary
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]
    res.write(tmp_path / "a")
    served = [r for r in _rows(tmp_path / "a") if r["gpu"] == "1" and r["status"] == "SUCCESS"]
    assert len(served) > 1000, (policy, len(served), s)


def test_same_time_events_play_in_one_order_in_the_simulator_and_live(tmp_path, monkeypatch):
    """At one time: faults, then the workers that join, then the repository events, in
    the simulator and in the live player's plan."""
    import clockwork.client
    from clockwork.cluster.faults import LiveFaults
    from clockwork.scenario import repository_plan

    text = SCENARIO + """
[[repository]]
at_s = 3.0
unload = "resnet50_v2"
"""
    sc = _scenario(tmp_path, text)
    sim = Simulation(sc)
    sim.run()
    assert [w for _, w in sim.fault_log] == ["cluster: worker 1 joined (1 GPU(s))",
                                             "repository: unloaded resnet50_v2 (4 instance(s))"]

    class Child:
        proc = None

    class Cluster:  # (what LiveFaults asks of a LocalCluster)
        address = "127.0.0.1:1"
        workers = [Child()]

        def spare_worker(self):
            self.workers.append(Child())
            return "127.0.0.1:2"

    class Client:  # (no controller: the plan is all this looks at)
        def __init__(self, *a, **kw):
            pass

        def list_models_raw(self):
            return None

    monkeypatch.setattr(clockwork.client, "Client", Client)
    live = LiveFaults(Cluster(), {}, sc.duration_s, repository_plan(sc), None,
                      {"resnet50_v2": 4}, joining_workers(sc))
    assert [(at, what) for at, _, what, _ in live.plan] == [(3.0, "join"), (3.0, "unload")]


def test_plan_and_serve_check_the_joining_workers_before_starting(tmp_path):
    """``clockwork plan`` chooses how many workers serve the whole run: it refuses them;
    serve counts the joining workers' processes against the machine's memory and refuses
    a fault naming one, before anything starts."""
    from clockwork.cluster.plan import PlanError, make_plan
    from clockwork.cluster.serve import events_error

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    with pytest.raises(PlanError, match=r"\[\[add_workers\]\] events"):
        make_plan(str(path), [], 0.99, None, 1, 4, 1)
    sc = _scenario(tmp_path, overrides=["faults.hang=[{worker=1, at_s=4, for_s=1}]"])
    assert "is not one of the 1 worker(s) at the start" in events_error(sc, True)
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--replay", "--set", "add_workers.0.count=9000"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "9,001 local worker processes need" in p.stderr, p.stderr


def test_ctrl_c_while_the_joining_workers_start_stops_serve(tmp_path, monkeypatch, capsys):
    """Ctrl-C while serve starts the joining workers' processes (cuda ones: minutes each)
    stops it before the next one starts, exit 130, no replay run."""
    import os
    import signal

    from clockwork.cluster import local
    from clockwork.cluster.cli import main

    started = []

    def spare_worker(self):
        started.append(True)
        os.kill(os.getpid(), signal.SIGINT)  # (serve's handler only notes it)
        return "127.0.0.1:1"

    monkeypatch.setattr(local.LocalCluster, "spare_worker", spare_worker)
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("at_s = 3.0", "at_s = 3.0\ncount = 3"))
    rc = main(["serve", str(path), "--replay", "--quiet", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 130 and started == [True], err[-2000:]
    assert "interrupted before the replay started" in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_clock_offsets_count_the_joining_workers_in_the_simulator_and_live(tmp_path):
    """One offset per worker, those that join included: more is refused alike by the
    simulator and by serve (which ignored the extra ones), before anything starts."""
    sc = _scenario(tmp_path, overrides=["cluster.clock_offsets_ms=[0, 1.5]"])
    Simulation(sc)  # (two: the one at the start and the one that joins)
    text = SCENARIO.replace("gpus_per_worker = 1", "gpus_per_worker = 1\n"
                            "clock_offsets_ms = [0, 1, 2]")
    with pytest.raises(ScenarioError, match=r"cluster.clock_offsets_ms: 3 offsets for 2 "
                                            r"worker\(s\) \(1 at the start and 1 that join\)"):
        Simulation(_scenario(tmp_path, text))
    path = tmp_path / "s.toml"
    path.write_text(text)
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--replay"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "3 offsets for 2 worker(s)" in p.stderr, p.stderr
