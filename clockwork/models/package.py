"""Model packages: ``compile_model`` writes one, ``read_package`` reads its metadata.

A package directory holds

* ``model.so``     the compiled TVM library: one Relax function ``forward_b<B>`` per
                   batch size B, each taking ``(input, *weights)`` in ``params`` order;
* ``weights.bin``  the weights blob, laid out in pages by :func:`worker.memory.layout_tensors`
                   (``weights_pages`` x ``page_size`` bytes; see :func:`pack_tensors`);
* ``model.json``   metadata: inputs/outputs (shapes without the batch dimension),
                   batch sizes, function names, weights size, the page layout
                   (``page_size``, ``weights_pages``, ``page_runs``), per tensor, its
                   logical byte ``offset`` in the blob, and ``sha256``: digests of the
                   library, the weights and the layout fields, which a worker checks when
                   it reads the package (a library from another package, a weights file
                   changed or damaged, or a layout edited by hand is refused, not served).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from pathlib import Path

import numpy as np
import orjson

from clockwork.models.layout import TENSOR_ALIGNMENT, layout_tensors
from clockwork.profiles import PAGE_SIZE

FORMAT = 1
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
METADATA = "model.json"


class PackageError(ValueError):
    """A package directory is missing files or has malformed metadata."""


# the fields of model.json that say how the library and the weights fit together; their
# digest is kept beside the files' (``sha256.layout``)
LAYOUT_FIELDS = ("functions", "inputs", "outputs", "params", "page_size", "page_runs",
                 "weights_pages")


def layout_digest(meta: dict) -> str:
    """SHA-256 of the layout fields of ``meta``, in a canonical JSON form."""
    fields = {k: meta.get(k) for k in LAYOUT_FIELDS}
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()


def digest(data) -> str:
    """SHA-256 of ``data`` (bytes, a numpy array or a buffer), hex."""
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def integrity_problem(meta: dict, library: bytes, blob) -> str:
    """Why the package's files are not the ones it was compiled with ("" if they are, or
    if it predates digests): ``library`` is ``model.so``'s bytes, ``blob`` the weights
    read from ``weights.bin``."""
    sums = meta.get("sha256")
    if sums is None:
        return ""
    if not isinstance(sums, dict) or not all(
            isinstance(sums.get(k), str) for k in (LIBRARY, WEIGHTS, "layout")):
        return f"{METADATA}: sha256 is {sums!r}, not digests of {LIBRARY}, {WEIGHTS} and layout"
    if layout_digest(meta) != sums["layout"]:
        return (f"{METADATA}: its layout fields ({', '.join(LAYOUT_FIELDS)}) were changed "
                "after the package was compiled")
    if digest(library) != sums[LIBRARY]:
        return (f"{LIBRARY} is not the library this package was compiled with (another "
                "package's, or changed since)")
    if digest(blob) != sums[WEIGHTS]:
        return f"{WEIGHTS} is not the weights this package was compiled with (changed or damaged)"
    return ""


def function_name(batch_size: int) -> str:
    return f"forward_b{batch_size}"


def target_device(target: str) -> str:
    """"cpu" or "cuda" for a TVM target string (plain, e.g. "llvm", or JSON)."""
    t = target.strip()
    kind = orjson.loads(t)["kind"] if t.startswith("{") else t.split()[0]
    return {"llvm": "cpu", "c": "cpu", "cuda": "cuda"}.get(kind, kind)


def pack_tensors(sizes: list[int], page_size: int = PAGE_SIZE) -> tuple[list[int], int, list[int]]:
    """Offsets (in the given order), page count and page runs for tensors of ``sizes`` bytes.

    Always obeys :func:`worker.memory.layout_tensors`' rule (it is what places the
    tensors); only the order in which they are placed may differ from the given one.
    Placing them in the given order wastes the tail of a page whenever the next tensor
    does not fit (a real ResNet-18 then needs 4 pages of 16 MiB instead of 3), so a
    first-fit-decreasing order is tried as well and kept if it needs fewer pages.
    """
    plain = layout_tensors(sizes, page_size)
    order = _packing_order(sizes, page_size)
    offs, n_pages, runs = layout_tensors([sizes[i] for i in order], page_size)
    if n_pages >= plain[1]:
        return plain
    offsets = [0] * len(sizes)
    for k, i in enumerate(order):
        offsets[i] = offs[k]
    return offsets, n_pages, runs


def _packing_order(sizes: list[int], page_size: int) -> list[int]:
    """Indices of ``sizes``: each tensor larger than a page (its run's tail is a bin),
    then first-fit-decreasing bins of page size, bin after bin."""
    def cost(n: int) -> int:  # bytes a tensor takes before the next aligned offset
        return -(-n // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT

    bins: list[list] = []  # [free bytes, indices]
    for i, n in enumerate(sizes):
        if n > page_size:
            bins.append([-(-n // page_size) * page_size - cost(n), [i]])
    for i in sorted((i for i, n in enumerate(sizes) if n <= page_size), key=lambda i: -sizes[i]):
        c = cost(sizes[i])
        for b in bins:
            if c <= b[0]:
                b[0] -= c
                b[1].append(i)
                break
        else:
            bins.append([page_size - c, [i]])
    return [i for b in bins for i in b[1]]


def weights_blob(tensors: list[dict], arrays: dict[str, np.ndarray], size: int) -> np.ndarray:
    """The weights file's bytes: each array of ``arrays`` at the offset its entry of
    ``tensors`` (model.json's ``params``) gives, zeros elsewhere, ``size`` bytes."""
    blob = np.zeros(size, dtype=np.uint8)
    for t in tensors:
        a = np.ascontiguousarray(arrays[t["name"]])
        blob[t["offset"] : t["offset"] + a.nbytes] = np.frombuffer(a.tobytes(), np.uint8)
    return blob


def write_package(out: str | Path, *, model: str, irmod, target: str, batch_sizes: list[int],
                  weights: list[tuple[str, np.ndarray]], inputs: list[dict],
                  outputs: list[dict], page_size: int = PAGE_SIZE, started: float | None = None,
                  extra: dict | None = None) -> Path:
    """Compile ``irmod`` (functions ``forward_b<B>(input, *weights)``) for ``target``, lay
    ``weights`` (in parameter order) out in pages and write the package to ``out``.
    ``inputs``/``outputs`` are ``{"name", "shape" (no batch dimension), "dtype"}``."""
    import tvm

    started = time.perf_counter() if started is None else started
    offsets, n_pages, runs = pack_tensors([a.nbytes for _, a in weights], page_size)
    tensors = [{"name": pname, "shape": [int(s) for s in a.shape], "dtype": str(a.dtype),
                "offset": int(off), "nbytes": int(a.nbytes)}
               for (pname, a), off in zip(weights, offsets, strict=True)]
    blob = weights_blob(tensors, dict(weights), n_pages * page_size)

    executable = tvm.compile(irmod, target=target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(out / LIBRARY))
    blob.tofile(out / WEIGHTS)
    meta = {
        "format": FORMAT,
        "model": model,
        "target": target,
        "device": target_device(target),
        "batch_sizes": batch_sizes,
        "functions": {str(b): function_name(b) for b in batch_sizes},
        "inputs": inputs,
        "outputs": outputs,
        "weights_bytes": int(sum(t["nbytes"] for t in tensors)),
        "page_size": page_size,
        "weights_pages": n_pages,
        "page_runs": runs,
        "params": tensors,
        **(extra or {}),
        "tvm_version": tvm.__version__,
        "compile_s": round(time.perf_counter() - started, 3),
    }
    meta["sha256"] = {LIBRARY: digest((out / LIBRARY).read_bytes()), WEIGHTS: digest(blob),
                      "layout": layout_digest(meta)}
    (out / METADATA).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2) + b"\n")
    return out


def check_batch_sizes(batch_sizes: list[int]) -> list[int]:
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {batch_sizes}")
    return sizes


def compile_model(name: str, batch_sizes: list[int], out: str | Path, target: str = "llvm",
                  seed: int = 0, page_size: int = PAGE_SIZE) -> Path:
    """Build zoo model ``name`` for ``batch_sizes`` and write its package to ``out``."""
    from tvm.relax.frontend import nn

    from clockwork.models.zoo import get_model, random_weights

    zm = get_model(name)
    batch_sizes = check_batch_sizes(batch_sizes)
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

    probe = np.zeros((1, *zm.input_shape), zm.dtype)
    out_sample = zm.reference(probe, weights)
    return write_package(
        out, model=name, irmod=irmod, target=target, batch_sizes=batch_sizes,
        weights=[(n, weights[n]) for n, _, _ in specs],
        inputs=[{"name": zm.input_name, "shape": list(zm.input_shape), "dtype": zm.dtype}],
        outputs=[{"name": "output", "shape": list(out_sample.shape[1:]),
                  "dtype": str(out_sample.dtype)}],
        page_size=page_size, started=t0, extra={"seed": seed})


def profile_disagreement(meta: dict, prof) -> str:
    """How the package with metadata ``meta`` disagrees with the profile ``prof`` (a
    ``ModelProfile``) that its instance is scheduled by ("" if it does not): other inputs
    or outputs (names, shapes, dtypes; where the profile lists them), a batch size the
    profile runs that it is not compiled for, or more weight pages than the
    profile's (the controller reserves the profile's pages for its LOAD); and first,
    another model than the profile's (``model.json``'s ``model``: another network with
    the same tensors ran under this model's name and timings)."""
    held, profiled = meta.get("model"), getattr(prof, "model", None)
    if isinstance(held, str) and held and profiled and held != profiled:
        return f"it holds model {held!r}, the profile is of model {profiled!r}"

    def specs(tensors) -> list[tuple]:
        return [(t["name"], tuple(t["shape"]), t["dtype"]) for t in tensors]

    for what, theirs in (("inputs", prof.inputs), ("outputs", prof.outputs)):
        ours = specs(meta.get(what) or [])
        want = [(t.name, tuple(t.shape), t.dtype) for t in theirs]
        if want and ours != want:
            return f"its {what} {ours} are not the profile's {want}"
    compiled = set(meta.get("batch_sizes") or ())
    lacking = [b for b in prof.batch_sizes if b not in compiled]
    if compiled and lacking:  # (the scheduler runs the profile's batch sizes)
        return (f"the profile runs batch sizes {lacking} it is not compiled for (it has "
                f"{sorted(compiled)})")
    if meta.get("weights_pages", 0) > prof.weights_pages:
        return (f"its weights take {meta['weights_pages']} pages, the profile "
                f"{prof.weights_pages}")
    return ""


# the keys of model.json a package cannot be read without
REQUIRED = ("weights_pages", "page_size", "page_runs", "functions", "inputs", "outputs",
            "params")


def _meta_problem(meta: dict) -> str:
    """What is wrong with the types of model.json's required fields ("" if nothing): a
    package whose metadata was edited by hand loaded, said READY, and failed every
    request (``page_runs`` missing), or was refused with a message that contradicted
    itself (``"weights_pages": "1"``)."""
    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not count(meta["weights_pages"]):
        return f"weights_pages is {meta['weights_pages']!r}, not a whole number >= 0"
    if not count(meta["page_size"]) or not meta["page_size"]:
        return f"page_size is {meta['page_size']!r}, not a whole number > 0"
    runs = meta["page_runs"]
    if (not isinstance(runs, list) or not all(count(r) and r for r in runs)
            or sum(runs) != meta["weights_pages"]):
        return (f"page_runs is {runs!r}, not a list of page counts > 0 that add up to "
                f"weights_pages ({meta['weights_pages']})")
    f = meta["functions"]
    if (not isinstance(f, dict) or not f
            or not all(isinstance(k, str) and k.isdigit() and int(k) > 0
                       and isinstance(v, str) for k, v in f.items())):
        return f"functions is {f!r}, not a map of batch sizes to function names"
    for key in ("inputs", "outputs"):
        ts = meta[key]
        if (not isinstance(ts, list) or not ts
                or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                           and isinstance(t.get("dtype"), str)
                           and isinstance(t.get("shape"), list)
                           and all(count(d) for d in t["shape"]) for t in ts)):
            return f"{key} is not a list of tensors (name, shape, dtype)"
    if not isinstance(meta["params"], list) or not all(isinstance(t, dict)
                                                       for t in meta["params"]):
        return "params is not a list of tensors"
    for t in meta["params"]:  # (a shape edited by hand failed every EXEC, the model READY)
        size = _param_bytes(t)
        if size is None or size != t.get("nbytes"):
            return (f"params: {t.get('name')!r} has shape {t.get('shape')!r} of "
                    f"{t.get('dtype')!r}, which is not its nbytes ({t.get('nbytes')!r})")
        # (an offset past the pages, or across two runs of them: the package was READY
        # and failed every LOAD, said as a full cache)
        off = t.get("offset")
        ends = [r * meta["page_size"] for r in itertools.accumulate(runs)]
        if not count(off) or size and not any(
                lo <= off and off + size <= hi for lo, hi in zip([0, *ends], ends, strict=False)):
            return (f"params: {t.get('name')!r} at offset {off!r} of {size} bytes does not "
                    f"lie within one run of the weights pages (page_runs {runs}, "
                    f"{meta['page_size']}-byte pages)")
    return ""


def _param_bytes(t: dict) -> int | None:
    """The bytes of a weight tensor as its shape and dtype say, or None if they cannot."""
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    try:
        item = np.dtype(t.get("dtype")).itemsize
    except (TypeError, ValueError):
        return None
    return math.prod(shape) * item


def elf_problem(path: Path) -> str:
    """Why the shared library at ``path`` cannot be loaded safely ("" if it can, as far as
    its headers tell): not a 64-bit little-endian ELF file, or shorter than its headers
    and loadable segments say (a copy cut short: loading it would kill the process with
    SIGBUS when a page past the end is touched)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return "not a 64-bit little-endian ELF shared library (compiled elsewhere?)"
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
            return f"{size} bytes, shorter than its headers say (cut short?)"
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table,
                                                                 i * phentsize)
        if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
            return f"{size} bytes, shorter than its segments say (cut short?)"
    return ""


def read_package(path: str | Path) -> dict:
    """The metadata of the package at ``path``, checked against the files."""
    p = Path(path)
    for name in (METADATA, LIBRARY, WEIGHTS):  # (a FIFO was read for ever: the worker
        # hung at the controller's Hello, and would not stop on SIGTERM)
        f = p / name
        if f.exists() and not f.is_file():
            raise PackageError(f"{f}: not a regular file (a package's files are plain "
                               "files)")
    try:
        meta = orjson.loads((p / METADATA).read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        more = " (a package is a folder: give the folder)" if p.is_file() else ""
        raise PackageError(f"{p} is not a model package (no {METADATA}){more}") from None
    except orjson.JSONDecodeError as e:
        raise PackageError(f"{p / METADATA}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise PackageError(f"{p}: package format {got!r}, expected {FORMAT}")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise PackageError(f"{p / METADATA}: no {', '.join(missing)}")
    why = _meta_problem(meta)
    if why:
        raise PackageError(f"{p / METADATA}: {why}")
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


__all__ = ["PackageError", "check_batch_sizes", "compile_model", "function_name",
           "integrity_problem", "pack_tensors", "read_package", "reference_weights",
           "write_package"]
