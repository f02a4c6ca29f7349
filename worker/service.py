"""The worker service: gRPC shell around the pure ``GpuExecutor`` on a real clock.

One ``GpuExecutor`` per GPU, driven by ``worker.loop.WorkerLoop`` (the same driver the
simulator runs); this module is its transport. A controller opens ``Worker.Connect`` and
sends ``Hello`` (its instance list); the worker answers with its state and then hands
every batch of actions to ``loop.submit`` with ``now`` = the real clock. Instances join
and leave while it serves by ``InstanceUpdate`` (the controller's model repository),
answered with the state too; the weights cache and the actions in flight stay as they are
(but for those of the instances that leave). ``loop.arm`` sets an asyncio timer that calls
``loop.timer``. Finished results are sent back in batches (what is ready when the stream
is free, in messages of at most ``RESULT_MESSAGE_BYTES``); while more than
``RESULT_BACKLOG_BYTES`` of them wait to be sent, the worker reads nothing more from its
controller. A controller that asks for it gets the fast link: the same messages as frames
on a TCP connection to ``--link-port`` that presents the ticket handed out on the stream
(``clockwork.protocol.framing``); one ``_Session`` per controller connection serves
either transport. One controller holds the worker at a time, the one whose connection
is live: another's ``Connect`` meanwhile is refused (``FAILED_PRECONDITION``, saying
which controller holds it), its own reconnection replaces its stale session
(``clockwork.protocol.holding``; ``WorkerServicer._take``). The event loop's timers fire
to the microsecond (``clockwork.protocol.precise_loop``), not rounded up to a
millisecond as epoll's.

Windows and result times are this process's monotonic clock; the controller converts.

Devices: ``emulated`` (an action takes its profiled time) or ``cpu`` (TVM-compiled model
packages really run on the host; ``cuda`` the same on a GPU). A real device's actions
start "open" in the executor (see ``worker.executor``); this shell runs them on one
EXEC thread and one LOAD thread per GPU and reports the measured times back with
``complete``. Packages come from ``--packages DIR`` (``DIR/<profile>/``), an Instance's
``package`` path, or a ``LoadModelFromDisk`` call; the last two name a package inside
``DIR`` (a name, or a path that resolves inside it), and anything else is refused with
one message whether or not it exists.

With a cluster secret every call must carry the controller's proof, and the worker proves
the secret back in the response's initial metadata (``clockwork.protocol.security``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import orjson

from clockwork.actions import ActionType, ErrorCode, Result
from clockwork.extras import pip_extra
from clockwork.profiles import PAGE_SIZE, ModelProfile, ProfileError, load_profile_set
from clockwork.protocol import accept_guard, keepalive
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.addresses import host_of, join
from clockwork.protocol.framing import TICKET_BYTES, FrameStream, new_ticket
from clockwork.protocol.holding import Holder, printable
from clockwork.protocol.listen import LISTEN_OPTIONS, ListenError, bind_grpc
from clockwork.protocol.pacing import Pacer, doze
from clockwork.protocol.parent import stop_when_orphaned
from clockwork.protocol.precise_loop import run_precise
from clockwork.protocol.ratelog import KeyedLog, LogLimiter
from clockwork.protocol.security import (
    WORKER_CLOCK_SYNC,
    WORKER_CONNECT,
    WORKER_LOAD,
    ClusterAuth,
    ClusterProofInterceptor,
    Refusals,
    SecurityError,
    TlsFiles,
    answers_to,
    cluster_secret,
    exposure_error,
)
from clockwork.protocol.versions import PROTOCOL, SOFTWARE, mismatch
from clockwork.protocol.wire import (
    ACTION_MODEL_CHARS,
    WireError,
    add_result,
    add_tensors,
    attach_tensor,
    cut_attachments,
    msg_to_action,
    msgs_to_tensors,
)
from clockwork.signals import said_why, stop_event_on_signals
from clockwork.sizes import MAX_ACTIONS_PER_MESSAGE, MAX_MESSAGE_BYTES
from clockwork.tensors import Tensor
from worker.devices.emulated import EmulatedDevice
from worker.executor import GpuExecutor, held_weights, keep_weights
from worker.loop import WorkerLoop

DEVICES = ("emulated", "cpu", "cuda")
DEFAULT_PROFILES = {"emulated": "v100-reference", "cpu": "cpu", "cuda": "cuda"}

LINK_WAIT_S = 5.0  # a fast link's TLS handshake, then its ticket, must each come within this
# Results go back in messages of at most this many bytes (the message, and the output
# tensors attached to its frame on the fast link; one larger result goes alone), as the
# controller's replies go to its clients (``reply_message_bytes``, controller.limits): a
# backlog of results (a controller that read slowly) never makes a message over the
# links' 64 MiB (``MAX_FRAME``, gRPC's max message), which ended the link, every result
# in it lost.
RESULT_MESSAGE_BYTES = 1 << 20
# Backpressure: while the results not yet sent come to more than this many bytes (an
# estimate, ``_backlog_bytes``), the worker reads no more messages from its controller (the
# controller's writes wait; it reads on, and the worker sends on), so a controller that
# reads results slowly makes the worker wait instead of hold an unbounded backlog (~300 B
# a result in memory). A few messages' worth: a burst of results (one message of many
# actions) goes out at the stream's pace, and normal traffic (hundreds of bytes at a
# time) never comes near it.
RESULT_BACKLOG_BYTES = 4 * RESULT_MESSAGE_BYTES
# a real device's INFER inputs held until their actions start: past this many bytes the
# worker reads no more either, until some start (a controller plans milliseconds ahead:
# megabytes; one that sent 30 MiB inputs an hour ahead grew a worker without end)
INPUTS_WAITING_BYTES = 1 << 30
# answers to Hellos and InstanceUpdates (each a WorkerState, with every instance's name)
# waiting to be sent: past this many the worker reads no more either (a controller that
# sent updates and read nothing grew a worker with long names by ~20 MB an update)
STATES_WAITING_MAX = 8
# clock echoes waiting to be sent back past which the worker reads nothing more from the
# controller until they go (a peer that sends echoes and never reads grew the worker by
# ~500 bytes an echo, without end); a controller has one or a few out at a time
ECHOES_WAITING_MAX = 1024
_RESULT_BYTES = 64  # a result's fixed fields in a message, estimated (strings, tensors added)
_TOLD_MAX = 64  # other controllers a session logs the refusal of (once each)
BUILD_NOTE_S = 10.0  # while one package's kernels build, a line this often (a sign of life)
_OFFSET = 0  # --clock-offset-ms: shifts this worker's clock (tests the controller's conversion)
# LoadModelFromDisk's one answer for every path it will not load: outside the package
# directory, missing or broken alike (the caller learns nothing about the worker's disk)
PACKAGE_REFUSED = "cannot load package: no model package by that name in the worker's package directory"


class PackageRefused(ValueError):
    """A package reference the worker will not load (the reason goes to its own log)."""


def now_ns() -> int:
    return time.monotonic_ns() + _OFFSET


def _is_package(p: Path) -> bool:
    """Whether ``p`` holds a model package (its ``model.json``); False also where the path
    cannot be looked at (a name too long for the file system, say)."""
    try:
        return (p / "model.json").exists()
    except (OSError, ValueError):
        return False



def controller_disagreement(i: pb.Instance, p: ModelProfile) -> str:
    """Why this worker's profile ``p`` cannot run instance ``i`` as the controller counts
    it ("" if it can): other weights pages (the controller's view of the cache would be
    wrong, its LOADs refused or the cache over-committed), or a batch size the controller
    may send that ``p`` has no function for (each such INFER refused). A field the
    controller left unset (0, empty) is not checked."""
    if i.weights_pages and i.weights_pages != p.weights_pages:
        return (f"its profile {i.profile!r} here needs {p.weights_pages} pages of weights, "
                f"the controller's {i.weights_pages}")
    lacking = sorted(set(i.batch_sizes) - set(p.batch_sizes))
    if lacking:
        return (f"its profile {i.profile!r} here has no batch size "
                f"{', '.join(map(str, lacking))} (it has {', '.join(map(str, p.batch_sizes))}), "
                "which the controller may send")
    return ""


class WorkerNode:
    """The worker's state and its timer task. All methods run on one event loop."""

    cluster_auth: ClusterAuth | None = None  # the cluster secret (None: calls are not checked)

    def __init__(self, gpus: int, pages: int | None, profiles: str | None = None,
                 device: str = "emulated", noise: float = 0.0, seed: int = 0,
                 packages: str | None = None, result_interval_us: float = 0.0,
                 slow_prob: float = 0.0, slow_factor: float = 3.0) -> None:
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
        self.pset = load_profile_set(profiles or DEFAULT_PROFILES[device])
        self.n_gpus = gpus
        self.pages = int(pages or self.pset.weights_cache_pages)
        self.device = device
        self.noise = noise
        self.seed = seed
        self.slow = (slow_prob, slow_factor)
        self.packages = Path(packages) if packages else Path("packages") / device
        self.registered: dict[str, Path] = {}  # LoadModelFromDisk: name -> package path
        self._looking: dict[str, Path | None] | None = None  # (``confined``'s memo)
        # (package, profile) -> why it cannot serve, within one Hello or InstanceUpdate:
        # a broken package named by many instances is read and checked once, not once
        # for each (8 copies of a 45 MB package: 360 MB read at every reconnection)
        self._refused_here: dict[tuple, str] | None = None
        self.worker_id = 0
        self.instances: dict[str, ModelProfile] = {}
        # instance name -> (its profile, the profile under its name): a Hello that names the
        # same instances again (a reset, at thousands of instances) reuses them instead of
        # making each anew, so the worker answers within the controller's probe timeout
        self._renamed: dict[str, tuple[ModelProfile, ModelProfile]] = {}
        self.executors: list[GpuExecutor] = []
        self.real: list = []  # real devices, one per GPU
        self._threads: list[tuple[ThreadPoolExecutor, ThreadPoolExecutor]] = []
        self._inputs: dict[int, list[Tensor]] = {}  # INFER id -> its batch's inputs
        self._inputs_bytes = 0  # their bytes (``INPUTS_WAITING_BYTES``)
        self._want: set[int] = set()  # INFERs whose output tensors go back
        self.result_interval_us = result_interval_us  # pacing of result messages
        # paced results: by INFER id, when its answer is due (``ActionMsg.answer_by``);
        # the soonest of those waiting in _out, less an interval (0: none); and when the
        # session's writer, asleep, sends next (0: it is not, any result wakes it)
        self._answer_by: dict[int, int] = {}
        self._out_due = 0  # (time.monotonic_ns, as the pacer's)
        self._send_at = 0
        # results to send, in order: (Result, output tensors to send or None), or the
        # ResultMsg answering a malformed action; ``_out_bytes``: their bytes, estimated
        self._out: deque[tuple[Result, list[Tensor] | None] | pb.ResultMsg] = deque()
        self._out_bytes = 0
        self._out_ready = asyncio.Event()
        self._room = asyncio.Event()  # set when _out_bytes <= RESULT_BACKLOG_BYTES
        self._room.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.wloop: WorkerLoop | None = None  # the driver (worker.loop); this node is its transport
        self._complain = LogLimiter("worker")  # malformed messages from the controller
        # instances it cannot serve, at most a line a second (a Hello of 5,000 of them
        # printed 5,000 lines; the controller hears of each in the state's missing list)
        self._cannot = LogLimiter("worker")
        # why a package cannot serve an instance: each package's reason said (a burst of
        # broken packages said the first only, the controller told "the worker's log
        # says why"), the same again at most once a minute
        self._bad_package = KeyedLog("worker")
        # INFERs that failed on the device (the controller's client hears only an error
        # code; a model whose kernels always fail was silent here): a few lines a second
        self._exec_failed = LogLimiter("worker", burst=4)
        if device != "emulated":
            if device == "cpu":
                _check_host_memory(self.pages, gpus)
            self.real = [_open_device(device, self.pages, g) for g in range(gpus)]
            self._threads = [(ThreadPoolExecutor(1, f"exec{g}"), ThreadPoolExecutor(1, f"load{g}"))
                             for g in range(gpus)]
        self._reset({})

    # -- state ---------------------------------------------------------------------------

    def _reset(self, instances: dict[str, ModelProfile], keep=()) -> None:
        """Nothing in flight, and an empty weights cache but for ``keep``'s weights,
        each (GPU, instance, version), where they are fully loaded."""
        old = self.executors
        self.instances = instances
        self.executors = [
            GpuExecutor(self.worker_id, g, self.pages, instances,
                        self.real[g] if self.real else EmulatedDevice(self.noise, self.seed * 1000 + g,
                                                                      *self.slow))
            for g in range(self.n_gpus)
        ]
        kept = keep_weights(old, self.executors, keep, now_ns()) if keep else []
        # EXECs still running free theirs later; a LOAD still running on a LOAD thread
        # evicts its own weights when it ends (``_run_load``: its executor is gone), and
        # one that ends meanwhile may evict them first (``drop``: no error then)
        for g, dev in enumerate(self.real):
            for name, m in list(dev.models.items()):
                if m.pages is not None and not (kept and name in kept[g]):
                    dev.drop(name)
        if self.wloop is None:
            self.wloop = WorkerLoop(self.worker_id, self.executors, self, real=bool(self.real))
        else:
            self.wloop.reset(self.worker_id, self.executors)
        self._inputs = {}
        self._inputs_bytes = 0
        self._want = set()
        self._answer_by = {}
        self._out_due = 0
        self._out = deque()
        self._out_bytes = 0
        self._room.set()

    def prepare_packages(self, stopped=lambda: False, built=lambda: None) -> None:
        """Build the kernels of every package in the package directory on each device
        that needs it (cuda: seconds of NVRTC a package, cached on disk), before the
        worker serves: a Hello then registers instances at once. Says what it does on
        stderr, a line a package and, while one package takes long (a real-size model's
        first build: a minute or more), a line every ``BUILD_NOTE_S``. A package that will
        not build is left to the Hello, which reports it missing. Stops early once
        ``stopped()``; calls ``built()`` after each package built and with each of those
        notes, from another thread (a sign of life for whoever waits for the worker to
        listen: ``clockwork serve`` gives a child more time with each line it prints, a
        Ray actor's wait with each call)."""
        devices = [d for d in self.real if d.builds_kernels]
        if not devices or not self.packages.is_dir():
            return
        found = sorted(p.parent for p in self.packages.glob("*/model.json"))
        for k, path in enumerate(found, 1):
            if stopped():
                return
            t0 = time.perf_counter()
            done = threading.Event()
            note = threading.Thread(target=_building_notes, daemon=True,
                                    args=(done, f"{path.name} ({k}/{len(found)})", t0, built))
            note.start()
            try:
                for dev in devices:
                    dev.prepare(path)
            except Exception as e:  # noqa: BLE001 - not a package for this device, say
                done.set()
                note.join()  # (its last note before this line)
                print(f"worker: package {path.name} not prepared: {e}", file=sys.stderr,
                      flush=True)
                continue
            finally:
                done.set()
                note.join()
            print(f"worker: kernels of {path.name} ready ({k}/{len(found)}, "
                  f"{time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
            built()

    def confined(self, ref: str) -> Path | None:
        """Package reference ``ref`` (a name, or a path) as a directory inside the package
        directory (``--packages``), resolved; None if it is anywhere else: a ``..`` part,
        an absolute path outside, or a symbolic link that leads out. Within one Hello
        or InstanceUpdate each reference is resolved once (``_looking``)."""
        memo = self._looking
        if memo is not None:
            if ref not in memo:
                self._looking = None
                try:
                    memo[ref] = self.confined(ref)
                finally:
                    self._looking = memo
            return memo[ref]
        try:
            root = self.packages.resolve()
            p = Path(ref)
            if not ref or ".." in p.parts:
                return None
            p = (p if p.is_absolute() else root / p).resolve()
        except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
            return None
        return p if p != root and p.is_relative_to(root) else None

    def _leads_out(self, ref: str) -> bool:
        """Whether ``ref`` names something in the package directory that leads outside it
        (a symbolic link out, which ``confined`` refuses)."""
        try:
            return (self.packages / ref).exists() and self.confined(ref) is None
        except (OSError, ValueError):
            return False

    def package_for(self, name: str, profile: str, explicit: str = "",
                    say: bool = True) -> Path | None:
        """Where instance ``name`` (of ``profile``) has its model package, if anywhere
        (always inside the package directory); ``say``: why not, on stderr."""
        own = self.confined(explicit) if explicit else None
        if explicit and (own is None or not _is_package(own)):
            # a package named for it: that one, or none (never another)
            if say:
                why = (f"package {explicit!r} is not inside the package directory"
                       if own is None else
                       f"no model package {explicit!r} in the package directory")
                print(f"worker: instance {name}: {why} {self.packages}; refused",
                      file=sys.stderr, flush=True)
            return None
        if own is not None:
            return own
        for p in (self.registered.get(name), self.registered.get(profile),
                  self.confined(profile)):
            if p is not None and _is_package(p):
                return p
        return None

    def unprepared(self, instances) -> list[Path]:
        """The packages of ``instances`` (a Hello's or an InstanceUpdate's) that some real
        device has not made ready yet (``prepare``): made on a thread before the message
        is applied, so that the event loop keeps running the other models' actions
        meanwhile (a real-size package's library and weights take a while to read; a
        cuda package's kernels, when not built at start, seconds)."""
        if not self.real:
            return []
        paths: dict[Path, None] = {}  # (each looked at once: ``prepared`` reads its files'
        # stamps, and thousands of instances name a few packages)
        outer, self._looking = self._looking, {}
        try:
            for i in instances:
                path = self.package_for(i.name, i.profile, i.package, say=False)
                if path is not None:
                    paths[path] = None
        finally:
            self._looking = outer
        return [p for p in paths if not all(dev.prepared(p) for dev in self.real)]

    def prepare_paths(self, paths: list[Path]) -> None:
        """``prepare`` each package on every real device (on a thread). A package that
        fails is left alone: registering it fails again, and says so."""
        for path in paths:
            for dev in self.real:
                try:
                    dev.prepare(path)
                except Exception:  # noqa: BLE001 - reported when it is registered
                    break

    async def read_packages(self, paths: list[Path]) -> None:
        """``prepare_paths`` on a thread (the event loop runs on meanwhile); nothing to
        do for no paths."""
        if paths:
            await asyncio.to_thread(self.prepare_paths, paths)

    def _elsewhere(self, name: str, path: Path | None) -> bool:
        """Whether instance ``name`` is registered on a real device with a package other
        than the one at ``path``."""
        for dev in self.real:
            m = dev.models.get(name)
            if m is not None and m.package is not dev.packages.get(path):
                try:
                    if path is None or Path(m.package.path).resolve() != path.resolve():
                        return True
                except (OSError, RuntimeError):
                    return True
        return False

    def _meta(self, path: Path) -> dict:
        """The package's meta: as a real device read it (``prepare``) if its files are
        as they were then, else read now (a package compiled again into its folder was
        checked with the old one's meta, then registered unchecked)."""
        for dev in self.real:
            pkg = dev._cached(path)
            if pkg is not None:
                return pkg.meta
        from clockwork.models.package import read_package

        return read_package(path)

    def _register(self, name: str, path: Path) -> None:
        for dev in self.real:
            if name not in dev.models:
                dev.register(name, path)

    def load_from_disk(self, name: str, path: str) -> pb.LoadModelFromDiskResponse:
        """LoadModelFromDisk: check the package, remember it under ``name``."""
        from clockwork.models.package import read_package

        p = self.confined(path)
        try:
            if p is None:
                raise PackageRefused(f"not inside the package directory {self.packages}")
            meta = read_package(p)  # raises on a missing or broken package
        except Exception as e:  # noqa: BLE001 - one answer for every refusal (no path oracle)
            print(f"worker: LoadModelFromDisk {path!r} refused: {e}", file=sys.stderr,
                  flush=True)
            raise PackageRefused(PACKAGE_REFUSED) from None
        if self.device == "emulated":
            raise ValueError("the emulated device runs profiles, not packages "
                             "(start the worker with --device cpu)")
        self.registered[name] = p
        prof = self.pset.find(name) or self.pset.find(meta.get("model", ""))
        info = pb.ModelInfo(
            name=name, profile=str(meta.get("model", name)),
            inputs=[pb.TensorSpec(name=t["name"], shape=t["shape"], dtype=t["dtype"])
                    for t in meta["inputs"]],
            outputs=[pb.TensorSpec(name=t["name"], shape=t["shape"], dtype=t["dtype"])
                     for t in meta["outputs"]],
            batch_sizes=sorted(int(b) for b in meta["functions"]),
            weights_pages=int(meta["weights_pages"]))
        pj = p / "profile.json"
        if pj.is_file():  # (not a FIFO: read for ever, the event loop held with it)
            text = pj.read_text()
        else:
            text = orjson.dumps(prof.to_json()).decode() if prof is not None else ""
        return pb.LoadModelFromDiskResponse(model=info, profile_json=text)

    def _instance(self, i: pb.Instance) -> ModelProfile | None:
        """The profile instance ``i`` runs with (its package registered on a real device);
        None if this worker cannot serve it (no such profile, no package, a broken one)."""
        p = self.pset.find(i.profile)  # (one profiled since the worker started too)
        path = self.package_for(i.name, i.profile, i.package) if self.real else None
        if p is not None and self.real and path is None and not i.package:
            # (a package named for it and missing was said by package_for)
            none = (f"no model package for profile {_cut(i.profile)} in {self.packages} "
                    f"(clockwork compile {_cut(i.profile)} --out {self.packages}/"
                    f"{_cut(i.profile)}): its instances")
            if self._leads_out(i.profile):  # (a symbolic link out: said as none, whose
                # advice, compiling through the link, was refused again)
                none = (f"the model package for profile {_cut(i.profile)} in "
                        f"{self.packages} leads outside it (a symbolic link out of the "
                        "package directory is not followed: put the package inside): its "
                        "instances")
            self._bad_package(("none", i.profile), f"{none} refused",
                              f"{none}, {_cut(i.name)} among them, refused")
        if p is None or (self.real and path is None):
            return None
        why = controller_disagreement(i, p)
        if why:
            self._cannot(f"cannot serve {_cut(i.name)}: {why}")
            return None
        made = self._renamed.get(i.name)
        if (made is not None and made[0] is not p) or self._elsewhere(i.name, path):
            # the name now runs another model, or another package (either since this
            # session's Hello, or since an earlier Hello that no longer named it)
            for dev in self.real:
                dev.unregister(i.name)  # (its weights evicted), registered anew below
            made = None  # (new figures: a reset keeps none of the old weights for it)
        if path is not None:
            memo = self._refused_here
            why = memo.get((path, i.profile)) if memo is not None else None
            try:
                if why is not None:
                    raise ValueError(why)
                from clockwork.models.package import profile_disagreement

                why = profile_disagreement(self._meta(path), p)
                if why:
                    raise ValueError(f"it does not match profile {i.profile!r}: {why}")
                self._register(i.name, path)
            except Exception as e:  # noqa: BLE001 - a broken package: report it missing
                if memo is not None:
                    memo[(path, i.profile)] = str(e)
                # (one line a package: its instances' lines differ by name only)
                self._bad_package(path, f"cannot load package {path}: {e}",
                                  f"cannot load package {path} for {_cut(i.name)}: {e}")
                return None
        if made is not None and made[0] is p:
            return made[1]  # a Hello again (a reset): the same figures, made before
        r = p.renamed(i.name)
        self._renamed[i.name] = (p, r)
        return r

    def hello(self, h: pb.Hello) -> pb.WorkerState:
        self._looking = {}  # (thousands of instances name a few packages)
        self._refused_here = {}
        try:
            return self._hello(h)
        finally:
            self._looking = self._refused_here = None

    def _hello(self, h: pb.Hello) -> pb.WorkerState:
        self.worker_id = h.worker_id
        inst: dict[str, ModelProfile] = {}
        missing = []
        for i in h.instances:
            p = self._instance(i)
            if p is None:
                missing.append(i.name)
            else:
                inst[i.name] = p
        self._renamed = {name: self._renamed[name] for name in inst}  # only the current ones
        if h.reset or not self.executors or inst.keys() != self.instances.keys():
            # adopt: every weights cached (``_reset`` keeps those fully loaded, for
            # instances that still run the same model)
            self._reset(inst, held_weights(self.executors) if h.adopt else
                        [(k.gpu, k.model, k.version) for k in h.keep])
        return self.state(missing)

    def update(self, u: pb.InstanceUpdate) -> pb.WorkerState:
        """InstanceUpdate: instances leave (their cached weights, if any, are dropped, and
        their actions still queued answered ``UNKNOWN_MODEL``) and join, without touching
        anything else; the state answers it (``missing``: those it could not add)."""
        self._refused_here = {}
        try:
            return self._update(u)
        finally:
            self._refused_here = None

    def _update(self, u: pb.InstanceUpdate) -> pb.WorkerState:
        now = now_ns()
        for name in u.remove:
            self._renamed.pop(name, None)
            if self.instances.pop(name, None) is None:
                continue
            self.wloop.forget(name, now)  # its queued actions answered UNKNOWN_MODEL
            for dev in self.real:
                dev.unregister(name)
        missing = []
        for i in u.add:
            if i.name in self.instances:  # another profile under an old name: replace it
                self.wloop.forget(i.name, now)
                for dev in self.real:
                    dev.unregister(i.name)
            p = self._instance(i)
            if p is None:
                self.instances.pop(i.name, None)
                missing.append(i.name)
            else:
                self.instances[i.name] = p  # the executors share this dict
        st = self.state(missing)
        st.update_seq = u.seq
        return st

    def state(self, missing: list[str] | None = None) -> pb.WorkerState:
        return pb.WorkerState(
            device=self.device, profiles=self.pset.name,
            profile_names=sorted(self.pset.profiles),
            gpus=[pb.GpuState(gpu=e.gpu, pages=e.total_pages, pages_used=e.pages_used,
                              loaded=(names := e.loaded_models()),
                              versions=[e.weights[n].version for n in names])
                  for e in self.executors],
            missing=missing or [], worker_time=now_ns(), protocol=PROTOCOL,
            software=SOFTWARE)

    # -- actions -------------------------------------------------------------------------

    def submit(self, batch: pb.ActionBatch, tail=None) -> None:
        """A batch of actions from the controller; ``tail``: its frame's attachments (the
        fast link), the inputs' bytes. An action that cannot be decoded (an unknown
        type, unreadable inputs: ``WireError``) is answered at once with
        ``INVALID_INPUT`` and the rest run as usual; attachments that do not add up make
        every action of the batch such a one."""
        now = now_ns()
        real = bool(self.real)
        actions = []
        bad: list[pb.ResultMsg] = []
        cuts, whole = cut_attachments(batch.actions, tail)
        for i, m in enumerate(batch.actions):
            try:
                if whole is not None:
                    raise whole
                a = msg_to_action(m, self.worker_id)
                inputs = (msgs_to_tensors(m.inputs, cuts[i] if cuts else None)
                          if real and m.inputs else None)
            except WireError as e:
                self._complain(f"malformed action {m.id} answered INVALID_INPUT: {e}")
                bad.append(pb.ResultMsg(id=m.id, type=m.type, status=ErrorCode.INVALID_INPUT,
                                        gpu=m.gpu, model=m.model[:ACTION_MODEL_CHARS],
                                        batch_size=m.batch_size,
                                        received=now, begin=now, end=now,
                                        message=f"malformed action: {e}"))
                continue
            if a.type == ActionType.INFER:  # (only an INFER's result takes them back:
                # kept for a LOAD or EVICT they were held until the next reset)
                if m.want_outputs:
                    self._want.add(a.id)
                if m.answer_by and self.result_interval_us:
                    self._answer_by[a.id] = m.answer_by
                if inputs:
                    self._take_inputs(a.id)  # (an id again: the old ones go)
                    self._inputs[a.id] = inputs
                    self._inputs_bytes += sum(t.nbytes for t in inputs)
            actions.append(a)
        if bad:
            self._out.extend(bad)
            self._out_bytes += sum(_backlog_bytes(b) for b in bad)
            self._out_ready.set()
        self.wloop.submit(actions, now)

    # -- the WorkerLoop's transport (worker.loop.WorkerTransport) -------------------------

    def results(self, results: list[Result]) -> None:
        if self.real:
            self._evicted(results)
        self._emit(results)

    def run(self, e: GpuExecutor, a) -> None:
        """Hand an action the executor started open to its GPU's EXEC / LOAD thread."""
        loop = asyncio.get_running_loop()
        dev = self.real[e.gpu]
        ex, ld = self._threads[e.gpu]
        if a.type == ActionType.INFER:
            ex.submit(self._run_infer, loop, e, dev, a, self._take_inputs(a.id))
        else:
            ld.submit(self._run_load, loop, e, dev, a)

    def arm(self, at: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = self._loop or asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, (at - now_ns()) / 1e9), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.wloop.timer(now_ns())

    # -- real devices ----------------------------------------------------------------------

    def _evicted(self, results: list[Result]) -> None:
        for r in results:
            if r.type == ActionType.EVICT and r.status == ErrorCode.SUCCESS:
                # (drop: weights the device does not hold -- its view and the executor's
                # apart -- must not raise here, where the results of the batch and the
                # actions started with it would be lost)
                self.real[r.gpu].drop(r.model)
            elif r.type == ActionType.INFER:
                self._take_inputs(r.id)

    def _take_inputs(self, aid: int) -> list[Tensor] | None:
        """INFER ``aid``'s inputs, no longer held here (None: none held)."""
        inputs = self._inputs.pop(aid, None)
        if inputs:
            self._inputs_bytes -= sum(t.nbytes for t in inputs)
            self._room.set()  # (the reader may wait for them to go: room)
        return inputs

    def _run_infer(self, loop, e: GpuExecutor, dev, a, inputs) -> None:
        """EXEC thread: INPUT copy, EXEC, OUTPUT copy; times measured here."""
        from worker.devices.base import DeviceError

        t0 = now_ns()
        status, message, exec_ns, outs = ErrorCode.SUCCESS, "", None, None
        try:
            arr = inputs[0].array if inputs else None  # a view over the received bytes
            out, exec_ns = dev.infer(a.model, arr, a.batch_size)
            prof = self.instances.get(a.model)
            specs = prof.outputs if prof is not None else []
            outs = [Tensor.of(specs[k].name if k < len(specs) else f"output{k}", o)
                    for k, o in enumerate(out if isinstance(out, list) else [out])]
        except DeviceError as err:  # each device error carries the code to answer with
            status, message = err.code, str(err)
        except Exception as err:  # noqa: BLE001 - a failed EXEC must still be answered
            status, message = ErrorCode.INVALID_INPUT, f"EXEC failed: {err!r}"
        t1 = now_ns()
        loop.call_soon_threadsafe(self._completed, e, a, t0, t1, status, message, exec_ns, outs)

    def _run_load(self, loop, e: GpuExecutor, dev, a) -> None:
        from worker.devices.base import DeviceError
        from worker.memory import ArenaError

        t0 = now_ns()
        status, message = ErrorCode.SUCCESS, ""
        try:
            dev.load(a.model)
            if self.executors[e.gpu] is not e:
                # a reset replaced the executor that asked for these weights while they
                # loaded: the executors after it do not hold them (the reset evicted only
                # what was loaded then), so they leave the device now (a LOAD of the new
                # executors runs after this one, on this thread). (A reset after this
                # check finds them loaded and evicts them itself.)
                dev.drop(a.model)
        except DeviceError as err:  # each device error carries the code to answer with
            status, message = err.code, str(err)
        except ArenaError as err:
            status, message = ErrorCode.LOAD_INSUFFICIENT_CACHE, str(err)
        except Exception as err:  # noqa: BLE001
            status, message = ErrorCode.LOAD_INSUFFICIENT_CACHE, f"LOAD failed: {err!r}"
        t1 = now_ns()
        loop.call_soon_threadsafe(self._completed, e, a, t0, t1, status, message, None, None)

    def _completed(self, e: GpuExecutor, a, t0: int, t1: int, status: ErrorCode,
                   message: str, duration: int | None, outs) -> None:
        """A device thread finished an action (its work from ``t0`` to ``t1``). The result
        says the lane was held from when the executor started the action to now, when
        the executor hears of its end and can start the next: the hand-over to the
        thread and back belongs to the lane as much as the work does, and the controller
        predicts the lane from these times (a GPU's small models on the host's event
        loop: the hand-overs were as long as the work). ``duration`` stays the device's
        own figure (the work alone, ``t1 - t0`` where the device gives none)."""
        if status and a.type == ActionType.INFER:
            self._exec_failed(f"INFER {a.id} of {a.model} (batch {a.batch_size}) failed on "
                              f"GPU {e.gpu}: {status.name}: {message}")
        self.wloop.complete(e, a.id, now_ns(), status, message,
                            t1 - t0 if duration is None else duration, outs, a.type)

    def _emit(self, results: list[Result]) -> None:
        if not results:
            return
        want = self._want
        out = self._out
        by = self._answer_by
        urgent = 0  # the soonest a result here must go (0: none is in a hurry)
        size = 0
        for r in results:
            outs = None
            if r.type == ActionType.INFER:
                if r.id in want:
                    want.discard(r.id)
                    if r.status == ErrorCode.SUCCESS:
                        # a real device's output Tensors; the emulated device has none and
                        # sends none (the controller answers zeros of the output shapes)
                        outs = r.outputs
                if by:
                    due = by.pop(r.id, 0)
                    if due and r.status == ErrorCode.SUCCESS and (not urgent or due < urgent):
                        urgent = due
            item = (r, outs or None)  # a message when sent: outputs in it or attached
            out.append(item)
            size += _backlog_bytes(item)
        self._out_bytes += size
        if urgent:
            if now_ns() < urgent:  # (past its deadline already: no hurry)
                # due one interval before it, on the pacer's clock (the worker's clock
                # less --clock-offset-ms)
                urgent -= _OFFSET + round(self.result_interval_us * 1000)
                if not self._out_due or urgent < self._out_due:
                    self._out_due = urgent
            else:
                urgent = 0
        # (a writer asleep until its next slot is woken only by a result due before it)
        if not self._send_at or (urgent and urgent < self._send_at):
            self._out_ready.set()

    def take_message(self, attach: list | None = None) -> pb.WorkerMessage | None:
        """The next results ready to send as one message (None: none), built in place,
        with their output tensors: in the message, or (a list ``attach``, the fast link)
        as attachments, the device's buffers. In order, as many as fit in
        ``RESULT_MESSAGE_BYTES`` (at least one); the rest wait for the next call."""
        out = self._out
        if not out:
            self._out_ready.clear()
            self._out_due = 0
            return None
        msg = pb.WorkerMessage()
        field = msg.results.results
        limit = RESULT_MESSAGE_BYTES
        if self._out_bytes <= limit // 4:
            # the usual case: a few results, all in (a result's size is within a few
            # times its estimate), not measured one by one
            for item in out:
                _add_item(field, item, attach)
            out.clear()
            self._out_bytes = 0
        else:
            size = 0
            taken = 0  # their estimated bytes (``_out_bytes``)
            while out:
                item = out[0]
                mark = len(attach) if attach is not None else 0
                n = _add_item(field, item, attach).ByteSize() + 6  # (+ its tag and length)
                if attach is not None and len(attach) > mark:
                    n += sum(memoryview(a).nbytes for a in attach[mark:])
                if size and size + n > limit:  # the next message's first
                    del field[-1]
                    if attach is not None:
                        del attach[mark:]
                    break
                out.popleft()
                size += n
                taken += _backlog_bytes(item)
            self._out_bytes -= taken
        if not out:
            self._out_ready.clear()
            self._out_due = 0  # (none is waiting; a partial message leaves it as it was)
        if self._out_bytes <= RESULT_BACKLOG_BYTES:
            self._room.set()
        return msg

    async def run_timer(self) -> None:
        """Bind the worker's timer to the running event loop; runs until cancelled (then
        the armed timer is cancelled)."""
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.Event().wait()
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


def _add_item(field, item, attach: list | None):
    """Result ``item`` of ``WorkerNode._out`` added to ``field`` (a message's repeated
    ``ResultMsg``), its output tensors in it or (``attach``) attached; a message of
    its size."""
    if isinstance(item, pb.ResultMsg):  # a malformed action's answer
        field.append(item)
        return item
    r, ts = item
    m = add_result(field, r)
    if ts:
        if attach is None:
            add_tensors(m.outputs, ts)
        else:
            for t in ts:
                attach_tensor(m.outputs, t.name, t.shape, t.dtype, [t.data], attach)
    return m


def _backlog_bytes(item) -> int:
    """A result waiting in ``WorkerNode._out``: its bytes in a message, estimated (cheaply:
    ``take_message`` measures them exactly)."""
    if isinstance(item, pb.ResultMsg):
        return item.ByteSize() + 6
    r, ts = item
    n = _RESULT_BYTES + len(r.model) + len(r.message)
    if ts:
        n += sum(_RESULT_BYTES + t.nbytes for t in ts)
    return n


def _building_notes(done: threading.Event, what: str, t0: float, built) -> None:
    """Until ``done``: every ``BUILD_NOTE_S`` say that ``what``'s kernels are still being
    built (since ``t0``, ``time.perf_counter``) and call ``built()``."""
    while not done.wait(BUILD_NOTE_S):
        print(f"worker: still building the kernels of {what}, "
              f"{time.perf_counter() - t0:.0f} s so far", file=sys.stderr, flush=True)
        try:
            built()
        except Exception as e:  # noqa: BLE001 - the notes go on; the build is not ours to stop
            print(f"worker: a sign of life failed: {e!r}", file=sys.stderr, flush=True)


def _check_host_memory(pages: int, gpus: int) -> None:
    """ValueError unless the cpu device's weights caches (``gpus`` arenas of ``pages``
    pages, allocated and touched at start) fit in the memory the machine has available
    (``MemAvailable``; not checked where it cannot be read)."""
    need = pages * PAGE_SIZE * gpus
    try:
        with open("/proc/meminfo") as f:
            have = next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return
    if need > have:
        raise ValueError(f"--device cpu: {gpus} GPU(s) x {pages:,} pages x 16 MiB = "
                         f"{need / 2**30:,.1f} GiB of weights cache, more than the "
                         f"{have / 2**30:,.1f} GiB of memory available here: give fewer "
                         "--pages or --gpus")


def _open_device(kind: str, pages: int, index: int = 0):
    """A real device; raises ValueError with what to do instead when it cannot start."""
    if kind == "cpu":
        try:
            from worker.devices.cpu import CpuDevice
            return CpuDevice(pages)
        except ImportError:
            raise ValueError(f"--device cpu needs Apache TVM: {pip_extra('tvm')} "
                             "(or use --device emulated)") from None
        except MemoryError:
            raise ValueError(f"--device cpu: no memory for a weights cache of {pages:,} "
                             "pages of 16 MiB: give fewer --pages") from None
    try:
        from worker.devices.cuda import CudaDevice
    except ImportError as e:
        raise ValueError(f"--device cuda is not available here ({e}); use --device cpu "
                         "(TVM on the host) or --device emulated") from None
    try:
        return CudaDevice(pages, index=index)
    except Exception as e:  # DeviceUnavailable and friends carry the message to show
        raise ValueError(str(e)) from None


class WorkerServicer(pbg.WorkerServicer):
    def __init__(self, node: WorkerNode, link_port: int = 0,
                 advertise: tuple[str, ...] = ()) -> None:
        self.node = node
        self._session: _Session | None = None  # the controller connection that owns us
        self.link_port = link_port  # the fast link's port (0: not offered)
        self.port = 0  # the gRPC port it listens on (set once bound)
        self.host: str | None = None  # the host it listens on (set once bound)
        self.advertise = advertise  # other addresses it is reached as (--advertise)
        self._refused = Refusals("worker")
        self._links: set[asyncio.Task] = set()  # the fast-link connections' tasks
        self._versions_said: set[tuple[str, str]] = set()  # controllers of another protocol
        # controller -> why it said it does not use this worker (its last goodbye): its
        # next attempts are quiet until the reason changes or it uses the worker
        self._goodbyes: dict[str, str] = {}

    async def close(self, timeout: float = 1.0) -> None:
        """At stop: end the controller's session (its Connect stream ends, not cancelled
        by the server's stop) and wait up to ``timeout`` for the fast-link connections
        to finish; cancel what is left and wait for that too. Left to the loop's
        shutdown, a cancelled link printed a traceback (Python 3.11's streams callback
        asks a cancelled task for its exception)."""
        if self._session is not None:
            self._session.stop()
        if self._links:
            _, late = await asyncio.wait(set(self._links), timeout=timeout)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def _take(self, holder: Holder) -> str:
        """The one place that decides who holds this worker (``Holder.refuses``): a new
        connection (``holder``, from its first Hello) takes it if no session is live, or
        if the live one is the same controller's for the same worker index (its own
        reconnection: the stale session ends now); else it is refused -- another
        controller, or this one under a second address -- and this says why (what the
        refused controller is told; logged here once per refused controller while the
        holder's session lives). (No await between this and the new session: two
        connections cannot both pass.)"""
        old = self._session
        live = old is not None and old.active
        why = old.holder.refuses(holder, live) if old is not None else ""
        if not why:
            if live:
                old.stop()
            return ""
        if old.told(holder.controller_id):
            print(f"worker: refused a Connect from {holder.peer} "
                  f"({holder.label or 'a controller that does not say which'}): {why}; "
                  "it may take the worker once that connection ends (not said again for "
                  "this controller)", file=sys.stderr, flush=True)
        return why

    def _used(self, key: str, who: str) -> None:
        """A controller that did not use this worker last time uses it now."""
        self._goodbyes.pop(key, None)
        print(f"worker: {who} connected (it uses this worker now)", file=sys.stderr,
              flush=True)

    def _ended(self, key: str, who: str, session: _Session) -> None:
        """A controller's session ended: said, but for the attempts of a controller that
        does not use this worker, for the same reason as the last time (it tries again
        every few seconds: two lines each, without why, were all an operator saw)."""
        if session.goodbye:
            if self._goodbyes.get(key) != session.goodbye:
                if len(self._goodbyes) >= 64:
                    self._goodbyes.clear()
                self._goodbyes[key] = session.goodbye
                print(f"worker: {who} does not use this worker: {session.goodbye} (its "
                      "attempts not said again while the reason stays)", file=sys.stderr,
                      flush=True)
            return
        if session.on_used is None:  # (its connected line was said)
            print(f"worker: {who} disconnected", file=sys.stderr, flush=True)
        else:  # (quiet, and ended neither used nor refused: said, and quiet no more)
            self._goodbyes.pop(key, None)
            print(f"worker: {who} connected and disconnected without using this worker",
                  file=sys.stderr, flush=True)

    def _other_protocol(self, holder: Holder, why: str) -> None:
        """Log a controller refused for its worker protocol, once per controller and
        version (it tries again every fraction of a second)."""
        key = (_controller_key(holder), why)
        if key in self._versions_said:
            return
        if len(self._versions_said) >= 64:
            self._versions_said.clear()
        self._versions_said.add(key)
        print(f"worker: refused a Connect from {holder.peer}: {why} (not said again for "
              "this controller)", file=sys.stderr, flush=True)

    def _is_me(self, target: str, peer: str) -> bool:
        """Whether the controller's proof, from gRPC peer ``peer``, was made for this
        worker's address."""
        return answers_to(target, self.port, peer, self.advertise, self.host)

    async def _authorize(self, context, method: str) -> None:
        """With a cluster secret: refuse a call without the controller's proof
        (UNAUTHENTICATED, before anything runs), else send ours back as the response's
        initial metadata."""
        auth = self.node.cluster_auth
        if auth is None:
            return
        peer = context.peer()
        why, nonce, target = auth.check_controller(method, context.invocation_metadata(),
                                                   lambda t: self._is_me(t, peer))
        if why is not None:
            self._refused(f"{method.rpartition('/')[2]} from {peer}: {why}")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "cluster authentication failed")
        await context.send_initial_metadata(auth.worker_metadata(method, nonce, target))

    async def ClockSync(self, request, context):  # noqa: N802
        await self._authorize(context, WORKER_CLOCK_SYNC)
        return pb.ClockSyncResponse(worker_time=now_ns())

    async def LoadModelFromDisk(self, request, context):  # noqa: N802
        await self._authorize(context, WORKER_LOAD)
        try:
            return self.node.load_from_disk(request.name, request.path)
        except PackageRefused as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (OSError, ValueError, KeyError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot load package: {e}")

    async def Connect(self, request_iterator, context):  # noqa: N802
        node = self.node
        if node.cluster_auth is not None:
            await self._authorize(context, WORKER_CONNECT)
        else:  # at once, as with a secret: a controller waits for them before its Hello
            await context.send_initial_metadata(())
        it = request_iterator.__aiter__()
        first = await anext(it, None)
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be Hello")
        holder = Holder.of(first.hello, context.peer())
        why = mismatch("controller", holder.label or host_of(holder.peer),
                       first.hello.protocol, first.hello.software)
        if why:  # (before it may take the worker: a mixed pair does not work together)
            self._other_protocol(holder, why)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        why = self._take(holder)
        if why:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        session = self._session = _Session(node, first.hello.fast_link and self.link_port > 0,
                                           self._refused, holder)
        # (an operator on this host learns who holds the worker, and since when)
        who = f"controller {holder.label or '(unnamed)'} from {holder.peer}"
        key = _controller_key(holder)
        if key in self._goodbyes:  # (refused last time: said once it uses the worker)
            session.on_used = lambda: self._used(key, who)
        else:
            print(f"worker: {who} connected", file=sys.stderr, flush=True)
        rtask = None
        try:  # (from here on the session ends with this call, however it ends: a session
            # left active would hold the worker for a controller that is gone)
            await node.read_packages(node.unprepared(first.hello.instances))
            if not session.active:  # taken over meanwhile: this Hello is not applied
                return
            state = node.hello(first.hello)
            if session.ticket:
                state.link_port, state.link_ticket = self.link_port, session.ticket
            yield pb.WorkerMessage(state=state)

            async def reader() -> None:
                while True:
                    await session.room()
                    msg = await anext(it, None)
                    if msg is None:
                        break
                    if not await session.deliver(msg):
                        return
                session.wake.set()

            rtask = asyncio.create_task(reader())
            rtask.add_done_callback(_report_reader)
            if session.ticket:  # the link moves to TCP: this stream waits, idle
                ended = asyncio.ensure_future(session.ended.wait())
                await asyncio.wait([rtask, ended], return_when=asyncio.FIRST_COMPLETED)
                ended.cancel()
            else:
                async for m, _ in session.outgoing(rtask, fast=False):
                    yield m
        finally:
            if rtask is not None:
                rtask.cancel()
            session.stop()
            self._ended(key, who, session)
        if session.refused:  # the controller's stream ends with why
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, session.refused)

    async def serve_link(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        """A connection to the link port: the ticket of the session that owns the worker
        first (else it is closed at once), then that session's messages as frames.
        Cancelled (the worker stops), it ends quietly: on Python 3.11 asyncio's streams
        callback calls ``exception()`` on the connection's task, which raises (and a
        traceback is printed) for a task that ended cancelled."""
        task = asyncio.current_task()
        self._links.add(task)
        stream = FrameStream(reader, writer, pb.ControllerMessage.FromString)
        try:
            await self._serve_link(reader, writer, stream)
        except asyncio.CancelledError:
            stream.close()
        finally:
            self._links.discard(task)

    async def _serve_link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          stream: FrameStream) -> None:
        session = self._session
        try:
            async with asyncio.timeout(LINK_WAIT_S):
                ticket = await reader.readexactly(TICKET_BYTES)
        except (asyncio.IncompleteReadError, TimeoutError, OSError):
            ticket = b""
        if session is None or not session.claim(ticket):
            self._refused(f"fast link from {writer.get_extra_info('peername')}: no valid ticket")
            stream.close()
            return

        async def read() -> None:
            while True:
                await session.room()
                if (msg := await stream.read()) is None:
                    break
                if not await session.deliver(msg, stream.tail):
                    return
            session.wake.set()

        rtask = asyncio.create_task(read())
        rtask.add_done_callback(_report_reader)
        try:
            async for m, attached in session.outgoing(rtask, fast=True):
                await stream.write(m, attached)
        except (ConnectionError, OSError):
            pass
        finally:
            rtask.cancel()
            session.stop()
            stream.close()


def _controller_key(holder: Holder) -> str:
    """What tells one controller from another in the worker's memory of what it said:
    its id (cut: a peer may send megabytes), else its host."""
    return holder.controller_id[:64] or host_of(holder.peer)


def _unknown_fields(msg) -> str:
    """The field numbers of a message that this version does not know, in words."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    numbers = sorted({f.field_number for f in UnknownFieldSet(msg)})
    return (f"field(s) {', '.join(map(str, numbers[:8]))}: a newer controller?" if numbers
            else "an empty message")


def _report_reader(t: asyncio.Task) -> None:
    if t.cancelled() or t.exception() is None:
        return
    e = t.exception()
    why = ("nothing sent to the controller on it acknowledged or read for "
           f"{keepalive.SILENT_S} s"
           if isinstance(e, TimeoutError) else repr(e))  # (watch_tcp: a silent controller)
    print(f"worker: controller stream failed: {why}", file=sys.stderr, flush=True)


class _Session:
    """One controller connection (a ``Connect`` stream, and its fast link if it takes
    one): what it has sent is handled by ``handle``; ``outgoing`` yields what to send it
    (results as they are ready, echoes, the answers to InstanceUpdates) until the session
    ends: its controller's reconnection took the worker over, either transport ended, or
    it refused a message (more than ``MAX_ACTIONS_PER_MESSAGE`` actions: ``refused``
    says so, and the gRPC stream ends with it, ``RESOURCE_EXHAUSTED``). While it lives
    (``active``) its controller (``holder``) holds the worker."""

    def __init__(self, node: WorkerNode, offer: bool, refusals, holder: Holder) -> None:
        self.node = node
        self.holder = holder  # the controller it belongs to (clockwork.protocol.holding)
        self._told: set[str] = set()  # the other controllers refused while it lives
        self._refusals = refusals  # logs a refused message (``Refusals``)
        self.refused = ""  # why the session ended on a message it refused, if it did
        self.goodbye = ""  # why its controller said it does not use this worker, if it did
        # called at its controller's first echo or actions (it uses the worker), if set
        self.on_used: Callable[[], None] | None = None
        self.echoes: deque[pb.ClockEcho] = deque()
        self.states: list[pb.WorkerState] = []  # answers to InstanceUpdates
        # something to send (results, echoes, states) or the end: one event, the node's
        self.wake = node._out_ready
        self.ended = asyncio.Event()
        self.ticket = new_ticket() if offer else b""
        self.claimed = False
        # ``deliver``: the last message queued behind an InstanceUpdate (None, or done:
        # none), the instances those updates add, whether every message now queues
        self._updating: asyncio.Task | None = None
        self._adding: set[str] = set()
        self._held = False

    @property
    def active(self) -> bool:
        return not self.ended.is_set()

    def stop(self) -> None:
        self.ended.set()
        self.wake.set()
        if self._updating is not None:
            self._updating.cancel()  # (its package read goes on in its thread, to no end)

    def told(self, controller_id: str) -> bool:
        """Whether a refusal of the controller ``controller_id`` while this session lives
        is the first (to be logged); at most ``_TOLD_MAX`` controllers are remembered."""
        if controller_id in self._told or len(self._told) >= _TOLD_MAX:
            return False
        self._told.add(controller_id)
        return True

    def claim(self, ticket: bytes) -> bool:
        """Whether ``ticket`` is this session's, not yet used (constant-time compare)."""
        if not self.ticket or self.claimed or not self.active:
            return False
        if not hmac.compare_digest(ticket, self.ticket):
            return False
        self.claimed = True
        return True

    async def room(self) -> None:
        """Returns once the results waiting to be sent are at most
        ``RESULT_BACKLOG_BYTES``, the states at most ``STATES_WAITING_MAX``, the clock
        echoes at most ``ECHOES_WAITING_MAX`` and a real device's inputs held at most
        ``INPUTS_WAITING_BYTES``: the reader asks before it reads the
        controller's next message (backpressure: the controller's writes wait;
        ``outgoing`` sends on)."""
        node = self.node
        while (node._out_bytes > RESULT_BACKLOG_BYTES or len(self.states) > STATES_WAITING_MAX
               or len(self.echoes) > ECHOES_WAITING_MAX
               or node._inputs_bytes > INPUTS_WAITING_BYTES):
            node._room.clear()
            await node._room.wait()

    async def deliver(self, msg: pb.ControllerMessage, tail=None) -> bool:
        """``handle``, but a Hello or an InstanceUpdate that brings instances of packages
        no device has read yet (``WorkerNode.unprepared``) has them read on a thread
        first: reading one takes from a fraction of a second (a library, weights into
        host memory) to a minute or more (a cuda package's kernels not built at start), and the
        event loop runs the other models' actions meanwhile.

        An InstanceUpdate is applied (and answered) once its packages are read, after
        the InstanceUpdates before it, however long that takes (a real-size cuda
        package's first kernel build: a minute or more; the controller waits while the
        worker answers its echoes); the messages behind it are handled as they come
        (actions of the other models, probes) until one names an instance still to be
        added (the controller may send such actions at once after an update it does not
        wait for: one it sends a worker that reconnected while a model was loaded): that
        one and every message after it but probes wait their turn, in order. A Hello (a reset) waits
        for all of those and holds back the messages behind it. False once the session
        has ended."""
        kind = msg.WhichOneof("kind")
        waiting = self._updating is not None and not self._updating.done()
        if kind == "update":
            paths = self.node.unprepared(msg.update.add)
            if paths or waiting:
                self._adding.update(i.name for i in msg.update.add)
                self._after(msg, tail, paths)
                return self.active
        elif kind == "hello":
            if waiting:
                await asyncio.wait([self._updating])
            await self.node.read_packages(self.node.unprepared(msg.hello.instances))
        elif waiting and kind != "echo" and (self._held or kind == "actions" and any(
                a.model in self._adding for a in msg.actions.actions)):
            # (a probe's echo is answered at once whatever waits: it says the worker
            # lives, and a held one would have the controller find it suspect, or give
            # up on the InstanceUpdate whose packages are being read: the controller
            # waits for its answer while it hears from the worker)
            self._held = True  # (in order from here on, until the queue is done)
            self._after(msg, tail, [])
            return self.active
        return self.handle(msg, tail)

    def _after(self, msg: pb.ControllerMessage, tail, paths: list[Path]) -> None:
        """Handle ``msg`` once the messages queued before it are (``deliver``)."""
        self._updating = asyncio.create_task(self._queued(self._updating, msg, tail, paths))

    async def _queued(self, earlier: asyncio.Task | None, msg: pb.ControllerMessage, tail,
                      paths: list[Path]) -> None:
        if earlier is not None:
            await asyncio.wait([earlier])
        await self.node.read_packages(paths)
        self.handle(msg, tail)
        if asyncio.current_task() is self._updating:  # the last queued: all applied
            self._adding.clear()
            self._held = False

    def handle(self, msg: pb.ControllerMessage, tail=None) -> bool:
        """One message from the controller (``tail``: its frame's attachments); False
        once the session has ended."""
        if not self.active:
            return False
        node = self.node
        kind = msg.WhichOneof("kind")
        if self.on_used is not None and kind in ("echo", "actions"):
            used, self.on_used = self.on_used, None
            used()
        if kind == "actions" and len(msg.actions.actions) > MAX_ACTIONS_PER_MESSAGE:
            # handling it would hold the event loop past the controller's probe timeout:
            # refused whole, and the connection ends (its actions cannot be answered
            # one by one in less time than running them)
            self.refused = (f"a message of {len(msg.actions.actions)} actions: at most "
                            f"{MAX_ACTIONS_PER_MESSAGE} per message "
                            "(clockwork.sizes.MAX_ACTIONS_PER_MESSAGE)")
            self._refusals(f"{self.refused}; ending the controller's connection",
                           "message_too_large")
            self.stop()
            return False
        try:
            if kind == "actions":
                node.submit(msg.actions, tail)
            elif kind == "echo":
                e = pb.ClockEcho()
                e.CopyFrom(msg.echo)
                e.worker_time = now_ns()
                self.echoes.append(e)
                self.wake.set()
            elif kind == "hello":  # a reset (a re-admission): answered once applied
                self.states.append(node.hello(msg.hello))
                self.wake.set()
            elif kind == "update":
                self.states.append(node.update(msg.update))
                self.wake.set()
            elif kind == "goodbye":  # (the session ends here: said as it does)
                self.goodbye = printable(msg.goodbye, 1000, "...")
                self.stop()
            else:  # (a kind of a newer protocol, or none: nothing to do, and no answer)
                node._complain("a message from the controller of a kind this worker does "
                               f"not know ({_unknown_fields(msg)}): ignored")
        except Exception as e:  # noqa: BLE001 - one bad message, not the stream
            node._complain(f"a {kind} message from the controller failed: {e!r}", e)
            if kind == "hello":  # (a reset unanswered held the controller's re-admission
                # for good, this worker connected and unused): the session ends, and the
                # controller connects again, with a Hello of its own
                self.refused = f"a reset from the controller failed: {e!r}"
                self.stop()
                return False
            if kind == "update":  # answered all the same (the controller waits for it):
                with contextlib.suppress(Exception):  # none of its instances was added
                    st = node.state([i.name for i in msg.update.add])
                    st.update_seq = msg.update.seq
                    self.states.append(st)
                    self.wake.set()
        return True

    async def outgoing(self, rtask: asyncio.Task, fast: bool):
        """(message, attachments) to send, until the session ends or ``rtask`` (the
        reader) does; ``fast``: output tensors as attachments (else in the messages)."""
        node = self.node
        echoes, states, wake = self.echoes, self.states, self.wake
        rtask.add_done_callback(lambda _: wake.set())
        pacer = Pacer(node.result_interval_us)
        while self.active:
            if not node._out and not echoes and not states:
                if rtask.done():  # (its wake may have been taken by a round with work)
                    return
                await wake.wait()
                if rtask.done() or not self.active:
                    return
            wake.clear()
            while echoes:
                e = echoes.popleft()
                node._room.set()  # (the reader may wait for echoes to go: room)
                yield pb.WorkerMessage(echo=e), ()
            while states:
                st = states.pop(0)
                node._room.set()  # (the reader may wait for states to go: room)
                yield pb.WorkerMessage(state=st), ()
            if node._out:  # under load: one message per interval, but none past its due
                at = pacer.slot(node._out_due)
                if at > time.monotonic_ns():
                    node._send_at = at
                    try:  # (woken by a result due sooner, an echo, a state)
                        await doze(at, wake)
                    finally:
                        node._send_at = 0
                    if wake.is_set() and not rtask.done():
                        continue  # (what woke it goes first; then the slot again)
                pacer.sent()
            attach: list | None = [] if fast else None
            msg = node.take_message(attach)
            if msg is not None:
                pacer.note(len(msg.results.results))
                yield msg, attach or ()


async def serve_worker(host: str, port: int, node: WorkerNode, ready=None,
                       stop: asyncio.Event | None = None, tls: TlsFiles | None = None,
                       link_port: int = 0, advertise: tuple[str, ...] = ()) -> None:
    """Serve until ``stop``; with ``tls`` the port speaks TLS only (and asks the controller
    for a client certificate when ``tls.ca`` is set). ``link_port``: where the fast link
    (``clockwork.protocol.framing``) listens (0: a free port; -1: no fast link; with
    ``tls`` it speaks TLS too, with the same certificate and client-certificate rule).
    ``ready(port, link_port)`` is called once both listen (link_port 0: none).
    ``advertise``: addresses (``HOST:PORT``) the controller may dial it at besides this
    machine's names and ``port`` (a NAT, a container's port mapping): with a cluster
    secret, the controller's proof must name one of them."""
    servicer = WorkerServicer(node, advertise=tuple(advertise))
    # with a secret, a call without a proof is refused before its request is read
    guard = (None if node.cluster_auth is None
             else [ClusterProofInterceptor(node.cluster_auth, servicer._refused)])
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      *LISTEN_OPTIONS, *keepalive.WORKER_SERVER],
                             interceptors=guard)
    pbg.add_WorkerServicer_to_server(servicer, server)
    bound = bind_grpc(server, host, port, "--port",
                      tls.grpc_credentials() if tls is not None else None)
    servicer.port, servicer.host = bound, host
    link = None
    if link_port >= 0:
        tls_link = {} if tls is None else {"ssl": tls.ssl_context(alpn=()),
                                           "ssl_handshake_timeout": LINK_WAIT_S}
        try:
            link = await asyncio.start_server(servicer.serve_link, host, link_port, **tls_link)
        except OSError as e:
            raise ListenError(f"--link-port {link_port}: cannot listen on {host}: "
                              f"{e.strerror or e}") from None
        servicer.link_port = link.sockets[0].getsockname()[1]
        accept_guard.guard(link)  # (out of descriptors: a line a second, no spinning)
        accept_guard.quiet(asyncio.get_running_loop(), "worker")
    await server.start()
    timer = asyncio.create_task(node.run_timer())
    if ready is not None:
        ready(bound, servicer.link_port)
    stop = stop or asyncio.Event()
    try:
        await stop.wait()
    finally:
        timer.cancel()
        if link is not None:
            link.close()  # (no new connections)
        await servicer.close()
        await server.stop(0.5)


def listening_line(args: argparse.Namespace, node: WorkerNode, port: int, link_port: int) -> str:
    """The line a worker prints once it serves (launchers read its address from it)."""
    where = "" if args.device == "emulated" else f", packages from {node.packages}"
    fast = f", fast link on port {link_port}" if link_port else ""
    return (f"clockwork worker listening on {join(args.host, port)} ({args.gpus} {args.device} "
            f"GPU(s), {node.pages} pages each, profiles {node.pset.name}{where}{fast})")


def cmd_worker(args: argparse.Namespace) -> int:
    global _OFFSET
    _OFFSET = round(args.clock_offset_ms * 1e6)
    up = time.monotonic_ns()
    if up + _OFFSET < 0:  # (every time it sent was refused as malformed: nothing served)
        print(f"clockwork worker: --clock-offset-ms {args.clock_offset_ms:g}: the worker's "
              f"clock would read before 0 (it counts from this host's start, "
              f"{up / 1e9:,.0f} s ago, and its times are never negative): at least "
              f"{-(up // 1_000_000):,}", file=sys.stderr)
        return 2
    if args.device == "cuda":  # say first when there is no GPU, before profiles and packages
        try:
            from worker.devices.cuda import probe
            probe()
        except Exception as e:  # noqa: BLE001 - DeviceUnavailable carries what to do instead
            print(f"clockwork worker: {e}", file=sys.stderr)
            return 2
    args.profiles = args.profiles or DEFAULT_PROFILES[args.device]
    try:
        load_profile_set(args.profiles)
    except ProfileError as e:
        print(f"clockwork worker: {e}", file=sys.stderr)
        return 2
    try:
        secret = cluster_secret(getattr(args, "cluster_secret_file", None))
        tls = TlsFiles.from_flags(getattr(args, "tls_cert", None), getattr(args, "tls_key", None),
                                  getattr(args, "tls_ca", None))
    except SecurityError as e:
        print(f"clockwork worker: {e}", file=sys.stderr)
        return 2
    why = exposure_error("worker", args.host, None, secret,
                         getattr(args, "insecure_no_auth", False))
    if why is not None:
        print(f"clockwork worker: {why}", file=sys.stderr)
        return 2

    async def main() -> None:
        node = WorkerNode(args.gpus, args.pages, args.profiles, args.device, args.noise, args.seed,
                          args.packages, args.result_interval_us, args.slow_prob,
                          args.slow_factor)
        node.cluster_auth = ClusterAuth(secret) if secret is not None else None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop_event_on_signals(loop, stop)
        orphan = asyncio.ensure_future(stop_when_orphaned(stop, "worker"))
        await asyncio.to_thread(node.prepare_packages, stop.is_set)
        if stop.is_set():
            orphan.cancel()
            return

        def ready(port: int, link_port: int) -> None:
            print(listening_line(args, node, port, link_port), flush=True)

        try:
            await serve_worker(args.host, args.port, node, ready, stop, tls, args.link_port,
                               tuple(args.advertise))
        finally:
            orphan.cancel()
        # (an operator tells a stop from a crash by it; a clean stop said nothing)
        print(f"clockwork worker: stopped{said_why(stop)}", file=sys.stderr, flush=True)

    try:
        run_precise(main())
    except (ListenError, ValueError) as e:
        print(f"clockwork worker: {e}", file=sys.stderr)
        return 2
    return 0


def _cut(name: str) -> str:
    """An instance name from the controller as a log line shows it: at most 130
    characters (a 2 MiB name made a 2 MiB line), none that moves the terminal."""
    return printable(name, 130, "...")
