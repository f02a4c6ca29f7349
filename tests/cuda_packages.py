"""The cuda packages the GPU tests run, compiled where they run or made ahead of time.

A GPU machine may carry only TVM's runtime (a few MiB), not its compiler (~260 MiB):
the cuda device needs no more. There the tests take their packages from the folder named
by ``CLOCKWORK_TEST_CUDA_PACKAGES``, written beforehand on a machine with TVM's compiler
(no GPU needed: a cross-compile) by

    python -m tests.cuda_packages DIR

Without that variable each test compiles its package into its own temporary folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "CLOCKWORK_TEST_CUDA_PACKAGES"

# (model, batch sizes, page size) of every cuda package a test asks for
NEEDED = [("mlp", (1, 2), 4096), ("mlp", (1, 4), 4096)]


def _name(model: str, batch_sizes, page_size: int) -> str:
    return f"{model}-b{'_'.join(str(b) for b in batch_sizes)}-p{page_size}"


def package(model: str, batch_sizes, page_size: int, out: Path) -> Path:
    """The cuda package of zoo ``model``: from ``$CLOCKWORK_TEST_CUDA_PACKAGES`` if set,
    else compiled into ``out``."""
    assert (model, tuple(batch_sizes), page_size) in NEEDED, "add it to NEEDED"
    made = os.environ.get(ENV)
    if made:
        path = Path(made) / _name(model, batch_sizes, page_size)
        if not (path / "model.json").is_file():
            raise FileNotFoundError(f"{path}: not made (python -m tests.cuda_packages {made})")
        return path
    from clockwork.models.package import compile_model
    from worker.devices.cuda import cuda_target_and_check

    return compile_model(model, list(batch_sizes), out, target=cuda_target_and_check(),
                         page_size=page_size)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    for model, sizes, page_size in NEEDED:
        path = package(model, sizes, page_size, root / _name(model, sizes, page_size))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    os.environ.pop(ENV, None)  # this is where they are made
    sys.exit(main(sys.argv[1:]))
