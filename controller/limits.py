"""The controller's bounds, in one place: how much a client (or all of them) may have
outstanding, how a large stream message is admitted, how big reply messages and reply
buffers may grow, what the gRPC and REST servers accept.

``Limits`` is the schema (``clockwork controller --limit KEY=VALUE``; each field's
description documents it and ``docs/settings.md`` is rendered from it); the code that
enforces each bound reads it from here: ``controller/intake.py`` (outstanding requests,
admission in slices, reply messages and the slow-reader caps, per stream and in all),
``controller/service.py`` and ``controller/grpc_api.py`` (the gRPC server's receive limit,
streams per connection and calls in all) and ``controller/kserve_rest.py`` (the REST server,
aiohttp's, configured from here in ``make_runner``).

Why each exists, in short: a request takes controller memory and scheduler time until it
is answered; a reply takes memory until the client reads it; a gRPC message and a REST
body are held whole in memory; and a single event loop serves every client and worker,
so no one message may keep it busy for long.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic.dataclasses import dataclass

from clockwork.settings import CONFIG, from_table, setting
from clockwork.sizes import INT32_MAX, MAX_MESSAGE_BYTES

MiB = 1 << 20
S = 1_000_000_000  # ns per second
# calls that came and wait for the controller to take them up, kept by gRPC's server at
# the least (``Limits.grpc_max_pending``): past them it ends calls CANCELLED, unrefused
PENDING_MIN = 4096


@dataclass(frozen=True, slots=True, config=CONFIG)
class Limits:
    """A frozen pydantic dataclass (its fields are read per request). Build it from a
    table with ``Limits.from_table({"stream_outstanding": 1000, "rest_idle_timeout_s":
    10})``; time settings are int ns inside."""

    settings_name: ClassVar[str] = "limits"

    stream_outstanding: int = setting(
        50_000, "Requests of one `InferStream` call admitted and not yet answered. A request "
        "beyond it is answered at once with status `ERROR`, reason `overloaded` (the "
        "Python client raises `Overloaded`), never queued.", ge=1)
    connection_outstanding: int = setting(
        100_000, "The same bound over everything one client connection (one gRPC peer "
        "address: its streams and its unary calls; one REST connection) has outstanding.",
        ge=1)
    global_outstanding: int = setting(
        200_000, "The same bound over the whole controller, every front end together.",
        ge=1)
    global_outstanding_bytes: int = setting(
        1024 * MiB, "The input tensors' bytes of the requests admitted and not yet "
        "answered, every front end together (the controller holds about three times this "
        "in memory): a request that would take them past it is answered `overloaded` as "
        "above, unless none is outstanding (one larger request alone still runs). The "
        "request counts alone let 300 streams of ResNet-size requests take the controller "
        "to 5.7 GB. The REST request bodies being read, every connection together, are "
        "bounded by it too: a body that would take them past it (unless it is the only "
        "one) is answered 503 with Retry-After, the rest of it not read.", ge=MiB)
    admit_slice: int = setting(
        100, "A stream message with more requests than this is admitted in slices of "
        "this many: each slice arrives at its own time (the wait counts against its SLO) "
        "and goes to the scheduler (so its actions start), then the event loop serves "
        "everyone else before the next slice (a slice of 100 holds it 1-2 ms). Under a "
        "200,000-request message on two cores, other clients' worst latency was 0.4-0.75 "
        "s with 100 per slice, 0.4-1.04 s with 1,000, and calls ran into their deadlines "
        "(the loop held ~3 s) with no slicing.", ge=1)
    reply_message_bytes: int = setting(
        1 * MiB, "An `InferStream` reply message carries replies up to this many bytes "
        "(one larger reply goes alone): well under the 4 MiB gRPC clients accept by "
        "default.", ge=1024)
    stream_reply_buffer_bytes: int = setting(
        64 * MiB, "Replies of one stream (`InferStream`, `ModelStreamInfer`) waiting for the "
        "client to read them, each counted as its size plus 1 KiB (what holding it in "
        "memory costs besides). A stream whose client does not read and falls this far "
        "behind is ended with `RESOURCE_EXHAUSTED` (the status follows the messages "
        "already in flight): the controller stops reading it, frees the waiting replies, "
        "withdraws its requests still queued and drops the replies still to come (each "
        "request is still answered once inside, counted `replies_discarded`).", ge=1024)
    replies_buffer_bytes: int = setting(
        1024 * MiB, "Replies of all streams together waiting for their clients to read "
        "them, counted as in `stream_reply_buffer_bytes`. Past it, the streams whose "
        "replies have not moved for longest (none sent) are ended as slow readers until the "
        "rest are back under it: many clients that do not read cannot together hold more "
        "than this, and one that reads is not cut for what it is sent at once.", ge=1024)
    # (the gRPC sizes are C ints in gRPC's options, INT32_MAX at most: a larger value ended
    # the controller's start in a traceback)
    grpc_max_receive_bytes: int = setting(
        MAX_MESSAGE_BYTES, "Largest gRPC message the controller accepts from a client (a stream "
        "message of many requests counts whole); at least 4 MiB, the messages the Python "
        "client's stream packs requests into (less ended such a stream whole); at most 2 GiB - 1 "
        "(gRPC's own bound).", ge=4 * MiB, le=INT32_MAX)
    grpc_max_streams_per_connection: int = setting(
        4_096, "gRPC calls (streams and unary calls: a unary inference request is one) one "
        "client connection may have open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS): "
        "a client's further calls wait in the client until one ends.", ge=1, le=INT32_MAX)
    grpc_max_calls: int = setting(
        20_000, "gRPC calls open at once over every client connection, on each gRPC port (the "
        "controller port and the KServe port are servers of their own: calls held on one "
        "take no room on the other); a call beyond it is refused at once with `RESOURCE_EXHAUSTED` (the Python client: `Overloaded` for "
        "an inference). An open stream costs the controller ~30 KB besides what it carries, "
        "and it may be left open, idle, for as long as its client answers keepalive pings. "
        "(Unary requests are bounded by this before `connection_outstanding` and "
        "`global_outstanding`, which bound streams' requests.) Calls that arrive faster "
        "than the controller takes them up wait for it, up to four times this many and 4,096 "
        "at least (gRPC's own default cancelled some past 1,000 waiting; at this many, a "
        "burst past the limit ended CANCELLED, not refused).", ge=1, le=INT32_MAX // 4)
    rest_max_body_bytes: int = setting(
        64 * MiB, "Largest REST request body, counted after decoding a `gzip` or `deflate` "
        "body (decoded in slices as it is read: a compression bomb is refused at this "
        "size, not held). Larger is answered 413: at once when the body's length is "
        "announced (with `Expect: 100-continue`, before the client sends it), else as "
        "soon as the limit is passed.", ge=1024)
    rest_max_header_bytes: int = setting(
        16 * 1024, "Longest REST request target (the path and query), longest header "
        "name and longest header value, each; longer is answered 400. (A value too large "
        "for the HTTP parser, 2^64 and beyond, made it reset every REST connection.)",
        ge=1024, le=INT32_MAX)
    rest_max_headers: int = setting(
        100, "Most headers in a REST request; more is answered 400.", ge=1, le=INT32_MAX)
    rest_max_head_bytes: int = setting(
        64 * 1024, "Largest REST request head in all: the request line and every header "
        "(names and values, each with its line's 4 bytes of separators; the whitespace "
        "around values not counted). More is answered 400; a head still arriving is "
        "refused as soon as more than this has come of it, before the rest is read (after "
        "a request with a body, counted from the read after the one that ended the body: "
        "such a head holds at most this plus one read, 256 KiB). (The bounds per line "
        "and on the count alone let one unfinished head hold ~1.6 MB, and ~3 MB of the "
        "controller's memory, for `rest_idle_timeout_s`, on every connection, with no "
        "token needed.)",
        ge=1024, le=INT32_MAX)
    rest_idle_timeout: int = setting(
        60 * S, "A REST connection that does not send a whole request head for this long "
        "(from its start, or from the end of its last answer) is closed; so is one that "
        "has not finished its TLS handshake by then.",
        units=("s",), gt=0)
    rest_read_timeout: int = setting(
        30 * S, "A REST request whose body takes longer than this to arrive (from the end "
        "of its head) is answered 408 and its connection closed.", units=("s",), gt=0)
    rest_linger_timeout: int = setting(
        2 * S, "After answering a REST request without reading all of its body (401, 413, a "
        "probe with a body), "
        "what the client still sends is read and dropped for up to this long, so that "
        "it sees the answer; then the connection closes.", units=("s",), ge=0)
    rest_json_offload_bytes: int = setting(
        1 * MiB, "A REST request whose JSON part is larger than this is decoded off the "
        "event loop: an inference request's in a decoding process (rest_json_processes), "
        "any other on a worker thread.", ge=0)
    rest_json_processes: int = setting(
        2, "Processes that decode large REST inference bodies (over "
        "rest_json_offload_bytes) beside the controller, started when first needed: "
        "reading JSON tensors holds Python's lock for as long as it takes (~250 ms for 16 "
        "ResNet-size images), which on a thread would hold up every other request. 0: "
        "decode them on a worker thread of the controller.", ge=0, le=64)

    @classmethod
    def from_table(cls, table: dict[str, Any] | None = None, where: str = "") -> Limits:
        """From ``{"key": value}`` (time settings under their unit keys, e.g.
        ``rest_idle_timeout_s``); a bad key or value raises ``SettingsError`` with one
        line."""
        return from_table(cls, table, where=where)

    def grpc_server_options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", self.grpc_max_receive_bytes),
                ("grpc.max_concurrent_streams", self.grpc_max_streams_per_connection),
                # calls that came and wait to be taken up: past the soft limit gRPC drops
                # some at random, past the hard one all, CANCELLED -- never reaching the
                # controller, whose refusal past grpc_max_calls (RESOURCE_EXHAUSTED) says
                # what happened: room for four times as many, and ``PENDING_MIN`` at least (at
                # the limit, a burst of 400 at grpc_max_calls=100 ended 262 calls CANCELLED;
                # at four times it, a burst of 200 at grpc_max_calls=10 ended 152 so, which
                # the Python client could only take for the controller stopping)
                ("grpc.server.max_pending_requests", self.grpc_max_pending),
                ("grpc.server.max_pending_requests_hard_limit", self.grpc_max_pending)]

    @property
    def grpc_max_pending(self) -> int:
        """Calls that came and that gRPC's server keeps waiting to be taken up."""
        return max(4 * self.grpc_max_calls, PENDING_MIN)


def limits_from_flags(items: list[str]) -> Limits:
    """``clockwork controller --limit KEY=VALUE`` (repeatable) as ``Limits``: values are
    read as TOML would (``--limit stream_outstanding=1000``, ``--limit
    rest_idle_timeout_s=5.5``); a malformed item, an unknown key or a bad value raises
    ``SettingsError`` with one line."""
    from clockwork.scenario import ScenarioError, parse_value
    from clockwork.settings import SettingsError

    table: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise SettingsError(f"--limit wants KEY=VALUE, got {item!r}")
        try:
            table[key.strip()] = parse_value(text.strip())
        except ScenarioError as e:
            raise SettingsError(f"--limit {key.strip()}: {e}") from None
    return Limits.from_table(table, where="--limit")
