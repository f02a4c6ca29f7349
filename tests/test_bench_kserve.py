"""experiments/bench_kserve.py's floor server (a bare grpc.aio KServe v2 server) driven by
the stock tritonclient, and one short run of the benchmark against it."""

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


@pytest.fixture
def floor():
    port = bench_kserve.free_port()
    p = subprocess.Popen([sys.executable, str(SCRIPT), "--serve-floor", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


def test_the_floor_answers_the_stock_client(floor):
    import tritonclient.grpc as tc

    cl = tc.InferenceServerClient(floor)
    deadline = time.monotonic() + 30
    while True:  # until it listens
        try:
            if cl.is_server_ready():
                break
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        assert time.monotonic() < deadline, "the floor server did not start"
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


def test_a_short_run_against_the_floor(tmp_path):
    out = tmp_path / "runs.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--servers", "floor", "--cells",
                        "tiny/grpc/2,tiny/rest/2", "--duration", "0.5", "--warmup", "0.2",
                        "--repeats", "1", "--procs", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    # the floor speaks gRPC only: the REST cell is skipped, the gRPC one measured
    assert [(x["server"], x["proto"]) for x in runs] == [("floor", "grpc")]
    assert runs[0]["requests"] > 0 and runs[0]["failed"] == 0
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| tiny | gRPC | 2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "–" and cells[4] == "–"  # neither ours nor the peer ran
    assert float(cells[13].split()[0].replace(",", "")) > 0  # the floor's requests/s
