"""Many simulations at once (composition root): the runner behind ``clockwork sweep`` and
``clockwork plan``.

A *point* is one simulation: a scenario file and its ``--set`` overrides (the seed
among them). Points are independent and each is deterministic, so they run as parallel
tasks and give the same ``summary.json`` as ``clockwork simulate`` of the same scenario
and overrides, in whatever order or process they run.

Each point has a folder under ``ROOT/points/``, named from its parameters (readable
``key=value`` parts and a hash of all of them, so a name never changes). A point is done
when its ``summary.json`` exists and is a run's summary, and its ``point.json``'s
``inputs_sha256`` matches its scenario file, profile set and traces as they are now
(``point_digests``), and, where logs are asked for, its logs are there too:
``summary.json`` is written last, atomically (a temporary file renamed), by the parent
process, after the task returned. So a sweep stopped at any moment resumes where it left
off, and a point whose folder is deleted (or whose ``summary.json`` is not a run's
summary, or whose files changed, or that ran without the logs asked for now) runs
again.

Where tasks run is a *backend*: a function ``jobs -> concurrent.futures.Executor``,
registered by name in ``BACKENDS``. ``local`` (the default) is a process pool on this
machine; with one job the points run one after another in this process. A backend for
another engine (a Ray cluster, say) registers an executor factory with
``register_backend``; a task (``run_point``) needs the scenario files where it runs, and
with ``logs`` writes the point's logs into its folder there, while ``summary.json`` and
``run.json`` are written by the parent from what the task returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from clockwork.extras import pip_extra
from clockwork.filenames import name_bytes, printable
from clockwork.telemetry import write_atomic, write_json

POINTS = "points"  # ROOT/points/<name>/
SUMMARY = "summary.json"
# a point's request and action logs, in either format (``logs = true``)
_LOG_FILES = tuple(f"{log}.{fmt}" for log in ("requests", "actions") for fmt in ("tsv", "npz"))
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._=+-]+")
_READABLE_MAX = 96  # characters of a point's folder name before its hash


# ----------------------------------------------------------------------------- values


def toml_value(v: Any) -> str:
    """``v`` written as a TOML value, the form ``--set key=VALUE`` parses back
    (``clockwork.scenario.parse_value``; strings as ``clockwork.scenario.toml_string``
    writes them). Raises ``ValueError`` for other types."""
    from clockwork.scenario import toml_string

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_string(str(k), ascii_only=True)} = {toml_value(x)}"
                               for k, x in v.items()) + "}"
    raise ValueError(f"a {type(v).__name__} value cannot be written as a --set value")


def label_value(v: Any) -> str:
    """A value as it appears in a folder name and a table cell (strings unquoted)."""
    return v if isinstance(v, str) else toml_value(v)


def shell_word(text: str) -> str:
    """``text`` quoted for a POSIX shell (``shlex.quote``); a name that is not UTF-8 as
    bash's ``$'...'`` with its bytes, so that the command names the same file."""
    import shlex

    try:
        text.encode()
        return shlex.quote(text)
    except UnicodeEncodeError:
        pass
    out = []
    for b in name_bytes(text):
        c = chr(b)
        out.append(c if 0x20 <= b < 0x7F and c not in "'\\" else f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


# ----------------------------------------------------------------------------- points


@dataclass(frozen=True)
class Point:
    """One simulation: ``path`` (the scenario file) with ``overrides`` (``key=value``,
    applied in order, as ``clockwork simulate --set``). ``scenario`` is the scenario as
    the user wrote it (a shipped name or a path): it names the point, not ``path``, so a
    point's name does not depend on where the package is installed. ``labels`` are the
    ``(key, value)`` pairs that tell this point from the others (they make the readable
    part of its name; every override is in its hash). ``pinned``: ``(key, path)`` pairs set
    after them (values as they are, not ``--set`` text) that name the scenario's files as
    the process that made the point finds them (``pinned_point``); not part of its name,
    nor of its ``run.json``."""

    scenario: str
    path: str
    overrides: tuple[str, ...] = ()
    labels: tuple[tuple[str, Any], ...] = ()
    pinned: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """A hash of the scenario (as written) and every override (a name that is not
        UTF-8 by its bytes)."""
        text = "\n".join([self.scenario, *self.overrides])
        return hashlib.sha256(name_bytes(text)).hexdigest()[:10]

    @property
    def name(self) -> str:
        """The point's folder name: readable ``scenario_key=value_...`` (at most 96
        characters) then ``-`` and the hash."""
        stem = Path(self.scenario).name
        stem = stem[:-5] if stem.endswith(".toml") else stem
        parts = [stem, *(f"{k}={label_value(v)}" for k, v in self.labels)]
        readable = _NAME_CHARS.sub("_", "_".join(parts)).strip("._")[:_READABLE_MAX]
        return f"{readable or 'point'}-{self.key}"

    def command(self) -> str:
        """The ``clockwork simulate`` command line that runs this point alone, from any
        folder: a shipped scenario by its name, any other file by its absolute path (a
        bare name found next to a sweep file too: by name, the shipped one would run; a
        name that is not UTF-8 quoted as bash's ``$'...'``, so the line is valid UTF-8)."""
        from clockwork.resources import scenarios_root

        found = Path(self.path).resolve()
        shipped = ("/" not in self.scenario and not self.scenario.endswith(".toml")
                   and found.parent == scenarios_root().resolve())
        scenario = self.scenario if shipped else str(found)
        sets = " ".join(f"--set {shell_word(o)}" for o in self.overrides)
        return f"clockwork simulate {shell_word(scenario)}" + (f" {sets}" if sets else "")


@dataclass
class Outcome:
    """What became of a point: its ``summary`` (None if it failed: ``error`` says why),
    whether it was already done (``reused``), and the task's wall time."""

    point: Point
    folder: Path
    summary: dict | None = None
    error: str | None = None
    reused: bool = False
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.summary is not None


def point_folder(root: str | Path, point: Point) -> Path:
    return Path(root) / POINTS / point.name


# the figures of a run's summary that sweep and plan read: numbers, at these paths
_FIGURES = (("submitted",), ("succeeded",), ("slo_met",), ("failed",), ("dropped",),
            ("goodput_rps",), ("throughput_rps",), ("slo_attainment",), ("cold_starts",),
            ("latency_ms", "p50"), ("latency_ms", "p99"), ("latency_ms", "p999"),
            ("latency_ms", "max"), ("actions", "load"), ("actions", "evict"))


def is_summary(s: Any) -> bool:
    """``s`` is a run's summary: a JSON object with a number at every path sweep and plan
    read (``_FIGURES``)."""
    for path in _FIGURES:
        v = s
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if not isinstance(v, int | float) or isinstance(v, bool):
            return False
    return True


_DIGESTS: dict[tuple, str] = {}  # file_digest's: (path, inode, size, mtime) -> digest
_DIGESTS_KEPT = 4096


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes ("" where it cannot be read); a file this process read
    before and that has not changed since (same inode, size and modification time) is
    not read again (a sweep asks for its points' digests more than once, and a day of a
    trace is hundreds of megabytes)."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _DIGESTS:
            return _DIGESTS[key]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return ""
    if len(_DIGESTS) >= _DIGESTS_KEPT:
        _DIGESTS.pop(next(iter(_DIGESTS)))
    _DIGESTS[key] = digest = h.hexdigest()
    return digest


def has_logs(folder: Path) -> bool:
    """``folder`` holds a run's request and action logs (either format)."""
    return all(any((folder / f"{log}.{fmt}").is_file() for fmt in ("tsv", "npz"))
               for log in ("requests", "actions"))


def done_summary(folder: Path, digest: str | None = None, logs: bool = False) -> dict | None:
    """The point's summary if it is done: ``summary.json`` there, readable, and a run's
    summary (``is_summary``), and, with ``digest`` (the point's ``point_digests`` now),
    run on its files as they are now (``point.json`` says what it ran on; a point run on
    an earlier version of its scenario file or of a file the scenario reads, or by a
    version of this program that did not say, is not done), and, with ``logs``, its
    request and action logs there too (a point run before without them, the logs asked
    for now, is not done). Anything else there (a file left half written by hand, or by
    another program) is not done: the point runs again and replaces it."""
    if logs and not has_logs(folder):
        return None
    try:
        s = orjson.loads((folder / SUMMARY).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not is_summary(s):
        return None
    if digest is not None:
        try:
            ran = orjson.loads((folder / "point.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(ran, dict) or ran.get("inputs_sha256") != digest:
            return None
    return s


def point_digests(points: Sequence[Point]) -> list[str]:
    """Each point's inputs digest: SHA-256 over its scenario file's bytes and those of
    every file its run reads (its profile set, its traces: ``scenario.data_files``, with
    its overrides applied), each file read once; "" for a scenario file that cannot be
    read. A point whose scenario does not load covers its scenario file alone (its run
    says why it fails)."""
    from clockwork.scenario import data_files, load_scenario

    seen: dict[str, str] = {}

    def digest(path: str | Path) -> str:
        key = str(path)
        if key not in seen:
            seen[key] = file_digest(path)
        return seen[key]

    out = []
    for p in points:
        own = digest(p.path)
        if not own:
            out.append("")
            continue
        try:
            files = data_files(load_scenario(p.path, list(p.overrides), pinned=p.pinned))
        except Exception:  # noqa: BLE001 - the point's own run reports it
            files = []
        h = hashlib.sha256(own.encode())
        for f in files:
            h.update(b"\n" + digest(f).encode())
        out.append(h.hexdigest())
    return out


def _unwritable(e: OSError, folder: Path) -> str:
    """A point's error for a file of it that could not be written, in one line."""
    return (f"cannot write {printable(str(e.filename or folder))}: "
            f"{e.strerror or e}").rstrip()


def run_point(point: Point, folder: str | None = None, logs: bool = False) -> dict:
    """Simulate ``point`` (in whatever process the backend runs it). With ``logs``, the
    request and action logs go into ``folder``. Returns ``{"summary", "run", "wall_s"}``,
    or ``{"error": one line}`` if the point cannot run."""
    from clockwork.cluster.sim import Simulation, run_info
    from clockwork.scenario import ScenarioError, load_scenario

    t0 = time.perf_counter()
    try:
        sc = load_scenario(point.path, list(point.overrides), pinned=point.pinned)
        res = Simulation(sc).run()
    except (ScenarioError, ValueError) as e:
        return {"error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
    except Exception as e:  # noqa: BLE001 - reported as the point's error, the others go on
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"error": f"{type(e).__name__}: {first}"}
    if logs and folder:
        # (a failure here, a full disk say, is this point's error, as a failure to run it
        # is: the other points go on, whatever process runs it)
        try:
            res.telemetry.write(Path(folder))
        except OSError as e:
            return {"error": f"cannot write its logs into {printable(str(folder))}: "
                             f"{e.strerror or e}"}
    run = run_info(res.wall_s, sc, res.events)
    return {"summary": res.summary, "run": run, "wall_s": time.perf_counter() - t0}


def pinned_point(point: Point) -> Point:
    """``point`` for a process with another working folder (a Ray task) to run as this
    one would: its scenario file's full path, and the files its scenario names as found
    here (``scenario.pinned_paths``). A scenario that does not load is left as written
    (its run says why)."""
    from clockwork.scenario import load_scenario, pinned_paths

    path = str(Path(point.path).resolve())
    try:
        pinned = tuple(pinned_paths(load_scenario(path, list(point.overrides))))
    except Exception:  # noqa: BLE001 - the point's own run reports it
        pinned = ()
    return dataclasses.replace(point, path=path, pinned=pinned)


# ----------------------------------------------------------------------------- backends


def _pool_worker(parent: int | None) -> None:
    """A pool worker starts so: Ctrl-C is the parent's to handle, SIGTERM ends it, and it
    ends once its parent is gone. A worker whose parent was killed (SIGKILL, the OOM killer) would
    otherwise wait forever on its task pipe, handed to pid 1. As in
    ``clockwork.protocol.parent``: a thread checks every ``CHECK_EVERY_S`` that the
    parent is still this process's parent (``parent``: the process that made the pool,
    when it is the worker's parent; a fork server's workers watch the fork server, which
    ends with it)."""
    import threading

    from clockwork.protocol.parent import CHECK_EVERY_S

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (forked: not the parent's, that stops it)
    ppid = os.getppid()
    if parent is not None and ppid != parent:  # gone already
        os._exit(1)

    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(CHECK_EVERY_S)
        os._exit(1)  # (the whole process, at once: a simulation running here too)

    threading.Thread(target=watch, name="clockwork-parent-watch", daemon=True).start()


def start_method() -> str:
    """How ``local_executor`` starts its processes. On Linux they are forked (started at
    once: the simulator is already imported, nothing to load again), unless this process
    has loaded gRPC: gRPC's own threads may be inside a call at the fork, and the child
    then inherits its locks held (a test run's forked simulation crashed in gRPC objects'
    clean-up so). Then, and where there is no fork, the processes come from a fork server
    (a fresh process started for the purpose), or are spawned."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods and "grpc" not in sys.modules:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def local_executor(jobs: int) -> Executor:
    """A process pool of ``jobs`` processes on this machine, started as ``start_method``
    says; they end with this process, however it ends (``_pool_worker``)."""
    method = start_method()
    ctx = multiprocessing.get_context(method)
    parent = None if method == "forkserver" else os.getpid()
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_pool_worker,
                               initargs=(parent,))


# name -> (jobs -> Executor), or "module:function" naming one (imported when used, so a
# backend whose engine is not installed costs nothing until it is asked for)
BACKENDS: dict[str, Callable[[int], Executor] | str] = {
    "local": local_executor,
    "ray": "clockwork.cluster.ray_cluster:RayExecutor",  # the ray extra
}


class BackendUnavailable(RuntimeError):
    """A backend's executor could not be made (a Ray cluster it did not connect to): its
    one-line reason. ``sweep`` and ``plan`` say it and exit 2, nothing run."""


def register_backend(name: str, factory: Callable[[int], Executor] | str) -> None:
    """Make ``factory`` (``jobs -> concurrent.futures.Executor``, or its
    ``"module:function"``) available as ``--backend name``. Its executor runs
    ``run_point(point, folder, logs)`` tasks."""
    BACKENDS[name] = factory


def backend(name: str) -> Callable[[int], Executor]:
    """The executor factory of backend ``name``: ``ValueError`` if there is none,
    ``ImportError`` if its module (or the engine it needs) cannot be imported."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(sorted(BACKENDS))})")
    f = BACKENDS[name]
    if isinstance(f, str):
        import importlib

        module, _, func = f.partition(":")
        f = getattr(importlib.import_module(module), func)
    return f


def backend_of(args) -> str:
    """The backend a command's arguments ask for: ``--ray [ADDRESS]`` is ``ray`` on that
    cluster (put in ``RAY_ADDRESS``, which ``RayExecutor`` reads; ``--ray`` alone or
    ``--ray local``: a local Ray instance started for the command, whatever
    ``RAY_ADDRESS`` said), else ``--backend``."""
    ray_address = getattr(args, "ray", None)
    if ray_address is None:
        return args.backend or "local"
    if ray_address == "local":
        os.environ.pop("RAY_ADDRESS", None)  # (not a cluster the environment names)
    else:
        os.environ["RAY_ADDRESS"] = ray_address
    return "ray"


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its
# client server) answers with a SETTINGS frame of its own
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def ray_unreachable(address: str | None, timeout: float = 3.0) -> str | None:
    """Why the Ray cluster at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) cannot be
    reached (nothing answers there within ``timeout`` s, or what answers does not speak
    gRPC as Ray's ports do: another server's port), or None (it can, or an address Ray
    finds itself: none, ``auto``, ``local``). Asked before ``ray.init``, which would
    retry an address where nothing listens for ~14 minutes, and one where another server
    listens for longer still. (With ``RAY_USE_TLS`` the ports speak TLS first: only
    whether they listen is asked.) ``auto`` with ``RAY_ADDRESS`` set is that address, as
    Ray takes it (a stale one hung ``serve --ray auto`` for minutes, with only Ray's own
    warnings)."""
    import socket

    if address == "auto":
        env = os.environ.get("RAY_ADDRESS", "").strip()
        if env and env not in ("auto", "local"):
            why = ray_unreachable(env, timeout)
            return None if why is None else f"RAY_ADDRESS (which auto takes): {why}"
    if not address or address in ("auto", "local"):
        return None
    hostport = address[6:] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return None  # (not one we can try; Ray says what is wrong with it)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return None
            s.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                got = s.recv(9 - len(head))
                if not got:
                    break
                head += got
    except TimeoutError:
        head = b""
    except OSError as e:
        return (f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start it "
                "(ray start --head) or give its address")
    if len(head) < 9 or head[3] != 4:  # (not a SETTINGS frame)
        return (f"{address} answers, but not as a Ray cluster does (give the head's GCS "
                "address, HOST:6379 unless ray start --port said otherwise, or "
                "ray://HOST:10001 for Ray's client server)")
    return None


def check_backend(name: str) -> str | None:
    """None if backend ``name`` can be used, else a one-line reason."""
    if name == "ray":
        why = ray_unreachable(os.environ.get("RAY_ADDRESS"))
        if why:
            return f"--ray: {why}"
    try:
        backend(name)
    except ValueError as e:
        return f"--backend: {e}"
    except ImportError as e:
        if name == "ray":
            return f"needs ray: {pip_extra('ray')}"
        return (f"--backend {name} needs {e.name or 'a module that is missing'} "
                f"({type(e).__name__}: {e})")
    return None


def check_parts(args) -> str | None:
    """What ``sweep`` and ``plan`` check before anything runs: ``--plot`` needs
    matplotlib; ``--jobs`` is at most ``MAX_JOBS``; the backend (``--ray``/``--backend``, set on ``args.backend``) must be
    usable. None if all is there, else a one-line reason."""
    if getattr(args, "plot", None):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return f"--plot needs matplotlib: {pip_extra('plots')}"
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs > MAX_JOBS:
        return f"--jobs {jobs}: at most {MAX_JOBS:,} simulations at once"
    if getattr(args, "ray", None) is not None and args.backend not in (None, "ray"):
        return f"--ray and --backend {args.backend} ask for two backends: give one"
    args.backend = backend_of(args)
    return check_backend(args.backend)


MAX_JOBS = 1024  # --jobs: simulations at once (a typo must not start thousands of processes)
LOCK = ".lock"  # OUT/.lock: held by the sweep or plan writing OUT


class FolderBusy(ValueError):
    """Another process holds the folder's lock; the message is one line."""


@contextlib.contextmanager
def locked(folder: Path):
    """Hold ``folder``'s lock (``LOCK``, an exclusive ``flock``) while the block runs, so
    that two sweeps (or plans) on one folder do not both run every point. Raises
    ``FolderBusy`` at once if another process holds it. (No lock where there is no
    ``fcntl``.)"""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(folder / LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(f"{folder} is in use by another sweep or plan (it holds "
                             f"{folder / LOCK}); wait for it to end or give another "
                             "--out") from None
        yield  # (closing the file lets go of the lock)


def default_jobs() -> int:
    """The CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _stop(executor: Executor) -> None:
    """Stop at once: drop the queued tasks and end the running ones (a point left half
    done has no summary.json and runs again next time)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())  # gone after shutdown
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            p.terminate()
        except Exception:  # noqa: BLE001, S110 - already gone
            pass
    if manager is not None and manager is not threading.current_thread():
        # (its cleanup closes the pool's wake-up pipe: left running, it raced Python's own
        # at exit, which wrote to that pipe, "OSError: Bad file descriptor" after exit 130)
        manager.join(timeout=2.0)


class _Pools(set):
    """The one-process pools of points run alone (``Runner._run_alone``), and whether
    their caller has stopped them."""

    stopped = False


@dataclass
class Runner:
    """Runs points: ``jobs`` at a time on ``backend``, the finished ones skipped.
    Use as a context manager (the executor is started at the first point that must run,
    for at most as many jobs as that ``run`` has points, and kept for later ``run``
    calls; one with more points gets a larger one, unless the executor says its size
    does not matter: ``sized_by_jobs = False``)."""

    jobs: int = field(default_factory=default_jobs)
    backend: str = "local"
    logs: bool = False
    progress: bool | None = None  # None: a bar when stderr is a terminal
    _executor: Executor | None = field(default=None, init=False, repr=False)
    _size: int = field(default=0, init=False, repr=False)  # the jobs it was made for

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r} (known: "
                             f"{', '.join(sorted(BACKENDS))})")
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._executor is not None:
            if exc_type is not None:
                _stop(self._executor)
            else:
                self._executor.shutdown(wait=True)
            self._executor = None

    @property
    def inline(self) -> bool:
        return self.backend == "local" and self.jobs == 1

    def run(self, points: Sequence[Point], root: str | Path, desc: str = "points") -> list[Outcome]:
        """Every point's outcome, in the order of ``points``: the done ones read back,
        the others run (``jobs`` at a time) and written."""
        out: list[Outcome] = []
        todo: list[tuple[Outcome, str]] = []
        for p, digest in zip(points, point_digests(points), strict=True):
            folder = point_folder(root, p)
            s = done_summary(folder, digest, self.logs)
            o = Outcome(p, folder, summary=s, reused=s is not None)
            out.append(o)
            if s is None:
                todo.append((o, digest))
        if todo:
            ready = []
            for o, digest in todo:
                try:
                    o.folder.mkdir(parents=True, exist_ok=True)
                    # (an earlier file's run: its logs too, which a run without logs would
                    # have left beside this run's summary)
                    for name in ("error.txt", SUMMARY, "run.json", *_LOG_FILES):
                        (o.folder / name).unlink(missing_ok=True)
                    write_atomic(o.folder / "point.json", {
                        "scenario": o.point.scenario, "overrides": list(o.point.overrides),
                        "command": o.point.command(), "inputs_sha256": digest})
                except OSError as e:  # (a full disk: this point's error, the others go on)
                    o.error = _unwritable(e, o.folder)
                    continue
                ready.append(o)
            if ready:
                self._run(ready, desc)
        return out

    def _bar(self, total: int, desc: str):
        from tqdm import tqdm

        class Bar(tqdm):
            monitor_interval = 0  # no monitor thread (pool workers may be forked later)

        show = self.progress if self.progress is not None else sys.stderr.isatty()
        return Bar(total=total, desc=desc, unit="sim", disable=not show, file=sys.stderr,
                   dynamic_ncols=True, leave=True)

    def _alone(self, o: Outcome, pools: _Pools | None = None) -> dict:
        """Run ``o`` in a process pool of its own: the answer, or its error if that process
        died too (it, and not a point beside it, is what kills its process). ``pools``:
        where the pool is kept while it runs (to be stopped by the caller)."""
        ex = backend(self.backend)(1)
        if pools is not None:
            pools.add(ex)
            if pools.stopped:  # (the caller stopped the others as this one was made)
                _stop(ex)
                return {"error": "stopped"}
        try:
            return ex.submit(run_point, pinned_point(o.point), str(o.folder.resolve()),
                             self.logs).result()
        except BrokenProcessPool:
            return {"error": "its simulation process died (killed: out of memory?); run "
                             f"it alone to see why: {o.point.command()}"}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}".strip()}
        finally:
            _stop(ex)
            if pools is not None:
                pools.discard(ex)

    def _run_alone(self, broken: list[Outcome], bar) -> None:
        """The points a broken pool failed, each in a process of its own, ``jobs`` at a
        time (one after another, one process dead made the rest of a sweep serial)."""
        from concurrent.futures import ThreadPoolExecutor

        pools = _Pools()
        threads = ThreadPoolExecutor(max_workers=min(self.jobs, len(broken)))
        try:
            running = {threads.submit(self._alone, o, pools): o for o in broken}
            for f in as_completed(running):
                self._finish(running[f], f.result())
                bar.update(1)
        finally:  # (interrupted: the points still running stopped, their threads end)
            pools.stopped = True
            for ex in list(pools):
                _stop(ex)
            threads.shutdown(wait=True, cancel_futures=True)

    def _finish(self, o: Outcome, answer: dict) -> None:
        if "error" in answer:
            o.error = printable(str(answer["error"]))
            with contextlib.suppress(OSError):  # (what the error says is the outcome's)
                (o.folder / "error.txt").write_text(o.error + "\n")
            return
        o.wall_s = float(answer.get("wall_s", 0.0))
        try:
            write_json(o.folder / "run.json", answer["run"])
            write_atomic(o.folder / SUMMARY, answer["summary"])  # last: the point is done
        except OSError as e:  # (a full disk: this point's error, the others go on)
            o.error = _unwritable(e, o.folder)
            return
        o.summary = answer["summary"]

    def _run(self, todo: list[Outcome], desc: str) -> None:
        if self.inline:
            with self._bar(len(todo), desc) as bar:
                for o in todo:
                    try:
                        answer = run_point(o.point, str(o.folder), self.logs)
                    except Exception as e:  # noqa: BLE001 - the point's error, as in a pool
                        answer = {"error": f"{type(e).__name__}: {e}".strip()}
                    self._finish(o, answer)
                    bar.update(1)
            return
        want = min(self.jobs, len(todo))
        if (self._executor is not None and self._size < want
                and getattr(self._executor, "sized_by_jobs", True)):
            # (made for a smaller round: a process pool starts its processes at once, so
            # it was made no larger than its first round; idle now, it is made anew)
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._executor is None:
            self._executor = backend(self.backend)(want)
            self._size = want
        ex = self._executor
        futures: dict[Future, Outcome] = {}
        broken: list[Outcome] = []
        try:
            for o in todo:  # all submitted before the bar exists (forked workers, no threads)
                if broken:  # (the pool broke while they were submitted: the rest as well)
                    broken.append(o)
                    continue
                point = pinned_point(o.point)  # (a Ray worker's folder is not ours)
                try:
                    futures[ex.submit(run_point, point, str(o.folder.resolve()),
                                      self.logs)] = o
                except BrokenProcessPool:  # a worker died before this point went in (the
                    broken.append(o)  # sweep ended in this traceback)
            with self._bar(len(todo), desc) as bar:
                for f in as_completed(futures):
                    o = futures[f]
                    try:
                        answer = f.result()
                    except BrokenProcessPool:  # a worker died: every point not done fails
                        broken.append(o)  # so, the one that killed it among them
                        continue
                    except Exception as e:  # noqa: BLE001 - reported as the point's error
                        answer = {"error": f"{type(e).__name__}: {e}".strip()}
                    self._finish(o, answer)
                    bar.update(1)
                if broken:  # each again in a process of its own: only its killer fails
                    _stop(ex)
                    self._executor = None
                    self._run_alone(broken, bar)
        except BaseException:
            _stop(ex)
            self._executor = None
            raise


def run_points(points: Iterable[Point], root: str | Path, jobs: int | None = None,
               backend: str = "local", logs: bool = False,
               progress: bool | None = None, desc: str = "points") -> list[Outcome]:
    """Run ``points`` once (see ``Runner``)."""
    with Runner(jobs or default_jobs(), backend, logs, progress) as r:
        return r.run(list(points), root, desc)
