"""Predictability of EXEC on a real device (the paper's Fig. 3 / Section 2 claim).

For each zoo model: compile it for cpu at batch size 1, LOAD it into a
:class:`worker.devices.cpu.CpuDevice`, warm up, then time many isolated batch-1
executions one after another (the ``exec_ns`` that ``CpuDevice.infer`` returns: the VM
call alone, no input/output copies). Reports p50, p99, p99.9, p99.99 and max per model
and the tail spread (p99.99 - p50) / p50 next to the paper's anchor: on a V100, the
p99.99 of an isolated ResNet50 batch-1 inference is within 0.03 % of its median.

    python experiments/predictability.py [--quick] [--runs N] [--models a,b] [--out DIR]

Default: 10,000 timed runs per model into ``experiments/figures/predictability/``;
``--quick``: 500 runs into ``experiments/figures/predictability/quick/``. Writes
``predictability.tsv`` (one row per model), ``predictability.json`` (machine, settings,
per model the summary, 1,000 quantiles, the 20 slowest runs with their positions),
``predictability_runs.npz`` (every run's EXEC duration in ns, in run order, and as
``<model>_off_cpu`` the time the thread spent off the CPU during that run) and
``predictability.png``. Needs Apache TVM (``pip install -e .[tvm]``).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from experiments import common  # noqa: E402

NAME = "predictability"
OUT = common.FIGURES / NAME
CACHE = Path(tempfile.gettempdir()) / "clockwork-predictability"
RUNS = 10_000
QUICK_RUNS = 500
WARMUP = 200
PAPER_TAIL_PCT = 0.03  # Fig. 3: p99.99 within 0.03 % of the median (ResNet50, V100)
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p99_9", 99.9), ("p99_99", 99.99))


MAX_RUNS = 10_000_000  # timed runs per model: their figures are held in memory


def parse_args(argv) -> argparse.Namespace:
    from clockwork.cluster.cli import argtypes
    from clockwork.models.zoo import ZOO

    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_RUNS} runs per model (a smoke test), output under quick/")
    p.add_argument("--runs", type=int, default=None,
                   help=f"timed runs per model (default {RUNS:,}; {QUICK_RUNS} with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed runs first (default {WARMUP}; 50 with --quick)")
    p.add_argument("--models", default=None, metavar="A,B",
                   help=f"zoo models (default all: {','.join(ZOO)})")
    p.add_argument("--out", type=common.out_dir, default=None,
                   help=f"output directory (default {OUT.relative_to(common.ROOT)}/, "
                   "or its quick/ with --quick)")
    p.add_argument("--cache", type=common.out_dir, default=CACHE,
                   help="where compiled packages are kept between runs (default %(default)s)")
    p.add_argument("--no-gc", action="store_true",
                   help="disable Python's garbage collector during the timed runs "
                   "(default: on, as in the worker)")
    p.add_argument("--seed", type=argtypes.seed, default=0,
                   help="input and weights seed (default 0)")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else RUNS
    if args.warmup is None:
        args.warmup = 50 if args.quick else WARMUP
    if not 1 <= args.runs <= MAX_RUNS or not 0 <= args.warmup <= MAX_RUNS:
        p.error(f"--runs must be 1 to {MAX_RUNS:,} and --warmup 0 to {MAX_RUNS:,}")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models \
        else list(ZOO)
    unknown = [m for m in args.models if m not in ZOO]
    if unknown or not args.models:
        p.error(f"unknown zoo model(s) {', '.join(unknown) or '(none given)'}; "
                f"zoo: {', '.join(ZOO)}")
    if args.out is None:
        args.out = OUT / "quick" if args.quick else OUT
    if not args.out.exists():  # (made for this run: removed if it stops with it empty)
        common._MADE.append(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    common.OUTS.append(args.out)
    return args


# -- packages -------------------------------------------------------------------------


def _cache_key() -> str:
    """Changes whenever the zoo, the packager or TVM does (stale packages are rebuilt)."""
    import tvm

    from clockwork.models import package, zoo

    h = hashlib.sha1(tvm.__version__.encode())
    for mod in (zoo, package):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:12]


def package_for(model: str, cache: Path, seed: int) -> tuple[Path, float]:
    """A cpu batch-1 package of ``model`` under ``cache``: (path, compile seconds or 0)."""
    from clockwork.models.package import PackageError, compile_model, read_package

    path = cache / _cache_key() / f"{model}-b1-s{seed}"
    try:
        read_package(path)
        return path, 0.0
    except PackageError:
        pass
    t0 = time.perf_counter()
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    compile_model(model, [1], tmp, target="llvm", seed=seed)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path, time.perf_counter() - t0


# -- measuring ------------------------------------------------------------------------


def measure(model: str, path: Path, runs: int, warmup: int, seed: int,
            no_gc: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``runs`` isolated batch-1 inferences: (EXEC ns, off-CPU ns), int64, in run order.

    Off-CPU time is the wall time of the whole ``infer`` call minus the CPU time this
    thread got during it (TVM runs its kernels on the calling thread when it has one
    worker, its default on 2 vCPUs): time spent preempted, waiting or sleeping."""
    from clockwork.models.package import read_package
    from worker.devices.cpu import CpuDevice

    meta = read_package(path)
    dev = CpuDevice(meta["weights_pages"], meta["page_size"])
    dev.register(model, path)
    dev.load(model)
    spec = meta["inputs"][0]
    x = np.random.default_rng(seed).standard_normal((1, *spec["shape"])).astype(spec["dtype"])
    for _ in range(warmup):
        dev.infer(model, x)
    out = np.empty(runs, dtype=np.int64)
    off = np.empty(runs, dtype=np.int64)
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    gc.collect()
    was_enabled = gc.isenabled()
    if no_gc:
        gc.disable()
    try:
        infer = dev.infer
        for i in range(runs):
            w0, c0 = wall(), cpu()
            out[i] = infer(model, x)[1]
            off[i] = (wall() - w0) - (cpu() - c0)
    finally:
        if no_gc and was_enabled:
            gc.enable()
    dev.evict(model)
    return out, np.maximum(off, 0)


def summarize(ns: np.ndarray, off_ns: np.ndarray | None = None) -> dict:
    """Per-model figures (ms unless named otherwise)."""
    ms = np.asarray(ns, dtype=np.float64) / 1e6
    s = {"runs": int(ms.size)}
    for key, q in PERCENTILES:
        s[f"{key}_ms"] = float(np.percentile(ms, q))
    s["max_ms"] = float(ms.max())
    s["min_ms"] = float(ms.min())
    s["mean_ms"] = float(ms.mean())
    s["std_ms"] = float(ms.std())
    med = s["p50_ms"]
    s["tail_pct"] = (s["p99_99_ms"] - med) / med * 100.0  # (p99.99 - p50) / p50
    s["p99_pct"] = (s["p99_ms"] - med) / med * 100.0
    s["max_pct"] = (s["max_ms"] - med) / med * 100.0
    s["over_1pct"] = int((ms > med * 1.01).sum())  # runs more than 1 % above the median
    s["over_2x"] = int((ms > med * 2).sum())
    if off_ns is not None:
        # the slowest 0.1 % of runs: how far above the median, and how much of that was
        # time this thread spent off the CPU (preempted by other processes)
        k = max(1, ms.size // 1000)
        top = np.argsort(ms)[-k:]
        off = np.asarray(off_ns, dtype=np.float64)[top] / 1e6
        s["top01_excess_ms"] = float((ms[top] - med).mean())
        s["top01_off_cpu_ms"] = float(off.mean())
        s["median_off_cpu_ms"] = float(np.median(np.asarray(off_ns, dtype=np.float64)) / 1e6)
    return s


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tvm

    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "tvm": tvm.__version__,
            "tvm_num_threads": os.environ.get("TVM_NUM_THREADS", "(TVM default)"),
            "nice": os.nice(0)}


def _plot(path: Path, durations: dict[str, np.ndarray], rows: list[dict]) -> None:
    fig, ax = common.figure(1, 2, size=(6.4, 4.2))
    left, right = ax[0][0], ax[0][1]
    for r in rows:
        m = r["model"]
        ms = np.sort(durations[m]) / 1e6
        rel = ms / r["p50_ms"]
        ccdf = 1.0 - np.arange(ms.size) / ms.size  # P(X >= x)
        left.step(rel, ccdf, where="post",
                  label=f"{m} (p50 {r['p50_ms']:.3g} ms, p99.99 +{r['tail_pct']:.1f} %)")
        right.plot(np.arange(durations[m].size), durations[m] / 1e6, ".", ms=1.5, label=m)
    left.axvline(1 + PAPER_TAIL_PCT / 100, color="k", ls="--", lw=0.8,
                 label="paper: p99.99 = p50 + 0.03 % (V100)")
    left.axhline(1e-4, color="grey", ls=":", lw=0.8)
    left.set(xscale="log", yscale="log", xlabel="EXEC latency / median",
             ylabel="fraction of runs at least this slow",
             title="isolated batch-1 EXEC, cpu device (tail)")
    left.legend(fontsize=7)
    right.set(yscale="log", xlabel="run", ylabel="EXEC latency (ms)",
              title="every run, in order")
    right.legend(fontsize=7, markerscale=6)
    common.save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    machine = _machine()
    machine["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    rows, durations, off_cpu, details = [], {}, {}, {}
    with common.Timer() as t:
        for model in args.models:
            path, compile_s = package_for(model, args.cache, args.seed)
            t0 = time.perf_counter()
            ns, off_ns = measure(model, path, args.runs, args.warmup, args.seed, args.no_gc)
            wall = time.perf_counter() - t0
            durations[model] = ns
            off_cpu[model] = off_ns
            s = summarize(ns, off_ns)
            from clockwork.models.package import read_package

            meta = read_package(path)
            rows.append({"model": model, **{k: (round(v, 6) if isinstance(v, float) else v)
                                             for k, v in s.items()},
                         "paper_tail_pct": PAPER_TAIL_PCT, "warmup": args.warmup,
                         "weights_bytes": meta["weights_bytes"], "wall_s": round(wall, 2)})
            order = np.argsort(ns)[::-1][:20]
            qs = np.linspace(0, 1, 1001)
            details[model] = {
                "summary": s, "compile_s": round(compile_s, 3), "wall_s": round(wall, 2),
                "quantiles": {"q": qs.round(4), "ms": np.round(np.quantile(ns, qs) / 1e6, 6)},
                "slowest": [{"run": int(i), "ms": round(ns[i] / 1e6, 6),
                     "off_cpu_ms": round(off_ns[i] / 1e6, 6)} for i in order],
            }
            print(f"{model}: {args.runs:,} runs in {wall:.1f} s", file=sys.stderr)
    machine["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]

    common.write_tsv(args.out / f"{NAME}.tsv", rows)
    common.write_json(args.out / f"{NAME}.json", {
        "name": NAME, "machine": machine,
        "settings": {"runs": args.runs, "warmup": args.warmup, "batch": 1, "device": "cpu",
                     "target": "llvm", "gc_during_runs": not args.no_gc, "seed": args.seed,
                     "timed": "CpuDevice.infer exec_ns: the Relax VM call alone"},
        "paper": {"tail_pct": PAPER_TAIL_PCT,
                  "claim": "isolated batch-1 inference on a V100: p99.99 within 0.03 % of the "
                           "median (Clockwork, OSDI 2020, Fig. 3)"},
        "models": details})
    np.savez_compressed(args.out / f"{NAME}_runs.npz", **durations,
                        **{f"{m}_off_cpu": v for m, v in off_cpu.items()})
    _plot(args.out / f"{NAME}.png", durations, rows)

    hdr = (f"{'model':<18}{'runs':>7}{'p50 ms':>10}{'p99 ms':>10}{'p99.9 ms':>10}"
           f"{'p99.99 ms':>11}{'max ms':>10}{'(p99.99-p50)/p50':>18}{'paper':>8}")
    print(hdr)
    for r in rows:
        print(f"{r['model']:<18}{r['runs']:>7,}{r['p50_ms']:>10.4f}{r['p99_ms']:>10.4f}"
              f"{r['p99_9_ms']:>10.4f}{r['p99_99_ms']:>11.4f}{r['max_ms']:>10.4f}"
              f"{r['tail_pct']:>17.2f}%{PAPER_TAIL_PCT:>7.2f}%")
    for r in rows:
        print(f"{r['model']}: slowest 0.1 % of runs {r['top01_excess_ms']:.3f} ms above the "
              f"median on average, {r['top01_off_cpu_ms']:.3f} ms of it off the CPU")
    line = common.compare(
        f"Fig. 3 predictability: isolated batch-1 EXEC, {args.runs:,} runs per model",
        f"p99.99 within {PAPER_TAIL_PCT} % of the median (ResNet50, dedicated V100)",
        "; ".join(f"{r['model']} +{r['tail_pct']:.1f} %" for r in rows)
        + f" (cpu device, {machine['logical_cpus']} shared vCPUs)")
    return {"name": NAME, "wall_s": round(t.wall_s, 2), "summary": line, "rows": rows,
            "out": str(args.out)}


if __name__ == "__main__":
    common.script(main)
