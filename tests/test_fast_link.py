"""The worker link's fast path (``clockwork.protocol.framing``): actions and results on a
ticketed TCP connection, set up over the gRPC Connect stream; off with --link-port -1."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest

import clockwork
from clockwork.cluster.local import LocalCluster
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol.addresses import host_of
from clockwork.protocol.framing import MAX_FRAME, TICKET_BYTES, FrameStream, dial
from clockwork.protocol.versions import PROTOCOL
from tests.conftest import wait_output

MODEL = "resnet18_v2"
TIMEOUT = 30.0


def _serve_some(address: str, n: int = 20) -> dict[str, int]:
    with clockwork.Client(address, timeout=TIMEOUT) as c:
        for _ in range(n):
            assert c.infer(MODEL, slo_ms=1000).status == 0
        return c.stats()


def test_actions_and_results_travel_on_the_fast_link():
    with LocalCluster(models=MODEL, timeout=60) as c:
        line = wait_output(c.workers[0], "listening on")
        port = int(re.search(r"fast link on port (\d+)", line).group(1))
        st = _serve_some(c.address)
        assert st["worker_fast_links"] == 1 and st["worker_connects"] == 1
        assert st["msgs_from_workers"] >= 1
        # a stranger with a wrong ticket is turned away; the controller's link serves on
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(bytes(TICKET_BYTES))
            assert s.recv(1) == b""  # closed by the worker
        wait_output(c.workers[0], "no valid ticket")
        st = _serve_some(c.address)
        assert st.get("worker_losses", 0) == 0 and st["worker_fast_links"] == 1


def test_link_port_off_keeps_everything_on_grpc():
    with LocalCluster(models=MODEL, timeout=60, worker_args=[["--link-port", "-1"]]) as c:
        assert "fast link" not in wait_output(c.workers[0], "listening on")
        st = _serve_some(c.address)
        assert st.get("worker_fast_links", 0) == 0 and st["worker_connects"] == 1


def test_a_restarted_worker_gets_a_new_fast_link():
    with LocalCluster(models=MODEL, timeout=60) as c:
        _serve_some(c.address, 5)
        c.workers[0].proc.kill()
        c.workers[0].proc.wait(10)
        c.restart_worker(0)
        deadline = time.monotonic() + TIMEOUT
        with clockwork.Client(c.address, timeout=TIMEOUT) as cl:
            while cl.stats().get("worker_fast_links", 0) < 2:
                assert time.monotonic() < deadline, cl.stats()
                time.sleep(0.1)
        st = _serve_some(c.address, 5)
        assert st["worker_fast_links"] == 2 and st["worker_losses"] == 1


def test_frames_are_bounded_and_a_cut_frame_ends_the_link():
    async def run():
        got = []

        async def serve(reader, writer):
            stream = FrameStream(reader, writer, pb.ControllerMessage.FromString)
            assert await reader.readexactly(TICKET_BYTES) == b"t" * TICKET_BYTES
            got.append(await stream.read())  # a whole message
            try:
                await stream.read()  # a header announcing too much
            except ConnectionError as e:
                got.append(str(e))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = await dial("127.0.0.1", port, b"t" * TICKET_BYTES, pb.WorkerMessage.FromString)
        await s.write(pb.ControllerMessage(echo=pb.ClockEcho(seq=7)))
        s._w.write((MAX_FRAME + 1).to_bytes(4, "little"))
        assert await s.read() is None  # the server closed: the end of the link
        s.close()
        server.close()
        return got

    first, err = asyncio.run(run())
    assert first.echo.seq == 7 and "at most" in err


def test_both_ends_of_a_fast_link_have_the_kernel_watch_for_a_silent_peer():
    """A fast link whose packets are dropped while the gRPC stream beside it still answers
    (a firewall rule or partition of that port) stayed open for as long as TCP retransmits,
    ~15 minutes: the worker never counted lost, and once the path healed the first message
    waited out TCP's back-off (47 s after a 60 s outage). Both ends now have the kernel end
    the connection after ~15 s unacknowledged (``TCP_USER_TIMEOUT``) and probe it when
    idle (keepalive), as gRPC's keepalive does for the stream: the controller's end (made by
    ``dial``) and the worker's (the ``FrameStream`` of an accepted connection)."""
    from clockwork.protocol.keepalive import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS

    def watched(sock) -> dict[str, int]:
        out = {"keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)}
        for name in ("TCP_USER_TIMEOUT", "TCP_KEEPIDLE"):
            if hasattr(socket, name):
                out[name] = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
        return out

    async def run():
        accepted = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            FrameStream(reader, writer, pb.ControllerMessage.FromString)
            accepted.set_result(watched(writer.get_extra_info("socket")))

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = await dial("127.0.0.1", port, b"t" * TICKET_BYTES, pb.WorkerMessage.FromString)
        ends = [watched(s._w.get_extra_info("socket")), await accepted]
        s.close()
        server.close()
        return ends

    want = {"keepalive": 1}
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # (Linux)
        want |= {"TCP_USER_TIMEOUT": KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS,
                 "TCP_KEEPIDLE": KEEPALIVE_TIME_MS // 1000}
    for end in asyncio.run(run()):
        assert end == want, end


def test_an_option_the_system_refuses_leaves_the_others_set():
    """``watch_tcp`` on a system that refuses one option (an older kernel without
    ``TCP_USER_TIMEOUT``) still sets the rest (it stopped at the first refusal, leaving the
    system's two-hour keepalive)."""
    from clockwork.protocol.keepalive import KEEPALIVE_TIME_MS, watch_tcp

    class RefusesUserTimeout:
        def __init__(self) -> None:
            self.set: dict[int, int] = {}

        def setsockopt(self, level: int, option: int, value: int) -> None:
            if option == getattr(socket, "TCP_USER_TIMEOUT", None):
                raise OSError(92, "Protocol not available")
            self.set[option] = value

    s = RefusesUserTimeout()
    watch_tcp(s)
    assert s.set[socket.SO_KEEPALIVE] == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert s.set[socket.TCP_KEEPIDLE] == KEEPALIVE_TIME_MS // 1000
        assert s.set[socket.TCP_KEEPINTVL] == 1
    watch_tcp(None)  # (a transport without a socket: nothing to do)


def test_dial_fails_fast_on_a_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    with pytest.raises(OSError):
        asyncio.run(dial("127.0.0.1", port, b"x" * TICKET_BYTES, pb.WorkerMessage.FromString))
    assert host_of("[::1]:5") == "::1" and host_of("10.0.0.1:12345") == "10.0.0.1"


def test_attachments_travel_after_the_message_and_are_cut_per_tensor():
    import numpy as np

    from clockwork.protocol.wire import (
        WireError,
        cut_attachments,
        msgs_to_tensors,
        split_attachments,
    )

    batch = pb.ActionBatch(actions=[
        pb.ActionMsg(id=1, inputs=[pb.Tensor(name="x", shape=[2], dtype="uint8", attached=2),
                                   pb.Tensor(name="y", shape=[1], dtype="uint8", data=b"\x09")]),
        pb.ActionMsg(id=2, inputs=[pb.Tensor(name="x", shape=[4], dtype="uint8", attached=4)])])

    async def run():
        got = []

        async def serve(reader, writer):
            stream = FrameStream(reader, writer, pb.ControllerMessage.FromString)
            await reader.readexactly(TICKET_BYTES)
            msg = await stream.read()
            got.append((msg, bytes(stream.tail)))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = await dial("127.0.0.1", port, b"t" * TICKET_BYTES, pb.WorkerMessage.FromString)
        await s.write(pb.ControllerMessage(actions=batch),
                      [b"ab", np.array([1, 2], np.uint8), memoryview(b"cd")])
        assert await s.read() is None
        s.close()
        server.close()
        return got[0]

    msg, tail = asyncio.run(run())
    assert tail == b"ab\x01\x02cd"
    cuts = split_attachments(msg.actions.actions, memoryview(tail))
    first = msgs_to_tensors(msg.actions.actions[0].inputs, cuts[0])
    second = msgs_to_tensors(msg.actions.actions[1].inputs, cuts[1])
    assert [bytes(t.data) for t in first] == [b"ab", b"\x09"]
    assert second[0].array.tolist() == [1, 2, 99, 100]
    with pytest.raises(WireError):  # the sizes do not add up to the attachments
        split_attachments(msg.actions.actions, memoryview(tail + b"z"))
    with pytest.raises(WireError):  # attached data that never came (the gRPC stream)
        msgs_to_tensors(msg.actions.actions[1].inputs)
    assert split_attachments(msg.actions.actions, memoryview(b"")) is None
    # what the services call: no tail (a gRPC frame), or the error for the whole frame
    assert cut_attachments(msg.actions.actions, None) == (None, None)
    cuts, err = cut_attachments(msg.actions.actions, memoryview(tail + b"z"))
    assert cuts is None and isinstance(err, WireError)


def test_arrays_of_wide_items_are_written_as_their_bytes(monkeypatch):
    """Output tensors (float32 rows) go to the socket as flat views of their bytes: a
    transport counts what it sent by ``len()``, which for a (3, 10) float32 array is 3.
    Python 3.12's ``writelines`` lost its place in its buffers over that (IndexError,
    the link closed after each worker's first result); every version could resume a
    short send at the wrong byte."""
    import numpy as np

    rows = np.arange(30, dtype=np.float32).reshape(3, 10)
    empty = np.zeros((0, 10), np.float32)
    written = []

    async def run():
        got = []

        async def serve(reader, writer):
            stream = FrameStream(reader, writer, pb.ControllerMessage.FromString)
            await reader.readexactly(TICKET_BYTES)
            await stream.read()
            got.append(bytes(stream.tail))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = await dial("127.0.0.1", port, b"t" * TICKET_BYTES, pb.WorkerMessage.FromString)
        w = s._w
        writelines = w.writelines
        monkeypatch.setattr(w, "writelines",
                            lambda parts: written.extend(parts) or writelines(parts))
        await s.write(pb.ControllerMessage(), [rows, empty, memoryview(rows)[1:]])
        assert await s.read() is None
        s.close()
        server.close()
        return got[0]

    tail = asyncio.run(run())
    assert tail == rows.tobytes() + rows[1:].tobytes()
    assert all(len(p) == memoryview(p).nbytes for p in written)


def test_attached_outputs_make_a_result_whose_rows_are_views():
    from clockwork.protocol.wire import WireError, msg_to_result, split_attachments

    res = [pb.ResultMsg(id=3, type=1, batch_size=2, outputs=[
        pb.Tensor(name="y", shape=[2, 2], dtype="uint8", attached=4)])]
    tail = memoryview(b"\x01\x02\x03\x04")
    cuts = split_attachments(res, tail, "outputs")
    r = msg_to_result(res[0], 0, 0, cuts[0])
    assert r.outputs[0].row(1).array.tolist() == [3, 4]
    with pytest.raises(WireError):
        msg_to_result(res[0], 0, 0)  # attached bytes that never came


@pytest.mark.parametrize("fast", [False, True])
def test_a_backlog_of_results_goes_back_in_messages_under_the_cap(fast):
    """Results that waited (a controller that read slowly) go back in messages of at most
    ``RESULT_MESSAGE_BYTES`` (with their attachments on the fast link), in order, every
    one; a result larger than that goes alone. (The whole backlog went in one message:
    past 64 MiB the fast link's frame raised and the link ended, the gRPC stream failed
    RESOURCE_EXHAUSTED, every result in it lost.)"""
    import numpy as np

    from clockwork.actions import ActionType, ErrorCode, Result
    from clockwork.tensors import Tensor
    from worker.service import RESULT_MESSAGE_BYTES, WorkerNode

    node = WorkerNode(1, None)
    n = 30_000  # ~1.6 MB
    small = [Result(id=i, type=ActionType.EVICT, status=ErrorCode.EVICT_NOT_IN_CACHE, worker=0,
                    gpu=0, model="resnet50_v2", received=i, begin=i, end=i,
                    message="weights not in the cache") for i in range(1, n + 1)]
    big = Result(id=n + 1, type=ActionType.INFER, status=ErrorCode.SUCCESS, worker=0, gpu=0,
                 model="resnet50_v2", batch_size=1, received=1, begin=1, end=2,
                 outputs=[Tensor.of("y", np.ones((1, RESULT_MESSAGE_BYTES // 4), np.float32))])
    node._want.add(big.id)
    node._emit(small[:10] + [big] + small[10:])
    got, sizes = [], []
    while True:
        attach = [] if fast else None
        msg = node.take_message(attach)
        if msg is None:
            break
        ids = [r.id for r in msg.results.results]
        got += ids
        sizes.append(msg.ByteSize() + sum(memoryview(a).nbytes for a in attach or ()))
        if ids == [big.id]:
            assert sizes.pop() > RESULT_MESSAGE_BYTES  # alone, whole
            assert len(msg.results.results[0].outputs) == 1
    assert got == [*range(1, 11), big.id, *range(11, n + 1)]
    assert len(sizes) >= 2 and max(sizes) <= RESULT_MESSAGE_BYTES
    assert node._out_bytes == 0 and not node._out_ready.is_set()


@pytest.mark.parametrize("fast", [False, True])
def test_the_worker_reads_no_more_actions_while_its_results_back_up(fast, monkeypatch):
    """Backpressure: the worker reads the controller's next message only once the results
    waiting to be sent are within ``RESULT_BACKLOG_BYTES`` (it read on, and a controller
    that read slowly made the backlog grow without bound). Three messages written at once,
    each answered with more than that; every result comes back, in messages under the cap.
    (The cap and bound made small here.)"""
    import struct

    import grpc

    from clockwork.actions import NEVER, ActionType
    from clockwork.protocol import clockwork_pb2_grpc as pbg
    from worker import service
    from worker.service import WorkerNode, serve_worker

    monkeypatch.setattr(service, "RESULT_MESSAGE_BYTES", 4096)
    monkeypatch.setattr(service, "RESULT_BACKLOG_BYTES", 16384)
    per, batches = 300, 3  # 300 answers: ~27 kB estimated

    def batch(k):
        return pb.ControllerMessage(actions=pb.ActionBatch(actions=[
            pb.ActionMsg(id=k * per + i + 1, type=int(ActionType.EVICT), gpu=0, model="a",
                         earliest=0, latest=NEVER) for i in range(per)]))

    async def run():
        node = WorkerNode(1, None)
        backlog = []  # the results waiting when each message was handed to the worker
        submit = node.submit
        monkeypatch.setattr(node, "submit", lambda b, tail=None: (
            backlog.append(node._out_bytes), submit(b, tail)))
        stop = asyncio.Event()
        ports = asyncio.get_running_loop().create_future()
        served = asyncio.create_task(serve_worker(
            "127.0.0.1", 0, node, lambda p, lp: ports.set_result((p, lp)), stop,
            link_port=0 if fast else -1))
        port, _ = await ports
        q: asyncio.Queue = asyncio.Queue()
        await q.put(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL,
            worker_id=0, reset=True, fast_link=fast,
            instances=[pb.Instance(name="a", profile="resnet50_v2")])))

        async def gen():
            while (m := await q.get()) is not None:
                yield m

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = pbg.WorkerStub(ch).Connect(gen())
            st = (await call.read()).state
            if fast:
                link = await dial("127.0.0.1", st.link_port, st.link_ticket,
                                  pb.WorkerMessage.FromString)
                frames = []
                for k in range(batches):
                    data = batch(k).SerializeToString()
                    frames.append(struct.pack("<II", 4 + len(data), len(data)) + data)
                link._w.write(b"".join(frames))  # all at once: the worker has them together
                read = link.read
            else:
                for k in range(batches):
                    await q.put(batch(k))
                read = call.read
            ids, sizes = [], []
            while len(ids) < per * batches:
                msg = await asyncio.wait_for(read(), 10)
                ids += [r.id for r in msg.results.results]
                sizes.append(msg.ByteSize())
            if fast:
                link.close()
            await q.put(None)
        stop.set()
        await served
        return backlog, ids, sizes

    backlog, ids, sizes = asyncio.run(asyncio.wait_for(run(), 30))
    assert ids == list(range(1, per * batches + 1))
    assert max(sizes) <= 4096
    assert len(backlog) == batches and max(backlog) <= 16384, backlog


@pytest.mark.parametrize("retry_s", [1.0, 3600.0])
def test_a_worker_whose_fast_link_failed_asks_for_it_again_when_it_next_connects(
        monkeypatch, retry_s):
    """Controller and worker in this process. The fast link cannot be reached once (its
    dial fails): the worker is served on its gRPC stream. When it next connects (lost and
    reconnected) the fast link is asked for again once ``FAST_RETRY_S`` has passed (it
    stayed on gRPC for as long as the controller ran); before that, it stays on gRPC."""
    import controller.links as links
    from controller.service import ControllerNode
    from tests.inprocess import answer
    from worker.service import WorkerNode, serve_worker

    real, calls = links.dial, []

    async def flaky(*a, **kw):
        calls.append(a)
        if len(calls) == 1:
            raise ConnectionRefusedError("refused (a fault of the test)")
        return await real(*a, **kw)

    monkeypatch.setattr(links, "dial", flaky)
    monkeypatch.setattr(links, "FAST_RETRY_S", retry_s)

    async def main():
        stop = asyncio.Event()
        port = asyncio.get_running_loop().create_future()
        served = asyncio.create_task(serve_worker(
            "127.0.0.1", 0, WorkerNode(gpus=1, pages=100), stop=stop, link_port=0,
            ready=lambda p, _: port.set_result(p)))
        node = ControllerNode([f"127.0.0.1:{await port}"], "v100-reference", models=MODEL,
                              connect_timeout=10.0)
        await node.start()
        try:
            link = node.links[0]
            assert (await answer(node, MODEL)).status == 0
            first = (node.counters.get("worker_fast_links", 0),
                     isinstance(link.call, FrameStream))
            await asyncio.sleep(1.1)  # (past the shorter FAST_RETRY_S)
            node._lost(link)  # (as a broken connection is noticed)
            while not link.connected:
                await asyncio.sleep(0.02)
            assert (await answer(node, MODEL)).status == 0
            return first, (node.counters.get("worker_fast_links", 0),
                           isinstance(link.call, FrameStream))
        finally:
            await node.stop()
            stop.set()
            await served

    first, then = asyncio.run(asyncio.wait_for(main(), 60))
    assert first == (0, False)  # (its dial failed: on gRPC)
    assert then == ((1, True) if retry_s == 1.0 else (0, False)), then
