"""Reference outputs for checking live answers: a zoo model's numpy forward pass with the
weights of its compiled package (``packages/<device>/<model>/weights.bin``).

Used by ``clockwork replay --check-outputs`` (and ``serve --replay`` on real devices):
the load generator sends inputs from a small seeded pool per model and, after the run,
compares every answer with the reference output for its input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

POOL = 8  # distinct inputs per model


def input_pool(shape: tuple[int, ...], dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(POOL)]


def zoo_reference(model: str, package: str | Path):
    """``f(batch) -> outputs`` for a zoo model's package, or None when ``model`` is not a
    zoo model or the package is missing (e.g. an ONNX import: no numpy reference here)."""
    from clockwork.models.package import read_package, reference_weights
    from clockwork.models.zoo import ZOO

    path = Path(package)
    if model not in ZOO or not (path / "model.json").exists():
        return None
    meta = read_package(path)
    weights = reference_weights(meta, path)
    ref = ZOO[model].reference
    return lambda x: ref(x, weights)


class OutputCheck:
    """Collects (model, pool index, output) during a run; ``verify`` compares them with
    the references afterwards (so the numpy work does not slow the load generator)."""

    def __init__(self, packages: str | Path, seed: int = 0, rtol: float = 1e-4,
                 atol: float = 1e-4) -> None:
        self.packages = Path(packages)
        self.seed = seed
        self.rtol, self.atol = rtol, atol
        self.pools: dict[str, list[np.ndarray]] = {}
        self.seen: list[tuple[str, int, np.ndarray]] = []

    def pool(self, model: str, shape: tuple[int, ...], dtype: str) -> list[np.ndarray]:
        p = self.pools.get(model)
        if p is None:
            p = self.pools[model] = input_pool(shape, dtype, self.seed + len(self.pools))
        return p

    def record(self, model: str, index: int, output: np.ndarray) -> None:
        self.seen.append((model, index, output))

    def verify(self) -> dict:
        """{"checked", "wrong", "unchecked", "max_abs_err"} over everything recorded."""
        refs: dict[str, np.ndarray | None] = {}
        checked = wrong = unchecked = 0
        worst = 0.0
        for model, i, out in self.seen:
            if model not in refs:
                f = zoo_reference(model, self.packages / model)
                refs[model] = None if f is None else f(np.stack(self.pools[model]))
            ref = refs[model]
            if ref is None or out.shape != ref[i].shape:
                unchecked += ref is None
                wrong += ref is not None
                checked += ref is not None
                continue
            checked += 1
            err = float(np.abs(out - ref[i]).max()) if out.size else 0.0
            worst = max(worst, err)
            if not np.allclose(out, ref[i], rtol=self.rtol, atol=self.atol):
                wrong += 1
        return {"checked": checked, "wrong": wrong, "unchecked": unchecked,
                "max_abs_err": worst}
