"""Inputs beyond what a run can hold, refused before anything runs: one line on stderr
naming the problem, exit 2, no traceback, no hang, memory bounded (docs/contracts.md).
Seeds, offered load, sweep and plan sizes, TOML files that are not UTF-8 or nest too
deeply; and a run's files in --out never mixed with an earlier run's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clockwork.cluster.cli import main
from tests.conftest import cli_command

SC = "scenarios/poisson_warm.toml"


def run_cli(*argv: str, mem_gib: float = 2.0, timeout: float = 60.0
            ) -> subprocess.CompletedProcess:
    """``clockwork ARGV`` as a process whose address space is capped (a refusal must come
    before any big allocation; without it the process fails on the cap, not the host)."""
    return subprocess.run(cli_command(*argv, mem_bytes=int(mem_gib * 2**30)),
                          capture_output=True, text=True, timeout=timeout)


def refused(p: subprocess.CompletedProcess, *fragments: str) -> str:
    """``p`` exited 2 with one line on stderr holding every fragment; that line."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def refused_in_process(argv: list[str], capsys, *fragments: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- --out


def test_write_run_encodes_before_touching_the_folder(tmp_path):
    """A summary JSON cannot hold (an integer past 64 bits) fails before the folder is
    touched: the earlier run's logs and summary stay together."""
    from clockwork.telemetry import Telemetry, write_run

    for name in ("summary.json", "run.json", "requests.tsv", "actions.tsv"):
        (tmp_path / name).write_text("earlier run\n")
    with pytest.raises(TypeError):
        write_run(tmp_path, Telemetry(), {"seed": 2**70}, {})
    for name in ("summary.json", "run.json", "requests.tsv", "actions.tsv"):
        assert (tmp_path / name).read_text() == "earlier run\n", name


def test_write_run_that_fails_leaves_the_earlier_run_whole(tmp_path, monkeypatch):
    """Logs that fail half-way (a full disk) leave the earlier run in the folder as it
    was, with nothing of the new one beside it (its summary was removed first, and the
    new request log cut short stayed); a whole write then replaces it, summary last."""
    from clockwork.telemetry import Telemetry, write_run

    earlier = {n: f"earlier {n}\n" for n in ("summary.json", "run.json", "requests.tsv",
                                             "actions.tsv", "requests.npz")}
    for name, text in earlier.items():
        (tmp_path / name).write_text(text)
    tel = Telemetry()

    def broken(out, log_format=None):
        (Path(out) / "requests.tsv").write_text("new, cut short\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tel, "write", broken)
    with pytest.raises(OSError):
        write_run(tmp_path, tel, {"submitted": 0}, {"wall_s": 0})
    assert {f.name: f.read_text() for f in tmp_path.iterdir()} == earlier
    monkeypatch.undo()
    write_run(tmp_path, tel, {"submitted": 0}, {"wall_s": 0})
    assert sorted(f.name for f in tmp_path.iterdir()) == ["actions.tsv", "requests.tsv",
                                                          "run.json", "summary.json"]
    assert (tmp_path / "summary.json").read_text().startswith("{")
    # a folder where a run file goes: refused before anything is written or removed
    (tmp_path / "run.json").unlink()
    (tmp_path / "run.json").mkdir()
    kept = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    with pytest.raises(IsADirectoryError):
        write_run(tmp_path, tel, {"submitted": 0}, {"wall_s": 0})
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()} == kept
    assert sorted(f.name for f in tmp_path.iterdir()) == ["actions.tsv", "requests.tsv",
                                                          "run.json", "summary.json"]


# ----------------------------------------------------------------------------- seeds

MAX_SEED = 2**63 - 1


def test_seed_beyond_64_bits_is_refused_before_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("earlier run\n")
    line = refused_in_process(["simulate", SC, "--set", "duration_s=1", "--set",
                               f"seed={2**64}", "--out", str(out)], capsys, "seed")
    assert str(2**64) in line
    assert (out / "summary.json").read_text() == "earlier run\n"
    assert not (out / "requests.tsv").exists()


def test_largest_seed_runs(tmp_path, capsys):
    import orjson

    rc = main(["simulate", SC, "--set", "duration_s=0.2", "--set", f"seed={MAX_SEED}",
               "--out", str(tmp_path), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert orjson.loads((tmp_path / "summary.json").read_bytes())["seed"] == MAX_SEED


def test_sweep_seed_beyond_64_bits_is_refused(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text(f'scenarios = ["poisson_warm"]\nseeds = [1, {2**64}]\n')
    refused_in_process(["sweep", str(f), "--list", "--out", str(tmp_path / "o")], capsys,
                       "seeds")


def test_plan_seed_range_past_the_largest_seed_is_refused(capsys):
    line = refused_in_process(["plan", SC, "--set", f"seed={MAX_SEED}", "--seeds", "2",
                               "--max-gpus", "1"], capsys, "--seeds 2")
    assert f"{MAX_SEED:,}" in line


# ----------------------------------------------------------------------------- TOML files

MAX_DEPTH = 100


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.fixture
def odd_files(tmp_path):
    """A scenario that is not UTF-8, one nested 500 levels deep (past what Python's TOML
    parser recurses through), one just past the bound, sweep files of each kind, and a
    sweep naming the scenario that is not UTF-8."""
    f = {
        "binary": tmp_path / "bin.toml",
        "deep": tmp_path / "deep.toml",
        "deeper": tmp_path / "deeper.toml",
        "sw_binary": tmp_path / "sw_bin.toml",
        "sw_deep": tmp_path / "sw_deep.toml",
        "sw_names_binary": tmp_path / "sw_names_bin.toml",
    }
    f["binary"].write_bytes(b"\xff\xfe\x00")
    f["deep"].write_text(f"x = {nested(500)}\n")
    f["deeper"].write_text(f"duration_s = 1\nx = {nested(MAX_DEPTH + 1)}\n")
    f["sw_binary"].write_bytes(b'scenarios = ["poisson_warm"]\n# \xff\xfe\n')
    f["sw_deep"].write_text(f'scenarios = ["poisson_warm"]\nx = {nested(500)}\n')
    f["sw_names_binary"].write_text('scenarios = ["bin.toml"]\n')
    return f


@pytest.mark.parametrize("verb", ["simulate", "plan"])
def test_scenario_not_utf8_names_the_file(verb, odd_files, capsys):
    p = str(odd_files["binary"])
    line = refused_in_process([verb, p], capsys, p, "UTF-8")
    assert "0xff" in line


@pytest.mark.parametrize("verb", ["simulate", "plan"])
@pytest.mark.parametrize("which", ["deep", "deeper"])
def test_scenario_nested_too_deeply(verb, which, odd_files, capsys):
    p = str(odd_files[which])
    refused_in_process([verb, p], capsys, p, f"at most {MAX_DEPTH} levels")


@pytest.mark.parametrize("which", ["sw_binary", "sw_deep", "sw_names_binary"])
def test_sweep_file_not_utf8_or_too_deep(which, odd_files, tmp_path, capsys):
    line = refused_in_process(["sweep", str(odd_files[which]), "--list", "--out",
                               str(tmp_path / "o")], capsys)
    assert "UTF-8" in line or f"at most {MAX_DEPTH} levels" in line
    assert str(odd_files[which]) in line


@pytest.mark.parametrize("depth", [500, MAX_DEPTH + 1])
def test_set_value_nested_too_deeply(depth, capsys):
    refused_in_process(["simulate", SC, "--set", f"workloads.0.x={nested(depth)}"], capsys,
                       "--set workloads.0.x", f"at most {MAX_DEPTH} levels")


DIGITS = "1" * 5000  # past Python's int() limit (4,300 digits)


def test_numbers_of_more_digits_than_python_reads_are_refused_by_name(tmp_path, capsys):
    """A 5,000-digit number: in a scenario file (a traceback: tomllib's plain ValueError),
    a --set value and a --limit value (Python's "Exceeds the limit (4300 digits) for
    integer string conversion", naming no key), a sweep's grid key (a traceback)."""
    from clockwork.settings import SettingsError
    from controller.limits import limits_from_flags

    f = tmp_path / "big.toml"
    f.write_text(f"seed = {DIGITS}\n")
    refused_in_process(["simulate", str(f)], capsys, f"{f}: a number of more than 4,300 digits")
    refused_in_process(["simulate", SC, "--set", f"seed={DIGITS}"], capsys,
                       "--set seed: a number of more than 4,300 digits")
    with pytest.raises(SettingsError, match="--limit admit_slice: a number of more than"):
        limits_from_flags([f"admit_slice={DIGITS}"])
    # in hexadecimal (or octal, binary) TOML reads any length: refused all the same
    for big in ("0x" + "f" * 5000, "0o" + "7" * 6000, "0b" + "1" * 15000):
        refused_in_process(["simulate", SC, "--set", f"seed={big}"], capsys,
                           "--set seed: a number of more than 4,300 digits")
        with pytest.raises(SettingsError, match="--limit admit_slice: a number of more"):
            limits_from_flags([f"admit_slice={big}"])
    f.write_text(f"seed = 0x{'f' * 5000}\n")
    refused_in_process(["simulate", str(f)], capsys, f"{f}: a number of more than 4,300 digits")
    sweep = tmp_path / "sw.toml"
    sweep.write_text(f'scenarios = ["{SC}"]\nseeds = [1]\n[grid]\n"workloads.{DIGITS}.slo_ms" = [100]\n')
    line = refused_in_process(["sweep", str(sweep), "--list", "--out", str(tmp_path / "o")],
                              capsys)
    assert "workloads.111" in line and "Traceback" not in line, line


def test_set_value_nested_to_the_bound_is_read(capsys):
    """As deep as allowed: read, and refused only for what it is (a key poisson lacks)."""
    refused_in_process(["simulate", SC, "--set", f"workloads.0.x={nested(MAX_DEPTH)}"],
                       capsys, "workloads.0: poisson workload: unknown setting 'x' (known: ")


# ----------------------------------------------------------------------------- --set paths


@pytest.mark.parametrize("key", ["seed.a", "seed.a.b", "seed.a.b.c"])
def test_set_through_a_value_names_the_value(key, capsys):
    """``--set seed.a.b=1`` where ``seed`` is a number (poisson_warm says seed = 1): the
    line names ``seed``, the value in the way, not the key below it."""
    refused_in_process(["simulate", SC, "--set", f"{key}=1"], capsys,
                       f"--set {key}: seed is not a table")


def test_set_through_a_list_item_value_names_it(capsys):
    refused_in_process(["simulate", SC, "--set", "workloads.0.kind.x.y=1"], capsys,
                       "workloads.0.kind is not a table")


# ----------------------------------------------------------------------------- scenarios copy


@pytest.mark.parametrize("force", [False, True])
def test_copy_refuses_a_file_where_a_folder_goes(force, tmp_path, capsys):
    """``DIR/traces/samples`` a plain file: azure_sample's trace cannot go under it, so
    nothing is copied (it copied the scenario, then failed 'File exists', exit 1)."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "samples").write_text("x")
    line = refused_in_process(["scenarios", "copy", "azure_sample", "--to", str(tmp_path)]
                              + (["--force"] if force else []), capsys, "nothing copied")
    assert str(tmp_path / "traces" / "samples") in line
    assert not (tmp_path / "azure_sample.toml").exists()


def test_copy_refuses_a_folder_where_a_file_goes(tmp_path, capsys):
    (tmp_path / "poisson_warm.toml").mkdir()
    (tmp_path / "traces").mkdir()
    line = refused_in_process(["scenarios", "copy", "poisson_warm", "azure_sample", "--to",
                               str(tmp_path), "--force"], capsys, "nothing copied")
    assert str(tmp_path / "poisson_warm.toml") in line
    assert not (tmp_path / "azure_sample.toml").exists()
    assert not list((tmp_path / "traces").iterdir())


# ----------------------------------------------------------------------------- sweep, plan sizes

MAX_POINTS = 100_000


def test_sweep_of_too_many_points_is_refused_before_listing(tmp_path):
    """10^10 points: counted, not built (list(itertools.product) ran out of memory after
    3.8 GB, --list included)."""
    vals = ", ".join(str(i) for i in range(1, 101))
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\n[grid]\n' + "".join(
        f'"{k}" = [{vals}]\n' for k in ("workloads.0.rate_rps", "workloads.0.slo_ms",
                                        "cluster.noise", "cluster.jitter_ms", "drain_s")))
    p = run_cli("sweep", str(f), "--list", "--out", str(tmp_path / "o"), timeout=30)
    refused(p, "10,000,000,000 points", f"at most {MAX_POINTS:,}", str(f))


def test_sweep_one_past_the_bound_is_refused(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm", "bursty"]\nseeds = [1, 2]\n[grid]\n'
                 f'"workloads.0.rate_rps" = [{", ".join(str(i) for i in range(1, 25_002))}]\n')
    refused_in_process(["sweep", str(f), "--list", "--out", str(tmp_path / "o")], capsys,
                       "100,004 points (2 scenarios x 25,001 x 2 seeds)")


def test_sweep_duplicate_among_many_values_is_found_at_once(tmp_path):
    """The duplicate check compared every value with every other (50,000 values: ~10^9
    comparisons, minutes): now a set lookup each."""
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\n[grid]\n"workloads.0.rate_rps" = ['
                 + ", ".join(str(i) for i in range(1, 50_001)) + ", 7.0]\n")
    p = run_cli("sweep", str(f), "--list", "--out", str(tmp_path / "o"), timeout=30)
    refused(p, "grid.workloads.0.rate_rps: value 7.0 is listed twice")


def test_sweep_duplicates_keep_their_meaning(tmp_path, capsys):
    """1 and 1.0 are the same point, true and 1 are not; arrays and tables compare by
    value."""
    for values, dup in (("[1, true]", None), ("[1, 1.0]", "1.0"),
                        ('[{a = [1, 2]}, {a = [1, 2.0]}]', '{"a" = [1, 2.0]}'),
                        ('[[true], [1]]', "[1]"), ('[[1, 2], [2, 1]]', None)):
        f = tmp_path / "s.toml"
        f.write_text(f'scenarios = ["poisson_warm"]\n[grid]\n"x" = {values}\n')
        rc = main(["sweep", str(f), "--list", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        if dup is None:
            assert "listed twice" not in err, (values, err)
        else:
            assert rc == 2 and f"value {dup} is listed twice" in err, (values, err)


def test_plan_with_too_many_seeds_is_refused_at_once():
    p = run_cli("plan", SC, "--seeds", "1000000000", timeout=30)
    refused(p, "--seeds 1000000000", f"at most {MAX_POINTS:,}")


# ----------------------------------------------------------------------------- offered load

MAX_OFFERED = 1_000_000_000
MAX_MINUTE = 50_000_000
AZ = "azure_sample"


@pytest.mark.parametrize("argv,fragments", [
    # open loops: a rate that ran until killed, memory growing
    ((SC, "--set", "duration_s=2", "--set", "workloads.0.rate_rps=1e12"),
     ("workloads.0.rate_rps", f"{MAX_OFFERED:,}")),
    (("poisson_warm", "--set", "duration_s=2", "--set", "workloads.0.kind=\"fixed_rate\"",
      "--set", "workloads.0.rate_rps=1e300"), ("workloads.0.rate_rps", f"{MAX_OFFERED:,}")),
    (("bursty", "--set", "duration_s=2", "--set", "workloads.0.burst_rps=1e12"),
     ("workloads.0.burst_rps", f"{MAX_OFFERED:,}")),
    (("bursty_experiment", "--set", "duration_s=100", "--set", "workloads.0.major_rps=1e8"),
     ("workloads.0.major_rps", f"{MAX_OFFERED:,}")),
])
def test_open_loop_rate_beyond_the_bound_is_refused(argv, fragments):
    refused(run_cli("simulate", *argv, timeout=30), *fragments)


@pytest.mark.parametrize("argv,fragments", [
    # closed loops resending a failed request every nanosecond: 10^9 requests a simulated
    # second each, memory growing as the run went
    (("fig5_1gpu", "--set", "duration_s=10", "--set", "workloads.0.retry_ms=1e-6"),
     ("workloads.0: closed_loop workload: 240 client(s) sending again every 1e-06 ms",
      f"{MAX_OFFERED:,}")),
    (("bursty_closed_loop", "--set", "duration_s=10", "--set", "workloads.0.retry_ms=1e-6"),
     ("bursty_closed_loop workload", f"{MAX_OFFERED:,}")),
    # on and off periods of a nanosecond: 2 * 10^9 periods an instance in 2 s (it never
    # finished)
    (("bursty", "--set", "duration_s=2", "--set", "workloads.0.on_s=1e-9", "--set",
      "workloads.0.off_s=1e-9"),
     ("workloads.0: bursty workload: on_s 1e-09 and off_s 1e-09", "100,000,000")),
    (("bursty_closed_loop", "--set", "duration_s=2", "--set", "workloads.0.on_s=1e-9",
      "--set", "workloads.0.off_s=1e-9"), ("bursty_closed_loop workload", "100,000,000")),
])
def test_closed_loops_and_periods_beyond_the_bound_are_refused(argv, fragments):
    refused(run_cli("simulate", *argv, timeout=30), *fragments)


def test_rates_of_all_workloads_count_together(tmp_path):
    f = tmp_path / "two.toml"
    f.write_text('duration_s = 10\n[[models]]\nname = "resnet50_v2"\n'
                 '[[workloads]]\nkind = "poisson"\nrate_rps = 6e7\n'
                 '[[workloads]]\nkind = "fixed_rate"\nrate_rps = 6e7\n')
    refused(run_cli("simulate", str(f), timeout=30), "1,200,000,000 requests",
            f"{MAX_OFFERED:,}")


def test_default_rates_count_too(tmp_path):
    """bursty_experiment's default rates (200 + 1000 r/s) over a year: 3.8 * 10^10."""
    f = tmp_path / "year.toml"
    f.write_text('duration_s = 31536000\n[[models]]\nname = "resnet50_v2"\ncopies = 2\n'
                 '[[workloads]]\nkind = "bursty_experiment"\n')
    refused(run_cli("simulate", str(f), timeout=30), "bursty_experiment", f"{MAX_OFFERED:,}")


@pytest.mark.parametrize("sets,fragments", [
    # arrivals per trace minute: 22 GiB, "array is too big", "lam value too large", a
    # negative repeat count, PiB for gamma
    (("workloads.0.load_factor=1e6",), ("load_factor", f"{MAX_MINUTE:,}")),
    (("workloads.0.load_factor=1e15",), ("load_factor", f"{MAX_MINUTE:,}")),
    (("workloads.0.load_factor=1e300",), ("load_factor", f"{MAX_MINUTE:,}")),
    (("workloads.0.arrivals=\"uniform\"", "workloads.0.load_factor=1e300"),
     ("load_factor", f"{MAX_MINUTE:,}")),
    (("workloads.0.arrivals=\"gamma\"", "workloads.0.load_factor=1e12"),
     ("load_factor", f"{MAX_MINUTE:,}")),
    # a short run still draws its whole first trace minute
    (("duration_s=2", "workloads.0.load_factor=20000"), ("trace minute 0", f"{MAX_MINUTE:,}")),
    # ZeroDivisionError, OverflowError
    (("workloads.0.arrivals=\"gamma\"", "workloads.0.cv=1e-300"), ("cv", "0.01", "100")),
    (("workloads.0.arrivals=\"gamma\"", "workloads.0.cv=1e300"), ("cv", "0.01", "100")),
    # 0 ns minutes: no requests and a misleading warning, or numpy's "high <= 0"
    (("workloads.0.interval_s=1e-12",), ("interval_s", "1e-12")),
    (("workloads.0.interval_s=1e-12", "workloads.0.randomise_start=true"),
     ("interval_s", "1e-12")),
])
def test_azure_arrivals_beyond_the_bounds_are_refused(sets, fragments):
    argv = [AZ, "--set", "duration_s=60"]
    for s in sets:
        argv += ["--set", s]
    refused(run_cli("simulate", *argv, timeout=30), *fragments)


def test_azure_trace_of_huge_counts_is_refused(tmp_path):
    """Every minute 4,294,967,295 invocations (a uint32's most): 160 GiB to draw."""
    trace = tmp_path / "u32max.csv"
    trace.write_text("HashOwner,HashApp,HashFunction,Trigger,"
                     + ",".join(str(m) for m in range(1, 1441)) + "\n"
                     + "o,a,f,http," + ",".join(["4294967295"] * 1440) + "\n")
    refused(run_cli("simulate", AZ, "--set", "duration_s=10", "--set",
                    f"workloads.0.trace=\"{trace}\"", timeout=30),
            "trace minute 0", f"{MAX_MINUTE:,}")


@pytest.mark.parametrize("sets,fragments", [
    (("workloads.0.workers=1000000000",), ("workers", "10000")),
    (("workloads.0.load_factor_start=1e9", "workloads.0.load_factor_max=1e10"),
     (f"{MAX_MINUTE:,}",)),
])
def test_azure_scalability_beyond_the_bounds_is_refused(sets, fragments):
    argv = ["azure_scalability", "--set", "duration_s=60"]
    for s in sets:
        argv += ["--set", s]
    refused(run_cli("simulate", *argv, timeout=30), *fragments)


def test_sweep_refuses_a_rate_beyond_the_bound_at_its_check(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('scenarios = ["poisson_warm"]\noverrides = ["duration_s=2"]\n'
                 '[grid]\n"workloads.0.rate_rps" = [100, 1e12]\n')
    refused_in_process(["sweep", str(f), "--list", "--out", str(tmp_path / "o")], capsys,
                       "workloads.0.rate_rps", f"{MAX_OFFERED:,}")


# ----------------------------------------------------------------------------- stepped schedules

MAX_STEPS = 1_000_000


@pytest.mark.parametrize("argv,key", [
    (("azure_scalability", "--set", "duration_s=60", "--set", "workloads.0.step_period_s=1e-9",
      "--set", "workloads.0.step_op=\"add\"", "--set", "workloads.0.load_factor_step=1e-12"),
     "step_period_s"),
    (("slo_exp_1", "--set", "duration_s=60", "--set", "workloads.0.period_s=1e-9", "--set",
      "workloads.0.op=\"add\"", "--set", "workloads.0.factor=1e-12"), "period_s"),
    (("slo_exp_1", "--set", "duration_s=60", "--set", "workloads.0.period_s=1e-9", "--set",
      "workloads.0.factor=0.5"), "period_s"),
])
def test_stepped_schedule_of_too_many_steps_is_refused(argv, key):
    """A value that steps every nanosecond for a minute: 6 * 10^10 values (a MemoryError
    traceback, or a list growing as the run goes)."""
    refused(run_cli("simulate", *argv, timeout=30), key, f"{MAX_STEPS:,}")


def test_stepped_schedule_that_stops_early_still_runs(capsys):
    """Many periods in the run, but the value passes its maximum within a few: it runs."""
    rc = main(["simulate", "slo_exp_1", "--set", "duration_s=2", "--set",
               "workloads.0.period_s=1e-6", "--set", "workloads.0.rate_rps=100", "--quiet"])
    assert rc == 0, capsys.readouterr().err
