"""The cuda device. Without a GPU (CI): constructing it raises DeviceUnavailable with the
install hint and the alternatives, the arena logic runs over numpy, and zoo models
cross-compile for CUDA when TVM can. With cupy and a GPU: real runs, checked against the
numpy reference."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from tests import cuda_packages
from worker.devices import cuda
from worker.devices.base import target_kind
from worker.devices.cpu import DeviceError
from worker.devices.cuda import CudaDevice, CudaPageArena, DeviceUnavailable
from worker.memory import ARENA_ALIGNMENT, layout_tensors


def _gpu_present() -> bool:
    try:
        cuda.probe()
    except DeviceUnavailable:
        return False
    return True


GPU = _gpu_present()


def _check_message(msg: str) -> None:
    assert msg.startswith("cuda device unavailable: ")
    assert "--device cpu" in msg and "--device emulated" in msg
    assert "pip install -e '.[cuda12]' or '.[cuda13]' in your clockwork-py checkout" in msg


def test_unavailable_is_a_device_error():
    assert issubclass(DeviceUnavailable, DeviceError)


@pytest.mark.skipif(GPU, reason="a usable GPU is present")
def test_constructor_without_gpu_raises_with_hint():
    with pytest.raises(DeviceUnavailable) as e:
        CudaDevice(4)
    _check_message(str(e.value))


def test_constructor_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(DeviceUnavailable, match="cupy is not installed") as e:
        CudaDevice(4)
    _check_message(str(e.value))


def _fake_cupy(count):
    def get_count():
        if isinstance(count, Exception):
            raise count
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_count)
    return types.SimpleNamespace(__name__="cupy", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("count, match", [
    (0, "no CUDA GPU found"),
    (RuntimeError("cudaErrorInsufficientDriver"), "no usable CUDA GPU or driver"),
])
def test_constructor_without_gpu_or_driver(monkeypatch, count, match):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count))
    with pytest.raises(DeviceUnavailable, match=match) as e:
        CudaDevice(4)
    _check_message(str(e.value))


def test_constructor_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DeviceUnavailable, match="nvidia-ml-py") as e:
        CudaDevice(4)
    _check_message(str(e.value))


def test_kernel_compiler_missing(monkeypatch):
    for m in ("cuda", "cuda.bindings", "cuda.bindings.nvrtc"):  # no cuda-bindings (NVRTC),
        monkeypatch.setitem(sys.modules, m, None)  # even where a GPU probe imported it
    monkeypatch.setattr(cuda.shutil, "which", lambda _: None)
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    assert cuda._kernel_compiler() is None
    with pytest.raises(DeviceUnavailable, match="NVRTC .*or nvcc"):
        cuda._use_kernel_compiler()


# -- the arena, over numpy ------------------------------------------------------------


def test_arena_over_numpy_writes_and_views_pages():
    ps = 4096
    sizes = [1000, 3 * ps + 100, 200]  # the middle tensor spans a run of 4 pages
    offsets, n_pages, runs = layout_tensors(sizes, ps)
    arena = CudaPageArena(n_pages + 3, ps, xp=np)
    assert arena.address % ARENA_ALIGNMENT == 0 and arena.backend == "numpy"
    blob = np.zeros(n_pages * ps, np.uint8)
    rng = np.random.default_rng(0)
    tensors = []
    for off, n in zip(offsets, sizes, strict=True):
        a = rng.integers(0, 255, n, dtype=np.uint8)
        blob[off : off + n] = a
        tensors.append(a)
    blocker = arena.alloc(1)
    pages = arena.alloc(n_pages, runs)
    assert pages[0] == 1 and arena.used_pages == n_pages + 1
    arena.write(pages, blob)
    for off, n, a in zip(offsets, sizes, tensors, strict=True):
        np.testing.assert_array_equal(arena.view(pages, off, (n,), "uint8"), a)
    arena.free(pages + blocker)
    assert arena.free_pages == arena.n_pages


def test_arena_rejects_oversized_blob():
    arena = CudaPageArena(2, 4096, xp=np)
    with pytest.raises(Exception, match="do not fit"):
        arena.write(arena.alloc(1), np.zeros(5000, np.uint8))


# -- compile for cuda (a cross-compile without a GPU) ---------------------------------


def test_target_is_tvm_json():
    assert json.loads(cuda.CUDA_TARGET) == {"kind": "cuda", "arch": "sm_90"}
    assert target_kind(cuda.CUDA_TARGET) == "cuda"
    assert target_kind("llvm -mcpu=x") == "llvm"


def test_cuda_target_and_check_and_cross_compile(tmp_path):
    pytest.importorskip("tvm")
    try:
        target = cuda.cuda_target_and_check()
    except DeviceUnavailable as e:
        _check_message(str(e))
        pytest.skip(f"TVM cannot generate CUDA code here: {e}")
    assert target == cuda.CUDA_TARGET
    from clockwork.models.package import compile_model, read_package

    path = compile_model("mlp", [1], tmp_path / "mlp", target=target)
    meta = read_package(path)
    assert target_kind(meta["target"]) == "cuda"
    assert b"__global__" in (path / "model.so").read_bytes()  # CUDA kernels inside


def test_check_cli_device(capsys):
    assert cuda.check_cli_device("compile", "cpu")
    assert not cuda.check_cli_device("compile", "tpu")
    assert "not supported" in capsys.readouterr().err
    if not GPU:
        assert not cuda.check_cli_device("profile", "cuda")
        err = capsys.readouterr().err
        assert err.startswith("clockwork profile: cuda device unavailable")
        _check_message(err.split("clockwork profile: ", 1)[1].strip())


def test_profiling_a_package_built_elsewhere_needs_no_cuda_code_generator(monkeypatch,
                                                                           capsys):
    """A GPU machine with TVM's runtime alone profiles a cross-compiled package; only
    compiling needs the code generator."""
    def no_codegen(arch=cuda.DEFAULT_ARCH):
        raise cuda._unavailable("this Apache TVM build has no CUDA code generator")

    monkeypatch.setattr(cuda, "probe", lambda index=0: None)  # (a GPU is there)
    monkeypatch.setattr(cuda, "cuda_target_and_check", no_codegen)
    assert cuda.check_cli_device("profile", "cuda", compiles=False)
    assert capsys.readouterr().err == ""
    for cmd in ("profile", "compile"):
        assert not cuda.check_cli_device(cmd, "cuda")
        assert "no CUDA code generator" in capsys.readouterr().err


# -- on a GPU -------------------------------------------------------------------------


@pytest.mark.skipif(not GPU, reason="needs cupy, pynvml and a CUDA GPU")
def test_gpu_outputs_match_reference(tmp_path):
    from clockwork.models.package import read_package, reference_weights
    from clockwork.models.zoo import get_model

    path = cuda_packages.package("mlp", [1, 4], 4096, tmp_path / "mlp")
    meta = read_package(path)
    dev = CudaDevice(meta["weights_pages"] + 2, 4096)
    assert dev.kind == "cuda"
    dev.register("mlp", path)
    assert not dev.loaded("mlp")
    pages, load_ns = dev.load("mlp")
    assert dev.loaded("mlp") and load_ns > 0 and len(pages) == meta["weights_pages"]
    w = reference_weights(meta, path)
    for b in (1, 4):
        x = np.random.default_rng(b).standard_normal((b, 64)).astype("float32")
        y, exec_ns = dev.infer("mlp", x)
        np.testing.assert_allclose(y, get_model("mlp").reference(x, w), rtol=1e-4, atol=1e-4)
        assert exec_ns > 0
    t = dev.telemetry()
    assert t["memory_total_bytes"] > 0 and t["arena_used_pages"] == len(pages)
    dev.evict("mlp")
    with pytest.raises(DeviceError, match="not in the cache"):
        dev.infer("mlp", np.zeros((1, 64), "float32"))

