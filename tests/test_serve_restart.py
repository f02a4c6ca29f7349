"""``clockwork serve`` (no --replay) restarts a worker that dies, on the same port with the
same flags, and the controller takes it back; a worker that keeps dying (more than
``WORKER_RESTARTS`` restarts within ``RESTART_WINDOW_S``) stops the cluster, exit 1.
Real processes on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import clockwork
from clockwork.cluster.serve import RESTART_WINDOW_S, WORKER_RESTARTS
from clockwork.errors import ClockworkError


class Serve:
    """``clockwork serve`` as a child process; its stderr lines read by a thread."""

    def __init__(self, read_err: bool = True, env: dict | None = None) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "clockwork.cluster.cli", "serve", "--port", "0",
             "--http-port", "-1", "--kserve-port", "-1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f),
                                         daemon=True)
                        for f, into in ((self.p.stdout, self.out), (self.p.stderr, self.err))
                        if read_err or f is self.p.stdout]
        for t in self.readers:
            t.start()
        m = self.wait_line(self.out, r"controller listening on (\S+)")
        self.address = m.group(1)

    def wait_line(self, lines: list[str], pattern: str, after: int = 0, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            exited = self.p.poll() is not None
            if exited:  # (its last lines read before the last look)
                for t in self.readers:
                    t.join(10)
            for line in lines[after:]:
                if m := re.search(pattern, line):
                    return m
            assert not exited and time.monotonic() < deadline, \
                f"no {pattern!r} (exit {self.p.poll()}):\n{''.join(self.err[-30:])}"
            time.sleep(0.05)

    def children(self) -> list[int]:
        """The pids of serve's children (the controller and the workers)."""
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rpartition(")")[2].split()[1]) == self.p.pid:
                    pids.append(int(d.name))
        return pids

    def worker_pid(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.children():
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"worker" in argv:
                    return pid
            assert time.monotonic() < deadline, "no worker process"
            time.sleep(0.05)

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(60)
        finally:
            if self.p.poll() is None:
                self.p.kill()
            for t in self.readers:  # (its last lines read before the test looks at them)
                t.join(10)


def _served(address: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with clockwork.Client(address, timeout=10) as cl:
        while True:
            try:
                if cl.infer("resnet50_v2", slo_ms=2000).status == 0:
                    return
            except ClockworkError:
                pass
            assert time.monotonic() < deadline, "the controller did not serve again"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_serve_restarts_a_worker_killed_with_sigkill():
    s = Serve()
    try:
        worker = s.wait_line(s.err, r"\[worker0\] clockwork worker listening on (\S+) ").group(1)
        _served(s.address)
        old = s.worker_pid()
        seen = len(s.err)
        os.kill(old, signal.SIGKILL)
        s.wait_line(s.err, rf"clockwork serve: worker0 was killed by SIGKILL; restarting it on "
                    rf"{re.escape(worker)}", after=seen)
        s.wait_line(s.err, rf"\[worker0\] clockwork worker listening on {re.escape(worker)} ",
                    after=seen)
        assert s.worker_pid() != old
        _served(s.address)  # the controller took it back
        assert s.p.poll() is None
        assert not any("stopping" in line for line in s.err), s.err
    finally:
        rc = s.stop()
    assert rc == 0, "".join(s.err[-30:])


def test_serve_stops_a_cluster_whose_worker_keeps_dying():
    s = Serve()
    try:
        for n in range(WORKER_RESTARTS + 1):
            pid = s.worker_pid()
            children = s.children()
            seen = len(s.err)
            os.kill(pid, signal.SIGKILL)
            if n < WORKER_RESTARTS:
                s.wait_line(s.err, r"\[worker0\] clockwork worker listening on", after=seen)
        rc = s.p.wait(60)
    finally:
        s.stop()
    assert rc == 1, "".join(s.err[-30:])
    notes = [line for line in s.err if line.startswith("clockwork serve: ")]
    assert sum("restarting it" in line for line in notes) == WORKER_RESTARTS, notes
    assert (f"worker0 was killed by SIGKILL, restarted {WORKER_RESTARTS} times in "
            f"{RESTART_WINDOW_S:g} s; stopping") in "".join(notes), notes
    assert len(children) == 2 and not any(_alive(p) for p in children)  # (all stopped)


def test_serve_says_its_controller_was_stopped_by_a_signal_sent_to_it():
    """The controller SIGTERMed on its own (not through serve) stops cleanly with code 0:
    serve said "controller exited (code 0)", as if it had ended by itself."""
    s = Serve()
    try:
        for pid in s.children():
            if b"controller" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                os.kill(pid, signal.SIGTERM)
                break
        else:
            raise AssertionError("no controller process")
        rc = s.p.wait(60)
        s.wait_line(s.err, r"clockwork serve: stopped")
    finally:
        s.stop()
    assert rc == 1, "".join(s.err[-30:])
    assert ("clockwork serve: the controller stopped (code 0: it was told to stop); "
            "stopping\n") in s.err, s.err


def test_serve_help_states_the_restart_rule(capsys):
    from clockwork.cluster.cli import main

    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"restarted {WORKER_RESTARTS} times within {RESTART_WINDOW_S:g} s"
            in text), text


class _Proc:
    def __init__(self, rc: int | None) -> None:
        self.returncode = rc

    def poll(self) -> int | None:
        return self.returncode


class _Child:
    name = "worker0"

    def __init__(self, rc: int | None) -> None:
        self.proc = _Proc(rc)


class _Cluster:
    """What ``_restart_worker`` uses of a LocalCluster: worker 0 has exited; each new
    one exits before it listens ``dying`` times, then one starts."""

    def __init__(self, dying: int) -> None:
        self.workers = [_Child(-9)]
        self.worker_addresses = ["127.0.0.1:1"]
        self.dying = dying
        self.starts = 0

    def restart_worker(self, i: int) -> None:
        self.starts += 1
        if self.starts <= self.dying:
            self.workers[i] = _Child(-9)
            raise RuntimeError("worker0 exited (rc -9)")
        self.workers[i] = _Child(None)


def test_a_worker_that_dies_while_restarting_counts_as_one_more_exit(capsys):
    """A restarted worker that exits before it listens (killed again at once) stopped
    the whole cluster after one restart of the five allowed; it is one more exit."""
    from clockwork.cluster.serve import _restart_worker

    c = _Cluster(dying=2)
    times: list[float] = []
    assert _restart_worker(c, 0, times) is None  # restarted a third time: it serves
    assert c.starts == 3 and len(times) == 3 and c.workers[0].proc.poll() is None
    err = capsys.readouterr().err
    assert err.count("restarting it on 127.0.0.1:1") == 3 and "stopping" not in err, err
    c = _Cluster(dying=100)  # dies every time: stopped at the bound, as when serving
    assert _restart_worker(c, 0, []) == 1
    assert c.starts == WORKER_RESTARTS
    assert f"restarted {WORKER_RESTARTS} times in" in capsys.readouterr().err


def test_serve_goes_on_when_the_reader_of_its_stderr_goes_away():
    """``clockwork serve 2>&1 | tee log`` whose ``tee`` dies: serve's next line on stderr
    (a worker's restart notice) failed, and that stopped the whole cluster, exit 0, without
    a word. Now what it writes there is dropped: the worker is restarted, the cluster
    serves, and it stops on SIGTERM as usual."""
    s = Serve(read_err=False)
    try:
        _served(s.address)
        s.p.stderr.close()  # (its reader gone: serve's next write to the pipe fails)
        old = s.worker_pid()
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while s.worker_pid() == old:
            assert s.p.poll() is None, f"serve exited ({s.p.returncode})"
            assert time.monotonic() < deadline, "the worker was not restarted"
            time.sleep(0.05)
        _served(s.address)
        assert s.p.poll() is None
    finally:
        rc = s.stop()
    assert rc == 0


def test_a_stop_while_a_worker_restarts_stops_at_once(tmp_path):
    """SIGTERM while serve waits for a restarted worker to listen (a cuda worker may take
    minutes, each line it says giving it more): the cluster stops at once, exit 0, as
    while serving. The stop was taken up only once the restart gave up, 30 s later (never,
    for a worker that said a line every 10 s), and said as its failure, exit 1."""
    # a worker started once the flag file exists never listens (each process of the
    # cluster imports sitecustomize at its start: only the restarted worker sees the flag)
    flag = tmp_path / "hang"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        f"if os.path.exists({str(flag)!r}) and 'worker' in sys.argv:\n"
        "    time.sleep(3600)\n")
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)
    s = Serve(env={**os.environ, "PYTHONPATH": path})
    try:
        s.wait_line(s.err, r"\[worker0\] clockwork worker listening on ")
        flag.touch()
        seen = len(s.err)
        os.kill(s.worker_pid(), signal.SIGKILL)
        s.wait_line(s.err, r"clockwork serve: worker0 was killed by SIGKILL; restarting it",
                    after=seen)
        t0 = time.monotonic()
        rc = s.stop()
        took = time.monotonic() - t0
    finally:
        if s.p.poll() is None:
            s.p.kill()
    assert rc == 0, "".join(s.err[-20:])
    assert took < 15, took
    assert "could not be restarted" not in "".join(s.err)
    assert s.err[-1].strip() == "clockwork serve: stopped", s.err[-5:]
