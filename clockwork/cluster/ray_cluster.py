"""``clockwork serve --ray [ADDRESS]``: the workers as Ray actors (composition root).

Ray places and restarts the processes; the data path stays our gRPC protocol:

- one **worker per Ray node** that offers GPUs: an actor (``WorkerActor``) that holds
  all of that node's GPUs -- ``num_gpus`` for real ones (``--device cuda``; Ray sets
  ``CUDA_VISIBLE_DEVICES``), the custom resource ``clockwork_gpu`` for emulated (and
  ``cpu``) ones, so a cluster without GPUs can run it (``ray start --resources
  '{"clockwork_gpu": 2}'``). It is pinned to its node (``NodeAffinitySchedulingStrategy``,
  not soft) and runs the worker service in its own process (a thread with its own event
  loop), listening on the node's address;
- the **controller** is a child process of the driver (this machine, the head node when
  run as a Ray job), started with ``--workers`` set to the addresses the actors report;
- ``max_restarts`` (default: unlimited): an actor whose process dies is started again by
  Ray on the same node, and its worker listens on the **same port** as before, with the
  same flags (its place and the port chosen at first start are kept in a file in the
  node's temporary folder, named after this cluster's run id). The controller, which
  keeps reconnecting to a lost worker at its address, takes it over again (Hello with
  reset: an empty weights cache) -- no new address to learn. An actor Ray will not start
  again (``ray.kill`` without a restart, a restart that failed, its node gone) is found
  by the node watcher: a new one on its node serves its place on its port
  (``replace_dead_workers``);
- the actors' output (the worker's lines) goes to Ray's log files on each node and is
  streamed to the driver by Ray (``log_to_driver``), prefixed with the actor's pid and
  node;
- the cluster secret (a new random one per cluster) reaches the controller in its
  environment and the actors as a constructor argument: the Ray cluster is the trust
  boundary (whoever can submit work to it can run code on its nodes anyway).

``RayCluster`` is a ``LocalCluster`` whose workers are those actors: ``with
RayCluster(address=...) as c: Client(c.address)``; ``c.worker_info(i)`` has each actor's
pid, node and address.

- **nodes that join** while the cluster serves: every ``watch_s`` seconds (2 s) Ray's
  node list is read; a live node offering GPUs without a worker gets one (an actor, as
  above), and the running controller is told to connect it (``Client.add_worker``: its
  GPUs get the next indices and the policy places copies there by its usual rules);
- **nodes that cannot host a worker** (an actor takes ``worker_num_cpus``, 1 CPU, of its
  node; one held pending past ``timeout`` is killed, so that it cannot take the GPUs
  later, unseen): one line each, the cluster serves on the others, and the node is looked
  at again after 1, 2, 4, ... ``RETRY_LOOKS_MAX`` looks (its line again only for another
  cause);
- a worker's per-worker flags (``worker_args[i]``: a scenario's clock offset, seed) and
  port (``worker_port + 10 * i``, its fast link one above) are those of its place ``i``
  in the controller's order.
  An actor is made once per node and look and first only holds its node; its worker is
  started for a place when its turn comes (at start all at once, one after a node that
  failed started again in the same actor for the place it then takes), so a node that
  fails or is refused makes no other actor again. A worker the controller did not take
  is stopped before another serves its place (a fixed ``worker_port``'s port is free
  again): its worker stopped, else its actor killed and gone (one still in a slow
  ``serve`` is killed at once), each wait bounded by ``RELEASE_S``; the next worker for
  that place retries a fixed port it cannot listen on for ``REBIND_S``;
- an ``AddWorker`` the controller did not answer (the call's deadline passed: it may
  have taken the worker as the caller gave up) is in doubt, not failed: the worker keeps
  serving its place and the same address is asked again, this look and the next ones
  (``added`` False: the controller had it), and no other node is added meanwhile; only
  the controller's refusal (or a call that never reached it) releases it. So the
  controller's order and the places do not drift apart (a worker the controller numbers
  otherwise, because something else added one to it, is one line); actors' names and
  place files are numbered apart, never reused;
- ``stop`` stops the node watcher first (its waits on Ray end at once; it makes and adds
  none once stopping, and kills one the controller took meanwhile), then the controller,
  then it kills the workers' actors and every actor still starting or being added: no
  node joining during the stop gets an actor, or is asked of the controller, and none is
  left holding a node's GPUs.

- a node that **leaves** (its actor dead for good and the node no longer in Ray's list):
  said once, and its worker taken out of the controller for good
  (``Client.remove_worker``): no more reconnecting to it, its GPUs out of the counts.

Not here yet: a worker whose old port is taken cannot serve its place again (the
controller would have to learn a new address: it is said, and tried again later).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from concurrent.futures import Executor, Future
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clockwork.cluster.local import (
    LINK_PORT_OFFSET,
    WORKER_PORT_STEP,
    ChildRefused,
    LocalCluster,
    own_link_port,
)
from clockwork.protocol.addresses import join

RESOURCE = "clockwork_gpu"  # Ray custom resource: emulated (and cpu-device) GPUs
# what a call on an actor that will not run again raises: died (killed for good, its
# restart failed) or unschedulable (pinned to a node that left)
_DEAD_FOR_GOOD = tuple(e for e in (getattr(ray.exceptions, "ActorDiedError", None),
                                   getattr(ray.exceptions, "ActorUnschedulableError", None))
                       if e is not None)
READY_TIMEOUT_S = 60.0  # for a worker in an actor to listen, from its last sign of life
# a cuda worker builds its packages' kernels before it listens (minutes the first time
# on a machine), each sign of life giving it READY_TIMEOUT_S more in its actor, which
# gives up by itself past that: the driver waits for one this long in all
BUILD_WAIT_S = 3600.0
# a node that could not host a worker is looked at again after 1, 2, 4, ... looks, at
# most this many (32 s apart at watch_s = 2 s)
RETRY_LOOKS_MAX = 16
# a worker retries a fixed port it cannot listen on this long: a restarted one its old
# port, one serving a place the port a released actor's process may still hold
REBIND_S = 10.0
STOP_S = 5.0  # for a worker in an actor to stop (its ports closed)
# a worker the controller did not take is stopped before its place (a fixed --worker-port's
# port) is served by another actor: this long for it to stop, and as long again for its
# actor, killed, to be gone (each wait its own deadline)
RELEASE_S = 15.0
WAIT_SLICE_S = 0.1  # the node watcher's waits on Ray end this soon once the cluster stops
ADD_TRIES = 2  # AddWorker calls per look for a worker whose add is in doubt
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's nodes use 127.0.0.1
# connecting to a Ray cluster by its address this long without an answer: said (Ray's own
# retries go on for minutes, each a line of its words only)
CONNECT_SAY_S = 30.0
# what to look at when Ray does not connect to the cluster at an address
CONNECT_HINT = (f"check the address; that this machine reaches the address the head "
                f"advertises (a head started on this machine's loopback advertises it only "
                f"with {LOOPBACK_ENV}=0 set for `ray start` and for this command); and Ray's "
                "authentication (RAY_AUTH_TOKEN or RAY_AUTH_MODE, as the head's)")


def connect_ray(who: str, error: type[Exception], **kw) -> None:
    """``init_ray(**kw)`` for command ``who`` (``clockwork serve``): for a cluster at an
    address, a wait past ``CONNECT_SAY_S`` is said with what to look at (Ray retries for
    minutes in its own words); a connection Ray gives up on is raised as ``error`` in one
    line (Ray's words name an ``--address`` flag our commands do not have)."""
    address = kw["address"]
    said = None
    if address not in ("local", "auto"):
        said = threading.Timer(CONNECT_SAY_S, lambda: print(
            f"{who}: --ray {address}: not connected after {CONNECT_SAY_S:.0f} s (Ray's lines "
            f"above say what it tries); {CONNECT_HINT}; Ctrl-C stops", file=sys.stderr,
            flush=True))
        said.daemon = True
        said.start()
    try:
        init_ray(**kw)
    except ConnectionError as e:
        if address == "auto":
            raise error("--ray auto: no running Ray cluster found from this machine "
                        "($RAY_ADDRESS unset, none started here); start one (ray start "
                        "--head), give its address (--ray HOST:PORT), or give --ray alone "
                        "for a one-node Ray instance of its own") from e
        raise error(f"--ray {address}: Ray did not connect ({_first_line(e)}); "
                    f"{CONNECT_HINT}") from e
    finally:
        if said is not None:
            said.cancel()


def own_packages() -> None:
    """In a worker actor's process: ``worker`` and ``controller`` imported from this
    installation, before any folder Ray put ahead of it on the path (the driver's working
    folder: a user's ``worker.py`` there was imported instead, and every actor failed
    "No module named 'worker.service'; 'worker' is not a package")."""
    import clockwork

    root = str(Path(clockwork.__file__).resolve().parent.parent)
    for name in ("worker", "controller"):
        m = sys.modules.get(name)
        where = getattr(m, "__file__", None) or ""
        if m is not None and not str(Path(where).resolve()).startswith(root + os.sep):
            for k in [k for k in sys.modules if k == name or k.startswith(f"{name}.")]:
                del sys.modules[k]  # (another's, imported by mistake: ours from now)
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)


def _own_then(fn, /, *args, **kwargs):
    """A Ray task: ``fn(*args, **kwargs)`` once ``own_packages`` has run (a sweep's point
    imports ``controller``: a user's ``controller.py`` in the driver's folder, on the
    task's path, would be imported instead)."""
    own_packages()
    return fn(*args, **kwargs)


def _state_dir(run_id: str) -> Path:
    """Where a node's worker actors keep their place files for run ``run_id``: inside a
    folder of this user's alone (``clockwork-ray-UID``, mode 0700) in the temporary
    folder, which every local user can write: a folder or file another user put there
    first would have been taken as ours (its flags passed to the worker: a --packages
    folder of theirs, whose model.so the worker loads, or --host 0.0.0.0)."""
    return _private_dir(Path(tempfile.gettempdir()) / f"clockwork-ray-{os.getuid()}") / run_id


def _private_dir(path: Path) -> Path:
    """``path``, a folder made (mode 0700) if missing; ``RuntimeError`` unless it is a
    folder (not a link) that this user owns and no one else may enter."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{path}: not a folder of this user's alone (owner uid "
                           f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it")
    return path


def _read_place(path: Path) -> dict | None:
    """A place file's content, None if there is none; a link is not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        return json.loads(f.read())


def _write_place(path: Path, place: dict) -> None:
    """``place`` into ``path`` (mode 0600) through a new temporary file, never through a
    link."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(place))
    tmp.replace(path)


def worker_args(flags: list[str], host: str, port: int):
    """``clockwork worker`` flags -> its parsed arguments (the CLI's own parser and checks;
    a bad value raises ``ValueError`` with argparse's one line)."""
    import contextlib
    import io

    from clockwork.cluster.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(["worker", "--host", host, "--port", str(port),
                                              *flags])
    except SystemExit:
        raise ValueError(err.getvalue().strip() or f"bad worker flags {flags}") from None


class WorkerActor:
    """A ``clockwork worker`` in a Ray actor's process (made a Ray actor class by
    ``RayCluster``). ``__init__`` only takes the node (the actor holds its GPUs); ``serve``
    starts the worker for a place in the controller's order. A restart (Ray started the
    actor again after its process died) serves its place again at once, on the same port.
    If the worker's thread ends by itself the process exits, so that Ray starts the actor
    again."""

    def __init__(self, secret: str, run_id: str, host: str | None = None,
                 insecure: bool = False, slot: int = 0) -> None:
        """``slot``: this actor's own number (its name and place file), never reused in a
        cluster."""
        from clockwork.protocol.security import SECRET_ENV, cluster_secret, exposure_error

        self.index: int | None = None  # the place it serves (None: none yet)
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = host or ray.util.get_node_ip_address()  # the node's address in Ray
        self.secret = cluster_secret(None, {SECRET_ENV: secret}) if secret else None
        why = exposure_error("worker", self.host, None, self.secret, insecure)
        if why is not None:
            raise ValueError(why)
        self.port = 0
        self.started = time.time()
        self._run: _Run | None = None
        self._place_file = _state_dir(run_id) / f"worker{slot}.json"
        # a restart (same node): the place it served, on the port of its first start
        was = _read_place(self._place_file)
        self.restarted = was is not None
        if self.restarted:
            self._serve(was["index"], was["flags"], was["port"], REBIND_S)

    def ready(self) -> bool:
        """True once the actor runs on its node (its GPUs and CPUs are taken)."""
        return True

    def serve(self, index: int, flags: list[str], port: int) -> str:
        """Run the worker for the controller's place ``index`` (its ``clockwork worker``
        flags but ``--host``/``--port``; ``port``: 0 for a free one); returns its
        ``host:port`` once it listens. A worker it runs for another place is stopped first
        (its port free again); for this place: left as it is. A fixed ``port`` that cannot
        be bound is tried again for ``REBIND_S`` (the worker that served this place before,
        in an actor just killed, may hold it until its process is gone)."""
        if self._run is not None:
            if self.index == index:
                return self.address()
            if not self._end_worker():
                raise RuntimeError(f"its worker for place {self.index} did not stop")
        self._serve(index, flags, port, REBIND_S if port else 0.0)
        return self.address()

    def _serve(self, index: int, flags: list[str], port: int, rebind_s: float) -> None:
        """Start the worker and wait until it listens (a port it cannot listen on, maybe
        still held: retried for ``rebind_s``); then its place and port are kept in the
        place file."""
        from clockwork.protocol.listen import ListenError

        args = worker_args(flags, self.host, port)
        deadline = time.monotonic() + rebind_s
        while True:
            run = self._run = _Run(args)
            self.index = index
            threading.Thread(target=self._main, args=(run,), name="clockwork-worker",
                             daemon=True).start()
            # (a cuda worker builds its packages' kernels first: each package built, and
            # each note while one builds, gives it the wait again)
            while not run.ready.wait(1.0):
                if time.monotonic() - run.progress > READY_TIMEOUT_S:
                    raise TimeoutError(f"worker {index} did not listen: no sign of life "
                                       f"for {READY_TIMEOUT_S:.0f} s")
            if run.error is None:
                break
            self._run, self.index = None, None
            # (not a port it cannot listen on, or past the deadline: refuse now)
            if not isinstance(run.error, ListenError) or time.monotonic() >= deadline:
                raise run.error
            time.sleep(0.25)
        self.port = run.port
        _private_dir(self._place_file.parent)
        _write_place(self._place_file, {"index": index, "flags": list(flags), "port": self.port})
        print(f"clockwork ray: worker {index} {'restarted' if self.restarted else 'started'} "
              f"(pid {self.pid}, node {self.node_id[:12]}) at {self.address()}", flush=True)

    def _main(self, run: _Run) -> None:
        from clockwork.protocol.precise_loop import run_precise
        from clockwork.protocol.security import ClusterAuth

        own_packages()
        from worker.service import WorkerNode, listening_line, serve_worker

        a = run.args

        async def main() -> None:
            node = WorkerNode(a.gpus, a.pages, a.profiles, a.device, a.noise, a.seed,
                              a.packages, a.result_interval_us, a.slow_prob, a.slow_factor)
            node.cluster_auth = ClusterAuth(self.secret) if self.secret is not None else None
            run.loop = asyncio.get_running_loop()
            run.stop = asyncio.Event()
            if run.stopping:  # (stopped before it listened)
                run.stop.set()

            def built() -> None:
                run.progress = time.monotonic()

            await asyncio.to_thread(node.prepare_packages, run.stop.is_set, built)

            def ready(port: int, link_port: int) -> None:
                run.port = port
                print(listening_line(a, node, port, link_port), flush=True)
                run.ready.set()

            await serve_worker(a.host, a.port, node, ready, run.stop, None, a.link_port)

        try:
            run_precise(main())
        except BaseException as e:  # noqa: BLE001 - reported to _serve, or fatal below
            run.error = e
        finally:
            run.ended.set()
        if not run.ready.is_set():  # (it never listened: _serve says why)
            run.ready.set()
            return
        if not run.stopping:  # the worker ended by itself: let Ray start it again
            print(f"clockwork ray: worker {self.index} ended ({run.error!r}); exiting so "
                  "that Ray restarts it", file=sys.stderr, flush=True)
            os._exit(1)

    def _end_worker(self) -> bool:
        """Stop the worker it runs (if any): True once it has stopped (its ports closed)."""
        run = self._run
        if run is None:
            return True
        run.stopping = True
        if run.loop is not None and run.stop is not None:
            run.loop.call_soon_threadsafe(run.stop.set)
        if not run.ended.wait(STOP_S):
            return False
        self._run, self.index, self.port = None, None, 0
        return True

    def address(self) -> str:
        return join(self.host, self.port)

    def info(self) -> dict:
        return {"index": self.index, "address": self.address(), "pid": self.pid,
                "node_id": self.node_id, "restarted": self.restarted,
                "started": self.started}

    def forget(self, slot: int) -> None:
        """Remove the place file of this cluster's actor ``slot`` on this node: one that
        died for good, whose place this actor now serves (its own ``stop`` never ran)."""
        (self._place_file.parent / f"worker{slot}.json").unlink(missing_ok=True)

    def stop(self) -> bool:
        """Stop the worker and forget its place (the cluster is going away, or the
        controller did not take it): True once the worker has stopped (its port is free)."""
        stopped = self._end_worker()
        self._place_file.unlink(missing_ok=True)
        try:
            self._place_file.parent.rmdir()
        except OSError:
            pass
        return stopped


class _Run:
    """One run of a worker in a ``WorkerActor`` (its thread and event loop)."""

    def __init__(self, args) -> None:
        self.args = args
        self.ready, self.ended = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.stopping = False
        self.port = 0
        self.progress = time.monotonic()  # the last sign of life before it listens


def init_ray(**kw) -> None:
    """``ray.init(**kw)``, keeping the SIGINT and SIGTERM handlers this process put in
    place: ``ray.init`` installs its own SIGTERM handler (``sys.exit``), which would skip
    the command's own stop (``clockwork serve|sweep|plan``: SIGTERM stops as Ctrl-C does,
    exit 130). A default or no handler is left to Ray. Only the main thread has
    handlers to keep."""
    kept = {}
    if threading.current_thread() is threading.main_thread():
        kept = {s: h for s in (signal.SIGINT, signal.SIGTERM)
                if (h := signal.getsignal(s)) not in (None, signal.SIG_DFL)}
    # Ray's handler is put in place as ray.init starts: a SIGTERM during init (seconds)
    # exited 15 with no stop of what Ray had started. Ray's setter is made a no-op
    # meanwhile, so that ours stays (it is put back after, as the handlers are).
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    setter = getattr(utils, "set_sigterm_handler", None) if signal.SIGTERM in kept else None
    if setter is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        ray.init(**kw)
    except BaseException:
        # (interrupted, or failed: stop what it started, its processes on this machine)
        with contextlib.suppress(Exception):
            ray.shutdown()
        raise
    finally:
        if setter is not None:
            utils.set_sigterm_handler = setter
        for s, h in kept.items():
            signal.signal(s, h)


def _node_name(node: tuple[str, str, int]) -> str:
    """A node in a line: its address and the start of its id (nodes may share one)."""
    return f"{node[1]} ({node[0][:12]})"


def _first_line(e: BaseException) -> str:
    """The last line of a Ray error's cause (what went wrong, without Ray's traceback)."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip()
    return text.splitlines()[-1] if text else repr(cause)


def offered_nodes(device: str) -> list[tuple[tuple[str, str, int], float]]:
    """The live Ray nodes that offer GPUs, each ((node id, address, GPU count), its CPU
    count); ``GPU`` for the cuda device, ``clockwork_gpu`` otherwise."""
    key = "GPU" if device == "cuda" else RESOURCE
    out = []
    for n in ray.nodes():
        res = n.get("Resources", {})
        count = int(res.get(key, 0))
        if n.get("Alive") and count > 0:
            out.append(((n["NodeID"], n["NodeManagerAddress"], count),
                        float(res.get("CPU", 0.0))))
    return sorted(out, key=lambda t: (t[0][1], t[0][0]))


def _failed_again(table: dict, key, cause: str) -> bool:
    """One more failure of ``key`` (``cause``: a key of why) in ``table`` (key ->
    [cause, failures, looks to skip]): it is looked at again after 1, 2, 4, ...
    ``RETRY_LOOKS_MAX`` looks (``_not_yet``). True when its line is to be said: the first
    failure, or another cause than the last."""
    was = table.get(key)
    failures = was[1] + 1 if was else 1
    table[key] = [cause, failures, min(2 ** (failures - 1), RETRY_LOOKS_MAX)]
    return was is None or was[0] != cause


def _not_yet(table: dict, key) -> bool:
    """Whether ``key``'s turn (``_failed_again``) has not come: this look of it skipped."""
    was = table.get(key)
    if was is not None and was[2] > 0:
        was[2] -= 1
        return True
    return False


def add_refused(e: BaseException) -> bool:
    """Whether a failed ``Client.add_worker`` call settles that the controller has not
    taken the worker: it answered with a refusal (the worker cannot serve the models, it
    cannot reach it, another controller holds it; an answer comes once its add ended,
    adds being one at a time), or the call never reached it. Its deadline passing, or an
    error that is not a gRPC status, leaves that in doubt: the controller may have taken
    the worker as the caller gave up, or take it still.

    ``UNAVAILABLE`` counts as settled: the controller's own answer when it cannot reach the
    worker, or no connection to the controller at all. It also comes when the connection
    drops after the request reached the controller; the controller is the driver's child
    on loopback, so that means it died (or is stopping), and with it whatever it took:
    nothing is left to settle."""
    import grpc

    from clockwork.errors import InvalidRequest

    if isinstance(e, InvalidRequest):  # (refused, or an address never sent)
        return True
    cause = e.__cause__
    if not isinstance(cause, grpc.RpcError) or not callable(getattr(cause, "code", None)):
        return False
    return cause.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


class _Stopping(Exception):  # noqa: N818 - not an error: the cluster is stopping
    """No worker actor is made: the cluster is stopping."""


def _kill(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001, S110 - gone already
        pass


class RayCluster(LocalCluster):
    """A controller (child process) and one worker per Ray node (a ``WorkerActor``).

    ``address``: the Ray cluster to attach to (``"auto"``, ``HOST:PORT``,
    ``ray://HOST:PORT``), or None: start a local one-node Ray instance offering ``gpus``
    GPUs (``clockwork_gpu``, or real ones for ``device="cuda"``). When Ray is already
    initialised in this process (a test, a Ray job) that session is used and left running.
    ``max_restarts``: Ray restarts a dead worker actor this often (-1: always).
    ``worker_num_cpus``: CPUs each worker actor reserves on its node (1): a node without
    them gets no worker. The other arguments are ``LocalCluster``'s; ``workers`` is
    ignored (one worker per node that offers GPUs).

    A node whose worker actor cannot start (no CPU for it, its GPUs held by other actors
    past ``timeout``, an error) is one line, the actor killed (a pending one would take
    the GPUs later, unseen); the cluster starts on the other nodes, and the node is looked
    at again while the cluster serves (after 1, 2, 4, ... ``RETRY_LOOKS_MAX`` looks; its
    line again only for another cause). No node that can host one: ``ChildRefused``
    (``TimeoutError`` when every actor only took too long)."""

    def __init__(self, *, address: str | None = None, max_restarts: int = -1,
                 worker_num_cpus: float = 1.0, insecure_workers: bool = False,
                 watch_s: float = 2.0, **kw) -> None:
        super().__init__(**kw)
        # how often Ray's node list is read for new nodes offering GPUs (each gets a
        # worker actor, added to the running controller); 0: never
        self.watch_s = watch_s
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.ray_address = address
        self.max_restarts = max_restarts
        self.worker_num_cpus = worker_num_cpus
        self.insecure_workers = insecure_workers
        self.run_id = secrets.token_hex(6)
        self.actors: list = []  # the workers' actors, in the controller's order
        self.nodes: list[tuple[str, str, int]] = []  # their nodes
        # actors made and not yet in actors (starting, or waiting for the controller to
        # take them): stop kills them too; _lock guards actors and _pending together
        self._pending: set = set()
        self._lock = threading.Lock()
        self._made = 0  # actors made, each numbered (its name and place file)
        # node id -> [cause, failures, looks to skip] of a node that has no worker
        self._unhosted: dict[str, list] = {}
        # (node, actor, address) of a worker the controller did not answer for (it may
        # have taken it): serving its place, asked again before any other node is added
        self._doubt: tuple | None = None
        self._doubt_said: str | None = None  # (its line is said once per address)
        self._asking = None  # the Client of an AddWorker under way (closed by a stop)
        self._own_ray = False
        # place -> [cause, failures, looks to skip] of a worker whose actor died for good
        # and has no new one yet (cause "gone": its node left; not tried again)
        self._dead: dict[int, list] = {}
        self._slot_of: dict = {}  # actor -> its number (its name and place file)

    def _init_ray(self) -> None:
        if ray.is_initialized():
            return
        kw: dict = {"log_to_driver": True, "include_dashboard": False,
                    "configure_logging": False}
        if self.ray_address in (None, "", "local"):
            kw |= {"address": "local", "num_cpus": max(1, math.ceil(self.worker_num_cpus))}
            if self.device == "cuda":
                pass  # Ray counts this machine's GPUs
            else:
                kw["resources"] = {RESOURCE: self.gpus}
            # on loopback, like a LocalCluster's workers (Ray would take this machine's
            # address; this is what it does on macOS and Windows, where clusters are off)
            # (the processes Ray starts read the variable; this one read it at import)
            if os.environ.setdefault(LOOPBACK_ENV, "0") == "0":
                try:
                    from ray._private import ray_constants
                    ray_constants.ENABLE_RAY_CLUSTER = False
                except (ImportError, AttributeError):
                    pass
        else:
            kw["address"] = self.ray_address
        connect_ray("clockwork serve", ChildRefused, **kw)
        self._own_ray = True

    def _flags(self, i: int, gpus: int) -> list[str]:
        """Worker ``i``'s flags with its node's GPU count; paths made absolute (an actor's
        working folder is not ours)."""
        saved = self.gpus, self.profiles, self.packages
        try:
            self.gpus = gpus
            if Path(self.profiles).exists():
                self.profiles = str(Path(self.profiles).resolve())
            if self.packages:
                self.packages = str(Path(self.packages).resolve())
            return self.worker_flags(i)
        finally:
            self.gpus, self.profiles, self.packages = saved

    def _start_workers(self) -> list[str]:
        self._init_ray()
        offered = offered_nodes(self.device)
        if not offered:
            what = ("GPUs (resource 'GPU')" if self.device == "cuda" else
                    f"emulated GPUs (resource '{RESOURCE}': ray start --resources "
                    f"'{{\"{RESOURCE}\": 2}}')")
            raise ChildRefused(f"no live Ray node offers {what}")
        placed, failed = self._place(offered)
        started, more = self._serve_in_order(placed, 0)
        failed += more
        if self._watch_stop.is_set():  # (stopped meanwhile: its actors are killed)
            raise ChildRefused("the cluster was stopped while its workers started")
        if not started:
            why = "; ".join(f"Ray node {_node_name(node)}: {line}" for node, _, line in failed)
            if all(cause == "timeout" for _, cause, _ in failed):
                raise TimeoutError(f"no worker actor started: {why}")
            raise ChildRefused(f"no Ray node can host a worker actor: {why}")
        with self._lock:
            if self._watch_stop.is_set():  # (stopped meanwhile: its actors are killed)
                raise ChildRefused("the cluster was stopped while its workers started")
            self.actors = [actor for _, actor, _ in started]
            self.nodes = [node for node, _, _ in started]
            self._pending.difference_update(self.actors)
        for node, cause, line in failed:
            self._unhosted_now(node, cause, line)
        return [address for _, _, address in started]

    def _place(self, offered: list[tuple[tuple[str, str, int], float]]):
        """A worker actor on each of ``offered`` (as ``offered_nodes`` gives them) that
        has the CPUs for one, each made once, waiting up to ``timeout`` for them to run on
        their nodes: (the placed ones as (node, actor), in order; the others as (node,
        cause, one line)). An actor that did not start is killed (a pending one would take
        its node's GPUs later). The placed ones hold their nodes and run no worker yet
        (``_serve_ref``); they stay in ``_pending`` until the caller counts them."""
        placed, failed, made = [], [], []
        try:
            for node, cpus in offered:
                if cpus < self.worker_num_cpus:
                    failed.append((node, "cpus", f"it has {cpus:g} CPU(s) and a worker actor "
                                   f"takes {self.worker_num_cpus:g} (worker_num_cpus)"))
                else:
                    made.append((node, self._make_actor(node)))
            refs = [actor.ready.remote() for _, actor in made]
            done = self._wait_ready(refs, self.timeout)
            for (node, actor), ref in zip(made, refs, strict=True):
                if ref in done:
                    try:
                        ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - the node's line says what
                        cause, line = (type(e).__name__,
                                       f"its worker actor did not start: {_first_line(e)}")
                    else:
                        placed.append((node, actor))
                        continue
                elif self._watch_stop.is_set():
                    cause, line = "stopping", "the cluster is stopping"
                else:
                    cause, line = "timeout", (
                        f"its worker actor did not start in {self.timeout:.0f} s (are "
                        "its GPUs or CPUs taken by other actors?)")
                self._drop(actor)
                failed.append((node, cause, line))
        except BaseException:
            for _, actor in made:
                self._drop(actor)
            raise
        return placed, failed

    def _serve_ref(self, node: tuple[str, str, int], actor, place: int,
                   port: int | None = None):
        """``actor`` (on ``node``) runs the worker of the controller's place ``place``: its
        flags (``worker_args[place]``, with the node's GPU count) and port (``port``, else
        ``worker_port + 10 * place``); the ref of its address. A bad flag: ``ValueError``
        here, in one line (not in the actor)."""
        flags = self._flags(place, node[2])
        worker_args(flags, "127.0.0.1", 0)
        if port is None:
            port = self.worker_port + WORKER_PORT_STEP * place if self.worker_port else 0
        if port and not own_link_port(flags):  # (a fixed port: its fast link's fixed too)
            flags = [*flags, "--link-port", str(port + LINK_PORT_OFFSET)]
        return actor.serve.remote(place, flags, port)

    @property
    def serve_timeout(self) -> float:
        """How long the driver waits for a worker to listen once its actor runs: the
        cluster's ``timeout``, and for cuda workers, which build kernels first, at least
        ``BUILD_WAIT_S`` (the actor gives up by itself once its worker shows no progress
        for ``READY_TIMEOUT_S``)."""
        return max(self.timeout, BUILD_WAIT_S) if self.device == "cuda" else self.timeout

    def _wait_ready(self, refs: list, timeout: float) -> set:
        """The refs of ``refs`` done within ``timeout`` (all of them: at once); sooner,
        those done by then, once the cluster is stopping (so that ``stop`` does not wait
        for a look of the node watcher)."""
        deadline = time.monotonic() + timeout
        left, done = list(refs), set()
        while left:
            wait = min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
            ready, left = ray.wait(left, num_returns=len(left), timeout=wait)
            done.update(ready)
            if self._watch_stop.is_set() or time.monotonic() >= deadline:
                break
        return done

    def _got(self, ref, timeout: float | None = None):
        """A worker's address from ``serve`` (waiting up to ``timeout``, less once the
        cluster is stopping): (None, address), or ((cause, one line), None) when it did
        not listen."""
        if timeout is not None and ref not in self._wait_ready([ref], timeout):
            if self._watch_stop.is_set():
                return ("stopping", "the cluster is stopping"), None
            return ("timeout", f"its worker did not listen in {timeout:.0f} s"), None
        try:
            return None, ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the node's line says what
            return (type(e).__name__, f"its worker did not start: {_first_line(e)}"), None

    def _serve_in_order(self, placed: list, first: int):
        """The workers of ``placed`` ([(node, actor)] from ``_place``), all started at once
        for places ``first``, ``first + 1``, ... in order: (the served ones as (node,
        actor, address), the others as (node, cause, one line)). A worker after one that
        did not start is started again in the same actor for the place it then takes
        (the next free one), once that place's port is free; no actor is made again. One
        that did not start is released (``_release``)."""
        served, failed = [], []
        try:
            refs = [self._serve_ref(node, actor, first + k)
                    for k, (node, actor) in enumerate(placed)]
            done = self._wait_ready(refs, self.serve_timeout)
            for k, ((node, actor), ref) in enumerate(zip(placed, refs, strict=True)):
                place = first + len(served)
                if ref in done:
                    why, address = self._got(ref)
                elif self._watch_stop.is_set():
                    why, address = ("stopping", "the cluster is stopping"), None
                else:
                    why, address = ("timeout", "its worker did not listen in "
                                    f"{self.serve_timeout:.0f} s"), None
                if why is None and first + k != place:  # (a node before it failed)
                    ref = self._serve_ref(node, actor, place)
                    why, address = self._got(ref, self.serve_timeout)
                if why is not None:
                    self._release(actor, ref)
                    failed.append((node, *why))
                    continue
                served.append((node, actor, address))
        except BaseException:
            for _, actor in placed:
                self._drop(actor)
            raise
        return served, failed

    def _drop(self, actor) -> None:
        """Kill ``actor`` (one of ours that is not a worker of the controller)."""
        with self._lock:
            self._pending.discard(actor)
        self._slot_of.pop(actor, None)
        _kill(actor)

    def _release(self, actor, serving=None) -> None:
        """Stop ``actor``'s worker and kill the actor (one of ours the controller did not
        take): returns once its worker has stopped or the actor is gone, so that the port
        of its place (a fixed ``worker_port``) is free for the next actor that serves that
        place. ``serving``: the ref of its last ``serve`` call; while that still runs (a
        worker slow to listen) a ``stop`` would only wait behind it, so the actor is killed
        at once. Each wait is bounded by its own ``RELEASE_S``: for ``stop``, then for the
        killed actor to be gone; past them it returns all the same (the next worker for
        that place retries its port for ``REBIND_S``, then its node's line says it is
        taken). Once the cluster is stopping: killed, no wait."""
        with self._lock:
            self._pending.discard(actor)
        self._slot_of.pop(actor, None)
        stopping = self._watch_stop.is_set()
        busy = serving is not None and not ray.wait([serving], timeout=0)[0]
        stopped = False
        if not stopping and not busy:
            try:
                stopped = bool(ray.get(actor.stop.remote(), timeout=RELEASE_S))
            except Exception:  # noqa: BLE001 - dead, or hung: killed below
                stopped = False
        _kill(actor)
        if stopped or stopping:
            return
        deadline = time.monotonic() + RELEASE_S  # (its own: from the kill on)
        while True:
            try:  # (a call on a killed actor fails once its process is gone)
                ray.get(actor.ready.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - gone (or past the deadline)
                return
            if self._watch_stop.wait(0.05) or time.monotonic() >= deadline:
                return

    def _unhosted_now(self, node: tuple[str, str, int], cause: str, line: str) -> None:
        """``node`` has no worker (``cause``: a key, ``line``: why): said once per cause;
        it is looked at again after 1, 2, 4, ... ``RETRY_LOOKS_MAX`` looks."""
        if self._watch_stop.is_set():  # (stopping: its actor was killed for that)
            return
        if _failed_again(self._unhosted, node[0], cause):
            again = "; looked at again while the cluster serves" if self.watch_s > 0 else ""
            print(f"clockwork: Ray node {_node_name(node)} has no worker: {line}{again}",
                  file=sys.stderr, flush=True)

    def _make_actor(self, node: tuple[str, str, int]):
        """A worker actor on ``node`` (node id, address, GPU count) that takes its GPUs and
        ``worker_num_cpus``, with no worker yet (``_serve_ref`` starts one for a place);
        its name and place file numbered by the order actors are made (never reused). Put
        in ``_pending``; none once the cluster is stopping (``_Stopping``)."""
        node_id, ip, n = node
        with self._lock:
            if self._watch_stop.is_set():
                raise _Stopping()
            slot = self._made
            self._made += 1
        opts: dict = {"num_cpus": self.worker_num_cpus,
                      "max_restarts": self.max_restarts,
                      "name": f"clockwork-{self.run_id}-worker{slot}",
                      "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id,
                                                                            soft=False)}
        if self.device == "cuda":
            opts["num_gpus"] = n
        else:
            opts["resources"] = {RESOURCE: n}
        # (made without the lock: Ray may wait on its control store here, and stop takes
        # the lock; stop sets its flag before it takes the lock, so an actor made while it
        # stops is either in _pending when stop looks, or killed here)
        actor = ray.remote(WorkerActor).options(**opts).remote(
            self.cluster_secret or "", self.run_id, ip, self.insecure_workers, slot)
        self._slot_of[actor] = slot
        with self._lock:
            stopping = self._watch_stop.is_set()
            if not stopping:
                self._pending.add(actor)
        if stopping:
            _kill(actor)
            raise _Stopping()
        return actor

    def start(self) -> RayCluster:
        self._watch_stop.clear()
        super().start()
        if self.watch_s > 0:
            self._watcher = threading.Thread(target=self._watch, name="clockwork-ray-nodes",
                                             daemon=True)
            self._watcher.start()
        return self

    def add_new_nodes(self) -> list[dict]:
        """A worker actor on every live Ray node offering GPUs that has none yet (one
        that could not host one before: when its turn comes again), each added to the
        running controller (``Client.add_worker``); returns the controller's answers.
        Called every ``watch_s`` seconds while the cluster runs.

        Each new node's actor is made once a look; its worker is started for the place
        the controller gives next (``len(actors)``) when its turn comes, so a node the
        controller refuses shifts no actor made for a later place. An add the controller
        did not answer (its deadline passed: it may have taken the worker as the call gave
        up, or take it still) is in doubt: that worker keeps serving its place and is
        asked again (the same address: the controller answers ``added`` False for a
        worker it has), on this look and the next ones, and no other node is added
        meanwhile (the controller would give it the next index)."""
        added: list[dict] = []
        if self._doubt is not None and not self._add(*self._doubt, added):
            return added  # (still no answer)
        known = {node_id for node_id, *_ in self.nodes}
        offered = offered_nodes(self.device)
        live = {node[0] for node, _ in offered}
        for gone in set(self._unhosted) - live:
            del self._unhosted[gone]
        due = []
        for node, cpus in offered:
            if node[0] not in known and not _not_yet(self._unhosted, node[0]):
                due.append((node, cpus))
        if not due or self._watch_stop.is_set():
            return added
        queue, failed = self._place(due)
        for node, cause, line in failed:
            self._unhosted_now(node, cause, line)
        try:
            while queue and not self._watch_stop.is_set():
                node, actor = queue[0]
                ref = self._serve_ref(node, actor, len(self.actors))
                queue.pop(0)
                why, address = self._got(ref, self.serve_timeout)
                if why is not None:
                    self._release(actor, ref)
                    self._unhosted_now(node, *why)
                elif not self._add(node, actor, address, added):
                    break  # (in doubt: the others wait for the next look)
        finally:
            for _, actor in queue:  # (no worker in them: made again on the next look)
                self._drop(actor)
        return added

    def _add(self, node: tuple[str, str, int], actor, address: str, added: list) -> bool:
        """Have the controller take ``actor``'s worker at ``address`` (serving the place
        ``len(actors)``): counted when it answers (its answer appended to ``added``);
        released when it refuses (the node is looked at again later); kept, serving its
        place, while its answer is in doubt (``_doubt``: asked again on the next look).
        False while in doubt."""
        from clockwork.client import Client

        place = len(self.actors)
        self._doubt = None
        got = err = None
        for _ in range(ADD_TRIES):
            if self._watch_stop.is_set():
                break
            try:
                with Client(self.address, token=self.token or "") as c:
                    with self._lock:
                        if self._watch_stop.is_set():
                            break
                        self._asking = c
                    try:
                        got = c.add_worker(address, timeout=self.timeout)
                    finally:
                        with self._lock:
                            self._asking = None
                break
            except Exception as e:  # noqa: BLE001 - settled below
                err = e
                if add_refused(e):
                    break
        if got is None and err is not None and add_refused(err):
            self._release(actor)
            self._unhosted_now(node, type(err).__name__, "the controller did not take its "
                               f"worker at {address}: {_first_line(err)}")
            return True
        if got is None:
            if self._watch_stop.is_set():  # (stopping: its actor is killed by stop)
                _kill(actor)
                return False
            self._doubt = (node, actor, address)
            if self._doubt_said != address:
                self._doubt_said = address
                print(f"clockwork: Ray node {_node_name(node)}: the controller did not say "
                      f"whether it took its worker at {address} "
                      f"({_first_line(err) if err is not None else 'no answer'}); it keeps "
                      f"serving place {place} and is asked again, no other node is added "
                      "meanwhile", file=sys.stderr, flush=True)
            return False
        with self._lock:
            counted = not self._watch_stop.is_set() and actor in self._pending
            if counted:
                self._pending.discard(actor)
                self.actors.append(actor)
                self.nodes.append(node)
                self.worker_addresses.append(address)
        if not counted:  # stopped while the controller took it: ours to kill
            _kill(actor)
            return True
        self._unhosted.pop(node[0], None)
        if got["worker"] != place:  # (someone else added a worker to this controller)
            print(f"clockwork: Ray node {_node_name(node)}'s worker at {address} is the "
                  f"controller's worker {got['worker']}, not {place}: it runs with the flags "
                  f"and port of place {place}", file=sys.stderr, flush=True)
        print(f"clockwork: Ray node {_node_name(node)} joined: worker {got['worker']} "
              f"at {address}, GPUs {got['gpus']}", file=sys.stderr, flush=True)
        added.append(got)
        return True

    def replace_dead_workers(self) -> list[int]:
        """A new actor for each worker whose actor died for good (Ray will not start it
        again: killed without a restart, its restart failed -- its old port taken --, or
        its node left), on the same node, serving its place on the port it had: the
        controller, which keeps reconnecting to a lost worker at its address, takes it
        over (Hello with reset: an empty weights cache). One line each. One that cannot
        be started again is said (once per cause) and tried again after 1, 2, 4, ...
        looks; one whose node left is said once and not tried again (the controller
        serves without it; a node that joins gets a worker of its own). Called every
        ``watch_s`` seconds while the cluster runs; returns the places served again."""
        with self._lock:
            actors = list(self.actors)
        if not actors or self._watch_stop.is_set():
            return []
        died = self._died(actors)
        if died:  # (a call in flight as a restartable actor's process died fails so too:
            # dead for good only if a call made now fails at once as well)
            again = self._died([actors[i] for i, _ in died])
            dead = [died[k] for k, _ in again]
        else:
            dead = []
        for i in [i for i in self._dead if i not in {i for i, _ in dead}
                  and self._answers(actors[i])]:
            del self._dead[i]  # (alive again: Ray did restart it after all)
        live = {node[0] for node, _ in offered_nodes(self.device)}
        back = []
        for i, err in dead:
            if self._watch_stop.is_set():
                break
            node, address = self.nodes[i], self.worker_addresses[i]
            if self._dead.get(i, [""])[0] == "gone" or _not_yet(self._dead, i):
                continue
            if node[0] not in live:  # (once: a "gone" one is passed over above)
                self._dead_now(i, "gone", f"its actor died ({_first_line(err)}) and its Ray "
                               f"node {_node_name(node)} is gone: the controller serves "
                               f"without it ({self._remove_gone(address)})")
                continue
            why = self._serve_again(i, node, address)
            if why is None:
                self._dead.pop(i, None)
                back.append(i)
                print(f"clockwork: worker {i}'s actor on Ray node {_node_name(node)} died "
                      f"({_first_line(err)}); a new one serves its place at {address}",
                      file=sys.stderr, flush=True)
            else:
                self._dead_now(i, *why)
        return back

    def _remove_gone(self, address: str) -> str:
        """Have the controller take out for good the worker at ``address``, whose Ray node
        left (``Client.remove_worker``: it stops reconnecting to it, and its GPUs leave
        the counts); what happened, in words."""
        from clockwork.client import Client

        try:
            with Client(self.address, token=self.token or "") as c:
                c.remove_worker(address, timeout=self.timeout)
        except Exception as e:  # noqa: BLE001 - said; the controller keeps it as lost
            return f"removing it from the controller failed: {_first_line(e)}"
        return "removed from the controller"

    def _died(self, actors: list) -> list[tuple[int, BaseException]]:
        """(index, error) of each of ``actors`` whose ``ready`` call fails within a second
        with ActorDiedError, or ActorUnschedulableError (an actor pinned to a node that
        left: its call fails so, never ActorDiedError, and the node's leaving went
        unsaid); one alive answers at once, one Ray restarts waits."""
        refs = [a.ready.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=min(1.0, self.watch_s))
        out = []
        for i, ref in enumerate(refs):
            if ref not in ready:
                continue  # (alive and slow, or being restarted by Ray)
            try:
                ray.get(ref)
            except _DEAD_FOR_GOOD as e:
                out.append((i, e))
            except Exception:  # noqa: BLE001, S112 - unavailable for now (restarting)
                continue
        return out

    @staticmethod
    def _answers(actor) -> bool:
        """Whether ``actor`` answers a call within a second."""
        try:
            return bool(ray.get(actor.ready.remote(), timeout=1.0))
        except Exception:  # noqa: BLE001 - dead, restarting or slow: not now
            return False

    def _serve_again(self, i: int, node: tuple[str, str, int], address: str):
        """A new actor on ``node`` serving place ``i`` at ``address``'s port: None once it
        listens (it replaces the dead one in ``actors``), else (cause, one line)."""
        try:
            actor = self._make_actor(node)
        except _Stopping:
            return "stopping", "the cluster is stopping"
        ref = None
        try:
            r = actor.ready.remote()
            if r not in self._wait_ready([r], self.timeout):
                self._drop(actor)
                return "timeout", (f"its actor died and a new one did not start in "
                                   f"{self.timeout:.0f} s (are its GPUs or CPUs taken?)")
            ref = self._serve_ref(node, actor, i, int(address.rpartition(":")[2]))
            why, got = self._got(ref, self.serve_timeout)
            if why is None and got != address:  # (the controller dials the old one)
                why = "address", f"it listens at {got}, not {address}"
        except Exception as e:  # noqa: BLE001 - said by the caller
            why = type(e).__name__, _first_line(e)
        if why is not None:
            self._release(actor, ref)
            return why[0], f"its actor died and a new one could not serve its place: {why[1]}"
        with self._lock:
            if self._watch_stop.is_set() or actor not in self._pending:
                stopping = True
            else:
                stopping = False
                self._pending.discard(actor)
                dead, self.actors[i] = self.actors[i], actor
        if stopping:  # (stop killed the others meanwhile: this one is ours to kill)
            _kill(actor)
            return "stopping", "the cluster is stopping"
        slot = self._slot_of.pop(dead, None)
        if slot is not None:  # (its place file, on this node, would stay behind)
            actor.forget.remote(slot)
        return None

    def _dead_now(self, i: int, cause: str, line: str) -> None:
        """Worker ``i`` has no live actor (``cause``: a key, ``line``: why): said once per
        cause, tried again after 1, 2, 4, ... ``RETRY_LOOKS_MAX`` looks (not a ``gone``
        one)."""
        if self._watch_stop.is_set():
            return
        if _failed_again(self._dead, i, cause):
            print(f"clockwork: worker {i} ({self.worker_addresses[i]}): {line}",
                  file=sys.stderr, flush=True)

    def _watch(self) -> None:
        said = None  # the last failure's kind: said once, until another or a success
        while not self._watch_stop.wait(self.watch_s):
            try:
                self.replace_dead_workers()
                self.add_new_nodes()
                said = None
            except _Stopping:
                return
            except Exception as e:  # noqa: BLE001 - keep watching; say what went wrong
                if self._watch_stop.is_set():  # (stopping: Ray may be shut down)
                    return
                if type(e).__name__ != said:
                    said = type(e).__name__
                    print(f"clockwork: looking for new Ray nodes failed: {said}: "
                          f"{_first_line(e)}", file=sys.stderr, flush=True)

    def shape(self) -> str:
        gpus = "+".join(str(n) for *_, n in self.nodes) or "0"
        return (f"{len(self.nodes)} {self.device} worker actor(s) on Ray node(s) x "
                f"{gpus} GPU(s)")

    def worker_info(self, i: int, timeout: float = 30.0) -> dict:
        """Worker ``i``'s actor: index, address, pid, node_id, restarted, started (waits
        while Ray restarts it)."""
        return ray.get(self.actors[i].info.remote(), timeout=timeout)

    def restart_worker(self, i: int) -> None:
        raise RuntimeError("Ray restarts a worker actor by itself")

    def restart_controller(self, extra=()) -> None:
        """As ``LocalCluster``'s, with the workers of every node the cluster holds: those
        of nodes that joined while the old controller served too (the new one was given
        the first ``--workers`` list, and the node watcher, which counts those nodes as
        known, never added their workers to it), but not those of nodes that left (taken
        out of the old one for good: the new one would dial them, and wait for them)."""
        with self._lock:
            workers = ",".join(a for i, a in enumerate(self.worker_addresses)
                               if self._dead.get(i, [""])[0] != "gone")
        argv = self._controller_argv
        argv[argv.index("--workers") + 1] = workers
        super().restart_controller(extra)

    def add_worker(self) -> dict:
        """Not here: a worker process of this machine, outside Ray, that ``stop`` would
        not stop. A Ray cluster's workers come from its nodes: a node that joins with the
        GPU resource gets one (the node watcher, or ``add_new_nodes``)."""
        raise RuntimeError("a Ray cluster adds a worker for each node that joins with its "
                           "GPUs (add_new_nodes(), or the node watcher); start a Ray node")

    def stop(self, hard: threading.Event | None = None) -> None:
        """The node watcher first (no node is placed or added from then on), then the
        controller, then the workers (``LocalCluster.stop``): a node joining while the
        controller stops (which may take a while: it writes its logs) gets no actor, and
        no add is asked of a controller that is going away."""
        self._stop_watcher()
        super().stop(hard)

    def _stop_watcher(self) -> None:
        """Stop the node watcher: no actor is made from now on; waits up to ``timeout``
        for its look to end (its waits on Ray end within ``WAIT_SLICE_S``, an AddWorker
        call under way is cancelled; Ray's actor creation may take longer: what it makes
        or adds from then on it kills itself)."""
        with self._lock:
            self._watch_stop.set()
            asking = self._asking
        if asking is not None:  # its call ends now (cancelled), not when the controller
            asking.close()  # answers: a node's add stays in doubt, and is undone below
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.timeout)

    def _stop_workers(self, hard=None) -> None:  # (actors: ``hard`` not needed)
        self._stop_watcher()  # (done already by stop)
        # the workers, and the actors still starting or being added by the watcher (one
        # still running past the join above kills what it makes or adds from now on)
        with self._lock:
            actors, pending = self.actors, list(self._pending)
            self.actors = []
            self._pending.clear()
            self._doubt = None
        if actors:  # (each stops on its own: one dead actor's error did not wait for
            # the others, which were killed before they removed their place files)
            refs = [a.stop.remote() for a in actors]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=10.0)
            for r in ready:
                with contextlib.suppress(Exception):  # a dead or restarting actor
                    ray.get(r)
        for a in actors + pending:
            _kill(a)
        # the run's folder of place files on this node goes: an actor that died for good
        # or was killed above (its own stop never ran) left its file there, and the
        # folder with it, one per run in the temporary folder (another node's is its own)
        base = Path(tempfile.gettempdir()) / f"clockwork-ray-{os.getuid()}"
        if base.is_dir():  # (not made here when none is: the actors ran elsewhere)
            with contextlib.suppress(OSError, RuntimeError):  # (not ours: left alone)
                shutil.rmtree(_private_dir(base) / self.run_id)
        if self._own_ray:
            ray.shutdown()
            self._own_ray = False


class RayExecutor(Executor):
    """``clockwork sweep|plan --ray [ADDRESS]`` (``--backend ray``): each task a Ray task
    of one CPU, on the Ray cluster this process is attached to, else the one
    ``RAY_ADDRESS`` names, else a local Ray instance started for it (and stopped at
    shutdown; not a cluster already running here, which ``ray.init()`` would attach to).
    Ray runs as many at once as the cluster has CPUs (``jobs`` is not a bound here). A
    task that fails raises in its future, as in a process pool."""

    sized_by_jobs = False  # (so a sweep's Runner keeps it for a larger round of points)

    def __init__(self, jobs: int) -> None:
        from clockwork.cluster.parallel import BackendUnavailable

        self._own = not ray.is_initialized()
        if self._own:
            connect_ray("clockwork", BackendUnavailable,
                        address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False,
                        include_dashboard=False, configure_logging=False)
        self._remote: dict = {}
        self._refs: list = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        task = self._remote.get(_own_then)
        if task is None:
            # (a task whose process died, killed or out of memory, is run once more, as a
            # local pool's broken point is run again alone: each writes its own folder
            # only, and runs the same again)
            task = self._remote[_own_then] = ray.remote(num_cpus=1, max_retries=1)(_own_then)
        ref = task.remote(fn, *args, **kwargs)
        self._refs.append(ref)
        return ref.future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for ref in self._refs:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001, S110 - finished already
                    pass
        elif wait and self._refs:
            ray.wait(self._refs, num_returns=len(self._refs))
        self._refs = []
        if self._own:
            ray.shutdown()
            self._own = False
