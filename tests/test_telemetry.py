"""Telemetry's columnar logs: rows as tuples, the summary and the TSV match the row-list
form they replaced (reference implementations below), the npz format round-trips, and
``clockwork report`` / ``clockwork simulate`` / the live controller handle both formats."""

from __future__ import annotations

import errno
import filecmp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orjson
import pytest

from clockwork import telemetry as T
from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.cluster.cli import main
from clockwork.requests import Reply, Request
from clockwork.telemetry import Telemetry, read_logs, summarize, timeline

# ---------------------------------------------------------------- reference (row lists)

_STATUS = {s.value: s.name for s in RequestStatus}


def ref_request_row(rep: Reply, o: int) -> tuple:
    r = rep.request
    status = int(rep.status)
    met = status == 0 and rep.time <= r.arrival + r.slo
    return (r.id, r.model, r.arrival - o, r.arrival + r.slo - o, rep.time - r.arrival, status,
            met, r.cold, rep.batch_size, rep.gpu)


def ref_action_row(a: Action, res: Result, received: int, o: int) -> tuple:
    measured_end = res.end - o if res.end else received - o
    err = (res.end - a.expected_end) if not res.status and a.type != ActionType.EVICT else 0
    return (a.id, a.type.name, res.status.name, a.worker, a.gpu, a.model, a.batch_size,
            a.sent_at - o, a.earliest - o if a.earliest else 0,
            a.latest - o if a.latest < (1 << 62) else -1, a.expected_duration,
            # how long the lane was held: its begin..end, never less than the work alone
            max(res.end - res.begin, res.duration),
            a.expected_end - o, measured_end, err)


def ref_tsv(columns, rows) -> bytes:
    return ("\t".join(columns) + "\n" + "".join("\t".join(map(str, r)) + "\n"
                                                 for r in rows)).encode()


def ref_request_tsv(rows) -> bytes:
    return ref_tsv(T.REQUEST_COLUMNS, ((i, m, a, d, lat, _STATUS.get(s, s), int(met), int(c), b, g)
                                       for i, m, a, d, lat, s, met, c, b, g in rows))


def _pct(values, q):
    return round(float(np.percentile(values, q)) / 1e6, 6) if len(values) else 0.0


def ref_summarize(requests, actions, duration_s):
    n = len(requests)
    status = np.array([r[5] for r in requests], dtype=np.int64)
    lat = np.array([r[4] for r in requests], dtype=np.int64)
    ok = status == 0
    succeeded = int(ok.sum())
    dropped = int((status == RequestStatus.TIMEOUT).sum())
    slo_met = sum(bool(r[6]) for r in requests)
    lat_ok = lat[ok]
    counts = {"infer": 0, "load": 0, "evict": 0, "rejected": 0}
    exec_err, load_err = [], []
    for a in actions:
        counts[a[1].lower()] += 1
        if a[2] != "SUCCESS":
            counts["rejected"] += 1
        elif a[1] == "INFER":
            exec_err.append(a[14])
        elif a[1] == "LOAD":
            load_err.append(a[14])
    d = duration_s
    return {
        "submitted": n, "succeeded": succeeded, "slo_met": slo_met,
        "failed": n - succeeded - dropped, "dropped": dropped,
        "invalid": int((status == RequestStatus.INVALID_REQUEST).sum()),
        "goodput_rps": round(slo_met / d, 6), "throughput_rps": round(succeeded / d, 6),
        "slo_attainment": round(slo_met / n, 9) if n else 0.0,
        "latency_ms": {"p50": _pct(lat_ok, 50), "p90": _pct(lat_ok, 90), "p99": _pct(lat_ok, 99),
                       "p999": _pct(lat_ok, 99.9),
                       "max": round(float(lat_ok.max()) / 1e6, 6) if len(lat_ok) else 0.0},
        "cold_starts": sum(bool(r[7]) for r in requests),
        "actions": counts,
        "prediction_error_ms": {
            "exec_p50": _pct(np.abs(np.array(exec_err, dtype=np.int64)), 50),
            "exec_p99": _pct(np.abs(np.array(exec_err, dtype=np.int64)), 99),
            "load_p99": _pct(np.abs(np.array(load_err, dtype=np.int64)), 99)},
        "duration_s": duration_s,
    }


# ---------------------------------------------------------------- a made-up run


def fill(tel: Telemetry, n: int, seed: int = 1, o: int = 0) -> tuple[list, list]:
    """``n`` replies and about n/3 actions of every kind and status into ``tel``; the
    reference rows."""
    rng = np.random.default_rng(seed)
    models = ["resnet50_v2", "resnet50_v2:1", "mobilenet_v2", "bert:7"]
    statuses = [RequestStatus.SUCCESS] * 6 + [RequestStatus.TIMEOUT, RequestStatus.ERROR,
                                              RequestStatus.INVALID_REQUEST]
    errors = [ErrorCode.SUCCESS] * 5 + [ErrorCode.EXEC_TOO_LATE, ErrorCode.LOAD_TOO_LATE,
                                        ErrorCode.WEIGHTS_NOT_PRESENT]
    reqs, acts = [], []
    t = o
    for i in range(n):
        t += int(rng.integers(0, 3_000_000))
        r = Request(i, models[int(rng.integers(len(models)))], t, int(rng.integers(1, 10**8)))
        r.cold = bool(rng.random() < 0.1)
        rep = Reply(r, statuses[int(rng.integers(len(statuses)))],
                    t + int(rng.integers(1, 2 * 10**8)), gpu=int(rng.integers(-1, 400)),
                    batch_size=int(rng.integers(0, 17)))
        tel.reply(rep)
        reqs.append(ref_request_row(rep, o))
        if i % 3 == 0:
            kind = ActionType(int(rng.integers(3)))
            dur = int(rng.integers(10**6))
            a = Action(id=i, type=kind, worker=int(rng.integers(100)), gpu=int(rng.integers(4)),
                       model=models[int(rng.integers(len(models)))],
                       earliest=t + 10 if rng.random() < 0.5 else 0,
                       latest=t + 10**7 if rng.random() < 0.5 else (1 << 63) - 1,
                       expected_duration=dur, expected_end=t + dur, sent_at=t,
                       batch_size=int(rng.integers(1, 17)) if kind == ActionType.INFER else 0)
            tel.sent(a)
            status = errors[int(rng.integers(len(errors)))]
            end = a.expected_end + int(rng.integers(-10**5, 10**5)) if rng.random() < 0.9 else 0
            res = Result(id=i, type=kind, status=status, worker=a.worker, gpu=a.gpu, model=a.model,
                         begin=end - int(rng.integers(2 * 10**6)) if end else 0, end=end,
                         duration=int(rng.integers(10**6)))
            tel.result(res, t + 5)
            acts.append(ref_action_row(a, res, t + 5, o))
    return reqs, acts


N = T._BUF_ROWS * 3 + T._CHUNK_ROWS // 2 + 17  # crosses buffer drains and chunk growth


@pytest.fixture(scope="module")
def run():
    tel = Telemetry(origin=1000)
    reqs, acts = fill(tel, N, o=1000)
    return tel, reqs, acts


def test_rows_as_tuples_are_the_row_lists(run):
    tel, reqs, acts = run
    assert tel.requests == reqs
    assert tel.actions == acts
    assert [type(x) for x in tel.requests[0]] == [type(x) for x in reqs[0]]
    cols = tel.request_columns()
    assert cols["status"].dtype == np.int8 and cols["arrival"].dtype == np.int64
    assert [tel.models[c] for c in cols["model"][:50]] == [r[1] for r in reqs[:50]]


def test_summary_is_the_row_lists_summary(run):
    tel, reqs, acts = run
    ref = ref_summarize(reqs, acts, 12.5)
    got = tel.summary(12.5)
    assert orjson.dumps(got) == orjson.dumps(ref)  # same keys, order, values and types
    assert orjson.dumps(summarize(reqs, acts, 12.5)) == orjson.dumps(ref)
    empty = Telemetry()
    assert orjson.dumps(empty.summary(1.0)) == orjson.dumps(ref_summarize([], [], 1.0))


def test_tsv_is_the_row_lists_tsv(run, tmp_path):
    tel, reqs, acts = run
    tel.write(tmp_path)
    assert (tmp_path / "requests.tsv").read_bytes() == ref_request_tsv(reqs)
    assert (tmp_path / "actions.tsv").read_bytes() == ref_tsv(T.ACTION_COLUMNS, acts)


def test_npz_round_trips_and_reads_back_as_the_same_tsv(run, tmp_path):
    tel, reqs, acts = run
    tel.write(tmp_path / "tsv")
    tel.write(tmp_path / "npz", "npz")
    assert sorted(os.listdir(tmp_path / "npz")) == ["actions.npz", "requests.npz"]
    with np.load(tmp_path / "npz" / "requests.npz") as z:
        assert set(T.REQUEST_COLUMNS) <= set(z.files)
        assert z["model"].dtype == np.int32 and z["deadline_met"].dtype == bool
        assert [str(z["model_names"][c]) for c in z["model"][:20]] == [r[1] for r in reqs[:20]]
        assert dict(zip(z["status_codes"].tolist(), z["status_names"].tolist(), strict=True)) \
            == _STATUS
    back = read_logs(tmp_path / "npz")
    assert back.log_format == "npz"
    assert back.requests == reqs and back.actions == acts
    back.write(tmp_path / "again", "tsv")
    for name in ("requests.tsv", "actions.tsv"):
        assert filecmp.cmp(tmp_path / "again" / name, tmp_path / "tsv" / name, shallow=False)
    tsv = read_logs(tmp_path / "tsv")
    assert tsv.log_format == "tsv" and tsv.requests == reqs and tsv.actions == acts
    assert timeline(tmp_path / "npz", 2.0) == timeline(tmp_path / "tsv", 2.0)
    assert orjson.dumps(back.summary(3.0)) == orjson.dumps(tel.summary(3.0))


def test_writing_one_format_removes_the_others_files(run, tmp_path):
    tel, _, _ = run
    tel.write(tmp_path, "tsv")
    tel.write(tmp_path, "npz")
    assert sorted(os.listdir(tmp_path)) == ["actions.npz", "requests.npz"]
    tel.write(tmp_path, "tsv")
    assert sorted(os.listdir(tmp_path)) == ["actions.tsv", "requests.tsv"]


def test_empty_logs_in_both_formats(tmp_path):
    tel = Telemetry()
    for fmt in ("tsv", "npz"):
        tel.write(tmp_path / fmt, fmt)
        back = read_logs(tmp_path / fmt)
        assert back.requests == [] and back.actions == []
        assert timeline(tmp_path / fmt, 1.0) == []
    assert (tmp_path / "tsv" / "requests.tsv").read_text() == "\t".join(T.REQUEST_COLUMNS) + "\n"


def test_tsv_flush_appends_whole_lines_and_forgets(tmp_path):
    tel = Telemetry(0)
    ref = Telemetry(0)
    rows = []
    for part in range(3):
        got, _ = fill(tel, 2 * T._BUF_ROWS + part, seed=part)
        fill(ref, 2 * T._BUF_ROWS + part, seed=part)
        rows += got
        tel.flush(tmp_path)
        assert tel.requests == [] and tel.actions == []
    assert (tmp_path / "requests.tsv").read_bytes() == ref_request_tsv(rows)
    ref.write(tmp_path / "all")
    assert filecmp.cmp(tmp_path / "actions.tsv", tmp_path / "all" / "actions.tsv", shallow=False)


def test_tsv_flush_in_steps_writes_what_flush_writes(tmp_path):
    """The controller's periodic flush runs in steps (the event loop serves others between
    them): the rows are taken at the first step, each step writes at most its share, rows
    that come in meanwhile go to the next flush, and the files are what ``flush`` and
    ``write`` make of the same rows."""
    tel = Telemetry(0)
    ref = Telemetry(0)
    first, _ = fill(tel, 250, seed=1)
    fill(ref, 250, seed=1)
    steps = tel.flush_steps(tmp_path, rows_per_step=100)
    next(steps)  # the rows are taken: the first 100 requests are in the file
    assert tel.requests == [] and tel.actions == []
    assert (tmp_path / "requests.tsv").read_bytes() == ref_request_tsv(first[:100])
    later, _ = fill(tel, 120, seed=2)  # arrives while the steps go on
    fill(ref, 120, seed=2)
    n_acts = len(ref.actions) - len(tel.actions)  # the first fill's actions
    assert 1 + sum(1 for _ in steps) == 3 + -(-n_acts // 100)  # 250 requests: 3 steps
    assert (tmp_path / "requests.tsv").read_bytes() == ref_request_tsv(first)
    assert len(tel.requests) == 120
    tel.flush(tmp_path)
    assert (tmp_path / "requests.tsv").read_bytes() == ref_request_tsv(first + later)
    ref.write(tmp_path / "all")
    assert filecmp.cmp(tmp_path / "actions.tsv", tmp_path / "all" / "actions.tsv", shallow=False)


def test_tsv_flushes_keep_no_name_table_of_every_model_ever_logged(tmp_path):
    """A long-running controller's TSV logs: each flush starts the model-name table anew
    (it kept, and copied at every flush, every name ever logged: ~250 bytes a name and
    milliseconds of a held event loop per flush after 10^5 models loaded and unloaded);
    the files still name every row's model."""
    from clockwork.telemetry import read_logs

    tel = Telemetry(0)
    names = []
    for i in range(3):  # three flushes, each of models of its own, and one they share
        batch = [f"model-{i}-{j}" for j in range(200)] + ["shared"]
        for j, m in enumerate(batch):
            r = Request(i * 1000 + j, m, i * 10**9 + j, 10**8)
            tel.reply(Reply(r, RequestStatus.SUCCESS, i * 10**9 + j + 5))
        names += batch
        tel.flush(tmp_path)
        assert tel.models == [], len(tel.models)
    assert [row[1] for row in read_logs(tmp_path).requests] == names


def test_npz_flush_writes_only_at_the_end(tmp_path):
    tel = Telemetry(0, "npz")
    reqs, acts = fill(tel, 100)
    tel.flush(tmp_path)
    assert not tmp_path.exists() or not os.listdir(tmp_path)
    more, more_acts = fill(tel, 50, seed=2)
    tel.flush(tmp_path, final=True)
    assert sorted(os.listdir(tmp_path)) == ["actions.npz", "requests.npz"]
    back = read_logs(tmp_path)
    assert back.requests == reqs + more and back.actions == acts + more_acts


def test_rows_can_be_set_from_tuples_with_names():
    """(experiments/common.py replaces the action log with rows read from a TSV.)"""
    tel = Telemetry()
    _, acts = fill(tel, 300)
    other = Telemetry()
    other.actions = acts
    assert other.actions == acts
    assert other.action_columns()["type"].tolist() == tel.action_columns()["type"].tolist()


def test_read_logs_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no requests.tsv or requests.npz"):
        read_logs(tmp_path)
    (tmp_path / "requests.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match="not a log file"):
        read_logs(tmp_path)
    with pytest.raises(ValueError, match="log format"):
        Telemetry(0, "csv")


# scenarios/faults.toml's faults moved into a run of a few seconds (a fault at or after
# duration_s is refused)
EARLY = ["--set", "faults.kill=[{worker=1, at_s=1.0, back_s=2.5}]",
         "--set", "faults.hang=[{worker=0, at_s=3.0, for_s=0.5}]"]


def test_simulate_npz_and_report(tmp_path, capsys):
    runs = {}
    for fmt in ("tsv", "npz"):
        out = tmp_path / fmt
        assert main(["simulate", "scenarios/faults.toml", "--set", "duration_s=4", *EARLY,
                     "--out", str(out), "--quiet", "--log-format", fmt]) == 0
        capsys.readouterr()
        assert {p.name for p in out.iterdir()} == {"summary.json", "run.json",
                                                   f"requests.{fmt}", f"actions.{fmt}"}
        assert main(["report", str(out), "--timeline", "0.5"]) == 0
        runs[fmt] = capsys.readouterr().out
    assert (tmp_path / "tsv" / "summary.json").read_bytes() == \
        (tmp_path / "npz" / "summary.json").read_bytes()
    strip = lambda text: [x for x in text.splitlines() if not x.startswith("wall time")]  # noqa: E731
    assert strip(runs["tsv"]) == strip(runs["npz"])
    assert len(strip(runs["npz"])) > 15
    back = read_logs(tmp_path / "npz")
    assert len(back.requests) == orjson.loads((tmp_path / "npz" / "summary.json").read_bytes())[
        "submitted"]
    whole = (tmp_path / "npz" / "requests.npz").read_bytes()
    for cut in (whole[:3000], b""):  # a truncated or an empty file: one line, exit 2
        (tmp_path / "npz" / "requests.npz").write_bytes(cut)
        assert main(["report", str(tmp_path / "npz"), "--timeline", "0.5"]) == 2
        err = capsys.readouterr().err
        assert "requests.npz: not a log file" in err and "Traceback" not in err, err
    (tmp_path / "npz" / "requests.npz").unlink()
    assert main(["report", str(tmp_path / "npz"), "--timeline"]) == 2
    assert "no requests.tsv or requests.npz" in capsys.readouterr().err


def test_live_controller_writes_npz_at_stop(tmp_path):
    """--log-format npz: during the run the rows wait in column files in a folder inside
    the log folder (not in memory), put there at each --log-flush-s (they waited in
    memory until 4,096 had come, and a crash lost them); requests.npz/actions.npz at
    SIGTERM, and the folder goes."""
    import clockwork
    from tests.conftest import local_cluster

    logs = tmp_path / "logs"
    with local_cluster(workers=1, gpus=1, models="mobilenet_v2", http_port=-1,
                       controller_args=["--log-dir", str(logs), "--log-format", "npz",
                                        "--log-flush-s", "0.1"]) as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(6):
                assert cl.infer("mobilenet_v2", slo_ms=500).status == 0
        (rows,) = os.listdir(logs)
        assert rows.startswith("clockwork-rows-")
        assert {p.name for p in (logs / rows).iterdir()} >= {"requests.latency", "actions.type"}
        latency = logs / rows / "requests.latency"  # int64: 8 bytes a row
        deadline = time.monotonic() + 10  # (a flush every 0.1 s)
        while latency.stat().st_size < 6 * 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert latency.stat().st_size == 6 * 8
        c.controller.stop(timeout=30.0)
    assert sorted(os.listdir(logs)) == ["actions.npz", "requests.npz"]
    tel = read_logs(logs)
    assert [r[1] for r in tel.requests] == ["mobilenet_v2"] * 6
    assert all(r[5] == 0 and r[6] for r in tel.requests)
    kinds = {a[1] for a in tel.actions}
    assert {"LOAD", "INFER"} <= kinds


def test_bench_logs_smoke(tmp_path, capsys):
    """experiments/bench_logs.py end to end at a tiny size (its figures are not checked)."""
    from experiments import bench_logs

    res = bench_logs.main(["--repeat", "1", "--gpus", "2", "--per-gpu", "2", "--duration", "0.3",
                           "--json", str(tmp_path / "b.json")])
    assert res["summaries_identical"] and res["requests"] > 100
    m = res["modes"]
    assert m["none"]["log_bytes"] == 0 < m["npz"]["log_bytes"] < m["tsv"]["log_bytes"]
    assert orjson.loads((tmp_path / "b.json").read_bytes())["modes"].keys() == {"none", "tsv", "npz"}


# ------------------------------------------------------------------ rows kept in files

def test_spilled_rows_are_the_same_rows_and_stay_out_of_memory(run, tmp_path):
    """``spill_dir``: the same rows, summary and log files as in memory; the columns are
    read-only maps of files and no chunk is held in memory."""
    tel, reqs, acts = run
    sp = Telemetry(origin=1000, spill_dir=tmp_path / "spill")
    fill(sp, N, o=1000)
    assert sp._req._chunks == [] and sp._act._chunks == []
    assert len(sp._req.buf) < sp._req.limit  # at most one buffer's rows in memory
    cols = sp.request_columns()
    assert all(isinstance(c, np.memmap) and not c.flags.writeable for c in cols.values())
    assert sp.requests == reqs and sp.actions == acts
    assert orjson.dumps(sp.summary(12.5)) == orjson.dumps(tel.summary(12.5))
    files = {p.name for p in sp.spill_folder.iterdir()}
    assert files == {f"requests.{c}" for c in T.REQUEST_COLUMNS} | {
        f"actions.{c}" for c in T.ACTION_COLUMNS} | {"model_names"}
    # the codes named as they came, for a folder a crash leaves behind
    assert (sp.spill_folder / "model_names").read_text().splitlines() == [
        str(m) for m in sp.models]
    assert (sp.spill_folder / "requests.latency").stat().st_size == 8 * N
    for fmt in ("tsv", "npz"):
        tel.write(tmp_path / f"mem-{fmt}", fmt)
        sp.write(tmp_path / f"spill-{fmt}", fmt)
        for name in ("requests", "actions"):
            assert (tmp_path / f"mem-{fmt}" / f"{name}.{fmt}").read_bytes() == \
                (tmp_path / f"spill-{fmt}" / f"{name}.{fmt}").read_bytes()


def test_the_rows_left_in_a_spill_folder_read_back(run, tmp_path):
    """``read_rows``: the rows a spilling Telemetry left in its folder (a controller killed
    before it wrote its npz logs) read back as they were; ``read_logs`` of the folder
    around it finds them. Columns a kill left of different lengths are read to the
    shortest (a note says so); a value no writer writes is refused."""
    tel, reqs, acts = run
    sp = Telemetry(origin=1000, spill_dir=tmp_path / "logs")
    fill(sp, N, o=1000)
    sp._req.drain(), sp._act.drain()  # (what a controller's flush does)
    back = T.read_logs(tmp_path / "logs")
    assert back.requests == reqs and back.actions == acts and back.notes == []
    with (sp.spill_folder / "requests.status").open("ab") as f:
        f.write(b"\x00")  # a row more in one column, half a row in another
    with (sp.spill_folder / "actions.gpu").open("ab") as f:
        f.write(b"\x00\x00")
    back = T.read_rows(sp.spill_folder)
    assert back.requests == reqs and back.actions == acts
    assert len(back.notes) == 2 and f"the {N:,} rows all of them hold" in back.notes[0]
    (sp.spill_folder / "requests.cold_start").write_bytes(b"\x02" * N)
    with pytest.raises(ValueError, match="requests.cold_start: column 'cold_start': 2 is not"):
        T.read_rows(sp.spill_folder)
    sp.close()
    with pytest.raises(FileNotFoundError):
        T.read_logs(tmp_path / "logs")


def test_spilled_columns_handed_out_survive_clear_and_the_folder_goes(tmp_path):
    sp = Telemetry(spill_dir=tmp_path)
    fill(sp, 3 * T._BUF_ROWS)
    before = sp.request_columns()["request_id"]
    want = before.copy()
    folder = sp.spill_folder
    sp._req.clear()  # (as a TSV flush does): new files, the map keeps the old rows
    fill(sp, 10)
    assert len(sp.request_columns()["request_id"]) == 10
    assert np.array_equal(before, want)
    sp.requests = [(7, "m", 1, 2, 3, int(RequestStatus.SUCCESS), True, False, 1, 0)]
    assert sp.requests == [(7, "m", 1, 2, 3, 0, True, False, 1, 0)]
    del sp
    assert not folder.exists()  # removed with the object
    assert np.array_equal(before, want)  # (unlinked, still mapped)


def test_a_ctrl_c_as_the_spill_folder_is_made_leaves_no_folder(tmp_path, monkeypatch):
    """A stop (Ctrl-C, SIGTERM, SIGHUP) landing just as the rows' folder was made left it
    behind: the folder was named only once made, so nothing held it to remove."""
    made = os.mkdir

    def mkdir_then_stopped(path, *a, **k):
        made(path, *a, **k)
        if os.path.basename(path).startswith(T.ROWS_PREFIX):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", mkdir_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        Telemetry(spill_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_spilled_log_pickles_with_its_rows_in_memory(run, tmp_path):
    """A Telemetry spilling to files pickles (a SimResult returned from a multiprocessing
    pool: it raised "cannot pickle '_io.FileIO' object"): the copy holds the same rows in
    memory and owns no folder, takes more rows, and outlives the original's folder."""
    import pickle

    tel, reqs, acts = run
    sp = Telemetry(origin=1000, spill_dir=tmp_path / "spill")
    fill(sp, N, o=1000)
    copy = pickle.loads(pickle.dumps(sp))
    assert copy.spill_folder is None and copy._req._chunks  # in memory
    assert copy.requests == reqs and copy.actions == acts
    folder = sp.spill_folder
    del sp
    assert not folder.exists()  # the original's, removed with it
    fill(copy, 10, o=1000)  # more rows reach its columns
    assert len(copy.requests) == len(reqs) + 10 and copy.requests[:len(reqs)] == reqs
    assert orjson.dumps(pickle.loads(pickle.dumps(tel)).summary(12.5)) == orjson.dumps(
        tel.summary(12.5))  # (one in memory pickles as before)


def test_simulate_with_spill_dir_writes_the_same_files(tmp_path, capsys):
    outs = {}
    for mode, extra in (("memory", []), ("files", ["--spill-dir", str(tmp_path / "sp")])):
        out = outs[mode] = tmp_path / mode
        assert main(["simulate", "scenarios/faults.toml", "--set", "duration_s=6", *EARLY,
                     "--out", str(out), "--quiet", "--log-format", "npz", *extra]) == 0
    capsys.readouterr()
    for name in ("summary.json", "requests.npz", "actions.npz"):
        assert (outs["memory"] / name).read_bytes() == (outs["files"] / name).read_bytes(), name
    assert list((tmp_path / "sp").iterdir()) == []  # the run's folder is gone
    (tmp_path / "f").write_text("")
    assert main(["simulate", "scenarios/faults.toml", "--spill-dir", str(tmp_path / "f"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clockwork simulate: ") and "Traceback" not in err


FULL_DISK = """
import resource, sys
import orjson
from clockwork.telemetry import Telemetry
from tests.test_telemetry import N, fill
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))  # a full disk
mem = Telemetry(origin=1000)
reqs, acts = fill(mem, N, o=1000)
sp = Telemetry(origin=1000, spill_dir=sys.argv[1])
fill(sp, N, o=1000)
ok = (sp.requests == reqs and sp.actions == acts
      and orjson.dumps(sp.summary(3.0)) == orjson.dumps(mem.summary(3.0)))
size = (sp.spill_folder / "requests.latency").stat().st_size
print(ok, sp._req._on_disk + sp._req._rows == N, size, repr(sp.spill_error))
"""


def test_a_full_disk_keeps_the_rest_of_the_rows_in_memory(tmp_path):
    """Column files that cannot grow (a real EFBIG: the file size limit of the process):
    the rows already in them stay, the rest go to memory, none is lost."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True,
                       text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    ok, all_rows, size, err = r.stdout.split(" ", 3)
    assert ok == "True" and all_rows == "True"
    assert "File too large" in err or "short write" in err, err
    assert 0 < int(size) <= 100_000 < 8 * N  # part of the rows did go to the file
    assert list(tmp_path.iterdir()) == []  # and the folder went at exit


FULL_DISK_THEN_GONE = FULL_DISK.replace(
    "ok = (sp.requests", "import shutil\nshutil.rmtree(sp.spill_folder)\nok = (sp.requests"
).replace("size = (sp.spill_folder / \"requests.latency\").stat().st_size", "size = 1")


def test_rows_on_a_full_disk_are_kept_when_their_folder_is_removed(tmp_path):
    """Column files that stopped growing (a full disk), then their folder removed (by
    hand, a clean-up job) before the rows are read: none is lost. They were read again
    by name (FileNotFoundError: at a controller's stop, 'not written', every row lost)."""
    import subprocess
    import sys

    assert "rmtree" in FULL_DISK_THEN_GONE and "size = 1" in FULL_DISK_THEN_GONE
    r = subprocess.run([sys.executable, "-c", FULL_DISK_THEN_GONE, str(tmp_path)],
                       capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    ok, all_rows, _, err = r.stdout.split(" ", 3)
    assert ok == "True" and all_rows == "True"
    assert "File too large" in err or "short write" in err, err


def _timeline_reference(run_dir, bucket_s):
    """The per-interval figures counted interval by interval (the definition)."""
    tel = read_logs(run_dir)
    req, act = tel.request_columns(), tel.action_columns()
    width = int(bucket_s * 1e9)
    rb, ab = req["arrival"] // width, act["measured_completion"] // width
    n = int(max(rb.max(initial=-1), ab.max(initial=-1))) + 1
    out = []
    for i in range(n):
        sel = rb == i
        k = int(sel.sum())
        met = int(req["deadline_met"][sel].sum())
        kinds = act["type"][ab == i]
        out.append({"start_s": round(i * bucket_s, 3), "requests": k,
                    "goodput_rps": round(met / bucket_s, 3), "slo_met": met,
                    "slo_attainment": round(met / k, 6) if k else 1.0,
                    "cold_starts": int(req["cold_start"][sel].sum()),
                    "loads": int((kinds == ActionType.LOAD).sum()),
                    "evicts": int((kinds == ActionType.EVICT).sum())})
    return out


def test_timeline_counts_as_defined_reading_only_its_columns(tmp_path, capsys):
    for fmt in ("tsv", "npz"):
        assert main(["simulate", "azure_sample", "--set", "duration_s=8", "--out",
                     str(tmp_path / fmt), "--quiet", "--log-format", fmt]) == 0
    capsys.readouterr()
    for bucket in (0.25, 1.0, 3.0):
        want = _timeline_reference(tmp_path / "tsv", bucket)
        assert sum(r["loads"] for r in want) > 0 and sum(r["cold_starts"] for r in want) > 0
        assert timeline(tmp_path / "tsv", bucket) == want
        assert timeline(tmp_path / "npz", bucket) == want
    # with the run's duration (8 s), the 3 s interval from 6 s has 2 s of arrivals: its
    # goodput is over those 2 s, the others' as before
    full, cut = timeline(tmp_path / "npz", 3.0), timeline(tmp_path / "npz", 3.0, 8.0)
    met_last = round(full[2]["goodput_rps"] * 3.0)
    assert cut[:2] == full[:2] and cut[2]["goodput_rps"] == round(met_last / 2.0, 3)
    assert met_last > 0 and cut[3:] == full[3:]
    # a run that goes on after its last arrival and answer (a workload that stops
    # early): the intervals up to the end are there, empty (the rows stopped at the last
    # arrival or answer, whatever duration_s said)
    last = len(full)
    longer = timeline(tmp_path / "npz", 3.0, 3.0 * last + 7.0)
    assert longer[:last] == full[:last] and len(longer) == last + 3
    assert all(r["requests"] == r["loads"] == r["evicts"] == r["goodput_rps"] == 0
               and r["start_s"] == 3.0 * (last + i) for i, r in enumerate(longer[last:]))
    req, act = T.read_columns(tmp_path / "npz", ("latency",), ())
    assert list(req) == ["latency"] and act == {} and len(req["latency"]) > 100
    with pytest.raises(ValueError, match="unknown requests column"):
        T.read_columns(tmp_path / "npz", ("nope",), ())


def test_tsv_read_in_parts_is_the_same_rows(run, tmp_path, monkeypatch):
    """A TSV log read back a few hundred lines at a time (as a long log is): the same rows
    and summary as written."""
    tel, reqs, acts = run
    tel.write(tmp_path, "tsv")
    monkeypatch.setattr(T, "_TSV_READ_ROWS", 100)  # ~6 KB of lines per part: ~90 parts
    back = read_logs(tmp_path)
    assert back.requests == reqs and back.actions == acts
    assert orjson.dumps(back.summary(12.5)) == orjson.dumps(tel.summary(12.5))


def test_simulate_stopped_by_sigterm_removes_its_spill_folder(tmp_path):
    """SIGTERM mid-run ends ``clockwork simulate`` as Ctrl-C does: exit 130 and the
    --spill-dir folder gone (the process was killed, leaving it behind)."""
    from tests.conftest import sigterm_once_made

    # (its folder is made when the run starts)
    rc, err = sigterm_once_made(["simulate", "fig5_1gpu", "--set", "duration_s=600",
                                 "--spill-dir", str(tmp_path), "--quiet"], tmp_path,
                                end_s=30)
    assert rc == 130 and "interrupted" in err, (rc, err)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_as_the_spill_folder_is_made_leaves_no_folder(tmp_path):
    """SIGTERM right after --spill-dir's folder is made, before the run starts: exit 130
    and the folder gone (SIGTERM's handler came only with the run, so the process was
    killed then and left the folder)."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from clockwork import telemetry\n"
        "real = telemetry.ColumnLog.__init__\n"
        "def init(self, *a, **k):  # (its folder exists by now)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    real(self, *a, **k)\n"
        "telemetry.ColumnLog.__init__ = init\n"
        "from clockwork.cluster.cli import main\n"
        "sys.exit(main(['simulate', 'fig5_1gpu', '--set', 'duration_s=1', '--quiet',\n"
        "               '--spill-dir', sys.argv[1]]))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 130 and "interrupted" in p.stderr, (p.returncode, p.stderr)
    assert list(tmp_path.iterdir()) == []


def test_a_second_controller_keeps_the_first_ones_tsv_logs(tmp_path):
    """A controller restarted with the same --log-dir: its first flush moves the earlier
    logs aside (requests.1.tsv, then .2, ...) instead of writing over them."""
    runs = []
    for seed in (1, 2, 3):
        tel = Telemetry(0, "tsv")
        reqs, acts = fill(tel, 40, seed=seed)
        tel.flush(tmp_path)
        runs.append((reqs, acts))
    assert sorted(os.listdir(tmp_path)) == ["actions.1.tsv", "actions.2.tsv", "actions.tsv",
                                            "requests.1.tsv", "requests.2.tsv", "requests.tsv"]
    back = read_logs(tmp_path)
    assert (back.requests, back.actions) == runs[2]
    first = (tmp_path / "requests.1.tsv").read_text()
    (tmp_path / "requests.tsv").write_text(first)
    assert read_logs(tmp_path).requests == runs[0][0]


def test_a_failed_log_write_leaves_whole_rows(tmp_path):
    """A write that fails part-way (a full disk) is taken back: the file ends with the
    last whole row it had, and the error is raised (the controller logs it, drops that
    flush's rows and tries again at the next)."""
    import errno

    from clockwork.telemetry import _write_all

    path = tmp_path / "requests.tsv"
    path.write_bytes(b"a\tb\n1\t2\n")

    class Disk:  # an unbuffered file that takes 5 bytes a call, and fills up after 12
        def __init__(self, f):
            self.f, self.taken = f, 0

        def write(self, b):
            if self.taken >= 12:
                raise OSError(errno.ENOSPC, "No space left on device")
            n = self.f.write(bytes(b[:5]))
            self.taken += n
            return n

        def tell(self):
            return self.f.tell()

        def truncate(self, n):
            return self.f.truncate(n)

    with path.open("ab", buffering=0) as f:
        _write_all(Disk(f), b"3\t4\n")  # short writes: all of it all the same
        with pytest.raises(OSError, match="No space"):
            _write_all(Disk(f), b"5\t6\n7\t8\n9\t10\n11\t12\n")
    assert path.read_bytes() == b"a\tb\n1\t2\n3\t4\n"


def test_report_reads_a_controllers_log_dir_without_a_summary(tmp_path, capsys):
    """``clockwork report`` on what ``clockwork controller --log-dir`` leaves (logs, no
    summary.json): the figures computed from the logs, said so in a note."""
    from clockwork.telemetry import summary_of

    tel = Telemetry(0, "tsv")
    fill(tel, 200)
    tel.flush(tmp_path)
    assert main(["report", str(tmp_path), "--timeline", "1"]) == 0
    out = capsys.readouterr()
    assert "figures computed from its logs" in out.err
    tel_back = read_logs(tmp_path)
    req = tel_back.request_columns()
    span = int((req["arrival"] + req["latency"]).max() - req["arrival"].min())
    s = summary_of(req, tel_back.action_columns(), round(span / 1e9, 6))
    assert f"{s['submitted']:,}" in out.out and "start_s" in out.out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "no summary.json" in capsys.readouterr().err


# A controller's log folder (no summary.json) whose first arrival is 2.1 s after the logs'
# time 0 (an idle controller before the load came): five requests, the last answered at
# 4.2 s; a LOAD, an INFER and an EVICT.
_REQ_ROWS = [  # (arrival ns, latency ns, deadline_met, cold_start)
    (2_100_000_000, 50_000_000, 1, 1), (2_500_000_000, 60_000_000, 1, 0),
    (2_900_000_000, 70_000_000, 1, 0), (3_200_000_000, 300_000_000, 0, 0),
    (4_000_000_000, 200_000_000, 1, 0)]
_ACT_ROWS = [("LOAD", 2_000_000_000, 2_050_000_000), ("INFER", 2_100_000_000, 2_200_000_000),
             ("EVICT", 3_500_000_000, 3_600_000_000)]  # (type, sent, measured completion)


def _controller_logs(path, actions=True):
    path.mkdir()
    lines = ["\t".join(T.REQUEST_COLUMNS)]
    for i, (t, lat, met, cold) in enumerate(_REQ_ROWS):
        lines.append(f"{i + 1}\tm\t{t}\t{t + 100_000_000}\t{lat}\tSUCCESS\t{met}\t{cold}\t1\t0")
    (path / "requests.tsv").write_text("\n".join(lines) + "\n")
    lines = ["\t".join(T.ACTION_COLUMNS)]
    for i, (kind, sent, done) in enumerate(_ACT_ROWS if actions else []):
        d = done - sent
        lines.append(f"{i + 1}\t{kind}\tSUCCESS\t0\t0\tm\t{int(kind == 'INFER')}\t{sent}\t"
                     f"{sent}\t-1\t{d}\t{d}\t{done}\t{done}\t0")
    (path / "actions.tsv").write_text("\n".join(lines) + "\n")


def _timeline_rows(text):
    return [line.split() for line in text.split("start_s")[1].splitlines()[1:]]


def test_report_timeline_rates_are_over_each_intervals_length(tmp_path, capsys):
    """Intervals of 1.5 s from the logs' time 0: [1.5, 3) holds 3 met requests, 2.0 r/s
    over its 1.5 s; [3, 4.5) holds 1 met of 2, and the run ends at the last answer (4.2
    s): 1 / 1.2 s. (The span from the first arrival to the last answer, 2.1 s, was taken
    as the end: 3 / 0.6 s = 5.0 r/s and 1 / 1.5 s.) With a summary.json, its duration_s
    is the end. An interval without requests: SLO % n/a, not 100 %."""
    from clockwork.telemetry import summary_of, timeline_of

    logs = tmp_path / "logs"
    _controller_logs(logs)
    assert main(["report", str(logs), "--timeline", "1.5"]) == 0
    got = capsys.readouterr()
    assert "over 2.1 s from the first arrival to the last answer" in got.err
    assert _timeline_rows(got.out) == [
        ["0.000", "0", "0.0", "n/a", "0", "0", "0"],
        ["1.500", "3", "2.0", "100.000", "1", "1", "0"],
        ["3.000", "2", "0.8", "50.000", "0", "0", "1"]]
    tel = read_logs(logs)
    req, act = tel.request_columns(), tel.action_columns()
    rows = timeline_of(req, act, 1.5, 4.2)
    assert [r["goodput_rps"] for r in rows] == [0.0, 2.0, round(1 / 1.2, 3)]
    assert [r["slo_attainment"] for r in rows] == [1.0, 1.0, 0.5]  # (the data: 1.0)
    # the same logs with a summary.json whose arrivals end at 4.1 s: 1 / 1.1 s
    write = tmp_path / "run"
    _controller_logs(write)
    T.write_json(write / "summary.json", summary_of(req, act, 4.1))
    assert main(["report", str(write), "--timeline", "1.5"]) == 0
    got = capsys.readouterr()
    assert [r[2] for r in _timeline_rows(got.out)] == ["0.0", "2.0", "0.9"]
    # 1 s intervals: [4, 5) is cut at 4.2 s (1 / 0.2 s), the others whole
    assert main(["report", str(logs), "--timeline", "1"]) == 0
    assert [r[2] for r in _timeline_rows(capsys.readouterr().out)] == \
        ["0.0", "0.0", "3.0", "0.0", "5.0"]


def test_timeline_slo_percent_is_rounded_once():
    """An interval's SLO % is printed from its counts: 1,441 met of 9,070 is 15.8875...%,
    15.888 (the attainment rounded to 0.158875 first printed as 15.887)."""
    from clockwork.telemetry import format_timeline, timeline_of

    k, met = 9070, 1441
    req = {"arrival": np.zeros(k, np.int64), "deadline_met": np.arange(k) < met,
           "cold_start": np.zeros(k, bool)}
    act = {"type": np.zeros(0, np.int64), "measured_completion": np.zeros(0, np.int64)}
    rows = timeline_of(req, act, 1.0)
    assert rows[0]["slo_met"] == met and rows[0]["slo_attainment"] == 0.158875
    assert format_timeline(rows).splitlines()[1].split()[3] == "15.888"


def test_timeline_counts_what_came_before_time_0_in_the_first_interval():
    """A live controller logs a request whose client stamped it as sent before the
    controller started with an arrival before time 0: the timeline counted it in no
    interval (0 requests in every one, 2 in the summary); now in the first, so the
    intervals add up to the summary."""
    from clockwork.telemetry import timeline_of

    req = {"arrival": np.array([-44_000_000_000, -5, 1_500_000_000], np.int64),
           "deadline_met": np.array([True, True, False]), "cold_start": np.zeros(3, bool)}
    act = {"type": np.array([int(ActionType.LOAD)], np.int64),
           "measured_completion": np.array([-1_000], np.int64)}
    rows = timeline_of(req, act, 1.0)
    assert [(r["requests"], r["slo_met"], r["loads"]) for r in rows] == [(2, 2, 1), (1, 0, 0)]
    only_before = {k: v[:2] for k, v in req.items()}
    assert [r["requests"] for r in timeline_of(only_before, act, 1.0)] == [2]


def test_report_of_a_renamed_summary_reads_the_logs_and_run_renamed_with_it(tmp_path,
                                                                              capsys):
    """A controller logging into a finished run's folder renames its files ``.1``:
    ``report summary.1.json --timeline`` reads ``requests.1.*``/``actions.1.*`` and
    ``run.1.json`` (it read the new, empty logs and another run's run.json, exit 0). A
    run.json that cannot be read (a folder) is a warning, as a malformed one is."""
    d = tmp_path / "run"
    assert main(["simulate", "poisson_warm", "--set", "duration_s=2", "--out", str(d),
                 "--quiet"]) == 0
    for name in ("summary", "run"):
        (d / f"{name}.json").rename(d / f"{name}.1.json")
    for name in ("requests", "actions"):
        (d / f"{name}.tsv").rename(d / f"{name}.1.tsv")
    assert main(["simulate", "poisson_warm", "--set", "duration_s=2",
                 "--set", "workloads.0.rate_rps=10", "--out", str(tmp_path / "other"),
                 "--quiet"]) == 0
    for name in ("requests.tsv", "actions.tsv", "run.json"):  # (the later run's, beside)
        (d / name).write_bytes((tmp_path / "other" / name).read_bytes())
    capsys.readouterr()
    assert main(["report", str(d / "summary.1.json"), "--timeline", "1"]) == 0
    cap = capsys.readouterr()
    submitted = orjson.loads((d / "summary.1.json").read_bytes())["submitted"]
    rows = [ln.split() for ln in cap.out.split("start_s")[1].splitlines()[1:] if ln.strip()]
    assert sum(int(r[1]) for r in rows) == submitted > 100, cap.out
    wall = orjson.loads((d / "run.1.json").read_bytes())["wall_s"]
    assert f"{wall:.2f} s" in cap.out.split("wall time")[1].splitlines()[0], cap.out
    assert "warning" not in cap.err, cap.err
    (d / "run.1.json").unlink()
    (d / "run.1.json").mkdir()
    assert main(["report", str(d / "summary.1.json")]) == 0
    cap = capsys.readouterr()
    assert "wall time" not in cap.out and "run.1.json is not readable run information" \
        in cap.err, cap.err


def test_report_timeline_interval_over_a_year_is_one_line(tmp_path, capsys):
    """An interval whose nanoseconds overflow (>= ~9.2e9 s) was a traceback; intervals
    are bounded at a year (as other times)."""
    from clockwork.telemetry import timeline_of

    _controller_logs(tmp_path / "logs")
    for bucket in ("1e10", "1e300", "31536001"):
        assert main(["report", str(tmp_path / "logs"), "--timeline", bucket]) == 2
        got = capsys.readouterr()
        lines = got.err.strip().splitlines()
        assert "at most 31,536,000 s (a year)" in lines[-1] and "Traceback" not in got.err
        assert got.out == ""
    assert main(["report", str(tmp_path / "logs"), "--timeline", "31536000"]) == 0
    assert _timeline_rows(capsys.readouterr().out)[0][:2] == ["0", "5"]
    tel = read_logs(tmp_path / "logs")
    with pytest.raises(ValueError, match="a year"):
        timeline_of(tel.request_columns(), tel.action_columns(), 1e10)


def test_report_on_a_missing_path_or_a_sweeps_folder_says_what_it_is(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"clockwork report: no such folder: {tmp_path / 'nope'}"
    assert main(["report", str(tmp_path / "nope" / "summary.json")]) == 2
    assert "no such file: " in capsys.readouterr().err
    sweep = tmp_path / "sweep"
    (sweep / "points" / "a-1").mkdir(parents=True)  # a point not finished
    assert main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a sweep's output, not a run" in err and "no point finished yet" in err, err
    plan = tmp_path / "plan"  # (clockwork plan --out: its tables, not a sweep's, named)
    (plan / "points" / "a-1").mkdir(parents=True)
    (plan / "plan.json").write_text("{}")
    assert main(["report", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a plan's output, not a run" in err and f"see {plan / 'plan.json'}" in err, err
    point = sweep / "points" / "b-2"
    _controller_logs(point)
    tel = read_logs(point)
    T.write_json(point / "summary.json", T.summary_of(tel.request_columns(),
                                                     tel.action_columns(), 4.1))
    (sweep / "results.tsv").write_text("point\n")
    assert main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(sweep / "results.tsv") in err and f"clockwork report {point}" in err, err
    assert main(["report", str(point)]) == 0  # (what it points to works)
    capsys.readouterr()
    # one of its tables named (it said "not valid JSON: unexpected character")
    for table in (sweep / "results.tsv", plan / "plan.json"):
        assert main(["report", str(table)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"clockwork report: {table}: {table.parent} is a "), err
        assert "output, not a run" in err and "not valid JSON" not in err, err


def test_report_timeline_of_a_live_replay_says_n_a_for_actions_it_has_not(tmp_path,
                                                                          capsys):
    """A live replay's actions.tsv has only its header (its actions are the controller's,
    in the controller's --log-dir: docs/contracts.md) while its summary counts them from
    the controller's counters: the loads and evicts columns are n/a, not 0."""
    run = tmp_path / "replay"
    _controller_logs(run, actions=False)
    tel = read_logs(run)
    s = T.summary_of(tel.request_columns(), tel.action_columns(), 4.1)
    s["actions"] = {"infer": 5, "load": 2, "evict": 0, "rejected": 0}
    T.write_json(run / "summary.json", s)
    assert main(["report", str(run), "--timeline", "1.5"]) == 0
    got = capsys.readouterr()
    assert "loads and evicts n/a" in got.err
    assert [r[5:] for r in _timeline_rows(got.out)] == [["n/a", "n/a"]] * 3
    # a summary that counts no LOADs or EVICTs: 0 is the truth
    s["actions"] = {"infer": 5, "load": 0, "evict": 0, "rejected": 0}
    T.write_json(run / "summary.json", s)
    assert main(["report", str(run), "--timeline", "1.5"]) == 0
    got = capsys.readouterr()
    assert "n/a" not in got.err and [r[5:] for r in _timeline_rows(got.out)][1:] == \
        [["0", "0"]] * 2
    # the controller went away before it said them (actions null): unknown, n/a too
    s["actions"] = None
    T.write_json(run / "summary.json", s)
    assert main(["report", str(run), "--timeline", "1.5"]) == 0
    got = capsys.readouterr()
    assert "the run's actions (unknown to its summary)" in got.err, got.err
    assert [r[5:] for r in _timeline_rows(got.out)] == [["n/a", "n/a"]] * 3


# ---------------------------------------------------------------- a full disk


def _full_after_headers(monkeypatch):
    """Writes fail as on a full disk (ENOSPC, no file name) once a log has its header."""
    import errno

    real = T._write_all

    def write_all(f, data):
        if f.tell() > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(f, data)

    monkeypatch.setattr(T, "_write_all", write_all)


def test_simulate_on_a_full_disk_prints_the_table_and_names_the_file(tmp_path, capsys,
                                                                      monkeypatch):
    """The table is printed (it was lost: only "[Errno 28] No space left on device"),
    the error names the file it could not write (where it would be in the run's folder),
    and the earlier run in that folder is left whole: nothing of the new one is there,
    and ``report`` reads the earlier one (the write removed it first, and left a
    request log with its header only, which report read as an empty run)."""
    argv = ["simulate", "poisson_warm", "--set", "duration_s=1", "--quiet"]
    out = tmp_path / "run"
    assert main(["simulate", "poisson_warm", "--set", "duration_s=0.5", "--quiet",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    earlier = {f.name: f.read_bytes() for f in out.iterdir()}
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "SLO attainment" in table
    _full_after_headers(monkeypatch)
    assert main([*argv, "--out", str(out)]) == 1
    cap = capsys.readouterr()
    assert cap.out.splitlines()[1:] == table.splitlines()[1:]  # (the first: its wall time)
    assert cap.out.split(" simulated in ")[0] == table.split(" simulated in ")[0]
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in cap.err, err
    assert str(out / "requests.tsv") in err[0] and "No space left on device" in err[0], err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == earlier
    monkeypatch.undo()
    assert main(["report", str(out)]) == 0
    assert "SLO attainment" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["tsv", "npz"])
def test_write_run_names_the_file_a_full_disk_stopped(tmp_path, monkeypatch, fmt):
    import errno

    from clockwork.telemetry import write_run

    tel = Telemetry(0, fmt)
    fill(tel, 50)
    for name in (f"requests.{fmt}", "run.json", "summary.json"):
        def fail(*a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with monkeypatch.context() as m:
            if name == "requests.tsv":
                m.setattr(T, "_write_all", fail)
            elif name == "requests.npz":
                m.setattr(np.lib.format, "write_array", fail)
            else:  # (run.json, then summary.json under a temporary name)
                real = T.Path.write_bytes

                def write_bytes(self, data, real=real, name=name):
                    if self.name.startswith(name):
                        fail()
                    return real(self, data)

                m.setattr(T.Path, "write_bytes", write_bytes)
            with pytest.raises(OSError) as e:
                write_run(tmp_path, tel, {"submitted": 0}, {"wall_s": 0})
        assert e.value.errno == errno.ENOSPC
        assert e.value.filename == str(tmp_path / name), name
        assert str(tmp_path / name) in str(e.value)
        assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "summary.json").exists()


def test_the_table_says_what_failed_requests_were_told():
    """A live replay's summary keeps the commonest answers of failed requests; the table
    prints them under 'failed' (and passes over entries a hand-made summary got wrong)."""
    tel = T.Telemetry(0)
    s = tel.summary(1.0)
    s["failures"] = [{"message": "no worker is available to serve the model", "count": 20115},
                     {"message": "worker lost", "count": 7},
                     {"message": 3, "count": "x"}]
    lines = T.format_summary(s).splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("failed"))
    assert "20,115 x no worker is available to serve the model" in lines[at + 1]
    assert "7 x worker lost" in lines[at + 2]
    assert "told" in lines[at + 1] and "told" not in lines[at + 3]


def test_a_run_stopped_while_its_files_are_written_leaves_the_earlier_one(tmp_path,
                                                                          capsys, monkeypatch):
    """A folder holds a finished run; a new run into it stops while writing its logs (a
    signal, a full disk) after its request log: the earlier run is left whole, and
    ``clockwork report`` reads it as before (the earlier run's summary was removed first:
    report refused the folder as incomplete, and before that reported the new requests
    beside the old action log as one run). Stopped while its files replace the earlier
    run's (between renames), the folder is refused as incomplete, exit 2."""
    from clockwork.cluster.sim import simulate

    d = tmp_path / "run"
    simulate("poisson_warm", ["duration_s=1"]).write(d)
    assert main(["report", str(d)]) == 0
    table = capsys.readouterr().out
    earlier = {f.name: f.read_bytes() for f in d.iterdir()}
    res = simulate("poisson_warm", ["duration_s=2", "seed=3"])
    real = res.telemetry.write

    def stopped(out, log_format=None):  # its request log written, then the stop: no
        real(tmp_path / "whole", log_format)  # action log of its own
        for f in (tmp_path / "whole").glob("requests.*"):
            (out / f.name).write_bytes(f.read_bytes())
        raise KeyboardInterrupt

    res.telemetry.write = stopped
    with pytest.raises(KeyboardInterrupt):
        res.write(d)
    assert {f.name: f.read_bytes() for f in d.iterdir()} == earlier
    assert main(["report", str(d)]) == 0
    assert capsys.readouterr().out == table
    res.telemetry.write = real
    moves = []

    def replace(a, b):  # the stop after the logs' renames, before summary.json's
        if T.Path(b).name == "summary.json":
            raise KeyboardInterrupt
        moves.append(T.Path(b).name)
        os.rename(a, b)

    monkeypatch.setattr(T.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        res.write(d)
    monkeypatch.undo()
    assert sorted(moves) == ["actions.tsv", "requests.tsv", "run.json"]
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert "no summary.json" in err and "incomplete" in err, err
    assert not [f for f in d.iterdir() if f.name.startswith(T.NEW_RUN_PREFIX)]


def test_a_controllers_first_flush_sets_a_finished_runs_table_aside(tmp_path):
    """A controller's --log-dir that holds a finished run: its summary.json and run.json
    are set aside with its logs (``summary.1.json``), so that ``clockwork report`` reads
    the controller's logs (it printed the old run's table with the new logs' timeline)."""
    from clockwork.cluster.sim import simulate

    d = tmp_path / "logs"
    simulate("poisson_warm", ["duration_s=1"]).write(d)
    T._keep_earlier_logs(d)
    assert not (d / "summary.json").exists() and (d / "summary.1.json").exists()
    assert (d / "run.1.json").exists() and (d / "requests.1.tsv").exists()


def test_report_out_of_memory_is_one_line(tmp_path, monkeypatch, capsys):
    """Logs too large for the memory the process can take: one line, exit 2 (a
    MemoryError traceback, exit 1)."""
    from clockwork.cluster.sim import simulate

    d = tmp_path / "run"
    simulate("poisson_warm", ["duration_s=1"]).write(d)

    def no_memory(*a, **k):
        raise MemoryError

    monkeypatch.setattr(T, "read_columns", no_memory)
    assert main(["report", str(d), "--timeline", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too large to read" in err[0], err


def test_a_run_whose_spilled_rows_were_closed_cannot_be_written(tmp_path):
    """``write`` after ``close()`` removed the spilled rows: a ValueError saying so, and
    nothing in the folder (it wrote logs of a header only beside a summary counting every
    request)."""
    tel = Telemetry(origin=1000, spill_dir=tmp_path / "spill")
    fill(tel, N, o=1000)
    tel.close()
    with pytest.raises(ValueError, match="rows were removed"):
        tel.write(tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


SPILLED_THEN_KILLED = """
import os, signal, sys
from clockwork.cluster.sim import simulate
r = simulate("poisson_warm", ["duration_s=0.5"], spill_dir=sys.argv[1])
print(len(r.telemetry.request_columns()["latency"]), flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # (as a pool's terminate ends its workers)
"""


def test_a_simulated_runs_spill_folder_goes_as_the_run_ends(tmp_path):
    """A simulated run's rows' folder is removed as the run ends, its rows readable on
    (maps of the files): a process ended by a signal while it held the result (the
    workers of a ``multiprocessing`` pool left by its ``with``) left the whole run's rows
    on disk; ``close()`` afterwards removes nothing the result still reads."""
    from clockwork.cluster.sim import simulate

    p = subprocess.run([sys.executable, "-c", SPILLED_THEN_KILLED, str(tmp_path / "sp")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGTERM, p.stderr[-2000:]
    assert int(p.stdout) > 0
    assert list((tmp_path / "sp").iterdir()) == []
    r = simulate("poisson_warm", ["duration_s=0.5"], spill_dir=tmp_path / "sp2")
    assert list((tmp_path / "sp2").iterdir()) == []
    want = simulate("poisson_warm", ["duration_s=0.5"]).telemetry.request_columns()
    r.telemetry.close()
    got = r.telemetry.request_columns()
    assert all(np.array_equal(got[k], want[k]) for k in want)
    r.write(tmp_path / "out")  # (the rows were not removed: still its own)
    assert (tmp_path / "out" / "summary.json").exists()


KEEPS_SPILLED_RESULTS = """
import os, resource, sys
from clockwork.cluster.sim import simulate
soft, hard = int(sys.argv[2]), int(sys.argv[3])
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + soft, used + hard))
kept = []
try:
    for i in range(12):
        kept.append(simulate("poisson_warm", ["duration_s=0.2", f"seed={i}"],
                             spill_dir=sys.argv[1]))
except OSError as e:
    print(len(kept), e.errno, e.strerror)
else:
    print(len(kept), resource.getrlimit(resource.RLIMIT_NOFILE)[0] - used)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_results_kept_with_spilled_rows_raise_the_open_file_limit_or_say_it(tmp_path):
    """Each result kept with ``spill_dir`` holds its rows as maps, one open file each (25
    a run): a script keeping them ran out of files under the usual soft limit of 1,024
    at the 41st, a bare "Too many open files" from inside the run. The soft limit is
    raised to the hard one when it runs out; with no room left, the error says why."""
    args = [sys.executable, "-c", KEEPS_SPILLED_RESULTS, str(tmp_path / "sp")]
    p = subprocess.run(args + ["100", "1000"], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["12", "1000"]  # (every run kept: the soft limit raised)
    p = subprocess.run(args + ["100", "100"], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    kept, code, line = p.stdout.split(" ", 2)
    assert int(kept) < 12 and int(code) == errno.EMFILE
    assert "25 a run, for as long as its result is kept" in line and "ulimit -n" in line


def test_a_simulated_result_writes_npz_logs_from_python_and_progress_is_a_bool(tmp_path):
    """``SimResult.write(dir, log_format="npz")`` writes the run's files with npz logs,
    byte for byte what ``clockwork simulate --log-format npz`` writes (a script could
    not: ``write`` took no format); a format that is neither is refused before anything
    is written; ``progress`` that is not a bool is refused (``"no"`` turned it on)."""
    from clockwork.cluster.sim import simulate
    from clockwork.scenario import ScenarioError

    r = simulate("poisson_warm", ["duration_s=0.5"])
    r.write(tmp_path / "py", log_format="npz")
    assert main(["simulate", "poisson_warm", "--set", "duration_s=0.5", "--quiet",
                 "--out", str(tmp_path / "cli"), "--log-format", "npz"]) == 0
    for name in ("summary.json", "requests.npz", "actions.npz"):
        assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    with pytest.raises(ValueError, match="log format 'csv'"):
        r.write(tmp_path / "bad", log_format="csv")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ScenarioError, match="progress must be True or False, got 'no'"):
        simulate("poisson_warm", ["duration_s=0.5"], progress="no")
