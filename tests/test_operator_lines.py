"""What an operator reads in the controller's and the workers' output for events that
change what is served or end a process: each says so in one line (a model loaded or
unloaded through the repository; a controller or worker stopped by a signal, with the
requests the controller answered as it stopped). Real processes on loopback; and the
limits on lines said again and again, on their own."""

from __future__ import annotations

import signal

import clockwork
from tests.conftest import local_cluster, wait_output


def test_loads_unloads_and_stops_are_said():
    with local_cluster(workers=1, gpus=1, models="resnet50_v2") as c:
        with clockwork.Client(c.address, timeout=30) as cl:
            cl.load_model("mnet", copies=2, profile="mobilenet_v2")
            line = wait_output(c.controller, "controller: loaded mnet")
            assert "mnet, mnet:1 (profile mobilenet_v2)" in line, line
            cl.unload_model("mnet")
            line = wait_output(c.controller, "controller: unloaded mnet")
            assert "mnet, mnet:1" in line, line
        worker = c.workers[0]
        c.controller.proc.send_signal(signal.SIGTERM)
        assert c.controller.proc.wait(30) == 0
        wait_output(c.controller, "clockwork controller: stopped (SIGTERM)")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        wait_output(worker, "clockwork worker: stopped (SIGTERM)")


def test_a_log_limiter_says_a_burst_then_counts_and_a_changed_line_at_once(monkeypatch,
                                                                          capsys):
    """``LogLimiter``'s ``burst``: that many lines per ``every`` seconds, then none until
    the oldest of them is ``every`` old, the next saying how many were left out (a worker
    found suspect, answering again and re-admitted 40 times in 40 s wrote 120 lines).
    ``changes``: a line unlike the last one said goes at once (a worker refused again
    for a new reason said the old one for up to a minute)."""
    from clockwork.protocol import ratelog

    now = [0.0]
    monkeypatch.setattr(ratelog.time, "monotonic", lambda: now[0])
    say = ratelog.LogLimiter("c", every=60.0, burst=3)
    for t in range(5):
        now[0] = float(t)
        say(f"line {t}")
    now[0] = 60.5  # (the first is 60 s old: room for one)
    say("line 5")
    assert capsys.readouterr().err.splitlines() == [
        "c: line 0", "c: line 1", "c: line 2", "c: line 5 (2 more like it not shown)"]
    said = ratelog.LogLimiter("c", every=60.0, changes=True)
    for t, line in enumerate(["A", "A", "B", "B", "B", "A"]):
        now[0] = 100.0 + t
        said(line)
    assert capsys.readouterr().err.splitlines() == [
        "c: A", "c: B (1 more like it not shown)", "c: A (2 more like it not shown)"]
