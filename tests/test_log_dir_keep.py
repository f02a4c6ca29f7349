"""A controller started on a --log-dir that holds an earlier controller's logs keeps them
(``requests.N.tsv`` / ``requests.N.npz``, N the next free number over both formats),
whatever the format of either run."""

from __future__ import annotations

import os

import numpy as np

import clockwork
from clockwork.telemetry import Telemetry, read_logs
from tests.conftest import local_cluster
from tests.test_telemetry import fill


def _npz_rows(path) -> int:
    with np.load(path) as z:
        return len(z["arrival"])


def _tsv_rows(path) -> int:
    return len(path.read_text().splitlines()) - 1


def test_npz_logs_of_an_earlier_run_are_kept(tmp_path):
    """npz after npz: the first run's requests.npz becomes requests.1.npz (it was
    overwritten); npz after TSV and TSV after npz: the earlier files are renamed (the TSV
    ones were deleted by the npz run's write)."""
    runs = []
    for seed, fmt in ((1, "npz"), (2, "npz"), (3, "tsv"), (4, "npz"), (5, "tsv")):
        tel = Telemetry(0, fmt)
        runs.append(fill(tel, 10 * seed, seed=seed))
        tel.flush(tmp_path)  # (npz: nothing until the final flush)
        tel.flush(tmp_path, final=True)
        tel.flush(tmp_path, final=True)  # a second final flush rewrites its own files only
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"{name}.{suffix}" for name in ("requests", "actions")
        for suffix in ("1.npz", "2.npz", "3.tsv", "4.npz", "tsv"))
    assert read_logs(tmp_path).requests == runs[4][0]
    for n, fmt in ((1, "npz"), (2, "npz"), (3, "tsv"), (4, "npz")):
        one = tmp_path / f"run{n}"
        one.mkdir()
        for name in ("requests", "actions"):
            os.link(tmp_path / f"{name}.{n}.{fmt}", one / f"{name}.{fmt}")
        back = read_logs(one)
        assert (back.requests, back.actions) == runs[n - 1], n


def test_a_restarted_controller_keeps_the_earlier_ones_logs(tmp_path):
    """Real controllers on one --log-dir, one after another: npz (4 requests), npz (2),
    tsv (3), npz (1); each stopped with SIGTERM. Every run's rows are still there."""
    logs = tmp_path / "logs"

    def serve(n: int) -> None:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(n):
                assert cl.infer("mobilenet_v2", slo_ms=2000).status == 0
        assert c.controller.stop(timeout=30) == 0

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2",
                       controller_args=["--log-dir", str(logs), "--log-format", "npz"]) as c:
        serve(4)
        c.restart_controller()
        serve(2)
        c.restart_controller(["--log-format", "tsv"])
        serve(3)
        c.restart_controller()
        serve(1)
    assert _npz_rows(logs / "requests.1.npz") == 4
    assert _npz_rows(logs / "requests.2.npz") == 2
    assert _tsv_rows(logs / "requests.3.tsv") == 3
    assert _npz_rows(logs / "requests.npz") == 1
    assert (logs / "actions.1.npz").exists() and (logs / "actions.3.tsv").exists()
    assert not (logs / "requests.tsv").exists()


def test_a_log_folder_where_no_file_can_be_made_is_refused_at_start(tmp_path):
    """The controller tries to make a file in its --log-dir when it starts (a folder it
    cannot write is said then, not at the first flush), and one under a plain file
    cannot be made at all."""
    import pytest

    from controller.service import ControllerNode

    (tmp_path / "a-file").write_text("")
    for where in ("/proc/self", str(tmp_path / "a-file" / "logs")):
        with pytest.raises(ValueError, match=f"^--log-dir {where}: cannot make a file there"):
            ControllerNode(["127.0.0.1:1"], log_dir=where)
    ControllerNode(["127.0.0.1:1"], log_dir=str(tmp_path / "made"))
    assert (tmp_path / "made").is_dir() and not list((tmp_path / "made").iterdir())


def test_tsv_logs_renamed_while_the_controller_runs_start_again(tmp_path):
    """Rotation by renaming (logrotate's default, without copytruncate): the controller
    opens its TSV logs at each flush, so after requests.tsv and actions.tsv are renamed
    the next flush starts new ones, with their headers, holding only the rows since; the
    renamed files keep theirs; report reads the new folder's logs."""
    import subprocess
    import time

    from tests.conftest import cli_command

    logs = tmp_path / "logs"
    req, act = logs / "requests.tsv", logs / "actions.tsv"

    def rows_in(path, n):  # the flush that writes them runs every 0.05 s
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if path.exists() and _tsv_rows(path) >= n:
                return
            time.sleep(0.02)
        raise AssertionError(f"{path}: fewer than {n} rows after 20 s")

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2", http_port=-1,
                       controller_args=["--log-dir", str(logs), "--log-flush-s", "0.05"]) as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(3):
                assert cl.infer("mobilenet_v2", slo_ms=2000).status == 0
            rows_in(req, 3)
            rows_in(act, 4)  # a LOAD and three INFERs
            req.rename(logs / "requests.tsv.1")
            act.rename(logs / "actions.tsv.1")
            for _ in range(2):
                assert cl.infer("mobilenet_v2", slo_ms=2000).status == 0
        assert c.controller.stop(timeout=30) == 0
    assert _tsv_rows(logs / "requests.tsv.1") == 3
    assert _tsv_rows(logs / "actions.tsv.1") == 4
    assert _tsv_rows(req) == 2 and _tsv_rows(act) == 2
    assert req.read_text().split("\n", 1)[0].startswith("request_id\t")
    r = subprocess.run([*cli_command("report", str(logs))], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    submitted = next(ln for ln in r.stdout.splitlines() if ln.startswith("requests submitted"))
    assert submitted.split()[-1] == "2", r.stdout


def test_npz_rows_whose_folder_is_removed_while_serving_are_written_at_stop(tmp_path):
    """npz logs: the --log-dir (with the rows' column files in it) removed while the
    controller serves, by hand or a clean-up job. It went unsaid, and at stop the rows
    were read back by name: "not written", exit 1, every row of the run lost. Now it is
    said once, the rows are read through the files still open, and at stop the folder is
    made again with every row."""
    import shutil
    import time

    logs = tmp_path / "logs"
    with local_cluster(workers=1, gpus=1, models="mobilenet_v2", http_port=-1,
                       controller_args=["--log-dir", str(logs), "--log-format", "npz",
                                        "--log-flush-s", "0.05"]) as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(3):
                assert cl.infer("mobilenet_v2", slo_ms=2000).status == 0
            shutil.rmtree(logs)
            for _ in range(2):
                assert cl.infer("mobilenet_v2", slo_ms=2000).status == 0
        deadline = time.monotonic() + 20
        while not any("were removed while open" in line for line in c.controller.output):
            assert time.monotonic() < deadline, c.controller.output[-10:]
            time.sleep(0.02)
        assert c.controller.stop(timeout=30) == 0, c.controller.output[-10:]
    assert _npz_rows(logs / "requests.npz") == 5
    assert read_logs(logs).summary(1.0)["submitted"] == 5
