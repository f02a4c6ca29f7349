"""The ``clockwork`` command: simulate, report, errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import orjson
import pytest

from clockwork.cluster.cli import main
from tests.conftest import cli_command


def test_simulate_writes_outputs_and_report_reads_them(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=2", "--out", str(out),
               "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "goodput" in printed
    s = orjson.loads((out / "summary.json").read_bytes())
    assert s["duration_s"] == 2.0 and s["submitted"] > 1000
    assert main(["report", str(out), "--timeline", "1"]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert sum(int(r[1].replace(",", "")) for r in rows) == s["submitted"]
    # intervals of a fraction of a second are labelled to the millisecond, each once
    assert main(["report", str(out), "--timeline", "0.5"]) == 0
    table = capsys.readouterr().out.split("start_s")[1]
    starts = [line.split()[0] for line in table.splitlines()[1:]]
    # (the run ended at 2 s: the actions the drain completes count in the last one)
    assert starts == ["0.000", "0.500", "1.000", "1.500"], starts
    # an interval too short to mean anything: refused before anything is printed
    assert main(["report", str(out), "--timeline", "1e-10"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and "at least 0.001 s" in got.err
    # a run.json that cannot be read: the summary still, with a warning
    (out / "run.json").write_text("{")
    assert main(["report", str(out)]) == 0
    got = capsys.readouterr()
    assert "SLO attainment" in got.out and "run.json is not readable" in got.err


def test_requests_left_when_drain_s_runs_out_is_one_line(capsys):
    assert main(["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=1",
                 "--set", "drain_s=0", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unanswered request(s) at drain_s = 0 s" in err, err


def test_simulate_json(capsys, tmp_path):
    assert main(["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=1", "--json",
                 "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    s = orjson.loads(out)
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]
    assert out.encode() == (tmp_path / "summary.json").read_bytes()  # (keys sorted, as there)


def test_bad_input_exit_code_and_message(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "missing.toml")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = [")
    assert main(["simulate", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["simulate", "scenarios/poisson_warm.toml", "--set", "cluster.gpus_per_worker=-1"]) == 2
    assert main(["report", str(tmp_path)]) == 2


def test_help_lists_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for cmd in ("simulate", "report", "trace"):
        assert cmd in out


def test_cuda_without_a_gpu_fails_at_start_naming_the_alternatives(capsys):
    import importlib.util

    import pytest

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed: this machine may have a GPU")
    for argv in (["worker", "--device", "cuda", "--port", "0"],
                 ["serve", "--device", "cuda", "--port", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "cuda device unavailable" in err
        assert "--device cpu" in err and "--device emulated" in err


def test_cluster_from_scenario_passes_every_scheduler_key(tmp_path):
    from clockwork.cluster.local import LocalCluster
    from clockwork.cluster.serve import cluster_from_scenario
    from clockwork.scenario import load_scenario
    from controller.command import read_settings_file

    sc = load_scenario(data={
        "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "noise": 0.05, "slow_prob": 0.01, "jitter_ms": 0.2},
        "scheduler": {"policy": "tfserving", "max_exec_ms": 25, "batch_timeout_us": 500,
                      "batch_first": False},
        "models": [{"name": "resnet50_v2", "copies": 3}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 10}]})
    kw, ignored = cluster_from_scenario(sc)
    table = {"policy": "tfserving", "max_exec_ms": 25, "batch_timeout_us": 500,
             "batch_first": False}
    assert kw["scheduler"] == table and kw["controller_args"] == []  # data, not flags
    # what the controller reads back is the table itself, types included
    path = LocalCluster(**kw, run_dir=str(tmp_path))._write_settings()
    assert path.parent == tmp_path and read_settings_file(str(path)) == table
    assert kw["models"] == "resnet50_v2:3" and len(kw["worker_args"]) == 2
    assert "--noise" in kw["worker_args"][0] and "--slow-prob" in kw["worker_args"][1]
    assert ignored == ["cluster.jitter_ms"]


def test_settings_a_live_cluster_does_not_apply_are_said(tmp_path, capsys):
    """The simulator's network latency, drain and fault detection set in a scenario, and
    [faults] given to a cluster that only serves (no --replay plays them): said, each
    named (they were dropped with no word; only jitter and clock error were said)."""
    from clockwork.cluster.serve import live_ignored
    from clockwork.scenario import load_scenario

    base = {"cluster": {"workers": 1, "gpus_per_worker": 1},
            "models": [{"name": "resnet50_v2"}],
            "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 10}]}
    assert live_ignored(load_scenario(data=base)) == []
    sc = load_scenario(data={
        **base, "drain_s": 5,
        "cluster": {**base["cluster"], "network_latency_ms": 60, "clock_error_ms": 1},
        "faults": {"detect_ms": 900, "kill": [{"worker": 0, "at_s": 0.5, "back_s": 0.8}]}})
    said = ["cluster.network_latency_ms", "cluster.clock_error_ms", "drain_s",
            "faults.detect_ms"]
    assert live_ignored(sc) == said
    assert live_ignored(sc, replay=False) == [*said, "faults.kill (played by --replay only)"]


def _controller_args(*argv):
    from clockwork.cluster.cli import build_parser

    return build_parser().parse_args(["controller", "--workers", "127.0.0.1:1", *argv])


def test_controller_settings_file_then_flags_over_it(tmp_path):
    from controller.command import scheduler_settings

    f = tmp_path / "s.json"
    f.write_text('{"scheduler": {"policy": "clipper", "max_batch": 8, "batch_wait_ms": 2,'
                 ' "default_slo_ms": 50}}')
    policy, cfg, own = scheduler_settings(_controller_args("--settings", str(f)))
    assert policy == "clipper" and cfg.max_batch == 8 and cfg.default_slo == 50_000_000
    assert own == {"batch_wait_ms": 2}
    # flags override the file: --max-batch, --set, and --policy (whose own settings apply)
    policy, cfg, own = scheduler_settings(_controller_args(
        "--settings", str(f), "--max-batch", "4", "--set", "batch_wait_ms=3"))
    assert (policy, cfg.max_batch, cfg.default_slo, own) == ("clipper", 4, 50_000_000,
                                                             {"batch_wait_ms": 3})
    # a scenario file works: only its [scheduler] table is read
    policy, cfg, own = scheduler_settings(_controller_args(
        "--settings", "scenarios/fig5_1gpu.toml"))
    assert policy == "clockwork" and own == {}
    # no file: the flags alone, as before
    policy, cfg, own = scheduler_settings(_controller_args("--set", "max_exec_ms=20"))
    assert policy == "clockwork" and cfg.max_exec == 20_000_000


def test_controller_set_parses_settings_and_rejects_unknown_ones():
    from controller.command import parse_settings

    assert parse_settings(["max_exec_ms=25", "batch_first=false", "x=1.5", "name=abc"]) == {
        "max_exec_ms": 25, "batch_first": False, "x": 1.5, "name": "abc"}
    assert main(["controller", "--workers", "127.0.0.1:1", "--set", "no_such=1"]) == 2


def _option(verb: str, flag: str):
    from clockwork.cluster.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[verb]
    return next(a for a in sub._actions if flag in a.option_strings)


def test_every_tuning_flag_says_what_it_does_and_its_default():
    from controller.config import SchedulerConfig

    cfg = SchedulerConfig()
    scheduler = {"--schedule-ahead-ms": f"else {cfg.schedule_ahead / 1e6:g})",
                 "--default-slo-ms": f"else {cfg.default_slo / 1e6:g})",
                 "--max-batch": f"else {cfg.max_batch})"}
    for flag, default in scheduler.items():  # (None: the --settings file's, else these)
        text = _option("controller", flag).help or ""
        assert len(text) > 40 and default in text, (flag, text)
    for verb, flag, default in [("worker", "--slow-factor", 3.0), ("worker", "--seed", 0),
                                ("worker", "--noise", 0.0), ("compile", "--device", "cpu"),
                                ("profile", "--device", "cpu"), ("infer", "-n", 1)]:
        a = _option(verb, flag)
        assert a.default == default, (verb, flag, a.default)
        text = a.help or ""
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert len(text) > 20 and f"(default {shown}" in text, (verb, flag, text)


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"clockwork {version('clockwork-py')}"


def test_a_run_written_over_an_earlier_one_says_so(tmp_path, capsys):
    """A second run into the same --out replaces the first and says so (it was silent,
    the other format's logs deleted too)."""
    out = tmp_path / "run"
    args = ["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=1", "--out",
            str(out), "--quiet"]
    assert main(args) == 0
    assert "replaced" not in capsys.readouterr().err
    assert main([*args, "--log-format", "npz"]) == 0
    err = capsys.readouterr().err
    assert f"replaced the earlier run in {out} (summary.json, requests.tsv" in err, err


def test_report_on_the_rows_of_a_controller_killed_before_it_wrote_its_logs(tmp_path):
    """A controller writing npz logs, killed (SIGKILL) while its rows waited in its
    --log-dir, leaves them in a clockwork-rows-* folder and no logs: report reads them
    there, figures and timeline (it said they "cannot be reported"), its table saying
    they are a run's rows alone (a script reading the table took it for a whole run)."""
    import clockwork
    from tests.conftest import local_cluster

    logs = tmp_path / "logs"
    with local_cluster(workers=1, gpus=1, models="mobilenet_v2", http_port=-1,
                       controller_args=["--log-dir", str(logs), "--log-format", "npz",
                                        "--log-flush-s", "0.05"]) as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(5):
                assert cl.infer("mobilenet_v2", slo_ms=500).status == 0
        (rows,) = logs.iterdir()
        # the last column of each log (written after the others at a flush): 5 requests'
        # gpu (int32), 6 actions' prediction_error (int64: 5 INFERs, a LOAD)
        last = ((rows / "requests.gpu", 5 * 4), (rows / "actions.prediction_error", 6 * 8))
        deadline = time.monotonic() + 10
        while any(p.stat().st_size < n for p, n in last) and time.monotonic() < deadline:
            time.sleep(0.02)
        c.controller.proc.kill()
        c.controller.proc.wait(timeout=10)
    assert [p.name for p in logs.iterdir()] == [rows.name]  # no npz: only the rows
    r = subprocess.run([*cli_command("report", str(logs), "--timeline", "1")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"read from {rows.name}" in r.stderr and "Traceback" not in r.stderr
    submitted = next(ln for ln in r.stdout.splitlines() if ln.startswith("requests submitted"))
    met = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("met SLO"))
    assert submitted.split()[-1] == "5" and met.split()[-1] == "5", r.stdout
    acts = next(ln for ln in r.stdout.splitlines() if ln.startswith("actions infer"))
    infer, _, load, _, evict, _, rejected = acts.split()[-7:]
    # 5 INFERs and a LOAD succeeded; on a loaded host a worker may turn one away as too
    # late, and it is sent again (7 / 2 / 0 / 3 seen)
    assert int(infer) >= 5 and int(load) >= 1 and evict == "0", r.stdout
    assert int(infer) + int(load) - int(rejected) == 6, r.stdout
    inc = next(ln for ln in r.stdout.splitlines() if ln.startswith("incomplete"))
    assert f"no logs written, the rows in {rows.name}" in inc, r.stdout
    # an earlier run's logs beside them (the killed controller's --log-dir was used
    # before): report reads those, and says the later run's rows are there (it said
    # nothing), which it reads when named (refused: "no summary.json")
    assert main(["simulate", "poisson_warm", "--set", "duration_s=1", "--quiet", "--out",
                 str(tmp_path / "earlier"), "--log-format", "npz"]) == 0
    for name in ("requests.npz", "actions.npz"):
        (logs / name).write_bytes((tmp_path / "earlier" / name).read_bytes())
        os.utime(logs / name, ns=(rows.stat().st_mtime_ns - 10**9,) * 2)
    r = subprocess.run([*cli_command("report", str(logs))], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and f"also holds {rows.name}, the rows of a later run" in r.stderr
    r = subprocess.run([*cli_command("report", str(rows))], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    submitted = next(ln for ln in r.stdout.splitlines() if ln.startswith("requests submitted"))
    assert submitted.split()[-1] == "5", r.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_controller_waiting_for_its_workers_stops_on_a_signal(sig):
    """Ctrl-C (or SIGTERM) while the controller waits for a worker that is not there
    (up to --connect-timeout, 60 s here) ends it at once: exit 130, saying why. Before,
    the signal was looked at only once every worker had answered, or the wait had run
    out."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(cli_command("controller", "--port", "0", "--http-port", "-1",
                                     "--kserve-port", "-1", "--workers", f"127.0.0.1:{port}",
                                     "--connect-timeout", "60"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()  # it says it waits (after 0.5 s without an answer)
        assert "not answering yet; waiting up to 60 s" in line, line
        p.send_signal(sig)
        rest = p.communicate(timeout=20)[1]
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, (p.returncode, rest)
    assert "clockwork controller: stopped while waiting for the workers" in rest, rest
    assert "Traceback" not in rest, rest


def test_progress_into_a_log_is_lines_not_a_redrawn_line(monkeypatch, capsys):
    """``--progress`` with stderr not a terminal (a log file, CI): whole lines, each ending
    in a newline, at most one every PROGRESS_LOG_S (a line redrawn with carriage returns
    every second filled logs with them); on a terminal the redrawn line."""
    import clockwork.cluster.sim as sim

    monkeypatch.setattr(sim, "PROGRESS_LOG_S", 0.0)  # (every report, for a short run)
    assert main(["simulate", "poisson_warm", "--set", "duration_s=20", "--progress"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "simulated" in ln]
    assert "\r" not in err and len(lines) >= 2, err[-500:]
    assert " ".join(lines[-1].split()).startswith("simulated 20.0 s / 20.0 s (100.0 %)")


def test_simulate_a_scenario_file_whose_name_is_not_utf8(tmp_path, capsys):
    """A scenario file named with bytes that are not UTF-8 (``bad\\xff.toml``): the run
    printed its table, then failed writing run.json with a traceback ('str is not valid
    UTF-8'), nothing written. Now its files are written, the name's bytes escaped."""
    from clockwork.resources import resolve_scenario

    name = os.fsdecode(b"bad\xff.toml")
    (tmp_path / name).write_bytes(resolve_scenario("poisson_warm").read_bytes())
    out = tmp_path / "run"
    assert main(["simulate", str(tmp_path / name), "--set", "duration_s=1", "--quiet",
                 "--out", str(out)]) == 0
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["scenario"].endswith("bad\\xff.toml"), run["scenario"]
    assert main(["report", str(out)]) == 0


def test_simulate_writes_its_files_when_the_reader_of_its_output_goes_away(tmp_path):
    """``clockwork simulate ... --out DIR | less``, quit before the run ends: printing the
    table failed, the files were never written, and it exited 0 without a word. Now the
    table goes nowhere and the files are written."""
    out = tmp_path / "run"
    p = subprocess.Popen(cli_command("simulate", "poisson_warm", "--set", "duration_s=2",
                                     "--quiet", "--out", str(out)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # (before it prints anything: it is still importing)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == 0, err
    assert "wrote " in err and "Traceback" not in err, err
    assert sorted(f.name for f in out.iterdir()) == ["actions.tsv", "requests.tsv",
                                                      "run.json", "summary.json"]
    assert orjson.loads((out / "summary.json").read_bytes())["submitted"] > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_simulate_stopped_by_a_signal_removes_its_spill_folder(tmp_path, sig):
    """SIGTERM or SIGHUP (the terminal closed) to a simulation spilling its rows ends it
    as Ctrl-C does: exit 130, the rows' folder removed (SIGHUP killed it and left the
    folder, growing ~5 MB a second, behind)."""
    if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
        pytest.skip("this test run ignores SIGHUP (nohup), and its children with it")
    spill = tmp_path / "spill"
    spill.mkdir()
    p = subprocess.Popen(cli_command("simulate", "poisson_warm", "--set", "duration_s=3000",
                                     "--quiet", "--spill-dir", str(spill)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(spill.iterdir()):  # (its rows' folder: the run is under way)
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
            time.sleep(0.02)
        p.send_signal(sig)
        err = p.communicate(timeout=30)[1]
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert list(spill.iterdir()) == []


_REPLAY_SIGNALLED_WHILE_WRITING = """
import os, signal, sys, types
import clockwork.cluster.replay as R
from clockwork.cluster.cli import main

async def finished(*args, **kwargs):  # (a replay that ran: its files are next)
    return types.SimpleNamespace(wall_s=0.0, answered_once=True)

def writing(*args, **kwargs):  # the signal comes (once or twice) as the files are written
    for _ in range(int(sys.argv[2])):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    print("written", file=sys.stderr)

R.replay, R.emit_run = finished, writing
sys.exit(main(["replay", "poisson_warm", "--controller", "127.0.0.1:1"]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_replay_signalled_while_writing_its_files_writes_them_then_ends(sig):
    """SIGTERM, SIGHUP or Ctrl-C as a finished replay's files are written: they are
    written all the same, then it ends as Ctrl-C does (exit 130, ``interrupted``); a
    second signal stops it at once. (The replay's loop had put the handlers back to the
    defaults, which killed it, leaving the files' hidden folder and spilled rows behind;
    then the first signal, raised in the middle of the write, lost the files.)"""
    if sig == "SIGHUP" and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        pytest.skip("this test run ignores SIGHUP (nohup), and its children with it")
    for times, written in ((1, True), (2, False)):
        r = subprocess.run([sys.executable, "-c", _REPLAY_SIGNALLED_WHILE_WRITING, sig,
                            str(times)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 130 and "interrupted" in r.stderr, (r.returncode, r.stderr)
        assert ("written" in r.stderr) == written and "Traceback" not in r.stderr, r.stderr


def test_ctrl_c_while_the_arguments_are_read_is_one_line(monkeypatch, capsys):
    """Ctrl-C in a command's first tenth of a second, while its arguments are read (their
    checks import gRPC, numpy), is the one ``interrupted`` line and exit 130, as later
    (a traceback of 25-60 lines ending in KeyboardInterrupt)."""
    import clockwork.cluster.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["replay", "poisson_warm"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


_THREADS = """
import os, sys
from clockwork.cluster.cli import main
assert "numpy" not in sys.modules  # (the verbs import it; none has before main runs)
main(["scenarios"])
import numpy
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="needs Linux's /proc and two or more CPUs")
@pytest.mark.parametrize("given", [None, "2"])
def test_a_clockwork_process_starts_one_blas_thread_unless_told(given):
    """numpy's OpenBLAS starts a thread per CPU at import, each spinning a tenth of a
    second: the clockwork command's processes (which do no linear algebra) start one, and
    an explicit OPENBLAS_NUM_THREADS is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given:
        env["OPENBLAS_NUM_THREADS"] = given
    r = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) == (1 if given is None else 2)


def test_a_link_slower_than_the_windows_is_said(capsys):
    """A one-way network latency longer than future_ms + latest_delta_ms (11 ms by
    default): every action reaches its worker after its window and is refused, and no
    request is served (all TIMEOUT). It ran with nothing said; the simulator now warns
    naming the setting to raise (and only for the Clockwork policy: the baselines' actions
    have no windows)."""
    base = ["simulate", "poisson_warm", "--set", "duration_s=0.5"]
    assert main([*base, "--set", "cluster.network_latency_ms=20"]) == 0
    err = capsys.readouterr().err
    assert ("warning: cluster.network_latency_ms: actions take ~20 ms to reach the worker, "
            "longer than scheduler future_ms + latest_delta_ms (11 ms) allow") in err, err
    assert "raise latest_delta_ms above 19" in err
    for ok in (["--set", "cluster.network_latency_ms=5"],
               ["--set", "cluster.network_latency_ms=20", "--set", "scheduler.latest_delta_ms=30"],
               ["--set", "cluster.network_latency_ms=20", "--set", "scheduler.policy=tfserving"]):
        assert main([*base, *ok]) == 0
        assert "warning" not in capsys.readouterr().err, ok


def test_a_link_whose_jitter_passes_the_windows_is_said(capsys):
    """A network jitter that takes some actions past their windows: those are refused
    (50 ms of jitter: attainment 4 %), with nothing said (only the fixed latency was
    compared with the windows). Now a warning naming jitter_ms; none when the slowest
    action still reaches in time, and only the latency's when no action can."""
    base = ["simulate", "poisson_warm", "--set", "duration_s=0.5"]
    assert main([*base, "--set", "cluster.jitter_ms=50"]) == 0
    err = capsys.readouterr().err
    assert "warning: cluster.jitter_ms: actions take up to ~50" in err, err
    assert "longer than scheduler future_ms + latest_delta_ms (11 ms) allow" in err
    assert main([*base, "--set", "cluster.jitter_ms=5"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*base, "--set", "cluster.jitter_ms=50",
                 "--set", "cluster.network_latency_ms=20"]) == 0
    err = capsys.readouterr().err
    assert "cluster.network_latency_ms" in err and "cluster.jitter_ms" not in err, err


def test_a_live_worker_slower_than_the_windows_is_said_once():
    """The live controller measures each worker's round trip as it connects: half of it
    longer than the windows allow is said once (here the windows are made 0 ms wide, as
    no loopback link is slow)."""
    from tests.conftest import local_cluster

    with local_cluster(workers=1, gpus=1, controller_args=[
            "--set", "future_ms=0", "--set", "latest_delta_ms=0"]) as cluster:
        out = "".join(cluster.controller.output)
    lines = [ln for ln in out.splitlines() if "controller: warning: worker" in ln]
    assert len(lines) == 1, out[-2000:]
    assert "ms to reach the worker, longer than scheduler future_ms + latest_delta_ms (0 ms)" \
        in lines[0], lines


def test_controller_and_worker_lines_are_timed_when_asked():
    """With ``CLOCKWORK_LOG_TIME=1`` each line a controller (or worker) writes to stderr
    begins with the UTC time to the millisecond, for an operator's log file (its lines
    said what happened, never when); without it the lines are as before."""
    import os
    import re

    argv = cli_command("controller", "--port", "0", "--http-port", "-1", "--kserve-port",
                       "-1", "--workers", "127.0.0.1:1", "--connect-timeout", "1")
    timed = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "CLOCKWORK_LOG_TIME": "1"})
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    for p in (timed, plain):
        assert p.returncode == 1 and len(p.stderr.splitlines()) >= 2, p.stderr
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
    assert all(re.match(stamp + r"(clockwork )?controller: ", ln)
               for ln in timed.stderr.splitlines()), timed.stderr
    assert [re.sub("^" + stamp, "", ln) for ln in timed.stderr.splitlines()] == \
        plain.stderr.splitlines()


def test_python_dash_m_clockwork_is_the_command(tmp_path):
    """``python -m clockwork`` runs the ``clockwork`` command (for an environment whose
    scripts are not on the path): it said "'clockwork' is a package and cannot be
    directly executed", exit 1."""
    r = subprocess.run([sys.executable, "-m", "clockwork", "--version"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("clockwork "), (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "clockwork", "simulate", "no_such_scenario"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("clockwork simulate: "), r.stderr
    # a controller.py and a worker.py of the user's in the current folder, which
    # ``python -m`` puts first on the path: this installation's packages all the same
    for name in ("controller", "worker"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the user {name}.py')\n")
    r = subprocess.run([sys.executable, "-m", "clockwork", "simulate", "poisson_warm", "--set",
                        "duration_s=0.2", "--quiet"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "the user" not in r.stderr, r.stderr
