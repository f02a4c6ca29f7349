"""experiments/bench_reconnect.py end to end with a short outage (its figure is not
checked: timing belongs to the benchmark, not to a test)."""

from __future__ import annotations


def test_bench_reconnect_smoke(capsys):
    from experiments import bench_reconnect

    took = bench_reconnect.main(["--down", "1"])
    assert took is not None and "the client's first success" in capsys.readouterr().out
