"""Opening listening gRPC ports: every listener is exclusive, and one that cannot be
bound is an error that names the address and the flag that chose it."""

from __future__ import annotations

import socket

from clockwork.protocol.addresses import join

# a connection to a gRPC listener that has not finished its handshake (TLS, HTTP/2's
# preface) within this is closed: gRPC's own default, 120 s, let connections that send
# nothing hold a descriptor each that long
HANDSHAKE_TIMEOUT_MS = 10_000
# gRPC sets SO_REUSEPORT by default on Linux, which lets a second server bind a port that
# is already in use (and silently share its connections): turn it off on every listener.
LISTEN_OPTIONS = [("grpc.so_reuseport", 0),
                  ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS)]


class ListenError(OSError):
    """A listening socket could not be opened; the message says which and why."""


def _check_free(host: str, port: int, flag: str) -> None:
    """Fail early, in one line, when ``host:port`` cannot be bound (gRPC would also log
    its own multi-line error)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ListenError(f"cannot listen on {join(host, port)} ({flag}): "
                         f"{e.strerror or e}") from None
    for family, kind, proto, _, addr in infos[:1]:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                s.bind(addr)
            except OSError as e:
                raise ListenError(f"cannot listen on {join(host, port)} ({flag}): "
                                  f"{e.strerror or e}") from None


def bind_grpc(server, host: str, port: int, flag: str, credentials=None) -> int:
    """Add ``host:port`` to a (not yet started) gRPC server, with TLS when ``credentials``
    (``grpc.ServerCredentials``) are given; returns the bound port."""
    _check_free(host, port, flag)
    try:
        if credentials is not None:
            bound = server.add_secure_port(join(host, port), credentials)
        else:
            bound = server.add_insecure_port(join(host, port))
    except RuntimeError:
        bound = 0
    if not bound:
        raise ListenError(f"cannot listen on {join(host, port)} ({flag}): address in use or "
                          "not available")
    return bound
