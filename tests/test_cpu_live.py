"""Real execution through the live system: a cpu worker (TVM-compiled zoo packages on this
host) behind the controller, driven by ``clockwork.Client``/``AsyncClient`` and the stock
``tritonclient``. The weights cache holds fewer pages than there are model instances, so
LOAD and EVICT happen while serving; every output is checked against a numpy reference.

Skipped without TVM (``pip install -e .[tvm]``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tvm")

from clockwork.client import AsyncClient, Client  # noqa: E402
from clockwork.models.package import read_package, reference_weights  # noqa: E402
from clockwork.models.zoo import get_model  # noqa: E402
from clockwork.protocol.wire import msg_to_array  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402

MODELS = ("mlp", "resnet_tiny")
COPIES = {"mlp": 3, "resnet_tiny": 4}  # 7 instances, 1 page each, against a 2-page cache
PAGES = 2
SLO_MS = 1000  # generous: the suite may share the machine's cores with other jobs


@pytest.fixture(scope="module")
def packages(tmp_path_factory, cpu_package):
    root = tmp_path_factory.mktemp("cpu-packages")
    for m in MODELS:
        cpu_package(m, root)
    return root


@pytest.fixture(scope="module")
def references(packages):
    out = {}
    for m in MODELS:
        meta = read_package(packages / m)
        out[m] = (meta, reference_weights(meta, packages / m))
    return out


@pytest.fixture(scope="module")
def cluster(packages):
    models = ",".join(f"{m}:{COPIES[m]}" for m in MODELS)
    with local_cluster(workers=1, gpus=1, profiles="cpu", models=models, pages=PAGES,
                       device="cpu", packages=str(packages),
                       controller_args=["--http-port", "0"]) as c:
        yield c


def _instances():
    return [m if k == 0 else f"{m}:{k}" for m in MODELS for k in range(COPIES[m])]


def _sample(meta, rng):
    spec = meta["inputs"][0]
    return rng.standard_normal(spec["shape"]).astype(spec["dtype"])


def _reference(references, instance, x):
    model = instance.split(":")[0]
    meta, w = references[model]
    return get_model(model).reference(x[None], w)[0]


def test_outputs_correct_while_loading_and_evicting(cluster, references):
    rng = np.random.default_rng(7)
    with Client(cluster.address) as c:
        before = c.stats()
        for i in range(3 * len(_instances())):
            inst = _instances()[i % len(_instances())]
            x = _sample(references[inst.split(":")[0]][0], rng)
            r = c.infer(inst, x, slo_ms=SLO_MS)
            np.testing.assert_allclose(r.output, _reference(references, inst, x),
                                       rtol=1e-4, atol=1e-4)
        after = c.stats()
    loads = after.get("load_ok", 0) - before.get("load_ok", 0)
    evicts = after.get("evict_ok", 0) - before.get("evict_ok", 0)
    # 7 instances round-robin through a 2-page cache: nearly every request needs a LOAD
    assert loads >= len(_instances()) and evicts >= len(_instances()) - PAGES


def test_batched_outputs_go_to_their_own_requests(cluster, references):
    """Many concurrent requests for one instance run in batches; each answer must be the
    output row of its own input."""
    rng = np.random.default_rng(11)
    meta = references["resnet_tiny"][0]
    xs = [_sample(meta, rng) for _ in range(64)]

    async def run():
        async with AsyncClient(cluster.address) as c:
            s = c.stream()  # all 64 in one message: admitted together, so they batch
            futs = [s.submit("resnet_tiny", x, slo_ms=SLO_MS) for x in xs]
            out = await asyncio.gather(*futs)
            await s.close()
            return out

    results = asyncio.run(run())
    for x, r in zip(xs, results, strict=True):
        assert r.status == 0, r.message
        np.testing.assert_allclose(msg_to_array(r.outputs[0]),
                                   _reference(references, "resnet_tiny", x), rtol=1e-4, atol=1e-4)
    sizes = {r.batch_size for r in results}
    assert max(sizes) > 1, sizes  # rows were really sliced out of batches


def test_tensors_on_a_mutual_tls_cluster(packages, references, tmp_path):
    """On a cluster whose worker speaks TLS and wants the controller's certificate, the
    fast link is used (over TLS) and a batch's input and output rows, attached to its
    frames, reach the right requests."""
    from tests.pki import make_pki

    pki = make_pki(tmp_path)
    tls = ["--tls-cert", pki.cert, "--tls-key", pki.key]
    with local_cluster(workers=1, gpus=1, profiles="cpu", models="resnet_tiny", pages=PAGES,
                       device="cpu", packages=str(packages),
                       worker_args=[[*tls, "--tls-ca", pki.ca]],
                       controller_args=[*tls, "--worker-tls-ca", pki.ca]) as c:
        rng = np.random.default_rng(13)
        meta = references["resnet_tiny"][0]
        xs = [_sample(meta, rng) for _ in range(64)]

        async def run():
            async with AsyncClient(c.address, tls_ca=pki.ca) as cl:
                await cl.infer("resnet_tiny", xs[0], slo_ms=SLO_MS)  # loaded: the rest batch
                s = cl.stream()  # one message: admitted together, so they batch
                out = await asyncio.gather(*(s.submit("resnet_tiny", x, slo_ms=SLO_MS)
                                             for x in xs))
                await s.close()
                return out, await cl.stats()

        results, st = asyncio.run(run())
    assert st["worker_fast_links"] == 1
    for x, r in zip(xs, results, strict=True):
        assert r.status == 0, r.message
        np.testing.assert_allclose(msg_to_array(r.outputs[0]),
                                   _reference(references, "resnet_tiny", x), rtol=1e-4,
                                   atol=1e-4)
    assert max(r.batch_size for r in results) > 1


def test_tritonclient_grpc_and_http(cluster, references):
    script = f"""
import re, sys, time
import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th
x = np.load(sys.argv[1])
c = tg.InferenceServerClient({cluster.address!r})
inp = tg.InferInput("x", [1, *x.shape], "FP32")
inp.set_data_from_numpy(x[None])
y1 = c.infer("mlp:2", [inp], parameters={{"slo_ms": {SLO_MS}}}).as_numpy("output")
url = sys.argv[2]
h = th.InferenceServerClient(url)
hi = th.InferInput("x", [1, *x.shape], "FP32")
hi.set_data_from_numpy(x[None])
y2 = h.infer("mlp", [hi], parameters={{"slo_ms": {SLO_MS}}}).as_numpy("output")
np.save(sys.argv[3], np.stack([y1[0], y2[0]]))
"""
    from tests.test_kserve import _http_address

    rng = np.random.default_rng(3)
    meta = references["mlp"][0]
    x = _sample(meta, rng)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        np.save(Path(d) / "x.npy", x)
        # a child process: tritonclient's protobuf modules clash with ours in one process
        subprocess.run([sys.executable, "-c", script, str(Path(d) / "x.npy"),
                        _http_address(cluster), str(Path(d) / "y.npy")], check=True, timeout=60)
        y = np.load(Path(d) / "y.npy")
    ref = _reference(references, "mlp", x)
    np.testing.assert_allclose(y[0], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y[1], ref, rtol=1e-4, atol=1e-4)


def test_load_model_from_disk(cluster, packages):
    import grpc

    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol import clockwork_pb2_grpc as pbg
    from clockwork.protocol.security import WORKER_LOAD, ClusterAuth

    auth = ClusterAuth(cluster.cluster_secret.encode())  # the worker obeys only its controller

    def md():
        return auth.call_metadata(WORKER_LOAD, cluster.worker_addresses[0])[0]

    with grpc.insecure_channel(cluster.worker_addresses[0]) as ch:
        stub = pbg.WorkerStub(ch)
        r = stub.LoadModelFromDisk(pb.LoadModelFromDiskRequest(
            name="my_resnet", path=str(packages / "resnet_tiny")), metadata=md(), timeout=10)
        assert r.model.name == "my_resnet" and r.model.profile == "resnet_tiny"
        assert list(r.model.batch_sizes) == [1, 2, 4, 8, 16]
        assert list(r.model.inputs[0].shape) == [3, 16, 16] and r.model.weights_pages == 1
        assert '"exec_ns"' in r.profile_json  # the worker's measured profile for it
        with pytest.raises(grpc.RpcError) as e:
            stub.LoadModelFromDisk(pb.LoadModelFromDiskRequest(
                name="nope", path=str(packages / "missing")), metadata=md(), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_worker_without_package_is_refused_with_a_clear_message(tmp_path):
    from clockwork.cluster.local import LocalCluster

    c = LocalCluster(workers=1, gpus=1, profiles="cpu", models="mlp", pages=1, device="cpu",
                     packages=str(tmp_path), timeout=30)
    with pytest.raises(RuntimeError, match="no model package") as e:
        c.start()
    c.stop()
    # the worker's own words of why (not shown without --out under serve --replay: the
    # controller's line says only "the worker's log says which")
    assert "the workers said:\nworker0: no model package for profile mlp in " \
        f"{tmp_path}" in str(e.value), str(e.value)


def test_live_prediction_script(tmp_path, cpu_package):
    """experiments/live_prediction.py at a tiny scale: profile vs measured durations of a
    real cpu run, from the controller's action log (the packages of the session's cache,
    so the four models are not compiled again)."""
    import json

    from experiments import live_prediction

    for m in ("mlp", "resnet_tiny", "mobilenet_tiny", "transformer_tiny"):
        cpu_package(m, tmp_path / "packages")
    out = live_prediction.main(["--duration", "3", "--rate", "40", "--out", str(tmp_path),
                                "--packages", str(tmp_path / "packages")])
    data = json.loads((tmp_path / "live_prediction.json").read_text())
    assert (tmp_path / "live_prediction.png").stat().st_size > 0
    infer = data["INFER"]["profile"]
    assert infer["n"] == out["INFER"]["profile"]["n"] > 50  # ~120 requests in 3 s
    assert infer["p1_ms"] <= infer["p50_ms"] <= infer["p99_ms"] <= infer["p99.9_ms"]
    assert data["LOAD"]["profile"]["n"] > 0  # 36 instances vs an 8-page cache: LOADs happen
    assert set(data["INFER"]["per_model"]) <= {"mlp", "resnet_tiny", "mobilenet_tiny",
                                               "transformer_tiny"}


def test_replayed_workload_answers_checked_against_the_reference(cluster, packages):
    """A replayed Poisson workload over all 7 instances (2-page cache): every answer's
    output is compared with the numpy reference for the input it was sent."""
    from clockwork.cluster.replay import replay
    from clockwork.scenario import load_scenario

    models = [{"name": m, "copies": COPIES[m]} for m in MODELS]
    sc = load_scenario(data={
        "seed": 3, "duration_s": 3.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "cpu"},
        "models": models,
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 60, "slo_ms": SLO_MS}]})
    res = asyncio.run(replay(sc, cluster.address, check_packages=str(packages)))
    s = res.summary
    assert res.answered_once and s["succeeded"] > 100
    assert s["outputs"]["checked"] == s["succeeded"] and s["outputs"]["wrong"] == 0


def test_replay_makes_references_only_for_the_scenarios_models(cluster, packages, monkeypatch):
    """The controller serves mlp and resnet_tiny; a scenario of mlp's copies alone gets
    references (a forward pass each, before the run) for mlp alone."""
    from clockwork.cluster.replay import replay
    from clockwork.models.reference import OutputCheck
    from clockwork.scenario import load_scenario

    made = []
    real = OutputCheck.pool
    monkeypatch.setattr(OutputCheck, "pool",
                        lambda self, model, *a: made.append(model) or real(self, model, *a))
    sc = load_scenario(data={
        "seed": 4, "duration_s": 1.0,
        "cluster": {"workers": 1, "gpus_per_worker": 1, "profiles": "cpu"},
        "models": [{"name": "mlp", "copies": COPIES["mlp"]}],
        "workloads": [{"kind": "poisson", "models": "*", "rate_rps": 20, "slo_ms": SLO_MS}]})
    res = asyncio.run(replay(sc, cluster.address, check_packages=str(packages)))
    assert res.answered_once and res.summary["outputs"]["checked"] > 0
    assert set(made) == {"mlp"}


def test_output_check_flags_a_wrong_answer(packages):
    from clockwork.models.reference import OutputCheck

    chk = OutputCheck(packages, seed=1)
    pool = chk.pool("mlp", (64,), "float32")
    right = _reference_direct(packages, "mlp", pool[2])
    chk.record("mlp", 2, right)
    chk.record("mlp", 3, right)  # the answer to another input
    chk.record("not_in_zoo", 0, right)
    v = chk.verify()
    assert (v["checked"], v["wrong"], v["unchecked"]) == (2, 1, 1)


def test_output_check_computes_references_before_answers_and_passes_over_a_package_not_the_zoo_model(
        packages, tmp_path, monkeypatch, capsys):
    """The references are computed as the pools are made, before the run: not while
    answers are recorded (a real-size model's numpy pass stalled the load generator for
    seconds mid-run). A package that carries a zoo model's name but not its weights (an
    ONNX import named like it) leaves its outputs unchecked, said once, instead of
    failing the report."""
    import shutil

    import clockwork.models.reference as reference
    from clockwork.models.reference import OutputCheck

    shutil.copytree(packages / "mlp", tmp_path / "mlp")
    shutil.copytree(packages / "mlp", tmp_path / "resnet_tiny")  # not resnet_tiny's weights
    made = []
    real = reference.zoo_reference
    monkeypatch.setattr(reference, "zoo_reference", lambda m, p: made.append(m) or real(m, p))
    chk = OutputCheck(tmp_path, seed=1)
    pool = chk.pool("mlp", (64,), "float32")
    chk.pool("resnet_tiny", (3, 16, 16), "float32")
    assert made == ["mlp", "resnet_tiny"]
    right = _reference_direct(packages, "mlp", pool[1])
    for _ in range(3):
        chk.record("mlp", 1, right)
        chk.record("resnet_tiny", 0, right)
    assert made == ["mlp", "resnet_tiny"]  # nothing computed while answers came
    v = chk.verify()
    assert (v["checked"], v["wrong"], v["unchecked"]) == (3, 0, 3)
    err = capsys.readouterr().err
    assert err.count("outputs of 'resnet_tiny' not checked") == 1


def test_output_check_passes_over_a_reference_that_cannot_be_computed(tmp_path, monkeypatch,
                                                                         capsys):
    """A reference that fails for any reason (weights unreadable, say) leaves that model's
    outputs unchecked, said once, and the run goes on: the check is computed before the
    run now, where an error would otherwise stop the replay before it starts."""
    import clockwork.models.reference as reference
    from clockwork.models.reference import OutputCheck

    def unreadable(model, path):
        def f(x):
            raise OSError("weights.bin: input/output error")
        return f

    monkeypatch.setattr(reference, "zoo_reference", unreadable)
    chk = OutputCheck(tmp_path, seed=1)
    chk.pool("mlp", (64,), "float32")
    chk.record("mlp", 0, np.zeros(10, np.float32))
    assert chk.verify()["unchecked"] == 1
    assert "outputs of 'mlp' not checked" in capsys.readouterr().err


def _reference_direct(packages, model, x):
    meta = read_package(packages / model)
    return get_model(model).reference(x[None], reference_weights(meta, packages / model))[0]


def test_serve_device_cpu_replay_from_the_command_line(tmp_path, cpu_package):
    """The user's path: ``clockwork serve scenarios/cpu_live.toml --replay`` compiles the
    missing packages (two of the four here; the other two are already there), starts a
    cpu worker and a controller, replays, checks every output."""
    import orjson

    from clockwork.cluster.cli import main

    # the two slow to compile come from the session's cache; serve compiles mlp and
    # resnet_tiny itself
    for m in ("mobilenet_tiny", "transformer_tiny"):
        cpu_package(m, tmp_path / "packages")
    out = tmp_path / "run"
    rc = main(["serve", "scenarios/cpu_live.toml", "--replay", "--quiet", "--port", "0",
               "--packages", str(tmp_path / "packages"), "--out", str(out),
               "--set", "duration_s=2", "--set", "workloads.0.rate_rps=60"])
    assert rc == 0
    s = orjson.loads((out / "summary.json").read_bytes())
    # real EXECs with a 50 ms SLO on a shared CPU: on a loaded host some run too late to be
    # saved, or a probe times out and the worker is suspected (answered, counted; seen
    # 0.84-0.96 served at a load of 2-5 on 2 cores, 1.0 idle). This checks the path, not
    # the speed: most are served, each answered once, every output right
    assert s["submitted"] > 60 and s["succeeded"] >= 0.5 * s["submitted"]
    assert s["succeeded"] + s["failed"] + s["dropped"] == s["submitted"]
    assert s["outputs"]["checked"] == s["succeeded"] and s["outputs"]["wrong"] == 0
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == [
        "mlp", "mobilenet_tiny", "resnet_tiny", "transformer_tiny"]
