"""gRPC keepalive: how every channel notices a peer that vanished without closing the
connection (its host gone, a partition, a stopped process), and what every server allows.

A channel pings after ``KEEPALIVE_TIME_MS`` without traffic and gives the connection up
when a ping goes unanswered for ``KEEPALIVE_TIMEOUT_MS``: its calls then fail with
UNAVAILABLE (about 15 s after the peer went silent). The wait for the answer is set twice:
``grpc.keepalive_timeout_ms`` alone does not bound it in current gRPC (1.85 here), whose
pings, keepalive ones included, time out after ``grpc.http2.ping_timeout_ms`` (60 s by
default): without it a stopped peer was noticed after 60 s. Servers accept such
pings, also on idle connections (by default gRPC servers refuse pings more often than
every 5 minutes and close the connection after two).

The worker's fast link, a plain TCP connection beside the gRPC stream, is watched by the
kernel to the same bounds (``watch_tcp``): data it sent that goes unacknowledged for
``SILENT_S`` (the controller sends a clock echo every second; on Linux a peer whose
receive window stays shut that long counts too, though the kernel answers the probes: a
process that reads nothing for 15 s, as a stopped one, whose gRPC pings would go
unanswered as long), or a connection idle for ``KEEPALIVE_TIME_MS`` whose keepalive
probes go unanswered, ends the connection. Without it a fast link whose packets were
dropped while its gRPC stream still answered pings (a firewall rule, a partition of that
port) stayed open for as long as TCP retransmits (~15 minutes): its worker was never
counted lost, and once the path healed the link waited out TCP's retransmission back-off
(46 s after a 60 s outage) before a message went through.

A worker's server pings its controller the same way (``WORKER_SERVER``): a controller that
stops answering (a stopped process, a vanished host) loses the worker's connection after
~15 s, and with it the worker (``clockwork.protocol.holding``), which another controller
may then take. (A gRPC server pings no one by default: a stopped controller held the
worker for as long as its connection stayed open, hours.) The controller's client-facing
servers ping their clients alike (``CLIENT_SERVER``): a client that vanished or stopped
gives up its connections, streams and what they hold after ~15 s, not hours.
"""

from __future__ import annotations

import socket

KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
SILENT_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) // 1000  # a peer given up after this

CHANNEL = [("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
           ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
           ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
           ("grpc.keepalive_permit_without_calls", 1),
           ("grpc.http2.max_pings_without_data", 0)]

SERVER = [("grpc.keepalive_permit_without_calls", 1),
          ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
          ("grpc.http2.max_ping_strikes", 0)]

# a server that pings its peers too (a silent one is let go ~15 s after it fell silent)
PINGING_SERVER = [*SERVER, ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                  ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                  ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                  ("grpc.http2.max_pings_without_data", 0)]
WORKER_SERVER = PINGING_SERVER
CLIENT_SERVER = PINGING_SERVER


def watch_tcp(sock) -> None:
    """Have the kernel end TCP connection ``sock`` once its peer has acknowledged (or
    read) nothing sent for ``SILENT_S`` (``TCP_USER_TIMEOUT``), and probe it after
    ``KEEPALIVE_TIME_MS`` idle (keepalive, ~1 s apart). Options the platform lacks
    (``TCP_USER_TIMEOUT`` is Linux's) or refuses are left as they are; ``sock`` None (not
    a socket's transport) does nothing."""
    if sock is None:
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_USER_TIMEOUT", SILENT_S * 1000),
                        ("TCP_KEEPIDLE", KEEPALIVE_TIME_MS // 1000), ("TCP_KEEPINTVL", 1),
                        ("TCP_KEEPCNT", max(1, KEEPALIVE_TIMEOUT_MS // 1000))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:  # (one the system refuses: the others still hold)
            continue
