"""Authentication and TLS for every listener (see SECURITY.md for the threat model).

Three mechanisms, each off unless configured, each required by the defaults when a
process is reachable from other hosts:

- **Client token** (controller; ``--token`` / ``--token-file``): every ``clockwork.v1`` and
  KServe v2 gRPC call carries ``authorization: Bearer <token>`` in its metadata, every
  REST request the ``Authorization: Bearer <token>`` header (health endpoints excepted).
  A call without it, or with another token, is refused before any handler runs
  (``UNAUTHENTICATED`` / HTTP 401 with ``WWW-Authenticate: Bearer``). Tokens are compared
  with ``hmac.compare_digest``.
- **Cluster secret** (controller and workers; ``--cluster-secret-file`` or
  ``$CLOCKWORK_CLUSTER_SECRET``): mutual authentication of the controller-worker link,
  per call, with HMAC-SHA256 under the shared secret K:

      controller -> worker, request metadata:
        x-clockwork-nonce   N   32 random hex digits, new for every call
        x-clockwork-time    T   the controller's wall clock, integer milliseconds
        x-clockwork-target  A   the worker's address as the controller dialled it
        x-clockwork-auth        HMAC(K, "clockwork-v2 controller\\n" METHOD "\\n" A "\\n" T "\\n" N)
      worker -> controller, response initial metadata (before any message):
        x-clockwork-worker-auth  HMAC(K, "clockwork-v2 worker\\n" METHOD "\\n" A "\\n" N)

  The worker accepts a call only if the HMAC matches, ``T`` is within ``FRESH_S`` of its
  own wall clock, ``N`` was not seen before (a replay cache that covers the window) and
  ``A`` is its own address (``answers_to``);
  the controller trusts an answer (and writes ``Hello`` on ``Connect``) only once the
  worker's proof over its fresh ``N`` checks out. METHOD is the full gRPC method name, so
  a proof for one call is no good for another.
- **TLS** on every listener (``--tls-cert``/``--tls-key``; ``--tls-ca`` makes a server
  require client certificates signed by that CA), and the controller's connections to
  workers (``--worker-tls-ca``).

This module imports ``grpc`` but nothing from ``controller/`` or ``worker/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import shlex
import socket
import ssl
import stat
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import grpc

from clockwork.protocol.addresses import host_of
from clockwork.protocol.cert_validity import validity_warning

TOKEN_ENV = "CLOCKWORK_TOKEN"  # clients: the bearer token when none is given
SECRET_ENV = "CLOCKWORK_CLUSTER_SECRET"  # controller and workers: the cluster secret
MIN_CREDENTIAL = 16  # characters (token) / bytes (secret)
FRESH_S = 300.0  # a controller's proof is accepted this long either side of the worker's clock
MAX_NONCES = 100_000  # nonces a worker remembers at most (the oldest go first)

AUTHORIZATION = "authorization"
NONCE_KEY = "x-clockwork-nonce"
TIME_KEY = "x-clockwork-time"
PROOF_KEY = "x-clockwork-auth"
WORKER_PROOF_KEY = "x-clockwork-worker-auth"
TARGET_KEY = "x-clockwork-target"  # the worker address the controller dialled (HOST:PORT)

WORKER_CONNECT = "/clockwork.v1.Worker/Connect"
WORKER_CLOCK_SYNC = "/clockwork.v1.Worker/ClockSync"
WORKER_LOAD = "/clockwork.v1.Worker/LoadModelFromDisk"

_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in a header and in metadata
_NONCE = re.compile(r"[0-9a-f]{32}")


class SecurityError(ValueError):
    """A security setting that cannot be used; the message is one line naming the flag."""


class AuthFailed(ValueError):
    """A peer did not authenticate (a worker without the cluster secret, or a worker that
    refused ours)."""


# ---------------------------------------------------------------------- settings


def far_workers(workers) -> list[str]:
    """The worker addresses (``host:port``) off this machine (not loopback)."""
    return [w for w in workers if not is_loopback(host_of(w))]


def plaintext_workers_warning(clients_tls: bool, worker_tls, workers) -> str | None:
    """A warning when the clients speak TLS and the links to the workers among
    ``workers`` off this machine do not (``worker_tls`` None; allowed, but the tensors
    cross the network in the clear, while the start line says TLS), or None. Said for
    the workers at start and for each one added later."""
    if not clients_tls or worker_tls is not None:
        return None
    far = far_workers(workers)
    if not far:
        return None
    return (f"clients speak TLS, but the links to {', '.join(far[:3])}"
            f"{' and more' if len(far) > 3 else ''} do not (the tensors cross the network "
            "in the clear): --worker-tls-ca CA for TLS to the workers (started with "
            "--tls-cert/--tls-key)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine. A name counts
    when every address it resolves to is a loopback address; "" and wildcards do not."""
    h = host.strip().strip("[]")
    if not h:
        return False
    try:
        return _unmapped(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None)
    except (OSError, UnicodeError):  # (UnicodeError: a name no resolver takes)
        return False
    return bool(infos) and all(_unmapped(i[4][0]).is_loopback for i in infos)


def _unmapped(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address (an IPv6 one's zone, ``%eth0``, left out), an IPv4 one mapped into
    IPv6 (``::ffff:127.0.0.1``) as itself; ValueError for what is not an address."""
    a = ipaddress.ip_address(address.split("%")[0])
    return getattr(a, "ipv4_mapped", None) or a


def _read(path: str, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SecurityError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    return data.strip()


def warn_if_readable(path: str, flag: str) -> None:
    """Say on stderr when the credential file ``path`` (given as ``flag``), accepted, can be
    read by other users (group or others may read it): anyone on the machine who can read
    it can act as the controller or a client."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) and mode & 0o044:
        print(f"clockwork: warning: {flag} {path} can be read by other users (mode "
              f"{stat.S_IMODE(mode):o}): chmod 600 {shlex.quote(str(path))}", file=sys.stderr,
              flush=True)


MAX_TOKEN = 4096  # a token's characters at most: it goes in each call's metadata / header


def check_token(token: str, where: str) -> str:
    if not token:
        raise SecurityError(f"{where}: empty; a token needs at least {MIN_CREDENTIAL} "
                            "characters")
    if not _TOKEN_CHARS.fullmatch(token):
        raise SecurityError(f"{where}: a token is visible ASCII characters without spaces")
    if len(token) < MIN_CREDENTIAL:
        raise SecurityError(f"{where}: a token needs at least {MIN_CREDENTIAL} characters "
                            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    if len(token) > MAX_TOKEN:
        raise SecurityError(f"{where}: {len(token):,} characters; a token has at most "
                            f"{MAX_TOKEN:,} (it travels in every call's header, which gRPC "
                            "and HTTP servers cap at 8 KiB)")
    return token


def server_token(token: str | None, token_file: str | None,
                 warn: bool = True) -> str | None:
    """The controller's client token from ``--token`` or ``--token-file`` (None: off);
    ``warn``: say so if the file can be read by others (``clockwork serve`` checks it
    and leaves that to its controller, which reads it again)."""
    if token_file:
        token = check_token(_read(token_file, "--token-file").decode("latin-1"),
                            f"--token-file {token_file}")
        if warn:
            warn_if_readable(token_file, "--token-file")
        return token
    if token is not None:  # (an empty --token "" is refused, not read as no token)
        return check_token(token, "--token")
    return None


def client_token(token: str | None = None, token_file: str | None = None,
                 warn: bool = True) -> str | None:
    """A client's token: ``token``, else ``token_file``'s content, else
    ``$CLOCKWORK_TOKEN``; None (or "") sends none. Only its characters are checked (the
    server decides what is long enough); ``warn``: a file others can read is warned of,
    as the controller's is (``clockwork serve`` leaves that to its controller)."""
    if token is None and token_file:
        token = _read(token_file, "--token-file").decode("latin-1")
        if not token:  # (it sent none, and the server's refusal told of no file)
            raise SecurityError(f"--token-file {token_file}: empty")
        if warn:
            warn_if_readable(token_file, "--token-file")
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token is not None and not isinstance(token, str):  # (123, a bytes read from a file)
        raise SecurityError(f"token: a string, got {type(token).__name__}")
    if not token:
        return None
    if not _TOKEN_CHARS.fullmatch(token):
        raise SecurityError("token: visible ASCII characters without spaces, please")
    return token


def cluster_secret(secret_file: str | None, env=None) -> bytes | None:
    """The cluster secret from ``--cluster-secret-file``, else ``$CLOCKWORK_CLUSTER_SECRET``
    (None: off). Surrounding whitespace is not part of it."""
    env = os.environ if env is None else env
    if secret_file:
        data = _read(secret_file, "--cluster-secret-file")
        where = f"--cluster-secret-file {secret_file}"
    elif env.get(SECRET_ENV):
        data = env[SECRET_ENV].strip().encode()
        where = f"${SECRET_ENV}"
    else:
        return None
    if len(data) < MIN_CREDENTIAL:
        raise SecurityError(f"{where}: the cluster secret needs at least {MIN_CREDENTIAL} bytes "
                            "(e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    if secret_file:
        warn_if_readable(secret_file, "--cluster-secret-file")
    return data


def new_secret() -> str:
    """A fresh cluster secret (64 hex digits), as ``clockwork serve`` makes per cluster."""
    return secrets.token_hex(32)


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to a new file only its owner can read (0600). Whatever was at
    ``path`` is replaced, never written through: a symbolic link planted there (a
    folder others may write to) would have sent the text to its target."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # (whatever the umask)
        f.write(text)
    return path


def exposure_error(who: str, host: str, token: str | None, secret: bytes | None,
                   insecure: bool, workers: list[str] = ()) -> str | None:
    """The default rule: a listener off loopback needs a token (controller) or the cluster
    secret (worker), and a controller whose workers are off loopback needs the secret,
    unless ``--insecure-no-auth``. Returns the one-line refusal, or None."""
    if insecure:
        return None
    off = "--insecure-no-auth to run without authentication"
    if who == "controller":
        if token is None and not is_loopback(host):
            return (f"--host {host} is not a loopback address, so clients must authenticate: "
                    f"give --token-file FILE (or --token), or {off}")
        far = far_workers(workers)
        if secret is None and far:
            return (f"worker {far[0]} is not on a loopback address, so the link needs the "
                    f"cluster secret: give --cluster-secret-file FILE (or ${SECRET_ENV}), "
                    f"or {off}")
        return None
    if secret is None and not is_loopback(host):
        return (f"--host {host} is not a loopback address, so the controller must "
                f"authenticate: give --cluster-secret-file FILE (or ${SECRET_ENV}), or {off}")
    return None


# ---------------------------------------------------------------------- TLS


@dataclass
class TlsFiles:
    """A server's certificate chain and key (PEM files), and the CA its clients' certificates
    must chain to (None: no client certificates asked for)."""

    cert: str
    key: str
    ca: str | None = None

    @classmethod
    def from_flags(cls, cert: str | None, key: str | None, ca: str | None,
                   warn: bool = True) -> TlsFiles | None:
        """The files of ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` (None: no TLS),
        checked: ``SecurityError`` for files that cannot be used. ``warn``: a certificate
        that has expired, is not valid yet or ends soon is said on stderr."""
        if not cert and not key:
            if ca:
                raise SecurityError("--tls-ca (client certificates) needs --tls-cert and --tls-key")
            return None
        if not cert or not key:
            raise SecurityError("--tls-cert and --tls-key go together")
        files = cls(cert, key, ca or None)
        files.ssl_context()  # refuses a certificate, key or CA that cannot be used
        line = validity_warning(cert, key) if warn else None
        if line is not None:
            print(f"clockwork: warning: {line}", file=sys.stderr, flush=True)
        return files

    def ssl_context(self, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
        """A listener's context (TLS 1.2 or newer): the REST port's (``alpn``), or the
        worker's fast link's (no ALPN). With ``ca`` the peer must present a certificate
        it signed."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise SecurityError(f"--tls-cert {self.cert} / --tls-key {self.key}: cannot use "
                                f"them ({getattr(e, 'strerror', None) or e})") from None
        if self.ca:
            try:
                ctx.load_verify_locations(self.ca)
            except (OSError, ssl.SSLError) as e:
                raise SecurityError(f"--tls-ca {self.ca}: cannot use it "
                                    f"({getattr(e, 'strerror', None) or e})") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def grpc_credentials(self) -> grpc.ServerCredentials:
        ca = Path(self.ca).read_bytes() if self.ca else None
        return grpc.ssl_server_credentials(
            [(Path(self.key).read_bytes(), Path(self.cert).read_bytes())],
            root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(ca: str | bytes | None = None, cert: str | bytes | None = None,
                        key: str | bytes | None = None) -> grpc.ChannelCredentials:
    """TLS credentials for dialing a server: verified against ``ca`` (a PEM file, or PEM
    bytes or text; None: the system's roots), presenting ``cert``/``key`` if the server
    asks.
    ``SecurityError`` for one of ``cert`` and ``key`` without the other (gRPC's core
    aborted the process: a failed check, SIGABRT, nothing to catch)."""
    if (cert is None) != (key is None):
        raise SecurityError("tls_cert and tls_key go together: a client certificate needs "
                            "its private key (give both, or neither)")

    def pem(x, arg: str, marker: bytes, what: str):
        if x is None:
            return x
        # PEM text itself: one with a BEGIN line or more than one line (a bundle's comments
        # or "Bag Attributes" may come first), never echoed (a key's text is secret)
        text = isinstance(x, str) and ("-----BEGIN " in x or "\n" in x)
        shown = "" if isinstance(x, bytes) or text \
            else (str(x) if len(str(x)) <= 200 else str(x)[:200] + "...")
        if isinstance(x, bytes) or x == "":
            data = x or b""  # ("": given empty, as an unset variable read as "")
        elif text:
            data = x.encode()
        else:
            try:
                data = Path(x).read_bytes()
            except OSError as e:
                raise SecurityError(f"{arg}: {shown}: cannot read it ({e.strerror or e})"
                                    ) from None
        # (anything else -- empty, a token, a key given as the CA -- failed in gRPC's
        # handshake, said as a controller that could not be reached)
        if not any(marker in line for line in data.splitlines()
                   if line.startswith(b"-----BEGIN ")):
            where = f"{shown}: " if shown else ""
            raise SecurityError(f"{arg}: {where}not a PEM {what} (no '-----BEGIN "
                                f"...{marker.decode()}-----' line)")
        return data

    return grpc.ssl_channel_credentials(
        root_certificates=pem(ca, "tls_ca", b"CERTIFICATE", "certificate"),
        private_key=pem(key, "tls_key", b"PRIVATE KEY", "private key"),
        certificate_chain=pem(cert, "tls_cert", b"CERTIFICATE", "certificate"))


def client_ssl_context(ca: str | None, cert: str | None = None,
                       key: str | None = None) -> ssl.SSLContext:
    """A TLS context for dialing a server (TLS 1.2 or newer; its certificate verified
    against ``ca`` and the host name dialled), presenting ``cert``/``key`` if given: the
    controller's side of a worker's fast link, as ``channel_credentials`` is of its gRPC."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise SecurityError(f"TLS files {ca}, {cert}, {key}: cannot use them "
                            f"({getattr(e, 'strerror', None) or e})") from None
    return ctx


# ---------------------------------------------------------------------- client token


def one_bearer_ok(values: list, token: bytes) -> bool:
    """Whether a request's ``authorization`` values (its headers', its metadata's) are one,
    ``Bearer <token>``: several are refused, whichever holds the token (a proxy that adds
    its own beside the client's: the first one counted, so the order decided)."""
    return len(values) == 1 and bearer_ok(values[0], token)


def token_refused_how(values: list, what: str = "authorization values") -> str:
    """How a request whose ``authorization`` ``values`` ``one_bearer_ok`` refused went
    wrong, for the line that logs it: several ``what``, another token, or none."""
    return (f"several {what}" if len(values) > 1 else
            "a token that is not this controller's" if values else "no token")


def bearer_ok(value: str | bytes | None, token: bytes) -> bool:
    """Whether an ``authorization`` value is ``Bearer <token>`` (scheme in any case; the
    token compared in constant time)."""
    if not value:
        return False
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    scheme, _, given = value.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


class Refusals:
    """Counts refused calls and logs them, at most one line a second per process."""

    def __init__(self, who: str, count=None) -> None:
        self.who = who
        self.count = count  # count(key) -> None, e.g. the controller's Stats counters
        self._last = 0.0
        self._quiet = 0
        self._held = ""  # the last refusal not said yet (said once its second is over)
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, what: str, key: str = "auth_refused") -> None:
        self.counted(key)
        self.said(what)

    def counted(self, key: str = "auth_refused") -> None:
        """Count a refusal (at once, as it happens: ``said`` may come later, or not)."""
        if self.count is not None:
            self.count(key)

    def said(self, what: str) -> None:
        """Log a refusal (at most a line a second, with how many were not said). One that
        comes within a second of the last line is said when that second is over (on
        the running event loop: said only with a later refusal, it went unsaid when
        none followed), or with the next refusal."""
        now = time.monotonic()
        if now - self._last < 1.0:
            self._quiet += 1
            self._held = what
            if self._timer is None:
                with contextlib.suppress(RuntimeError):  # (no loop: with the next one)
                    self._timer = asyncio.get_running_loop().call_later(
                        self._last + 1.0 - now, self._say_held)
            return
        self._say(what, self._quiet, now)

    def _say(self, what: str, quiet: int, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        more = f" (and {quiet} more since the last line)" if quiet else ""
        self._last, self._quiet, self._held = now, 0, ""
        print(f"{self.who}: refused {what}{more}", file=sys.stderr, flush=True)

    def _say_held(self) -> None:
        """The refusals held in the last second, as the latest of them."""
        self._timer = None
        if self._quiet:
            self._say(self._held, self._quiet - 1, time.monotonic())


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every gRPC call without ``authorization: Bearer <token>`` with
    ``UNAUTHENTICATED`` before its handler runs (nothing is admitted or counted as a
    request), but those to ``open_methods`` (full method names: the health probes)."""

    MESSAGE = "authentication required: send the metadata 'authorization: Bearer <token>'"
    WRONG = ("authentication failed: the token sent is not this controller's (send its "
             "token as 'authorization: Bearer <token>')")

    def __init__(self, token: str, count=None, open_methods: frozenset = frozenset()) -> None:
        self._token = token.encode()
        self._refused = Refusals("controller", count)
        self._open = open_methods  # answered without the token (health probes)

    async def intercept_service(self, continuation, details):
        if details.method in self._open:
            return await continuation(details)
        sent = [v for k, v in details.invocation_metadata or () if k == AUTHORIZATION]
        if one_bearer_ok(sent, self._token):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None
        how = token_refused_how(sent)
        method = details.method
        self._refused.counted()  # (now: a caller that gives up at once is counted too)
        return _deny(handler, grpc.StatusCode.UNAUTHENTICATED,
                     self.WRONG if sent else self.MESSAGE, self._refused.said,
                     lambda peer: f"an unauthenticated call to {method} from {peer} ({how})")


# a refused call is refused this long after it came, its request never read: time for a
# small first write to arrive whole, so that grpc's asyncio client reports the refusal
REFUSE_AFTER_S = 0.1


def _deny(handler, code: grpc.StatusCode, message: str, refused, what):
    """A handler that only aborts, ``REFUSE_AFTER_S`` after the call came, without reading
    its request; ``refused`` is told ``what(the caller's address)`` (logged: an operator
    learns who knocks, and how: no token or a wrong one, which proof; the interceptor
    counted the refusal already). Not at once: grpc's asyncio client loses the refusal when it ends the
    call while the client's first write is still on its way (the write fails and the call
    reports INTERNAL "Internal error from Core" instead; grpc/grpc issue 36066); a small
    request has arrived by then (one larger than the stream's flow-control window cannot
    arrive unread, and its client may see INTERNAL). Not read: a request read before it
    is refused took its size in memory, and the memory stayed the process's (the
    controller read each refused call's first message: 36 refused calls of 40 MB left it
    1.1 GB larger, a worker parsed them: 20 calls of 60 MB, 2 GB; unread, under 100 MB).
    A unary method is answered as a stream (the same messages on the wire): as a unary
    handler, its request would be read, and a call that never sent its request waited for
    it without end, holding one of the ``grpc_max_calls`` for as long as its client
    liked."""

    async def abort_stream(requests, context):
        refused(what(context.peer()))
        await asyncio.sleep(REFUSE_AFTER_S)
        await context.abort(code, message)

    kw = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, **kw)
    return grpc.stream_unary_rpc_method_handler(abort_stream, **kw)


def refuse(handler, code: grpc.StatusCode, message: str):
    """A handler that only aborts with ``code`` and ``message``, as ``_deny``'s do (after
    ``REFUSE_AFTER_S``, its request never read), logging nothing."""
    return _deny(handler, code, message, lambda what: None, lambda peer: "")


class ClusterProofInterceptor(grpc.aio.ServerInterceptor):
    """A worker's first look at a call, before its request is read: a call without a
    controller's proof that checks (``ClusterAuth.proof_checks``) is refused
    ``UNAUTHENTICATED`` (``_deny``: its request is never read), so a peer without the
    secret cannot make the worker read and hold messages up to its receive limit. The handler checks the call whole (nonce, time,
    address: ``ClusterAuth.check_controller``) and answers with the worker's proof."""

    def __init__(self, auth: ClusterAuth, refused) -> None:
        self._auth = auth
        self._refused = refused  # a Refusals: counted at once, said from the handler

    async def intercept_service(self, continuation, details):
        why = self._auth.proof_checks(details.method, details.invocation_metadata)
        handler = await continuation(details)
        if why is None or handler is None:
            return handler
        method = details.method.rpartition("/")[2]
        self._refused.counted()
        return _deny(handler, grpc.StatusCode.UNAUTHENTICATED, "cluster authentication failed",
                     self._refused.said, lambda peer: f"{method} from {peer}: {why}")


# ---------------------------------------------------------------------- cluster secret


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\n".join(parts).encode(), hashlib.sha256).hexdigest()


class ClusterAuth:
    """Both ends of the controller-worker handshake under one shared secret."""

    def __init__(self, secret: bytes, clock=time.time) -> None:
        self._key = bytes(secret)
        self._clock = clock
        # nonces accepted, oldest first -> (when they may be forgotten, their time T in ms);
        # a call stamped no later than a forgotten nonce's T is refused (``_floor``), so
        # forgetting one never lets it be replayed
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._floor = -1

    # the controller's side

    def call_metadata(self, method: str, target: str
                      ) -> tuple[tuple[tuple[str, str], ...], str]:
        """(metadata for a call to ``method`` on the worker at ``target``, the address
        dialled, its nonce): prove we know the secret, to that worker only."""
        nonce = secrets.token_hex(16)
        t = str(int(self._clock() * 1000))
        proof = _mac(self._key, "clockwork-v2 controller", method, target, t, nonce)
        return ((NONCE_KEY, nonce), (TIME_KEY, t), (TARGET_KEY, target),
                (PROOF_KEY, proof)), nonce

    def worker_proved(self, method: str, nonce: str, metadata, target: str) -> bool:
        """Whether the worker's initial metadata proves the secret for this call."""
        want = _mac(self._key, "clockwork-v2 worker", method, target, nonce).encode()
        for key, value in metadata or ():
            if key == WORKER_PROOF_KEY:
                v = value.encode("latin-1", "replace") if isinstance(value, str) else value
                return hmac.compare_digest(v, want)
        return False

    # the worker's side

    def proof_checks(self, method: str, metadata) -> str | None:
        """Why the controller's proof in ``metadata`` is no good for a call to ``method``
        (no credentials, malformed, or an HMAC that does not match), or None: made with
        the secret. Its nonce is not taken (``check_controller`` does that)."""
        return self._proof(method, metadata)[0]

    def _proof(self, method: str, metadata) -> tuple[str | None, str, str, str]:
        """(``proof_checks``'s answer, the call's nonce, time and target)."""
        md = {k: v for k, v in metadata or () if isinstance(v, str)}
        nonce, t, proof = md.get(NONCE_KEY, ""), md.get(TIME_KEY, ""), md.get(PROOF_KEY, "")
        target = md.get(TARGET_KEY, "")
        if not (nonce or t or proof):
            return "no cluster credentials", nonce, t, target
        if not _NONCE.fullmatch(nonce) or not t.isdigit() or len(target) > 300:
            return "malformed cluster credentials", nonce, t, target
        want = _mac(self._key, "clockwork-v2 controller", method, target, t, nonce)
        if not hmac.compare_digest(proof.encode("latin-1", "replace"), want.encode()):
            if not target:  # (made before proofs named the worker: an older controller)
                return ("wrong cluster credentials, or those of an older clockwork-py (they "
                        "name no worker address: run the same version on the controller and "
                        "its workers)"), nonce, t, target
            return "wrong cluster credentials", nonce, t, target
        return None, nonce, t, target

    def check_controller(self, method: str, metadata, is_me=None
                         ) -> tuple[str | None, str, str]:
        """(why the call is refused or None, its nonce, the target it was made for). An
        accepted nonce is remembered, so the same metadata is refused the second time.
        ``is_me(target)``: whether the address the proof was made for is this worker's
        (a proof the controller made for another address, relayed here by whoever it
        dialled there, is refused)."""
        why, nonce, t, target = self._proof(method, metadata)
        if why is not None:
            return why, "", ""
        if is_me is not None and not is_me(target):
            return (f"cluster credentials made for another worker ({target!r}: not an "
                    "address this worker listens on -- relayed? If the controller reaches "
                    f"this worker as {target} through a NAT or a port mapping, start it "
                    f"with --advertise {target}; a name must resolve only to addresses the "
                    "worker listens on)", "", "")
        now = self._clock()
        ts = int(t)
        if abs(now - ts / 1000) > FRESH_S:
            return (f"stale cluster credentials (the clocks differ by more than "
                    f"{FRESH_S:.0f} s?)"), "", ""
        seen = self._seen
        while seen:  # forget the expired (and, past MAX_NONCES, the oldest): O(1) a call
            first = next(iter(seen.values()))
            if first[0] > now and len(seen) < MAX_NONCES:
                break
            seen.popitem(last=False)
            self._floor = max(self._floor, first[1])
        if nonce in seen or ts <= self._floor:
            return "replayed cluster credentials", "", ""
        seen[nonce] = (now + 3 * FRESH_S, ts)  # by then ts is older than any fresh call
        return None, nonce, target

    def worker_metadata(self, method: str, nonce: str, target: str
                        ) -> tuple[tuple[str, str], ...]:
        """The worker's proof for an accepted call (its response's initial metadata)."""
        return ((WORKER_PROOF_KEY,
                 _mac(self._key, "clockwork-v2 worker", method, target, nonce)),)


_LOCAL_HOSTS: OrderedDict[str, bool] = OrderedDict()  # host -> local?, the most recent


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) names this machine: one of the addresses
    it resolves to can be bound here. Remembered for the 256 most recent names."""
    got = _LOCAL_HOSTS.get(host)
    if got is None:
        got = False
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            infos = []
        for family, _, _, _, sa in infos:
            try:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.bind((sa[0], 0))
                got = True
                break
            except OSError:
                continue
        _LOCAL_HOSTS[host] = got
        while len(_LOCAL_HOSTS) > 256:
            _LOCAL_HOSTS.popitem(last=False)
    return got


def peer_is_local(peer: str) -> bool:
    """Whether a gRPC peer (``context.peer()``: ``ipv4:A:P``, ``ipv6:[A]:P`` -- its
    brackets percent-encoded by some gRPC versions -- or ``unix:PATH``) is on this
    machine's loopback."""
    kind, _, rest = unquote(peer).partition(":")
    if kind in ("unix", "unix-abstract"):
        return True
    host = rest.rpartition(":")[0].strip("[]")
    try:
        return _unmapped(host).is_loopback
    except ValueError:
        return False


def _any_machine(host: str) -> bool:
    """A host every machine has: a loopback or wildcard address in any spelling -- an
    IPv4 address mapped into IPv6 (``::ffff:127.0.0.1``), a short form (``127.1``, ``0``,
    ``0x0``) -- or a name every address of which is a loopback one (``localhost``).
    (Only the plain spellings counted: a proof made for ``[::ffff:127.0.0.1]:P`` was taken
    from any machine.) A name that also resolves to another address (a host name that
    /etc/hosts maps to 127.0.1.1 as well) names this machine alone."""
    try:  # (an address, as the system reads one: inet_aton's short forms too)
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP,
                                   flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):  # a name
        return is_loopback(host)
    a = _unmapped(infos[0][4][0])
    return a.is_loopback or a.is_unspecified


_ADDRESSES: OrderedDict[str, frozenset] = OrderedDict()  # host -> its addresses, the most recent


def _addresses(host: str) -> frozenset:
    """Every address ``host`` (a name or an address) resolves to, IPv4 ones mapped into
    IPv6 as themselves; empty if it does not resolve. Remembered for the 256 most recent."""
    got = _ADDRESSES.get(host)
    if got is None:
        try:
            infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            infos = []
        out = set()
        for info in infos:
            try:
                out.add(_unmapped(info[4][0]))
            except ValueError:
                continue
        got = _ADDRESSES[host] = frozenset(out)
        while len(_ADDRESSES) > 256:
            _ADDRESSES.popitem(last=False)
    return got


def listener_covers(bound: str, host: str) -> bool:
    """Whether a connection to ``host`` (every address it resolves to) reaches a listener
    bound to ``bound`` on the same port: ``bound`` is a wildcard address (gRPC listens on
    every address of the machine then), or ``host``'s addresses are all among
    ``bound``'s. Another process may listen on the same port at an address the listener
    did not take (``[::1]:P`` beside ``127.0.0.1:P``). A connection to a wildcard
    address goes to the loopback one of its family (``0.0.0.0:P`` reaches
    ``127.0.0.1:P``, ``[::]:P`` reaches ``[::1]:P``)."""
    have = _addresses(bound)
    if any(a.is_unspecified for a in have):
        return True
    want = {_LOOPBACK[a.version] if a.is_unspecified else a for a in _addresses(host)}
    return bool(want) and want <= have


_LOOPBACK = {4: ipaddress.ip_address("127.0.0.1"), 6: ipaddress.ip_address("::1")}


def answers_to(target: str, port: int, peer: str, advertised: tuple[str, ...] = (),
               bound: str | None = None) -> bool:
    """Whether a worker listening on ``port`` of this machine (at ``bound``, the host it
    was told to listen on, if given), or reached as one of ``advertised``
    (``--advertise``: an address behind a NAT or port mapping), is the worker at
    ``target``. ``target`` must reach this listener: with ``bound`` not a wildcard,
    every address ``target`` resolves to must be one of ``bound``'s (another process
    may listen on the same port at another address of this machine and relay the proof
    made for it here). A loopback or wildcard ``target`` names a worker on the
    controller's own machine, which every machine could claim to be: it is this worker
    only for a caller (``peer``, the gRPC peer) on this machine's loopback -- a proof
    made for 127.0.0.1:P and relayed here from another machine is refused."""
    if target in advertised:
        return True
    host = host_of(target)
    if not host or target.rpartition(":")[2] != str(port) or not is_local_host(host):
        return False
    if bound is not None and not listener_covers(bound, host):
        return False
    return not _any_machine(host) or peer_is_local(peer)

