"""KServe v2 / Open Inference Protocol front end of the controller (gRPC and REST).

Requests go through :meth:`ControllerNode.submit` like ``clockwork.v1`` ones, so they are
scheduled, timed out and answered exactly once in the same way. Conventions:

- the model name is the instance name (``resnet50_v2``, ``resnet50_v2:1``, ...); each has
  one version, ``"1"`` (a request naming no version gets it; any other is NOT_FOUND);
- a request carries one row: metadata shapes carry a leading ``-1`` and the model
  configuration says ``max_batch_size`` 1 (Triton's form of "a batch dimension, of at
  most 1"); an input may be sent with a leading batch dimension of 1 or without one, and
  outputs mirror that choice. The controller batches rows of many requests itself (the
  profile's batch sizes: the configuration's ``execution_batch_sizes`` parameter);
- the SLO comes from the request parameter ``slo_ms`` (double or integer), else Triton's
  ``timeout`` (integer microseconds), else the controller's default;
- how a request fails: one table, ``controller/kserve_status.py`` (the SLO cannot be met
  -> DEADLINE_EXCEEDED / 504, shed or unavailable -> UNAVAILABLE / 503 with Retry-After,
  a bad request -> INVALID_ARGUMENT / 400, an unknown model or version -> NOT_FOUND /
  404, only a bug -> INTERNAL / 500, saying "internal error" and no more).

Inputs become ``clockwork.tensors.Tensor``s over the bytes that arrived (a
``raw_input_contents`` entry, a slice of the REST body) or over the array decoded from
typed contents / JSON data, and go to the controller as they are (no ``clockwork.v1``
message in between).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections import deque
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.protobuf import json_format

from clockwork import __version__
from clockwork.actions import RequestStatus
from clockwork.protocol import kserve_pb2 as kpb
from clockwork.protocol import kserve_pb2_grpc as kpbg
from clockwork.protocol.ratelog import LogLimiter
from clockwork.tensors import Tensor
from controller.intake import overloaded, submit_guarded, submit_unary
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
)

# KServe datatype <-> numpy dtype name
KS_TO_NP = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
            "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
            "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
NP_TO_KS = {v: k for k, v in KS_TO_NP.items()}
# KServe datatype -> InferTensorContents field holding it
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                  "UINT16": "uint_contents", "UINT32": "uint_contents",
                  "UINT64": "uint64_contents", "FP32": "fp32_contents",
                  "FP64": "fp64_contents"}


# the protocol extensions served (Triton's names; ServerMetadata.extensions): binary
# tensors after the JSON header of a REST request or response; Triton's model
# configuration (``.../config``, ModelConfig) and statistics (``.../stats``, ModelStatistics)
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
VERSION = "1"  # every model's only version
PLATFORM = "clockwork"  # model metadata's platform; the configuration's platform and backend
# rows per request (the configuration's max_batch_size): a request carries one row, with or
# without its batch dimension; the scheduler forms the batches that run
MAX_BATCH_SIZE = 1


_internal_log = LogLimiter("controller")


def _internal(where: str, e: Exception) -> KServeError:
    """An unexpected exception: logged (rate-limited, with its traceback) and answered
    INTERNAL with a stable message that says nothing of it."""
    _internal_log(f"kserve {where}: {e!r}", e)
    return KServeError(INTERNAL, INTERNAL_MESSAGE)


@dataclass
class InTensor:
    """One decoded input: name, datatype (KServe), shape (as sent), its elements in C
    order (``bytes``, a ``memoryview`` of the request body, or a numpy array)."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | np.ndarray


@dataclass(slots=True)
class TypedInferRequest:
    """What the controller reads of a request (``pb.InferRequest``'s fields), with the
    inputs already Tensors: no ``clockwork.v1`` message is built for a KServe request."""

    model: str
    inputs: list[Tensor] = field(default_factory=list)
    slo_ms: float = 0.0
    client_id: int = 0
    skip_outputs: bool = False


@dataclass
class OutTensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes


def ks_dtype(np_name: str) -> str:
    return NP_TO_KS.get(np_name, np_name.upper())


def slo_from_params(params: dict) -> float:
    """``slo_ms`` (ms) or Triton's ``timeout`` (µs) -> SLO in ms; 0 = default."""
    if "slo_ms" in params:
        v = params["slo_ms"]
        key = "slo_ms"
    elif "timeout" in params:
        v = params["timeout"]
        key = "timeout"
    else:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, int | float):
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise KServeError(INVALID, f"parameter {key!r} must be a number, got {v!r}") from None
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise KServeError(INVALID, f"parameter {key!r} must be a finite number >= 0, got {v}")
    return v if key == "slo_ms" else v / 1000.0


class KServeFrontend:
    """The protocol logic shared by the gRPC servicer and the REST handler."""

    def __init__(self, node) -> None:
        self.node = node

    # ------------------------------------------------------------------ health/metadata

    def server_ready(self) -> bool:
        n = self.node
        return n.policy is not None and not n._stopping and any(lk.connected for lk in n.links)

    def model_ready(self, name: str) -> bool:
        return name in self.node.profiles and self.server_ready()

    def profile(self, name: str):
        p = self.node.profiles.get(name)
        if p is None:
            raise KServeError(NOT_FOUND, f"unknown model {name!r}; known: "
                              f"{', '.join(sorted(self.node.profiles))}")
        return p

    def check_version(self, name: str, version: str) -> None:
        """NOT_FOUND unless ``version`` is the model's (``"1"``) or empty (the default)."""
        if version not in ("", VERSION):
            raise KServeError(NOT_FOUND, f"model {name!r} has no version {version!r} "
                              f"(its only version is {VERSION!r})")

    def model_config(self, name: str) -> dict:
        """Triton's model configuration of an instance (model_config.proto's field names,
        REST's JSON form; gRPC parses it into ``ModelConfig``): dims leave out the batch
        dimension, ``max_batch_size`` is what one request may carry (1), the profile's
        batch sizes (those the scheduler runs) are the ``execution_batch_sizes``
        parameter, and one instance group: at most one copy per GPU, on any GPU of the
        cluster (``count`` 1, ``gpus`` the controller-wide GPU indices)."""
        p = self.profile(name)
        n = self.node
        return {
            "name": name, "platform": PLATFORM, "backend": PLATFORM,
            "max_batch_size": MAX_BATCH_SIZE,
            "input": [{"name": t.name, "data_type": "TYPE_" + ks_dtype(t.dtype),
                       "format": "FORMAT_NONE", "dims": list(t.shape)} for t in p.inputs],
            "output": [{"name": t.name, "data_type": "TYPE_" + ks_dtype(t.dtype),
                        "dims": list(t.shape), "label_filename": ""} for t in p.outputs],
            "dynamic_batching": {},
            "instance_group": [{"name": name, "kind": "KIND_GPU", "count": 1,
                                "gpus": list(range(len(n.gpu_index)))}],
            "parameters": {
                "execution_batch_sizes": {"string_value": ",".join(map(str, p.batch_sizes))},
                "default_slo_ms": {"string_value": f"{n.cfg.default_slo / 1e6:g}"}},
        }

    def model_statistics(self, name: str = "", version: str = "") -> dict:
        """Triton's ``ModelStatisticsResponse`` (REST's JSON form) of one model instance,
        or of every one for an empty ``name``; the figures are the controller's
        (``ControllerMetrics.statistics``), cumulative since it started."""
        if name:
            self.profile(name)
            self.check_version(name, version)
            names = [name]
        else:
            names = list(self.node.profiles)
        stats = self.node.metrics.statistics
        return {"model_stats": [{"name": n, "version": VERSION, **stats(n)} for n in names]}

    def model_metadata(self, name: str) -> dict:
        p = self.profile(name)
        return {"name": name, "versions": [VERSION], "platform": PLATFORM,
                "inputs": [{"name": t.name, "datatype": ks_dtype(t.dtype),
                            "shape": [-1, *t.shape]} for t in p.inputs],
                "outputs": [{"name": t.name, "datatype": ks_dtype(t.dtype),
                             "shape": [-1, *t.shape]} for t in p.outputs]}

    def server_metadata(self) -> dict:
        return {"name": "clockwork", "version": __version__, "extensions": list(EXTENSIONS)}

    # ------------------------------------------------------------------ inference

    def _check(self, name: str, inputs: list[InTensor], requested: list[str]):
        """Validate against the profile -> (Tensors of the profile's shapes, batch-dim
        flag). The Tensors share the inputs' buffers."""
        p = self.profile(name)
        specs = {t.name: t for t in p.inputs}
        tensors = []
        batched = True
        seen = set()
        for t in inputs:
            spec = specs.get(t.name)
            if spec is None:
                raise KServeError(INVALID, f"model {name!r} has no input {t.name!r}; "
                                  f"inputs: {sorted(specs)}")
            if t.name in seen:
                raise KServeError(INVALID, f"input {t.name!r} given twice")
            seen.add(t.name)
            np_name = KS_TO_NP.get(t.datatype)
            if np_name != spec.dtype:
                raise KServeError(INVALID, f"input {t.name!r} of model {name!r} has datatype "
                                  f"{t.datatype}, expected {ks_dtype(spec.dtype)}")
            shape = tuple(int(d) for d in t.shape)
            if shape == (1, *spec.shape):
                batched = True
            elif shape == tuple(spec.shape):
                batched = False
            else:
                raise KServeError(INVALID, f"input {t.name!r} of model {name!r} has shape "
                                  f"{list(shape)}, expected {[1, *spec.shape]} "
                                  f"(or {list(spec.shape)})")
            tensor = Tensor(t.name, np.dtype(np_name), tuple(spec.shape), t.data)
            n = int(np.prod(shape, dtype=np.int64))
            want = n * tensor.dtype.itemsize
            if tensor.nbytes != want:
                raise KServeError(INVALID, f"input {t.name!r} of model {name!r} has "
                                  f"{tensor.nbytes} bytes of data, expected {want} for shape "
                                  f"{list(shape)} {t.datatype}")
            tensors.append(tensor)
        outs = {t.name for t in p.outputs}
        for r in requested:
            if r not in outs:
                raise KServeError(INVALID, f"model {name!r} has no output {r!r}; "
                                  f"outputs: {sorted(outs)}")
        return tensors, batched

    async def infer(self, name: str, inputs: list[InTensor], params: dict,
                    requested: list[str], conn: str = "kserve") -> list[OutTensor]:
        """Run one request through the controller; raises KServeError on failure.
        ``conn`` names the client connection (its outstanding requests are bounded)."""
        req, batched = self.prepare(name, inputs, params, requested)
        fut = asyncio.get_running_loop().create_future()

        def deliver(resp):
            if not fut.done():
                fut.set_result(resp)

        submit_unary(self.node, req, deliver, conn)
        return self.finish(name, await fut, requested, batched)

    def prepare(self, name: str, inputs: list[InTensor], params: dict,
                requested: list[str]) -> tuple[TypedInferRequest, bool]:
        """A checked request for the controller, and whether its inputs had a batch
        dimension (the outputs will); raises KServeError."""
        tensors, batched = self._check(name, inputs, requested)
        return TypedInferRequest(name, tensors, slo_from_params(params)), batched

    def finish(self, name: str, resp, requested: list[str], batched: bool) -> list[OutTensor]:
        """The outputs of the controller's answer ``resp`` (a ``pb.InferResponse``);
        raises the KServeError its status maps to."""
        if resp.status != RequestStatus.SUCCESS:
            raise of_answer(resp.status, resp.reason, resp.message)
        got = {t.name: t for t in resp.outputs}
        out = []
        for spec in self.profile(name).outputs:
            if requested and spec.name not in requested:
                continue
            t = got.get(spec.name)
            if t is not None and t.data:
                data = t.data
            else:  # no tensor returned: the profile's shape, zeros
                data = np.zeros(spec.shape, spec.dtype).tobytes()
            shape = [1, *spec.shape] if batched else list(spec.shape)
            out.append(OutTensor(spec.name, ks_dtype(spec.dtype), shape, data))
        return out


# ---------------------------------------------------------------------- gRPC

def _param_value(p: kpb.InferParameter):
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _grpc_inputs(request: kpb.ModelInferRequest) -> list[InTensor]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise KServeError(INVALID, f"{len(raw)} raw_input_contents for "
                          f"{len(request.inputs)} inputs")
    out = []
    for i, t in enumerate(request.inputs):
        if raw:
            data = raw[i]
        else:
            np_name = KS_TO_NP.get(t.datatype)
            field = CONTENTS_FIELD.get(t.datatype)
            if np_name is None or field is None:
                raise KServeError(INVALID, f"input {t.name!r}: datatype {t.datatype!r} "
                                  "cannot be sent as typed contents")
            data = np.ascontiguousarray(getattr(t.contents, field), dtype=np_name)
        out.append(InTensor(t.name, t.datatype, list(t.shape), data))
    return out


def _guarded(method):
    """A servicer method whose unexpected exception is answered INTERNAL ("internal
    error", logged) instead of gRPC's UNKNOWN with the exception's text."""

    @functools.wraps(method)
    async def run(self, request, context):
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except KServeError as e:
            await self._abort(context, e)
        except Exception as e:  # noqa: BLE001 - a bug: answer it, say nothing of it
            await self._abort(context, _internal(method.__name__, e))

    return run


class KServeGrpcServicer(kpbg.GRPCInferenceServiceServicer):
    def __init__(self, node) -> None:
        self.fe = KServeFrontend(node)

    async def _abort(self, context, e: KServeError):
        trailer = (("retry-after", str(RETRY_AFTER_S)),) if e.kind == UNAVAILABLE else ()
        await context.abort(GRPC_CODE[e.kind], e.message, trailer)

    async def ServerLive(self, request, context):  # noqa: N802
        return kpb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return kpb.ServerReadyResponse(ready=self.fe.server_ready())

    @_guarded
    async def ModelReady(self, request, context):  # noqa: N802
        if request.name not in self.fe.node.profiles:
            await self._abort(context, KServeError(NOT_FOUND, f"unknown model {request.name!r}"))
        try:
            self.fe.check_version(request.name, request.version)
        except KServeError as e:
            await self._abort(context, e)
        return kpb.ModelReadyResponse(ready=self.fe.model_ready(request.name))

    async def ServerMetadata(self, request, context):  # noqa: N802
        return kpb.ServerMetadataResponse(**self.fe.server_metadata())

    @_guarded
    async def ModelMetadata(self, request, context):  # noqa: N802
        try:
            md = self.fe.model_metadata(request.name)
            self.fe.check_version(request.name, request.version)
        except KServeError as e:
            await self._abort(context, e)
        return kpb.ModelMetadataResponse(
            name=md["name"], versions=md["versions"], platform=md["platform"],
            inputs=[kpb.ModelMetadataResponse.TensorMetadata(**t) for t in md["inputs"]],
            outputs=[kpb.ModelMetadataResponse.TensorMetadata(**t) for t in md["outputs"]])

    @_guarded
    async def ModelStatistics(self, request, context):  # noqa: N802
        stats = self.fe.model_statistics(request.name, request.version)
        return json_format.ParseDict(stats, kpb.ModelStatisticsResponse())

    @_guarded
    async def ModelConfig(self, request, context):  # noqa: N802
        try:
            cfg = self.fe.model_config(request.name)
            self.fe.check_version(request.name, request.version)
        except KServeError as e:
            await self._abort(context, e)
        return kpb.ModelConfigResponse(config=json_format.ParseDict(cfg, kpb.ModelConfig()))

    @_guarded
    async def ModelInfer(self, request, context):  # noqa: N802
        try:
            self.fe.check_version(request.model_name, request.model_version)
            params = {k: _param_value(v) for k, v in request.parameters.items()}
            outs = await self.fe.infer(request.model_name, _grpc_inputs(request), params,
                                       [o.name for o in request.outputs], context.peer())
        except KServeError as e:
            await self._abort(context, e)
        return _grpc_response(request, outs)

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        """Many requests on one stream, one response each: ``_ModelStream``."""
        await _ModelStream(self.fe, context).serve(request_iterator)


def _grpc_response(request: kpb.ModelInferRequest, outs: list[OutTensor]):
    resp = kpb.ModelInferResponse(model_name=request.model_name, model_version=VERSION,
                                  id=request.id)
    for o in outs:
        resp.outputs.append(kpb.ModelInferResponse.InferOutputTensor(
            name=o.name, datatype=o.datatype, shape=o.shape))
        resp.raw_output_contents.append(o.data)
    return resp


class _ModelStream:
    """One ``ModelStreamInfer`` call. Each request read is checked at once (a bad one is
    answered at once); the good ones are admitted together once per event-loop turn,
    through the controller's batched path (``submit_guarded``: one ``submit_many`` per
    ``admit_slice``), within the stream's (``stream_outstanding``) and the connection's
    bounds (over them: ``overloaded``). Every request gets exactly one
    ``ModelStreamInferResponse``, in completion order: its ``infer_response``, or
    ``error_message`` ``KIND: message`` (the kinds of ``controller.kserve_status``) with
    ``infer_response`` naming the request (model, version, id). No request's failure ends
    the stream; it ends when the client has closed its side and every request has been
    answered. A client that does not read its responses gets at most
    ``stream_reply_buffer_bytes`` of them buffered, then its stream is ended with
    RESOURCE_EXHAUSTED (its requests are still answered once inside)."""

    def __init__(self, fe: KServeFrontend, context) -> None:
        self.fe = fe
        self.node = fe.node
        self.context = context
        self.conn = context.peer()
        self.loop = asyncio.get_running_loop()
        self.waiting: list = []  # (request, TypedInferRequest, batched, requested): read
        self.pending: dict[int, tuple] = {}  # client_id -> (request, batched, requested)
        self.seq = 0
        self.open = 0  # admitted, not yet answered
        self.done = False  # the client closed its side
        self.dead = False  # no more responses go out
        self.out: deque = deque()  # (ModelStreamInferResponse, size) to write
        self.buffered = 0
        self.wake = asyncio.Event()
        self.killed = asyncio.Event()
        self.why = ""

    # -- responses

    def _reply(self, msg) -> None:
        if self.dead:
            self.node.count("replies_discarded")
            return
        size = msg.ByteSize()
        self.out.append((msg, size))
        self.buffered += size
        cap = self.node.limits.stream_reply_buffer_bytes
        if self.buffered > cap:
            self.node.count("streams_slow_reader")
            self.why = (f"the client is not reading its responses: {self.buffered} bytes "
                        f"waiting (limit stream_reply_buffer_bytes {cap})")
            self.node.count("replies_discarded", len(self.out))
            self._close()
            self.killed.set()
            return
        self.wake.set()

    def _error(self, request, e: KServeError) -> None:
        self._reply(kpb.ModelStreamInferResponse(
            error_message=f"{e.kind}: {e.message}",
            infer_response=kpb.ModelInferResponse(model_name=request.model_name,
                                                  model_version=request.model_version,
                                                  id=request.id)))

    def _deliver(self, resp) -> None:
        """The controller's answer to one admitted request (exactly once each)."""
        item = self.pending.pop(resp.client_id, None)
        if item is None:
            return
        self.open -= 1
        self.node.gate.leave(self.conn)
        request, batched, requested = item
        try:
            outs = self.fe.finish(request.model_name, resp, requested, batched)
        except KServeError as e:
            self._error(request, e)
            return
        except Exception as e:  # noqa: BLE001 - a bug: answer it, keep the stream
            self._error(request, _internal("ModelStreamInfer", e))
            return
        self._reply(kpb.ModelStreamInferResponse(infer_response=_grpc_response(request, outs)))

    # -- requests

    def _read_one(self, request) -> None:
        try:
            self.fe.check_version(request.model_name, request.model_version)
            params = {k: _param_value(v) for k, v in request.parameters.items()}
            requested = [o.name for o in request.outputs]
            typed, batched = self.fe.prepare(request.model_name, _grpc_inputs(request),
                                             params, requested)
        except KServeError as e:
            self._error(request, e)
            return
        except Exception as e:  # noqa: BLE001 - a bug: answer it, keep the stream
            self._error(request, _internal("ModelStreamInfer", e))
            return
        self.waiting.append((request, typed, batched, requested))
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
        n = min(len(batch), max(0, room))
        reqs = []
        for request, typed, batched, requested in batch[:n]:
            self.seq += 1
            typed.client_id = self.seq
            self.pending[self.seq] = (request, batched, requested)
            reqs.append(typed)
        if n:
            self.open += n
            gate.enter(self.conn, n)
            size = lim.admit_slice
            for i in range(0, n, size):
                submit_guarded(node, reqs[i:i + size], self._deliver, 0)
        for request, typed, _, _ in batch[n:]:
            resp = overloaded(node, typed, why)
            self._error(request, of_answer(resp.status, resp.reason, resp.message))

    async def _reader(self, requests) -> None:
        async for request in requests:
            if self.dead:
                return
            self._read_one(request)
        self.done = True
        self.wake.set()

    async def _writer(self, rtask: asyncio.Task) -> None:
        wake, out = self.wake, self.out
        while True:
            await wake.wait()
            wake.clear()
            while out:
                msg, size = out.popleft()
                self.buffered -= size
                await self.context.write(msg)
            if self.done and self.open <= 0 and not self.waiting and not out:
                return
            if rtask.done() and not self.done:
                return  # the reader failed; serve() says why

    def _close(self) -> None:
        self.dead = True
        self.out.clear()
        self.buffered = 0

    async def serve(self, requests) -> None:
        rtask = asyncio.create_task(self._reader(requests))
        rtask.add_done_callback(lambda _: self.wake.set())
        wtask = asyncio.create_task(self._writer(rtask))
        ktask = asyncio.create_task(self.killed.wait())
        try:
            await asyncio.wait([wtask, ktask], return_when=asyncio.FIRST_COMPLETED)
            if self.killed.is_set():
                _internal_log(f"ModelStreamInfer from {self.conn} ended: {self.why}")
                await self.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.why)
            wtask.result()  # a failed write (the client went away) raises here
            if rtask.done() and not rtask.cancelled() and rtask.exception() is not None:
                e = rtask.exception()
                if isinstance(e, grpc.RpcError | asyncio.CancelledError):
                    raise e
                await self.context.abort(grpc.StatusCode.INTERNAL,
                                         _internal("ModelStreamInfer", e).message)
        finally:
            self._close()
            for t in (rtask, wtask, ktask):
                t.cancel()


def add_kserve_grpc(node, server: grpc.aio.Server) -> None:
    """Register ``inference.GRPCInferenceService`` on the controller's gRPC server."""
    kpbg.add_GRPCInferenceServiceServicer_to_server(KServeGrpcServicer(node), server)


# ---------------------------------------------------------------------- REST bodies

def rest_request(req: dict, binary: bytes | memoryview):
    """A REST request's JSON header (``req``) and the binary data after it ->
    (inputs, parameters, requested output names, {output: binary?}, binary by default)."""
    params = req.get("parameters") or {}
    wanted = req.get("outputs") or []
    requested = [o.get("name") for o in wanted if isinstance(o, dict)]
    binary_all = bool(params.get("binary_data_output", False))
    binary_of = {o.get("name"): bool((o.get("parameters") or {}).get("binary_data",
                                                                      binary_all))
                 for o in wanted if isinstance(o, dict)}
    return _rest_inputs(req, binary), params, requested, binary_of, binary_all


def _rest_inputs(body: dict, binary: bytes | memoryview) -> list[InTensor]:
    """The inputs of a REST request: binary ones as views of the body after the JSON
    header (no copy), JSON ones as arrays."""
    out = []
    binary = memoryview(binary)
    pos = 0
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise KServeError(INVALID, "request needs an 'inputs' list")
    for t in inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise KServeError(INVALID, "each input needs a name, shape, datatype and data")
        name, datatype = t["name"], t.get("datatype", "")
        shape = t.get("shape", [])
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise KServeError(INVALID, f"input {name!r}: shape must be a list of integers")
        params = t.get("parameters") or {}
        np_name = KS_TO_NP.get(datatype)
        if np_name is None:
            raise KServeError(INVALID, f"input {name!r}: unsupported datatype {datatype!r}")
        if "binary_data_size" in params:
            n = int(params["binary_data_size"])
            if n < 0 or pos + n > len(binary):
                raise KServeError(INVALID, f"input {name!r}: binary_data_size {n} exceeds "
                                  "the binary data sent")
            data = binary[pos:pos + n]
            pos += n
        else:
            if "data" not in t:
                raise KServeError(INVALID, f"input {name!r} has no data")
            try:
                data = np.ascontiguousarray(t["data"], dtype=np_name)
            except (TypeError, ValueError) as e:
                raise KServeError(INVALID, f"input {name!r}: bad data ({e})") from None
        out.append(InTensor(name, datatype, shape, data))
    return out
