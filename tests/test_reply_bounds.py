"""The bound on the replies waiting in all streams together (``replies_buffer_bytes``,
``Gate.hold``): past it, the streams whose replies have not moved for longest are ended
as slow readers, not the stream that happens to be sent a burst. A controller and an
emulated worker in a child process, whose gate's counts it reads directly (in the test
process the controller's KServe messages would clash with tritonclient's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r'''
import asyncio, contextlib, json
import grpc
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from controller.grpc_api import serve_controller
from controller.limits import Limits
from controller.service import ControllerNode
from tests.inprocess import workers_served
from worker.service import WorkerNode

CAP, BURST = 1 << 20, 300


async def main():
    async with workers_served([WorkerNode(gpus=1, pages=100)]) as addresses:
        node = ControllerNode(addresses, "v100-reference", models="mobilenet_v2")
        node.limits = Limits(replies_buffer_bytes=CAP, admit_slice=BURST)
        stop = asyncio.Event()
        port = asyncio.get_running_loop().create_future()
        served = asyncio.create_task(serve_controller(node, "127.0.0.1", 0,
                                                      ready=port.set_result, stop=stop))
        address = f"127.0.0.1:{await asyncio.wait_for(port, 30)}"
        gate = node.gate
        # (no BDP probe: a client's receive window stays small, and fills)
        slow = grpc.aio.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)])
        queues, calls, seq = [], [], [0]

        async def messages(q):
            while True:
                yield await q.get()

        def send(q, n):
            seq[0] += 1
            q.put_nowait(pb.InferRequestBatch(requests=[
                pb.InferRequest(model="nosuch", client_id=seq[0] * 1000 + k)
                for k in range(n)]))

        async def held_still(n):
            """``n`` streams hold replies, none of which moved for 0.2 s: their windows
            are full. (A stream holds each reply until its writer sends it: on a loaded
            host one whose window is still open is seen holding for a while, then sends;
            waiting for the count of holders alone left windows unfilled.)"""
            if len(gate.holders) < n:
                return False
            last = max(st.moved for st in gate.holders)
            await asyncio.sleep(0.2)
            return len(gate.holders) >= n and max(st.moved for st in gate.holders) == last

        for _ in range(16):
            q = asyncio.Queue()
            queues.append(q)
            calls.append(pbg.ClockworkStub(slow).InferStream(messages(q)))
            while not await held_still(len(queues)):  # until its window is full
                send(q, 20)
                await asyncio.sleep(0.003)
        full = False
        while not full:
            for q in queues:
                full = gate.replies + 6 * 1100 > CAP
                if full:
                    break
                send(q, 3)
                await asyncio.sleep(0.003)
        await asyncio.sleep(0.2)
        before = node.counters.get("streams_slow_reader", 0)
        most = max(s.buffered for s in gate.holders)
        holding = len(gate.holders)

        async def burst():
            yield pb.InferRequestBatch(requests=[
                pb.InferRequest(model="nosuch", client_id=i + 1) for i in range(BURST)])

        fast = grpc.aio.insecure_channel(address)
        got = [len(m.responses) async for m in pbg.ClockworkStub(fast).InferStream(burst())]
        cut = node.counters.get("streams_slow_reader", 0) - before
        waiting = gate.replies
        for call in calls:
            call.cancel()
        await fast.close()
        await slow.close()
        while gate.holders:
            await asyncio.sleep(0.01)
        stop.set()
        await served
        print(json.dumps(dict(got=sum(got), cut=cut, waiting=waiting, left=gate.replies,
                              most=most, holding=holding)))


asyncio.run(asyncio.wait_for(main(), 120))
'''


def test_a_client_that_reads_is_not_cut_for_a_burst_while_others_fill_the_bound():
    """Sixteen streams that never read hold replies up to just under the bound of all; a
    new stream whose client reads is then sent a burst of 300 replies at once (more bytes
    than any of the others holds). It gets them all, and the streams cut to make room
    are among the others (the stream holding the most bytes at that instant was cut:
    the reader); the replies waiting never pass the bound, and once every stream has
    ended none are counted."""
    p = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["holding"] >= 10 and r["most"] < 300 * 700, r  # (the burst is the biggest)
    assert r["got"] == 300 and 1 <= r["cut"] <= 16, r
    assert r["waiting"] <= 1 << 20 and r["left"] == 0, r
