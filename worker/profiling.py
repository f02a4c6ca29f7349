"""Measure a model package on a device: LOAD and EXEC per batch size, many runs each,
as a :class:`~clockwork.profiles.ModelProfile` (the format the scheduler reads)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from clockwork.profiles import PAGE_SIZE, ModelProfile, TensorSpec, pages_for


def _stats(ns: list[int]) -> dict[str, int]:
    a = np.asarray(ns, dtype=np.int64)
    return {"p50": int(np.percentile(a, 50)), "p99": int(np.percentile(a, 99)),
            "max": int(a.max()), "n": int(a.size)}


def _describe(s: dict[str, int], where: str) -> str:
    return (f"measured: p99 of {s['n']} runs on {where}; p50 {s['p50']} ns, "
            f"p99 {s['p99']} ns, max {s['max']} ns")


PROGRESS_S = 10.0  # a progress line at least this often while one batch size is measured


def profile_package(package: str | Path, runs: int = 200, load_runs: int = 50,
                    warmup: int = 10, seed: int = 0, device: str = "cpu",
                    progress=None) -> ModelProfile:
    """Profile the package at ``package`` on ``device`` (cpu, or cuda on a machine with
    a GPU). Figures are p99s. ``progress(text)``, if given, hears of each step done (a
    real-size model takes minutes)."""
    say = progress or (lambda text: None)
    from clockwork.models.package import read_package

    meta = read_package(package)
    if device == "cuda":
        from worker.devices.cuda import CudaDevice
        dev = CudaDevice(meta["weights_pages"], meta["page_size"])
    else:
        from worker.devices.cpu import CpuDevice
        dev = CpuDevice(meta["weights_pages"], meta["page_size"])
    dev.register(meta["model"], package)
    name = meta["model"]
    where = (f"cuda GPU {dev.telemetry().get('name') or dev.index}" if device == "cuda"
             else f"cpu ({platform.processor() or platform.machine()}, {meta['target']})")
    loads = []
    for _ in range(max(1, load_runs)):
        _, ns = dev.load(name)
        loads.append(ns)
        dev.evict(name)
    say(f"{len(loads)} LOADs: p99 {np.percentile(loads, 99) / 1e6:.3f} ms")
    dev.load(name)
    spec = meta["inputs"][0]
    rng = np.random.default_rng(seed)
    exec_ns, source = {}, {}
    for b in meta["batch_sizes"]:
        x = rng.standard_normal((b, *spec["shape"])).astype(spec["dtype"])
        for _ in range(warmup):
            dev.infer(name, x)
        held, kernels = [], []
        n = max(1, runs)
        said = time.monotonic()
        for i in range(n):
            held.append(dev.infer(name, x)[1])
            if getattr(dev, "kernel_ns", None) is not None:
                kernels.append(dev.kernel_ns)
            if time.monotonic() - said >= PROGRESS_S:  # (a batch of a real-size model on
                said = time.monotonic()  # a CPU takes minutes: a line now and then)
                say(f"batch {b}: {i + 1} of {n} EXECs so far")
        s = _stats(held)
        exec_ns[b] = s["p99"]
        source[f"exec_ns.{b}"] = _describe(s, where)
        if kernels:  # the cuda device: the lane's time, and the kernels' share of it
            k = _stats(kernels)
            source[f"exec_ns.{b}"] += (f" (the EXEC lane held: input copy, kernels, output "
                                       f"copy; the kernels alone, by CUDA events: p50 "
                                       f"{k['p50']} ns, p99 {k['p99']} ns)")
        say(f"batch {b}: {max(1, runs)} EXECs, p99 {s['p99'] / 1e6:.3f} ms")
    ls = _stats(loads)
    source["load_ns"] = _describe(ls, where) + " (alloc + page copy + zero-copy bind)"
    source["weights_bytes"] = f"package of {meta['model']}: sum of parameter sizes"
    # a model without parameters still takes a page of the cache (and a profile's weights
    # are at least a byte): counted as one byte
    weights_bytes = max(1, meta["weights_bytes"])
    if not meta["weights_bytes"]:
        source["weights_bytes"] += " (none: counted as 1 byte, one page)"
    pages = meta["weights_pages"] if meta["page_size"] == PAGE_SIZE else pages_for(
        weights_bytes)
    return ModelProfile(
        model=name, device=device, weights_bytes=weights_bytes, load_ns=ls["p99"],
        exec_ns=exec_ns, weights_pages=pages,
        inputs=[TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in meta["inputs"]],
        outputs=[TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in meta["outputs"]],
        source=source,
    )


__all__ = ["profile_package"]
