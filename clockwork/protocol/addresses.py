"""Worker addresses, ``HOST:PORT``: how one is read, and when two name the same listener.

The command line's ``--workers`` and a running controller's AddWorker read an address with
the same rule (``split``), and the controller tells whether a worker it is asked to add is
one it already has by the endpoints both addresses resolve to (``endpoints``): two
spellings of one listener (``localhost:7000`` and ``127.0.0.1:7000``, a port written
``07000``) are one worker, and a second link to it would take the worker from the first
again and again."""

from __future__ import annotations

import socket

_HINT = "expected HOST:PORT (an IPv6 address in brackets, [ADDRESS]:PORT)"


def split(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port): the host a name or an address (an IPv6 one in
    brackets, which are taken off), the port 1-65535. Anything else -- no port, a gRPC
    target scheme (``dns:///``, ``ipv4:``), a path -- raises ``ValueError`` saying what is
    expected."""
    given = text
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":") or not host:
            raise ValueError(f"worker address {given!r}: {_HINT}")
        port = rest[1:]
    else:
        host, colon, port = text.rpartition(":")
        if not colon or not host or ":" in host:
            raise ValueError(f"worker address {given!r}: {_HINT}")
    if any(c in host for c in "/@ ?#\\") or host.startswith("-"):
        raise ValueError(f"worker address {given!r}: {_HINT}")
    name = host[:-1] if host.endswith(".") else host  # ("host." is fully qualified)
    if ":" not in host and (len(name) > 253
                            or any(not 1 <= len(p) <= 63 for p in name.split("."))):
        # (no resolver takes it; resolving it raised UnicodeError, not a socket error)
        raise ValueError(f"worker address {given[:80]!r}{'...' if len(given) > 80 else ''}: "
                         "not a host name DNS takes (at most 253 characters, each part "
                         f"between dots 1 to 63; {_HINT})")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"worker address {given!r}: the port must be 1-65535 ({_HINT})")
    return host, int(port)


def join(host: str, port: int) -> str:
    """``host`` and ``port`` as ``HOST:PORT``, an IPv6 address in brackets (gRPC reads
    ``::1:5000`` as something else, and so would a reader)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_of(address: str) -> str:
    """The host part of ``HOST:PORT`` (``[v6]:PORT`` -> ``v6``), read without checks (a
    peer's or a link's address, already whole)."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def canonical(text: str) -> str:
    """``HOST:PORT`` as ``split`` reads it, written back the one way (no spaces, the port
    without leading zeros, an IPv6 address in brackets): the form a worker link keeps and
    names in its proofs, which the worker compares with its own port as text."""
    return join(*split(text))


async def endpoints(address: str) -> frozenset[tuple[str, int]]:
    """The (IP, port) pairs ``address`` resolves to; a host that does not resolve stands for
    itself (lower case), so that two equal spellings still match."""
    import asyncio  # (not at import: the command line reads addresses without a loop)

    host, port = split(address)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return frozenset({(host.lower(), port)})
    return frozenset((i[4][0].split("%")[0], port) for i in infos) or frozenset(
        {(host.lower(), port)})
