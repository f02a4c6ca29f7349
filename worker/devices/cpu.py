"""The cpu device: TVM-compiled model packages executed on a numpy page arena.

* ``register(name, package)`` is LoadModelFromDisk: it loads the library, creates a
  Relax VM and reads the weights blob into host memory (kept there, so LOAD is a copy).
  Instances of one package (model copies) share its library, VM and host blob.
* ``load(name)`` is LOAD: allocate arena pages (contiguous within each run of the
  package's layout), copy the blob in page by page, and wrap every tensor's arena
  view as a TVM tensor with ``tvm.runtime.from_dlpack`` (zero-copy; TVM checks that
  the data is 64-byte aligned, which the layout guarantees).
  A model unregistered while its LOAD copies gets nothing: its pages are freed when the
  copy ends, and the LOAD fails.
* ``evict(name)`` is EVICT: drop the bindings, free the pages. It never waits: pages an
  EXEC is still reading are freed when that EXEC ends.
* ``infer(name, inputs)`` is INPUT copy + EXEC + OUTPUT copy: the input is copied into
  a preallocated aligned buffer per (package, batch size), the VM function for that
  batch size runs with the bound page views as its weights, and the output is copied
  out. The returned ``exec_ns`` is how long the EXEC lane was held: from the input copy
  to the outputs copied out (as the cuda device's).
* ``duration`` returns None: to ``worker.executor`` its actions are "open" (the worker
  shell runs them on its EXEC and LOAD threads and reports the measured times).

One EXEC at a time (a lock); LOAD runs beside it, as a GPU's copy engine would.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from clockwork.profiles import PAGE_SIZE
from worker.devices.base import (
    DeviceError,
    ExecFailed,
    Instance,
    InvalidBatchSize,
    InvalidInput,
    InvalidPackage,
    LoadFailed,
    Package,
    RealDevice,
    WeightsAlreadyLoaded,
    numpy_outputs,
    package_stamp,
    target_kind,
)
from worker.memory import TENSOR_ALIGNMENT, PageArena


def _aligned_empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + TENSOR_ALIGNMENT, np.uint8)
    skip = (-raw.ctypes.data) % TENSOR_ALIGNMENT
    return raw[skip : skip + nbytes].view(dt).reshape(shape)


class CpuDevice(RealDevice):
    """Real execution on the host CPU; see the module docstring."""

    kind = "cpu"

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE) -> None:
        import tvm  # noqa: F401  (fail early, with the message below, if TVM is absent)

        self.arena = PageArena(n_pages, page_size)
        self.models: dict[str, Instance] = {}
        self.packages: dict[Path, Package] = {}
        self.stamps: dict[Path, tuple] = {}
        self._registering = threading.Lock()  # one package made at a time
        self._lock = threading.Lock()  # models and the arena's page table
        self._idle = threading.Condition(self._lock)  # (RealDevice._take_pages)
        self._exec = threading.Lock()  # one EXEC at a time

    # -- LoadModelFromDisk --------------------------------------------------------------

    def _package(self, path: Path) -> Package:
        """The package at ``path``, loaded on first use (under ``_registering``)."""
        import tvm
        from tvm.runtime.vm import VirtualMachine  # TVM's runtime alone is enough

        from clockwork.models.package import LIBRARY, WEIGHTS, elf_problem, read_package

        stamp = package_stamp(path)
        pkg = self._cached(path, stamp)
        if pkg is not None:
            return pkg
        meta = read_package(path)
        kind = target_kind(meta.get("target"))
        if kind not in ("llvm", "c", ""):
            raise InvalidPackage(f"package {path} was compiled for {kind}, not the CPU "
                                 "(clockwork compile MODEL, whose --device is cpu by default)")
        if meta["page_size"] != self.arena.page_size:
            raise InvalidPackage(f"package {path} is laid out in {meta['page_size']}-byte pages, "
                              f"the arena has {self.arena.page_size}-byte pages")
        why = elf_problem(path / LIBRARY)  # (a truncated library would crash the process)
        if why:
            raise InvalidPackage(f"package {path}: {LIBRARY}: {why}")
        blob = np.fromfile(path / WEIGHTS, dtype=np.uint8)
        library = self._check_files(path, meta, blob)  # (before a library is opened)
        try:
            lib = self._library(tvm, path, library)
            vm = VirtualMachine(lib, tvm.cpu())
            functions = {int(b): vm[f] for b, f in meta["functions"].items()}
        except Exception as e:  # noqa: BLE001 - TVM's own errors: a library it cannot use
            raise InvalidPackage(f"package {path}: {LIBRARY} cannot be loaded: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
        pkg = Package(path, meta, vm, functions, blob)
        spec = meta["inputs"][0]
        for b in functions:
            buf = _aligned_empty((b, *spec["shape"]), spec["dtype"])
            buf[...] = 0
            pkg.inputs[b] = (buf, tvm.runtime.from_dlpack(buf))
        self._keep(path, stamp, pkg)
        return pkg

    # -- LOAD / EVICT ---------------------------------------------------------------------

    def load(self, name: str) -> tuple[list[int], int]:
        """LOAD: returns (pages, duration_ns) where the duration covers alloc + copy + bind.
        Errors: see :class:`worker.devices.base.Device`."""

        m = self._model(name)
        meta = m.meta
        t0 = time.perf_counter_ns()
        with self._lock:
            if m.pages is not None:
                raise WeightsAlreadyLoaded(f"model {name!r} is already loaded")
            pages = self._take_pages(meta)
        try:
            self.arena.write(pages, m.package.blob)
            bound = self._bind(pages, meta)
        except Exception as e:
            with self._lock:
                self.arena.free(pages)
            raise LoadFailed(f"model {name!r}: LOAD failed: {e}") from e
        with self._lock:
            if self.models.get(name) is not m:  # unregistered while it loaded: not kept
                self.arena.free(pages)
                raise LoadFailed(f"model {name!r}: unregistered during its LOAD")
            m.pages, m.bound = pages, bound
        return pages, time.perf_counter_ns() - t0

    def _bind(self, pages: list[int], meta: dict) -> list:
        import tvm

        return [tvm.runtime.from_dlpack(self.arena.view(pages, t["offset"], t["shape"],
                                                        t["dtype"]))
                for t in meta["params"]]

    # -- INPUT + EXEC + OUTPUT ------------------------------------------------------------

    def infer(self, name: str, inputs: np.ndarray | None,
              batch_size: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
        """Run one batch; returns (outputs, exec_ns). ``inputs`` None runs zeros of
        ``batch_size`` rows."""
        m = self._model(name)
        pkg = m.package
        b = int(inputs.shape[0]) if inputs is not None else int(batch_size or 0)
        if b not in pkg.functions:
            raise InvalidBatchSize(f"model {name!r}: batch size {b} not in {sorted(pkg.functions)}")
        buf, tin = pkg.inputs[b]
        if inputs is not None and inputs.shape != buf.shape:
            raise InvalidInput(f"model {name!r}: input shape {inputs.shape}, "
                              f"expected {buf.shape}")
        with self._exec:
            with self._lock:
                bound = self._exec_starts(m)
            try:
                t0 = time.perf_counter_ns()
                if inputs is None:
                    buf[...] = 0
                else:
                    buf[...] = inputs
                f = pkg.functions[b]
                try:
                    outputs = numpy_outputs(f(tin, *bound))
                except Exception as e:
                    raise ExecFailed(f"model {name!r}: EXEC failed: {e}") from e
                return outputs, max(1, time.perf_counter_ns() - t0)
            finally:
                with self._lock:
                    self._exec_ends(m)


__all__ = ["CpuDevice", "DeviceError"]
