"""``clockwork plan``: the fewest GPUs at which a scenario meets an SLO attainment target,
found by parallel simulation.

What varies is ``cluster.workers``; ``gpus_per_worker`` stays the scenario's, so the
counts are multiples of it (GPUs = workers x gpus_per_worker; with the shipped scenarios,
one GPU per worker, workers and GPUs are the same). A count *meets the target* when the
simulation of every seed (the scenario's seed and the ``seeds - 1`` after it) has
``slo_attainment >= target``. With ``--slo-ms`` every workload's ``slo_ms`` is set to it
(``--set workloads.I.slo_ms=MS``; a ``--set`` of one as well is refused), else the
scenario's SLOs hold. The scenario is checked as the simulator checks it, at the smallest
and the largest count, before anything runs: a setting it refuses is a bad input (exit 2),
not a count that fails.

Attainment need not grow with the GPU count (seeds, placement, cold starts), so the
answer is defined by the counts the search decided on (the curve): the answer N meets
the target, N minus one worker was decided on and does not (unless N is the smallest
count allowed), and no count of the curve below N meets it. The search is the one of a
single count at a time (``walk``): counts that double from ``--min-gpus`` (the smallest
first) until one meets the target, then bisection between the largest count known to
miss and the smallest known to meet (their midpoint, rounded down). It decides from
those counts only, so the answer and the curve do not depend on ``--jobs``: with more
jobs, each round also simulates, ahead of need, the counts the search may ask for after
(up to ``max(1, jobs // seeds)`` counts a round, in parallel), which saves rounds and
changes nothing else; they are not in the curve. Every simulation is a
``clockwork.cluster.parallel`` point: cached per count for the run, and with ``--out``
kept on disk, so a rerun reuses those whose files are unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clockwork.cluster.parallel import (
    BackendUnavailable,
    FolderBusy,
    Outcome,
    Point,
    Runner,
    check_parts,
    default_jobs,
    locked,
)
from clockwork.signals import term_as_ctrl_c
from clockwork.sizes import MAX_POINTS, MAX_SEED, MAX_WORKERS


class PlanError(ValueError):
    """A bad argument or scenario; the message is one line."""


class NoRequests(PlanError):
    """The scenario submits no requests: nothing to size a cluster by (an input error)."""


@dataclass
class Count:
    """One GPU count: its simulations (one per seed)."""

    workers: int
    gpus: int
    outcomes: list[Outcome]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    @property
    def summaries(self) -> list[dict]:
        return [o.summary for o in self.outcomes if o.summary is not None]

    def meets(self, target: float) -> bool:
        return all(s["slo_attainment"] >= target for s in self.summaries)

    def row(self, target: float) -> dict[str, Any]:
        ss = self.summaries
        att = [s["slo_attainment"] for s in ss]
        mean = (lambda xs: round(sum(xs) / len(xs), 9) if xs else None)  # noqa: E731
        return {
            "gpus": self.gpus,
            "workers": self.workers,
            "meets": self.meets(target),
            "attainment_min": min(att) if att else None,
            "attainment_mean": mean(att),
            "goodput_rps_mean": mean([s["goodput_rps"] for s in ss]),
            "cold_starts_mean": mean([s["cold_starts"] for s in ss]),
            # (a seed where no request succeeded has no latency: its summary's 0.0 is
            # not one; None when no seed has one)
            "p99_ms_max": max((s["latency_ms"]["p99"] for s in ss if s["succeeded"]),
                              default=None),
            "seeds": [{"seed": s.get("seed"), "slo_attainment": s["slo_attainment"],
                       "goodput_rps": s["goodput_rps"], "cold_starts": s["cold_starts"],
                       "submitted": s["submitted"]} for s in ss],
            "command": self.outcomes[0].point.command() if self.outcomes else "",
        }


@dataclass
class Plan:
    """The search: its inputs, what it simulated (``counts``, by workers), the counts it
    decided on (``decided``, in order: the curve) and the answer (in workers, or None)."""

    scenario: str
    path: str
    sets: list[str]
    seeds: list[int]
    target: float
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    slo_ms: float | None = None
    warnings: list[str] = field(default_factory=list)  # said before the search runs
    counts: dict[int, Count] = field(default_factory=dict)
    rounds: list[list[int]] = field(default_factory=list)
    decided: list[int] = field(default_factory=list)
    answer: int | None = None

    def points(self, workers: int) -> list[Point]:
        over = [*self.sets, f"cluster.workers={workers}"]
        return [Point(self.scenario, self.path, tuple(over + [f"seed={s}"]),
                      (("workers", workers), ("seed", s))) for s in self.seeds]

    def meets(self, w: int) -> bool:
        return self.counts[w].meets(self.target)

    def curve(self) -> list[dict]:
        """The counts decided on (``decided``), by GPUs: the same whatever ``--jobs``."""
        return [self.counts[w].row(self.target) for w in sorted(self.decided)]

    def result(self) -> dict:
        g = self.gpus_per_worker
        return {
            "scenario": self.scenario,
            "target_attainment": self.target,
            "slo_ms": self.slo_ms,
            "seeds": self.seeds,
            "gpus_per_worker": g,
            "min_gpus": self.min_workers * g,
            "max_gpus": self.max_workers * g,
            "overrides": self.sets,
            "answer_gpus": None if self.answer is None else self.answer * g,
            "answer_workers": self.answer,
            "rounds": [[w * g for w in r] for r in self.rounds],
            "curve": self.curve(),
        }


def _doubling(plan: Plan) -> list[int]:
    """The counts the search grows through: doubling from the minimum, then the maximum."""
    cands, w = [], plan.min_workers
    while w < plan.max_workers:
        cands.append(w)
        w *= 2
    cands.append(plan.max_workers)
    return list(dict.fromkeys(cands))


def walk(plan: Plan, known: dict[int, bool]) -> tuple[int | None, list[int], int | None]:
    """The search as one count at a time would make it, told which counts meet the
    target (``known``): ``(next, path, answer)``. ``path`` is the counts it decided on,
    in order; ``next`` the count it needs next (None when it is done: ``answer`` is the
    answer then, None for "not met"). First the counts of ``_doubling``, the smallest
    first, until one meets the target; then bisection between the largest count known
    to miss and the smallest known to meet, at their midpoint ``(lo + hi) // 2``."""
    path: list[int] = []
    lo, hi = plan.min_workers - 1, None
    for c in _doubling(plan):
        if c not in known:
            return c, path, None
        path.append(c)
        if known[c]:
            hi = c
            break
        lo = c
    if hi is None:
        return None, path, None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid not in known:
            return mid, path, None
        path.append(mid)
        if known[mid]:
            hi = mid
        else:
            lo = mid
    return None, path, hi


def next_counts(plan: Plan, k: int) -> list[int]:
    """The worker counts to simulate next (at most ``k``), or [] when the search is done
    (``plan.answer`` set, or None: not met). The decisions are ``walk``'s, made from the
    counts on its path only, so the answer and ``plan.decided`` do not depend on ``k``: the
    first count is the one ``walk`` needs, the others are those it may need after it
    (the next levels of its tree of outcomes, a miss first), simulated ahead to save
    rounds. Raises ``PlanError`` when the path needs a count whose simulation failed."""
    g = plan.gpus_per_worker
    known = {w: c.meets(plan.target) for w, c in plan.counts.items() if c.ok}
    nxt, plan.decided, answer = walk(plan, known)
    if nxt is None:
        plan.answer = answer
        return []
    if nxt in plan.counts:  # simulated, and it failed
        bad = next(o for o in plan.counts[nxt].outcomes if not o.ok)
        raise PlanError(f"{nxt * g} GPUs ({nxt} workers): {bad.error}")
    picks: list[int] = []
    level = [known]
    while level and len(picks) < k:
        deeper = []
        for assumed in level:
            n = walk(plan, assumed)[0]
            if n is None or n in picks or n in plan.counts:
                continue
            picks.append(n)
            if len(picks) == k:
                break
            deeper += [{**assumed, n: False}, {**assumed, n: True}]
        level = deeper
    return picks


def search(plan: Plan, runner: Runner, root: str | Path, k: int, log=None) -> Plan:
    """Run the search to the end; ``log(line)`` is told each round."""
    g = plan.gpus_per_worker

    def said(w: int) -> str:
        c = plan.counts[w]
        if not c.ok:
            return f"{w * g} GPUs failed"
        return (f"{w * g} GPUs {'meet' if plan.meets(w) else 'miss'} (attainment min "
                f"{min(s['slo_attainment'] for s in c.summaries):.6f})")

    while True:
        todo = next_counts(plan, k)
        if not todo:
            break
        plan.rounds.append(todo)
        pts = {w: plan.points(w) for w in todo}
        flat = [p for w in todo for p in pts[w]]
        outs = runner.run(flat, root, desc=f"plan round {len(plan.rounds)}")
        by_name = {o.point.name: o for o in outs}
        for w in todo:
            plan.counts[w] = Count(w, w * g, [by_name[p.name] for p in pts[w]])
        if log:
            log(f"round {len(plan.rounds)}: " + ", ".join(said(w) for w in todo))
        empty = [s for w in todo for s in plan.counts[w].summaries if not s["submitted"]]
        if empty:  # (the requests do not depend on the GPUs: no count will have any; the
            # search ran every doubling to "not met", or "met" at 0 of 0 for a target 0)
            raise NoRequests(
                f"no requests were submitted in duration_s = "
                f"{empty[0].get('duration_s', 0):g} s (rates too low or the run too short): "
                "no cluster size can be judged by them")
    return plan



def _number(v: float) -> str:
    """``v`` as a ``--set`` value, every digit kept: the short form (``100``, ``2.5``) when
    it is exact, which keeps the points of earlier plans reusable; else the integer or
    Python's shortest exact form (``1234567``, ``0.1234567``)."""
    short = f"{v:g}"
    if float(short) == v:
        return short
    return str(int(v)) if float(v).is_integer() else repr(float(v))  # (an int: 3.11
    # has no int.is_integer)


def make_plan(scenario: str, sets: list[str], target: float, slo_ms: float | None,
              min_gpus: int, max_gpus: int, seeds: int) -> Plan:
    """Check the arguments against the scenario and set up the search."""
    from clockwork.resources import resolve_scenario
    from clockwork.scenario import ScenarioError, load_scenario

    if seeds > MAX_POINTS:  # (before the list of them is built)
        raise PlanError(f"--seeds {seeds}: at most {MAX_POINTS:,} seeds (each GPU count runs "
                        "one simulation per seed)")
    for o in sets:  # (the plan's own value came after it: it was ignored, and the
        key = o.partition("=")[0].strip()  # check command printed both)
        if key in ("cluster", "cluster.workers"):
            raise PlanError(f"--set {key}: the plan chooses cluster.workers itself (give "
                            "--min-gpus / --max-gpus)")
        if slo_ms is not None and _sets_slo_ms(o):  # (--slo-ms's override comes after
            # it and would replace it without a word)
            raise PlanError(f"--set {key}: a workload's slo_ms, which --slo-ms sets too; "
                            "give the SLO in one place (--slo-ms or --set)")
    try:
        path = resolve_scenario(scenario)
        sc = load_scenario(path, sets)
    except ScenarioError as e:
        raise PlanError(str(e)) from None
    sets = list(sets)
    if slo_ms is not None:
        for i, w in enumerate(sc.workloads):
            fixed = [k for k in w if k.startswith(("slo_factor", "slo_ms_", "slo_factor_"))]
            if fixed:
                raise PlanError(f"--slo-ms: workloads.{i} ({w.get('kind')}) sets its SLO with "
                                f"{fixed[0]}; leave out --slo-ms to plan with the scenario's "
                                "SLOs")
            sets.append(f"workloads.{i}.slo_ms={_number(slo_ms)}")
    g = int(sc.cluster["gpus_per_worker"])
    lo_w, hi_w = math.ceil(min_gpus / g), max_gpus // g
    if max_gpus < min_gpus:
        raise PlanError(f"--max-gpus {max_gpus} is below --min-gpus {min_gpus}")
    if hi_w < lo_w:
        raise PlanError(f"--min-gpus {min_gpus} .. --max-gpus {max_gpus} holds no multiple of "
                        f"the scenario's gpus_per_worker ({g})")
    if hi_w > MAX_WORKERS:
        raise PlanError(f"--max-gpus {max_gpus}: {hi_w:,} workers of {g} GPU(s), more than a "
                        f"cluster may have ({MAX_WORKERS:,} workers: cluster.workers)")
    for key in ("add_workers", "remove_workers"):  # (it chooses the workers at the start)
        if sc.data.get(key):
            raise PlanError(f"the scenario has [[{key}]] events: the plan chooses how many "
                            "workers serve the whole run (cluster.workers); remove them "
                            f"(--set {key}=[])")
    seed0 = sc.seed
    if seed0 + seeds - 1 > MAX_SEED:
        raise PlanError(f"--seeds {seeds}: the seeds {seed0} ... {seed0 + seeds - 1} pass the "
                        f"largest seed, {MAX_SEED:,} (2^63 - 1); give a smaller seed "
                        "(--set seed=S) or fewer seeds")
    # the overrides, seeds and the smallest and largest worker counts make a simulation:
    # a setting it refuses (a fault after the end, or naming a worker --min-gpus does not
    # have) is said here, before anything runs, not as a failure of the search
    why = {w: _simulation_error(path, [*sets, f"cluster.workers={w}",
                                       f"seed={seed0 + seeds - 1}"])
           for w in dict.fromkeys((lo_w, hi_w))}  # (one build where both are one count)
    if why[lo_w] is not None and why[lo_w] == why[hi_w]:  # (whatever the count)
        raise PlanError(why[lo_w])
    for w, given, fix in ((lo_w, f"--min-gpus {min_gpus}", "a larger --min-gpus"),
                          (hi_w, f"--max-gpus {max_gpus}", "a smaller --max-gpus")):
        if why[w] is not None:  # (and not at the other end: the count matters)
            raise PlanError(f"{given} ({w} worker(s) of {g} GPU(s)): {why[w]}; give {fix} "
                            "or change the scenario")
    plan = Plan(scenario, str(path), sets, [seed0 + i for i in range(seeds)], target, g,
                lo_w, hi_w, slo_ms)
    from controller import table_policy, unused_line

    line = unused_line(*table_policy(sc.scheduler))  # (as clockwork simulate says it)
    if line:
        plan.warnings.append(line)
    return plan


def _sets_slo_ms(override: str) -> bool:
    """Whether a ``--set`` override gives a workload's ``slo_ms``: ``workloads.I.slo_ms``,
    or a whole workload (``workloads.I``) or list of them (``workloads``) that has one."""
    from clockwork.scenario import ScenarioError, parse_value

    key, _, raw = override.partition("=")
    parts = key.strip().split(".")
    if parts[0] != "workloads" or len(parts) > 3:
        return False
    if len(parts) == 3:
        return parts[2] == "slo_ms"
    try:
        value = parse_value(raw.strip())
    except ScenarioError:  # (load_scenario says why)
        return False
    tables = [value] if len(parts) == 2 else value if isinstance(value, list) else []
    return any(isinstance(t, dict) and "slo_ms" in t for t in tables)


def _simulation_error(path: str | Path, sets: list[str]) -> str | None:
    """Why the scenario at ``path`` with ``sets`` cannot be simulated (it does not load,
    or the simulator refuses it, as ``clockwork simulate`` would: exit 2), in one line;
    None when it can. Building the simulation runs nothing (a few ms)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import ScenarioError, load_scenario

    try:
        Simulation(load_scenario(path, sets))
    except (ScenarioError, ValueError, OSError) as e:
        return str(e)
    return None


def format_curve(plan: Plan) -> str:
    head = ["GPUs", "workers", "meets", "attainment min", "mean", "goodput r/s", "cold starts",
            "p99 ms"]
    cells = [head]
    for r in plan.curve():
        mark = " <-" if plan.answer is not None and r["workers"] == plan.answer else ""
        cells.append([str(r["gpus"]), str(r["workers"]), "yes" if r["meets"] else "no",
                      f"{r['attainment_min']:.6f}", f"{r['attainment_mean']:.6f}",
                      f"{r['goodput_rps_mean']:,.1f}", f"{r['cold_starts_mean']:,.1f}",
                      ("n/a" if r["p99_ms_max"] is None else f"{r['p99_ms_max']:.2f}")
                      + mark])
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True))
                     for row in cells)


def answer_line(plan: Plan) -> str:
    g = plan.gpus_per_worker
    slo = f"SLO {_number(plan.slo_ms)} ms" if plan.slo_ms is not None else "the scenario's SLOs"
    want = (f"attainment >= {plan.target:g} with {slo} in every seed "
            f"({len(plan.seeds)} seed{'s' if len(plan.seeds) != 1 else ''})")
    if plan.answer is None:
        tried = sorted(w * g for w in plan.decided)
        return (f"not met: even {plan.max_workers * g} GPUs (--max-gpus) miss {want} "
                f"(tried {', '.join(map(str, tried))}; attainment need not grow with GPUs, "
                "so a size between may meet it)")
    n = plan.answer * g
    per = f" ({plan.answer} workers x {g} GPUs)" if g != 1 else ""
    if plan.answer == plan.min_workers:
        below = ("fewer is none" if plan.answer == 1 else
                 f"{n - g} GPUs are below --min-gpus, not checked")
    else:
        below = f"{n - g} GPUs do not"
    line = f"{n} GPUs{per} meet {want}; {below}"
    fewer = sorted(w * g for w, c in plan.counts.items()
                   if w < plan.answer and w not in plan.decided and c.ok and plan.meets(w))
    if fewer:  # (simulated ahead, off the search's path: said, not taken, so that the
        # answer does not depend on --jobs)
        line += (f" (note: {', '.join(map(str, fewer))} GPUs, simulated ahead, meet it "
                 "too: attainment does not grow steadily with GPUs here)")
    return line


def plot_curve(plan: Plan, path: Path) -> Path:
    import os

    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    curve = plan.curve()
    x = [r["gpus"] for r in curve]
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True)
    ax = axes[0]
    for r in curve:
        ax.scatter([r["gpus"]] * len(r["seeds"]), [s["slo_attainment"] for s in r["seeds"]],
                   s=12, color="0.6", zorder=2)
    ax.plot(x, [r["attainment_min"] for r in curve], marker="o", label="min over seeds",
            zorder=3)
    ax.axhline(plan.target, ls="--", color="tab:red", label=f"target {plan.target:g}")
    if plan.answer is not None:
        for a in axes:
            a.axvline(plan.answer * plan.gpus_per_worker, ls=":", color="tab:green")
    ax.set(ylabel="SLO attainment", title=f"clockwork plan {plan.scenario}: "
           + (f"{plan.answer * plan.gpus_per_worker} GPUs" if plan.answer else "not met"))
    ax.legend(loc="lower right", fontsize="small")
    axes[1].plot(x, [r["goodput_rps_mean"] for r in curve], marker="o", label="goodput")
    axes[1].set(xlabel="GPUs", ylabel="goodput (r/s, mean)")
    axes[1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for a in axes:
        a.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def cmd_plan(args: argparse.Namespace) -> int:
    def fail(msg: str) -> int:
        print(f"clockwork plan: {msg}", file=sys.stderr)
        return 2

    if (why := check_parts(args)) is not None:
        return fail(why)
    try:
        plan = make_plan(args.scenario, args.set, args.attainment, args.slo_ms, args.min_gpus,
                         args.max_gpus, args.seeds)
    except PlanError as e:
        return fail(str(e))
    out = Path(args.out) if args.out else None
    if out is None:
        return _run_plan(args, plan, None)
    if out.exists() and not out.is_dir():
        return fail(f"--out: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked(out):
            return _run_plan(args, plan, out)
    except FolderBusy as e:
        return fail(str(e))


def _run_plan(args: argparse.Namespace, plan: Plan, out: Path | None) -> int:
    jobs = args.jobs or default_jobs()
    k = max(1, jobs // len(plan.seeds))
    quiet = args.quiet
    for line in plan.warnings:  # (with --quiet too, as clockwork simulate says them)
        print(f"clockwork plan: {line}", file=sys.stderr)

    def log(line: str) -> None:
        if not quiet:
            print(f"plan: {line}", file=sys.stderr)

    log(f"{plan.scenario}: {plan.min_workers * plan.gpus_per_worker}.."
        f"{plan.max_workers * plan.gpus_per_worker} GPUs, {len(plan.seeds)} seed(s) "
        f"{plan.seeds}, target attainment {plan.target:g}; {k} count(s) per round, "
        + ("as many simulations at a time as the Ray cluster has CPUs" if args.backend == "ray"
           else f"{jobs} job(s)"))
    with term_as_ctrl_c():  # (as Ctrl-C: the simulations stopped, the temporary folder gone)
        tmp = None
        if out is None:
            tmp = tempfile.TemporaryDirectory(prefix="clockwork-plan-")
            root = Path(tmp.name)
        else:
            root = out
            for name in ("plan.json", "curve.tsv"):  # (an earlier plan's, until this one ends:
                # one stopped left them looking current; a folder there: its write says
                # so, after the search, as sweep's does)
                with contextlib.suppress(IsADirectoryError, PermissionError):
                    (out / name).unlink(missing_ok=True)
        try:
            with Runner(jobs, args.backend, progress=False if quiet else
                        (True if args.progress else None)) as runner:
                search(plan, runner, root, k, log)
        except (NoRequests, BackendUnavailable) as e:  # (the scenario's fault, found once
            # it ran, or a Ray cluster not connected to: exit 2)
            print(f"clockwork plan: {e}", file=sys.stderr)
            return 2
        except PlanError as e:
            return _failed(str(e))
        finally:
            if tmp is not None:
                tmp.cleanup()
    result = plan.result()
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(answer_line(plan))
        print(format_curve(plan))
        if plan.answer is not None:
            check = plan.counts[plan.answer].outcomes[0].point.command()
            print(f"check (first seed): {check}")
    sys.stdout.flush()  # (the answer first: files that cannot be written lose nothing else)
    unwritten = 0  # (1 once a file could not be written)
    if out is not None:
        from clockwork.telemetry import write_atomic

        cols = ["gpus", "workers", "meets", "attainment_min", "attainment_mean",
                "goodput_rps_mean", "cold_starts_mean", "p99_ms_max"]
        lines = ["\t".join(cols)] + ["\t".join(_tsv_cell(r[c]) for c in cols)
                                     for r in result["curve"]]
        try:
            write_atomic(out / "plan.json", result)
            write_atomic(out / "curve.tsv", ("\n".join(lines) + "\n").encode())
        except OSError as e:
            unwritten = _failed(f"cannot write {e.filename or out}: {e.strerror or e}")
    if args.plot:  # (after the answer: a plot that fails loses nothing else)
        try:
            png = plot_curve(plan, Path(args.plot))
        except Exception as e:  # noqa: BLE001 - matplotlib's errors are of many kinds
            first = (str(e).strip().splitlines() or [""])[0]
            return _failed(f"--plot {args.plot}: could not draw the curve "
                           f"({type(e).__name__}: {first})")
        log(f"wrote {png}")
    return unwritten or (0 if plan.answer is not None else 1)


def _tsv_cell(v: Any) -> str:
    """A curve.tsv field: booleans as JSON spells them, None (not available) empty."""
    if v is None:
        return ""
    return str(v).lower() if isinstance(v, bool) else str(v)


def _failed(msg: str) -> int:
    print(f"clockwork plan: {msg}", file=sys.stderr)
    return 1
