"""Building a cuda package's kernels, without a GPU: built kernels are cached on disk and
read back for the same source and architecture, the callback TVM builds with names the
GPU's architecture and goes through that cache, and a cuda worker builds every package's
kernels before it serves (tests/fake_cuda.py stands in for cupy and TVM)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.fake_cuda import PAGE, fake_cuda_device, fake_package
from worker.devices import cuda


@pytest.fixture
def cache(tmp_path, monkeypatch):
    where = tmp_path / "kernels"
    monkeypatch.setenv(cuda.KERNEL_CACHE_ENV, str(where))
    return where


def _counting_build(calls):
    def build(code):
        calls.append(code)
        return f"binary of {code}".encode()
    return build


def test_kernels_are_built_once_for_a_source_and_tag(cache):
    calls: list = []
    build = _counting_build(calls)
    first = cuda.cached_kernels(build, "__global__ void k() {}", "nvrtc cubin sm_90")
    again = cuda.cached_kernels(build, "__global__ void k() {}", "nvrtc cubin sm_90")
    assert first == again == b"binary of __global__ void k() {}" and len(calls) == 1
    cuda.cached_kernels(build, "__global__ void k() {}", "nvrtc cubin sm_100")  # another GPU
    cuda.cached_kernels(build, "__global__ void j() {}", "nvrtc cubin sm_90")  # other code
    assert len(calls) == 3
    assert len(list(cache.glob("*.bin"))) == 3 and not list(cache.glob(".*"))  # no parts


def test_a_damaged_cache_entry_is_built_again(cache):
    """An entry cut short or changed on disk is not handed to the GPU: the kernels are
    built again and the entry written anew (it was read as it was, on every start)."""
    calls: list = []
    build = _counting_build(calls)
    code = "__global__ void k() {}"
    assert cuda.cached_kernels(build, code, "t") == b"binary of " + code.encode()
    (entry,) = cache.glob("*.bin")
    whole = entry.read_bytes()
    for damaged in (whole[:-3], whole[:-1] + b"X", b"", whole[:20]):
        entry.write_bytes(damaged)
        assert cuda.cached_kernels(build, code, "t") == b"binary of " + code.encode()
        assert entry.read_bytes() == whole
    assert len(calls) == 5
    assert cuda.cached_kernels(build, code, "t") == b"binary of " + code.encode()
    assert len(calls) == 5  # (whole again: read, not built)


def test_no_cache_when_the_variable_is_empty_or_the_folder_unusable(tmp_path, monkeypatch):
    calls: list = []
    build = _counting_build(calls)
    monkeypatch.setenv(cuda.KERNEL_CACHE_ENV, "")
    assert cuda.kernel_cache_dir() is None
    for _ in range(2):
        assert cuda.cached_kernels(build, "c", "t") == b"binary of c"
    assert len(calls) == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cuda.KERNEL_CACHE_ENV, str(blocker / "kernels"))
    assert cuda.cached_kernels(build, "c", "t") == b"binary of c"  # built all the same
    assert len(calls) == 3


def test_default_cache_folder_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(cuda.KERNEL_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cuda.kernel_cache_dir() == tmp_path / "clockwork" / "cuda-kernels"


@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs Apache TVM")
def test_the_callback_tvm_builds_with_names_the_gpu_and_uses_the_cache(cache, monkeypatch):
    import tvm_ffi
    from tvm.support import nvcc

    seen: list = []

    def compile_cuda(code, target_format=None, arch=None, options=None, path_target=None,
                     compiler="nvrtc"):
        seen.append((target_format, arch, compiler))
        return b"cubin"

    monkeypatch.setattr(cuda, "_kernel_compiler", lambda: "nvrtc")
    monkeypatch.setattr(nvcc, "compile_cuda", compile_cuda)
    try:
        assert cuda._use_kernel_compiler("sm_90") == "nvrtc"
        build = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
        assert bytes(build("extern \"C\" __global__ void k() {}")) == b"cubin"
        assert bytes(build("extern \"C\" __global__ void k() {}")) == b"cubin"
    finally:  # TVM's own callback back, for the other tests of this process
        tvm_ffi.register_global_func("tvm_callback_cuda_compile",
                                     nvcc.tvm_callback_cuda_compile, override=True)
        os.environ.pop("TVM_CUDA_COMPILE_MODE", None)
    assert seen == [("cubin", "sm_90", "nvrtc")]  # once: the second came from the cache


def test_a_cuda_worker_builds_every_package_before_it_serves(tmp_path, monkeypatch, capsys):
    from worker import service

    packages = tmp_path / "packages"
    for name in ("a", "b"):
        fake_package(packages / name)
    (packages / "broken").mkdir()
    (packages / "broken" / "model.json").write_text("{")
    made = []

    def open_device(kind, pages, index=0):
        dev, _, tvm = fake_cuda_device(pages)
        load_module = tvm.runtime.load_module
        tvm.runtime.load_module = lambda path: made.append(path) or load_module(path)
        return dev

    monkeypatch.setattr(service, "_open_device", open_device)
    node = service.WorkerNode(1, 8, "v100-reference", "cuda", packages=str(packages))
    signs = []
    node.prepare_packages(built=lambda: signs.append(1))
    assert len(signs) == 2  # a sign of life after each package built (Ray's wait reads them)
    err = capsys.readouterr().err
    assert "kernels of a ready (1/3" in err and "kernels of b ready (2/3" in err
    assert "package broken not prepared" in err
    assert len(made) == 2
    dev = node.real[0]
    dev.register("a:1", packages / "a")
    dev.register("a:2", packages / "a")
    assert len(made) == 2  # registering built nothing more
    assert dev.arena.page_size == PAGE


def test_a_long_build_keeps_saying_it_is_alive(tmp_path, monkeypatch, capsys):
    """A package whose kernels take long to build (resnet18's first build on a GPU took
    more than 30 s) gets lines while it builds: ``clockwork serve`` gives up on a child
    that says nothing for 30 s, a Ray actor's wait on one that shows no progress."""
    import threading

    from worker import service

    packages = tmp_path / "packages"
    fake_package(packages / "slow")
    signs = threading.Semaphore(0)

    def open_device(kind, pages, index=0):
        dev = fake_cuda_device(pages)[0]
        prepare = dev.prepare

        def slow_prepare(path):  # still building until two signs of life came
            assert signs.acquire(timeout=30) and signs.acquire(timeout=30)
            return prepare(path)

        dev.prepare = slow_prepare
        return dev

    monkeypatch.setattr(service, "_open_device", open_device)
    monkeypatch.setattr(service, "BUILD_NOTE_S", 0.01)
    node = service.WorkerNode(1, 8, "v100-reference", "cuda", packages=str(packages))
    node.prepare_packages(built=signs.release)
    err = capsys.readouterr().err
    assert err.count("still building the kernels of slow (1/1)") >= 2
    assert "kernels of slow ready (1/1" in err.splitlines()[-1]
    assert node.real[0].packages


def test_building_stops_once_the_worker_is_told_to(tmp_path, monkeypatch):
    from worker import service

    packages = tmp_path / "packages"
    for name in ("a", "b"):
        fake_package(packages / name)
    monkeypatch.setattr(service, "_open_device",
                        lambda kind, pages, index=0: fake_cuda_device(pages)[0])
    node = service.WorkerNode(1, 8, "v100-reference", "cuda", packages=str(packages))
    node.prepare_packages(lambda: True)
    assert not node.real[0].packages
