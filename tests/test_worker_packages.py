"""What a cpu worker serves from its package directory as it changes: a package compiled
again into its folder is checked against the profile as it is now; a package of another
model is not served under a model's name; the packages no instance uses any more are
not all kept for the worker's life. In process (a controller and a cpu worker on one
event loop); needs TVM."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from tests.inprocess import answer, controller_with


def _refused(node, name: str, profile: str, package: str = "") -> str:
    """The refusal of loading ``name`` (the worker cannot serve it): its message."""
    from controller.service import RepositoryError

    async def load():
        with pytest.raises(RepositoryError) as e:
            await node.load_model(name, profile=profile, package=package)
        return e.value.message

    return load()


def test_a_package_compiled_again_into_its_folder_is_checked_as_it_is_now(tmp_path,
                                                                         cpu_package):
    """``mlp``'s package compiled again into its folder, for batch sizes 1 and 2 only,
    while the worker serves ``mlp`` from it: a new instance of profile ``mlp`` (batch
    sizes up to 16) is refused, as the same package in another folder is. It was
    checked with the meta the worker read first, said READY, and most of its requests
    failed "internal error" (a batch size the package lacks)."""
    pytest.importorskip("tvm")
    from clockwork.models.package import compile_model
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)

    async def main():
        wnode = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        async with controller_with([wnode], "cpu", models="mlp") as node:
            assert (await answer(node, "mlp")).status == 0
            await asyncio.to_thread(compile_model, "mlp", [1, 2], tmp_path / "mlp")
            why = await _refused(node, "mlpC", "mlp")
            assert "mlp" in why, why

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_package_of_another_model_is_not_served_under_a_models_name(tmp_path, cpu_package,
                                                                      capsys):
    """A ``mobilenet_tiny`` package in the folder ``resnet_tiny`` (the same tensors):
    an instance of profile ``resnet_tiny`` is refused, the worker saying why. It was
    served, the one network under the other's name and timings."""
    pytest.importorskip("tvm")
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    cpu_package("mobilenet_tiny", tmp_path).rename(tmp_path / "resnet_tiny")

    async def main():
        wnode = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        async with controller_with([wnode], "cpu", models="mlp") as node:
            await _refused(node, "r", "resnet_tiny")

    asyncio.run(asyncio.wait_for(main(), 120))
    err = capsys.readouterr().err
    assert "it holds model 'mobilenet_tiny', the profile is of model 'resnet_tiny'" in err, err


def test_packages_no_instance_uses_are_not_kept_for_good(tmp_path, cpu_package):
    """Eight copies of a package, each registered and unregistered in turn: the device
    keeps at most ``UNUSED_PACKAGES_KEPT`` of them once no instance uses them (it kept
    every one, its weights and library: a worker grew by a package's size for each);
    one registered again soon is the one kept, not read again."""
    pytest.importorskip("tvm")
    from worker.devices import base
    from worker.devices.cpu import CpuDevice

    first = cpu_package("mlp", tmp_path)
    folders = [first] + [shutil.copytree(first, tmp_path / f"mlp{k}") for k in range(1, 8)]
    dev = CpuDevice(8)
    for k, folder in enumerate(folders):
        dev.register(f"m{k}", folder)
        dev.load(f"m{k}")
        dev.unregister(f"m{k}")
        assert len(dev.packages) <= base.UNUSED_PACKAGES_KEPT
    kept = dev.packages[folders[-1].resolve()]
    dev.register("again", folders[-1])
    assert dev.models["again"].package is kept


def _mapped_libraries() -> int:
    """How many of this process's mappings are of a file named model.so."""
    with open("/proc/self/maps") as f:
        return sum("model.so" in line for line in f)


def test_a_library_is_loaded_once_and_never_from_the_package_folder(tmp_path, cpu_package):
    """The same library in eight package folders, each registered, run and unregistered
    in turn on one of two devices: mapped once (TVM never unloads a library: each
    folder's was mapped for the worker's life, ~5 MB a package registered again for a
    worker rotating models), and
    from a private copy: the package's own file truncated while it serves (a compile into
    the folder served) leaves the worker running (it died of SIGBUS)."""
    pytest.importorskip("tvm")
    import subprocess
    import sys

    from worker.devices.cpu import CpuDevice

    first = cpu_package("mlp", tmp_path)
    folders = [first] + [shutil.copytree(first, tmp_path / f"mlp{k}") for k in range(1, 8)]
    devices = [CpuDevice(8), CpuDevice(8)]  # (a worker's GPUs: one library for both)
    for k, folder in enumerate(folders):
        dev = devices[k % 2]
        dev.register(f"m{k}", folder)
        dev.load(f"m{k}")
        dev.infer(f"m{k}", None, 1)
        dev.unregister(f"m{k}")
        if k == 0:  # (mapped now, by this test or one before it in this process)
            once = _mapped_libraries()
    assert once > 0 and _mapped_libraries() == once
    # (in a process of its own: the old way, it died)
    code = f"""
import os
from worker.devices.cpu import CpuDevice
dev = CpuDevice(8)
dev.register("m", {str(folders[1])!r})
dev.load("m")
dev.infer("m", None, 1)
os.truncate({str(folders[1] / "model.so")!r}, 0)
dev.infer("m", None, 1)
print("served")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "served" in p.stdout, (p.returncode, p.stderr[-2000:])


def test_a_package_compiled_with_another_tvm_is_said_once(tmp_path, cpu_package, capsys):
    """``model.json``'s ``tvm_version`` other than the worker's TVM, and no digests of
    its files (an older package's): served, and each said once (neither was said)."""
    pytest.importorskip("tvm")
    import json

    from worker.devices.cpu import CpuDevice

    folder = cpu_package("mlp", tmp_path)
    meta = json.loads((folder / "model.json").read_text())
    meta["tvm_version"] = "0.1.0"
    del meta["sha256"]  # (an older package's: no digests)
    (folder / "model.json").write_text(json.dumps(meta))
    dev = CpuDevice(8)
    for name in ("a", "b"):
        dev.register(name, folder)
        dev.load(name)
        dev.infer(name, None, 1)
        dev.unregister(name)
        dev.packages.clear()  # (read again)
    err = capsys.readouterr().err.splitlines()
    said = [x for x in err if "compiled with TVM" in x]
    assert len(said) == 1 and f"package {folder} was compiled with TVM 0.1.0, this worker " \
        "runs TVM " in said[0], said
    said = [x for x in err if "has no digests of its files" in x]
    assert len(said) == 1 and f"package {folder} has no digests" in said[0], err


def test_the_worker_says_why_for_each_package_it_cannot_serve(tmp_path, cpu_package,
                                                              capsys):
    """The controller's refusal says "the worker's log says why": the worker says it for
    a profile with no package at all (it said nothing), for each of several broken
    packages loaded in a burst (it said the first, then "(N more like it not shown)"),
    and for a cuda package on a cpu worker in its own words (TVM's "a loader of that name
    is not registered")."""
    pytest.importorskip("tvm")
    import json

    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    for k in range(3):  # broken: weights cut short
        bad = shutil.copytree(tmp_path / "mlp", tmp_path / f"broken{k}")
        (bad / "weights.bin").write_bytes(b"\0" * (k + 1))
    # a package folder that is a symbolic link out of the package directory: refused,
    # said as such (it was said as no package, to compile one: through the link, refused
    # again)
    outside = shutil.copytree(tmp_path / "mlp", tmp_path.parent / f"{tmp_path.name}-out")
    (tmp_path / "mobilenet_tiny").symlink_to(outside, target_is_directory=True)
    cuda = shutil.copytree(tmp_path / "mlp", tmp_path / "for_cuda")
    meta = json.loads((cuda / "model.json").read_text())
    meta["target"] = json.dumps({"kind": "cuda", "arch": "sm_90"})
    (cuda / "model.json").write_text(json.dumps(meta))

    async def main():
        wnode = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        async with controller_with([wnode], "cpu", models="mlp") as node:
            await _refused(node, "t", "transformer_tiny")  # (no package for it)
            await _refused(node, "s", "mobilenet_tiny")  # (a symbolic link out)
            for k in range(3):
                await _refused(node, f"b{k}", "mlp", f"broken{k}")
            await _refused(node, "c", "mlp", "for_cuda")

    asyncio.run(asyncio.wait_for(main(), 120))
    err = capsys.readouterr().err
    assert "no model package for profile transformer_tiny in" in err, err
    assert "the model package for profile mobilenet_tiny in" in err, err
    assert "leads outside it" in err and "mobilenet_tiny --out" not in err, err
    for k in range(3):
        assert f"cannot load package {tmp_path / f'broken{k}'} for b{k}" in err, err
    assert f"package {tmp_path / 'for_cuda'} was compiled for cuda, not the CPU" in err, err


def test_a_model_whose_kernels_always_fail_is_answered_error_and_logged(tmp_path,
                                                                        cpu_package,
                                                                        capsys):
    """A package that loads but whose EXEC always fails (its meta, without digests, gives
    a weight another shape of the same size: TVM refuses the tensor at every run), the
    only GPU's copy: its request is answered ERROR with the worker's reason, and the
    worker says so in its log. It waited out its SLO and was answered TIMEOUT "SLO cannot
    be met", as if the cluster were overloaded, with no line in any log."""
    pytest.importorskip("tvm")
    import json

    from clockwork.actions import RequestStatus
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    bad = shutil.copytree(tmp_path / "mlp", tmp_path / "mlp_bad")
    meta = json.loads((bad / "model.json").read_text())
    del meta["sha256"]  # (a package from before digests: read as it says)
    w = next(p for p in meta["params"] if len(p["shape"]) == 2)
    w["shape"] = w["shape"][::-1]
    (bad / "model.json").write_text(json.dumps(meta))

    async def main():
        wnode = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        async with controller_with([wnode], "cpu", models="mlp") as node:
            await node.load_model("bad", profile="mlp", package="mlp_bad")
            return await answer(node, "bad"), await answer(node, "mlp")

    broken, fine = asyncio.run(asyncio.wait_for(main(), 120))
    assert broken.status == RequestStatus.ERROR, broken
    assert "worker error INVALID_INPUT: model 'bad': EXEC failed" in broken.message, broken
    assert fine.status == RequestStatus.SUCCESS, fine
    err = capsys.readouterr().err
    assert "of bad (batch 1) failed on GPU 0: INVALID_INPUT: model 'bad': EXEC" in err, err


def test_a_broken_package_of_many_instances_is_read_and_said_once(tmp_path, cpu_package,
                                                                  capsys, monkeypatch):
    """A load of 8 copies from a package whose weights are damaged: the worker reads and
    checks the package once and says why once, then again not within the minute. It read
    and hashed it once for each copy, and said 8 lines (they differed by the copy's name
    only), at every load and every reconnection."""
    pytest.importorskip("tvm")
    from worker.devices.cpu import CpuDevice
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    bad = shutil.copytree(tmp_path / "mlp", tmp_path / "damaged")
    blob = bytearray((bad / "weights.bin").read_bytes())
    blob[:64] = b"\xff" * 64
    (bad / "weights.bin").write_bytes(bytes(blob))
    reads = []
    read = CpuDevice._package
    monkeypatch.setattr(CpuDevice, "_package", lambda dev, path: reads.append(path) or read(
        dev, path))

    async def main():
        wnode = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        async with controller_with([wnode], "cpu", models="mlp") as node:
            from controller.service import RepositoryError

            for name in ("d", "e"):  # (the second: within the minute, not said again)
                before = len(reads)
                with pytest.raises(RepositoryError):
                    await node.load_model(name, profile="mlp", package="damaged", copies=8)
                assert len(reads) - before <= 2, reads  # (once prepared, once registered)

    asyncio.run(asyncio.wait_for(main(), 120))
    said = [ln for ln in capsys.readouterr().err.splitlines()
            if f"cannot load package {bad}" in ln]
    assert len(said) == 1, said
    assert "for d" in said[0] and "not the weights this package was compiled with" in said[0]
