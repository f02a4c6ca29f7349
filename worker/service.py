"""The worker service: gRPC shell around the pure ``GpuExecutor`` on a real clock.

One ``GpuExecutor`` per GPU. A controller opens ``Worker.Connect`` and sends ``Hello``
(its instance list); the worker answers with its state and then, for every batch of
actions, submits each one with ``now`` = the real clock. One asyncio task sleeps until
the earliest ``next_time()`` of all executors and calls ``advance(now)``. Finished results
are sent back in batches (everything ready when the stream is free goes in one message).

Windows and result times are this process's monotonic clock; the controller converts.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

import grpc
import numpy as np

from clockwork.actions import ActionType, ErrorCode, Result
from clockwork.profiles import ModelProfile, ProfileError, load_profile_set
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.wire import msg_to_action, result_to_msg
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor

_OFFSET = 0  # --clock-offset-ms: shifts this worker's clock (tests the controller's conversion)


def now_ns() -> int:
    return time.monotonic_ns() + _OFFSET


class WorkerNode:
    """The worker's state and its timer task. All methods run on one event loop."""

    def __init__(self, gpus: int, pages: int | None, profiles: str, device: str = "emulated",
                 noise: float = 0.0, seed: int = 0) -> None:
        if device != "emulated":
            raise ValueError(f"device {device!r} is not available yet (only 'emulated')")
        self.pset = load_profile_set(profiles)
        self.n_gpus = gpus
        self.pages = int(pages or self.pset.weights_cache_pages)
        self.device = device
        self.noise = noise
        self.seed = seed
        self.worker_id = 0
        self.instances: dict[str, ModelProfile] = {}
        self.executors: list[GpuExecutor] = []
        self._out: list[pb.ResultMsg] = []
        self._out_ready = asyncio.Event()
        self._kick = asyncio.Event()
        self._zeros: dict[tuple[str, int], list[pb.Tensor]] = {}
        self._reset({})

    # -- state ---------------------------------------------------------------------------

    def _reset(self, instances: dict[str, ModelProfile]) -> None:
        self.instances = instances
        self.executors = [
            GpuExecutor(self.worker_id, g, self.pages, instances,
                        EmulatedDevice(self.noise, self.seed * 1000 + g))
            for g in range(self.n_gpus)
        ]
        self._out = []

    def hello(self, h: pb.Hello) -> pb.WorkerState:
        self.worker_id = h.worker_id
        inst: dict[str, ModelProfile] = {}
        missing = []
        for i in h.instances:
            p = self.pset.profiles.get(i.profile)
            if p is None:
                missing.append(i.name)
            else:
                inst[i.name] = p.renamed(i.name)
        if h.reset or not self.executors or inst.keys() != self.instances.keys():
            self._reset(inst)
        self._kick.set()
        return self.state(missing)

    def state(self, missing: list[str] | None = None) -> pb.WorkerState:
        return pb.WorkerState(
            device=self.device, profiles=self.pset.name,
            profile_names=sorted(self.pset.profiles),
            gpus=[pb.GpuState(gpu=e.gpu, pages=e.total_pages, pages_used=e.pages_used,
                              loaded=e.loaded_models()) for e in self.executors],
            missing=missing or [], worker_time=now_ns())

    # -- actions -------------------------------------------------------------------------

    def submit(self, batch: pb.ActionBatch) -> None:
        now = now_ns()
        out: list[Result] = []
        n = len(self.executors)
        for m in batch.actions:
            a = msg_to_action(m, self.worker_id)
            if 0 <= a.gpu < n:
                out.extend(self.executors[a.gpu].submit(a, now))
            else:
                out.append(Result(id=a.id, type=a.type, status=ErrorCode.INVALID_GPU,
                                  worker=self.worker_id, gpu=a.gpu, model=a.model,
                                  batch_size=a.batch_size, received=now, begin=now, end=now,
                                  message=f"no gpu {a.gpu} (worker has {n})"))
        self._emit(out)
        self._kick.set()

    def _outputs(self, model: str, batch: int) -> list[pb.Tensor]:
        """Zeros of the profile's output shapes and dtypes (emulated device)."""
        key = (model, batch)
        t = self._zeros.get(key)
        if t is None:
            t = []
            for spec in self.instances[model].outputs:
                shape = (batch, *spec.shape)
                nbytes = int(np.prod(shape)) * np.dtype(spec.dtype).itemsize
                t.append(pb.Tensor(name=spec.name, shape=shape, dtype=spec.dtype,
                                   data=bytes(nbytes)))
            if len(self._zeros) < 4096:
                self._zeros[key] = t
        return t

    def _emit(self, results: list[Result]) -> None:
        if not results:
            return
        for r in results:
            outs = None
            if r.type == ActionType.INFER and r.status == ErrorCode.SUCCESS:
                outs = self._outputs(r.model, r.batch_size)
            self._out.append(result_to_msg(r, outs))
        self._out_ready.set()

    def take_results(self) -> list[pb.ResultMsg]:
        out, self._out = self._out, []
        self._out_ready.clear()
        return out

    async def run_timer(self) -> None:
        """Sleep until the earliest executor time, advance, repeat."""
        while True:
            nt = None
            for e in self.executors:
                t = e.next_time()
                if t is not None and (nt is None or t < nt):
                    nt = t
            self._kick.clear()
            if nt is None:
                await self._kick.wait()
                continue
            delay = (nt - now_ns()) / 1e9
            if delay > 0:
                try:
                    await asyncio.wait_for(self._kick.wait(), delay)
                    continue  # new actions: recompute the wake-up time
                except TimeoutError:
                    pass
            now = now_ns()
            out: list[Result] = []
            for e in self.executors:
                out.extend(e.advance(now))
            self._emit(out)


class WorkerServicer(pbg.WorkerServicer):
    def __init__(self, node: WorkerNode) -> None:
        self.node = node
        self._active: object = None

    async def ClockSync(self, request, context):  # noqa: N802
        return pb.ClockSyncResponse(worker_time=now_ns())

    async def Connect(self, request_iterator, context):  # noqa: N802
        node = self.node
        token = object()
        self._active = token  # the newest controller connection owns the worker
        echoes: list[pb.ClockEcho] = []
        wake = asyncio.Event()
        it = request_iterator.__aiter__()
        first = await anext(it, None)
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be Hello")
        yield pb.WorkerMessage(state=node.hello(first.hello))

        async def reader() -> None:
            async for msg in it:
                kind = msg.WhichOneof("kind")
                if self._active is not token:
                    return
                if kind == "actions":
                    node.submit(msg.actions)
                elif kind == "echo":
                    e = pb.ClockEcho()
                    e.CopyFrom(msg.echo)
                    e.worker_time = now_ns()
                    echoes.append(e)
                    wake.set()
                elif kind == "hello":
                    node.hello(msg.hello)
            wake.set()

        def reader_done(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                print(f"worker: controller stream failed: {t.exception()!r}", file=sys.stderr,
                      flush=True)

        rtask = asyncio.create_task(reader())
        rtask.add_done_callback(reader_done)
        try:
            while self._active is token:
                if not node._out and not echoes:
                    w1 = asyncio.ensure_future(node._out_ready.wait())
                    w2 = asyncio.ensure_future(wake.wait())
                    await asyncio.wait([w1, w2, rtask], return_when=asyncio.FIRST_COMPLETED)
                    w1.cancel()
                    w2.cancel()
                    if rtask.done():
                        return
                wake.clear()
                while echoes:
                    yield pb.WorkerMessage(echo=echoes.pop(0))
                res = node.take_results()
                if res:
                    yield pb.WorkerMessage(results=pb.ResultBatch(results=res))
        finally:
            rtask.cancel()


async def serve_worker(host: str, port: int, node: WorkerNode, ready=None,
                       stop: asyncio.Event | None = None) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20),
                                      ("grpc.max_send_message_length", 64 << 20)])
    pbg.add_WorkerServicer_to_server(WorkerServicer(node), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    timer = asyncio.create_task(node.run_timer())
    if ready is not None:
        ready(bound)
    stop = stop or asyncio.Event()
    try:
        await stop.wait()
    finally:
        timer.cancel()
        await server.stop(0.5)


def _cmd_worker(args: argparse.Namespace) -> int:
    global _OFFSET
    _OFFSET = round(args.clock_offset_ms * 1e6)
    try:
        load_profile_set(args.profiles)
    except ProfileError as e:
        print(f"clockwork worker: {e}", file=sys.stderr)
        return 2

    async def main() -> None:
        node = WorkerNode(args.gpus, args.pages, args.profiles, args.device, args.noise, args.seed)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(port: int) -> None:
            print(f"clockwork worker listening on {args.host}:{port} ({args.gpus} emulated GPU(s), "
                  f"{node.pages} pages each, profiles {node.pset.name})", flush=True)

        await serve_worker(args.host, args.port, node, ready, stop)

    try:
        asyncio.run(main())
    except ValueError as e:
        print(f"clockwork worker: {e}", file=sys.stderr)
        return 2
    return 0


def add_worker_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run a worker (GPUs that execute the controller's actions)",
                       description="Run a Clockwork worker: it executes timestamped LOAD/EVICT/"
                       "INFER actions from the controller on its GPUs (emulated by default).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=12345, help="port (0 picks a free one; printed)")
    p.add_argument("--device", default="emulated", choices=["emulated"],
                   help="GPU kind (cpu/cuda come with the real-model devices)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument("--pages", type=int, default=None,
                   help="weights-cache pages per GPU (default: the profile set's)")
    p.add_argument("--profiles", default="v100-reference", help="profile set (folder under profiles/)")
    p.add_argument("--noise", type=float, default=0.0, help="emulated duration noise (std dev fraction)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clock-offset-ms", type=float, default=0.0,
                   help="add this to the worker's clock (to test clock-offset handling)")
    p.set_defaults(func=_cmd_worker)
