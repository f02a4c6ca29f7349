"""Stream pacing (``clockwork.protocol.pacing``): a busy stream sends one message per
interval, but the controller never holds a reply past one interval before its request's
SLO ends, nor an action past one interval before its latest start, nor a worker a result
past one interval before its batch's deadline. Controller
(with its clockwork.v1 gRPC service) and an emulated worker in this process, the stock
``clockwork.AsyncClient`` on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest

import clockwork
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.pacing import Pacer
from tests.inprocess import controller_with

INTERVAL_US = 400_000.0  # the pacing here: 400 ms


class _Busy(Pacer):
    """A pacer that paces from the first message (no rate or CPU to reach first)."""

    def __init__(self, interval_us: float, busy_rate: float = 0.0) -> None:
        super().__init__(interval_us, 0.0)


@contextlib.asynccontextmanager
async def _serving(reply_interval_us: float = 0.0, result_interval_us: float = 0.0,
                   action_interval_us: float = 0.0, cfg=None):
    """An emulated worker and a controller (scheduler settings ``cfg``) serving
    clockwork.v1 on loopback, in this process: (the controller node, a connected
    ``clockwork.AsyncClient``)."""
    from controller.grpc_api import ClockworkServicer
    from worker.service import WorkerNode

    wnode = WorkerNode(gpus=1, pages=100, result_interval_us=result_interval_us)
    async with controller_with([wnode], "v100-reference", models="mobilenet_v2",
                               reply_interval_us=reply_interval_us,
                               action_interval_us=action_interval_us, cfg=cfg) as node:
        server = grpc.aio.server()
        pbg.add_ClockworkServicer_to_server(ClockworkServicer(node), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with clockwork.AsyncClient(f"127.0.0.1:{port}", timeout=10) as c:
                yield node, c
        finally:
            await server.stop(None)


async def _urgent_then_relaxed(c) -> tuple:
    """On one stream: a request that sets the pacer's slot, then one with a 100 ms SLO,
    then one with a 5 s SLO, each once the one before is answered: (the three answers,
    the seconds the second and third took)."""
    s = c.stream()
    first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
    t0 = time.monotonic()  # (the first answer's message went: the next slot is 0.4 s on)
    urgent = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=100), 10)
    urgent_s = time.monotonic() - t0
    t1 = time.monotonic()
    relaxed = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
    relaxed_s = time.monotonic() - t1
    await s.close()
    return first, urgent, urgent_s, relaxed, relaxed_s


def _urgent_went_relaxed_waited(first, urgent, urgent_s, relaxed, relaxed_s) -> None:
    assert first.status == 0
    assert urgent.status == 0, (urgent.reason, urgent.message)
    assert urgent_s < 0.1
    assert relaxed.status == 0
    assert relaxed_s > 0.5 * INTERVAL_US / 1e6  # (held for the next slot: pacing batches)


def test_a_paced_reply_goes_before_its_slo_ends(monkeypatch):
    """Replies were held for the stream's next message whatever their SLO: with the
    controller's replies paced at 400 ms, a request with a 100 ms SLO answered in a few
    milliseconds reached the client after its SLO (status TIMEOUT, reason ``late``). A
    reply now goes no later than one interval before its SLO ends (here: at once); one
    whose SLO leaves room still waits for the next message."""
    from controller import intake

    monkeypatch.setattr(intake, "Pacer", _Busy)

    async def main():
        async with _serving(reply_interval_us=INTERVAL_US) as (_, c):
            return await _urgent_then_relaxed(c)

    _urgent_went_relaxed_waited(*asyncio.run(asyncio.wait_for(main(), 60)))


def test_answers_past_their_slo_are_paced_as_before(monkeypatch):
    """A reply already past its SLO (or a failure) gains nothing by going early: each
    such reply woke the writer and went in a message of its own, so under overload, when
    pacing matters most, replies were no longer paced. Twenty requests whose SLO cannot
    be met (1 us), submitted 10 ms apart, are answered TIMEOUT at once: their replies
    share the stream's next message or two, not one message each."""
    from controller import intake

    monkeypatch.setattr(intake, "Pacer", _Busy)

    async def main():
        async with _serving(reply_interval_us=INTERVAL_US) as (node, c):
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
    from worker import service

    monkeypatch.setattr(service, "Pacer", _Busy)

    async def main():
        async with _serving(result_interval_us=INTERVAL_US) as (_, c):
            return await _urgent_then_relaxed(c)

    _urgent_went_relaxed_waited(*asyncio.run(asyncio.wait_for(main(), 60)))


def test_a_paced_action_goes_before_its_latest_start(monkeypatch):
    """The controller's actions, paced at 400 ms: an INFER planned to start a
    millisecond on waited for the link's next message, and the worker, getting it
    hundreds of milliseconds after its latest start, refused it (or it ran late and the
    answer missed its 100 ms SLO); the controller's echoes waited too, and it found the
    worker suspect. A paced action now goes no later than one interval before its
    latest start (here: at once): every request is answered in time, each within a few
    milliseconds."""
    from controller import links as service  # (the action writer's module)

    monkeypatch.setattr(service, "Pacer", _Busy)

    async def main():
        async with _serving(action_interval_us=INTERVAL_US) as (node, c):
            s = c.stream()
            took, answers = [], []
            for slo_ms in (5000, 100, 100, 5000):  # (the first sets the link's slot)
                t0 = time.monotonic()
                answers.append(await asyncio.wait_for(s.submit("mobilenet_v2",
                                                               slo_ms=slo_ms), 10))
                took.append(time.monotonic() - t0)
            await s.close()
            return answers, took, node.counters.get("msgs_to_workers", 0)

    answers, took, msgs = asyncio.run(asyncio.wait_for(main(), 60))
    assert [(a.status, a.reason) for a in answers] == [(0, "")] * 4, answers
    assert max(took[1:]) < 0.1, took  # (held for the next slot: 0.4 s)
    assert msgs >= 4, msgs  # (the LOAD and the first INFER may share one)


def test_a_paced_action_with_room_to_wait_waits_for_the_slot(monkeypatch):
    """Pacing still batches the actions that can wait: with the worker taking an action
    up to 2 s after its planned start (``latest_delta``), an INFER is held for the
    link's next message, 0.4 s after the previous one, and still answered."""
    from clockwork.time import ms
    from controller import links as service  # (the action writer's module)
    from controller.config import SchedulerConfig

    monkeypatch.setattr(service, "Pacer", _Busy)

    async def main():
        async with _serving(action_interval_us=INTERVAL_US,
                            cfg=SchedulerConfig(latest_delta=ms(2000))) as (_, c):
            s = c.stream()
            first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
            t0 = time.monotonic()  # (the first INFER's message went: the next slot is on)
            second = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
            took = time.monotonic() - t0
            await s.close()
            return first, second, took

    first, second, took = asyncio.run(asyncio.wait_for(main(), 60))
    assert (first.status, second.status) == (0, 0), (first, second)
    assert took > 0.5 * INTERVAL_US / 1e6, took


@pytest.mark.parametrize("case", ["one urgent result", "clock offset"])
def test_a_busy_result_stream_stays_paced(monkeypatch, case):
    """A worker's session writer (``_Session.outgoing``) fed a result every 2 ms, each
    message taking 3 ms to write, results paced at 50 ms: about one message per interval.
    Two ways pacing was lost for good: one urgent result left its due behind (cleared
    only when a write ended with nothing queued, which under load it never did), so every
    later message went at once; and a worker run with ``--clock-offset-ms`` compared the
    pacer's clock with its own (an offset ahead: no message ever waited)."""
    from clockwork.actions import ActionType, ErrorCode, Result
    from clockwork.protocol.holding import Holder
    from worker import service

    monkeypatch.setattr(service, "Pacer", _Busy)
    if case == "clock offset":
        monkeypatch.setattr(service, "_OFFSET", 300_000_000)

    async def main():
        node = service.WorkerNode(gpus=1, pages=100, result_interval_us=50_000.0)
        session = service._Session(node, False, lambda *a: None, Holder("c", 0, "c", "p", 0.0))
        reader = asyncio.create_task(asyncio.Event().wait())  # (the controller's side: open)
        done = asyncio.Event()

        async def results():
            k = 0
            while not done.is_set():
                k += 1
                if case == "one urgent result" and k == 20:  # due in 150 ms
                    node._answer_by[k] = service.now_ns() + 150_000_000
                node._emit([Result(k, ActionType.INFER, ErrorCode.SUCCESS, 0, 0, "m", 1)])
                await asyncio.sleep(0.002)

        feeder = asyncio.create_task(results())
        messages = 0
        t0 = time.monotonic()
        async for _msg, _ in session.outgoing(reader, fast=False):
            messages += 1
            await asyncio.sleep(0.003)  # (the write)
            if time.monotonic() - t0 > 0.6:
                break
        done.set()
        await feeder
        reader.cancel()
        return messages

    messages = asyncio.run(asyncio.wait_for(main(), 30))
    assert 5 <= messages <= 25, messages  # ~13 at one per 50 ms; hundreds unpaced


def test_a_session_writer_ends_with_its_reader_once_its_results_are_sent(monkeypatch):
    """The controller's side of a session ends while results are still queued: the
    writer sends them and ends. The reader's end woke it once, and a round that had
    results to send took that wake: the writer then waited for another for ever, holding
    the session (and the worker) open."""
    from clockwork.actions import ActionType, ErrorCode, Result
    from clockwork.protocol.holding import Holder
    from worker import service

    async def main():
        node = service.WorkerNode(gpus=1, pages=100)
        session = service._Session(node, False, lambda *a: None, Holder("c", 0, "c", "p", 0.0))
        ended = asyncio.Event()

        async def reader():
            await ended.wait()

        rtask = asyncio.create_task(reader())
        node._emit([Result(1, ActionType.INFER, ErrorCode.SUCCESS, 0, 0, "m", 1)])
        sent = 0
        async for _msg, _ in session.outgoing(rtask, fast=False):
            sent += 1
            if sent == 1:  # the reader ends while a result is still queued
                node._emit([Result(2, ActionType.INFER, ErrorCode.SUCCESS, 0, 0, "m", 1)])
                ended.set()
                await rtask
        return sent

    assert asyncio.run(asyncio.wait_for(main(), 10)) == 2


def test_what_a_load_or_evict_asks_of_its_result_is_not_kept():
    """``want_outputs`` and ``answer_by`` on a LOAD or an EVICT (only an INFER's result
    takes them back): the worker kept each such action's id until its next reset
    (4,000 ids after 4,000 answered actions of a controller that sets them)."""
    from clockwork.protocol import clockwork_pb2 as pb
    from worker.service import WorkerNode

    async def main() -> tuple[int, int]:
        node = WorkerNode(1, 40, result_interval_us=2000)
        node.hello(pb.Hello(instances=[pb.Instance(name="m", profile="resnet18_v2")],
                            reset=True))
        timer = asyncio.create_task(node.run_timer())
        never = (1 << 63) - 1
        try:
            for k in range(0, 400, 2):
                node.submit(pb.ActionBatch(actions=[
                    pb.ActionMsg(id=k + 1, type=0, model="m", earliest=0, latest=never,
                                 want_outputs=True, answer_by=never),
                    pb.ActionMsg(id=k + 2, type=1, model="m", earliest=0, latest=never,
                                 want_outputs=True, answer_by=never)]))
                await asyncio.sleep(0.002)
                while node.take_message() is not None:
                    pass
        finally:
            timer.cancel()
        return len(node._want), len(node._answer_by)

    assert asyncio.run(main()) == (0, 0)


def test_a_session_reads_no_more_while_its_states_wait_to_be_sent():
    """Answers to InstanceUpdates (each a WorkerState with every instance's name) count
    in the worker's backpressure: with more than STATES_WAITING_MAX waiting, the reader
    waits (``room``) until one is sent. A controller that sent updates and read nothing
    grew a worker with long instance names by ~20 MB an update, the reader reading on."""
    from clockwork.protocol import clockwork_pb2 as pb
    from worker import service

    async def main():
        session = _session()
        session.states = [pb.WorkerState(update_seq=k) for k in range(
            service.STATES_WAITING_MAX + 1)]
        first = await _held_until_one_is_sent(session)
        assert first.state.update_seq == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def _session():
    """A worker's session with a controller, without its streams."""
    from clockwork.protocol.holding import Holder
    from worker import service

    node = service.WorkerNode(gpus=1, pages=100)
    return service._Session(node, False, lambda *a: None, Holder("c", 0, "c", "p", 0.0))


async def _held_until_one_is_sent(session):
    """``session.room()`` waits (one too many waiting), and returns once ``outgoing``
    has sent one message, which is returned."""
    room = asyncio.ensure_future(session.room())
    await asyncio.sleep(0)
    assert not room.done()  # (one too many waiting)
    reader = asyncio.create_task(asyncio.Event().wait())  # (the controller's side)
    sent = session.outgoing(reader, fast=False)
    first, _ = await sent.__anext__()
    await asyncio.wait_for(room, 5)  # one went: the reader reads again
    await sent.aclose()
    reader.cancel()
    return first


def test_a_session_reads_no_more_while_its_clock_echoes_wait_to_be_sent():
    """Clock echoes count in the worker's backpressure too: with more than
    ECHOES_WAITING_MAX waiting to go back, the reader waits until one is sent. A peer
    that sent echoes and read nothing grew a worker by 3 GB in 25 s."""
    from clockwork.protocol import clockwork_pb2 as pb
    from worker import service

    async def main():
        session = _session()
        for k in range(service.ECHOES_WAITING_MAX + 1):
            assert await session.deliver(pb.ControllerMessage(echo=pb.ClockEcho(seq=k)))
        first = await _held_until_one_is_sent(session)
        assert first.echo.seq == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_session_reads_no_more_while_a_devices_inputs_wait_past_the_bound(monkeypatch):
    """A real device's INFER inputs held until their actions start count in the worker's
    backpressure: past INPUTS_WAITING_BYTES the reader waits until some are taken (a
    controller that sent 30 MiB inputs an hour ahead grew a worker without end)."""
    import numpy as np

    from clockwork.tensors import Tensor
    from worker import service

    async def main():
        session = _session()
        node = session.node
        monkeypatch.setattr(service, "INPUTS_WAITING_BYTES", 100)
        node._inputs[5] = [Tensor.of("x", np.zeros(64, np.float32))]
        node._inputs_bytes = 256
        room = asyncio.ensure_future(session.room())
        await asyncio.sleep(0)
        assert not room.done()  # (past the bound)
        assert node._take_inputs(5) is not None and node._inputs_bytes == 0
        await asyncio.wait_for(room, 5)  # taken: the reader reads again

    asyncio.run(asyncio.wait_for(main(), 30))
