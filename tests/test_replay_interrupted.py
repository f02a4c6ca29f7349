"""A live replay stopped by a signal keeps its figures: no more requests are sent, the
answers still due are awaited, the table is printed and ``--out`` written, marked
``stopped: interrupted``, exit 130 (Ctrl-C threw everything away; SIGTERM killed
``clockwork replay`` without a word). Real processes on loopback."""

from __future__ import annotations

import re
import signal
import subprocess
import threading

import orjson

import clockwork
from tests.conftest import cli_command, local_cluster, poll

SC = "scenarios/poisson_warm.toml"  # (723.5 r/s on one warm model)


def _lines(stream, into: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: into.extend(stream), daemon=True)
    t.start()
    return t


def _answered(address: str, at_least: int):
    def enough():
        """the controller answered some of the replay's requests"""
        with clockwork.Client(address, timeout=10) as cl:
            return cl.stats().get("requests", 0) >= at_least
    return enough


def _replaying(p: subprocess.Popen, err: list[str]) -> str:
    """The controller address ``clockwork serve ... --replay`` names as it starts its
    replay (read from its stderr lines, ``err``)."""
    def started():
        """serve says it replays, naming the controller"""
        assert p.poll() is None, "".join(err)
        return next((m for line in err if (m := re.search(
            r"controller at (\S+); replaying", line))), None)
    return poll(started, 90).group(1).rstrip(",")


def _serve_replay(argv: list[str], answered: int, act) -> tuple[int, str, str]:
    """``clockwork serve ARGV`` (a ``--replay``) in a session of its own: once its
    controller has answered ``answered`` requests, ``act(p)``; then its exit code,
    stderr and stdout (it is killed on the way out, whatever happened)."""
    p = subprocess.Popen(cli_command("serve", *argv), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    err: list[str] = []
    table: list[str] = []
    readers = [_lines(p.stderr, err), _lines(p.stdout, table)]
    try:
        poll(_answered(_replaying(p, err), answered), 60)
        act(p)
        code = p.wait(60)
    finally:
        p.kill()
        p.wait()
    for t in readers:
        t.join(10)
    return code, "".join(err), "".join(table)


def _spilling(spill) -> None:
    """A replay's request rows are in files in a folder of its own inside ``spill``."""
    (rows,) = spill.iterdir()
    assert any(f.name.startswith("requests.") for f in rows.iterdir()), list(rows.iterdir())


def _check_kept(out, code: int, err: str, table: str) -> None:
    assert code == 130, err
    assert re.search(r"interrupted [\d.]+ s into the run: no more requests are sent", err), err
    assert "Traceback" not in err, err
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["stopped"]["reason"] == "interrupted"
    assert 0 < summary["stopped"]["at_s"] < 30 and summary["duration_s"] < 30
    assert summary["submitted"] >= 200 and summary["answered_once"] is True
    assert "stopped early" in table and "interrupted" in table, table
    r = subprocess.run(cli_command("report", str(out)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and f"{summary['submitted']:,}" in r.stdout, r.stderr


def test_replay_stopped_by_sigterm_keeps_its_figures(tmp_path):
    """(With its rows in files, ``--spill-dir``: their folder is there while it runs and
    removed at the end.)"""
    out, spill = tmp_path / "run", tmp_path / "spill"
    with local_cluster(workers=1, gpus=1, models="resnet50_v2", http_port=-1) as c:
        p = subprocess.Popen(cli_command("replay", SC, "--controller", c.address,
                                         "--set", "duration_s=30", "--quiet", "--out",
                                         str(out), "--spill-dir", str(spill)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            poll(_answered(c.address, 200), 60)
            _spilling(spill)
            p.send_signal(signal.SIGTERM)
            table, err = p.communicate(timeout=60)
        finally:
            p.kill()
            p.wait()
        _check_kept(out, p.returncode, err, table)
        assert list(spill.iterdir()) == []
        with clockwork.Client(c.address, timeout=10) as cl:  # (the controller serves on)
            assert cl.infer("resnet50_v2", slo_ms=2000).status == 0


def test_serve_replay_stopped_by_ctrl_c_keeps_its_figures(tmp_path):
    out = tmp_path / "run"
    spill = tmp_path / "spill"
    code, err, table = _serve_replay(
        [SC, "--replay", "--port", "0", "--http-port", "-1", "--kserve-port", "-1", "--set",
         "duration_s=30", "--quiet", "--out", str(out), "--spill-dir", str(spill)], 200,
        lambda p: (_spilling(spill), p.send_signal(signal.SIGINT)))
    _check_kept(out, code, err, table)
    assert list(spill.iterdir()) == []
    assert "clockwork serve: stopped" in err


def test_replay_stopped_while_it_connects_ends_at_once(tmp_path):
    """Ctrl-C while ``clockwork replay`` waits for a controller that accepts and never
    answers: exit 130 at once (the first signal was only noted, and it ran on until the
    connection timed out, ~13 s, then exit 1 'could not reach the controller')."""
    import socket
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        p = subprocess.Popen(cli_command("replay", SC, "--controller", f"127.0.0.1:{port}"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            silent.settimeout(60)
            conn, _ = silent.accept()  # (it is connecting: past its imports and set-up)
            with conn:
                p.send_signal(signal.SIGINT)
                t0 = time.monotonic()
                err = p.communicate(timeout=60)[1]
                took = time.monotonic() - t0
        finally:
            p.kill()
            p.wait()
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert took < 5, took  # (not the connection's timeout)


def test_serve_replay_says_a_worker_that_died_and_exits_1(tmp_path):
    """A worker process killed during ``serve SCENARIO --replay`` (not by the scenario's
    own faults): said as it happens and at the end, exit 1, as a fault that could not be
    played is (the run, with fewer GPUs, is not the scenario's). It ended exit 0 with no
    word."""
    import os
    from pathlib import Path

    def kill_a_worker(p):
        workers = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
                   and f"\nPPid:\t{p.pid}\n" in _status(d)
                   and b" worker" in _cmdline(d)]
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)

    code, text, _ = _serve_replay(
        ["live_poisson_1000", "--replay", "--port", "0", "--http-port", "-1", "--kserve-port",
         "-1", "--set", "duration_s=6", "--set", "workloads.0.rate_rps=200", "--quiet"], 50,
        kill_a_worker)
    assert code == 1, text
    assert re.search(r"worker \d was killed by SIGKILL during the replay; it is not "
                     r"restarted", text), text
    assert "1 worker process(es) exited during the replay, unplanned" in text, text


def _status(d) -> str:
    try:
        return (d / "status").read_text()
    except OSError:
        return ""


def _cmdline(d) -> bytes:
    try:
        return (d / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def test_other_clients_requests_are_not_said_below_zero():
    """A replay's ``other_requests``: the controller's request count's growth less what
    the replay sent; below 0 (an overloaded controller had not yet read requests the
    replay gave up on when its counters were read) it is not known, None (it said "the
    controller took in -11,478 request(s) of other clients")."""
    from clockwork.cluster.replay import other_requests

    assert other_requests(1_500, 1_000) == 500
    assert other_requests(1_000, 1_000) == 0
    assert other_requests(900, 1_000) is None
    assert other_requests(1_500, 1_000, given_up=3) is None  # (too small, maybe: unknown)
