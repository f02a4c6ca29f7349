"""The worker link's fast path (``clockwork.protocol.framing``): actions and results on a
ticketed TCP connection, set up over the gRPC Connect stream; off with --link-port -1."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest

import clockwork
from clockwork.cluster.serve import LocalCluster
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol.framing import MAX_FRAME, TICKET_BYTES, FrameStream, dial, host_of
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
