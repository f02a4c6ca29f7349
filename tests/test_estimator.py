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
