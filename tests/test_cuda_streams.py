"""The cuda device's two lanes, without a GPU: over a fake stream API (tests/fake_cuda.py,
where each stream is a thread running its operations in order and logging when each
started and ended), LOAD copies run on the LOAD stream from pinned memory, EXEC kernels
on the EXEC stream, an EXEC is not held up by a long LOAD in progress, exec_ns is the time
the EXEC lane was held and kernel_ns the kernels' time from events on the EXEC stream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from clockwork.actions import ErrorCode
from tests.fake_cuda import PAGE, fake_cuda_device, fake_package
from worker.devices.base import NotInCache, WeightsAlreadyLoaded, WeightsNotPresent

COPY_S = 0.2  # per copy (a page): a 4-page LOAD takes >= 0.8 s
KERNEL_S = 0.05


def _wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.002)


@pytest.fixture
def device(tmp_path):
    dev, cp, tvm = fake_cuda_device(12, copy_s=COPY_S, kernel_s=KERNEL_S)
    dev.register("a", fake_package(tmp_path / "a"))
    dev.register("b", fake_package(tmp_path / "b"))
    return dev, cp, tvm


def test_lanes_have_their_own_non_blocking_streams(device):
    dev, cp, _ = device
    assert dev.load_stream.ptr != dev.exec_stream.ptr
    assert dev.load_stream.non_blocking and dev.exec_stream.non_blocking
    assert cp.null.ptr not in (dev.load_stream.ptr, dev.exec_stream.ptr)


def test_load_copies_pinned_pages_on_the_load_stream(device):
    dev, cp, _ = device
    pages, load_ns = dev.load("a")
    copies = cp.ops("copy")
    assert len(copies) == 4 and len(pages) == 4  # one per page
    assert all(c.stream == dev.load_stream.ptr and c.pinned for c in copies)
    assert isinstance(load_ns, int) and load_ns >= 4 * COPY_S * 1e9
    w = dev.arena.view(pages, 0, (4 * PAGE // 4,), "float32")
    np.testing.assert_array_equal(w, np.arange(4 * PAGE // 4, dtype=np.float32))
    assert dev.models["a"].bound is not None


def test_exec_overlaps_a_long_load_on_another_stream(device):
    dev, cp, tvm = device
    dev.load("a")
    cp.log.clear()
    done = {}

    def load_b():
        dev.load("b")
        done["load"] = time.perf_counter_ns()

    t = threading.Thread(target=load_b)
    t.start()
    _wait_for(lambda: cp.ops("copy"))  # b's first page is being copied
    x = np.ones((2, 8), np.float32)
    y, exec_ns = dev.infer("a", x)
    done["exec"] = time.perf_counter_ns()
    assert t.is_alive(), "EXEC waited for the LOAD"
    t.join(5)
    assert done["exec"] < done["load"]
    assert y.shape == (2, 10)

    copies = [c for c in cp.ops("copy") if c.pinned]  # b's weights
    (inp,) = [c for c in cp.ops("copy") if not c.pinned]  # a's input
    (kernel,) = cp.ops("kernel")
    assert len(copies) == 4 and {c.stream for c in copies} == {dev.load_stream.ptr}
    assert inp.stream == kernel.stream
    assert kernel.stream == dev.exec_stream.ptr
    assert tvm.set_streams[-1] == dev.exec_stream.ptr  # TVM told to launch on the EXEC stream
    # in time: the kernel ran while the copies were still going
    assert copies[0].start < kernel.start and kernel.end < copies[-1].end


def test_exec_ns_is_the_lane_held_and_kernel_ns_the_events_around_the_kernels(device):
    dev, cp, _ = device
    dev.load("a")
    cp.log.clear()
    t0 = time.perf_counter_ns()
    _, exec_ns = dev.infer("a", None, 1)
    wall = time.perf_counter_ns() - t0
    events, (kernel,) = cp.ops("event"), cp.ops("kernel")
    (inp,) = [c for c in cp.ops("copy") if not c.pinned]
    assert [e.stream for e in events] == [dev.exec_stream.ptr] * 2
    assert dev._start.stream == dev._end.stream == dev.exec_stream.ptr
    # start event before the kernel, end event after it, kernel_ns their difference
    assert events[0].end <= kernel.start and kernel.end <= events[1].start
    assert dev.kernel_ns == round((dev._end.t - dev._start.t) / 1e6 * 1e6)
    assert KERNEL_S * 1e9 <= dev.kernel_ns < KERNEL_S * 1e9 + 0.5e9
    # exec_ns is what the scheduler must predict, the time the EXEC lane was held: the
    # (pageable, so synchronous) input copy, the kernels and the output copy
    assert isinstance(exec_ns, int) and inp.end <= kernel.start
    assert (inp.end - inp.start) + (kernel.end - kernel.start) <= exec_ns <= wall
    assert exec_ns >= (COPY_S + KERNEL_S) * 1e9 > dev.kernel_ns


def test_evict_during_exec_frees_pages_when_it_ends(tmp_path):
    dev, cp, _ = fake_cuda_device(8, kernel_s=0.3)
    dev.register("a", fake_package(tmp_path / "a"))
    dev.load("a")
    t = threading.Thread(target=dev.infer, args=("a", None, 1))
    t.start()
    _wait_for(lambda: cp.ops("event"))  # the start event: the kernel is queued
    dev.evict("a")  # never waits
    assert not dev.loaded("a") and dev.arena.used_pages == 4  # still read by the EXEC
    t.join(5)
    assert dev.arena.used_pages == 0


def test_lane_errors_carry_codes(tmp_path):
    dev, _, _ = fake_cuda_device(8)
    dev.register("a", fake_package(tmp_path / "a"))
    with pytest.raises(WeightsNotPresent) as e:
        dev.infer("a", None, 1)
    assert e.value.code == ErrorCode.WEIGHTS_NOT_PRESENT
    with pytest.raises(NotInCache) as e:
        dev.evict("a")
    assert e.value.code == ErrorCode.EVICT_NOT_IN_CACHE
    dev.load("a")
    with pytest.raises(WeightsAlreadyLoaded) as e:
        dev.load("a")
    assert e.value.code == ErrorCode.WEIGHTS_ALREADY_LOADED


def test_instances_of_one_package_share_its_kernels_and_pinned_weights(tmp_path):
    """The kernels of a package are built once however many instances the controller
    registers (each build is an NVRTC compile), and its weights pinned once; each
    instance still loads into its own pages and runs on its own weights."""
    dev, _, tvm = fake_cuda_device(12)
    built = []
    load_module = tvm.runtime.load_module
    tvm.runtime.load_module = lambda path: built.append(path) or load_module(path)
    pkg = fake_package(tmp_path / "a")
    for n in ("a:1", "a:2", "a:3"):
        dev.register(n, pkg)
    dev.register("b", fake_package(tmp_path / "b"))
    assert len(built) == 2
    assert dev.models["a:1"].package is dev.models["a:3"].package
    assert dev.models["a:1"].package is not dev.models["b"].package
    p1, _ = dev.load("a:1")
    p2, _ = dev.load("a:2")
    assert set(p1).isdisjoint(p2)
    dev.evict("a:1")
    assert dev.infer("a:2", None, 1)[0] is not None
    with pytest.raises(WeightsNotPresent):
        dev.infer("a:1", None, 1)


def test_profile_gives_the_lane_held_and_names_the_kernels_share(tmp_path, monkeypatch):
    import worker.devices.cuda as cuda
    from tests.fake_cuda import FakeCupy, FakeTvm
    from worker.profiling import profile_package

    copy_s, kernel_s = 0.01, 0.01
    cp = FakeCupy(copy_s)
    tvm = FakeTvm(cp, kernel_s)
    real = cuda.CudaDevice
    monkeypatch.setattr(cuda, "CudaDevice", lambda n, ps: real(n, ps, cupy=cp, tvm=tvm))
    prof = profile_package(fake_package(tmp_path / "a"), runs=5, load_runs=2, warmup=1,
                           device="cuda")
    for b in (1, 2):
        # the scheduler's figure covers the input copy as well as the kernels
        assert prof.exec_ns[b] >= (copy_s + kernel_s) * 1e9
        assert "the kernels alone, by CUDA events: p50" in prof.source[f"exec_ns.{b}"]
