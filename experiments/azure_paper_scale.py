"""Paper Figs. 9-10 at the paper's scale, in the simulator: how long does it take?

The paper's Azure replay (Clockwork, OSDI'20, Section 6.5; /work/shared/REFERENCES.md):
the Azure Functions trace onto 61 model varieties x 66 copies = 4,026 instances, 6
workers with 2 V100s each (12 GPUs; the artifact ran it as 12 one-GPU worker machines --
12 GPUs either way), 6 hours, 9,638 r/s offered (208 M requests), 100 ms SLO. This
script builds that scenario as closely as the shipped data allows and times a slice of
it (or all of it) in the discrete-event simulator:

* instances: 4,026 copies spread evenly over the 9 ``v100-reference`` profiles (the
  paper's 61 varieties are not all profiled here): 448 x 3 + 447 x 6, listed in the order
  of ``VARIETIES`` -- with Clockwork's contiguous mapping the busiest functions land on
  the first variety (ResNet50 v2, as in ``scenarios/azure_sample.toml``);
* cluster: 6 workers x 2 GPUs, 1,376-page weights cache each (37,572 pages of weights
  for 16,512 pages of cache: the least used instances cold-start), 100 ms SLO, the
  emulated timing noise and jitter of ``fig9_azure.py``;
* trace (``--trace``): no real trace day ships (traces/README.md), so by default a
  full-size synthetic day -- 46,000 functions (a real day has ~46,000 rows), seed 1,
  ``clockwork trace synth`` -- made once into traces/azure/ (git-ignored, ~150 MB);
  ``--trace sample`` takes the shipped 500-function sample instead (only ~500 of the
  4,026 instances then see traffic), ``--trace PATH`` any day file;
* load factor: the trace multiplier that makes the 6 trace hours from ``--replay-start``
  (default minute 0) offer ``--rate`` r/s on average (default the paper's 9,638 r/s, so
  the 6 hours hold ~208 M requests). A slice (``--start-minute``, ``--minutes``) offers
  whatever the trace's own rate is in its minutes.

Trace minutes are replayed at real speed (60 s of simulated time each). ``--minutes N``
simulates the first N minutes (default 5); ``--hours 6`` the whole replay. Parts of at
most ``--part-minutes`` (default 60, as ``fig9_azure.py --full``) run one after another
(or ``--jobs`` at a time, each in its own process: the same results in less wall time),
each in a fresh process that starts with empty GPU caches, idle queues and fresh
estimates: so a split replay is NOT the same as one continuous run -- it has a burst of
cold starts at every part's start and forgets what the scheduler learnt.
``--warmup-minutes W`` takes the cold burst away: each part after the first also
simulates the W trace minutes before its own (not before ``--start-minute``) and counts
only the requests that arrive, and the actions that complete, in its own minutes, so it
begins from the caches, queues and estimates those minutes leave. It is still not the
continuous run, whose state at that minute is another: measured over 12 minutes
(experiments/RESULTS.md), split runs, warmed up or not, differ from the continuous one
in attainment by about as much as two continuous runs with different ``--seed``s do,
and in cold starts by more. A part whose warm-up reaches back to ``--start-minute`` is
exactly the continuous run's tail. A warm-up is simulated like any other minutes (W /
part-minutes more per part). Why split: the
simulator keeps every request and action row in memory (numpy columns, whether or not
logs are written), 73 bytes per request at this scale (measured), so one continuous
6-hour run would hold ~14 GiB of rows, ~15-17 GiB at its peak with the ~0.7 GiB base and
the summary's temporaries: barely inside this 23 GiB machine and not beside other jobs.
A 1-hour part: ~2.4 GiB of rows, an estimated 3-4 GiB peak. ``--part-minutes 0`` runs one continuous simulation
anyway; with ``--spill-dir DIR`` the rows go to files in DIR instead (~15 GiB of disk for
the 6 hours) and the process's memory stays near its set-up size (0.45 GiB anonymous
after 12 minutes, against 1.27 GiB with the rows in memory; measured), plus the summary's
scratch copy of the latencies at the end (8 bytes a request: ~1.6 GiB for 208 M), so the
continuous replay -- the paper's experiment, without a cold start every hour -- fits.

Each part runs in a child process (``--part``, internal). Printed: simulated requests,
offered r/s, goodput and attainment, cold-start requests and cold models per minute, the
child's CPU time (user + system, from ``getrusage``) split into start-up, scenario set-up
(trace load, instances), the simulation and writing the logs, wall time, simulated
requests per CPU-second, the child's peak RSS, the load average, and the time the whole
6-hour replay would take at the measured rate (simulation CPU per request x the paper's
208 M requests, plus one set-up per part), against the 30-minute target.

    python experiments/azure_paper_scale.py [--minutes N | --hours H] [--start-minute M]
        [--replay-start M]
        [--trace synth|sample|PATH] [--rate R | --load-factor F] [--part-minutes P]
        [--warmup-minutes W] [--jobs N] [--spill-dir DIR]
        [--out DIR [--log-format npz|tsv] [--no-logs]] [--json FILE] [--progress]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clockwork.cluster.cli import argtypes as t  # noqa: E402
from experiments import common  # noqa: E402

NAME = "azure_paper_scale"
WORKERS, GPUS_PER_WORKER = 6, 2
INSTANCES = 4026  # the paper's 61 varieties x 66 copies
VARIETIES = ("resnet50_v2", "resnet101_v2", "inception_v3", "resnet18_v2", "mobilenet_v2",
             "resnet34_v2", "resnet152_v2", "densenet121", "vgg16")
SLO_MS = 100
PAPER_RPS = 9638.0  # offered = goodput, over 6 hours
PAPER_HOURS = 6
PAPER_REQUESTS = 208e6  # "58 failures in 208 M requests"
TARGET_WALL_S = 1800.0  # acceptance target: the 6-hour replay simulated in < 30 minutes
MINUTE_NS = 60_000_000_000  # a trace minute, replayed at real speed
SYNTH_FUNCTIONS, SYNTH_SEED = 46000, 1
SAMPLE = common.ROOT / "traces" / "samples" / "invocations_per_function_md.anon.d01.csv.gz"
BASE = common.SCENARIOS / "azure_sample.toml"


def copies() -> dict[str, int]:
    """``INSTANCES`` copies spread as evenly as possible over ``VARIETIES``."""
    q, r = divmod(INSTANCES, len(VARIETIES))
    return {m: q + (i < r) for i, m in enumerate(VARIETIES)}


def scenario_data(trace: Path, start: int, minutes: int, load_factor: float,
                  noise: bool, seed: int | None = None) -> dict:
    """The paper-scale scenario for trace minutes ``[start, start + minutes)``: the Azure
    sample scenario with the cluster, instances and trace replaced."""
    from experiments import fig9_azure

    data = tomllib.loads(BASE.read_text())
    data["name"] = "azure-paper-scale"
    if seed is not None:
        data["seed"] = seed
    data["duration_s"] = minutes * 60.0
    data["cluster"].update(workers=WORKERS, gpus_per_worker=GPUS_PER_WORKER)
    if noise:
        data["cluster"].update(noise=fig9_azure.NOISE, jitter_ms=fig9_azure.JITTER_MS)
    data["scheduler"]["default_slo_ms"] = SLO_MS
    data["models"] = [{"name": m, "copies": c} for m, c in copies().items()]
    w = data["workloads"][0]
    w.update(trace=str(trace), start_minute=start, minutes=minutes, interval_s=60.0,
             load_factor=load_factor, mapping="contiguous", slo_ms=SLO_MS)
    return data


def resolve_trace(which: str) -> Path:
    """``synth`` (made once into traces/azure/), ``sample`` or a path."""
    if which == "sample":
        return SAMPLE
    if which != "synth":
        p = Path(which)
        if not p.is_file():
            raise SystemExit(f"{NAME}: trace file {p} not found")
        return p.resolve()
    path = common.ROOT / "traces" / "azure" / f"synth-{SYNTH_FUNCTIONS}f-seed{SYNTH_SEED}.d01.csv"
    if not path.is_file():
        from clockwork.workloads.synth import write_synthetic

        print(f"making the synthetic trace day ({SYNTH_FUNCTIONS:,} functions, seed "
              f"{SYNTH_SEED}) once: {path.relative_to(common.ROOT)} ...", flush=True)
        with tempfile.TemporaryDirectory(dir=path.parent.parent) as tmp:
            path.parent.mkdir(parents=True, exist_ok=True)
            (made,) = write_synthetic(tmp, SYNTH_FUNCTIONS, 1, SYNTH_SEED)
            made.replace(path)
    return path


@contextlib.contextmanager
def spill_folder(spill_dir: Path | None):
    """With ``--spill-dir``: a folder of this run's own inside it, for the parts' row
    folders, removed when the run ends however it ends (a part stopped by Ctrl-C is
    killed, so it cannot remove its own rows; they go with this folder). Yields its path
    as text, or None without ``--spill-dir``."""
    if spill_dir is None:
        yield None
        return
    spill_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=spill_dir.resolve(),
                                     ignore_cleanup_errors=True) as own:
        yield own


# ----------------------------------------------------------------------- one part (child)

def cpu_timeline(samples: list[tuple[int, float, int]], minutes: int) -> list[float]:
    """Simulated requests per CPU-second of simulation in each simulated minute, from
    (simulated ns, CPU s, requests so far) samples, the CPU time and requests at each
    minute's bounds read between the samples around it (linearly in simulated time: the
    samples come with the progress line, every second, or 30 s in a log, and a minute
    between two of them got all their requests and CPU, the next ones 0); the last
    minute runs to the last sample, drain included."""
    def at(t: int) -> tuple[float, float]:
        for (t0, c0, n0), (t1, c1, n1) in zip(samples, samples[1:], strict=False):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
                return c0 + f * (c1 - c0), n0 + f * (n1 - n0)
        return samples[-1][1], samples[-1][2]

    out = []
    prev = at(0)
    for k in range(1, minutes + 1):
        nxt = (samples[-1][1], samples[-1][2]) if k == minutes else at(k * MINUTE_NS)
        dc = nxt[0] - prev[0]
        out.append(round((nxt[1] - prev[1]) / dc) if dc > 0 else 0)
        prev = nxt
    return out


def run_part(spec: dict) -> dict:
    """One simulation in this process (``--part``); returns its figures."""
    import numpy as np

    from clockwork.cluster.sim import Simulation
    from clockwork.telemetry import summary_of, timeline_of

    cpu = time.process_time
    samples: list[tuple[int, float, int]] = []

    class Sampled(Simulation):
        """The simulator, its progress report (every second of wall time) also taken
        as a sample of (simulated time, CPU time, requests so far); printed only with
        ``progress``."""

        def _report(self, now: int, wall: float, n: int, end: str = "\r") -> None:
            samples.append((now, cpu(), n))
            if spec["progress"]:
                super()._report(now, wall, n, end)
            status = spec.get("status")
            if status and len(samples) % 10 == 1:  # for the parent's line (--jobs)
                Path(status).write_text(f"{now / self.duration:.4f} {n}")

    c0, w0 = cpu(), time.perf_counter()
    warm = spec.get("warmup", 0)  # minutes simulated before ``start``, not counted
    sc = common.scenario(scenario_data(Path(spec["trace"]), spec["start"] - warm,
                                       spec["minutes"] + warm, spec["load_factor"],
                                       spec["noise"], spec.get("seed")))
    sim = Sampled(sc, progress=True, spill_dir=spec.get("spill_dir"))
    c1, w1 = cpu(), time.perf_counter()
    rss_setup = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = sim.run()
    c2, w2 = cpu(), time.perf_counter()
    rss_end = memory_now()
    samples.insert(0, (0, c1, 0))
    samples.append((sim.duration + 1, c2, res.summary["submitted"]))
    tel = res.telemetry
    req, act = tel.request_columns(), tel.action_columns()
    log_bytes = sum(a.nbytes for a in req.values()) + sum(a.nbytes for a in act.values())
    s = res.summary
    last = spec.get("last", True)
    if warm or not last:
        # count only the requests that arrived, and the actions done, from ``start``; and
        # but for the last part, the actions done before the part's end (those after it
        # are the next part's, which counts them from its start: they were counted twice)
        end = None if last else (warm + spec["minutes"]) * MINUTE_NS
        req, act = counted(req, act, warm * MINUTE_NS, end)
        s = dict(summary_of(req, act, spec["minutes"] * 60.0),
                 max_pages_used=s["max_pages_used"])
    # distinct instances with a cold-start request, per trace minute
    minute = req["arrival"] // MINUTE_NS
    cold = req["cold_start"]
    pairs = np.unique(minute[cold] * (1 << 20) + req["model"][cold])
    per_min = np.bincount((pairs >> 20).astype(np.int64), minlength=spec["minutes"])
    del minute, cold, pairs
    # Fig. 9's series: per trace minute, requests, goodput, attainment, cold starts, LOADs
    by_minute = timeline_of(req, act, 60.0)[:spec["minutes"]]
    del req, act
    if spec["out"]:
        tel.log_format = spec["log_format"]
        res.write(spec["out"])
    tel.close()  # (--spill-dir: the rows' files go)
    c3, w3 = cpu(), time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"start_minute": spec["start"], "minutes": spec["minutes"], "warmup_minutes": warm,
            "seed": sc.seed,
            "summary": {k: s[k] for k in ("submitted", "succeeded", "slo_met", "failed",
                                          "dropped", "cold_starts", "actions", "latency_ms",
                                          "max_pages_used")},
            "events": res.events,
            "requests_per_cpu_s_by_minute": cpu_timeline(samples, spec["minutes"] + warm)[warm:],
            "cold_models_per_minute": per_min[:spec["minutes"]].tolist(),
            "by_minute": by_minute,
            "log_bytes": int(log_bytes),
            "cpu_s": {"setup": c1 - c0, "simulate": c2 - c1, "write": c3 - c2,
                      "process": ru.ru_utime + ru.ru_stime},
            "wall_s": {"setup": w1 - w0, "simulate": w2 - w1, "write": w3 - w2},
            "maxrss_setup_kb": rss_setup, "maxrss_kb": ru.ru_maxrss, "rss_end_kb": rss_end}


# the columns a part's figures read (summary_of, timeline_of, cold models per minute)
COUNTED_COLUMNS = (("arrival", "status", "latency", "deadline_met", "cold_start", "model"),
                   ("type", "status", "prediction_error", "measured_completion"))


def counted(req: dict, act: dict, cut: int, end: int | None = None) -> tuple[dict, dict]:
    """The rows a part counts, of ``COUNTED_COLUMNS`` only (copies: the other columns stay
    where they are, in files with ``--spill-dir``): requests that arrived at or after
    ``cut`` (ns of simulated time) and actions that completed then (as ``timeline_of``
    places them), and before ``end`` if given, with those times moved back by ``cut``
    (so that minute 0 is the part's first counted minute)."""
    keep = req["arrival"] >= cut
    req = {k: req[k][keep] for k in COUNTED_COLUMNS[0]}
    req["arrival"] -= cut
    keep = act["measured_completion"] >= cut
    if end is not None:
        keep &= act["measured_completion"] < end
    act = {k: act[k][keep] for k in COUNTED_COLUMNS[1]}
    act["measured_completion"] -= cut
    return req, act


def memory_now() -> dict:
    """This process's resident memory now, kB (Linux ``/proc/self/status``): all of it,
    and the anonymous part (not counting file pages such as --spill-dir's maps, which
    the kernel may drop); empty elsewhere."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    fields = dict(ln.split(":", 1) for ln in lines if ":" in ln)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon") if k in fields}


PROGRESS_S = 60.0  # with --jobs: a line on the running parts this often


def parts_line(specs: list[dict], done: dict) -> str:
    """Where each part is, from the status files its process writes now and then."""
    out = []
    for i, spec in enumerate(specs):
        if i in done:
            continue
        try:
            frac, n = Path(spec["status"]).read_text().split()
            out.append(f"part {i + 1} {100 * float(frac):.0f} % ({int(n):,} requests)")
        except (OSError, ValueError):
            out.append(f"part {i + 1} starting or waiting")
    return "; ".join(out)


_CHILDREN: set[subprocess.Popen] = set()  # the parts running now (each waited on by a thread)
# (a part is started and entered in _CHILDREN under this lock, and none is started once
# _STOP is set: a stop either sees a part or keeps it from starting; a part started just
# as Ctrl-C came was missed and ran to its end)
_CHILDREN_LOCK = threading.Lock()
_STOP = threading.Event()


def stop_parts() -> None:
    """Kill every part running, and start none from now on."""
    with _CHILDREN_LOCK:
        _STOP.set()
        for c in list(_CHILDREN):
            c.kill()


def spawn_part(spec: dict, alone: bool = True) -> dict:
    """``run_part`` in a fresh Python process; adds the process's own CPU time and wall
    time as its parent sees them (``RUSAGE_CHILDREN``: start-up and imports included;
    with parts running at the same time, ``alone`` false, the child's own count at its
    end instead, which misses only its exit)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", prefix=f"{NAME}-") as f:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--part", json.dumps(spec),
               "--result", f.name]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = None
        try:
            with _CHILDREN_LOCK:
                if _STOP.is_set():
                    raise SystemExit(f"{NAME}: stopped")
                p = subprocess.Popen(cmd, cwd=common.ROOT)
                _CHILDREN.add(p)
            rc = p.wait()
        except BaseException:  # (Ctrl-C here, from the start: the part goes too)
            if p is not None:
                p.kill()
                p.wait()
            raise
        finally:
            _CHILDREN.discard(p)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if rc:
            raise SystemExit(f"{NAME}: part from minute {spec['start']} failed "
                             f"(exit status {rc})")
        out = json.loads(Path(f.name).read_text())
    out["cpu_s"]["child"] = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
                             if alone else out["cpu_s"]["process"])
    out["wall_s"]["child"] = wall
    return out


def in_process(spec: dict) -> dict:
    """``run_part`` in this process (``--in-process``: for profilers; peak RSS then
    includes this process's own trace load, start-up is not counted)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = run_part(spec)
    out["cpu_s"]["child"] = time.process_time() - c0
    out["wall_s"]["child"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------- the driver

def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:-1]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=int, default=5,
                   help="trace minutes to simulate, at real speed (default 5)")
    g.add_argument("--hours", type=t.positive_float, default=None,
                   help="trace hours to simulate instead (6: the paper's whole replay)")
    p.add_argument("--start-minute", type=int, default=None,
                   help="first trace minute (0-based) to simulate (default --replay-start)")
    p.add_argument("--replay-start", type=int, default=0,
                   help="first trace minute of the 6-hour replay whose mean rate --rate "
                        "sets (default 0)")
    p.add_argument("--trace", default="synth",
                   help="synth (default: a 46,000-function synthetic day, made once into "
                        "traces/azure/), sample (the shipped 500-function sample) or a "
                        "day file's path")
    lf = p.add_mutually_exclusive_group()
    lf.add_argument("--rate", type=t.positive_float, default=PAPER_RPS,
                    help="mean offered r/s over the 6 trace hours from --replay-start; "
                         f"sets the load factor (default the paper's {PAPER_RPS:,.0f})")
    lf.add_argument("--load-factor", type=t.positive_float, default=None,
                    help="trace multiplier instead of --rate")
    p.add_argument("--part-minutes", type=int, default=60,
                   help="split the replay into consecutive runs of at most this many trace "
                        "minutes, each a fresh process starting cold (default 60; 0: one "
                        "continuous run)")
    p.add_argument("--warmup-minutes", type=int, default=0,
                   help="with parts: each part after the first also simulates up to this "
                        "many trace minutes before its own (never before --start-minute) and "
                        "counts only its own, so that it starts from the state those minutes "
                        "leave instead of cold (default 0: cold parts). Reaching back to "
                        "--start-minute, a part is the continuous run's tail exactly")
    p.add_argument("--spill-dir", type=common.out_dir, default=None,
                   help="keep each simulation's request and action rows in files in a "
                        "temporary folder inside this one instead of in memory (removed at "
                        "the end, also when stopped; ~75 bytes of disk per request): memory "
                        "stays flat, so a continuous run (--part-minutes 0) of the whole "
                        "replay fits")
    p.add_argument("--jobs", type=int, default=1,
                   help="parts to run at the same time, each in its own process (default 1: "
                        "one after another); the same results, in less wall time on a "
                        "machine with that many free cores (and memory for that many parts)")
    p.add_argument("--seed", type=t.seed, default=None,
                   help="the scenario's seed (arrival times within each trace minute, "
                        "timing noise; default that of scenarios/azure_sample.toml, 1): "
                        "another seed is another equally likely run, to see how much the "
                        "figures vary between runs")
    p.add_argument("--no-noise", action="store_true",
                   help="no emulated timing noise and jitter (fig9_azure.py's 2 %% and "
                        "0.1 ms are on by default)")
    p.add_argument("--out", type=common.out_dir, default=None,
                   help="write each part's logs (DIR/part-MMMM/) and the figures "
                        f"(DIR/{NAME}.json) here; without it nothing is written")
    p.add_argument("--log-format", choices=("npz", "tsv"), default=None,
                   help="log format with --out (default npz)")
    p.add_argument("--no-logs", action="store_true",
                   help="with --out: only the figures, no request/action logs")
    p.add_argument("--json", type=common.out_file, default=None,
                   help="write the figures here too")
    p.add_argument("--progress", action="store_true",
                   help="the simulator's progress line (on by default on a terminal)")
    p.add_argument("--in-process", action="store_true",
                   help="run the simulation(s) in this process, not in child processes "
                        "(to profile it: python -m cProfile -s tottime "
                        f"experiments/{NAME}.py --minutes 1 --in-process)")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from clockwork.workloads.azure import MINUTES

    if args.out is None and args.log_format:  # (it did nothing without it, silently)
        p.error("--log-format needs --out (the logs go there)")
    if args.no_logs and args.log_format:
        p.error("--log-format with --no-logs: no logs are written")
    args.log_format = args.log_format or "npz"
    if args.out is not None:  # (said if it stops early: the parts written are kept)
        common.OUTS.append(args.out)

    if args.hours is not None:
        if args.hours > MINUTES / 60:  # (a huge value would overflow into minutes)
            p.error(f"--hours must be at most {MINUTES // 60}, the trace day, got {args.hours:g}")
        args.minutes = round(args.hours * 60)
    if args.start_minute is None:
        args.start_minute = args.replay_start
    if args.minutes < 1:
        p.error("--minutes / --hours: at least one trace minute")
    if args.part_minutes < 0:
        p.error("--part-minutes must be >= 0")
    if args.warmup_minutes < 0:
        p.error("--warmup-minutes must be >= 0")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.trace not in ("synth", "sample") and not os.path.isfile(args.trace):
        p.error(f"--trace: no trace file {args.trace}")
    # (here, not in a part: a bad value found by the second part cost the first's hours)
    for flag, minute in (("--replay-start", args.replay_start),
                         ("--start-minute", args.start_minute)):
        if not 0 <= minute < MINUTES:
            p.error(f"{flag} must be a minute of the trace day, 0 to {MINUTES - 1}, got {minute}")
    if args.start_minute + args.minutes > MINUTES:
        p.error(f"--start-minute {args.start_minute} and --minutes {args.minutes} run past the "
                f"trace day's {MINUTES:,} minutes")
    return args


def load_factor(trace: Path, start: int, rate: float) -> tuple[float, float]:
    """The multiplier that makes the 6 trace hours from ``start`` (or what is left of the
    day) offer ``rate`` r/s; and the trace's own mean r/s over them."""
    from clockwork.workloads.azure import MINUTES, AzureTrace

    tr = AzureTrace.load(trace)
    n = min(PAPER_HOURS * 60, MINUTES - start)
    base = float(tr.window(start, n).per_minute().sum()) / (n * 60.0)
    return rate / base, base


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.part:
        try:
            res = run_part(json.loads(args.part))
        except KeyboardInterrupt:
            # a Ctrl-C at the terminal reaches the parent too, which says "interrupted"
            # once for the run (and removes the rows' folder): this part ends quietly
            raise SystemExit(130) from None
        Path(args.result).write_text(json.dumps(res))
        return res

    load0 = os.getloadavg()
    c0 = time.process_time()
    trace = resolve_trace(args.trace)
    if args.load_factor is None:
        lf, base = load_factor(trace, args.replay_start, args.rate)
    else:
        lf, base = args.load_factor, None
    setup_parent = time.process_time() - c0
    part = args.part_minutes or args.minutes
    starts = list(range(args.start_minute, args.start_minute + args.minutes, part))
    cp = copies()
    print(f"{NAME}: {sum(cp.values()):,} instances ({', '.join(f'{m} x{c}' for m, c in cp.items())}); "
          f"{WORKERS} workers x {GPUS_PER_WORKER} GPUs; SLO {SLO_MS} ms; trace "
          f"{trace.name}" + (f" ({base:,.1f} r/s over the 6 h from minute "
                             f"{args.replay_start})" if base else "")
          + f"; load factor {lf:.4f}; minutes {args.start_minute}.."
          f"{args.start_minute + args.minutes - 1} in {len(starts)} part(s)"
          + (f", each after the first warmed up by up to {args.warmup_minutes} earlier trace "
             f"minute(s) (simulated, not counted)"
             if args.warmup_minutes and len(starts) > 1 else "") + "; load average "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    if args.out and not args.no_logs and args.out.is_dir():
        # (part folders of an earlier run this one would not replace: its figures and logs
        # were left beside this run's, for whoever reads part-* to take as one run)
        ours = {f"part-{s:04d}" for s in starts}
        stale = sorted(d.name for d in args.out.glob("part-*") if d.name not in ours)
        if stale:
            print(f"{NAME}: --out {args.out} holds part folders of an earlier run that this "
                  f"one would not replace ({', '.join(stale[:3])}"
                  f"{', ...' if len(stale) > 3 else ''}): give another --out, or remove them",
                  file=sys.stderr)
            raise SystemExit(2)
    specs = []
    for s in starts:
        out = None
        if args.out and not args.no_logs:
            out = str((args.out / f"part-{s:04d}").resolve())
        specs.append({"trace": str(trace), "start": s,
                      "minutes": min(part, args.start_minute + args.minutes - s),
                      "warmup": min(args.warmup_minutes, s - args.start_minute),
                      "last": s == starts[-1],
                      "seed": args.seed,
                      "load_factor": lf, "noise": not args.no_noise, "out": out,
                      "log_format": args.log_format,
                      # one progress line, of a part running alone
                      "progress": (args.progress or sys.stderr.isatty()) and args.jobs == 1,
                      "spill_dir": None})  # (set below: the run's own folder)
    done: dict[int, dict] = {}
    with spill_folder(args.spill_dir) as spill, common.Timer() as t:
        for spec in specs:
            spec["spill_dir"] = spill
        def finished(i: int, r: dict) -> None:
            done[i] = r
            sm, s, n = r["summary"], r["start_minute"], r["minutes"]
            left = args.minutes - sum(p["minutes"] for p in done.values())
            eta = (time.perf_counter() - t.t0) / (args.minutes - left) * left
            warm = f", warmed up from {s - r['warmup_minutes']}" if r["warmup_minutes"] else ""
            print(f"  part {i + 1}/{len(starts)} (minutes {s}..{s + n - 1}{warm}): "
                  f"{sm['submitted']:,} requests, attainment "
                  f"{sm['slo_met'] / max(1, sm['submitted']):.6f}, CPU {r['cpu_s']['child']:,.1f} s "
                  f"(simulation {r['cpu_s']['simulate']:,.1f} s), wall {r['wall_s']['child']:,.1f} s, "
                  f"peak RSS {r['maxrss_kb'] / 2**20:.2f} GiB"
                  + (f"; about {eta / 60:,.1f} min wall to go" if left else ""), flush=True)

        if args.in_process or args.jobs == 1 or len(specs) == 1:
            for i, spec in enumerate(specs):
                finished(i, in_process(spec) if args.in_process else spawn_part(spec))
        else:  # parts side by side, each its own process
            with tempfile.TemporaryDirectory(prefix=f"{NAME}-") as status_dir, \
                    ThreadPoolExecutor(args.jobs) as pool:
                for i, spec in enumerate(specs):
                    spec["status"] = str(Path(status_dir) / f"part-{i}")
                futures: dict = {}
                try:  # (from the first submit: a Ctrl-C just after it left the parts running
                    # and the pool waited for their ends before the stop was seen)
                    for i, spec in enumerate(specs):
                        futures[pool.submit(spawn_part, spec, False)] = i
                    pending = set(futures)
                    while pending:
                        ended, pending = wait(pending, timeout=PROGRESS_S,
                                              return_when=FIRST_COMPLETED)
                        for f in ended:
                            finished(futures[f], f.result())
                        if pending and not ended:
                            print(f"  {(time.perf_counter() - t.t0) / 60:,.1f} min: "
                                  + parts_line(specs, done), flush=True)
                except BaseException:  # Ctrl-C, a part that failed: none goes on running
                    for f in futures:
                        f.cancel()  # (those not started)
                    stop_parts()
                    raise
    parts = [done[i] for i in range(len(specs))]
    load1 = os.getloadavg()
    info = summarise(args, parts, lf, base, trace, t.wall_s, setup_parent, load0, load1)
    report(info)
    for path in ([args.out / f"{NAME}.json"] if args.out else []) + ([args.json] if args.json else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        common.write_json(path, info)
    return info


def summarise(args, parts, lf, base, trace, wall, setup_parent, load0, load1) -> dict:
    tot = {k: sum(p["summary"][k] for p in parts)
           for k in ("submitted", "succeeded", "slo_met", "failed", "dropped", "cold_starts")}
    acts = {k: sum(p["summary"]["actions"][k] for p in parts)
            for k in ("infer", "load", "evict", "rejected")}
    cpu = {k: sum(p["cpu_s"][k] for p in parts)
           for k in ("child", "setup", "simulate", "write")}
    cpu["start_up"] = cpu["child"] - cpu["setup"] - cpu["simulate"] - cpu["write"]
    dur = args.minutes * 60.0
    n = tot["submitted"]
    cold_models = [c for p in parts for c in p["cold_models_per_minute"]]
    per_req = cpu["simulate"] / max(1, n)
    setup_per_part = (cpu["child"] - cpu["simulate"] - cpu["write"]) / len(parts)
    full_parts = -(-PAPER_HOURS * 60 // (args.part_minutes or PAPER_HOURS * 60))
    full_cpu = per_req * PAPER_REQUESTS + setup_per_part * full_parts
    log_per_req = sum(p["log_bytes"] for p in parts) / max(1, n)
    return {
        "instances": INSTANCES, "workers": WORKERS, "gpus": WORKERS * GPUS_PER_WORKER,
        "trace": str(trace), "trace_rps_6h": base, "load_factor": lf,
        "replay_start": args.replay_start, "start_minute": args.start_minute, "minutes": args.minutes, "parts": len(parts),
        "part_minutes": args.part_minutes, "warmup_minutes": args.warmup_minutes,
        "seed": parts[0]["seed"],  # the one used (without --seed, the base scenario's)
        "noise": not args.no_noise,
        "spill_dir": str(args.spill_dir) if args.spill_dir else None,
        "logs": None if not args.out or args.no_logs else args.log_format,
        "duration_s": dur, "requests": n, "offered_rps": n / dur,
        "goodput_rps": tot["slo_met"] / dur, "attainment": tot["slo_met"] / max(1, n),
        **{k: v for k, v in tot.items() if k != "submitted"}, "actions": acts,
        "cold_start_share": tot["cold_starts"] / max(1, n),
        "cold_models_per_minute_mean": sum(cold_models) / max(1, len(cold_models)),
        "latency_ms_max": max(p["summary"]["latency_ms"]["max"] for p in parts),
        "latency_ms_p99_worst_part": max(p["summary"]["latency_ms"]["p99"] for p in parts),
        "events": sum(p["events"] for p in parts),
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_s_parent_setup": round(setup_parent, 2),
        "wall_s": round(wall, 2),
        "wall_s_simulate": round(sum(p["wall_s"]["simulate"] for p in parts), 2),
        "requests_per_cpu_s": n / cpu["child"], "requests_per_cpu_s_simulate": n / cpu["simulate"],
        "requests_per_wall_s": n / wall,
        "requests_per_cpu_s_by_minute": [x for p in parts
                                         for x in p["requests_per_cpu_s_by_minute"]],
        # per trace minute (Fig. 9): requests, goodput r/s, attainment, cold-start
        # requests, LOADs, EVICTs, and distinct cold models
        "by_minute": [{"trace_minute": p["start_minute"] + k,
                       **{c: v for c, v in row.items() if c != "start_s"}, "cold_models": cm}
                      for p in parts
                      for k, (row, cm) in enumerate(zip(p["by_minute"],
                                                        p["cold_models_per_minute"],
                                                        strict=False))],
        "maxrss_gib": max(p["maxrss_kb"] for p in parts) / 2**20,
        "maxrss_setup_gib": max(p["maxrss_setup_kb"] for p in parts) / 2**20,
        "rss_anon_end_gib": max(p["rss_end_kb"].get("RssAnon", 0) for p in parts) / 2**20,
        "maxrss_children_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
        "log_bytes_per_request": log_per_req,
        "full_6h": {"requests": PAPER_REQUESTS, "parts": full_parts,
                    "cpu_s": full_cpu, "cpu_h": full_cpu / 3600,
                    "vs_target": full_cpu / TARGET_WALL_S,
                    "needed_requests_per_cpu_s": PAPER_REQUESTS / TARGET_WALL_S,
                    "continuous_log_gib": log_per_req * PAPER_REQUESTS / 2**30},
        "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in load1]},
    }


def report(i: dict) -> None:
    f = i["full_6h"]
    c = i["cpu_s"]
    lines = [
        f"simulated  {i['minutes']} trace minute(s) from minute {i['start_minute']} in "
        f"{i['parts']} part(s): {i['requests']:,} requests, offered {i['offered_rps']:,.1f} r/s, "
        f"goodput {i['goodput_rps']:,.1f} r/s, attainment {i['attainment']:.6f} "
        f"({i['failed']:,} failed, {i['dropped']:,} timed out), max latency "
        f"{i['latency_ms_max']:.1f} ms",
        f"cold       {i['cold_starts']:,} cold-start requests ({100 * i['cold_start_share']:.2f} %), "
        f"{i['cold_models_per_minute_mean']:,.0f} cold models per minute "
        f"({100 * i['cold_models_per_minute_mean'] / i['instances']:.1f} % of instances); "
        f"{i['actions']['load']:,} LOADs, {i['actions']['infer']:,} INFERs, "
        f"{i['actions']['rejected']:,} rejected",
        f"CPU        {c['child']:,.1f} s in the child process(es): start-up {c['start_up']:.1f}, "
        f"set-up {c['setup']:.1f}, simulation {c['simulate']:,.1f}, logs {c['write']:.1f} "
        f"(+ {i['cpu_s_parent_setup']:.1f} s here for the load factor)",
        f"wall       {i['wall_s']:,.1f} s (simulation {i['wall_s_simulate']:,.1f} s); load average "
        f"{' '.join(map(str, i['load_average']['start']))} -> "
        f"{' '.join(map(str, i['load_average']['end']))}",
        f"rate       {i['requests_per_cpu_s_simulate']:,.0f} simulated requests per CPU-second "
        f"of simulation ({i['requests_per_cpu_s']:,.0f} all-in; {i['requests_per_wall_s']:,.0f} "
        f"per wall second); per simulated minute: "
        f"{' '.join(f'{x:,}' for x in i['requests_per_cpu_s_by_minute'][:12])}"
        + (" ..." if len(i["requests_per_cpu_s_by_minute"]) > 12 else ""),
        f"memory     peak RSS {i['maxrss_gib']:.2f} GiB ({i['maxrss_setup_gib']:.2f} GiB after "
        f"set-up; anonymous {i['rss_anon_end_gib']:.2f} GiB at the end of the simulation); "
        f"log rows {i['log_bytes_per_request']:.0f} bytes per request "
        + ("(in files: --spill-dir)" if i["spill_dir"] else "(in memory)"),
        f"full 6 h   {f['requests'] / 1e6:.0f} M requests in {f['parts']} part(s): ~{f['cpu_s']:,.0f} "
        f"CPU s = {f['cpu_h']:.2f} h on one core, {f['vs_target']:.1f}x the 30-minute target "
        f"(which needs {f['needed_requests_per_cpu_s']:,.0f} requests per CPU-second); one "
        f"continuous run would hold ~{f['continuous_log_gib']:.1f} GiB of log rows"
        + (" (in --spill-dir)" if i["spill_dir"] else " (in memory; --spill-dir: on disk)"),
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    common.script(main)
