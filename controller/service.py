"""The controller service: the scheduler core driven by gRPC events on a real clock.

The glue between the policy and the world is ``controller.loop.ControllerLoop`` (the
same driver the simulator runs); this module is its transport, on one asyncio loop:

- client ``Infer`` / ``InferStream`` -> ``Request`` -> ``loop.requests``;
- worker result batches -> ``loop.results`` (times converted to our clock);
- ``loop.arm`` sets an asyncio timer that calls ``loop.tick``;
- ``send`` queues a worker's actions; its writer task writes them as one
  ``ActionBatch`` per loop iteration (windows converted to that worker's clock);
- ``answer`` answers a waiting client call (exactly once per request).

The model repository (``load_model`` / ``unload_model``; ``controller/repository.py``
puts the KServe face on them): a model loaded at run time is announced to every worker
(an ``InstanceUpdate``, in stream order before any action naming it, answered with the
worker's state) and then added to the policy; one unloaded is removed from the policy at
once (its queued requests are answered ``INVALID_REQUEST`` reason ``unknown_model``, new
ones refused the same way), and forgotten -- by the node and the workers -- once the
policy has evicted its copies and its last request running has been answered.

Each worker's clock offset (worker - controller) is estimated from round trips: a burst
of ``ClockSync`` calls at connect, then echoes on the action stream; the estimate is the
offset of the lowest-RTT sample among recent ones. A worker that disconnects has its
outstanding actions failed back into the policy (so their requests are retried or
answered), and the controller keeps reconnecting to it.

A worker serves one controller at a time (``clockwork.protocol.holding``): every Hello
carries this controller's id (``controller_id``, random, made once) and its words
(``label``). A worker another controller holds refuses us (``WorkerHeld``): said once,
counted (``worker_held_refusals``) at each attempt, and we keep trying -- at start until
``connect_timeout``, later for as long as we run -- until that controller's connection
ends.

The links to the workers (connecting, Hello, the action writer, the result reader, a
lost worker and its reconnection) are in ``controller/links.py``, whose ``WorkerLinks``
this node inherits; the clockwork.v1 servicer and the listeners are in
``controller/grpc_api.py``, the ``clockwork controller`` command in
``controller/command.py``.

Security (``clockwork.protocol.security``, SECURITY.md): with ``--token`` every client call
on every port must carry the bearer token; with a cluster secret every call to a worker
carries our proof and the worker's answer must carry its own, or the worker is refused;
with ``--tls-cert``/``--tls-key`` every listener speaks TLS, and ``--worker-tls-ca`` makes
the links to the workers TLS too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import sys
import time
import traceback
from dataclasses import dataclass

import grpc

from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.names import BASE_NAME_RULE, MODEL_NAME
from clockwork.profiles import ModelProfile, load_profile_set
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import keepalive
from clockwork.protocol.holding import controller_label, new_controller_id
from clockwork.protocol.listen import LISTEN_OPTIONS
from clockwork.protocol.ratelog import LogLimiter
from clockwork.protocol.security import (
    ClusterAuth,
    Refusals,
)
from clockwork.protocol.wire import (
    add_tensors,
    msgs_to_tensors,
)
from clockwork.requests import Answer, Reply, Request
from clockwork.sizes import (
    MAX_INSTANCES,
    MAX_LOAD_COPIES,
)
from clockwork.tensors import (
    Tensor,
    TensorError,
    check_inputs,
    zero_rows,
)
from clockwork.time import MAX_SLO_MS, ms
from controller import links, make_policy, policy_class
from controller.config import SchedulerConfig
from controller.inflight import failed_code
from controller.intake import (
    CLIENT_CLOCK_WINDOW_NS,
    STOPPING_MESSAGE,
    Gate,
)
from controller.limits import Limits
from controller.links import (
    CHANNEL_OPTIONS,
    ListedTwice,
    WorkerLink,
    WorkerLinks,
    _canonical,
    _endpoints,
)
from controller.loop import NO_WORKER_FOR_REQUEST, ControllerLoop, Liveness
from controller.metrics import ControllerMetrics
from controller.policy import CANCELLED, NO_GPU_LEFT, GpuSpec, Policy
from controller.repository import RepositoryError, shutting_down
from controller.repository import group_name as _group_name

now_ns = time.monotonic_ns
# counter keys, made once (these run for every action, result and reply)
_SENT_KEY = {t: f"{t.name.lower()}_sent" for t in ActionType}
_RESULT_KEY = {t: (f"{t.name.lower()}_rejected", f"{t.name.lower()}_ok") for t in ActionType}
_STATUS_NAME = {s: s.name.lower() for s in RequestStatus}
_STATUS_KEY = {s: f"requests_{s.name.lower()}" for s in RequestStatus}
LOG_FLUSH_S = 1.0  # --log-flush-s: a crash loses at most this much of the logs
LOG_ROWS_PER_STEP = 256  # log rows formatted and written between turns of the event loop
# at start, a worker whose gRPC server has not answered within SAY_WAITING_S: one line that
# we wait for it (up to --connect-timeout)
SAY_WAITING_S = 0.5
# at start, when the look at which workers answer took all of --connect-timeout (some did
# not), those that did still get this long for their Hellos
HELLO_MIN_S = 5.0
SERVER_OPTIONS = [*CHANNEL_OPTIONS, *LISTEN_OPTIONS, *keepalive.CLIENT_SERVER]
# the model repository
LOG_ERROR_EVERY_S = 60.0  # a failing log write is said at most this often
UNKNOWN_LOG_S = 60.0  # a result for no outstanding action is said at most this often
MAX_SERVED = MAX_INSTANCES  # instances served at once (--models, then loads)
# an InstanceUpdate's answer is waited for while its worker is heard from (its echoes
# every ECHO_S at least): the worker reads a new package on a thread, and answers once it
# has, which takes from a fraction of a second (a cpu package) to minutes (a cuda
# package's first kernel build); silent this long, it did not take the update
UPDATE_TIMEOUT_S = 30.0
# ... and however lively it is, no longer than links.UPDATE_MAX_S in all (one bound with
# the Hello's wait)
UNLOAD_WAIT_S = 60.0  # a load waits this long for an unload of the same names to finish
UNLOADED_KEPT = 1000  # unloaded instances the index still lists (the newest ones)
UNLOAD_POLL_S = 0.005  # how often an unload looks whether its copies and requests are gone
NO_WORKER_FOR_LOAD = ("no worker is connected and answering to take the model (a load "
                      "completes once a connected worker can serve it); nothing was loaded: "
                      "try again once a worker is back")
_COPY_SUFFIX = re.compile(r"(.+):([0-9]+)")


HINT_NAMES = 3  # an unknown name's message: the closest names it lists
HINT_WINDOW = 64  # ... chosen among this many on either side of it in name order
HINT_ECHO = 130  # characters of the unknown name itself a message repeats
UNKNOWN_SAID = 256  # unknown names whose messages are kept (ControllerNode.unknown_model)


def echo_name(name: object) -> str:
    """``repr(name)`` cut to ``HINT_ECHO`` characters: a client's name, said back."""
    s = repr(name)
    return s if len(s) <= HINT_ECHO else s[:HINT_ECHO - 3] + "..."


def closest_names(name: str, names: list[str], n: int = HINT_NAMES) -> list[str]:
    """The few of ``names`` (sorted) closest to ``name`` (difflib's ratio), looked for
    among the ``HINT_WINDOW`` names on either side of where ``name`` sorts (all of
    them when there are few): a message names these, never every name, and finding
    them takes the same few milliseconds however many names there are."""
    import bisect
    import difflib

    if not isinstance(name, str) or not names:
        return []
    name = name[:HINT_ECHO]
    if len(names) > 4 * HINT_WINDOW:
        i = bisect.bisect_left(names, name)
        names = names[max(0, i - HINT_WINDOW):i + HINT_WINDOW]
    return difflib.get_close_matches(name, names, n=n, cutoff=0.6)


def unknown_message(what: str, name: object, names: list[str], count: int,
                    counted: str) -> str:
    """``unknown model 'resnet5' (did you mean 'resnet50_v2'? 12 served)``: the name
    said back (cut), the closest of ``names`` (sorted), and ``count`` -- bounded,
    however many names there are."""
    close = closest_names(name, names) if isinstance(name, str) else []
    hint = f"did you mean {' or '.join(map(echo_name, close))}? " if close else ""
    return f"{what} {echo_name(name)} ({hint}{count:,} {counted})"


def server_options(limits: Limits) -> list[tuple[str, object]]:
    """The client-facing gRPC server's options: ``SERVER_OPTIONS`` with the receive limit
    of ``limits`` (``grpc_max_receive_bytes``)."""
    own = limits.grpc_server_options()
    keys = {k for k, _ in own}
    return [(k, v) for k, v in SERVER_OPTIONS if k not in keys] + own


def parse_models(spec: str | None, profiles: dict[str, ModelProfile]) -> dict[str, str]:
    """``"resnet50_v2:4,vgg16"`` -> instance name -> profile name (copies named
    ``m``, ``m:1``, ...). Empty: every profile of the set, one copy. Each item is checked
    like a ``[[models]]`` entry; a bad one raises ``ValueError`` with one line."""
    from clockwork.scenario import parse_value
    from clockwork.settings import ModelEntry, SettingsError, validate

    out: dict[str, str] = {}
    if not spec:
        return {m: m for m in sorted(profiles)}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, colon, copies = part.partition(":")
        entry = {"name": name.strip(), "copies": parse_value(copies.strip()) if colon else 1}
        m = validate(ModelEntry, entry, where=f"--models {part}")
        if m.name not in profiles:
            close = closest_names(m.name, sorted(profiles), n=1)
            hint = f" (did you mean {echo_name(close[0])}?)" if close else ""
            raise SettingsError(f"--models {part}: no profile for model {m.name!r}{hint}; "
                                f"known: {', '.join(sorted(profiles))}")
        if len(out) + m.copies > MAX_SERVED:
            raise SettingsError(f"--models {part}: at most {MAX_SERVED:,} instances in "
                                f"all, got {len(out) + m.copies:,} with this item")
        for k in range(m.copies):
            inst = m.name if k == 0 else f"{m.name}:{k}"
            if inst in out:
                raise SettingsError(f"--models {part}: model instance {inst!r} is listed twice")
            out[inst] = m.name
    if not out:  # (",,": items all empty, not the empty default that means every model)
        raise SettingsError(f"--models {spec!r}: names no model (leave it out, or give "
                            "an empty string, to serve every profile of the set once)")
    return out


@dataclass
class LoadedModel:
    """What one load made: the instances of ``name`` (``name``, ``name:1``, ...) and the
    parameters they were loaded with (a second identical load is a no-op)."""

    profile: str
    copies: int
    package: str
    instances: list[str]


class ControllerNode(WorkerLinks):
    """The controller's shell state. Construct, ``await start()``, serve, ``await stop()``."""

    # the bounds on what clients may hold and send (controller/limits.py); cmd_controller
    # sets them from --limit before the node starts
    limits: Limits = Limits()

    # the link to the workers: the cluster secret (None: no proofs either way) and TLS
    # credentials to dial them with (None: plaintext), for gRPC and for their fast links
    cluster_auth: ClusterAuth | None = None
    insecure_no_auth: bool = False  # --insecure-no-auth: far workers without the secret too
    worker_credentials: grpc.ChannelCredentials | None = None
    worker_tls: ssl.SSLContext | None = None
    clients_tls: bool = False  # --tls-cert: a far worker linked in the clear is warned of
    plaintext_said: frozenset[str] = frozenset()  # (the workers at start so warned of)
    _worker_refusals: Refusals | None = None

    def __init__(self, workers: list[str], profiles: str = "v100-reference",
                 models: str | None = None, policy: str = "clockwork",
                 cfg: SchedulerConfig | None = None, connect_timeout: float = 30.0,
                 log_dir: str | None = None, action_interval_us: float = 0.0,
                 reply_interval_us: float = 0.0, settings: dict | None = None,
                 log_flush_s: float = LOG_FLUSH_S, log_format: str = "tsv",
                 adopt_weights: bool = True) -> None:
        self.pset = load_profile_set(profiles)
        self.log_flush_s = log_flush_s
        # stream pacing (clockwork.protocol.pacing): per worker action stream, per client stream
        self.action_interval_us = action_interval_us
        self._action_interval = round(action_interval_us * 1000)  # ns (0: not paced)
        self.reply_interval_us = reply_interval_us
        # instance -> profile name: every instance the workers are told of (served, loading,
        # unloading); ``profiles``: those that take requests (and unloading ones whose
        # last requests still run), as ModelProfiles named after the instance
        self.instances = parse_models(models, self.pset.profiles)
        self._hello_list: tuple[tuple, bytes] | None = None  # (instances, packages), encoded
        self.profiles = {i: self.pset.profiles[m].renamed(i) for i, m in self.instances.items()}
        # the model repository: models as loaded (at start or by load_model), instances
        # being loaded / unloaded, instances unloaded (the index lists them UNAVAILABLE)
        self.loaded: dict[str, LoadedModel] = {}
        for i, m in self.instances.items():
            g = self.loaded.setdefault(_group_name(i), LoadedModel(m, 0, "", []))
            g.copies += 1
            g.instances.append(i)
        self._names_served: list[str] | None = None  # sorted(self.loaded), made when asked
        self._largest: tuple[list, int] = ([], 0)  # (the links' states, largest_cache())
        # unknown_model's messages while _names_served and the count served stay the same:
        # (that list, the count, name -> message)
        self._unknown_said: tuple[list | None, int, dict[str, str]] = (None, -1, {})
        self.packages: dict[str, str] = {}  # instance -> its package (load_model's package)
        self.loading: set[str] = set()
        self.unloading: set[str] = set()
        self.unloaded: dict[str, str] = {}  # instance -> the profile it had
        # loads and unloads of one model (a name and its copies' names) one at a time, in
        # the order they came; of different models side by side (a load may wait up to
        # UPDATE_MAX_S for a worker it hears from: an unload of another model must not wait)
        self._model_locks: dict[str, list] = {}  # model -> [its asyncio.Lock, users]
        self._update_seq = 0
        self._unloads: set[asyncio.Task] = set()
        self.policy_name = policy
        # at start, take over the weights the workers still hold (a controller restarted
        # on running workers) instead of emptying their caches, if the policy can
        self.adopt_weights = adopt_weights and policy_class(policy).adopts_weights
        self.cfg = cfg or SchedulerConfig()
        self.settings = settings or {}  # the policy's own settings (baselines)
        self.connect_timeout = connect_timeout
        # who we are to the workers (Hello.controller_id, Hello.controller): the id tells
        # our own reconnection from another controller's Connect; the words name us in a
        # worker's refusal of another controller (serve_controller adds our port)
        self.controller_id = new_controller_id()
        self.label = controller_label()
        self.links = [WorkerLink(i, _canonical(a)) for i, a in enumerate(workers)]
        self._add_lock = asyncio.Lock()  # workers joining at run time, one at a time
        # the adds asked for and not ended, (address, endpoints) each: a remove of one of
        # those workers waits for its add's end
        self._adds_pending: list[list] = []
        # listed workers removed while still awaited: their addresses and endpoints
        self._removed_awaited: set[str] = set()
        self._removed_awaited_at: frozenset = frozenset()
        # listed workers that did not answer at start: address -> the task that adds it
        # once it answers (/readyz is 503 meanwhile)
        self.awaited: dict[str, asyncio.Future] = {}
        self.awaited_why: dict[str, str] = {}  # why each is not in yet (its last look)
        self.answered_at_stop = 0  # requests still waiting when it stopped (ERROR shutdown)
        # until start() is done (its workers awaited): the front ends answer the probes
        # only, every other call "starting" (STARTING_MESSAGE)
        self.starting = True
        self.ctrl: ControllerLoop | None = None
        self.policy: Policy | None = None
        self.gpu_index: dict[tuple[int, int], int] = {}
        self.pending: dict[int, Request] = {}  # request id -> Request (not yet answered)
        self.next_id = 1
        self.counters: dict[str, int] = {}
        self.gate = Gate(self)  # requests outstanding, in all and per connection
        self._bad_worker_msg = LogLimiter("controller")
        # results for no outstanding action: said at most once a minute (a reset's
        # stragglers come in bursts)
        self._unknown_results = LogLimiter("controller", every=UNKNOWN_LOG_S)
        # a log write that fails (a full disk) fails again at every flush: said once a
        # minute, and once when writing works again
        self._log_error = LogLimiter("controller", every=LOG_ERROR_EVERY_S)
        self._log_bug = LogLimiter("controller", every=LOG_ERROR_EVERY_S)  # (its own: a
        # full disk's line does not hide a bug's)
        self._flush_failures = 0  # flushes failed since the last that worked
        self._rows_gone_said = False  # (_said_rows_gone)
        self._spill_said = False  # that npz rows stopped going to their files
        self.logs_lost = ""  # why the logs could not be written at stop (exit status 1)
        self._tick_handle: asyncio.TimerHandle | None = None
        self._stopping = False
        self._stops: set[asyncio.Future] = set()  # waits that end when the controller stops
        # the open streams' "the controller stops" callbacks (intake.serve_stream, the
        # KServe stream): each stops reading, sends what is answered and ends its call
        self.stream_closers: set = set()
        self._no_worker = False  # set by submit_many: no worker available to admit to
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics = ControllerMetrics(self)
        self.log_dir = log_dir  # requests.tsv / actions.tsv like the simulator's, at stop
        self.telemetry = None
        self._log_steps = None  # a periodic log flush under way (Telemetry.flush_steps)
        if log_dir:
            import tempfile
            from pathlib import Path

            from clockwork.telemetry import Telemetry

            try:  # a log folder we cannot write is said now, not at the first flush or stop
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                # (a file made and gone: os.access says yes to root where nothing can be
                # made, in /proc say)
                with tempfile.TemporaryFile(dir=log_dir):
                    pass
                # npz logs are written once, at stop: until then the rows wait in column
                # files in log_dir (memory stays flat however long the controller runs)
                # (rows converted LOG_ROWS_PER_STEP at a time, a short hold of the loop each)
                self.telemetry = Telemetry(now_ns(), log_format,
                                           spill_dir=log_dir if log_format == "npz" else None,
                                           buffer_rows=LOG_ROWS_PER_STEP)
            except OSError as e:
                raise ValueError(f"--log-dir {log_dir}: cannot make a file there "
                                 f"({e.strerror or e})") from None

    def write_logs(self, final: bool = False) -> None:
        """TSV logs: append the request/action rows since the last call to ``log_dir``'s
        logs. npz logs: written once, when ``final`` (at stop). A final write that fails
        sets ``logs_lost`` (the controller exits 1); npz rows in their column files are
        then left there (``clockwork report`` reads them), not removed."""
        if self.telemetry is not None:
            from pathlib import Path
            failed = None
            try:
                if self._log_steps is not None:  # a periodic flush stopped midway: its rows
                    for _ in self._log_steps:
                        pass
                self.telemetry.flush(Path(self.log_dir), final=final)
            except OSError as e:  # (as in _flush_logs: whole rows kept, these lost)
                failed = e
                self.count("log_flush_errors")
                print(f"controller: writing the logs in {self.log_dir} failed ({e})",
                      file=sys.stderr, flush=True)
            finally:
                self._log_steps = None
            if final:
                self._said_spill_error()
                folder = self.telemetry.spill_folder
                if failed is None or folder is None or not folder.is_dir():
                    self.telemetry.close()  # (npz: the rows' column files go)
                else:  # (the only copy of the rows that reached the disk: kept)
                    self.telemetry.keep()
                    for name in ("requests.npz", "actions.npz"):  # (one written before
                        # the other failed: report would read it, not the rows, as logs
                        # incomplete; earlier runs' were renamed aside before this write)
                        (Path(self.log_dir) / name).unlink(missing_ok=True)
                    print(f"controller: the rows written before are left in {folder} "
                          f"(clockwork report {self.log_dir} reads them)", file=sys.stderr,
                          flush=True)
                if failed is not None:
                    self.logs_lost = f"its logs in {self.log_dir} were not written ({failed})"
                elif self.counters.get("log_flush_errors"):
                    self.logs_lost = (f"its logs in {self.log_dir} miss the rows of "
                                      f"{self.counters['log_flush_errors']} flush(es) that "
                                      "failed")

    def _said_spill_error(self) -> None:
        """Say once that npz rows stopped going to their column files (a full disk): those
        after it wait in memory until stop."""
        err = self.telemetry.spill_error if self.telemetry is not None else None
        if err is not None and not self._spill_said:
            self._spill_said = True
            print(f"controller: log rows stopped going to files in {self.log_dir} ({err}); "
                  "the rows from now on wait in memory until the logs are written at stop",
                  file=sys.stderr, flush=True)

    async def _flush_logs(self) -> None:
        """With --log-dir: write the logs out every ``log_flush_s`` (memory stays flat; a
        crash loses at most that much), in steps of ``LOG_ROWS_PER_STEP`` rows with the
        loop free between them: at a few thousand requests per second, one second's rows
        took 10-15 ms to format, and every request and worker waited meanwhile."""
        from pathlib import Path
        while True:
            await asyncio.sleep(self.log_flush_s)
            self._log_steps = self.telemetry.flush_steps(Path(self.log_dir),
                                                         rows_per_step=LOG_ROWS_PER_STEP)
            try:
                for _ in self._log_steps:
                    await asyncio.sleep(0)
            except OSError as e:  # a full disk, the folder gone: this flush's rows are lost,
                # the files still end with whole rows, and the next flush tries again
                self.count("log_flush_errors")
                self._flush_failures += 1
                self._log_error(f"writing the logs in {self.log_dir} failed ({e}); this "
                                f"flush's rows are lost, the next one tries again")
            except Exception as e:  # noqa: BLE001 - a bug: said with its traceback; the
                # flusher goes on (ended, every later row would wait in memory unwritten)
                self.count("log_flush_errors")
                self._flush_failures += 1
                where = "".join(traceback.format_exception(e)).rstrip()  # (a ValueError's
                # too, which LogLimiter takes for bad input and says without one)
                self._log_bug(f"writing the logs in {self.log_dir} failed ({e!r}); this "
                              f"flush's rows are lost, the next one tries again\n{where}")
            else:
                if self._flush_failures:
                    print(f"controller: writing the logs in {self.log_dir} works again "
                          f"({self._flush_failures} flush(es) failed before, their rows "
                          "lost)", file=sys.stderr, flush=True)
                    self._flush_failures = 0
                self._said_spill_error()
                self._said_rows_gone()
            self._log_steps = None

    def _said_rows_gone(self) -> None:
        """Say once that npz rows' files were removed while open (their folder removed by
        hand or a clean-up job): nothing is lost, but it went unsaid, and their rows were
        then lost at stop."""
        if self._rows_gone_said or not self.telemetry.rows_files_gone():
            return
        self._rows_gone_said = True
        print(f"controller: the files of the logs' rows in {self.telemetry.spill_folder} "
              f"were removed while open: their rows are still read through them and "
              f"written to {self.log_dir} at stop (made again then); until then they take "
              "disk space no folder shows", file=sys.stderr, flush=True)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    # ------------------------------------------------------------------ workers

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.connect_timeout
        seen: dict[tuple[str, int], WorkerLink] = {}
        for link in self.links:  # one worker listed twice would be taken back and forth
            link.endpoints = await _endpoints(link.address)
            for ep in link.endpoints:
                if seen.setdefault(ep, link) is not link:
                    raise ListedTwice(f"workers {seen[ep].address} and {link.address} are one "
                                      f"listener ({ep[0]} port {ep[1]}): list each worker once")
        said = asyncio.ensure_future(self._say_waiting())
        try:  # first whether each answers at all (no Hello yet: the indices may change)
            lasts = await asyncio.gather(*(self._reach(link, deadline) for link in self.links))
        finally:
            said.cancel()
        left = [(lk, last) for lk, last in zip(self.links, lasts, strict=True) if last is not None]
        whys = list(zip([lk.address for lk, _ in left], await asyncio.gather(
            *(self._why_unreached(lk, last) for lk, last in left)), strict=True))
        if len(left) == len(self.links):  # (each one's reason)
            raise ConnectionError("; ".join(self._unreached_text(a, why, "--connect-timeout")
                                            for a, why in whys))
        # one that does not answer (stopped, hung, down) is left out, and added once it
        # answers (_join_later): it kept the whole cluster from starting
        if left:
            self.links[:] = [lk for lk, last in zip(self.links, lasts, strict=True)
                             if last is None]
            for i, lk in enumerate(self.links):
                lk.index = i
        # then each one that answered takes its Hello, within what is left of the wait
        # (a few seconds at least, when the look at the others took it all)
        deadline = max(deadline, time.monotonic() + HELLO_MIN_S)
        await asyncio.gather(*(self._connect(link, deadline, "--connect-timeout")
                               for link in self.links))
        specs = []
        for link in self.links:
            for g in link.state.gpus:
                self.gpu_index[(link.index, g.gpu)] = len(specs)
                specs.append(GpuSpec(link.index, g.gpu, g.pages))
        self.policy = make_policy(self.policy_name, list(self.profiles.values()), specs, self.cfg,
                                  self.settings)
        self.ctrl = ControllerLoop(self.policy, self, specs, self.telemetry, observer=self,
                                   liveness=Liveness.of(self.cfg))
        if whys and type(self.policy).add_gpu is Policy.add_gpu:  # (it could never join)
            raise ConnectionError(f"{self._unreached_text(*whys[0], '--connect-timeout')}, "
                                  f"and policy {self.policy_name} cannot add it later")
        for address, why in whys:
            self.awaited_why[address] = why
            self.awaited[address] = asyncio.ensure_future(self._join_later(address, why))
        if self.adopt_weights:
            for link in self.links:
                self._adopt(link)
        self._say_unfit()
        for link in self.links:
            self._start_link_tasks(link)
        self.starting = False

    def largest_cache(self) -> int:
        """Pages of the largest GPU weights cache of the workers (0 before any answered;
        a removed worker's counts no more: it never comes back); kept while no worker's
        state changes (a repository index asks it per name)."""
        states = [lk.state for lk in self.in_service()]
        seen, pages = self._largest
        if len(states) != len(seen) or any(a is not b for a, b in zip(states, seen, strict=True)):
            pages = max((g.pages for st in states if st for g in st.gpus), default=0)
            self._largest = (states, pages)  # (the states held: each one's identity)
        return pages

    def unfit(self, name: str) -> str:
        """Why model instance ``name`` fits on no GPU ("" if one can hold it): its requests
        are answered ERROR, and it is not ready."""
        p, biggest = self.profiles.get(name), self.largest_cache()
        if p is None or p.weights_pages <= biggest:
            return ""
        return (f"fits on no GPU: needs {p.weights_pages:,} pages of weights cache, the "
                f"largest has {biggest:,}")

    def _say_unfit(self) -> None:
        """At start, one line naming the models no GPU can hold (each answered ERROR, not
        ready), so that the operator hears of it before their clients do."""
        unfit = sorted((p.weights_pages, i) for i, p in self.profiles.items()
                       if self.unfit(i))
        if unfit:
            biggest = self.largest_cache()
            names = ", ".join(f"{i} ({n:,} pages)" for n, i in unfit[:5])
            more = f" and {len(unfit) - 5} more" if len(unfit) > 5 else ""
            print(f"controller: warning: {len(unfit)} model instance(s) fit on no GPU (the "
                  f"largest weights cache has {biggest:,} pages): {names}{more}; their "
                  "requests are answered ERROR and they are not ready", file=sys.stderr,
                  flush=True)

    async def _say_waiting(self) -> None:
        """At start, ``SAY_WAITING_S`` in: one line naming the workers whose gRPC server
        has not answered yet, if any, and how long we wait for them (a worker another
        controller holds has answered: ``_held`` says why we wait)."""
        await asyncio.sleep(SAY_WAITING_S)
        quiet = [lk.address for lk in self.links if not lk.reached]
        if not quiet:
            return
        names = ", ".join(quiet[:5]) + (f" and {len(quiet) - 5} more" if len(quiet) > 5
                                        else "")
        who = (f"worker {names} is" if len(quiet) == 1 else f"workers {names} are")
        them = "it" if len(quiet) == 1 else "them"
        print(f"controller: {who} not answering yet; waiting up to "
              f"{self.connect_timeout:g} s for {them} (--connect-timeout)", file=sys.stderr,
              flush=True)

    # ------------------------------------------------------------------ events


    # -- the ControllerLoop's transport (controller.loop.ControllerTransport) and observer


    def answer(self, replies: list[Reply]) -> None:
        self._answer(replies)

    def arm(self, at: int) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._tick_handle = self.loop.call_later(max(0.0, (at - now_ns()) / 1e9), self._on_tick)

    def _on_tick(self) -> None:
        self._tick_handle = None
        if not self._stopping:
            self.ctrl.tick(now_ns())

    def sent(self, a: Action) -> None:
        self.count(_SENT_KEY[a.type])
        self.metrics.action_sent(a.type.name)

    def result(self, a: Action | None, r: Result) -> None:
        """An action's result; ``a`` None: one the loop failed itself (its worker lost or
        suspect), counted as a rejected one too, as /metrics and the action log count it
        (the Stats counters behind a live replay's summary left them out)."""
        self.count(_RESULT_KEY[r.type][r.status == ErrorCode.SUCCESS])
        self.metrics.result(a, r)

    def unknown(self, worker: int, r: Result) -> None:
        self.count("results_unknown")
        self._unknown_results(
            f"worker {self.links[worker].address} answered {r.type.name} {r.id}, which is not "
            "outstanding (a duplicate, or sent before the worker was reset or lost): ignored, "
            "counted results_unknown")

    def suspect(self, worker: int, failed: int, reason: str = "") -> None:
        self.count("worker_suspects")
        link = self.links[worker]
        link.changed = time.monotonic()  # (ListWorkers: its time in this state)
        link.liveness_log(f"worker {link.address} is suspect "
                          f"({reason or 'no answer to a probe'}); {failed} action(s) failed")

    def readmitted(self, worker: int) -> None:
        self.count("worker_readmissions")
        self.links[worker].changed = time.monotonic()

    def log_refused(self, model: str, slo_ms: float, status: RequestStatus,
                    now: int | None = None, rid: int | None = None) -> None:
        """A request answered at once, without the scheduler (invalid, no worker,
        overloaded, the controller stopping): its row in the request log (``--log-dir``),
        as every request the scheduler answers has one (latency 0, GPU -1; a model not
        served is logged as ""). ``rid``: its id (None: one is taken)."""
        tel = self.telemetry
        if tel is None:
            return
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        now = now_ns() if now is None else now
        slo = (max(1, ms(slo_ms)) if isinstance(slo_ms, float | int) and 0 < slo_ms <= MAX_SLO_MS
               else self.cfg.default_slo)
        tel.reply(Reply(Request(rid, model if model in self.profiles else "", now, slo),
                        status, now))

    def _answer(self, replies: list[Reply]) -> None:
        pending = self.pending
        metrics, tel = self.metrics, self.telemetry
        for rep in replies:
            r = rep.request
            if pending.pop(r.id, None) is None:
                self.count("replies_duplicate")
                continue
            status = _STATUS_NAME[rep.status]
            self.count(_STATUS_KEY[rep.status])
            if rep.status == RequestStatus.ERROR and rep.message == CANCELLED:
                self.count("requests_cancelled")
            metrics.answered(rep, status)
            if tel is not None:
                r.slo = r.slo or self.cfg.default_slo
                tel.reply(rep)
            try:
                resp = self._response(rep, r)
            except Exception as e:  # noqa: BLE001 - a bug: still one answer, ERROR
                self.count("replies_bad_answer")
                print(f"controller: building the answer to request {r.id} failed: {e!r}",
                      file=sys.stderr, flush=True)
                msg = "internal error"
                resp = (Answer(RequestStatus.ERROR, msg, gpu=rep.gpu) if r.typed
                        else pb.InferResponse(status=RequestStatus.ERROR, message=msg,
                                              gpu=rep.gpu))
            r.tag(resp)
            r.tag = r.inputs = None  # answered: whatever still holds it holds no tensors

    def _response(self, rep: Reply, r: Request):
        """The answer to deliver: a ``pb.InferResponse``, or an ``Answer`` for a typed
        request (KServe), with the request's output rows (views into the batch's outputs,
        no copy; zeros of the output shapes from an emulated device)."""
        status, latency = rep.status, rep.time - r.arrival
        outs = ()
        if r.want_outputs and status == RequestStatus.SUCCESS:
            batch = rep.outputs
            if batch:
                row = r.row
                try:
                    outs = [t.row(row) if t.shape else t for t in batch]
                except (IndexError, ValueError) as e:  # answered all the same, ERROR
                    self.count("replies_bad_outputs")
                    msg = f"the worker's outputs do not fit: {e}"
                    if r.typed:
                        return Answer(RequestStatus.ERROR, msg, latency_ns=latency, gpu=rep.gpu)
                    return pb.InferResponse(status=RequestStatus.ERROR, gpu=rep.gpu,
                                            message=msg, latency_ns=latency)
            else:  # the emulated device computes nothing
                outs = zero_rows(self.profiles[r.model].outputs)
        reason = ""
        if status == RequestStatus.INVALID_REQUEST and (
                r.model not in self.profiles or r.model in self.unloading):
            reason = "unknown_model"  # (also: its model was unloaded meanwhile)
        elif status == RequestStatus.ERROR:
            if rep.message == STOPPING_MESSAGE:
                reason = "shutdown"
            elif rep.message == CANCELLED:
                reason = "cancelled"  # (read by nobody: counted)
            elif rep.message in (NO_GPU_LEFT, NO_WORKER_FOR_REQUEST):
                # (queued as the last worker was removed, or went: no_worker_wait)
                reason = "no_worker"
            elif failed_code(rep.message) == ErrorCode.WORKER_LOST:
                reason = "worker_lost"  # its worker went away and no retry was in time
        if r.typed:
            return Answer(int(status), rep.message, reason, outs, latency, rep.batch_size,
                          rep.gpu, r.cold)
        resp = pb.InferResponse(status=int(status), message=rep.message, reason=reason,
                                latency_ns=latency, batch_size=rep.batch_size, gpu=rep.gpu,
                                cold=r.cold)
        if outs:
            add_tensors(resp.outputs, outs)
        return resp

    def withdraw(self, ids) -> None:
        """The caller of the requests ``ids`` (one call's) went away, a cancelled call or
        a closed connection: those still waiting in a queue are answered now, ERROR
        ``CANCELLED``, which nobody reads (``Policy.cancel``); they take no GPU time and no
        place before the requests whose callers wait, and their inputs' bytes count no
        more against the bounds."""
        rs = self._pending_of(ids)
        if rs:
            self.ctrl.cancel(rs, now_ns())

    def arrived_earlier(self, ids, by: int) -> None:
        """The requests ``ids`` (one stream's) were sent ``by`` ns earlier than they were
        admitted as (their stream's clock found it out later: ``ClientClock``): those
        still waiting in a queue count from then, and are answered TIMEOUT once they can
        no longer finish within their SLO (``Policy.arrived_earlier``)."""
        rs = self._pending_of(ids)
        if rs:
            self.ctrl.arrived_earlier(rs, by, now_ns())

    def _pending_of(self, ids) -> list[Request]:
        """The requests of ``ids`` not answered yet."""
        pending = self.pending
        return [r for r in map(pending.get, ids) if r is not None]

    def submit(self, req: pb.InferRequest, deliver, budget: int | None = None) -> None:
        """A client request; ``deliver(InferResponse)`` is called exactly once. ``budget``
        (ns): what is left of the client's call deadline; the SLO is cut to it."""
        self.submit_many((req,), deliver, 0, budget)

    def submit_many(self, reqs, deliver, late: int = 0, budget: int | None = None) -> None:
        """Several client requests that arrived together (one stream message): admitted
        at one ``now``, their actions sent and replies drained once. ``late`` (ns): how
        much longer than the stream's fastest message this one took to arrive; its
        requests count as having arrived that much earlier (an SLO runs from the
        client's send, not from our receipt; and each request older by its own wait in
        the client before the message went, ``queued_ns``: from the client's submit)."""
        now = now_ns()
        admit = self._admit
        # no worker connected and answering: each request is answered at once, not
        # queued for a GPU that none can give it (it would wait out its SLO); the rule
        # of ``ControllerLoop.no_worker``, which the simulator applies, read here from the
        # links (they include workers the loop has not been given yet, still joining)
        # (a node with no worker links at all, as tests build, admits as before)
        serving = self.in_service()  # (not the removed: a walk of them cost each request)
        self._no_worker = bool(self.links) and not any(self.available(lk) for lk in serving)
        self.ctrl.requests([r for r in (admit(req, deliver, now, late, budget) for req in reqs)
                            if r is not None], now)

    def no_worker_message(self, model: str = "") -> str:
        """What a request for ``model`` is told while no worker takes work:
        ``NO_WORKER_FOR_REQUEST``, or, where a worker is connected but refused (it cannot
        serve a model served: a package it could not load), that refusal, one naming
        ``model`` first (it read "none is connected")."""
        refusals = [lk.retry_err for lk in self.in_service()
                    if lk.retry_err and not lk.retry_net and not lk.connected]
        refused = next((r for r in refusals if model and model in r),
                       refusals[0] if refusals else None)
        if refused is None:
            return NO_WORKER_FOR_REQUEST
        return (f"no worker is available to serve the model: {refused[:400]}; it stays out "
                "until that is mended (the controller's log says more)")

    def _admit(self, req: pb.InferRequest, deliver, now: int, late: int = 0,
               budget: int | None = None) -> Request | None:
        """Check a request; answer it at once if it is invalid, else make its Request.
        ``req`` is a ``pb.InferRequest``, or an object with the same fields whose inputs
        are Tensors already (the KServe front end)."""
        rid = self.next_id
        self.next_id += 1
        self.count("requests")
        if self._stopping:
            self.count(_STATUS_KEY[RequestStatus.ERROR])
            self.metrics.reply(req.model if req.model in self.profiles else "", "error", None)
            self.log_refused(req.model, req.slo_ms, RequestStatus.ERROR, now, rid)
            deliver(pb.InferResponse(status=RequestStatus.ERROR, reason="shutdown",
                                     message=STOPPING_MESSAGE, client_id=req.client_id,
                                     gpu=-1))
            return None
        prof = self.profiles.get(req.model)
        bad = inputs = None
        reason = ""
        typed = not isinstance(req, pb.InferRequest)  # KServe's rows: answered with Answers
        if prof is None or (self.unloading and req.model in self.unloading):
            # (the message's hint is made here only: a name not served; one being
            # unloaded is not served either, and its policy may have forgotten it)
            bad, reason = self.unknown_model(req.model), "unknown_model"
        elif not 0 <= req.slo_ms <= MAX_SLO_MS:  # also refuses nan and inf
            bad, reason = (f"slo_ms must be a number from 0 (the default SLO) to "
                           f"{MAX_SLO_MS:.0f}, got {req.slo_ms}"), "bad_slo"
        elif req.inputs:
            if typed and getattr(req, "checked", None) is prof:  # cut to its specs (KServe)
                inputs = req.inputs
            else:
                inputs, bad = _check_inputs(req.inputs, prof)
                reason = "bad_input"
        cid = req.client_id
        if bad is not None:
            self.count("requests_invalid_request")
            self.metrics.reply(req.model if prof is not None else "", "invalid_request", None)
            self.log_refused(req.model, req.slo_ms, RequestStatus.INVALID_REQUEST, now, rid)
            deliver(pb.InferResponse(status=RequestStatus.INVALID_REQUEST, message=bad,
                                     reason=reason, client_id=cid, gpu=-1))
            return None
        # a positive SLO is at least 1 ns (0 would mean "the default")
        slo = max(1, ms(req.slo_ms)) if req.slo_ms else 0
        if not typed and req.queued_ns:  # its wait in the client before it was sent
            late += min(req.queued_ns, CLIENT_CLOCK_WINDOW_NS)  # (as a message's delay)
        # the client's call ends sooner than its SLO: the SLO (from the arrival, ``late``
        # before now) is cut to what is left of the call (``budget``, from now)
        cut = budget is not None and late + budget < (slo or self.cfg.default_slo)
        if cut:
            slo = max(1, late + budget)
        # no worker, and its SLO not spent yet: answered at once, to try again (one whose
        # SLO ran out before it was read, say in a controller held up until its workers
        # closed their links, is TIMEOUT below, as the scheduler answers it with workers)
        expired = late >= (slo or self.cfg.default_slo)
        if self._no_worker and not expired:
            self.count(_STATUS_KEY[RequestStatus.ERROR])
            self.count("requests_no_worker")
            self.metrics.reply(req.model, "error", None)
            self.log_refused(req.model, req.slo_ms, RequestStatus.ERROR, now, rid)
            deliver(pb.InferResponse(status=RequestStatus.ERROR, reason="no_worker",
                                     message=self.no_worker_message(req.model),
                                     client_id=cid, gpu=-1))
            return None

        def tagged(resp: pb.InferResponse) -> None:
            resp.client_id = cid
            if cut and resp.status == RequestStatus.TIMEOUT:  # (a KServe row's Answer too:
                # it was told "SLO cannot be met", its SLO feasible)
                # (the client's own timeout, not the SLO, made it too late: say so, and
                # the SLO it would have had: its own, or the default)
                slo_asked = (f"{req.slo_ms:g} ms" if req.slo_ms else
                             f"{self.cfg.default_slo / 1e6:g} ms, the controller's default")
                resp.reason = "call_deadline"
                resp.message = (f"{resp.message or 'SLO cannot be met'} within the call's "
                                f"deadline ({budget / 1e6:.1f} ms left of it when the "
                                f"request came; its SLO {slo_asked}): give the "
                                "client a longer timeout")
            deliver(resp)
        r = Request(rid, req.model, now - late, slo, tagged, inputs)  # inputs: list[Tensor]
        if req.skip_outputs:
            r.want_outputs = False
        r.typed = typed
        if typed and req.group is not None:  # a row of a KServe request of several
            self.metrics.row(req.group, rid)
        self.pending[rid] = r
        if self._no_worker:  # (expired: no scheduler is needed to say so)
            self._answer([Reply(r, RequestStatus.TIMEOUT, now, "SLO cannot be met")])
            return None
        return r

    async def _unless_stopping(self, coro):
        """``await coro``, but if the controller stops first, cancel it and raise
        ``RepositoryError`` UNAVAILABLE "the controller is shutting down" (an add of a
        worker that does not answer waited until the server's grace cancelled the call:
        "Cancelling all calls")."""
        if self._stopping:  # (it began while this one waited its turn, or resolved names)
            coro.close()
            raise shutting_down()
        task = asyncio.ensure_future(coro)
        stop = self.loop.create_future()
        self._stops.add(stop)
        try:
            await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stops.discard(stop)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.cancelled():  # (by the stop, above)
            raise shutting_down()
        return task.result()

    def begin_stop(self) -> None:
        """Take no more requests, and answer those still waiting ERROR/shutdown as any
        answer is (counted, in the metrics and the request log); before the front ends
        close, so that each writes its answer (REST's 503 too) within its grace."""
        self._stopping = True
        for stop in list(self._stops):
            if not stop.done():
                stop.set_result(None)
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        for t in list(self._unloads) + list(self.awaited.values()):
            t.cancel()
        now = now_ns()
        self.answered_at_stop += len(self.pending)  # (said as the controller stops)
        self._answer([Reply(r, RequestStatus.ERROR, now, STOPPING_MESSAGE)
                      for r in list(self.pending.values())])
        self.pending.clear()

    async def stop(self) -> None:
        self.begin_stop()  # (again: nothing more, when the front ends were closed after it)
        for close in list(self.stream_closers):  # (their calls end UNAVAILABLE, not
            close()  # cancelled by the server's stop with a traceback)
        # (the adds of workers left out at start, cancelled by begin_stop: their ends)
        await asyncio.gather(*self.awaited.values(), return_exceptions=True)
        for link in self.links:
            for t in link.tasks:
                t.cancel()
            if link.why_task is not None:  # (a look at why it is not back, under way)
                link.why_task.cancel()
            if link.channel is not None:
                await link.channel.close()

    # ------------------------------------------------------------------ model repository

    def _is_suspect(self, link: WorkerLink) -> bool:
        """Whether ``link``'s worker is suspect now (it did not answer a probe): handled
        as lost; once heard from it is reset, and the Hello of its reset, made then, lists
        every instance served."""
        ctrl = self.ctrl
        return ctrl is not None and link.index < len(ctrl.suspect) and ctrl.suspect[link.index]

    def available(self, link: WorkerLink) -> bool:
        """Whether ``link``'s worker takes work now: connected, not suspect (one that did
        not answer a probe is handled as lost until it answers again and its reset is
        answered) and not being drained (``ControllerLoop.takes``)."""
        return link.connected and (self.ctrl is None or self.ctrl.takes[link.index])

    def serving(self) -> bool:
        """Whether the controller serves: started, not stopping, a worker available
        (connected and not suspect)."""
        return (self.policy is not None and not self._stopping
                and any(self.available(lk) for lk in self.in_service()))

    def model_state(self, name: str) -> tuple[str, str] | None:
        """(state, reason) of a name in the model repository, Triton's states: ``READY``
        (served), ``LOADING``, ``UNLOADING`` (refusing requests, its last ones running or
        its copies being evicted), ``UNAVAILABLE`` (``unloaded``, or no worker connected),
        or ``""`` for a profile of the set that can be loaded and is not; None for a name
        the repository does not know."""
        if name in self.loading:
            return "LOADING", ""
        if name in self.unloading:
            return "UNLOADING", ""
        if name in self.profiles:
            if not self.serving():
                return "UNAVAILABLE", "no worker connected"
            unfit = self.unfit(name)
            return ("UNAVAILABLE", unfit) if unfit else ("READY", "")
        if name in self.unloaded:
            return "UNAVAILABLE", "unloaded"
        if name in self.pset.profiles:
            return "", ""
        return None

    def unknown_model(self, name: object) -> str:
        """What a client is told of a model name that is not served, on every front end
        (clockwork.v1's Infer, InferStream and UnloadModel, KServe's): the name (cut), the
        closest models served and how many instances are (``unknown_message``: under
        1 KiB however many are served; gRPC carries it in a header). Finding the closest
        names takes milliseconds with thousands served: a name asked again (a client
        sending many requests for one wrong name) is answered from ``_unknown_said``
        while the models served stay the same."""
        count = len(self.profiles) - len(self.unloading)
        if type(name) is str and name in self.unloaded:  # (not a misspelling: no guess)
            return (f"unknown model {echo_name(name)} (it was unloaded: load it again to "
                    f"serve it; {count:,} served)")
        if self._names_served is None:
            self._names_served = sorted(self.loaded)
        said = self._unknown_said
        if said[0] is not self._names_served or said[1] != count:
            said = self._unknown_said = (self._names_served, count, {})
        # (only names a message repeats whole: a client's 64 MiB names are not kept)
        key = name if type(name) is str and len(name) <= HINT_ECHO else None
        msg = said[2].get(key) if key is not None else None
        if msg is None:
            msg = unknown_message("unknown model", name, self._names_served, count, "served")
            if key is not None:
                if len(said[2]) >= UNKNOWN_SAID:
                    said[2].clear()
                said[2][key] = msg
        return msg

    def model_ready(self, name: str) -> bool:
        """Whether requests for ``name`` are served now (state ``READY``)."""
        return (name in self.profiles and name not in self.unloading and self.serving()
                and not self.unfit(name))

    def repository_index(self, ready_only: bool = False) -> list[tuple[str, str, str]]:
        """(name, state, reason) of every name the repository knows, by name: the
        instances served, loading, unloading or unloaded, and the profiles not loaded."""
        self.pset.refresh()  # (profiles written since the controller started)
        names = set(self.pset.profiles) | set(self.unloaded) | set(self.instances) | self.loading
        out = []
        for n in sorted(names):
            state, reason = self.model_state(n)
            if not ready_only or state == "READY":
                out.append((n, state, reason))
        return out

    async def load_model(self, name: str, copies: int = 1, profile: str | None = None,
                         package: str = "") -> list[str]:
        """Serve ``copies`` instances of ``profile`` (default: ``name``, or for a copy's name
        ``m:k`` its model ``m``) as ``name``, ``name:1``, ...; returns their names once
        every connected worker can run them and the policy has them (loaded on a GPU
        when requests come). Loading what is loaded with the same parameters does
        nothing. Raises ``RepositoryError``: NOT_FOUND for an unknown profile or a
        package a worker lacks; INVALID_ARGUMENT for a bad name, ``copies`` or a name
        loaded otherwise; UNAVAILABLE if not serving, a worker did not answer, or no
        worker is connected to take it (nothing is made)."""
        async with self._model_lock(name):
            return await self._load(name, copies, profile, package)

    async def load_resolved(self, name: str, resolve) -> list[str] | None:
        """``load_model`` of what ``resolve()`` says, (copies, profile, package), or None
        (nothing to do: returns None), asked once the loads and unloads of ``name``
        before it are done: a reload (the model as it is loaded) read before an unload
        queued ahead of it brought the unloaded model back."""
        async with self._model_lock(name):
            asked = resolve()
            return None if asked is None else await self._load(name, *asked)

    @contextlib.asynccontextmanager
    async def _model_lock(self, name: str):
        """Held while a load or an unload of ``name`` works: one of the model ``name``
        belongs to (its copies' names too) at a time. The bookkeeping between two awaits
        needs no lock (one event loop); what a load must see unchanged while it waits for
        the workers is its own model's, which only its loads and unloads change."""
        key = _group_name(str(name))
        held = self._model_locks.get(key)
        if held is None:
            held = self._model_locks[key] = [asyncio.Lock(), 0]
        held[1] += 1
        try:
            async with held[0]:
                yield
        finally:
            held[1] -= 1
            if not held[1]:  # names come from clients: keep only those in use
                del self._model_locks[key]

    async def _load(self, name: str, copies: int, profile: str | None,
                    package: str) -> list[str]:
        bad = grpc.StatusCode.INVALID_ARGUMENT
        if self.policy is None or self._stopping:
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE, "the controller is not serving")
        if type(self.policy).add_model is Policy.add_model:
            raise RepositoryError(bad, f"the {self.policy_name} policy cannot load models "
                                  "while it runs")
        if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
            copy = _COPY_SUFFIX.fullmatch(name) if isinstance(name, str) else None
            if copy and MODEL_NAME.fullmatch(copy[1]) and len(copy[2]) <= 6:
                base, k = copy[1], int(copy[2])
                right = base if k == 0 else f"{base}:{k}"
                raise RepositoryError(bad, (
                    f"bad model name {name!r}: NAME:K names copy K of NAME (K from 1, no "
                    f"leading zero; copy 0 is NAME itself), so this copy is {right!r}"))
            raise RepositoryError(bad, f"bad model name {name!r}: {BASE_NAME_RULE}, "
                                  "optionally ':K' (a copy's name, K from 1, no leading zero)")
        have = self.loaded.get(name)
        # (a model loaded with more copies at start may be loaded again as it is: a reload)
        as_loaded = have is not None and copies == have.copies
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1 \
                or (copies > MAX_LOAD_COPIES and not as_loaded):
            raise RepositoryError(bad, f"copies must be an integer from 1 to {MAX_LOAD_COPIES}, "
                                  f"got {copies!r}")
        base = _group_name(name)
        if base != name and copies != 1:
            raise RepositoryError(bad, f"{name!r} names one copy: load {base!r} with "
                                  f"copies={copies} instead")
        owner = self.loaded.get(base) if base != name else None
        if owner is not None and (int(name.rpartition(":")[2]) >= owner.copies or (
                name in self.profiles and name not in self.unloading)):
            owner = None  # (not one of its copies; or served: "served already", below)
        if owner is not None:  # a copy of a loaded model, unloaded alone: back as it was
            if (profile or owner.profile, package or owner.package) != (owner.profile,
                                                                        owner.package):
                raise RepositoryError(bad, (
                    f"{name!r} is a copy of model {base!r} (profile {owner.profile!r}"
                    + (f", package {owner.package!r}" if owner.package else "")
                    + f"): it is loaded as the model is; unload {base!r} first to load "
                    "it otherwise"))
            profile, package = owner.profile, owner.package
        profile = profile or base
        prof = self.pset.find(profile)  # (one profiled since the controller started too)
        if prof is None:
            why = self.pset.unreadable.get(profile)
            if why:  # (its file is there: what is wrong with it, not a guess at a name)
                raise RepositoryError(grpc.StatusCode.NOT_FOUND, (
                    f"no profile {profile!r} in the controller's profile set "
                    f"{self.pset.name!r}: its file cannot be read: {why}"))
            said = "" if have is None or profile != base else (
                f"; {name!r} is loaded with profile {have.profile!r}, and a load that names "
                "no profile looks up the model's own name: name its profile to load it again")
            raise RepositoryError(grpc.StatusCode.NOT_FOUND, unknown_message(
                "no profile", profile, sorted(self.pset.profiles), len(self.pset.profiles),
                f"in the controller's profile set {self.pset.name!r}") + said)
        # (the workers that can take it now: a larger one away could not, and when it
        # comes back it would be told a model no GPU up can hold, after it was answered
        # READY and its requests timed out meanwhile)
        biggest = max((g.pages for lk in self.in_service() if self.available(lk) and lk.state
                       for g in lk.state.gpus), default=0)
        if biggest and prof.weights_pages > biggest:
            raise RepositoryError(bad, f"profile {profile!r} needs {prof.weights_pages} pages "
                                  f"of weights cache; the largest GPU of the workers "
                                  f"connected has {biggest}")
        names = [name] + [f"{name}:{k}" for k in range(1, copies)]
        if have is not None:
            if (have.profile, have.copies, have.package) != (profile, copies, package):
                was = f"profile {have.profile!r}, copies {have.copies}" + (
                    f", package {have.package!r}" if have.package else "")
                raise RepositoryError(bad, f"model {name!r} is loaded already ({was}); "
                                      "unload it first to load it otherwise")
            names = [i for i in names if i not in self.profiles or i in self.unloading]
            if not names:
                return have.instances  # loaded as asked: nothing to do
        for i in names:
            if i in self.profiles and i not in self.unloading:
                raise RepositoryError(bad, f"{i!r} is served already (a copy of model "
                                      f"{_group_name(i)!r}); unload it first")
        if not any(self.available(lk) for lk in self.in_service()):  # (connected, answering)
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE, NO_WORKER_FOR_LOAD)
        await self._wait_unloaded(names)
        # (checked here, with no await before the instances are added: a load of another
        # model may have added its own while this one waited)
        if len(self.instances) + len(names) > MAX_SERVED:
            raise RepositoryError(bad, f"at most {MAX_SERVED:,} instances are served at once; "
                                  f"{len(self.instances):,} are, and this load adds "
                                  f"{len(names):,}: unload some first")
        # the workers first (a worker that reconnects meanwhile has them in its Hello)
        self.loading.update(names)
        committed = False  # (from here on the policy has them: the load is made)
        try:
            for i in names:
                self.instances[i] = profile
                if package:
                    self.packages[i] = package
            missing = await self._update_workers(
                add=[self.instance_message(i, profile) for i in names])
            if missing:
                where = "; ".join(f"worker {a}: {', '.join(ms)}" for a, ms in missing)
                raise RepositoryError(grpc.StatusCode.NOT_FOUND, (
                    f"a worker cannot serve profile {profile!r} ({where}): no such profile in "
                    "its profile set" + ("" if self.links[0].state is None
                                         or self.links[0].state.device == "emulated"
                                         else ", or no model package (see clockwork compile)")
                    + ", or its profile's weights pages or batch sizes are not the "
                    "controller's, or adding it failed there (the worker's log says why)"))
            committed = True
            now = now_ns()
            out: list[Action] = []
            for i in names:
                self.profiles[i] = prof.renamed(i)
                self.unloaded.pop(i, None)
                out += self.policy.add_model(i, self.profiles[i], now)
        except BaseException:
            # a worker that cannot serve it or did not answer, or the call cancelled (its
            # client's deadline passed): a load makes every instance or none
            if not committed:
                for i in names:
                    self.instances.pop(i, None)
                    self.packages.pop(i, None)
                await self._update_workers(remove=names, wait=False)  # (never waits)
            raise
        finally:
            self.loading.difference_update(names)
        self.count("models_loaded", len(names))
        self.ctrl.apply(out, now)  # (none, for our policies: weights load on demand)
        print(f"controller: loaded {_listed(names)} (profile {profile or name})",
              file=sys.stderr, flush=True)  # (who changed what is served, and when)
        if owner is not None and self.loaded.get(base) is owner:  # one of its copies again
            owner.instances = [i for i in [base] + [f"{base}:{k}" for k in range(1, owner.copies)]
                               if i in owner.instances or i == name]
            self._names_served = None
            return [name]
        if have is None:
            self.loaded[name] = LoadedModel(profile, copies, package, [])
            self._names_served = None
        g = self.loaded[name]
        g.instances = [i for i in [name] + [f"{name}:{k}" for k in range(1, copies)]
                       if i in self.profiles]
        return g.instances

    async def unload_model(self, name: str) -> list[str]:
        """Stop serving ``name`` (every instance loaded as ``name``, or the one instance of
        that name): its queued requests are answered now (``INVALID_REQUEST``, reason
        ``unknown_model``), new ones are refused the same way, requests already running
        finish; returns the instances unloaded, without waiting for their copies to be
        evicted (the state is ``UNLOADING`` until then). A name the repository knows but
        does not serve is a no-op (``[]``). Raises ``RepositoryError`` NOT_FOUND for a
        name it does not know."""
        async with self._model_lock(name):
            return self._unload(name)

    def _unload(self, name: str) -> list[str]:
        if self.policy is None or self._stopping:
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE, "the controller is not serving")
        if type(self.policy).remove_model is Policy.remove_model:
            raise RepositoryError(grpc.StatusCode.INVALID_ARGUMENT, (
                f"the {self.policy_name} policy cannot unload models while it runs"))
        g = self.loaded.get(name)
        self._names_served = None
        if g is not None:
            names = [i for i in g.instances if i in self.profiles and i not in self.unloading]
            del self.loaded[name]
        elif name in self.profiles and name not in self.unloading:
            names = [name]
            owner = self.loaded.get(_group_name(name))
            if owner is not None and name in owner.instances:
                owner.instances.remove(name)
                if not owner.instances:
                    del self.loaded[_group_name(name)]
        elif self.model_state(name) is not None:
            return []  # not served: nothing to do
        else:
            raise RepositoryError(grpc.StatusCode.NOT_FOUND, self.unknown_model(name))
        if not names:
            return []
        now = now_ns()
        self.unloading.update(names)
        out: list[Action] = []
        for i in names:
            try:
                out += self.policy.remove_model(i, now)
            except KeyError:
                pass  # the policy never had it
        self.ctrl.apply(out, now)  # EVICTs of idle copies; the queued requests answered
        self.count("models_unloaded", len(names))
        print(f"controller: unloaded {_listed(names)}", file=sys.stderr, flush=True)
        t = asyncio.ensure_future(self._forget_unloaded(names))
        self._unloads.add(t)
        t.add_done_callback(self._unloads.discard)
        return names

    async def _forget_unloaded(self, names: list[str]) -> None:
        """Once the policy has let go of ``names`` (copies evicted) and none of their
        requests is left unanswered, forget them here and on the workers."""
        left = list(names)
        while left and not self._stopping:
            left = [i for i in left if self.policy.model_view(i) is not None]
            if not left:
                busy = {r.model for r in self.pending.values()}
                left = [i for i in names if i in busy]
            if left:
                await asyncio.sleep(UNLOAD_POLL_S)
        await asyncio.sleep(0)  # the last answers' callers (KServe) read the profile first
        for i in names:
            if i in self.unloading:
                self.unloading.discard(i)
                self.profiles.pop(i, None)
                self.unloaded.pop(i, None)  # (the newest last)
                self.unloaded[i] = self.instances.pop(i, "")
                self.packages.pop(i, None)
                self.metrics.forget(i)
        while len(self.unloaded) > UNLOADED_KEPT:  # names come from clients: keep the newest
            del self.unloaded[next(iter(self.unloaded))]
        if not self._stopping:
            await self._update_workers(remove=names, wait=False)

    async def _wait_unloaded(self, names: list[str]) -> None:
        """Until no instance of ``names`` is still being unloaded."""
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while any(i in self.unloading for i in names):
            if time.monotonic() > deadline or self._stopping:
                raise RepositoryError(grpc.StatusCode.UNAVAILABLE, (
                    f"{', '.join(i for i in names if i in self.unloading)} still being "
                    "unloaded (requests running); try again"))
            await asyncio.sleep(UNLOAD_POLL_S)

    async def _update_workers(self, add=(), remove=(), wait: bool = True):
        """Send an InstanceUpdate to every connected worker, after the actions queued for
        it so far; with ``wait``, wait for their answers and return [(worker address,
        instances it could not add)] for those that could not. A worker's answer is
        waited for while it is heard from (it reads a new package on a thread and
        answers its echoes meanwhile); one not heard from for ``UPDATE_TIMEOUT_S``, or
        not done in ``UPDATE_MAX_S``, raises ``RepositoryError`` UNAVAILABLE. A worker lost meanwhile
        gets the instance list in its Hello when it is back; instances to add that no
        worker answered for (none connected, or every one lost meanwhile) raise
        ``RepositoryError`` UNAVAILABLE: nothing says they can be served."""
        self._update_seq += 1
        seq = self._update_seq
        u = pb.InstanceUpdate(seq=seq, add=list(add), remove=list(remove))
        waits = []
        for link in self.in_service():
            if not link.connected or self._is_suspect(link):
                continue  # (a suspect one gets every instance in its Hello when it is back)
            link.updates.append((len(link.pending), u))
            if wait:
                f = self.loop.create_future()
                link.acks[seq] = f
                waits.append((link, f))
            link.wake.set()
        missing = []
        answered = 0
        sent = time.monotonic()
        for link, f in waits:
            # a worker answers once it has read the packages of the instances added (on a
            # thread: a cuda package's first kernel build takes minutes), answering its
            # echoes meanwhile; so it is waited for as long as it is heard from
            while (not f.done() and link.connected and not self._is_suspect(link)
                   and not self._stopping):
                quiet = min(max(link.heard, sent) + UPDATE_TIMEOUT_S,
                            sent + links.UPDATE_MAX_S) - time.monotonic()
                if quiet <= 0:
                    break
                with contextlib.suppress(TimeoutError):  # (looking again at least 4 times
                    async with asyncio.timeout(min(quiet, 0.25)):  # a second: suspect?)
                        await asyncio.shield(f)
            if not f.done():
                link.acks.pop(seq, None)
                if self._stopping:  # (answered now, not cancelled by the server's stop)
                    raise shutting_down()
                if not link.connected or self._is_suspect(link):
                    continue  # lost or suspect meanwhile: its Hello will say it
                raise RepositoryError(grpc.StatusCode.UNAVAILABLE, (
                    f"worker {link.address} did not take the model: not heard from for "
                    f"{UPDATE_TIMEOUT_S:g} s" if time.monotonic() - sent < links.UPDATE_MAX_S else
                    f"worker {link.address} did not take the model in {links.UPDATE_MAX_S:g} s"))
            got = f.result()
            if got is not None:  # (None: the link was lost meanwhile)
                answered += 1
            if got:
                missing.append((link.address, got))
        if wait and add and not answered:
            raise RepositoryError(grpc.StatusCode.UNAVAILABLE, NO_WORKER_FOR_LOAD)
        return missing

    # ------------------------------------------------------------------ queries

    def model_info(self, name: str) -> pb.ModelInfo:
        return model_infos([self.model_row(name)])[0]

    def model_row(self, name: str) -> tuple:
        """What ``model_infos`` makes ``name``'s ``ModelInfo`` of (read on the loop):
        (name, profile name, profile, state, reason)."""
        profile = self.instances.get(name) or self.unloaded.get(name) or name
        p = self.profiles.get(name) or self.pset.profiles[profile]
        state, reason = self.model_state(name) or ("", "")
        return name, profile, p, state, reason


def model_infos(rows) -> list[pb.ModelInfo]:
    """``ModelInfo`` messages of ``ControllerNode.model_row`` rows; the tensor specs of
    one profile made once (every copy of a model shares them). Reads nothing of the
    controller's: a long list is made off the event loop (20,000 instances took the loop
    ~0.3 s)."""
    made: dict[int, pb.ModelInfo] = {}
    out = []
    for name, profile, p, state, reason in rows:
        t = made.get(id(p))
        if t is None:
            t = made[id(p)] = pb.ModelInfo(
                inputs=[pb.TensorSpec(name=x.name, shape=x.shape, dtype=x.dtype)
                        for x in p.inputs],
                outputs=[pb.TensorSpec(name=x.name, shape=x.shape, dtype=x.dtype)
                         for x in p.outputs],
                batch_sizes=p.batch_sizes, weights_pages=p.weights_pages)
        m = pb.ModelInfo()
        m.CopyFrom(t)
        m.name, m.profile, m.state, m.reason = name, profile, state, reason
        out.append(m)
    return out


OFF_LOOP_ROWS = 256  # a list longer than this is made on a thread, off the event loop


def _check_inputs(inputs, prof: ModelProfile) -> tuple[list[Tensor] | None, str | None]:
    """A request's inputs as Tensors (``pb.Tensor``s are converted; the KServe front end
    sends Tensors already), and why they do not fit the model (None if they do)."""
    if not isinstance(inputs[0], Tensor):
        try:
            inputs = msgs_to_tensors(inputs)
        except TensorError as e:
            return None, str(e)
    return inputs, check_inputs(inputs, prof.inputs)


def _listed(names: list[str]) -> str:
    """Instance names for a log line: the first five, and how many more."""
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more
