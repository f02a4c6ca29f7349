"""What an operator reads in the controller's and the workers' output for events that
change what is served or end a process: each says so in one line (a model loaded or
unloaded through the repository; a controller or worker stopped by a signal, with the
requests the controller answered as it stopped). Real processes on loopback."""

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
