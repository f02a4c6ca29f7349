"""Every zoo model at every batch size against its numpy reference, on a real device
(cpu, or cuda on an NVIDIA GPU): compiled outputs before and after an EVICT and a LOAD
into different pages.

    python experiments/check_outputs.py [--models a,b] [--batch-sizes 1,2,4,8,16]
    python experiments/check_outputs.py --device cuda [--packages DIR]

Prints the largest absolute error per model and batch size, before and after the reload;
exits 1 if any output is outside rtol = atol = 1e-4, 2 if a package given (``--packages``)
cannot be read or run (one line each, naming it and why: not this model's, damaged). Packages are compiled into a
temporary folder, or taken from DIR/<model>/ (``clockwork compile MODEL --device DEVICE
--out DIR/MODEL``: for cuda that is a cross-compile, so a GPU machine can run this with
TVM's runtime alone).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    from clockwork.models.package import PackageError, compile_model
    from clockwork.models.zoo import ZOO
    from worker.devices.base import DeviceError

    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--models", default=",".join(sorted(ZOO)),
                   help=f"zoo models, comma-separated (default all: {','.join(sorted(ZOO))})")
    p.add_argument("--batch-sizes", default="1,2,4,8,16",
                   help="when compiling; with --packages, each package's own")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the outputs are computed (default cpu; cuda: an NVIDIA GPU)")
    p.add_argument("--packages", metavar="DIR", type=Path,
                   help="take the packages from DIR/<model>/ instead of compiling them")
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in ZOO]
    if unknown:
        p.error(f"unknown zoo model(s) {', '.join(map(repr, unknown))}; zoo: "
                f"{', '.join(sorted(ZOO))}")
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or max(sizes) > 1024:
        p.error(f"--batch-sizes: batch sizes from 1 to 1024, comma-separated, got "
                f"{args.batch_sizes!r}")
    if args.packages is not None and not args.packages.is_dir():
        p.error(f"--packages {args.packages}: no such folder")
    if args.device == "cuda":
        from worker.devices.cuda import CudaDevice as Device
        from worker.devices.cuda import cuda_target_and_check
        target = "" if args.packages else cuda_target_and_check()
    else:
        from worker.devices.cpu import CpuDevice as Device
        target = "llvm"
    bad = invalid = 0
    print(f"{'model':18} {'batch':>5} {'max |err|':>10} {'after reload':>12}  pages", flush=True)
    with tempfile.TemporaryDirectory(prefix="cw-check-") as tmp:
        for name in args.models.split(","):
            if args.packages:
                path = args.packages / name
            else:
                path = compile_model(name, sizes, Path(tmp) / name, target=target)
            try:
                bad += check(name, path, Device)
            except (PackageError, DeviceError) as e:
                if not args.packages:
                    raise  # (one compiled here: not the user's package, a fault of ours)
                invalid += 1
                print(f"{name:18} INVALID  {path}: {str(e).strip()}", flush=True)
    print(("all outputs within 1e-4" if not bad and not invalid else
           "the outputs checked are within 1e-4" if not bad else
           f"{bad} mismatching (model, batch) pairs")
          + (f"; {invalid} package(s) not checked (INVALID above)" if invalid else ""))
    return 1 if bad else 2 if invalid else 0


def check(name: str, path: Path, Device) -> int:
    """Model ``name``'s package at ``path`` on a ``Device``: its outputs at each of its
    batch sizes against the reference, before and after a reload into other pages; the
    (model, batch) pairs outside 1e-4. A package that is another model's, or one the
    device refuses, raises ``PackageError`` / ``DeviceError``."""
    from clockwork.models.package import PackageError, read_package, reference_weights
    from clockwork.models.zoo import get_model

    meta = read_package(path)
    if meta.get("model") != name:
        raise PackageError(f"holds a package of {meta.get('model')!r}, not {name!r}")
    sizes = meta["batch_sizes"]
    w = reference_weights(meta, path)
    n = meta["weights_pages"]
    # room for two copies plus a filler: the reload lands on different pages
    dev = Device(2 * n + 1, meta["page_size"])
    dev.register(name, path)
    dev.register("filler", path)
    pages1, _ = dev.load(name)
    rng = np.random.default_rng(0)
    xs = {b: rng.standard_normal((b, *meta["inputs"][0]["shape"])).astype(
        meta["inputs"][0]["dtype"]) for b in sizes}
    refs = {b: get_model(name).reference(xs[b], w) for b in sizes}
    first = {b: dev.infer(name, xs[b])[0] for b in sizes}
    dev.evict(name)
    dev.load("filler")  # takes the pages just freed
    pages2, _ = dev.load(name)
    assert set(pages1).isdisjoint(pages2), "reload should use other pages"
    bad = 0
    for b in sizes:
        again = dev.infer(name, xs[b])[0]
        e1 = float(np.abs(first[b] - refs[b]).max())
        e2 = float(np.abs(again - refs[b]).max())
        ok = all(np.allclose(y, refs[b], rtol=1e-4, atol=1e-4) for y in (first[b], again))
        bad += not ok
        print(f"{name:18} {b:>5} {e1:>10.2e} {e2:>12.2e}  {pages1} -> {pages2}"
              + ("" if ok else "  MISMATCH"), flush=True)
    return bad


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
