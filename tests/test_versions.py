"""A controller and a worker of different worker protocols (a rolling upgrade, a worker
left on an old clockwork-py) do not work together, and both say so naming both versions:
without the versions a mixed pair half-worked (fast-link frames of another layout dropped
and dialled again for ever, a message kind the worker did not know ignored while a model
load waited for its answer, checks one side did not make taken as passed)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time

import grpc
import pytest

from clockwork.cluster.local import _Child, _cli
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.security import TARGET_KEY, ClusterAuth
from clockwork.protocol.versions import OTHER_PROTOCOL, PROTOCOL, SOFTWARE

TIMEOUT = 20


def _wait_line(child: _Child, text: str) -> str:
    """The first line of ``child``'s output holding ``text`` (read as it comes)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        for line in list(child.output):
            if text in line:
                return line
        left = deadline - time.monotonic()
        assert left > 0, "".join(child.output)
        with contextlib.suppress(queue.Empty):
            child.lines.get(timeout=left)


@pytest.fixture(scope="module")
def worker():
    w = _Child("worker", _cli() + ["worker", "--host", "127.0.0.1", "--port", "0",
                                   "--link-port", "-1"])
    try:
        w.wait_address(30.0)
        yield w
    finally:
        w.stop()


def _hello(controller_id: str = "c" * 32, **kw) -> pb.ControllerMessage:
    return pb.ControllerMessage(hello=pb.Hello(
        worker_id=0, reset=True, controller_id=controller_id, controller="test controller",
        instances=[pb.Instance(name="a", profile="resnet50_v2")], **kw))


async def _connect(address: str, first: pb.ControllerMessage):
    """A Connect stream opened with ``first``: (the channel, the call, its first answer or
    the error that ended it)."""
    ch = grpc.aio.insecure_channel(address)
    call = pbg.WorkerStub(ch).Connect()
    await call.write(first)
    try:
        return ch, call, await asyncio.wait_for(call.read(), TIMEOUT)
    except grpc.aio.AioRpcError as e:
        return ch, call, e


def test_a_worker_refuses_a_controller_of_another_protocol_naming_both(worker):
    """An older controller (its Hello says no protocol) and a newer one (another number)
    are refused FAILED_PRECONDITION before they can take the worker, with both versions;
    the worker says so once per controller however often it tries; one of this protocol
    is served."""

    async def main():
        for kw, theirs in (({}, "no protocol version (a clockwork-py older than"),
                           ({"protocol": PROTOCOL + 1, "software": "9.9.9"},
                            f"protocol {PROTOCOL + 1} (clockwork-py 9.9.9)")):
            for _ in range(3):  # (a controller tries again and again)
                ch, _, got = await _connect(worker.address, _hello(**kw))
                await ch.close()
                assert isinstance(got, grpc.aio.AioRpcError), got
                assert got.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert f"controller test controller {OTHER_PROTOCOL}: it says {theirs}" in \
                    got.details(), got.details()
                assert f"this worker speaks protocol {PROTOCOL} (clockwork-py {SOFTWARE})" \
                    in got.details()
        ch, call, got = await _connect(worker.address, _hello(protocol=PROTOCOL,
                                                              software=SOFTWARE))
        assert got.WhichOneof("kind") == "state", got
        assert (got.state.protocol, got.state.software) == (PROTOCOL, SOFTWARE)
        call.cancel()
        await ch.close()

    asyncio.run(main())
    said = [x for x in worker.output if OTHER_PROTOCOL in x]
    assert len(said) == 2, said  # one line per version, not per attempt
    assert "refused a Connect from" in said[0] and "not said again" in said[0]


def test_a_worker_says_a_message_kind_it_does_not_know(worker):
    """A controller message of a kind the worker does not know (a newer one's) is logged,
    naming its field, not dropped without a word; the stream serves on."""

    async def main():
        ch, call, got = await _connect(worker.address, _hello(protocol=PROTOCOL))
        assert got.WhichOneof("kind") == "state", got
        unknown = pb.ControllerMessage.FromString(b"\x4a\x02\x08\x01")  # field 9
        assert unknown.WhichOneof("kind") is None
        await call.write(unknown)
        await call.write(pb.ControllerMessage(echo=pb.ClockEcho(seq=7, controller_time=1)))
        got = await asyncio.wait_for(call.read(), TIMEOUT)
        assert got.WhichOneof("kind") == "echo" and got.echo.seq == 7
        call.cancel()
        await ch.close()

    asyncio.run(main())
    line = _wait_line(worker, "of a kind this worker does not know")
    assert "(field(s) 9: a newer controller?): ignored" in line, line


def test_a_controller_does_not_use_a_worker_of_another_protocol(monkeypatch):
    """A worker whose state says another protocol is not used: the controller's start
    fails naming both versions (in process, on loopback gRPC); and a controller the
    worker refuses for its protocol says the worker's words."""
    import controller.links
    import worker.service
    from tests.inprocess import controller_with
    from worker.service import WorkerNode

    async def start() -> str:
        with pytest.raises(ValueError) as e:
            async with controller_with([WorkerNode(gpus=1, pages=100)], "v100-reference",
                                       models="resnet50_v2"):
                pass
        return str(e.value)

    with monkeypatch.context() as m:
        m.setattr(worker.service, "PROTOCOL", PROTOCOL + 1)  # (its state says so)
        why = asyncio.run(start())
    assert f"{OTHER_PROTOCOL}: it says protocol {PROTOCOL + 1}" in why, why
    assert f"this controller speaks protocol {PROTOCOL}" in why, why
    with monkeypatch.context() as m:
        m.setattr(controller.links, "PROTOCOL", PROTOCOL + 1)  # (its Hello says so)
        why = asyncio.run(start())
    assert "refused us: controller" in why and f"it says protocol {PROTOCOL + 1}" in why, why
    assert f"this worker speaks protocol {PROTOCOL}" in why, why


def test_credentials_of_an_older_controller_are_said_as_such():
    """Cluster credentials that name no worker address (an older clockwork-py's handshake)
    are refused saying that they may be an older version's, not only "wrong"."""
    from clockwork.protocol.security import WORKER_CONNECT

    auth = ClusterAuth(b"s" * 32)
    md, _ = auth.call_metadata(WORKER_CONNECT, "127.0.0.1:1")
    old = tuple((k, v) for k, v in md if k != TARGET_KEY)
    why = auth.check_controller(WORKER_CONNECT, old)[0]
    assert why.startswith("wrong cluster credentials, or those of an older clockwork-py"), why
    assert auth.check_controller(WORKER_CONNECT, md)[0] is None


def test_a_version_mismatch_of_one_version_number_says_another_build():
    """Two builds that share a version number but not a protocol (checkouts of
    different days): said as another build, not as 'clockwork-py X' on both sides."""
    from clockwork.protocol.versions import mismatch

    why = mismatch("worker", "127.0.0.1:1", PROTOCOL + 1, SOFTWARE)
    assert f"it says protocol {PROTOCOL + 1} (clockwork-py {SOFTWARE}, another build)" in why
    assert mismatch("worker", "127.0.0.1:1", PROTOCOL, "9.9") is None


def test_a_worker_ends_the_stream_on_a_goodbye_and_says_why_once(worker):
    """A controller that does not use the worker says why (``goodbye``): the worker ends
    the stream on it (the controller waits for that before closing its side, so the
    goodbye is read), says why once, and not again for the same controller and reason."""

    async def main():
        for _ in range(2):
            ch, call, got = await _connect(worker.address, _hello(protocol=PROTOCOL))
            assert got.WhichOneof("kind") == "state", got
            await call.write(pb.ControllerMessage(goodbye="no room for it here"))
            await call.done_writing()
            assert await asyncio.wait_for(call.read(), TIMEOUT) is grpc.aio.EOF
            await ch.close()

    asyncio.run(main())
    line = _wait_line(worker, "does not use this worker")
    assert line.rstrip().endswith("does not use this worker: no room for it here (its "
                                  "attempts not said again while the reason stays)"), line
    assert sum("does not use this worker" in x for x in worker.output) == 1


def test_a_refused_controllers_attempt_that_ends_unused_is_said(worker):
    """After a goodbye the controller's attempts are quiet; one that ends neither used
    nor refused (it went away mid-handshake) is said, and the next is said as usual."""

    async def session(goodbye: str | None) -> None:
        ch, call, got = await _connect(worker.address, _hello("d" * 32, protocol=PROTOCOL))
        assert got.WhichOneof("kind") == "state", got
        if goodbye is not None:
            await call.write(pb.ControllerMessage(goodbye=goodbye))
            await call.done_writing()
        else:
            call.cancel()  # (gone without a word)
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await asyncio.wait_for(call.read(), TIMEOUT)
        await ch.close()

    asyncio.run(session("not today"))
    _wait_line(worker, "does not use this worker: not today")
    asyncio.run(session(None))
    line = _wait_line(worker, "connected and disconnected without using this worker")
    assert "controller test controller from " in line, line
