"""``clockwork compile`` and ``clockwork profile`` (need TVM: ``pip install -e .[tvm]``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEVICES = {"cpu": "llvm", "cuda": "cuda"}


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers, e.g. 1,2,4: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive: {text!r}")
    return sizes


def _check_device(cmd: str, device: str) -> bool:
    if device != "cpu":
        print(f"clockwork {cmd}: device {device!r} is not supported yet (use --device cpu)",
              file=sys.stderr)
        return False
    return True


def _cmd_compile(args: argparse.Namespace) -> int:
    from clockwork.models.package import compile_model
    from clockwork.models.zoo import ZOO

    if not _check_device("compile", args.device):
        return 2
    if args.model not in ZOO:
        print(f"clockwork compile: unknown model {args.model!r}; zoo: {', '.join(sorted(ZOO))}",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("packages") / args.device / args.model
    compile_model(args.model, args.batch_sizes, out, target=DEVICES[args.device], seed=args.seed)
    print(f"wrote {out}/ (model.so, weights.bin, model.json)", file=sys.stderr)
    return 0


def add_compile_parser(sub: argparse._SubParsersAction) -> None:
    from clockwork.models.zoo import ZOO

    p = sub.add_parser(
        "compile", help="compile a zoo model into a model package (needs TVM)",
        description="Build a zoo model with TVM Relax (seeded random weights) and write a model "
        "package: model.so (one function per batch size), weights.bin (laid out in 16 MiB "
        f"pages) and model.json. Zoo: {', '.join(sorted(ZOO))}.")
    p.add_argument("model", help="zoo model name")
    p.add_argument("--device", default="cpu", choices=sorted(DEVICES))
    p.add_argument("--batch-sizes", type=_batch_sizes, default=[1, 2, 4, 8, 16],
                   metavar="B1,B2,...", help="default 1,2,4,8,16")
    p.add_argument("--out", metavar="DIR", help="package directory (default packages/DEVICE/MODEL)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    p.set_defaults(func=_cmd_compile)
