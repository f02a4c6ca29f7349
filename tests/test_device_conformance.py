"""One contract (worker.devices.base.Device), every device: emulated always; cpu when
Apache TVM is installed; the cuda device over the fake stream API (tests/fake_cuda.py)
always, and on a real GPU when one is present. Load then exec works, exec without
weights raises WeightsNotPresent, evict frees the pages, measured durations are positive
ints in ns, and every error is a DeviceError subclass carrying its ErrorCode."""

from __future__ import annotations

import importlib.util
import threading
import time

import numpy as np
import pytest

from clockwork.actions import NEVER, Action, ActionType, ErrorCode
from tests.conftest import make_profile
from tests.fake_cuda import fake_cuda_device, fake_package
from worker.devices import base
from worker.devices.base import (
    Device,
    DeviceError,
    InsufficientCache,
    InvalidBatchSize,
    InvalidInput,
    InvalidPackage,
    NotInCache,
    UnknownModel,
    WeightsAlreadyLoaded,
    WeightsNotPresent,
)
from worker.memory import ArenaError

BATCHES = [1, 2]
PS = 4096
HAS_TVM = importlib.util.find_spec("tvm") is not None


def _gpu() -> bool:
    from worker.devices.cuda import DeviceUnavailable, probe

    try:
        probe()
    except DeviceUnavailable:
        return False
    return True


@pytest.fixture(scope="module")
def cpu_package(tmp_path_factory):
    from clockwork.models.package import compile_model

    return compile_model("mlp", BATCHES, tmp_path_factory.mktemp("conformance") / "mlp",
                         page_size=PS)


@pytest.fixture(scope="module")
def cuda_package(tmp_path_factory):
    from tests import cuda_packages

    return cuda_packages.package("mlp", BATCHES, PS,
                                 tmp_path_factory.mktemp("conformance-cuda") / "mlp")


@pytest.mark.skipif(not HAS_TVM, reason="needs Apache TVM")
def test_cpu_exec_ns_is_the_lane_held_output_copy_included(cpu_package, monkeypatch):
    """As the cuda device's: exec_ns covers the input copy, the EXEC and the outputs
    copied out, the time the scheduler predicts (here an output copy made 50 ms slow)."""
    import time

    import worker.devices.cpu as cpu
    from clockwork.models.package import read_package

    real = cpu.numpy_outputs

    def slow(out):
        time.sleep(0.05)
        return real(out)

    dev = cpu.CpuDevice(read_package(cpu_package)["weights_pages"] + 1, PS)
    dev.register("m", cpu_package)
    dev.load("m")
    monkeypatch.setattr(cpu, "numpy_outputs", slow)
    _, exec_ns = dev.infer("m", None, BATCHES[0])
    assert exec_ns >= 50_000_000


class _Completions:
    def complete(self, *args):
        self.args = args


def test_the_worker_reports_the_lane_held_until_its_loop_hears_of_the_end(monkeypatch):
    """A device thread's action is completed at the time the worker's loop hears of its
    end (the executor's result spans its lane from its own start to then), with the
    device's own figure as duration (the thread's t1 - t0 when the device gives none)."""
    import worker.service as service
    from worker.service import WorkerNode

    node = object.__new__(WorkerNode)  # only the completion, no event loop or executors
    node.wloop = _Completions()
    monkeypatch.setattr(service, "now_ns", lambda: 50)
    infer = Action(7, ActionType.INFER, 0, 0, "m", 0, NEVER, 0)
    node._completed("e", infer, 10, 30, ErrorCode.SUCCESS, "", 15, "outs")
    assert node.wloop.args == ("e", 7, 50, ErrorCode.SUCCESS, "", 15, "outs",
                               ActionType.INFER)  # (its lane's kind: the id alone is not)
    load = Action(8, ActionType.LOAD, 0, 0, "m", 0, NEVER, 0)
    node._completed("e", load, 10, 30, ErrorCode.SUCCESS, "", None, None)
    assert node.wloop.args == ("e", 8, 50, ErrorCode.SUCCESS, "", 20, None, ActionType.LOAD)


@pytest.fixture(params=[
    "emulated",
    pytest.param("cpu", marks=pytest.mark.skipif(not HAS_TVM, reason="needs Apache TVM")),
    "cuda-fake",
    "cuda",
])
def kind(request):
    if request.param == "cuda" and not _gpu():
        pytest.skip("needs cupy, pynvml and a CUDA GPU")
    return request.param


@pytest.fixture
def make(kind, request, tmp_path):
    """make(n_pages or None) -> (device, package); None: just enough pages, plus 2."""
    if kind == "emulated":
        from worker.devices.emulated import EmulatedDevice

        prof = make_profile("mlp", pages=3, batches=BATCHES)
        return lambda n=None: (EmulatedDevice(n_pages=n or prof.weights_pages + 2), prof)
    if kind == "cpu":
        from clockwork.models.package import read_package
        from worker.devices.cpu import CpuDevice

        pkg = request.getfixturevalue("cpu_package")
        need = read_package(pkg)["weights_pages"]
        return lambda n=None: (CpuDevice(n or need + 2, PS), pkg)
    if kind == "cuda-fake":
        pkg = fake_package(tmp_path / "mlp", pages=3, batch_sizes=BATCHES)
        return lambda n=None: (fake_cuda_device(n or 5)[0], pkg)
    from clockwork.models.package import read_package
    from worker.devices.cuda import CudaDevice

    pkg = request.getfixturevalue("cuda_package")
    need = read_package(pkg)["weights_pages"]
    return lambda n=None: (CudaDevice(n or need + 2, PS), pkg)


def _raises(cls: type[DeviceError], code: ErrorCode, f, *args) -> DeviceError:
    with pytest.raises(DeviceError) as e:
        f(*args)
    err = e.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert err.code == code == type(err).code and isinstance(err.code, ErrorCode)
    assert str(err)  # says what went wrong, for people
    return err


def _inputs(meta: dict, b: int) -> np.ndarray:
    spec = meta["inputs"][0]
    return np.random.default_rng(b).standard_normal((b, *spec["shape"])).astype(spec["dtype"])


def test_load_exec_evict(make):
    dev, pkg = make()
    assert isinstance(dev, Device) and dev.kind in ("emulated", "cpu", "cuda")
    meta = dev.register("m", pkg)
    need = meta["weights_pages"]
    assert sorted(meta["batch_sizes"]) == BATCHES
    assert not dev.loaded("m") and dev.models["m"].pages is None

    _raises(WeightsNotPresent, ErrorCode.WEIGHTS_NOT_PRESENT, dev.infer, "m", None, 1)

    pages, load_ns = dev.load("m")
    assert len(pages) == need and all(isinstance(p, int) for p in pages)
    assert type(load_ns) is int and load_ns > 0
    assert dev.loaded("m") and dev.arena.used_pages == need
    _raises(WeightsAlreadyLoaded, ErrorCode.WEIGHTS_ALREADY_LOADED, dev.load, "m")
    assert dev.arena.used_pages == need

    out_shape = tuple(meta["outputs"][0]["shape"])
    for b in BATCHES:
        for x in (_inputs(meta, b), None):
            y, exec_ns = dev.infer("m", x, b)
            assert type(exec_ns) is int and exec_ns > 0
            y = y if isinstance(y, list) else [y]
            assert y[0].shape == (b, *out_shape)

    dev.evict("m")
    assert not dev.loaded("m") and dev.arena.used_pages == 0
    _raises(NotInCache, ErrorCode.EVICT_NOT_IN_CACHE, dev.evict, "m")
    _raises(WeightsNotPresent, ErrorCode.WEIGHTS_NOT_PRESENT, dev.infer, "m", None, 1)
    pages2, _ = dev.load("m")  # the pages came back: they can be taken again
    assert len(pages2) == need and dev.arena.used_pages == need


def test_bad_calls_raise_coded_errors(make):
    dev, pkg = make()
    meta = dev.register("m", pkg)
    _raises(InvalidPackage, ErrorCode.UNKNOWN_MODEL, dev.register, "m", pkg)
    for f, args in ((dev.load, ("x",)), (dev.evict, ("x",)), (dev.infer, ("x", None, 1)),
                    (dev.loaded, ("x",))):
        _raises(UnknownModel, ErrorCode.UNKNOWN_MODEL, f, *args)
    dev.load("m")
    _raises(InvalidBatchSize, ErrorCode.INVALID_BATCH_SIZE, dev.infer, "m", None, 3)
    x = _inputs(meta, 2)
    _raises(InvalidInput, ErrorCode.INVALID_INPUT, dev.infer, "m", x[:, :-1], 2)
    dev.infer("m", x)  # the device still works


def test_too_few_pages_is_insufficient_cache(make):
    dev, pkg = make(1)
    meta = dev.register("m", pkg)
    assert meta["weights_pages"] > 1
    err = _raises(InsufficientCache, ErrorCode.LOAD_INSUFFICIENT_CACHE, dev.load, "m")
    assert isinstance(err, ArenaError)  # what the worker caught before there were codes
    assert dev.arena.used_pages == 0 and not dev.loaded("m")


def test_every_error_class_has_its_own_code():
    assert all(issubclass(c, DeviceError) and isinstance(c.code, ErrorCode) for c in base.ERRORS)
    from worker.devices import cpu, cuda

    assert cpu.DeviceError is cuda.DeviceError is DeviceError  # re-exported
    assert cuda.DeviceUnavailable is base.DeviceUnavailable
    assert base.DeviceUnavailable.code == ErrorCode.INVALID_GPU


class _Loop:
    def call_soon_threadsafe(self, f, *args):
        self.args = args


class _Raising:
    def __init__(self, err: Exception) -> None:
        self.err = err

    def infer(self, *a):
        raise self.err

    load = infer


@pytest.mark.parametrize("cls", base.ERRORS)
def test_worker_answers_with_the_error_code(cls):
    """The worker shell maps ``err.code``, whatever the message says."""
    from clockwork.actions import Action, ActionType
    from worker.service import WorkerNode

    node = object.__new__(WorkerNode)  # only the lane runners, no event loop or executors
    for typ, run in ((ActionType.INFER, node._run_infer), (ActionType.LOAD, node._run_load)):
        a = Action(1, typ, 0, 0, "m", 0, 1 << 62, 0, batch_size=1)
        loop = _Loop()
        dev = _Raising(cls("batch size not in the cache, already loaded"))  # misleading text
        if typ == ActionType.INFER:
            run(loop, None, dev, a, None)
        else:
            run(loop, None, dev, a)
        status, message = loop.args[4], loop.args[5]
        assert status == cls.code and message.startswith("batch size")


@pytest.fixture(params=[
    pytest.param("cpu", marks=pytest.mark.skipif(not HAS_TVM, reason="needs Apache TVM")),
    "cuda-fake",
    "cuda",
])
def real(request, tmp_path):
    """(device, package) of a real device (its weights in arena memory) whose arena has
    room for three instances and 4 pages more."""
    if request.param in ("cpu", "cuda"):
        from clockwork.models.package import read_package

        if request.param == "cpu":
            from worker.devices.cpu import CpuDevice as cls
        else:
            if not _gpu():
                pytest.skip("needs cupy, pynvml and a CUDA GPU")
            from worker.devices.cuda import CudaDevice as cls
        pkg = request.getfixturevalue(f"{request.param}_package")
        return cls(3 * read_package(pkg)["weights_pages"] + 4, PS), pkg
    pkg = fake_package(tmp_path / "mlp", pages=5, batch_sizes=BATCHES)
    return fake_cuda_device(3 * 5 + 4)[0], pkg


def _weights(dev, name: str) -> list[np.ndarray]:
    """The weights where the arena holds them, copied to host memory."""
    m = dev.models[name]
    views = [dev.arena.view(m.pages, t["offset"], t["shape"], t["dtype"])
             for t in m.meta["params"]]
    return [v.get() if hasattr(v, "get") else v.copy() for v in views]  # (cupy: .get())


def _scatter(dev, pkg, before_a: int, before_b: int) -> None:
    """Register a, b and c, and load a and b with free pages before each (``before_a``,
    ``before_b``) and the rest after b: free pages apart."""
    for n in ("a", "b", "c"):
        dev.register(n, pkg)
    gaps = [dev.arena.alloc(before_a)]
    dev.load("a")
    gaps.append(dev.arena.alloc(before_b))
    dev.load("b")
    for g in gaps:
        dev.arena.free(g)


def test_scattered_free_pages_take_a_load_whose_tensors_span_pages(real):
    """Free pages enough but no run long enough for a tensor larger than a page: the
    LOAD slides the loaded weights together instead of being refused, and those still
    compute what they did, from where they now lie."""
    dev, pkg = real
    from clockwork.models.package import read_package

    meta = read_package(pkg)
    need, longest = meta["weights_pages"], max(meta["page_runs"])
    assert longest > 1
    spacer = (dev.arena.n_pages - 2 * need) // 3
    assert spacer < longest
    _scatter(dev, pkg, spacer, spacer)  # free: a spacer before a, one before b, the rest
    assert dev.arena.free_pages >= need
    x = _inputs(meta, 2)
    before = {n: (list(dev.models[n].pages), _weights(dev, n), dev.infer(n, x)[0])
              for n in ("a", "b")}

    pages, _ = dev.load("c")

    assert len(pages) == need and dev.loaded("c")
    for n, (old_pages, weights, y) in before.items():
        assert dev.models[n].pages != old_pages  # moved
        for w, now in zip(weights, _weights(dev, n), strict=True):
            np.testing.assert_array_equal(now, w)
        np.testing.assert_array_equal(dev.infer(n, x)[0], y)
    assert dev.arena.used_pages == 3 * need


def test_weights_evicted_twice_during_one_exec_are_all_freed(real):
    """EVICT, LOAD and EVICT again while one EXEC still reads the first weights: both
    sets of pages are freed once it ends (the second EVICT replaced the pages the first
    one left to free, which were then never freed: the device's cache and the
    executor's page count drifted apart, and LOADs the executor allowed were refused)."""
    dev, pkg = real
    dev.register("a", pkg)
    dev.load("a")
    m = dev.models["a"]
    started, release = threading.Event(), threading.Event()
    functions = dict(m.package.functions)

    def held(f):
        def run(*args):
            started.set()
            release.wait(10)
            return f(*args)
        return run

    m.package.functions.update({b: held(f) for b, f in functions.items()})
    try:
        run = threading.Thread(target=dev.infer, args=("a", None, 1))
        run.start()
        assert started.wait(10), "the EXEC did not start"
        dev.evict("a")
        dev.load("a")
        dev.evict("a")
        release.set()
        run.join(10)
    finally:
        release.set()
        m.package.functions.update(functions)
    assert not dev.loaded("a") and dev.arena.used_pages == 0


def test_registering_a_prepared_package_does_not_wait_for_another_being_made(real):
    """A worker registers instances on its event loop: one of a package made ready
    already must not wait while another package is being made on a thread (one a
    finished session left reading, seconds for a cuda package's kernels)."""
    dev, pkg = real
    dev.prepare(pkg)
    holding, release = threading.Event(), threading.Event()

    def make_another() -> None:  # (holds what making a package holds)
        with dev._registering:
            holding.set()
            release.wait(10)

    other = threading.Thread(target=make_another)
    other.start()
    try:
        assert holding.wait(10)
        done = threading.Event()
        t = threading.Thread(target=lambda: (dev.register("a", pkg), done.set()))
        t.start()
        assert done.wait(5), "registering waited for the other package"
    finally:
        release.set()
        other.join(10)
    t.join(10)
    assert "a" in dev.models


def test_weights_an_exec_reads_stay_where_they_are(tmp_path):
    """While an EXEC reads a's weights, a LOAD that needs a longer run slides only the
    others: b moves down to a, c takes the pages freed after b, a has not moved."""
    dev, _, _ = fake_cuda_device(3 * 5 + 4, kernel_s=0.5)
    pkg = fake_package(tmp_path / "mlp", pages=5, batch_sizes=BATCHES)  # a 5-page run each
    _scatter(dev, pkg, 3, 3)  # a: 3..7, b: 11..15; free: 0..2, 8..10, 16..18
    a_pages, b_weights = list(dev.models["a"].pages), _weights(dev, "b")
    run = threading.Thread(target=dev.infer, args=("a", None, 1))
    run.start()
    deadline = time.monotonic() + 10
    while not dev.models["a"].busy:  # (the fake kernel takes 0.5 s)
        assert time.monotonic() < deadline, "the EXEC did not start"
        time.sleep(0.001)
    pages, _ = dev.load("c")
    still_busy = dev.models["a"].busy
    run.join()
    assert still_busy, "the EXEC ended before the LOAD: nothing was tested"
    assert dev.models["a"].pages == a_pages
    assert dev.models["b"].pages == [8, 9, 10, 11, 12] and pages == [13, 14, 15, 16, 17]
    for w, now in zip(b_weights, _weights(dev, "b"), strict=True):
        np.testing.assert_array_equal(now, w)


def test_a_load_waits_for_the_exec_reading_weights_it_must_slide(tmp_path):
    """Free pages enough, but only with the weights an EXEC is reading slid aside: the
    LOAD waits for that EXEC to end, then slides them (it was refused
    LOAD_INSUFFICIENT_CACHE: a model with a tensor over a page, sharing a tight cache,
    had 4 in 10 of its requests failed in a live run on the CPU); an EXEC asked for
    meanwhile runs after the slide, on the weights where they then lie, even when it
    takes the lock before the woken LOAD does (it ran on the old place, where the new
    model's weights were being written)."""
    dev, _, _ = fake_cuda_device(12, kernel_s=0.3)
    pkg = fake_package(tmp_path / "mlp", pages=5, batch_sizes=BATCHES)  # a 5-page run each
    for n in ("a", "c"):
        dev.register(n, pkg)
    gap = dev.arena.alloc(3)
    dev.load("a")  # a: 3..7; free once the gap goes: 0..2 and 8..11, no run of 5
    dev.arena.free(gap)
    weights = _weights(dev, "a")
    a = dev.models["a"]
    arena0 = dev.arena.page(0).__array_interface__["data"][0]
    run, read = a.package.functions[1], []  # (the page each EXEC's weights start at)

    def spy(x, *w):
        read.append((w[0].__array_interface__["data"][0] - arena0) // dev.arena.page_size)
        return run(x, *w)

    a.package.functions[1] = spy
    wait = dev._idle.wait

    def load_late(timeout=None):  # (the woken LOAD is the last to take the lock back)
        woke = wait(timeout)
        if threading.current_thread().name == "load":
            dev._lock.release()
            time.sleep(0.05)
            dev._lock.acquire()
        return woke

    dev._idle.wait = load_late
    first = threading.Thread(target=dev.infer, args=("a", None, 1))
    first.start()
    deadline = time.monotonic() + 10
    while not a.busy:
        assert time.monotonic() < deadline, "the EXEC did not start"
        time.sleep(0.001)
    loaded: dict = {}
    load = threading.Thread(target=lambda: loaded.update(pages=dev.load("c")[0]), name="load")
    load.start()
    while not dev._sliding:  # (the LOAD waits for the EXEC)
        assert load.is_alive() and time.monotonic() < deadline, loaded
        time.sleep(0.001)
    second = threading.Thread(target=dev.infer, args=("a", None, 1))
    second.start()
    for t in (first, load, second):
        t.join(10)
    assert sorted(loaded["pages"]) == loaded["pages"] and len(loaded["pages"]) == 5
    assert a.pages == [0, 1, 2, 3, 4]  # slid down, once the EXEC ended
    assert read == [3, 0]  # (the second EXEC: on the weights where the slide left them)
    for w, now in zip(weights, _weights(dev, "a"), strict=True):
        np.testing.assert_array_equal(now, w)
    assert a.busy == 0 and dev._sliding == 0


def test_a_copy_that_fails_while_sliding_is_a_failed_load_and_the_moved_weights_serve(
        tmp_path, monkeypatch):
    """A device error in a copy while the weights slide together: the LOAD fails
    (LoadFailed, nothing taken), and the weights moved before it are where the device
    says, bound there, and still serve."""
    from worker.devices.base import LoadFailed

    dev, _, _ = fake_cuda_device(3 * 5 + 4)
    pkg = fake_package(tmp_path / "mlp", pages=5, batch_sizes=BATCHES)
    _scatter(dev, pkg, 3, 3)  # a: 3..7, b: 11..15
    weights = {n: _weights(dev, n) for n in ("a", "b")}
    move, copies = dev.arena._move, []

    def failing(src, dst):
        copies.append(src)
        if len(copies) == 6:  # a's five pages moved, b's first one fails
            raise RuntimeError("an illegal memory access was encountered")
        move(src, dst)

    monkeypatch.setattr(dev.arena, "_move", failing)
    used = dev.arena.used_pages
    _raises(LoadFailed, ErrorCode.LOAD_INSUFFICIENT_CACHE, dev.load, "c")
    assert dev.arena.used_pages == used and not dev.loaded("c")
    assert dev.models["a"].pages == [0, 1, 2, 3, 4]  # moved, and known to be
    assert dev.models["b"].pages == list(range(11, 16))
    for n in ("a", "b"):
        for w, now in zip(weights[n], _weights(dev, n), strict=True):
            np.testing.assert_array_equal(now, w)
        assert np.shares_memory(dev.models[n].bound[0], dev.arena.page(dev.models[n].pages[0]))
        dev.infer(n, None, 1)


def test_weights_a_failed_copy_overwrote_are_dropped(tmp_path, monkeypatch):
    """A copy that fails while a model's weights slide onto part of their own pages:
    they are half overwritten, so the model is evicted (its next EXEC finds no weights,
    which the controller handles), not left serving wrong weights."""
    from worker.devices.base import LoadFailed

    dev, _, _ = fake_cuda_device(15)
    pkg = fake_package(tmp_path / "mlp", pages=5, batch_sizes=BATCHES)
    _scatter(dev, pkg, 1, 2)  # a: 1..5, b: 8..12; free: 0, 6..7, 13..14
    b_pages, b_weights = list(dev.models["b"].pages), _weights(dev, "b")
    move = dev.arena._move

    def failing(src, dst):
        if dst == 2:  # a's second page, onto its own first one
            raise RuntimeError("an illegal memory access was encountered")
        move(src, dst)

    monkeypatch.setattr(dev.arena, "_move", failing)
    _raises(LoadFailed, ErrorCode.LOAD_INSUFFICIENT_CACHE, dev.load, "c")
    assert not dev.loaded("a") and not dev.loaded("c")
    _raises(WeightsNotPresent, ErrorCode.WEIGHTS_NOT_PRESENT, dev.infer, "a", None, 1)
    assert dev.models["b"].pages == b_pages and dev.arena.used_pages == 5
    for w, now in zip(b_weights, _weights(dev, "b"), strict=True):
        np.testing.assert_array_equal(now, w)
