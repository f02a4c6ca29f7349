"""experiments/azure_paper_scale.py end to end at a small size (the shipped trace sample,
two one-minute parts in child processes): with the rows kept in files (--spill-dir), and
with the parts side by side (--jobs 2), each giving the same parts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from experiments import azure_paper_scale


def test_two_parts_with_rows_in_files(tmp_path, capsys, monkeypatch):
    spill, out = tmp_path / "spill", tmp_path / "out"
    info = azure_paper_scale.main(["--trace", "sample", "--load-factor", "1", "--minutes", "2",
                                   "--part-minutes", "1", "--spill-dir", str(spill),
                                   "--out", str(out)])
    text = capsys.readouterr().out
    assert "in 2 part(s)" in text and "(in files: --spill-dir)" in text
    assert info["parts"] == 2 and info["instances"] == 4026 and info["gpus"] == 12
    # the sample offers ~52 r/s at load factor 1: every request answered on time
    assert 4000 < info["requests"] < 9000 and info["attainment"] > 0.99
    assert info["actions"]["load"] > 0 and info["cold_starts"] > 0
    assert info["spill_dir"] == str(spill) and list(spill.iterdir()) == []  # the rows' folders went
    saved = json.loads((out / "azure_paper_scale.json").read_text())
    assert saved["requests"] == info["requests"]
    # the seed the parts used (the base scenario's, no --seed given), not null
    assert saved["seed"] == 1 == json.loads((out / "part-0000" / "summary.json").read_text())["seed"]
    # Fig. 9's series, a row per trace minute
    rows = info["by_minute"]
    assert [r["trace_minute"] for r in rows] == [0, 1]
    assert sum(r["requests"] for r in rows) == info["requests"]
    assert sum(r["loads"] for r in rows) == info["actions"]["load"]
    assert sum(r["cold_starts"] for r in rows) == info["cold_starts"]
    assert all(0.99 < r["slo_attainment"] <= 1 and r["cold_models"] > 0 for r in rows)
    for part in ("part-0000", "part-0001"):
        z = np.load(out / part / "requests.npz")
        s = json.loads((out / part / "summary.json").read_text())
        assert len(z["latency"]) == s["submitted"] > 0
    assert sum(json.loads((out / p / "summary.json").read_text())["submitted"]
               for p in ("part-0000", "part-0001")) == info["requests"]

    # the same two parts side by side, rows in memory: the same summaries and logs
    monkeypatch.setattr(azure_paper_scale, "PROGRESS_S", 0.2)  # (a line on the parts)
    info2 = azure_paper_scale.main(["--trace", "sample", "--load-factor", "1", "--minutes", "2",
                                    "--part-minutes", "1", "--jobs", "2", "--out",
                                    str(tmp_path / "out2")])
    assert info2["requests"] == info["requests"] and info2["spill_dir"] is None
    for part in ("part-0000", "part-0001"):
        for name in ("summary.json", "requests.npz", "actions.npz"):
            assert (out / part / name).read_bytes() == (tmp_path / "out2" / part / name).read_bytes()
    text = capsys.readouterr().out
    assert info2["cpu_s"]["child"] > 0 and "(in memory)" in text
    assert " min: part 1 " in text, text  # where the running parts are


def test_a_warmed_up_part_counts_only_its_own_minutes(tmp_path):
    """A part whose warm-up reaches back to --start-minute simulates what the continuous
    run does, so its counted figures are that run's for the part's own minutes, exactly."""
    common = ["--trace", "sample", "--load-factor", "1", "--minutes", "3", "--no-noise"]
    whole = azure_paper_scale.main([*common, "--part-minutes", "0"])
    split = azure_paper_scale.main([*common, "--part-minutes", "2", "--warmup-minutes", "2"])
    assert split["parts"] == 2 and split["warmup_minutes"] == 2
    # part 2 (trace minute 2) simulated minutes 0..2, as the continuous run did
    assert split["by_minute"][2] == whole["by_minute"][2]
    assert split["by_minute"][2]["requests"] > 0 and split["by_minute"][2]["cold_starts"] > 0
    # part 1 (minutes 0..1) had no warm-up, and nothing after it: its minutes may differ
    # from the continuous run's only by what the third minute changed
    assert [r["trace_minute"] for r in split["by_minute"]] == [0, 1, 2]
    assert split["requests"] == sum(r["requests"] for r in split["by_minute"])
    assert split["requests"] == whole["requests"]  # the arrivals are the trace's
    assert split["actions"]["load"] == sum(r["loads"] for r in split["by_minute"])
    # the actions done after part 1's end are part 2's (part 1 counted them in its drain
    # too: two INFERs more than the continuous run in the review's case)
    assert split["actions"] == whole["actions"], (split["actions"], whole["actions"])


def test_the_cpu_rate_of_minutes_between_two_samples_is_theirs():
    """Samples further apart than a minute (the progress line's, 30 s in a log, a few
    minutes of a small run) gave their first minute every request and all the CPU, and
    the others 0."""
    timeline = azure_paper_scale.cpu_timeline
    m = azure_paper_scale.MINUTE_NS
    assert timeline([(0, 0.0, 0), (3 * m, 3.0, 300)], 3) == [100, 100, 100]
    assert timeline([(0, 0.0, 0), (m // 2, 1.0, 50), (2 * m, 2.0, 250), (2 * m + 5, 2.5, 260)],
                    2) == [88, 123]  # (116.7 requests in 1.33 s, then 143.3 in 1.17 s)


def test_another_seed_is_another_run_of_the_same_minutes():
    args = ["--trace", "sample", "--load-factor", "1", "--minutes", "1", "--no-noise"]
    one, again = azure_paper_scale.main(args), azure_paper_scale.main(args)
    other = azure_paper_scale.main([*args, "--seed", "2"])
    assert one["by_minute"] == again["by_minute"] and one["seed"] == 1  # the base scenario's
    assert other["seed"] == 2 and other["by_minute"] != one["by_minute"]
    assert abs(other["requests"] - one["requests"]) < 0.05 * one["requests"]  # the same trace


def test_ctrl_c_as_the_parts_start_kills_them(monkeypatch):
    """A Ctrl-C reaching the script just as it hands parts to the pool (after the first
    started, before the second) kills the part started: none runs on to its end while the
    script waits for it (under load, a stop took 11 s, the part's whole run)."""
    import subprocess
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    started: list[subprocess.Popen] = []
    up = threading.Event()

    class Recorded(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            started.append(self)
            up.set()

    class CtrlCAtSecondSubmit(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            if getattr(self, "_one", False):
                assert up.wait(60)  # the first part's process is up
                raise KeyboardInterrupt
            self._one = True
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(azure_paper_scale, "_STOP", threading.Event())
    monkeypatch.setattr(azure_paper_scale.subprocess, "Popen", Recorded)
    monkeypatch.setattr(azure_paper_scale, "ThreadPoolExecutor", CtrlCAtSecondSubmit)
    with pytest.raises(KeyboardInterrupt):
        azure_paper_scale.main(["--trace", "sample", "--minutes", "4", "--rate", "3000",
                                "--part-minutes", "2", "--jobs", "2"])
    # killed, not run to its end (exit 0) while the pool waited
    assert [p.returncode for p in started] == [-9]


@pytest.mark.parametrize("argv,option", [
    (["--hours", "nan"], "--hours"), (["--hours", "inf"], "--hours"),
    (["--hours", "1e308"], "--hours"), (["--hours", "-1"], "--hours"),
    (["--rate", "nan"], "--rate"), (["--load-factor", "inf"], "--load-factor"),
    (["--trace", "/nonexistent/day.csv"], "--trace"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_value_is_one_usage_line(argv, option, capsys):
    """A value the script cannot use stops it in its parser: one error line naming the
    option, exit 2 (--hours nan or inf ended in a traceback, a missing --trace file in
    exit 1 as if the run had failed)."""
    with pytest.raises(SystemExit) as e:
        azure_paper_scale.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and option in err.strip().splitlines()[-1], err


@pytest.mark.parametrize("jobs,group", [(2, True), (1, False), (1, True)],
                         ids=["2 jobs, Ctrl-C at a terminal", "1 job, SIGINT to the script",
                              "1 job, Ctrl-C at a terminal"])
def test_ctrl_c_removes_the_rows_in_spill_dir_and_says_so_once(tmp_path, jobs, group):
    """Stopped by SIGINT (to the whole process group, as Ctrl-C at a terminal sends it,
    or to the script alone), the script leaves nothing in --spill-dir (its parts, killed,
    left their row folders there: megabytes each here, gigabytes at scale) and says
    "interrupted" once (a part said it too)."""
    spill = tmp_path / "spill"
    spill.mkdir()
    from tests.conftest import script_command

    p = subprocess.Popen(script_command(Path(azure_paper_scale.__file__), "--trace",
                                        "sample", "--minutes", "4", "--part-minutes",
                                        "2" if jobs == 2 else "0", "--jobs", str(jobs),
                                        "--load-factor", "30", "--spill-dir", str(spill),
                                        "--out", str(tmp_path / "out")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (len(list(spill.rglob("clockwork-rows-*"))) < jobs and p.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert len(list(spill.rglob("clockwork-rows-*"))) == jobs  # every part simulating
        time.sleep(0.5)
        if group:
            os.killpg(p.pid, signal.SIGINT)
        else:
            os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130, (p.returncode, err[-500:])
        assert err.strip().splitlines() == ["azure_paper_scale.py: interrupted"], err[-500:]
        assert list(spill.rglob("*")) == []
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # (the parts too, had any been left running)
        except ProcessLookupError:
            pass
        p.wait()


def test_an_out_holding_another_runs_parts_is_refused(tmp_path, capsys):
    """--out holding part folders of an earlier run that this one would not replace is
    refused (the new run's parts were written beside them, for whoever reads part-* to
    take as one run); the parts this run writes may be there."""
    out = tmp_path / "out"
    (out / "part-0001").mkdir(parents=True)  # (an earlier run of minutes 0-1)
    (out / "part-0000").mkdir()
    with pytest.raises(SystemExit) as e:
        azure_paper_scale.main(["--trace", "sample", "--load-factor", "1", "--minutes", "1",
                                "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "part-0001" in err and "part-0000" not in err, err
