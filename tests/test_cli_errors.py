"""Every command-line entry point, fed bad values: exit code 2, exactly one line on stderr
that names the bad value, no traceback. And a verb whose optional part is missing says what
to install, while every other verb (and every --help) keeps working."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from clockwork.cluster.cli import main
from tests.conftest import cli_command

SC = "scenarios/poisson_warm.toml"

BAD = [
    # (argv, a fragment the one stderr line must contain)
    (["nosuchverb"], "nosuchverb"),
    (["simulate"], "scenario"),
    (["simulate", "no_such_scenario"], "no_such_scenario"),
    (["simulate", SC, "--set", "duration_s=abc"], "abc"),
    (["simulate", SC, "--set", "duration_s=-1"], "duration_s"),
    (["simulate", SC, "--set", "cluster.noise=nan"], "nan"),
    (["simulate", SC, "--set", "cluster.workers=0"], "workers"),
    (["simulate", SC, "--set", "cluster.workers=true"], "workers"),
    (["simulate", SC, "--set", "cluster.wokers=2"], "workers"),
    (["simulate", SC, "--set", "scheduler.max_batch=abc"], "max_batch"),
    (["simulate", SC, "--set", "nosuch=1"], "nosuch"),
    (["simulate", SC, "--set", "noequals"], "noequals"),
    (["simulate", SC, "--set", "cluster.profiles=no_such_set"], "no_such_set"),
    (["report", "/no/such/dir"], "/no/such/dir"),
    # an empty path is none (it would read as the current folder, or as no option given)
    (["simulate", SC, "--out", ""], "expected a path, got ''"),
    (["simulate", SC, "--spill-dir", " "], "expected a path, got ' '"),
    (["sweep", "example", "--out", ""], "expected a path, got ''"),
    (["trace", "synth", "--out", ""], "expected a path, got ''"),
    (["scenarios", "copy", "demo_live", "--to", ""], "expected a path, got ''"),
    (["serve", "--log-dir", ""], "expected a path, got ''"),
    (["controller", "--workers", "127.0.0.1:1", "--log-dir", ""], "expected a path"),
    (["controller", "--workers", "127.0.0.1:1", "--log-dir", "afile"], "is not a folder"),
    (["profile", "mlp", "--package", "afile", "--out", "out/mlp.json"],
     "a package is a folder: give the folder"),
    (["controller", "--workers", "127.0.0.1:1", "--policy", ""], "expected a name, got ''"),
    (["controller", "--workers", "127.0.0.1:1", "--profiles", " "], "expected a name"),
    (["worker", "--profiles", ""], "expected a name, got ''"),
    (["serve", "faults", "--worker-port", "65535"], "up to 65546, past 65535"),
    (["controller", "--workers", "127.0.0.1:5,127.0.0.1:5"], "listed twice"),
    (["infer", "m", "--slo-ms", "1e300"], "at most 86400000 (a day)"),
    (["plan", SC, "--max-gpus", "10001"], "--max-gpus 10001: 10,001 workers of 1 GPU(s)"),
    (["simulate", "adir"], "is a folder, not a scenario file"),
    # (each said "not found", or " is a folder" with no name)
    (["simulate", "/dev/null"], "/dev/null is not a regular file, not a scenario file"),
    (["simulate", ""], "no scenario file given (an empty name)"),
    (["sweep", "adir"], "adir is a folder, not a sweep file"),
    (["sweep", "/dev/null"], "/dev/null is not a regular file, not a sweep file"),
    # options that contradict each other (the progress line won; --trace-dir was ignored)
    (["simulate", SC, "--quiet", "--progress"], "--progress: not allowed with argument --quiet"),
    (["sweep", "example", "--quiet", "--progress"], "not allowed with argument --quiet"),
    (["trace", "info", "day.csv", "--trace-dir", "x"], "--trace-dir is for a DAY number"),
    (["serve", "--progress"], "--progress needs --replay"),
    # (a title of two lines split the table's first line)
    (["simulate", SC, "--set", "name=a\nb"], "name: must be one line of text"),
    (["report", "--timeline", "adir"], "give the run folder before --timeline"),
    (["serve", "faults", "--port", "23456", "--worker-port", "23446"],
     "--port 23456 is worker 1's port (--worker-port 23446: worker i listens on 23446 + 10 i, its fast link on 23446 + 10 i + 1)"),
    (["report", SC, "--timeline", "-3"], "-3"),
    (["serve", "--port", "99999"], "99999"),
    (["serve", "--http-port", "-5"], "-5"),
    (["serve", "--device", "tpu"], "tpu"),
    (["serve", SC, "--set", "cluster.gpus_per_worker=-1"], "gpus_per_worker"),
    (["serve", "no_such_scenario"], "no_such_scenario"),
    # refused before anything starts, as simulate refuses them (serve started the
    # cluster, and every request for such a model failed)
    (["serve", SC, "--set", "cluster.weights_cache_pages=1"],
     "model 'resnet50_v2' takes 7 pages, more than the 1 page(s)"),
    (["serve", SC, "--set", "models.0.name=nosuchmodel"], "no profile for model 'nosuchmodel'"),
    (["replay", SC, "--controller", "nohostport"], "nohostport"),
    (["replay", SC, "--max-outstanding", "0"], "0"),
    # the controller's logs and the replay's in one folder overwrote each other
    (["serve", SC, "--replay", "--out", "out/same", "--log-dir", "out/same"],
     "--log-dir and --out name one folder"),
    # a check across two settings names its table once (it said "[scheduler]: scheduler:")
    (["simulate", SC, "--set", "scheduler.schedule_ahead_ms=1", "--set",
      "scheduler.future_ms=5"], ": [scheduler]: schedule_ahead_ms (1) must be more than"),
    # a scenario's [faults] cannot be played by a replay against a running controller
    # (it played none, and said nothing)
    (["replay", "faults", "--controller", "127.0.0.1:1"], "[faults] (kill, hang)"),
    (["infer", "m", "--slo-ms", "inf"], "inf"),
    (["infer", "m", "-n", "-1"], "-1"),
    (["trace", "synth", "--out", "t", "--seed", str(2**63)], "2^63 - 1"),
    (["worker", "--seed", "-1"], "-1"),
    # a worker reports its pages in an int32 (it said "listening" and failed every
    # Connect), and a clock offset that overflowed its clock failed every Connect too
    (["worker", "--port", "0", "--pages", "3000000000"], "from 1 to 2,147,483,647"),
    (["worker", "--port", "0", "--clock-offset-ms", "1e13"], "1e+12"),
    # one below minus the host's uptime: its clock read negative, every result it sent
    # was dropped as malformed and the worker lost again and again, nothing served
    (["worker", "--port", "0", "--clock-offset-ms=-1e12"], "would read before 0"),
    # a cpu worker's caches are allocated at start: more than the machine has was a
    # numpy MemoryError traceback (or the OOM killer)
    (["worker", "--port", "0", "--device", "cpu", "--pages", "100000000"],
     "more than the"),
    (["compile", "mlp", "--seed", str(10**30)], "2^63 - 1"),
    (["infer", "m", "--controller", "h:70000"], "70000"),
    (["infer", "m", "--controller", "grpc://127.0.0.1"], "grpc://127.0.0.1"),
    (["controller", "--workers", "dns:///127.0.0.1:5"], "dns:///127.0.0.1:5"),
    (["controller", "--workers", "127.0.0.1:5,127.0.0.1"], "127.0.0.1"),
    (["controller", "--workers", "x"], "x"),
    (["controller", "--workers", "127.0.0.1:1", "--max-batch", "0"], "0"),
    (["controller", "--workers", "127.0.0.1:1", "--default-slo-ms", "nan"], "nan"),
    (["controller", "--workers", "127.0.0.1:1", "--set", "max_batch=abc"], "abc"),
    (["controller", "--workers", "127.0.0.1:1", "--set", "nosuch=1"], "nosuch"),
    (["controller", "--workers", "127.0.0.1:1", "--set", "default_slo_ms=inf"], "inf"),
    (["controller", "--workers", "127.0.0.1:1", "--models", "resnet50_v2:0"], "resnet50_v2:0"),
    (["controller", "--workers", "127.0.0.1:1", "--models", "nosuchmodel"], "nosuchmodel"),
    (["controller", "--workers", "127.0.0.1:1", "--profiles", "no_such_set"], "no_such_set"),
    (["controller", "--workers", "127.0.0.1:1", "--policy", "nosuchpolicy"], "nosuchpolicy"),
    (["controller", "--workers", "127.0.0.1:1", "--settings", "/no/such/settings.json"],
     "/no/such/settings.json"),
    (["controller", "--workers", "127.0.0.1:1", "--log-dir", "/proc/no_logs_here"],
     "/proc/no_logs_here"),
    (["controller", "--workers", "127.0.0.1:1", "--log-dir", "/proc/no_logs_here",
      "--log-format", "npz"], "/proc/no_logs_here"),
    (["worker", "--gpus", "-1"], "-1"),
    (["worker", "--pages", "-5"], "-5"),
    (["worker", "--port", "abc"], "abc"),
    (["worker", "--noise", "nan"], "nan"),
    # (a straggler below 1 was faster than the rest; the scenario's takes >= 1)
    (["worker", "--slow-factor", "0.5"], "must be a number from 1 to 1000, got '0.5'"),
    (["worker", "--noise", "1e300"], "must be a number from 0 to 10"),
    (["worker", "--slow-prob", "2"], "2"),
    (["worker", "--profiles", "no_such_set"], "no_such_set"),
    (["trace", "synth", "--functions", "0", "--out", "x"], "0"),
    (["trace", "info", "/no/such/trace.csv"], "/no/such/trace.csv"),
    # (a digit str.isdigit takes and int() does not: a traceback, not a file name)
    (["trace", "info", "\u00b2"], "\u00b2"),
    (["trace", "info", "x.csv", "--top", "-2"], "-2"),
    (["compile", "mlp", "--batch-sizes", "1,x"], "1,x"),
    (["compile", "mlp", "--device", "tpu"], "tpu"),
    (["profile", "mlp", "--runs", "0"], "0"),
    (["profile", "mlp", "--runs", "1000000000"], "from 1 to 1,000,000"),
    # (compiled, a batch past any real model's failed inside TVM, or allocated 1 TiB)
    (["compile", "mlp", "--batch-sizes", "99999999999999999999"], "at most 65,536"),
    (["profile", "mlp", "--batch-sizes", "1,4294967296"], "at most 65,536"),
    (["scenarios", "copy", "no_such_scenario", "--to", "out"], "no_such_scenario"),
    # where results go, checked before anything runs ("afile": a plain file, "adir": a
    # folder, "notsummary": a JSON file that is not a run's summary)
    (["simulate", SC, "--out", "afile"], "exists and is not a folder"),
    (["simulate", SC, "--out", "afile/sub"], "is not a folder"),
    # a name longer than the file system allows: a usage error, not a traceback
    (["simulate", SC, "--out", "x" * 300], "File name too long"),
    (["profile", "mlp", "--out", "x" * 300 + ".json"], "File name too long"),
    (["controller", "--workers", "127.0.0.1:1", "--settings", "x" * 300], "File name too long"),
    (["simulate", SC, "--out", f"{'x' * 300}/sub"], "File name too long"),
    # (a folder where nothing can be made, though os.access says yes to root there)
    (["simulate", SC, "--out", "/proc/clockwork_out"], "cannot write into '/proc'"),
    (["simulate", SC, "--spill-dir", "afile"], "exists and is not a folder"),
    # a TLS file that is not PEM (a client then said "could not reach the controller")
    (["infer", "resnet50_v2", "--tls-ca", "notsummary"], "is not a PEM certificate"),
    (["controller", "--workers", "127.0.0.1:1", "--tls-cert", "notsummary"],
     "is not a PEM certificate"),
    (["worker", "--tls-key", "notsummary"], "is not a PEM private key"),
    # a folder given for a file is named so (it said "no such file")
    (["controller", "--workers", "127.0.0.1:1", "--token-file", "adir"],
     "is a folder, not a file"),
    (["simulate", SC, "--spill-dir", "afile/sub"], "is not a folder"),
    (["serve", SC, "--replay", "--out", "afile"], "exists and is not a folder"),
    (["replay", SC, "--out", "afile"], "exists and is not a folder"),
    (["trace", "synth", "--functions", "10", "--out", "afile"], "exists and is not a folder"),
    (["scenarios", "copy", "demo_live", "--to", "afile"], "exists and is not a folder"),
    (["sweep", "example", "--out", "afile"], "exists and is not a folder"),
    (["plan", SC, "--slo-ms", "100", "--plot", "adir"], "is a folder"),
    (["profile", "mlp", "--out", "adir"], "is a folder"),
    (["compile", "mlp", "--out", "afile"], "exists and is not a folder"),
    (["replay", SC, "--check-outputs", "/no/such/packages"], "/no/such/packages"),
    (["report", "notsummary"], "is not a run summary"),
    # a Ray cluster where nothing listens: said at once (ray.init retried ~14 minutes)
    (["serve", SC, "--replay", "--ray", "127.0.0.1:1"], "cannot reach the Ray cluster"),
    (["sweep", "example", "--ray", "127.0.0.1:1", "--out", "out"], "cannot reach the Ray"),
    (["plan", SC, "--slo-ms", "100", "--ray", "ray://127.0.0.1:1"], "cannot reach the Ray"),
    (["simulate", "azure_sample", "--set", "workloads.0.minutes=0"], "0 minutes is empty"),
    # a fault only the simulator models: refused before the cluster starts (it started,
    # replayed nothing and stopped; with --device cpu after compiling the packages)
    (["serve", SC, "--replay", "--set", "faults.slow_network=[{worker=0, at_s=1, for_s=1, "
      "delay_ms=30}]"], "slow_network has no live form"),
    # a fault after the end or of a worker not there: refused before the cluster starts
    # and before --out is cleared (the earlier run there was deleted first)
    (["serve", SC, "--replay", "--out", "out", "--set", "duration_s=1", "--set",
      "faults.hang=[{worker=0, at_s=5, for_s=1}]"],
     "faults.hang.0.at_s: must be before the end (duration_s 1), got 5"),
    (["serve", SC, "--replay", "--set", "faults.kill=[{worker=7, at_s=0.5}]"],
     "faults.kill.0.worker: 7 is not one of the"),
    # a controller restart the simulator would refuse: refused as it (before anything runs)
    (["serve", SC, "--replay", "--out", "out", "--set",
      "faults.controller_restart=[{at_s=1, down_s=1}]", "--set",
      "faults.hang=[{worker=0, at_s=5, for_s=1}]"],
     "faults.controller_restart: not together with faults.kill or faults.hang"),
    (["serve", SC, "--replay", "--set", "duration_s=2", "--set",
      "faults.controller_restart=[{at_s=1, down_s=1}]"],
     "faults.controller_restart.0: the new controller must start before the end"),
    # a profile written into the shipped set changed the figures every run of it reads
    # (in a checkout profiles/cpu links there): refused before anything is measured
    (["profile", "resnet18", "--device", "cpu", "--package", "p", "--out",
      str(__import__("clockwork.resources").resources.profiles_root() / "cpu" / "x.json")],
     "is the profile set shipped with clockwork"),
    # times beyond what means anything (and what int64 nanoseconds hold)
    (["simulate", SC, "--set", "workloads.0.slo_ms=1e13"], "at most 86,400,000 (a day)"),
    (["simulate", SC, "--set", "workloads.0.slo_factor=1e9"], "<= 10000"),
    (["simulate", SC, "--set", "duration_s=1e300"], "at most 31,536,000 (a year)"),
    (["simulate", SC, "--set", "scheduler.future_ms=1e13"], "future_ms"),
    (["controller", "--workers", "127.0.0.1:1", "--default-slo-ms", "1e13"], "a day"),
    # a pacing interval past a second (1e7 for 10 ms held results 10 s under load)
    (["worker", "--result-interval-us", "1e300"], "from 0 (off) to 1000000 (a second)"),
    (["controller", "--workers", "127.0.0.1:1", "--action-interval-us", "1e7"], "a second"),
    (["controller", "--workers", "127.0.0.1:1", "--reply-interval-us", "2e6"], "a second"),
    # values that were taken: a cache no served model fits, a fault after the run, sizes
    # that ran out of memory, a negative list index, an SLO that rounds to 0 ns
    (["simulate", SC, "--set", "cluster.weights_cache_pages=1"],
     "model 'resnet50_v2' takes 7 pages, more than the 1 page(s)"),
    (["simulate", SC, "--set", "duration_s=1", "--set", "faults.kill=[{worker=0,at_s=50}]"],
     "faults.kill.0.at_s: must be before the end (duration_s 1), got 50"),
    (["simulate", SC, "--set", "cluster.workers=1000000"], "cluster.workers"),
    (["simulate", SC, "--set", "cluster.gpus_per_worker=1000"], "cluster.gpus_per_worker"),
    (["simulate", SC, "--set", "models.0.copies=10000000"], "models.0.copies"),
    (["simulate", SC, "--set", "workloads.-1.rate_rps=10"], "no list item '-1'"),
    (["simulate", SC, "--set", "scheduler.default_slo_ms=1e-9"],
     "default_slo_ms: must be a finite number > 0 (at most a day), got 1e-09"),
]


@pytest.mark.parametrize("argv,fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_value_is_one_line_exit_2(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "")  # (--ray sets it: put back as it was afterwards)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "notsummary").write_text("{}")
    (tmp_path / "adir").mkdir()
    names = {"out": "out", "afile": "afile", "afile/sub": "afile/sub", "adir": "adir",
             "notsummary": "notsummary"}
    argv = [str(tmp_path / names[a]) if a in names else a for a in argv]
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], (fragment, lines[0])


def test_a_worker_listed_twice_under_two_spellings_is_exit_2():
    """The same worker as 127.0.0.1:P and localhost:P, found as the names resolve (in a
    process of its own: the controller's protocol modules are not loaded beside the
    Triton client's): one line, exit 2, as the same spelling twice (it was exit 1)."""
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "controller",
                        "--workers", "127.0.0.1:5,localhost:5", "--port", "0",
                        "--http-port", "-1", "--kserve-port", "-1"], capture_output=True,
                       text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and "list each worker once" in lines[0], p.stderr


RUNTIME_FAILURES = [
    # (argv, a fragment of the one stderr line): a failure while running, not a usage
    # error: exit 1 (docs/contracts.md, exit codes)
    (["replay", SC, "--controller", "127.0.0.1:1"],
     "could not reach the controller at 127.0.0.1:1"),
    # a URL as clockwork.Client takes it (the scheme chooses TLS)
    (["replay", SC, "--controller", "grpc://127.0.0.1:1"],
     "could not reach the controller at 127.0.0.1:1"),
    (["infer", "--list", "--controller", "grpcs://127.0.0.1:1", "--timeout", "5"],
     "could not reach the controller at 127.0.0.1:1"),
]


@pytest.mark.parametrize("argv,fragment", RUNTIME_FAILURES,
                         ids=[" ".join(a) for a, _ in RUNTIME_FAILURES])
def test_runtime_failure_is_one_line_exit_1(argv, fragment, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 1, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], (fragment, lines[0])


BAD_SETTINGS = [
    # (file name, its text, a fragment the one stderr line must contain besides the name)
    ("s.json", "{not json", "not valid JSON"),
    ("s.toml", "[scheduler\nmax_batch = 4", "not valid TOML"),
    ("s.json", '{"policy": "clipper", "max_batch": 4}', "no [scheduler] table"),
    ("s.toml", "[schedular]\nmax_batch = 4\n", "no [scheduler] table"),
    ("s.json", '{"scheduler": {"max_batch": "abc"}}', "abc"),
    ("s.toml", "[scheduler]\nmax_bacth = 4\n", "max_bacth"),
    ("s.json", '{"scheduler": {"policy": "nosuchpolicy"}}', "nosuchpolicy"),
    ("s.json", '{"scheduler": {"policy": "clockwork", "batch_wait_ms": 2}}', "batch_wait_ms"),
    ("s.toml", b"[scheduler]\nname = '\xff'\n", "not UTF-8"),
    ("s.json", b'{"scheduler": {"name": "\xff"}}', "not valid JSON"),
    ("s.toml", "[scheduler]\nx = " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    ("s.toml", "[scheduler]\nx = " + "[" * 150 + "]" * 150 + "\n", "nested"),
    ("s.json", '{"scheduler": {"x": ' + "[" * 100000 + "]" * 100000 + "}}", "nested"),
]


@pytest.mark.parametrize("name,text,fragment", BAD_SETTINGS,
                         ids=[f"{n}:{t[:40]!r}" for n, t, _ in BAD_SETTINGS])
def test_bad_settings_file_is_one_line_exit_2(name, text, fragment, capsys, tmp_path):
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc = main(["controller", "--workers", "127.0.0.1:1", "--settings", str(f)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(f) in lines[0] and fragment in lines[0], lines[0]


def test_profile_refuses_another_checkouts_shipped_set(capsys, tmp_path, monkeypatch):
    """Run from a second checkout with this one's installed package (a clone beside the
    development one, say), ``profiles/cpu`` links into that checkout's own shipped data:
    written there, the clone's tracked profile was replaced, though the check guarded
    the installed package's set only."""
    clone = tmp_path / "clone"
    data = clone / "clockwork" / "data" / "profiles" / "cpu"
    data.mkdir(parents=True)
    (clone / "clockwork" / "__init__.py").write_text("")  # (a checkout's package)
    (clone / "profiles").mkdir()
    (clone / "profiles" / "cpu").symlink_to(data)
    monkeypatch.chdir(clone)
    rc = main(["profile", "resnet18", "--device", "cpu", "--package", "p"])
    err = capsys.readouterr().err
    assert rc == 2 and "is the profile set shipped with clockwork" in err, (rc, err)
    assert not list(data.iterdir())
    # a folder of the user's own of the same names, in no package, is not refused so
    from clockwork.cluster.models_cli import _shipped_target

    own = tmp_path / "mine" / "clockwork" / "data" / "profiles" / "cpu"
    own.mkdir(parents=True)
    assert _shipped_target(own) is None


@pytest.mark.parametrize("text,fragment", [
    ("[1]", "profile set: must be a table, got [1]"),
    ('{"weights_cache_pages": 0}', "weights_cache_pages: must be an integer in [1, 2147483647], got 0"),
    ('{"weights_cache_pages": "many"}', "weights_cache_pages: must be an integer in [1, 2147483647]"),
])
def test_bad_profile_set_file_is_one_line_exit_2(text, fragment, capsys, tmp_path):
    from clockwork.profiles import load_profile_set

    (tmp_path / "resnet50_v2.json").write_bytes(
        orjson.dumps(load_profile_set("v100-reference").get("resnet50_v2").to_json()))
    (tmp_path / "set.json").write_text(text)
    rc = main(["simulate", SC, "--set", f"cluster.profiles='{tmp_path}'", "--out",
               str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(tmp_path / "set.json") in lines[0] and fragment in lines[0], lines[0]


@pytest.mark.parametrize("override", ["workloads.0.rate_rps=1e-9", "duration_s=1e-9"])
def test_a_run_without_requests_warns_and_says_n_a(override, capsys, tmp_path):
    """Not an error (a sweep may hold such a point): exit 0, one warning line, and a table
    that says n/a where a percentage or a latency of nothing would read 0; summary.json
    as for any run."""
    rc = main(["simulate", SC, "--set", "duration_s=1", "--set", override, "--out",
               str(tmp_path)])
    got = capsys.readouterr()
    assert rc == 0, got.err
    warnings = [x for x in got.err.splitlines() if "warning" in x]
    assert len(warnings) == 1 and "no requests were submitted" in warnings[0], got.err
    assert "n/a" in got.out and "0.0000 %" not in got.out and "0.00 ms" not in got.out
    # (nothing predicted: not a perfect 0.000 ms)
    assert "0.000 / 0.000 ms" not in got.out and "n/a (no INFER succeeded)" in got.out
    s = orjson.loads((tmp_path / "summary.json").read_bytes())
    assert (s["submitted"], s["slo_attainment"], s["latency_ms"]["p99"]) == (0, 0.0, 0.0)
    assert main(["simulate", SC, "--set", "duration_s=1", "--out", str(tmp_path / "b")]) == 0
    got = capsys.readouterr()
    assert "warning" not in got.err and "n/a" not in got.out and "100.0000 %" in got.out


def test_help_works_for_every_verb(capsys):
    from clockwork.cluster.cli import build_parser

    verbs = [a for a in build_parser()._subparsers._group_actions[0].choices]
    assert {"simulate", "serve", "controller", "worker", "scenarios"} <= set(verbs)
    for verb in [None, *verbs]:
        assert main([verb, "--help"] if verb else ["--help"]) == 0
        assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, prog, extra", [
    (["simulate", SC, "--bogus"], "clockwork simulate", "--bogus"),
    (["sweep", "example", "--set", "x=1"], "clockwork sweep", "--set x=1"),
    (["trace", "info", "x", "--nope"], "clockwork trace info", "--nope"),
    (["--nope"], "clockwork", "--nope"),
])
def test_an_unknown_option_is_blamed_on_the_command_it_was_given_to(argv, prog, extra,
                                                                      capsys):
    """An option a verb does not take is said by that verb, pointing to its own --help
    (it was said by "clockwork", pointing to the list of verbs)."""
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1, cap
    assert err[0].startswith(f"{prog}: unrecognized arguments: {extra} "), err
    assert err[0].endswith(f"(see {prog} --help)"), err


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_missing_optional_parts_are_one_line_and_other_verbs_work(tmp_path):
    # A light install without grpc, protobuf or TVM: the simulator and every --help still
    # work; a verb that needs the missing part says what to install.
    code = f"""
import sys
for m in ("grpc", "google.protobuf", "tvm", "onnx"):
    sys.modules[m] = None
from clockwork.cluster.cli import main
assert main(["--help"]) == 0
assert main(["controller", "--help"]) == 0
assert main(["simulate", "{SC}", "--set", "duration_s=1", "--json"]) == 0
rc = main(["controller", "--workers", "127.0.0.1:1"])
print("RC", rc)
rc = main(["compile", "mlp", "--out", {str(tmp_path / "pkg")!r}])
print("RC", rc)
"""
    p = _run(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("RC 2") == 2, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert lines[0].startswith("clockwork controller: needs grpcio")
    assert lines[1].startswith("clockwork compile: needs Apache TVM") and "tvm" in lines[1]


def test_the_simulator_does_not_import_the_live_systems_stack():
    """``clockwork simulate`` pays only for what it runs: asyncio, gRPC and protobuf stay
    unimported (asyncio alone added ~0.1 s to every process, through the pacing defaults
    the CLI shows)."""
    p = _run(f"""
import sys
from clockwork.cluster.cli import main
assert main(["simulate", "{SC}", "--set", "duration_s=1", "--json"]) == 0
print("LOADED", [m for m in ("asyncio", "grpc", "google.protobuf") if m in sys.modules])
""")
    assert p.returncode == 0, p.stderr
    assert "LOADED []" in p.stdout, p.stdout


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("argv", [
    ["worker", "--port", "{port}"],
    ["controller", "--workers", "127.0.0.1:1", "--port", "{port}", "--connect-timeout", "1"],
    ["controller", "--workers", "127.0.0.1:1", "--port", "0", "--kserve-port", "{port}",
     "--http-port", "-1", "--connect-timeout", "1"],
])
def test_listener_that_cannot_bind_exits_2_naming_the_port(argv):
    s, port = _busy_port()
    with s:
        args = [a.replace("{port}", str(port)) for a in argv]
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *args], capture_output=True,
                           text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("listening,why", [
    (False, "connection refused: is a `clockwork worker` listening there?"),
    (True, "it accepts connections but no gRPC answer came: a worker stopped or hung"),
], ids=["refused", "silent"])
def test_a_controller_whose_worker_does_not_answer_says_it_waits_then_why_it_gave_up(
        listening, why):
    """A worker address where no worker answers: one line at once that the controller
    waits for it, and on giving up after --connect-timeout one line that says why (a
    refused connection; a port that takes connections but speaks no gRPC, as a worker
    with TLS where the controller dials without) -- exit 1."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # (bound: no one else listens there meanwhile)
    if listening:
        s.listen()  # connections complete, and are never answered
    address = f"127.0.0.1:{s.getsockname()[1]}"
    with s:
        p = subprocess.run(cli_command("controller", "--workers", address, "--port", "0",
                                       "--http-port", "-1", "--kserve-port", "-1",
                                       "--connect-timeout", "1"),
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert lines == [
        f"controller: worker {address} is not answering yet; waiting up to 1 s for it "
        "(--connect-timeout)",
        f"clockwork controller: cannot reach worker {address} within --connect-timeout "
        f"1 s ({why}" + lines[-1].partition(why)[2],
    ], p.stderr
    assert lines[-1].endswith(")"), p.stderr


def test_serve_stops_with_exit_2_when_a_port_is_taken(tmp_path):
    s, port = _busy_port()
    with s:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", "--port", "0",
                            "--http-port", str(port), "--kserve-port", "0"],
                           capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"{port} (--http-port)" in p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("flag,child", [("--port", "controller"), ("--worker-port", "worker0")])
@pytest.mark.parametrize("replay", [False, True], ids=["serving", "--replay"])
def test_serve_says_a_childs_refusal_once_naming_the_child(tmp_path, flag, child, replay):
    """A child that refuses to start (its port is taken): its one line once, named --
    echoed as ``[child] ...`` while serve echoes its children, else said by serve as
    ``clockwork serve: child: ...`` -- and exit 2."""
    s, port = _busy_port()
    ports = ["--port", "0", "--http-port", "-1", "--kserve-port", "-1"]
    argv = ["serve", SC, "--replay"] if replay else ["serve"]
    with s:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *argv, *ports,
                            flag, str(port)], capture_output=True, text=True, timeout=90,
                           cwd=Path(__file__).resolve().parent.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 2, (p.returncode, out)
    refusal = [ln for ln in out.splitlines() if f"cannot listen on 127.0.0.1:{port}" in ln]
    assert len(refusal) == 1, out
    assert refusal[0].startswith(f"clockwork serve: {child}: " if replay else f"[{child}] "), out
    assert "Traceback" not in out
    # the worker's line names its own flag (--port); serve's user gave --worker-port
    hint = f"clockwork serve: worker0's port is --worker-port {port} + 10 x 0: give"
    assert (hint in out) == (flag == "--worker-port"), out


@pytest.mark.parametrize("echo", [True, False])
def test_a_child_that_fails_at_start_shows_its_output_once(capsys, echo):
    """A child that exits before it listens (not a refusal, exit 1): its output is in the
    error once -- echoed already, or in the message when not echoed."""
    from clockwork.cluster.local import _Child

    c = _Child("worker0", [sys.executable, "-c", "import sys; print('boom'); sys.exit(1)"],
               echo=echo)
    with pytest.raises(RuntimeError) as e:
        c.wait_address(30)
    said = capsys.readouterr().err + str(e.value)
    assert said.count("boom") == 1 and "worker0 exited (code 1)" in str(e.value), said


def test_worker_takes_the_seeds_serve_derives_from_any_scenario_seed():
    """serve gives worker i the seed ``scenario seed x 1000 + i``: past 2^63 for a
    scenario seed past ~9.2e15, which a scenario may have (numpy takes any size)."""
    from clockwork.cluster.cli import build_parser
    from clockwork.sizes import MAX_SEED

    seed = MAX_SEED * 1000 + 7
    assert build_parser().parse_args(["worker", "--seed", str(seed)]).seed == seed


def test_ctrl_c_while_a_verb_loads_is_one_line_exit_130(monkeypatch, capsys):
    """Ctrl-C while the verb's modules are imported (a second or so for some) ends as it
    does while the verb runs: "interrupted", exit 130. It was a traceback through
    importlib."""
    from clockwork.cluster import cli

    def importing(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load", importing)
    assert cli.main(["simulate", "poisson_warm"]) == 130
    cap = capsys.readouterr()
    assert (cap.out, cap.err) == ("", "interrupted\n"), cap


def test_a_binary_file_given_as_a_trace_is_named_in_a_short_line(tmp_path, capsys):
    """Its first bytes are quoted cut short and in ASCII (about 900 raw bytes of it went
    into the line before)."""
    f = tmp_path / "blob.bin"
    f.write_bytes(bytes(b for b in range(256) if b not in b"\r\n,") * 4)  # one long line
    rc = main(["trace", "info", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.isascii() and len(err) < 400, err
    assert "header must start with HashOwner" in err and "' ...;" in err, err


def test_report_given_a_log_file_reads_its_pair_or_names_what_is_missing(tmp_path, capsys):
    (tmp_path / "requests.tsv").write_text("request_id\tmodel\n")
    rc = main(["report", str(tmp_path / "requests.tsv")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"no actions.tsv beside requests.tsv in {tmp_path}" in err, err
    (tmp_path / "requests.status").write_text("x")  # (not a log: read as a summary)
    rc = main(["report", str(tmp_path / "requests.status")])
    err = capsys.readouterr().err
    assert rc == 2 and f"(a log file: give its run folder, {str(tmp_path)!r})" in err, err


def test_worker_ports_clash_only_with_the_controller_on_the_same_address():
    """serve's workers listen on 127.0.0.1: a controller port among theirs clashes when the
    controller binds there too (or every address), not on another address."""
    from clockwork.cluster.serve import worker_ports_error

    ports = {"--port": 23456, "--http-port": -1, "--kserve-port": 0}
    for host in ("127.0.0.1", "0.0.0.0", "localhost", "::"):
        assert "--port 23456 is worker 1's port" in worker_ports_error(23446, 3, ports, host)
    assert worker_ports_error(23446, 3, ports, "127.0.0.2") == ""
    assert worker_ports_error(23446, 1, ports, "127.0.0.1") == ""  # (one worker: 23446)
    assert "past 65535" in worker_ports_error(65530, 2, ports, "127.0.0.2")
    # each worker's fast link listens one port above its own
    said = worker_ports_error(23446, 3, {"--http-port": 23457}, "127.0.0.1")
    assert "--http-port 23457 is worker 1's fast link's port" in said, said
    assert "its fast link on 23446 + 10 i + 1" in said, said
    assert "past 65535" in worker_ports_error(65535, 1, {}, "127.0.0.1")  # (its link: 65536)


def test_a_scenario_saved_with_a_byte_order_mark_runs(tmp_path, capsys):
    """A UTF-8 scenario file that starts with a byte-order mark (as some editors save
    it) reads as it would without (it was "not valid TOML: Invalid statement (at line 1,
    column 1)")."""
    from clockwork.scenario import load_scenario

    text = ('duration_s = 1\n[[models]]\nname = "resnet50_v2"\n[[workloads]]\nkind = "poisson"\n'
            "rate_rps = 10\n")
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "plain.toml").write_text(text)
    assert load_scenario(tmp_path / "bom.toml").data == load_scenario(tmp_path / "plain.toml").data
    assert main(["simulate", str(tmp_path / "bom.toml"), "--quiet"]) == 0, capsys.readouterr().err


def test_a_ray_address_where_another_server_listens_is_one_line(tmp_path, capsys, monkeypatch):
    """--ray at a port where a server that is not Ray's listens (an HTTP server, the
    dashboard's port): ray.init retried it for over 10 minutes with no word from
    clockwork; it is refused at once, exit 2. A gRPC server (as Ray's GCS and client
    ports are) passes the check."""
    import http.server
    import threading
    import time
    from concurrent import futures

    import grpc

    from clockwork.cluster.parallel import ray_unreachable

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        at = f"127.0.0.1:{httpd.server_address[1]}"
        t0 = time.monotonic()
        assert main(["sweep", "example", "--ray", at, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "answers, but not as a Ray cluster does" in err and at in err, err
        assert time.monotonic() - t0 < 20
        assert ray_unreachable(f"ray://{at}") is not None
        assert ray_unreachable(f"127.0.0.1:{port}") is None
        assert ray_unreachable(f"ray://127.0.0.1:{port}") is None
        # auto is RAY_ADDRESS when it is set, as Ray takes it (a stale one hung serve)
        monkeypatch.setenv("RAY_ADDRESS", at)
        assert "RAY_ADDRESS (which auto takes): " in (ray_unreachable("auto") or "")
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        assert ray_unreachable("auto") is None
        monkeypatch.setenv("RAY_ADDRESS", "")
        assert ray_unreachable("auto") is None
    finally:
        httpd.shutdown()
        server.stop(0)


def test_a_controller_none_of_whose_workers_answers_names_each_one():
    """Two listed workers, neither answering (nothing listens on either port): exit 1, and
    the one line says why for each (it named the first only)."""
    addresses = []
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))  # (bound: no one else listens there meanwhile)
        socks.append(s)
        addresses.append(f"127.0.0.1:{s.getsockname()[1]}")
    try:
        p = subprocess.run(cli_command("controller", "--workers", ",".join(addresses),
                                       "--port", "0", "--http-port", "-1", "--kserve-port",
                                       "-1", "--connect-timeout", "1"),
                           capture_output=True, text=True, timeout=60)
    finally:
        for s in socks:
            s.close()
    assert p.returncode == 1, (p.returncode, p.stderr)
    last = p.stderr.strip().splitlines()[-1]
    for a in addresses:
        assert f"cannot reach worker {a} within --connect-timeout 1 s (connection refused" \
            in last, last


def test_logs_cut_short_by_the_disk_are_one_line_naming_the_file(tmp_path):
    """``simulate --out`` where the logs cannot all be written (here a file-size limit,
    as a full disk: the write fails part-way): one line naming the file and what the
    system said, exit 1, and nothing of the run is left in the folder (``report``: no
    run there)."""
    out = tmp_path / "o"
    p = subprocess.run(cli_command("simulate", SC, "--set", "duration_s=5", "--out", str(out),
                                   "--quiet", file_bytes=64 << 10),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr == f"clockwork simulate: {out / 'requests.tsv'}: File too large\n", p.stderr
    q = subprocess.run(cli_command("report", str(out)), capture_output=True, text=True,
                       timeout=60)
    assert q.returncode == 2 and "no summary.json" in q.stderr, q.stderr
    assert list(out.iterdir()) == []


def test_an_os_error_is_one_line_naming_its_files(tmp_path):
    """``os_error``: the file it names (both of a rename's), or, for a descriptor's
    number, Python's own words (it raised TypeError on those)."""
    import os

    from clockwork.cluster.cli import os_error

    def said(f) -> str:
        with pytest.raises(OSError) as e:
            f()
        return os_error(e.value)

    a, b = tmp_path / "a", tmp_path / "no" / "b"
    assert said(lambda: open(a)) == f"{a}: No such file or directory"
    assert said(lambda: os.rename(a, b)) == f"{a} -> {b}: No such file or directory"
    assert said(lambda: os.stat(1 << 20)) == "[Errno 9] Bad file descriptor: 1048576"


def test_a_scenarios_ray_backend_takes_the_cluster_ray_address_names(monkeypatch, capsys):
    """``cluster.backend = "ray"`` serves on the Ray cluster ``$RAY_ADDRESS`` names (inside
    a Ray job, the job's), as ``sweep --backend ray`` does: it started a one-node Ray
    instance of its own. (Here nothing listens there: refused at once, naming it.)"""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert main(["serve", "demo_live", "--set", "cluster.backend=ray", "--port", "0",
                 "--http-port", "-1", "--kserve-port", "-1"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in err, err


def test_a_signal_as_a_finished_simulation_writes_its_files_keeps_them(tmp_path, monkeypatch,
                                                                        capsys):
    """SIGTERM (or Ctrl-C) once the run is over, while its files are written: they are
    written all the same, then the command ends interrupted (exit 130). The signal, raised
    as Ctrl-C in the middle of the write, lost the whole run's files."""
    import os
    import signal

    from clockwork.cluster.sim import SimResult

    write = SimResult.write

    def signalled(self, out):
        os.kill(os.getpid(), signal.SIGTERM)
        return write(self, out)
    monkeypatch.setattr(SimResult, "write", signalled)
    out = tmp_path / "run"
    assert main(["simulate", "poisson_warm", "--set", "duration_s=0.2", "--out", str(out),
                 "--quiet"]) == 130
    assert sorted(p.name for p in out.iterdir()) == ["actions.tsv", "requests.tsv",
                                                      "run.json", "summary.json"]
    assert capsys.readouterr().err.strip().endswith("interrupted")


def test_serve_names_a_workers_taken_fast_link_port_as_worker_port_plus_one():
    """With --worker-port P, worker 0's fast link listens on P + 1: that port taken,
    serve says the worker's refusal and which of its own ports that is, exit 2."""
    s, busy = _busy_port()
    first = busy - 1
    with s:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", "--port",
                            "0", "--http-port", "-1", "--kserve-port", "-1", "--worker-port",
                            str(first)], capture_output=True, text=True, timeout=90,
                           cwd=Path(__file__).resolve().parent.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 2, (p.returncode, out)
    assert f"--link-port {busy}: cannot listen on 127.0.0.1" in out, out
    assert (f"clockwork serve: worker0's fast link's port is --worker-port {first} + 10 x 0 "
            "+ 1: give --worker-port other ports") in out, out
    assert "Traceback" not in out
