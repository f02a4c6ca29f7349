"""``clockwork simulate`` and ``clockwork report``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path

import orjson


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM ends the run as Ctrl-C does (exit 130, --spill-dir's folder removed); it
    killed the process, leaving the folder behind. Only in the main thread (where Python
    runs signal handlers); the previous handler is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def cmd_simulate(args: argparse.Namespace) -> int:
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import ScenarioError, load_scenario
    from clockwork.telemetry import emit_run

    try:
        sc = load_scenario(args.scenario, args.set)
        sim = Simulation(sc, progress=not args.quiet and sys.stderr.isatty() or args.progress,
                         spill_dir=args.spill_dir)
    except (ScenarioError, ValueError, OSError) as e:
        print(f"clockwork simulate: {e}", file=sys.stderr)
        return 2
    try:
        with _sigterm_as_ctrl_c():
            res = sim.run()
    except RuntimeError as e:  # requests still unanswered when drain_s ran out
        print(f"clockwork simulate: {e}", file=sys.stderr)
        return 1
    if res.telemetry.spill_error is not None:
        print(f"clockwork simulate: warning: rows stopped going to --spill-dir "
              f"({res.telemetry.spill_error}); the rest were kept in memory", file=sys.stderr)
    for t, what in sim.fault_log:  # the [faults] plan as it played out
        print(f"clockwork simulate: {t / 1e9:7.2f} s  fault: {what}", file=sys.stderr)
    s = res.summary
    if not s["submitted"]:  # (a sweep may hold such a point: a warning, not an error)
        print(f"clockwork simulate: warning: no requests were submitted in duration_s = "
              f"{sc.duration_s:g} s (rates too low or the run too short): the figures are "
              "empty", file=sys.stderr)
    res.telemetry.log_format = args.log_format
    try:
        emit_run(res, sc, f"{s['gpus']} GPU(s), {s['model_instances']} model instance(s), "
                 f"policy {s['policy']}, simulated in {res.wall_s:.1f} s wall", args.out, args.json)
    finally:
        res.telemetry.close()  # (--spill-dir: the rows' files go now)
    return 0


def _summary_from_logs(path: Path) -> tuple[dict, dict, dict] | str | None:
    """A folder with logs and no summary.json (``clockwork controller --log-dir``): the
    summary computed from its logs, over the span from the first arrival to the last
    answer (a note says so), with the request and action columns read; None without
    logs, a message for logs it cannot read."""
    from clockwork.telemetry import read_logs, summary_of

    if not any((path / f"requests.{x}").exists() for x in ("tsv", "npz")):
        return None
    try:
        tel = read_logs(path)
    except (FileNotFoundError, ValueError) as e:
        return str(e)
    req = tel.request_columns()
    arrival, latency = req["arrival"], req["latency"]
    span = int((arrival + latency).max() - arrival.min()) if len(arrival) else 0
    print(f"clockwork report: no summary.json in {path}: figures computed from its logs, "
          f"over {span / 1e9:.1f} s from the first arrival to the last answer",
          file=sys.stderr)
    act = tel.action_columns()
    return summary_of(req, act, round(span / 1e9, 6)), req, act


def cmd_report(args: argparse.Namespace) -> int:
    from clockwork.telemetry import format_summary

    path = Path(args.dir)
    f = path / "summary.json" if path.is_dir() else path
    columns = None  # (request, action) columns, when read already
    try:
        s = orjson.loads(f.read_bytes())
    except FileNotFoundError:
        got = _summary_from_logs(path) if path.is_dir() else None
        if got is None:
            print(f"clockwork report: no summary.json in {path}", file=sys.stderr)
            return 2
        if isinstance(got, str):
            print(f"clockwork report: {got}", file=sys.stderr)
            return 2
        s, *columns = got
    except orjson.JSONDecodeError as e:
        print(f"clockwork report: {f} is not valid JSON: {e}", file=sys.stderr)
        return 2
    try:
        table = format_summary(s) if isinstance(s, dict) else None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        table, why = None, f" ({type(e).__name__}: {e})"
    else:
        why = ""
    if table is None:
        print(f"clockwork report: {f} is not a run summary (the summary.json that "
              f"clockwork simulate/replay/serve --replay write){why}", file=sys.stderr)
        return 2
    rows = None
    if args.timeline:  # (read before anything is printed: a bad interval prints nothing)
        from clockwork.telemetry import timeline, timeline_of

        try:
            d = s.get("duration_s")
            d = d if isinstance(d, int | float) and d > 0 else None
            rows = (timeline(f.parent, args.timeline, d) if columns is None else
                    timeline_of(*columns, args.timeline, d))
        except (FileNotFoundError, ValueError) as e:
            print(f"clockwork report: {e}", file=sys.stderr)
            return 2
    print(table)
    run = f.parent / "run.json"
    if run.exists():
        try:
            r = orjson.loads(run.read_bytes())
            print(f"{'wall time':<40}  {float(r.get('wall_s', 0)):.2f} s")
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            print(f"clockwork report: warning: {run} is not readable run information; "
                  "left out", file=sys.stderr)
    if rows is not None:
        from clockwork.telemetry import format_timeline

        print()
        print(format_timeline(rows))
    return 0
