"""``clockwork serve --ray``: the workers as Ray actors on a local two-node Ray cluster
(``ray.cluster_utils.Cluster``, 2 emulated GPUs per node as the custom resource
``clockwork_gpu``). A replay at 300 r/s; a worker actor's process killed mid-run is
restarted by Ray and re-admitted by the controller, and every request is answered once.
Skipped without the ``ray`` extra; the one-line message without it is tested anyway."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

# Ray's nodes on 127.0.0.1 (else Ray uses this machine's address); read at Ray's import
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from clockwork.scenario import load_scenario  # noqa: E402
from tests.conftest import poll  # noqa: E402

# light, and room for retries: the test is about the deployment, on a shared CI host
# (a starved host runs actions past their windows; a retry within the SLO saves them)
RATE = 300
SLO_MS = 1000
DURATION_S = 10.0
KILL_RUN_S = 8.0
KILL_AT_S = 3.0


def _scenario(duration_s: float):
    return load_scenario(data={
        "seed": 7, "duration_s": duration_s,
        "cluster": {"workers": 2, "gpus_per_worker": 2, "backend": "ray"},
        "models": [{"name": "resnet18_v2", "copies": 4}, {"name": "mobilenet_v2", "copies": 4}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": RATE, "slo_ms": SLO_MS}],
    })


def _two_nodes(Cluster, node: dict, tries: int = 3):
    """A head and one more node, tried again when Ray's own start gives up: a node's
    raylet must register within a fixed 30 s (not a setting), which a starved CI host
    once missed and every test on the cluster errored. The processes a failed try
    started are killed; the tail of its raylet and GCS logs goes to stderr (the cause)."""
    import psutil

    me = psutil.Process()
    for attempt in range(1, tries + 1):
        before = {p.pid for p in me.children(recursive=True)}
        cluster = None
        try:
            cluster = Cluster(initialize_head=True,
                              head_node_args={**node, "include_dashboard": False})
            cluster.add_node(**node)
            return cluster
        except Exception as e:
            if attempt == tries:
                raise
            print(f"Ray's local cluster did not start (try {attempt} of {tries}): {e}",
                  file=sys.stderr)
            _print_ray_log_tails()
            if cluster is not None:
                cluster.shutdown()
            for p in me.children(recursive=True):
                if p.pid not in before:
                    with contextlib.suppress(psutil.Error):
                        p.kill()


def _print_ray_log_tails(lines: int = 20) -> None:
    import glob

    try:  # Ray's own place for its session folders (RAY_TMPDIR, TMPDIR, else /tmp)
        from ray._common.utils import get_default_ray_temp_dir
        root = get_default_ray_temp_dir()
    except ImportError:
        root = "/tmp/ray"
    logs = os.path.join(root, "session_latest", "logs")
    for path in sorted(glob.glob(os.path.join(logs, "raylet*.out"))
                       + glob.glob(os.path.join(logs, "gcs_server.out"))):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            tail = [ln for ln in f if not ln.startswith("[state-dump]")][-lines:]
            print(f"--- {path} (last {lines} lines)", *tail, sep="", file=sys.stderr)


@pytest.fixture(scope="module")
def ray_nodes():
    ray = pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "resources": {"clockwork_gpu": 2}, "node_ip_address": "127.0.0.1"}
    cluster = _two_nodes(Cluster, node)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_replay_on_ray_and_a_killed_worker_actor_is_readmitted(ray_nodes):
    import clockwork
    from clockwork.cluster.ray_cluster import RayCluster
    from clockwork.cluster.replay import replay

    t0 = time.monotonic()
    sc = _scenario(DURATION_S)
    with RayCluster(models="resnet18_v2:4,mobilenet_v2:4", http_port=-1, kserve_port=-1,
                    timeout=60.0) as c:
        assert len(c.worker_addresses) == 2 and [n for *_, n in c.nodes] == [2, 2]
        infos = [c.worker_info(i) for i in range(2)]
        assert len({i["node_id"] for i in infos}) == 2  # one worker per node
        started = time.monotonic() - t0
        with clockwork.Client(c.address, timeout=10) as cl:  # warm: every copy loaded
            for m in ("resnet18_v2", "mobilenet_v2"):
                for k in range(4):
                    assert cl.infer(f"{m}:{k}" if k else m, slo_ms=5000).status == 0

        res = asyncio.run(asyncio.wait_for(replay(sc, c.address), DURATION_S + 60))
        s = res.summary
        assert res.answered_once
        assert s["submitted"] >= 0.9 * RATE * DURATION_S
        # live processes on a shared 2-core machine (Ray's own daemons included): 0.999
        # holds on a quiet one, 0.48 was seen at a load of 4; misses under load come from
        # the CPU, not the deployment, so this checks the deployment serves, not its speed
        if s["succeeded"] < 0.3 * s["submitted"]:
            print(s, "".join(c.controller.output[-60:]))
        assert s["succeeded"] >= 0.3 * s["submitted"]

        # kill worker 0's process mid-run: Ray restarts it, the controller re-admits it
        victim = c.worker_info(0)
        times: dict[str, float] = {}

        def on_start(t_ns: int) -> None:
            def kill() -> None:
                time.sleep(KILL_AT_S)
                n = len(c.controller.output)
                times["kill"] = time.monotonic()
                os.kill(victim["pid"], signal.SIGKILL)
                back = f"worker {victim['address']} reconnected"
                while time.monotonic() < times["kill"] + 30 and len(times) < 3:
                    if "readmitted" not in times and any(
                            back in line for line in c.controller.output[n:]):
                        times["readmitted"] = time.monotonic()
                    if "ready" not in times:
                        try:
                            if c.worker_info(0, timeout=1.0)["pid"] != victim["pid"]:
                                times["ready"] = time.monotonic()
                        except Exception:  # noqa: BLE001 - Ray is restarting it
                            pass
                    time.sleep(0.02)
            threading.Thread(target=kill, daemon=True).start()

        n_out = len(c.controller.output)
        res2 = asyncio.run(asyncio.wait_for(
            replay(_scenario(KILL_RUN_S), c.address, on_start=on_start), KILL_RUN_S + 60))
        s2 = res2.summary
        assert res2.answered_once, s2
        assert s2["submitted"] == s2["succeeded"] + s2["failed"] + s2["dropped"]
        # (Ray restarts the actor in ~1-2 s on a quiet host; a starved one may take longer
        # than the run: wait for the controller's line)
        back = f"worker {victim['address']} reconnected"
        deadline = time.monotonic() + 60
        while (back not in "".join(c.controller.output[n_out:])
               and time.monotonic() < deadline):
            time.sleep(0.05)
        after = "".join(c.controller.output[n_out:])
        assert f"lost worker {victim['address']}" in after, after
        assert back in after, after
        again = c.worker_info(0)
        assert again["restarted"] and again["address"] == victim["address"]
        assert again["pid"] != victim["pid"]
        with clockwork.Client(c.address, timeout=10) as cl:
            st = cl.stats()
            assert st["worker_connects"] == 3 and st.get("replies_duplicate", 0) == 0
            # the re-admitted worker's GPUs serve again
            gpus = {cl.infer(f"resnet18_v2:{k}" if k else "resnet18_v2", slo_ms=500).gpu
                    for k in range(4)
                    for _ in range(3)}
        print(f"\nray: cluster up in {started:.1f} s; {s['submitted']} requests, attainment "
              f"{s['slo_attainment']:.4f}, p99 {s['latency_ms']['p99']:.1f} ms; kill run "
              f"{s2['submitted']} requests, attainment {s2['slo_attainment']:.4f}, "
              f"actor back {times['ready'] - times['kill']:.2f} s and re-admitted "
              f"{times['readmitted'] - times['kill']:.2f} s after the kill; "
              f"GPUs serving {sorted(gpus)}")


def _serve_replay(scenario, address: str, out) -> str:
    """``clockwork serve SCENARIO --ray ADDRESS --replay --out OUT``, which must exit 0:
    what it printed."""
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(scenario),
                        "--ray", address, "--replay", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    return said


def test_serve_ray_replays_a_scenario_on_the_attached_cluster(ray_nodes, tmp_path):
    """The command line: ``clockwork serve SCENARIO --ray ADDRESS --replay`` attaches to the
    running Ray cluster, starts a worker on each of its nodes, replays and stops them."""
    import ray

    sc = tmp_path / "s.toml"
    sc.write_text("""
seed = 2
duration_s = 3.0
[cluster]
workers = 2
gpus_per_worker = 2
[[models]]
name = "resnet18_v2"
copies = 2
[[workloads]]
kind = "poisson"
rate_rps = 200
slo_ms = 100
""")
    out = _serve_replay(sc, ray_nodes.address, tmp_path / "run")
    assert "2 emulated worker actor(s) on Ray node(s) x 2+2 GPU(s)" in out, out[-3000:]
    assert "every request answered exactly once: True" in out
    assert (tmp_path / "run" / "summary.json").exists()
    # its actors are gone: the nodes' GPUs are free again
    deadline = time.monotonic() + 30
    while ray.available_resources().get("clockwork_gpu", 0) < 4:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_repository_remove_workers_and_restart_events_are_played_on_ray(ray_nodes, tmp_path):
    """A scenario's ``[[repository]]`` and ``[[remove_workers]]`` events on Ray, as on a
    local cluster: a copy unloaded at its time (its later requests refused), worker 1
    drained and taken out (its GPUs serve nothing after, and the node watcher, which
    gives a node without a worker one, does not bring it back); and a controller restart,
    whose new controller takes the actors over. They were refused."""
    import csv

    from clockwork.time import sec

    sc = tmp_path / "s.toml"
    sc.write_text("""
seed = 4
duration_s = 5.0
[cluster]
workers = 2
gpus_per_worker = 2
[[models]]
name = "resnet18_v2"
copies = 4
[[workloads]]
kind = "poisson"
rate_rps = 200
slo_ms = 1000
[[repository]]
at_s = 1.0
unload = "resnet18_v2:3"
[[remove_workers]]
at_s = 1.5
worker = 1
drain = true
""")
    out = _serve_replay(sc, ray_nodes.address, tmp_path / "run")
    assert "repository: unloaded resnet18_v2:3 (1 instance(s))" in out, out[-3000:]
    assert "cluster: worker 1 removed (drained)" in out, out[-3000:]
    assert "every request answered exactly once: True" in out
    with open(tmp_path / "run" / "requests.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    late = [r for r in rows if int(r["arrival"]) > sec(2.0)]
    assert late and all(r["gpu"] in ("0", "1", "-1") for r in late), \
        {r["gpu"] for r in late}
    assert any(r["status"] == "SUCCESS" for r in late)
    gone = [r for r in rows if r["model"] == "resnet18_v2:3" and int(r["arrival"]) > sec(1.1)]
    assert gone and all(r["status"] == "INVALID_REQUEST" for r in gone), gone[:3]
    # a controller restart on Ray: the new one takes the worker actors over
    text = sc.read_text()
    sc.write_text(text[:text.index("[[repository]]")]
                  + "[faults]\ncontroller_restart = [{ at_s = 1.5, down_s = 0.2 }]\n")
    out = _serve_replay(sc, ray_nodes.address, tmp_path / "run2")
    assert "fault: controller killed" in out and "fault: new controller started" in out
    assert "every request answered exactly once: True" in out
    with open(tmp_path / "run2" / "requests.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert {r["gpu"] for r in rows if r["status"] == "SUCCESS"
            and int(r["arrival"]) > sec(4.0)} == {"0", "1", "2", "3"}


def test_without_ray_serve_ray_says_what_to_install(tmp_path):
    """No ray installed (its import blocked): ``serve --ray``, a scenario's backend =
    "ray" and ``sweep --ray`` are one line naming the extra, exit 2."""
    sc = tmp_path / "s.toml"
    sc.write_text('[cluster]\nbackend = "ray"\n[[models]]\nname = "resnet18_v2"\n'
                  '[[workloads]]\nkind = "poisson"\nrate_rps = 10\n')
    code = f"""
import sys
sys.modules["ray"] = None
from clockwork.cluster.cli import main
print("RC", main(["serve", "--ray"]))
print("RC", main(["serve", {str(sc)!r}, "--replay"]))
print("RC", main(["serve", "--ray", "auto", "--port", "0"]))
print("RC", main(["sweep", "example", "--ray", "--quiet", "--out", {str(tmp_path / "sw")!r}]))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("RC 2") == 4, p.stdout
    lines = p.stderr.strip().splitlines()
    hint = "needs ray: pip install -e '.[ray]' in your clockwork-py checkout"
    assert lines[:3] == [f"clockwork serve: {hint}"] * 3, p.stderr
    assert lines[3:] == [f"clockwork sweep: {hint}"], p.stderr


def test_ray_address_is_checked(capsys):
    """``--ray`` takes an optional ADDRESS: a scenario given after it is refused in one
    line that says to put the scenario first; ``cluster.backend`` is checked."""
    from clockwork.cluster.cli import main

    assert main(["serve", "--ray", "scenarios/poisson_warm.toml"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Ray address" in lines[0] and "before --ray" in lines[0], lines
    # the scenario key takes local or ray only
    assert main(["serve", "scenarios/poisson_warm.toml", "--set", "cluster.backend=k8s"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cluster.backend" in lines[0] and "k8s" in lines[0], lines


def test_a_ray_cluster_that_does_not_connect_is_said_with_what_to_look_at(monkeypatch):
    """Ray connecting to a cluster at an address retries for minutes, saying only its own
    words (a head advertising an address this machine cannot reach, a token it
    refuses): after ``CONNECT_SAY_S`` one line says what to look at, and a connection
    Ray gives up on is one line naming the address and the same (it said "Failed to
    connect to Ray cluster at ..." alone)."""
    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.local import ChildRefused

    said = threading.Event()
    lines: list[str] = []

    class Stderr:
        def write(self, text):
            lines.append(text)
            if "not connected after" in text:
                said.set()

        def flush(self):
            pass

    def init_ray(**kw):  # (Ray retrying until the line is said, then giving up)
        assert kw["address"] == "10.0.0.9:6379"
        assert said.wait(10)
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379")

    monkeypatch.setattr(ray_cluster, "CONNECT_SAY_S", 0.05)
    monkeypatch.setattr(ray_cluster, "init_ray", init_ray)
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(sys, "stderr", Stderr())
    with pytest.raises(ChildRefused) as e:
        ray_cluster.RayCluster(address="10.0.0.9:6379")._init_ray()
    text = "".join(lines)
    assert "--ray 10.0.0.9:6379: not connected after 0 s" in text, text
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in text and "RAY_AUTH_TOKEN" in text
    assert str(e.value).startswith("--ray 10.0.0.9:6379: Ray did not connect (Failed to "
                                   "connect to Ray cluster at 10.0.0.9:6379); check the address")


def test_a_node_that_joins_gets_a_worker_that_serves(ray_nodes, capfd):
    """A third Ray node offering 2 GPUs joins while the cluster serves: a worker actor is
    started there and added to the running controller, whose new GPUs (4 and 5) then hold
    copies and serve requests. A controller restarted then (``restart_controller``) has
    the three workers (it had the first two: the joined node counted as known, so its
    worker was never added to it). The node then leaves: said once (a call on its actor
    fails ActorUnschedulableError, not ActorDiedError, and it went unsaid), and its
    worker is removed from the controller (it was reconnected to for as long as it ran),
    and not given to a controller restarted after."""
    import clockwork
    from clockwork.cluster.ray_cluster import RayCluster

    with RayCluster(models="resnet18_v2:6", http_port=-1, kserve_port=-1, timeout=60.0,
                    watch_s=0.5) as c, clockwork.Client(c.address, timeout=10) as cl:
        assert len(c.worker_addresses) == 2
        node = ray_nodes.add_node(num_cpus=1, resources={"clockwork_gpu": 2},
                                  node_ip_address="127.0.0.1")
        try:
            # (a node that has just joined may be refused by Ray's scheduler for a while, a
            # minute on a loaded machine: the watcher tries it again, 1, 2, 4, ... looks on)
            deadline = time.monotonic() + 150
            # (the controller counts the worker as its AddWorker ends; the node watcher
            # records it once the call's answer is back: both, polled)
            while cl.stats().get("workers_added", 0) < 1 or len(c.worker_addresses) < 3:
                assert time.monotonic() < deadline, "the new node's worker was not added"
                time.sleep(0.1)
            assert len(c.worker_addresses) == 3 and len(c.nodes) == 3
            _runs_on_the_new_gpus(cl, deadline)
            c.controller.proc.kill()
            c.controller.proc.wait()
            c.restart_controller()
            assert asyncio.run(_workers_and_gpus(c.address)) == (3, 6)
            capfd.readouterr()
            ray_nodes.remove_node(node)
            node, said = None, ""
            while "is gone: the controller serves without it" not in said:
                assert time.monotonic() < deadline + 60, f"the node's leaving unsaid: {said}"
                time.sleep(0.2)
                said += capfd.readouterr().err
            assert "clockwork: worker 2 (" in said, said
            # taken out of the controller for good: not reconnected to, out of the counts
            assert "serves without it (removed from the controller)" in said, said
            assert asyncio.run(_workers_and_gpus(c.address)) == (2, 4)
            assert cl.stats().get("workers_removed") == 1
            # a controller restarted after it left is not given its worker (it was, and
            # counted it, dialing it on)
            c.controller.proc.kill()
            c.controller.proc.wait()
            c.restart_controller()
            argv = c.controller.proc.args
            assert c.worker_addresses[2] not in argv[argv.index("--workers") + 1], argv
            assert asyncio.run(_workers_and_gpus(c.address)) == (2, 4)
        finally:
            c.stop()
            if node is not None:
                ray_nodes.remove_node(node)


async def _workers_and_gpus(address: str) -> tuple[int, int]:
    import clockwork

    async with clockwork.AsyncClient(address, timeout=10) as k:
        info = await k.list_models_raw()
        return info.workers, info.gpus


def _runs_on_the_new_gpus(cl, deadline: float) -> None:
    """Requests for the six copies of resnet18_v2 until one runs on GPU 4 or 5, the new
    node's (six copies on six GPUs: the new ones take some), by ``deadline``."""
    gpus: set = set()
    while not gpus & {4, 5}:
        assert time.monotonic() < deadline, f"no request ran on GPUs 4-5: {gpus}"
        for k in range(6):
            gpus.add(cl.infer(f"resnet18_v2:{k}" if k else "resnet18_v2", slo_ms=500).gpu)


def test_a_worker_actor_killed_for_good_gets_a_new_one_serving_its_place(ray_nodes):
    """``ray.kill(actor)`` (no restart: ``ray.kill``'s default): the node watcher makes a
    new actor on the same node serving the worker's place on the port it had, and the
    controller, reconnecting to it there, takes it back. (It was never noticed: serve ran
    on without that worker, a replay's requests failing "no worker is available".)"""
    import ray

    import clockwork
    from clockwork.cluster.ray_cluster import RayCluster
    from tests.conftest import wait_output

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    with RayCluster(models="resnet18_v2:2", http_port=-1, kserve_port=-1, timeout=60.0,
                    watch_s=0.5) as c, clockwork.Client(c.address, timeout=10) as cl:
        old, address, dead = c.worker_info(0), c.worker_addresses[0], c.actors[0]
        ray.kill(dead, no_restart=True)
        deadline = time.monotonic() + 120
        while c.actors[0] is dead:
            assert time.monotonic() < deadline, "no new actor for worker 0"
            time.sleep(0.1)
        new = c.worker_info(0)
        assert new["pid"] != old["pid"] and new["node_id"] == old["node_id"], (old, new)
        assert (new["address"], new["index"]) == (address, 0), new
        wait_output(c.controller, f"controller: worker {address} reconnected", 60)
        assert c.worker_addresses[0] == address and len(c.actors) == 2
        # (the dead actor's place file is gone: only the live actors' are left)
        from clockwork.cluster.ray_cluster import _state_dir

        poll(lambda: len(list(_state_dir(c.run_id).glob("worker*.json"))) == 2, 10.0, 0.1)
        for k in range(2):
            assert cl.infer(f"resnet18_v2:{k}" if k else "resnet18_v2", slo_ms=1000).status == 0


def test_sweep_points_run_as_ray_tasks_give_the_local_results(ray_nodes, tmp_path):
    """``--backend ray`` (``--ray ADDRESS``): the points run as Ray tasks on the attached
    cluster; every summary is the one a local, in-process run gives."""
    from clockwork.cluster.parallel import Point, run_points
    from clockwork.resources import resolve_scenario

    path = str(resolve_scenario("poisson_warm"))
    points = [Point("poisson_warm", path, ("duration_s=3", f"seed={s}"), (("seed", s),))
              for s in (1, 2, 3)]
    on_ray = run_points(points, tmp_path / "ray", backend="ray", progress=False)
    local = run_points(points, tmp_path / "local", jobs=1, progress=False)
    assert all(o.ok for o in on_ray), [o.error for o in on_ray]
    assert [o.summary for o in on_ray] == [o.summary for o in local]
    assert len({o.summary["seed"] for o in on_ray}) == 3


def test_sweep_ray_without_an_address_starts_a_local_instance(monkeypatch):
    """``--ray`` alone or ``--ray local`` starts a local Ray instance (``ray.init`` with
    address "local"), not the cluster RAY_ADDRESS names or a running ``ray start`` head
    (which ``ray.init()`` attaches to); ``--ray ADDRESS`` attaches there; ``--backend
    ray`` takes RAY_ADDRESS, else a local instance."""
    import argparse

    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from clockwork.cluster import parallel, ray_cluster

    seen = []
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", lambda **kw: seen.append(kw["address"]))
    monkeypatch.setattr(ray_cluster.ray, "shutdown", lambda: None)
    for flag, env, address in [("local", "127.0.0.1:1", "local"), ("local", None, "local"),
                               ("auto", "127.0.0.1:1", "auto"),
                               ("10.0.0.1:6379", None, "10.0.0.1:6379"),
                               (None, "127.0.0.1:1", "127.0.0.1:1"), (None, None, "local")]:
        if env is None:
            monkeypatch.delenv("RAY_ADDRESS", raising=False)
        else:
            monkeypatch.setenv("RAY_ADDRESS", env)
        args = argparse.Namespace(ray=flag, backend="ray")
        assert parallel.backend_of(args) == "ray"
        parallel.backend("ray")(4).shutdown()
        assert seen[-1] == address, (flag, env, seen)


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_sweep_and_plan_on_ray_auto_with_no_cluster_say_so_in_one_line_exit_2(
        tmp_path, command, monkeypatch, capsys):
    """``--ray auto`` with no Ray cluster to find: one line of ours, exit 2 (it was
    Ray's own message, naming an ``--address`` flag these commands lack, exit 1). Ray
    finds any cluster running on this machine (this module's own): its failure to find
    one is Ray's ConnectionError, raised here where Ray raises it."""
    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.cli import main

    def no_cluster(**kw):
        assert kw["address"] == "auto"
        raise ConnectionError("Could not find any running Ray instance. Please specify the "
                              "one to connect to by setting `--address` flag or "
                              "`RAY_ADDRESS` environment variable.")

    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster, "init_ray", no_cluster)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    sw = tmp_path / "g.toml"
    sw.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1"]\n[grid]\n')
    argv = ([str(sw), "--out", str(tmp_path / "out")] if command == "sweep"
            else ["poisson_warm", "--set", "duration_s=1", "--slo-ms", "100"])
    assert main([command, *argv, "--ray", "auto", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"clockwork {command}: --ray auto: no running Ray cluster found from "
                   "this machine ($RAY_ADDRESS unset, none started here); start one (ray "
                   "start --head), give its address (--ray HOST:PORT), or give --ray alone "
                   "for a one-node Ray instance of its own"], err


def _ray_cpus_free() -> float:
    import ray

    return ray.available_resources().get("CPU", 0.0)


def test_sweep_on_ray_finds_paths_relative_to_the_callers_folder(ray_nodes, tmp_path,
                                                                 monkeypatch):
    """A scenario's relative paths (a profile set ``./rp``, a trace ``tr/t.csv.gz``) mean
    the folder of the process that runs the sweep, as in a local run: a Ray task (whose
    working folder is another) runs each point with the same files, and gives the same
    summary."""
    from clockwork.cluster.parallel import Point, run_points
    from tests.conftest import scenario_apart_from_its_files

    monkeypatch.chdir(tmp_path)
    scenario_apart_from_its_files(tmp_path, "rp", "tr")
    points = [Point("sub/s.toml", "sub/s.toml", (f"seed={s}",), (("seed", s),))
              for s in (1, 2)]
    local = run_points(points, tmp_path / "local", jobs=1, progress=False)
    assert all(o.ok for o in local), [o.error for o in local]
    on_ray = run_points(points, tmp_path / "ray", backend="ray", progress=False)
    assert all(o.ok for o in on_ray), [o.error for o in on_ray]
    assert [o.summary for o in on_ray] == [o.summary for o in local]
    # what the point was given stays as written (run.json's overrides)
    import json
    run = json.loads((on_ray[0].folder / "run.json").read_text())
    assert run["overrides"] == ["seed=1"], run


def _one_point_sweep_on(ray_nodes, tmp_path, duration_s: int):
    """``clockwork sweep --ray ADDRESS`` of one ``poisson_warm`` point of ``duration_s``,
    started once the cluster's CPUs are all free (the earlier tests' work ended): (the
    process, the cluster's CPUs)."""
    sw = tmp_path / "sw.toml"
    sw.write_text(f'scenarios = ["poisson_warm"]\noverrides = ["duration_s={duration_s}"]\n')
    import ray

    before = ray.cluster_resources()["CPU"]
    poll(lambda: _ray_cpus_free() >= before, 60.0, 0.1)
    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "sweep", str(sw),
                          "--ray", ray_nodes.address, "--quiet", "--out", str(tmp_path / "o")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, before


def test_sweep_on_ray_stops_on_sigterm_as_on_ctrl_c(ray_nodes, tmp_path):
    """``clockwork sweep --ray ADDRESS``: SIGTERM while a point runs as a Ray task stops
    the sweep as Ctrl-C does ("interrupted", exit 130), not with Ray's own handler."""
    p, before = _one_point_sweep_on(ray_nodes, tmp_path, 3000)
    try:
        def running() -> bool:
            """the point's Ray task holds a CPU of the cluster"""
            assert p.poll() is None, p.communicate()
            return _ray_cpus_free() < before
        poll(running, 60.0, 0.1)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (p.returncode, err[-3000:])
    assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    poll(lambda: _ray_cpus_free() >= before, 60.0, 0.1)  # the task was stopped


def test_a_sweep_point_whose_ray_task_process_dies_is_run_again(ray_nodes, tmp_path):
    """A point's Ray task whose process is killed (out of memory, a node's process
    reaped) is run once more and the sweep ends as a local one would (it was an error
    row, "WorkerCrashedError", exit 1, where a local pool runs the point again alone)."""
    p, _ = _one_point_sweep_on(ray_nodes, tmp_path, 600)
    try:
        def task() -> list[str]:
            """the process running the point's task (Ray names it after the function)"""
            assert p.poll() is None, p.communicate()
            return subprocess.run(["pgrep", "-f", "^ray::_own_then"], capture_output=True,
                                  text=True).stdout.split()
        pids = poll(task, 60.0, 0.05)
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, (p.returncode, err[-3000:])
    assert "WorkerCrashedError" not in err, err[-3000:]
    assert (tmp_path / "o" / "results.tsv").read_text().count("\n") == 2  # header, the point


def test_sigterm_while_a_local_ray_starts_stops_as_ctrl_c_and_leaves_no_process(tmp_path):
    """``clockwork sweep --ray local`` sent SIGTERM while ``ray.init`` starts its local
    instance (Ray's session folder made, seconds before it is up): "interrupted", exit
    130, and none of the processes Ray started is left (it exited 15 by Ray's own
    handler, and left Ray's processes to end by themselves, up to minutes later)."""
    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    sw = tmp_path / "sw.toml"
    sw.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=3000"]\n')
    root = tmp_path / "r"
    root.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "sweep", str(sw),
                          "--ray", "local", "--quiet", "--out", str(tmp_path / "o")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "RAY_TMPDIR": str(root)})

    def left() -> list[str]:
        """the processes of this Ray instance (their command lines name its folder)"""
        return subprocess.run(["pgrep", "-f", str(root)], capture_output=True,
                              text=True).stdout.split()
    try:
        def starting() -> bool:
            assert p.poll() is None, p.communicate()
            return any(root.rglob("session_*"))
        poll(starting, 60.0, 0.01)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 130, (p.returncode, err[-3000:])
        assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
        poll(lambda: not left(), 20.0, 0.2)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        subprocess.run(["pkill", "-9", "-f", str(root)])


def test_a_node_that_cannot_host_a_worker_now_is_tried_again(ray_nodes, capsys):
    """A node that offers GPUs but no CPU for a worker actor (each takes
    ``worker_num_cpus``, 1) is left out in one line, once, and the cluster starts on the
    others. A node whose GPUs are taken (the actor cannot start in time) is one line, its
    pending actor is killed (so it does not take the GPUs later, unseen), and the node is
    tried again on a later look: once its GPUs are free it gets a worker."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import clockwork
    from clockwork.cluster.ray_cluster import RayCluster

    nodes = [ray_nodes.add_node(num_cpus=0, resources={"clockwork_gpu": 2},
                                node_ip_address="127.0.0.1")]
    try:
        ray_nodes.wait_for_nodes()
        with RayCluster(models="resnet18_v2:2", http_port=-1, kserve_port=-1, timeout=60.0,
                        watch_s=0) as c:
            assert len(c.worker_addresses) == 2 and len(c.nodes) == 2
            assert c.add_new_nodes() == [] and c.add_new_nodes() == []
            err = capsys.readouterr().err
            no_cpu = [line for line in err.splitlines() if nodes[0].node_id[:12] in line]
            assert len(no_cpu) == 1 and "CPU" in no_cpu[0], err
            assert "Traceback" not in err, err

            # a node whose GPUs another actor holds
            nodes.append(ray_nodes.add_node(num_cpus=1, resources={"clockwork_gpu": 2},
                                            node_ip_address="127.0.0.1"))
            ray_nodes.wait_for_nodes()

            @ray.remote(num_cpus=0, resources={"clockwork_gpu": 2})
            class Holder:
                def ready(self) -> bool:
                    return True

            holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                nodes[1].node_id, soft=False)).remote()
            ray.get(holder.ready.remote(), timeout=60)
            c.timeout = 3.0  # (how long a new node's worker actor may take to start)
            assert c.add_new_nodes() == []
            err = capsys.readouterr().err
            held = [line for line in err.splitlines() if nodes[1].node_id[:12] in line]
            assert len(held) == 1, err
            assert "Traceback" not in err, err
            ray.kill(holder)
            c.timeout = 60.0
            added = []
            for _ in range(8):  # (a node that failed is looked at again after a few looks)
                added = c.add_new_nodes()
                if added:
                    break
            assert len(added) == 1 and added[0]["gpus"] == [4, 5], added
            assert len(c.worker_addresses) == 3 and len(c.nodes) == 3
            err = capsys.readouterr().err
            assert sum(nodes[0].node_id[:12] in line for line in err.splitlines()) == 0, err
            with clockwork.Client(c.address, timeout=10) as cl:
                assert cl.stats().get("workers_added", 0) == 1
    finally:
        for n in nodes:
            ray_nodes.remove_node(n)


class _RpcError(grpc.RpcError):
    """A failed call as gRPC raises it (its status code and details)."""

    def __init__(self, code, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self) -> str:
        return self._details


def _add_error(code, details: str) -> Exception:
    """What ``Client.add_worker`` raises for a call that ended with ``code``."""
    from clockwork.client import _worker_error

    e = _RpcError(code, details)
    try:
        raise _worker_error(e) from e
    except Exception as err:  # noqa: BLE001 - (raised to chain it as the client does)
        return err


class _FakeController:
    """``clockwork.client.Client`` as ``RayCluster.add_new_nodes`` uses it, answering
    ``add_worker`` as a controller does: a new address is its next worker (the next
    index), one it has answers ``added`` False with its index. The first ``refuse`` calls
    are refused (UNAVAILABLE: it cannot reach the worker); the first ``late`` calls get
    no answer in time (DEADLINE_EXCEEDED), the controller having taken the worker all the
    same; each call waits while ``hold`` is clear. ``workers``: its workers' addresses,
    in its order."""

    def __init__(self, cluster, refuse: int = 0, late: int = 0) -> None:
        self.cluster, self.refuse, self.late = cluster, refuse, late
        self.calls: list[str] = []
        self.workers: list[str] = []
        self.hold, self.entered = threading.Event(), threading.Event()
        self.hold.set()

    def __call__(self, *args, **kw):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def close(self) -> None:  # (stop closes the client of a call under way: this one's
        return None  # call goes on all the same, as one held up past the close would)

    def add_worker(self, address: str, timeout: float | None = None) -> dict:
        self.calls.append(address)
        self.entered.set()
        if len(self.calls) <= self.refuse:
            raise _add_error(grpc.StatusCode.UNAVAILABLE, f"cannot reach worker {address}")
        self.hold.wait(60)
        added = address not in self.workers
        if added:
            self.workers.append(address)
        if len(self.calls) <= self.refuse + self.late:
            raise _add_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        n = self.workers.index(address)
        return {"worker": n, "gpus": [2 * n, 2 * n + 1], "added": added}


def _gpus_free() -> float:
    import ray

    return ray.available_resources().get("clockwork_gpu", 0.0)


def test_stop_kills_the_actors_the_node_watcher_is_adding(ray_nodes, monkeypatch):
    """``stop`` while the node watcher waits on the controller for its new workers (past
    the time stop waits for the watcher): the actors it made are killed all the same,
    and none is counted afterwards, so the nodes' GPUs are free again (they were left
    held, by actors nobody stops, on a Ray cluster this process does not own)."""
    import ray

    import clockwork.client
    from clockwork.cluster.ray_cluster import RayCluster

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)  # (the earlier tests' actors are gone)
    c = RayCluster(watch_s=0, timeout=60.0)
    c.address = "127.0.0.1:1"  # (no controller: the fake one answers)
    fake = _FakeController(c)
    fake.hold.clear()
    monkeypatch.setattr(clockwork.client, "Client", fake)
    c._watcher = threading.Thread(target=c.add_new_nodes, daemon=True)
    watcher = c._watcher
    try:
        watcher.start()
        assert fake.entered.wait(60), "no worker actor started"
        assert _gpus_free() == 0
        c.timeout = 0.5  # (how long stop waits for the watcher)
        c._stop_workers()
        fake.hold.set()  # the controller answers now: too late
        watcher.join(60)
        assert not watcher.is_alive()
        assert c.actors == []
        poll(lambda: _gpus_free() >= 4, 30.0, 0.1)
        # no place file of the killed actors left behind (a folder a run was left in the
        # temporary folder, holding the place file of the actor killed before its stop)
        from clockwork.cluster.ray_cluster import _state_dir

        assert not _state_dir(c.run_id).exists(), list(_state_dir(c.run_id).iterdir())
    finally:
        fake.hold.set()
        for a in c.actors:
            ray.kill(a, no_restart=True)


def test_stop_cancels_an_add_the_controller_has_not_answered(ray_nodes):
    """``stop`` while the node watcher waits for a (real gRPC) controller's answer to its
    AddWorker, which would come only at the call's deadline: the call is cancelled, so
    the stop takes a moment instead of the whole deadline (Ctrl-C on ``serve --ray`` as
    a node joined waited up to a minute), and the new worker's actor is killed."""
    from concurrent.futures import ThreadPoolExecutor

    from clockwork.cluster.ray_cluster import RayCluster
    from clockwork.protocol import clockwork_pb2_grpc as rpc

    entered, release = threading.Event(), threading.Event()

    class Busy(rpc.ClockworkServicer):  # answers AddWorker only once released
        def AddWorker(self, request, context):  # noqa: N802
            entered.set()
            release.wait(60)
            context.abort(grpc.StatusCode.UNAVAILABLE, "too late")

    server = grpc.server(ThreadPoolExecutor(2))
    rpc.add_ClockworkServicer_to_server(Busy(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    c = RayCluster(watch_s=0, timeout=30.0)
    c.address = f"127.0.0.1:{port}"
    c._watcher = watcher = threading.Thread(target=c.add_new_nodes, daemon=True)
    try:
        watcher.start()
        assert entered.wait(60), "no AddWorker was asked"
        t0 = time.monotonic()
        c._stop_workers()
        took = time.monotonic() - t0
        assert not watcher.is_alive(), "the watcher still waits for the controller"
        assert took < 10, f"stop took {took:.1f} s"
        assert c.actors == []
        poll(lambda: _gpus_free() >= 4, 30.0, 0.1)
    finally:
        release.set()
        watcher.join(60)
        server.stop(0)


def test_stop_does_not_wait_for_an_actor_being_made(ray_nodes, monkeypatch):
    """``stop`` while the node watcher is inside Ray's actor creation (which may wait on
    Ray's control store) returns at once: the creation holds no lock stop needs. The
    actor made meanwhile is killed by its maker, so the nodes' GPUs are free again."""
    import ray

    import clockwork.client
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.ray_cluster import RayCluster

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    real_remote = ray.remote
    entered, release = threading.Event(), threading.Event()

    class SlowActorClass:  # ray.remote(cls), whose creation waits for `release`
        def __init__(self, cls):
            self.cls = real_remote(cls)

        def options(self, **opts):
            made = self.cls.options(**opts)

            class Maker:
                @staticmethod
                def remote(*a, **k):
                    entered.set()
                    release.wait(20)
                    return made.remote(*a, **k)
            return Maker()

    c = RayCluster(watch_s=0, timeout=60.0)
    c.address = "127.0.0.1:1"
    monkeypatch.setattr(clockwork.client, "Client", _FakeController(c))
    monkeypatch.setattr(ray_cluster.ray, "remote", SlowActorClass)
    watcher = threading.Thread(target=_quietly, args=(c.add_new_nodes,), daemon=True)
    c._watcher = watcher
    try:
        watcher.start()
        assert entered.wait(60), "no worker actor was being made"
        c.timeout = 0.5  # (how long stop waits for the watcher)
        t0 = time.monotonic()
        c._stop_workers()
        took = time.monotonic() - t0
        release.set()
        watcher.join(60)
        assert took < 5, f"stop waited {took:.1f} s for an actor being made"
        assert not watcher.is_alive() and c.actors == []
        monkeypatch.setattr(ray_cluster.ray, "remote", real_remote)
        poll(lambda: _gpus_free() >= 4, 30.0, 0.1)
    finally:
        release.set()


def _quietly(f) -> None:
    """``f()``, ending quietly if it stops because the cluster does."""
    from clockwork.cluster.ray_cluster import _Stopping

    try:
        f()
    except _Stopping:
        pass


def _two_places(monkeypatch, **fake):
    """A cluster whose places 0 and 1 have their own flags (clock offsets 5 and 7 ms),
    telling its workers to a fake controller (``_FakeController(cluster, **fake)``):
    (the cluster, the fake)."""
    import clockwork.client
    from clockwork.cluster.ray_cluster import RayCluster

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    c = RayCluster(watch_s=0, timeout=60.0,
                   worker_args=[["--clock-offset-ms", "5"], ["--clock-offset-ms", "7"]])
    c.address = "127.0.0.1:1"
    controller = _FakeController(c, **fake)
    monkeypatch.setattr(clockwork.client, "Client", controller)
    return c, controller


def _add_both_nodes(c) -> list[dict]:
    """What ``add_new_nodes`` added, look after look, until both nodes are workers (a node
    that failed, or whose add is in doubt, is looked at again after a look)."""
    added: list[dict] = []
    for _ in range(4):
        added += c.add_new_nodes()
        if len(added) == 2:
            break
    return added


def test_a_new_nodes_worker_takes_the_flags_of_its_place(ray_nodes, monkeypatch):
    """A worker's flags (``worker_args[i]``: the scenario's clock offset, seed) and port
    are those of its place in the controller's order, not of how many actors were made:
    the first node's worker is refused by the controller, so the second node's worker is
    started for place 0, and the first node, tried again later, gets place 1 (it got
    place 2, and the flags of none)."""
    c, fake = _two_places(monkeypatch, refuse=1)
    try:
        added = _add_both_nodes(c)
        assert [a["worker"] for a in added] == [0, 1], added
        assert [c.worker_info(i)["index"] for i in range(2)] == [0, 1]
        assert len(fake.calls) == 3 and fake.calls[2] == c.worker_addresses[1]
    finally:
        c._stop_workers()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


def test_a_worker_after_one_that_did_not_start_takes_its_place(ray_nodes, monkeypatch):
    """The first node's worker actor cannot start in time (its GPUs held), the second
    node's did: its worker runs for place 0, the place the controller gives it (its flags
    and port)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import clockwork.client
    from clockwork.cluster.ray_cluster import RayCluster, offered_nodes

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    first = offered_nodes("emulated")[0][0]

    @ray.remote(num_cpus=0, resources={"clockwork_gpu": 2})
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        first[0], soft=False)).remote()
    ray.get(holder.ready.remote(), timeout=60)
    # (the held node's actor is waited for this long; the other's must start and listen
    # within it, on a loaded host too: 8 s was missed once, the worker not listening yet)
    c = RayCluster(watch_s=0, timeout=15.0)
    c.address = "127.0.0.1:1"
    monkeypatch.setattr(clockwork.client, "Client", _FakeController(c))
    try:
        added = c.add_new_nodes()
        assert [a["worker"] for a in added] == [0], added
        assert c.nodes[0][0] != first[0] and c.worker_info(0)["index"] == 0
    finally:
        c._stop_workers()
        ray.kill(holder)
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


def _free_ports(step: int = 10) -> int:
    """A port P on 127.0.0.1 such that P and P + ``step`` are free now, and the ports
    one above each (a fixed ``--worker-port`` for places 0 and 1, and their fast links)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + step + 1 > 65535:
            continue
        free = True
        for other in (port + 1, port + step, port + step + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", other))
                except OSError:
                    free = False
            if not free:
                break
        if free:
            return port
    raise AssertionError("no free ports")


def test_an_add_the_controller_answers_too_late_is_asked_again(ray_nodes, monkeypatch,
                                                                capsys):
    """The controller takes the first new node's worker, but its answer comes after the
    call's deadline, three calls in a row: the worker is not given up (the controller
    has it, and would keep dialing its address), it keeps serving its place and is asked
    again, look after look, until the controller answers (``added`` False: it had it);
    the second node is added only then, at the next place. The controller's workers are
    the cluster's, in its order, each with the flags of its place (the first used to be
    killed, and the second made for its place: the controller's indices and the places
    drifted apart)."""
    c, fake = _two_places(monkeypatch, late=3)
    try:
        added = _add_both_nodes(c)
        assert fake.workers == c.worker_addresses, (fake.workers, c.worker_addresses)
        assert [a["worker"] for a in added] == [0, 1], added
        assert [a["added"] for a in added] == [False, True], added
        assert [c.worker_info(i)["index"] for i in range(2)] == [0, 1]
        # asked again with the same address until it answered, then the second node
        assert fake.calls == [fake.workers[0]] * 4 + [fake.workers[1]], fake.calls
        err = capsys.readouterr().err
        assert err.count("did not say whether it took its worker") == 1, err
        assert "has no worker" not in err, err
    finally:
        c._stop_workers()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


@pytest.mark.parametrize("slow_stop", [False, True])
def test_a_refused_node_makes_no_other_actor_again_and_frees_its_port(ray_nodes,
                                                                      monkeypatch,
                                                                      slow_stop):
    """Two new nodes, a fixed worker port P: the controller refuses the first node's
    worker (place 0, port P). The second node's actor, made once in the look, starts its
    worker for place 0 on port P, free again: the first's worker was stopped first (also
    when it takes a while to stop). Two actors in the look, not three (the second's
    actor, made for place 1, used to be made again for place 0 -- O(N^2) actor starts
    when the first of N is refused -- and could find P still held by the first's actor
    being killed)."""
    import clockwork.client
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.ray_cluster import RayCluster

    class SlowToStop(ray_cluster.WorkerActor):
        def stop(self):
            time.sleep(1.0)  # (a worker that takes a while to let its port go)
            return super().stop()

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    if slow_stop:
        monkeypatch.setattr(ray_cluster, "WorkerActor", SlowToStop)
    port = _free_ports()
    c = RayCluster(watch_s=0, timeout=60.0, worker_port=port)
    c.address = "127.0.0.1:1"
    fake = _FakeController(c, refuse=1)
    monkeypatch.setattr(clockwork.client, "Client", fake)
    try:
        added = c.add_new_nodes()
        assert [a["worker"] for a in added] == [0], added
        assert fake.calls == [f"127.0.0.1:{port}"] * 2, fake.calls
        assert c.worker_addresses == [f"127.0.0.1:{port}"]
        assert c.worker_info(0)["index"] == 0
        assert c._made == 2  # one actor per node
    finally:
        c._stop_workers()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


@pytest.mark.parametrize("fails_in", ["its actor", "its worker"])
def test_at_start_a_node_that_fails_makes_no_other_actor_again(ray_nodes, monkeypatch,
                                                               capsys, fails_in):
    """At start, the first node's actor does not start, or its worker does not (both
    nodes' workers were started at once, for places 0 and 1): the second node's worker
    runs for place 0 (its flags, its fixed port), in the actor made for it -- its worker
    started again there when it had started for place 1 -- no actor made again."""
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.ray_cluster import RayCluster

    class FirstFails(ray_cluster.WorkerActor):
        def __init__(self, *a, **k) -> None:
            self.slot = a[-1]
            if fails_in == "its actor" and self.slot == 0:
                raise RuntimeError("no room here")
            super().__init__(*a, **k)

        def serve(self, *a, **k):
            if self.slot == 0:
                raise RuntimeError("no room here")
            return super().serve(*a, **k)

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    monkeypatch.setattr(ray_cluster, "WorkerActor", FirstFails)
    port = _free_ports()
    c = RayCluster(watch_s=0, timeout=60.0, worker_port=port,
                   worker_args=[["--clock-offset-ms", "5"], ["--clock-offset-ms", "7"]])
    try:
        assert c._start_workers() == [f"127.0.0.1:{port}"]
        assert c.worker_info(0)["index"] == 0
        assert c._made == 2
        err = capsys.readouterr().err
        assert err.count("has no worker") == 1 and "no room here" in err, err
    finally:
        c._stop_workers()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


def test_a_place_whose_port_is_freed_late_is_served_by_the_next_node(ray_nodes,
                                                                     monkeypatch, capsys,
                                                                     tmp_path):
    """At start, a fixed worker port P: the first node's worker does not listen within
    ``timeout`` (its ``serve`` is slow), so the second node's worker is started again
    for place 0, on P, which stays held a while after the first's actor is killed (its
    process not yet gone). The first's actor is killed at once (a ``stop`` would only
    wait behind its ``serve``), and the second node's worker retries P until it is free:
    it serves place 0 (it failed at once on P, address in use, and the cluster had no
    worker at all; the ``stop`` waited out the whole release time, and the killed actor
    was not waited for)."""
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.ray_cluster import RayCluster

    port = _free_ports()
    tried = tmp_path / "tried"  # (the second node's worker could not listen on P)

    class FirstSlowSecondTold(ray_cluster.WorkerActor):
        def __init__(self, *a, **k) -> None:
            self.slot = a[-1]
            super().__init__(*a, **k)

        def serve(self, *a, **k):
            if self.slot == 0:  # a worker slow to listen (killed meanwhile)
                threading.Event().wait(60)
            return super().serve(*a, **k)

        def _main(self, run) -> None:
            super()._main(run)
            if run.error is not None and run.args.port == port:
                tried.write_text(repr(run.error))

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    monkeypatch.setattr(ray_cluster, "WorkerActor", FirstSlowSecondTold)
    held = socket.socket()  # P, as the first's process holds it while it goes away
    held.bind(("127.0.0.1", port))
    held.listen()
    done = threading.Event()

    def let_go() -> None:
        try:
            poll(lambda: tried.exists() or done.is_set(), 120.0, 0.02)
        finally:
            held.close()
    threading.Thread(target=let_go, daemon=True).start()
    c = RayCluster(watch_s=0, timeout=60.0, worker_port=port,
                   worker_args=[["--clock-offset-ms", "5"], ["--clock-offset-ms", "7"]])
    place = c._place

    def placed(offered):
        """the actors: up to 60 s to start; their workers then 8 s to listen"""
        got = place(offered)
        c.timeout = 8.0
        return got
    monkeypatch.setattr(c, "_place", placed)
    try:
        assert c._start_workers() == [f"127.0.0.1:{port}"]
        assert tried.exists()  # (P was held when it was first tried)
        assert c.worker_info(0)["index"] == 0
        assert c._made == 2
        err = capsys.readouterr().err
        assert err.count("has no worker") == 1 and "did not listen" in err, err
    finally:
        done.set()
        c._stop_workers()
        held.close()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


def test_stop_stops_the_node_watcher_before_the_controller(ray_nodes, monkeypatch,
                                                           capsys):
    """``stop`` while a node joins (the node watcher's look has just found it): the
    watcher is stopped before the controller, which may take a while to stop (it writes
    its logs). The node gets no worker, no AddWorker is asked once the stop began, and no
    node is said to have none (the watcher went on while the controller stopped: it
    placed the node, asked the stopping controller to add its worker, and said the node
    had no worker, the controller having refused it)."""
    import clockwork.client
    from clockwork.cluster import ray_cluster
    from clockwork.cluster.ray_cluster import RayCluster

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    real_offered = ray_cluster.offered_nodes
    join, joining, stop_began = threading.Event(), threading.Event(), threading.Event()

    def offered(device: str):
        if not join.is_set():  # (no node has joined yet)
            return []
        joining.set()
        return real_offered(device)

    class Controller(_FakeController):  # refuses once it is stopping, as a stopped one
        def __init__(self, cluster) -> None:
            super().__init__(cluster)
            self.asked_after_stop: list[str] = []

        def add_worker(self, address: str, timeout: float | None = None) -> dict:
            if stop_began.is_set():
                self.asked_after_stop.append(address)
                self.entered.set()
                raise _add_error(grpc.StatusCode.UNAVAILABLE,
                                 "failed to connect to all addresses")
            return super().add_worker(address, timeout)

    c = RayCluster(watch_s=0.05, timeout=60.0)
    c.address = "127.0.0.1:1"
    fake = Controller(c)
    watcher = threading.Thread(target=c._watch, name="clockwork-ray-nodes", daemon=True)
    alive_at_stop: list[bool] = []

    class SlowToStop:  # the controller's process, which stops once it wrote its logs
        output: list[str] = []

        def stop(self, timeout: float = 5.0, hard=None, slow=None) -> int:
            stop_began.set()
            alive_at_stop.append(watcher.is_alive())
            # (its logs take a while: until the watcher asked, or is gone)
            poll(lambda: fake.entered.is_set() or not watcher.is_alive(), 60.0, 0.02)
            return 0

    monkeypatch.setattr(ray_cluster, "offered_nodes", offered)
    monkeypatch.setattr(clockwork.client, "Client", fake)
    c.controller = SlowToStop()
    c._watcher = watcher
    try:
        watcher.start()
        join.set()
        assert joining.wait(60), "the watcher did not look"
        c.stop()
        assert fake.asked_after_stop == [], fake.asked_after_stop
        assert alive_at_stop == [False]
        assert not watcher.is_alive() and c.actors == []
        err = capsys.readouterr().err
        assert "has no worker" not in err and "failed" not in err, err
    finally:
        c._stop_workers()
    poll(lambda: _gpus_free() >= 4, 30.0, 0.1)


def test_an_add_is_settled_by_the_controllers_answer_only():
    """A failed ``Client.add_worker`` settles that the controller has not taken the
    worker when the controller answered (a refusal) or the call never reached it; a call
    whose deadline passed (the controller may have taken it as the caller gave up), or
    an error that is not a gRPC status, leaves it in doubt."""
    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from clockwork.cluster.ray_cluster import add_refused

    code = grpc.StatusCode
    for c, details, settled in [
            (code.INVALID_ARGUMENT, "worker w cannot serve m", True),
            (code.FAILED_PRECONDITION, "worker is held by another controller", True),
            (code.UNAVAILABLE, "cannot reach worker 127.0.0.1:5 in 2.0 s", True),
            (code.UNAVAILABLE, "failed to connect to all addresses; last error: ...", True),
            (code.UNAUTHENTICATED, "no token", True),
            (code.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
            (code.CANCELLED, "Cancelled", False),
            (code.UNKNOWN, "Exception calling application", False)]:
        assert add_refused(_add_error(c, details)) is settled, (c, details)
    assert not add_refused(ConnectionError("reset"))
    assert not add_refused(RuntimeError("?"))


def test_an_add_past_its_deadline_settles_on_its_place_with_a_real_controller(ray_nodes,
                                                                              monkeypatch):
    """A real controller, and a third node joining: the controller takes the new worker
    on the first AddWorker call, but its answer is lost (the call ends DEADLINE_EXCEEDED,
    as when the caller's deadline passes just as the controller finishes). The add is in
    doubt, not failed: the same address is asked again at once, and the worker is the
    controller's worker 2, with place 2's flags, and serves (it used to be killed, and
    the controller kept, or went on dialing, a worker that was gone).

    (The answer is dropped here rather than raced with a short deadline: the controller
    answers within the deadline it is given, so a short one is answered UNAVAILABLE, a
    settled refusal, about as often as it expires.)"""
    import clockwork
    import clockwork.client
    from clockwork.cluster.ray_cluster import RayCluster

    real = clockwork.client.Client
    calls: list[str] = []

    class FirstAnswerLost(real):
        def add_worker(self, address: str, timeout: float | None = None) -> dict:
            calls.append(address)
            answer = super().add_worker(address, timeout=timeout)
            if len(calls) == 1:
                assert answer["added"], answer  # (taken on this call)
                raise _add_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return answer

    poll(lambda: _gpus_free() >= 4, 60.0, 0.1)
    with RayCluster(models="resnet18_v2:6", http_port=-1, kserve_port=-1, timeout=60.0,
                    watch_s=0) as c, clockwork.Client(c.address, timeout=10) as cl:
        monkeypatch.setattr(clockwork.client, "Client", FirstAnswerLost)
        node = ray_nodes.add_node(num_cpus=1, resources={"clockwork_gpu": 2},
                                  node_ip_address="127.0.0.1")
        try:
            ray_nodes.wait_for_nodes()
            added = c.add_new_nodes()
            assert [a["worker"] for a in added] == [2], (added, calls)
            assert len(c.worker_addresses) == 3 and calls == [c.worker_addresses[2]] * 2
            assert c.worker_info(2)["index"] == 2
            assert cl.stats().get("workers_added", 0) == 1
            _runs_on_the_new_gpus(cl, time.monotonic() + 60)
        finally:
            c.stop()
            ray_nodes.remove_node(node)


def test_a_ray_cluster_does_not_add_a_worker_outside_ray():
    """``RayCluster.add_worker`` (``LocalCluster``'s) started a worker process of this
    machine, outside Ray, that ``stop`` never stopped, and shifted the places of the
    nodes that joined after it: refused, naming how a Ray cluster gets workers."""
    pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")
    from clockwork.cluster.ray_cluster import RayCluster

    c = RayCluster(models="resnet18_v2")
    with pytest.raises(RuntimeError, match="add_new_nodes"):
        c.add_worker()
    assert c.workers == [] and c.worker_addresses == []


def test_place_files_live_in_a_folder_of_this_users_alone(tmp_path, monkeypatch):
    """The worker actors' place files (a restarted actor's flags) are kept in a folder
    of this user's alone, and never read or written through a link: in the shared
    temporary folder another user could make the run's folder first and plant a place
    file whose flags the worker took (--packages of theirs, --host 0.0.0.0)."""
    import json
    import tempfile

    from clockwork.cluster import ray_cluster as rc

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = rc._state_dir("run1")
    base = d.parent
    assert base.name == f"clockwork-ray-{os.getuid()}" and (base.stat().st_mode & 0o777) == 0o700
    rc._private_dir(d)
    rc._write_place(d / "worker0.json", {"index": 1, "flags": [], "port": 5})
    assert rc._read_place(d / "worker0.json") == {"index": 1, "flags": [], "port": 5}
    assert (d / "worker0.json").stat().st_mode & 0o777 == 0o600
    assert rc._read_place(d / "worker9.json") is None
    # a link planted where the place file or its temporary file goes is not followed
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"index": 0, "flags": ["--host", "0.0.0.0"], "port": 1}))
    (d / "worker1.json").symlink_to(target)
    with pytest.raises(OSError):
        rc._read_place(d / "worker1.json")
    (d / "worker2.tmp").symlink_to(target)
    rc._write_place(d / "worker2.json", {"index": 2, "flags": [], "port": 6})
    assert json.loads(target.read_text())["port"] == 1  # (the link was replaced, not used)
    # a folder others may enter, or a link, is refused
    base.chmod(0o777)
    with pytest.raises(RuntimeError, match="not a folder of this user's alone"):
        rc._state_dir("run2")
    base.chmod(0o700)
    (tmp_path / "link").symlink_to(base)
    with pytest.raises(RuntimeError, match="not a folder of this user's alone"):
        rc._private_dir(tmp_path / "link")


def test_ray_auto_with_no_cluster_running_is_refused_in_our_words(monkeypatch):
    """``--ray auto`` where Ray finds no running cluster: ChildRefused (one line, exit 2,
    as an address where nothing listens), naming what to do; it was Ray's ConnectionError
    (exit 1), advising an ``--address`` flag this command does not have."""
    import clockwork.cluster.ray_cluster as rc
    from clockwork.cluster.local import ChildRefused

    def no_cluster(**kw):
        assert kw["address"] == "auto"
        raise ConnectionError("Could not find any running Ray instance. Please specify the "
                              "one to connect to by setting `--address` flag or "
                              "`RAY_ADDRESS` environment variable.")

    monkeypatch.setattr(rc, "init_ray", no_cluster)
    monkeypatch.setattr(rc.ray, "is_initialized", lambda: False)
    cluster = rc.RayCluster(address="auto", http_port=-1, kserve_port=-1)
    with pytest.raises(ChildRefused, match=r"--ray auto: no running Ray cluster found .*"
                                           r"ray start --head") as e:
        cluster._init_ray()
    assert "--address" not in str(e.value)


def test_a_worker_actor_imports_this_installations_worker_package(tmp_path):
    """Ray puts the driver's working folder ahead on a worker actor's path: a user's
    ``worker.py`` there was imported instead of this installation's ``worker`` package,
    and every actor failed ("'worker' is not a package"). ``own_packages`` (what the
    actor runs first) takes ours, even after the other was imported."""
    (tmp_path / "worker.py").write_text("print('the user worker.py')\n")
    (tmp_path / "controller.py").write_text("")
    code = ("import sys; sys.path.insert(0, '.'); import worker\n"
            "from clockwork.cluster.ray_cluster import own_packages\n"
            "own_packages()\n"
            "from worker.service import WorkerNode\n"
            "import controller.loop\n"
            "print('imported', WorkerNode.__module__)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["the user worker.py", "imported worker.service"], r.stdout
