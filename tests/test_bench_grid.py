"""experiments/bench_grid.py: a tiny grid (two shapes) as whole ``clockwork simulate``
processes, its table, its JSON and its line against the targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from experiments import bench_grid

SCRIPT = Path(bench_grid.__file__)


def test_a_tiny_grid(tmp_path):
    out = tmp_path / "grid.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "10", "--copies", "1,4",
                        "--models", "1", "--requests", "3000", "--repeat", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    info = json.loads(out.read_text())
    cells = info["cells"]
    assert [(c["gpus"], c["copies"], c["models"]) for c in cells] == [(10, 1, 1), (10, 4, 1)]
    for c in cells:
        assert c["requests"] > 2000 and c["attainment"] > 0.99 and c["cpu_rps"] > 0
    assert max(c["vs_best"] for c in cells) == 1.0
    target = next(ln for ln in r.stdout.splitlines() if ln.startswith("target:"))
    rates = sorted(c["cpu_rps"] for c in cells)
    reach = sum(x >= bench_grid.TARGET_RPS for x in rates)
    met = reach == 2 and rates[1] / rates[0] <= bench_grid.TARGET_SPREAD
    assert f"{reach} of 2 shapes reach the rate" in target
    assert f"best/worst {rates[1] / rates[0]:.2f}x" in target
    assert target.endswith(": met" if met else ": NOT met")


def test_keep_relative_to_where_it_is_run(tmp_path):
    """``--keep DIR`` relative: the cells' logs go under the folder it is run from (the
    cells run in the repository: they went into the repository's DIR, and the script
    then failed to read DIR/10-1-1/run.json, a traceback)."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "10", "--copies", "1",
                        "--models", "1", "--requests", "500", "--repeat", "1",
                        "--keep", "kept"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "kept" / "10-1-1" / "run.json").is_file()
    assert not (SCRIPT.parent.parent / "kept").exists()


def test_sigterm_stops_the_grid_and_its_simulation_in_one_line(tmp_path):
    """SIGTERM while a cell's simulation runs: the script says so in one line (exit 130),
    and neither the simulation process nor its temporary folder is left (the process
    went on, adopted by init, and the folder stayed)."""
    import os
    import signal
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, str(SCRIPT), "--gpus", "10", "--copies", "1",
                          "--models", "1", "--requests", "3000000"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def children() -> list[int]:
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children")
            return [int(x) for x in kids.read_text().split()] if kids.exists() else []

        deadline = time.monotonic() + 60
        while not children():  # (the cell's simulate process started)
            assert time.monotonic() < deadline and p.poll() is None, "no simulation started"
            time.sleep(0.05)
        kid = children()[0]
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "bench_grid.py: interrupted", err[-2000:]
    assert "Traceback" not in err
    assert not Path(f"/proc/{kid}").exists() or "zombie" in Path(f"/proc/{kid}/status").read_text().lower()
    assert not list(tmp_path.glob("bench_grid-*")), list(tmp_path.iterdir())
