"""Options of the ``clockwork`` command that mean nothing without another one: refused in
one line (exit 2) that says what they need, instead of being ignored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SC = str(Path(__file__).resolve().parent.parent / "scenarios" / "poisson_warm.toml")
QUIET_PORTS = ["--port", "0", "--http-port", "-1", "--kserve-port", "-1"]

NEEDS_ANOTHER = [
    # (argv, what the one stderr line must say)
    (["serve", "--set", "cluster.workers=2", *QUIET_PORTS], "--set needs a scenario"),
    (["serve", "--out", "run", *QUIET_PORTS], "--out needs --replay"),
    (["serve", SC, "--out", "run", *QUIET_PORTS], "--out needs --replay"),
    (["serve", "--quiet", *QUIET_PORTS], "--quiet needs --replay"),
    (["serve", SC, "--quiet", *QUIET_PORTS], "--quiet needs --replay"),
    # (a worker address nothing listens on: a controller that started would wait for it)
    (["controller", "--workers", "127.0.0.1:1", "--log-format", "npz", *QUIET_PORTS],
     "--log-format needs --log-dir"),
    (["controller", "--workers", "127.0.0.1:1", "--log-format", "tsv", *QUIET_PORTS],
     "--log-format needs --log-dir"),
    (["controller", "--workers", "127.0.0.1:1", "--log-flush-s", "0.5", *QUIET_PORTS],
     "--log-flush-s needs --log-dir"),
    (["simulate", SC, "--set", "duration_s=1", "--log-format", "npz"],
     "--log-format needs --out"),
    (["simulate", SC, "--set", "duration_s=1", "--log-format", "tsv"],
     "--log-format needs --out"),
]


@pytest.mark.parametrize("argv,fragment", NEEDS_ANOTHER,
                         ids=[" ".join(a[:4]) for a, _ in NEEDS_ANOTHER])
def test_an_option_without_what_it_needs_is_one_line_exit_2(argv, fragment, tmp_path):
    # (a process of its own: a serve that started would run until stopped)
    try:
        p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *argv],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"clockwork {' '.join(argv)} ran instead of refusing the option")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert fragment in lines[0] and lines[0].startswith(f"clockwork {argv[0]}: "), lines[0]
    assert p.stdout == "" and not (tmp_path / "run").exists()


def test_simulate_log_format_with_out_still_writes_it(tmp_path):
    from clockwork.cluster.cli import main

    assert main(["simulate", SC, "--set", "duration_s=1", "--out", str(tmp_path),
                 "--log-format", "npz", "--quiet"]) == 0
    assert (tmp_path / "requests.npz").exists() and not (tmp_path / "requests.tsv").exists()
    assert main(["simulate", SC, "--set", "duration_s=1", "--out", str(tmp_path / "t"),
                 "--quiet"]) == 0
    assert (tmp_path / "t" / "requests.tsv").exists()  # tsv by default


def test_controller_settings_takes_a_shipped_scenario_name(tmp_path, monkeypatch):
    """--settings NAME finds a shipped scenario as simulate NAME does (its [scheduler]
    table is read); a path that is a file still wins, and a name that is neither is
    one line naming the closest shipped scenarios."""
    from clockwork.cluster.cli import build_parser
    from clockwork.resources import resolve_scenario
    from controller.command import scheduler_settings

    monkeypatch.chdir(tmp_path)  # (in the checkout scenarios/cpu_live.toml is a file too)

    def parse(*argv):
        return build_parser().parse_args(["controller", "--workers", "127.0.0.1:1", *argv])

    for name in ("cpu_live", "cpu_live.toml", "scenarios/cpu_live.toml"):
        args = parse("--settings", name)
        assert args.settings == str(resolve_scenario("cpu_live")), args.settings
        policy, cfg, own = scheduler_settings(args)
        assert policy == "clockwork" and cfg.default_slo == 50_000_000 and own == {}


def test_controller_settings_of_a_scenario_without_scheduler_table_are_the_defaults():
    """A shipped scenario with no [scheduler] table (poisson_warm, cold_starts) runs on
    the default settings in simulate; --settings takes it the same way."""
    from clockwork.cluster.cli import build_parser
    from controller.command import scheduler_settings
    from controller.config import SchedulerConfig

    for name in ("poisson_warm", "cold_starts"):
        args = build_parser().parse_args(["controller", "--workers", "127.0.0.1:1",
                                          "--settings", name])
        policy, cfg, own = scheduler_settings(args)
        assert policy == "clockwork" and cfg == SchedulerConfig() and own == {}


def test_controller_settings_unknown_name_is_one_line(capsys):
    from clockwork.cluster.cli import main

    assert main(["controller", "--workers", "127.0.0.1:1", "--settings", "cpu_lvie"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--settings" in err and "cpu_live" in err, err


@pytest.mark.parametrize("device", ["emulated", "cpu"])
def test_worker_packages_that_do_not_exist_is_one_warning_line(device, tmp_path):
    """The worker starts (a package folder may come later) and says so in one line."""
    if device == "cpu":
        pytest.importorskip("tvm")
    missing = tmp_path / "no_such_packages"
    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", "worker", "--port", "0",
                          "--device", device, "--packages", str(missing)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    try:
        line = p.stdout.readline()
        assert "clockwork worker listening on" in line, (line, p.stderr.read())
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    warnings = [x for x in err.splitlines() if "warning" in x]
    assert len(warnings) == 1 and "Traceback" not in err, err
    assert warnings[0].startswith(f"clockwork worker: warning: --packages {missing}: no such "
                                  "folder"), warnings[0]
    assert not missing.exists()



def test_config_names_only_the_batch_sizes_the_scheduler_runs():
    """With the controller's max_batch below the profile's largest batch, the model
    configuration's execution_batch_sizes are those up to it (they listed every compiled
    size: with --max-batch 4, '1,2,4,8,16' while 8 rows ran as two INFERs of 4);
    max_batch_size stays the most rows a request may carry. Read over REST with the
    standard library: the controller runs as a process of its own (its protocol modules
    cannot share a process with the Triton client's, which other test files load)."""
    import json
    import urllib.request

    from tests.conftest import local_cluster

    with local_cluster(models="resnet18_v2", http_port=0,
                       controller_args=["--max-batch", "4"]) as c:
        url = f"http://{c.printed_address('http')}/v2/models/resnet18_v2/config"
        with urllib.request.urlopen(url, timeout=30) as r:
            cfg = json.loads(r.read())
    assert cfg["parameters"]["execution_batch_sizes"]["string_value"] == "1,2,4"
    assert cfg["max_batch_size"] == 16
