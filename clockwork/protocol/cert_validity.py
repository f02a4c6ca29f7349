"""Whether a listener's own certificate is within its dates.

A server whose ``--tls-cert`` has expired (or is not valid yet) starts and listens as
usual, but every client refuses its handshake, and the server's side sees only
connections that end: without a word at start the operator learns it from the clients.
The dates are read by a TLS handshake in memory between a server holding that certificate
and key and a client that trusts that certificate alone (OpenSSL checks the dates as any
client does), which needs nothing beyond Python's ``ssl`` module.
"""

from __future__ import annotations

import ssl
import time

# a certificate that ends within this long, or within a quarter of its lifetime if that is
# shorter (one of a day, renewed and the process restarted each day, is not said every start),
# is said to end soon
SOON_S = 7 * 86_400
_HANDSHAKE_ROUNDS = 8  # a TLS 1.3 handshake in memory takes 2-3; more means it is stuck


def _handshake(server: ssl.SSLContext, cert: str) -> dict | str:
    """A client that trusts ``cert`` alone (``VERIFY_X509_PARTIAL_CHAIN``: the leaf
    itself, not the CA above it) shakes hands with ``server`` through memory: the
    certificate's fields as the client read them, or the client's reason to refuse it."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False  # (the names are the clients' business, not checked here)
    client.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    client.load_verify_locations(cafile=cert)
    to_client, to_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = server.wrap_bio(to_server, to_client, server_side=True)
    theirs = client.wrap_bio(to_client, to_server, server_side=False)
    for _ in range(_HANDSHAKE_ROUNDS):
        try:
            theirs.do_handshake()
            return theirs.getpeercert()  # (the client's side is done: it has checked)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLCertVerificationError as e:
            return str(e.verify_message)
        try:  # (a server that asks for a client certificate gets none: its side fails
            ours.do_handshake()  # after the client's is done, which is all that counts)
        except ssl.SSLWantReadError:
            pass
    return "no TLS handshake in memory"


def validity_warning(cert: str, key: str, flag: str = "--tls-cert",
                     now: float | None = None) -> str | None:
    """One line when the certificate a server presents with ``cert`` and ``key`` (PEM
    files; ``cert`` given as ``flag``) has expired, is not valid yet, or ends soon
    (``SOON_S``); None if its dates hold (or the check itself could not be made: the
    listener then says what it can). The server side here asks for no client
    certificate, whatever the listener's ``--tls-ca`` (with TLS 1.2 a server that asks
    ends the handshake before the client has read the dates)."""
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        seen = _handshake(server, cert)
    except (OSError, ssl.SSLError):
        return None
    if isinstance(seen, str):
        if "expired" in seen or "not yet valid" in seen:
            return f"{flag} {cert}: {seen}: every client will refuse the TLS handshake"
        return None  # (another reason: the clients' own checks say it)
    try:
        start, end = (ssl.cert_time_to_seconds(seen[k]) for k in ("notBefore", "notAfter"))
    except (KeyError, ValueError):
        return None
    left = end - (time.time() if now is None else now)
    if left < min(SOON_S, (end - start) / 4):
        return (f"{flag} {cert}: certificate expires on {seen['notAfter']} (in "
                f"{left / 86_400:.1f} days); after that every client will refuse the TLS "
                "handshake")
    return None
