"""The cuda device: TVM CUDA kernels on a cupy page arena, clocks and memory from pynvml.

Same interface and semantics as :class:`worker.devices.cpu.CpuDevice`:

* ``register(name, package)`` is LoadModelFromDisk: load the library (TVM compiles the
  package's CUDA kernels for this GPU here, with NVRTC or nvcc, or reads them from the
  kernel cache), create a VM (``tvm.runtime.vm``) on ``tvm.cuda()``, and read the weights blob into pinned host memory (so LOAD is a copy);
  once per package, shared by all its instances. TVM's runtime is all this needs.
* ``load(name)`` is LOAD: allocate pages of the GPU arena (one preallocated,
  4096-aligned cupy buffer cut into 16 MiB pages), copy the pinned blob in page by page
  (host to device, asynchronous on the LOAD stream, then wait for that stream) and wrap
  each tensor's page view as a TVM tensor with ``tvm.runtime.from_dlpack`` (zero-copy).
* ``evict(name)`` is EVICT: drop the bindings, free the pages. It never waits: pages an
  EXEC is still reading are freed when that EXEC ends.
* ``infer(name, inputs)`` is INPUT copy (host to a preallocated device buffer) + EXEC
  (the VM function with the bound page views as weights) + OUTPUT copy, all on the EXEC
  stream (TVM is told to launch there with ``set_raw_stream``). ``exec_ns`` is how long
  the EXEC lane was held: from the INPUT copy's start to the outputs in host memory, on
  the host's clock. That, not the kernels' time alone, is what the scheduler has to
  predict (when the lane is free again), and for small models on a large GPU the host's
  share (copies, the VM's launches, the wait) can be most of it. The kernels alone,
  timed with CUDA events recorded on the EXEC stream around them, are ``kernel_ns`` (the
  last EXEC's), which ``clockwork profile`` reports beside.

Two lanes, as the scheduler models a GPU: LOAD and EXEC each have their own
non-blocking CUDA stream and their own lock (one LOAD at a time, one EXEC at a time), so
a LOAD's copies run beside an EXEC's kernels. A third lock guards only the model table
and the arena's page table and is never held while the GPU works. Errors are the
:mod:`worker.devices.base` classes, each with its ``ErrorCode``.

The stream API is injectable (``CudaDevice(..., cupy=, tvm=, nvml=)``, default the real
cupy, TVM and pynvml), so the lanes can be tested without a GPU. ``telemetry()`` reads
the GPU's clocks, memory, temperature and power from NVML.

cupy and pynvml are imported lazily: without them, without a GPU (or driver), or with a
TVM that has no CUDA runtime, constructing a :class:`CudaDevice` raises
:class:`DeviceUnavailable`, whose message names the install hint and the alternatives.

Packages for this device come from ``clockwork compile --device cuda``, which can
cross-compile on a machine without a GPU: see :func:`cuda_target_and_check`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

from clockwork.extras import pip_extra
from clockwork.profiles import PAGE_SIZE
from worker.devices.base import (
    DeviceError,
    DeviceUnavailable,
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
from worker.memory import ARENA_ALIGNMENT, ArenaError, PageArena

INSTALL_HINT = (f"{pip_extra('cuda12', 'cuda13')}, matching the CUDA major version "
                "nvidia-smi shows")
ALTERNATIVES = ("use `--device cpu` for real execution on the host CPU (or, where the command "
                "takes it, `--device emulated` for profile-timed emulation)")
DEFAULT_ARCH = "sm_90"


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


def _runtime_only(tvm) -> bool:
    """Whether TVM runs with its runtime library alone (no libtvm_compiler)."""
    return bool(getattr(getattr(tvm, "base", None), "_RUNTIME_ONLY", False))


KERNEL_CACHE_ENV = "CLOCKWORK_KERNEL_CACHE"


def kernel_cache_dir() -> Path | None:
    """Where built kernels are kept between runs: ``$CLOCKWORK_KERNEL_CACHE`` (empty: no
    cache), else ``$XDG_CACHE_HOME/clockwork/cuda-kernels`` (``~/.cache`` by default)."""
    set_to = os.environ.get(KERNEL_CACHE_ENV)
    if set_to is not None:
        return Path(set_to) if set_to else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                "clockwork", "cuda-kernels")


def cached_kernels(build, code: str, tag: str) -> bytes:
    """``build(code)``, or what it made for the same ``code`` and ``tag`` (compiler and
    architecture) before, from :func:`kernel_cache_dir`. A cache that cannot be read or
    written is passed by: the kernels are built."""
    where = kernel_cache_dir()
    if where is None:
        return bytes(build(code))
    key = hashlib.sha256(f"{tag}\0{code}".encode()).hexdigest()
    path = where / f"{key}.bin"
    with contextlib.suppress(OSError):
        kept = path.read_bytes()
        # an entry is its binary's SHA-256, then the binary: one that does not check out
        # (cut short, damaged on disk, written otherwise) is built and written again
        if len(kept) >= 32 and hashlib.sha256(kept[32:]).digest() == kept[:32]:
            return kept[32:]
    made = bytes(build(code))
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        part = where / f".{key}.{os.getpid()}.{threading.get_ident()}"
        part.write_bytes(hashlib.sha256(made).digest() + made)
        os.replace(part, path)  # whole or not at all, for readers beside us
    return made


def _use_kernel_compiler(arch: str | None = None) -> str:
    """Pick NVRTC or nvcc for TVM (TVM defaults to NVRTC, which needs cuda-bindings) and
    register the callback TVM builds kernels with; raise DeviceUnavailable when there is
    neither.

    With ``arch`` (the GPU's, ``sm_XY``: a GPU machine), the callback is ours: it names
    the architecture and keeps what it builds in :func:`kernel_cache_dir`, so a package's
    kernels (seconds of NVRTC each) are built once per machine. TVM's own callback reads
    the architecture from the compiler's current target, which TVM's runtime alone does
    not have; there the kernels are built with NVRTC."""
    how = _kernel_compiler()
    tvm = _tvm()
    if how is None or (arch is not None and _runtime_only(tvm) and how != "nvrtc"):
        raise _unavailable("no CUDA kernel compiler: TVM needs NVRTC (`pip install "
                           "cuda-bindings`) or nvcc (the CUDA toolkit) to build kernels"
                           + ("; with TVM's runtime alone (no libtvm_compiler) only NVRTC "
                              "will do, and only nvcc is here" if how else ""))
    os.environ["TVM_CUDA_COMPILE_MODE"] = how
    nvcc = importlib.import_module("tvm.support.nvcc")  # registers TVM's own callback
    if arch is None:
        return how
    fmt = "cubin" if how == "nvrtc" else "fatbin"
    tag = f"{how} {fmt} {arch} tvm {getattr(tvm, '__version__', '?')}"

    def build(code: str) -> bytes:
        return nvcc.compile_cuda(code, target_format=fmt, arch=arch, compiler=how)

    def build_kernels(code: str) -> bytes:
        return cached_kernels(build, code, tag)

    importlib.import_module("tvm_ffi").register_global_func(
        "tvm_callback_cuda_compile", build_kernels, override=True)
    return how


def _tvm():
    try:
        import tvm
    except ImportError as e:
        raise _unavailable(f"Apache TVM is not installed ({e}; `{pip_extra('tvm')}`)") from e
    _load_cuda_runtime(tvm)
    return tvm


def _load_cuda_runtime(tvm) -> None:
    """Load TVM's CUDA runtime library (libtvm_runtime_cuda) if TVM has not.

    TVM 0.27 loads it only while registering its CUDA backend, whose Python side needs
    TVM's compiler: with TVM's runtime alone (no libtvm_compiler, or
    ``TVM_USE_RUNTIME_LIB=1``) that registration fails first and ``tvm.cuda().exist``
    stays False on a GPU machine. A library that will not load here (no libcuda.so.1)
    is left for :func:`probe` to report.
    """
    libs = getattr(getattr(tvm, "base", None), "_LOADED_LIBS", None)
    if not isinstance(libs, dict) or "tvm_runtime_cuda" in libs or "tvm_runtime" not in libs:
        return
    try:
        from tvm_ffi.libinfo import load_lib_ctypes

        libs["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", mode="RTLD_LOCAL",
            extra_lib_paths=[Path(libs["tvm_runtime"]._name).resolve().parent])
    except Exception:  # noqa: BLE001  (OSError, RuntimeError: not there, or no driver)
        pass


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
    _use_kernel_compiler(f"sm_{cupy.cuda.Device(index).compute_capability}")  # e.g. "90"
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


def check_cli_device(cmd: str, device: str, compiles: bool = True) -> bool:
    """For ``clockwork compile|profile --device DEVICE``: True if the command can go on;
    otherwise print why not (the caller exits 2). ``compiles``: the command builds a
    package, which needs TVM's CUDA code generator; a profile of a package built elsewhere
    needs only the GPU and TVM's runtime."""
    if device == "cpu":
        return True
    if device != "cuda":
        print(f"clockwork {cmd}: device {device!r} is not supported (use --device cpu)",
              file=sys.stderr)
        return False
    try:
        if cmd == "profile":
            probe()
        if compiles:
            cuda_target_and_check()
    except DeviceUnavailable as e:
        print(f"clockwork {cmd}: {e}", file=sys.stderr)
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
        if xp is None:
            import cupy as xp
        self.xp = xp
        super().__init__(n_pages, page_size, backend=xp.__name__)

    def _allocate(self, nbytes: int):
        """One ARENA_ALIGNMENT-aligned device buffer (over-allocated and sliced)."""
        self._raw = self.xp.empty(nbytes + ARENA_ALIGNMENT, dtype=self.xp.uint8)
        skip = (-_ptr(self._raw)) % ARENA_ALIGNMENT
        return self._raw[skip : skip + nbytes]

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


class CudaDevice(RealDevice):
    """Real execution on an NVIDIA GPU; see the module docstring.

    ``cupy`` is the stream API (default: the real cupy, after :func:`probe`): a module
    with cupy's ``cuda.Device``, ``cuda.Stream(non_blocking=True)`` (``.ptr``,
    ``.synchronize()``), ``cuda.Event()`` (``.record(stream)``, ``.synchronize()``),
    ``cuda.get_elapsed_time`` (ms), ``empty``/``zeros``/``uint8`` for device arrays whose
    ``set(host, stream=)`` copies host to device, and (``cupyx``'s) ``empty_pinned``.
    ``tvm`` (default: Apache TVM) loads the package and binds arrays with
    ``runtime.from_dlpack``; kernels launch on the stream set with
    ``tvm.cuda(index).set_raw_stream(ptr)``. ``nvml`` (pynvml) feeds ``telemetry``.
    Tests pass fakes for all three.
    """

    kind = "cuda"
    builds_kernels = True

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE, index: int = 0, *,
                 cupy=None, tvm=None, nvml=None) -> None:
        if cupy is None:
            cupy, nvml, tvm = probe(index)
        elif tvm is None:
            tvm = _tvm()
        self.index = index
        self._cupy = cupy
        self._tvm = tvm
        self._nvml = nvml
        self._nvml_handle = nvml.nvmlDeviceGetHandleByIndex(index) if nvml is not None else None
        self._dev = tvm.cuda(index)
        with cupy.cuda.Device(index):
            self.arena = CudaPageArena(n_pages, page_size, cupy)
            # two lanes, as the scheduler models them: LOAD copies on one stream, EXEC on
            # another; neither blocks on the legacy default stream
            self.load_stream = cupy.cuda.Stream(non_blocking=True)
            self.exec_stream = cupy.cuda.Stream(non_blocking=True)
            self._start = cupy.cuda.Event()
            self._end = cupy.cuda.Event()
        self.kernel_ns: int | None = None  # the last EXEC's kernels, by CUDA events
        self.models: dict[str, Instance] = {}
        self.packages: dict[Path, Package] = {}
        self.stamps: dict[Path, tuple] = {}
        self._registering = threading.Lock()  # one package loaded (kernels built) at a time
        # models and the arena's page table; held on the GPU only while a LOAD slides
        # loaded weights together (_take_pages)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # (RealDevice._take_pages)
        self._load_lane = threading.Lock()  # one LOAD at a time
        self._exec_lane = threading.Lock()  # one EXEC at a time

    def _pinned(self, a: np.ndarray) -> np.ndarray:
        empty_pinned = getattr(self._cupy, "empty_pinned", None)
        if empty_pinned is None:
            empty_pinned = importlib.import_module("cupyx").empty_pinned
        out = empty_pinned(a.shape, a.dtype)
        out[...] = a
        return out

    def _vm_module(self):
        """Where the VirtualMachine class is: TVM's runtime (``tvm.runtime.vm``), so a GPU
        machine needs only TVM's runtime libraries, not its compiler."""
        vm = getattr(getattr(self._tvm, "runtime", None), "vm", None)
        return vm if vm is not None else importlib.import_module("tvm.runtime.vm")

    # -- LoadModelFromDisk --------------------------------------------------------------

    def _package(self, path: Path) -> Package:
        """The package at ``path``, loaded on first use (under ``_registering``)."""
        from clockwork.models.package import WEIGHTS, read_package

        stamp = package_stamp(path)
        pkg = self._cached(path, stamp)
        if pkg is not None:
            return pkg
        cupy, tvm = self._cupy, self._tvm
        meta = read_package(path)
        if target_kind(meta["target"]) != "cuda":
            raise InvalidPackage(f"package {path} was compiled for {meta['target']!r}, not "
                                 "cuda (clockwork compile --device cuda)")
        if meta["page_size"] != self.arena.page_size:
            raise InvalidPackage(f"package {path} is laid out in {meta['page_size']}-byte "
                                 f"pages, the arena has {self.arena.page_size}-byte pages")
        host = np.fromfile(path / WEIGHTS, dtype=np.uint8)
        library = self._check_files(path, meta, host)
        lib = self._library(tvm, path, library)  # compiles the kernels
        vm = self._vm_module().VirtualMachine(lib, self._dev)
        functions = {int(b): vm[f] for b, f in meta["functions"].items()}
        blob = self._pinned(host)
        pkg = Package(path, meta, vm, functions, blob)
        spec = meta["inputs"][0]
        with cupy.cuda.Device(self.index):
            for b in functions:
                buf = cupy.zeros((b, *spec["shape"]), dtype=spec["dtype"])
                pkg.inputs[b] = (buf, tvm.runtime.from_dlpack(buf))
        self._keep(path, stamp, pkg)
        return pkg

    # -- LOAD / EVICT ---------------------------------------------------------------------

    def load(self, name: str) -> tuple[list[int], int]:
        """LOAD: returns (pages, duration_ns) covering alloc + host-to-device copy + bind.
        The copies run on the LOAD stream from pinned memory, beside any EXEC."""
        m = self._model(name)
        with self._load_lane:
            t0 = time.perf_counter_ns()
            with self._lock:
                if m.pages is not None or m.loading:
                    raise WeightsAlreadyLoaded(f"model {name!r} is already loaded")
                pages = self._take_pages(m.meta)
                m.loading = True
            try:
                with self._cupy.cuda.Device(self.index):
                    self._copy_in(pages, m.package.blob)
                    bound = self._bind(pages, m.meta)
            except Exception as e:
                with self._lock:
                    m.loading = False
                    self.arena.free(pages)
                raise LoadFailed(f"model {name!r}: LOAD failed: {e}") from e
            with self._lock:
                m.loading = False
                if self.models.get(name) is not m:  # unregistered while it loaded: not kept
                    self.arena.free(pages)
                    raise LoadFailed(f"model {name!r}: unregistered during its LOAD")
                m.pages, m.bound = pages, bound
            return pages, max(1, time.perf_counter_ns() - t0)

    def _bind(self, pages: list[int], meta: dict) -> list:
        return [self._tvm.runtime.from_dlpack(self.arena.view(pages, t["offset"], t["shape"],
                                                              t["dtype"]))
                for t in meta["params"]]

    @contextlib.contextmanager
    def _moving(self):
        """Pages slid together (``_take_pages``) are copied on the LOAD stream, and
        waited for before anything runs on them where they now lie."""
        with self._cupy.cuda.Device(self.index), self.load_stream:
            yield
        self.load_stream.synchronize()

    def _copy_in(self, pages: list[int], blob: np.ndarray) -> None:
        """Page k of the pinned blob -> arena page ``pages[k]``, asynchronously on the LOAD
        stream; returns when the stream has finished them."""
        ps, stream = self.arena.page_size, self.load_stream
        if blob.size > len(pages) * ps:
            raise ArenaError(f"{blob.size} bytes do not fit in {len(pages)} pages")
        for k, p in enumerate(pages):
            chunk = blob[k * ps : (k + 1) * ps]
            if chunk.size == 0:
                break
            self.arena.page(p)[: chunk.size].set(chunk, stream=stream)
        stream.synchronize()

    # -- INPUT + EXEC + OUTPUT ------------------------------------------------------------

    def infer(self, name: str, inputs: np.ndarray | None,
              batch_size: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
        """Run one batch on the EXEC stream; returns (outputs, exec_ns): exec_ns is how
        long the lane was held (INPUT copy to outputs in host memory, host clock);
        ``kernel_ns`` is then the kernels' time from CUDA events. ``inputs`` None runs
        zeros of ``batch_size`` rows."""
        m = self._model(name)
        pkg = m.package
        b = int(inputs.shape[0]) if inputs is not None else int(batch_size or 0)
        if b not in pkg.functions:
            raise InvalidBatchSize(f"model {name!r}: batch size {b} not in "
                                   f"{sorted(pkg.functions)}")
        buf, tin = pkg.inputs[b]
        if inputs is None:
            spec = m.meta["inputs"][0]
            inputs = np.zeros((b, *spec["shape"]), spec["dtype"])
        if tuple(inputs.shape) != tuple(buf.shape):
            raise InvalidInput(f"model {name!r}: input shape {inputs.shape}, "
                               f"expected {tuple(buf.shape)}")
        cupy, stream = self._cupy, self.exec_stream
        with self._exec_lane:
            with self._lock:
                bound = self._exec_starts(m)
            try:
                t0 = time.perf_counter_ns()
                with cupy.cuda.Device(self.index):
                    buf.set(np.ascontiguousarray(inputs, dtype=buf.dtype), stream=stream)  # INPUT
                    self._dev.set_raw_stream(stream.ptr)  # TVM launches on the EXEC stream
                    self._start.record(stream)
                    out = pkg.functions[b](tin, *bound)  # EXEC
                    self._end.record(stream)
                    self._end.synchronize()
                    outputs = numpy_outputs(out)  # OUTPUT
                held = time.perf_counter_ns() - t0
                self.kernel_ns = max(1, round(cupy.cuda.get_elapsed_time(self._start, self._end) * 1e6))
                return outputs, max(1, held)
            except Exception as e:  # a cupy or TVM error: nothing in here raises our own
                raise ExecFailed(f"model {name!r}: EXEC failed: {e}") from e
            finally:
                with self._lock:
                    self._exec_ends(m)

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

        if nv is None:  # a fake stream API without NVML
            nv = types.SimpleNamespace(NVML_CLOCK_SM=0, NVML_CLOCK_MEM=0,
                                       NVML_TEMPERATURE_GPU=0)
            for f in ("Name", "MemoryInfo", "PowerUsage", "ClockInfo", "MaxClockInfo",
                      "Temperature"):
                setattr(nv, f"nvmlDeviceGet{f}", None)
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


__all__ = ["CUDA_TARGET", "CudaDevice", "CudaPageArena", "DeviceError", "DeviceUnavailable",
           "check_cli_device", "cuda_target", "cuda_target_and_check", "probe"]
