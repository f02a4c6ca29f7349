"""Faults on a live local cluster (real processes on loopback): what happens to requests
when a worker hangs. Part of the fault-injection suite (marker ``faults``)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

from clockwork.time import sec
from tests.inprocess import answer, controller_with, workers_served

pytestmark = pytest.mark.faults


def _serve(tmp_path, scenario: str, *flags: str):
    sc = tmp_path / "s.toml"
    sc.write_text(scenario)
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(sc),
                        "--replay", "--quiet", "--out", str(out),
                        "--log-dir", str(tmp_path / "controller"), *flags],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(out / "requests.tsv") as f:
        return p, list(csv.DictReader(f, delimiter="\t"))


def test_a_hung_worker_is_routed_around(tmp_path):
    """Worker 0 is stopped (SIGSTOP) for 3 s while the other has headroom: the controller
    probes it when its actions run late, stops using it within ~100 ms, re-plans its
    requests, and re-admits it (reset) when it resumes. At least 90 % of the requests
    that arrive during the hang still meet their SLO on a quiet host (checked: 60 %, for
    a shared one); every request is answered once."""
    p, rows = _serve(tmp_path, """
seed = 3
duration_s = 7.0
[cluster]
workers = 2
gpus_per_worker = 1
[[models]]
name = "resnet18_v2"
copies = 4
[[workloads]]
kind = "poisson"
rate_rps = 500
slo_ms = 100
[faults]
hang = [{ worker = 0, at_s = 2.0, for_s = 3.0 }]
""")
    assert "every request answered exactly once: True" in p.stdout + p.stderr
    assert "fault: stop worker 0" in p.stderr and "fault: resume worker 0" in p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers_suspected"] >= 1  # reported, as in the printed table
    assert summary["weights_kept"] >= 1 and "copies kept through the resets" in p.stdout
    assert "workers suspected (then reset)" in p.stdout
    # what failed requests were told, if any failed (counted apart by message)
    assert bool(summary["failures"]) == bool(summary["failed"])
    assert sum(f["count"] for f in summary["failures"]) <= summary["failed"]
    during = [r for r in rows if sec(2.0) <= int(r["arrival"]) < sec(5.0)]
    met = sum(r["deadline_met"] == "1" for r in during) / len(during)
    # >= 0.9 on a quiet host (0.86 seen with the 2 cores shared by 3 busy loops, 0.71
    # with Ray's daemons still stopping); without routing around, the hung worker's half
    # of them would all miss (<= 0.5)
    print(f"met during the hang: {met:.4f} of {len(during)}")
    assert len(during) > 1000 and met >= 0.6, met
    # re-admitted: worker 0's GPU serves again after it resumed
    assert any(r["gpu"] == "0" and int(r["arrival"]) > sec(5.5) and r["status"] == "SUCCESS"
               for r in rows)
    # ... with the weights it had: the reset kept them (no LOAD of a model it held), and
    # no INFER found them missing
    with open(tmp_path / "controller" / "actions.tsv") as f:  # the controller's own log
        acts = [a for a in csv.DictReader(f, delimiter="\t") if a["worker"] == "0"]
    held = {a["model"] for a in acts if a["type"] == "LOAD" and a["status"] == "SUCCESS"
            and int(a["sent"]) < sec(2.0)}
    after = [a for a in acts if int(a["sent"]) > sec(5.0)]
    assert held and not [a for a in after if a["type"] == "LOAD" and a["model"] in held]
    # (an INFER the controller fails back itself, its worker suspect again after 5 s on a
    # loaded host, is logged WORKER_LOST; one sent to a copy whose LOAD overran is the
    # worker's WEIGHTS_NOT_PRESENT, so only the copies kept are asked about)
    assert not [a for a in after if a["status"] == "WEIGHTS_NOT_PRESENT"
                and a["model"] in held]


def test_a_scenario_restarts_the_controller_during_a_live_replay(tmp_path):
    """[faults] controller_restart live: the controller process is killed 2.5 s into the
    replay and a new one started 0.5 s later on the same port and workers. It takes the
    workers' copies over (no LOAD again), the replay's stream goes on with it, what the
    old one had not answered fails (and only that), and every request is answered once."""
    p, rows = _serve(tmp_path, """
seed = 5
duration_s = 7.0
[cluster]
workers = 2
gpus_per_worker = 1
[[models]]
name = "resnet18_v2"
copies = 4
[[workloads]]
kind = "poisson"
rate_rps = 300
slo_ms = 100
[faults]
controller_restart = [{ at_s = 2.5, down_s = 0.5 }]
""")
    assert "every request answered exactly once: True" in p.stdout + p.stderr
    killed = re.search(r"([\d.]+) s  fault: controller killed", p.stderr)
    assert killed and "fault: new controller started" in p.stderr, p.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the new controller took the copies over (the actions: both controllers' counts):
    # the 4 instances' at least; on a loaded host the old one may have placed a second
    # copy of some on the other GPU before the kill (6 seen), which are taken over too
    assert 4 <= summary["weights_adopted"] <= 8, summary
    assert summary["actions"] is not None and summary["actions"]["infer"] > 100, summary
    # only what was sent before the kill failed
    kill_ns = sec(float(killed.group(1)))
    late = [r for r in rows if r["status"] == "ERROR" and int(r["arrival"]) > kill_ns]
    assert not late, (kill_ns, late[:5], p.stderr[-3000:])
    # the cluster serves again: ~1 s after the kill on a quiet host (a new process
    # starting and taking the workers over; 3.5 s seen with the 2 cores shared by 3 busy
    # loops), and from then on nearly every request meets its SLO
    back = min(int(r["arrival"]) for r in rows
               if r["status"] == "SUCCESS" and int(r["arrival"]) > kill_ns)
    assert back < kill_ns + sec(4.0), back
    after = [r for r in rows if int(r["arrival"]) >= back + sec(0.5)]
    met = sum(r["deadline_met"] == "1" for r in after) / len(after)
    assert len(after) > 100 and met >= 0.8, met
    # the old controller's log rows kept beside the new one's
    assert (tmp_path / "controller" / "requests.1.tsv").is_file()


def _one_worker_restarts(duration_s: float, restarts: str) -> str:
    """A scenario of one worker serving resnet18_v2 at 100 r/s for ``duration_s``, with
    ``restarts`` (TOML) as its controller restarts."""
    return f"""
seed = 5
duration_s = {duration_s}
[cluster]
workers = 1
gpus_per_worker = 1
[[models]]
name = "resnet18_v2"
[[workloads]]
kind = "poisson"
rate_rps = 100
slo_ms = 100
[faults]
controller_restart = {restarts}
"""


def test_restarts_closer_than_a_controller_starts_are_played_late_saying_so(tmp_path):
    """Two restarts 0.2 s apart: the second kill waits for the first restart's new
    controller to have started (about a second), said on stderr with how late, and the
    events after it are not held up by the start. The REST and KServe gRPC ports chosen
    by the first controller (0: a free one) are every new controller's too."""
    p, rows = _serve(tmp_path, _one_worker_restarts(
        5.0, "[{ at_s = 1.0, down_s = 0.1 }, { at_s = 1.2, down_s = 0.1 }]"),
        "--http-port", "0", "--kserve-port", "0")
    assert "every request answered exactly once: True" in p.stdout + p.stderr
    assert p.stderr.count("fault: controller killed") == 2, p.stderr[-2000:]
    assert p.stderr.count("fault: new controller started") == 2, p.stderr[-2000:]
    late = re.search(r"fault: controller restart 1 \(kill\) played ([\d.]+) s late", p.stderr)
    assert late and float(late.group(1)) > 0.1, p.stderr[-2000:]
    assert "restart 0 (kill) played" not in p.stderr  # (no restart before it to wait for)
    log = (tmp_path / "run" / "logs" / "controller.log").read_text()
    for what in ("http", "kserve grpc"):
        ports = re.findall(rf"controller {what} listening on \S+:(\d+)", log)
        assert len(ports) == 3 and len(set(ports)) == 1, (what, ports)
    assert any(r["status"] == "SUCCESS" and int(r["arrival"]) > sec(3.5) for r in rows)


def test_a_controller_that_dies_outside_the_scenarios_restarts_is_said_exit_1(tmp_path):
    """A replay whose scenario restarts the controller waits for a controller however it
    went away; one that dies outside the plan (here before the planned restart) is said
    as it happens and at the end, exit 1 (it went unnoticed, exit 0)."""
    import psutil

    sc = tmp_path / "s.toml"
    sc.write_text(_one_worker_restarts(6.0, "[{ at_s = 4.0, down_s = 0.1 }]"))
    serve = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(sc),
                              "--replay", "--quiet"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        import time

        import clockwork

        lines = []
        for line in serve.stderr:
            lines.append(line)
            if "replaying 1 workload(s)" in line:
                break
        address = re.search(r"controller at (\S+);", lines[-1]).group(1)
        with clockwork.Client(address, timeout=10) as c:  # (the replay's requests come)
            deadline = time.monotonic() + 30
            while c.stats().get("requests", 0) < 10:
                assert time.monotonic() < deadline, "no request reached the controller"
                time.sleep(0.05)
        ctrl = [c for c in psutil.Process(serve.pid).children(recursive=True)
                if "controller" in c.cmdline()]
        assert len(ctrl) == 1, lines
        ctrl[0].kill()
        out, err = serve.communicate(timeout=120)
    finally:
        if serve.poll() is None:
            serve.kill()
    err = "".join(lines) + err
    assert serve.returncode == 1, err[-3000:]
    assert "the controller was killed by SIGKILL during the replay, outside the scenario's " \
        "controller restarts" in err, err[-3000:]
    assert "so this run is not the scenario's" in err
    assert "fault: new controller started" in err  # (the planned restart: served again)


def test_a_stop_asked_for_plays_no_more_faults():
    """Once the run is asked to stop (serve's Ctrl-C or SIGTERM, ``stopped``), nothing
    more of the plan is played (a new controller was started after the stop), and what
    was not played is not counted as failed."""
    import threading
    import time

    from clockwork.cluster.faults import LiveFaults

    class Cluster:
        workers = [None]
        timeout = 5.0

    asked = threading.Event()
    for stop_first, want in ((False, ["stop", "resume"]), (True, [])):
        played: list[str] = []
        faults = LiveFaults(Cluster(), {"hang": [{"worker": 0, "at_s": 0.05, "for_s": 0.05}]},
                            10.0, stopped=asked.is_set)
        faults._fault = lambda t0, what, w, played=played: played.append(what)
        if stop_first:
            asked.set()
        faults.start(time.monotonic_ns())
        faults._thread.join(5.0)
        assert not faults._thread.is_alive()
        faults.stop()
        assert played == want and faults.failed == [], (played, faults.failed)


def test_a_killed_controller_is_replaced_and_every_request_answered_once():
    """kill -9 the controller while a stream has requests in flight: each of them is
    answered exactly once (an error, at once); a new controller started on the same port
    takes the workers over and serves, with the weights they still hold (no LOAD for a
    model served before the kill)."""
    import asyncio

    import clockwork
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    with local_cluster(workers=2, gpus=1, models="mobilenet_v2:2") as c:
        async def before_and_during():
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                s = cl.stream()
                ok = await asyncio.wait_for(asyncio.gather(
                    *(s.submit("mobilenet_v2", slo_ms=200) for _ in range(50))), 10)
                futs = [s.submit("mobilenet_v2:1", slo_ms=200) for _ in range(200)]
                c.controller.proc.kill()
                done = await asyncio.wait_for(
                    asyncio.gather(*futs, return_exceptions=True), 5)
                await s.close()
                return ok, done

        ok, done = asyncio.run(before_and_during())
        assert [r.status for r in ok] == [0] * 50
        assert len(done) == 200  # every one resolved, none twice (a future resolves once)
        for r in done:  # answered before the kill, or the stream's error
            assert isinstance(r, ControllerUnavailable) or r.status in (0, 4)
        c.controller.proc.wait()
        c.restart_controller()
        with clockwork.Client(c.address, timeout=10) as cl:
            r = cl.infer("mobilenet_v2", slo_ms=500)
            assert r.status == 0 and not r.cold  # served before the kill: still cached
            assert cl.infer("mobilenet_v2:1", slo_ms=500).status == 0
            st = cl.stats()
            assert st["worker_connects"] == 2  # both workers taken over
            assert st.get("weights_adopted", 0) >= 1


def test_a_stream_goes_on_with_the_controller_that_replaces_a_killed_one():
    """kill -9 the controller under a stream: what was in flight fails (or was answered),
    the requests submitted while it is down wait in the stream, and once a new controller
    listens on the port the same stream carries them and every later one (it failed
    every later submit until a new stream was made). One made with reconnect=False
    ends for good."""
    import asyncio

    import clockwork
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2") as c:
        async def run():
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                s, once = cl.stream(), cl.stream(reconnect=False)
                for st in (s, once):
                    assert (await asyncio.wait_for(st.submit("mobilenet_v2", slo_ms=1000),
                                                   10)).status == 0
                inflight = [s.submit("mobilenet_v2", slo_ms=5000) for _ in range(20)]
                while s._queue:  # (sent: taken by the call's sender)
                    await asyncio.sleep(0)
                # (the messages sent are kept only until the controller takes the call: a
                # load generator's inputs were held until their answers)
                assert s._carried == {} and s.outstanding == 20
                c.controller.proc.kill()
                done = await asyncio.wait_for(
                    asyncio.gather(*inflight, return_exceptions=True), 20)
                await asyncio.to_thread(c.controller.proc.wait)
                ended = await asyncio.wait_for(asyncio.gather(
                    once.submit("mobilenet_v2", slo_ms=1000), return_exceptions=True), 20)
                waiting = [s.submit("mobilenet_v2", slo_ms=30000) for _ in range(5)]
                await asyncio.to_thread(c.restart_controller)
                got = await asyncio.wait_for(asyncio.gather(*waiting), 40)
                after = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=2000), 10)
                await s.close()
                await once.close()
                return done, ended, got, after

        done, ended, got, after = asyncio.run(run())
        assert len(done) == 20 and all(
            isinstance(r, ControllerUnavailable) or r.status == 0 for r in done), done
        assert isinstance(ended[0], ControllerUnavailable), ended
        assert [r.status for r in got] == [0] * 5, [r.message for r in got]
        assert after.status == 0, after.message


def test_a_stream_through_outages_holds_no_given_up_request_and_sends_what_it_closes_on():
    """While its controller is down a stream keeps no message of a request it gave up
    (its queue grew by each one, inputs included: gigabytes a minute under load); closed
    during an outage it sends what waits once a controller is back (it failed them with
    the old call's error); and a stream opened on a controller that is starting (it waits
    for its worker) waits for it (it ended for good)."""
    import asyncio
    import os
    import signal

    import clockwork
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2") as c:
        async def run():
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                s = cl.stream()
                assert (await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=1000),
                                               10)).status == 0
                c.controller.proc.kill()
                await asyncio.to_thread(c.controller.proc.wait)
                short = []
                for _ in range(200):
                    short.append(s.submit("mobilenet_v2", slo_ms=20))
                    await asyncio.sleep(0.01)
                # (given up, or failed if sent on the call before its end was read)
                gone = await asyncio.wait_for(asyncio.gather(*short, return_exceptions=True),
                                              10)
                assert all(isinstance(r, ControllerUnavailable) or r.status == 4
                           for r in gone), gone
                assert s.outstanding == 0 and len(s._queue) <= 64, len(s._queue)
                waiting = [s.submit("mobilenet_v2", slo_ms=30000) for _ in range(5)]
                closing = asyncio.create_task(s.close())
                await asyncio.to_thread(c.restart_controller)
                await asyncio.wait_for(closing, 30)
                got = [(await f).status for f in waiting]
                # a controller that starts: it waits for its worker, stopped
                os.kill(c.workers[0].proc.pid, signal.SIGSTOP)
                try:
                    c.controller.proc.kill()
                    await asyncio.to_thread(c.controller.proc.wait)
                    starting = asyncio.create_task(asyncio.to_thread(
                        c.restart_controller, ["--connect-timeout", "30"]))
                    host, _, port = c.address.rpartition(":")
                    while True:  # (it listens as it starts, refusing calls: "starting")
                        try:
                            _, w = await asyncio.open_connection(host, int(port))
                            w.close()
                            break
                        except OSError:
                            await asyncio.sleep(0.05)
                    fresh = cl.stream()
                    early = [fresh.submit("mobilenet_v2", slo_ms=30000) for _ in range(3)]
                    await asyncio.sleep(1.0)
                finally:
                    os.kill(c.workers[0].proc.pid, signal.SIGCONT)
                await asyncio.wait_for(starting, 40)
                late = [(await asyncio.wait_for(f, 40)).status for f in early]
                await fresh.close()
                return got, late

        got, late = asyncio.run(run())
        assert got == [0] * 5 and late == [0] * 3, (got, late)


def test_closing_the_client_ends_a_stream_waiting_for_its_controller():
    """A stream waiting for its controller to come back (killed) ends when its client
    closes: what waits in it fails ControllerUnavailable at once (it waited out its SLO,
    the stream's task left pending)."""
    import asyncio

    import clockwork
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2") as c:
        async def run():
            cl = clockwork.AsyncClient(c.address, timeout=10)
            s = cl.stream()
            assert (await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=1000),
                                           10)).status == 0
            c.controller.proc.kill()
            await asyncio.to_thread(c.controller.proc.wait)
            while s._away is None:  # (the stream has seen its call end: what is submitted
                await asyncio.sleep(0.01)  # now waits in it, not sent on the dead call)
            f = s.submit("mobilenet_v2", slo_ms=60000)
            await cl.close()
            with pytest.raises(ControllerUnavailable, match="the client was closed"):
                await asyncio.wait_for(f, 5)
            await asyncio.wait_for(s._reader, 5)

        asyncio.run(run())


def test_a_restarted_controller_forgets_what_changed_at_run_time():
    """The controller keeps no state on disk: a new one (same flags) serves the models of
    its --models and connects the workers of its --workers. A model loaded at run time
    is unknown to it (its weights dropped from the worker), a --models model unloaded at
    run time is served again, and a worker added at run time is not connected (its
    process runs on, unused), as Triton's explicit mode keeps no runtime loads."""
    import clockwork
    from clockwork.errors import UnknownModel
    from tests.conftest import local_cluster

    def index(cl) -> dict:
        return {m.name: (m.state, m.reason) for m in cl.repository_index()}

    def until(what, deadline_s: float = 10.0):
        import time

        end = time.monotonic() + deadline_s
        while not what():
            assert time.monotonic() < end, what.__doc__
            time.sleep(0.02)

    with local_cluster(workers=1, gpus=1, models="resnet50_v2,mobilenet_v2") as c:
        with clockwork.Client(c.address, timeout=20) as cl:
            cl.load_model("mnet", profile="mobilenet_v2")
            assert cl.infer("mnet", slo_ms=500).status == 0  # its weights on the worker
            assert cl.unload_model("mobilenet_v2") == ["mobilenet_v2"]
            until(lambda: index(cl)["mobilenet_v2"] == ("UNAVAILABLE", "unloaded"))
            assert c.add_worker()["added"]
            assert cl.stats()["worker_connects"] == 2
        c.controller.stop()
        c.restart_controller()
        with clockwork.Client(c.address, timeout=20) as cl:
            idx = index(cl)
            assert "mnet" not in idx  # never heard of
            with pytest.raises(UnknownModel):
                cl.infer("mnet", slo_ms=500)
            with pytest.raises(UnknownModel):
                cl.unload_model("mnet")
            assert idx["mobilenet_v2"] == idx["resnet50_v2"] == ("READY", "")
            assert cl.infer("mobilenet_v2", slo_ms=500).status == 0
            st = cl.stats()
            assert st["worker_connects"] == 1  # the worker of --workers only
            assert st.get("weights_adopted", 0) == 0  # mnet's weights were not kept
            assert c.workers[1].proc.poll() is None  # the added worker runs on, unused


def test_a_worker_reconnected_while_its_process_lived_on_keeps_its_weights():
    """The controller's stream to a worker breaks while the worker process lives on (the
    controller drops a link on a message it cannot handle, say): on reconnecting, its
    Hello asks the worker to keep the copies its GPU held, the worker's answer says what
    it kept, and those serve again with no LOAD. Controller and worker in this process,
    on loopback gRPC."""
    import asyncio

    from worker.service import WorkerNode

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        async with controller_with([wnode], "v100-reference",
                                   models="resnet50_v2,mobilenet_v2") as node:
            for m in ("resnet50_v2", "mobilenet_v2"):
                assert (await answer(node, m)).status == 0
            loads = node.counters.get("load_ok", 0)
            assert loads == 2
            link = node.links[0]
            node._lost(link)  # the stream is dropped; the process lives on
            assert not link.connected
            while not link.connected:  # the controller reconnects on its own
                await asyncio.sleep(0.01)
            assert sorted(link.state.gpus[0].loaded) == ["mobilenet_v2", "resnet50_v2"]
            assert node.counters.get("worker_losses") == 1
            assert node.counters.get("weights_kept") == 2
            for m in ("resnet50_v2", "mobilenet_v2"):
                r = await answer(node, m)
                assert r.status == 0 and not r.cold
            assert node.counters.get("load_ok", 0) == loads  # served with no LOAD
            assert wnode.executors[0].loaded_models() == ["mobilenet_v2", "resnet50_v2"]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_new_controller_takes_over_the_weights_its_workers_hold():
    """A controller stops; a new one starts on the same worker process (a restart or an
    upgrade). Its Hello asks the worker to keep what it holds, the worker's answer lists
    those weights with their versions, and the clockwork policy serves them with no
    LOAD. ``adopt_weights=False`` (``--fresh-caches``) and the baselines start with an
    empty cache, as before. Controllers and worker in this process, on loopback gRPC."""
    import asyncio

    from controller.service import ControllerNode
    from worker.service import WorkerNode

    models = ("resnet50_v2", "mobilenet_v2")

    async def controller(address, **kw):
        node = ControllerNode([address], "v100-reference", models=",".join(models), **kw)
        await node.start()
        return node

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        async with workers_served([wnode]) as [address]:
            first = await controller(address)
            for m in models:
                assert (await answer(first, m)).status == 0
            assert first.counters.get("load_ok") == 2
            assert first.counters.get("weights_adopted") is None  # the worker was empty
            await first.stop()

            second = await controller(address)  # the same worker, a new controller
            try:
                assert second.counters.get("weights_adopted") == 2
                for m in models:
                    r = await answer(second, m)
                    assert r.status == 0 and not r.cold
                assert second.counters.get("load_ok", 0) == 0  # served with no LOAD
                assert wnode.executors[0].loaded_models() == sorted(models)
            finally:
                await second.stop()

            for kw in ({"adopt_weights": False}, {"policy": "clipper"}):
                node = await controller(address, **kw)
                try:
                    assert node.counters.get("weights_adopted") is None
                    assert wnode.executors[0].loaded_models() == []  # emptied at start
                    r = await answer(node, models[0])
                    assert r.status == 0 and (r.cold or "policy" in kw), kw  # (clipper: no flag)
                    assert node.counters.get("load_ok") == 1
                finally:
                    await node.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_log_flush_that_fails_is_logged_and_the_next_one_goes_on(tmp_path, capsys):
    """--log-dir: a flush that cannot write (here requests.tsv turned into a folder; a
    full disk alike) is counted and logged, the controller serves on, and once the files
    can be written again the logs go on, with whole rows only. The failures are said
    once (a line at every flush, a second, for as long as the disk was full), and so is
    writing working again; at stop the logs are said not whole (the controller exits
    1)."""
    import asyncio
    import time

    from clockwork.actions import RequestStatus
    from clockwork.telemetry import read_logs
    from worker.service import WorkerNode

    logs = tmp_path / "logs"

    async def main():
        async def until(what, seconds=10.0):
            end = time.monotonic() + seconds
            while not what():
                assert time.monotonic() < end, what
                await asyncio.sleep(0.01)

        wnode = WorkerNode(gpus=1, pages=100)
        async with controller_with([wnode], "v100-reference", models="mobilenet_v2",
                                   log_dir=str(logs), log_flush_s=0.05) as node:
            flusher = asyncio.create_task(node._flush_logs())  # (serve_controller's task)
            try:
                assert (await answer(node, "mobilenet_v2")).status == 0
                await until(lambda: (logs / "requests.tsv").exists()
                            and len((logs / "requests.tsv").read_text().splitlines()) == 2)
                (logs / "requests.tsv").rename(tmp_path / "first.tsv")
                (logs / "requests.tsv").mkdir()
                for _ in range(3):  # (a flush with rows to write fails each time)
                    n = node.counters.get("log_flush_errors", 0)
                    assert (await answer(node, "mobilenet_v2")).status == 0
                    await until(lambda n=n: node.counters.get("log_flush_errors", 0) > n)
                (logs / "requests.tsv").rmdir()
                assert (await answer(node, "mobilenet_v2")).status == 0
                await until(lambda: (logs / "requests.tsv").is_file())
                await until(lambda: len((logs / "requests.tsv").read_text().splitlines()) >= 2)
                # (the flush writes its files a step at a time: it says writing works again
                # once its last step is written, after requests.tsv has its rows)
                await until(lambda: node._flush_failures == 0)
            finally:
                flusher.cancel()
            node.write_logs(final=True)
            assert "miss the rows of" in node.logs_lost, node.logs_lost

    asyncio.run(asyncio.wait_for(main(), 60))
    err = capsys.readouterr().err
    assert err.count("failed (") == 1 and "works again (" in err, err
    back = read_logs(logs)  # a header and whole rows: what came after the failure
    assert 1 <= len(back.requests) <= 2 and all(r[5] == RequestStatus.SUCCESS for r in back.requests)


def test_a_log_flush_that_fails_on_a_bug_is_said_and_the_flusher_goes_on(tmp_path, capsys):
    """A flush that raises something other than OSError (a bug in formatting a row, say)
    is counted and said with its traceback, and the next flush goes on: the flusher task
    ended on it, and from then on every row waited in memory, never written."""
    import asyncio
    from types import SimpleNamespace

    from clockwork.protocol.ratelog import LogLimiter
    from controller.service import ControllerNode

    flushes = []

    def flush_steps(out, rows_per_step):
        flushes.append(out)
        if len(flushes) == 1:
            raise RuntimeError("a row that cannot be formatted")
        if len(flushes) == 2:  # (a ValueError too: LogLimiter says those without one)
            raise ValueError("I/O operation on closed file.")
        yield

    counted = []
    node = SimpleNamespace(
        log_flush_s=0.001, log_dir=str(tmp_path), _log_steps=None, _flush_failures=0,
        telemetry=SimpleNamespace(flush_steps=flush_steps),
        count=counted.append, _log_error=LogLimiter("controller", every=60.0),
        _log_bug=LogLimiter("controller", every=0.0),
        _said_spill_error=lambda: None, _said_rows_gone=lambda: None)

    async def main():
        task = asyncio.create_task(ControllerNode._flush_logs(node))
        while len(flushes) < 4:
            assert not task.done(), task
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 30))
    err = capsys.readouterr().err
    assert counted == ["log_flush_errors"] * 2
    assert "RuntimeError('a row that cannot be formatted')" in err, err
    assert err.count("Traceback") == 2 and "ValueError('I/O operation on closed" in err, err
    assert "works again (2 flush(es) failed before" in err, err


@pytest.mark.parametrize("full_at", ["requests.npz", "actions.npz"])
def test_npz_logs_that_cannot_be_written_at_stop_leave_their_rows(tmp_path, capsys,
                                                                  monkeypatch, full_at):
    """--log-format npz: the logs are written at stop; if that fails (a full disk, at the
    first file or the second), the rows' column files are left in --log-dir, where
    ``clockwork report`` reads them, and the controller says its logs are not whole (it
    removed them: every row lost, and exit 0). A first file written before the second
    failed is removed (report took it, and refused the folder as incomplete)."""
    import asyncio
    import errno
    import os

    import clockwork.telemetry as T
    from clockwork.cluster.cli import main as cli
    from worker.service import WorkerNode

    real = T._write_npz

    def full(path, arrays):
        if path.name == full_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, arrays)

    logs = tmp_path / "logs"

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        async with controller_with([wnode], "v100-reference", models="mobilenet_v2",
                                   log_dir=str(logs), log_format="npz") as node:
            for _ in range(3):
                assert (await answer(node, "mobilenet_v2")).status == 0
            with monkeypatch.context() as m:
                m.setattr(T, "_write_npz", full)
                node.write_logs(final=True)
            assert "were not written" in node.logs_lost, node.logs_lost

    asyncio.run(asyncio.wait_for(main(), 60))
    (rows,) = (p for p in logs.iterdir() if p.name.startswith("clockwork-rows-"))
    assert f"left in {rows}" in capsys.readouterr().err
    assert not [p for p in logs.iterdir() if p.suffix == ".npz"]
    assert cli(["report", str(logs)]) == 0
    out = capsys.readouterr().out
    assert "requests submitted" in out and " 3\n" in out.split("requests submitted")[1][:60]
    assert "incomplete" in out, out


def test_a_second_reset_during_a_hellos_write_goes_before_the_actions_after_it():
    """A worker found suspect twice in a row: the second reset (and an action after it)
    came while the writer was still writing the first reset's Hello. The writer then
    took the action at once and wrote it before the second Hello, which wiped it on the
    worker. The second Hello now goes first, then the action."""
    import asyncio

    from clockwork.actions import NEVER, Action, ActionType
    from clockwork.protocol import clockwork_pb2 as pb
    from controller.service import ControllerNode, WorkerLink

    async def main():
        node = ControllerNode([], "v100-reference", models="resnet50_v2")
        written: list = []
        first_hello = asyncio.Event()  # (the first Hello's write is under way)
        go_on = asyncio.Event()

        class Call:  # the link's stream: records what is written, in order
            async def write(self, msg, attach=None):
                kind = msg.WhichOneof("kind")
                written.append([a.id for a in msg.actions.actions] if kind == "actions"
                               else kind)
                if kind == "hello" and not first_hello.is_set():
                    first_hello.set()
                    await go_on.wait()

        link = WorkerLink(0, "127.0.0.1:1", call=Call(),
                          state=pb.WorkerState(device="emulated"))
        node.links = [link]
        writer = asyncio.create_task(node._writer(link))
        try:
            node.reset(0, [])
            await asyncio.wait_for(first_hello.wait(), 10)
            node.reset(0, [])
            node.send(0, [Action(7, ActionType.INFER, 0, 0, "resnet50_v2", 0, NEVER, 1,
                                 batch_size=1, requests=[])])
            go_on.set()
            while len(written) < 3:
                await asyncio.sleep(0.001)
        finally:
            writer.cancel()
        return written

    assert asyncio.run(asyncio.wait_for(main(), 30)) == ["hello", "hello", [7]]


def test_a_worker_back_with_another_weights_cache_stays_out_saying_so(capsys):
    """A worker restarted on its port with a smaller cache (``--pages``): it was taken
    back with the cache size the policy had (100 pages here, 20 now), so a model that
    needed an EVICT first was never loaded (every LOAD refused LOAD_INSUFFICIENT_CACHE
    for room the policy believed free), with only "reconnected" said. It now stays out
    as one back with another GPU count does, the log naming both sizes; back as it was,
    it serves again."""
    import asyncio

    from tests.inprocess import serve_in_process
    from tests.test_repository import _until
    from worker.service import WorkerNode, serve_worker

    async def main():
        from controller.service import ControllerNode

        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        port = int(address.rpartition(":")[2])
        try:
            assert (await answer(node, "resnet50_v2")).status == 0
            for pages in (20, 100):  # another cache, then the one it had
                stop.set()
                await served
                await _until(lambda: not node.links[0].connected, "worker lost")
                stop = asyncio.Event()
                served = asyncio.create_task(serve_worker(
                    "127.0.0.1", port, WorkerNode(gpus=1, pages=pages), stop=stop,
                    link_port=-1))
                if pages == 20:
                    await _until(lambda: node.counters.get("worker_refusals", 0) >= 3,
                                 "refused three times")
                    assert not node.links[0].connected
                    # a request meanwhile is told why no worker serves (it read "none
                    # is connected")
                    r = await answer(node, "resnet50_v2")
                    assert r.status == 1 and r.reason == "no_worker", r
                    assert r.message.startswith(
                        f"no worker is available to serve the model: worker {address} "
                        "came back with another weights cache"), r.message
            await _until(lambda: node.links[0].connected, "taken back as it was")
            assert (await answer(node, "resnet50_v2")).status == 0
        finally:
            await node.stop()
            stop.set()
            await served
        return address

    address = asyncio.run(main())
    err = capsys.readouterr().err
    assert (f"worker {address} came back with another weights cache: GPU 0 has 20 pages, "
            "had 100; it stays out") in err, err
    # the worker's own log says why, once, and not each attempt (it said "connected" and
    # "disconnected" at each, without why)
    said = [x for x in err.splitlines() if x.startswith("worker: ")]
    why = [x for x in said if "does not use this worker" in x]
    assert len(why) == 1 and "came back with another weights cache: GPU 0 has 20 pages" \
        in why[0], said
    assert sum(x.endswith(" connected") for x in said) == 3, said  # first, refused, back


def test_a_worker_says_which_controller_holds_it_and_when_it_lets_go():
    """A worker's log said nothing of its controller: from a worker's host an operator
    could not tell whether anyone held it. It now says when a controller connects (its
    pid, host and port, and where from) and when the session ends."""
    from tests.conftest import local_cluster, wait_output

    with local_cluster(workers=1, gpus=1, models="resnet18_v2") as c:
        line = wait_output(c.workers[0], "worker: controller pid ")
        assert line.rstrip().endswith(" connected"), line
        pid = c.controller.proc.pid
    assert f"worker: controller pid {pid} on " in line, line
    assert wait_output(c.workers[0], " disconnected").startswith(line.rstrip()[:-len(
        "connected")]), c.workers[0].output


def test_a_lost_worker_that_stays_away_is_said_again_with_why(monkeypatch, capsys):
    """A lost worker that does not come back is said again now and then (LOST_SAY_AGAIN_S)
    with how long and why (here: nothing listens on its port): the one "lost worker" line
    was all an operator had, however long it stayed away. Controller and worker in this
    process, on loopback gRPC; the worker's server is stopped."""
    import asyncio
    import time

    import controller.links
    from controller.service import ControllerNode
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    monkeypatch.setattr(controller.links, "LOST_SAY_AGAIN_S", 0.5)

    async def main() -> str:
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="mobilenet_v2")
        await node.start()
        try:
            assert (await answer(node, "mobilenet_v2")).status == 0
            stop.set()
            await served  # the worker's server is gone
            said, end = "", time.monotonic() + 20
            while said.count("still lost") < 2:  # said again, and again
                assert time.monotonic() < end, said
                await asyncio.sleep(0.05)
                said += capsys.readouterr().err
            return said
        finally:
            await node.stop()

    said = asyncio.run(asyncio.wait_for(main(), 60))
    assert "lost worker" in said, said
    line = next(x for x in said.splitlines() if "still lost" in x)
    assert re.fullmatch(r"controller: worker 127\.0\.0\.1:\d+ still lost \(for \d+ s; still "
                        r"trying\): connection refused: is a `clockwork worker` listening "
                        r"there\?", line), line


def test_a_reset_the_worker_fails_ends_its_connection_and_it_is_taken_back():
    """A re-admitted worker (found suspect, then heard from) is reset; a reset whose
    handling fails on the worker ends its connection, so that the controller connects
    again with a Hello and takes it back. (The worker said so in its log and answered
    nothing: the controller waited for the answer for good, the worker connected and
    unused, every request answered no_worker.) Controller and worker in this process."""
    import asyncio
    import time

    from worker.service import WorkerNode

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        hello, failing = wnode.hello, []

        def failing_once(h):
            if failing == [True]:
                failing.append(False)
                raise RuntimeError("a reset that fails (a test)")
            return hello(h)

        wnode.hello = failing_once
        async with controller_with([wnode], "v100-reference", models="resnet50_v2") as node:
            assert (await answer(node, "resnet50_v2")).status == 0
            failing.append(True)
            node.ctrl._suspect(0, time.monotonic_ns(), "a test")  # (re-admitted when next heard from)
            deadline = time.monotonic() + 20
            while failing != [True, False] or not node.ctrl.up[0] or node.ctrl.resetting[0]:
                assert time.monotonic() < deadline, (failing, node.ctrl.up, node.ctrl.resetting)
                await asyncio.sleep(0.02)
            assert (await answer(node, "resnet50_v2")).status == 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_worker_stopped_while_idle_is_suspect_before_a_request_reaches_it():
    """Two workers, both holding the model; worker 1 is stopped (SIGSTOP) while idle. It
    is suspect within about a second (the idle probe: it was listed serving and taken
    for ready for 10-15 s, until its connection's keepalive gave up, and a request placed
    on it waited for its action to be overdue: a 40 ms SLO failed WorkerLost though
    worker 0 held the model). Requests then go to worker 0; resumed, worker 1 serves
    again."""
    import os
    import signal
    import time

    import clockwork
    from tests.conftest import local_cluster

    with local_cluster(workers=2, gpus=1, models="mobilenet_v2:2") as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(20):  # (both copies loaded)
                assert cl.infer("mobilenet_v2", slo_ms=1000).status == 0
            pid = c.workers[1].proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                while [w["state"] for w in cl.workers()] != ["serving", "suspect"]:
                    assert time.monotonic() - t0 < 5, cl.workers()
                    time.sleep(0.05)
                found = time.monotonic() - t0
                assert found < 3, found
                # its time in that state counts from its suspicion (it counted from its
                # connection: 19 s suspect after 6 s stopped)
                row = cl.workers()[1]
                assert 0 < row["for_s"] <= time.monotonic() - t0, row
                rs = [cl.infer("mobilenet_v2", slo_ms=40) for _ in range(20)]
                assert [r.status for r in rs] == [0] * 20
            finally:
                os.kill(pid, signal.SIGCONT)
            t0 = time.monotonic()
            while [w["state"] for w in cl.workers()] != ["serving", "serving"]:
                assert time.monotonic() - t0 < 10, cl.workers()
                time.sleep(0.05)
            row = cl.workers()[1]  # (and serving again, from its readmission)
            assert 0 < row["for_s"] <= time.monotonic() - t0, row
