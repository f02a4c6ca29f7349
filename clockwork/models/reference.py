"""Reference outputs for checking live answers: a zoo model's numpy forward pass with the
weights of its compiled package (``packages/<device>/<model>/weights.bin``).

Used by ``clockwork replay --check-outputs`` (and ``serve --replay`` on real devices):
the load generator sends inputs from a small seeded pool per model, whose reference
outputs are computed before the run, and compares every answer with the reference output
for its input.
"""

from __future__ import annotations

import sys
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
    """Checks each answer's output against the reference output for its input, as it is
    recorded; ``verify`` gives the totals. The references are computed when a model's
    input pool is made (``pool``), before the run: a real-size model's numpy forward pass
    takes seconds, and computed on the first answers it stalled the load generator (no
    request sent for those seconds, and every answer in them late). Nothing is kept per
    answer, so memory stays bounded however long the run."""

    def __init__(self, packages: str | Path, seed: int = 0, rtol: float = 1e-4,
                 atol: float = 1e-4) -> None:
        self.packages = Path(packages)
        self.seed = seed
        self.rtol, self.atol = rtol, atol
        self.pools: dict[str, list[np.ndarray]] = {}
        self._refs: dict[str, np.ndarray | None] = {}
        self._totals = {"checked": 0, "wrong": 0, "unchecked": 0, "max_abs_err": 0.0}

    def pool(self, model: str, shape: tuple[int, ...], dtype: str) -> list[np.ndarray]:
        """The model's input pool, made (with its reference outputs) on first use."""
        p = self.pools.get(model)
        if p is None:
            p = self.pools[model] = input_pool(shape, dtype, self.seed + len(self.pools))
            self._refs[model] = self._reference(model)
        return p

    def record(self, model: str, index: int, output: np.ndarray) -> None:
        t = self._totals
        ref = self._refs.get(model)
        if ref is None:
            t["unchecked"] += 1
            return
        t["checked"] += 1
        if output.shape != ref[index].shape:
            t["wrong"] += 1
            return
        err = float(np.abs(output - ref[index]).max()) if output.size else 0.0
        if err > t["max_abs_err"]:
            t["max_abs_err"] = err
        if not np.allclose(output, ref[index], rtol=self.rtol, atol=self.atol):
            t["wrong"] += 1

    def _reference(self, model: str) -> np.ndarray | None:
        """The model's outputs for its input pool; None when there is no reference: not a
        zoo model, no package, or a package that is not the zoo model of that name (an
        ONNX import named like one: its weights are not the zoo model's)."""
        try:
            f = zoo_reference(model, self.packages / model)
            return None if f is None else f(np.stack(self.pools[model]))
        except (KeyError, ValueError) as e:  # (weights by other names or shapes)
            print(f"outputs of {model!r} not checked: its package in {self.packages} "
                  f"is not the zoo model ({type(e).__name__}: {e})", file=sys.stderr)
            return None
        except Exception as e:  # noqa: BLE001  (a check must not stop the run it checks)
            print(f"outputs of {model!r} not checked: its reference could not be computed "
                  f"from {self.packages / model} ({type(e).__name__}: {e})", file=sys.stderr)
            return None

    def verify(self) -> dict:
        """{"checked", "wrong", "unchecked", "max_abs_err"} over everything recorded."""
        return dict(self._totals)
