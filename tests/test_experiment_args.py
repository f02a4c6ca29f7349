"""The experiment scripts' argument checks, live summaries and ways of ending: a bad
value or a scale that cannot run live is one line and exit 2 before anything is made,
SIGTERM stops a live run as Ctrl-C does, a live Fig. 11 says only what it measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clockwork.signals import term_as_ctrl_c
from experiments import common

EXPERIMENTS = Path(common.__file__).resolve().parent


def _script(name: str, *argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXPERIMENTS / f"{name}.py"), *argv],
                          capture_output=True, text=True, timeout=timeout, **kw)


# ------------------------------------------------------------------- fig11 --live summary


def _fake_live_fig11(monkeypatch, steps: list[tuple[float, float, float]]):
    """fig11_scale's runs replaced by a live result whose steps are ``steps``
    (offered r/s, goodput r/s, attainment)."""
    from experiments import fig11_scale

    res = SimpleNamespace(summary={"submitted": 1000}, controller_cpu_s=0.6, wall_s=2.0)
    monkeypatch.setattr(common, "run", lambda *a, **k: res)
    monkeypatch.setattr(common, "timeline", lambda r, b: [
        {"t_s": i * b, "offered_rps": o, "goodput_rps": g, "attainment": a}
        for i, (o, g, a) in enumerate(steps)])
    return fig11_scale


def test_fig11_live_summary_says_what_was_measured(monkeypatch, tmp_path):
    """--live: the largest step served at >= 99 % is found from the live run's steps (as
    in the simulator), and the controller's CPU is the whole run's, said so; the summary
    gave the peak goodput as served "at >= 99 %" when the peak step's attainment was 0.59,
    and the whole-run CPU as the figure at that step and at the peak."""
    fig11 = _fake_live_fig11(monkeypatch, [(100, 100, 1.0), (150, 150, 0.995),
                                           (340, 200, 0.59)])
    out = fig11.main(["--smoke", "--live", "--out", str(tmp_path)])
    for r in out["rows"]:
        assert r["served_rps"] == 150 and r["peak_goodput_rps"] == 200
        assert r["ctl_cpu_per_s"] == 0.3
        assert "ctl_cpu_per_s_at_served" not in r and "ctl_cpu_per_s_at_peak" not in r
        # (the run's own seconds: they were named as simulated ones)
        assert not [k for k in r if k.startswith("sim") or k.endswith("sim_s")], r
        assert r["run_s"] > 0 and r["requests_per_wall_s"] > 0
    saved = json.loads((tmp_path / "fig11_scale.json").read_text())
    assert "requests_per_wall_s_min" in saved and "sim_requests_per_wall_s_min" not in saved
    s = out["summary"]
    assert "200 r/s at >= 99 %" not in s and "150 r/s served at >= 99 %" in s, s
    assert "attainment 0.59 at the peak" in s and "over the run" in s, s

    fig11 = _fake_live_fig11(monkeypatch, [(100, 50, 0.5), (340, 200, 0.59)])
    out = fig11.main(["--smoke", "--live", "--out", str(tmp_path)])
    assert all(r["served_rps"] is None for r in out["rows"])
    assert ">= 99 %" not in out["summary"].replace("no step served at >= 99 %", "")
    assert "no step served at >= 99 %" in out["summary"]


# ------------------------------------------------------------------ live_prediction


def test_live_prediction_refuses_a_bad_rate_before_anything_runs(monkeypatch, capsys,
                                                                  tmp_path):
    """--rate 0 was ignored (the scenario's rate ran); a negative one was refused only
    after every missing package had been compiled. Now both are usage errors, before the
    --out folder is made or anything is compiled or run."""
    from experiments import live_prediction

    def ran(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(common, "run_live", ran)
    monkeypatch.setattr(common, "ensure_packages", ran)
    out = tmp_path / "out"
    for argv, option in ((["--rate", "0"], "--rate"), (["--rate", "-5"], "--rate"),
                         (["--duration", "inf"], "--duration")):
        with pytest.raises(SystemExit) as e:
            live_prediction.main([*argv, "--out", str(out), "--packages",
                                  str(tmp_path / "packages")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and option in err[-1], err
        assert not out.exists() and not (tmp_path / "packages").exists()


def _description(help_text: str) -> str:
    """The description paragraph of an argparse --help."""
    paragraphs = help_text.split("\n\n")
    return " ".join(paragraphs[1].split())


def test_descriptions_are_whole_sentences(monkeypatch, capsys):
    """live_prediction's --help description stopped at "... with", bench_security's at a
    colon: only the docstring's first paragraph is shown."""
    from experiments import bench_security, live_prediction

    with pytest.raises(SystemExit):
        live_prediction.main(["--help"])
    text = _description(capsys.readouterr().out)
    assert text.startswith("How well a profile") and text.endswith("."), text
    monkeypatch.setattr(sys, "argv", ["bench_security.py", "--help"])
    with pytest.raises(SystemExit):
        bench_security.main()
    text = _description(capsys.readouterr().out)
    assert text.startswith("Benchmark:") and text.endswith("."), text


# --------------------------------------------------------------------- live refusals


@pytest.mark.parametrize("script", ["fig9_azure", "fig11_scale"])
def test_a_refused_live_scale_is_one_line_exit_2_and_makes_no_folder(script, tmp_path):
    """--full --live (a scale this machine cannot hold live): the refusal was a bare
    SystemExit (exit 1, no program name) after the --out folder had been made."""
    out = tmp_path / "out"
    r = _script(script, "--full", "--live", "--out", str(out))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith(f"{script}.py: --live: "), err
    assert not out.exists()


def test_a_refused_live_scale_makes_no_default_folder(monkeypatch, tmp_path):
    """Without --out the refusal left an empty experiments/figures/live/full/."""
    from experiments import fig9_azure, fig11_scale

    monkeypatch.setattr(common, "FIGURES", tmp_path / "figures")
    for mod in (fig9_azure, fig11_scale):
        with pytest.raises(common.LiveRefused):
            mod.main(["--full", "--live"])
    assert not (tmp_path / "figures").exists()


def test_live_scale_refused_is_one_line_exit_2():
    r = _script("live_scale", "--workers", "20")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith("live_scale.py: --live: ") and "20 emulated workers" in err[0]


# ---------------------------------------------------------------- bad values, up front


@pytest.mark.parametrize("script,argv,option", [
    ("live_scale", ["--duration", "inf"], "--duration"),
    ("live_scale", ["--duration", "nan"], "--duration"),
    ("controller_restart", ["--warm", "inf"], "--warm"),
    # (a live restart has no --down: it was taken and not used)
    ("controller_restart", ["--down", "2"], "--down"),
    ("bench_json_stall", ["--seconds", "inf"], "--seconds"),  # (it never ended)
    ("bench_repository_reads", ["--copies", "0", "--models", "1"], "--copies"),
    ("bench_repository_reads", ["--models", "0"], "--models"),
    ("bench_repository_reads", ["--repeat", "0", "--models", "1", "--copies", "1"],
     "--repeat"),
    ("predictability", ["--quick", "--models", "mlp", "--cache", "{file}"], "--cache"),
])
def test_a_bad_value_is_a_usage_error_before_anything_is_made(script, argv, option,
                                                              tmp_path):
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    argv = [a.format(file=tmp_path / "file") for a in argv]
    if script == "predictability":
        argv += ["--out", str(out)]
    r = _script(script, *argv)
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}.py: error: ") and option in last, last
    assert not out.exists()


# --------------------------------------------------------------------- SIGTERM, SIGHUP


def test_stop_signals_raise_keyboard_interrupt_inside_and_not_after():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), term_as_ctrl_c():
        os.kill(os.getpid(), signal.SIGHUP if signal.getsignal(signal.SIGHUP)
                is not signal.SIG_IGN else signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_stops_a_live_run_as_ctrl_c_does(tmp_path):
    """SIGTERM to a --live run: exit 130 and one line, its cluster's and its logs'
    temporary folders removed (it was killed: exit 143, both left behind)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    p = subprocess.Popen([sys.executable, str(EXPERIMENTS / "fig5_compare.py"), "--smoke",
                          "--live", "--out", str(tmp_path / "out")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("cw-live-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp.glob("cw-live-*")), "the live run did not start"
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "fig5_compare.py: interrupted", err[-2000:]
    assert "Traceback" not in err
    left = [x.name for x in tmp.iterdir()
            if x.name.startswith(("cw-live-", "clockwork-cluster-"))]
    assert not left, left


# ------------------------------------------------------------------------ bench_reconnect


def test_bench_reconnect_without_a_success_is_a_failure(monkeypatch, capsys):
    """No success after the controller came back: it printed a line and exited 0."""
    import clockwork
    import clockwork.cluster.local
    from experiments import bench_reconnect

    class Cluster:
        address = "localhost:1"

        def __init__(self, **kw):
            self.controller = SimpleNamespace(stop=lambda timeout: None)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def restart_controller(self):
            pass

    class Client:
        def __init__(self, address, timeout):
            self.calls = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def stats(self):
            self.calls += 1
            if self.calls > 1:  # (the first, before the outage, succeeds)
                raise clockwork.errors.ControllerUnavailable("not there")
            return {}

    monkeypatch.setattr(clockwork.cluster.local, "LocalCluster", Cluster)
    monkeypatch.setattr(clockwork, "Client", Client)
    monkeypatch.setattr(bench_reconnect, "BACK_WAIT_S", 0.3)
    monkeypatch.setattr(sys, "argv", ["bench_reconnect.py"])
    with pytest.raises(SystemExit) as e:
        common.script(lambda: bench_reconnect.main(["--down", "0"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("bench_reconnect.py: ") and "no success within" in err[0], err


def test_a_default_out_that_cannot_be_written_is_refused_before_the_runs(monkeypatch,
                                                                           tmp_path, capsys):
    """The default --out (the repository's figures/) is checked as a given one is, before
    anything runs: a folder it cannot write failed after the whole run (up to 25 minutes
    at --full), in a traceback."""
    (tmp_path / "figures").write_text("a file where the folder goes")
    monkeypatch.setattr(common, "FIGURES", tmp_path / "figures")
    with pytest.raises(SystemExit) as e:
        common.parse_args([], "a figure")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "the default --out" in err and "--out DIR" in err, err


def test_a_stop_signal_held_while_a_child_starts_is_raised_after():
    """clockwork.signals.stops_held: SIGTERM (as Ctrl-C, term_as_ctrl_c) inside it is
    raised as KeyboardInterrupt once it ends, not in the middle (bench_kserve's client
    process started then read half its start message: an EOFError traceback)."""
    import os
    import signal

    from clockwork.signals import stops_held, term_as_ctrl_c

    reached = []
    with term_as_ctrl_c(), pytest.raises(KeyboardInterrupt):
        with stops_held():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append(True)
    assert reached == [True]
    # a second one stops at once (asked twice)
    with term_as_ctrl_c(), pytest.raises(KeyboardInterrupt):
        with stops_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            reached.append(True)
    assert reached == [True]


@pytest.mark.parametrize("error", ["device", "child"])
def test_a_device_not_here_or_a_childs_refusal_is_one_line_exit_2(monkeypatch, capsys, error):
    """A script asked for a device this machine has not (cupy missing: ``--device
    cuda``), or whose cluster's child refused its settings, ends in one line, exit 2 (it
    was a traceback, exit 1)."""
    from clockwork.cluster.local import ChildRefused
    from worker.devices.base import DeviceUnavailable

    def main():
        if error == "device":
            raise DeviceUnavailable("cuda device unavailable: cupy is not installed")
        raise ChildRefused("worker0: --pages 0: must be at least 1\n", False)

    monkeypatch.setattr(sys, "argv", ["check_outputs.py"])
    with pytest.raises(SystemExit) as e:
        common.script(main)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("check_outputs.py: ") and ("cupy" in err[0] or "--pages" in err[0])


def test_check_outputs_says_a_package_it_cannot_check_in_one_line(tmp_path, capsys):
    """``check_outputs.py --packages DIR`` with a folder that is no package (or another
    model's, or damaged): one line naming it and why, exit 2 (it was a traceback, exit
    1: an output outside 1e-4 to a script driving it)."""
    from experiments import check_outputs

    (tmp_path / "mlp").mkdir()
    assert check_outputs.main(["--models", "mlp", "--packages", str(tmp_path)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() [:2] == ["mlp", "INVALID"] and "no model.json" in out[1], out
    assert out[-1].endswith("1 package(s) not checked (INVALID above)"), out


def test_predictability_removes_the_out_it_made_if_stopped_empty(tmp_path, monkeypatch):
    """predictability.py stopped before writing: the --out it made is removed, as the
    figure scripts' are (it was left, empty)."""
    from experiments import predictability

    monkeypatch.setattr(common, "_MADE", [])
    out = tmp_path / "new" / "out"
    predictability.parse_args(["--models", "mlp", "--out", str(out)])
    assert out.is_dir()
    common._unmake()
    assert not out.exists()


def test_an_interrupted_script_says_where_its_files_so_far_are(monkeypatch, tmp_path,
                                                               capsys):
    """Ctrl-C after a script wrote some of its files (run_all after fig5, a part of the
    Azure replay): the one line says where they are (it said only "interrupted")."""
    monkeypatch.setattr(common, "_MADE", [])
    monkeypatch.setattr(common, "OUTS", [])
    monkeypatch.setattr(sys, "argv", ["run_all.py"])
    out = tmp_path / "out"
    earlier = tmp_path / "earlier"  # (an --out holding an earlier run's files only)
    earlier.mkdir()
    os.utime(_touch(earlier / "fig5_compare.tsv"), (0, 0))

    def main(done: bool):
        args = common.parse_args(["--smoke", "--out", str(out)], "test")
        if done:
            (args.out / "fig5_compare.tsv").write_text("x\n")
        raise KeyboardInterrupt

    for done in (False, True):
        with pytest.raises(SystemExit) as e:
            common.script(lambda done=done: main(done))
        err = capsys.readouterr().err.strip()
        assert e.value.code == 130
        assert err == "run_all.py: interrupted" + (
            f"; what it wrote before is in {out}" if done else ""), err
        assert out.exists() == done  # (made, left empty: removed)
    common.OUTS.clear()
    common.parse_args(["--smoke", "--out", str(earlier)], "test")
    with pytest.raises(SystemExit):
        common.script(lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    assert capsys.readouterr().err.strip() == "run_all.py: interrupted"


def _touch(p):
    p.write_text("x\n")
    return p


def test_a_smoke_runs_temporary_folder_is_removed_if_it_stops_empty(monkeypatch, tmp_path):
    """--smoke without --out writes to a new temporary folder: one the run stopped
    before writing to is removed as a made --out is (it was left behind, empty)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(common, "_MADE", [])
    args = common.parse_args(["--smoke"], "test")
    assert args.out.parent == tmp_path and args.out.is_dir()
    common._unmake()
    assert not args.out.exists()
