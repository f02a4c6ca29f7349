"""``clockwork trace``: make synthetic Azure Functions traces and look inside trace files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TRACE_EPILOG = """examples:
  clockwork trace synth --functions 40000 --days 14 --seed 1 --out traces/azure
  clockwork trace info traces/samples/invocations_per_function_md.anon.d01.csv
  clockwork trace info 1 --top 20        # day 1 from traces/azure or $AZURE_TRACE_DIR

The real dataset: Microsoft AzurePublicDataset, "Azure Functions Trace 2019"
(see traces/README.md).
"""


def _cmd_synth(args: argparse.Namespace) -> int:
    from clockwork.workloads.synth import write_synthetic

    if args.functions < 1 or args.days < 1:
        print("clockwork trace synth: --functions and --days must be >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    paths = write_synthetic(args.out, args.functions, args.days, args.seed, args.gzip)
    wall = time.perf_counter() - t0
    for p in paths:
        print(f"{p}  ({p.stat().st_size / 1e6:.1f} MB)")
    print(f"{len(paths)} day file(s) of {args.functions:,} functions, seed {args.seed}, "
          f"in {wall:.1f} s", file=sys.stderr)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from clockwork.workloads.azure import AzureTrace, TraceError

    src: str | int = args.file
    if args.file.isdigit() and not Path(args.file).exists():
        src = int(args.file)
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
        f"owners {len(set(tr.owners.tolist())):,})",
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
        lines.append(f"{name:<14} {nf:>10,} {100 * nf / max(tr.n_functions, 1):>6.1f} "
                     f"{ni:>15,} {100 * ni / max(total, 1):>6.1f}")
    if top > 0 and tr.n_functions:
        order = tr.rank_order()[:top]
        lines += ["", f"top {len(order)} functions by invocations",
                  f"{'rank':>4}  {'function':<12}  {'app':<12}  {'trigger':<13} "
                  f"{'invocations':>13} {'mean r/s':>10} {'peak/min':>10}"]
        for r, i in enumerate(order.tolist()):
            lines.append(f"{r:>4}  {tr.functions[i][:12]:<12}  {tr.apps[i][:12]:<12}  "
                         f"{tr.triggers[i]:<13} {int(tot[i]):>13,} {int(tot[i]) / secs:>10,.2f} "
                         f"{int(tr.counts[i].max()):>10,}")
    return "\n".join(lines)


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace", help="synthesise or inspect Azure Functions traces",
        description="Azure Functions Trace 2019 files: make synthetic ones in the same CSV "
        "format, or summarise a file (real or synthetic).",
        epilog=TRACE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    s = tsub.add_parser(
        "synth", help="write synthetic day files in the dataset's format",
        description="Write invocations_per_function_md.anon.d01.csv ... dNN.csv into DIR: "
        "seeded synthetic days whose statistics follow Shahrad et al. (ATC'20) — trigger "
        "mix, functions per app, heavy-tailed daily counts, diurnal shape, periodic timers, "
        "bursts (the parameters are documented in clockwork/workloads/synth.py). The same "
        "seed gives byte-identical files. 40,000 functions take a few seconds per day.")
    s.add_argument("--functions", type=int, default=1000, metavar="N",
                   help="functions (rows) per day (default 1000; the real days have ~46,000)")
    s.add_argument("--days", type=int, default=1, metavar="D",
                   help="number of day files, d01..dD (default 1)")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    s.add_argument("--out", required=True, metavar="DIR",
                   help="output folder (created if missing), e.g. traces/azure")
    s.add_argument("--gzip", action="store_true",
                   help="write .csv.gz (the reader and the azure workload read both)")
    s.set_defaults(func=_cmd_synth)

    i = tsub.add_parser(
        "info", help="summarise a trace file: rows, totals, triggers, top functions",
        description="Load a day file (checking every row) and print its size, total and "
        "peak invocations, the per-trigger breakdown, the busiest functions and the load "
        "time.")
    i.add_argument("file", metavar="FILE|DAY",
                   help="a day file, or a day number looked up in traces/azure and "
                   "$AZURE_TRACE_DIR (both name forms)")
    i.add_argument("--top", type=int, default=10, metavar="K",
                   help="list the K busiest functions (default 10; 0 for none)")
    i.add_argument("--start-minute", type=int, default=0, metavar="M",
                   help="only minutes from M (0-based) ...")
    i.add_argument("--minutes", type=int, default=None, metavar="N",
                   help="... for N minutes (default: to the end of the day)")
    i.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="also look for day files here (for a DAY argument)")
    i.set_defaults(func=_cmd_info)
