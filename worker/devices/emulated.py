"""The emulated device: an action takes its profiled duration (Clockwork's
``worker_dummy``), optionally with seeded noise to test how the scheduler copes
with misprediction."""

from __future__ import annotations

import numpy as np

from clockwork.actions import Action, ActionType
from clockwork.profiles import ModelProfile


class EmulatedDevice:
    """Duration = profile figure x (1 + noise); noise ~ N(0, ``noise``) clipped at -90 %.

    ``slow_prob``/``slow_factor`` add rare stragglers (e.g. 0.001 of EXECs take 3x).
    """

    def __init__(self, noise: float = 0.0, seed: int = 0, slow_prob: float = 0.0,
                 slow_factor: float = 3.0) -> None:
        if noise < 0 or not 0 <= slow_prob <= 1:
            raise ValueError("noise must be >= 0 and slow_prob in [0, 1]")
        self.noise = noise
        self.slow_prob = slow_prob
        self.slow_factor = slow_factor
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []

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

    def duration(self, action: Action, profile: ModelProfile) -> int:
        if action.type == ActionType.INFER:
            base = profile.exec_ns[action.batch_size]
        elif action.type == ActionType.LOAD:
            base = profile.load_ns
        else:
            return 0
        if not self.noise and not self.slow_prob:
            return base
        return max(1, round(base * self._factor()))
