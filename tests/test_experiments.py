"""Smoke tests of the Section 6 experiment scripts (experiments/fig*.py) at ``--smoke``
scale: each writes its data and figure with sane values."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import (
    common,
    fig5_compare,
    fig6_thousands,
    fig7_tight_slo,
    fig8_isolation,
    fig9_azure,
    fig11_scale,
)

pytest.importorskip("matplotlib")


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 300_000


def test_fig5(tmp_path, capsys):
    (tmp_path / "fig5_compare.png").write_bytes(b"an earlier run's")
    fig5_compare.main(["--smoke", "--out", str(tmp_path)])
    # each file written is said, and one written over too
    err = capsys.readouterr().err.splitlines()
    assert f"wrote {tmp_path / 'fig5_compare.tsv'}" in err, err
    assert f"wrote {tmp_path / 'fig5_compare_cdf.json'}" in err, err
    assert f"wrote {tmp_path / 'fig5_compare.png'} (replaced)" in err, err
    rows = common.read_tsv(tmp_path / "fig5_compare.tsv")
    assert {r["policy"] for r in rows} == set(common.POLICIES)
    by = {r["policy"]: r for r in rows}
    assert all(0 <= r["attainment"] <= 1 for r in rows)
    # the GPU is saturated: clockwork's goodput is near the 1,447 r/s batch-16 bound
    assert 1000 < by["clockwork"]["goodput_rps"] < 1600
    assert by["clockwork"]["goodput_rps"] > max(by[p]["goodput_rps"] for p in ("clipper", "tfserving", "infaas"))
    cdf = json.loads((tmp_path / "fig5_compare_cdf.json").read_text())["cdf"]
    assert cdf["clockwork"]["F"][-1] == 1.0
    _png(tmp_path / "fig5_compare.png")


def test_fig7_and_min_slo(tmp_path):
    assert fig7_tight_slo.min_slo([(1, 0, 0.5), (2, 0, 0.995), (4, 0, 1.0)]) == 2
    assert fig7_tight_slo.min_slo([(1, 0, 1.0), (2, 0, 0.5), (4, 0, 1.0)]) == 4
    out = fig7_tight_slo.main(["--smoke", "--out", str(tmp_path)])
    rows = common.read_tsv(tmp_path / "fig7_tight_slo.tsv")
    assert {r["rate_rps"] for r in rows} == {600, 1200, 2400}
    slos = sorted({r["slo_ms"] for r in rows})
    assert slos[0] == pytest.approx(2.9) and len(slos) >= 10
    # the loosest SLO steps are met
    assert all(r["attainment"] > 0.99 for r in rows if r["slo_ms"] > 200)
    assert all(v is not None for v in out["mins"].values())
    _png(tmp_path / "fig7_tight_slo.png")


def test_fig8(tmp_path):
    out = fig8_isolation.main(["--smoke", "--out", str(tmp_path)])
    rows = common.read_tsv(tmp_path / "fig8_isolation.tsv")
    assert {r["case"] for r in rows} == {"with_background", "without_background"}
    assert out["info"]["without_background"]["background"]["requests"] == 0
    # (no background: no attainment of it, not 0 %)
    assert out["info"]["without_background"]["background"]["attainment"] is None
    bg = out["info"]["with_background"]["background"]
    assert bg["requests"] > 0
    # the background's goodput is over the time it runs (from background_delay_s; it
    # was over the whole run): times that, the requests it met
    smoke = fig8_isolation.PERIOD["smoke"]
    duration, delay = smoke * fig8_isolation.STEPS, min(10.0, smoke)
    assert bg["seconds"] == pytest.approx(duration - delay)
    assert bg["goodput_rps"] * bg["seconds"] == pytest.approx(bg["requests"] * bg["attainment"])
    _png(tmp_path / "fig8_isolation.png")


def test_fig6(tmp_path):
    out = fig6_thousands.main(["--smoke", "--out", str(tmp_path)])
    info = json.loads((tmp_path / "fig6_thousands.json").read_text())
    assert info["max_latency_met_ms"] <= 100 and info["completed_late"] == 0
    assert info["cold_starts"] > 0 and info["goodput_rps"] > 100
    assert len(out["timeline"]) >= 3
    # cut to the run, as fig9's and fig11's are (a bucket at t = duration_s, with nothing
    # offered and attainment 1.0, was written after the run's last)
    _, _, dur, bucket = fig6_thousands.SCALE["smoke"]
    assert len(out["timeline"]) == round(dur / bucket)
    assert out["timeline"][-1]["t_s"] < dur
    assert len(common.read_tsv(tmp_path / "fig6_thousands.tsv")) == round(dur / bucket)
    _png(tmp_path / "fig6_thousands.png")


def test_fig9_and_fig10(tmp_path):
    fig9_azure.main(["--smoke", "--out", str(tmp_path)])
    info = json.loads((tmp_path / "fig9_azure.json").read_text())
    assert info["attainment"] > 0.9 and info["goodput_rps"] > 0
    assert info["max_latency_met_ms"] <= 100
    errs = json.loads((tmp_path / "fig10_prediction_errors.json").read_text())
    assert errs["INFER"]["n"] > 0 and errs["LOAD"]["n"] > 0
    assert errs["INFER"]["abs_p99_ms"] < 10
    rows = common.read_tsv(tmp_path / "fig9_azure.tsv")
    assert sum(r["cold_starts"] for r in rows) > 0
    _png(tmp_path / "fig9_azure.png")
    _png(tmp_path / "fig10_prediction_errors.png")


def test_fig11(tmp_path):
    fig11_scale.main(["--smoke", "--out", str(tmp_path)])
    rows = common.read_tsv(tmp_path / "fig11_scale.tsv")
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["peak_goodput_rps"] > 0 and r["wall_s"] > 0 for r in rows)
    _png(tmp_path / "fig11_scale.png")


def test_fig11_times_the_controller(tmp_path):
    out = fig11_scale.main(["--smoke", "--out", str(tmp_path)])
    for r in out["rows"]:
        # the policy's wall time is part of the simulator's, and it grows with requests
        assert 0 < r["ctl_cpu_per_s"] < r["wall_per_sim_s"]
        assert 0 < r["ctl_us_per_request"] < 10_000
    info = json.loads((tmp_path / "fig11_scale.json").read_text())
    assert info["first_N_controller_over_one_core"] is None  # a few hundred r/s


@pytest.mark.parametrize("policy", ["clockwork", "clipper"])
def test_timed_policy_changes_nothing_and_counts_every_call(policy):
    sc = {"seed": 3, "duration_s": 2.0,
          "cluster": {"workers": 1, "gpus_per_worker": 2, "profiles": "v100-reference"},
          "scheduler": {"policy": policy},
          "models": [{"name": "resnet50_v2", "copies": 3}],
          "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 300, "slo_ms": 100}]}
    plain = common.Simulation(common.scenario(sc)).run().summary
    sim = common.Simulation(common.scenario(sc))
    inner = sim.policy
    timed = sim.policy = common.TimedPolicy(inner, 500_000_000)  # 0.5 s buckets
    res = sim.run()
    assert res.summary == plain  # the wrapper only passes calls on
    # every request went through the wrapper (and more calls: results, ticks, drains)
    assert sum(timed.calls) > 2 * res.summary["submitted"] > 0
    assert 4 <= len(timed.spent) <= 5 and all(v > 0 for v in timed.seconds())
    assert timed.queued() == inner.queued() == 0
    assert timed.stats() == inner.stats() and timed.stats()["infer"] > 0
    assert timed.model_view("resnet50_v2") == inner.model_view("resnet50_v2") is not None


def test_fig5_live_smoke(tmp_path):
    """--live: a LocalCluster (1 emulated worker + controller processes) per policy, the
    closed-loop workload replayed on the real clock, the cluster stopped again."""
    out = fig5_compare.main(["--smoke", "--live", "--out", str(tmp_path)])
    rows = {r["policy"]: r for r in common.read_tsv(tmp_path / "fig5_compare.tsv")}
    assert set(rows) == set(common.POLICIES)  # the baselines run live too (--settings)
    assert all(r["submitted"] > 100 for r in rows.values())
    # one saturated GPU (1,447 r/s at batch 16): clockwork ahead of the baselines, whose
    # queues hold the 100 ms SLO's requests too long (loose bounds: real time on shared
    # cores; a slow hour read 287 r/s in this 1-s point, a quiet one 900)
    assert 100 < rows["clockwork"]["goodput_rps"] < 1700
    assert rows["clockwork"]["goodput_rps"] > max(rows[p]["goodput_rps"] for p in
                                                   ("clipper", "tfserving", "infaas"))
    assert "clockwork" in out["summary"]
    _png(tmp_path / "fig5_compare.png")


def test_live_result_has_the_controllers_actions(tmp_path):
    res = common.run("fig5_1gpu", ["duration_s=0.5", "models.0.copies=2",
                                   "workloads.0.concurrency=4"], live=True)
    assert res.answered_once and res.summary["mode"] == "live"
    assert res.summary["submitted"] == len(res.telemetry.requests) > 0
    a = common.actions(res)
    assert {"LOAD", "INFER"} <= set(a["type"])
    # the action log was moved onto the replay's clock: completions fall inside the run
    assert 0 < a["completion"].min() and a["completion"].max() < 2e9
    # every [scheduler] key (fig5_1gpu sets max_exec_ms) reaches the live controller
    assert res.controller_cpu_s > 0 and res.ignored == ()
    tl = common.timeline(res, 0.25)
    assert sum(row["loads"] for row in tl) == res.summary["actions"]["load"] == 2
    # run.json: a live run has no simulator events to count (it said "events": 0)
    info = json.loads((res.write(tmp_path / "run") / "run.json").read_text())
    assert info["mode"] == "live" and "events" not in info, info


def test_a_live_run_whose_controller_goes_away_is_not_an_experiments_figure(monkeypatch,
                                                                           capsys):
    """The controller killed part way through a live run: the run raises
    ControllerUnavailable saying when and why (its figures cover part of the run, and no
    figure is made of them), and a script built on ``common.script`` ends with that one
    line, exit 1."""
    import threading

    from clockwork.errors import ControllerUnavailable

    class Killed(common.LocalCluster):
        def __enter__(self):
            super().__enter__()
            threading.Timer(1.0, self.controller.proc.kill).start()
            return self

    monkeypatch.setattr(common, "LocalCluster", Killed)

    def main():
        common.run("fig5_1gpu", ["duration_s=4", "workloads.0.concurrency=4"], live=True)

    with pytest.raises(SystemExit) as e:
        common.script(main)
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{Path(sys.argv[0]).name}: the live run's controller went "
                              "away "), err
    assert "Traceback" not in "".join(err)
    with pytest.raises(ControllerUnavailable, match=r"went away \d+(\.\d+)? s into the run"):
        main()


def test_live_refuses_scales_it_cannot_hold(tmp_path):
    """The refusal is a SystemExit whose message says why (Python prints it once)."""
    with pytest.raises(common.LiveRefused, match="21,600 s of real time"):
        fig9_azure.main(["--full", "--live", "--out", str(tmp_path)])
    with pytest.raises(common.LiveRefused, match="150 emulated workers"):
        fig11_scale.main(["--full", "--live", "--out", str(tmp_path)])


def test_run_all_says_which_live_scales_it_refuses_before_anything_runs(
        tmp_path, capsys, monkeypatch):
    """run_all --full --live refused Figs. 9 and 11 only after Figs. 5-8 had run (an hour
    live); now it says so first, and still runs the others (here the first is stopped
    as it starts)."""
    from experiments import run_all

    class Started(Exception):
        pass

    def first(argv):
        print("fig5 starts", file=sys.stderr)
        raise Started
    monkeypatch.setattr(fig5_compare, "main", first)
    with pytest.raises(Started):
        run_all.main(["--full", "--live", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "fig9_azure: refused: --live: fig9 --full needs" in err, err
    assert "fig11_scale: refused: --live: fig11 --full needs" in err, err
    assert err.index("fig11_scale: refused") < err.index("fig5 starts")


def test_controller_restart_compares_taking_over_the_caches_with_emptying_them(
        tmp_path, capsys):
    """experiments/controller_restart.py at a small shape: load, a controller restart,
    load again, once taking the workers' weights over and once with --fresh-caches. The
    restarted controller that adopts serves with fewer LOADs and cold starts than the one
    that empties the caches (which loads every model it serves again)."""
    from experiments import controller_restart

    assert controller_restart.main(["--instances", "12", "--workers", "2", "--gpus", "1",
                                    "--rate", "120", "--warm", "1.5", "--after", "1",
                                    "--repeats", "1", "--json", str(tmp_path / "r.json")]) == 0
    adopt, fresh = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert (adopt["mode"], fresh["mode"]) == ("adopt", "fresh")
    assert adopt["answered_once"] and fresh["answered_once"]
    assert adopt["adopted"] >= 6 and fresh["adopted"] == 0  # 12 small models, all cached
    assert adopt["loads"] < fresh["loads"] and adopt["cold_starts"] < fresh["cold_starts"]
    assert "after the restart" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        controller_restart.main(["--warm", "0"])
    assert e.value.code == 2 and "must be positive" in capsys.readouterr().err
    # the same in the simulator ([faults] controller_restart): the same contrast
    assert controller_restart.main(["--simulate", "--instances", "12", "--workers", "2",
                                    "--gpus", "1", "--rate", "120", "--warm", "1.5",
                                    "--after", "1", "--down", "0.3",
                                    "--json", str(tmp_path / "s.json")]) == 0
    adopt, fresh = json.loads((tmp_path / "s.json").read_text())["runs"]
    assert (adopt["mode"], fresh["mode"]) == ("adopt", "fresh")
    assert adopt["adopted"] == 12 and fresh["adopted"] == 0
    assert adopt["loads"] == adopt["cold_starts"] == 0 < fresh["cold_starts"]
    assert fresh["loads"] >= 12 and adopt["requests"] == fresh["requests"] > 50
    with pytest.raises(SystemExit) as e:
        controller_restart.main(["--simulate", "--after", "1", "--down", "1"])
    assert e.value.code == 2 and "--down must be" in capsys.readouterr().err


def test_live_scale_runs_the_simulator_and_the_live_cluster_side_by_side(tmp_path, capsys):
    """experiments/live_scale.py at a small shape: the simulator's run and a live one of
    the same scenario (the same arrivals), printed and written side by side, the live one
    with the count of workers the controller found suspect."""
    from experiments import live_scale

    sc = live_scale.scenario(30, 2, 1, 150.0, 1.0, 100.0)
    assert sum(m["copies"] for m in sc["models"]) == 30 and len(sc["models"]) == 9
    assert sc["faults"] == {}
    hangs = live_scale.scenario(30, 2, 1, 150.0, 1.5, 100.0, hang_s=0.2)["faults"]["hang"]
    assert hangs == [{"worker": 0, "at_s": 0.5, "for_s": 0.2},
                     {"worker": 1, "at_s": 1.0, "for_s": 0.2}]  # each in turn, spread
    assert live_scale.main(["--instances", "30", "--workers", "2", "--gpus", "1", "--rate",
                            "150", "--duration", "1", "--repeats", "1", "--hang-s", "0.1",
                            "--json", str(tmp_path / "runs.json")]) == 0
    sim, live = json.loads((tmp_path / "runs.json").read_text())["runs"]
    assert (sim["mode"], live["mode"]) == ("simulator", "live")
    assert sim["requests"] == live["requests"] > 80
    assert sim["loads"] > 0 and live["loads"] > 0
    assert sim["workers_suspected"] is None and isinstance(live["workers_suspected"], int)
    assert live["controller_cpu_s"] > 0 and 0 < live["attainment"] <= 1
    out = capsys.readouterr().out
    assert "live attainment median" in out and "workers suspected" in out
    assert "each worker hangs 0.1 s once" in out
    with pytest.raises(SystemExit) as e:  # a shape that cannot be: one line, exit 2
        live_scale.main(["--instances", "0"])
    assert e.value.code == 2 and "must be positive" in capsys.readouterr().err


# --------------------------------------------------------------- benchmarks' bad arguments

EXPERIMENTS = Path(common.__file__).resolve().parent
# small shapes first, so that a value that got past the parser would run briefly
GRID = ["--gpus", "1", "--copies", "1", "--models", "1", "--requests", "100"]
KSERVE = ["--servers", "floor", "--cells", "tiny/grpc/1", "--repeats", "1", "--warmup", "0.1",
          "--duration", "0.2"]
LIVE = ["--rates", "100", "--step-s", "0.3", "--workers", "1", "--gpus", "1", "--copies", "1"]
LOGS = ["--repeat", "1", "--gpus", "1", "--per-gpu", "1", "--duration", "0.2"]
REST = ["--duration", "0.3", "--warmup", "0.1", "--concurrency", "1"]
SCHED = ["--gpus", "1", "--per-gpu", "1", "--duration", "0.2"]
SEC = ["--runs", "1", "--seconds", "0.3", "--copies", "1", "--concurrency", "1", "--callers", "1"]

BENCH_BAD = [
    # (script, argv: {dir} a folder, {file} a file; the option the error names)
    ("bench_grid", GRID + ["--repeat", "0"], "--repeat"),
    ("bench_grid", GRID + ["--repeat", "-1"], "--repeat"),
    ("bench_grid", GRID + ["--requests", "-5"], "--requests"),
    ("bench_grid", GRID + ["--gpus", "0"], "--gpus"),
    ("bench_grid", GRID + ["--gpus", ""], "--gpus"),
    ("bench_grid", GRID + ["--copies", "1,x"], "--copies"),
    ("bench_grid", GRID + ["--models", "many"], "--models"),
    ("bench_grid", GRID + ["--models", "hot", "--copies", "4"], "--models"),
    ("bench_grid", GRID + ["--seed", "-1"], "--seed"),
    ("bench_grid", GRID + ["--json", "{dir}"], "--json"),
    ("bench_grid", GRID + ["--json", "{file}/grid.json"], "--json"),
    ("bench_grid", GRID + ["--keep", "{file}"], "--keep"),
    ("bench_kserve", ["--cells", "tiny/grpc"], "--cells"),
    ("bench_kserve", ["--cells", "tiny/grpc/0"], "--cells"),
    ("bench_kserve", ["--sizes", "huge"], "--sizes"),
    ("bench_kserve", ["--protocols", "ftp"], "--protocols"),
    ("bench_kserve", ["--concurrency", "8,abc"], "--concurrency"),
    ("bench_kserve", ["--servers", "ours,nobody"], "--servers"),
    ("bench_kserve", KSERVE + ["--duration", "0"], "--duration"),
    ("bench_kserve", KSERVE + ["--warmup", "-1"], "--warmup"),
    ("bench_kserve", KSERVE + ["--repeats", "0"], "--repeats"),
    ("bench_kserve", KSERVE + ["--procs", "0"], "--procs"),
    ("bench_kserve", KSERVE + ["--exec-us", "nan"], "--exec-us"),
    ("bench_kserve", KSERVE + ["--exec-us", "0.0001"], "--exec-us"),
    ("bench_kserve", KSERVE + ["--slo-ms", "-1"], "--slo-ms"),
    ("bench_kserve", KSERVE + ["--json", "{dir}"], "--json"),
    ("bench_live", ["--rates", ""], "--rates"),
    ("bench_live", ["--rates", "1000,abc"], "--rates"),
    ("bench_live", LIVE + ["--step-s", "0"], "--step-s"),
    ("bench_live", LIVE + ["--workers", "0"], "--workers"),
    ("bench_live", LIVE + ["--model", "nosuch"], "--model"),
    ("bench_live", LIVE + ["--slo-ms", "nan"], "--slo-ms"),
    ("bench_live", LIVE + ["--target", "2"], "--target"),
    ("bench_live", LIVE + ["--seed", "-3"], "--seed"),
    ("bench_live", LIVE + ["--out", "{dir}"], "--out"),
    ("bench_logs", LOGS + ["--repeat", "0"], "--repeat"),
    ("bench_logs", LOGS + ["--modes", ""], "--modes"),
    ("bench_logs", LOGS + ["--modes", "none,foo"], "--modes"),
    ("bench_logs", LOGS + ["--gpus", "0"], "--gpus"),
    ("bench_logs", LOGS + ["--load", "inf"], "--load"),
    ("bench_logs", LOGS + ["--duration", "-1"], "--duration"),
    ("bench_logs", LOGS + ["--baseline", "{dir}/missing"], "--baseline"),
    ("bench_logs", LOGS + ["--json", "{dir}"], "--json"),
    ("bench_rest", REST + ["--concurrency", "0"], "--concurrency"),
    ("bench_rest", REST + ["--duration", "0"], "--duration"),
    ("bench_rest", REST + ["--warmup", "-1"], "--warmup"),
    ("bench_rest", REST + ["--procs", "0"], "--procs"),
    ("bench_rest", REST + ["--floats", "0"], "--floats"),
    ("bench_rest", REST + ["--exec-us", "-5"], "--exec-us"),
    ("bench_scheduler", SCHED + ["--gpus", "0"], "--gpus"),
    ("bench_scheduler", SCHED + ["--load", "0"], "--load"),
    ("bench_scheduler", SCHED + ["--duration", "nan"], "--duration"),
    ("bench_scheduler", SCHED + ["--per-gpu", "0"], "--per-gpu"),
    ("bench_scheduler", SCHED + ["--seed", "-1"], "--seed"),
    ("bench_security", SEC + ["--runs", "0"], "--runs"),
    ("bench_security", SEC + ["--seconds", "0"], "--seconds"),
    ("bench_security", SEC + ["--model", "nosuch"], "--model"),
    ("bench_security", SEC + ["--callers", "0"], "--callers"),
    ("bench_security", SEC + ["--slo-ms", "inf"], "--slo-ms"),
    ("bench_security", SEC + ["--out", "{dir}"], "--out"),
    ("bench_sweep", ["--repeat", "0"], "--repeat"),
    ("bench_sweep", ["--repeat", "1", "--jobs", "0"], "--jobs"),
    ("bench_sweep", ["--repeat", "1", "--json", "{dir}"], "--json"),
    ("bench_trace_load", ["--functions", "0"], "--functions"),
    ("bench_trace_load", ["--functions", "10", "--seed", "-1"], "--seed"),
    ("bench_trace_load", ["--file", "{dir}/missing.csv"], "--file"),
    ("bench_sweep", ["--repeat", "1", "--jobs", "1"], "--jobs"),
    # the experiment scripts too: refused before any work (azure_paper_scale's second
    # part found a minute past the day after the first had run; a file as --json or
    # --out was found after every run)
    ("azure_paper_scale", ["--start-minute", "1430", "--minutes", "20"], "--start-minute"),
    ("azure_paper_scale", ["--replay-start", "1440"], "--replay-start"),
    ("azure_paper_scale", ["--rate", "0"], "--rate"),
    ("azure_paper_scale", ["--load-factor", "-1"], "--load-factor"),
    ("azure_paper_scale", ["--seed", "-3"], "--seed"),
    ("azure_paper_scale", ["--out", "{file}"], "--out"),
    ("azure_paper_scale", ["--spill-dir", "{file}"], "--spill-dir"),
    ("controller_restart", ["--simulate", "--slo-ms", "0"], "--slo-ms"),
    ("controller_restart", ["--simulate", "--rate", "1e9"], "--rate"),
    ("controller_restart", ["--simulate", "--json", "{dir}"], "--json"),
    ("live_scale", ["--json", "{file}/x.json"], "--json"),
    ("live_scale", ["--slo-ms", "-5"], "--slo-ms"),
    ("predictability", ["--seed", "-1"], "--seed"),
    ("predictability", ["--runs", "100000000000"], "--runs"),
    ("check_outputs", ["--models", "nosuch"], "nosuch"),
    ("check_outputs", ["--batch-sizes", "0"], "--batch-sizes"),
    ("check_outputs", ["--packages", "{dir}/missing"], "--packages"),
    ("faults_timeline", ["--scenario", "nosuch"], "nosuch"),
    ("faults_timeline", ["--out", "{file}"], "--out"),
    ("faults_timeline", ["--live-dir", "{dir}/missing"], "--live-dir"),
    # a live run stopped early (it was taken, and the comparison failed in an IndexError)
    ("faults_timeline", ["--live-dir", "{dir}/stopped"], "--live-dir"),
    ("fig5_compare", ["--smoke", "--out", "{file}"], "--out"),
    ("live_prediction", ["--out", "{file}"], "--out"),
    # (a file for --packages failed after the header, compiling into it: a traceback)
    ("live_prediction", ["--packages", "{file}"], "--packages"),
    ("live_overload", ["--packages", "{file}"], "--packages"),
    ("live_overload", ["--seed", "-1"], "--seed"),
    ("bench_churn", ["--churn", "5,x"], "--churn"),
    ("bench_churn", ["--repeat", "0"], "--repeat"),
    ("bench_churn", ["--duration", "1"], "--duration"),
    ("bench_churn", ["--json", "{dir}"], "--json"),
]


@pytest.mark.parametrize("script,argv,option", BENCH_BAD,
                         ids=[f"{s} {' '.join(a)}" for s, a, _ in BENCH_BAD])
def test_a_benchmarks_bad_value_is_a_usage_error(script, argv, option, tmp_path):
    """A benchmark given a value it cannot use stops in its parser: the usage and one
    error line that names the option, exit 2, no traceback and no work done."""
    (tmp_path / "file").write_text("")
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "summary.json").write_text(
        '{"stopped": {"at_s": 9.1, "reason": "interrupted"}}')
    argv = [a.format(dir=tmp_path, file=tmp_path / "file") for a in argv]
    r = subprocess.run([sys.executable, str(EXPERIMENTS / f"{script}.py"), *argv],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.startswith("usage: ") and r.stderr.count("error:") == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}.py: error: ") and option in last, last


def test_comma_list_keeps_order_and_repeats_and_checks_each_item():
    from clockwork.cluster.cli import argtypes as t

    ints = t.comma_list(t.positive_int)
    assert ints("16, 1,,4,1") == [16, 1, 4, 1]
    with pytest.raises(argparse.ArgumentTypeError, match="got '0'"):
        ints("1,0")
    with pytest.raises(argparse.ArgumentTypeError, match="got nothing"):
        ints(" , ")
    names = t.comma_list(t.one_of("a", "b"))
    assert names("b,a") == ["b", "a"]
    with pytest.raises(argparse.ArgumentTypeError, match="one of a, b, got 'c'"):
        names("a,c")


def test_live_pacing_names_its_hops():
    from experiments import common

    sc = common.scenario({"name": "x", "duration_s": 1.0, "models": [{"name": "resnet50_v2"}],
                          "workloads": [{"kind": "poisson", "rate_rps": 10}]})
    with pytest.raises(ValueError, match="HOP is one of requests, actions"):
        common.run_live(sc, pacing={"reply": 0.0})
    with pytest.raises(ValueError, match="to 1,000,000"):  # (the client's bound) at once
        common.run_live(sc, pacing={"requests": 2e6})
    assert common.pacing_intervals(["all=0", "results=500"]) == {
        "requests": 0.0, "actions": 0.0, "results": 500.0, "replies": 0.0}
    for bad in ("results", "results=-1", "results=nan", "foo=1"):
        with pytest.raises(ValueError):
            common.pacing_intervals([bad])


def test_smoke_writes_to_a_folder_of_its_own_not_the_figures_kept():
    """``--smoke`` without ``--out`` writes to a new temporary folder: it shared the quick
    scale's, and `run_all.py --smoke --live` replaced the committed live figures."""
    from experiments import common

    for argv in (["--smoke"], ["--smoke", "--live"]):
        out = common.parse_args(argv, "x").out
        assert common.FIGURES not in out.parents and out != common.FIGURES, out
        assert out.is_dir() and not any(out.iterdir())
        out.rmdir()
    assert common.parse_args(["--quick"], "x").out == common.FIGURES


def test_a_script_stopped_or_refused_says_so_in_one_line(tmp_path):
    """common.script: Ctrl-C is one line and exit 130, a setting the scenario refuses its
    one line and exit 2 (tracebacks before)."""
    code = ("import sys; sys.path.insert(0, {root!r}); from experiments import common\n"
            "def main():\n    {body}\ncommon.script(main)\n")
    root = str(EXPERIMENTS.parent)
    for body, rc, line in (
            ("raise KeyboardInterrupt", 130, "-c: interrupted"),
            ("common.scenario('poisson_warm', ['duration_s=-1'])", 2, "duration_s"),
            ("return 3", 3, None), ("return {'a': 1}", 0, None)):
        r = subprocess.run([sys.executable, "-c", code.format(root=root, body=body)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == rc and "Traceback" not in r.stderr, (body, r.stderr)
        if line:
            assert len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr


def test_a_script_stopped_early_removes_the_out_folder_it_made(tmp_path):
    """Interrupted before it wrote anything, a figure script removes the --out folder it
    made (an empty folder was left); one that was there already stays."""
    made, kept = tmp_path / "new" / "out", tmp_path / "kept"
    kept.mkdir()
    for out in (made, kept):
        def main(out=out):
            assert common.parse_args(["--out", str(out)], "x").out.is_dir()
            raise KeyboardInterrupt
        with pytest.raises(SystemExit) as e:
            common.script(main)
        assert e.value.code == 130
    assert not made.exists() and made.parent.is_dir() and kept.is_dir()


def test_check_outputs_stopped_says_so_in_one_line():
    """experiments/check_outputs.py stopped (SIGTERM) while it compiles ends in one line,
    exit 130 (a traceback on Ctrl-C, and 143 with nothing said on SIGTERM, before)."""
    import signal

    pytest.importorskip("tvm")
    p = subprocess.Popen([sys.executable, str(EXPERIMENTS / "check_outputs.py"), "--models",
                          "resnet18"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().startswith("model")  # its header: compiling now
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert err.strip() == "check_outputs.py: interrupted", err


def test_azure_paper_scale_stopped_with_parts_side_by_side_stops_them(tmp_path):
    """SIGINT to azure_paper_scale.py running two parts side by side (--jobs 2) ends it and
    both parts at once (the parts ran on to their ends, ~12 s here, hours at scale)."""
    import os
    import signal
    import time

    from tests.conftest import script_command

    p = subprocess.Popen(script_command(EXPERIMENTS / "azure_paper_scale.py", "--trace",
                                        "sample", "--minutes", "4", "--rate", "3000",
                                        "--part-minutes", "2", "--jobs", "2"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)

    def parts() -> list[int]:
        kids = []
        for d in Path("/proc").iterdir():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{p.pid}\n" in status:
                kids.append(int(d.name))
        return kids

    try:
        deadline = time.monotonic() + 60
        while len(parts()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = parts()
        assert len(kids) == 2, kids
        os.kill(p.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=30)
        assert time.monotonic() - t0 < 5 and p.returncode == 130, (p.returncode, err[-500:])
        assert err.strip().splitlines()[-1] == "azure_paper_scale.py: interrupted"
        assert not [k for k in kids if Path(f"/proc/{k}").exists()
                    and "zombie" not in Path(f"/proc/{k}/status").read_text()]
    finally:
        p.kill()
        p.wait()


def test_a_figure_script_without_matplotlib_says_so_before_it_runs(monkeypatch, capsys):
    """Without matplotlib (not in the base install) a figure script stops at once, one
    line naming the extra, exit 2: it ran every simulation first, then ended in a
    ModuleNotFoundError traceback (at --full, after ~45 minutes)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib fails)
    ran = []
    monkeypatch.setattr(common, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(SystemExit) as e:
        fig8_isolation.main(["--smoke"])
    assert e.value.code == 2 and not ran
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[plots]'" in err[0], err


def test_bench_live_prints_the_cpu_per_request_and_the_ceiling_it_sets(tmp_path):
    """A short real run (a low rate: sustained): each row carries the CPU per request of
    the controller, the workers and the load generator, and the last line of figures is
    the rate at which that cost fills the machine's cores."""
    out = tmp_path / "live.json"
    p = subprocess.run([sys.executable, str(EXPERIMENTS / "bench_live.py"), "--rates", "300",
                        "--step-s", "1", "--workers", "1", "--gpus", "1", "--copies", "2",
                        "--target", "0.9", "--out", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads(out.read_text())["rows"][0]
    ctl, wrk, gen = row["cpu_us_per_request"]
    assert ctl > 0 and wrk > 0 and gen > 0, row
    line = next(x for x in p.stdout.splitlines() if x.startswith("CPU per request at 300 r/s"))
    total = ctl + wrk + gen
    cores = len(os.sched_getaffinity(0))
    assert f"({total:.0f} µs)" in line and f"~{cores * 1e6 / total:,.0f} r/s" in line, line


def test_bench_churn_prints_the_cost_of_each_worker_that_joined_and_left(tmp_path, capsys):
    """experiments/bench_churn.py at a small size: a run without churn and one where 5
    workers each join and leave, side by side with the cost per churned worker."""
    from experiments import bench_churn

    text = bench_churn.scenario(3, 4.0, 100.0)
    assert text.count("[[add_workers]]") == text.count("[[remove_workers]]") == 3
    assert bench_churn.main(["--churn", "0,5", "--repeat", "1", "--duration", "2",
                             "--rate", "200", "--json", str(tmp_path / "c.json")]) == 0
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert runs["0"][0]["submitted"] == runs["5"][0]["submitted"] > 200
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[:2] == ["churned", "CPU"] and rows[3].split()[0] == "5"


def test_bench_control_calls_times_every_call_under_a_small_load(capsys):
    """experiments/bench_control_calls.py at a small size: every control call is answered
    and timed while the clients' inferences are answered."""
    from experiments import bench_control_calls

    out = bench_control_calls.main(["--grpc", "2", "--http", "2", "--duration", "4",
                                    "--workers", "1"])
    assert set(out["calls"]) == {"workers", "index", "stats", "ready", "metrics"}
    for k, row in out["calls"].items():
        assert row["failed"] == 0 and 0 < row["median_ms"] <= row["worst_ms"], (k, row)
    assert out["answered"].get("grpc ok", 0) > 0 and out["answered"].get("http ok", 0) > 0
    assert "| workers |" in capsys.readouterr().out
