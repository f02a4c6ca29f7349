"""KServe v2 / Open Inference Protocol front end of the controller (gRPC and REST).

Requests go through :meth:`ControllerNode.submit_many` like ``clockwork.v1`` ones, so they
are scheduled, timed out and answered exactly once in the same way. Conventions:

- the model name is the instance name (``resnet50_v2``, ``resnet50_v2:1``, ...); each has
  one version, ``"1"`` (a request naming no version gets it; any other is NOT_FOUND);
- a request carries 1 to ``max_batch_size`` rows, the profile's largest batch size (the
  model configuration's ``max_batch_size``; metadata shapes carry a leading ``-1``): its
  inputs have shape ``[n, *spec]``, the same ``n`` for all, or the spec's shape without a
  batch dimension (one row). Its rows become ``n`` controller requests, one row each,
  with the request's SLO, admitted together (one ``submit_many``, every row counted in the
  connection's bound), so the scheduler may run them in one batch or in several, with
  rows of other requests. The answer has the ``n`` output rows in order (``[n, *out]``,
  or the output's shape when the inputs had no batch dimension); if any row fails the
  request fails, with the worst row's status (``kserve_status.worst``). The profile's
  batch sizes are the configuration's ``execution_batch_sizes`` parameter;
- the SLO comes from the request parameter ``slo_ms`` (double or integer), else Triton's
  ``timeout`` (integer microseconds), else the controller's default; a gRPC ``ModelInfer``
  with a deadline gets at most what is left of it;
- every field of a request is checked once, by ``controller/kserve_validate.py`` (gRPC
  and REST alike): a bad one is INVALID_ARGUMENT / 400 naming the field and the value;
- how a request fails: one table, ``controller/kserve_status.py`` (the SLO cannot be met
  -> DEADLINE_EXCEEDED / 504, shed or unavailable -> UNAVAILABLE / 503 with Retry-After,
  a bad request -> INVALID_ARGUMENT / 400, an unknown model or version -> NOT_FOUND /
  404, only a bug -> INTERNAL / 500, saying "internal error" and no more).

Inputs become ``clockwork.tensors.Tensor``s over the bytes that arrived (a
``raw_input_contents`` entry, a slice of the REST body) or over the array decoded from
typed contents / JSON data, one per row (views, no copy), and go to the controller as
they are (no ``clockwork.v1`` message in between).

The model repository extension (``RepositoryIndex``, ``RepositoryModelLoad``,
``RepositoryModelUnload``) calls ``controller/repository.py``.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import json_format

from clockwork import __version__
from clockwork.actions import RequestStatus
from clockwork.protocol import kserve_pb2 as kpb
from clockwork.protocol import kserve_pb2_grpc as kpbg
from clockwork.protocol.decode import Malformed, add_service
from clockwork.protocol.ratelog import LogLimiter
from clockwork.tensors import Tensor
from controller.config import usable_batch_sizes
from controller.intake import (
    REPLY_OBJECT_BYTES,
    STOP_WRITE_S,
    STOPPING_MESSAGE,
    Admitted,
    answer_or_withdraw,
    overloaded,
    submit_guarded,
)
from controller.kserve_status import (  # noqa: F401 - the kinds, re-exported
    DEADLINE,
    GRPC_CODE,
    HTTP_CODE,
    INTERNAL,
    INTERNAL_MESSAGE,
    INVALID,
    NOT_FOUND,
    RETRY_AFTER_S,
    UNAVAILABLE,
    KServeError,
    of_answer,
    worst,
)
from controller.kserve_unserved import add_unserved
from controller.kserve_validate import (  # noqa: F401 - re-exported (kserve_rest, tests)
    CONTENTS_FIELD,
    KS_TO_NP,
    NP_TO_KS,
    VERSION,
    InTensor,
    check_inputs,
    grpc_params,
    grpc_request,
    max_batch_size,
    profile_plan,
    rest_request,
    slo_from_params,
)
from controller.kserve_validate import check_version as _check_version

# the protocol extensions served (Triton's names; ServerMetadata.extensions): binary
# tensors after the JSON header of a REST request or response; Triton's model
# configuration (``.../config``, ModelConfig), statistics (``.../stats``, ModelStatistics),
# model repository (index, load, unload) and parameters (a request's own parameters, such
# as ``slo_ms``: Triton lists it as it takes them)
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics", "model_repository",
              "parameters")
PLATFORM = "clockwork"  # model metadata's platform; the configuration's platform and backend


_internal_log = LogLimiter("controller")


def _internal(where: str, e: Exception) -> KServeError:
    """An unexpected exception: logged (rate-limited, with its traceback) and answered
    INTERNAL with a stable message that says nothing of it; running out of memory is
    UNAVAILABLE (503 with Retry-After over REST): the controller serves on, and the same
    request may go through once memory is free."""
    _internal_log(f"kserve {where}: {e!r}", e)
    if isinstance(e, MemoryError):
        return KServeError(UNAVAILABLE, OUT_OF_MEMORY)
    return KServeError(INTERNAL, INTERNAL_MESSAGE)


OUT_OF_MEMORY = ("the controller ran out of memory handling this request: try again "
                 "later, or send smaller inputs")


@dataclass(slots=True)
class TypedInferRequest:
    """What the controller reads of a request (``pb.InferRequest``'s fields), with the
    inputs already Tensors: no ``clockwork.v1`` message is built for a KServe request.
    One row of a KServe request. ``checked``: the profile whose input specs the inputs
    were checked against and cut to (``check_inputs``); the controller checks them
    again unless that is the model's profile still. ``group``: the request's
    ``controller.metrics.Rows`` when it has several rows (Triton's figures count it
    once), else None."""

    model: str
    inputs: list[Tensor] = field(default_factory=list)
    slo_ms: float = 0.0
    client_id: int = 0
    skip_outputs: bool = False
    checked: object = None
    group: object = None


@dataclass
class OutTensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes


def ks_dtype(np_name: str) -> str:
    return NP_TO_KS.get(np_name, np_name.upper())


class _Rows:
    """The answers to one KServe request's rows, collected as they come (each once)."""

    __slots__ = ("resps", "left", "group")

    def __init__(self, n: int, group=None) -> None:
        self.resps: list = [None] * n
        self.left = n
        self.group = group  # the request's metrics.Rows (several rows), or None

    def put(self, i: int, resp) -> bool:
        """Row ``i``'s answer; True when it was the last one missing (once)."""
        if self.resps[i] is not None:
            return False
        self.resps[i] = resp
        self.left -= 1
        return self.left == 0


def submit_rows(node, rows: list[TypedInferRequest], deliver, conn: str,
                budget: int | None = None) -> None:
    """One KServe request's rows (a unary call's), admitted together: through the
    connection's gate (all rows, or none: over a bound every row is answered
    ``overloaded``), then one :func:`submit_guarded`. ``deliver(answers)`` is called once,
    with the rows' answers in order. ``budget`` (ns): what is left of the call's
    deadline."""
    gate = node.gate
    n = len(rows)
    room, why = gate.room(conn)
    nbytes = rows_bytes(rows)
    full = gate.over(nbytes) if room >= n else ""
    if room < n or full:
        answers = [overloaded(node, r, full or why) for r in rows]
        node.metrics.request_done(rows[0].group)
        deliver(answers)
        return
    gate.enter(conn, n)
    gate.take(nbytes)
    got = _Rows(n, rows[0].group)
    for i, r in enumerate(rows):
        r.client_id = i

    def done(resp) -> None:
        i = resp.client_id
        if not 0 <= i < n or got.resps[i] is not None:
            return  # (never: the controller answers each request once)
        gate.leave(conn)
        if got.put(i, resp):
            gate.give(nbytes)
            node.metrics.request_done(got.group)
            deliver(got.resps)

    submit_guarded(node, rows, done, 0, budget)


def rows_bytes(rows) -> int:
    """The bytes of a KServe request's input tensors (its rows' together)."""
    return sum(t.nbytes for r in rows for t in r.inputs)


# instances whose statistics are read, and written as JSON or gRPC messages, in one turn
# of the event loop (~0.6 / ~2 ms)
STATS_SLICE = 128


def _duration(d: dict) -> kpb.StatisticDuration:
    return kpb.StatisticDuration(count=d["count"], ns=d["ns"])


def _model_stats(s: dict) -> kpb.ModelStatistics:
    """One entry of ``KServeFrontend.model_statistics`` as its message (built field by
    field: ``json_format.ParseDict`` took ~40 us an entry, 0.8 s for 20,000 models)."""
    return kpb.ModelStatistics(
        name=s["name"], version=s["version"], last_inference=s["last_inference"],
        inference_count=s["inference_count"], execution_count=s["execution_count"],
        inference_stats=kpb.InferStatistics(
            **{k: _duration(v) for k, v in s["inference_stats"].items()}),
        batch_stats=[kpb.InferBatchStatistics(
            batch_size=b["batch_size"], compute_input=_duration(b["compute_input"]),
            compute_infer=_duration(b["compute_infer"]),
            compute_output=_duration(b["compute_output"])) for b in s["batch_stats"]])


def statistics_message(stats: dict) -> kpb.ModelStatisticsResponse:
    """``ModelStatisticsResponse`` of ``KServeFrontend.model_statistics``' JSON form."""
    return kpb.ModelStatisticsResponse(model_stats=[_model_stats(s) for s in stats["model_stats"]])


class KServeFrontend:
    """The protocol logic shared by the gRPC servicer and the REST handler."""

    def __init__(self, node) -> None:
        self.node = node

    # ------------------------------------------------------------------ health/metadata

    def server_ready(self) -> bool:
        """Started, not stopping, and a worker available: connected and not suspect
        (``ControllerNode.serving``)."""
        return self.node.serving()

    def model_ready(self, name: str) -> bool:
        """Served now: loaded (not loading or unloading) and the server ready."""
        return self.node.model_ready(name) and self.server_ready()

    def profile(self, name: str):
        p = self.node.profiles.get(name)
        if p is None:
            raise KServeError(NOT_FOUND, self.node.unknown_model(name))
        return p

    def described(self, name: str):
        """The profile of a model whose metadata, configuration and statistics are
        answered: one served and not being unloaded. An unknown model, and one being
        unloaded (not ready, its requests refused ``NOT_FOUND``), are ``NOT_FOUND``, as
        Triton answers a model with no ready version."""
        p = self.profile(name)
        if name in self.node.unloading:
            raise KServeError(NOT_FOUND, f"model {name!r} is being unloaded (not ready)")
        return p

    def check_version(self, name: str, version: str) -> None:
        """NOT_FOUND unless ``version`` is the model's (``"1"``) or empty (the default)."""
        _check_version(name, version)

    def model_config(self, name: str) -> dict:
        """Triton's model configuration of an instance (model_config.proto's field names,
        REST's JSON form; gRPC parses it into ``ModelConfig``): dims leave out the batch
        dimension, ``max_batch_size`` is the most rows one request may carry (the
        profile's largest batch size), the profile's batch sizes (those the scheduler
        runs: those up to its ``max_batch``) are the ``execution_batch_sizes`` parameter,
        and one instance group on any GPU of the cluster whose weights cache can hold it
        (``gpus`` the controller-wide GPU indices; each instance has at most one copy of
        its weights per GPU). What it says of the load that made the instance is
        ``controller.repository.as_configured``'s, so that a load with the configuration
        read back changes nothing: ``count`` is the copies of a model loaded as ``name``
        (``name``, ``name:1``, ...; 1 for one of a model's copies ``m:k``), and the
        parameters ``profile`` and ``package`` (when not the defaults)."""
        from controller.repository import as_configured

        p = self.described(name)
        n = self.node
        copies, loaded_as = as_configured(n, name)
        return {
            "name": name, "platform": PLATFORM, "backend": PLATFORM,
            "max_batch_size": max_batch_size(p),
            "input": [{"name": t.name, "data_type": "TYPE_" + ks_dtype(t.dtype),
                       "format": "FORMAT_NONE", "dims": list(t.shape)} for t in p.inputs],
            "output": [{"name": t.name, "data_type": "TYPE_" + ks_dtype(t.dtype),
                        "dims": list(t.shape), "label_filename": ""} for t in p.outputs],
            "dynamic_batching": {},
            "instance_group": [{"name": name, "kind": "KIND_GPU", "count": copies,
                                "gpus": n.gpus_in_service(p.weights_pages)}],
            "parameters": {
                "execution_batch_sizes": {"string_value": ",".join(
                    map(str, usable_batch_sizes(p.batch_sizes, n.cfg.max_batch)))},
                "default_slo_ms": {"string_value": f"{n.cfg.default_slo / 1e6:g}"},
                **loaded_as},
        }

    def model_statistics(self, name: str, version: str = "") -> dict:
        """Triton's ``ModelStatisticsResponse`` (REST's JSON form) of one model instance
        (``statistics_slices``: of every one); the figures are the controller's
        (``ControllerMetrics.statistics``), cumulative since it started."""
        self.described(name)
        self.check_version(name, version)
        return {"model_stats": [self._stats_of(name)]}

    async def statistics_slices(self) -> AsyncIterator[list[dict]]:
        """``model_statistics``' entries of every instance served (not being unloaded),
        ``STATS_SLICE`` at a time, the event loop free before each next slice is read
        (what the caller makes of a slice, JSON or messages, is done in the same turn):
        20,481 instances took it ~0.2 s at once, and 5,000 held it ~4 ms a slice of
        1,024 and ~4 ms more to write the JSON of all."""
        gone = self.node.unloading
        names = [n for n in self.node.profiles if n not in gone]
        for k in range(0, len(names), STATS_SLICE):
            if k:
                await asyncio.sleep(0)
            yield [self._stats_of(n) for n in names[k:k + STATS_SLICE]]

    def _stats_of(self, name: str) -> dict:
        return {"name": name, "version": VERSION, **self.node.metrics.statistics(name)}

    def model_metadata(self, name: str) -> dict:
        p = self.described(name)
        return {"name": name, "versions": [VERSION], "platform": PLATFORM,
                "inputs": [{"name": t.name, "datatype": ks_dtype(t.dtype),
                            "shape": [-1, *t.shape]} for t in p.inputs],
                "outputs": [{"name": t.name, "datatype": ks_dtype(t.dtype),
                             "shape": [-1, *t.shape]} for t in p.outputs]}

    def server_metadata(self) -> dict:
        return {"name": "clockwork", "version": __version__, "extensions": list(EXTENSIONS)}

    # ------------------------------------------------------------------ inference

    async def infer(self, name: str, inputs: list[InTensor], params: dict,
                    requested: list[str], conn: str = "kserve",
                    budget: int | None = None) -> list[OutTensor]:
        """Run one request (its rows) through the controller; raises KServeError on
        failure. ``conn`` names the client connection (its outstanding requests are
        bounded; every row counts); ``budget`` (ns): what is left of the call's
        deadline, if it has one (the SLO is cut to it)."""
        try:
            rows, batched = self.prepare(name, inputs, params, requested)
        except KServeError:
            self.refused(name)
            raise
        fut = asyncio.get_running_loop().create_future()

        def deliver(resps):
            if not fut.done():
                fut.set_result(resps)

        first = self.node.next_id
        submit_rows(self.node, rows, deliver, conn, budget)
        answers = await answer_or_withdraw(self.node, fut, first)
        return self.finish(name, answers, requested, batched)

    def refused(self, name: str) -> None:
        """A request turned away here before the controller saw it (unknown model, bad
        inputs or parameters): counted and logged as the controller counts and logs the
        requests it refuses (one, whatever its rows; an unknown model's under the model
        ""; its row in the request log with the default SLO: its own was not read)."""
        node = self.node
        node.count("requests")
        node.count("requests_invalid_request")
        node.metrics.reply(name if name in node.profiles else "", "invalid_request", None)
        node.log_refused(name, 0.0, RequestStatus.INVALID_REQUEST)

    def prepare(self, name: str, inputs: list[InTensor], params: dict,
                requested: list[str]) -> tuple[list[TypedInferRequest], bool]:
        """A checked request as controller requests, one per row (Tensors over the
        inputs' buffers, the request's SLO), and whether its inputs had a batch dimension
        (the outputs will); raises KServeError."""
        p = self.profile(name)
        slo = slo_from_params(params)
        rows, batched = check_inputs(name, p, inputs, requested)
        group = self.node.metrics.request_rows(name, len(rows))
        return [TypedInferRequest(name, row, slo, checked=p, group=group)
                for row in rows], batched

    def finish(self, name: str, resps, requested: list[str],
               batched: bool) -> list[OutTensor]:
        """The outputs of the controller's answers to a request's rows (``resps``: an
        answer per row, in order, or one; a successful one is an ``Answer`` whose outputs
        are Tensor rows), rows stacked in order: each row copied once, into the bytes of
        the response's output; raises the KServeError of the worst row that failed."""
        if not isinstance(resps, list | tuple):
            resps = [resps]
        ok = RequestStatus.SUCCESS
        if any(r.status != ok for r in resps):
            raise worst(of_answer(r.status, r.reason, r.message) for r in resps
                        if r.status != ok)
        n = len(resps)
        got = [{t.name: t for t in r.outputs} for r in resps]
        out = []
        for oname, datatype, row_bytes, oshape in profile_plan(self.profile(name)).out_rows:
            if requested and oname not in requested:
                continue
            parts = []
            for g in got:
                t = g.get(oname)
                if t is None or not t.nbytes:
                    parts.append(bytes(row_bytes))
                    continue
                if t.nbytes != row_bytes:  # the controller checked the worker's outputs
                    raise _internal("finish", ValueError(
                        f"output {oname!r} of {name!r}: {t.nbytes} bytes in a row, "
                        f"expected {row_bytes}"))
                parts.append(t.data)
            data = b"".join(parts)  # one copy of each row (the bytes themselves if n == 1)
            shape = [n, *oshape] if batched else list(oshape)
            out.append(OutTensor(oname, datatype, shape, data))
        return out


# ---------------------------------------------------------------------- gRPC

def _guarded(method):
    """A servicer method whose ``KServeError`` is answered with its status (the method
    raises it; ``context.abort`` here), and whose unexpected exception is answered
    INTERNAL ("internal error", logged) instead of gRPC's UNKNOWN with the exception's
    text.

    The abort is made with nothing of the request left to it: gRPC keeps the
    ``AbortError`` it raises with the call, and its traceback reaches back into the
    frames here, in a cycle only a full garbage collection frees -- rare in the
    controller (``grpc_api._settle_heap``). Each failed call kept its request (a
    ResNet-size input: 600 KB) until then: ~260 MB swings under a stream of refusals.
    So the error's own traceback (the method's frames) is dropped, and so is the
    request, before the abort."""

    @functools.wraps(method)
    async def run(self, request, context):
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except KServeError as e:
            err = e
        except Exception as e:  # noqa: BLE001 - a bug: answer it, say nothing of it
            if context.done():
                # the call ended (its deadline passed, its client went) before the answer,
                # whose sending failed: nothing went wrong here, and no one to tell
                # (gRPC's own handling of the failed send follows)
                raise
            err = _internal(method.__name__, e)
        # (and the exceptions it was raised while handling: their tracebacks reach the
        # frames too, a repository load's error one raised ``from None``)
        err.__traceback__ = err.__context__ = err.__cause__ = None
        request = None  # noqa: F841 - let go of it before the abort (above)
        await self._abort(context, err)

    return run


class KServeGrpcServicer(kpbg.GRPCInferenceServiceServicer):
    def __init__(self, node) -> None:
        self.fe = KServeFrontend(node)

    async def _abort(self, context, e: KServeError):
        trailer = (("retry-after", str(RETRY_AFTER_S)),) if e.kind == UNAVAILABLE else ()
        await context.abort(GRPC_CODE[e.kind], e.message, trailer)  # (cut: KServeError)

    async def ServerLive(self, request, context):  # noqa: N802
        return kpb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return kpb.ServerReadyResponse(ready=self.fe.server_ready())

    @_guarded
    async def ModelReady(self, request, context):  # noqa: N802
        # (an unknown model or version is not ready, not an error: Triton's answer, which
        # health checks that probe a name before it is loaded rely on)
        try:
            self.fe.check_version(request.name, request.version)
        except KServeError:
            return kpb.ModelReadyResponse(ready=False)
        return kpb.ModelReadyResponse(ready=self.fe.model_ready(request.name))

    async def ServerMetadata(self, request, context):  # noqa: N802
        return kpb.ServerMetadataResponse(**self.fe.server_metadata())

    @_guarded
    async def ModelMetadata(self, request, context):  # noqa: N802
        md = self.fe.model_metadata(request.name)  # (a KServeError: answered by _guarded)
        self.fe.check_version(request.name, request.version)
        return kpb.ModelMetadataResponse(
            name=md["name"], versions=md["versions"], platform=md["platform"],
            inputs=[kpb.ModelMetadataResponse.TensorMetadata(**t) for t in md["inputs"]],
            outputs=[kpb.ModelMetadataResponse.TensorMetadata(**t) for t in md["outputs"]])

    @_guarded
    async def ModelStatistics(self, request, context):  # noqa: N802
        if request.name:
            return statistics_message(self.fe.model_statistics(request.name, request.version))
        out = kpb.ModelStatisticsResponse()
        async for some in self.fe.statistics_slices():
            out.model_stats.extend(_model_stats(s) for s in some)
        return out

    @_guarded
    async def ModelConfig(self, request, context):  # noqa: N802
        cfg = self.fe.model_config(request.name)  # (a KServeError: answered by _guarded)
        self.fe.check_version(request.name, request.version)
        return kpb.ModelConfigResponse(config=json_format.ParseDict(cfg, kpb.ModelConfig()))

    @_guarded
    async def ModelInfer(self, request, context):  # noqa: N802
        """One request of 1 to max_batch_size rows (``KServeFrontend.infer``); its SLO is
        cut to what is left of the call's deadline, when the client set one."""
        try:  # (a KServeError: answered by _guarded)
            inputs, params, requested = grpc_request(request)
        except KServeError:
            self.fe.refused(request.model_name)
            raise
        rem = context.time_remaining()  # None: the call has no deadline
        outs = await self.fe.infer(request.model_name, inputs, params, requested,
                                   context.peer(),
                                   None if rem is None else max(0, int(rem * 1e9)))
        return _grpc_response(request, outs)

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        """Many requests on one stream, one response each: ``_ModelStream``."""
        await _ModelStream(self.fe, context).serve()  # (it reads with context.read())

    # -- the model repository extension (controller/repository.py)

    @staticmethod
    def _repository(request):
        """``controller.repository`` (imported on first use), after checking the
        request's ``repository_name``: this server has one repository, unnamed."""
        if request.repository_name:
            raise KServeError(NOT_FOUND, f"unknown repository {request.repository_name!r} "
                              "(this server has one repository: leave repository_name empty)")
        from controller import repository

        return repository

    @_guarded
    async def RepositoryIndex(self, request, context):  # noqa: N802
        models = self._repository(request).index(self.fe.node, request.ready)
        return kpb.RepositoryIndexResponse(models=[
            kpb.RepositoryIndexResponse.ModelIndex(
                name=str(m.get("name", "")), version=str(m.get("version", "")),
                state=str(m.get("state", "")), reason=str(m.get("reason", "")))
            for m in models])

    @_guarded
    async def RepositoryModelLoad(self, request, context):  # noqa: N802
        await self._repository(request).load(self.fe.node, request.model_name,
                                             _repository_params(request.parameters))
        return kpb.RepositoryModelLoadResponse()

    @_guarded
    async def RepositoryModelUnload(self, request, context):  # noqa: N802
        await self._repository(request).unload(self.fe.node, request.model_name,
                                               _repository_params(request.parameters))
        return kpb.RepositoryModelUnloadResponse()


def _repository_params(parameters) -> dict:
    """A ``map<string, ModelRepositoryParameter>`` as a dict (an unset value: None)."""
    out = {}
    for k, v in parameters.items():
        which = v.WhichOneof("parameter_choice")
        out[k] = getattr(v, which) if which else None
    return out


def _grpc_response(request: kpb.ModelInferRequest, outs: list[OutTensor]):
    resp = kpb.ModelInferResponse(model_name=request.model_name, model_version=VERSION,
                                  id=request.id)
    add, raw = resp.outputs.add, resp.raw_output_contents
    for o in outs:
        add(name=o.name, datatype=o.datatype, shape=o.shape)  # built in place, no copy
        raw.append(o.data)
    return resp


@dataclass(slots=True)
class _Request:
    """One admitted request of a stream: what its response needs, and its rows' answers."""

    request: object  # the ModelInferRequest
    batched: bool
    requested: list[str]
    rows: _Rows
    nbytes: int = 0  # its input bytes, held in the gate until its last row is answered


def _final(resp) -> None:
    """Mark a stream response as its request's last (and only) one, as Triton does for a
    model that is not decoupled: clients that wait for ``triton_final_response`` (for
    example with ``enable_empty_final_response``) end the request on it."""
    resp.parameters["triton_final_response"].bool_param = True


class _ModelStream:
    """One ``ModelStreamInfer`` call. Each request read is checked at once (a bad one is
    answered at once); the good ones are admitted together once per event-loop turn,
    through the controller's batched path (``submit_guarded``: one ``submit_many`` per
    ``admit_slice`` rows or so, a request's rows never split), within the stream's
    (``stream_outstanding``) and the connection's bounds, counted in rows (a request
    whose rows do not all fit is answered ``overloaded``, and so is every request read
    after it in that turn). Every request gets exactly one ``ModelStreamInferResponse``,
    once all its rows are answered, in completion order: its ``infer_response`` (all its
    rows, in order), or ``error_message`` ``KIND: [request id: ID] message`` (the kinds of
    ``controller.kserve_status``; the worst row's) with ``infer_response`` naming the
    request (model, version, id). No request's failure ends the stream; it ends when the
    client has closed its side and every request has been answered. A client that does
    not read its responses gets at most ``stream_reply_buffer_bytes`` of them buffered,
    then its stream is ended with RESOURCE_EXHAUSTED (its requests are still answered
    once inside)."""

    def __init__(self, fe: KServeFrontend, context) -> None:
        self.fe = fe
        self.node = fe.node
        self.context = context
        self.conn = context.peer()
        self.loop = asyncio.get_running_loop()
        self.waiting: list = []  # (request, rows, batched, requested): read, not admitted
        self.pending: dict[int, tuple] = {}  # a row's client_id -> (_Request, row index)
        self.seq = 0
        self.open = 0  # rows admitted, not yet answered
        self.admitted = Admitted()  # their ids
        self.moved = 0  # when its responses last moved (``Gate.hold``)
        self.done = False  # the client closed its side
        self.dead = False  # no more responses go out
        self.out: deque = deque()  # (ModelStreamInferResponse, size) to write
        self.buffered = 0
        self.wake = asyncio.Event()
        self.killed = asyncio.Event()
        self.why = ""
        self.stopping = False  # the controller stops: read no more, send what is answered

    # -- responses

    def _reply(self, msg) -> None:
        if self.dead:
            self.node.count("replies_discarded")
            return
        size = msg.ByteSize() + REPLY_OBJECT_BYTES  # (in memory: see intake)
        self.out.append((msg, size))
        why = self.node.gate.hold(self, size)
        if why:
            self.cut(why)
            return
        self.wake.set()

    def cut(self, why: str) -> None:
        """End the stream as a slow reader (``Gate.hold``)."""
        self.node.count("streams_slow_reader")
        self.why = why
        self.node.count("replies_discarded", len(self.out))
        self._close()
        self.killed.set()

    def _error(self, request, e: KServeError) -> None:
        resp = kpb.ModelInferResponse(model_name=request.model_name,
                                      model_version=request.model_version, id=request.id)
        _final(resp)
        # (the request's id in the message too, as Triton's errors say it: tritonclient's
        # stream callback is given the message alone)
        rid = request.id
        said = (f"[request id: {rid if len(rid) <= 200 else rid[:200] + '...'}] " if rid
                else "")  # (cut: an id of any length was echoed whole into the message)
        self._reply(kpb.ModelStreamInferResponse(
            error_message=f"{e.kind}: {said}{e.message}", infer_response=resp))

    def _deliver(self, resp) -> None:
        """The controller's answer to one admitted row (exactly once each); the last of
        a request's rows answers the request."""
        item = self.pending.pop(resp.client_id, None)
        if item is None:
            return
        self.open -= 1
        self.node.gate.leave(self.conn)
        req, i = item
        if not req.rows.put(i, resp):
            return
        self.node.gate.give(req.nbytes)
        self.node.metrics.request_done(req.rows.group)
        request = req.request
        try:
            outs = self.fe.finish(request.model_name, req.rows.resps, req.requested,
                                  req.batched)
        except KServeError as e:
            self._error(request, e)
            return
        except Exception as e:  # noqa: BLE001 - a bug: answer it, keep the stream
            self._error(request, _internal("ModelStreamInfer", e))
            return
        resp = _grpc_response(request, outs)
        _final(resp)
        self._reply(kpb.ModelStreamInferResponse(infer_response=resp))

    # -- requests

    def _read_one(self, request) -> None:
        if type(request) is Malformed:  # (answered, the stream goes on, as for a request
            # refused; no id, no model: counted nowhere, as a unary call's)
            self._error(kpb.ModelInferRequest(), KServeError(INVALID, request.message))
            return
        try:
            inputs, params, requested = grpc_request(request)
            rows, batched = self.fe.prepare(request.model_name, inputs, params, requested)
        except KServeError as e:
            self.fe.refused(request.model_name)
            self._error(request, e)
            return
        except Exception as e:  # noqa: BLE001 - a bug: answer it, keep the stream
            self._error(request, _internal("ModelStreamInfer", e))
            return
        self.waiting.append((request, rows, batched, requested))
        if len(self.waiting) == 1:
            self.loop.call_soon(self._admit)  # with whatever else arrives this turn

    def _admit(self) -> None:
        batch, self.waiting = self.waiting, []
        if not batch or self.dead:
            return  # (the call ended: what it sent last is not run)
        node, lim, gate = self.node, self.node.limits, self.node.gate
        room, why = gate.room(self.conn)
        mine = lim.stream_outstanding - self.open
        if mine <= room:
            room, why = mine, (f"{lim.stream_outstanding} requests outstanding on this "
                               "stream (limit stream_outstanding)")
        slices: list[list[TypedInferRequest]] = []
        current: list[TypedInferRequest] = []
        taken = 0
        for request, rows, batched, requested in batch:
            k = len(rows)
            if k > room:
                break
            nbytes = rows_bytes(rows)
            full = gate.over(nbytes)
            if full:
                why = full
                break
            gate.take(nbytes)  # (given back when its last row is answered)
            room -= k
            taken += 1
            req = _Request(request, batched, requested, _Rows(k, rows[0].group), nbytes)
            for i, row in enumerate(rows):
                self.seq += 1
                row.client_id = self.seq
                self.pending[self.seq] = (req, i)
            self.open += k
            gate.enter(self.conn, k)
            current.extend(rows)
            if len(current) >= lim.admit_slice:
                slices.append(current)
                current = []
        if current:
            slices.append(current)
        for reqs in slices:
            first = node.next_id
            submit_guarded(node, reqs, self._deliver, 0)
            self.admitted.add(node, first)
        for request, rows, _, _ in batch[taken:]:
            answers = [overloaded(node, row, why) for row in rows]
            node.metrics.request_done(rows[0].group)
            self._error(request, of_answer(answers[0].status, answers[0].reason,
                                           answers[0].message))

    async def _reader(self) -> None:
        # (read() and not ``async for``: grpc.aio's iterator holds the last message while
        # it waits for the next, up to grpc_max_receive_bytes an idle stream)
        read = self.context.read
        while (request := await read()) is not grpc.aio.EOF:
            if self.dead:
                return
            self._read_one(request)
            request = None  # let go of the message before waiting for the next
        self.done = True
        self.wake.set()

    async def _writer(self, rtask: asyncio.Task) -> None:
        wake, out = self.wake, self.out
        while True:
            await wake.wait()
            wake.clear()
            while out:
                msg, size = out.popleft()
                self.node.gate.release(self, size)
                await self.context.write(msg)
            if self.done and self.open <= 0 and not self.waiting and not out:
                return
            if rtask.done() and not self.done:
                return  # the reader failed; serve() says why

    def _close(self) -> None:
        self.dead = True
        self.out.clear()
        self.node.gate.release(self, self.buffered)

    async def serve(self) -> None:
        if self.node._stopping:  # (its closers have run: nothing would end this one)
            await self.context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
        rtask = asyncio.create_task(self._reader())
        rtask.add_done_callback(lambda _: self.wake.set())
        wtask = asyncio.create_task(self._writer(rtask))
        ktask = asyncio.create_task(self.killed.wait())

        def stopping() -> None:  # (ControllerNode.stop, once every request is answered)
            self.stopping = self.done = True
            # read, not admitted: admitted now, each is answered at once as the stopping
            # controller answers, ERROR shutdown (they were dropped: a request the client
            # sent got no response of its own, only the stream's end)
            self._admit()
            rtask.cancel()
            self.wake.set()
            asyncio.get_running_loop().call_later(  # (a client that does not read)
                STOP_WRITE_S, lambda: wtask.done() or wtask.cancel())

        self.node.stream_closers.add(stopping)
        try:
            await asyncio.wait([wtask, ktask], return_when=asyncio.FIRST_COMPLETED)
            if self.killed.is_set():
                _internal_log(f"ModelStreamInfer from {self.conn} ended: {self.why}")
                await self.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.why)
            if self.stopping and wtask.cancelled():  # (its client does not read: given up)
                await self.context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
            wtask.result()  # a failed write (the client went away) raises here
            if rtask.done() and not rtask.cancelled() and rtask.exception() is not None:
                e = rtask.exception()
                if isinstance(e, grpc.RpcError | asyncio.CancelledError):
                    raise e
                err = _internal("ModelStreamInfer", e)
                trailer = (("retry-after", str(RETRY_AFTER_S)),) if err.kind == UNAVAILABLE \
                    else ()
                await self.context.abort(GRPC_CODE[err.kind], err.message, trailer)
            if self.stopping:
                await self.context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
        finally:
            self.node.stream_closers.discard(stopping)
            self._close()
            for t in (rtask, wtask, ktask):
                t.cancel()
            self.admitted.withdraw(self.node)  # (those its client will never read)


def add_kserve_grpc(node, server: grpc.aio.Server) -> None:
    """Register ``inference.GRPCInferenceService`` on the controller's gRPC server (its
    requests that do not decode: ``clockwork.protocol.decode``)."""
    add_service(server, KServeGrpcServicer(node),
                kpb.DESCRIPTOR.services_by_name["GRPCInferenceService"])
    add_unserved(server)  # (Triton's shared-memory, trace and logging calls: by name)


# ---------------------------------------------------------------------- REST bodies
# ``rest_request(req, binary)`` (imported above from controller.kserve_validate, where
# gRPC's requests are checked too): a REST request's JSON header and the binary data
# after it -> (inputs, parameters, requested output names, {output: binary?}, binary by
# default). controller/kserve_rest.py calls it, then ``KServeFrontend.infer``.
