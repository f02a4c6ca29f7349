"""experiments/bench_repository_reads.py end to end at a tiny size (its figures are not
checked: timing belongs to the benchmark, not to a test)."""

from __future__ import annotations

import pytest

pytest.importorskip("tritonclient.http")


def test_bench_repository_reads_smoke(capsys):
    from experiments import bench_repository_reads

    res = bench_repository_reads.main(["--models", "2", "--copies", "3"])
    out = capsys.readouterr().out
    assert "7 instances served" in out, out
    assert {"list_models", "repository_index", "REST index", "GET /metrics",
            "REST statistics (all)"} <= set(res)
    assert all(len(rows) == 1 and rows[0][0] > 0 for rows in res.values())
