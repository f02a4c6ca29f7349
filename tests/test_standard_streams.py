"""Standard streams that are closed or fail: a command run with stdout/stderr closed
(``>&-``, a daemon's closed descriptors) works, its output dropped; a cluster whose own
stderr fails (a full disk under ``serve 2>>log``) still reads its children's output, so
they never block on a full pipe."""

from __future__ import annotations

import errno
import subprocess
import sys

from clockwork.cluster.local import _ROOT, _Child


def _closed(args: str, cwd) -> subprocess.CompletedProcess:
    """``clockwork ARGS`` with stdout and stderr closed."""
    return subprocess.run(["bash", "-c", f"exec {sys.executable} -m clockwork.cluster.cli "
                           f"{args} >&- 2>&-"], cwd=cwd, timeout=120)


def test_commands_with_stdout_and_stderr_closed_run(tmp_path):
    """They exited 120 with nothing done (sys.stdout None: every print failed), a
    simulation's files never written."""
    assert _closed("scenarios", tmp_path).returncode == 0
    assert _closed(f"simulate poisson_warm --set duration_s=2 --out {tmp_path / 'out'}",
                   tmp_path).returncode == 0
    assert (tmp_path / "out" / "summary.json").is_file()


def test_version_to_a_full_disk_is_one_line_exit_1():
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "--version"],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr == "clockwork: cannot write the version: No space left on device\n"


class _FullDisk:
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_child_is_read_whatever_happens_to_the_echo(monkeypatch):
    """A child echoed to a stderr that fails: its output is read on (the reading thread
    died at the first failed echo; the child then blocked on its full pipe, and a
    serving controller froze)."""
    monkeypatch.setattr(sys, "stderr", _FullDisk())
    talk = "import sys\nfor i in range(5000): print('x' * 100, i)\nprint('done')"
    child = _Child("talker", [sys.executable, "-c", talk], echo=True)
    assert child.proc.wait(60) == 0  # (500 KB: far past a pipe's 64 KiB)
    child._t.join(30)
    assert child.output[-1] == "done\n"



def test_a_removed_current_folder_is_one_line_exit_2(tmp_path):
    """Run from a folder that was removed: one line saying so (simulate said "[Errno 2]
    No such file or directory", an --out folder "cannot write into '.' (permissions)")."""
    gone = tmp_path / "gone"
    gone.mkdir()
    p = subprocess.run(["bash", "-c", f"cd {gone} && rmdir {gone} && exec {sys.executable} "
                        "-m clockwork.cluster.cli simulate poisson_warm"],
                       capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "PYTHONPATH": _ROOT})
    assert p.returncode == 2, p.stderr
    assert p.stderr == ("clockwork: the current folder no longer exists (it was removed): "
                        "change to another one\n"), p.stderr


def test_a_controller_whose_stdout_is_full_stops_in_one_line():
    """A controller whose "listening on" line cannot be written (stdout to a full disk):
    one line, exit 1, its server stopped (it also printed "Exception ignored in
    Server.__del__" and "coroutine ... was never awaited": the line was outside the part
    that stops the server)."""
    from clockwork.cluster.local import _cli

    w = _Child("worker", _cli() + ["worker", "--port", "0"])
    try:
        address = w.wait_address(30.0)
        with open("/dev/full", "w") as full:
            p = subprocess.run(_cli() + ["controller", "--workers", address, "--port", "0",
                                         "--http-port", "-1", "--kserve-port", "-1",
                                         "--models", "resnet50_v2"],
                               stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        w.stop()
    assert p.returncode == 1
    assert p.stderr == "clockwork controller: [Errno 28] No space left on device\n", p.stderr


def test_serve_whose_stdout_is_full_serves_on():
    """``serve > /dev/full``: its address lines are lost, said on stderr, and the cluster
    serves until stopped (the failed print stopped it, exit 1)."""
    import signal

    from clockwork.cluster.local import _cli

    with open("/dev/full", "w") as full:
        p = subprocess.Popen(_cli() + ["serve", "--port", "0", "--http-port", "-1",
                                       "--kserve-port", "-1"],
                             stdout=full, stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for line in p.stderr:
            said.append(line)
            if "cannot write to standard output" in line:
                break
        assert said and "serving on: controller at 127.0.0.1:" in said[-1], said
        assert p.poll() is None  # serving
        p.send_signal(signal.SIGTERM)
        assert p.wait(90) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def test_stderr_full_for_a_moment_loses_lines_not_the_stream():
    """A non-blocking stderr pipe that is full for a moment (EAGAIN): the lines written
    meanwhile are lost, and the stream works again once the reader catches up (a
    failure of any other kind sends it to /dev/null for good)."""
    import io
    import os

    from clockwork.cluster.cli.streams import ReaderSafe

    r, w = os.pipe()
    os.set_blocking(w, False)
    raw = io.FileIO(w, "w")
    err = ReaderSafe(io.TextIOWrapper(io.BufferedWriter(raw), write_through=True),
                     any_error=True)
    try:
        chunk = "x" * 4096 + "\n"
        for _ in range(64):  # (past a pipe's 64 KiB: some writes fail with EAGAIN)
            err.write(chunk)
        err.flush()
        drained = 0
        os.set_blocking(r, False)
        with __import__("contextlib").suppress(BlockingIOError):
            while data := os.read(r, 1 << 16):
                drained += len(data)
        assert drained > 0
        err.write("after\n")
        data = b""
        for _ in range(100):  # (what the buffer kept goes first, a pipe's worth at a time)
            err.flush()
            with __import__("contextlib").suppress(BlockingIOError):
                while chunk_read := os.read(r, 1 << 16):
                    data += chunk_read
            if data.endswith(b"after\n"):
                break
        assert data.endswith(b"after\n")  # (still the pipe, not /dev/null)
    finally:
        raw.close()
        os.close(r)
