"""A reconnecting ``InferStream`` sends a request again only when the controller surely
read none of the call that carried it (it refused the call as it starts, or there was no
connection): a controller that read a call's requests and died before its first words on
the call reached the client may have run them, so they fail instead of running twice.

The controller here is a bare ``clockwork.v1`` gRPC service in this process that dies on
cue (a real controller cannot be killed between reading a message and sending its
metadata on purpose); the client is the shipped one."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest

import clockwork
from clockwork.errors import ControllerUnavailable
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg


class _DiesOnCue(pbg.ClockworkServicer):
    """Answers every request SUCCESS and counts each client id it reads, except: a
    request for model ``bye`` ends its call UNAVAILABLE (the controller gone, after
    answering on the call); the call after that one reads its first message and ends
    UNAVAILABLE before any word to the client."""

    def __init__(self) -> None:
        self.read: collections.Counter[int] = collections.Counter()
        self.calls = 0
        self.mute_next = False

    async def InferStream(self, request_iterator, context):  # noqa: N802
        self.calls += 1
        mute, self.mute_next = self.mute_next, False
        async for batch in request_iterator:
            self.read.update(r.client_id for r in batch.requests)
            if mute:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller died")
            if any(r.model == "bye" for r in batch.requests):
                self.mute_next = True
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller died")
            yield pb.InferResponseBatch(responses=[
                pb.InferResponse(client_id=r.client_id, status=0, gpu=0)
                for r in batch.requests])


def test_requests_read_by_a_call_that_died_unconfirmed_are_not_sent_again():
    async def run():
        server = grpc.aio.server()
        fake = _DiesOnCue()
        pbg.add_ClockworkServicer_to_server(fake, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with clockwork.AsyncClient(f"127.0.0.1:{port}", timeout=10) as cl:
                s = cl.stream()
                first = await asyncio.wait_for(s.submit("m", slo_ms=10_000), 10)
                with pytest.raises(ControllerUnavailable):
                    await asyncio.wait_for(s.submit("bye", slo_ms=10_000), 10)
                # submitted while the stream reopens: they go on the call that dies
                # after reading them, before saying anything
                read_then_lost = [s.submit("m", slo_ms=10_000) for _ in range(5)]
                lost = await asyncio.wait_for(
                    asyncio.gather(*read_then_lost, return_exceptions=True), 10)
                after = await asyncio.wait_for(s.submit("m", slo_ms=10_000), 10)
                await s.close()
                return fake, first, lost, after
        finally:
            await server.stop(None)

    fake, first, lost, after = asyncio.run(run())
    assert first.status == 0 and after.status == 0 and fake.calls == 3
    # each failed as "may have run" (before: sent again on the next call and answered
    # SUCCESS, read by the controller twice)
    assert all(isinstance(r, ControllerUnavailable) for r in lost), lost
    twice = {cid: n for cid, n in fake.read.items() if n > 1}
    assert not twice, twice
