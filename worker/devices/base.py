"""The device contract: what every device (emulated, cpu, cuda) offers the worker, and
the errors it raises.

Units: every duration is an ``int`` of nanoseconds; pages are indices into the device's
page arena (``arena``), whose pages are ``arena.page_size`` bytes.

Errors: every failure a device reports is a :class:`DeviceError` subclass whose ``code``
is the :class:`~clockwork.actions.ErrorCode` the worker answers the action with; the
worker maps ``err.code`` and never reads the message (which is for people).

=========================  ===========================  ==================================
class                      ``code``                     raised when
=========================  ===========================  ==================================
``UnknownModel``           ``UNKNOWN_MODEL``            no instance of that name
``InvalidPackage``         ``UNKNOWN_MODEL``            ``register`` refuses the package
                                                        (wrong target or page size, name
                                                        taken): the instance stays unknown
``WeightsAlreadyLoaded``   ``WEIGHTS_ALREADY_LOADED``   LOAD of weights already loaded
``InsufficientCache``      ``LOAD_INSUFFICIENT_CACHE``  LOAD finds too few (contiguous)
                                                        free pages; also an ``ArenaError``
``WeightsNotPresent``      ``WEIGHTS_NOT_PRESENT``      EXEC without the weights loaded
``NotInCache``             ``EVICT_NOT_IN_CACHE``       EVICT of weights not loaded
``InvalidBatchSize``       ``INVALID_BATCH_SIZE``       EXEC of a batch size the model
                                                        was not compiled for
``InvalidInput``           ``INVALID_INPUT``            EXEC input of the wrong shape
``LoadFailed``             ``LOAD_INSUFFICIENT_CACHE``  the copy itself failed (device)
``ExecFailed``             ``INVALID_INPUT``            the kernels failed (device)
``DeviceUnavailable``      ``INVALID_GPU``              the device cannot be used here
=========================  ===========================  ==================================

``LoadFailed``, ``ExecFailed`` and ``DeviceUnavailable`` are ``DeviceFailure``\\ s: the
device, not the action, went wrong. Their codes are the ones the worker has always
answered such failures with.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from clockwork.actions import Action, ErrorCode
from clockwork.profiles import ModelProfile
from clockwork.protocol.ratelog import KeyedLog
from worker.memory import ArenaError, PageArena

# -- errors ---------------------------------------------------------------------------


class DeviceError(RuntimeError):
    """A device refused or failed an operation; ``code`` is what the worker answers.

    Devices raise the subclasses below, never this class itself."""

    code: ClassVar[ErrorCode] = ErrorCode.INVALID_INPUT


class UnknownModel(DeviceError):
    """No instance of that name is registered on this device."""

    code = ErrorCode.UNKNOWN_MODEL


class InvalidPackage(DeviceError):
    """``register`` refused the package (compiled for another target, laid out in other
    pages, or the name is taken); the instance is not made known."""

    code = ErrorCode.UNKNOWN_MODEL


class WeightsAlreadyLoaded(DeviceError):
    """LOAD of an instance whose weights are already in the cache (or being loaded)."""

    code = ErrorCode.WEIGHTS_ALREADY_LOADED


class InsufficientCache(DeviceError, ArenaError):
    """LOAD found too few free (or contiguous) pages. Also an ``ArenaError``."""

    code = ErrorCode.LOAD_INSUFFICIENT_CACHE


class WeightsNotPresent(DeviceError):
    """EXEC of an instance whose weights are not in the cache."""

    code = ErrorCode.WEIGHTS_NOT_PRESENT


class NotInCache(DeviceError):
    """EVICT of an instance whose weights are not in the cache."""

    code = ErrorCode.EVICT_NOT_IN_CACHE


class InvalidBatchSize(DeviceError):
    """EXEC of a batch size the model has no function for."""

    code = ErrorCode.INVALID_BATCH_SIZE


class InvalidInput(DeviceError):
    """EXEC input whose shape is not (batch size, *input shape)."""

    code = ErrorCode.INVALID_INPUT


class DeviceFailure(DeviceError):
    """The device itself failed (a copy, a kernel, the driver)."""


class LoadFailed(DeviceFailure):
    """The LOAD copy or binding failed on the device; the pages were given back."""

    code = ErrorCode.LOAD_INSUFFICIENT_CACHE


class ExecFailed(DeviceFailure):
    """The EXEC kernels (or the INPUT/OUTPUT copies) failed on the device."""

    code = ErrorCode.INVALID_INPUT


class DeviceUnavailable(DeviceFailure):
    """The device cannot be used on this machine (missing package, GPU, driver or
    compiler); the message says what is missing and what to do instead."""

    code = ErrorCode.INVALID_GPU


ERRORS: tuple[type[DeviceError], ...] = (
    UnknownModel, InvalidPackage, WeightsAlreadyLoaded, InsufficientCache, WeightsNotPresent,
    NotInCache, InvalidBatchSize, InvalidInput, LoadFailed, ExecFailed, DeviceUnavailable)


# -- the contract ---------------------------------------------------------------------


@runtime_checkable
class Device(Protocol):
    """What every device offers. The worker's executor only asks ``duration``; the worker
    shell (and the profiler) drive the rest, one EXEC thread and one LOAD thread per
    device: a LOAD may run while an EXEC runs (two lanes), and EVICT may be called from
    either side at any time.

    ``models`` maps each registered instance name to its state, whose ``pages`` is the
    list of arena pages holding its weights (``None`` while not loaded).
    """

    kind: str  # "emulated", "cpu" or "cuda"
    arena: PageArena  # the weights cache: n_pages, page_size, used_pages, free_pages
    models: dict[str, Any]

    def duration(self, action: Action, profile: ModelProfile) -> int | None:
        """How long ``action`` will take, in ns, known in advance (emulated: the profile's
        figure, with noise); ``None`` when it is measured as it runs (cpu, cuda)."""
        ...

    def register(self, name: str, package: Any) -> dict:
        """LoadModelFromDisk: make instance ``name`` known, not loaded. ``package`` is a
        compiled package's directory (cpu, cuda) or a ``ModelProfile`` (emulated).
        Returns the package metadata (``weights_pages``, ``batch_sizes``, ``inputs``,
        ``outputs``...). Raises ``InvalidPackage``."""
        ...

    def loaded(self, name: str) -> bool:
        """Whether instance ``name``'s weights are in the cache. Raises ``UnknownModel``."""
        ...

    def load(self, name: str) -> tuple[list[int], int]:
        """LOAD: allocate the weights' pages, copy the weights in, bind them. Returns
        (pages, load_ns), load_ns > 0 the measured duration. Raises ``UnknownModel``,
        ``WeightsAlreadyLoaded``, ``InsufficientCache`` (nothing allocated) or
        ``LoadFailed`` (pages given back)."""
        ...

    def evict(self, name: str) -> None:
        """EVICT: drop the weights, free their pages. Never waits: pages an EXEC still
        reads are freed when that EXEC ends. Raises ``UnknownModel`` or ``NotInCache``."""
        ...

    def infer(self, name: str, inputs: np.ndarray | None,
              batch_size: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
        """INPUT copy + EXEC + OUTPUT copy of one batch. ``inputs`` is (batch, *input
        shape); ``None`` runs zeros of ``batch_size`` rows. Returns (outputs, exec_ns):
        outputs one array per model output (a single array when there is one), exec_ns
        > 0 how long the EXEC lane was held (input copy, EXEC and output copy: what the
        scheduler predicts). Raises ``UnknownModel``, ``InvalidBatchSize``,
        ``InvalidInput``, ``WeightsNotPresent`` or ``ExecFailed``."""
        ...


@dataclass
class Package:
    """A compiled package made usable on a device (``RealDevice.prepare``), once, and
    shared by every instance of it: its library and VM functions by batch size, its
    weights in host memory (cuda: pinned, so LOAD's copies are asynchronous), and per
    batch size an input buffer (array, TVM view) that EXEC copies into (one EXEC runs at
    a time)."""

    path: Path
    meta: dict
    vm: object
    functions: dict[int, object]
    blob: np.ndarray
    inputs: dict[int, tuple[object, object]] = field(default_factory=dict)


@dataclass
class Instance:
    """A registered instance of a package on a real device."""

    name: str
    package: Package
    pages: list[int] | None = None  # its weights' arena pages (None: not loaded)
    bound: list[object] | None = None  # TVM tensors viewing those pages, in params order
    loading: bool = False  # a LOAD is copying its weights in
    busy: int = 0  # EXECs running on these weights
    free_after: list[int] | None = None  # evicted during an EXEC: free these pages after it

    @property
    def meta(self) -> dict:
        return self.package.meta


def package_stamp(path: Path) -> tuple:
    """What tells the package at ``path`` apart from one written there since: each of its
    files' inode, size and modification time (None for one missing)."""
    from clockwork.models.package import LIBRARY, METADATA, WEIGHTS

    out = []
    for f in (METADATA, LIBRARY, WEIGHTS):
        try:
            st = (path / f).stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def target_kind(target) -> str:
    """The kind of a package's TVM target (``model.json``'s ``target``: TVM's JSON, or
    its older text form): ``llvm`` for the CPU, ``cuda``, ..."""
    try:
        return json.loads(target)["kind"]
    except (ValueError, TypeError, KeyError):
        return target.split()[0] if isinstance(target, str) and target else ""


# how long a LOAD whose free pages lie apart waits for running EXECs to leave the weights
# it must slide together (an EXEC takes milliseconds; past this, LOAD_INSUFFICIENT_CACHE)
SLIDE_WAIT_S = 2.0
# packages no instance uses any more, kept ready in case they are registered again
UNUSED_PACKAGES_KEPT = 4
# what is said once about a package (compiled with another TVM, or without digests)
_SAY_ONCE = KeyedLog("worker", every=math.inf)
# the libraries loaded in this process, per TVM (a test's fake one has its own): TVM never
# unloads one, so each distinct one is loaded once (``RealDevice._library``)
_LIBRARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LIBRARIES_LOCK = threading.Lock()
_DIRECT_PATHS: set = set()  # packages whose library was loaded from their own file


class RealDevice:
    """Instance lookup, and the executor's view of a real device: its actions' durations
    are measured when they run, not predicted (``duration`` is None: see
    ``worker.executor``). Subclasses keep ``self.models``: instance name -> state with
    ``pages`` (None when not loaded)."""

    models: dict
    # whether making a package ready builds its kernels (seconds: a worker does it for its
    # whole package directory before it serves) or only reads it (done when first used)
    builds_kernels: ClassVar[bool] = False
    packages: dict  # resolved package path -> what ``_package`` made of it
    stamps: dict  # resolved package path -> ``package_stamp`` of it when it was read
    _registering: threading.Lock  # one package made at a time
    _lock: threading.Lock
    _idle: threading.Condition  # on ``_lock``: an EXEC left its weights, or may start
    _sliding: int = 0  # LOADs waiting for EXECs to leave weights they must slide

    # -- packages read, and read again when written again -------------------------------

    def _cached(self, path: Path, stamp: tuple | None = None):
        """What ``_package`` made of the package at ``path``, if its files are as they
        were then (``stamp``: as they are now, if taken already; a package compiled again
        into the same folder is read again: the first one read was served for the
        device's life, with no word); else None."""
        key = path.resolve()
        pkg = self.packages.get(key)
        if pkg is not None and self.stamps.get(key) == (stamp or package_stamp(path)):
            return pkg
        return None

    def _keep(self, path: Path, stamp: tuple, pkg) -> None:
        """``pkg``, made of the package at ``path`` whose files were as ``stamp`` says
        (``package_stamp``, taken before they were read)."""
        key = path.resolve()
        self.packages[key] = pkg
        self.stamps[key] = stamp

    def _library(self, tvm, path: Path, data: bytes):
        """The package's library (``data``, ``model.so``'s bytes as read and checked)
        loaded, once per distinct library in the process: TVM never unloads one (each
        load mapped the file again for the process's life, so a worker that registered
        packages again and again grew by a library each time), so the same bytes again,
        on any of the worker's devices, are the module loaded before. A new one is loaded
        from a private copy, removed once loaded: the dynamic loader keeps one library per
        path (the same path again gave the old one's code), and a package's own file,
        rewritten or truncated in place while mapped (a compile into the folder served),
        killed the worker with SIGBUS."""
        from clockwork.models.package import digest

        key = digest(data)
        with _LIBRARIES_LOCK:  # (held a moment: a cuda build takes minutes, each its own)
            entry = _LIBRARIES.setdefault(tvm, {}).setdefault(key, [threading.Lock(), None])
        with entry[0]:
            if entry[1] is None:
                entry[1] = self._load_copy(tvm, path, data)
            return entry[1]

    @staticmethod
    def _load_copy(tvm, path: Path, data: bytes):
        """``data`` loaded as a library from a private copy, removed once loaded."""
        from clockwork.models.package import LIBRARY

        # (named after the package: what a build's logs and tools show; made with the stop
        # signals held back: Ctrl-C or SIGTERM between the folder's making and its
        # clean-up's arming left it behind, a clockwork profile stopped as it started)
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        was = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            made = tempfile.TemporaryDirectory(prefix=f"clockwork-package-{path.name[:40]}-")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, was)
        with made as tmp:
            copy = Path(tmp) / LIBRARY
            copy.write_bytes(data)
            if not os.statvfs(tmp).f_flag & os.ST_NOEXEC:
                return tvm.runtime.load_module(str(copy))
            # a temporary folder that may not hold code: from the package's own file (the
            # first time only: the loader would give that path's old code again)
            with _LIBRARIES_LOCK:
                if path.resolve() in _DIRECT_PATHS:
                    raise InvalidPackage(
                        f"package {path}: a library loaded from {path / LIBRARY} before cannot "
                        f"be loaded again: the temporary folder {tempfile.gettempdir()} holds "
                        "no code (noexec); set TMPDIR to one that does")
                _DIRECT_PATHS.add(path.resolve())
            return tvm.runtime.load_module(str(path / LIBRARY))

    @staticmethod
    def _check_files(path: Path, meta: dict, blob) -> bytes:
        """Refuse the package at ``path`` if its library, weights (``blob``, as read) or
        layout are not those it was compiled with (``model.json``'s digests): a library
        from another package or weights changed on disk loaded, said READY, and then
        failed every request or answered wrongly. Returns the library's bytes, as read
        and checked (what ``_library`` loads)."""
        from clockwork.models.package import LIBRARY, integrity_problem

        library = (path / LIBRARY).read_bytes()
        why = integrity_problem(meta, library, blob)
        if why:
            raise InvalidPackage(f"package {path}: {why}")
        if meta.get("sha256") is None:  # (an older package: served, said once)
            _SAY_ONCE((path, "digests"), f"package {path} has no digests of its files "
                      "(compiled by an older version): a changed or damaged file is not "
                      "found; compile it again (clockwork compile) to have them checked")
        built = meta.get("tvm_version")
        if isinstance(built, str):
            import tvm

            if built != tvm.__version__:  # (it may work: said, not refused)
                _SAY_ONCE((path, "tvm"), f"package {path} was compiled with TVM "
                          f"{built[:40]}, this worker runs TVM {tvm.__version__}: if it "
                          "fails or answers wrongly, compile it again with this one "
                          "(clockwork compile)")
        return library

    def duration(self, action, profile) -> None:
        return None

    def _package(self, path: Path):
        """The package at ``path`` made usable (library, weights in host memory, ...), on
        first use; under ``_registering``, never ``_lock``."""
        raise NotImplementedError

    def prepare(self, package: str | Path) -> dict:
        """Make the package ready now (load its library, read its weights; cuda: build its
        kernels), so that registering its instances later takes no time. Holds no lock a
        LOAD or an EXEC takes, so a worker runs it on a thread beside its actions.
        Returns its meta."""
        with self._registering:
            return self._package(Path(package)).meta

    def prepared(self, package: str | Path) -> bool:
        """Whether the package at ``package`` is ready (``prepare``), as its files are now
        (one compiled again into its folder is not)."""
        try:
            return self._cached(Path(package)) is not None
        except (OSError, RuntimeError):
            return False

    def register(self, name: str, package: str | Path) -> dict:
        """LoadModelFromDisk: make instance ``name`` of the package known (not yet LOADed).
        Instances of one package share what ``prepare`` made of it; making it holds no
        lock a LOAD or an EXEC takes."""
        with self._lock:
            if name in self.models:
                raise InvalidPackage(f"model {name!r} is already registered")
        pkg = self._cached(Path(package))  # (prepared: no wait for one being made)
        if pkg is None:
            with self._registering:
                pkg = self._package(Path(package))
        with self._lock:
            if name in self.models:
                raise InvalidPackage(f"model {name!r} is already registered")
            self.models[name] = Instance(name, pkg)
        return pkg.meta

    def _model(self, name: str):
        try:
            return self.models[name]
        except KeyError:
            raise UnknownModel(f"unknown model {name!r}") from None

    def loaded(self, name: str) -> bool:
        return self._model(name).pages is not None

    def _take_pages(self, meta: dict) -> list[int]:
        """The arena pages for a LOAD of a package with ``meta`` (under the subclass's
        ``_lock``). A tensor larger than a page needs a run of contiguous pages; when the
        free pages suffice but lie apart, the loaded weights no EXEC is using are slid
        together first (:meth:`PageArena.compact`) and re-bound where they now lie; if
        that is not enough, the LOAD waits (up to ``SLIDE_WAIT_S``, EXECs not starting
        meanwhile) for the EXECs running to leave their weights, and slides those too:
        a LOAD is refused only for want of pages, not for their order. Raises
        ``InsufficientCache``, or ``LoadFailed`` if a copy fails (the weights moved until
        then are bound where they lie), with nothing taken."""
        n, runs = meta["weights_pages"], meta["page_runs"]
        try:
            return self.arena.alloc(n, runs)
        except ArenaError as e:
            if n > self.arena.free_pages:
                raise InsufficientCache(str(e)) from None
        self._slide_idle()
        try:
            return self.arena.alloc(n, runs)
        except ArenaError as e:
            if not any(m.busy for m in list(self.models.values())):
                raise InsufficientCache(str(e)) from None
        self._sliding += 1  # (EXECs wait to start: under a stream of them, no gap comes)
        try:
            deadline = time.monotonic() + SLIDE_WAIT_S
            while (any(m.busy for m in list(self.models.values()))
                   and (left := deadline - time.monotonic()) > 0):
                self._idle.wait(left)  # (releases _lock: evictions may free pages too)
            self._slide_idle()  # (the lock held from the wake: no EXEC starts between)
        finally:
            self._sliding -= 1
            self._idle.notify_all()
        try:
            return self.arena.alloc(n, runs)
        except ArenaError as e:
            raise InsufficientCache(str(e)) from None

    def _slide_idle(self) -> None:
        """Slide the loaded weights no EXEC is using together (under ``_lock``)."""
        loaded = {name: m for name, m in list(self.models.items())  # (unregister pops)
                  if m.pages is not None and not m.busy}
        moved: dict = {}
        broken: set = set()
        with self._moving():
            try:
                self.arena.compact({name: (m.pages, m.meta["page_runs"])
                                    for name, m in loaded.items()}, moved, broken)
            except ArenaError as e:
                raise InsufficientCache(str(e)) from None
            except Exception as e:  # noqa: BLE001 - the device's own error, in a copy
                raise LoadFailed(f"sliding the loaded weights together failed: {e}") from e
            finally:  # (also after a copy that failed: the page table says where they are)
                for name, pages in moved.items():
                    loaded[name].pages, loaded[name].bound = pages, None
                for name in broken:  # evicted: its next EXEC finds no weights
                    m = loaded[name]
                    self.arena.free(moved.get(name, m.pages))
                    moved.pop(name, None)
                    m.pages = m.bound = None
                for name, pages in moved.items():
                    loaded[name].bound = self._bind(pages, loaded[name].meta)

    def _exec_starts(self, m) -> list:
        """Under ``_lock``, as an EXEC takes ``m``'s weights: after any LOAD waiting to
        slide weights together (``_take_pages``), ``m`` is busy and its weights' tensors
        where they then lie are returned (read after the wait: the slide may have moved
        them, or an EVICT dropped them, ``WeightsNotPresent``)."""
        while self._sliding:
            self._idle.wait()
        if m.bound is None:
            raise WeightsNotPresent(f"model {m.name!r}: weights not in the cache")
        m.busy += 1
        return m.bound

    def _exec_ends(self, m) -> None:
        """Under ``_lock``, as an EXEC leaves ``m``'s weights: pages evicted meanwhile are
        freed once no EXEC reads them; a LOAD waiting to slide them is woken."""
        m.busy -= 1
        if not m.busy and m.free_after is not None:
            self.arena.free(m.free_after)
            m.free_after = None
        self._idle.notify_all()

    def _moving(self):
        """Where :meth:`_take_pages` moves pages (a device: on its copy stream, waited for)."""
        return contextlib.nullcontext()

    def _bind(self, pages: list[int], meta: dict) -> list:
        """The weights held in ``pages`` as the tensors the package's functions take."""
        raise NotImplementedError

    def evict(self, name: str) -> None:
        """EVICT: never waits. Pages under a running EXEC are freed when it ends (the
        subclass's ``_lock`` guards ``arena``; its models keep ``bound``, ``busy`` and
        ``free_after``)."""
        m = self._model(name)
        with self._lock:
            if m.pages is None:
                raise NotInCache(f"model {name!r} is not loaded")
            m.bound = None
            if m.busy:  # (evicted, loaded and evicted again while one EXEC runs: both)
                m.free_after = (m.free_after or []) + m.pages
            else:
                self.arena.free(m.pages)
            m.pages = None

    def drop(self, name: str) -> bool:
        """Evict ``name``'s weights if they are cached (``evict``), else nothing (not
        loaded, not registered); whether it evicted. For the worker's resets, whose
        evictions may meet the LOAD thread's (``worker.service``)."""
        try:
            self.evict(name)
        except (NotInCache, UnknownModel):
            return False
        return True

    def unregister(self, name: str) -> None:
        """Forget instance ``name`` (the controller unloaded it); its weights, if still
        cached, are evicted first. Nothing happens for a name not registered."""
        m = self.models.get(name)
        if m is None:
            return
        if m.pages is not None:
            try:
                self.evict(name)
            except DeviceError:
                pass  # evicted meanwhile
        self.models.pop(name, None)
        self._release(m.package)

    def _release(self, pkg) -> None:
        """``pkg``'s last instance went: it is kept among the ``UNUSED_PACKAGES_KEPT`` such
        packages last used (registered again soon, it is not read again); the one used
        longest ago is dropped, its weights and buffers with it (a worker that served
        many packages in turn grew by each one's whole size, for good; its library stays
        loaded, as TVM keeps every one: ``_library``)."""
        if any(x.package is pkg for x in self.models.values()):
            return
        unused = self.__dict__.setdefault("_unused", [])
        unused[:] = [p for p in unused if p is not pkg] + [pkg]
        while len(unused) > UNUSED_PACKAGES_KEPT:
            old = unused.pop(0)
            if any(x.package is old for x in self.models.values()):
                continue  # (registered again since)
            for key in [k for k, p in self.packages.items() if p is old]:
                del self.packages[key]
                self.stamps.pop(key, None)


def numpy_outputs(out):
    """A TVM function's result as numpy: one array, or a list of them for a tuple."""
    if hasattr(out, "numpy"):
        return out.numpy()
    return [o.numpy() for o in out]


__all__ = ["ERRORS", "Device", "DeviceError", "DeviceFailure", "DeviceUnavailable",
           "ExecFailed", "InsufficientCache", "InvalidBatchSize", "InvalidInput",
           "InvalidPackage", "LoadFailed", "NotInCache", "RealDevice", "UnknownModel",
           "WeightsAlreadyLoaded", "WeightsNotPresent", "numpy_outputs"]
