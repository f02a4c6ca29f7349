"""Two controllers given one worker: the worker belongs to the controller whose connection
is live (``clockwork.protocol.holding``). The other is refused, says so once, keeps
trying, and gets the worker once the holder's connection ends: it exits, or stops
answering (the worker's keepalive closes its connection). A controller's own
reconnection replaces its stale session at once. (They took the worker from each other
every few seconds, for ever, each schedule wrong.) Real processes on loopback, but for
the worker of the tests that need its keepalive short (in this process)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
import urllib.request
from contextlib import asynccontextmanager, contextmanager

import grpc
import pytest

from clockwork.protocol.versions import PROTOCOL
from tests.conftest import cli_command, local_cluster, wait_output
from tests.conftest import poll as _poll

MODEL = "resnet50_v2"
HELD = "worker is held by another controller"  # clockwork.protocol.holding.HELD


def _controller(name: str, worker: str, env, *extra: str):
    """A controller process on a free port serving MODEL from ``worker``, waiting for
    it up to 120 s at start (a worker held by another controller)."""
    from clockwork.cluster.local import _Child

    return _Child(name, cli_command(
        "controller", "--host", "127.0.0.1", "--port", "0", "--workers", worker,
        "--models", MODEL, "--http-port", "-1", "--kserve-port", "-1",
        "--connect-timeout", "120", *extra), False, env)


def _said(child, text: str) -> list[str]:
    return [ln for ln in list(child.output) if text in ln]


def _infer_ok(address: str) -> bool:
    """Whether a request to the controller at ``address`` is served (an error: False)."""
    import clockwork

    with clockwork.Client(address, timeout=20) as cl:
        try:
            return cl.infer(MODEL, slo_ms=2000).status == 0
        except clockwork.errors.ClockworkError:
            return False


def test_a_second_controller_waits_while_the_first_holds_the_worker_then_takes_it():
    """The second controller started on the first one's worker is refused, says so once
    (naming the first: its pid and port, where from, since when) and waits; for 10 s the
    first keeps the worker (no loss, one connection) and serves. Once the first stops,
    the second takes the worker within a few seconds, with the weights it holds."""
    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL) as c:
        first_pid, first_port = c.controller.proc.pid, c.address.rpartition(":")[2]
        second = _controller("controller2", c.worker_addresses[0], c._env)
        try:
            line = wait_output(second, HELD, timeout=30)
            assert f"pid {first_pid} on " in line and f"port {first_port}" in line, line
            assert re.search(r"connected from 127\.0\.0\.1:\d+ since \d{4}-\d\d-\d\d "
                             r"\d\d:\d\d:\d\d UTC", line), line
            # the stretch: the first keeps the worker and serves all along
            n = 0
            with clockwork.Client(c.address, timeout=20) as cl:
                end = time.monotonic() + 10.0
                while time.monotonic() < end:
                    assert cl.infer(MODEL, slo_ms=2000).status == 0
                    n += 1
                st = cl.stats()
            assert n > 10
            assert st["worker_connects"] == 1 and st.get("worker_losses", 0) == 0, st
            assert not _said(c.controller, "lost worker")
            assert second.proc.poll() is None and not _said(second, "listening on")
            assert len(_said(second, HELD)) == 1  # once, not at every attempt
            assert len(_said(c.workers[0], "worker: refused a Connect")) == 1
            # the first stops: the second has the worker within a bounded time
            t0 = time.monotonic()
            c.controller.stop()  # (SIGTERM, and waits for it to exit)
            address = second.wait_address(15)
            took = time.monotonic() - t0
            print(f"\nthe second controller listened {took:.2f} s after the first was "
                  "told to stop")
            assert took < 5.0
            assert len(_said(second, "is ours now")) == 1
            with clockwork.Client(address, timeout=20) as cl:
                r = cl.infer(MODEL, slo_ms=2000)
                assert r.status == 0 and not r.cold  # the first's copy, taken over
                st = cl.stats()
            assert st["worker_connects"] == 1 and st.get("weights_adopted") == 1, st
            assert st["worker_held_refusals"] >= 2, st  # counted at each attempt
            assert len(_said(second, HELD)) == 1
        finally:
            second.stop()
        assert second.proc.returncode == 0


def test_a_controller_held_off_past_its_connect_timeout_says_why_and_exits():
    """A controller whose worker another one holds for all of --connect-timeout exits
    1, saying which controller holds it (it said 'cannot reach worker')."""
    with local_cluster(workers=1, gpus=1, models=MODEL) as c:
        second = _controller("controller2", c.worker_addresses[0], c._env,
                             "--connect-timeout", "2")
        try:
            assert second.proc.wait(30) == 1
            last = wait_output(second, "clockwork controller: cannot take worker", 10)
            assert last.startswith(f"clockwork controller: cannot take worker "
                                   f"{c.worker_addresses[0]}: {HELD} (pid "
                                   f"{c.controller.proc.pid} on "), last
            assert _infer_ok(c.address)  # the first serves on, untouched
        finally:
            second.stop()


@contextmanager
def _worker_in_this_process(monkeypatch):
    """A worker (1 GPU, the fast link on) served by a thread of this process, pinging its
    controllers every 1 s with a 1 s timeout instead of 10 s and 5 s: its address."""
    from clockwork.protocol import keepalive
    from worker.service import WorkerNode, serve_worker

    short = {"grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms"}
    fast = [(k, 1000 if k in short else v) for k, v in keepalive.WORKER_SERVER]
    assert sum(k in short for k, _ in fast) == 3
    monkeypatch.setattr(keepalive, "WORKER_SERVER", fast)
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        async def main() -> None:
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()

            def listening(port: int, _link: int) -> None:
                box["port"] = port
                ready.set()

            await serve_worker("127.0.0.1", 0, WorkerNode(1, None), listening, box["stop"])

        try:
            asyncio.run(main())
        finally:
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(30) and "port" in box, "the worker did not start"
    try:
        yield f"127.0.0.1:{box['port']}"
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        t.join(10)


def test_a_stopped_controller_loses_the_worker_to_the_waiting_one_and_gets_it_back(
        monkeypatch, capfd):
    """The controller that holds the worker is stopped (SIGSTOP): the worker's keepalive
    closes its connection (here within ~2 s; ~15 s by default) and the waiting controller
    takes the worker. Resumed, the first finds its link gone and is refused in turn: it
    says so once and reports the worker as held elsewhere (/metrics, Stats) while it
    serves nothing; it has the worker back once the second stops."""
    import clockwork
    from clockwork.protocol.security import SECRET_ENV
    from controller.metrics import parse_text

    env = {SECRET_ENV: None}  # (a worker on loopback, no cluster secret)
    with _worker_in_this_process(monkeypatch) as worker:
        first = _controller("first", worker, env, "--http-port", "0")
        second = None
        try:
            first_address = first.wait_address(30)
            http = re.search(r"http listening on (\S+:\d+)",
                             wait_output(first, "http listening on", 10)).group(1)
            second = _controller("second", worker, env)
            wait_output(second, HELD, 30)
            os.kill(first.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                second_address = second.wait_address(30)
                took = time.monotonic() - t0
            finally:
                os.kill(first.proc.pid, signal.SIGCONT)
            assert took < 10.0, f"the second controller had the worker {took:.2f} s after"
            line = wait_output(first, HELD, 20)  # its link gone, refused in turn
            assert f"pid {second.proc.pid} on " in line, line
            assert _infer_ok(second_address)
            with clockwork.Client(first_address, timeout=20) as cl:
                with pytest.raises(clockwork.errors.InferenceError) as e:
                    cl.infer(MODEL, slo_ms=2000)
                assert e.value.reason == "no_worker", str(e.value)
                st = cl.stats()
            assert st["worker_losses"] == 1 and st["worker_held_refusals"] >= 1, st
            with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
                samples = parse_text(r.read().decode())
            assert samples["clockwork_workers_held_elsewhere"][0][1] == 1
            assert samples["clockwork_workers_connected"][0][1] == 0
            with clockwork.Client(second_address, timeout=20) as cl:
                assert cl.stats().get("worker_losses", 0) == 0
            # the second stops: the first has the worker back, and serves
            second.stop()
            wait_output(first, "reconnected: it is ours again", 15)
            _poll(lambda: _infer_ok(first_address), 10)
            assert len(_said(first, HELD)) == len(_said(second, HELD)) == 1
            err = capfd.readouterr().err
            assert err.count("worker: refused a Connect") == 2, err  # once each
        finally:
            for ch in (first, second):
                if ch is not None:
                    ch.stop()


@asynccontextmanager
async def _served_worker(host: str = "127.0.0.1"):
    """A worker (1 GPU, no fast link) served by a task of this event loop: its port."""
    from worker.service import WorkerNode, serve_worker

    stop = asyncio.Event()
    port = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(serve_worker(
        host, 0, WorkerNode(1, 100), lambda p, _: port.set_result(p), stop, link_port=-1))
    try:
        yield await port
    finally:
        stop.set()
        await served


def test_the_worker_refuses_another_controller_and_lets_its_holder_reconnect(capfd):
    """The rule, on the wire: while the holder's stream is open a Connect with another
    controller_id, or none, is refused FAILED_PRECONDITION naming the holder (never its
    id); one with the holder's id and worker index replaces its stale session at once
    (that stream ends), with another index it is refused (one worker listed twice);
    once the holder's stream ends, another controller's Connect is taken."""
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol import clockwork_pb2_grpc as pbg

    ours, other = "a" * 32, "b" * 32

    async def main():
        async with _served_worker() as port:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.WorkerStub(ch)

                async def connect(cid: str, label: str = "pid 7 on there, port 9",
                                  index: int = 0):
                    call = stub.Connect()
                    await call.write(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL,
                        worker_id=index, reset=True, controller_id=cid, controller=label)))
                    return call, await asyncio.wait_for(call.read(), 10)

                held, msg = await connect(ours)
                assert msg.WhichOneof("kind") == "state"
                for cid in (other, other, ""):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await connect(cid, "the other one")
                    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    why = e.value.details()
                    assert why.startswith(f"{HELD} (pid 7 on there, port 9; connected from "
                                          "127.0.0.1:"), why
                    assert ours not in why
                # logged once for each refused controller (the two without an id are
                # one: they cannot be told apart)
                assert capfd.readouterr().err.count("worker: refused a Connect") == 2
                with pytest.raises(grpc.aio.AioRpcError) as e:  # ours, as another worker
                    await connect(ours, index=1)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert e.value.details().startswith(
                    "worker is connected to this controller already, as its worker 0 "
                    "(connected from 127.0.0.1:"), e.value.details()
                again, msg = await connect(ours)  # its own reconnection: taken at once
                assert msg.WhichOneof("kind") == "state"
                assert await asyncio.wait_for(held.read(), 10) is grpc.aio.EOF  # replaced
                again.cancel()  # the holder's connection ends: another may take it
                deadline = time.monotonic() + 10
                while True:
                    try:
                        call, msg = await connect(other)
                        break
                    except grpc.aio.AioRpcError as e:  # until the worker sees the end
                        assert time.monotonic() < deadline and HELD in e.details()
                assert msg.WhichOneof("kind") == "state"
                call.cancel()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_refusal_text_is_the_protocols():
    from clockwork.protocol import holding

    assert holding.HELD == HELD


def test_a_controller_that_reaches_one_worker_under_two_addresses_is_told_so():
    """One worker listed twice under addresses that do not resolve alike (127.0.0.1 and
    127.0.0.2, a worker on every interface): the second link is refused as the same
    controller's (its two links took the worker from each other) and the controller
    does not start, saying so."""
    from controller.service import ControllerNode

    async def main():
        async with _served_worker("0.0.0.0") as p:
            node = ControllerNode([f"127.0.0.1:{p}", f"127.0.0.2:{p}"], models=MODEL,
                                  connect_timeout=10)
            try:
                with pytest.raises(ValueError) as e:
                    await node.start()
                assert "worker is connected to this controller already, as its worker" in \
                    str(e.value) and "one worker listed under two addresses" in str(e.value)
            finally:
                await node.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_connect_that_ends_at_its_first_answer_leaves_the_worker_free():
    """A controller's Connect cut off right after the worker's state (its channel closed
    at its deadline while a slow Hello ran, then it exited): the session ends with the
    call. It stayed the holder for ever, and every other controller was refused until
    the worker restarted."""
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol.holding import Holder
    from worker.service import WorkerNode, WorkerServicer

    class Context:
        def peer(self):
            return "ipv4:127.0.0.1:5555"

        async def send_initial_metadata(self, metadata):
            pass

        async def abort(self, code, details):
            raise AssertionError(f"aborted {code}: {details}")

    async def messages():
        yield pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL, worker_id=0, controller_id="a" * 32,
                                                  controller="pid 1"))
        await asyncio.Event().wait()  # (no more: the call is cut off first)

    async def main():
        servicer = WorkerServicer(WorkerNode(1, 100))
        call = servicer.Connect(messages(), Context())
        first = await anext(call)
        assert first.WhichOneof("kind") == "state"
        await call.aclose()  # what gRPC does to a handler whose call ended at this yield
        other = Holder.of(pb.Hello(worker_id=0, controller_id="b" * 32), "ipv4:10.0.0.2:1")
        assert servicer._take(other) == ""  # taken: nobody holds the worker

    asyncio.run(asyncio.wait_for(main(), 30))
