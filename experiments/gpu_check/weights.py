"""Write the weights.bin of zoo-model packages again from their model.json (the weights
are seeded: ``seed`` and the parameters' names, shapes and offsets say all), so that the
packages can travel without their weights.

    python experiments/gpu_check/weights.py PACKAGE_DIR...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson  # noqa: E402

from clockwork.models.package import (  # noqa: E402
    METADATA,
    WEIGHTS,
    read_package,
    weights_blob,
)
from clockwork.models.zoo import random_weights  # noqa: E402


def rewrite(path: Path) -> int:
    meta = orjson.loads((path / METADATA).read_bytes())
    specs = [(t["name"], tuple(t["shape"]), t["dtype"]) for t in meta["params"]]
    blob = weights_blob(meta["params"], random_weights(specs, meta["seed"]),
                        meta["weights_pages"] * meta["page_size"])
    blob.tofile(path / WEIGHTS)
    read_package(path)  # (checks the size against model.json)
    return blob.size


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"wrote {Path(p) / WEIGHTS} ({rewrite(Path(p)):,} bytes)")
