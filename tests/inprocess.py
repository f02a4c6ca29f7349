"""A cluster in this process, for tests: worker nodes served on loopback gRPC (without
the fast link) and a controller node connected to them, on the test's event loop.

Controller and workers are imported inside the functions: a test module that imports
this one decides itself what its process loads (``controller.kserve*`` and
``tritonclient.grpc`` must not share one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable


async def serve_in_process(wnode):
    """Serve the worker node ``wnode`` in this process on loopback gRPC, without the fast
    link: (its address, the event that stops it, the serving task)."""
    from worker.service import serve_worker

    stop = asyncio.Event()
    port = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(serve_worker("127.0.0.1", 0, wnode, stop=stop, link_port=-1,
                                              ready=lambda p, _: port.set_result(p)))
    return f"127.0.0.1:{await port}", stop, served


async def answer(node, model: str):
    """One request through the controller node ``node`` (in this process): its answer."""
    from clockwork.protocol import clockwork_pb2 as pb

    got = asyncio.get_running_loop().create_future()
    node.submit_many([pb.InferRequest(model=model, slo_ms=1000)],
                     lambda r: got.done() or got.set_result(r))
    return await asyncio.wait_for(got, 10)


@contextlib.asynccontextmanager
async def workers_served(wnodes: Iterable) -> AsyncIterator[list[str]]:
    """Serve each of ``wnodes`` with :func:`serve_in_process`, in order: their addresses.
    On exit each one is stopped and its serving task awaited, in the same order."""
    served = []
    try:
        for w in wnodes:
            served.append(await serve_in_process(w))
        yield [address for address, _, _ in served]
    finally:
        for _, stop, task in served:
            stop.set()
            await task


@contextlib.asynccontextmanager
async def controller_with(wnodes: Iterable, profiles, models: str, **kw) -> AsyncIterator:
    """Serve ``wnodes`` (:func:`workers_served`) and start a ``ControllerNode`` on them
    (``profiles``, ``models`` and ``kw`` as its own): the started node. On exit the node
    is stopped first, then the workers."""
    from controller.service import ControllerNode

    async with workers_served(wnodes) as addresses:
        node = ControllerNode(addresses, profiles, models=models, **kw)
        await node.start()
        try:
            yield node
        finally:
            await node.stop()
