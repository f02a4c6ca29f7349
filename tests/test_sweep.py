"""``clockwork sweep``: every point's summary.json is byte for byte what a sequential
``clockwork simulate`` of the same point writes, a rerun runs nothing and writes the same
table, a deleted point (only it) runs again; bad sweep files are one line and exit 2."""

from __future__ import annotations

import os
import shutil
import sys

import orjson
import pytest

from clockwork.cluster.cli import argtypes, main
from clockwork.cluster.parallel import Point, toml_value
from clockwork.cluster.sweep import load_sweep
from clockwork.scenario import parse_value
from tests.conftest import cli_command

REPO = __import__("pathlib").Path(__file__).resolve().parent.parent

SWEEP8 = """
name = "t8"
scenarios = ["poisson_warm", "bursty"]
seeds = [2, 3]
overrides = ["duration_s=5", "drain_s=1"]

[grid]
"workloads.0.slo_ms" = [20, 100]
"""


def _summaries(out):
    return {p.name: (p / "summary.json").read_bytes()
            for p in sorted((out / "points").iterdir())}


def _mtimes(out):
    return {p.name: (p / "summary.json").stat().st_mtime_ns
            for p in sorted((out / "points").iterdir())}


def test_sweep_matches_simulate_and_resumes(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text(SWEEP8)
    out = tmp_path / "out"
    assert main(["sweep", str(f), "--jobs", "2", "--out", str(out), "--quiet"]) == 0
    sweep = load_sweep(f)
    assert len(sweep.points) == 8
    got = _summaries(out)
    assert sorted(got) == sorted(p.name for p in sweep.points)

    # each point == a sequential `clockwork simulate` of it (summary.json has no wall time)
    for i, p in enumerate(sweep.points):
        seq = tmp_path / f"seq{i}"
        argv = ["simulate", p.scenario, "--out", str(seq), "--quiet"]
        for o in p.overrides:
            argv += ["--set", o]
        assert main(argv) == 0
        assert (seq / "summary.json").read_bytes() == got[p.name], p.name
        assert "wall" not in orjson.loads(got[p.name])

    tsv = (out / "results.tsv").read_bytes()
    js = (out / "results.json").read_bytes()
    rows = orjson.loads(js)["points"]
    assert [r["point"] for r in rows] == [p.name for p in sweep.points]
    assert {r["scenario"] for r in rows} == {"poisson_warm", "bursty"}
    # (seeds whose 5 s of bursty traffic hold a burst: a run may start in a long pause)
    assert {r["seed"] for r in rows} == {2, 3}
    for r in rows:
        assert r["status"] == "ok" and r["submitted"] > 0
        assert 0 < r["slo_attainment"] <= 1 and r["goodput_rps"] > 0
        assert r["workloads.0.slo_ms"] in (20, 100)
        assert r["overrides"][:2] == ["duration_s=5", "drain_s=1"]
    header = tsv.decode().splitlines()[0].split("\t")
    for col in ("point", "scenario", "seed", "overrides", "workloads.0.slo_ms", "submitted",
                "goodput_rps", "slo_attainment", "p50_ms", "p99_ms", "cold_starts"):
        assert col in header
    assert len(tsv.decode().splitlines()) == 9

    # a rerun runs nothing and writes the same table
    before = _mtimes(out)
    capsys.readouterr()
    assert main(["sweep", str(f), "--jobs", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "0 run, 8 already done" in err
    assert _mtimes(out) == before
    assert (out / "results.tsv").read_bytes() == tsv
    assert (out / "results.json").read_bytes() == js

    # one point's folder deleted: only it runs again, to the same bytes
    gone = sweep.points[5].name
    for x in (out / "points" / gone).iterdir():
        x.unlink()
    (out / "points" / gone).rmdir()
    assert main(["sweep", str(f), "--jobs", "2", "--out", str(out)]) == 0
    assert "1 run, 7 already done" in capsys.readouterr().err
    after = _mtimes(out)
    assert {k: v for k, v in after.items() if k != gone} == \
        {k: v for k, v in before.items() if k != gone}
    assert _summaries(out) == got
    assert (out / "results.tsv").read_bytes() == tsv
    assert (out / "results.json").read_bytes() == js


def test_a_summary_that_is_not_a_runs_summary_is_run_again(tmp_path, capsys):
    """A point's summary.json that is JSON but not a run's summary (``{}``, a figure that
    is not a number) is not done: the point runs again, no traceback."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2, 3, 4]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    good = _summaries(out)
    names = sorted(good)
    for name, text in zip(names, [b"{}", b'{"slo_attainment": "x"}', b"[1]"], strict=False):
        (out / "points" / name / "summary.json").write_bytes(text)
    capsys.readouterr()
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--list"]) == 0
    assert [x.split()[0] for x in capsys.readouterr().out.splitlines()].count("done") == 1
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "3 run, 1 already done" in err and "Traceback" not in err
    assert _summaries(out) == good


def test_list_plot_and_a_failing_point(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 'out = "ignored"\n[grid.workloads.0]\nrate_rps = [100.0, 200.0]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--out", str(out), "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and all(x.startswith("to run  ") for x in listed)
    assert "clockwork simulate poisson_warm --set duration_s=1" in listed[0]
    assert main(["sweep", str(f), "--out", str(out), "--jobs", "1", "--plot", "--quiet"]) == 0
    assert (out / "sweep.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["sweep", str(f), "--out", str(out), "--list"]) == 0
    done = capsys.readouterr().out.splitlines()  # (in the same columns as "to run")
    assert [x.replace("done  ", "to run", 1) for x in done] == listed, (done, listed)

    # points that fail while running (requests still unanswered when the drain ends):
    # error rows, with their seed; the others still run
    capsys.readouterr()
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1"]\n'
                 '[grid]\n"drain_s" = [0, 1]\n')
    assert main(["sweep", str(f), "--out", str(tmp_path / "bad"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "failed" in err and "unanswered request(s) at drain_s = 0 s" in err, err
    rows = orjson.loads((tmp_path / "bad" / "results.json").read_bytes())["points"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "unanswered" in rows[0]["error"] and rows[0]["seed"] == rows[1]["seed"] == 1
    tsv = [ln.split("\t") for ln in (tmp_path / "bad" / "results.tsv").read_text().splitlines()]
    assert [r[tsv[0].index("seed")] for r in tsv[1:]] == ["1", "1"]
    assert len(list((tmp_path / "bad" / "points").glob("*/summary.json"))) == 1


BAD = [
    ("scenarios = []", "scenarios"),
    ('scenarios = "poisson_warm"', "scenarios"),
    ('scenarios = ["poisson_warm"]\nseeds = [1, -1]', "seeds.1"),
    ('scenarios = ["poisson_warm"]\nseeds = [1, 1]', "seeds"),
    ('scenarios = ["poisson_warm"]\nsedes = [1]', "seeds"),
    ('scenarios = ["no_such_scenario"]', "no_such_scenario"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.wokers" = [1]', "cluster.workers"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = [0, 1]', "cluster.workers"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = []', "grid.cluster.workers"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = 2', "grid.cluster.workers"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = [1, 1]', "listed twice"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.slo_ms" = [25, 25.0]', "listed twice"),
    ('scenarios = ["poisson_warm", "poisson_warm.toml"]', "listed twice"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = [1, 2]\n[grid.cluster]\n'
     'workers = [3]', "grid.cluster.workers: listed twice"),
    ('scenarios = ["poisson_warm"]\n[grid]\ncluster = {workers = [3]}\n'
     '"cluster.workers" = [1]', "grid.cluster.workers: listed twice"),
    ('scenarios = ["poisson_warm"]\n[grid]\nseed = [1, 2]', "seeds"),
    ('scenarios = ["poisson_warm"]\noverrides = ["duration_s"]', "overrides.0"),
    ('scenarios = ["poisson_warm"]\noverrides = ["ab"]', "overrides.0: expected key=value, "
     "got 'ab'"),
    ('scenarios = ["poisson_warm"]\noverrides = ["=5"]', "overrides.0: expected key=value"),
    ('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1"]\n[grid]\nduration_s = [2]',
     "duration_s"),
    ('scenarios = ["poisson_warm"]\nlogs = "yes"', "logs"),
    # keys that name one setting, or a table and a setting in it (one silently won, and
    # rows showed values that were not simulated)
    ('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.slo_ms" = [10, 100]\n'
     '"workloads.00.slo_ms" = [25]', "grid.workloads.0.slo_ms and grid.workloads.00.slo_ms "
     "set the same setting"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = [1, 4]\n'
     '"cluster" = [{gpus_per_worker = 1}]', "(cluster is a table holding cluster.workers)"),
    ('scenarios = ["poisson_warm"]\noverrides = ["cluster.workers=3"]\n[grid]\n'
     '"cluster" = [{gpus_per_worker = 1}]', "grid.cluster and overrides' cluster.workers "
     "overlap"),
    # the same for two overrides (the last silently won; the table showed both)
    ('scenarios = ["poisson_warm"]\noverrides = ["duration_s=2", "duration_s=3"]',
     "overrides' duration_s and overrides' duration_s set the same setting"),
    ('scenarios = ["poisson_warm"]\noverrides = ["cluster.workers=2", "cluster={workers=1}"]',
     "(cluster is a table holding cluster.workers)"),
    ('scenarios = ["poisson_warm"', "TOML"),
    # the [scheduler] table as the policy reads it, before anything runs (a misspelt key
    # passed --list, then every point failed)
    ('scenarios = ["poisson_warm"]\n[grid]\n"scheduler.max_batc" = [1, 2]',
     "unknown scheduler setting 'max_batc' (did you mean 'max_batch'?)"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"scheduler.policy" = ["clockwork", "clipr"]',
     "unknown scheduler policy 'clipr'"),
    # what only the simulator checks, before anything runs as clockwork simulate does (each
    # was an error row after the other points ran, exit 1)
    ('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.slo_ms" = [-5, 50]',
     "with workloads.0.slo_ms=-5: workloads.0: slo_ms must be > 0"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.rate_rps" = [100.0]\n'
     '"workloads.0.burst" = [1, 2]', "burst"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.kind" = ["nosuch"]', "nosuch"),
    ('scenarios = ["poisson_warm"]\noverrides = ["duration_s=5"]\n[grid]\n'
     '"faults.kill" = [[{worker = 0, at_s = 6.0}]]', "faults.kill.0.at_s: must be before the end"),
    ('scenarios = ["poisson_warm"]\n[grid]\n"cluster.profiles" = ["/nonexistent/profiles"]',
     "/nonexistent/profiles"),
]


@pytest.mark.parametrize("text,fragment", BAD)
def test_bad_sweep_file_is_one_line_exit_2(tmp_path, capsys, text, fragment):
    f = tmp_path / "bad.toml"
    f.write_text(text + "\n")
    assert main(["sweep", str(f), "--out", str(tmp_path / "o")]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0].startswith("clockwork sweep: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in cap.err and not (tmp_path / "o").exists()


def test_bad_arguments(tmp_path, capsys):
    assert main(["sweep", "no_such_sweep"]) == 2
    assert "no_such_sweep" in capsys.readouterr().err
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\n')
    assert main(["sweep", str(f), "--plot"]) == 2  # nothing to plot against
    assert "[grid]" in capsys.readouterr().err
    assert main(["sweep", str(f), "--jobs", "0"]) == 2
    assert main(["sweep", str(f), "--backend", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    # two backends asked for (--ray won without a word, running on Ray)
    assert main(["sweep", str(f), "--backend", "local", "--ray"]) == 2
    assert "--ray and --backend local ask for two backends" in capsys.readouterr().err


def test_jobs_is_bounded_and_one_out_folder_takes_one_sweep(tmp_path, capsys):
    """--jobs above 1,024 is refused (a typo must not fork thousands of processes); a
    second sweep (or plan) on an --out that another one is writing is refused at once,
    in one line, running nothing."""
    import fcntl

    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    for argv in (["sweep", str(f), "--out", str(out)], ["plan", "poisson_warm"]):
        assert main([*argv, "--jobs", "5000"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--jobs 5000: at most 1,024" in err[0], err
    assert not out.exists()
    out.mkdir()
    with open(out / ".lock", "a") as held:  # (as a sweep running on it holds it)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for argv in (["sweep", str(f), "--jobs", "1"],
                     ["plan", "poisson_warm", "--max-gpus", "1", "--seeds", "1"]):
            assert main([*argv, "--out", str(out)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "in use by another sweep or plan" in err[0], err
        assert not (out / "points").exists()
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0


def test_shipped_example_loads():
    s = load_sweep("example")
    assert len(s.points) == 12 and s.keys == ["workloads.0.slo_ms"]


def test_help_lists_the_verbs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "sweep" in out and "plan" in out
    for verb in ("sweep", "plan"):
        assert main([verb, "--help"]) == 0
        assert "--jobs" in capsys.readouterr().out


def test_missing_progress_bar_package_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    assert main(["sweep", "example"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clockwork sweep: needs tqdm") and "\n" not in err


@pytest.mark.parametrize("value", [1, -3, 2.5, 1e-05, 1e20, True, False, "a b\"c", "x/y",
                                   [1, 2.0, "z"], {"a": 1, "b c": [True]}, [],
                                   # outside the BMP, DEL, control characters, a backslash
                                   "\U0001F680 set", "del\x7f", "\x00\t\n\x1f", "a\\b",
                                   "donn\u00e9es", {"\U0001F680": "\x7f"}])
def test_values_survive_set(value):
    assert parse_value(toml_value(value)) == value


@pytest.mark.parametrize("value", ["a b\"c", "tab\there", "\x1b", "donn\u00e9es",
                                   {"donn\u00e9es": "x\ny"}, {"k": "\x1b"}])
def test_a_value_is_written_as_before_where_that_was_valid(value):
    """A point's name hashes its overrides' text: a value spelled as earlier versions
    wrote it (JSON's spelling; table keys ASCII-only) keeps an existing sweep folder's
    points found on resume. Only what JSON wrote that TOML refuses is written otherwise
    (the cases of test_values_survive_set)."""
    import json

    def old(v):  # the spelling of earlier versions
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {old(x)}"
                                   for k, x in v.items()) + "}"
        return json.dumps(v, ensure_ascii=False)

    assert toml_value(value) == old(value)


def test_a_lone_surrogate_has_no_set_form():
    with pytest.raises(ValueError, match="TOML string"):
        toml_value("bad\udcff")


def test_pinned_paths_of_any_name_reach_a_point_run_elsewhere(tmp_path, monkeypatch):
    """A point run in another working folder (a Ray task) gets the scenario's files as
    this process found them (``pinned_point``), whatever their names: a profile set in a
    folder named with a character outside the BMP (written as JSON's surrogate escapes,
    which TOML refuses, the path was taken with its quotes and not found) and a trace
    under a non-ASCII name."""
    from clockwork.cluster.parallel import pinned_point, run_point
    from tests.conftest import scenario_apart_from_its_files

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLOCKWORK_PROFILES", raising=False)
    sets = tmp_path / "\U0001F680 sets"
    scenario_apart_from_its_files(tmp_path, "\U0001F680 sets/rp", "donn\u00e9es")
    point = Point("sub/s.toml", "sub/s.toml", ("seed=1",), (("seed", 1),))
    here = run_point(point)
    assert "summary" in here, here
    pinned = pinned_point(point)
    assert dict(pinned.pinned) == {
        "cluster.profiles": str(sets / "rp"),
        "workloads.0.trace": str(tmp_path / "donn\u00e9es" / "t.csv.gz")}, pinned.pinned
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert "error" in run_point(point)  # (as written, the paths mean the other folder)
    there = run_point(pinned)
    assert "summary" in there, there
    assert there["summary"] == here["summary"]
    assert there["run"]["overrides"] == ["seed=1"]  # the pins are not the point's


def test_an_azure_day_found_here_is_the_one_a_point_run_elsewhere_reads(tmp_path, monkeypatch,
                                                                        capsys):
    """An azure workload's ``day`` is looked for in ``trace_dir``, then in
    ``$AZURE_TRACE_DIR`` and the usual folders: a point run in another process (a Ray
    task: another folder, another environment) looked the day up again there, and read
    another file than the one this process found (and digested), or none. The folder
    it was found in here is now pinned as the point's ``trace_dir``."""
    from clockwork.cluster.parallel import pinned_point, run_point

    traces = tmp_path / "days"
    assert main(["trace", "synth", "--functions", "40", "--seed", "3", "--out",
                 str(traces)]) == 0
    capsys.readouterr()
    sc = tmp_path / "s.toml"
    sc.write_text("""name = "d"
duration_s = 60.0
[[models]]
name = "resnet50_v2"
copies = 4
[[workloads]]
kind = "azure"
day = 1
minutes = 1
""")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AZURE_TRACE_DIR", str(traces))
    point = Point(str(sc), str(sc), ("seed=1",), (("seed", 1),))
    here = run_point(point)
    assert "summary" in here, here
    pinned = pinned_point(point)
    assert dict(pinned.pinned)["workloads.0.trace_dir"] == str(traces), pinned.pinned
    monkeypatch.delenv("AZURE_TRACE_DIR")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert "no Azure trace file for day 1" in run_point(point)["error"]
    there = run_point(pinned)
    assert "summary" in there, there
    assert there["summary"] == here["summary"]


def test_point_names_are_stable():
    p = Point("poisson_warm", "/anywhere/poisson_warm.toml",
              ("duration_s=2", "workloads.0.slo_ms=25", "seed=1"),
              (("workloads.0.slo_ms", 25), ("seed", 1)))
    assert p.name == "poisson_warm_workloads.0.slo_ms=25_seed=1-f6b82cd6df"
    assert Point("poisson_warm", "/elsewhere.toml", p.overrides, p.labels).name == p.name
    long = Point("x.toml", "x", ("a=" + "q" * 300,), (("a", "q" * 300),))
    assert len(long.name) <= 96 + 11 and os.sep not in long.name


def test_a_points_command_runs_as_written_from_any_folder(tmp_path, monkeypatch, capsys):
    """point.json's command: a shipped scenario by its name, a file by its full path (the
    sweep file named it relative to its own folder, which need not be the current one)."""
    import shlex
    import shutil

    from clockwork.resources import resolve_scenario

    here = tmp_path / "sweeps"
    here.mkdir()
    shutil.copy(resolve_scenario("poisson_warm"), here / "mine.toml")
    p = Point("mine.toml", str(here / "mine.toml"), ("duration_s=1",))
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    argv = shlex.split(p.command())
    assert argv[:2] == ["clockwork", "simulate"] and argv[2] == str(here / "mine.toml")
    assert main(argv[1:] + ["--quiet"]) == 0
    assert Point("poisson_warm", str(resolve_scenario("poisson_warm"))).command() == \
        "clockwork simulate poisson_warm"
    # a scenario found next to the sweep file by its bare name: by its path (by name, the
    # shipped one ran: other figures, or "not found" for a name none ships)
    shutil.copy(resolve_scenario("poisson_warm"), here / "poisson_warm.toml")
    (here / "s.toml").write_text('scenarios = ["poisson_warm", "mine"]\n')
    got = [shlex.split(p.command())[2] for p in load_sweep(here / "s.toml").points]
    assert got == [str(here / "poisson_warm.toml"), str(here / "mine.toml")]


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\n[grid]\n"cluster.workers" = [1]\n')
    assert main(["sweep", str(f), "--plot", "--out", str(tmp_path / "o")]) == 2
    assert main(["plan", "poisson_warm", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("needs matplotlib" in x and "[plots]" in x for x in err)
    assert not (tmp_path / "o").exists()


def test_a_backend_plugs_in(tmp_path, monkeypatch, capsys):
    """The seam another engine uses: a factory jobs -> concurrent.futures.Executor (here
    threads), or "module:function" imported when asked for."""
    from concurrent.futures import ThreadPoolExecutor

    from clockwork.cluster import parallel

    submitted = []

    class Threads(ThreadPoolExecutor):  # (and what the engine is handed)
        def submit(self, fn, /, *args, **kw):
            submitted.append(args)
            return super().submit(fn, *args, **kw)

    monkeypatch.setitem(parallel.BACKENDS, "threads", lambda jobs: Threads(1))
    monkeypatch.setitem(parallel.BACKENDS, "absent", "no_such_engine_module:executor")
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\n')
    monkeypatch.chdir(tmp_path)  # a relative --out: the engine still gets full paths
    assert main(["sweep", str(f), "--out", "a", "--backend", "threads", "--quiet"]) == 0
    # (an engine's workers need not share our folder: Ray's run where ray start ran)
    assert len(submitted) == 2 and all(
        os.path.isabs(point.path) and os.path.isabs(folder) for point, folder, _ in submitted)
    assert main(["sweep", str(f), "--out", str(tmp_path / "b"), "--jobs", "2", "--quiet"]) == 0
    assert (tmp_path / "a" / "results.json").read_bytes() == \
        (tmp_path / "b" / "results.json").read_bytes()
    capsys.readouterr()
    # (Ray runs as many at once as its cluster has CPUs: the status line says so, not --jobs)
    monkeypatch.setitem(parallel.BACKENDS, "ray", lambda jobs: Threads(1))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # (--ray takes it out: put back after)
    assert main(["sweep", str(f), "--out", "c", "--ray", "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert "as many at a time as the Ray cluster has CPUs (ray)" in err and "2 at a time" \
        not in err
    assert main(["sweep", str(f), "--backend", "absent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clockwork sweep: --backend absent needs no_such_engine_module")


def test_the_pool_grows_with_a_larger_round(tmp_path, monkeypatch):
    """A Runner kept for several runs (clockwork plan's rounds) makes its pool for the
    first run's points, no more than --jobs; a later, larger run gets a larger pool (up
    to --jobs), not the first one's."""
    from concurrent.futures import ThreadPoolExecutor

    from clockwork.cluster import parallel

    sizes = []

    def pool(jobs):
        sizes.append(jobs)
        return ThreadPoolExecutor(jobs)

    summary = {k: 1 for k in ("submitted", "succeeded", "slo_met", "failed", "dropped",
                              "goodput_rps", "throughput_rps", "slo_attainment",
                              "cold_starts")}
    summary |= {"latency_ms": {"p50": 1, "p99": 1, "p999": 1, "max": 1},
                "actions": {"load": 0, "evict": 0}}
    monkeypatch.setattr(parallel, "run_point",
                        lambda point, folder, logs: {"summary": summary, "run": {}})
    monkeypatch.setitem(parallel.BACKENDS, "spy", pool)
    pts = [Point("x", "x.toml", (f"seed={i}",)) for i in range(12)]
    with parallel.Runner(4, "spy", progress=False) as r:
        for n in (1, 2, 2, 3, 12, 1):
            assert all(o.ok for o in r.run(pts[:n], tmp_path / str(n)))
    assert sizes == [1, 2, 3, 4]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_running_simulations(tmp_path):
    import signal
    import subprocess
    import time

    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2, 3]\n'
                 'overrides = ["duration_s=600"]\n')
    proc = subprocess.Popen(
        cli_command("sweep", str(f), "--jobs", "2", "--out", str(tmp_path / "o"), "--quiet"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children_file = f"/proc/{proc.pid}/task/{proc.pid}/children"
    kids: list[int] = []
    deadline = time.monotonic() + 30
    while len(kids) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            kids = [int(x) for x in open(children_file).read().split()]
        except OSError:
            break
    assert len(kids) >= 2, "the pool did not start"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and b"interrupted" in err
    for pid in kids:  # the simulations were ended, not left running
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert not list((tmp_path / "o" / "points").glob("*/summary.json"))


def _pool_of(proc, n: int = 2) -> list[int]:
    """The pids of ``proc``'s children once ``n`` of them run (its process pool)."""
    import time

    children_file = f"/proc/{proc.pid}/task/{proc.pid}/children"
    kids: list[int] = []
    deadline = time.monotonic() + 30
    while len(kids) < n and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            kids = [int(x) for x in open(children_file).read().split()]
        except OSError:
            break
    assert len(kids) >= n, "the pool did not start"
    return kids


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Every process in ``pids`` has ended (or is a zombie) within ``within_s``."""
    import time

    def alive(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _long_sweep(tmp_path, *extra):
    import subprocess

    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2, 3]\n'
                 'overrides = ["duration_s=600"]\n')
    return subprocess.Popen(
        cli_command("sweep", str(f), "--jobs", "2", "--out", str(tmp_path / "o"), "--quiet",
                    *extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_like_ctrl_c_and_sigkill_leaves_no_simulation_running(tmp_path):
    """SIGTERM: exit 130 as Ctrl-C, the pool ended. SIGKILL (nothing to handle it): the
    pool's processes end by themselves, not left running handed to pid 1."""
    import signal
    import time

    pool: list[int] = []
    try:
        proc = _long_sweep(tmp_path)
        kids = _pool_of(proc)
        pool += kids
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and b"interrupted" in err, err
        assert _gone(kids)

        proc = _long_sweep(tmp_path)
        kids = _pool_of(proc)
        pool += kids
        time.sleep(0.5)
        proc.kill()
        proc.communicate(timeout=20)
        assert _gone(kids), "the pool outlived its parent"
    finally:
        for pid in pool:  # (were they left running)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not list((tmp_path / "o" / "points").glob("*/summary.json"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's default here")
def test_a_process_with_grpc_does_not_fork_its_pool(tmp_path, monkeypatch):
    """Forking while gRPC's threads may be inside a call can leave the child with gRPC's
    locks held; a process that has loaded gRPC gets its pool from a fork server instead,
    with the same results."""
    import grpc

    from clockwork.cluster import parallel

    monkeypatch.delitem(sys.modules, "grpc")
    assert parallel.start_method() == "fork"
    monkeypatch.setitem(sys.modules, "grpc", grpc)
    assert parallel.start_method() == "forkserver"
    channel = grpc.insecure_channel("127.0.0.1:1")  # gRPC's threads busy reconnecting
    channel.subscribe(lambda state: None, try_to_connect=True)
    try:
        f = tmp_path / "s.toml"
        f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2]\n'
                     'overrides = ["duration_s=1", "drain_s=1"]\n')
        assert main(["sweep", str(f), "--out", str(tmp_path / "a"), "--jobs", "2",
                     "--quiet"]) == 0
        assert main(["sweep", str(f), "--out", str(tmp_path / "b"), "--jobs", "1",
                     "--quiet"]) == 0
        assert (tmp_path / "a" / "results.json").read_bytes() == \
            (tmp_path / "b" / "results.json").read_bytes()
    finally:
        channel.close()


def test_only_a_name_or_sweeps_name_means_a_shipped_sweep(tmp_path, monkeypatch, capsys):
    """``example``, ``example.toml`` and ``sweeps/example.toml`` are the shipped sweep; a
    path elsewhere (another folder, an absolute path) whose file is missing is "not
    found", one line, exit 2, naming the close shipped sweeps; nothing is run or listed."""
    from clockwork.cluster.sweep import SweepError, resolve_sweep
    from clockwork.resources import data_root

    monkeypatch.chdir(tmp_path)
    shipped = data_root() / "sweeps" / "example.toml"
    for name in ("example", "example.toml", "sweeps/example.toml", "sweeps/example"):
        assert resolve_sweep(name) == shipped, name
    for name in ("mysweep/example.toml", "/example.toml", "/sweeps/example.toml",
                 "a/sweeps/example.toml", str(tmp_path / "example.toml"), "exampel"):
        with pytest.raises(SweepError, match="not found"):
            resolve_sweep(name)
        for extra in ([], ["--list"]):
            assert main(["sweep", name, "--jobs", "1", "--quiet", *extra]) == 2
            cap = capsys.readouterr()
            err = cap.err.strip().splitlines()
            assert cap.out == "" and len(err) == 1, (name, cap)
            assert err[0].startswith(f"clockwork sweep: sweep file {name} not found"), err
            assert "example" in err[0].removeprefix(f"clockwork sweep: sweep file {name}")
    assert not (tmp_path / "sweeps").exists()
    # a file that is there is that file, whatever its name
    (tmp_path / "mysweep").mkdir()
    (tmp_path / "mysweep" / "example.toml").write_text('scenarios = ["poisson_warm"]\n')
    assert resolve_sweep("mysweep/example.toml").resolve() == \
        tmp_path / "mysweep" / "example.toml"


def test_latency_is_not_available_when_no_request_succeeded(tmp_path, capsys):
    """A point where no request succeeded (an SLO none can meet: all dropped) has no
    latency: n/a in the table, an empty field in results.tsv, null in results.json (its
    summary.json, kept whole there, is simulate's, with 0.0); a point with answers has
    its figures."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 '[grid]\n"workloads.0.slo_ms" = [0.01, 100]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    table = capsys.readouterr().out.splitlines()
    lat = ["p50_ms", "p99_ms", "p999_ms", "max_ms"]
    none, some = orjson.loads((out / "results.json").read_bytes())["points"]
    assert none["submitted"] > 0 and none["succeeded"] == 0 and some["succeeded"] > 0
    assert all(none[c] is None for c in lat) and all(some[c] > 0 for c in lat)
    assert none["summary"]["latency_ms"]["p99"] == 0.0  # (summary.json as simulate's)
    at = table[0].index("p99 ms")  # (the columns are left-aligned)
    assert table[1][at:].split()[0] == "n/a"
    assert table[2][at:].split()[0] == f"{some['p99_ms']:.2f}"
    tsv = [line.split("\t") for line in (out / "results.tsv").read_text().splitlines()]
    for c in lat:
        i = tsv[0].index(c)
        assert tsv[1][i] == "" and float(tsv[2][i]) == some[c]


def test_a_point_with_no_requests_has_no_attainment_and_is_warned_of(tmp_path, capsys):
    """A point that submitted no requests (its run too short for its rates) has no SLO
    attainment (0 of 0): n/a in the table, null in results.json, left out of the plot's
    mean over seeds (it was 0.0, and a line at 0.5 for one empty seed of two), and a
    warning names it, as ``simulate`` warns of such a run; a point with requests keeps
    its figures."""
    pytest.importorskip("matplotlib")
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["bursty"]\noverrides = ["duration_s=3"]\nseeds = [11, 12]\n'
                 '[grid]\n"workloads.0.slo_ms" = [100]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--out", str(out), "--jobs", "1", "--plot"]) == 0
    cap = capsys.readouterr()
    empty, full = orjson.loads((out / "results.json").read_bytes())["points"]
    assert empty["submitted"] == 0 and full["submitted"] > 0, (empty, full)
    assert empty["slo_attainment"] is None and full["slo_attainment"] == 1.0
    table = cap.out.splitlines()
    at = table[0].index("attainment")
    assert table[1][at:].split()[0] == "n/a" and table[2][at:].split()[0] == "1.000000"
    warned = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert len(warned) == 1 and "1 point(s) submitted no requests" in warned[0], cap.err
    assert empty["point"] in warned[0] and full["point"] not in warned[0]
    assert (out / "sweep.png").stat().st_size > 0


def test_the_files_out_is_checked_as_out_is(tmp_path, monkeypatch, capsys):
    """The sweep file's ``out`` (and the default sweeps/<stem>) is checked before
    anything runs as --out is: one line, exit 2, naming the file's key (it said "--out",
    never given, or was a raw OSError, exit 1)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    f = tmp_path / "s.toml"
    body = 'scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
    for out, fragment in (("afile", "'afile' exists and is not a folder"),
                          ("afile/sub", "'afile' is not a folder")):
        f.write_text(body + f"out = {out!r}\n")
        for extra in ([], ["--list"]):
            assert main(["sweep", str(f), "--jobs", "1", "--quiet", *extra]) == 2
            cap = capsys.readouterr()
            err = cap.err.strip().splitlines()
            assert cap.out == "" and len(err) == 1 and "Traceback" not in cap.err, cap
            assert err[0].startswith(f"clockwork sweep: {f}: out: "), err
            assert fragment in err[0] and "--out" not in err[0], err
    # a folder this process may not write into (as a read-only one: no file can be made)
    (tmp_path / "ro").mkdir()
    real_can = argtypes._can_write_into
    monkeypatch.setattr(argtypes, "_can_write_into", lambda folder: False
                        if os.path.abspath(folder) == str(tmp_path / "ro")
                        else real_can(folder))
    f.write_text(body + 'out = "ro/x"\n')
    for argv in (["sweep", str(f)], ["sweep", str(f), "--out", "ro/x"]):
        assert main([*argv, "--jobs", "1", "--quiet"]) == 2
        cap = capsys.readouterr()
        err = cap.err.strip().splitlines()
        assert len(err) == 1 and "cannot make folder 'ro/x': cannot write into 'ro'" in err[0]
        assert (f"{f}: out: " in err[0]) == ("--out" not in argv), err
    assert not (tmp_path / "ro" / "x").exists()
    # --out wins over the file's out, unchecked then
    assert main(["sweep", str(f), "--out", str(tmp_path / "o"), "--list"]) == 0
    capsys.readouterr()
    # the default, sweeps/<stem>, where "sweeps" is a file
    f.write_text(body)
    (tmp_path / "sweeps").write_text("x")
    assert main(["sweep", str(f), "--jobs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'sweeps' is not a folder" in err[0] and "--out" in err[0], err
    assert not (tmp_path / "o").exists()


def test_list_only_reads_the_output_folder(tmp_path, monkeypatch, capsys):
    """--list writes nothing, so a folder it may not write into (or not there yet, under
    one it may not write into) is listed, not refused; running there still is."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    real_can = argtypes._can_write_into
    monkeypatch.setattr(argtypes, "_can_write_into", lambda folder: False
                        if str(os.path.abspath(folder)).startswith(str(out))
                        else real_can(folder))
    capsys.readouterr()
    assert main(["sweep", str(f), "--out", str(out), "--list"]) == 0
    cap = capsys.readouterr()
    assert [x.split()[0] for x in cap.out.splitlines()] == ["done", "done"], cap
    assert main(["sweep", str(f), "--out", str(out / "new"), "--list"]) == 0
    assert [x.split()[0] for x in capsys.readouterr().out.splitlines()] == ["to", "to"]
    assert not (out / "new").exists()
    assert main(["sweep", str(f), "--out", str(out), "--jobs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --out: cannot write into" in err[0], err


def test_a_point_whose_scenario_file_changed_runs_again(tmp_path, capsys):
    """A sweep (and a plan, which runs its points the same way) reused a point's result
    after its scenario file was edited: the folder's name hashes the scenario as written
    and the overrides, not what the file holds. A point now records the file's digest
    and is done only while the file is the same."""
    sc = tmp_path / "mine.toml"
    text = (REPO / "scenarios" / "poisson_warm.toml").read_text()
    sc.write_text(text)
    f = tmp_path / "s.toml"
    f.write_text(f'scenarios = ["{sc}"]\noverrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    first = _summaries(out)
    capsys.readouterr()
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    assert "0 run, 1 already done" in capsys.readouterr().err
    sc.write_text(text.replace("rate_rps = 723.5", "rate_rps = 100"))
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--list"]) == 0
    assert capsys.readouterr().out.startswith("to run")
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    assert "1 run, 0 already done" in capsys.readouterr().err
    (name, again), = _summaries(out).items()
    assert orjson.loads(again)["submitted"] < orjson.loads(first[name])["submitted"] / 3


def test_a_scenario_name_is_looked_for_next_to_the_sweep_file_first(tmp_path, capsys):
    """A shipped scenario copied next to a sweep file and edited there, named as the
    shipped one is (``poisson_warm``, no ``.toml``): the copy runs (the shipped one ran,
    silently). A name with no file next to it is the shipped scenario."""
    (tmp_path / "poisson_warm.toml").write_text(
        (REPO / "scenarios" / "poisson_warm.toml").read_text().replace(
            "rate_rps = 723.5", "rate_rps = 100"))
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm", "bursty"]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    rows = [ln.split("\t") for ln in (out / "results.tsv").read_text().splitlines()]
    col = rows[0].index("submitted")
    got = {r[1]: int(r[col]) for r in rows[1:]}
    assert got["poisson_warm"] < 200 and "bursty" in got, got  # (the shipped: ~720 in 1 s)


def test_a_point_whose_trace_or_profiles_changed_runs_again(tmp_path, capsys):
    """A sweep reused a point's result after a file its scenario reads (a trace, a
    profile set) had changed: only the scenario file itself was covered. A point's
    digest now covers every file its run reads, found as the run finds them (here by
    paths relative to the scenario's folder)."""
    traces = tmp_path / "traces"
    synth = ["trace", "synth", "--functions", "50", "--days", "1"]
    assert main([*synth, "--seed", "1", "--out", str(traces)]) == 0
    day1 = sorted(traces.glob("*d01.csv"))[0]
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles" / "v100-reference", profiles)
    sc = tmp_path / "mine.toml"
    sc.write_text(f"""name = "x"
seed = 1
duration_s = 60.0
[cluster]
profiles = "profiles"
[[models]]
name = "resnet50_v2"
copies = 20
[[workloads]]
kind = "azure"
trace = "traces/{day1.name}"
minutes = 1
load_factor = 10
""")
    f = tmp_path / "s.toml"
    f.write_text(f'scenarios = ["{sc}"]\n')
    out = tmp_path / "o"
    argv = ["sweep", str(f), "--jobs", "1", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    first = _summaries(out)
    capsys.readouterr()
    assert main(argv) == 0
    assert "0 run, 1 already done" in capsys.readouterr().err
    assert main([*synth, "--seed", "2", "--out", str(tmp_path / "other")]) == 0
    shutil.copy(sorted((tmp_path / "other").glob("*d01.csv"))[0], day1)  # the trace changed
    capsys.readouterr()
    assert main([*argv, "--list"]) == 0
    assert capsys.readouterr().out.startswith("to run")
    assert main(argv) == 0
    assert "1 run, 0 already done" in capsys.readouterr().err
    (name, again), = _summaries(out).items()
    assert orjson.loads(again)["submitted"] != orjson.loads(first[name])["submitted"]
    assert main(argv) == 0
    assert "0 run, 1 already done" in capsys.readouterr().err
    prof = profiles / "resnet50_v2.json"
    prof.write_text(prof.read_text().replace("{", "{ ", 1))  # the profile set changed
    assert main(argv) == 0
    assert "1 run, 0 already done" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_simulation_process_that_dies_costs_no_other_point(tmp_path):
    """One of the pool's processes killed (the OOM killer, say) while points run and wait:
    the points the broken pool failed run again, each in a process of its own, so only a
    point that kills its process again fails (every point not yet done failed with
    'BrokenProcessPool', and a point that always died broke every later run too)."""
    import signal
    import subprocess

    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2, 3, 4]\n'
                 'overrides = ["duration_s=60"]\n')
    proc = subprocess.Popen(cli_command("sweep", str(f), "--jobs", "2", "--out",
                                        str(tmp_path / "o")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kids = _pool_of(proc)
    try:
        os.kill(kids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert len(list((tmp_path / "o" / "points").glob("*/summary.json"))) == 4
    assert b"BrokenProcessPool" not in err


def test_a_point_run_again_keeps_no_logs_of_its_earlier_run(tmp_path, capsys):
    """A point run again in its folder (its scenario file changed) by a sweep without
    logs: the logs of its earlier run are gone with its summary (they stayed beside the
    new summary, and `clockwork report --timeline` read another run's rows)."""
    sc = tmp_path / "mine.toml"
    text = (REPO / "scenarios" / "poisson_warm.toml").read_text()
    sc.write_text(text)
    f = tmp_path / "s.toml"
    f.write_text(f'scenarios = ["{sc}"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 "logs = true\n")
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    (point,) = (out / "points").iterdir()
    assert (point / "requests.tsv").exists() and (point / "actions.tsv").exists()
    sc.write_text(text.replace("rate_rps = 723.5", "rate_rps = 100"))
    f.write_text(f'scenarios = ["{sc}"]\noverrides = ["duration_s=1", "drain_s=1"]\n')
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    assert (point / "summary.json").exists() and not list(point.glob("requests.*"))
    assert not list(point.glob("actions.*"))
    capsys.readouterr()


def test_a_stopped_run_leaves_no_earlier_tables_looking_current(tmp_path, capsys,
                                                                 monkeypatch):
    """results.tsv/json (a sweep) and plan.json/curve.tsv (a plan) of an earlier run are
    removed when a run that has points to run starts: one stopped before its end left
    the earlier tables, a point short, looking like its own."""
    from clockwork.cluster import parallel

    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    assert (out / "results.tsv").exists() and (out / "results.json").exists()
    f.write_text(f.read_text().replace("seeds = [1]", "seeds = [1, 2]"))

    def stopped(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(parallel, "run_point", stopped)
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 130
    assert not (out / "results.tsv").exists() and not (out / "results.json").exists()
    capsys.readouterr()


def test_a_scheduler_setting_the_policy_ignores_is_a_warning_once(tmp_path, capsys):
    """A [scheduler] setting the points' policy takes but does not use is the warning
    `clockwork simulate` gives, once (not once per point), before anything runs; for a
    grid key it says its values give the same rows (they did, silently)."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2]\n'
                 'overrides = ["duration_s=1", "drain_s=1", "scheduler.policy=\\"clipper\\""]\n'
                 '[grid]\n"scheduler.schedule_ahead_ms" = [5, 50]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--out", str(out), "--list"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: [scheduler] schedule_ahead_ms not used by policy 'clipper'") \
        == 1, err
    assert "grid.scheduler.schedule_ahead_ms gives the same rows" in err
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    (i,) = [n for n, x in enumerate(lines) if "schedule_ahead_ms not used by policy" in x]
    assert lines[i].startswith("clockwork sweep: warning: ")
    assert i < next(n for n, x in enumerate(lines) if x.startswith("sweep s: 4 points"))
    # the clockwork policy uses it: no warning
    f.write_text(f.read_text().replace('"scheduler.policy=\\"clipper\\""', '"drain_s=2"')
                 .replace('"drain_s=1", ', ""))
    assert main(["sweep", str(f), "--out", str(tmp_path / "o2"), "--list"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_logs_asked_for_after_a_run_without_them_run_the_points_again(tmp_path, capsys):
    """`logs = true` in a sweep whose points ran without logs: those points are not done
    (`--list` says to run), they run again and write their logs; then they are done."""
    f = tmp_path / "s.toml"
    text = 'scenarios = ["poisson_warm"]\nseeds = [1, 2]\noverrides = ["duration_s=1", ' \
           '"drain_s=1"]\n'
    f.write_text(text)
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    before = _summaries(out)
    f.write_text(text + "logs = true\n")
    capsys.readouterr()
    assert main(["sweep", str(f), "--out", str(out), "--list"]) == 0
    assert [x.split()[0] for x in capsys.readouterr().out.splitlines()] == ["to", "to"]
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    assert "2 run, 0 already done" in capsys.readouterr().err
    for point in (out / "points").iterdir():
        assert (point / "requests.tsv").is_file() and (point / "actions.tsv").is_file()
    assert _summaries(out) == before
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    assert "0 run, 2 already done" in capsys.readouterr().err
    # one point's logs deleted: only it runs again
    (next((out / "points").iterdir()) / "actions.tsv").unlink()
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out)]) == 0
    assert "1 run, 1 already done" in capsys.readouterr().err


def test_a_point_whose_logs_cannot_be_written_is_its_error_with_one_job(tmp_path, capsys,
                                                                       monkeypatch):
    """With --jobs 1 (points run in this process) a point whose logs cannot be written (a
    full disk) is an error row, as with a pool: the other points run and the table is
    written (the error ended the whole sweep, with no table)."""
    from clockwork.telemetry import Telemetry

    write = Telemetry.write

    def full(self, out, *a, **kw):
        if "seed=2" in str(out):
            raise OSError(28, "No space left on device", str(out) + "/requests.tsv")
        return write(self, out, *a, **kw)

    monkeypatch.setattr(Telemetry, "write", full)
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\nseeds = [1, 2, 3]\n'
                 'overrides = ["duration_s=1", "drain_s=1"]\nlogs = true\n')
    out = tmp_path / os.fsdecode(b"o\xff")  # (a folder name that is not UTF-8 in the error)
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "failed: cannot write its logs into " in err and "Traceback" not in err
    rows = orjson.loads((out / "results.json").read_bytes())["points"]
    assert [r["status"] for r in rows] == ["ok", "error", "ok"]
    assert rows[1]["error"].startswith(f"cannot write its logs into {tmp_path}/o\\xff/")
    assert rows[1]["error"].endswith(": No space left on device")
    (failed,) = (out / "points").glob("*seed=2*")
    assert (failed / "error.txt").read_text() == rows[1]["error"] + "\n"
    assert len((out / "results.tsv").read_text().splitlines()) == 4


def test_file_names_that_are_not_utf8(tmp_path, capsys):
    """A sweep file and a scenario in a folder whose names are not UTF-8 (bytes the file
    system holds, a lone surrogate in Python): the sweep runs and writes its files, the
    name's bytes written \\xNN in JSON, and a point's command (bash's $'...') names the
    same file (point.json's command held the name as JSON escapes it, a text no shell
    turns back into the file's name); a point named by such a path (as `clockwork plan`
    makes one) has a name (a UnicodeEncodeError)."""
    import subprocess

    folder = tmp_path / os.fsdecode(b"d\xff")
    folder.mkdir()
    scenario = folder / "pw.toml"
    scenario.write_text((REPO / "scenarios" / "poisson_warm.toml").read_text())
    f = folder / os.fsdecode(b"sw\xfe.toml")
    f.write_text('scenarios = ["pw.toml"]\noverrides = ["duration_s=1", "drain_s=1"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    doc = orjson.loads((out / "results.json").read_bytes())
    assert doc["file"].endswith("/d\\xff/sw\\xfe.toml") and doc["sweep"] == "sw\\xfe"
    (point,) = (out / "points").iterdir()
    run = orjson.loads((point / "run.json").read_bytes())
    assert run["scenario"].endswith("/d\\xff/pw.toml")
    command = orjson.loads((point / "point.json").read_bytes())["command"]
    assert command == load_sweep(f).points[0].command()
    assert f"$'{tmp_path}/d\\xff/pw.toml'" in command
    if shutil.which("bash"):
        from clockwork.cluster.parallel import shell_word

        word = shell_word(str(scenario))
        got = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                             check=True).stdout
        assert got == os.fsencode(scenario)
    # a point named by such a path (as `clockwork plan` makes one) has a name
    bad = Point(os.fsdecode(b"bad\xff.toml"), os.fsdecode(b"bad\xff.toml"))
    other = Point(os.fsdecode(b"bad\xfe.toml"), os.fsdecode(b"bad\xfe.toml"))
    assert bad.name.startswith("bad-") and bad.key != other.key
    assert Point("caf\u00e9.toml", "x").key == Point("caf\u00e9.toml", "y").key
    capsys.readouterr()


def test_the_plot_gives_a_line_one_colour_on_both_panels_and_a_legend_entry(tmp_path,
                                                                             monkeypatch):
    """A line whose points have no attainment (no requests) is drawn on the goodput
    panel alone: each line keeps one colour on both panels (the colour cycles had got out
    of step: the legend's blue line was orange below) and is in the legend."""
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    import clockwork.cluster.sweep as sw

    made = {}
    subplots = plt.subplots

    def keep(*a, **kw):
        fig, axes = subplots(*a, **kw)
        made["axes"] = axes
        return fig, axes

    monkeypatch.setattr(plt, "subplots", keep)
    monkeypatch.setattr(plt, "close", lambda fig: None)
    sweep = SimpleNamespace(keys=["rate"], grid={"rate": [1, 2]}, name="t")
    table = [{"status": "ok", "scenario": name, "rate": x, "slo_attainment": att,
              "goodput_rps": 5.0 if att else 0.0}
             for name, att in (("A", None), ("B", 0.9)) for x in (1, 2)]
    sw.plot(tmp_path, sweep, table)
    top, bottom = made["axes"]
    below = {c.get_label(): c.lines[0].get_color() for c in bottom.containers}
    above = {c.get_label(): c.lines[0].get_color() for c in top.containers}
    assert above == {"B": below["B"]} and below["A"] != below["B"], (above, below)
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["B", "A"]


def test_a_pool_found_broken_as_points_go_in_runs_them_alone(tmp_path):
    """The pool breaks (a process of it killed) before a round's points have all gone in:
    each point of the round runs in a process of its own, and every one is done. The
    sweep ended in a BrokenProcessPool traceback from ``submit`` (a loaded host's run of
    the test above killed the process that early)."""
    import signal
    import time

    from clockwork.cluster.parallel import Point, Runner

    sc = str(REPO / "scenarios" / "poisson_warm.toml")
    points = [Point("poisson_warm", sc, ("duration_s=0.2", "drain_s=0.2", f"seed={k}"))
              for k in range(1, 4)]
    with Runner(2, "local", False, False) as runner:
        assert all(not o.error for o in runner.run(points[:2], tmp_path / "a", "first"))
        ex = runner._executor  # (the pool of the first round, kept for the next)
        os.kill(next(iter(ex._processes)), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not ex._broken:  # (its manager thread marks it: then submit raises)
            assert time.monotonic() < deadline, "the pool was not found broken"
            time.sleep(0.01)
        outcomes = runner.run(points, tmp_path / "b", "second")
    assert [bool(o.error) for o in outcomes] == [False] * 3, [o.error for o in outcomes]
    assert all((o.folder / "summary.json").exists() for o in outcomes)


@pytest.mark.parametrize("key", ["seed", "seed ", " seed"])
def test_a_grid_of_seeds_is_refused_however_the_key_is_spaced(tmp_path, key):
    """grid."seed " (a space in the quoted key) passed the check for grid.seed: the table
    showed seeds 5 and 6 beside the scenario's seed 1, and both points ran seed 1."""
    from clockwork.cluster.sweep import SweepError

    f = tmp_path / "s.toml"
    f.write_text(f'scenarios = ["poisson_warm"]\noverrides = ["duration_s=1"]\nseeds = [1]\n'
                 f'[grid]\n"{key}" = [5, 6]\n')
    with pytest.raises(SweepError, match="give the seeds as seeds"):
        load_sweep(f)


def test_points_a_broken_pool_failed_run_again_side_by_side(tmp_path, monkeypatch):
    """The points a broken pool failed run again each in a process of its own, ``jobs``
    at a time: they ran one after another (one process killed early made the rest of a
    sweep serial: 16.5 s against 9.7 s for six points on 2 jobs)."""
    import signal
    import threading
    import time

    from clockwork.cluster.parallel import Point, Runner

    sc = str(REPO / "scenarios" / "poisson_warm.toml")
    points = [Point("poisson_warm", sc, ("duration_s=0.2", "drain_s=0.2", f"seed={k}"))
              for k in range(1, 5)]
    at_once, most, lock = [0], [0], threading.Lock()
    alone = Runner._alone

    def counted(self, o, pools=None):
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
        try:
            return alone(self, o) if pools is None else alone(self, o, pools)
        finally:
            with lock:
                at_once[0] -= 1
    monkeypatch.setattr(Runner, "_alone", counted)
    with Runner(2, "local", False, False) as runner:
        assert all(not o.error for o in runner.run(points[:2], tmp_path / "a", "first"))
        ex = runner._executor
        os.kill(next(iter(ex._processes)), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not ex._broken:
            assert time.monotonic() < deadline, "the pool was not found broken"
            time.sleep(0.01)
        outcomes = runner.run(points, tmp_path / "b", "second")
    assert [bool(o.error) for o in outcomes] == [False] * 4, [o.error for o in outcomes]
    assert most[0] == 2


def test_files_that_cannot_be_written_cost_their_point_or_a_line_after_the_table(
        tmp_path, capsys):
    """A point's summary.json that cannot be written (here a folder in its place) is that
    point's error row, naming the file; the other point runs. results.json that cannot
    be written: the table is printed first, then one line naming it, exit 1, and no
    half-written file is left."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 '[grid]\n"workloads.0.slo_ms" = [10, 50]\n')
    out = tmp_path / "o"
    first = load_sweep(f).points[0].name
    (out / "points" / first / "summary.json").mkdir(parents=True)
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {out / 'points' / first / 'summary.json'}: Is a directory" in err
    rows = orjson.loads((out / "results.json").read_bytes())["points"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    (out / "points" / first / "summary.json").rmdir()
    (out / "results.json").unlink()
    (out / "results.json").mkdir()
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(out), "--quiet"]) == 1
    cap = capsys.readouterr()
    assert "poisson_warm  10" in cap.out and "poisson_warm  50" in cap.out, cap.out
    assert cap.err.strip().splitlines()[-1] == (
        f"clockwork sweep: cannot write {out / 'results.json'}: Is a directory"), cap.err
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_no_point_file_that_can_be_written_is_error_rows_with_jobs(tmp_path, capsys):
    """With --jobs 2, every point's point.json unwritable (folders in their place): error
    rows naming the file, exit 1 (a pool of no processes was made: a traceback)."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 '[grid]\n"workloads.0.slo_ms" = [10, 50]\n')
    out = tmp_path / "o"
    for p in load_sweep(f).points:
        (out / "points" / p.name / "point.json").mkdir(parents=True)
    assert main(["sweep", str(f), "--jobs", "2", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("point.json: Is a directory") == 2, err
    rows = orjson.loads((out / "results.json").read_bytes())["points"]
    assert [r["status"] for r in rows] == ["error", "error"]


def test_an_empty_list_grid_value_shows_as_one(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=1", "drain_s=1"]\n'
                 '[grid]\n"faults.hang" = [[], [{worker = 0, at_s = 0.5, for_s = 0.2}]]\n')
    assert main(["sweep", str(f), "--jobs", "1", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split()[:2] == ["poisson_warm", "[]"], printed
    tsv = [ln.split("\t") for ln in (tmp_path / "o" / "results.tsv").read_text().splitlines()]
    col = tsv[0].index("faults.hang")
    assert tsv[1][col] == "[]" and tsv[2][col].startswith("[{"), tsv
