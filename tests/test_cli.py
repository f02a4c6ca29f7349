"""The ``clockwork`` command: simulate, report, errors."""

from __future__ import annotations

import orjson

from clockwork.cluster.cli import main


def test_simulate_writes_outputs_and_report_reads_them(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=2", "--out", str(out),
               "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "goodput" in printed
    s = orjson.loads((out / "summary.json").read_bytes())
    assert s["duration_s"] == 2.0 and s["submitted"] > 1000
    assert main(["report", str(out), "--timeline", "1"]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert sum(int(r[1].replace(",", "")) for r in rows) == s["submitted"]


def test_simulate_json(capsys):
    assert main(["simulate", "scenarios/poisson_warm.toml", "--set", "duration_s=1", "--json",
                 "--quiet"]) == 0
    s = orjson.loads(capsys.readouterr().out)
    assert s["submitted"] == s["succeeded"] + s["failed"] + s["dropped"]


def test_bad_input_exit_code_and_message(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "missing.toml")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = [")
    assert main(["simulate", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["simulate", "scenarios/poisson_warm.toml", "--set", "cluster.gpus_per_worker=-1"]) == 2
    assert main(["report", str(tmp_path)]) == 2


def test_help_lists_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for cmd in ("simulate", "report", "trace"):
        assert cmd in out


def test_cuda_without_a_gpu_fails_at_start_naming_the_alternatives(capsys):
    import importlib.util

    import pytest

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed: this machine may have a GPU")
    for argv in (["worker", "--device", "cuda", "--port", "0"],
                 ["serve", "--device", "cuda", "--port", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "cuda device unavailable" in err
        assert "--device cpu" in err and "--device emulated" in err


def test_cluster_from_scenario_passes_every_scheduler_key():
    from clockwork.cluster.serve import cluster_from_scenario
    from clockwork.scenario import load_scenario

    sc = load_scenario(data={
        "cluster": {"workers": 2, "gpus_per_worker": 1, "profiles": "v100-reference",
                    "noise": 0.05, "slow_prob": 0.01, "jitter_ms": 0.2},
        "scheduler": {"policy": "tfserving", "max_exec_ms": 25, "batch_timeout_us": 500,
                      "batch_first": False},
        "models": [{"name": "resnet50_v2", "copies": 3}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 10}]})
    kw, ignored = cluster_from_scenario(sc)
    ctl = kw["controller_args"]
    assert ctl[:2] == ["--policy", "tfserving"]
    assert {"max_exec_ms=25", "batch_timeout_us=500", "batch_first=false"} == set(ctl[3::2])
    assert kw["models"] == "resnet50_v2:3" and len(kw["worker_args"]) == 2
    assert "--noise" in kw["worker_args"][0] and "--slow-prob" in kw["worker_args"][1]
    assert ignored == ["cluster.jitter_ms"]


def test_controller_set_parses_settings_and_rejects_unknown_ones():
    from controller.service import parse_settings

    assert parse_settings(["max_exec_ms=25", "batch_first=false", "x=1.5", "name=abc"]) == {
        "max_exec_ms": 25, "batch_first": False, "x": 1.5, "name": "abc"}
    assert main(["controller", "--workers", "127.0.0.1:1", "--set", "no_such=1"]) == 2
