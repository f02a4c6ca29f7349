"""The controller's links to its workers: connecting each (a Connect stream, then the
fast link's TCP frames where the worker offers one), its Hello and the answer to it,
clock samples, the writer that sends its actions and InstanceUpdates, the reader of its
results, and what happens when it is lost (its actions failed back into the loop, the
reconnection, a refusal when it cannot serve what the controller serves).

``WorkerLinks`` holds these as methods of ``ControllerNode`` (``controller/service.py``),
which inherits them: they read and change the node's state (its loop, its counters, the
instances served). ``send``, ``probe`` and ``reset`` are the loop's transport calls for a
worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import grpc

from clockwork.actions import Action, ActionType, ErrorCode, Result
from clockwork.protocol import addresses, keepalive
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.framing import FrameStream, LinkClosed, dial
from clockwork.protocol.holding import is_held, is_twice
from clockwork.protocol.pacing import Pacer, doze
from clockwork.protocol.ratelog import LogLimiter
from clockwork.protocol.security import (
    WORKER_CLOCK_SYNC,
    WORKER_CONNECT,
    AuthFailed,
    Refusals,
    exposure_error,
    plaintext_workers_warning,
)
from clockwork.protocol.versions import PROTOCOL, SOFTWARE, is_other_protocol, mismatch
from clockwork.protocol.wire import (
    WireError,
    add_action,
    add_tensors,
    attach_tensor,
    cut_attachments,
    msg_to_result,
)
from clockwork.sizes import (
    CLOCK_OFFSET_MAX_NS,
    MAX_ACTIONS_PER_MESSAGE,
    MAX_GPUS_PER_WORKER,
    MAX_MESSAGE_BYTES,
)
from clockwork.tensors import (
    batch_inputs,
    batch_rows,
    row_buffers,
)
from controller import policy_class
from controller.config import reach_note, usable_batch_sizes
from controller.policy import GpuSpec
from controller.repository import RepositoryError

now_ns = time.monotonic_ns
RECONNECT_S = 0.25  # between attempts to reach a lost worker again
# a worker whose fast link could not be reached is served on its gRPC stream, and asked
# for the fast link again when it next connects from this long after
FAST_RETRY_S = 60.0
# a worker listed at start that did not answer in time: looked at again (at most
# JOIN_TRY_S; added as by an AddWorker once it answers) after JOIN_RETRY_S, the pause
# doubling to JOIN_RETRY_MAX_S
JOIN_RETRY_S = 1.0
JOIN_RETRY_MAX_S = 10.0
JOIN_TRY_S = 3.0
JOIN_SAY_AGAIN_S = 60.0  # the same reason it cannot be added: said again after this
# a lost worker that does not come back: said again after this, and this often (with why)
LOST_SAY_AGAIN_S = 60.0
# the longest an AddWorker tries to reach its worker, whatever the caller's deadline (adds
# wait for each other: one given a day held every other for that day); a worker that
# answers takes as long as the caller allows to answer its Hello
ADD_WORKER_MAX_S = 300.0
# on giving up on a worker at start, a TCP connection of at most PROBE_S tells a refused
# connection from no answer at all
PROBE_S = 1.0
REFUSED_LOG_S = 60.0  # a worker refused at each reconnection attempt: a line this often
# (as a lost worker's, LOST_SAY_AGAIN_S; a new reason at once)
# ListWorkers lists the removed workers of the highest indices, at most this many
REMOVED_LISTED = 100
# a worker found suspect, answering again and re-admitted (a line each): at most
# LIVENESS_LOG_BURST such lines per LIVENESS_LOG_S (one that flaps, stopped for 300 ms at a
# time, wrote three lines a second)
LIVENESS_LOG_S = 60.0
LIVENESS_LOG_BURST = 15
# a session with a worker that ends within SHORT_SESSION_S of being made (another
# controller took the worker, a worker that fails right after each Hello) backs off the
# next reconnection: RECONNECT_S, doubling with each such session, at most
# RECONNECT_MAX_S; a session that lasted longer (a worker restarted after serving)
# is reconnected at once, as before
RECONNECT_MAX_S = 4.0
SHORT_SESSION_S = 2 * RECONNECT_MAX_S  # (longer than the other side's longest backoff)
LINK_LOG_S = 5.0  # a worker lost again for the same cause: a line at most this often
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
# to a worker: retry a refused connection quickly (a restarted worker is back in ~0.3 s)
WORKER_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 100),
                          ("grpc.min_reconnect_backoff_ms", 100),
                          ("grpc.max_reconnect_backoff_ms", 500), *keepalive.CHANNEL]
# an InstanceUpdate's answer (controller/service.py, UPDATE_TIMEOUT_S), and a worker's
# answer to our Hello, are waited for no longer than this in all
UPDATE_MAX_S = 1800.0
# a worker's answer to our Hello (its state) comes after it has read the packages the Hello
# names that it had not (a package compiled into its directory after it started): waited
# for in rounds of this long, each ended by a ClockSync it must answer, up to UPDATE_MAX_S
HELLO_WAIT_S = 5.0
ECHO_S = 1.0  # a clock echo to each worker this often (a clock sample, and a sign of life)
# why a fast link ended whose socket timed out: what was sent to the worker went
# unacknowledged past TCP_USER_TIMEOUT (clockwork.protocol.keepalive.watch_tcp)
LINK_TIMED_OUT = ("its fast link timed out: nothing sent on it acknowledged or read for "
                  f"{keepalive.SILENT_S} s (the network to it drops the link's packets, its "
                  "host is gone, or its process reads nothing: stopped or stalled)")


class WorkerHeld(ConnectionError):
    """The worker refused our Connect: another controller holds it (the message says which,
    from where, since when; ``clockwork.protocol.holding``)."""


class NoAnswer(TimeoutError):
    """An attempt to connect a worker in which its gRPC server never answered (no channel
    was ready in time): a refused connection, none at all, or one that speaks no gRPC."""


class OtherProtocol(ValueError):
    """A worker that speaks another worker protocol (another clockwork-py version): it is
    not used until it runs this controller's version."""


class ListedTwice(ValueError):
    """Two of the workers listed at start are one listener (the user's list to correct:
    exit 2, as for a bad argument)."""


class CannotServe(ValueError):
    """A worker that lacks the profile (or package) of an instance served: it is not
    used."""


@dataclass
class WorkerLink:
    index: int
    address: str
    channel: grpc.aio.Channel | None = None
    call: object = None  # what actions go on: the Connect stream, or the fast link's FrameStream
    # the Connect stream, held (so it stays open) while the fast link carries the messages
    grpc_call: object = None
    endpoints: frozenset = frozenset()  # the (IP, port) pairs its address resolved to
    # (time.monotonic) until then its fast link is not asked for: it could not be reached
    fast_off_until: float = 0.0
    connected: bool = False
    offset: int = 0  # worker clock - controller clock
    rtt: int = 0
    samples: deque = field(default_factory=lambda: deque(maxlen=32))
    state: pb.WorkerState | None = None
    pending: list = field(default_factory=list)  # Actions to write
    # (pacing) when the pending actions go at the latest: one interval before the soonest
    # latest start among them
    due: int = 0
    send_at: int = 0  # (pacing) when the writer, asleep, sends next; 0: not asleep
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list = field(default_factory=list)
    echo_seq: int = 0
    echo_due: bool = False
    reset_due: bool = False  # write a Hello(reset) before any further action
    keep: list = field(default_factory=list)  # the reset's weights to keep: (gpu, model, version)
    asked_kept: int = 0  # how many the last reset written asked it to keep
    error: str = ""
    # InstanceUpdates to write, each after the first ``pos`` actions of ``pending``
    updates: list = field(default_factory=list)  # (pos, pb.InstanceUpdate)
    acks: dict = field(default_factory=dict)  # update seq -> Future of its missing names
    told: dict = field(default_factory=dict)  # the instance list its last Hello carried
    # why a reconnection was refused (it cannot serve a model loaded while it was away)
    refused: LogLimiter = field(default_factory=lambda: LogLimiter(
        "controller", REFUSED_LOG_S, changes=True))
    # its suspect / answers again / re-admitted lines
    liveness_log: LogLimiter = field(default_factory=lambda: LogLimiter(
        "controller", LIVENESS_LOG_S, burst=LIVENESS_LOG_BURST))
    since: float = 0.0  # when its session was made (time.monotonic)
    # when it was last found suspect, taken back or began to drain (time.monotonic)
    changed: float = 0.0
    heard: float = 0.0  # when a message last came from it (time.monotonic)
    # while another controller holds the worker (its refusals, ``WorkerHeld``): what the
    # worker said, logged once; "" once we have it
    held: str = ""
    # why its last Hello's answer made it refused (told it in a goodbye): the reason an
    # add gives should its deadline end while the goodbye waits
    turned_away: str = ""
    reached: bool = False  # its gRPC server answered once (a channel was ready)
    backoff: float = 0.0  # the wait before the next reconnection's first attempt (s)
    refused_wait: float = 0.0  # the pause after its last refusal (0: not refused)
    # its "lost" line (ControllerNode._lost): the cause last logged, when, and a line not
    # logged (a repeat within LINK_LOG_S), said after all if it does not come back at once
    lost_err: str = ""
    # why the attempts to reconnect it fail (ListWorkers' detail; "" while none failed):
    # a refusal's words, or an unreachable worker's cause (looked at beside the attempts
    # after the first that failed so, ``_note_why``, and again as it is said still lost)
    retry_err: str = ""
    retry_net: bool = False  # retry_err is an unreachable worker's cause
    why_task: object = None  # the look at that cause under way
    lost_logged: float = -1e9
    lost_quiet: str = ""
    lost_skipped: int = 0
    lost_at: float = 0.0  # when it was last lost (time.monotonic)
    lost_again: float = 0.0  # when "still lost" is said next (time.monotonic)
    slow_said: bool = False  # its round trip was said to be too slow for the windows
    removed: bool = False  # removed by an operator (RemoveWorker): never reconnected
    # while a RemoveWorker drains it (its actions in flight finishing): set when none is
    # left outstanding, or it was lost (``ControllerLoop.drain_worker``, ``drained``)
    drained: asyncio.Event | None = None
    drain_task: asyncio.Future | None = None  # that drain, then its removal
    drain_failed: int = 0  # its actions in flight that failed during it (lost)
    reconnecting: asyncio.Future | None = None  # its reconnection task, while lost

    def add_sample(self, t0: int, tw: int, t2: int) -> None:
        """A clock sample: our send at ``t0``, the worker's clock read ``tw``, our receipt
        at ``t2``. ``ValueError`` (the sample not taken) for a worker clock further than
        ``CLOCK_OFFSET_MAX_NS`` from ours: every action's window, moved by it, went out
        in the far past (each refused, every request TIMEOUT, nothing logged) or past
        int64 (the writes failed, the worker lost again and again)."""
        rtt = t2 - t0
        offset = tw - (t0 + t2) // 2
        if abs(offset) > CLOCK_OFFSET_MAX_NS:
            raise ValueError(f"worker {self.address}'s clock reads {tw} ns, "
                             f"{offset / 1e9:.3g} s from ours (more than "
                             f"{CLOCK_OFFSET_MAX_NS / 1e9:.3g} s: a broken clock)")
        self.samples.append((rtt, offset))
        best = min(self.samples)
        self.rtt, self.offset = best


# stand-ins for what a removed link held of its own (``_forget``)
_NO_SAMPLES: deque = deque(maxlen=0)
_REMOVED_LOG = LogLimiter("controller", LIVENESS_LOG_S, burst=LIVENESS_LOG_BURST)


def _forget(link: WorkerLink) -> None:
    """What a removed worker's link held for its connection, let go: it stays in the
    links (its index is taken for good, and ``ListWorkers`` lists it removed) as an
    address and its GPUs only (an operator's add and remove a minute held ~100 KB each,
    its gRPC calls and channel among them, for the controller's life)."""
    link.channel = link.call = link.grpc_call = link.why_task = None
    link.drained = None  # (its reconnection and drain tasks: cancelled, or ended)
    link.tasks, link.keep, link.told, link.acks = [], [], {}, {}
    link.samples = _NO_SAMPLES  # (appended to, it keeps nothing)
    link.refused = link.liveness_log = _REMOVED_LOG
    if link.state is not None:  # (its GPUs, as ListWorkers gives them)
        link.state = pb.WorkerState(device=link.state.device, gpus=[
            pb.GpuState(gpu=g.gpu, pages=g.pages) for g in link.state.gpus])


def _canonical(address: str) -> str:
    """``addresses.canonical``, with an address it cannot read kept as given."""
    try:
        return addresses.canonical(address)
    except ValueError:
        return address


async def _endpoints(address: str) -> frozenset[tuple[str, int]]:
    """``addresses.endpoints``, with an address it cannot read standing for itself."""
    try:
        return await addresses.endpoints(address)
    except ValueError:
        return frozenset({(address, 0)})


def _mismatch(a: Action, r: Result) -> str:
    """How a result contradicts the action it names ("" if it does not)."""
    if r.type != a.type or r.gpu != a.gpu or r.model != a.model:
        return (f"a {r.type.name} of {r.model!r} on gpu {r.gpu}, but action {a.id} is a "
                f"{a.type.name} of {a.model!r} on gpu {a.gpu}")
    if r.outputs and a.requests and any(t.shape[0] < len(a.requests) for t in r.outputs):
        return f"outputs of fewer rows than the {len(a.requests)} request(s) of action {a.id}"
    return ""


def _unfit_outputs(r: Result, a: Action, profile, device: str) -> str:
    """How a successful INFER's outputs differ from the model's (its profile's names,
    dtypes and shapes, in order; "" if they do not): such outputs were answered SUCCESS
    as they came (another name, int8, a row of 0 values, tensors more). A real device
    that sent none where a request wanted them: its requests got zeros, as from an
    emulated device."""
    outs = r.outputs
    if not outs:
        if device != "emulated" and any(q.want_outputs for q in a.requests or ()):
            return "no outputs, though a request wanted them"
        return ""
    specs = profile.outputs if profile is not None else ()
    if len(outs) != len(specs) or any(
            t.name != s.name or t.dtype.name != s.dtype or tuple(t.shape[1:]) != tuple(s.shape)
            for t, s in zip(outs, specs, strict=True)):
        got = ", ".join(f"{t.name} {t.dtype.name}{list(t.shape[1:])}" for t in outs)
        want = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in specs)
        return f"outputs {got}, the model's are {want or 'none'}"
    return ""


class WorkerLinks:
    """``ControllerNode``'s worker links (see the module's docstring)."""

    # ``in_service``'s list, and the (links, removals) counts it was made at
    _in_service: list = []
    _in_service_at: tuple[int, int] = (-1, -1)
    _removals = 0  # links removed so far (``_remove``)

    def in_service(self) -> list[WorkerLink]:
        """The links of the workers not removed, in index order: what the walks over the
        workers at each request, probe and scrape read. A removed worker's link keeps its
        place in ``links`` for good (its index is never reused); walking every link ever
        made cost each request more with every worker that joined and left. Made again
        only after a link was added, dropped or removed."""
        at = (len(self.links), self._removals)
        if at != self._in_service_at:
            self._in_service = [lk for lk in self.links if not lk.removed]
            self._in_service_at = at
        return self._in_service

    def instance_message(self, name: str, profile: str) -> pb.Instance:
        """Instance ``name`` (profile ``profile``) as workers are told it: with the pages
        and the batch sizes the controller counts for it, which the worker's own profile
        must agree with (it reports the instance missing otherwise)."""
        msg = pb.Instance(name=name, profile=profile, package=self.packages.get(name, ""))
        p = self.pset.find(profile)
        if p is not None:
            msg.weights_pages = p.weights_pages
            msg.batch_sizes.extend(usable_batch_sizes(p.batch_sizes, self.cfg.max_batch))
        return msg

    def _check_reach(self, link: WorkerLink) -> None:
        """Say once per worker when half its clock-sync round trip is longer than the
        policy's windows allow (``config.reach_note``): every action to it would be
        refused, and nothing would say why."""
        if link.slow_said or not policy_class(self.policy_name).timed_windows:
            return
        note = reach_note(self.cfg, link.rtt // 2)
        if note:
            link.slow_said = True
            print(f"controller: warning: worker {link.address} (round trip "
                  f"{link.rtt / 1e6:.3g} ms): {note}", file=sys.stderr, flush=True)

    def _adopt(self, link: WorkerLink) -> None:
        """The weights the worker kept through our first Hello (it held them for an
        earlier controller) become the policy's copies, counted ``weights_adopted``."""
        held = {g.gpu: list(zip(g.loaded, g.versions, strict=True))
                for g in link.state.gpus if len(g.versions) == len(g.loaded)}
        n = sum(len(c) for c in held.values())
        if not n:
            return
        self.ctrl.adopt(link.index, now_ns(), held)
        self.count("weights_adopted", n)
        print(f"controller: worker {link.address} still holds {n} model copies (weights cached); "
              "serving them with no LOAD", file=sys.stderr, flush=True)

    async def _link_to(self, address: str, wait: float) -> tuple[WorkerLink | None, frozenset]:
        """The link to the worker ``address`` (canonical) names, under any spelling that
        resolves to one of the same endpoints (a second link to one worker would take it
        from the first again and again), or None; and the endpoints ``address`` resolves
        to (each link keeps its own, resolved when it was made)."""
        links = self.in_service()
        for lk in links:
            if lk.address == address:
                return lk, lk.endpoints
        try:
            async with asyncio.timeout(wait):
                wanted = await _endpoints(address)
        except TimeoutError:
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE,
                                  f"cannot resolve worker {address} in {wait:.1f} s") from None
        return next((lk for lk in links if wanted & lk.endpoints), None), wanted

    async def add_worker(self, address: str, timeout: float | None = None,
                         said=None) -> tuple[int, list[int], bool]:
        """Connect a worker while serving (a node joined the cluster): as for the workers
        at start -- clock sync, Hello with the instance list, its state -- then its GPUs
        get the next controller-wide indices, the policy places copies there by its
        rules, and the link is kept up like any other. Returns (worker index, its GPU
        indices, added); a worker already connected (an address that resolves to one of
        its endpoints) is left as it is (added False), one draining is FAILED_PRECONDITION;
        an address that is not HOST:PORT is INVALID_ARGUMENT. Raises ``RepositoryError`` (UNAVAILABLE: cannot reach it in
        ``timeout`` seconds, default ``connect_timeout``, tried at most ``ADD_WORKER_MAX_S``;
        INVALID_ARGUMENT: it cannot serve the models, or the policy cannot grow).
        ``said``: a function of nothing that says more for the line that says it
        joined (called as the line is written)."""
        address, wait = self._worker_call(address, timeout)
        deadline = time.monotonic() + wait  # (one for the name's resolution and the dial)
        def connected(lk: WorkerLink) -> tuple[int, list[int], bool]:
            if lk.drained is not None:  # (it said "a worker already", and left soon after)
                raise RepositoryError(grpc.StatusCode.FAILED_PRECONDITION, (
                    f"add worker {address}: it is draining (a removal under way, its GPUs "
                    "taking nothing more); add it again once it is removed"))
            return lk.index, self._gpus_of(lk), False

        # a worker connected already is answered at once, not after the adds before it
        # (one that cannot reach its worker holds the lock for up to its timeout)
        # (a remove of this worker waits for this add's end: its address, its endpoints
        # once resolved, and the event set as it ends)
        pending = [address, frozenset(), asyncio.Event()]
        self._adds_pending.append(pending)
        try:
            lk, pending[1] = await self._link_to(address,
                                                 max(0.0, deadline - time.monotonic()))
            if lk is not None and lk.state is not None:
                return connected(lk)
            return await self._add_in_turn(address, deadline, wait, said, connected)
        finally:
            self._adds_pending.remove(pending)
            pending[2].set()

    async def _add_in_turn(self, address: str, deadline: float, wait: float, said,
                           connected) -> tuple[int, list[int], bool]:
        """``add_worker``'s connection, made under the adds' lock (one at a time)."""
        async with self._add_lock:
            if time.monotonic() >= deadline:  # (it waited for another worker's add)
                raise RepositoryError(grpc.StatusCode.UNAVAILABLE, (
                    f"add worker {address}: its {wait:g} s ran out while another worker's "
                    "add was under way; try again"))
            lk, endpoints = await self._link_to(address, max(0.0, deadline - time.monotonic()))
            if lk is not None:
                return connected(lk)
            # (the rule for the workers at start: one off loopback needs the secret)
            why = exposure_error("controller", "127.0.0.1", None,
                                 None if self.cluster_auth is None else b"",
                                 self.insecure_no_auth, [address])
            if why is not None:
                raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"this controller runs without the cluster secret: {why}")
            link = WorkerLink(len(self.links), address, endpoints=endpoints)
            # (tries end PROBE_S early, where there is time: giving up, _connect looks
            # why it could not reach the worker, within the caller's deadline)
            tries_end = deadline - PROBE_S if deadline - time.monotonic() > 2 * PROBE_S \
                else deadline
            # (tries to reach it: at most ADD_WORKER_MAX_S, whatever the caller gave; a
            # worker that answers may take the caller's time for its Hello: a cuda worker
            # builds its kernels first)
            tries_end = min(tries_end, time.monotonic() + ADD_WORKER_MAX_S)
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._unless_stopping(self._connect(link, tries_end))
                    # a load or unload made while the connection's task handed back went
                    # to the links of then, not this one (its requests failed
                    # UNKNOWN_MODEL on the new GPUs): caught up again, the last look at
                    # the instances with no await before the link joins the others
                    try:
                        await self._catch_up(link, pbg.WorkerStub(link.channel), link.call)
                    except grpc.aio.AioRpcError as e:
                        raise ConnectionError(f"worker {link.address}: {e.details()}") from None
                    except asyncio.CancelledError:  # (the caller gone: its connection
                        # closed, or a fast link would hold the worker for good)
                        if isinstance(link.call, FrameStream):
                            link.call.close()
                        with contextlib.suppress(Exception):
                            await asyncio.shield(link.channel.close())
                        raise
            except ValueError as e:
                if link.channel is not None:  # (connected, then refused by the catch-up)
                    if isinstance(link.call, FrameStream):
                        link.call.close()
                    await link.channel.close()
                raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
            except (ConnectionError, TimeoutError) as e:
                # (a connection made just as the time ran out is let go, not left open)
                if isinstance(link.call, FrameStream):
                    link.call.close()
                if link.channel is not None:
                    await link.channel.close()
                if link.held:  # refused for as long as we tried: another controller's
                    raise RepositoryError(grpc.StatusCode.FAILED_PRECONDITION,
                                          f"cannot add worker {address}: {link.held}") from None
                if link.turned_away:  # (the time ran out while it was told why)
                    raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT,
                                          link.turned_away) from None
                raise RepositoryError(grpc.StatusCode.UNAVAILABLE,
                                      str(e) or f"cannot reach worker {address} in "
                                      f"{wait:.1f} s") from None
            specs = [GpuSpec(link.index, g.gpu, g.pages) for g in link.state.gpus]
            first = len(self.gpu_index)
            # the link first: the policy may place copies on the new GPUs at once (models
            # waiting for one), and their LOADs are sent through it
            self.links.append(link)
            for i, s in enumerate(specs):
                self.gpu_index[(link.index, s.gpu)] = first + i
            try:
                self.ctrl.add_worker(specs, now_ns())
            except NotImplementedError as e:
                self.links.pop()
                for s in specs:
                    del self.gpu_index[(link.index, s.gpu)]
                await link.channel.close()
                raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
            self._start_link_tasks(link)
            self.count("workers_added")
            more = said() if said is not None else ""
            print(f"controller: worker {address} joined with {len(specs)} GPU(s){more}",
                  file=sys.stderr, flush=True)
            line = plaintext_workers_warning(self.clients_tls, self.worker_credentials,
                                             [address])
            if line and address not in self.plaintext_said:  # (as for those at start)
                print(f"controller: warning: {line}", file=sys.stderr, flush=True)
            return link.index, list(range(first, first + len(specs))), True

    def _worker_call(self, address: str, timeout: float | None) -> tuple[str, float]:
        """An AddWorker's or RemoveWorker's address (canonical) and wait (``timeout``,
        default ``connect_timeout``); ``RepositoryError`` UNAVAILABLE while the controller
        does not serve, INVALID_ARGUMENT for an address that is not HOST:PORT."""
        if self.ctrl is None or self._stopping:
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE, "the controller is not serving")
        try:
            address = addresses.canonical(address)
        except ValueError as e:
            raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return address, self.connect_timeout if timeout is None else timeout

    async def remove_worker(self, address: str, timeout: float | None = None,
                            drain: bool = False) -> tuple[int, list[int], bool, bool, int]:
        """Take the worker ``address`` names out of the cluster for good (scaled down,
        retired): the policy places nothing more on its GPUs, the actions it has in
        flight fail at once (``ControllerLoop.remove_worker``: their requests placed
        again elsewhere where their SLO allows, else answered), its connection closes
        (the worker process runs on, free for another controller, its weights cache as
        it was) and it is not reconnected. ``drain``: gently, for a worker connected --
        nothing more is placed on its GPUs at once, but the actions it has in flight run
        to their end there (``ControllerLoop.drain_worker``); it is taken out as above
        once none is left, or when ``timeout`` has run out (what is still in flight then
        fails), or at once if it is lost meanwhile. A worker lost and being reconnected
        is removed at once; one listed at start that has not answered yet is no longer
        awaited (worker index -1, no GPUs). Returns (worker index, its GPU indices,
        removed, drained: every action it had in flight ran to its end there, failed:
        how many failed, lost during a drain or in flight when it was taken out); an
        address of a worker removed already: removed False. An add of the same worker
        under way is waited for first (``timeout``, default ``connect_timeout``:
        UNAVAILABLE when it runs out). NOT_FOUND for an address that names no worker of
        this controller, INVALID_ARGUMENT for one that is not HOST:PORT. Each address is
        matched under any spelling that resolves to the same endpoints."""
        address, wait = self._worker_call(address, timeout)
        deadline = time.monotonic() + wait
        lk, endpoints = await self._link_to(address, wait)
        if lk is None:
            awaited = await self._awaited_as(address, endpoints, deadline)
            if awaited is not None:  # listed at start, never in
                done = await self._no_longer_awaited(awaited, deadline)
                if done is not None:
                    return (*done, False, 0)
                lk, endpoints = await self._link_to(address,
                                                    max(0.0, deadline - time.monotonic()))
            adds = [ended for a, eps, ended in self._adds_pending
                    if a == address or endpoints & eps]
            if adds:
                try:  # an add of this worker under way: its end first
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        for ended in adds:
                            await ended.wait()
                        lk, endpoints = await self._link_to(
                            address, max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise RepositoryError(grpc.StatusCode.UNAVAILABLE, (
                        f"{address}: its add was still under way when the {wait:.1f} s ran "
                        "out; try again")) from None
        if lk is None or lk.removed:  # (removed meanwhile by a call beside this one)
            was = lk if lk is not None else next(
                (x for x in reversed(self.links) if x.removed
                 and (x.address == address or endpoints & x.endpoints)), None)
            if was is not None:
                return was.index, self._gpus_of(was), False, False, 0
            if address in self._removed_awaited or endpoints & self._removed_awaited_at:
                return -1, [], False, False, 0
            raise RepositoryError(grpc.StatusCode.NOT_FOUND,
                                  f"no worker {address} in this controller")
        gpus = self._gpus_of(lk)
        if lk.drain_task is not None and drain:  # a drain beside this one: its end waited
            # for (within this call's time), which that call says
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.shield(lk.drain_task)
            if not lk.removed:
                raise RepositoryError(grpc.StatusCode.UNAVAILABLE, (
                    f"{address}: still draining (another call drains it) when this call's "
                    f"{wait:.1f} s ran out; remove it without drain to take it out now"))
            return lk.index, gpus, False, False, 0
        if drain and lk.connected and self.ctrl.up[lk.index]:  # (one lost or suspect has
            # nothing in flight to wait for: removed at once, not drained)
            lk.drain_task = asyncio.ensure_future(self._drain(lk, gpus, deadline))
            lk.drain_task.add_done_callback(_said_if_failed)
            # (the call's caller gone: the drain goes on)
            drained, failed = await asyncio.shield(lk.drain_task)
            if failed < 0:  # (taken out by a remove beside it meanwhile)
                return lk.index, gpus, False, False, 0
            return lk.index, gpus, True, drained, failed
        # (a drain under way ends here: what it waits for fails now)
        return lk.index, gpus, True, False, self._remove(lk, gpus)

    async def _drain(self, lk: WorkerLink, gpus: list[int], deadline: float
                     ) -> tuple[bool, int]:
        """``remove_worker`` with drain: ``lk``'s GPUs leave the policy at once
        (``ControllerLoop.drain_worker``), its actions in flight are waited for until
        ``deadline``, then it is removed (``_remove``). (whether every action in flight
        ran to its end there, how many failed: lost during the drain, or in flight when
        it was taken out; -1 when a removal beside it took it out first)."""
        lk.drained = asyncio.Event()
        lk.changed = time.monotonic()  # (ListWorkers: its time draining)
        n = self.ctrl.drain_worker(lk.index, now_ns())
        print(f"controller: worker {lk.address} draining: nothing more is placed on its "
              f"{len(gpus)} GPU(s); waiting for its {n} action(s) in flight",
              file=sys.stderr, flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await lk.drained.wait()
        if lk.removed:
            return False, -1
        ended = lk.drained.is_set()  # (not when the deadline came first)
        failed = self._remove(lk, gpus, lk.drain_failed) + lk.drain_failed
        return ended and not failed, failed

    async def _awaited_as(self, address: str, endpoints: frozenset, deadline: float
                          ) -> str | None:
        """The address of the listed worker still awaited (``_join_later``) that
        ``address`` names, under its spelling or one resolving to the same endpoints."""
        if address in self.awaited:
            return address
        for a in list(self.awaited):
            with contextlib.suppress(TimeoutError, OSError, ValueError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    if endpoints & await _endpoints(a):
                        return a
        return None

    async def _no_longer_awaited(self, address: str, deadline: float
                                 ) -> tuple[int, list[int], bool] | None:
        """Stop awaiting the listed worker ``address``: its endpoints resolved first, then
        with no await between, it leaves ``awaited`` and is recorded removed (a remove
        beside this one answers removed False, under any spelling). None if it was
        taken in meanwhile (a link now: removed as one)."""
        eps: frozenset = frozenset()
        with contextlib.suppress(TimeoutError, OSError, ValueError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                eps = await _endpoints(address)
        joining = self.awaited.pop(address, None)
        if joining is None:  # (removed by a call beside this one, or in now)
            if address in self._removed_awaited:
                return -1, [], False
            return None
        self._removed_awaited.add(address)
        self._removed_awaited_at |= eps
        self.count("workers_removed")
        print(f"controller: worker {address} removed: it is no longer awaited",
              file=sys.stderr, flush=True)
        joining.cancel()
        with contextlib.suppress(BaseException):
            await joining
        return -1, [], True

    def _state_of(self, lk: WorkerLink) -> str:
        """``lk``'s worker's state: removed, draining (a RemoveWorker waits for its
        actions in flight), serving, suspect (it missed a probe), resetting (heard again,
        its reset not answered), held (by another controller) or lost (being reconnected
        to)."""
        ctrl, i = self.ctrl, lk.index
        if lk.removed:
            return "removed"
        if lk.drained is not None:
            return "draining"
        if lk.connected:
            return ("suspect" if ctrl is not None and ctrl.suspect[i] else
                    "resetting" if ctrl is not None and ctrl.resetting[i] else "serving")
        return "held" if lk.held else "lost"

    def worker_rows(self) -> list[dict]:
        """Each worker in one row (``ListWorkers``): its index, address, state
        (``_state_of``, or awaited), GPU indices, link kind while connected, clock-sync
        round trip, seconds in this state (since its connection, loss, or last suspicion,
        readmission or drain's start while connected), and why it is lost, held or
        awaited; of the workers removed, the last ``REMOVED_LISTED`` (by index)."""
        now = time.monotonic()
        rows = []
        removed = [lk.index for lk in self.links if lk.removed]
        shown = set(removed[-REMOVED_LISTED:])  # (an add and remove a minute: a row each)
        for lk in self.links:
            if lk.removed and lk.index not in shown:
                continue
            state = self._state_of(lk)
            since = ((max(lk.since, lk.changed) if lk.connected else lk.lost_at)
                     if state != "removed" else 0.0)
            rows.append({
                "worker": lk.index, "address": lk.address, "state": state,
                "gpus": self._gpus_of(lk),
                "link": ("fast" if isinstance(lk.call, FrameStream) else "grpc")
                if lk.connected else "",
                "rtt_ms": 0.0 if lk.removed else lk.rtt / 1e6,
                "for_s": now - since if since else 0.0,
                "detail": {"lost": lk.lost_err + (f"; reconnecting fails: {lk.retry_err}"
                                                  if lk.retry_err else ""),
                           "held": lk.held}.get(state, "")})
        why = self.awaited_why
        rows.extend({"worker": -1, "address": a, "state": "awaited", "gpus": [], "link": "",
                     "rtt_ms": 0.0, "for_s": 0.0,
                     "detail": "listed at start; added once it answers"
                     + (f" (not yet: {why[a]})" if why.get(a) else "")}
                    for a in self.awaited)
        rows.extend({"worker": -1, "address": a, "state": "removed", "gpus": [], "link": "",
                     "rtt_ms": 0.0, "for_s": 0.0, "detail": "listed at start, never in"}
                    for a in sorted(self._removed_awaited))
        return rows

    def worker_states(self) -> list[tuple[int, str, str]]:
        """(index, address, state) of each worker not removed (``_state_of``; awaited
        ones -1): the metrics' per-worker family, read at every scrape, with no work for
        a removed worker but a flag's look."""
        out = [(lk.index, lk.address, self._state_of(lk)) for lk in self.in_service()]
        out.extend((-1, a, "awaited") for a in self.awaited)
        return out

    def _gpus_of(self, link: WorkerLink, pages: int = 0) -> list[int]:
        """The controller-wide indices of ``link``'s GPUs (none before they have them;
        with ``pages``: those whose weights cache holds that many pages)."""
        if link.state is None:
            return []
        index = self.gpu_index
        return [index[k] for k in ((link.index, g.gpu) for g in link.state.gpus
                                   if g.pages >= pages) if k in index]

    def gpus_in_service(self, pages: int = 0) -> list[int]:
        """The controller-wide indices of the GPUs of the workers not removed (with
        ``pages``: those whose weights cache holds that many pages, a model's weights)."""
        return sorted(g for lk in self.in_service() for g in self._gpus_of(lk, pages))

    def _remove(self, link: WorkerLink, gpus: list[int], lost: int = 0) -> int:
        """``remove_worker``'s work on the link (no await: nothing sent to it after); how
        many of its actions in flight failed (``lost``: how many failed before, as it was
        lost while it drained: said too)."""
        link.removed = True
        self._removals += 1
        link.connected = False
        if link.drained is not None:  # (a drain under way ends: removed beside it)
            link.drained.set()
        for t in link.tasks:
            t.cancel()
        if link.reconnecting is not None:
            link.reconnecting.cancel()
        if isinstance(link.call, FrameStream):
            link.call.close()
        if link.channel is not None:
            asyncio.ensure_future(link.channel.close())
        link.pending, link.due = [], 0
        self._drop_updates(link)
        n = self.ctrl.remove_worker(link.index, now_ns())
        if link.why_task is not None:  # (a look at why it was lost: no longer asked for)
            link.why_task.cancel()
        _forget(link)
        self.count("workers_removed")
        print(f"controller: worker {link.address} removed with its {len(gpus)} GPU(s): "
              f"{n} action(s) in flight failed (their requests placed again or answered)"
              + (f", {lost} before, as it was lost while it drained" if lost else "")
              + "; its connection closed, and it is not reconnected", file=sys.stderr,
              flush=True)
        return n

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self.worker_credentials is not None:
            return grpc.aio.secure_channel(address, self.worker_credentials,
                                           options=WORKER_CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(address, options=WORKER_CHANNEL_OPTIONS)

    async def _reach(self, link: WorkerLink, deadline: float) -> BaseException | None:
        """At start, before any Hello: whether ``link``'s worker answers by ``deadline``:
        its gRPC server takes a channel and its service a ClockSync (gRPC's own threads
        complete a channel for a process whose event loop is stuck). None if it does,
        else the last failure (for ``_unreached``). Raises ``AuthFailed`` for a worker
        that refused our cluster credentials (or proved none)."""
        last: BaseException = NoAnswer(f"worker {link.address}: no answer")
        while time.monotonic() < deadline:
            ch = self._channel(link.address)
            try:
                async with asyncio.timeout(min(2.0, max(0.1, deadline - time.monotonic()))):
                    await ch.channel_ready()
                    link.reached = True
                    await self._clock_sync(pbg.WorkerStub(ch), link)
                return None
            except TimeoutError:
                last = NoAnswer(f"worker {link.address}: no answer")
            except grpc.aio.AioRpcError as e:  # (its deadline is ours: no answer in time)
                last = (NoAnswer(f"worker {link.address}: no answer")
                        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else e)
            except (ConnectionError, OSError) as e:
                last = e
            finally:
                await ch.close()
            await asyncio.sleep(0.2)
        return last

    async def _unreached(self, link: WorkerLink, last: BaseException | None,
                         flag: str = "") -> ConnectionError:
        """The error that says ``link``'s worker could not be reached (``last``: its last
        attempt's failure) within ``flag``'s wait."""
        return ConnectionError(self._unreached_text(link.address,
                                                    await self._why_unreached(link, last), flag))

    def _unreached_text(self, address: str, why: str, flag: str = "") -> str:
        within = f" within {flag} {self.connect_timeout:g} s" if flag else ""
        return f"cannot reach worker {address}{within} ({why})"

    async def _join_later(self, address: str, why: str) -> None:
        """A worker listed at start that did not answer in time (``why``): added, as by
        AddWorker, once it answers; looked at (``_reach``, at most ``JOIN_TRY_S``, without
        holding the adds' lock: a user's AddWorker of another worker is not held up)
        after a second, the pause doubling to ``JOIN_RETRY_MAX_S``. Said once as it is
        left out, then for each other reason it cannot be added, and the same reason
        again once a minute."""
        print(f"controller: worker {address} did not answer within --connect-timeout "
              f"{self.connect_timeout:g} s ({why}); serving on the other "
              f"{len(self.links)} worker(s) meanwhile, and adding it once it answers "
              f"(trying every {JOIN_RETRY_S:g} s, doubling to {JOIN_RETRY_MAX_S:g} s)",
              file=sys.stderr, flush=True)
        # (not answering: said above; another reason is said at once, the same again now
        # and then: a mistyped address or a TLS mismatch is said more than once)
        said, wait, again = "", JOIN_RETRY_S, time.monotonic() + JOIN_SAY_AGAIN_S
        try:
            while not self._stopping:
                probe = WorkerLink(-1, address)  # (a look only: no Hello, no index)
                try:
                    last = await self._reach(probe, time.monotonic() + JOIN_TRY_S)
                except ValueError:  # (it answers, refusing our credentials: the add says)
                    last = None
                if last is not None:
                    reason = self.awaited_why[address] = await self._why_unreached(probe, last)
                    if time.monotonic() >= again or said:
                        said, again = "", time.monotonic() + JOIN_SAY_AGAIN_S
                        print(f"controller: worker {address} (left out at start) still does "
                              f"not answer ({reason})", file=sys.stderr, flush=True)
                    await asyncio.sleep(wait)
                    wait = min(JOIN_RETRY_MAX_S, 2 * wait)
                    continue
                def joined() -> str:  # (when it is in: how many others are still out)
                    left = len(self.awaited) - 1
                    return (", left out at start (its weights cache emptied, as for a worker "
                            "added at run time); " + (f"{left} listed worker(s) still "
                                                      "awaited" if left else
                                                      "every listed worker is in"))

                try:
                    await self.add_worker(address, timeout=JOIN_TRY_S, said=joined)
                    return
                except RepositoryError as e:
                    self.awaited_why[address] = e.message
                    kind = "" if e.code == grpc.StatusCode.UNAVAILABLE else e.message
                    if kind != said or time.monotonic() >= again:
                        said, again = kind, time.monotonic() + JOIN_SAY_AGAIN_S
                        print(f"controller: worker {address} (left out at start) not added "
                              f"yet: {e.message}", file=sys.stderr, flush=True)
                await asyncio.sleep(wait)
                wait = min(JOIN_RETRY_MAX_S, 2 * wait)
        finally:
            self.awaited.pop(address, None)
            self.awaited_why.pop(address, None)

    async def _open(self, link: WorkerLink, ready_s: float = 2.0) -> None:
        """One connection attempt: clock sync, Connect stream, Hello, state. ``NoAnswer``
        if the worker's gRPC server does not answer within ``ready_s`` seconds."""
        ch = self._channel(link.address)
        stream = call = None
        try:
            try:
                async with asyncio.timeout(ready_s):
                    await ch.channel_ready()
            except TimeoutError:
                raise NoAnswer(f"worker {link.address}: no answer") from None
            link.reached = True
            stub = pbg.WorkerStub(ch)
            # a new connection may reach another clock (a rebooted host, another machine at
            # the address): the old samples, with their tiny echo round trips, would win
            link.samples.clear()
            for _ in range(8):
                t0, r, t2 = await self._clock_sync(stub, link)
                link.add_sample(t0, r.worker_time, t2)
            self._check_reach(link)
            call = await self._open_connect(stub, link)
            # a reconnection (a loop already runs): the worker may be the same process
            keep = self.ctrl.keep_list(link.index) if self.ctrl is not None else ()
            # at start: the worker keeps what it holds, for the policy to adopt
            adopt = self.ctrl is None and self.adopt_weights
            try:
                await call.write(pb.ControllerMessage(hello=self._hello(link, keep, adopt)))
                msg = await self._hello_answer(link, stub, call)
            except grpc.aio.AioRpcError as e:
                if is_held(e):  # another controller's connection to it is live
                    raise WorkerHeld(e.details()) from None
                if is_twice(e):  # ours, through another link: listed twice
                    raise ValueError(f"worker {link.address}: {e.details()}") from None
                if is_other_protocol(e):  # (it says both versions)
                    raise OtherProtocol(f"worker {link.address} refused us: "
                                        f"{e.details()}") from None
                raise
            if msg is grpc.aio.EOF or msg.WhichOneof("kind") != "state":
                raise ConnectionError(f"worker {link.address} did not send its state")
            # (a worker refused is refused before its fast link is dialed: dialed, it said
            # "refused fast link: no valid ticket" at each of our attempts)
            self._check_state(link, msg.state)
            stream = await self._dial_fast(link, msg.state) if msg.state.link_port else call
            # (on the stream the worker answers on: with a fast link, the gRPC call is idle)
            await self._catch_up(link, stub, stream)
        except BaseException as e:
            try:
                if (isinstance(e, ValueError) and not isinstance(e, (OtherProtocol, AuthFailed))
                        and (stream or call) is not None):
                    # (it answered, and is not used: it is told why, to say in its own
                    # log; it ends the stream on it: waited for, a second at most, so that
                    # closing ours does not cancel the call before the worker read it)
                    link.turned_away = str(e)
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            out = stream or call
                            await out.write(pb.ControllerMessage(goodbye=str(e)))
                            if out is call:
                                await call.done_writing()
                            while await out.read() not in (None, grpc.aio.EOF):
                                pass
            finally:  # (closed also when the caller's deadline cancels the wait)
                if isinstance(stream, FrameStream):
                    stream.close()
                await ch.close()
            raise
        link.channel, link.call, link.grpc_call, link.state = ch, stream, call, msg.state
        link.connected = True
        link.since = link.heard = time.monotonic()
        self.count("worker_connects")
        if stream is not call:
            self.count("worker_fast_links")

    async def _catch_up(self, link: WorkerLink, stub: pbg.WorkerStub, call) -> None:
        """Tell a worker being connected the models loaded or unloaded while it answered
        our Hello, and refuse it (``CannotServe``) if it cannot serve one, as at Hello:
        the news went as an update whose answer was taken for a reset's (its ``missing``
        unread), so a worker without a model loaded meanwhile was let in, and its
        requests failed ``UNKNOWN_MODEL``. Until the list holds still."""
        while link.told != self.instances:
            gone = [i for i in link.told if i not in self.instances]
            new = [self.instance_message(i, p) for i, p in self.instances.items()
                   if link.told.get(i) != p]
            link.told = dict(self.instances)
            self._update_seq += 1
            await call.write(pb.ControllerMessage(update=pb.InstanceUpdate(
                seq=self._update_seq, add=new, remove=gone)))
            msg = await self._hello_answer(link, stub, call)
            if msg is grpc.aio.EOF or msg is None or msg.WhichOneof("kind") != "state":
                raise ConnectionError(f"worker {link.address} did not answer an update")
            self._check_state(link, msg.state)

    @staticmethod
    def _check_state(link: WorkerLink, state: pb.WorkerState) -> None:
        """Raise ``CannotServe`` or ``ValueError`` for a worker whose state (its answer to
        our Hello) says it cannot be used: another worker protocol, instances it cannot
        serve, no GPU or too many, another GPU count than it had."""
        why = mismatch("worker", link.address, state.protocol, state.software)
        if why:  # (first: a worker of another version may have said anything below)
            raise OtherProtocol(why)
        if state.missing:
            more = " ..." if len(state.missing) > 5 else ""
            raise CannotServe(f"worker {link.address} ({state.device}) cannot serve "
                              f"{', '.join(state.missing[:5])}{more}: no profile in its "
                              f"profile set {state.profiles!r}"
                              + ("" if state.device == "emulated" else
                                 " or no model package (see clockwork compile)")
                              + ", or one whose weights pages or batch sizes are not the "
                              "controller's (the worker's log says which)")
        if not 1 <= len(state.gpus) <= MAX_GPUS_PER_WORKER:
            raise ValueError(f"worker {link.address} has {len(state.gpus)} GPUs: a worker "
                             f"has 1 to {MAX_GPUS_PER_WORKER}")
        if link.state is not None and len(state.gpus) != len(link.state.gpus):
            raise ValueError(f"worker {link.address} came back with {len(state.gpus)} "
                             f"GPU(s), it had {len(link.state.gpus)}")
        if link.state is not None:
            # (the policy keeps each GPU's cache size: with a smaller one its LOADs were
            # refused for want of room it believed free, and no EVICT made any)
            for old, new in zip(link.state.gpus, state.gpus, strict=True):
                if new.pages != old.pages:
                    raise ValueError(f"worker {link.address} came back with another "
                                     f"weights cache: GPU {new.gpu} has {new.pages:,} pages, "
                                     f"had {old.pages:,}")

    async def _hello_answer(self, link: WorkerLink, stub: pbg.WorkerStub, call):
        """The worker's first message after our Hello (its state, as a rule). Before it
        answers, the worker reads the packages the Hello names that it has not read yet,
        on a thread, answering ClockSync meanwhile: a cuda package's first kernel build
        takes a minute or more. So the answer is waited for in rounds of
        ``HELLO_WAIT_S``, each ended by a ClockSync that must be answered (within its own
        2 s), up to ``UPDATE_MAX_S`` in all; ``TimeoutError`` if the worker stops
        answering or takes longer."""
        read = asyncio.ensure_future(call.read())
        t0 = time.monotonic()
        said = False
        try:
            while True:
                done, _ = await asyncio.wait([read], timeout=HELLO_WAIT_S)
                if done:
                    return read.result()
                waited = time.monotonic() - t0
                if waited >= UPDATE_MAX_S:
                    raise TimeoutError(f"worker {link.address} did not answer our Hello in "
                                       f"{UPDATE_MAX_S:g} s")
                try:
                    s0, r, s2 = await self._clock_sync(stub, link)
                except (grpc.aio.AioRpcError, TimeoutError) as e:
                    raise TimeoutError(f"worker {link.address} stopped answering before it "
                                       f"answered our Hello ({waited:.1f} s)") from e
                link.add_sample(s0, r.worker_time, s2)
                if not said:
                    said = True
                    print(f"controller: worker {link.address} has not answered our Hello in "
                          f"{waited:.0f} s but answers: waiting while it does (it reads the "
                          "model packages the Hello names first; a cuda package's first "
                          "kernel build takes a minute or more)", file=sys.stderr,
                          flush=True)
        finally:
            read.cancel()

    async def _dial_fast(self, link: WorkerLink, state: pb.WorkerState) -> FrameStream:
        """The fast link the worker offered (``clockwork.protocol.framing``). If it cannot
        be reached, this link is on gRPC from the next attempt on, and asks for the fast
        link again at a connection ``FAST_RETRY_S`` or more later (said each time)."""
        try:
            return await dial(addresses.host_of(link.address), state.link_port, state.link_ticket,
                              pb.WorkerMessage.FromString, self.worker_tls)
        except (OSError, TimeoutError) as e:
            link.fast_off_until = time.monotonic() + FAST_RETRY_S
            print(f"controller: worker {link.address}: its fast link (port {state.link_port}) "
                  f"cannot be reached ({e!r}); using its gRPC stream (the fast link is asked "
                  f"for again when it next connects, from {FAST_RETRY_S:g} s on)",
                  file=sys.stderr, flush=True)
            raise ConnectionError(f"fast link of {link.address} unreachable") from e

    async def _clock_sync(self, stub: pbg.WorkerStub, link: WorkerLink):
        """One ClockSync round trip -> (sent, response, received); with a cluster secret
        the worker's answer counts only if it proves the secret."""
        auth = self.cluster_auth
        md, nonce = (auth.call_metadata(WORKER_CLOCK_SYNC, link.address) if auth is not None
                     else (None, ""))
        t0 = now_ns()
        call = stub.ClockSync(pb.ClockSyncRequest(controller_time=t0), timeout=2.0, metadata=md)
        try:
            r = await call
        except grpc.aio.AioRpcError as e:
            self._auth_refused(link, e)  # a worker that wants a secret we lack or do not share
            raise
        t2 = now_ns()
        if auth is not None:
            self._check_worker(link, WORKER_CLOCK_SYNC, nonce, await call.initial_metadata())
        return t0, r, t2

    async def _open_connect(self, stub: pbg.WorkerStub, link: WorkerLink):
        """The Connect stream; with a cluster secret, nothing is written on it (not even
        Hello) before the worker has proved the secret in its initial metadata."""
        auth = self.cluster_auth
        if auth is None:
            return stub.Connect()
        md, nonce = auth.call_metadata(WORKER_CONNECT, link.address)
        call = stub.Connect(metadata=md)
        try:
            async with asyncio.timeout(5.0):
                got = await call.initial_metadata()
        except grpc.aio.AioRpcError as e:
            self._auth_refused(link, e)
            raise
        except TimeoutError:
            call.cancel()
            raise
        try:
            self._check_worker(link, WORKER_CONNECT, nonce, got)
        except AuthFailed:
            call.cancel()
            raise
        return call

    def _check_worker(self, link: WorkerLink, method: str, nonce: str, metadata) -> None:
        if not self.cluster_auth.worker_proved(method, nonce, metadata, link.address):
            self._refuse_worker(link, f"worker {link.address}: it did not prove the cluster "
                                "secret (a worker without it, or with another one)")

    def _auth_refused(self, link: WorkerLink, e: grpc.aio.AioRpcError) -> None:
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            self._refuse_worker(link, (
                f"worker {link.address}: it refused our cluster credentials (give both the "
                "same cluster secret, and run the same clockwork-py version on both)"
                if self.cluster_auth is not None else
                f"worker {link.address}: it wants a cluster secret and this controller has "
                "none (give it the worker's: --cluster-secret-file, or "
                "CLOCKWORK_CLUSTER_SECRET)"))

    def _refuse_worker(self, link: WorkerLink, why: str) -> None:
        """Log (at most a line a second), count and raise: a worker we will not use. (At
        start it is not logged: it ends the start, and the controller's last line says
        it.)"""
        if self._worker_refusals is None:
            self._worker_refusals = Refusals("controller", self.count)
        if self.starting:
            self._worker_refusals.counted("worker_auth_refused")
        else:
            self._worker_refusals(why, "worker_auth_refused")
        raise AuthFailed(f"refused {why}")

    async def _connect(self, link: WorkerLink, deadline: float, flag: str = "") -> None:
        """Connect ``link``, trying again until ``deadline`` (``time.monotonic``); raises
        ``WorkerHeld`` (another controller held it throughout), ``ConnectionError`` saying
        why it could not be reached, or ``ValueError`` (it cannot be used). ``flag``: the
        option that set the wait (at start, ``--connect-timeout``), named in the error."""
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                await self._open(link, min(2.0, max(0.1, deadline - time.monotonic())))
                if link.held:
                    print(f"controller: worker {link.address} is ours now (the controller "
                          "that held it let it go)", file=sys.stderr, flush=True)
                    link.held = ""
                return
            except ValueError:
                raise
            except WorkerHeld as e:
                last = e
                self._held(link, str(e))
                await asyncio.sleep(RECONNECT_S)
            except (grpc.aio.AioRpcError, TimeoutError, ConnectionError, OSError) as e:
                last = e
                await asyncio.sleep(0.2)
        if isinstance(last, WorkerHeld):
            raise WorkerHeld(f"cannot take worker {link.address}: {last}, for as long as "
                             "we tried (--connect-timeout)")
        raise await self._unreached(link, last, flag)

    async def _why_unreached(self, link: WorkerLink, last: BaseException | None) -> str:
        """Why ``link``'s worker could not be connected, its last attempt having failed
        with ``last``: a refused connection, no answer, a port that speaks no gRPC (TLS on
        one side only, or no worker there), or what the worker answered. (A worker that
        refused our cluster credentials, or did not prove its own, was said at once:
        ``AuthFailed``.)"""
        if isinstance(last, grpc.aio.AioRpcError):
            code = last.code()
            hint = (": is it a `clockwork worker`?" if code == grpc.StatusCode.UNIMPLEMENTED
                    else "")
            return f"it answered {code.name} {last.details()!r}{hint}"
        if last is None:
            return "no time was left to try"
        if not isinstance(last, NoAnswer):  # it answered: no state, no fast link, a timeout
            return str(last) or ("it answered, but did not finish the handshake (clock "
                                 "sync, Hello, its state) in time")
        try:
            host, port = addresses.split(link.address)
        except ValueError as e:
            return str(e)
        tls = self.worker_tls  # (our TLS, as the fast link dials it: the same rule)
        try:
            async with asyncio.timeout(PROBE_S):
                _, w = await asyncio.open_connection(host, port, ssl=tls,
                                                     server_hostname=host if tls else None)
            w.close()
        except ConnectionRefusedError:
            return "connection refused: is a `clockwork worker` listening there?"
        except TimeoutError:
            if tls is not None and await _takes_connections(host, port):
                return ("it accepts connections but no TLS answer came: a worker stopped or "
                        "hung (restart it), or one without --tls-cert?")
            return ("no answer at all: is the host up, and its port open to this machine "
                    "(a firewall)?")
        except socket.gaierror as e:
            return f"cannot resolve {host!r}: {e.strerror}"
        except UnicodeError:  # (a name no resolver takes: one whose IDNA form is too long)
            return f"cannot resolve {host!r}: not a valid host name"
        except ssl.SSLCertVerificationError as e:
            return (f"the TLS handshake failed, its certificate refused ({e.verify_message})"
                    ": is it signed by the --worker-tls-ca CA, for this host name?")
        except ssl.SSLError as e:
            return (f"the TLS handshake failed ({e.reason or e})"
                    + (": a worker without --tls-cert?" if e.reason == "WRONG_VERSION_NUMBER"
                       else ""))
        except OSError as e:
            return e.strerror or repr(e)
        # (a stopped or hung process's port still takes connections: the kernel's)
        hung = "a worker stopped or hung (restart it)"
        if tls is not None:
            return ("it accepts TLS connections but no gRPC answer came: " + hung + ", one "
                    "that does not trust this controller's --tls-cert (a worker with "
                    "--tls-ca), or no `clockwork worker` there?")
        return ("it accepts connections but no gRPC answer came: " + hung + ", a worker "
                "with --tls-cert (then give this controller --worker-tls-ca), or no "
                "`clockwork worker` there?")

    def _held(self, link: WorkerLink, why: str) -> None:
        """Another controller holds ``link``'s worker (its refusal says ``why``): counted at
        each attempt, said once while it lasts (until we have the worker)."""
        self.count("worker_held_refusals")
        if not link.held:
            print(f"controller: worker {link.address}: {why}; waiting for it (trying again "
                  f"every {RECONNECT_S:g} s: it is ours once that controller's connection "
                  "ends, when it exits or stops answering)", file=sys.stderr, flush=True)
        link.held = why

    def _hello(self, link: WorkerLink, keep=(), adopt: bool = False) -> pb.Hello:
        """Take the worker over with nothing in flight and an empty cache but for the
        weights ``keep`` lists, each (GPU, model, version), that it still has (``adopt``:
        but for every weights it has fully loaded for an instance it still serves)."""
        self._drop_updates(link)  # what they said is in the instance list
        link.told = dict(self.instances)
        # The instance list, encoded once for as long as it stays the same: with thousands
        # of instances making each message anew held the loop for 5-12 ms per Hello (a
        # reset after a worker was suspect, a reconnection), every link waiting.
        key = (tuple(self.instances.items()), tuple(self.packages.items()))
        cached = self._hello_list
        if cached is None or cached[0] != key:
            listed = pb.Hello(instances=[self.instance_message(i, m)
                                         for i, m in self.instances.items()])
            cached = self._hello_list = (key, listed.SerializeToString())
        h = pb.Hello.FromString(cached[1])
        fast = time.monotonic() >= link.fast_off_until
        h.worker_id, h.reset, h.fast_link, h.adopt = link.index, True, fast, adopt
        h.controller_id, h.controller = self.controller_id, self.label
        h.protocol, h.software = PROTOCOL, SOFTWARE
        h.keep.extend(pb.KeptWeights(gpu=g, model=m, version=v) for g, m, v in keep)
        return h

    @staticmethod
    def _drop_updates(link: WorkerLink) -> None:
        """Forget the link's InstanceUpdates not written and not answered (a Hello will
        carry the whole instance list); whoever waits for an answer gets None."""
        link.updates = []
        for f in link.acks.values():
            if not f.done():
                f.set_result(None)
        link.acks = {}

    def _start_link_tasks(self, link: WorkerLink) -> None:
        link.tasks = [asyncio.create_task(self._reader(link)),
                      asyncio.create_task(self._writer(link)),
                      asyncio.create_task(self._echoer(link))]
        if link.call is not link.grpc_call:
            link.tasks.append(asyncio.create_task(self._watch_grpc(link)))
        for t in link.tasks:
            t.add_done_callback(lambda t, link=link: self._link_task_done(link, t))

    def _link_task_done(self, link: WorkerLink, t: asyncio.Task) -> None:
        """Supervision: a link task that dies of an exception (none should: each handles
        its own) is logged, and the link is treated as lost and reconnected."""
        if t.cancelled() or t.exception() is None or t not in link.tasks:
            return
        e = t.exception()
        link.error = f"{t.get_coro().__name__} failed: {e!r}"
        self._bad_worker_msg(f"worker {link.address}: {link.error}; resetting the link", e)
        if not self._stopping:
            self._lost(link)

    async def _writer(self, link: WorkerLink) -> None:
        """The only task that writes to the stream (grpc.aio allows one write at a time).
        Under load it writes the actions once per interval, but none later than one
        interval before its latest start (``link.due``); echoes and Hellos never wait for
        the actions' slot."""
        call = link.call
        pacer = Pacer(self.action_interval_us)
        wake = link.wake
        try:
            while True:
                await wake.wait()
                wake.clear()
                await self._write_control(link, call)
                if link.pending:
                    while (at := pacer.slot(link.due)) and at > now_ns():
                        link.send_at = at
                        try:  # (woken by an action due sooner, an echo, a Hello or an
                            # InstanceUpdate; the update waits with the actions)
                            woken = await doze(at, wake)
                        finally:
                            link.send_at = 0
                        if not woken:
                            break
                        wake.clear()
                        await self._write_control(link, call)
                        if not link.pending:
                            break  # (a reset dropped them)
                await self._write_control(link, call)
                # (no await from here until the actions are taken: a reset must not come
                # between its Hello and them)
                acts, link.pending, link.due = link.pending, [], 0
                if acts:
                    pacer.sent()
                if link.updates:
                    acts = await self._write_updates(link, call, acts)
                if not acts:
                    continue
                pacer.note(len(acts))
                await self._write_actions(link, call, acts)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reset the link (the stream may be fine)
            if link.call is call and link.connected and not self._stopping:
                if isinstance(e, LinkClosed | ConnectionResetError | BrokenPipeError):
                    # the worker closed the fast link as we wrote (it died): the link's
                    # end, said once, as the reader says it, not as a failed write
                    link.error = "stream ended"
                elif isinstance(e, TimeoutError):  # (as the reader says it)
                    link.error = LINK_TIMED_OUT
                else:
                    link.error = f"writing failed: {e!r}"
                    self._bad_worker_msg(f"writing to worker {link.address} failed: {e!r}",
                                         None if isinstance(e, grpc.RpcError | OSError) else e)
                self._lost(link)

    async def _write_control(self, link: WorkerLink, call) -> None:
        """The link's echo and reset Hello, if due (before any action queued after them),
        until none is: one asked for during a write goes too. Returns without suspending
        when none is due."""
        while link.echo_due or link.reset_due:
            if link.echo_due:
                link.echo_due = False
                link.echo_seq += 1
                await call.write(pb.ControllerMessage(
                    echo=pb.ClockEcho(seq=link.echo_seq, controller_time=now_ns())))
                if self.ctrl is not None:  # (a probe's wait counts from its write)
                    self.ctrl.probe_sent(link.index, now_ns())
            if link.reset_due:
                link.reset_due = False
                keep, link.keep = link.keep, []
                link.asked_kept = len(keep)  # (said when its answer comes)
                await call.write(pb.ControllerMessage(hello=self._hello(link, keep)))

    async def _write_actions(self, link: WorkerLink, call, acts: list[Action]) -> None:
        """The actions for ``link`` in one message, or in several of at most
        ``MAX_ACTIONS_PER_MESSAGE`` (the most a worker takes in one: a list that grew
        while a write waited), in order (windows on its clock; INFERs' batch rows and, for
        a real device, their inputs: on the fast link as the frame's attachments, the
        rows' own buffers; on gRPC joined into the message)."""
        off = link.offset
        real = link.state.device != "emulated"
        for start in range(0, max(len(acts), 1), MAX_ACTIONS_PER_MESSAGE):
            attach = [] if real and isinstance(call, FrameStream) else None
            msg = pb.ControllerMessage()
            msg.actions.SetInParent()  # an ActionBatch, even of no actions
            field = msg.actions.actions  # (built in place: no copies)
            for a in acts[start:start + MAX_ACTIONS_PER_MESSAGE]:
                m = add_action(field, a, off)
                if a.type == ActionType.INFER and a.requests:
                    self._add_inputs(m, a, real, attach)
            self.count("msgs_to_workers")
            await (call.write(msg, attach) if attach else call.write(msg))

    async def _write_updates(self, link: WorkerLink, call, acts: list[Action]) -> list[Action]:
        """Write the link's InstanceUpdates, each after the actions queued before it;
        returns the actions queued after the last one (the caller writes them)."""
        ups, link.updates = link.updates, []
        done = 0
        for pos, u in ups:
            if pos > done:
                await self._write_actions(link, call, acts[done:pos])
                done = pos
            await call.write(pb.ControllerMessage(update=u))
        return acts[done:]

    def _add_inputs(self, m: pb.ActionMsg, a: Action, real: bool, attach: list | None) -> None:
        """An INFER's batch rows, whether outputs go back, and (real devices) the inputs:
        appended to ``attach`` as the rows' buffers if it is a list, else in the message."""
        reqs = a.requests
        want = False
        for i, r in enumerate(reqs):
            r.row = i
            want = want or r.want_outputs
        m.want_outputs = want
        if not real:
            return
        specs = self.profiles[a.model].inputs
        if attach is None:
            inputs = batch_inputs([r.inputs for r in reqs], a.batch_size, specs)
            if inputs:
                add_tensors(m.inputs, inputs)
            return
        per_spec = batch_rows([r.inputs for r in reqs], specs)
        if per_spec is not None:
            b = a.batch_size
            for rows, spec in zip(per_spec, specs, strict=True):
                attach_tensor(m.inputs, spec.name, (b, *spec.shape), spec.dtype,
                              row_buffers(rows, spec, b), attach)

    async def _watch_grpc(self, link: WorkerLink) -> None:
        """On the fast link the Connect stream stays open, idle, and nothing else reads it:
        its keepalive is what ends the connection of a worker whose host vanished or whose
        process hangs (liveness finds it suspect sooner: its idle probes, or an action
        overdue). When the stream ends, or a message comes on it, the link is lost as for
        a broken stream."""
        call = link.grpc_call
        try:
            msg = await call.read()
            # (a clean end is told as the fast link's reader tells it: either may see the
            # end of a session first, and a cause that changes is logged every time)
            link.error = ("stream ended" if msg is grpc.aio.EOF or msg is None else
                          "a message on its gRPC stream beside the fast link")
        except grpc.aio.AioRpcError as e:
            link.error = f"{e.code()}: {e.details()}"
        except asyncio.CancelledError:
            return
        if not self._stopping:
            self._lost(link)

    async def _echoer(self, link: WorkerLink) -> None:
        while True:
            await asyncio.sleep(ECHO_S)
            link.echo_due = True
            link.wake.set()

    async def _reader(self, link: WorkerLink) -> None:
        """The worker's messages. A malformed result is logged, counted and dropped
        (``_on_results``); one that leaves an action's outcome unknown, and any exception
        while handling a message, end the link: it is treated as lost (its actions fail
        back into the policy) and reconnected."""
        call = link.call
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF or msg is None:
                    break
                link.heard = time.monotonic()
                kind = msg.WhichOneof("kind")
                if kind == "results":
                    self.count("msgs_from_workers")
                    why = self._on_results(link, msg.results.results,
                                           call.tail if isinstance(call, FrameStream) else None)
                    if why:
                        link.error = why
                        break
                elif kind == "echo":
                    e = msg.echo
                    t = now_ns()
                    if 0 < e.controller_time <= t:  # an echo of ours: a clock sample
                        try:
                            link.add_sample(e.controller_time, e.worker_time, t)
                        except ValueError:  # (a clock far from ours: not taken)
                            self.count("echoes_malformed")
                    else:
                        self.count("echoes_malformed")
                    self.ctrl.heard_from(link.index, t)
                elif kind == "state":
                    if msg.state.update_seq == 0:  # the answer to a reset's Hello
                        if not self.ctrl.resetting[link.index]:  # (none asked: a state
                            # sent for nothing was taken as one, its kept copies counted)
                            self.count("msgs_malformed")
                            continue
                        if msg.state.missing:  # (a model loaded while it was suspect)
                            # refused as at a connection's Hello: it reconnects, and
                            # stays out while it cannot serve them (it was let back in,
                            # and its requests failed UNKNOWN_MODEL)
                            try:
                                self._check_state(link, msg.state)
                            except CannotServe as e:
                                link.error = str(e)
                                break
                        kept = self._kept(msg.state)
                        self.ctrl.reset_done(link.index, now_ns(), kept)
                        link.liveness_log(
                            f"worker {link.address} re-admitted (it kept "
                            f"{sum(len(v) for v in kept.values())} of the {link.asked_kept} "
                            "model copies asked)")
                        continue
                    f = link.acks.pop(msg.state.update_seq, None)
                    if f is not None and not f.done():
                        f.set_result(list(msg.state.missing))
                else:
                    self.count("msgs_malformed")
        except grpc.aio.AioRpcError as e:
            link.error = f"{e.code()}: {e.details()}"
        except ConnectionError as e:  # the fast link (an oversized frame)
            link.error = str(e)
        except TimeoutError:  # the fast link's kernel gave up on a silent worker
            link.error = LINK_TIMED_OUT
        except asyncio.CancelledError:
            return
        except Exception as e:  # noqa: BLE001 - a message we could not handle: reset
            link.error = f"handling its message failed: {e!r}"
            self._bad_worker_msg(f"worker {link.address}: {link.error}", e)
        if not self._stopping:
            self._lost(link)

    def _lost(self, link: WorkerLink) -> None:
        """A worker went away: fail its outstanding actions back into the policy, reconnect.
        Once per connection (the reader, the writer and supervision may all notice)."""
        if not link.connected:
            return
        link.connected = False
        self.count("worker_losses")
        for t in link.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        if isinstance(link.call, FrameStream):
            link.call.close()
        if link.channel is not None:
            asyncio.ensure_future(link.channel.close())
        link.pending, link.due = [], 0
        self._drop_updates(link)  # its Hello will carry the instance list when it is back
        err = link.error or "stream ended"
        link.error = ""
        # the policy places nothing there meanwhile; its outstanding actions fail
        n = self.ctrl.worker_lost(link.index, now_ns(), "worker lost")
        t = time.monotonic()
        link.lost_at, link.lost_again = t, t + LOST_SAY_AGAIN_S
        held = t - link.since
        link.backoff = (min(RECONNECT_MAX_S, max(RECONNECT_S, 2 * link.backoff))
                        if held < SHORT_SESSION_S else 0.0)
        why = (f" in {link.backoff:g} s (its session lasted {held:.1f} s)"
               if link.backoff else "")
        line = (f"lost worker {link.address} ({err}) while it drained; failed {n} "
                "action(s); it is taken out, not reconnected" if link.drained is not None
                else f"lost worker {link.address} ({err}); failed {n} action(s), "
                     f"reconnecting{why}")
        if err != link.lost_err or t - link.lost_logged >= LINK_LOG_S:
            self._log_lost(link, line)  # (another cause: at once; a repeat: this often)
            link.lost_err, link.lost_logged = err, t
        else:  # a repeat: quiet while sessions come and go (two controllers, say), said
            link.lost_quiet = line  # if a reconnection attempt fails (_reconnect)
            link.lost_skipped += 1
        link.retry_err, link.retry_net = "", False
        link.reconnecting = asyncio.ensure_future(self._reconnect(link))

    async def _note_why(self, link: WorkerLink, e: BaseException) -> None:
        """ListWorkers' cause of a lost worker's failed reconnection (``retry_err``),
        looked at beside the next attempts, not before them (the look may take a second),
        and kept only if the worker is still out of the same loss."""
        lost_at = link.lost_at
        try:
            why = await self._why_unreached(link, e)
        finally:
            link.why_task = None
        if link.lost_at == lost_at and not link.connected and not link.removed:
            link.retry_err, link.retry_net = why, True

    async def _refused_pause(self, wait: float, models_change: bool) -> None:
        """The pause after a worker refused as it connected: ``wait`` seconds (each
        attempt has the worker check every instance again, reading every package: 4 a
        second took a CPU-sixth of its host), cut short when the instances served change
        if ``models_change`` (the unload it waits for, or a load: tried again at once)."""
        seen = dict(self.instances) if models_change else None
        end = time.monotonic() + wait
        while not self._stopping and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(RECONNECT_S, left))
            if seen is not None and self.instances != seen:
                return

    def _log_lost(self, link: WorkerLink, line: str) -> None:
        more = (f" ({link.lost_skipped} more like it not shown)" if link.lost_skipped
                else "")
        link.lost_quiet, link.lost_skipped = "", 0
        print(f"controller: {line}{more}", file=sys.stderr, flush=True)

    async def _reconnect(self, link: WorkerLink) -> None:
        if link.backoff and not self._stopping:
            await asyncio.sleep(link.backoff)
        while not self._stopping and not link.connected and not link.removed:
            try:
                await self._open(link)
            except ValueError as e:
                # it cannot serve a model loaded while it was away (a load checks only the
                # workers connected), or came back with other GPUs: it stays out, and says
                # why (each attempt counted, a line every REFUSED_LOG_S at most)
                self.count("worker_refusals")
                serve = isinstance(e, CannotServe)
                link.retry_err, link.retry_net = str(e), False
                link.refused(f"{e}; it stays out (trying again after {RECONNECT_S:g} s, "
                             f"doubling to {RECONNECT_MAX_S:g} s"
                             + (", and at once when the models served change) until they "
                                "are unloaded" if serve else
                                ") until it runs this controller's version"
                                if isinstance(e, OtherProtocol) else
                                ") until it is restarted as it was"))
                link.refused_wait = (min(RECONNECT_MAX_S, 2 * link.refused_wait)
                                     if link.refused_wait else RECONNECT_S)
                await self._refused_pause(link.refused_wait, serve)
                continue
            except WorkerHeld as e:  # another controller's now: ours once it lets go
                if link.lost_quiet:
                    self._log_lost(link, link.lost_quiet)
                self._held(link, str(e))
                await asyncio.sleep(RECONNECT_S)
                continue
            except (grpc.aio.AioRpcError, TimeoutError, ConnectionError, OSError) as e:
                if link.lost_quiet:  # it is not coming back at once: say it was lost
                    self._log_lost(link, link.lost_quiet)
                if time.monotonic() >= link.lost_again:  # (an operator who looks later
                    # learns it is still out, and why, without reading back an hour)
                    link.lost_again = time.monotonic() + LOST_SAY_AGAIN_S
                    link.retry_err = await self._why_unreached(link, e)
                    link.retry_net = True
                    print(f"controller: worker {link.address} still lost (for "
                          f"{time.monotonic() - link.lost_at:.0f} s; still trying): "
                          f"{link.retry_err}", file=sys.stderr, flush=True)
                elif not link.retry_net and link.why_task is None:
                    link.why_task = asyncio.ensure_future(self._note_why(link, e))
                await asyncio.sleep(RECONNECT_S)
                continue
            except Exception as e:  # noqa: BLE001 - whatever the worker said: keep trying
                self._bad_worker_msg(f"reconnecting to worker {link.address} failed: {e!r}", e)
                await asyncio.sleep(RECONNECT_S)
                continue
            link.refused_wait = 0.0
            if link.held:
                print(f"controller: worker {link.address} reconnected: it is ours again "
                      "(the controller that held it let it go)", file=sys.stderr, flush=True)
            elif not link.lost_quiet:  # (its "lost" line was said: so is this one)
                print(f"controller: worker {link.address} reconnected", file=sys.stderr,
                      flush=True)
            link.lost_quiet = link.held = ""
            self._start_link_tasks(link)
            # the Hello reset it, keeping what it still had of the copies it held
            self.ctrl.worker_back(link.index, now_ns(), self._kept(link.state))

    def _on_results(self, link: WorkerLink, msgs, tail=None) -> str:
        """Decode a batch of results and hand the good ones to the loop. A malformed one
        (``WireError``: an unknown type, bad outputs...; or a type, GPU, model or output
        batch that does not match its action) is logged, counted ``results_malformed``
        and dropped. Returns why the link must be reset, "" if not: a dropped result whose
        id names an outstanding action leaves that action's outcome unknown, so the worker
        is treated as lost (its actions fail and their requests are retried or answered)."""
        off, w = link.offset, link.index
        outstanding = self.ctrl.outstanding[w]
        good: list[Result] = []
        why = ""
        # the fast link: output tensors attached after the message
        cuts, whole = cut_attachments(msgs, tail, "outputs")
        for i, m in enumerate(msgs):
            try:
                if whole is not None:
                    raise whole
                r = msg_to_result(m, w, off, cuts[i] if cuts else None)
                a = outstanding.get(r.id)
                bad = _mismatch(a, r) if a is not None else ""
                if bad:
                    raise WireError(f"result {r.id}: {bad}")
                if a is not None and r.type == ActionType.INFER and not r.status:
                    unfit = _unfit_outputs(r, a, self.profiles.get(a.model),
                                           link.state.device if link.state else "")
                    if unfit:  # (the copy's device failed the batch: as a fault of it)
                        self.count("results_bad_outputs")
                        self._bad_worker_msg(f"worker {link.address}: INFER {r.id} of "
                                             f"{a.model} answered failed: {unfit}")
                        r.status, r.message, r.outputs = (
                            ErrorCode.INVALID_INPUT, f"outputs that do not fit: {unfit}", None)
            except WireError as e:
                self.count("results_malformed")
                self._bad_worker_msg(f"worker {link.address}: malformed result dropped: {e}")
                if not why and m.id in outstanding:
                    why = f"malformed result for outstanding action {m.id} ({e})"
                continue
            good.append(r)
        if good:
            self.ctrl.results(w, good, now_ns())
        return why

    def send(self, worker: int, actions: list[Action]) -> None:
        link = self.links[worker]
        link.pending.extend(actions)
        if self._action_interval:
            # (paced) none is held later than one interval before its latest start (the
            # worker refuses it after that); a writer asleep until its next slot is woken
            # only by an action due before it
            due = min([a.latest for a in actions]) - self._action_interval
            if not link.due or due < link.due:
                link.due = due
            if link.send_at and due >= link.send_at:
                return
        link.wake.set()

    def drained(self, worker: int, failed: int) -> None:
        link = self.links[worker]
        if link.drained is not None:
            link.drain_failed = failed
            link.drained.set()

    def probe(self, worker: int) -> None:
        link = self.links[worker]
        link.echo_due = True  # the worker echoes at once; _reader reports heard_from
        link.wake.set()

    def reset(self, worker: int, keep: list[tuple[int, str, int]]) -> None:
        link = self.links[worker]
        link.pending, link.due = [], 0  # queued before it was suspect: failed already
        link.reset_due = True
        link.keep = keep
        link.wake.set()
        link.liveness_log(f"worker {link.address} answers again; resetting and re-admitting "
                          f"it (asking it to keep its {len(keep)} model copies)")

    def _kept(self, state: pb.WorkerState) -> dict[int, set[str]]:
        """What a worker's answer to a reset says it holds (its GPU -> the models loaded:
        those it kept of the ones the reset listed), counted ``weights_kept``."""
        kept = {g.gpu: set(g.loaded) for g in state.gpus}
        self.count("weights_kept", sum(len(v) for v in kept.values()))
        return kept


def _said_if_failed(task: asyncio.Future) -> None:
    """A drain's task that failed (none should) is said, though its call went away."""
    if not task.cancelled() and task.exception() is not None:
        print(f"controller: a worker's drain failed: {task.exception()!r}", file=sys.stderr,
              flush=True)


async def _takes_connections(host: str, port: int) -> bool:
    """Whether a plain TCP connection to ``host:port`` completes within ``PROBE_S`` (a
    stopped process's port still takes them: its kernel's)."""
    try:
        async with asyncio.timeout(PROBE_S):
            _, w = await asyncio.open_connection(host, port)
        w.close()
        return True
    except (OSError, TimeoutError):
        return False
