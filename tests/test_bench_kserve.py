"""experiments/bench_kserve.py's bare servers driven by the stock tritonclient: the floor (a
bare grpc.aio KServe v2 server) and the hop (the floor plus a round trip to a second
process); one short run of the benchmark against them, and its check against the
targets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from experiments import bench_kserve

SCRIPT = Path(bench_kserve.__file__)


@pytest.fixture(params=["floor", "hop"])
def bare(request, tmp_path):
    p = bench_kserve.Peer(tmp_path / "log", request.param, exec_us=100)
    p.start()
    try:
        yield f"127.0.0.1:{p.grpc_port}"
        tree = bench_kserve.tree_pids([p.proc.pid])  # the server, and the hop's echo process
        assert len(tree) == (2 if request.param == "hop" else 1)
    finally:
        p.stop()
    assert p.proc.poll() is not None
    for pid in tree:  # none left running
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        assert state in ("Z", "X"), (pid, state)


def test_the_bare_servers_answer_the_stock_client(bare):
    import tritonclient.grpc as tc

    cl = tc.InferenceServerClient(bare)
    deadline = time.monotonic() + 30
    while True:  # until it listens
        try:
            if cl.is_server_ready():
                break
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    assert cl.is_model_ready("tiny") and cl.is_model_ready("resnet")
    assert not cl.is_model_ready("nope")
    x = tc.InferInput("x", [1, 64], "FP32")
    data = np.arange(64, dtype=np.float32).reshape(1, 64)
    x.set_data_from_numpy(data)
    y = cl.infer("tiny", [x]).as_numpy("y")
    assert y.shape == (1, 64) and np.array_equal(y, data)  # tiny: its input again
    x = tc.InferInput("x", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(np.ones([1, 3, 224, 224], np.float32))
    y = cl.infer("resnet", [x]).as_numpy("y")
    assert y.shape == (1, 1000) and not y.any()  # resnet: zeros of the output's shape
    cl.close()


def test_a_short_run_against_the_floor_and_the_hop(tmp_path):
    out = tmp_path / "runs.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--servers", "floor,hop", "--cells",
                        "tiny/grpc/2,tiny/rest/2", "--duration", "0.5", "--warmup", "0.2",
                        "--repeats", "1", "--procs", "1", "--exec-us", "50000",
                        "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runs = {x["server"]: x for x in json.loads(out.read_text())["runs"]}
    # they speak gRPC only: the REST cell is skipped, the gRPC one measured
    assert sorted(runs) == ["floor", "hop"] and {x["proto"] for x in runs.values()} == {"grpc"}
    assert all(x["requests"] > 0 and x["failed"] == 0 for x in runs.values())
    # each hop call waited for the second process's 50 ms; the floor's do not wait (a
    # margin wide enough for a loaded machine: at 5 ms a busy CI host's floor reached it)
    assert runs["hop"]["p50_ms"] >= 50.0 > runs["floor"]["p50_ms"]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| tiny | gRPC | 2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "–" and cells[4] == "–"  # neither ours nor the peer ran
    assert float(cells[13].split()[0].replace(",", "")) > 0  # the floor's requests/s
    assert float(cells[17].split()[0]) >= 50.0  # the hop's p50, ms


def _run(server, size, proto, clients, rps, p50):
    return {"server": server, "size": size, "proto": proto, "concurrency": clients,
            "rps": rps, "p50_ms": p50}


def test_the_targets_are_checked_on_the_medians():
    import argparse

    args = argparse.Namespace(exec_us=100.0,
                              cells="tiny/grpc/1,tiny/grpc/8,tiny/rest/8,tiny/json/8",
                              sizes="", protocols="", concurrency="")
    runs = [_run("peer", "tiny", "grpc", 1, 800, 1.2), _run("ours", "tiny", "grpc", 1, 500, 1.5),
            _run("peer", "tiny", "grpc", 8, 2000, 4.0), _run("ours", "tiny", "grpc", 8, 1000, 8),
            _run("ours", "tiny", "grpc", 8, 2500, 3), _run("ours", "tiny", "grpc", 8, 1500, 5),
            _run("peer", "tiny", "rest", 8, 1000, 8.0), _run("ours", "tiny", "rest", 8, 1200, 7),
            _run("peer", "tiny", "json", 8, 800, 9.0), _run("ours", "tiny", "json", 8, 900, 8)]
    lines = bench_kserve.against_targets(runs, args)
    assert lines == [
        "target, ours >= the peer's requests/s from 8 clients: 2 of 3 cells; short: "
        "tiny/grpc/8 0.75",  # the median of 1000, 2500, 1500 against 2000
        "target, ours p50 - EXEC <= the peer's p50 at 1 client, tiny/grpc: 1.40 against "
        "1.20 ms: NOT met"]


def test_sigterm_as_the_servers_start_leaves_none_running():
    """SIGTERM as soon as the first bare server's process appears (the next one being
    started): the script ends in one line (exit 130) and no server of it is left running
    (one whose start the signal cut short had no handle to be stopped by: it ran on,
    with its echo process)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def serving() -> list[int]:
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) > p.pid:
                try:
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                    state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if str(SCRIPT).encode() in cmd and b"--serve-" in cmd and state != "Z":
                    out.append(int(d))
        return out

    p = subprocess.Popen([sys.executable, str(SCRIPT), "--servers", "floor,hop", "--cells",
                          "tiny/grpc/1", "--duration", "0.5", "--warmup", "0", "--repeats",
                          "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not serving():
            assert time.monotonic() < deadline and p.poll() is None, "no server started"
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "bench_kserve.py: interrupted", err
    deadline = time.monotonic() + 10
    while serving():
        assert time.monotonic() < deadline, f"left running: {serving()}"
        time.sleep(0.05)
