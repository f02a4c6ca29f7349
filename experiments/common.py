"""Shared helpers for the Section 6 experiment scripts (``experiments/fig*.py``).

Every script has ``main(argv) -> dict`` and takes the same arguments:
``--quick`` (default: minutes of simulated time, seconds of wall time), ``--full`` (a
larger scale, nearer the paper's; run by hand), ``--smoke`` (a second or two, for the test suite),
``--out DIR`` (default ``experiments/figures``, or ``experiments/figures/full`` with
``--full``) and ``--live``: instead of the simulator, each scenario runs on a
``clockwork.cluster.local.LocalCluster`` (emulated workers and a controller as child processes)
sized from the scenario, and its workloads are replayed on the real clock by
``clockwork.cluster.replay.replay`` (see ``run_live``). Live runs take real time; scales that need
more worker processes or seconds than ``LIVE_MAX_WORKERS`` / ``LIVE_MAX_S`` are refused.

Each writes ``<name>.tsv`` and/or ``<name>.json`` (data) and ``<name>.png`` (figure) into
the output directory and prints ``paper: ... / ours: ...`` lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
FIGURES = Path(__file__).resolve().parent / "figures"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clockwork.actions import Action, Result  # noqa: E402
from clockwork.cluster.faults import LiveFaults  # noqa: E402
from clockwork.cluster.local import LocalCluster  # noqa: E402
from clockwork.cluster.replay import ReplayResult, replay  # noqa: E402
from clockwork.cluster.serve import cluster_from_scenario, ensure_packages  # noqa: E402
from clockwork.cluster.sim import SimResult, Simulation  # noqa: E402
from clockwork.requests import Reply, Request  # noqa: E402
from clockwork.scenario import Scenario, load_scenario  # noqa: E402
from clockwork.signals import run_until_signalled  # noqa: E402
from clockwork.telemetry import ACTION_COLUMNS  # noqa: E402
from controller.policy import ModelView, Policy  # noqa: E402

POLICIES = ("clockwork", "clipper", "tfserving", "infaas")

# --live limits: every emulated worker is a Python process and every request goes through
# one Python client, one controller and a worker on this (2-core) machine, in real time.
LIVE_MAX_WORKERS = 16  # worker processes (each emulates ``gpus_per_worker`` GPUs)
LIVE_MAX_S = 1800.0  # seconds of real time for one scenario run


class LiveRefused(Exception):
    """A scale that cannot run live here (too many worker processes or too long): a
    setting refused, so ``script`` ends with its one line and exit 2."""


def parse_args(argv: Sequence[str] | None, description: str,
               check=None) -> argparse.Namespace:
    """The figure scripts' arguments; ``check(args)``, if given, runs before the output
    folder is made (a ``LiveRefused`` from it leaves nothing behind)."""
    p = argparse.ArgumentParser(description=description)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="scale", action="store_const", const="quick",
                   help="small scale (default)")
    g.add_argument("--full", dest="scale", action="store_const", const="full",
                   help="a larger scale, nearer the paper's (experiments/README.md says "
                   "where each figure still differs; long: run by hand)")
    g.add_argument("--smoke", "--tiny", dest="scale", action="store_const", const="smoke",
                   help="a second or two of simulated time (tests)")
    p.add_argument("--out", type=out_dir, default=None,
                   help="output directory (default: experiments/figures/, or its live/ and "
                   "full/ folders: the figures kept in the repository, overwritten; with "
                   "--smoke a new temporary folder)")
    p.add_argument("--live", action="store_true",
                   help="run on a local live cluster (emulated workers + controller, real "
                        "time) instead of the simulator")
    p.set_defaults(scale="quick")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:  # (every figure script draws its figure at the end: said now, not after the runs)
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"{p.prog}: the figures need matplotlib: pip install -e '.[plots]'",
              file=sys.stderr)
        raise SystemExit(2) from None
    if check is not None:
        check(args)
    if args.out is None and args.scale == "smoke":  # (not over the figures kept)
        args.out = Path(tempfile.mkdtemp(prefix="clockwork-smoke-"))
        _MADE.append(args.out)  # (made for this run: removed if it stops with it empty)
        print(f"--smoke: writing to {args.out}", file=sys.stderr)
    elif args.out is None:
        sub = "full" if args.scale == "full" else ""
        args.out = FIGURES / "live" / sub if args.live else FIGURES / sub
        try:  # (checked as a given --out is, before the runs: a folder it cannot write
            # failed after them, up to 25 minutes at --full, in a traceback)
            out_dir(str(args.out))
        except argparse.ArgumentTypeError as e:
            p.error(f"the default --out {args.out}: {e} (give --out DIR)")
    if not args.out.exists():  # (made for this run: removed if it stops with it empty)
        _MADE.append(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    OUTS.append(args.out)
    return args


_MADE: list[Path] = []  # the --out folders this process made (``script``)
OUTS: list[Path] = []  # the --out folders this process writes to (said if it stops early)
_STARTED = time.time()  # (what an --out holds from before: not this run's)


def _kept() -> str:
    """Where what a run stopped early wrote is (its --out folders holding something
    written since the process started), as words after "interrupted", or ""."""
    kept = []
    for o in dict.fromkeys(OUTS):
        with contextlib.suppress(OSError):
            if o.is_dir() and any(p.stat().st_mtime >= _STARTED for p in o.iterdir()):
                kept.append(str(o))
    return f"; what it wrote before is in {', '.join(kept)}" if kept else ""


def _unmake() -> None:
    """The --out folders this run made and left empty, removed (it stopped early)."""
    while _MADE:
        with contextlib.suppress(OSError):  # (not empty, or gone: left as it is)
            _MADE.pop().rmdir()


def out_dir(text: str) -> Path:
    """An ``--out`` folder, checked before anything runs (``argtypes.out_dir``: one that
    can be written or made; a file there is a usage error)."""
    from clockwork.cluster.cli import argtypes

    return Path(argtypes.out_dir(text))


def out_file(text: str) -> Path:
    """A ``--json`` file, checked as ``argtypes.out_file`` before anything runs."""
    from clockwork.cluster.cli import argtypes

    return Path(argtypes.out_file(text))


def script(main) -> None:
    """Run an experiment script's ``main()`` as a command: Ctrl-C (and SIGTERM or SIGHUP,
    which stop it as Ctrl-C does) ends it with one line (exit 130) and a setting the
    scenario refuses, a scale that cannot run live (``LiveRefused``), a device this
    machine has not (``DeviceUnavailable``) or a child process's refusal of its settings
    (``ChildRefused``), with its one line
    (exit 2), not a traceback; else the exit status is ``main``'s (an int), or 0. Stopped
    so, it removes the --out folder it made if nothing was written there."""
    from clockwork.cluster.local import ChildRefused
    from clockwork.errors import ControllerUnavailable, ScenarioError
    from clockwork.profiles import ProfileError
    from clockwork.settings import SettingsError
    from clockwork.signals import term_as_ctrl_c
    from worker.devices.base import DeviceUnavailable

    name = Path(sys.argv[0]).name
    try:
        with term_as_ctrl_c():  # (SIGTERM, SIGHUP: as Ctrl-C)
            rc = main()
    except KeyboardInterrupt:
        _unmake()
        print(f"{name}: interrupted{_kept()}", file=sys.stderr)
        raise SystemExit(130) from None
    except (ScenarioError, SettingsError, ProfileError, LiveRefused, DeviceUnavailable,
            ChildRefused) as e:  # (no such device here; a child refused its settings)
        _unmake()
        print(f"{name}: {str(e).strip()}", file=sys.stderr)
        raise SystemExit(2) from None
    except ControllerUnavailable as e:  # (a live run's controller that went away)
        _unmake()
        print(f"{name}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(rc if isinstance(rc, int) else 0)


def scenario(name: str | Path | dict, overrides: Sequence[str] = ()) -> Scenario:
    """Load a scenario: a name under ``scenarios/``, a TOML path or a dict."""
    if isinstance(name, dict):
        return load_scenario(data=name, overrides=list(overrides))
    if isinstance(name, str) and not name.endswith(".toml"):
        name = SCENARIOS / f"{name}.toml"
    return load_scenario(name, list(overrides))


def run(name: str | Path | dict, overrides: Sequence[str] = (), live: bool = False,
        time_policy: float | None = None) -> SimResult | LiveResult:
    """Run a scenario in the simulator, or with ``live`` on a local live cluster
    (``run_live``). Both results have ``summary``, ``telemetry`` (``requests``,
    ``actions``: the simulator's rows), ``scenario`` and ``wall_s``.

    ``time_policy`` (simulator only; a bucket width in simulated seconds): the simulator
    is given a ``TimedPolicy`` around its policy, which times every call into it -- the
    controller's work -- in CPU time of the simulator's thread. ``res.policy_wall_s`` is
    the total, ``res.policy_wall_by_bucket`` the seconds spent per bucket of simulated
    time and ``res.policy_calls`` the number of timed calls."""
    sc = scenario(name, overrides)
    if live:
        return run_live(sc)
    # (a long --full run shows progress: redrawn on a terminal, a line every 30 s in a log)
    sim = Simulation(sc, progress=True)
    timed = None
    if time_policy:
        timed = sim.policy = TimedPolicy(sim.policy, int(time_policy * 1e9))
    res = sim.run()
    if timed is not None:
        cpu = timed.seconds()
        res.policy_wall_by_bucket = [round(v, 6) for v in cpu]
        res.policy_wall_s = round(sum(cpu), 6)
        res.policy_calls = sum(timed.calls)
    return res


class TimedPolicy(Policy):
    """A policy that passes every call on to ``inner`` and measures the controller's
    work: the CPU time of this thread (``time.thread_time``: not inflated when other
    processes share the cores) that each event call (``on_request``, ``on_result``,
    ``on_tick``, ``set_gpu_available``) and each ``drain_replies`` / ``next_wakeup``
    takes, added into cells of ``bucket_ns`` of simulated time by the call's ``now``
    (calls without one go to the bucket of the last call that had one). The read-only
    views are passed on untimed. The clock's own cost inside each timed interval
    (measured when the wrapper is built) is taken off again when the cells are read
    (``seconds()``).

    Give it to the simulator in place of the policy it built, before ``run()``:
    ``sim.policy = TimedPolicy(sim.policy, bucket_ns)``."""

    def __init__(self, inner: Policy, bucket_ns: int) -> None:
        self.inner = inner
        self.bucket_ns = bucket_ns
        self.spent: list[float] = []  # CPU seconds per bucket
        self.calls: list[int] = []  # timed calls per bucket
        self._bucket = 0
        clock = self._clock = time.thread_time
        pairs = []
        for _ in range(2000):
            t = clock()
            pairs.append(clock() - t)
        self.overhead = float(np.median(pairs))

    def _add(self, dt: float) -> None:
        i = self._bucket
        spent = self.spent
        while len(spent) <= i:
            spent.append(0.0)
            self.calls.append(0)
        spent[i] += dt
        self.calls[i] += 1

    def seconds(self) -> list[float]:
        """CPU seconds per bucket, less the clock's own cost."""
        return [max(0.0, v - n * self.overhead)
                for v, n in zip(self.spent, self.calls, strict=True)]

    # the timed calls -------------------------------------------------------------------

    def on_request(self, request: Request, now: int) -> list[Action]:
        self._bucket = now // self.bucket_ns
        t = self._clock()
        try:
            return self.inner.on_request(request, now)
        finally:
            self._add(self._clock() - t)

    def on_result(self, result: Result, now: int) -> list[Action]:
        self._bucket = now // self.bucket_ns
        t = self._clock()
        try:
            return self.inner.on_result(result, now)
        finally:
            self._add(self._clock() - t)

    def on_tick(self, now: int) -> list[Action]:
        self._bucket = now // self.bucket_ns
        t = self._clock()
        try:
            return self.inner.on_tick(now)
        finally:
            self._add(self._clock() - t)

    def set_gpu_available(self, gpu_index: int, available: bool, now: int) -> list[Action]:
        self._bucket = now // self.bucket_ns
        t = self._clock()
        try:
            return self.inner.set_gpu_available(gpu_index, available, now)
        finally:
            self._add(self._clock() - t)

    def next_wakeup(self) -> int | None:
        t = self._clock()
        try:
            return self.inner.next_wakeup()
        finally:
            self._add(self._clock() - t)

    def drain_replies(self) -> list[Reply]:
        t = self._clock()
        try:
            return self.inner.drain_replies()
        finally:
            self._add(self._clock() - t)

    # the read-only views, untimed --------------------------------------------------------

    def queued(self) -> int:
        return self.inner.queued()

    def model_view(self, model: str) -> ModelView | None:
        return self.inner.model_view(model)

    def pages_used(self, gpu_index: int) -> int:
        return self.inner.pages_used(gpu_index)

    def stats(self) -> dict[str, int]:
        return self.inner.stats()


# ---------------------------------------------------------------------------- live


@dataclass
class LiveResult(ReplayResult):
    """``clockwork.cluster.replay.replay``'s result, with the controller's action log merged into
    ``telemetry.actions`` (times moved onto the replay's clock) and the CPU time the
    controller and worker processes used during the replay."""

    controller_cpu_s: float = 0.0
    workers_cpu_s: float = 0.0
    ignored: tuple = ()  # scenario settings the live cluster cannot apply
    events: int = 0


def check_live(workers: int, duration_s: float, what: str = "this scale",
               smaller: str = "--quick or --smoke", per: str = "per run") -> None:
    """Refuse (``LiveRefused``, a clear message) a live run this machine cannot hold;
    ``smaller``: how to ask this script for less; ``per``: what ``duration_s`` is of."""
    why = []
    if workers > LIVE_MAX_WORKERS:
        why.append(f"{workers} emulated workers (one process each; at most {LIVE_MAX_WORKERS} "
                   "here)")
    if duration_s > LIVE_MAX_S:
        why.append(f"{duration_s:,.0f} s of real time {per} (at most {LIVE_MAX_S:,.0f} s)")
    if why:
        msg = (f"--live: {what} needs {' and '.join(why)}; run it in the simulator, or "
               f"live at a smaller scale ({smaller})")
        raise LiveRefused(msg)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc), 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _read_actions(path: Path, shift: int) -> list[tuple]:
    """The controller's actions.tsv as the simulator's action rows, times moved by
    ``-shift`` ns (from the controller's clock origin to the replay's)."""
    rows = []
    if not path.exists():
        return rows
    lines = path.read_text().splitlines()
    if not lines or tuple(lines[0].split("\t")) != ACTION_COLUMNS:
        return rows
    for line in lines[1:]:
        f = line.split("\t")
        v = [int(x) for x in f[6:]]  # batch .. prediction_error
        latest = v[3] - shift if v[3] != -1 else -1
        rows.append((int(f[0]), f[1], f[2], int(f[3]), int(f[4]), f[5], v[0], v[1] - shift,
                     v[2] - shift if v[2] else 0, latest, v[4], v[5], v[6] - shift,
                     v[7] - shift, v[8]))
    return rows


def _first_arrival(path: Path) -> int | None:
    try:
        with path.open() as f:
            f.readline()
            arrivals = [int(line.split("\t")[2]) for line in f]
    except (OSError, IndexError, ValueError):
        return None
    return min(arrivals) if arrivals else None


# a live run's pacing hops and the flag that sets each (the replay's is an argument)
PACING_HOPS = {"requests": None, "actions": "--action-interval-us",
               "results": "--result-interval-us", "replies": "--reply-interval-us"}


def pacing_intervals(items: Sequence[str]) -> dict[str, float]:
    """``HOP=US`` texts (HOP one of ``PACING_HOPS`` or ``all``; US microseconds from 0,
    no pacing, to a second) as ``run_live``'s ``pacing``; ``ValueError`` naming a bad
    one."""
    from clockwork.client import MAX_INTERVAL_US

    out: dict[str, float] = {}
    for item in items:
        hop, eq, us = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r}: expected HOP=US, e.g. results=500")
        if hop != "all" and hop not in PACING_HOPS:
            raise ValueError(f"{item!r}: HOP is one of {', '.join(PACING_HOPS)}, all")
        try:
            value = float(us)
        except ValueError:
            value = float("nan")
        if not 0 <= value <= MAX_INTERVAL_US:
            raise ValueError(f"{item!r}: US is microseconds from 0 (no pacing) to "
                             f"{MAX_INTERVAL_US:,.0f}")
        out.update(dict.fromkeys(list(PACING_HOPS) if hop == "all" else [hop], value))
    return out


def run_live(sc: Scenario, max_outstanding: int = 20000, echo: bool = False,
             pacing: Mapping[str, float] | None = None) -> LiveResult:
    """Run ``sc`` live: start a ``LocalCluster`` sized from its ``[cluster]``,
    ``[[models]]`` and ``[scheduler]`` (as ``clockwork serve`` does), replay its workloads
    against it with ``clockwork.cluster.replay.replay`` (real clock) while its ``[faults]``
    are played on the worker processes (``LiveFaults``, as ``clockwork serve --replay``
    does), stop the cluster, and merge the controller's action log (``--log-dir``) into the
    result.

    Requests are the replay's (latency measured at the client, network included). The
    controller's logs have their own clock origin (its start); action times are moved onto
    the replay's by the difference between the first arrival each side saw (the first
    request's one-way trip, ~0.1 ms, is the error).

    ``pacing``: streams' pacing intervals under load, microseconds (0: none;
    ``clockwork.protocol.pacing``), by hop: ``requests`` (the replay's stream),
    ``actions`` (controller to workers), ``results`` (workers to controller), ``replies``
    (controller to the replay); a hop not named keeps its command's default; a bad one
    raises ``ValueError`` before anything starts."""
    pacing = pacing_intervals([f"{hop}={us}" for hop, us in (pacing or {}).items()])
    kw, ignored = cluster_from_scenario(sc)
    workers, gpus = kw["workers"], kw["gpus"]
    check_live(workers, sc.duration_s, f"scenario {sc.data.get('name', sc.source)!r}")
    if ignored:
        print(f"--live: not applied by the live cluster: {', '.join(ignored)}", file=sys.stderr)
    device = kw["device"]
    kw["packages"] = kw["packages"] or f"packages/{device}"
    if device != "emulated":  # real execution: compile missing zoo packages first
        ensure_packages(kw["models"], kw["profiles"], device, kw["packages"])
    for hop in ("actions", "replies"):
        if hop in pacing:
            kw["controller_args"] = kw["controller_args"] + [PACING_HOPS[hop], str(pacing[hop])]
    if "results" in pacing:
        wargs = list(kw["worker_args"]) + [[]] * (workers - len(kw["worker_args"]))
        kw["worker_args"] = [a + [PACING_HOPS["results"], str(pacing["results"])]
                             for a in wargs]
    stream = {"stream_interval_us": pacing["requests"]} if "requests" in pacing else {}
    with tempfile.TemporaryDirectory(prefix="cw-live-") as logs:
        kw["controller_args"] = kw["controller_args"] + ["--log-dir", logs]
        cluster = LocalCluster(**kw, echo=echo, http_port=-1, timeout=60.0)
        with cluster:
            faults = LiveFaults(cluster, sc.faults, sc.duration_s)  # as ``serve --replay`` does
            procs = [cluster.controller.proc] + [w.proc for w in cluster.workers]
            cpu0 = [_cpu_s(p.pid) for p in procs]
            try:
                # (a stop signal cancels the replay on its loop, then KeyboardInterrupt)
                res = run_until_signalled(replay(sc, cluster.address, max_outstanding,
                                                 False, on_start=faults.start if faults
                                                 else None, **stream))
            finally:
                faults.stop()
            cpu = [_cpu_s(p.pid) - c0 for p, c0 in zip(procs, cpu0, strict=True)]
            cluster.controller.stop(timeout=60.0)  # writes its logs on SIGTERM
        stopped = res.summary.get("stopped")
        if stopped:  # (its figures cover part of the run: not this experiment's figures)
            from clockwork.errors import ControllerUnavailable
            raise ControllerUnavailable(f"the live run's controller went away "
                                        f"{stopped['at_s']} s into the run: "
                                        f"{stopped['reason']}")
        tel = res.telemetry
        ours = min((r[2] for r in tel.requests), default=None)
        theirs = _first_arrival(Path(logs) / "requests.tsv")
        shift = theirs - ours if ours is not None and theirs is not None else 0
        tel.actions = _read_actions(Path(logs) / "actions.tsv", shift)
    summary = res.summary
    if tel.actions:  # action counts and prediction errors from the controller's own log
        base = tel.summary(sc.duration_s)
        summary = {**base, **{k: v for k, v in summary.items() if k not in base}}
    summary["gpus"] = workers * gpus
    return LiveResult(summary, tel, sc, res.wall_s, res.answered_once, controller_cpu_s=cpu[0],
                      workers_cpu_s=sum(cpu[1:]), ignored=tuple(ignored))


def requests(res: SimResult) -> dict[str, np.ndarray]:
    """The request log as columns (times in ns)."""
    rows = res.telemetry.requests
    n = len(rows)
    cols = {}
    for i, key, dt in ((1, "model", object), (2, "arrival", np.int64), (3, "deadline", np.int64),
                       (4, "latency", np.int64), (5, "status", np.int64), (6, "met", bool),
                       (7, "cold", bool), (8, "batch", np.int64)):
        cols[key] = np.fromiter((r[i] for r in rows), dtype=dt, count=n)
    cols["ok"] = cols["status"] == 0
    cols["slo"] = cols["deadline"] - cols["arrival"]
    return cols


def actions(res: SimResult) -> dict[str, np.ndarray]:
    rows = res.telemetry.actions
    n = len(rows)
    return {
        "type": np.array([r[1] for r in rows], dtype=object),
        "status": np.array([r[2] for r in rows], dtype=object),
        "model": np.array([r[5] for r in rows], dtype=object),
        "batch": np.fromiter((r[6] for r in rows), dtype=np.int64, count=n),
        "completion": np.fromiter((r[13] for r in rows), dtype=np.int64, count=n),
        "error": np.fromiter((r[14] for r in rows), dtype=np.int64, count=n),
    }


def timeline(res: SimResult, bucket_s: float) -> list[dict]:
    """Per-bucket figures: offered load, goodput, max latency of met requests, mean batch,
    cold-start requests, distinct cold models, LOADs, EVICTs."""
    r = requests(res)
    a = actions(res)
    w = int(bucket_s * 1e9)
    rb = r["arrival"] // w
    ab = a["completion"] // w
    n = int(max(rb.max(initial=-1), ab.max(initial=-1))) + 1
    out = []
    for i in range(n):
        s = rb == i
        k = int(s.sum())
        met = s & r["met"]
        inf = (ab == i) & (a["type"] == "INFER") & (a["status"] == "SUCCESS")
        cold = s & r["cold"]
        out.append({
            "t_s": round(i * bucket_s, 3),
            "offered_rps": round(k / bucket_s, 3),
            "goodput_rps": round(int(met.sum()) / bucket_s, 3),
            "attainment": round(int(met.sum()) / k, 6) if k else 1.0,
            "max_latency_met_ms": round(float(r["latency"][met].max()) / 1e6, 3) if met.any() else 0.0,
            "mean_batch": round(float(a["batch"][inf].mean()), 3) if inf.any() else 0.0,
            "cold_starts": int(cold.sum()),
            "cold_models": len(set(r["model"][cold])),
            "loads": int(((ab == i) & (a["type"] == "LOAD")).sum()),
            "evicts": int(((ab == i) & (a["type"] == "EVICT")).sum()),
        })
    return out


def cdf(values: np.ndarray, points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) at up to ``points`` quantiles (small enough for a data file)."""
    v = np.sort(np.asarray(values, dtype=float))
    if not len(v):
        return np.zeros(0), np.zeros(0)
    q = np.linspace(0, 1, min(points, len(v)))
    return np.quantile(v, q), q


def _wrote(path: Path, existed: bool) -> Path:
    """Say on stderr which file was written, and whether it replaced one (a given --out
    is written over without asking, the repository's figures/ too)."""
    print(f"wrote {path}" + (" (replaced)" if existed else ""), file=sys.stderr, flush=True)
    return path


def write_tsv(path: Path, rows: list[dict]) -> Path:
    existed = path.exists()
    with path.open("w") as f:
        if rows:
            keys = list(rows[0])
            f.write("\t".join(keys) + "\n")
            for r in rows:
                f.write("\t".join(str(r[k]) for k in keys) + "\n")
    return _wrote(path, existed)


def read_tsv(path: Path) -> list[dict]:
    lines = Path(path).read_text().splitlines()
    keys = lines[0].split("\t")
    out = []
    for line in lines[1:]:
        row = {}
        for k, v in zip(keys, line.split("\t"), strict=True):
            try:
                row[k] = float(v)
            except ValueError:
                row[k] = v
        out.append(row)
    return out


def write_json(path: Path, data: dict) -> Path:
    def default(o):
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(type(o))

    existed = path.exists()
    path.write_text(json.dumps(data, indent=1, default=default) + "\n")
    return _wrote(path, existed)


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 3.6)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows),
                             squeeze=False)
    return fig, axes


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    existed = path.exists()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return _wrote(path, existed)


def compare(what: str, paper: str, ours: str) -> str:
    line = f"{what}\n  paper: {paper}\n  ours:  {ours}"
    print(line)
    return line


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.perf_counter() - self.t0
