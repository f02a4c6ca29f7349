"""gRPC's standard health service, ``grpc.health.v1.Health``, on the controller's gRPC
ports: what Kubernetes' ``grpc`` probes, ``grpc_health_probe`` and load balancers ask.
``Check`` answers ``SERVING`` while the controller serves (started, not stopping, a
worker connected and answering: ``ControllerNode.serving``, KServe's ``ServerReady``)
and ``NOT_SERVING`` otherwise; ``Watch`` sends the status at once and again whenever
it changes (looked at every ``WATCH_INTERVAL_S``). The service names answered are ""
(the server as a whole) and the services these ports serve; another is ``NOT_FOUND``
(``Check``) or ``SERVICE_UNKNOWN`` (``Watch``, which keeps the call open, as for a
service it knows), as the health protocol says. Like the
REST probes, it needs no token (``HEALTH_METHODS``), and so it is bounded: requests of
at most ``REQUEST_MAX_BYTES``, at most ``WATCH_MAX`` Watch calls open at once, a call's
request read within ``REQUEST_WAIT_S`` of its start, at most ``WAITING_MAX`` calls waiting
for theirs and ``READERS_MAX`` requests read at once, one per address (``read_request``).

The two messages are built from their descriptor here (field numbers and names as in
grpc's ``health.proto``) rather than taken from grpcio-health-checking, whose current
releases require protobuf 7, which the Triton and KServe clients installed beside us do
not accept.
"""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from clockwork.protocol.decode import Malformed, decoder

SERVICE = "grpc.health.v1.Health"
HEALTH_METHODS = frozenset({f"/{SERVICE}/Check", f"/{SERVICE}/Watch"})
SERVED = frozenset({"", "clockwork.v1.Clockwork", "inference.GRPCInferenceService"})
WATCH_INTERVAL_S = 1.0
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
# Open to peers without the token, so bounded: a request (a service name) of at most this
# many bytes is read, a larger one refused as it is decoded (50 MiB names were decoded,
# kept by each Watch and echoed back: ~120 MiB held a call); at most this many Watch calls
# open at once, and a fraction of them from one address (20,000 open Watches took every
# call slot of the server: every client with the token was refused RESOURCE_EXHAUSTED)
REQUEST_MAX_BYTES = 1024
WATCH_MAX = 128
WATCH_PER_ADDRESS = 16
# A request is read only once it has arrived whole, and gRPC's transport takes in a message
# being read up to the server's receive limit (64 MiB by default) whatever its size: a
# call that never sent its request held a call slot for good (20,000 such calls took them
# all), and one sending a large request slowly held it in memory (20 calls, 1.3 GB). So a
# call's request must come within this many seconds of the call, at most this many calls
# wait for theirs at once, ``WAITING_PER_ADDRESS`` from one address (an eighth of --limit
# grpc_max_calls when fewer: past them RESOURCE_EXHAUSTED at once), and the requests of
# at most ``READ_BUDGET_BYTES`` / the receive limit calls (1 to ``READERS_MAX``) are read
# at once, one per address, the others waiting unread (what a transport holds of a request
# not being read is its flow-control window): a peer that never sends its requests holds
# one reader, not all of them (with one reader, every other probe waited behind it)
REQUEST_WAIT_S = 1.0
WAITING_MAX = 128
WAITING_PER_ADDRESS = 16
READ_BUDGET_BYTES = 256 << 20
READERS_MAX = 8


def _messages():
    f = descriptor_pb2.FileDescriptorProto(name="clockwork/grpc_health_v1.proto",
                                           package="grpc.health.v1", syntax="proto3")
    req = f.message_type.add(name="HealthCheckRequest")
    req.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    resp = f.message_type.add(name="HealthCheckResponse")
    status = resp.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", 0), ("SERVING", SERVING), ("NOT_SERVING", NOT_SERVING),
                         ("SERVICE_UNKNOWN", SERVICE_UNKNOWN)):
        status.value.add(name=name, number=number)
    resp.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                   type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
                   label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()  # (its own: never clashes with another copy)
    pool.Add(f)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{n}"))
            for n in ("HealthCheckRequest", "HealthCheckResponse"))


HealthCheckRequest, HealthCheckResponse = _messages()


_decode = decoder(HealthCheckRequest)


def _service(data: bytes) -> str | None:
    """A request's service name; None for a request over ``REQUEST_MAX_BYTES`` or one that
    is not a HealthCheckRequest (refused by the handler, INVALID_ARGUMENT)."""
    if len(data) > REQUEST_MAX_BYTES:
        return None
    request = _decode(data)
    return None if type(request) is Malformed else request.service


def _address(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4`` (the peer's address, its port left out)."""
    return peer.rpartition(":")[0] or peer


def add_health(node, *servers) -> None:
    """Serve ``grpc.health.v1.Health`` for ``node`` on each gRPC server of ``servers`` (one
    per port: their health calls bounded together)."""
    # (a server allowed few calls at once, --limit grpc_max_calls: an eighth of them)
    cap = max(1, min(WATCH_MAX, node.limits.grpc_max_calls // 8))
    per_address = min(cap, WATCH_PER_ADDRESS)
    watching: dict[str, int] = {}  # peer address -> its Watch calls open
    waiting_cap = max(1, min(WAITING_MAX, node.limits.grpc_max_calls // 8))
    waiting_per_address = min(waiting_cap, WAITING_PER_ADDRESS)
    readers = asyncio.Semaphore(max(1, min(
        READERS_MAX, READ_BUDGET_BYTES // max(1, node.limits.grpc_max_receive_bytes))))
    # peer address -> [its calls whose request has not been read yet, the lock that
    # reads them one at a time]
    waiting: dict[str, list] = {}

    def status() -> int:
        return SERVING if node.serving() else NOT_SERVING

    async def read_request(context) -> str:
        """The call's service name, its request read as bounded above (``add_health``'s
        constants): the call aborted if it cannot be, or is not a request of at most
        ``REQUEST_MAX_BYTES``."""
        who = _address(context.peer() or "")
        mine = waiting.get(who)
        if (sum(w[0] for w in waiting.values()) >= waiting_cap
                or (mine is not None and mine[0] >= waiting_per_address)):
            node.count("health_calls_refused")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"too many health calls waiting for their request (at most {waiting_cap}, "
                f"{waiting_per_address} from one address)"))
        if mine is None:
            mine = waiting[who] = [0, asyncio.Lock()]
        mine[0] += 1
        data, reading = None, False
        try:
            async with asyncio.timeout(REQUEST_WAIT_S), mine[1], readers:
                reading = True
                data = await context.read()
        except TimeoutError:
            pass
        finally:
            mine[0] -= 1
            if not mine[0]:
                del waiting[who]
        if data is None:
            node.count("health_calls_refused")
            if reading:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, (
                    f"a health check's request did not come within {REQUEST_WAIT_S:g} s"))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"the health service did not get to this call's request in "
                f"{REQUEST_WAIT_S:g} s (it was reading others'): try again"))
        service = None if data is grpc.aio.EOF else _service(data)
        if service is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a health check request "
                                f"is a service name of at most {REQUEST_MAX_BYTES} bytes")
        return service

    async def check(requests, context):
        service = await read_request(context)
        if service not in SERVED:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"unknown service {service[:100]!r}")
        return HealthCheckResponse(status=status())

    async def watch(requests, context):
        service = await read_request(context)
        who = _address(context.peer() or "")
        if sum(watching.values()) >= cap or watching.get(who, 0) >= per_address:
            node.count("health_watches_refused")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"too many health Watch calls open (at most {cap}, {per_address} from one "
                "address): use Check"))
        watching[who] = watching.get(who, 0) + 1
        try:
            if service not in SERVED:
                # said once, the call kept open (the protocol: a call that ends, even OK,
                # makes a client call again, in a loop; the services served never change)
                yield HealthCheckResponse(status=SERVICE_UNKNOWN)
                await asyncio.get_running_loop().create_future()  # (until cancelled)
            last = None
            while True:
                now = status()
                if now != last:
                    yield HealthCheckResponse(status=now)
                    last = now
                await asyncio.sleep(WATCH_INTERVAL_S)
        finally:
            watching[who] -= 1
            if not watching[who]:
                del watching[who]

    # (handlers of a request stream, the same messages on the wire: a unary handler runs
    # only once its request has come, however long that takes)
    kw = {"request_deserializer": None,
          "response_serializer": HealthCheckResponse.SerializeToString}
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Check": grpc.stream_unary_rpc_method_handler(check, **kw),
        "Watch": grpc.stream_stream_rpc_method_handler(watch, **kw)})
    for server in servers:
        server.add_generic_rpc_handlers((handler,))
