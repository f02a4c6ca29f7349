"""``clockwork serve`` on the command line: what it refuses before it starts anything
(one line on stderr, exit 2) and what it checks early instead of leaving it to a child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _without_tvm(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``clockwork ARGV`` in a fresh interpreter where ``import tvm`` fails, as it does
    without the tvm extra (``sys.modules["tvm"] = None``: every import of tvm, or of a
    module under it, raises ImportError), run from an empty folder (no packages/)."""
    code = ("import sys\nsys.modules['tvm'] = None\n"
            "from clockwork.cluster.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("argv", [
    ["serve", "--device", "cpu", "--port", "0", "--http-port", "-1", "--kserve-port", "-1"],
    ["serve", str(ROOT / "scenarios" / "cpu_live.toml"), "--replay"],
    ["serve", "cpu_live", "--replay"],
], ids=["--device cpu", "cpu_live.toml --replay", "cpu_live --replay"])
def test_serve_cpu_without_tvm_names_the_extra(tmp_path, argv):
    p = _without_tvm(tmp_path, *argv)
    err = p.stderr.strip()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    assert len(err.splitlines()) == 1, err
    assert "pip install -e '.[tvm]' in your clockwork-py checkout" in err, err
    assert err.startswith("clockwork serve: "), err
    assert not (tmp_path / "packages").exists()  # refused before compiling anything


def test_ensure_packages_without_tvm_names_the_extra(tmp_path, monkeypatch):
    """The packages a cluster lacks are compiled with TVM (on a Ray cluster, here, before
    the nodes run them): without it, one line naming the models and the extra (it was a
    ModuleNotFoundError from deep inside the compiler)."""
    from clockwork.cluster.serve import ensure_packages

    monkeypatch.setitem(sys.modules, "tvm", None)
    with pytest.raises(RuntimeError, match=r"no model packages for mlp in .*pip install -e "
                       r"'\.\[tvm\]' in your clockwork-py checkout"):
        ensure_packages("mlp:2", "cpu", "cpu", str(tmp_path / "packages"))
    assert not (tmp_path / "packages").exists()


QUIET_PORTS = ["--port", "0", "--http-port", "-1", "--kserve-port", "-1"]
SC = str(ROOT / "scenarios" / "poisson_warm.toml")

EARLY = [
    # (argv, what the one line must say): settings the controller would refuse, checked
    # by serve before it starts any process (they were refused by the controller child
    # after the workers had started, echoed and then repeated, naming serve's temporary
    # settings or token file instead of what the user gave)
    (["serve", "--set", "scheduler.nope=1", SC], "unknown scheduler setting 'nope'"),
    (["serve", SC, "--set", "scheduler.max_batch=abc"], "max_batch"),
    (["serve", SC, "--set", "scheduler.policy=clipper", "--set", "scheduler.nope=2"],
     "unknown scheduler setting 'nope'"),
    (["serve", SC, "--set", "scheduler.policy=nosuchpolicy"], "nosuchpolicy"),
    (["serve", "--host", "0.0.0.0"], "--host 0.0.0.0 is not a loopback address"),
    (["serve", "--token", "short"], "--token: a token needs at least"),
    (["serve", "--tls-cert", str(Path(__file__).with_name("not_a_certificate.pem"))],
     "--tls-cert and --tls-key go together"),
    # more local workers than the memory holds: it started them one by one (291 in a
    # minute, 7 GB) on its way to 10,000
    (["serve", SC, "--set", "cluster.workers=10000"],
     "10,000 local worker processes need ~781.2 GiB"),
]


@pytest.mark.parametrize("argv,fragment", EARLY, ids=[" ".join(a[1:4]) for a, _ in EARLY])
def test_serve_refuses_controller_settings_before_starting_anything(argv, fragment, tmp_path):
    try:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *argv,
                            *QUIET_PORTS], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"clockwork {' '.join(argv)} started serving")
    out = p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, out)
    assert len(lines) == 1 and "Traceback" not in out, out
    assert lines[0].startswith("clockwork serve: ") and fragment in lines[0], lines[0]
    assert "listening" not in out and "clockwork-cluster-" not in out, out  # nothing started


def test_serve_replay_serves_rest_and_kserve_only_when_asked(tmp_path):
    """With --replay the REST and KServe gRPC listeners are off by default (the replay's
    clients use the controller port); --http-port/--kserve-port given turn them on, e.g.
    to watch /metrics during the replay, and the first line says where. --out keeps
    what the controller and the worker said; a second run into the same folder replaces
    the first's logs (they were appended to: a folder held several runs' logs beside one
    summary) and says so, and a setting a live cluster does not apply is named."""
    base = ["serve", "poisson_warm", "--replay", "--set", "duration_s=1", "--quiet"]
    lines, err = {}, {}
    for name, extra in (("default", ["--out", "run"]),
                        ("again", ["--out", "run", "--set", "cluster.jitter_ms=5"]),
                        ("asked", ["--http-port", "0", "--kserve-port", "0"])):
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *base, *extra],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        lines[name], err[name] = p.stderr.splitlines()[0], p.stderr
    logs = tmp_path / "run" / "logs"
    assert (logs / "controller.log").read_text().count("clockwork controller listening on") == 1
    assert "clockwork worker listening on" in (logs / "worker0.log").read_text()
    # the controller's own logs, every action (the replay's action log has none), of the
    # second run only (the first's removed, not numbered beside them)
    own = tmp_path / "run" / "controller"
    assert sorted(p.name for p in own.iterdir()) == ["actions.tsv", "requests.tsv"]
    acts = (own / "actions.tsv").read_text().splitlines()
    assert len(acts) > 10 and "\tINFER\t" in "\n".join(acts), acts[:3]
    reqs = (tmp_path / "run" / "requests.tsv").read_text().splitlines()
    assert len((own / "requests.tsv").read_text().splitlines()) == len(reqs)
    assert f"the controller's logs: {Path('run') / 'controller'}" in err["again"]
    assert "replacing the earlier run in run" in err["again"], err["again"]
    assert "not applied by a live cluster: cluster.jitter_ms" in err["again"], err["again"]
    assert "replacing" not in err["default"] and "not applied" not in err["default"]
    assert "REST at" not in lines["default"] and "KServe" not in lines["default"]
    assert ", REST at 127.0.0.1:" in lines["asked"], lines["asked"]
    assert ", KServe gRPC at 127.0.0.1:" in lines["asked"], lines["asked"]


def _child(tmp_path, script: str):
    from clockwork.cluster.local import _Child

    return _Child("worker0", [sys.executable, "-c", script], log=tmp_path / "w.log")


def test_a_child_that_keeps_saying_what_it_does_gets_more_time(tmp_path):
    """A cuda worker prints a line a package while it builds kernels, longer in all than
    the wait: each line gives it the wait again. One that says nothing for the wait is
    given up on, saying so; its output is in its log too."""
    slow = ("import time\nfor k in range(6):\n    print(f'building {k}', flush=True)\n"
            "    time.sleep(0.3)\nprint('clockwork worker listening on 127.0.0.1:5 (x)', "
            "flush=True)\ntime.sleep(30)")
    c = _child(tmp_path, slow)
    try:
        assert c.wait_address(1.0) == "127.0.0.1:5"  # after ~1.8 s
    finally:
        c.stop()
    assert "building 5" in (tmp_path / "w.log").read_text()
    quiet = _child(tmp_path, "import time; time.sleep(30)")
    try:
        with pytest.raises(TimeoutError, match="nothing said for 1 s"):
            quiet.wait_address(1.0)
    finally:
        quiet.stop()


def test_a_child_that_talks_on_is_remembered_in_bounded_memory(tmp_path):
    """A child's output is kept for error messages and handed to the wait for its
    address, but only its last lines: a worker that logs for days does not grow serve.
    What it said it listens on is kept whatever it says after: a child that printed its
    address and then more lines than are kept before the wait read them (a busy machine)
    was taken for one that never said it, and serve gave up on it."""
    from clockwork.cluster import local

    chatty = ("print('clockwork worker listening on 127.0.0.1:5 (x)', flush=True)\n"
              "print('http listening on 127.0.0.1:6', flush=True)\n"
              "for k in range(5000):\n    print(f'line {k}')\n")
    c = _child(tmp_path, chatty)
    try:
        c.proc.wait(10)
        c._t.join(10)  # (every line read: the first ones have left the queue)
        assert c.wait_address(10.0) == "127.0.0.1:5"
        assert c.announced("http") == "127.0.0.1:6"
        assert c.announced("kserve grpc") is None
    finally:
        c.stop()
    assert len(c.output) <= 2 * local.OUTPUT_KEPT and c.output[-1] == "line 4999\n"
    assert c.lines.qsize() <= local.OUTPUT_KEPT
    assert (tmp_path / "w.log").read_text().count("\n") == 5002  # the log has them all


def test_a_scenarios_worker_settings_hold_for_workers_past_its_count():
    """A Ray cluster may have more nodes than the scenario's ``workers``: each of their
    workers gets the scenario's emulated noise and stragglers and a seed of its own (they
    got none: only the first ``workers`` ran the scenario's settings)."""
    from clockwork.cluster.local import LocalCluster
    from clockwork.cluster.serve import cluster_from_scenario
    from clockwork.scenario import load_scenario

    sc = load_scenario("poisson_warm", ["cluster.workers=1", "cluster.noise=0.2",
                                        "cluster.slow_prob=0.05", "seed=7"])
    kw, _ = cluster_from_scenario(sc)
    c = LocalCluster(**kw)
    flags = [c.worker_flags(i) for i in range(4)]
    for f in flags:
        assert f[f.index("--noise") + 1] == "0.2" and "--slow-prob" in f, f
    assert [f[f.index("--seed") + 1] for f in flags] == ["7000", "7001", "7002", "7003"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_while_the_cluster_starts_stops_serve_at_once(monkeypatch, capsys, sig,
                                                              request):
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed) while the cluster starts (Ray
    actors waiting for GPUs, cuda kernels building: minutes) stops serve at once, exit
    130; it was only noted, and serve waited for the start to end or time out (60 s on
    Ray, an hour for cuda). (SIGHUP killed serve without stopping anything.)"""
    import os
    import signal
    import time

    from clockwork.cluster import serve
    from clockwork.cluster.cli import main

    if sig == "SIGHUP":  # (as in a terminal; a test run under nohup ignores it)
        old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
        request.addfinalizer(lambda: signal.signal(signal.SIGHUP, old))

    stopped = []

    def slow_start(self):
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(30)  # (the handler's exception ends it)
        raise AssertionError("the start went on after the signal")

    monkeypatch.setattr(serve.LocalCluster, "start", slow_start)
    monkeypatch.setattr(serve.LocalCluster, "stop", lambda self: stopped.append(True))
    t0 = time.monotonic()
    rc = main(["serve", "--port", "0", "--http-port", "-1", "--kserve-port", "-1"])
    assert rc == 130 and time.monotonic() - t0 < 10 and stopped == [True]
    assert "interrupted while the cluster started" in capsys.readouterr().err


def test_local_workers_are_checked_against_the_memory_available():
    from clockwork.cluster.serve import WORKER_MEMORY_BYTES, local_workers_error

    assert local_workers_error(4, 4 * WORKER_MEMORY_BYTES) is None
    why = local_workers_error(5, 4 * WORKER_MEMORY_BYTES)
    assert why.startswith("5 local worker processes need") and "--ray" in why, why


def test_a_cluster_started_in_a_folder_with_its_own_worker_and_controller_modules_serves(
        tmp_path, monkeypatch):
    """A user's folder with a ``worker.py`` and a ``controller.py`` of its own (common
    names in an ML project): the cluster's children import ours, not those (started as
    ``python -m``, they put the current folder first on their path and failed: 'worker'
    is not a package)."""
    import clockwork
    from clockwork.cluster.local import LocalCluster

    (tmp_path / "worker.py").write_text("raise SystemExit('the user worker.py was imported')\n")
    (tmp_path / "controller.py").write_text("raise SystemExit('the user controller.py')\n")
    monkeypatch.chdir(tmp_path)
    with LocalCluster(workers=1, gpus=1, models="mobilenet_v2", timeout=30) as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            assert cl.infer("mobilenet_v2", slo_ms=5000).status == 0


def test_a_second_signal_kills_a_controller_that_does_not_stop(tmp_path):
    """``serve`` stopping a controller that does not end (here SIGSTOPped): after a few
    seconds it says it waits (at most a minute), a second Ctrl-C kills the controller at
    once, and serve says so and exits 1 (it waited the whole minute, ignored the second
    signal, and exited 0 saying only "stopped")."""
    import os
    import re
    import signal
    import time

    from clockwork.cluster.local import _Child, _cli

    serve = _Child("serve", _cli() + ["serve", "--port", "0", "--http-port", "-1",
                                      "--kserve-port", "-1"])
    pid = None
    try:
        _lines_until(serve, "clockwork serve: controller at")  # (started)
        line = next(x for x in _lines_until(serve, "worker: controller pid")
                    if "worker: controller pid" in x)
        pid = int(re.search(r"controller pid (\d+)", line)[1])
        os.kill(pid, signal.SIGSTOP)
        serve.proc.send_signal(signal.SIGINT)
        _lines_until(serve, "waiting for the controller to stop")
        t0 = time.monotonic()
        serve.proc.send_signal(signal.SIGINT)
        assert serve.proc.wait(30) == 1
        assert time.monotonic() - t0 < 10
        said = "".join(serve.output)
        assert "the controller was killed (a second signal came before it stopped)" in said, \
            said
    finally:
        serve.stop()
        if pid is not None:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _lines_until(child, text: str, timeout: float = 60.0) -> list[str]:
    """``child``'s output until a line holding ``text`` (read as it comes)."""
    import queue
    import time

    end = time.monotonic() + timeout
    while not any(text in x for x in child.output):
        left = end - time.monotonic()
        assert left > 0, "".join(child.output)
        try:
            child.lines.get(timeout=left)
        except queue.Empty:
            pass
    return list(child.output)


def test_a_second_signal_kills_a_worker_that_does_not_stop():
    """A cluster stopped with its second signal already given (``hard``) kills a worker
    that does not end (here SIGSTOPped) at once, as it does the controller: it waited
    the worker's 5 s all the same."""
    import os
    import signal
    import threading
    import time

    from clockwork.cluster.local import LocalCluster

    c = LocalCluster(workers=1, gpus=1, models="mobilenet_v2", http_port=-1, timeout=30.0)
    c.start()
    try:
        (w,) = c.workers
        os.kill(w.proc.pid, signal.SIGSTOP)
        hard = threading.Event()
        hard.set()
        t0 = time.monotonic()
        c.stop(hard)
        took = time.monotonic() - t0
    finally:
        for ch in [c.controller, *c.workers]:
            if ch is not None and ch.proc.poll() is None:
                ch.proc.kill()
    assert w.killed and w.proc.poll() is not None
    assert took < 4.0, took  # (the worker's own wait is 5 s)


def test_a_live_replay_with_no_request_says_so_as_a_simulated_one_does(tmp_path):
    """No request in the run (a rate too low for its length): a warning that its figures
    are empty, as ``clockwork simulate`` says it (the live replay said nothing)."""
    over = ["--set", "duration_s=0.5", "--set", "workloads.0.rate_rps=0.001"]
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve",
                        "poisson_warm", "--replay", "--quiet", *over],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("clockwork serve: warning: no requests were submitted in duration_s = 0.5 s"
            in p.stderr), p.stderr
    s = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "simulate",
                        "poisson_warm", "--quiet", *over],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "warning: no requests were submitted in duration_s = 0.5 s" in s.stderr, s.stderr


def test_a_scenario_without_workloads_is_served_but_not_replayed(tmp_path):
    """``serve SCENARIO`` without --replay runs no workload: a scenario of a cluster and
    its models only is served (it was refused, "must be at least one [[workloads]]
    table"); with --replay it is still refused, naming what is missing."""
    from clockwork.cluster.serve import _served_scenario
    from clockwork.scenario import ScenarioError

    f = tmp_path / "cluster_only.toml"
    f.write_text('name = "c"\n[cluster]\nworkers = 2\n[[models]]\nname = "resnet50_v2"\n'
                 'copies = 3\n')
    sc = _served_scenario(str(f), ["cluster.noise=0"], replay=False)
    assert sc.cluster["workers"] == 2 and sc.models[0]["copies"] == 3 and sc.workloads == []
    sc = _served_scenario(str(ROOT / "scenarios" / "poisson_warm.toml"), ["workloads=[]"],
                          replay=False)
    assert sc.workloads == []  # (a scenario's workloads taken out by --set: the same)
    with pytest.raises(ScenarioError, match=r"at least one \[\[workloads\]\] table"):
        _served_scenario(str(f), [], replay=True)
    with pytest.raises(ScenarioError, match="cluster.workers"):  # (other errors: as before)
        _served_scenario(str(f), ["cluster.workers=0"], replay=False)


def test_an_earlier_runs_controller_logs_are_removed_and_nothing_else(tmp_path, capsys):
    """``serve --replay --out DIR`` clears an earlier run's controller logs in
    ``DIR/controller`` (a restarted one's numbered, a rotated one's) and nothing else
    there: files whose names only begin as a log's (``run.py``, ``summary.md``) were
    removed too."""
    from clockwork.cluster.serve import clear_run_folder

    own = tmp_path / "controller"
    own.mkdir()
    logs = ["requests.tsv", "actions.tsv", "requests.1.tsv", "actions.1.npz",
            "requests.tsv.1"]
    mine = ["run.py", "summary.md", "actions.todo.txt", "requests.tsv.bak", "notes.txt"]
    for name in logs + mine:
        (own / name).write_text("x")
    clear_run_folder(tmp_path, "clockwork serve")
    assert sorted(p.name for p in own.iterdir()) == sorted(mine)
    assert "replacing the earlier run" in capsys.readouterr().err


def test_serve_out_whose_controller_folder_is_a_file_is_refused_first(tmp_path):
    """``DIR/controller``, where the controller's logs go, a file: refused naming --out,
    exit 2, before anything starts (the controller refused its --log-dir, a flag the
    user never gave, after the workers had started)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "controller").write_text("mine")
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", "poisson_warm",
                        "--replay", "--out", "out", "--set", "duration_s=1", "--quiet"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        "clockwork serve: --out out: out/controller is a file, where the controller's logs "
        "go: move it, or give --log-dir another folder"], p.stderr
    assert "listening" not in p.stdout + p.stderr
