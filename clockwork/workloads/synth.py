"""Synthetic Azure-Functions-format traces, seeded, for tests, demos and scale runs.

``generate(functions, days, seed)`` returns one ``AzureTrace`` per day (``days_of`` yields
them one at a time) and ``write_synthetic(out_dir, ...)`` writes them as
``invocations_per_function_md.anon.dNN.csv`` in exactly the dataset's format, so the reader
and the replay cannot tell them apart from the real files. Everything is drawn from one
``numpy.random.Generator(seed)``: the same arguments give byte-identical files.
``write_synthetic`` writes each day as soon as it is made, so its memory is one day's
whatever ``days`` is (measured at 40,000 functions: ~500 MB peak for one day, ~0.7 GB
for two to four). ``functions`` is
at most ``MAX_FUNCTIONS`` (100,000, about twice a real day's ~46,000: ~1.2 GB while a day is
made, ~300 MB of CSV a day).

The statistics follow Shahrad et al., "Serverless in the Wild: Characterizing and
Optimizing the Serverless Workload at a Large Cloud Provider" (USENIX ATC 2020), the paper
that released the dataset. Where it gives no number we say what we assumed.

Functions and triggers (paper)
    Share of functions by trigger: ``TRIGGER_SHARE`` = http 55 %, queue 15 %, event 2 %,
    timer 16 %, orchestration 7 %, others 5 %. The paper's share of *invocations*
    (http 36 %, queue 34 %, event 25 %, timer 2 %, orchestration 2 %, others 1 %) was the
    target when choosing the per-trigger rate distributions below; it is dominated by the
    few busiest functions, so a single day only lands near it: over seeds 0-3 of a
    40,000-function day, http 34-50 %, queue 22-44 %, event 11-42 %, timer ~1 %,
    orchestration and others < 0.5 % each (``experiments/bench_trace_load.py`` prints a
    seed's figures).

Daily invocation counts of non-timer functions (the documented target distribution)
    ``X ~ Normal(mu_g, sigma_g)`` on log10 scale, per trigger ``g`` (``LOG10_DAILY``), and
    the day's count is ``N = min(DAILY_CAP, max(1, round(10**X)))``. So for
    ``1 <= k < DAILY_CAP``: ``P(N <= k) = Phi((log10(k + 0.5) - mu_g) / sigma_g)``
    (``daily_count_cdf``). Calibration: the paper reports that 45 % of applications are
    invoked at most once an hour and 81 % at most once a minute on average, and that rates
    span about 8 orders of magnitude. With the timers below, a 40,000-function day has
    ~42 % of functions at <= 24 a day, ~82 % at <= 1440 a day, and daily counts from 1 to
    10**8 - 3 * 10**8 (``DAILY_CAP``). (Assumption: the per-app figures are used per
    function.)
    A function keeps a base level over days: ``X_day = B + E_day`` with
    ``B ~ Normal(mu_g, sqrt(sigma_g**2 - DAY_SIGMA**2))`` and ``E_day ~ Normal(0,
    DAY_SIGMA)``, so each day's marginal is exactly the target.

Timer functions (paper: timer-triggered functions are periodic; the periods are assumed)
    A timer fires every ``p`` seconds, ``p`` from ``TIMER_PERIODS_S`` with
    ``TIMER_WEIGHTS`` (assumption shaped like NCRONTAB schedules in practice: sub-minute
    and 1/5/10/15/30/60-minute schedules are the common ones). ``p < 60`` gives
    ``60 // p`` invocations every minute; ``p >= 60`` gives one invocation every
    ``p / 60`` minutes from a random offset. Exactly periodic, same schedule every day.

Minute-by-minute shape of non-timer functions
    Diurnal: weight ``1 + A cos(2 pi (t - peak) / 1440)`` with ``A ~ U(DIURNAL_AMP)`` and
    ``peak ~ Normal(DIURNAL_PEAK_MIN, DIURNAL_PEAK_SD)`` minutes (the paper's aggregate
    load has a daily cycle; amplitude and phase are assumptions).
    Bursty: a ``BURSTY_SHARE`` of functions with at least ``BURSTY_MIN_DAILY`` daily
    invocations get ``1 + Poisson(BURST_EPISODES)`` episodes of ``BURST_MINUTES`` minutes
    during which their weight is multiplied by ``U(BURST_GAIN)`` (assumption, for the
    paper's observation that many functions' inter-arrival times are highly variable).
    The day's ``N`` invocations are spread over minutes by a multinomial draw with those
    weights, so each row sums exactly to ``N``.

Applications and owners
    Functions per app (paper): 1 -> 54 %, 2 -> 16 %, 3 -> 10 %, 4-5 -> 8 %, 6-10 -> 7 %,
    11+ -> 5 % (``APP_SIZES``); within a bucket sizes are uniform, and 11+ is
    ``11 + Geometric(1/15) - 1`` capped at 300 (assumption). Apps per owner
    ``Geometric(OWNER_APPS_P)`` (>= 1, mean 1.7; assumption). Triggers are drawn independently
    per function. Ids are 64 hex characters of seeded random bytes, like the dataset's
    HMAC-SHA256 ids. Rows are sorted by (owner, app, function), like the dataset.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from clockwork.workloads.azure import MINUTES, AzureTrace, trace_file_name

TRIGGER_SHARE: dict[str, float] = {
    "http": 0.55, "queue": 0.15, "event": 0.02, "timer": 0.16, "orchestration": 0.07,
    "others": 0.05,
}
#: paper's share of invocations by trigger (a calibration target, not enforced)
INVOCATION_SHARE: dict[str, float] = {
    "http": 0.36, "queue": 0.34, "event": 0.25, "timer": 0.02, "orchestration": 0.02,
    "others": 0.01,
}
#: log10 daily count ~ Normal(mu, sigma), per non-timer trigger
LOG10_DAILY: dict[str, tuple[float, float]] = {
    "http": (1.55, 1.6),
    "queue": (1.9, 1.7),
    "event": (3.2, 1.6),
    "orchestration": (1.3, 1.3),
    "others": (1.2, 1.3),
}
DAILY_CAP = 300_000_000
DAY_SIGMA = 0.15
TIMER_PERIODS_S = (5, 10, 15, 30, 60, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
TIMER_WEIGHTS = (0.08, 0.08, 0.04, 0.08, 0.14, 0.14, 0.08, 0.06, 0.06, 0.12, 0.03, 0.03,
                 0.02, 0.04)
DIURNAL_AMP = (0.1, 0.6)
DIURNAL_PEAK_MIN = 840.0
DIURNAL_PEAK_SD = 120.0
BURSTY_SHARE = 0.10
BURSTY_MIN_DAILY = 60
BURST_EPISODES = 1.5
BURST_MINUTES = (5, 60)
BURST_GAIN = (5.0, 40.0)
#: functions per app: (low, high) inclusive bucket -> share
APP_SIZES: dict[tuple[int, int], float] = {
    (1, 1): 0.54, (2, 2): 0.16, (3, 3): 0.10, (4, 5): 0.08, (6, 10): 0.07, (11, 300): 0.05,
}
OWNER_APPS_P = 0.6

_BLOCK = 2048
#: the most functions (rows) a synthetic day may have (a real day has ~46,000)
MAX_FUNCTIONS = 100_000
MAX_DAYS = 366  # day files a synthetic trace has at most (the real dataset has 14)


def daily_count_cdf(k: np.ndarray | float, trigger: str) -> np.ndarray:
    """Target ``P(N <= k)`` of a non-timer function's daily count (``1 <= k``)."""
    mu, sigma = LOG10_DAILY[trigger]
    k = np.asarray(k, dtype=np.float64)
    z = (np.log10(k + 0.5) - mu) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + np.vectorize(math.erf, otypes=[float])(z))
    return np.where(k >= DAILY_CAP, 1.0, cdf)


def _hex_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    h = rng.bytes(32 * n).hex()
    return np.array([h[64 * i:64 * (i + 1)] for i in range(n)], dtype="<U64")


def _app_sizes(rng: np.random.Generator, n: int) -> list[int]:
    buckets = list(APP_SIZES)
    p = np.array(list(APP_SIZES.values()))
    sizes: list[int] = []
    total = 0
    while total < n:
        m = max(16, (n - total) // 2)
        which = rng.choice(len(buckets), size=m, p=p / p.sum())
        lo = np.array([buckets[w][0] for w in which])
        hi = np.array([buckets[w][1] for w in which])
        big = hi > 10
        s = rng.integers(lo, hi + 1)
        s[big] = np.minimum(lo[big] + rng.geometric(1 / 15, big.sum()) - 1, hi[big])
        for v in s.tolist():
            if total >= n:
                break
            v = min(v, n - total)
            sizes.append(v)
            total += v
    return sizes


def _identities(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    app_sizes = _app_sizes(rng, n)
    n_apps = len(app_sizes)
    owner_sizes: list[int] = []
    left = n_apps
    while left > 0:
        k = min(int(rng.geometric(OWNER_APPS_P)), left)
        owner_sizes.append(k)
        left -= k
    owner_ids = _hex_ids(rng, len(owner_sizes))
    app_ids = _hex_ids(rng, n_apps)
    owners_of_app = np.repeat(owner_ids, owner_sizes)
    owners = np.repeat(owners_of_app, app_sizes)
    apps = np.repeat(app_ids, app_sizes)
    funcs = _hex_ids(rng, n)
    return owners, apps, funcs


def _minute_weights(rng: np.random.Generator, amp: np.ndarray, peak: np.ndarray,
                    bursty: np.ndarray) -> np.ndarray:
    t = np.arange(MINUTES, dtype=np.float64)
    w = 1.0 + amp[:, None] * np.cos(2 * np.pi * (t[None, :] - peak[:, None]) / MINUTES)
    for i in np.flatnonzero(bursty).tolist():
        for _ in range(1 + int(rng.poisson(BURST_EPISODES))):
            length = int(rng.integers(BURST_MINUTES[0], BURST_MINUTES[1] + 1))
            s = int(rng.integers(0, MINUTES - length + 1))
            w[i, s:s + length] *= rng.uniform(*BURST_GAIN)
    return w / w.sum(axis=1, keepdims=True)


def _timer_rows(period_s: np.ndarray, offset: np.ndarray) -> np.ndarray:
    out = np.zeros((len(period_s), MINUTES), np.uint32)
    t = np.arange(MINUTES)
    for i, (p, o) in enumerate(zip(period_s.tolist(), offset.tolist(), strict=True)):
        if p < 60:
            out[i] = 60 // p
        else:
            k = p // 60
            out[i] = ((t - o) % k == 0).astype(np.uint32)
    return out


def generate(functions: int, days: int = 1, seed: int = 0) -> list[AzureTrace]:
    """``days`` synthetic day traces of ``functions`` functions each (same functions)."""
    return list(days_of(functions, days, seed))


def check_size(functions: int, days: int) -> None:
    """ValueError unless 1 <= functions <= MAX_FUNCTIONS and 1 <= days <= MAX_DAYS."""
    if functions < 1:
        raise ValueError(f"functions must be >= 1, got {functions}")
    if functions > MAX_FUNCTIONS:
        raise ValueError(f"functions must be at most {MAX_FUNCTIONS:,} (a real day has "
                         f"~46,000), got {functions:,}")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if days > MAX_DAYS:
        raise ValueError(f"days must be at most {MAX_DAYS} (the real trace has 14), got "
                         f"{days:,}")


def days_of(functions: int, days: int = 1, seed: int = 0) -> Iterator[AzureTrace]:
    """``generate``'s days one at a time: each is made when it is asked for (the same
    traces, drawn in the same order)."""
    check_size(functions, days)
    return _days(functions, days, seed)


def _days(functions: int, days: int, seed: int) -> Iterator[AzureTrace]:
    rng = np.random.default_rng(seed)
    n = int(functions)
    names = list(TRIGGER_SHARE)
    share = np.array([TRIGGER_SHARE[t] for t in names])
    trig_idx = rng.choice(len(names), size=n, p=share / share.sum())
    triggers = np.array(names, dtype="<U16")[trig_idx]
    owners, apps, funcs = _identities(rng, n)

    is_timer = triggers == "timer"
    mu = np.zeros(n)
    sigma = np.ones(n)
    for t, (m, s) in LOG10_DAILY.items():
        sel = triggers == t
        mu[sel], sigma[sel] = m, s
    base = rng.normal(mu, np.sqrt(np.maximum(sigma**2 - DAY_SIGMA**2, 0.0)))
    amp = rng.uniform(*DIURNAL_AMP, size=n)
    peak = rng.normal(DIURNAL_PEAK_MIN, DIURNAL_PEAK_SD, size=n) % MINUTES
    bursty_pick = rng.random(n) < BURSTY_SHARE
    tw = np.array(TIMER_WEIGHTS)
    periods = np.array(TIMER_PERIODS_S)[rng.choice(len(TIMER_PERIODS_S), size=n, p=tw / tw.sum())]
    offsets = rng.integers(0, np.maximum(periods // 60, 1))
    timer_counts = _timer_rows(periods[is_timer], offsets[is_timer])

    order = np.lexsort((funcs, apps, owners))
    where = np.empty_like(order)  # each function's row in the sorted day
    where[order] = np.arange(n)
    timer_rows = where[is_timer]
    for day in range(days):
        x = base + rng.normal(0.0, DAY_SIGMA, size=n)
        daily = np.minimum(np.maximum(np.rint(10.0**np.minimum(x, 12.0)), 1), DAILY_CAP)
        daily = daily.astype(np.int64)
        daily[is_timer] = 0  # timers follow their schedule instead
        bursty = bursty_pick & (daily >= BURSTY_MIN_DAILY) & ~is_timer
        counts = np.empty((n, MINUTES), np.uint32)  # sorted rows (no second copy)
        for lo in range(0, n, _BLOCK):
            hi = min(lo + _BLOCK, n)
            w = _minute_weights(rng, amp[lo:hi], peak[lo:hi], bursty[lo:hi])
            counts[where[lo:hi]] = rng.multinomial(daily[lo:hi], w)
            del w
        counts[timer_rows] = timer_counts
        yield AzureTrace(owners[order], apps[order], funcs[order], triggers[order],
                         counts, 0, f"synthetic(seed={seed}, day={day + 1})")
        del counts


def write_synthetic(out_dir: str | Path, functions: int, days: int = 1, seed: int = 0,
                    gzip: bool = False, written=None, replace: bool = False) -> list[Path]:
    """Generate and write ``invocations_per_function_md.anon.d01.csv`` ... into ``out_dir``
    (``.csv.gz`` with ``gzip``), each day as soon as it is made (one day in memory);
    ``written(path)``, if given, is called as each is. A file of one of those days
    already there, in any form (either name form of the dataset, ``.csv`` or ``.csv.gz``:
    a real day's too), raises ``DaysExist`` naming them before anything is made,
    unless ``replace``: then each day's files are replaced by the new one. The days'
    files are written whole (a day cut short by a Ctrl-C is never left)."""
    days_iter = days_of(functions, days, seed)  # (checks the sizes before anything is made)
    out = Path(out_dir)
    there = existing_days(out, days)
    if there and not replace:
        shown = ", ".join(p.name for p in there[:3]) + (f" and {len(there) - 3} more"
                                                         if len(there) > 3 else "")
        raise DaysExist(errno.EEXIST, f"{out} holds {len(there)} of these days' files "
                        f"already ({shown})", str(out))
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gzip else ""
    paths = []
    for d, tr in enumerate(days_iter):
        path = out / (trace_file_name(d + 1) + suffix)
        # the day's files in the other forms go: left, they made the day ambiguous to the
        # replay (which refuses a day found twice)
        for old in existing_days(out, d + 1, first=d + 1):
            if old != path:
                old.unlink()
        paths.append(tr.save(path))
        del tr
        if written is not None:
            written(paths[-1])
    return paths


class DaysExist(FileExistsError):
    """``write_synthetic`` without ``replace``: the folder holds files of those days."""


def existing_days(out: Path, days: int, first: int = 1) -> list[Path]:
    """The files of days ``first`` .. ``days`` in ``out``, in any form (both name forms,
    ``.csv`` or ``.csv.gz``)."""
    return [p for d in range(first, days + 1) for svls in (False, True)
            for suffix in ("", ".gz")
            if (p := out / (trace_file_name(d, svls) + suffix)).is_file()]
