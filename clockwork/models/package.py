"""Model packages: ``compile_model`` writes one, ``read_package`` reads its metadata.

A package directory holds

* ``model.so``     the compiled TVM library: one Relax function ``forward_b<B>`` per
                   batch size B, each taking ``(input, *weights)`` in ``params`` order;
* ``weights.bin``  the weights blob, laid out in pages by :func:`worker.memory.layout_tensors`
                   (``weights_pages`` x ``page_size`` bytes);
* ``model.json``   metadata: inputs/outputs (shapes without the batch dimension),
                   batch sizes, function names, weights size, the page layout
                   (``page_size``, ``weights_pages``, ``page_runs``) and, per tensor, its
                   logical byte ``offset`` in the blob.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson

from clockwork.profiles import PAGE_SIZE
from worker.memory import layout_tensors

FORMAT = 1
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
METADATA = "model.json"


class PackageError(ValueError):
    """A package directory is missing files or has malformed metadata."""


def function_name(batch_size: int) -> str:
    return f"forward_b{batch_size}"


def target_device(target: str) -> str:
    kind = target.split()[0]
    return {"llvm": "cpu", "c": "cpu", "cuda": "cuda"}.get(kind, kind)


def compile_model(name: str, batch_sizes: list[int], out: str | Path, target: str = "llvm",
                  seed: int = 0, page_size: int = PAGE_SIZE) -> Path:
    """Build zoo model ``name`` for ``batch_sizes`` and write its package to ``out``."""
    import tvm
    from tvm.relax.frontend import nn

    from clockwork.models.zoo import get_model, random_weights

    zm = get_model(name)
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {batch_sizes}")
    t0 = time.perf_counter()
    module = zm.build()
    spec = {}
    for b in batch_sizes:
        # one Relax function per batch size, all sharing the module's parameters
        setattr(module, function_name(b), module.forward)
        spec[function_name(b)] = {zm.input_name: nn.spec.Tensor((b, *zm.input_shape), zm.dtype)}
    irmod, params = module.export_tvm(spec=spec)
    specs = [(pname, tuple(int(s) for s in p.shape), str(p.dtype)) for pname, p in params]
    weights = random_weights(specs, seed)

    offsets, n_pages, runs = layout_tensors([weights[n].nbytes for n, _, _ in specs], page_size)
    blob = np.zeros(n_pages * page_size, dtype=np.uint8)
    tensors = []
    for (pname, shape, dtype), off in zip(specs, offsets, strict=True):
        a = weights[pname]
        blob[off : off + a.nbytes] = np.frombuffer(a.tobytes(), np.uint8)
        tensors.append({"name": pname, "shape": list(shape), "dtype": dtype, "offset": off,
                        "nbytes": int(a.nbytes)})

    probe = np.zeros((1, *zm.input_shape), zm.dtype)
    out_sample = zm.reference(probe, weights)

    executable = tvm.compile(irmod, target=target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(out / LIBRARY))
    blob.tofile(out / WEIGHTS)
    meta = {
        "format": FORMAT,
        "model": name,
        "target": target,
        "device": target_device(target),
        "batch_sizes": batch_sizes,
        "functions": {str(b): function_name(b) for b in batch_sizes},
        "inputs": [{"name": zm.input_name, "shape": list(zm.input_shape), "dtype": zm.dtype}],
        "outputs": [{"name": "output", "shape": list(out_sample.shape[1:]),
                     "dtype": str(out_sample.dtype)}],
        "weights_bytes": int(sum(t["nbytes"] for t in tensors)),
        "page_size": page_size,
        "weights_pages": n_pages,
        "page_runs": runs,
        "params": tensors,
        "seed": seed,
        "tvm_version": tvm.__version__,
        "compile_s": round(time.perf_counter() - t0, 3),
    }
    (out / METADATA).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2) + b"\n")
    return out


def read_package(path: str | Path) -> dict:
    """The metadata of the package at ``path``, checked against the files."""
    p = Path(path)
    try:
        meta = orjson.loads((p / METADATA).read_bytes())
    except FileNotFoundError:
        raise PackageError(f"{p} is not a model package (no {METADATA})") from None
    except orjson.JSONDecodeError as e:
        raise PackageError(f"{p / METADATA}: not valid JSON ({e})") from e
    if meta.get("format") != FORMAT:
        raise PackageError(f"{p}: package format {meta.get('format')!r}, expected {FORMAT}")
    for f in (LIBRARY, WEIGHTS):
        if not (p / f).exists():
            raise PackageError(f"{p}: missing {f}")
    size = (p / WEIGHTS).stat().st_size
    if size != meta["weights_pages"] * meta["page_size"]:
        raise PackageError(f"{p / WEIGHTS}: {size} bytes, metadata says "
                           f"{meta['weights_pages']} x {meta['page_size']}")
    return meta


def reference_weights(meta: dict, path: str | Path) -> dict[str, np.ndarray]:
    """The package's weights as numpy arrays (copies), read from ``weights.bin``."""
    blob = np.fromfile(Path(path) / WEIGHTS, dtype=np.uint8)
    out = {}
    for t in meta["params"]:
        raw = blob[t["offset"] : t["offset"] + t["nbytes"]]
        out[t["name"]] = raw.view(t["dtype"]).reshape(t["shape"]).copy()
    return out


__all__ = ["PackageError", "compile_model", "function_name", "read_package", "reference_weights"]
