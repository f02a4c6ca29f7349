"""How client requests come into the controller and replies go out, within the bounds of
``controller.limits.Limits``.

- :class:`Gate` counts the requests admitted and not yet answered, in all and per client
  connection; a request over a bound is answered at once with status ``ERROR``, reason
  ``overloaded`` (never queued).
- :func:`submit_guarded` hands requests to ``ControllerNode.submit_many`` so that each is
  answered exactly once even if admitting them raises: a request it could not admit is
  answered ``ERROR`` and the exception is logged, never passed to the caller's task.
- :func:`serve_stream` is ``InferStream``: a message's requests are admitted in slices
  of ``admit_slice`` (each slice at its own arrival time, the event loop free between
  slices; as the message's own delay beyond the stream's fastest, the time a slice
  waited counts against its SLOs: ``late`` of ``ControllerNode.submit_many``),
  over-limit requests are answered ``overloaded``, replies go back in messages
  of at most ``reply_message_bytes``, and a client that does not read its replies gets
  at most ``stream_reply_buffer_bytes`` of them buffered: beyond that its stream is
  ended with ``RESOURCE_EXHAUSTED`` and its buffered and later replies are dropped (the
  requests are still answered exactly once inside, counted ``replies_discarded``).
  A message's ``client_time_ns`` is used only when it can be a reading of the clock the
  stream's other messages read (:class:`ClientClock`). Replies are paced (one message
  per ``reply_interval_us`` on a busy stream), but a successful one still in time is
  not held past one interval before its request's SLO ends (:func:`reply_dues`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Sequence

import grpc

from clockwork.actions import RequestStatus
from clockwork.errors import STOPPING_MESSAGE
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol.decode import Malformed
from clockwork.protocol.pacing import Pacer, doze
from clockwork.protocol.ratelog import LogLimiter
from clockwork.sizes import STREAM_DEFAULT_SLO_KEY, STREAM_LIMIT_KEY
from clockwork.time import MAX_SLO_MS

# one line a second of each kind, per process (a misbehaving client must not flood the log)
_ADMIT_LOG = LogLimiter("controller")
_SLOW_LOG = LogLimiter("controller")
_FAILED_LOG = LogLimiter("controller")
_CLOCK_LOG = LogLimiter("controller")

now_ns = time.monotonic_ns
OVERLOADED = "overloaded"
_FRAME = 6  # bytes a reply adds to its message besides its own size (tag and length)
# what a reply waiting to be sent costs in memory besides its encoded size: the Python
# object holding it (600-900 bytes measured for a small one). A stream's waiting replies
# are counted with it against ``stream_reply_buffer_bytes``: counted by their encoded
# size alone, a client that read nothing held 10-30 times that bound
REPLY_OBJECT_BYTES = 1024
# a client_time_ns is nanoseconds of a clock: positive and below 2^62 (146 years, beyond any
# clock counted from a machine's boot or from 1970 until the year 2116) ...
CLIENT_CLOCK_MAX_NS = 1 << 62
# ... and the offset it implies (receipt - client_time_ns) is taken within this of the
# stream's smallest so far, either way; a message is charged at most this much
CLIENT_CLOCK_WINDOW_NS = 60 * 1_000_000_000
# this many messages in a row whose offsets lie past the window and within
# CLIENT_CLOCK_STEP_NS of the first of them, arriving over CLIENT_CLOCK_STEP_SPAN_NS at
# least: the client's clock stepped, and the stream's offset is theirs from then on (an
# honest stream recovers from a clock step or a lying first stamp). A backlog held up
# behind a stall arrives bunched, its offsets falling as fast as it is read: no step
CLIENT_CLOCK_STEP_RUN = 3
CLIENT_CLOCK_STEP_NS = 1_000_000_000
CLIENT_CLOCK_STEP_SPAN_NS = 2_000_000_000
# a message charged at least this much within the window is said (``ClientClock.note``):
# held up that long, or its client's clock stepped back (each later message is charged the
# step, and a stream with SLOs under it times out whole)
CLIENT_CLOCK_NOTE_NS = 1_000_000_000
# a stream's earlier messages found at least this much later than they were charged, in
# all (a message whose offset is the smallest yet: ``ClientClock.shifted``), move their
# requests still waiting that much earlier (``Admitted.arrived_earlier``); smaller steps,
# the network's jitter, wait until they add up to it
CLIENT_CLOCK_SHIFT_NS = 1_000_000


class Gate:
    """Requests admitted and not yet answered: in all, and per client connection (a gRPC
    peer address, a REST connection). ``room`` says how many more may come in; ``over``
    whether their input bytes may grow by so many (``take`` and ``give`` count them).
    And the replies waiting for streams' clients to read them (``hold``, ``release``):
    per stream and in all."""

    __slots__ = ("node", "total", "conns", "bytes", "replies", "holders")

    def __init__(self, node) -> None:
        self.node = node  # reads node.limits (set after construction by the command)
        self.total = 0
        self.conns: dict[str, int] = {}
        self.bytes = 0  # input bytes of the requests admitted and not yet answered
        self.replies = 0  # bytes of the replies waiting in all streams (``hold``)
        self.holders: dict = {}  # the streams with replies waiting (a set, in order)

    def hold(self, st, n: int) -> str:
        """``n`` more bytes of replies (as ``REPLY_OBJECT_BYTES`` counts them) wait in
        stream ``st`` (``st.buffered`` counts its own; ``st.moved``, when it last sent
        some or began to hold them; ``st.cut(why)`` ends it as a slow reader): why ``st``
        must be ended so, or "". Past ``stream_reply_buffer_bytes`` of its own; or, with
        the replies of all streams past ``replies_buffer_bytes``, the streams whose
        replies have not moved for longest are ended until the rest are under it (``st``
        among them, said by the answer): a client that does not read holds its stream's
        writer up, and one that reads, however much it is sent at once, moves."""
        if not st.buffered:
            self.holders[st] = None
            st.moved = now_ns()
        held = st.buffered = st.buffered + n
        self.replies += n
        lim = self.node.limits
        if held > lim.stream_reply_buffer_bytes:
            return (f"the client is not reading its replies: {held} bytes waiting (limit "
                    f"stream_reply_buffer_bytes {lim.stream_reply_buffer_bytes})")
        cap = lim.replies_buffer_bytes
        while self.replies > cap:  # (rare: a walk over the streams holding replies)
            still = min(self.holders, key=lambda s: s.moved)
            why = (f"the client is not reading its replies: {still.buffered} bytes waiting, "
                   f"none sent for {(now_ns() - still.moved) / 1e6:.0f} ms, with "
                   f"{self.replies} bytes of all streams' replies waiting (limit "
                   f"replies_buffer_bytes {cap})")
            if still is st:
                return why
            still.cut(why)  # (its replies released: out of holders)
        return ""

    def release(self, st, n: int) -> None:
        """``n`` bytes of stream ``st``'s replies were sent, or dropped."""
        if n:
            st.moved = now_ns()
            st.buffered -= n
            self.replies -= n
            if not st.buffered:
                del self.holders[st]

    def over(self, nbytes: int, more: int = 0) -> str:
        """Why requests of ``nbytes`` input bytes may not come in now, with ``more``
        admitted already in this go ("" if they may: within global_outstanding_bytes,
        or nothing outstanding)."""
        held = self.bytes + more
        limit = self.node.limits.global_outstanding_bytes
        if not nbytes or not held or held + nbytes <= limit:
            return ""
        return (f"{held:,} bytes of requests outstanding in the controller (limit "
                f"global_outstanding_bytes {limit:,})")

    def take(self, nbytes: int) -> None:
        self.bytes += nbytes

    def give(self, nbytes: int) -> None:
        self.bytes -= nbytes

    def room(self, conn: str) -> tuple[int, str]:
        """How many more requests ``conn`` may have admitted now, and which bound says
        so (for the overloaded answer)."""
        lim = self.node.limits
        g = lim.global_outstanding - self.total
        c = lim.connection_outstanding - self.conns.get(conn, 0)
        if g <= c:
            return g, f"{lim.global_outstanding} requests outstanding in the controller " \
                      "(limit global_outstanding)"
        return c, f"{lim.connection_outstanding} requests outstanding on this connection " \
                  "(limit connection_outstanding)"

    def enter(self, conn: str, n: int = 1) -> None:
        self.total += n
        self.conns[conn] = self.conns.get(conn, 0) + n

    def leave(self, conn: str, n: int = 1) -> None:
        self.total -= n
        left = self.conns.get(conn, 0) - n
        if left > 0:
            self.conns[conn] = left
        else:
            self.conns.pop(conn, None)


# at the controller's stop, a stream's writer still held up this long after (a client
# that does not read: its window full) is given up, and the stream ends UNAVAILABLE
# within the gRPC server's stop grace (1 s) instead of being cancelled by it
STOP_WRITE_S = 0.5
TOKEN_BIT = 1 << 63  # set in the client id of a stream's request with inputs while inside
# (and of one whose client id has this bit set: see serve_stream's admit)


def input_bytes(req: pb.InferRequest) -> int:
    """The bytes of a clockwork.v1 request's input tensors (0: none)."""
    return sum(len(t.data) for t in req.inputs) if req.inputs else 0


def overloaded(node, req, why: str) -> pb.InferResponse:
    """The answer to a request turned away by a bound (counted)."""
    node.count("requests")
    node.count("requests_overloaded")
    node.metrics.reply(req.model if req.model in node.profiles else "", OVERLOADED, None)
    node.log_refused(req.model, req.slo_ms, RequestStatus.ERROR)
    return pb.InferResponse(status=RequestStatus.ERROR, reason=OVERLOADED,
                            message=f"overloaded: {why}", client_id=req.client_id, gpu=-1)


def submit_guarded(node, reqs: Sequence, deliver, *args) -> None:
    """``node.submit_many(reqs, deliver, *args)``; if it raises, every request of ``reqs`` it did
    not answer or hand to the scheduler is answered ``ERROR`` now (each exactly once:
    a later answer of one already handed over is a counted duplicate), and the exception
    is logged and counted (``admit_errors``) instead of reaching the caller."""
    start = node.next_id
    state = [0, False]  # requests taken from reqs, all taken

    def feed():
        for r in reqs:
            state[0] += 1
            yield r
        state[1] = True

    try:
        node.submit_many(feed(), deliver, *args)
    except Exception as e:  # noqa: BLE001 - isolate: this request or a bug, not the caller
        _admit_failed(node, reqs, deliver, start, state, e)


def _admit_failed(node, reqs, deliver, start: int, state: list, e: Exception) -> None:
    node.count("admit_errors")
    _ADMIT_LOG(f"admitting {len(reqs)} request(s) failed: {e!r}; answering them ERROR", e)
    msg = f"the controller could not admit this request: {e!r}"
    pending = node.pending
    swept = set()
    for rid in range(start, node.next_id):  # admitted, maybe not scheduled: answer now
        r = pending.pop(rid, None)
        if r is not None:
            swept.add(rid)
            node.count("requests_error")
            node.metrics.reply(r.model, "error", None)
            r.tag(pb.InferResponse(status=RequestStatus.ERROR, message=msg, gpu=-1))
    taken, all_taken = state
    if all_taken:
        return  # every request was admitted (or answered) before the scheduler raised
    reqs = list(reqs)
    for i in range(max(0, taken - 1), len(reqs)):  # the one that raised, those not reached
        if i == taken - 1:
            if start + i in swept:
                continue
        else:
            node.count("requests")  # never reached: not counted yet
        node.count("requests_error")
        model = reqs[i].model
        node.metrics.reply(model if model in node.profiles else "", "error", None)
        deliver(pb.InferResponse(status=RequestStatus.ERROR, message=msg,
                                 client_id=reqs[i].client_id, gpu=-1))


class Admitted:
    """The request ids a stream admitted, kept while any of them may still be waiting:
    what it withdraws when the call ends before they are answered (the client cancelled
    or went away, or did not read its replies; ``ControllerNode.withdraw``), and what it
    moves earlier when its clock finds them later than they were charged
    (``arrived_earlier``)."""

    __slots__ = ("spans", "keep", "applied")

    def __init__(self) -> None:
        # (first id, end, the stream's ClientClock.shifted they are charged as of, how
        # much more they may be charged: the window less what they were) of each admission
        self.spans: list[tuple[int, int, int, int]] = []
        self.keep = 64  # spans held before those all answered are dropped
        self.applied = 0  # the ClientClock.shifted every span is charged as of

    def add(self, node, first: int, shifted: int = 0, late: int = 0) -> None:
        """The ids from ``first`` to the node's next were just taken by this stream, as
        of its clock's ``shifted``, charged ``late``."""
        if node.next_id > first:
            self.spans.append((first, node.next_id, shifted,
                               max(0, CLIENT_CLOCK_WINDOW_NS - late)))
        if len(self.spans) > self.keep:
            pending = node.pending
            self.spans = [s for s in self.spans if any(i in pending for i in range(s[0], s[1]))]
            self.keep = 2 * len(self.spans) + 64

    def arrived_earlier(self, node, shifted: int) -> None:
        """The stream's clock (``ClientClock.shifted``, now ``shifted``) found its earlier
        messages later than they were charged: each admission's requests still waiting
        were sent ``shifted`` - its own ``shifted`` earlier than they were admitted as
        (``ControllerNode.arrived_earlier``), all told at most ``CLIENT_CLOCK_WINDOW_NS``
        with what they were charged on admission (a client's stamps charge its requests
        at most the window, whatever they say)."""
        by: dict[int, list[range]] = {}
        spans = []
        for first, end, base, room in self.spans:
            d = min(shifted - base, room)
            if d > 0:
                by.setdefault(d, []).append(range(first, end))
                room -= d
            spans.append((first, end, shifted, room))
        self.spans = spans
        self.applied = shifted
        for d, ranges in by.items():
            node.arrived_earlier(itertools.chain.from_iterable(ranges), d)

    def withdraw(self, node) -> None:
        spans, self.spans = self.spans, []
        node.withdraw(itertools.chain.from_iterable(range(s[0], s[1]) for s in spans))


def submit_unary(node, req, deliver, conn: str, budget: int | None = None) -> None:
    """One request of a unary call (``Infer``, KServe): through the gate, then
    :func:`submit_guarded`; ``deliver`` is called exactly once. ``budget`` (ns): what is
    left of the call's deadline (``ControllerNode.submit``)."""
    gate = node.gate
    room, why = gate.room(conn)
    nbytes = input_bytes(req)
    full = gate.over(nbytes) if room >= 1 else ""
    if room < 1 or full:
        deliver(overloaded(node, req, full or why))
        return
    gate.enter(conn)
    gate.take(nbytes)

    def done(resp: pb.InferResponse) -> None:
        gate.leave(conn)
        gate.give(nbytes)
        deliver(resp)

    submit_guarded(node, (req,), done, 0, budget)


async def answer_or_withdraw(node, fut: asyncio.Future, first: int):
    """``await fut``: the answer of a unary call whose requests were admitted just now,
    from id ``first`` to the node's next (awaited straight after the submit, before the
    event loop runs anything else). If the call is cancelled meanwhile (its client
    cancelled or went away), those still queued are withdrawn
    (``ControllerNode.withdraw``)."""
    end = node.next_id
    try:
        return await fut
    except asyncio.CancelledError:
        node.withdraw(range(first, end))
        raise


class ClientClock:
    """The client clock of one ``InferStream``: ``late(receipt, client_time_ns)`` is how
    long a message spent on its way beyond the stream's fastest one (its requests are
    charged that: ``late`` of ``ControllerNode.submit_many``). The offset between the
    client's clock and the controller's is unknown; the smallest ``receipt -
    client_time_ns`` of the stream's messages stands for it (the first message's sets it).

    A time of 0 is none (late 0). A time below 1 or from ``CLIENT_CLOCK_MAX_NS`` on is no
    clock reading: ignored, the message taken as sent when it arrived (late 0). An offset
    more than ``CLIENT_CLOCK_WINDOW_NS`` from the stream's: behind it, the message is
    charged the window (it was held up at least that long, or its stamp lies); ahead of
    it, late 0 (the stream's offset stays). ``CLIENT_CLOCK_STEP_RUN`` such messages in a
    row that agree (within ``CLIENT_CLOCK_STEP_NS``) are a clock that stepped, or a first
    stamp that lied: their offset becomes the stream's, if they arrived over
    ``CLIENT_CLOCK_STEP_SPAN_NS`` at least (a backlog read after a stall arrives bunched,
    and is charged the window). ``why`` says when a time was
    not taken as it is (else ""). Whatever a client's times say, they charge its
    stream's requests at most the window, and no other stream's.

    The first message's offset is the stream's until a smaller one comes: a stream
    opened while the controller was stalled has its first message held up as long as
    the backlog behind it, each next one a little less (charged 0 each, as the stream's
    fastest so far). ``shifted`` adds up how much the stream's offset fell so (within
    the window): the requests of the messages before each fall were sent that much
    earlier than they were charged (``Admitted.arrived_earlier`` moves those still
    waiting, each at most the window with what it was charged). A clock step past the
    window moves none; one forward by less reads as such a fall, and moves them (the
    protocol asks for a monotonic clock, which does not step)."""

    __slots__ = ("fastest", "why", "note", "off", "run", "since", "shifted")

    def __init__(self) -> None:
        self.fastest: int | None = None  # the stream's smallest receipt - client time
        self.why = ""
        self.note = ""  # a message charged CLIENT_CLOCK_NOTE_NS or more, said
        self.off = 0  # the offset of the first of the latest messages past the window,
        self.run = 0  # how many in a row agree with it,
        self.since = 0  # and when it arrived
        self.shifted = 0  # how far the stream's offset fell in all (see above)

    def late(self, receipt: int, client_time_ns: int) -> int:
        self.why = self.note = ""
        if not client_time_ns:
            return 0
        if not 0 < client_time_ns < CLIENT_CLOCK_MAX_NS:
            self.why = (f"client_time_ns {client_time_ns} is no clock reading (nanoseconds, "
                        f"from 1 to 2^62 - 1): taken as sent on arrival")
            return 0
        d = receipt - client_time_ns
        fastest = self.fastest
        if fastest is None:
            self.fastest = d
            return 0
        gap = d - fastest
        if -CLIENT_CLOCK_WINDOW_NS <= gap <= CLIENT_CLOCK_WINDOW_NS:
            self.run = 0
            if gap < 0:
                self.fastest = d
                self.shifted -= gap
                return 0
            if gap >= CLIENT_CLOCK_NOTE_NS:
                self.note = (f"client_time_ns {client_time_ns} is {gap / 1e9:.3g} s behind "
                             "the clock of the stream's fastest message: charged that much "
                             "(held up on the way, or the client's clock stepped back: "
                             "client_time_ns must come from a monotonic clock)")
            return gap
        if self.run and abs(d - self.off) <= CLIENT_CLOCK_STEP_NS:
            self.run += 1
        else:
            self.off, self.run, self.since = d, 1, receipt
        where = f"{abs(gap) / 1e9:.3g} s {'behind' if gap > 0 else 'ahead of'}"
        if (self.run >= CLIENT_CLOCK_STEP_RUN
                and receipt - self.since >= CLIENT_CLOCK_STEP_SPAN_NS):
            self.fastest, self.run = d, 0
            self.why = (f"client clock stepped: messages over "
                        f"{CLIENT_CLOCK_STEP_SPAN_NS // 10**9} s {where} the stream's clock "
                        "agree; theirs is the stream's clock from now on")
            return 0
        window_s = CLIENT_CLOCK_WINDOW_NS // 10**9
        self.why = (f"client_time_ns {client_time_ns} is {where} the clock of the stream's "
                    f"earlier messages (at most {window_s} s either way): "
                    + (f"charged {window_s} s" if gap > 0 else "taken as sent on arrival"))
        return CLIENT_CLOCK_WINDOW_NS if gap > 0 else 0


class _Stream:
    """One ``InferStream`` call's state."""

    __slots__ = ("open", "done", "dead", "buffered", "out", "wake", "why", "dues", "due",
                 "send_at", "stopping", "held", "tokens", "admitted", "cut", "moved")

    def __init__(self) -> None:
        self.open = 0  # requests admitted, not yet answered
        self.admitted = Admitted()  # their ids
        self.moved = 0  # when its replies last moved (``Gate.hold``)
        self.done = False  # the client closed its side
        self.dead = False  # replies are no longer sent (slow reader, or the call ended)
        self.buffered = 0  # what out holds in memory (each reply + REPLY_OBJECT_BYTES)
        self.out: deque[tuple[pb.InferResponse, int]] = deque()
        self.wake = asyncio.Event()
        self.why = ""
        # paced replies: by client id, when each admitted request's reply must go at the
        # latest (``reply_due``); the soonest of those waiting in out (0: none); and when
        # the writer, asleep, will send next (0: it is not, any reply wakes it)
        self.dues: dict[int, int] = {}
        self.due = 0
        self.send_at = 0
        self.stopping = False  # the controller stops: read no more, send what is answered
        # the admitted requests that have inputs (or a client id with TOKEN_BIT set), by
        # a token of ours put in their client id while they are inside: (the client's
        # id, their input bytes), given back to the gate at their own answer (a client
        # may repeat an id, or leave it 0: by its id an answer could give back another
        # request's bytes)
        self.held: dict[int, tuple[int, int]] = {}
        self.tokens = 0


async def serve_stream(node, context) -> None:
    """``InferStream``: see the module docstring. Returns when every request read has
    been answered and the client closed its side; raises ``AbortError`` (through
    ``context.abort``) for a slow reader or a failure."""
    if node._stopping:  # (its closers have run: nothing would end this one)
        await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
    lim = node.limits
    await context.send_initial_metadata(((STREAM_LIMIT_KEY, str(lim.grpc_max_receive_bytes)),
                                         (STREAM_DEFAULT_SLO_KEY, str(node.cfg.default_slo))))
    gate = node.gate
    conn = context.peer()
    st = _Stream()
    out = st.out
    killed = asyncio.Event()

    pacer = Pacer(node.reply_interval_us)
    interval = pacer.interval  # ns; 0: replies are not paced
    dues = st.dues

    def cut(why: str) -> None:
        """End the stream as a slow reader (``Gate.hold``)."""
        node.count("streams_slow_reader")
        st.why = why
        node.count("replies_discarded", len(out))
        _close(st, gate)
        killed.set()

    st.cut = cut

    def reply(resp: pb.InferResponse) -> None:
        due = dues.pop(resp.client_id, 0) if dues else 0
        if st.dead:
            node.count("replies_discarded")
            return
        size = resp.ByteSize() + _FRAME
        out.append((resp, size))
        why = gate.hold(st, size + REPLY_OBJECT_BYTES)
        if why:
            cut(why)
            return
        if due and (resp.status or now_ns() >= due + interval):
            due = 0  # a failure, or past its SLO already: no hurry
        if due and (not st.due or due < st.due):
            st.due = due
        # (a writer asleep until its next slot is woken only by a reply due before it)
        if not st.send_at or (due and due < st.send_at):
            st.wake.set()

    held = st.held

    def deliver(resp: pb.InferResponse) -> None:
        st.open -= 1
        gate.leave(conn)
        entry = held.pop(resp.client_id, None) if held else None
        reply(resp)  # (paced by the id it was admitted with)
        if entry is not None:
            resp.client_id = entry[0]  # (the client's own, before the reply is sent)
            gate.give(entry[1])

    def admit(reqs, late: int) -> None:
        k = len(reqs)
        room, why = gate.room(conn)
        mine = lim.stream_outstanding - st.open
        if mine <= room:
            room, why = mine, (f"{lim.stream_outstanding} requests outstanding on this "
                               "stream (limit stream_outstanding)")
        n = min(k, max(0, room))
        taken = 0  # input bytes of the first n
        for i in range(n):
            req = reqs[i]
            # (also one whose own id looks like a token: its answer must not be taken
            # for that of the request holding that token)
            if req.inputs or req.client_id & TOKEN_BIT:
                b = input_bytes(req)
                full = gate.over(b, taken)
                if full:
                    n, why = i, full
                    break
                taken += b
                st.tokens += 1
                token = TOKEN_BIT | st.tokens
                held[token] = (req.client_id, b)
                req.client_id = token
        gate.take(taken)
        if n:
            st.open += n
            gate.enter(conn, n)
            if interval and pacer.busy:  # (a quiet stream holds no reply)
                reply_dues(dues, reqs, n, now_ns() - late, node.cfg.default_slo, interval)
            first = node.next_id
            submit_guarded(node, reqs if n == k else reqs[:n], deliver, late)
            st.admitted.add(node, first, clock.shifted, late)
        for req in reqs[n:]:
            reply(overloaded(node, req, why))

    clock = ClientClock()

    async def reader() -> None:
        size = lim.admit_slice
        # (read() and not ``async for``: grpc.aio's iterator holds the last message while
        # it waits for the next, up to grpc_max_receive_bytes an idle stream)
        while (batch := await context.read()) is not grpc.aio.EOF:
            if st.dead:
                return
            if type(batch) is Malformed:  # (its requests cannot be told apart: the
                # stream ends, INVALID_ARGUMENT)
                raise _MalformedMessage(batch.message)
            node.count("msgs_from_clients")
            t0 = now_ns()
            late = clock.late(t0, batch.client_time_ns)
            if clock.why:
                node.count("client_times_ignored")
                _CLOCK_LOG(f"InferStream from {conn}: {clock.why}")
            elif clock.note:
                node.count("client_times_late")
                _CLOCK_LOG(f"InferStream from {conn}: {clock.note}")
            if clock.shifted - st.admitted.applied >= CLIENT_CLOCK_SHIFT_NS:
                # the requests admitted before were sent earlier than they were charged
                st.admitted.arrived_earlier(node, clock.shifted)
            reqs = batch.requests
            n = len(reqs)
            if n <= size:
                admit(reqs, late)
            else:
                node.count("msgs_admitted_in_slices")
                for i in range(0, n, size):
                    # a later slice arrives later, and the wait counts against its SLO
                    admit(reqs[i:i + size], late + now_ns() - t0)
                    await asyncio.sleep(0)  # everyone else's turn before the next slice
                    if st.dead:
                        return
            batch = reqs = None  # let go of the message before waiting for the next
        st.done = True
        st.wake.set()

    async def writer() -> None:
        limit = lim.reply_message_bytes
        wake = st.wake
        while True:
            await wake.wait()
            if out:  # under load: one message per interval, but no reply past its due
                while (at := pacer.slot(st.due)) and at > now_ns():
                    st.send_at = at
                    wake.clear()
                    try:  # (woken by a reply due sooner, or the stream's end)
                        woken = await doze(at, wake)
                    finally:
                        st.send_at = 0
                    if not woken or st.dead or rtask.done():
                        break
                pacer.sent()
            wake.clear()
            while out:
                batch: list[pb.InferResponse] = []
                size = 0
                while out and (not batch or size + out[0][1] <= limit):
                    resp, n = out.popleft()
                    batch.append(resp)
                    size += n
                gate.release(st, size + len(batch) * REPLY_OBJECT_BYTES)
                pacer.note(len(batch))
                node.count("msgs_to_clients")
                await context.write(pb.InferResponseBatch(responses=batch))
            st.due = 0  # (none is waiting)
            if st.done and st.open <= 0 and not out:
                return
            if rtask.done() and not st.done:
                return  # the reader failed; the handler says why

    rtask = asyncio.create_task(reader())
    rtask.add_done_callback(lambda _: st.wake.set())
    wtask = asyncio.create_task(writer())
    ktask = asyncio.create_task(killed.wait())

    def stopping() -> None:  # (ControllerNode.stop, once every request is answered)
        st.stopping = st.done = True
        rtask.cancel()
        st.wake.set()
        asyncio.get_running_loop().call_later(
            STOP_WRITE_S, lambda: wtask.done() or wtask.cancel())

    node.stream_closers.add(stopping)
    try:
        await asyncio.wait([wtask, ktask], return_when=asyncio.FIRST_COMPLETED)
        if killed.is_set():
            rtask.cancel()
            wtask.cancel()
            _SLOW_LOG(f"InferStream from {conn} ended: {st.why}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, st.why)
        if st.stopping and wtask.cancelled():  # (its client does not read: given up)
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
        wtask.result()  # a failed write (the client went away) raises here
        if rtask.done() and not rtask.cancelled() and rtask.exception() is not None:
            e = rtask.exception()
            if isinstance(e, grpc.RpcError | asyncio.CancelledError):
                raise e
            if isinstance(e, _MalformedMessage):  # the client's error, not a failure here
                node.count("msgs_malformed_from_clients")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            node.count("streams_failed")
            _FAILED_LOG(f"InferStream from {conn} failed: {e!r}", e)
            await context.abort(grpc.StatusCode.INTERNAL, f"stream failed: {e!r}")
        if st.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)
    finally:
        node.stream_closers.discard(stopping)
        _close(st, gate)
        for t in (rtask, wtask, ktask):
            t.cancel()
        st.admitted.withdraw(node)  # (those its client will never read)


class _MalformedMessage(Exception):
    """A stream message whose bytes are not an ``InferRequestBatch``."""


def reply_dues(dues: dict[int, int], reqs, n: int, sent: int, default_slo: int,
               interval: int) -> None:
    """When the replies of the first ``n`` of ``reqs`` (a stream message's requests, sent
    at ``sent`` on our clock as far as we can tell) must go at the latest, into ``dues``
    by client id: one pacing ``interval`` before the request's SLO ends (less its wait in
    the client, ``queued_ns``), so that pacing, which holds a reply for the stream's next
    message, never makes an answer late that the scheduler made in time. An SLO of 0
    takes the default; one outside (0, ``MAX_SLO_MS``] has no due (it is answered at
    once, as invalid)."""
    for i in range(n):
        req = reqs[i]
        slo_ms = req.slo_ms
        if not slo_ms:
            slo = default_slo
        elif 0 < slo_ms <= MAX_SLO_MS:
            slo = int(slo_ms * 1_000_000)
        else:
            continue
        dues[req.client_id] = sent - min(req.queued_ns, CLIENT_CLOCK_WINDOW_NS) + slo - interval


def _close(st: _Stream, gate: Gate) -> None:
    """No more replies go out on this stream: drop those waiting, discard later ones."""
    st.dead = True
    st.out.clear()
    gate.release(st, st.buffered)
