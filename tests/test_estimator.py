"""The estimator's window: the p percentile of the last measurements, by nearest rank (the
smallest value with at least p of them at or below it)."""

from __future__ import annotations

import pytest

from controller.estimator import SlidingWindow


@pytest.mark.parametrize("n, p, rank", [
    (10, 0.99, 10),   # Clockwork's default: the largest of 10
    (100, 0.99, 99),  # (int(p n) gave the 100th, the largest)
    (20, 0.95, 19),
    (10, 0.5, 5),
    (7, 0.5, 4),
    (5, 1.0, 5),
    (5, 0.01, 1),
])
def test_percentile_is_the_nearest_rank(n, p, rank):
    w = SlidingWindow(size=n)
    values = [1000 * (k + 1) for k in range(n)]
    got = None
    for v in reversed(values):  # (inserted out of order: the window sorts them)
        got = w.push(v, p)
    assert got == w.percentile(p) == values[rank - 1]


def test_the_window_keeps_the_last_size_measurements():
    w = SlidingWindow(size=3)
    for v in (5, 1, 9, 7):
        w.insert(v)
    assert len(w) == 3 and w.percentile(1.0) == 9 and w.percentile(0.01) == 1


def test_a_batch_size_a_straggler_locked_out_comes_back_once_stale():
    """One straggler at batch size 2 made that size look too slow for every batch, so it
    never ran again and nothing measured it: the model ran at batch 1 for good, short of
    the rate it was offered (half load on one GPU: 39 % attainment in a 10 s run). Once
    the size's figure is ``estimate_stale`` old (and others are measured meanwhile), it
    is its window's median (here the profile's); one measured since is kept."""
    from clockwork.profiles import ModelProfile
    from controller.estimator import Estimator

    prof = ModelProfile(model="m", device="t", weights_bytes=1, load_ns=1,
                        exec_ns={1: 100, 2: 150, 4: 200})
    e = Estimator(prof, stale=1_000)
    e.add_exec(2, 3_000, now=10)  # the straggler
    e.add_exec(4, 250, now=20)  # (4 inflated too, but measured lately)
    v = e.version
    e.add_exec(1, 100, now=900)
    assert e.exec(2) == 3_000 and e.version == v  # (not stale yet)
    e.add_exec(4, 250, now=1_500)
    e.add_exec(1, 100, now=1_900)  # (the look: at most once per stale)
    assert (e.exec(1), e.exec(2), e.exec(4)) == (100, 150, 250) and e.version > v
    assert e.inflated  # (4's figure is still above the profile's)
    assert Estimator(prof).stale is None  # (no aging unless asked)
    # a live worker's sizes take more than the profile says: aged, a size keeps what it
    # usually took (the median of its window), the straggler left out
    e = Estimator(prof, stale=1_000)
    for d in (130, 130, 130, 3_000):
        e.add_exec(2, d, now=10)
    e.add_exec(1, 100, now=2_000)
    assert e.exec(2) == 130
