"""``LocalCluster``: workers and a controller as child processes on this machine, for
``clockwork serve``, tests and experiments (a context manager), and ``_Child``, a child
process whose output lines are read by a thread.

A scenario's ``[scheduler]`` table reaches the controller as data: ``LocalCluster``
writes it to ``controller-settings.json`` in its run directory and starts the controller
with ``--settings`` that file. Every cluster has a cluster secret of its own (made at
random unless given), handed to the children in their environment
(``$CLOCKWORK_CLUSTER_SECRET``), never on a command line; a client token goes to the
controller as a 0600 file in the run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clockwork.protocol.parent import PARENT_DIR_ENV, PARENT_DIR_PREFIX, parent_env

_ADDR = re.compile(r"listening on (\S+):(\d+)")
WORKER_PORT_STEP = 10  # with --worker-port P, worker i listens on P + 10 i
LINK_PORT_OFFSET = 1  # ... and its fast link on P + 10 i + 1 (0: both free ports)


# a worker's lines that say why it cannot serve something (LocalCluster._workers_said)
REFUSAL_WORDS = ("cannot", "refused", "not prepared", "no model package", "no profile",
                 "compiled with TVM", "disagree")


def how_it_ended(code: int) -> str:
    """A child's exit, from its return code, in words: "was killed by SIGKILL" (a signal
    it did not handle), "stopped (code 0: ...)" (a controller or worker ends with 0 only
    when told to stop: a signal, or its parent gone), or "exited (code N)"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 0:
        return "stopped (code 0: it was told to stop)"
    return f"exited (code {code})"


class ChildRefused(RuntimeError):
    """A worker or the controller exited with code 2 at start (a bad setting, a port it
    cannot bind); the message is its own one-line explanation. ``echoed``: that line is
    already on stderr, echoed from the child's output with its name (``[controller]
    ...``), so whoever reports the refusal does not print it again."""

    def __init__(self, message: str, echoed: bool = False) -> None:
        super().__init__(message)
        self.echoed = echoed


OUTPUT_KEPT = 1000  # a child's last lines kept in memory (at most twice as many)
LISTENING_KEPT = 16  # a child's first "... listening on HOST:PORT" lines kept
# a stopping controller answers what it can and writes its logs: killed after this long
# (or at a second Ctrl-C); past SLOW_STOP_S the wait is said
CONTROLLER_STOP_S = 60.0
SLOW_STOP_S = 5.0


class _Child:
    """A child process whose stdout lines are read by a thread (so waits have deadlines)."""

    def __init__(self, name: str, argv: list[str], echo: bool = False,
                 extra_env: Mapping[str, str | None] | None = None,
                 log: Path | None = None) -> None:
        """``log``: a file its output is added to as it comes (None: kept in memory only)."""
        self.name = name
        # (bounded: once the address is read nobody reads them; the oldest go first)
        self.lines: queue.Queue[str | None] = queue.Queue(OUTPUT_KEPT)
        self.echo = echo
        self.killed = False  # stop() had to SIGKILL it
        self._log = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log, "a", buffering=1)  # noqa: SIM115 - closed by _pump
        env = dict(os.environ, PYTHONUNBUFFERED="1", **parent_env())  # stops if we die
        for k, v in (extra_env or {}).items():  # None: not in the child's environment
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.output: list[str] = []
        # what it said it listens on, kept whatever it says after: the first address
        # (``wait_address``) and its first "... listening on" lines (read by ``announced``)
        self.address: str | None = None
        self.listening: list[str] = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        log = self._log
        for line in self.proc.stdout:
            m = _ADDR.search(line)
            if m:  # (before the line is offered: the wait finds it set)
                if len(self.listening) < LISTENING_KEPT:
                    self.listening.append(line)
                if self.address is None:
                    self.address = f"{m.group(1)}:{m.group(2)}"
            self.output.append(line)
            if len(self.output) > 2 * OUTPUT_KEPT:  # (a long-lived child that keeps talking)
                del self.output[:OUTPUT_KEPT]
            self._offer(line)
            if self.echo:  # (a stderr that fails: its line lost, the child still read:
                # else the child blocks on a full pipe, and the cluster with it)
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"[{self.name}] {line}")
            if log is not None:
                with contextlib.suppress(OSError):  # (a full disk: the run goes on)
                    log.write(line)
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()
        with contextlib.suppress(OSError):
            self.proc.stdout.close()
        self._offer(None)

    def _offer(self, item: str | None) -> None:
        while True:
            try:
                self.lines.put_nowait(item)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.lines.get_nowait()

    def wait_address(self, timeout: float) -> str:
        """The address the child prints once it listens. Each line it prints meanwhile
        gives it ``timeout`` seconds more: a cuda worker says a line a package (and one
        every 10 s while one builds) while it builds kernels, which can take minutes the
        first time on a machine."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name} did not report its address (nothing said "
                                   f"for {timeout:.0f} s){self._output_note()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            deadline = time.monotonic() + timeout
            if self.address is not None:  # (its line may have left the queue since)
                return self.address
            if line is None:
                rc = self.proc.wait()
                if rc == 2 and self.output:  # it refused a setting or a port: its own line
                    raise ChildRefused(f"{self.name}: {self.output[-1].strip()}", self.echo)
                raise RuntimeError(f"{self.name} {how_it_ended(rc)}{self._output_note()}")

    def announced(self, what: str) -> str | None:
        """``HOST:PORT`` from its ``{what} listening on`` line, if it printed one (kept
        however much it printed after)."""
        pattern = re.compile(rf"{what} listening on (\S+:\d+)")
        for line in list(self.listening):
            m = pattern.search(line)
            if m:
                return m.group(1)
        return None

    def _output_note(self) -> str:
        """The child's output for a message saying it failed: its last lines, or, when
        they were echoed to stderr already, where they are."""
        if not self.output:
            return ""
        if self.echo:
            return " (its output is above)"
        return ":\n" + "".join(self.output[-20:])

    def stop(self, timeout: float = 5.0, hard: threading.Event | None = None,
             slow=None) -> int | None:
        """SIGTERM, and SIGKILL if it has not ended within ``timeout`` seconds, or at once
        when ``hard`` is set meanwhile (a second Ctrl-C); ``slow()`` is called once if it
        has not ended after ``SLOW_STOP_S``. ``killed`` says whether it was killed."""
        p = self.proc
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while p.poll() is None and time.monotonic() - t0 < timeout:
                if hard is not None and hard.is_set():
                    break
                if slow is not None and time.monotonic() - t0 >= SLOW_STOP_S:
                    slow()
                    slow = None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(min(0.1, max(0.0, timeout - (time.monotonic() - t0))))
            if p.poll() is None:
                p.kill()
                self.killed = True
                p.wait(timeout)
        return p.returncode


# where the clockwork, controller and worker packages lie (site-packages, or a checkout)
_ROOT = str(Path(__file__).resolve().parents[2])


def own_link_port(flags: Sequence[str]) -> bool:
    """Whether a worker's ``flags`` name its fast link's port themselves."""
    return any(f == "--link-port" or f.startswith("--link-port=") for f in flags)


def _cli() -> list[str]:
    """The ``clockwork`` command as a child process. ``-P``: the current folder does not go
    first on the child's path, so a user's own ``worker.py`` or ``controller.py`` there is
    not imported in place of ours (``_child_path`` puts our packages' folder on it, for a
    checkout run without installing)."""
    return [sys.executable, "-P", "-m", "clockwork.cluster.cli"]


def _child_path() -> str | None:
    """The children's ``PYTHONPATH``: a source checkout's folder first (run without
    installing, it is found through no other entry), then the one given. An installed
    package's folder (site-packages) is on their path already, and put before the
    standard library it could shadow it: not added."""
    checkout = (Path(_ROOT) / "pyproject.toml").is_file()
    return os.pathsep.join(filter(None, [_ROOT if checkout else None,
                                         os.environ.get("PYTHONPATH")])) or None


class LocalCluster:
    """Workers and a controller as child processes on ``host``.

    ``with LocalCluster(workers=2, gpus=2) as c: Client(c.address)``.

    ``scheduler``: a ``[scheduler]`` table (``policy`` and settings, as in a scenario
    file) for the controller; it is written to ``controller-settings.json`` in
    ``run_dir`` (default: a temporary directory removed at ``stop``) and passed as
    ``--settings``. ``controller_args`` are further controller flags.

    ``cluster_secret``: the secret the controller and the workers prove to each other
    (default: a new random one; "": none), in the children's environment. ``token``: the
    controller requires it from clients (a 0600 file in ``run_dir``, ``--token-file``).
    ``worker_host``: the workers' address (default ``host``).
    """

    def __init__(self, workers: int = 1, gpus: int = 1, profiles: str = "v100-reference",
                 models: str | None = None, pages: int | None = None, host: str = "127.0.0.1",
                 port: int = 0, worker_port: int = 0, echo: bool = False,
                 controller_args: list[str] | None = None, timeout: float = 30.0,
                 worker_args: list[list[str]] | None = None, http_port: int = 0,
                 device: str = "emulated", packages: str | None = None,
                 kserve_port: int = -1, scheduler: Mapping[str, object] | None = None,
                 run_dir: str | None = None, *, cluster_secret: str | None = None,
                 token: str | None = None, worker_host: str | None = None,
                 log_dir: str | Path | None = None,
                 worker_flags_of: Callable[[int], list[str]] | None = None) -> None:
        self.n_workers, self.gpus, self.profiles, self.models = workers, gpus, profiles, models
        self.pages, self.host, self.port, self.worker_port = pages, host, port, worker_port
        self.echo = echo
        self.controller_args = controller_args or []
        # set: stopping kills the controller at once (a second Ctrl-C), also when a start
        # that failed stops the cluster
        self.hard: threading.Event | None = None
        self.timeout = timeout
        self.worker_args = worker_args or []
        # the flags of a worker past ``worker_args`` (a Ray cluster's nodes past a
        # scenario's ``workers``): a scenario's settings hold for every worker
        self.worker_flags_of = worker_flags_of
        self.http_port = http_port  # KServe v2 REST; 0 picks a free port, -1 turns it off
        self.kserve_port = kserve_port  # KServe v2 gRPC of its own (also on the main port)
        self.device, self.packages = device, packages  # cpu/cuda workers run model packages
        self.scheduler = dict(scheduler) if scheduler is not None else None
        self.run_dir = run_dir
        self._own_run_dir = False  # made by start(), removed by stop()
        self.workers: list[_Child] = []
        self.worker_addresses: list[str] = []
        self.controller: _Child | None = None
        self.address = ""
        self._worker_argv: list[list[str]] = []
        self._controller_argv: list[str] = []
        from clockwork.protocol.security import SECRET_ENV, new_secret

        self.cluster_secret = new_secret() if cluster_secret is None else cluster_secret
        self._env = {SECRET_ENV: self.cluster_secret or None,  # the children's, not argv
                     "PYTHONPATH": _child_path()}
        self.token = token
        self.worker_host = worker_host or host
        self.log_dir = Path(log_dir) if log_dir is not None else None

    def _child(self, name: str, argv: list[str]) -> _Child:
        """Start a controller or worker process; with ``log_dir`` its output goes to
        ``log_dir/NAME.log`` too."""
        log = self.log_dir / f"{name}.log" if self.log_dir is not None else None
        env = dict(self._env)
        if self._own_run_dir:  # (removed by the child should this process die unstopped)
            env[PARENT_DIR_ENV] = str(self.run_dir)
        return _Child(name, argv, self.echo, env, log)

    def restart_worker(self, i: int) -> None:
        """Start worker ``i`` again on its port (after it died); returns once it listens.
        The controller reconnects to it by itself."""
        old = self.workers[i]
        if old.proc.poll() is None:
            raise RuntimeError(f"worker {i} is still running")
        port = self.worker_addresses[i].rpartition(":")[2]
        argv = list(self._worker_argv[i])
        argv[argv.index("--port") + 1] = port
        child = self._child(f"worker{i}", argv)
        self.workers[i] = child
        child.wait_address(self.timeout)

    def restart_controller(self, extra: Sequence[str] = ()) -> None:
        """Start a new controller on the same port (after the old one died or was
        stopped), with ``extra`` controller flags besides the first one's; it takes the
        workers over (its Hello resets them, keeping the weights they hold unless
        ``--fresh-caches``). Returns once it listens."""
        if self.controller is not None and self.controller.proc.poll() is None:
            raise RuntimeError("the controller is still running")
        argv = list(self._controller_argv) + list(extra)
        argv[argv.index("--port") + 1] = self.address.rpartition(":")[2]
        # the REST and KServe gRPC ports the first one chose (0: a free one) too, so that
        # the addresses said as the cluster started stay those of the cluster
        for flag, what in (("--http-port", "http"), ("--kserve-port", "kserve grpc")):
            said = self.controller.announced(what) if self.controller is not None else None
            if said is not None and flag in argv:
                argv[argv.index(flag) + 1] = said.rpartition(":")[2]
        self.controller = self._child("controller", argv)
        self.address = self.controller.wait_address(self.timeout)

    def _worker_command(self, i: int) -> list[str]:
        """Worker ``i``'s command: on ``worker_port`` + 10 i, its fast link one port
        above (unless its flags name a ``--link-port``), or both on free ports."""
        flags = self.worker_flags(i)
        port = link = 0
        if self.worker_port:
            port = self.worker_port + WORKER_PORT_STEP * i
            link = port + LINK_PORT_OFFSET
        return _cli() + ["worker", "--host", self.worker_host, "--port", str(port),
                         *([] if own_link_port(flags) or not link
                           else ["--link-port", str(link)]),
                         *flags]

    def worker_flags(self, i: int) -> list[str]:
        """Worker ``i``'s ``clockwork worker`` flags but ``--host`` and ``--port``."""
        argv = ["--gpus", str(self.gpus), "--profiles", self.profiles]
        if self.pages:
            argv += ["--pages", str(self.pages)]
        if self.device != "emulated":
            argv += ["--device", self.device]
            if self.packages:
                argv += ["--packages", str(self.packages)]
        if i < len(self.worker_args):
            argv += self.worker_args[i]
        elif self.worker_flags_of is not None:
            argv += self.worker_flags_of(i)
        return argv

    def _start_workers(self) -> list[str]:
        """Start the workers; return their addresses once each listens (RayCluster
        starts them as Ray actors instead)."""
        for i in range(self.n_workers):
            argv = self._worker_command(i)
            self._worker_argv.append(argv)
            self.workers.append(self._child(f"worker{i}", argv))
        return [w.wait_address(self.timeout) for w in self.workers]

    def _stop_workers(self, hard: threading.Event | None = None) -> None:
        """Each worker: SIGTERM, SIGKILL after 5 s, or at once when ``hard`` is set (a
        second Ctrl-C: it waited out the 5 s of a hung worker all the same)."""
        for w in self.workers:
            w.stop(hard=hard)

    def add_worker(self) -> dict:
        """Start one more worker process (the flags of the others) and have the running
        controller connect it (``Client.add_worker``): returns its answer, ``{"worker",
        "gpus", "added"}``. The new worker's GPUs serve from then on."""
        from clockwork.client import Client

        address = self.spare_worker()
        with Client(self.address, token=self.token or "") as c:
            return c.add_worker(address, timeout=self.timeout)

    def spare_worker(self) -> str:
        """Start one more worker process (the flags of the others) that the controller is
        not told of; returns its address once it listens (``Client.add_worker`` adds it:
        a scenario's ``[[add_workers]]`` start theirs before the run, so that joining
        costs no process start-up). It stops with the cluster."""
        i = len(self.workers)
        argv = self._worker_command(i)
        self._worker_argv.append(argv)
        child = self._child(f"worker{i}", argv)
        self.workers.append(child)
        address = child.wait_address(self.timeout)
        self.worker_addresses.append(address)
        return address

    def shape(self) -> str:
        """The workers in words: ``2 emulated worker(s) x 2 GPU(s)``."""
        return f"{self.n_workers} {self.device} worker(s) x {self.gpus} GPU(s)"

    def start(self) -> LocalCluster:
        """Start the workers, then the controller; returns once the controller listens.
        A cluster stopped may be started again (new processes, new ports where they
        were 0); one running raises ``RuntimeError``."""
        if any(ch.proc.poll() is None for ch in [self.controller, *self.workers] if ch):
            raise RuntimeError("this LocalCluster is running: stop() it first")
        # (a second start: the children of the first are gone, not to be listed again)
        self.workers, self._worker_argv, self.worker_addresses = [], [], []
        self.controller, self.address = None, ""
        try:
            self.worker_addresses = self._start_workers()
            argv = _cli() + ["controller", "--host", self.host, "--port", str(self.port),
                             "--workers", ",".join(self.worker_addresses),
                             "--profiles", self.profiles,
                             "--http-port", str(self.http_port),
                             "--kserve-port", str(self.kserve_port)] + self.controller_args
            if self.models:
                argv += ["--models", self.models]
            if self.scheduler is not None:
                argv += ["--settings", str(self._write_settings())]
            if self.token:
                from clockwork.protocol.security import write_private

                argv += ["--token-file", str(write_private(self._run_path() / "token",
                                                           self.token + "\n"))]
            self._controller_argv = argv
            self.controller = self._child("controller", argv)
            try:
                self.address = self.controller.wait_address(self.timeout)
            except ChildRefused:  # (its own setting or port: the workers have nothing to add)
                raise
            except RuntimeError as e:  # (its workers' own words of why, not echoed)
                said = self._workers_said()
                if not said:
                    raise
                raise RuntimeError(f"{str(e).rstrip()}\n{said}") from e
        except BaseException:
            self.stop()
            raise
        return self

    def _workers_said(self) -> str:
        """What the workers said beside their connections (a package they refused, and
        why: the controller says only that a worker cannot serve a model), for a
        controller that did not start; "" if nothing, or their output was shown."""
        lines = []
        for i, w in enumerate(self.workers):
            if w.echo:
                continue
            said = [ln.strip() for ln in w.output if ln.startswith("worker: ")
                    and any(word in ln for word in REFUSAL_WORDS)][-5:]
            lines += [f"worker{i}: {ln.removeprefix('worker: ')}" for ln in said]
        return "the workers said:\n" + "\n".join(lines) if lines else ""

    def _run_path(self) -> Path:
        """The run directory (made on first use: a private temporary one by default)."""
        if self.run_dir is None:
            self.run_dir = tempfile.mkdtemp(prefix=PARENT_DIR_PREFIX)
            self._own_run_dir = True
        path = Path(self.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write_settings(self) -> Path:
        """The controller's settings file: ``{"scheduler": {...}}`` in the run directory."""
        path = self._run_path() / "controller-settings.json"
        path.write_text(json.dumps({"scheduler": self.scheduler}, indent=1, default=str) + "\n")
        return path

    def printed_address(self, what: str, timeout: float = 10.0) -> str:
        """``HOST:PORT`` from the controller's ``{what} listening on`` line (``what``:
        "http" for KServe REST and /metrics, "kserve grpc"), waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            address = self.controller.announced(what)
            if address is not None:
                return address
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the controller printed no {what} address:\n"
                                   + "".join(self.controller.output[-20:]))
            time.sleep(0.05)

    def stop(self, hard: threading.Event | None = None) -> None:
        """The controller (SIGTERM: it answers what it can and writes its logs; SIGKILL
        after ``CONTROLLER_STOP_S``, or once ``hard``, else ``self.hard``, is set), then
        the workers (likewise)."""
        hard = hard or self.hard
        if self.controller is not None:
            now = "; a second Ctrl-C kills it now" if hard is not None else ""
            self.controller.stop(timeout=CONTROLLER_STOP_S, hard=hard, slow=lambda: print(
                f"clockwork: waiting for the controller to stop (it writes its logs; at most "
                f"{CONTROLLER_STOP_S:g} s, then it is killed{now})", file=sys.stderr,
                flush=True))
        self._stop_workers(hard)
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir, self._own_run_dir = None, False

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
