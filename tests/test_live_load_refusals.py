"""Live (real processes on loopback): a worker whose LOADs of a model are refused is passed
over for another worker, under every policy.

Worker 0 runs a profile set whose resnet18_v2 needs more pages than its cache holds (a
stale or different ``--profiles`` folder on one machine), so its emulated device refuses
every LOAD of it (LOAD_INSUFFICIENT_CACHE); worker 1 runs the shipped set, as does the
controller, which admits both. Before, every LOAD of the model went to worker 0 again:
the Clockwork policy answered every request ERROR, the baselines sent thousands of LOADs a
second there and answered nothing before the client's timeout; worker 1 got none."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import clockwork
from tests.conftest import local_cluster


def _actions(text: str, status: str, kind: str) -> float:
    m = re.search(rf'^clockwork_actions_total\{{status="{status}",type="{kind}"\}} (\S+)$',
                  text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("policy", ["clockwork", "tfserving", "infaas", "clipper"])
def test_a_worker_that_refuses_a_models_load_is_passed_over(policy, tmp_path):
    shipped = Path(clockwork.__file__).parent / "data" / "profiles" / "v100-reference"
    big = tmp_path / "big"
    shutil.copytree(shipped, big)
    p = big / "resnet18_v2.json"
    d = json.loads(p.read_text())
    d["weights_pages"], d["weights_bytes"] = 2000, 2000 << 24  # > its 1,376-page cache
    p.write_text(json.dumps(d))
    with local_cluster(workers=2, models="resnet18_v2", http_port=0,
                       worker_args=[["--profiles", str(big)]],
                       controller_args=["--policy", policy]) as c:
        with clockwork.Client(c.address, timeout=1.5) as client:
            def one(_):
                try:
                    return "SUCCESS", client.infer("resnet18_v2", slo_ms=100).gpu
                except clockwork.errors.ClockworkError as e:
                    return type(e).__name__, None

            with ThreadPoolExecutor(8) as ex:
                got = Counter(ex.map(one, range(40)))
        with urllib.request.urlopen(f"http://{c.printed_address('http')}/metrics",
                                    timeout=5) as r:
            metrics = r.read().decode()
    assert got == {("SUCCESS", 1): 40}, got  # every one served by worker 1's GPU
    assert _actions(metrics, "LOAD_INSUFFICIENT_CACHE", "LOAD") == 1, metrics
    assert _actions(metrics, "SUCCESS", "LOAD") == 1
