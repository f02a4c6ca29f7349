"""The ``clockwork`` command (composition root).

Subcommands register themselves in ``COMMANDS`` through ``add_*_parser``
functions, so each feature keeps its CLI beside its code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

EPILOG = """examples:
  clockwork simulate scenarios/fig5_1gpu.toml
  clockwork simulate scenarios/poisson_warm.toml --set duration_s=10 --out runs/p
  clockwork report runs/p
"""


def _cmd_simulate(args: argparse.Namespace) -> int:
    from clockwork.scenario import ScenarioError, load_scenario
    from clockwork.sim import Simulation
    from clockwork.telemetry import emit_run

    try:
        sc = load_scenario(args.scenario, args.set)
        sim = Simulation(sc, progress=not args.quiet and sys.stderr.isatty() or args.progress)
    except (ScenarioError, ValueError) as e:
        print(f"clockwork simulate: {e}", file=sys.stderr)
        return 2
    res = sim.run()
    s = res.summary
    emit_run(res, sc, f"{s['gpus']} GPU(s), {s['model_instances']} model instance(s), policy "
             f"{s['policy']}, simulated in {res.wall_s:.1f} s wall", args.out, args.json)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from clockwork.telemetry import format_summary

    path = Path(args.dir)
    f = path / "summary.json" if path.is_dir() else path
    try:
        s = orjson.loads(f.read_bytes())
    except FileNotFoundError:
        print(f"clockwork report: no summary.json in {path}", file=sys.stderr)
        return 2
    except orjson.JSONDecodeError as e:
        print(f"clockwork report: {f} is not valid JSON: {e}", file=sys.stderr)
        return 2
    print(format_summary(s))
    run = f.parent / "run.json"
    if run.exists():
        r = orjson.loads(run.read_bytes())
        print(f"{'wall time':<40}  {r.get('wall_s', 0):.2f} s")
    if args.timeline:
        from clockwork.telemetry import format_timeline, timeline

        if not (f.parent / "requests.tsv").exists():
            print(f"clockwork report: no requests.tsv in {f.parent}", file=sys.stderr)
            return 2
        print()
        print(format_timeline(timeline(f.parent, args.timeline)))
    return 0


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a scenario in the simulator (virtual clock, emulated GPUs)",
        description="Run a scenario file in the discrete-event simulator: the production "
        "scheduler and worker semantics on a virtual clock. Prints the SLO table; with --out "
        "also writes summary.json, requests.tsv, actions.tsv and run.json.",
    )
    p.add_argument("scenario", help="scenario TOML file (see scenarios/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key, e.g. --set cluster.workers=4 "
                   "--set workloads.0.rate_rps=500 (repeatable)")
    p.add_argument("--out", metavar="DIR", help="write logs and summary.json here")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--progress", action="store_true", help="progress line even without a TTY")
    p.set_defaults(func=_cmd_simulate)


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="print a run's summary as a table",
                       description="Print the summary.json of a run directory as a table.")
    p.add_argument("dir", help="a run directory (from --out) or a summary.json file")
    p.add_argument("--timeline", type=float, nargs="?", const=60.0, default=None,
                   metavar="SECONDS", help="also print per-interval figures (requests, goodput, "
                   "SLO attainment, cold starts, loads, evicts); interval default 60 s")
    p.set_defaults(func=_cmd_report)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_simulate_parser,
    add_report_parser,
]


def _needs_tvm(args: argparse.Namespace) -> int:
    print(f"clockwork {args.command}: real models need Apache TVM, which is not installed; "
          "install it with: pip install -e '.[tvm]' (the PyPI package is apache-tvm, not tvm)",
          file=sys.stderr)
    return 2


def _add_tvm_stubs(sub: argparse._SubParsersAction) -> None:
    for name, what in (("compile", "compile a model into a package"),
                       ("profile", "measure a compiled model's LOAD/EXEC times")):
        p = sub.add_parser(name, help=f"{what} (needs apache-tvm)", add_help=True)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_needs_tvm)


def _optional_commands() -> list[Callable]:
    """Commands whose modules may be absent in a light install."""
    out = []
    try:
        from clockwork.workloads.trace_cli import add_trace_parser
    except ImportError:
        pass
    else:
        out.append(add_trace_parser)
    import importlib.util

    if importlib.util.find_spec("tvm") is not None:  # real models (pip install -e .[tvm])
        from clockwork.models.cli import add_compile_parser, add_profile_parser

        out += [add_compile_parser, add_profile_parser]
    else:
        out.append(_add_tvm_stubs)
    try:  # the live system (needs grpcio)
        from clockwork.live import add_infer_parser, add_replay_parser, add_serve_parser
        from controller.service import add_controller_parser
        from worker.service import add_worker_parser
    except ImportError:
        pass
    else:
        out += [add_serve_parser, add_controller_parser, add_worker_parser, add_infer_parser,
                add_replay_parser]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clockwork",
        description="Clockwork-py: DNN model serving with predictable tail latency.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS + _optional_commands():
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
