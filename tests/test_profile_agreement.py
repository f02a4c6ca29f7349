"""A worker whose own profile of a model disagrees with the controller's is refused as it
connects, naming the disagreement, rather than admitted to fail at run time.

Live (real processes on loopback): worker 0 runs a profile set whose copy of resnet18_v2
differs from the controller's (a stale or different ``--profiles`` folder on one
machine). Its pages: the controller counted 3, the worker's device needed 2,000 and
refused every LOAD of it (LOAD_INSUFFICIENT_CACHE), the model served only if the policy
passed that GPU over. Its batch sizes: every INFER of a batch size the worker lacked was
refused INVALID_BATCH_SIZE, its requests answered ERROR. The controller now tells each
worker the pages and batch sizes it counts for every instance; the worker reports one
its profile disagrees with as one it cannot serve, and says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import clockwork
from clockwork.cluster.local import LocalCluster


def _changed(tmp_path: Path, **fields) -> Path:
    """The shipped v100-reference set with resnet18_v2's profile changed."""
    shipped = Path(clockwork.__file__).parent / "data" / "profiles" / "v100-reference"
    d = tmp_path / "other"
    shutil.copytree(shipped, d)
    p = d / "resnet18_v2.json"
    prof = json.loads(p.read_text())
    prof.update(fields)
    p.write_text(json.dumps(prof))
    return d


@pytest.mark.parametrize("fields, why", [
    ({"weights_pages": 2000, "weights_bytes": 2000 << 24},
     "its profile 'resnet18_v2' here needs 2000 pages of weights, the controller's 3"),
    ({"exec_ns": {"1": 1_000_000, "2": 1_500_000, "4": 2_500_000}},
     "its profile 'resnet18_v2' here has no batch size 8, 16 (it has 1, 2, 4), which the "
     "controller may send"),
])
def test_a_worker_whose_profile_disagrees_is_refused_naming_why(tmp_path, fields, why):
    other = _changed(tmp_path, **fields)
    cluster = LocalCluster(workers=2, models="resnet18_v2",
                           worker_args=[["--profiles", str(other)]], timeout=30.0)
    with pytest.raises(RuntimeError) as e:
        with cluster:
            pass
    assert "cannot serve resnet18_v2" in str(e.value), e.value
    assert "weights pages or batch sizes are not the controller's" in str(e.value)
    worker = "".join(cluster.workers[0].output)
    assert f"worker: cannot serve resnet18_v2: {why}" in worker, worker[-2000:]
    for ch in [cluster.controller, *cluster.workers]:
        assert ch is None or ch.proc.poll() is not None, f"{ch.name} still running"


def test_a_worker_with_the_same_figures_is_admitted(tmp_path):
    """The same pages and batch sizes under other timings: admitted (the controller's
    estimates follow what the worker measures)."""
    other = _changed(tmp_path, exec_ns={b: 2 * ns for b, ns in json.loads(
        (Path(clockwork.__file__).parent / "data" / "profiles" / "v100-reference"
         / "resnet18_v2.json").read_text())["exec_ns"].items()})
    with LocalCluster(workers=2, models="resnet18_v2", worker_args=[["--profiles", str(other)]],
                      timeout=30.0) as c:
        with clockwork.Client(c.address, timeout=5) as client:
            assert client.infer("resnet18_v2", slo_ms=1000).latency_ms > 0


def test_a_hello_of_many_instances_it_cannot_serve_is_a_line_not_one_each(capsys):
    """A Hello listing 500 instances whose pages are not the worker's profile's, with
    names of 5,000 characters: each is in the state's missing list, and the worker's log
    has one line for them (at most one a second), the name cut (it printed 500 lines,
    each with the whole name)."""
    import asyncio

    from clockwork.protocol import clockwork_pb2 as pb
    from worker.service import WorkerNode

    long = "m" + "x" * 5000

    async def main():
        w = WorkerNode(gpus=1, pages=100)
        return w.hello(pb.Hello(worker_id=0, reset=True, instances=[
            pb.Instance(name=f"{long}{k}", profile="resnet18_v2", weights_pages=999)
            for k in range(500)]))

    state = asyncio.run(main())
    assert len(state.missing) == 500
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and len(err[0]) < 400, (len(err), err[:2])
    assert "cannot serve mxxx" in err[0] and "needs 3 pages of weights, the controller's 999" \
        in err[0], err[0][:400]
