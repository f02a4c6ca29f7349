"""``clockwork trace``: make synthetic Azure Functions traces and look inside trace files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def cmd_synth(args: argparse.Namespace) -> int:
    from clockwork.workloads.synth import (
        MAX_DAYS,
        MAX_FUNCTIONS,
        DaysExist,
        existing_days,
        write_synthetic,
    )

    if args.functions < 1 or args.days < 1:
        print("clockwork trace synth: --functions and --days must be >= 1", file=sys.stderr)
        return 2
    if args.functions > MAX_FUNCTIONS:
        print(f"clockwork trace synth: --functions {args.functions:,} is over the most, "
              f"{MAX_FUNCTIONS:,} (a real day has ~46,000)", file=sys.stderr)
        return 2
    if args.days > MAX_DAYS:
        print(f"clockwork trace synth: --days {args.days:,} is over the most, {MAX_DAYS} "
              "(the real trace has 14 days)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def written(p: Path) -> None:  # (each day as it is written: a day takes seconds)
        print(f"{p}  ({p.stat().st_size / 1e6:.1f} MB)", flush=True)

    try:
        earlier = existing_days(Path(args.out), args.days) if args.force else []
        paths = write_synthetic(args.out, args.functions, args.days, args.seed, args.gzip,
                                written, replace=args.force)
    except DaysExist as e:
        print(f"clockwork trace synth: {e.strerror}: --force replaces them (a real trace's "
              "days too), or give another --out", file=sys.stderr)
        return 2
    except OSError as e:  # (a full disk, a folder that cannot be written)
        print(f"clockwork trace synth: cannot write into {args.out}: "
              f"{getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    if earlier:
        print(f"replaced {len(earlier)} earlier file(s) of these days in {args.out} ("
              f"{', '.join(p.name for p in earlier[:3])}{' ...' if len(earlier) > 3 else ''})",
              file=sys.stderr)
    print(f"{len(paths)} day file(s) of {args.functions:,} functions, seed {args.seed}, "
          f"in {wall:.1f} s", file=sys.stderr)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from clockwork.workloads.azure import AzureTrace, TraceError

    src: str | int = args.file
    if args.file.isascii() and args.file.isdigit() and not Path(args.file).exists():
        src = int(args.file)
    elif args.trace_dir is not None:  # (it looks for a DAY's file: a path is read as given)
        print(f"clockwork trace info: --trace-dir is for a DAY number, and {args.file} "
              "names a file (leave out --trace-dir to read it)", file=sys.stderr)
        return 2
    try:
        tr = AzureTrace.load(src, args.trace_dir)
        if args.start_minute or args.minutes:
            tr = tr.window(args.start_minute, args.minutes)
    except (TraceError, ValueError) as e:
        print(f"clockwork trace info: {e}", file=sys.stderr)
        return 2
    print(format_info(tr, args.top))
    return 0


def format_info(tr, top: int = 10) -> str:
    """A readable summary of an ``AzureTrace``."""
    tot = tr.totals()
    total = int(tot.sum())
    per_min = tr.per_minute()
    secs = tr.n_minutes * 60
    peak = int(per_min.argmax()) if per_min.size else 0
    lines = [
        f"file          {tr.source}",
        f"functions     {tr.n_functions:,}  (apps {len(set(tr.apps.tolist())):,}, "
        f"owners {len(set(tr.owners.tolist())):,})"
        + (f"; {repeated:,} row(s) repeat the ids of a row before them"
           if (repeated := tr.repeated_ids()) else ""),
        f"minutes       {tr.start_minute}..{tr.start_minute + tr.n_minutes - 1} "
        f"({tr.n_minutes})",
        f"invocations   {total:,}  (mean {total / secs:,.1f} r/s; busiest minute "
        f"{tr.start_minute + peak}: {int(per_min[peak]) if per_min.size else 0:,}, "
        f"{(int(per_min[peak]) if per_min.size else 0) / 60:,.1f} r/s)",
        f"load time     {tr.load_s:.2f} s",
        "",
        f"{'trigger':<14} {'functions':>10} {'%':>6} {'invocations':>15} {'%':>6}",
    ]
    for name, (nf, ni) in tr.trigger_summary().items():
        lines.append(f"{_cell(name, 14)} {nf:>10,} {100 * nf / max(tr.n_functions, 1):>6.1f} "
                     f"{ni:>15,} {100 * ni / max(total, 1):>6.1f}")
    if top > 0 and tr.n_functions:
        order = tr.rank_order()[:top]
        lines += ["", f"top {len(order)} functions by invocations",
                  f"{'rank':>4}  {'function':<12}  {'app':<12}  {'trigger':<13} "
                  f"{'invocations':>13} {'mean r/s':>10} {'peak/min':>10}"]
        for r, i in enumerate(order.tolist(), start=1):
            lines.append(f"{r:>4}  {_cell(tr.functions[i], 12)}  {_cell(tr.apps[i], 12)}  "
                         f"{_cell(tr.triggers[i], 13)} {int(tot[i]):>13,} "
                         f"{int(tot[i]) / secs:>10,.2f} {int(tr.counts[i].max()):>10,}")
    return "\n".join(lines)


def _cell(text: str, width: int) -> str:
    """``text`` cut and padded to ``width`` terminal columns (a wide character, as in
    CJK names or emoji, takes two: the table's columns stayed aligned only for ASCII)."""
    import unicodedata

    out, used = [], 0
    for ch in text:
        w = 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out) + " " * (width - used)
