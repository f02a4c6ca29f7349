"""A scenario's ``[faults]``, ``[[repository]]``, ``[[add_workers]]`` and
``[[remove_workers]]`` events on a live local cluster (composition root).

``LiveFaults`` runs beside a replay (``clockwork serve SCENARIO --replay``): at each
fault's time, counted from the moment the replay starts, it kills a worker process
(SIGKILL) and later starts it again on the same port, or stops (SIGSTOP) and resumes
(SIGCONT) one; at each ``[[repository]]`` event's, it unloads or loads a model through
the controller's model repository (``clockwork.Client.unload_model`` / ``load_model``);
at each joining worker's, it has the controller connect that worker
(``Client.add_worker``; its process was started before the run); at each leaving
worker's, it has the controller take that worker out (``Client.remove_worker``); at
each ``controller_restart``'s, it kills the controller process (SIGKILL, after reading
its counters) and ``down_s`` later starts a new one on the same port and workers
(``LocalCluster.restart_controller``; ``--fresh-caches`` with ``fresh_caches``), which
takes the workers over as ``clockwork controller`` does on running workers.
The simulator models the same events (``clockwork.cluster.sim``); ``slow_network`` has
no live form here and is refused.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from clockwork.scenario import fault_time_error, in_time_order

REPOSITORY_S = 30.0  # how long a [[repository]] event's call to the controller may take
COUNTS_S = 1.0  # how long reading a controller's counters before it is killed may take
LATE_S = 0.1  # a controller restart's kill this late (its predecessor still starting): said


class Interrupted(Exception):
    """A stop asked for while ``LiveFaults`` started the joining workers' processes."""


def no_live_form(faults: dict) -> str | None:
    """Why a scenario's ``[faults]`` cannot be played live (a fault only the simulator
    models), or None: asked before any process starts, and again by ``LiveFaults``."""
    if faults.get("slow_network"):
        return ("[faults] slow_network has no live form (the simulator models it); remove it "
                "to run this scenario live")
    return None


class LiveFaults:
    """Plays ``faults`` (a scenario's ``[faults]`` table) against ``cluster`` (a started
    ``LocalCluster``). ``start(t0)`` with ``t0`` the replay's start (``time.monotonic_ns``);
    ``stop()`` ends it early and resumes any stopped worker."""

    def __init__(self, cluster, faults: dict, duration_s: float,
                 repository: list | None = None, token: str | None = None,
                 copies: dict[str, int] | None = None, joins: list | None = None,
                 stopped=None, leaves: list | None = None) -> None:
        """``repository``: ``clockwork.scenario.repository_plan``'s events; ``token``: the
        one the controller takes from clients (its repository calls need it); ``copies``:
        each ``[[models]]`` name's copies (a model's load asks for all of them: the
        controller loads those not served); ``joins``: ``clockwork.scenario.
        joining_workers``' (at_s, worker index): their processes start here, before the
        run, and the controller connects each at its time; ``stopped()`` (if given),
        looked at before each one starts: once true, ``Interrupted`` is raised (the
        processes started so far stop with the cluster); ``leaves``: ``clockwork.scenario.
        leaving_workers``' (at_s, worker index, drain), each taken out at its time
        (gently with drain: ``Client.remove_worker(..., drain=True)``)."""
        why = no_live_form(faults)
        if why:
            raise ValueError(why)
        n = len(cluster.workers)
        plan: list[tuple[float, int, str, object]] = []  # (at_s, order, what, argument)
        for kind, entries in (("kill", faults.get("kill", ())), ("hang", faults.get("hang", ()))):
            for i, f in enumerate(entries):
                w = int(f["worker"])
                if w >= n:
                    raise ValueError(f"faults.{kind}.{i}.worker: {w} is not one of the {n} "
                                     f"worker(s) (0 ... {n - 1})")
                why = fault_time_error(kind, i, f, duration_s)
                if why:
                    raise ValueError(why)
            for f in in_time_order(entries):  # (checked above, in the file's order)
                w = int(f["worker"])
                if kind == "kill":
                    plan.append((float(f["at_s"]), len(plan), "kill", w))
                    if f.get("back_s") is not None:
                        plan.append((float(f["back_s"]), len(plan), "restart", w))
                else:
                    plan.append((float(f["at_s"]), len(plan), "stop", w))
                    plan.append((float(f["at_s"]) + float(f["for_s"]), len(plan), "resume", w))
        restarts = faults.get("controller_restart") or ()
        for i, f in enumerate(restarts):  # (checked: scenario.restarts_error)
            plan.append((float(f["at_s"]), len(plan), "ctrl_kill", i))
            plan.append((float(f["at_s"]) + float(f["down_s"]), len(plan), "ctrl_start",
                         (i, bool(f.get("fresh_caches", False)))))
        # at one time: the faults, then the workers that join, then the repository events
        # (the simulator's order)
        for at_s, w in joins or ():
            if stopped is not None and stopped():
                raise Interrupted("interrupted while the joining workers started")
            if w != len(cluster.workers):  # (a plan's workers join in index order)
                raise ValueError(f"add_workers: worker {w} would join as worker "
                                 f"{len(cluster.workers)}")
            plan.append((at_s, len(plan), "join", (w, cluster.spare_worker())))
        for at_s, w, drain in leaves or ():  # (after the joins at one time)
            plan.append((at_s, len(plan), "remove", (w, drain)))
        for at_s, what, name, insts in repository or ():  # (in the plan's order at one time)
            plan.append((at_s, len(plan), what, (name, len(insts))))
        self.plan = sorted(plan)
        self.duration_s = duration_s
        self._played = 0  # the plan's entry being played (those before it are done)
        self._t0 = 0
        self.copies = copies or {}
        self.cluster = cluster
        self.log: list[tuple[float, str]] = []  # (seconds from t0, what was done)
        self.failed: list[str] = []  # what could not be done, in words
        self._client = None
        # each killed controller's counters, read just before it was killed (None: they
        # could not be read), in order: a replay's action counts add them up
        self.counts: list[dict[str, int] | None] = []
        if repository or joins or leaves or restarts:  # (connected before the run: a first event's import and
            # connection made it ~10 ms late)
            from clockwork.client import Client

            self._client = Client(cluster.address, token=token or "", timeout=REPOSITORY_S)
            self._client.list_models_raw()
        self._stop = threading.Event()
        # the run was asked to stop (serve's Ctrl-C, SIGTERM): nothing more is played
        self._asked_stop = stopped
        self._halted = 0  # when that was seen (monotonic ns; 0: not)
        self._stopped: set[int] = set()
        self.down: set[int] = set()  # workers a kill took down (until a restart)
        self._thread: threading.Thread | None = None
        # the restarts under way, by worker: each on a thread of its own (a new process
        # takes ~0.3 s to listen, and the events due meanwhile were played that late)
        self._restarts: dict[int, threading.Thread] = {}
        self._drains: list[tuple[int, threading.Thread]] = []  # (worker, its drain) each
        # a new controller starting (the process takes ~1 s to listen): on a thread of its
        # own, as a worker's restart; the next restart's kill waits for it
        self._ctrl_start: threading.Thread | None = None
        # the controller is down by the plan (killed, its successor not started yet, or
        # its start failed): its process's exit is not a crash
        self.controller_down = False

    def __bool__(self) -> bool:
        return bool(self.plan)

    def start(self, t0: int) -> None:
        self._t0 = t0
        self._thread = threading.Thread(target=self._run, args=(t0,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End it (the run is over, or was interrupted); an event that was due by now and
        did not happen (one before it held the thread up) is counted in ``failed``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            busy = self._thread.is_alive()
            for w, th in list(self._restarts.items()):
                th.join(10.0)
                if th.is_alive():
                    self.failed.append(f"{_event('restart', w)}: not done by the end "
                                       "(still under way)")
            for w, th in self._drains:
                th.join(10.0)
                if th.is_alive():
                    self.failed.append(f"{_event('remove', (w, True))}: not done by the "
                                       "end (still draining)")
            th = self._ctrl_start
            if th is not None:
                th.join(self.cluster.timeout + 10.0)
                if th.is_alive():
                    self.failed.append("fault: controller restart (new controller): not "
                                       "done by the end (still starting)")
            # (an event due after the run was asked to stop was not missed: not played)
            done = self._halted or time.monotonic_ns()
            for at_s, _, what, w in self.plan[self._played + (0 if busy else 1):]:
                if self._t0 + round(at_s * 1e9) <= done:
                    self.failed.append(f"{at_s:.2f} s: {_event(what, w)}: not done by the "
                                       "end (still under way, or held up by the one before it)")
        if self._client is not None:
            self._client.close()
        for w in list(self._stopped):
            self._signal(w, signal.SIGCONT)

    def _signal(self, w: int, sig: int) -> None:
        p = self.cluster.workers[w].proc
        if p.poll() is None:
            os.kill(p.pid, sig)
        if sig == signal.SIGSTOP:
            self._stopped.add(w)
        elif sig == signal.SIGCONT:
            self._stopped.discard(w)

    def _failed(self, t0: int, what: str, w, e: Exception) -> None:
        """An event of the plan could not be done: said now, and kept for the end."""
        t = (time.monotonic_ns() - t0) / 1e9
        self.failed.append(f"{t:.2f} s: {_event(what, w)}: {e}")
        print(f"clockwork serve: {t:7.2f} s  {_event(what, w)} failed: {e}", file=sys.stderr,
              flush=True)

    def _repository(self, what: str, name: str, n: int) -> str:
        """Unload or load ``name`` (``n`` instances, by the plan) through the controller's
        repository, as the simulator does; what was done, in words. A load waits for an
        unload still under way (copies being evicted), as the repository itself does."""
        c = self._client
        if what == "unload":
            got = c.unload_model(name)
            return f"repository: unloaded {name} ({len(got)} instance(s))"
        c.load_model(name, copies=self.copies.get(name, 1) if ":" not in name else None)
        return f"repository: loaded {name} ({n} instance(s))"

    def _wait(self, until: int) -> bool:
        """Wait until ``until`` (monotonic ns); False if the run ends or is asked to stop
        first (then nothing more is played)."""
        while True:
            asked = self._asked_stop is not None and self._asked_stop()
            if asked or self._stop.is_set():
                if asked and not self._halted:
                    self._halted = time.monotonic_ns()
                    if self.controller_down and self._ctrl_start is None:
                        print("clockwork serve: stopped while the scenario's controller "
                              "restart has the controller down: no new one is started, and "
                              "the answers still due are given up", file=sys.stderr,
                              flush=True)
                return False
            left = (until - time.monotonic_ns()) / 1e9
            if left <= 0:
                return True
            # (serve's stop event is not this one: looked at every 0.1 s)
            if self._stop.wait(min(left, 0.1) if self._asked_stop is not None else left):
                return False

    def _run(self, t0: int) -> None:
        for k, (at_s, _, what, w) in enumerate(self.plan):
            self._played = k
            if not self._wait(t0 + round(at_s * 1e9)):
                return
            if what == "remove" and w[1]:  # a drain waits for what the worker has in
                # flight: on a thread of its own, so the events after it play on time
                th = threading.Thread(target=self._event, args=(t0, what, w), daemon=True)
                self._drains.append((w[0], th))
                th.start()
                continue
            if what in ("unload", "load", "join", "remove"):
                self._event(t0, what, w)
                continue
            if what == "ctrl_start":
                self._ctrl_start = threading.Thread(target=self._controller,
                                                    args=(t0, what, w), daemon=True)
                self._ctrl_start.start()
                continue
            if what == "ctrl_kill":
                before, self._ctrl_start = self._ctrl_start, None
                if before is not None:  # (the last restart's new controller: killed only
                    # once it has started, said if that made this one late)
                    before.join()
                    late = (time.monotonic_ns() - t0) / 1e9 - at_s
                    if late > LATE_S:
                        print(f"clockwork serve: {_event(what, w)} played {late:.2f} s "
                              "late: the new controller of the restart before it took that "
                              "long to start", file=sys.stderr, flush=True)
                self._controller(t0, what, w)
                continue
            earlier = self._restarts.pop(w, None)
            if earlier is not None:  # (a worker's own events stay in order)
                earlier.join()
            if what == "restart":
                th = threading.Thread(target=self._fault, args=(t0, what, w), daemon=True)
                self._restarts[w] = th
                th.start()
            else:
                self._fault(t0, what, w)

    def _event(self, t0: int, what: str, w) -> None:
        """Play one cluster or repository event through the controller now; said (and
        logged) once done, or failed."""
        try:
            if what == "join":
                proc = self.cluster.workers[w[0]].proc
                if proc.poll() is not None:
                    raise RuntimeError(f"its process (started before the run) has "
                                       f"exited (code {proc.returncode})")
                # (no longer than the run has left: the events after it must go on)
                left = self.duration_s - (time.monotonic_ns() - t0) / 1e9
                got = self._client.add_worker(w[1], timeout=max(1.0, min(
                    REPOSITORY_S, left)))
                said = (f"cluster: worker {got['worker']} joined "
                        f"({len(got['gpus'])} GPU(s))")
            elif what == "remove":
                got = self._client.remove_worker(
                    self.cluster.worker_addresses[w[0]], drain=w[1])
                said = (f"cluster: worker {w[0]} removed" + (
                    "" if not w[1] else " (drained)" if got["drained"] else
                    f" (not drained: {got['failed']} action(s) failed)"))
            else:
                said = self._repository(what, *w)
        except Exception as e:  # noqa: BLE001 - one line; the events after it still run
            self._failed(t0, what, w, e)
            return
        self._said(t0, said)

    def _controller(self, t0: int, what: str, arg) -> None:
        """A controller restart's step now: its process killed (its counters read first),
        or the new one started (returns once it listens); said (and logged) once done."""
        try:
            if what == "ctrl_kill":
                try:
                    self.counts.append(self._client.stats(timeout=COUNTS_S))
                except Exception:  # noqa: BLE001 - its counts are then unknown
                    self.counts.append(None)
                self.controller_down = True  # (before: its exit is the plan's)
                proc = self.cluster.controller.proc
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                said = "controller killed"
            else:
                self.cluster.restart_controller(["--fresh-caches"] if arg[1] else [])
                self.controller_down = False
                said = "new controller started" + (" (fresh caches)" if arg[1] else "")
        except Exception as e:  # noqa: BLE001 - one line; the faults after it still run
            self._failed(t0, what, arg, e)
            return
        self._said(t0, said, "fault: ")

    def settle(self) -> None:
        """Wait for a new controller still starting (a run's counters are read once it
        has), at most as long as its start may take."""
        th = self._ctrl_start
        if th is not None:
            th.join(self.cluster.timeout + 10.0)

    def _fault(self, t0: int, what: str, w: int) -> None:
        """Play one fault on worker ``w`` now; said (and logged) once done."""
        try:
            if what == "kill":
                self.down.add(w)  # (before: its exit is the plan's, not a crash)
                self._signal(w, signal.SIGKILL)
                self.cluster.workers[w].proc.wait()
            elif what == "restart":
                self.cluster.restart_worker(w)
                self.down.discard(w)
            elif what == "stop":
                self._signal(w, signal.SIGSTOP)
            else:
                self._signal(w, signal.SIGCONT)
        except Exception as e:  # noqa: BLE001 - one line; the faults after it still run
            self._failed(t0, what, w, e)
            return
        self._said(t0, f"{what} worker {w}", "fault: ")

    def _said(self, t0: int, said: str, kind: str = "") -> None:
        """An event done: logged (``said``) and said on stderr (after ``kind``), with its
        time from the start of the run."""
        t = (time.monotonic_ns() - t0) / 1e9
        self.log.append((t, said))
        print(f"clockwork serve: {t:7.2f} s  {kind}{said}", file=sys.stderr, flush=True)


def _event(what: str, arg) -> str:
    """A plan entry in words (what failed, or was not done): ``fault: kill worker 1``,
    ``cluster: worker 2 join``, ``repository: unload resnet50_v2``."""
    if what == "join":
        return f"cluster: worker {arg[0]} join"
    if what == "remove":
        return f"cluster: worker {arg[0]} remove" + (" (drain)" if arg[1] else "")
    if what in ("load", "unload"):
        return f"repository: {what} {arg[0]}"
    if what == "ctrl_kill":
        return f"fault: controller restart {arg} (kill)"
    if what == "ctrl_start":
        return f"fault: controller restart {arg[0]} (new controller)"
    return f"fault: {what} worker {arg}"
