"""Request and action records, their log files, and the run summary.

Columns follow Clockwork's telemetry. Logs are TSV with a header line; times are
int ns relative to the run's start (latency in ns too), so they load straight
into numpy/pandas.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.requests import Reply

REQUEST_COLUMNS = ("request_id", "model", "arrival", "deadline", "latency", "status",
                   "deadline_met", "cold_start", "batch_size", "gpu")
ACTION_COLUMNS = ("action_id", "type", "status", "worker", "gpu", "model", "batch_size",
                  "sent", "earliest", "latest", "expected_duration", "measured_duration",
                  "expected_completion", "measured_completion", "prediction_error")

_STATUS = {s.value: s.name for s in RequestStatus}


class Telemetry:
    """Collects one row per answered request and per finished action."""

    def __init__(self, origin: int = 0) -> None:
        self.origin = origin
        self.requests: list[tuple] = []
        self.actions: list[tuple] = []
        self._sent: dict[int, Action] = {}
        self._flushed = False  # flush() has started the log files

    # requests ------------------------------------------------------------------------

    def reply(self, rep: Reply) -> None:
        r = rep.request
        o = self.origin
        status = int(rep.status)
        met = status == 0 and rep.time <= r.arrival + r.slo
        self.requests.append((r.id, r.model, r.arrival - o, r.arrival + r.slo - o,
                              rep.time - r.arrival, status, met, r.cold, rep.batch_size, rep.gpu))

    # actions -------------------------------------------------------------------------

    def sent(self, a: Action) -> None:
        self._sent[a.id] = a

    def result(self, res: Result, received: int) -> None:
        a = self._sent.pop(res.id, None)
        if a is None:
            return
        o = self.origin
        measured_end = res.end - o if res.end else received - o
        err = (res.end - a.expected_end) if not res.status and a.type != ActionType.EVICT else 0
        self.actions.append((a.id, a.type.name, res.status.name, a.worker, a.gpu, a.model,
                             a.batch_size, a.sent_at - o, a.earliest - o if a.earliest else 0,
                             a.latest - o if a.latest < (1 << 62) else -1, a.expected_duration,
                             res.duration, a.expected_end - o, measured_end, err))

    def unfinished_actions(self) -> int:
        return len(self._sent)

    # output --------------------------------------------------------------------------

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        _write_tsv(out / "requests.tsv", REQUEST_COLUMNS,
                   ((i, m, a, d, lat, _STATUS.get(s, s), int(met), int(c), b, g)
                    for i, m, a, d, lat, s, met, c, b, g in self.requests))
        _write_tsv(out / "actions.tsv", ACTION_COLUMNS, self.actions)

    def flush(self, out: Path) -> None:
        """Append the rows collected since the last flush to ``out``'s logs and forget
        them (a long-running controller's memory stays flat). The first flush starts the
        files with their headers; ``write`` is the all-at-once form."""
        first = not self._flushed
        if first:
            out.mkdir(parents=True, exist_ok=True)
        self._flushed = True
        _write_tsv(out / "requests.tsv", REQUEST_COLUMNS,
                   ((i, m, a, d, lat, _STATUS.get(s, s), int(met), int(c), b, g)
                    for i, m, a, d, lat, s, met, c, b, g in self.requests), append=not first)
        _write_tsv(out / "actions.tsv", ACTION_COLUMNS, self.actions, append=not first)
        self.requests = []
        self.actions = []

    def summary(self, duration_s: float, extra: dict | None = None) -> dict:
        return summarize(self.requests, self.actions, duration_s, extra)


_ROWS_PER_WRITE = 4096


def _write_tsv(path: Path, columns: tuple, rows, append: bool = False) -> None:
    """Whole rows only: unbuffered, each write call a run of complete lines, so a process
    killed while writing leaves every row it wrote intact (and none half-written)."""
    with path.open("ab" if append else "wb", buffering=0) as f:
        if not append:
            f.write(("\t".join(columns) + "\n").encode())
        buf: list[str] = []
        for row in rows:
            buf.append("\t".join(map(str, row)))
            if len(buf) >= _ROWS_PER_WRITE:
                f.write(("\n".join(buf) + "\n").encode())
                buf = []
        if buf:
            f.write(("\n".join(buf) + "\n").encode())


def _pct(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)) / 1e6, 6) if len(values) else 0.0


def summarize(requests: list[tuple], actions: list[tuple], duration_s: float,
              extra: dict | None = None) -> dict:
    """The run summary (keys listed in docs/contracts.md), from request and action rows.
    Deterministic."""
    n = len(requests)
    if n:
        status = np.fromiter((r[5] for r in requests), dtype=np.int64, count=n)
        met = np.fromiter((r[6] for r in requests), dtype=bool, count=n)
        cold = np.fromiter((r[7] for r in requests), dtype=bool, count=n)
        lat = np.fromiter((r[4] for r in requests), dtype=np.int64, count=n)
    else:
        status = lat = np.zeros(0, dtype=np.int64)
        met = cold = np.zeros(0, dtype=bool)
    ok = status == RequestStatus.SUCCESS
    succeeded = int(ok.sum())
    dropped = int((status == RequestStatus.TIMEOUT).sum())
    invalid = int((status == RequestStatus.INVALID_REQUEST).sum())
    failed = n - succeeded - dropped
    slo_met = int(met.sum())
    lat_ok = lat[ok]
    counts = {"infer": 0, "load": 0, "evict": 0, "rejected": 0}
    exec_err = []
    load_err = []
    for a in actions:
        counts[a[1].lower()] += 1
        if a[2] != ErrorCode.SUCCESS.name:
            counts["rejected"] += 1
        elif a[1] == "INFER":
            exec_err.append(a[14])
        elif a[1] == "LOAD":
            load_err.append(a[14])
    d = duration_s if duration_s > 0 else 1.0
    summary = {
        "submitted": n,
        "succeeded": succeeded,
        "slo_met": slo_met,
        "failed": failed,
        "dropped": dropped,
        "invalid": invalid,
        "goodput_rps": round(slo_met / d, 6),
        "throughput_rps": round(succeeded / d, 6),
        "slo_attainment": round(slo_met / n, 9) if n else 0.0,
        "latency_ms": {
            "p50": _pct(lat_ok, 50), "p90": _pct(lat_ok, 90), "p99": _pct(lat_ok, 99),
            "p999": _pct(lat_ok, 99.9),
            "max": round(float(lat_ok.max()) / 1e6, 6) if len(lat_ok) else 0.0,
        },
        "cold_starts": int(cold.sum()),
        "actions": counts,
        "prediction_error_ms": {
            "exec_p50": _pct(np.abs(np.array(exec_err, dtype=np.int64)), 50),
            "exec_p99": _pct(np.abs(np.array(exec_err, dtype=np.int64)), 99),
            "load_p99": _pct(np.abs(np.array(load_err, dtype=np.int64)), 99),
        },
        "duration_s": duration_s,
    }
    if extra:
        summary.update(extra)
    return summary


def write_run(out: str | Path, telemetry: Telemetry, summary: dict, run: dict) -> Path:
    """A run's files: requests.tsv, actions.tsv, summary.json and run.json in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    telemetry.write(out)
    write_json(out / "summary.json", summary)
    write_json(out / "run.json", run)
    return out


def write_json(path: Path, data: dict) -> None:
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def format_summary(s: dict) -> str:
    """A human-readable table of a summary."""
    lat = s.get("latency_ms", {})
    acts = s.get("actions", {})
    rows = [
        ("requests submitted", f"{s['submitted']:,}"),
        ("  succeeded", f"{s['succeeded']:,}"),
        ("  met SLO", f"{s['slo_met']:,}"),
        ("  dropped (timeout)", f"{s['dropped']:,}"),
        ("  failed", f"{s['failed']:,}"),
        ("SLO attainment", f"{100 * s['slo_attainment']:.4f} %"),
        ("goodput", f"{s['goodput_rps']:,.1f} r/s"),
        ("throughput", f"{s['throughput_rps']:,.1f} r/s"),
        ("latency p50 / p99 / p99.9 / max",
         f"{lat.get('p50', 0):.2f} / {lat.get('p99', 0):.2f} / {lat.get('p999', 0):.2f} / "
         f"{lat.get('max', 0):.2f} ms"),
        ("cold-start requests", f"{s.get('cold_starts', 0):,}"),
        ("actions infer / load / evict / rejected",
         f"{acts.get('infer', 0):,} / {acts.get('load', 0):,} / {acts.get('evict', 0):,} / "
         f"{acts.get('rejected', 0):,}"),
        ("duration", f"{s['duration_s']:.1f} s"),
    ]
    oc = s.get("outputs")
    if oc:
        rows.append(("outputs checked / wrong vs reference",
                     f"{oc['checked']:,} / {oc['wrong']:,} (max |error| {oc['max_abs_err']:.1e}"
                     + (f"; {oc['unchecked']:,} without a reference)" if oc["unchecked"] else ")")))
    pe = s.get("prediction_error_ms")
    if pe:
        rows.append(("EXEC prediction error p50 / p99", f"{pe['exec_p50']:.3f} / {pe['exec_p99']:.3f} ms"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def timeline(run_dir: Path, bucket_s: float = 60.0) -> list[dict]:
    """Per-interval figures of a run directory's logs: arrivals, goodput, SLO
    attainment, cold-start requests, LOADs and EVICTs, by arrival (requests) and
    completion (actions) time."""
    req = np.genfromtxt(run_dir / "requests.tsv", delimiter="\t", names=True, dtype=None,
                        encoding="utf-8", usecols=("arrival", "deadline_met", "cold_start"))
    act = np.genfromtxt(run_dir / "actions.tsv", delimiter="\t", names=True, dtype=None,
                        encoding="utf-8", usecols=("type", "measured_completion"))
    req = np.atleast_1d(req)
    act = np.atleast_1d(act)
    width = int(bucket_s * 1e9)
    rb = (req["arrival"] // width).astype(np.int64) if req.size else np.zeros(0, np.int64)
    ab = (act["measured_completion"] // width).astype(np.int64) if act.size else np.zeros(0, np.int64)
    n = int(max(rb.max(initial=-1), ab.max(initial=-1))) + 1
    out = []
    for i in range(n):
        sel = rb == i
        k = int(sel.sum())
        met = int(req["deadline_met"][sel].sum()) if k else 0
        kinds = act["type"][ab == i] if act.size else np.zeros(0)
        out.append({
            "start_s": round(i * bucket_s, 3),
            "requests": k,
            "goodput_rps": round(met / bucket_s, 3),
            "slo_attainment": round(met / k, 6) if k else 1.0,
            "cold_starts": int(req["cold_start"][sel].sum()) if k else 0,
            "loads": int((kinds == "LOAD").sum()),
            "evicts": int((kinds == "EVICT").sum()),
        })
    return out


def format_timeline(rows: list[dict]) -> str:
    head = f"{'start_s':>9} {'requests':>9} {'goodput r/s':>12} {'SLO %':>9} {'cold':>6} {'loads':>6} {'evicts':>6}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['start_s']:>9.0f} {r['requests']:>9,} {r['goodput_rps']:>12,.1f} "
                     f"{100 * r['slo_attainment']:>9.3f} {r['cold_starts']:>6,} {r['loads']:>6,} "
                     f"{r['evicts']:>6,}")
    return "\n".join(lines)


def emit_run(result, scenario, headline: str, out: str | Path | None = None,
             as_json: bool = False) -> None:
    """Show a finished run (simulated or live) on the command line: optionally write its
    files to ``out``, then print summary.json (``as_json``) or the scenario's name with
    ``headline`` and the SLO table. ``result`` has ``.summary`` and ``.write(dir)``."""
    import sys

    if out:
        written = result.write(out)
        print(f"wrote {written}/summary.json, requests.tsv, actions.tsv, run.json",
              file=sys.stderr)
    if as_json:
        sys.stdout.write(orjson.dumps(result.summary, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    title = scenario.data.get("name") or Path(scenario.source).stem
    print(f"{title}: {headline}")
    print(format_summary(result.summary))
