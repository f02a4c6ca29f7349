"""``clockwork simulate`` and ``clockwork report``, and what the command line checks before
``clockwork worker`` runs (``worker.service.cmd_worker``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from clockwork.signals import stops_held, term_as_ctrl_c


def cmd_simulate(args: argparse.Namespace) -> int:
    with term_as_ctrl_c():  # (from before --spill-dir's folder is made to its removal)
        return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import ScenarioError, load_scenario
    from clockwork.telemetry import emit_run

    if args.log_format is not None and not args.out:
        print("clockwork simulate: --log-format needs --out (the logs are written only "
              "there)", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario, args.set)
        sim = Simulation(sc, progress=not args.quiet and sys.stderr.isatty() or args.progress,
                         spill_dir=args.spill_dir)
    except (ScenarioError, ValueError, OSError) as e:
        print(f"clockwork simulate: {e}", file=sys.stderr)
        return 2
    for line in sim.warnings:  # (about the settings: before the run)
        print(f"clockwork simulate: {line}", file=sys.stderr)
    try:
        res = sim.run()
    except RuntimeError as e:  # requests still unanswered when drain_s ran out
        print(f"clockwork simulate: {e}", file=sys.stderr)
        return 1
    for t, what in res.event_log:  # the scenario's events as they played out
        kind = "" if what.startswith(("repository: ", "cluster: ")) else "fault: "
        print(f"clockwork simulate: {t:7.2f} s  {kind}{what}", file=sys.stderr)
    for line in res.warnings[len(sim.warnings):]:  # (about the run: after it)
        print(f"clockwork simulate: {line}", file=sys.stderr)
    s = res.summary
    res.telemetry.log_format = args.log_format or "tsv"
    try:  # (a first signal as the files are written is held until they are: the run kept)
        with stops_held():
            emit_run(res, sc, f"{s['gpus']} GPU(s), {s['model_instances']} model "
                     f"instance(s), policy {s['policy']}, simulated in {res.wall_s:.1f} s "
                     "wall", args.out, args.json)
    finally:
        res.telemetry.close()  # (--spill-dir: the rows' files go now)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """``clockwork worker``: a ``--packages`` folder that does not exist is one warning
    line (the worker still starts: the folder may be filled later, and LOADs of its
    packages fail until then), then ``worker.service.cmd_worker``."""
    from worker.service import cmd_worker as run

    folder = args.packages
    if folder is not None and not Path(folder).is_dir():
        if args.device == "emulated":
            why = (" (the emulated device reads no packages: --packages is for --device cpu "
                   "or cuda)")
        else:
            why = (f"; it can serve no model until {folder}/<model>/ holds the model's "
                   "package (a controller that needs one refuses this worker, saying so): "
                   f"clockwork compile MODEL --device {args.device} --out {folder}/MODEL")
        print(f"clockwork worker: warning: --packages {folder}: no such folder{why}",
              file=sys.stderr, flush=True)
    return run(args)


def _summary_from_logs(path: Path) -> tuple[dict, dict, dict, float | None] | str | None:
    """A folder with logs and no summary.json (``clockwork controller --log-dir``): the
    summary computed from its logs, over the span from the first arrival to the last
    answer (a note says so), with the request and action columns read and the time of
    the last answer (s from the logs' time 0: where the run ended, for the timeline;
    None without requests); None without logs, a message for logs it cannot read or
    that are incomplete (a request log without its action log). Without log files, the
    rows a controller writing npz logs left in a ``clockwork-rows-*`` folder there (or
    that folder itself, named); such a folder newer than the logs beside it is said."""
    from clockwork.telemetry import (
        ROWS_PREFIX,
        WRITING_MARK,
        is_log_file,
        log_pair,
        read_logs,
        read_rows,
        rows_folder,
        summary_of,
    )

    own = path.name.startswith(ROWS_PREFIX) and (path / "requests.status").is_file()
    pair = is_log_file(path)  # (one log pair named: a renamed one, as rotated)
    if pair:
        try:
            req_log, act_log, _ = log_pair(path)
        except (FileNotFoundError, ValueError) as e:
            return str(e)
        if not act_log.exists():
            return f"no {act_log.name} beside {req_log.name} in {path.parent}"
        found = [(0, req_log)]
    else:
        found = [] if own else [(q.stat().st_mtime_ns, q) for x in ("tsv", "npz")
                                if (q := path / f"requests.{x}").exists()]
    rows = path if own else None if found else rows_folder(path)
    if not found and rows is None:
        return None
    if own:  # (a rows folder named: the run folder's newest may be another)
        print(f"clockwork report: {path}: the rows of a run whose npz logs were never "
              "written (a controller killed, or still running)", file=sys.stderr)
    elif rows is not None:  # (all its rows: the folder goes once the .npz files are in place)
        print(f"clockwork report: no logs in {path}: read from {rows.name}, the rows of a "
              "run whose npz logs were never written (a controller killed, or still "
              "running)", file=sys.stderr)
    elif not pair:
        newer = rows_folder(path)  # (a later run's rows beside an earlier run's logs)
        if newer is not None and newer.stat().st_mtime_ns > max(found)[0]:
            print(f"clockwork report: warning: {path} also holds {newer.name}, the rows of "
                  "a later run whose npz logs were never written (a controller killed, or "
                  f"still running); these figures are the earlier logs': clockwork report "
                  f"{newer} reads the later run", file=sys.stderr)
        req_log = max(found)[1]  # (the one read_logs reads: the newer)
        act_log = req_log.with_name("actions" + req_log.suffix)
        if not act_log.exists():  # (every run writes both: a write stopped part way)
            return (f"{path} has {req_log.name} but no {act_log.name} and no summary.json: "
                    "its logs are incomplete (a run whose files were not all written, e.g. "
                    "on a full disk)")
        if (path / WRITING_MARK).exists():  # (there while a run's files are written)
            return (f"{path} has {WRITING_MARK} and logs but no summary.json: a run whose "
                    "files were not all written (stopped or killed while writing them, a "
                    "full disk); its logs are incomplete")
    try:
        tel = read_rows(path) if own else read_logs(path)
    except (FileNotFoundError, ValueError) as e:
        return str(e)
    except OSError as e:  # (a log that is a folder, or that cannot be read)
        return f"cannot read {e.filename or path}: {e.strerror or e}"
    _warn(tel.notes)
    req = tel.request_columns()
    arrival, latency = req["arrival"], req["latency"]
    last = int((arrival + latency).max()) if len(arrival) else None  # ns
    span = last - int(arrival.min()) if last is not None else 0
    what = (f"{path}: figures computed from the log pair {req_log.name} and "
            f"{act_log.name}" if pair else
            f"no summary.json in {path}: figures computed from its logs")
    print(f"clockwork report: {what}, " + (
        f"over {span / 1e9:.1f} s from the first arrival to the last answer"
        if last is not None else "which hold no request"), file=sys.stderr)
    act = tel.action_columns()
    end = last / 1e9 if last is not None and last > 0 else None
    summary = summary_of(req, act, round(span / 1e9, 6))
    if not len(act["type"]) and summary["succeeded"]:
        # requests served with no INFER logged: the actions are logged elsewhere (a live
        # replay's are the controller's), so their counts and errors are unknown, not 0
        summary["actions"] = summary["prediction_error_ms"] = None
        summary["actions_where"] = "not in this action log"
        print(f"clockwork report: {act_log if found else rows} holds no actions"
              f" though {summary['succeeded']:,} requests succeeded (a live "
              "replay's actions are the controller's: its --log-dir): actions n/a",
              file=sys.stderr)
    if rows is not None:  # (in the table too: a script reads stdout)
        summary["incomplete"] = (f"no logs written, the rows in {rows.name}: a run killed, "
                                 "still running, or whose logs could not be written "
                                 "(figures up to its last answer)")
    return summary, req, act, end


def _warn(notes: list[str]) -> None:
    for n in notes:
        print(f"clockwork report: warning: {n}", file=sys.stderr)


def _beside(f: Path) -> tuple[Path, Path]:
    """The logs and the run information that go with the summary file ``f``: for
    ``summary.json``, its folder's pair and ``run.json``; for ``summary.N.json`` (a
    finished run's, renamed by a controller that then logged into its folder), the pair
    renamed alike (``requests.N.tsv`` or ``requests.N.npz``, the newer if both) and
    ``run.N.json``."""
    tag = f.name[len("summary."):-len(".json")] if (
        f.name.startswith("summary.") and f.name.endswith(".json")) else ""
    if not tag:
        return f.parent, f.parent / "run.json"
    pair = [p for p in (f.parent / f"requests.{tag}.npz", f.parent / f"requests.{tag}.tsv")
            if p.is_file()]
    logs = (max(pair, key=lambda p: p.stat().st_mtime_ns) if pair
            else f.parent / f"requests.{tag}.tsv")
    return logs, f.parent / f"run.{tag}.json"


def _no_summary(path: Path) -> str:
    """Why ``path`` (a folder or a file's path) has no run summary to report, in words."""
    if not path.exists():
        return f"no such {'file' if path.suffix == '.json' else 'folder'}: {path}"
    if (path / "points").is_dir():  # a sweep's or a plan's OUT (their points inside)
        plan = any((path / n).exists() for n in ("plan.json", "curve.tsv"))
        tables = ("plan.json", "curve.tsv") if plan else ("results.tsv",)
        got = [str(path / n) for n in tables if (path / n).exists()]
        point = next((p for p in sorted((path / "points").iterdir())
                      if (p / "summary.json").exists()), None)
        if point is not None:
            got.append(f"a point's run: clockwork report {point}")
        return (f"{path} is a {'plan' if plan else 'sweep'}'s output, not a run: no "
                "summary.json of its own"
                + (f"; see {' or '.join(got)}" if got else " (and no point finished yet)"))
    from clockwork.telemetry import COMPRESSED_SUFFIXES, is_log_file

    renamed = sorted(p.name for p in path.glob("requests.*")
                     if is_log_file(p) and not p.name.endswith(COMPRESSED_SUFFIXES))
    if renamed:  # (only renamed log pairs there: rotated, or a restart's)
        return (f"no summary.json and no requests.tsv or requests.npz in {path}; it holds "
                f"renamed request logs ({', '.join(renamed[:4])}"
                f"{', ...' if len(renamed) > 4 else ''}): clockwork report "
                f"{path / renamed[0]} reads that pair")
    from clockwork.telemetry import PROCESS_LOGS, process_logs

    if process_logs(path):  # (serve --replay --out writes its files at the end)
        return (f"no summary.json in {path}: its {PROCESS_LOGS}/ holds the output of a live "
                "run that did not finish (killed, or still running); the controller's "
                "own logs, if it was given --log-dir, have its requests so far")
    return f"no summary.json in {path}"


def _actions_counted(s: dict) -> bool:
    """Whether summary ``s`` counts LOADs or EVICTs (from its action log or, in a live
    replay, from the controller's counters), or does not know them (a live replay whose
    controller went away before it said them: ``actions`` null)."""
    acts = s.get("actions")
    if not isinstance(acts, dict):
        return True
    return any(isinstance(acts.get(k), int) and acts[k] > 0 for k in ("load", "evict"))


def cmd_report(args: argparse.Namespace) -> int:
    try:
        return _report(args)
    except MemoryError:  # (logs too large for this process: one line, not a traceback)
        print(f"clockwork report: {args.dir}: its logs are too large to read in the memory "
              "this process can take (without --timeline, a summary.json is read alone)",
              file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from clockwork.telemetry import format_summary, is_log_file

    path = Path(args.dir)
    log = is_log_file(path)  # (a log pair named by one of its files: read from the pair)
    f = path / "summary.json" if path.is_dir() else path
    logs, run = _beside(f)
    columns = None  # (request, action) columns, when read already
    end = None  # where the run ended, s from the logs' time 0
    from_logs = log  # (no summary.json to read: the figures from the logs)
    if not log and path.name != "summary.json" and (path.parent / "points").is_dir() \
            and path.is_file():  # (a sweep's or a plan's table: it said "not valid JSON")
        print(f"clockwork report: {path}: {_no_summary(path.parent)}", file=sys.stderr)
        return 2
    try:
        if not log:
            s = orjson.loads(f.read_bytes())
    except FileNotFoundError:
        from_logs = path.is_dir()
        if not from_logs:
            print(f"clockwork report: {_no_summary(path)}", file=sys.stderr)
            return 2
    except OSError as e:  # (a folder named summary.json, no permission to read it)
        print(f"clockwork report: cannot read {f}: {e.strerror or e}", file=sys.stderr)
        return 2
    except orjson.JSONDecodeError as e:
        hint = (f" (a log file: give its run folder, {str(path.parent)!r})"
                if path.name.startswith(("requests.", "actions.")) else "")
        print(f"clockwork report: {f} is not valid JSON: {e}{hint}", file=sys.stderr)
        return 2
    if from_logs:
        got = _summary_from_logs(path)
        if got is None or isinstance(got, str):
            print(f"clockwork report: {got or _no_summary(path)}", file=sys.stderr)
            return 2
        s, *columns, end = got
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
        from clockwork.telemetry import (
            TIMELINE_COLUMNS,
            check_timeline_interval,
            read_columns,
            timeline_of,
        )

        try:
            check_timeline_interval(args.timeline)  # (before the logs are read)
            if columns is None:  # a summary.json: its duration_s is where the arrivals end
                d = s.get("duration_s")
                end = d if isinstance(d, int | float) and d > 0 else None
                notes: list[str] = []
                columns = read_columns(logs, *TIMELINE_COLUMNS, notes)
                _warn(notes)
            rows = timeline_of(*columns, args.timeline, end)
            logged = len(columns[0]["arrival"])
            if isinstance(s.get("submitted"), int) and s["submitted"] != logged:
                print(f"clockwork report: warning: {logs}'s request log holds "
                      f"{logged:,} requests, its summary counts {s['submitted']:,}: are "
                      "they of one run?", file=sys.stderr)
        except (FileNotFoundError, ValueError) as e:
            point = isinstance(e, FileNotFoundError) and (logs / "point.json").is_file()
            print(f"clockwork report: {e}" + (
                " (a sweep keeps a point's logs only with logs = true in its sweep file)"
                if point else ""), file=sys.stderr)
            return 2
        except OSError as e:  # (a log that is a folder, or that cannot be read)
            print(f"clockwork report: cannot read {e.filename or logs}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 2
    print(table)
    if run.exists() and not log:  # (a pair named: the run.json beside may be another's)
        try:
            r = orjson.loads(run.read_bytes())
            print(f"{'wall time':<40}  {float(r.get('wall_s', 0)):.2f} s")
        except (OSError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            print(f"clockwork report: warning: {run} is not readable run information; "
                  "left out", file=sys.stderr)
    if rows is not None:
        from clockwork.telemetry import format_timeline

        # a live replay's action log is empty (its actions are the controller's, in the
        # controller's --log-dir) while its summary counts them: loads and evicts n/a
        logged = len(columns[1]["type"]) > 0 or not _actions_counted(s)
        if not logged and not s.get("actions_where"):  # (said as the logs were read)
            what = ("the actions the summary counts are" if isinstance(s.get("actions"), dict)
                    else "the run's actions (unknown to its summary) are")
            print(f"clockwork report: {what} not in {logs}'s action log (a live "
                  "replay's are the controller's: its --log-dir): loads and evicts n/a",
                  file=sys.stderr)
        print()
        print(format_timeline(rows, logged))
    return 0
