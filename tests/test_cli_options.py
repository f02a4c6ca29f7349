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
