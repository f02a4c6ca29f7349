"""The controller's gRPC face: the ``clockwork.v1`` servicer (``Infer``, ``InferStream``,
``Stats``, the model repository and ``AddWorker`` / ``RemoveWorker`` calls, each handed to the
``ControllerNode``) and ``serve_controller``, which binds every listener (clockwork.v1
and KServe v2 gRPC, gRPC health, KServe v2 REST), starts the node and serves until told
to stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc

import grpc

from clockwork.errors import STARTING_MESSAGE
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.addresses import join
from clockwork.protocol.decode import add_service
from clockwork.protocol.holding import controller_label
from clockwork.protocol.listen import ListenError, bind_grpc
from clockwork.protocol.security import TlsFiles, TokenInterceptor, refuse
from clockwork.sizes import status_details
from controller.grpc_health import HEALTH_METHODS, add_health
from controller.intake import answer_or_withdraw, serve_stream, submit_unary
from controller.repository import as_loaded
from controller.service import (
    OFF_LOOP_ROWS,
    ControllerNode,
    RepositoryError,
    model_infos,
    server_options,
)


class ClockworkServicer(pbg.ClockworkServicer):
    def __init__(self, node: ControllerNode) -> None:
        self.node = node

    async def Infer(self, request, context):  # noqa: N802
        fut = asyncio.get_running_loop().create_future()

        def deliver(resp):
            if not fut.done():
                fut.set_result(resp)

        rem = context.time_remaining()  # None: the call has no deadline
        first = self.node.next_id
        submit_unary(self.node, request, deliver, context.peer(),
                     None if rem is None else max(0, int(rem * 1e9)))
        return await answer_or_withdraw(self.node, fut, first)

    async def InferStream(self, request_iterator, context):  # noqa: N802
        """Slices, bounds and reply messages: ``controller.intake.serve_stream``."""
        await serve_stream(self.node, context)  # (it reads with context.read())

    async def ListModels(self, request, context):  # noqa: N802
        n = self.node
        if request.index:
            names = [name for name, _, _ in n.repository_index(request.ready_only)]
        else:
            names = [i for i in n.profiles if not request.ready_only or n.model_ready(i)]
        if len(names) <= OFF_LOOP_ROWS:
            models = model_infos([n.model_row(i) for i in names])
        else:  # read in slices, the loop free between them; made on a thread
            rows = []
            for k in range(0, len(names), OFF_LOOP_ROWS * 4):
                if k:
                    await asyncio.sleep(0)
                for i in names[k:k + OFF_LOOP_ROWS * 4]:
                    with contextlib.suppress(KeyError):  # (forgotten meanwhile)
                        rows.append(n.model_row(i))
            models = await asyncio.get_running_loop().run_in_executor(None, model_infos, rows)
        return pb.ListModelsResponse(
            models=models, default_slo_ms=n.cfg.default_slo / 1e6,
            workers=len(n.in_service()),
            workers_connected=sum(1 for lk in n.in_service() if lk.connected),
            gpus=len(n.gpus_in_service()))

    async def ModelStatus(self, request, context):  # noqa: N802
        n = self.node
        if request.model not in n.profiles:
            # not served; a name the repository knows (unloaded, loading, a profile not
            # loaded) says its state there, as the repository's index does
            if n.model_state(request.model) is None:
                return pb.ModelStatusResponse(known=False)
            return pb.ModelStatusResponse(known=False, model=n.model_info(request.model))
        resp = pb.ModelStatusResponse(known=True, model=n.model_info(request.model))
        view = n.policy.model_view(request.model)
        if view is not None:
            resp.loaded_on.extend(view.loaded_on)
            resp.queued = view.queued
        return resp

    async def Stats(self, request, context):  # noqa: N802
        n = self.node
        return pb.StatsResponse(counters=n.counters, outstanding=len(n.pending))

    async def LoadModel(self, request, context):  # noqa: N802
        n = self.node

        def resolve():  # (under the model's lock: after the loads and unloads before it)
            given = as_loaded(n, request.name, {"copies": request.copies or None,
                                                "profile": request.profile or None,
                                                "package": request.package or None})
            if given is None:  # a copy served as asked: as it is
                return None
            return given["copies"] or 1, given["profile"] or None, given["package"] or ""

        try:
            names = await n.load_resolved(request.name, resolve)
        except RepositoryError as e:
            await context.abort(e.code, status_details(e.message))
        if names is None:
            return pb.LoadModelResponse(models=[n.model_info(request.name)])
        return pb.LoadModelResponse(models=[n.model_info(i) for i in names])

    async def AddWorker(self, request, context):  # noqa: N802
        w, gpus, added = await self._change_workers(self.node.add_worker, request, context)
        return pb.AddWorkerResponse(worker=w, gpus=gpus, added=added)

    async def RemoveWorker(self, request, context):  # noqa: N802
        w, gpus, removed, drained, failed = await self._change_workers(
            functools.partial(self.node.remove_worker, drain=request.drain), request, context)
        return pb.RemoveWorkerResponse(worker=w, gpus=gpus, removed=removed, drained=drained,
                                       failed=failed)

    @staticmethod
    async def _change_workers(call, request, context) -> tuple:
        """AddWorker's or RemoveWorker's ``call`` (the node's) on the request's address,
        answered before the caller's deadline (its last quarter, at most half a second,
        for the answer to reach it); its ``RepositoryError`` as the call's status."""
        if not request.address:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give the worker's host:port")
        try:
            left = context.time_remaining()
            return await call(request.address,
                              None if left is None else left - min(0.5, left / 4))
        except RepositoryError as e:
            await context.abort(e.code, status_details(e.message))

    async def ListWorkers(self, request, context):  # noqa: N802
        return pb.ListWorkersResponse(
            workers=[pb.WorkerRow(**row) for row in self.node.worker_rows()])

    async def UnloadModel(self, request, context):  # noqa: N802
        try:
            names = await self.node.unload_model(request.name)
        except RepositoryError as e:
            await context.abort(e.code, status_details(e.message))
        return pb.UnloadModelResponse(instances=names)


async def serve_controller(node: ControllerNode, host: str, port: int, ready=None,
                           stop: asyncio.Event | None = None,
                           http_port: int | None = None,
                           kserve_port: int | None = None, token: str | None = None,
                           tls: TlsFiles | None = None) -> None:
    """Serve until ``stop``: clockwork.v1 and KServe v2 gRPC on ``port``, KServe v2 gRPC
    also on ``kserve_port`` (Triton's 8001 by default), REST on ``http_port``. ``token``:
    every client call must carry it (REST health endpoints excepted); ``tls``: every port
    speaks TLS."""
    interceptors = [TokenInterceptor(token, node.count, HEALTH_METHODS)] if token else []
    interceptors.append(StartingInterceptor(node))
    creds = tls.grpc_credentials() if tls is not None else None
    server = _client_server(node, interceptors)
    bound = bind_grpc(server, host, port, "--port", creds)
    node.label = controller_label(bound)  # (in our Hellos: a worker names us by it)
    servers = [server]
    kbound = 0
    if kserve_port is not None:  # (a server of its own: see _client_server)
        servers.append(_client_server(node, interceptors))
        kbound = bind_grpc(servers[-1], host, kserve_port, "--kserve-port", creds)
    add_health(node, *servers)  # grpc.health.v1.Health (Kubernetes' grpc probes), no token
    http = None
    if http_port is not None:  # KServe v2 REST: bound now (accepting nothing yet), as every
        # port is before any worker is contacted: a port that is taken stops this
        # controller before it takes the workers from the one that may have them
        from controller.kserve_rest import bind_http
        try:
            http = await bind_http(node, host, http_port, token,
                                   tls.ssl_context() if tls is not None else None)
        except OSError as e:
            raise ListenError(f"cannot listen on {join(host, http_port)} (--http-port): "
                              f"{e.strerror or e}") from None
    stop = stop or asyncio.Event()
    try:
        # the probes answer while the workers are awaited (a liveness probe found no
        # listener, for up to --connect-timeout); every other call is refused "starting"
        for sv in servers:
            await sv.start()
        if http is not None:
            await http.serve()
        await _unless_stopped(node.start(), stop)
    except BaseException:
        await asyncio.gather(*(sv.stop(None) for sv in servers))
        if http is not None:
            await http.close()
        raise
    flusher = None
    try:  # (from here on a failure, one of these lines to a full disk say, stops all)
        if ready is not None:
            ready(bound)
        if kbound:
            print(f"clockwork controller kserve grpc listening on {join(host, kbound)}",
                  flush=True)
        if http is not None:  # after the lines above (LocalCluster reads them in order)
            print(f"clockwork controller http listening on {join(host, http.port)}",
                  flush=True)
        if node.telemetry is not None:
            flusher = asyncio.create_task(node._flush_logs())
        _settle_heap()
        await stop.wait()
    finally:
        if flusher is not None:
            flusher.cancel()
        node.begin_stop()  # (the REST requests waiting get their 503 before it closes)
        if http is not None:
            await http.close()
        await node.stop()
        await asyncio.gather(*(sv.stop(1.0) for sv in servers))
        node.write_logs(final=True)


def _client_server(node: ControllerNode, interceptors: list) -> grpc.aio.Server:
    """A client-facing gRPC server: clockwork.v1 and KServe v2 (and, added by the caller,
    ``grpc.health.v1.Health``), calls bounded by ``grpc_max_calls``. Each port has one of
    its own: a gRPC server of this library takes up one new call per turn of the event
    loop or two, so with the loop busy (REST clients sending ResNet-size tensors) calls
    queue for it, and the controller port's control calls (``ListWorkers``, ``Stats``, the
    repository index) waited 1-3 s behind the KServe port's inferences (now ~50 ms)."""
    server = grpc.aio.server(options=server_options(node.limits), interceptors=interceptors,
                             maximum_concurrent_rpcs=node.limits.grpc_max_calls)
    add_service(server, ClockworkServicer(node), pb.DESCRIPTOR.services_by_name["Clockwork"])
    from controller.kserve import add_kserve_grpc  # lazy: its inference.* protos clash
    add_kserve_grpc(node, server)  # with tritonclient's in one process; KServe v2
    return server


def _settle_heap() -> None:
    """What start-up made (the profiles, every model's state, the modules) lives as long
    as the controller: it is left out of the garbage collector's full passes, which
    walked all of it with the event loop held (60-70 ms with 10,000 models served, set
    off by a /metrics scrape's garbage). With none of it counted as long-lived, the
    collector would make a full pass at every 10th middle one, walking a burst of new
    objects (a repository index of 20,000 models) again and again: at every 100th.
    (Start-up objects that become cyclic garbage later, as parts of a model's state when
    it is unloaded at run time, are not collected: most are freed by their reference
    counts all the same.)"""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


# what answers while the controller waits for its workers (``ControllerNode.starting``):
# gRPC's health probes and KServe's liveness and readiness; other calls are refused
# UNAVAILABLE STARTING_MESSAGE
ANSWERED_WHILE_STARTING = HEALTH_METHODS | {
    f"/inference.GRPCInferenceService/{m}" for m in ("ServerLive", "ServerReady",
                                                      "ServerMetadata")}


class StartingInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but ``ANSWERED_WHILE_STARTING`` with ``UNAVAILABLE``
    (``STARTING_MESSAGE``, its request not read) while ``node.starting``."""

    def __init__(self, node) -> None:
        self.node = node

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if not self.node.starting or handler is None \
                or details.method in ANSWERED_WHILE_STARTING:
            return handler
        return refuse(handler, grpc.StatusCode.UNAVAILABLE, STARTING_MESSAGE)


class Interrupted(Exception):
    """``stop`` came before the controller had started (it was still waiting for its
    workers)."""


async def _unless_stopped(start, stop: asyncio.Event) -> None:
    """Await ``start`` (a coroutine) unless ``stop`` is set first: then it is cancelled
    and ``Interrupted`` raised (a Ctrl-C or SIGTERM while the workers are awaited, for up
    to ``--connect-timeout``, ends the controller at once)."""
    task = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
    if task.cancelled():
        raise Interrupted("stopped while waiting for the workers")
    task.result()
