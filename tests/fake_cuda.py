"""A fake stream API for :class:`worker.devices.cuda.CudaDevice` without a GPU.

``FakeCupy`` stands in for cupy: every stream is a thread running its queued operations
in order (as a CUDA stream does); host-to-device copies (``DevArray.set``), kernels (the
fake TVM functions) and event records are operations on a stream, and each is logged
with the stream it ran on and when it started and ended (``time.perf_counter_ns``).
``FakeTvm`` stands in for Apache TVM: kernels launch on the stream last set with
``tvm.cuda(i).set_raw_stream(ptr)`` on the calling thread (0: the null stream).
``fake_package`` writes a package directory these accept.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE = 4096


@dataclass
class Op:
    stream: int  # the stream's ptr
    kind: str  # "copy", "kernel", "event"
    start: int  # perf_counter_ns
    end: int
    pinned: bool = False  # copy: the source was pinned host memory


class FakeStream:
    def __init__(self, fake: FakeCupy, ptr: int, non_blocking: bool = False) -> None:
        self.fake, self.ptr, self.non_blocking = fake, ptr, non_blocking
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True, name=f"fake-stream-{ptr}").start()

    def _run(self) -> None:
        while True:
            kind, seconds, fn, done, extra = self._q.get()
            t0 = time.perf_counter_ns()
            if seconds:
                time.sleep(seconds)
            if fn is not None:
                fn()
            t1 = time.perf_counter_ns()
            if kind is not None:
                with self.fake.lock:
                    self.fake.log.append(Op(self.ptr, kind, t0, t1, **extra))
            done.set()

    def enqueue(self, kind: str | None, seconds: float = 0.0, fn=None,
                **extra) -> threading.Event:
        done = threading.Event()
        self._q.put((kind, seconds, fn, done, extra))
        return done

    def synchronize(self) -> None:
        self.enqueue(None).wait()

    def __enter__(self) -> FakeStream:  # cupy: the current stream inside the block
        self.fake.current.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.fake.current.pop()


class FakeEvent:
    def __init__(self) -> None:
        self.t: int | None = None
        self.stream: int | None = None
        self._done = threading.Event()

    def record(self, stream: FakeStream) -> None:
        def stamp() -> None:
            self.t = time.perf_counter_ns()

        self.stream = stream.ptr
        self._done = stream.enqueue("event", fn=stamp)

    def synchronize(self) -> None:
        self._done.wait()


class DevArray(np.ndarray):
    """Device memory: ``set`` is a host-to-device copy queued on a stream."""

    fake: FakeCupy

    def set(self, host: np.ndarray, stream: FakeStream | None = None) -> None:
        fake = self.fake
        s = stream if stream is not None else fake.null
        dst, src = self, np.ascontiguousarray(host)
        pinned = any(np.may_share_memory(src, p) for p in fake.pinned)
        s.enqueue("copy", fake.copy_s, lambda: np.copyto(dst, src.reshape(dst.shape)),
                  pinned=pinned)
        if not pinned:  # pageable memory: the copy is synchronous with the host
            s.synchronize()


class FakeCupy:
    """The cupy subset CudaDevice uses. ``copy_s``: seconds per copy (one page)."""

    __name__ = "fakecupy"
    uint8 = np.uint8

    def __init__(self, copy_s: float = 0.0) -> None:
        self.copy_s = copy_s
        self.lock = threading.Lock()
        self.log: list[Op] = []
        self.pinned: list[np.ndarray] = []
        self.current: list[FakeStream] = []  # streams entered with ``with``, innermost last
        self.streams: dict[int, FakeStream] = {}
        self._ptrs = itertools.count(0)
        self.DevArray = type("DevArray", (DevArray,), {"fake": self})
        self.null = self._stream()
        fake = self

        class Stream(FakeStream):
            def __init__(self, non_blocking: bool = False) -> None:
                FakeStream.__init__(self, fake, next(fake._ptrs) * 16 + 0x1000, non_blocking)
                fake.streams[self.ptr] = self

        self.cuda = types.SimpleNamespace(
            Device=lambda index=0: contextlib.nullcontext(),
            Stream=Stream,
            Event=FakeEvent,
            get_elapsed_time=lambda a, b: (b.t - a.t) / 1e6,
        )

    def _stream(self) -> FakeStream:
        s = FakeStream(self, next(self._ptrs), False)
        self.streams[s.ptr] = s
        return s

    def empty(self, shape, dtype=np.uint8):
        return np.zeros(shape, dtype).view(self.DevArray)

    zeros = empty

    def empty_pinned(self, shape, dtype):
        a = np.empty(shape, dtype)
        self.pinned.append(a)
        return a

    def ops(self, kind: str) -> list[Op]:
        with self.lock:
            return [o for o in self.log if o.kind == kind]


class _FakeTensor:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def numpy(self) -> np.ndarray:
        return self._a.copy()


class FakeTvm:
    """The TVM subset CudaDevice uses. ``kernel_s``: seconds per EXEC kernel."""

    def __init__(self, fake: FakeCupy, kernel_s: float = 0.0, n_out: int = 10) -> None:
        self.fake, self.kernel_s, self.n_out = fake, kernel_s, n_out
        self._current = threading.local()
        self.set_streams: list[int] = []
        tvm = self

        class Dev:
            exist = True

            def set_raw_stream(self, ptr: int) -> None:
                tvm._current.ptr = ptr
                tvm.set_streams.append(ptr)

        self._dev = Dev()
        self.runtime = types.SimpleNamespace(
            load_module=lambda path: ("lib", path), from_dlpack=lambda a: a,
            vm=types.SimpleNamespace(VirtualMachine=lambda lib, dev: _FakeVM(tvm)))

    def cuda(self, index: int = 0):
        return self._dev

    def launch(self, batch: int) -> _FakeTensor:
        ptr = getattr(self._current, "ptr", 0)
        stream = self.fake.streams[ptr]
        out = np.zeros((batch, self.n_out), np.float32)
        stream.enqueue("kernel", self.kernel_s)  # asynchronous, as a kernel launch is
        return _FakeTensor(out)


class _FakeVM:
    def __init__(self, tvm: FakeTvm) -> None:
        self.tvm = tvm

    def __getitem__(self, fname: str):
        def run(x, *weights):
            return self.tvm.launch(int(x.shape[0]))

        return run


def fake_package(path: Path, pages: int = 4, batch_sizes=(1, 2), n_in: int = 8,
                 n_out: int = 10, out_name: str = "y", model: str | None = None) -> Path:
    """A cuda package directory: one float32 weight spanning ``pages`` pages, of model
    ``model`` (default: the folder's name)."""
    path.mkdir(parents=True, exist_ok=True)
    n = pages * PAGE // 4
    meta = {
        "format": 1, "model": model or path.name, "target": json.dumps({"kind": "cuda", "arch": "sm_90"}),
        "page_size": PAGE, "weights_pages": pages, "page_runs": [pages],
        "weights_bytes": pages * PAGE,
        "params": [{"name": "w", "offset": 0, "shape": [n], "dtype": "float32",
                    "nbytes": pages * PAGE}],
        "functions": {str(b): f"main_b{b}" for b in batch_sizes},
        "batch_sizes": list(batch_sizes),
        "inputs": [{"name": "x", "shape": [n_in], "dtype": "float32"}],
        "outputs": [{"name": out_name, "shape": [n_out], "dtype": "float32"}],
    }
    (path / "model.json").write_text(json.dumps(meta))
    # (each package's library its own: a library's bytes are loaded once, ``_library``)
    (path / "model.so").write_bytes(f"fake library of {path.resolve()}".encode())
    np.arange(n, dtype=np.float32).tofile(path / "weights.bin")
    return path


def fake_cuda_device(n_pages: int, copy_s: float = 0.0, kernel_s: float = 0.0):
    """(CudaDevice over the fakes, FakeCupy, FakeTvm)."""
    from worker.devices.cuda import CudaDevice

    cp = FakeCupy(copy_s)
    tvm = FakeTvm(cp, kernel_s)
    return CudaDevice(n_pages, PAGE, cupy=cp, tvm=tvm), cp, tvm
