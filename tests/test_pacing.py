"""Stream pacing (``clockwork.protocol.pacing``): a busy stream sends one message per
interval, but the controller never holds a reply past one interval before its request's
SLO ends, nor a worker a result past one interval before its batch's deadline. Controller
(with its clockwork.v1 gRPC service) and an emulated worker in this process, the stock
``clockwork.AsyncClient`` on loopback."""

from __future__ import annotations

import asyncio
import time

import grpc

import clockwork
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.pacing import Pacer
from tests.test_faults_live import _serve_in_process

INTERVAL_US = 400_000.0  # the controller's reply pacing here: 400 ms


class _Busy(Pacer):
    """A pacer that paces from the first message (no rate or CPU to reach first)."""

    def __init__(self, interval_us: float, busy_rate: float = 0.0) -> None:
        super().__init__(interval_us, 0.0)


def test_a_paced_reply_goes_before_its_slo_ends(monkeypatch):
    """Replies were held for the stream's next message whatever their SLO: with the
    controller's replies paced at 400 ms, a request with a 100 ms SLO answered in a few
    milliseconds reached the client after its SLO (status TIMEOUT, reason ``late``). A
    reply now goes no later than one interval before its SLO ends (here: at once); one
    whose SLO leaves room still waits for the next message."""
    from controller import intake
    from controller.service import ClockworkServicer, ControllerNode
    from worker.service import WorkerNode

    monkeypatch.setattr(intake, "Pacer", _Busy)

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        address, stop, served = await _serve_in_process(wnode)
        node = ControllerNode([address], "v100-reference", models="mobilenet_v2",
                              reply_interval_us=INTERVAL_US)
        await node.start()
        server = grpc.aio.server()
        pbg.add_ClockworkServicer_to_server(ClockworkServicer(node), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with clockwork.AsyncClient(f"127.0.0.1:{port}", timeout=10) as c:
                s = c.stream()
                first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                t0 = time.monotonic()  # the stream's first reply went: the next slot is
                urgent = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=100), 10)
                urgent_s = time.monotonic() - t0
                t1 = time.monotonic()
                relaxed = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                relaxed_s = time.monotonic() - t1
                await s.close()
        finally:
            await server.stop(None)
            await node.stop()
            stop.set()
            await served
        return first, urgent, urgent_s, relaxed, relaxed_s

    first, urgent, urgent_s, relaxed, relaxed_s = asyncio.run(asyncio.wait_for(main(), 60))
    assert first.status == 0
    assert urgent.status == 0, (urgent.reason, urgent.message)
    assert urgent_s < 0.1
    assert relaxed.status == 0
    # (held for the slot after the urgent reply's message: pacing still batches)
    assert relaxed_s > 0.5 * INTERVAL_US / 1e6


def test_answers_past_their_slo_are_paced_as_before(monkeypatch):
    """A reply already past its SLO (or a failure) gains nothing by going early: each
    such reply woke the writer and went in a message of its own, so under overload, when
    pacing matters most, replies were no longer paced. Twenty requests whose SLO cannot
    be met (1 us), submitted 10 ms apart, are answered TIMEOUT at once: their replies
    share the stream's next message or two, not one message each."""
    from controller import intake
    from controller.service import ClockworkServicer, ControllerNode
    from worker.service import WorkerNode

    monkeypatch.setattr(intake, "Pacer", _Busy)

    async def main():
        wnode = WorkerNode(gpus=1, pages=100)
        address, stop, served = await _serve_in_process(wnode)
        node = ControllerNode([address], "v100-reference", models="mobilenet_v2",
                              reply_interval_us=INTERVAL_US)
        await node.start()
        server = grpc.aio.server()
        pbg.add_ClockworkServicer_to_server(ClockworkServicer(node), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with clockwork.AsyncClient(f"127.0.0.1:{port}", timeout=10) as c:
                s = c.stream()
                first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                sent = node.counters.get("msgs_to_clients", 0)
                futs = []
                for _ in range(20):  # (spread over 0.2 s, inside one 0.4 s interval)
                    futs.append(s.submit("mobilenet_v2", slo_ms=0.001))
                    await asyncio.sleep(0.01)
                hopeless = await asyncio.wait_for(asyncio.gather(*futs), 10)
                msgs = node.counters.get("msgs_to_clients", 0) - sent
                await s.close()
        finally:
            await server.stop(None)
            await node.stop()
            stop.set()
            await served
        return first, hopeless, msgs

    first, hopeless, msgs = asyncio.run(asyncio.wait_for(main(), 60))
    assert first.status == 0
    assert {r.status for r in hopeless} == {4}
    assert msgs <= 3, msgs


def test_a_paced_result_goes_before_its_deadline(monkeypatch):
    """The same on the worker's side: with its results paced at 400 ms, the result of an
    INFER for a request with a 100 ms SLO waited for the worker's next message and the
    answer reached the client late. A worker now holds a result no later than one
    interval before the deadline its batch was planned for (``ActionMsg.answer_by``);
    one whose deadline leaves room still waits for the next message."""
    from controller.service import ClockworkServicer, ControllerNode
    from worker import service
    from worker.service import WorkerNode

    monkeypatch.setattr(service, "Pacer", _Busy)

    async def main():
        wnode = WorkerNode(gpus=1, pages=100, result_interval_us=INTERVAL_US)
        address, stop, served = await _serve_in_process(wnode)
        node = ControllerNode([address], "v100-reference", models="mobilenet_v2")
        await node.start()
        server = grpc.aio.server()
        pbg.add_ClockworkServicer_to_server(ClockworkServicer(node), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with clockwork.AsyncClient(f"127.0.0.1:{port}", timeout=10) as c:
                s = c.stream()
                first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                t0 = time.monotonic()
                urgent = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=100), 10)
                urgent_s = time.monotonic() - t0
                t1 = time.monotonic()
                relaxed = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                relaxed_s = time.monotonic() - t1
                await s.close()
        finally:
            await server.stop(None)
            await node.stop()
            stop.set()
            await served
        return first, urgent, urgent_s, relaxed, relaxed_s

    first, urgent, urgent_s, relaxed, relaxed_s = asyncio.run(asyncio.wait_for(main(), 60))
    assert first.status == 0
    assert urgent.status == 0, (urgent.reason, urgent.message)
    assert urgent_s < 0.1
    assert relaxed.status == 0
    assert relaxed_s > 0.5 * INTERVAL_US / 1e6  # (pacing still batches)
