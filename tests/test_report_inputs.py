"""``clockwork report`` on damaged or hand-edited run folders: one line on stderr naming
the file (and the line, for TSV logs) and exit 2; never a traceback, never figures made
from values a log cannot hold; memory bounded for an .npz that inflates past it."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import orjson
import pytest

from clockwork import telemetry as T
from clockwork.cluster.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A short simulated run, as TSV and as npz logs."""
    base = tmp_path_factory.mktemp("runs")
    for fmt in ("tsv", "npz"):
        assert main(["simulate", "poisson_warm", "--set", "duration_s=1", "--quiet",
                     "--out", str(base / fmt), "--log-format", fmt]) == 0
    return base


def _copy(runs, fmt, tmp_path, summary=True):
    d = tmp_path / fmt
    shutil.copytree(runs / fmt, d)
    if not summary:
        (d / "summary.json").unlink()
    return d


def _one_line(capsys, rc, *fragments):
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines()]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def _edit_tsv(path, line_no, column, value):
    """Line ``line_no`` (1-based, the header is 1) of a TSV log with one cell replaced."""
    lines = path.read_text().splitlines(keepends=True)
    names = lines[0].rstrip("\n").split("\t")
    cells = lines[line_no - 1].rstrip("\n").split("\t")
    cells[names.index(column)] = value
    lines[line_no - 1] = "\t".join(cells) + "\n"
    path.write_text("".join(lines))


def _edit_npz(path, **columns):
    with np.load(path) as z:
        arrays = dict(z)
    arrays.update(columns)
    np.savez_compressed(path, **arrays)


# ---------------------------------------------------------------------- TSV logs

@pytest.mark.parametrize("log, column, value, fragment", [
    ("actions", "type", "FOO", "column 'type': 'FOO' is not an action type name"),
    ("requests", "arrival", "99999999999999999999",
     "column 'arrival': 99999999999999999999 is not within"),
    ("requests", "arrival", "X4374624", "column 'arrival': 'X4374624' is not an integer"),
    ("requests", "status", "300", "column 'status': 300 is not within -128..127"),
    ("requests", "status", "WHAT", "column 'status': 'WHAT' is not a status name"),
    ("requests", "deadline_met", "2", "column 'deadline_met': 2 is not 0 or 1"),
    ("actions", "gpu", "3000000000", "column 'gpu': 3000000000 is not within"),
])
@pytest.mark.parametrize("summary", [True, False])
def test_a_bad_tsv_cell_names_file_line_and_column(runs, tmp_path, capsys, log, column, value,
                                                   fragment, summary):
    d = _copy(runs, "tsv", tmp_path, summary)
    _edit_tsv(d / f"{log}.tsv", 4, column, value)
    rc = main(["report", str(d), "--timeline", "1"])
    _one_line(capsys, rc, f"{d / log}.tsv:4: ", fragment)


@pytest.mark.parametrize("edit, fragment", [
    (lambda h: h[:-1], "(no column 'gpu')"),
    (lambda h: h + ["zone"], "(unknown column(s) 'zone')"),
    (lambda h: [h[0], h[2], h[1]] + h[3:], "(column 2 is 'arrival', where a log has 'model')"),
    (lambda h: h + [h[-1]], "(11 columns, where a log has 10)"),
])
def test_a_tsv_header_of_another_version_names_the_column(runs, tmp_path, capsys, edit,
                                                           fragment):
    """A request log whose header lacks a column, has one more, or has them in another
    order says which (it said "not a log file (header ['request_id', 'model',
    'arrival']...)", three names all right)."""
    d = _copy(runs, "tsv", tmp_path, summary=False)
    p = d / "requests.tsv"
    lines = p.read_text().splitlines(keepends=True)
    lines[0] = "\t".join(edit(lines[0].rstrip("\n").split("\t"))) + "\n"
    p.write_text("".join(lines))
    _one_line(capsys, main(["report", str(d)]), f"{p}: not a log file of this version "
              + fragment)


def test_a_tsv_row_with_a_field_too_many_names_its_line(runs, tmp_path, capsys):
    d = _copy(runs, "tsv", tmp_path, summary=False)
    p = d / "requests.tsv"
    lines = p.read_text().splitlines(keepends=True)
    lines[6] = lines[6].rstrip("\n") + "\t5\n"
    p.write_text("".join(lines))
    _one_line(capsys, main(["report", str(d)]), f"{p}:7: 11 tab-separated fields, expected 10")


def test_a_tsv_log_that_is_not_utf8_names_the_file(runs, tmp_path, capsys):
    d = _copy(runs, "tsv", tmp_path, summary=False)
    p = d / "requests.tsv"
    p.write_bytes(p.read_bytes() + b"\xff\xfe\x00garbage\n")
    _one_line(capsys, main(["report", str(d)]), f"{p}: not a log file", "UTF-8")


@pytest.mark.parametrize("log", ["requests", "actions"])
@pytest.mark.parametrize("summary", [True, False])
def test_a_tsv_log_cut_inside_its_last_line_reports_the_rest(runs, tmp_path, capsys, log,
                                                             summary):
    """A controller killed while it appended to its TSV logs leaves a last line without
    its end of line: the rows before it are reported, and a warning names the line left
    out (the whole log was refused: "5 tab-separated fields, expected 10")."""
    d = _copy(runs, "tsv", tmp_path, summary)
    p = d / f"{log}.tsv"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2])
    whole = T.read_logs(runs / "tsv")
    rc = main(["report", str(d), "--timeline", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err.count(f"warning: {p}: line {len(lines)} has no end of line") == 1, err
    assert "Traceback" not in err
    back = T.read_logs(d)
    n = len(whole.requests) - (log == "requests")
    assert len(back.requests) == n and len(back.actions) == len(whole.actions) - (
        log == "actions")
    assert back.notes and not whole.notes
    if not summary:
        submitted = next(ln for ln in out.splitlines() if ln.startswith("requests submitted"))
        assert submitted.split()[-1].replace(",", "") == str(n), out


def test_a_summary_json_that_cannot_be_read_is_one_line(tmp_path, capsys):
    """A folder whose summary.json is a folder: one line, exit 2 (it was Python's
    "[Errno 21] Is a directory" through the generic error path, exit 1)."""
    (tmp_path / "summary.json").mkdir()
    _one_line(capsys, main(["report", str(tmp_path)]),
              f"cannot read {tmp_path / 'summary.json'}: Is a directory")


def test_logs_of_another_run_than_the_summary_are_warned_of(runs, tmp_path, capsys):
    """A summary.json beside the logs of another run (more or fewer requests): the
    timeline says so (it printed one run's table above the other's timeline)."""
    d = _copy(runs, "tsv", tmp_path)
    p = d / "requests.tsv"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:100]))
    assert main(["report", str(d), "--timeline", "1"]) == 0
    err = capsys.readouterr().err
    assert f"request log holds 99 requests, its summary counts {len(lines) - 1:,}" in err, err
    assert main(["report", str(_copy(runs, "npz", tmp_path)), "--timeline", "1"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_numeric_action_type_reads_back(tmp_path):
    """The writer writes an action type it has no name for as its number: the reader
    takes that back (it took only names)."""
    tel = T.Telemetry(0)
    tel.actions = [(1, 7, "SUCCESS", 0, 0, "m", 1, 0, 0, -1, 5, 5, 5, 5, 0)]
    tel.write(tmp_path)
    assert "\t7\t" in (tmp_path / "actions.tsv").read_text()
    assert T.read_logs(tmp_path).action_columns()["type"].tolist() == [7]


@pytest.mark.parametrize("fmt", ["tsv", "npz"])
@pytest.mark.parametrize("column, value, fragment", [
    ("status", 77, "row 2: column 'status': 77 is not a request status (0 SUCCESS, 1 ERROR, "
                   "4 TIMEOUT, 6 INVALID_REQUEST)"),
    ("latency", -5, "row 2: column 'latency': -5 ns, answered before it arrived")])
def test_a_request_row_no_writer_writes_is_refused(runs, tmp_path, capsys, fmt, column,
                                                   value, fragment):
    """A request's status that is none of the statuses (it counted as neither a success
    nor a failure: 0 succeeded, yet 100 % attainment) or a request answered before it
    came is refused, one line naming the file, row and column, in either format."""
    d = _copy(runs, fmt, tmp_path, summary=False)
    path = d / f"requests.{fmt}"
    if fmt == "tsv":
        lines = path.read_text().splitlines(keepends=True)
        j = lines[0].rstrip("\n").split("\t").index(column)
        row = lines[2].rstrip("\n").split("\t")
        row[j] = str(value)
        lines[2] = "\t".join(row) + "\n"
        path.write_text("".join(lines))
    else:
        with np.load(path) as z:
            col = z[column].copy()
        col[1] = value
        _edit_npz(path, **{column: col})
    _one_line(capsys, main(["report", str(d)]), f"{path}: {fragment}")
    # with summary.json the table is the summary's, but the timeline reads the rows
    shutil.copy(runs / fmt / "summary.json", d / "summary.json")
    _one_line(capsys, main(["report", str(d), "--timeline", "1"]), f"{path}: {fragment}")


# ---------------------------------------------------------------------- npz logs

@pytest.mark.parametrize("code", [99, -1])
def test_a_model_code_without_a_name_is_refused(runs, tmp_path, capsys, code):
    d = _copy(runs, "npz", tmp_path, summary=False)
    with np.load(d / "requests.npz") as z:
        model = np.full_like(z["model"], code)
    _edit_npz(d / "requests.npz", model=model)
    _one_line(capsys, main(["report", str(d)]), f"{d / 'requests.npz'}: column 'model' holds "
              f"code {code}, but model_names has 1 name(s)")
    with pytest.raises(ValueError, match=f"code {code}"):
        T.read_columns(d, ("model",), ())


def _arrival(d, how):
    with np.load(d / "requests.npz") as z:
        a = z["arrival"]
    return {"str": np.array(["a"] * len(a)), "2d": a.reshape(-1, 1), "0d": np.array(5),
            "nan": np.full(len(a), np.nan), "short": a[:5],
            "uint64_over": (a % 256).astype(np.uint64) + 2**63}[how]


@pytest.mark.parametrize("how, fragment", [
    ("str", "column 'arrival' holds text values (<U1), not integers"),
    ("2d", ", 1), not one value a row"),
    ("0d", "column 'arrival' has shape (), not one value a row"),
    ("nan", "column 'arrival' holds floating-point values (float64), not integers"),
    ("short", "columns of different lengths"),
    ("uint64_over", "column 'arrival' holds 92233720368547"),
])
@pytest.mark.parametrize("summary", [True, False])
def test_a_bad_npz_column_names_file_and_column(runs, tmp_path, capsys, how, fragment, summary):
    d = _copy(runs, "npz", tmp_path, summary)
    _edit_npz(d / "requests.npz", arrival=_arrival(d, how))
    for argv in (["report", str(d), "--timeline", "1"],) + ((["report", str(d)],)
                                                          if not summary else ()):
        _one_line(capsys, main(argv), f"{d / 'requests.npz'}: ", fragment)


def _garble_npz(path, how: str) -> None:
    """``path``'s ``arrival`` member garbled: its .npy header cut inside its dict
    (``header``), or bytes of its compressed stream changed (``deflate``)."""
    import struct
    import zipfile

    if how == "header":
        with zipfile.ZipFile(path) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
        head = b"{'descr': '<i8', 'shape': (3,\n"
        head += b" " * (63 - 10 - len(head)) + b"\n"
        members["arrival.npy"] = (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head))
                                  + head + bytes(24))
        with zipfile.ZipFile(path, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
        return
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("arrival.npy")
    data = bytearray(path.read_bytes())
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 40
    data[at:at + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["header", "deflate"])
def test_a_garbled_npz_member_is_one_line(runs, tmp_path, capsys, how):
    """A log whose member is garbled is "not a log file", one line: a header cut inside
    its dict was a traceback (numpy's header parsing raises ``tokenize.TokenError``)."""
    d = _copy(runs, "npz", tmp_path, summary=False)
    _garble_npz(d / "requests.npz", how)
    for argv in (["report", str(d)], ["report", str(d), "--timeline", "1"]):
        _one_line(capsys, main(argv), f"{d / 'requests.npz'}: ")


def test_a_string_measured_completion_is_refused_on_the_timeline(runs, tmp_path, capsys):
    d = _copy(runs, "npz", tmp_path)
    with np.load(d / "actions.npz") as z:
        n = len(z["type"])
    _edit_npz(d / "actions.npz", measured_completion=np.array(["x"] * n))
    _one_line(capsys, main(["report", str(d), "--timeline", "1"]),
              f"{d / 'actions.npz'}: column 'measured_completion' holds text values")


def test_timeline_of_refuses_columns_it_cannot_count():
    req = {"arrival": np.array(["1", "2"]), "deadline_met": np.ones(2, bool),
           "cold_start": np.zeros(2, bool)}
    act = {"type": np.zeros(0, np.int8), "measured_completion": np.zeros(0, np.int64)}
    with pytest.raises(ValueError, match="request column 'arrival' is text values"):
        T.timeline_of(req, act, 1.0)
    req["arrival"] = np.zeros((2, 1), np.int64)
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        T.timeline_of(req, act, 1.0)
    req["arrival"] = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="different lengths"):
        T.timeline_of(req, act, 1.0)


def test_a_valid_npz_of_other_integer_types_reads_as_the_log_types(runs, tmp_path):
    d = _copy(runs, "npz", tmp_path, summary=False)
    ref = T.read_logs(d).request_columns()
    with np.load(d / "requests.npz") as z:
        _edit_npz(d / "requests.npz", status=z["status"].astype(np.int64),
                  deadline_met=z["deadline_met"].astype(np.uint8))
    got = T.read_logs(d).request_columns()
    for c in ref:
        assert got[c].dtype == ref[c].dtype and np.array_equal(got[c], ref[c]), c


def test_npz_columns_past_the_memory_left_are_refused_unread(runs, tmp_path, capsys,
                                                            monkeypatch):
    d = _copy(runs, "npz", tmp_path)
    monkeypatch.setattr(T, "_memory_room", lambda: 1000, raising=False)
    loaded = []
    real = np.lib.npyio.NpzFile.__getitem__

    def spy(self, key):
        loaded.append(key)
        return real(self, key)

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", spy)
    line = _one_line(capsys, main(["report", str(d), "--timeline", "1"]),
                     f"{d / 'requests.npz'}: its ", "GiB of memory to read, more than")
    assert "rows need" in line and not {"arrival", "deadline_met", "cold_start"} & set(loaded)


def _zip_bomb(path, rows: int, dtypes: dict) -> None:
    """An .npz (a zip, written byte by byte) whose members are columns of ``rows`` zeros,
    each a few KB that inflate to ``rows`` x its size; ``rows`` x 8 a multiple of 16 MiB
    and under 4 GiB. (Its CRCs are not right: a reader must refuse it before it reads
    that far.)"""
    chunk = 16 << 20
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)  # (no reference before it)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # (the last, empty block)
    local, central = b"", b""
    for name, dt in dtypes.items():
        dt = np.dtype(dt)
        nbytes = rows * dt.itemsize
        assert nbytes % chunk == 0 and nbytes < 2**32 - 1024
        head = f"{{'descr': '{dt.str}', 'fortran_order': False, 'shape': ({rows},), }}".encode()
        head += b" " * (63 - (10 + len(head)) % 64) + b"\n"
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH) + zeros * (nbytes // chunk) + end
        fname = f"{name}.npy".encode()
        sizes = struct.pack("<III", 0, len(data), len(head) + nbytes)
        offset = len(local)
        local += (struct.pack("<IHHHHH", 0x04034B50, 20, 0, 8, 0, 0x21) + sizes
                  + struct.pack("<HH", len(fname), 0) + fname + data)
        central += (struct.pack("<IHHHHHH", 0x02014B50, 20, 20, 0, 8, 0, 0x21) + sizes
                    + struct.pack("<HHHHHII", len(fname), 0, 0, 0, 0, 0, offset) + fname)
    n = len(dtypes)
    path.write_bytes(local + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n,
                                                   len(central), len(local), 0))


def test_a_compressed_npz_past_the_address_space_limit_is_one_line(runs, tmp_path):
    """The reviewer's case: a requests.npz of a few MB whose arrival column inflates to
    3.9 GiB (4.8 GiB with the two others), reported with --timeline under `ulimit -v
    4000000`: refused, naming the file, before anything is allocated (allocating the
    arrival column was a MemoryError traceback)."""
    d = _copy(runs, "npz", tmp_path)
    rows = 31 << 24
    _zip_bomb(d / "requests.npz", rows, {"arrival": np.int64, "deadline_met": np.bool_,
                                         "cold_start": np.bool_})
    assert (d / "requests.npz").stat().st_size < 8 << 20
    with np.load(d / "requests.npz") as z:  # (a well-formed .npz: its header says so)
        assert T._npy_header(z, "arrival") == ((rows,), np.dtype(np.int64))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    r = subprocess.run(["bash", "-c", 'ulimit -v 4000000; exec "$0" -m clockwork.cluster.cli '
                        'report "$1" --timeline 1', sys.executable, str(d)],
                       capture_output=True, text=True, timeout=120, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{d / 'requests.npz'}: its {rows:,} rows need" in lines[0], lines[0]


# ---------------------------------------------------------------------- summary.json

@pytest.mark.parametrize("value", [-5, 1.5, True, "1452"])
def test_a_summary_count_that_is_not_a_count_is_refused(runs, tmp_path, capsys, value):
    d = _copy(runs, "tsv", tmp_path)
    s = orjson.loads((d / "summary.json").read_bytes())
    s["submitted"] = value
    (d / "summary.json").write_bytes(orjson.dumps(s))
    _one_line(capsys, main(["report", str(d)]), f"{d / 'summary.json'} is not a run summary",
              "'submitted' is")


def test_a_summary_without_latencies_says_n_a(runs, tmp_path, capsys):
    d = _copy(runs, "tsv", tmp_path)
    s = orjson.loads((d / "summary.json").read_bytes())
    assert s["succeeded"] > 0
    del s["latency_ms"]
    (d / "summary.json").write_bytes(orjson.dumps(s))
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("latency p50")]
    assert line.endswith("  n/a (not in the summary)"), line
    s["latency_ms"] = {"p50": 1.0}
    (d / "summary.json").write_bytes(orjson.dumps(s))
    assert main(["report", str(d)]) == 0
    assert "1.00 / n/a / n/a / n/a ms" in capsys.readouterr().out


def test_the_python_readers_refuse_what_they_cannot_use_in_one_line(runs):
    """The log and summary functions a script calls: an interval or a duration that is not
    a number of seconds, and a summary without its counts, are ValueErrors saying so
    (they were TypeErrors from a comparison, and a KeyError naming the key alone); a run
    of no length has no rate (its goodput was its count, over a made-up second)."""
    d = runs / "tsv"
    for bad in ("1", None, True):
        with pytest.raises(ValueError, match="interval must be a number of seconds"):
            T.timeline(d, bad)
    for bad in (-1.0, float("nan"), "5", float("inf")):
        with pytest.raises(ValueError, match="duration_s must be a number of seconds"):
            T.timeline(d, 1.0, bad)
    tel = T.read_logs(d)
    for bad in (-1.0, float("nan"), None):
        with pytest.raises(ValueError, match="duration_s must be a number of seconds"):
            tel.summary(bad)
    s = tel.summary(0.0)
    assert s["slo_met"] > 0 and s["goodput_rps"] == s["throughput_rps"] == 0.0
    with pytest.raises(ValueError, match="it has no 'succeeded': not a run summary"):
        T.format_summary({"submitted": 3})
    for empty in ("", "  "):  # (it wrote the run's files into the current folder)
        with pytest.raises(ValueError, match="the run's folder must be a path"):
            T.write_run(empty, tel, s, {})


@pytest.mark.parametrize("fmt,renamed", [("tsv", "{k}.tsv.1"), ("npz", "{k}.1.npz")])
def test_a_renamed_log_pair_is_read_by_naming_one_of_its_files(runs, tmp_path, capsys, fmt,
                                                               renamed):
    """A log pair renamed (as logrotate renames a controller's TSV logs, or as a restart
    leaves them) is read by naming either of its files; a folder holding only such pairs
    says how (it said only "no summary.json"); a pair missing its other file is one line."""
    d = tmp_path / "logs"
    d.mkdir()
    for k in ("requests", "actions"):
        shutil.copy(runs / fmt / f"{k}.{fmt}", d / renamed.format(k=k))
    req, act = d / renamed.format(k="requests"), d / renamed.format(k="actions")
    _one_line(capsys, main(["report", str(d)]), f"clockwork report {req} reads that pair")
    submitted = orjson.loads((runs / fmt / "summary.json").read_bytes())["submitted"]
    for named in (req, act, runs / fmt / f"requests.{fmt}"):
        assert main(["report", str(named), "--timeline", "0.5"]) == 0, named
        out, err = capsys.readouterr()
        assert out.splitlines()[0].split() == ["requests", "submitted", f"{submitted:,}"], out
        assert "figures computed from the log pair" in err and "Traceback" not in err, err
    act.unlink()
    _one_line(capsys, main(["report", str(req)]), f"no {act.name} beside {req.name}")


def test_bytes_that_are_not_utf8_are_named_by_their_line(runs, tmp_path, capsys):
    """A TSV log with a byte that is not UTF-8 on some line is refused naming that line
    (it said "after line 1": the line before the block of lines being decoded)."""
    d = _copy(runs, "tsv", tmp_path, summary=False)
    lines = (d / "requests.tsv").read_bytes().splitlines(keepends=True)
    assert len(lines) > 600
    lines[499] = lines[499].replace(b"\t", b"\t\xff", 1)  # (line 500)
    (d / "requests.tsv").write_bytes(b"".join(lines))
    _one_line(capsys, main(["report", str(d)]), "requests.tsv: not a log file: bytes that "
              "are not UTF-8 text on line 500")


@pytest.mark.parametrize("summary", [True, False])
def test_a_log_that_is_a_folder_is_one_line_exit_2(runs, tmp_path, capsys, summary):
    """A run folder whose requests.tsv is a folder: one line naming it, exit 2 (as for a
    summary.json that is a folder; it was exit 1), with the summary (--timeline) or
    without (the figures from the logs)."""
    d = _copy(runs, "tsv", tmp_path, summary=summary)
    (d / "requests.tsv").unlink()
    (d / "requests.tsv").mkdir()
    _one_line(capsys, main(["report", str(d), "--timeline"]),
              f"cannot read {d / 'requests.tsv'}: Is a directory")


def test_a_run_folder_named_as_a_log_is_a_run_and_a_compressed_pair_is_said(runs, tmp_path,
                                                                            capsys):
    """A run folder whose name looks like a log's (``requests.tsv``) is read as the run
    folder it is; a compressed renamed log (logrotate's ``compress``) is one line saying
    to decompress it, not read as garbled TSV; a bad byte on the header line is named
    on line 1."""
    d = tmp_path / "requests.tsv"
    shutil.copytree(runs / "tsv", d)
    assert main(["report", str(d)]) == 0
    capsys.readouterr()
    gz = tmp_path / "requests.tsv.1.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00 not read")
    _one_line(capsys, main(["report", str(gz)]), "a compressed log (.gz): decompress it")
    e = _copy(runs, "tsv", tmp_path / "h", summary=False)
    (e / "requests.tsv").write_bytes(b"\xff" + (e / "requests.tsv").read_bytes())
    _one_line(capsys, main(["report", str(e)]), "not UTF-8 text on line 1 ")


@pytest.mark.parametrize("named", ["pair", "folder"])
def test_a_request_log_whose_actions_are_logged_elsewhere_says_actions_n_a(
        runs, tmp_path, capsys, named):
    """A live replay's own action log is empty (its actions are the controller's, in its
    --log-dir): read without its summary.json, its figures said 0 actions and an EXEC
    prediction error of 0.000 ms, as if every prediction had been exact."""
    d = _copy(runs, "tsv", tmp_path, summary=False)
    acts = d / "actions.tsv"
    acts.write_text(acts.read_text().splitlines()[0] + "\n")  # (the header alone)
    rc = main(["report", str(d / "requests.tsv" if named == "pair" else d),
               "--timeline", "0.5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "holds no actions though" in err and err.count("loads and evicts n/a") == 0, err
    line = next(x for x in out.splitlines() if x.startswith("actions infer"))
    assert "n/a (not in this action log)" in line, line
    assert "EXEC prediction error" not in out, out


def test_a_simulated_run_replaces_an_earlier_live_runs_process_output(runs, tmp_path):
    """A run written over a live one (``clockwork serve --replay --out``) takes its
    processes' output (``logs/controller.log``, ``logs/worker0.log``) with its other files:
    they stayed beside the new run's, read as its own. Other files there are left."""
    d = _copy(runs, "tsv", tmp_path)
    (d / "logs").mkdir()
    for name in ("controller.log", "worker0.log"):
        (d / "logs" / name).write_text("the earlier live run\n")
    assert main(["simulate", "poisson_warm", "--set", "duration_s=0.5", "--quiet",
                 "--out", str(d)]) == 0
    assert not (d / "logs").exists()
    (d / "logs").mkdir()
    (d / "logs" / "controller.log").write_text("the earlier live run\n")
    (d / "logs" / "notes.txt").write_text("mine\n")
    assert main(["simulate", "poisson_warm", "--set", "duration_s=0.5", "--quiet",
                 "--out", str(d)]) == 0
    assert sorted(p.name for p in (d / "logs").iterdir()) == ["notes.txt"]


def test_logs_without_a_request_are_said_to_hold_none(runs, tmp_path, capsys):
    """A controller's log folder with the headers alone (it served nothing): said so (it
    said "over 0.0 s from the first arrival to the last answer")."""
    d = _copy(runs, "tsv", tmp_path, summary=False)
    for log in ("requests.tsv", "actions.tsv"):
        (d / log).write_text((d / log).read_text().splitlines()[0] + "\n")
    assert main(["report", str(d)]) == 0
    err = capsys.readouterr().err
    assert "which hold no request" in err and "first arrival" not in err, err


def test_a_sweep_point_without_logs_names_the_setting_that_keeps_them(runs, tmp_path, capsys):
    """``report POINT --timeline`` on a sweep's point folder (summary.json, point.json,
    no logs) says how a sweep keeps a point's logs (it said only that none are there)."""
    d = _copy(runs, "tsv", tmp_path)
    for log in ("requests.tsv", "actions.tsv"):
        (d / log).unlink()
    (d / "point.json").write_text("{}")
    assert main(["report", str(d), "--timeline", "1"]) == 2
    err = capsys.readouterr().err
    assert "no requests.tsv or requests.npz in" in err and "logs = true" in err, err


def test_a_live_run_that_did_not_finish_is_said_so(tmp_path, capsys):
    """A ``serve --replay --out`` folder of a run killed before it wrote its files (its
    processes' output alone in logs/): said so (it said only "no summary.json")."""
    (tmp_path / "k9" / "logs").mkdir(parents=True)
    (tmp_path / "k9" / "logs" / "controller.log").write_text("clockwork controller ...\n")
    assert main(["report", str(tmp_path / "k9")]) == 2
    err = capsys.readouterr().err
    assert "a live run that did not finish" in err, err
