"""What a controller says, and does, while no worker can serve: the only worker hung
(suspect: it does not answer a probe) or gone. Real processes on loopback, stock
clients."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from clockwork.actions import RequestStatus
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from tests.conftest import local_cluster, wait_output
from tests.conftest import poll as _poll

MODEL = "resnet50_v2"


def _status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def test_readiness_is_off_while_the_only_worker_is_suspect_and_back_when_it_answers():
    """The only worker is stopped (SIGSTOP) with a request on it: the controller finds it
    suspect (it does not answer a probe) and handles it as lost, so nothing is ready --
    /readyz, /v2/health/ready, ServerReady, ModelReady, the index -- as with a lost
    worker (all said ready while every request timed out). Resumed, it answers again,
    is re-admitted, and all is ready again."""
    tgrpc = pytest.importorskip("tritonclient.grpc")

    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL, kserve_port=0,
                       controller_args=["--http-port", "0"]) as c:
        http = f"http://{c.printed_address('http')}"
        k = tgrpc.InferenceServerClient(c.address)
        worker = c.workers[0].proc
        stopped = False
        try:
            with clockwork.Client(c.address, timeout=30) as cl:
                def index_state():
                    return {m.name: (m.state, m.reason) for m in cl.repository_index()}[MODEL]

                def ready() -> tuple:
                    return (_status(f"{http}/readyz"), _status(f"{http}/v2/health/ready"),
                            _status(f"{http}/v2/models/{MODEL}/ready"),
                            k.is_server_ready(), k.is_model_ready(MODEL), index_state())

                assert cl.infer(MODEL, slo_ms=2000).status == 0
                every_ready = (200, 200, 200, True, True, ("READY", ""))
                assert ready() == every_ready
                os.kill(worker.pid, signal.SIGSTOP)
                stopped = True
                answered = []

                def ask():  # an INFER on the stopped worker: overdue, so it is probed
                    with clockwork.Client(c.address, timeout=30) as other:
                        try:
                            answered.append(other.infer(MODEL, slo_ms=3000).status)
                        except clockwork.errors.ClockworkError as e:
                            answered.append(e.status)

                t = threading.Thread(target=ask)
                t.start()
                wait_output(c.controller, "is suspect (no answer to a probe)", timeout=15)
                none_ready = (503, 503, 503, False, False, ("UNAVAILABLE", "no worker connected"))
                _poll(lambda: ready() == none_ready, 5)
                t.join(30)
                assert len(answered) == 1
                # a load has no worker to take it: UNAVAILABLE at once (it waited the
                # update's 30 s for the stopped worker)
                t0 = time.monotonic()
                with pytest.raises(clockwork.errors.RepositoryUnavailable, match="no worker"):
                    cl.load_model("mnet", profile="mobilenet_v2")
                assert time.monotonic() - t0 < 5.0
                os.kill(worker.pid, signal.SIGCONT)
                stopped = False
                _poll(lambda: ready() == every_ready, 20)
                assert cl.infer(MODEL, slo_ms=2000).status == 0
        finally:
            if stopped:
                os.kill(worker.pid, signal.SIGCONT)
            k.close()


def test_a_load_goes_on_with_the_healthy_worker_while_another_is_suspect():
    """Two workers, one stopped (SIGSTOP) and found suspect: a model loaded meanwhile is
    served at once by the healthy one (the load waited for the suspect one's answer until
    its connection dropped or 30 s passed, then failed UNAVAILABLE, and an unload of the
    same name waited behind it); resumed, the other worker is re-admitted with the model
    in its instance list and serves it too."""
    import clockwork

    with local_cluster(workers=2, gpus=1, models=MODEL) as c:
        worker = None
        stopped = False
        try:
            with clockwork.Client(c.address, timeout=30) as cl:
                r = cl.infer(MODEL, slo_ms=2000)
                assert r.status == 0
                worker = c.workers[r.gpu].proc  # (one GPU a worker) the one with the copy
                os.kill(worker.pid, signal.SIGSTOP)
                stopped = True
                def ask():  # INFERs on both workers: the stopped one's are probed
                    with clockwork.Client(c.address, timeout=30) as other:
                        with contextlib.suppress(clockwork.errors.ClockworkError):
                            other.infer(MODEL, slo_ms=3000)

                asking = [threading.Thread(target=ask) for _ in range(8)]
                for t in asking:
                    t.start()
                wait_output(c.controller, "is suspect (no answer to a probe)", timeout=15)
                t0 = time.monotonic()
                assert [m.name for m in cl.load_model("mnet", profile="mobilenet_v2")] == ["mnet"]
                assert time.monotonic() - t0 < 5.0
                assert cl.infer("mnet", slo_ms=2000).status == 0
                cl.unload_model("mnet")
                cl.load_model("mnet2", profile="mobilenet_v2")
                os.kill(worker.pid, signal.SIGCONT)
                stopped = False
                for t in asking:
                    t.join(30)
                wait_output(c.controller, "answers again; resetting and re-admitting", 20)
                wait_output(c.controller, "re-admitted (it kept ", 20)  # (its answer came)
                # the re-admitted worker serves the instance loaded while it was away: the
                # healthy one gone, it takes the model's requests
                _poll(lambda: cl.stats().get("worker_readmissions", 0) >= 1, 20)
                back = c.workers.index(next(w for w in c.workers if w.proc is worker))
                c.workers[1 - back].proc.kill()
                wait_output(c.controller, f"lost worker {c.worker_addresses[1 - back]} ",
                            timeout=15)
                r = cl.infer("mnet2", slo_ms=5000)
                assert r.status == 0 and r.gpu == back, r
        finally:
            if stopped and worker is not None:
                os.kill(worker.pid, signal.SIGCONT)


def test_a_suspect_worker_that_cannot_serve_a_model_loaded_meanwhile_stays_out(tmp_path):
    """A worker found suspect while a model it has no profile for is loaded: when it
    answers again, its re-admission's Hello says it cannot serve the model, and it stays
    out (refused, as at a connection's Hello) instead of being let back in (it was, and
    the model's requests placed there failed UNKNOWN_MODEL); the healthy one serves."""
    import shutil

    import clockwork
    from clockwork.profiles import load_profile_set

    partial = tmp_path / "partial"
    shutil.copytree(load_profile_set("v100-reference").path, partial)
    (partial / "resnet18_v2.json").unlink()
    names = [MODEL, f"{MODEL}:1"]
    with local_cluster(workers=2, gpus=1, models=f"{MODEL}:2",
                       worker_args=[[], ["--profiles", str(partial)]]) as c:
        worker = c.workers[1].proc
        stopped = False
        try:
            with clockwork.Client(c.address, timeout=30) as cl:
                gpus: set[int] = set()

                def both() -> bool:
                    """a copy on each worker (one GPU each)"""
                    gpus.update(cl.infer(n, slo_ms=2000).gpu for n in names)
                    return len(gpus) == 2
                _poll(both, 20)
                os.kill(worker.pid, signal.SIGSTOP)
                stopped = True

                def ask(name):  # INFERs on both workers: the stopped one's are probed
                    with clockwork.Client(c.address, timeout=30) as other:
                        with contextlib.suppress(clockwork.errors.ClockworkError):
                            other.infer(name, slo_ms=3000)

                asking = [threading.Thread(target=ask, args=(names[i % 2],))
                          for i in range(8)]
                for t in asking:
                    t.start()
                wait_output(c.controller, "is suspect (no answer to a probe)", timeout=15)
                assert [m.name for m in cl.load_model("r", profile="resnet18_v2")] == ["r"]
                os.kill(worker.pid, signal.SIGCONT)
                stopped = False
                for t in asking:
                    t.join(30)
                wait_output(c.controller, "cannot serve r", timeout=20)
                _poll(lambda: cl.stats().get("worker_refusals", 0) >= 1, 20)
                for _ in range(4):
                    r = cl.infer("r", slo_ms=2000)
                    assert r.status == 0 and r.gpu == 0, r
        finally:
            if stopped:
                os.kill(worker.pid, signal.SIGCONT)


def test_a_load_waiting_for_a_worker_is_answered_when_the_controller_stops():
    """SIGTERM while a load waits for its (stopped) worker's answer: the load is answered
    at once, "controller is shutting down", and the controller exits 0 (the wait
    went on until the server's grace cancelled the call: "Cancelling all calls", at
    times with a traceback)."""
    import clockwork
    from clockwork.errors import RepositoryUnavailable

    with local_cluster(workers=1, gpus=1, models=MODEL) as c:
        worker = c.workers[0].proc
        try:
            with clockwork.Client(c.address, timeout=30) as cl:
                assert cl.infer(MODEL, slo_ms=2000).status == 0
                os.kill(worker.pid, signal.SIGSTOP)
                got: list = []

                def load():
                    try:
                        got.append(cl.load_model("x", profile="resnet34_v2"))
                    except Exception as e:  # noqa: BLE001 - what the client raised
                        got.append(e)
                t = threading.Thread(target=load)
                t.start()
                _poll(lambda: {m.name: m.state for m in cl.repository_index()}.get("x")
                      == "LOADING", 10)
                c.controller.proc.send_signal(signal.SIGTERM)
                t.join(30)
                assert c.controller.proc.wait(30) == 0
            assert len(got) == 1 and isinstance(got[0], RepositoryUnavailable), got
            assert "controller is shutting down" in str(got[0]), got
            assert "Traceback" not in "".join(c.controller.output)
        finally:
            os.kill(worker.pid, signal.SIGCONT)


def test_an_add_of_a_worker_that_does_not_answer_is_answered_when_the_controller_stops():
    """SIGTERM while add_worker waits for a worker that does not answer (a listener that
    never speaks): the add is answered at once, "controller is shutting down", and
    the controller exits 0 (the add waited until the server's grace cancelled the call:
    "Cancelling all calls")."""
    import socket

    import clockwork
    from clockwork.errors import ControllerUnavailable

    with local_cluster(workers=1, gpus=1, models=MODEL) as c:
        silent = socket.create_server(("127.0.0.1", 0))
        silent.settimeout(20)
        port = silent.getsockname()[1]
        got: list = []
        try:
            with clockwork.Client(c.address, timeout=60) as cl:
                def add():
                    try:
                        got.append(cl.add_worker(f"127.0.0.1:{port}", timeout=30))
                    except Exception as e:  # noqa: BLE001 - what the client raised
                        got.append(e)
                t = threading.Thread(target=add)
                t.start()
                conn, _ = silent.accept()  # the controller dialed it: the add waits
                c.controller.proc.send_signal(signal.SIGTERM)
                t.join(30)
                assert c.controller.proc.wait(30) == 0
                conn.close()
        finally:
            silent.close()
    assert len(got) == 1 and isinstance(got[0], ControllerUnavailable), got
    assert "controller is shutting down" in str(got[0]), got


def test_a_request_with_no_worker_connected_is_unavailable_at_once():
    """With its only worker gone (SIGKILL) the controller serves no request: one with a
    5 s SLO is answered at once UNAVAILABLE / 503 with Retry-After, on every front end
    (it waited its whole SLO, then said TIMEOUT: SLO cannot be met, 504), as the health
    checks and a load say."""
    tgrpc = pytest.importorskip("tritonclient.grpc")
    import numpy as np
    from tritonclient.utils import InferenceServerException

    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL, kserve_port=0,
                       controller_args=["--http-port", "0"]) as c:
        http = f"http://{c.printed_address('http')}"
        k = tgrpc.InferenceServerClient(c.address)
        try:
            with clockwork.Client(c.address, timeout=30) as cl:
                assert cl.infer(MODEL, slo_ms=2000).status == 0
                os.kill(c.workers[0].proc.pid, signal.SIGKILL)
                c.workers[0].proc.wait(10)
                _poll(lambda: _status(f"{http}/v2/health/ready") == 503)
                t0 = time.monotonic()
                with pytest.raises(clockwork.errors.InferenceError) as e:
                    cl.infer(MODEL, slo_ms=5000)
                assert time.monotonic() - t0 < 2.0
                assert e.value.reason == "no_worker", (e.value.reason, str(e.value))
                assert "no worker" in str(e.value)
            # one whose SLO was spent before the controller read it (it says it waited
            # 500 ms in its client; a controller held up until its workers left reads
            # such ones) is TIMEOUT, as with a worker, not a no_worker to try again
            with grpc.insecure_channel(c.address) as ch:
                late = pbg.ClockworkStub(ch).Infer(pb.InferRequest(
                    model=MODEL, slo_ms=100, queued_ns=500_000_000, skip_outputs=True),
                    timeout=10)
            assert late.status == RequestStatus.TIMEOUT, late
            assert late.reason != "no_worker" and late.latency_ns >= 500_000_000, late
            x = tgrpc.InferInput("data", [1, 3, 224, 224], "FP32")
            x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
            t0 = time.monotonic()
            with pytest.raises(InferenceServerException) as e:
                k.infer(MODEL, [x], parameters={"slo_ms": 5000})
            assert time.monotonic() - t0 < 2.0
            assert e.value.status() == "StatusCode.UNAVAILABLE", e.value.message()
            body = json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 224, 224],
                                           "datatype": "FP32", "data": [0.0] * 150528}],
                               "parameters": {"slo_ms": 5000}}).encode()
            req = urllib.request.Request(f"{http}/v2/models/{MODEL}/infer", data=body,
                                         method="POST")
            t0 = time.monotonic()
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=20)
            assert time.monotonic() - t0 < 2.0
            assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
            assert "no worker" in json.loads(e.value.read())["error"]
        finally:
            k.close()


def test_a_request_queued_when_the_only_worker_hangs_is_answered_no_worker():
    """The only worker is stopped (SIGSTOP) with requests of a 1-day SLO on it: found
    suspect, their INFERs fail back and they are queued again, with no worker to take
    them. After no_worker_wait_ms (here 500 ms) they are answered no_worker, as one
    arriving then is (they were held until the worker came back, or for a day)."""
    import concurrent.futures

    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL,
                       controller_args=["--set", "no_worker_wait_ms=500"]) as c:
        worker = c.workers[0].proc
        with clockwork.Client(c.address, timeout=60) as cl:
            assert cl.infer(MODEL, slo_ms=2000).status == 0  # (loaded)
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    t0 = time.monotonic()
                    calls = [pool.submit(cl.infer, MODEL, slo_ms=86_400_000)
                             for _ in range(4)]
                    errors = []
                    for f in calls:
                        with pytest.raises(clockwork.errors.InferenceError) as e:
                            f.result(timeout=30)
                        errors.append(e.value)
                    took = time.monotonic() - t0
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            assert {e.reason for e in errors} == {"no_worker"}, [str(e) for e in errors]
            assert took < 15, took
            # the worker back, the model is served again
            _poll(lambda: not _raises(cl, MODEL), 30)


def _raises(cl, model: str) -> bool:
    """Whether a request for ``model`` raises (no worker yet)."""
    import clockwork

    try:
        cl.infer(model, slo_ms=5000)
    except clockwork.errors.ClockworkError:
        return True
    return False


def test_a_worker_lost_again_for_the_same_cause_and_not_back_is_logged():
    """A worker killed and restarted twice in a row (it reconnects each time), then
    killed for good, within the 5 s in which a repeat of the same cause gets no line:
    once a reconnection attempt fails, its last loss is logged after all. (The log ended
    on 'reconnected' for a worker that was away.)"""
    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL) as c, \
            clockwork.Client(c.address, timeout=10) as cl:
        def kill():
            os.kill(c.workers[0].proc.pid, signal.SIGKILL)
            c.workers[0].proc.wait(10)

        def last_worker_line() -> str:
            said = [ln for ln in list(c.controller.output) if "worker 127.0.0.1" in ln]
            return said[-1] if said else ""

        for _ in range(2):
            connects = cl.stats()["worker_connects"]
            kill()
            c.restart_worker(0)
            _poll(lambda n=connects: cl.stats()["worker_connects"] > n, 10)
        kill()
        _poll(lambda: "lost worker" in last_worker_line(), 10)


def test_an_idle_worker_that_hangs_on_the_fast_link_is_noticed_by_keepalive(monkeypatch):
    """On the fast link the worker's gRPC stream stays open, idle: its keepalive is what
    notices a worker process that stops (SIGSTOP) while no request is out -- nothing is
    overdue, so no probe is sent. The controller (here in this process, with a 1 s
    keepalive instead of 10 s) treats the worker as lost, so it is not ready, and takes
    it back once it runs again. Before, the stream's end was never read: the worker
    stayed 'ready' for as long as it was stopped."""
    import asyncio
    import subprocess
    import sys

    from clockwork.cluster.local import _ADDR
    from clockwork.protocol import keepalive
    from controller import links, service

    fast = [(k, 1000 if k in ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms",
                              "grpc.http2.ping_timeout_ms") else v)
            for k, v in links.WORKER_CHANNEL_OPTIONS]
    assert len(fast) == len(links.WORKER_CHANNEL_OPTIONS) >= len(keepalive.CHANNEL)
    monkeypatch.setattr(links, "WORKER_CHANNEL_OPTIONS", fast)
    w = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "worker", "--port",
                          "0", "--gpus", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        line = w.stdout.readline()
        m = _ADDR.search(line)
        assert m and "fast link on port" in line, line

        async def main():
            node = service.ControllerNode([f"{m.group(1)}:{m.group(2)}"], "v100-reference",
                                          models=MODEL)
            await node.start()
            try:
                assert node.counters.get("worker_fast_links") == 1 and node.serving()
                os.kill(w.pid, signal.SIGSTOP)
                t0 = time.monotonic()
                while node.serving():
                    assert time.monotonic() - t0 < 20, "a stopped idle worker stayed ready"
                    await asyncio.sleep(0.05)
                assert node.counters.get("worker_losses") == 1
                os.kill(w.pid, signal.SIGCONT)
                while not node.serving():
                    assert time.monotonic() - t0 < 40, "the worker was not taken back"
                    await asyncio.sleep(0.05)
                assert node.counters.get("worker_fast_links") == 2
            finally:
                await node.stop()

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        os.kill(w.pid, signal.SIGCONT)
        w.kill()
        w.wait(10)


def test_a_request_its_lost_worker_failed_too_late_to_retry_raises_worker_lost():
    """A request answered ERROR because its INFER's worker was lost (no time left to run
    it elsewhere) has reason ``worker_lost``, so the Python client raises ``WorkerLost``
    (an ``InferenceError``); any other ERROR keeps its reason."""
    from types import SimpleNamespace

    from clockwork.actions import ActionType, ErrorCode, RequestStatus, Result
    from clockwork.errors import InferenceError, WorkerLost, error_for
    from clockwork.requests import Reply, Request
    from controller.inflight import error_message
    from controller.service import ControllerNode

    node = SimpleNamespace(profiles={MODEL: None}, unloading=set())
    for code, reason in ((ErrorCode.WORKER_LOST, "worker_lost"),
                         (ErrorCode.EXEC_TOO_LATE, ""), (ErrorCode.WEIGHTS_NOT_PRESENT, "")):
        r = Request(1, MODEL, 0, 10**8)
        msg = error_message(Result(3, ActionType.INFER, code, 0, 0, MODEL, message="why"))
        resp = ControllerNode._response(node, Reply(r, RequestStatus.ERROR, 10**7, msg), r)
        assert (resp.status, resp.reason) == (RequestStatus.ERROR, reason), code
        e = error_for(resp.status, resp.reason, resp.message, MODEL)
        assert isinstance(e, InferenceError)
        assert isinstance(e, WorkerLost) == (code == ErrorCode.WORKER_LOST)


def test_a_restarted_controller_starts_without_a_hung_worker_and_adds_it_when_it_answers():
    """A controller restarted while one of its two workers is stopped (SIGSTOP): after
    --connect-timeout it serves on the other one, saying which it left out and why, not
    ready meanwhile (/readyz 503); once the stopped worker answers again it is added (as
    AddWorker adds one) and the controller is ready. It exited 1 instead: one hung worker
    kept the whole cluster down."""
    import clockwork

    with local_cluster(workers=2, gpus=1, models=f"{MODEL}:2", http_port=0) as c:
        with clockwork.Client(c.address, timeout=30) as cl:
            assert cl.infer(MODEL, slo_ms=2000).status == 0
        hung = c.workers[1].proc.pid
        os.kill(hung, signal.SIGSTOP)
        try:
            c.controller.proc.kill()
            c.controller.proc.wait(10)
            c.restart_controller(["--connect-timeout", "2"])
            line = wait_output(c.controller, "did not answer within --connect-timeout 2 s")
            assert c.worker_addresses[1] in line and "stopped or hung" in line, line
            assert "(1 more awaited)" in wait_output(c.controller, "listening on")
            http = f"http://{c.printed_address('http')}"
            assert _status(f"{http}/readyz") == 503
            assert _awaited(http) == 1
            with clockwork.Client(c.address, timeout=30) as cl:
                assert cl.infer(MODEL, slo_ms=2000).status == 0
        finally:
            os.kill(hung, signal.SIGCONT)
        wait_output(c.controller, f"worker {c.worker_addresses[1]} joined with 1 GPU(s)",
                    timeout=30)
        _poll(lambda: _status(f"{http}/readyz") == 200)
        assert _awaited(http) == 0
        with clockwork.Client(c.address, timeout=30) as cl:
            assert {cl.infer(MODEL, slo_ms=2000).status for _ in range(20)} == {0}


def _awaited(http: str) -> float:
    """The controller's clockwork_workers_awaited gauge, read from its /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{http}/metrics", timeout=10) as r:
        text = r.read().decode()
    return next(s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "clockwork_workers_awaited")


HUNG_SERVER = """
import asyncio, time, grpc
async def main():
    s = grpc.aio.server()
    port = s.add_insecure_port("127.0.0.1:0")
    await s.start()
    print(f"hung listening on 127.0.0.1:{port}", flush=True)
    time.sleep(120)  # its event loop stuck: gRPC's own threads still take channels
asyncio.run(main())
"""


def test_a_worker_whose_loop_is_stuck_is_left_out_at_start_too():
    """A listed worker whose gRPC server completes a channel but whose event loop is
    stuck (no call is answered) is left out as one that does not answer: the controller
    serves on the other. (The look at which workers answer took a ready channel for an
    answer; the Hello then timed out, and the start ended, exit 1.)"""
    import subprocess
    import sys

    from tests.conftest import cli_command

    procs = []

    def start(argv):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return p

    def line_with(p, text):
        for line in p.stdout:
            if text in line:
                return line
        raise AssertionError(f"{text!r} never printed (exit {p.wait()})")

    try:
        worker = start(cli_command("worker", "--port", "0", "--gpus", "1", "--link-port", "-1"))
        real = line_with(worker, "listening on").split("listening on ")[1].split()[0]
        hung = start([sys.executable, "-c", HUNG_SERVER])
        stuck = line_with(hung, "hung listening on").split()[-1]
        ctl = start(cli_command("controller", "--workers", f"{real},{stuck}", "--port", "0",
                                "--http-port", "-1", "--kserve-port", "-1",
                                "--models", MODEL, "--connect-timeout", "2"))
        left = line_with(ctl, "did not answer within --connect-timeout 2 s")
        assert stuck in left and "stopped or hung" in left, left
        ready = line_with(ctl, "clockwork controller listening on")
        assert "(1 worker(s) (1 more awaited)" in ready, ready
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_load_is_checked_against_the_caches_of_the_workers_connected():
    """Two workers, 20 and 40 pages of weights cache; the larger one is lost. A model of
    33 pages is loaded: no GPU connected can hold it, so the load is INVALID_ARGUMENT and
    makes nothing (it was made, answered READY while every request timed out, and the
    larger worker was refused when it came back until the model was unloaded). A model
    the smaller one holds still loads."""
    import clockwork

    with local_cluster(workers=2, gpus=1, models="mobilenet_v2",
                       worker_args=[["--pages", "20"], ["--pages", "40"]]) as c:
        with clockwork.Client(c.address, timeout=30) as cl:
            c.workers[1].proc.kill()
            wait_output(c.controller, f"lost worker {c.worker_addresses[1]} ", timeout=15)
            with pytest.raises(clockwork.errors.InvalidRequest,
                               match="needs 33 pages of weights cache; the largest GPU of "
                                     "the workers connected has 20"):
                cl.load_model("big", profile="vgg16")
            assert "big" not in {m.name for m in cl.repository_index()}
            assert [m.name for m in cl.load_model("small", profile="resnet18_v2")] == ["small"]
            assert cl.infer("small", slo_ms=2000).status == 0


# a worker whose clock answers (ClockSync and echoes alike) read WT, whatever the time
BROKEN_CLOCK_WORKER = """
import sys
import worker.service as ws
from clockwork.protocol import clockwork_pb2 as pb
WT = int(sys.argv[1])
async def clock_sync(self, request, context):
    await self._authorize(context, ws.WORKER_CLOCK_SYNC)
    return pb.ClockSyncResponse(worker_time=WT)
for obj in vars(ws).values():
    if isinstance(obj, type) and "ClockSync" in vars(obj):
        obj.ClockSync = clock_sync
from clockwork.cluster.cli import main
sys.exit(main(["worker", "--port", "0", "--gpus", "1", "--link-port", "-1"]))
"""


@pytest.mark.parametrize("reads", [-2**63, 2**63 - 1])
def test_a_worker_whose_clock_reads_far_from_ours_is_refused_by_name(reads):
    """A worker whose clock answers read the int64 ends: the controller's start ends with
    one line saying so. It was taken: at -2^63 every action's window went out in the far
    past, each refused, every request TIMEOUT and nothing logged; at 2^63 - 1 each
    action's write failed out of int64's range and the worker was lost again and
    again."""
    import subprocess
    import sys

    from tests.conftest import cli_command

    w = subprocess.Popen([sys.executable, "-c", BROKEN_CLOCK_WORKER, str(reads)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = next(x for x in w.stdout if "listening on" in x)
        address = line.split("listening on ")[1].split()[0]
        ctl = subprocess.run(cli_command("controller", "--workers", address, "--port", "0",
                                         "--http-port", "-1", "--kserve-port", "-1",
                                         "--models", MODEL, "--insecure-no-auth"),
                             capture_output=True, text=True, timeout=60)
        assert ctl.returncode != 0, ctl
        assert f"worker {address}'s clock reads {reads} ns" in ctl.stderr, ctl.stderr
        assert "a broken clock" in ctl.stderr and "Traceback" not in ctl.stderr, ctl.stderr
    finally:
        w.kill()
        w.wait()
