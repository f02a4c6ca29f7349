"""The cuda device: TVM CUDA kernels on a cupy page arena, clocks and memory from pynvml.

Same interface and semantics as :class:`worker.devices.cpu.CpuDevice`:

* ``register(name, package)`` is LoadModelFromDisk: load the library (TVM compiles the
  package's CUDA kernels for this GPU here, with NVRTC or nvcc), create a Relax VM on
  ``tvm.cuda()``, and read the weights blob into pinned host memory (so LOAD is a copy).
* ``load(name)`` is LOAD: allocate pages of the GPU arena (one preallocated,
  4096-aligned cupy buffer cut into 16 MiB pages), copy the blob in page by page
  (host to device) and wrap each tensor's page view as a TVM tensor with
  ``tvm.runtime.from_dlpack`` (zero-copy).
* ``evict(name)`` is EVICT: drop the bindings, free the pages.
* ``infer(name, inputs)`` is INPUT copy (host to a preallocated device buffer) + EXEC
  (the VM function with the bound page views as weights) + OUTPUT copy. ``exec_ns`` is
  the EXEC alone, timed with CUDA events on the stream TVM launches on.

One EXEC at a time (a lock). ``telemetry()`` reads the GPU's clocks, memory, temperature
and power from NVML.

cupy and pynvml are imported lazily: without them, without a GPU (or driver), or with a
TVM that has no CUDA runtime, constructing a :class:`CudaDevice` raises
:class:`DeviceUnavailable`, whose message names the install hint and the alternatives.

Packages for this device come from ``clockwork compile --device cuda``, which can
cross-compile on a machine without a GPU: see :func:`cuda_target_and_check`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clockwork.profiles import PAGE_SIZE
from worker.devices.base import DeviceError, RealDevice
from worker.memory import ARENA_ALIGNMENT, TENSOR_ALIGNMENT, ArenaError, PageArena

INSTALL_HINT = ("pip install 'clockwork-py[cuda12]' or 'clockwork-py[cuda13]', matching the "
                "CUDA major version nvidia-smi shows")
ALTERNATIVES = ("use `--device cpu` for real execution on the host CPU, or `--device emulated` "
                "for profile-timed emulation")
DEFAULT_ARCH = "sm_90"


class DeviceUnavailable(DeviceError):
    """The device cannot be used on this machine (missing package, GPU, driver or
    compiler); the message says what is missing and what to do instead."""


def _unavailable(what: str) -> DeviceUnavailable:
    return DeviceUnavailable(
        f"cuda device unavailable: {what}. Real execution on a GPU needs an NVIDIA GPU with "
        f"its driver and the CUDA extras ({INSTALL_HINT}: cupy and nvidia-ml-py); "
        f"otherwise {ALTERNATIVES}.")


def cuda_target(arch: str = DEFAULT_ARCH) -> str:
    """The TVM target for ``arch`` (TVM 0.27 takes JSON, not ``cuda -arch=sm_90``)."""
    return json.dumps({"kind": "cuda", "arch": arch})


CUDA_TARGET = cuda_target()


# -- availability ---------------------------------------------------------------------


def _import(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise _unavailable(f"{what} is not installed ({e})") from e
    except Exception as e:  # noqa: BLE001  (cupy raises other errors when CUDA libs are broken)
        raise _unavailable(f"{what} failed to import ({type(e).__name__}: {e})") from e


def _kernel_compiler() -> str | None:
    """How TVM will compile CUDA kernels here: "nvrtc" (the cuda-bindings package),
    "nvcc" (on PATH or under CUDA_HOME), or None."""
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "").lower()
    try:
        importlib.import_module("cuda.bindings.nvrtc")
        nvrtc = True
    except Exception:  # noqa: BLE001
        nvrtc = False
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or (str(Path(home, "bin", "nvcc"))
                                    if Path(home, "bin", "nvcc").exists() else None)
    if mode == "nvcc":
        return "nvcc" if nvcc else None
    if mode == "nvrtc":
        return "nvrtc" if nvrtc else None
    if nvrtc:
        return "nvrtc"
    return "nvcc" if nvcc else None


def _use_kernel_compiler() -> str:
    """Pick NVRTC or nvcc for TVM (TVM defaults to NVRTC, which needs cuda-bindings) and
    register TVM's compile callback; raise DeviceUnavailable when there is neither."""
    how = _kernel_compiler()
    if how is None:
        raise _unavailable("no CUDA kernel compiler: TVM needs NVRTC (`pip install "
                           "cuda-bindings`) or nvcc (the CUDA toolkit) to build kernels")
    os.environ["TVM_CUDA_COMPILE_MODE"] = how
    importlib.import_module("tvm.support.nvcc")  # registers tvm_callback_cuda_compile
    return how


def _tvm():
    try:
        import tvm
    except ImportError as e:
        raise _unavailable(f"Apache TVM is not installed ({e}; `pip install 'clockwork-py[tvm]'`)") from e
    return tvm


def probe(index: int = 0):
    """Check that a CudaDevice can run here; returns (cupy, pynvml, tvm) or raises
    :class:`DeviceUnavailable` naming the first thing missing."""
    cupy = _import("cupy", "cupy")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001  (CUDARuntimeError: no driver / no device)
        raise _unavailable(f"no usable CUDA GPU or driver ({type(e).__name__}: {e})") from e
    if count == 0:
        raise _unavailable("no CUDA GPU found")
    if not 0 <= index < count:
        raise _unavailable(f"GPU {index} requested, {count} present")
    pynvml = _import("pynvml", "pynvml (nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001  (NVMLError)
        raise _unavailable(f"NVML failed to initialise ({e})") from e
    tvm = _tvm()
    if not tvm.cuda(index).exist:
        raise _unavailable("this Apache TVM has no working CUDA runtime (libtvm_runtime_cuda "
                           "not loaded: it needs libcuda.so.1 from the NVIDIA driver)")
    _use_kernel_compiler()
    return cupy, pynvml, tvm


def cuda_target_and_check(arch: str = DEFAULT_ARCH) -> str:
    """The TVM target for ``clockwork compile --device cuda``, after checking that this
    TVM can generate CUDA code; raises :class:`DeviceUnavailable` saying what is missing.

    Without a GPU this is a cross-compile: TVM writes the kernels' CUDA source into the
    library, and the GPU machine compiles them (NVRTC or nvcc) when it loads the package.
    Where TVM's CUDA runtime is loaded (a GPU machine), TVM compiles the kernels at once,
    so a kernel compiler must be present here too.
    """
    tvm = _tvm()
    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        raise _unavailable("this Apache TVM build has no CUDA code generator "
                           "(built without USE_CUDA)")
    target = cuda_target(arch)
    try:
        tvm.target.Target(json.loads(target))
    except Exception as e:  # noqa: BLE001
        raise _unavailable(f"TVM rejects the target {target} ({e})") from e
    if tvm.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None:
        _use_kernel_compiler()
    return target


def check_cli_device(cmd: str, device: str) -> bool:
    """For ``clockwork compile|profile --device DEVICE``: True if the command can go on;
    otherwise print why not (the caller exits 2)."""
    if device == "cpu":
        return True
    if device != "cuda":
        print(f"clockwork {cmd}: device {device!r} is not supported (use --device cpu)",
              file=sys.stderr)
        return False
    try:
        if cmd == "profile":
            probe()
        cuda_target_and_check()
    except DeviceUnavailable as e:
        print(f"clockwork {cmd}: {e}", file=sys.stderr)
        return False
    if cmd == "profile":
        from clockwork.models.profiling import profile_package

        if "device" not in inspect.signature(profile_package).parameters:
            print(f"clockwork {cmd}: the GPU is usable, but profile_package() only measures on "
                  "the cpu device so far (it needs a device= argument that picks CudaDevice)",
                  file=sys.stderr)
            return False
    return True


# -- the arena ------------------------------------------------------------------------


def _ptr(a) -> int:
    """Device (cupy) or host (numpy) address of an array's first byte."""
    data = getattr(a, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(a.ctypes.data)


class CudaPageArena(PageArena):
    """:class:`worker.memory.PageArena` over one preallocated GPU buffer.

    ``xp`` is the array module (cupy; numpy works too, which the tests use). Page
    bookkeeping, ``page`` and ``view`` are the base class's (they only slice); only the
    allocation and the host-to-device ``write`` differ.
    """

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE, xp=None) -> None:
        # not super().__init__(): that allocates the host buffer this arena replaces
        if n_pages <= 0:
            raise ValueError("n_pages must be positive")
        if page_size <= 0 or page_size % TENSOR_ALIGNMENT:
            raise ValueError(f"page_size must be a positive multiple of {TENSOR_ALIGNMENT}")
        if xp is None:
            import cupy as xp
        self.xp = xp
        self.n_pages = n_pages
        self.page_size = page_size
        self.backend = xp.__name__
        nbytes = n_pages * page_size
        self._raw = xp.empty(nbytes + ARENA_ALIGNMENT, dtype=xp.uint8)
        skip = (-_ptr(self._raw)) % ARENA_ALIGNMENT
        self.buffer = self._raw[skip : skip + nbytes]
        self._free = [True] * n_pages
        self._n_free = n_pages

    @property
    def address(self) -> int:
        return _ptr(self.buffer)

    @staticmethod
    def _copy(dst, chunk: np.ndarray) -> None:
        """``PageArena.write``'s copy of one page: host -> device with cupy."""
        if hasattr(dst, "set"):
            dst.set(chunk)
        else:
            dst[...] = chunk


# -- the device -----------------------------------------------------------------------


@dataclass
class _Model:
    name: str
    path: Path
    meta: dict
    vm: object
    functions: dict[int, object]
    blob: np.ndarray  # pinned host memory
    inputs: dict[int, tuple[object, object]] = field(default_factory=dict)  # (cupy, tvm)
    pages: list[int] | None = None
    bound: list[object] | None = None


def _target_kind(target: str) -> str:
    try:
        return json.loads(target)["kind"]
    except (ValueError, TypeError, KeyError):
        return target.split()[0] if target else ""


class CudaDevice(RealDevice):
    """Real execution on an NVIDIA GPU; see the module docstring."""

    kind = "cuda"

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE, index: int = 0) -> None:
        cupy, pynvml, tvm = probe(index)
        self.index = index
        self._cupy = cupy
        self._nvml = pynvml
        self._nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._dev = tvm.cuda(index)
        with cupy.cuda.Device(index):
            self.arena = CudaPageArena(n_pages, page_size, cupy)
            self._start = cupy.cuda.Event()
            self._end = cupy.cuda.Event()
        self.models: dict[str, _Model] = {}
        self._lock = threading.Lock()

    def _pinned(self, a: np.ndarray) -> np.ndarray:
        import cupyx

        out = cupyx.empty_pinned(a.shape, a.dtype)
        out[...] = a
        return out

    # -- LoadModelFromDisk --------------------------------------------------------------

    def register(self, name: str, package: str | Path) -> dict:
        import tvm
        from tvm import relax

        from clockwork.models.package import LIBRARY, WEIGHTS, read_package

        cupy = self._cupy
        path = Path(package)
        meta = read_package(path)
        if _target_kind(meta["target"]) != "cuda":
            raise DeviceError(f"package {path} was compiled for {meta['target']!r}, not cuda "
                              "(clockwork compile --device cuda)")
        if meta["page_size"] != self.arena.page_size:
            raise DeviceError(f"package {path} is laid out in {meta['page_size']}-byte pages, "
                              f"the arena has {self.arena.page_size}-byte pages")
        lib = tvm.runtime.load_module(str(path / LIBRARY))  # compiles the kernels
        vm = relax.VirtualMachine(lib, self._dev)
        functions = {int(b): vm[f] for b, f in meta["functions"].items()}
        blob = self._pinned(np.fromfile(path / WEIGHTS, dtype=np.uint8))
        m = _Model(name, path, meta, vm, functions, blob)
        spec = meta["inputs"][0]
        with cupy.cuda.Device(self.index):
            for b in functions:
                buf = cupy.zeros((b, *spec["shape"]), dtype=spec["dtype"])
                m.inputs[b] = (buf, tvm.runtime.from_dlpack(buf))
        with self._lock:
            if name in self.models:
                raise DeviceError(f"model {name!r} is already registered")
            self.models[name] = m
        return meta

    # -- LOAD / EVICT ---------------------------------------------------------------------

    def load(self, name: str) -> tuple[list[int], int]:
        """LOAD: returns (pages, duration_ns) covering alloc + host-to-device copy + bind."""
        import tvm

        m = self._model(name)
        with self._lock:
            if m.pages is not None:
                raise DeviceError(f"model {name!r} is already loaded")
            t0 = time.perf_counter_ns()
            pages = self.arena.alloc(m.meta["weights_pages"], m.meta["page_runs"])
            try:
                with self._cupy.cuda.Device(self.index):
                    self.arena.write(pages, m.blob)
                    self._cupy.cuda.Stream.null.synchronize()
                bound = [tvm.runtime.from_dlpack(self.arena.view(pages, t["offset"], t["shape"],
                                                                 t["dtype"]))
                         for t in m.meta["params"]]
            except (ArenaError, RuntimeError):
                self.arena.free(pages)
                raise
            m.pages, m.bound = pages, bound
            return pages, time.perf_counter_ns() - t0

    def evict(self, name: str) -> None:
        m = self._model(name)
        with self._lock:
            if m.pages is None:
                raise DeviceError(f"model {name!r} is not loaded")
            m.bound = None
            self.arena.free(m.pages)
            m.pages = None

    # -- INPUT + EXEC + OUTPUT ------------------------------------------------------------

    def infer(self, name: str, inputs: np.ndarray | None,
              batch_size: int | None = None) -> tuple[np.ndarray, int]:
        """Run one batch; returns (outputs, exec_ns) with exec_ns from CUDA events.
        ``inputs`` None runs zeros of ``batch_size`` rows."""
        m = self._model(name)
        b = int(inputs.shape[0]) if inputs is not None else int(batch_size or 0)
        if inputs is None and b in m.functions:
            spec = m.meta["inputs"][0]
            inputs = np.zeros((b, *spec["shape"]), spec["dtype"])
        if b not in m.functions:
            raise DeviceError(f"model {name!r}: batch size {b} not in {sorted(m.functions)}")
        cupy = self._cupy
        with self._lock:
            if m.bound is None:
                raise DeviceError(f"model {name!r}: weights not in the cache")
            buf, tin = m.inputs[b]
            if tuple(inputs.shape) != tuple(buf.shape):
                raise DeviceError(f"model {name!r}: input shape {inputs.shape}, "
                                  f"expected {buf.shape}")
            with cupy.cuda.Device(self.index):
                buf.set(np.ascontiguousarray(inputs, dtype=buf.dtype))  # INPUT
                # TVM launches on the legacy default stream, as does cupy's null stream
                self._start.record(cupy.cuda.Stream.null)
                out = m.functions[b](tin, *m.bound)  # EXEC
                self._end.record(cupy.cuda.Stream.null)
                self._end.synchronize()
                exec_ns = int(cupy.cuda.get_elapsed_time(self._start, self._end) * 1e6)
                return out.numpy(), exec_ns  # OUTPUT

    # -- telemetry ------------------------------------------------------------------------

    def telemetry(self) -> dict:
        """GPU clocks (MHz), memory (bytes), temperature (C) and power (W) from NVML, and
        the arena's page use. A figure NVML cannot give is None."""
        nv, h = self._nvml, self._nvml_handle

        def q(f, *a):
            try:
                return f(h, *a)
            except Exception:  # noqa: BLE001  (NVMLError_NotSupported and friends)
                return None

        name = q(nv.nvmlDeviceGetName)
        mem = q(nv.nvmlDeviceGetMemoryInfo)
        power = q(nv.nvmlDeviceGetPowerUsage)
        return {
            "index": self.index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "sm_clock_mhz": q(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": q(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM),
            "memory_total_bytes": int(mem.total) if mem is not None else None,
            "memory_used_bytes": int(mem.used) if mem is not None else None,
            "memory_free_bytes": int(mem.free) if mem is not None else None,
            "temperature_c": q(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            "power_w": power / 1000 if power is not None else None,
            "arena_pages": self.arena.n_pages,
            "arena_used_pages": self.arena.used_pages,
            "page_size": self.arena.page_size,
        }


__all__ = ["CUDA_TARGET", "CudaDevice", "CudaPageArena", "DeviceUnavailable",
           "check_cli_device", "cuda_target", "cuda_target_and_check", "probe"]
