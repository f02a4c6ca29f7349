"""Triton's protocol extensions this server does not serve, answered by name.

A stock Triton client (perf_analyzer with ``--shared-memory`` or ``--trace-*``,
tritonclient's ``register_system_shared_memory``, ``update_trace_settings``,
``update_log_settings``, ...) calls these before any inference; a bare "Method not
found!" or "no route" left its user guessing why. Each gets gRPC ``UNIMPLEMENTED`` / REST
404 with a message that names the extension and what to do instead.
"""

from __future__ import annotations

import grpc

SERVICE = "inference.GRPCInferenceService"

SHARED_MEMORY = ("Triton's shared-memory extension is not served by this server: send "
                 "the tensors in the request")
TRACE = "Triton's trace extension is not served by this server"
LOGGING = "Triton's logging extension is not served by this server"

# gRPC methods of Triton's grpc_service.proto that this server does not have
GRPC_METHODS = {
    **{f"{kind}SharedMemory{what}": SHARED_MEMORY
       for kind in ("System", "Cuda") for what in ("Status", "Register", "Unregister")},
    "TraceSetting": TRACE,
    "LogSettings": LOGGING,
}


def rest_message(segs: list[str]) -> str | None:
    """The message for a REST path's segments after ``v2`` that belong to an unserved
    extension (``systemsharedmemory/...``, ``cudasharedmemory/...``, ``trace/setting``,
    ``models/<name>/trace/setting``, ``logging``), else None."""
    if segs and segs[0] in ("systemsharedmemory", "cudasharedmemory"):
        return SHARED_MEMORY
    if segs[:2] == ["trace", "setting"] or (
            len(segs) >= 4 and segs[0] == "models" and segs[-2:] == ["trace", "setting"]):
        return TRACE
    if segs[:1] == ["logging"]:
        return LOGGING
    return None


class _Unserved(grpc.GenericRpcHandler):
    def service(self, handler_call_details):
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        message = GRPC_METHODS.get(method) if service == SERVICE else None
        if message is None:
            return None

        async def refuse(request: bytes, context):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.unary_unary_rpc_method_handler(refuse)  # (the request left as bytes)


def add_unserved(server: grpc.aio.Server) -> None:
    """Answer ``GRPC_METHODS`` on ``server`` (after the served ones are registered)."""
    server.add_generic_rpc_handlers((_Unserved(),))
