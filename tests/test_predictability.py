"""Smoke test of experiments/predictability.py: a few dozen real batch-1 EXECs of one
small zoo model on the cpu device, and the files it writes. Skipped without TVM."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tvm")
pytest.importorskip("matplotlib")

from experiments import common, predictability  # noqa: E402

KEYS = ("p50_ms", "p99_ms", "p99_9_ms", "p99_99_ms", "max_ms")


def test_predictability_smoke(tmp_path):
    out = tmp_path / "out"
    res = predictability.main(["--runs", "40", "--warmup", "3", "--models", "mlp",
                               "--out", str(out), "--cache", str(tmp_path / "cache")])
    assert res["out"] == str(out)

    rows = common.read_tsv(out / "predictability.tsv")
    assert [r["model"] for r in rows] == ["mlp"]
    r = rows[0]
    assert r["runs"] == 40 and r["warmup"] == 3
    vals = [r[k] for k in KEYS]
    assert 0 < r["min_ms"] <= vals[0]
    assert all(a <= b for a, b in zip(vals, vals[1:], strict=False)), vals
    assert r["tail_pct"] == pytest.approx((r["p99_99_ms"] - r["p50_ms"]) / r["p50_ms"] * 100,
                                          rel=1e-3, abs=1e-3)
    assert r["paper_tail_pct"] == 0.03
    assert 0 <= r["top01_off_cpu_ms"] and r["top01_excess_ms"] <= r["max_ms"]

    data = json.loads((out / "predictability.json").read_text())
    assert data["settings"]["runs"] == 40 and data["settings"]["batch"] == 1
    m = data["models"]["mlp"]
    assert m["summary"]["runs"] == 40
    assert len(m["slowest"]) == 20
    assert m["slowest"][0]["ms"] == pytest.approx(r["max_ms"], rel=1e-6)
    q = m["quantiles"]["ms"]
    assert q == sorted(q) and q[-1] == pytest.approx(r["max_ms"], rel=1e-6)

    runs = np.load(out / "predictability_runs.npz")
    assert runs["mlp"].shape == runs["mlp_off_cpu"].shape == (40,) and (runs["mlp"] > 0).all()
    assert runs["mlp"].max() / 1e6 == pytest.approx(r["max_ms"], rel=1e-6)

    png = (out / "predictability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000

    # the compiled package is cached: a second run does not compile again
    again = predictability.main(["--runs", "5", "--warmup", "0", "--models", "mlp",
                                 "--out", str(out), "--cache", str(tmp_path / "cache"),
                                 "--no-gc"])
    assert again["rows"][0]["runs"] == 5
    data = json.loads((out / "predictability.json").read_text())
    assert data["models"]["mlp"]["compile_s"] == 0.0
    assert data["settings"]["gc_during_runs"] is False


def test_predictability_rejects_unknown_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        predictability.main(["--models", "mlp,nope", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "nope" in capsys.readouterr().err
