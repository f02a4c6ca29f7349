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
  Ray on the same node, and its worker listens on the **same port** as before (the port
  chosen at first start is kept in a file in the node's temporary folder, named after
  this cluster's run id). The controller, which keeps reconnecting to a lost worker at
  its address, takes it over again (Hello with reset: an empty weights cache) -- no new
  address to learn;
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
  port (``worker_port + 10 * i``) are those of its place ``i`` in the controller's order
  (an actor made for a later place, because a node before it failed, is made again for
  its own); actors' names and port files are numbered apart, never reused;
- ``stop`` kills the workers' actors and every actor still starting or being added by
  the node watcher (which makes none once stopping, and kills one the controller took
  meanwhile): none is left holding a node's GPUs.

Not here yet: a worker whose old port is taken when Ray restarts it fails to start (the
controller would have to learn a new address); a node that leaves keeps its worker's
GPUs in the controller's view, lost (the controller keeps trying to reconnect).
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import Executor, Future
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clockwork.cluster.serve import ChildRefused, LocalCluster

RESOURCE = "clockwork_gpu"  # Ray custom resource: emulated (and cpu-device) GPUs
READY_TIMEOUT_S = 60.0  # for a worker in an actor to listen
# a node that could not host a worker is looked at again after 1, 2, 4, ... looks, at
# most this many (32 s apart at watch_s = 2 s)
RETRY_LOOKS_MAX = 16
REBIND_S = 10.0  # a restarted worker retries its old port this long
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's nodes use 127.0.0.1


def _state_dir(run_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"clockwork-ray-{run_id}"


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
    ``RayCluster``). ``__init__`` returns once the worker listens; if the worker's thread
    ends by itself the process exits, so that Ray starts the actor again."""

    def __init__(self, index: int, flags: list[str], secret: str, run_id: str,
                 host: str | None = None, port: int = 0, insecure: bool = False,
                 slot: int | None = None) -> None:
        """``index``: the worker's place in the controller's order (its flags and port
        were chosen by it); ``slot``: this actor's own number (its port file; default
        ``index``), never reused in a cluster."""
        from clockwork.protocol.security import SECRET_ENV, cluster_secret, exposure_error

        self.index = index
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = host or ray.util.get_node_ip_address()  # the node's address in Ray
        self._port_file = _state_dir(run_id) / f"worker{index if slot is None else slot}.port"
        # a restart (same node): take the port of the first start again
        self.restarted = self._port_file.exists()
        if self.restarted:
            port = int(self._port_file.read_text())
        self.args = worker_args(flags, self.host, port)
        self.secret = cluster_secret(None, {SECRET_ENV: secret}) if secret else None
        why = exposure_error("worker", self.host, None, self.secret, insecure)
        if why is not None:
            raise ValueError(why)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        deadline = time.monotonic() + (REBIND_S if self.restarted else 0.0)
        while True:
            self._ready = threading.Event()
            self._error: BaseException | None = None
            self._thread = threading.Thread(target=self._run, name="clockwork-worker",
                                            daemon=True)
            self._thread.start()
            if not self._ready.wait(READY_TIMEOUT_S):
                raise TimeoutError(f"worker {index} did not listen in {READY_TIMEOUT_S:.0f} s")
            if self._error is None:
                break
            self._thread.join()
            if time.monotonic() >= deadline:  # not a port still held: refuse now
                raise self._error
            time.sleep(0.25)
        self._port_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._port_file.with_suffix(".tmp")
        tmp.write_text(str(self.port))
        tmp.replace(self._port_file)
        self.started = time.time()
        print(f"clockwork ray: worker {index} {'restarted' if self.restarted else 'started'} "
              f"(pid {self.pid}, node {self.node_id[:12]}) at {self.address()}", flush=True)

    def _run(self) -> None:
        from clockwork.protocol.precise_loop import run_precise
        from clockwork.protocol.security import ClusterAuth
        from worker.service import WorkerNode, listening_line, serve_worker

        a = self.args

        async def main() -> None:
            node = WorkerNode(a.gpus, a.pages, a.profiles, a.device, a.noise, a.seed,
                              a.packages, a.result_interval_us, a.slow_prob, a.slow_factor)
            node.cluster_auth = ClusterAuth(self.secret) if self.secret is not None else None
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(port: int, link_port: int) -> None:
                self.port = port
                print(listening_line(a, node, port, link_port), flush=True)
                self._ready.set()

            await serve_worker(a.host, a.port, node, ready, self._stop, None, a.link_port)

        try:
            run_precise(main())
        except BaseException as e:  # noqa: BLE001 - reported to __init__, or fatal below
            self._error = e
            if not self._ready.is_set():
                self._ready.set()
                return
        if not self._stopping:  # the worker ended by itself: let Ray start it again
            print(f"clockwork ray: worker {self.index} ended ({self._error!r}); exiting so "
                  "that Ray restarts it", file=sys.stderr, flush=True)
            os._exit(1)

    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def info(self) -> dict:
        return {"index": self.index, "address": self.address(), "pid": self.pid,
                "node_id": self.node_id, "restarted": self.restarted,
                "started": self.started}

    def stop(self) -> None:
        """Stop the worker and forget its port (the cluster is going away)."""
        self._stopping = True
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5.0)
        self._port_file.unlink(missing_ok=True)
        try:
            self._port_file.parent.rmdir()
        except OSError:
            pass


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
    try:
        ray.init(**kw)
    finally:
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
        self._made = 0  # actors made, each numbered (its name and port file)
        # node id -> [cause, failures, looks to skip] of a node that has no worker
        self._unhosted: dict[str, list] = {}
        self._own_ray = False

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
        init_ray(**kw)
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
        started, failed = self._launch(offered, 0)
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

    def _launch(self, offered: list[tuple[tuple[str, str, int], float]], first: int):
        """A worker actor on each of ``offered`` (as ``offered_nodes`` gives them) that
        has the CPUs for one, waiting up to ``timeout`` for them to listen: (the started
        ones as (node, actor, address), the others as (node, cause, one line)). The
        started ones are the controller's workers ``first``, ``first + 1``, ... in order,
        each made with that index's flags and port: one made for a later place (a node
        before it failed) is made again for its place. An actor that did not start is
        killed (a pending one would take its node's GPUs later). The started ones stay in
        ``_pending`` until the caller counts them."""
        started, failed = [], []
        todo = []
        for node, cpus in offered:
            if cpus < self.worker_num_cpus:
                failed.append((node, "cpus", f"it has {cpus:g} CPU(s) and a worker actor "
                               f"takes {self.worker_num_cpus:g} (worker_num_cpus)"))
            else:
                todo.append(node)
        tries: list = []
        try:
            while todo and not self._watch_stop.is_set():
                tries = []
                for k, node in enumerate(todo):
                    actor = self._start_actor(node, first + len(started) + k)
                    tries.append((node, actor, actor.address.remote(),
                                  first + len(started) + k))
                ready = set(ray.wait([t[2] for t in tries], num_returns=len(tries),
                                     timeout=self.timeout)[0])
                todo = []
                for node, actor, ref, index in tries:
                    if ref in ready:
                        try:
                            address = ray.get(ref)
                        except Exception as e:  # noqa: BLE001 - the node's line says what
                            cause, line = (type(e).__name__,
                                           f"its worker actor did not start: {_first_line(e)}")
                        else:
                            if index == first + len(started):
                                started.append((node, actor, address))
                            else:  # (made for a later place: again, for its own)
                                self._drop(actor)
                                todo.append(node)
                            continue
                    else:
                        cause, line = "timeout", (
                            f"its worker actor did not start in {self.timeout:.0f} s (are "
                            "its GPUs or CPUs taken by other actors?)")
                    self._drop(actor)
                    failed.append((node, cause, line))
                tries = []
        except BaseException:
            for t in tries:
                self._drop(t[1])
            for _, actor, _ in started:
                self._drop(actor)
            raise
        return started, failed

    def _drop(self, actor) -> None:
        """Kill ``actor`` (one of ours that is not a worker of the controller)."""
        with self._lock:
            self._pending.discard(actor)
        _kill(actor)

    def _unhosted_now(self, node: tuple[str, str, int], cause: str, line: str) -> None:
        """``node`` has no worker (``cause``: a key, ``line``: why): said once per cause;
        it is looked at again after 1, 2, 4, ... ``RETRY_LOOKS_MAX`` looks."""
        if self._watch_stop.is_set():  # (stopping: its actor was killed for that)
            return
        was = self._unhosted.get(node[0])
        failures = was[1] + 1 if was else 1
        if was is None or was[0] != cause:
            again = "; looked at again while the cluster serves" if self.watch_s > 0 else ""
            print(f"clockwork: Ray node {_node_name(node)} has no worker: {line}{again}",
                  file=sys.stderr, flush=True)
        self._unhosted[node[0]] = [cause, failures, min(2 ** (failures - 1), RETRY_LOOKS_MAX)]

    def _start_actor(self, node: tuple[str, str, int], index: int):
        """A worker actor on ``node`` (node id, address, GPU count) for the controller's
        worker ``index``: that worker's flags (``worker_args[index]``) and port
        (``worker_port + 10 * index``); its name and port file by the order actors are
        made (never reused). Put in ``_pending``; none once the cluster is stopping
        (``_Stopping``)."""
        node_id, ip, n = node
        flags = self._flags(index, n)
        worker_args(flags, "127.0.0.1", 0)  # a bad flag: one line here, not in an actor
        port = self.worker_port + 10 * index if self.worker_port else 0
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
            index, flags, self.cluster_secret or "", self.run_id, ip, port,
            self.insecure_workers, slot)
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
        Called every ``watch_s`` seconds while the cluster runs."""
        from clockwork.client import Client

        known = {node_id for node_id, *_ in self.nodes}
        offered = offered_nodes(self.device)
        live = {node[0] for node, _ in offered}
        for gone in set(self._unhosted) - live:
            del self._unhosted[gone]
        due = []
        for node, cpus in offered:
            was = self._unhosted.get(node[0])
            if node[0] in known:
                continue
            if was is not None and was[2] > 0:  # (its turn is not yet)
                was[2] -= 1
                continue
            due.append((node, cpus))
        cpus_of = {node[0]: cpus for node, cpus in due}
        added = []
        while due and not self._watch_stop.is_set():
            # (the controller gives the next worker the next index: len(actors))
            started, failed = self._launch(due, len(self.actors))
            for node, cause, line in failed:
                self._unhosted_now(node, cause, line)
            due = []
            shifted = False  # a node before this one was not taken
            for node, actor, address in started:
                if self._watch_stop.is_set() or shifted:
                    # stopping; or its flags and port are for another place: made again
                    self._drop(actor)
                    if not self._watch_stop.is_set():
                        due.append((node, cpus_of[node[0]]))
                    continue
                try:
                    with Client(self.address, token=self.token or "") as c:
                        got = c.add_worker(address, timeout=self.timeout)
                except Exception as e:  # noqa: BLE001 - the node is tried again later
                    self._drop(actor)
                    self._unhosted_now(node, type(e).__name__, "the controller did not take "
                                       f"its worker at {address}: {_first_line(e)}")
                    shifted = True
                    continue
                with self._lock:
                    counted = not self._watch_stop.is_set() and actor in self._pending
                    if counted:
                        self._pending.discard(actor)
                        self.actors.append(actor)
                        self.nodes.append(node)
                        self.worker_addresses.append(address)
                if not counted:  # stopped while the controller took it: ours to kill
                    _kill(actor)
                    continue
                self._unhosted.pop(node[0], None)
                print(f"clockwork: Ray node {_node_name(node)} joined: worker {got['worker']} "
                      f"at {address}, GPUs {got['gpus']}", file=sys.stderr, flush=True)
                added.append(got)
        return added

    def _watch(self) -> None:
        said = None  # the last failure's kind: said once, until another or a success
        while not self._watch_stop.wait(self.watch_s):
            try:
                self.add_new_nodes()
                said = None
            except _Stopping:
                return
            except Exception as e:  # noqa: BLE001 - keep watching; say what went wrong
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

    def _stop_workers(self) -> None:
        self._watch_stop.set()  # (no actor is made from now on)
        if self._watcher is not None:
            self._watcher.join(timeout=self.timeout)
            self._watcher = None
        # the workers, and the actors still starting or being added by the watcher (one
        # still running past the join above kills what it makes or adds from now on)
        with self._lock:
            actors, pending = self.actors, list(self._pending)
            self.actors = []
            self._pending.clear()
        if actors:
            try:
                ray.get([a.stop.remote() for a in actors], timeout=10.0)
            except Exception:  # noqa: BLE001 - a dead or restarting actor: kill it anyway
                pass
        for a in actors + pending:
            _kill(a)
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
        self._own = not ray.is_initialized()
        if self._own:
            init_ray(address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False,
                     include_dashboard=False, configure_logging=False)
        self._remote: dict = {}
        self._refs: list = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        task = self._remote.get(fn)
        if task is None:
            task = self._remote[fn] = ray.remote(num_cpus=1, max_retries=0)(fn)
        ref = task.remote(*args, **kwargs)
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
