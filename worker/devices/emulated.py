"""The emulated device: an action takes its profiled duration (Clockwork's
``worker_dummy``), optionally with seeded noise to test how the scheduler copes
with misprediction.

To the executor only ``duration`` matters. For the rest of the device contract
(:class:`worker.devices.base.Device`) it also keeps a page table of its own: ``register``
takes a :class:`ModelProfile`, ``load`` takes its pages and reports the profiled LOAD
time, ``infer`` returns zeros of the profile's outputs and the profiled EXEC time. No
memory is held and nothing sleeps: the times are the emulation's, not the host's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from clockwork.actions import Action, ActionType
from clockwork.profiles import PAGE_SIZE, ModelProfile
from worker.devices.base import (
    InsufficientCache,
    InvalidBatchSize,
    InvalidInput,
    InvalidPackage,
    NotInCache,
    RealDevice,
    WeightsAlreadyLoaded,
    WeightsNotPresent,
)
from worker.memory import ArenaError, PageArena


class PageTable(PageArena):
    """A :class:`PageArena`'s bookkeeping (alloc/free) without the memory behind it."""

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE) -> None:
        super().__init__(n_pages, page_size, backend="none")

    def _allocate(self, nbytes: int) -> None:
        return None

    @property
    def address(self) -> int:
        return 0

    def page(self, index: int):
        raise ArenaError("an emulated page table holds no memory")


@dataclass
class _Model:
    name: str
    profile: ModelProfile
    pages: list[int] | None = None


class EmulatedDevice:
    """Duration = profile figure x (1 + noise); noise ~ N(0, ``noise``) clipped at -90 %.

    ``slow_prob``/``slow_factor`` add rare stragglers (e.g. 0.001 of actions, EXECs and
    LOADs alike, take 3x).
    """

    kind = "emulated"

    def __init__(self, noise: float = 0.0, seed: int = 0, slow_prob: float = 0.0,
                 slow_factor: float = 3.0, n_pages: int = 1024,
                 page_size: int = PAGE_SIZE) -> None:
        if noise < 0 or not 0 <= slow_prob <= 1:
            raise ValueError("noise must be >= 0 and slow_prob in [0, 1]")
        self.noise = noise
        self.slow_prob = slow_prob
        self.slow_factor = slow_factor
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []
        self.arena = PageTable(n_pages, page_size)
        self.models: dict[str, _Model] = {}
        self._lock = threading.Lock()

    def _factor(self) -> float:
        if not self._buf:
            n = 4096
            f = np.ones(n)
            if self.noise:
                f += np.maximum(self._rng.normal(0.0, self.noise, n), -0.9)
            if self.slow_prob:
                f *= np.where(self._rng.random(n) < self.slow_prob, self.slow_factor, 1.0)
            self._buf = f.tolist()
            self._buf.reverse()
        return self._buf.pop()

    def _scaled(self, base: int) -> int:
        if not self.noise and not self.slow_prob:
            return base
        return max(1, round(base * self._factor()))

    def duration(self, action: Action, profile: ModelProfile) -> int:
        if action.type == ActionType.INFER:
            base = profile.exec_ns[action.batch_size]
        elif action.type == ActionType.LOAD:
            base = profile.load_ns
        else:
            return 0
        return self._scaled(base)

    # -- the rest of the device contract (worker.devices.base.Device) --------------------

    _model = RealDevice._model
    loaded = RealDevice.loaded

    def register(self, name: str, package: ModelProfile) -> dict:
        """Make instance ``name`` of the profile known; returns package-like metadata."""
        if not isinstance(package, ModelProfile):
            raise InvalidPackage(f"the emulated device runs profiles, not packages ({package!r})")
        with self._lock:
            if name in self.models:
                raise InvalidPackage(f"model {name!r} is already registered")
            self.models[name] = _Model(name, package)
        return {"model": package.model, "weights_pages": package.weights_pages,
                "page_size": self.arena.page_size, "batch_sizes": sorted(package.exec_ns),
                "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                           for t in package.inputs],
                "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                            for t in package.outputs]}

    def load(self, name: str) -> tuple[list[int], int]:
        """LOAD: take the profile's pages; the duration is the profiled LOAD time."""
        m = self._model(name)
        with self._lock:
            if m.pages is not None:
                raise WeightsAlreadyLoaded(f"model {name!r} is already loaded")
            try:
                m.pages = self.arena.alloc(m.profile.weights_pages)
            except ArenaError as e:
                raise InsufficientCache(str(e)) from None
            return list(m.pages), max(1, self._scaled(m.profile.load_ns))

    def evict(self, name: str) -> None:
        m = self._model(name)
        with self._lock:
            if m.pages is None:
                raise NotInCache(f"model {name!r} is not loaded")
            self.arena.free(m.pages)
            m.pages = None

    def infer(self, name: str, inputs: np.ndarray | None,
              batch_size: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
        """Zeros of the profile's outputs, and the profiled EXEC time."""
        m = self._model(name)
        p = m.profile
        b = int(inputs.shape[0]) if inputs is not None else int(batch_size or 0)
        if b not in p.exec_ns:
            raise InvalidBatchSize(f"model {name!r}: batch size {b} not in {sorted(p.exec_ns)}")
        if inputs is not None and p.inputs and tuple(inputs.shape) != (b, *p.inputs[0].shape):
            raise InvalidInput(f"model {name!r}: input shape {inputs.shape}, "
                               f"expected {(b, *p.inputs[0].shape)}")
        with self._lock:
            if m.pages is None:
                raise WeightsNotPresent(f"model {name!r}: weights not in the cache")
            exec_ns = max(1, self._scaled(p.exec_ns[b]))
        outs = [np.zeros((b, *t.shape), t.dtype) for t in p.outputs]
        return (outs[0] if len(outs) == 1 else outs), exec_ns
