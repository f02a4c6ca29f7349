"""gRPC services whose requests that do not decode are the client's error, not ours.

grpc.aio decodes a request with the method's deserializer inside the call: one that
raises (bytes that are not the message, a string field that is not UTF-8) ended a unary
call ``UNKNOWN`` with the exception's text ("Unexpected <class 'DecodeError'>: ...") and a
stream ``INTERNAL`` with a traceback in the log, as a bug. ``add_service`` registers a
servicer's methods with decoders that turn such bytes into a ``Malformed`` value instead:
a unary call is answered ``INVALID_ARGUMENT`` naming the message type, before the method
runs; a streaming method's reader meets the ``Malformed`` in the stream and answers it as
its protocol says (``controller.kserve``: an error response, the stream goes on;
``controller.intake``: the stream ends ``INVALID_ARGUMENT``)."""

from __future__ import annotations

import functools

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError


class Malformed:
    """A request whose bytes are not a ``type_name`` message."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    @property
    def message(self) -> str:
        return f"malformed request: its bytes are not a message of type {self.type_name}"


def decoder(cls):
    """``cls.FromString``, a ``Malformed`` for bytes that do not decode."""
    name = cls.DESCRIPTOR.full_name
    parse = cls.FromString

    def decode(data: bytes):
        try:
            return parse(data)
        except (DecodeError, ValueError):  # (a string that is not UTF-8: a ValueError)
            return Malformed(name)

    return decode


def _refusing(method):
    """A unary method that answers a ``Malformed`` request ``INVALID_ARGUMENT``."""

    @functools.wraps(method)
    async def run(request, context):
        if type(request) is Malformed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await method(request, context)

    return run


def add_service(server, servicer, service) -> None:
    """Register ``servicer``'s methods of ``service`` (a protobuf ``ServiceDescriptor``)
    on ``server``, as the generated ``add_..._to_server`` does, with ``decoder``s. Its
    methods are unary or stream-to-stream (those of the services served here)."""
    handlers = {}
    for m in service.methods:
        decode = decoder(message_factory.GetMessageClass(m.input_type))
        encode = message_factory.GetMessageClass(m.output_type).SerializeToString
        behaviour = getattr(servicer, m.name)
        if m.client_streaming and m.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif not m.client_streaming and not m.server_streaming:
            make, behaviour = grpc.unary_unary_rpc_method_handler, _refusing(behaviour)
        else:
            raise ValueError(f"{service.full_name}/{m.name}: one-sided streams are not served")
        handlers[m.name] = make(behaviour, request_deserializer=decode,
                                response_serializer=encode)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
