"""Which worker protocol a controller and a worker speak, and the one rule for a pair that
differs: they do not work together, and both say so, naming both versions.

The worker protocol is everything between a controller and its workers: the ``Worker``
gRPC service's messages, the fast link's frames, the cluster-secret handshake. Any change
to what either side sends or expects there takes the next ``PROTOCOL``. A controller's
``Hello`` and a worker's ``WorkerState`` carry it (and the clockwork-py version); a worker
refuses a Hello of another protocol (``FAILED_PRECONDITION``, saying ``OTHER_PROTOCOL``),
a controller a worker whose state says another one. A process too old to send it says 0.
Without this a mixed pair (a rolling upgrade) half-worked: frames of another layout read
as garbage and the link was dropped and dialled again for ever, a message kind the worker
did not know was ignored (a model load waited for its answer until the client gave up),
checks one side did not make were taken as passed."""

from __future__ import annotations

from clockwork import __version__
from clockwork.protocol.holding import printable

PROTOCOL = 1  # the worker protocol this clockwork-py speaks
SOFTWARE = __version__

# how a worker's refusal of a controller of another protocol begins (its gRPC details)
OTHER_PROTOCOL = "speaks another worker protocol"


def mismatch(role: str, address: str, protocol: int, software: str) -> str | None:
    """Why a peer (``role``: "worker" or "controller", at ``address``) that says it speaks
    ``protocol`` (clockwork-py ``software``) cannot work with this process, or None."""
    if protocol == PROTOCOL:
        return None
    said = printable(software) or "unknown"
    if said == SOFTWARE:  # (two builds of one version number: from other sources)
        said += ", another build"
    theirs = (f"protocol {protocol} (clockwork-py {said})" if protocol else
              "no protocol version (a clockwork-py older than version fields)")
    me = "controller" if role == "worker" else "worker"
    return (f"{role} {address} {OTHER_PROTOCOL}: it says {theirs}, this {me} speaks "
            f"protocol {PROTOCOL} (clockwork-py {SOFTWARE}); run the same clockwork-py "
            "version on the controller and its workers (upgrade them together)")


def is_other_protocol(e) -> bool:
    """Whether a gRPC error (``AioRpcError``) is a worker's refusal of a controller that
    speaks another worker protocol."""
    import grpc

    return (e.code() == grpc.StatusCode.FAILED_PRECONDITION
            and OTHER_PROTOCOL in (e.details() or ""))
