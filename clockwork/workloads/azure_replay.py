"""Clockwork's ``azure`` workload: replay Azure Functions invocation counts onto model
instances.

Each trace function is mapped to one model instance. Functions are ranked by their
whole-day invocation total (busiest first) and either cut into contiguous buckets over the
selected instances (``mapping = "contiguous"``, as Clockwork does: rank ``r`` of ``F``
functions goes to instance ``r * M // F``), or dealt round-robin (``"stripe"``: rank ``r``
goes to instance ``r % M``).

Trace minute ``start_minute + m`` becomes the run interval
``[start + m * interval, start + (m + 1) * interval)``, ``interval = interval_s`` seconds
(60 replays in real time; smaller compresses the trace). With ``randomise_start`` the
replay begins at a random point of the first trace minute (the part before it is skipped),
so runs do not all start on a minute boundary. Rates are ``count * load_factor``.

Arrivals inside a minute, per function with count ``c`` (``lam = c * load_factor``):

``poisson`` (default)
    ``Poisson(lam)`` arrivals at independent uniform times in the minute: a Poisson
    process of rate ``lam`` per minute.
``uniform``
    Exactly ``lam`` arrivals (fractions carried to the function's next minute, so with
    ``load_factor = 1`` every minute matches the trace exactly), evenly spaced with a fixed
    random phase per function.
``gamma``
    A renewal process with gamma inter-arrival times of coefficient of variation ``cv``
    (AlpaServe's bursty arrivals) and mean ``1 / lam`` minutes. The process runs in
    "operational time" (expected arrivals), so it carries over minute boundaries and
    rate changes; it starts in equilibrium.

Arrivals are produced lazily, one trace minute at a time (all functions merged and sorted
by time), and stop at the workload's end and at the end of the selected minutes. A minute
is drawn whole even when the run ends inside it, so ``bind`` refuses, before any is drawn,
a replay whose minutes the run reaches would draw more than
``clockwork.sizes.MAX_MINUTE_ARRIVALS`` in one minute or ``MAX_OFFERED_REQUESTS`` in all.
``interval_s`` is at least a microsecond and ``cv`` in [0.01, 100].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clockwork.settings import count_text
from clockwork.sizes import MAX_MINUTE_ARRIVALS, MAX_OFFERED_REQUESTS
from clockwork.workloads.azure import MINUTES, AzureTrace, find_trace_file, resolve_trace_path
from clockwork.workloads.base import Arrival, Params, SloSpec, Workload, WorkloadError

MAPPINGS = ("contiguous", "stripe")
ARRIVALS = ("poisson", "uniform", "gamma")
MIN_INTERVAL_S = 1e-6  # a trace minute's run time: at least a microsecond (0 ns drew nothing)
CV_RANGE = (0.01, 100.0)  # gamma arrivals' coefficient of variation (1e-300: 1 / cv**2 failed)
AZURE_KEYS = {"kind", "models", "slo_ms", "slo_factor", "trace", "day", "trace_dir",
              "start_minute", "minutes", "interval_s", "load_factor", "mapping",
              "randomise_start", "arrivals", "cv", "top"}


def map_functions(n_functions: int, n_instances: int, mapping: str) -> np.ndarray:
    """Instance index of each function rank (rank 0 = busiest)."""
    r = np.arange(n_functions, dtype=np.int64)
    if mapping == "contiguous":
        return r * n_instances // max(n_functions, 1)
    if mapping == "stripe":
        return r % n_instances
    raise WorkloadError(f"unknown mapping {mapping!r} (choose from {', '.join(MAPPINGS)})")


class AzureReplay(Workload):
    """Replay a window of an ``AzureTrace`` onto ``models`` (instance names)."""

    kind = "azure"

    def __init__(self, models: Sequence[str], trace: AzureTrace, start_minute: int = 0,
                 minutes: int | None = None, interval_s: float = 60.0,
                 load_factor: float = 1.0, mapping: str = "contiguous",
                 randomise_start: bool = False, arrivals: str = "poisson",
                 cv: float | None = None, slo: SloSpec | None = None,
                 top: int | None = None) -> None:
        super().__init__()
        if not models:
            raise WorkloadError("azure workload selects no model instances")
        if not interval_s >= MIN_INTERVAL_S:
            raise WorkloadError(f"interval_s must be at least {MIN_INTERVAL_S:g} (a "
                                f"microsecond), got {interval_s:g}")
        if not load_factor > 0:
            raise WorkloadError(f"load_factor must be > 0, got {load_factor}")
        if arrivals not in ARRIVALS:
            raise WorkloadError(f"unknown arrivals {arrivals!r} (choose from {', '.join(ARRIVALS)})")
        if cv is not None and arrivals != "gamma":
            raise WorkloadError("cv applies only to arrivals = \"gamma\"")
        cv = 1.0 if cv is None else float(cv)
        if not CV_RANGE[0] <= cv <= CV_RANGE[1]:
            raise WorkloadError(f"cv must be in [{CV_RANGE[0]:g}, {CV_RANGE[1]:g}], got {cv:g}")
        if not isinstance(randomise_start, bool):
            raise WorkloadError(f"randomise_start must be true or false, got {randomise_start!r}")
        if top is not None and (not isinstance(top, int) or top < 1):
            raise WorkloadError(f"top must be an integer >= 1, got {top!r}")
        self.models = list(models)
        self.trace_source = trace.source
        order = trace.rank_order()  # whole-day (all minutes held) ranking, busiest first
        # what the run does otherwise than its settings may lead one to think: said before
        # it (``clockwork simulate``'s warnings)
        self.notes: list[str] = []
        if top is not None and top > len(order):
            self.notes.append(f"top = {top:,}, but the trace holds {len(order):,} "
                              "function(s): every one is replayed")
        if top is not None:
            order = order[:top]
        repeated = trace.repeated_ids(order if top is not None else None)
        if repeated:
            self.notes.append(f"{repeated:,} of the trace's rows replayed repeat the owner, "
                              "app, function and trigger of a row before them (files "
                              "joined, or an extract cut wrong?): each row is replayed as a "
                              "function of its own")
        inst = map_functions(len(order), len(self.models), mapping)
        try:
            win = trace.window(int(start_minute), None if minutes is None else int(minutes))
        except ValueError as e:
            raise WorkloadError(str(e)) from None
        counts = win.counts[order]
        active = counts.any(axis=1)
        self.counts = np.ascontiguousarray(counts[active])
        self.instance_of = inst[active]
        self.functions = int(len(order))
        self.start_minute = int(start_minute)
        self.minutes = int(win.n_minutes)
        self.interval = round(float(interval_s) * 1e9)
        self.load_factor = float(load_factor)
        self.mapping = mapping
        self.randomise_start = randomise_start
        self.arrivals = arrivals
        self.cv = cv
        self.slo = slo or SloSpec()
        self._buf: list[Arrival] = []
        self._minute = 0
        self._done = False

    # ---------------------------------------------------------------- facts

    @property
    def total_invocations(self) -> int:
        """Trace invocations in the selected window (before ``load_factor``)."""
        return int(self.counts.sum(dtype=np.uint64))

    def mean_rate_rps(self) -> float:
        """Offered rate over the window: invocations x load_factor per second of run."""
        return self.total_invocations * self.load_factor / (self.minutes * self.interval / 1e9)

    # ---------------------------------------------------------------- driving

    def bind(self, start, end, rng, exec1) -> None:
        super().bind(start, end, rng, exec1)
        self._slos = [self.slo.resolve(m, exec1) for m in self.models]
        n = len(self.counts)
        self._offset = int(rng.integers(0, self.interval)) if self.randomise_start else 0
        self._minute = 0
        self._done = False
        self._buf = []
        if self.arrivals == "uniform":
            self._carry = np.zeros(n)
            self._phase = rng.random(n)
        elif self.arrivals == "gamma":
            k = 1.0 / self.cv**2
            # equilibrium forward-recurrence time: U * size-biased gap, Gamma(k + 1, 1/k)
            self._resid = rng.random(n) * rng.gamma(k + 1.0, 1.0 / k, n)
        self._check_draws()

    def _draw_factor(self, m: int) -> float:
        """The load factor trace minute ``m``'s arrivals are drawn at."""
        return self.load_factor

    def arrivals_end(self) -> int | None:
        """Where its trace minutes end (ns, after ``bind``) when that is before the run's
        end (its arrivals stop there, the run goes on), else None. (A ``randomise_start``
        offset, which ends them up to one interval early by design, is not counted.)"""
        t = self.start + self.minutes * self.interval
        return t if t < self.end else None

    def _check_draws(self) -> None:
        """Refuse a replay that would draw more than ``MAX_MINUTE_ARRIVALS`` for one trace
        minute (drawn, sorted and held at once), or more than ``MAX_OFFERED_REQUESTS`` in
        all: every trace minute the run reaches counts whole, as ``_refill`` draws it (for
        gamma arrivals, the gaps ``_gamma_positions`` draws), before any is drawn."""
        end = min(self.end, self.start + self.minutes * self.interval - self._offset)
        reached = min(self.minutes, max(0, -(-(end - self.start + self._offset)
                                            // self.interval)))
        if not reached:
            return
        factors = np.array([self._draw_factor(m) for m in range(reached)])
        invocations = self.counts[:, :reached].sum(axis=0, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.arrivals == "gamma":
                draws = np.empty(reached)
                for m in range(reached):
                    col = self.counts[:, m]
                    lam = col[col > 0].astype(np.float64) * factors[m]
                    draws[m] = np.ceil(lam + 6.0 * self.cv * np.sqrt(lam) + 6.0).sum()
            else:
                draws = invocations * factors
        what = "gamma gaps" if self.arrivals == "gamma" else "arrivals"
        over = np.flatnonzero(~(draws <= MAX_MINUTE_ARRIVALS))
        if over.size:
            m = int(over[0])
            raise WorkloadError(
                f"{self.kind} workload: trace minute {self.start_minute + m} draws "
                f"{count_text(float(draws[m]))} {what} ({invocations[m]:,.0f} invocations x "
                f"load_factor {factors[m]:g}; a trace minute is drawn whole, even when the "
                f"run ends inside it), more than the {MAX_MINUTE_ARRIVALS:,} one trace minute "
                "may hold")
        total = float(draws.sum())
        if not total <= MAX_OFFERED_REQUESTS:
            first = self.start_minute
            raise WorkloadError(
                f"{self.kind} workload: trace minutes {first}-{first + reached - 1} draw "
                f"{count_text(total)} {what} (whole minutes, at load_factor up to "
                f"{factors.max():g}), more than a run may offer ({MAX_OFFERED_REQUESTS:,})")

    def _minute_arrivals(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Arrival times (ns, unsorted) and function rows for trace minute ``m``."""
        col = self.counts[:, m]
        nz = np.flatnonzero(col)
        lam = col[nz].astype(np.float64) * self.load_factor
        t0 = self.start + m * self.interval - self._offset
        width = float(self.interval)
        rng = self.rng
        if self.arrivals == "poisson":
            n = rng.poisson(lam)
            rows = np.repeat(nz, n)
            times = t0 + rng.random(rows.size) * width
        elif self.arrivals == "uniform":
            x = self._carry[nz] + lam
            n = np.floor(x + 1e-9).astype(np.int64)
            self._carry[nz] = x - n
            rows = np.repeat(nz, n)
            first = np.cumsum(n) - n
            k = np.arange(rows.size) - np.repeat(first, n)
            times = t0 + (k + self._phase[rows]) * (width / np.repeat(n, n))
        else:
            pos, idx = self._gamma_positions(nz, lam)
            rows = nz[idx]
            times = t0 + pos / lam[idx] * width
        return times.astype(np.int64), rows

    def _gamma_positions(self, nz: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Operational-time positions (< lam) of this minute's arrivals, per active row."""
        k = 1.0 / self.cv**2
        rng = self.rng
        r = self._resid[nz]
        nd = np.ceil(lam + 6.0 * self.cv * np.sqrt(lam) + 6.0).astype(np.int64)
        gaps = rng.gamma(k, 1.0 / k, int(nd.sum()))
        seg = np.repeat(np.arange(len(nz)), nd)
        cs = np.cumsum(gaps)
        before = (cs - gaps)[np.cumsum(nd) - nd]
        pos_after = r[seg] + cs - before[seg]          # positions p_1 .. p_nd
        pos = np.concatenate([r, pos_after])
        idx = np.concatenate([np.arange(len(nz)), seg])
        keep = pos < lam[idx]
        kept = np.bincount(idx[keep], minlength=len(nz))
        # residual = first position at or beyond lam, minus lam
        first_out = np.where(kept == 0, r, 0.0)
        later = kept > 0
        if later.any():
            j = np.flatnonzero(later)
            slot = (np.cumsum(nd) - nd)[j] + kept[j] - 1   # p_kept in pos_after
            ok = kept[j] - 1 < nd[j]
            first_out[j[ok]] = pos_after[slot[ok]]
        pos, idx = pos[keep], idx[keep]
        short = np.flatnonzero(kept == nd + 1)
        if short.size:  # ran out of drawn gaps (rare): continue those rows one by one
            seg_end = np.cumsum(nd)
            extra_p, extra_i = [], []
            for i in short.tolist():
                p = float(pos_after[seg_end[i] - 1])
                while True:
                    p += float(rng.gamma(k, 1.0 / k))
                    if p >= lam[i]:
                        break
                    extra_p.append(p)
                    extra_i.append(i)
                first_out[i] = p
            pos = np.concatenate([pos, np.array(extra_p)])
            idx = np.concatenate([idx, np.array(extra_i, dtype=np.int64)])
        self._resid[nz] = first_out - lam
        return pos, idx

    def _refill(self) -> None:
        end = min(self.end, self.start + self.minutes * self.interval - self._offset)
        models, slos, inst = self.models, self._slos, self.instance_of
        while not self._done:
            m = self._minute
            t0 = self.start + m * self.interval - self._offset
            if m >= self.minutes or t0 >= end:
                self._done = True
                break
            self._minute += 1
            times, rows = self._minute_arrivals(m)
            keep = (times >= self.start) & (times < end)
            times, rows = times[keep], rows[keep]
            if not times.size:
                continue
            o = np.argsort(times, kind="stable")
            ii = inst[rows[o]].tolist()
            buf = [(t, models[i], slos[i]) for t, i in zip(times[o].tolist(), ii, strict=True)]
            buf.reverse()
            self._buf = buf
            return

    def next_arrival(self) -> Arrival | None:
        if not self._buf:
            self._refill()
            if not self._buf:
                return None
        return self._buf.pop()


# ---------------------------------------------------------------- scenario entry

_CACHE: dict[tuple, AzureTrace] = {}


def load_cached(path: Path) -> AzureTrace:
    """Load a trace file, reusing the last few loads of unchanged files."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    tr = _CACHE.get(key)
    if tr is None:
        tr = AzureTrace.load(path)
        while len(_CACHE) >= 2:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = tr
    if tr.source != str(path):  # the same file reached by another path (another cwd)
        tr = dataclasses.replace(tr, source=str(path))
    return tr


def build_azure(spec: dict, models: list[str]) -> AzureReplay:
    """The ``azure`` scenario entry (keys: ``AZURE_KEYS``)."""
    if ("trace" in spec) == ("day" in spec):
        raise WorkloadError("azure workload needs exactly one of trace (a file) or day "
                            "(a number, looked up in trace_dir, $AZURE_TRACE_DIR, then "
                            "traces/azure)")
    if "trace" in spec:
        if "trace_dir" in spec:  # (it was ignored: the file was looked up without it)
            raise WorkloadError("trace_dir goes with day (the folder day files are looked "
                                "up in); with trace, give the file's path itself")
        path = resolve_trace_path(spec["trace"])
    else:
        path = find_trace_file(spec["day"], spec.get("trace_dir"))
    p = Params(spec)  # (types as strict as every other kind's: true is not a number)
    start = p.integer("start_minute", 0)
    minutes = p.integer("minutes", 0) if "minutes" in spec else None
    if not 0 <= start < MINUTES:
        raise WorkloadError(f"start_minute must be in [0, {MINUTES}), got {start}")
    tr = load_cached(path)
    if tr.n_functions == 0:  # (else the run said its rates were too low or it too short)
        raise WorkloadError(f"trace {path} has no functions: its header only, no rows")
    return AzureReplay(
        models, tr, start, minutes,
        interval_s=p.num("interval_s", 60.0), load_factor=p.num("load_factor", 1.0),
        mapping=p.string("mapping", "contiguous"),
        randomise_start=p.flag("randomise_start", False),
        arrivals=p.string("arrivals", "poisson"), cv=p.opt_num("cv"), slo=p.slo(),
        top=p.integer("top", 0) if "top" in spec else None)

