"""The Azure Functions 2019 reader: format checks, selection, file lookup."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from clockwork.workloads import azure
from clockwork.workloads.azure import (
    HEADER,
    MINUTES,
    AzureTrace,
    TraceError,
    find_trace_file,
    trace_file_name,
)


def _row(i: int, counts, trigger: str = "http") -> str:
    return ",".join([f"o{i:063x}", f"a{i:063x}", f"f{i:063x}", trigger] + [str(c) for c in counts])


def _counts(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.poisson(rng.gamma(0.3, 20.0, (n, 1)), (n, MINUTES)).astype(np.uint32)
    c[0, 5] = 4_000_000_000  # a 10-digit count still fits uint32
    return c


def _write(path, rows: list[str], header: str = HEADER, newline: str = "\n") -> str:
    path.write_text(newline.join([header] + rows) + newline)
    return str(path)


@pytest.fixture
def small(tmp_path):
    c = _counts(30)
    trig = ["http", "timer", "queue", "event", "others", "orchestration"]
    rows = [_row(i, c[i], trig[i % len(trig)]) for i in range(len(c))]
    return _write(tmp_path / "t.csv", rows), c


def test_roundtrip_counts_and_ids(small):
    path, c = small
    tr = AzureTrace.load(path)
    assert tr.counts.dtype == np.uint32
    assert tr.counts.shape == (30, MINUTES)
    np.testing.assert_array_equal(tr.counts, c)
    assert tr.functions[3] == f"f{3:063x}" and tr.owners[3] == f"o{3:063x}"
    assert tr.triggers[1] == "timer"
    assert tr.start_minute == 0 and tr.source == path


def test_save_then_load_is_identical(small, tmp_path):
    tr = AzureTrace.load(small[0])
    out = tr.save(tmp_path / "again.csv")
    assert out.read_bytes() == open(small[0], "rb").read()
    gz = tr.save(tmp_path / "again.csv.gz")
    assert gzip.decompress(gz.read_bytes()) == out.read_bytes()
    np.testing.assert_array_equal(AzureTrace.load(gz).counts, tr.counts)


def test_a_save_stopped_midway_leaves_the_earlier_file_or_none(small, tmp_path,
                                                                 monkeypatch):
    """A save interrupted (Ctrl-C) after some rows leaves no short file that reads as a
    smaller day: where there was none there is none, an earlier file stays as it was, and
    nothing else is left in the folder."""
    tr = AzureTrace.load(small[0])
    real = azure._format_rows
    calls = []

    def stopped(counts):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(counts)

    monkeypatch.setattr(azure, "_format_rows", stopped)
    n = 3000  # (rows are written 1,024 at a time: stopped in the second chunk)
    tr = AzureTrace(*(np.resize(a, n) for a in (tr.owners, tr.apps, tr.functions,
                                                tr.triggers)),
                    np.resize(tr.counts, (n, tr.counts.shape[1])), 0, "bigger")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        tr.save(out / "day.csv")
    assert list(out.iterdir()) == []
    earlier = out / "kept.csv"
    earlier.write_bytes(b"an earlier day")
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        tr.save(earlier)
    assert list(out.iterdir()) == [earlier] and earlier.read_bytes() == b"an earlier day"


def test_many_blocks_and_line_numbers(small, tmp_path, monkeypatch):
    monkeypatch.setattr(azure, "_BLOCK_BYTES", 5000)  # about two rows per block
    tr = AzureTrace.load(small[0])
    np.testing.assert_array_equal(tr.counts, small[1])
    lines = open(small[0]).read().splitlines()
    lines[23] = lines[23].replace(",0,", ",x,", 1) if ",0," in lines[23] else lines[23] + ",x"
    bad = _write(tmp_path / "bad.csv", lines[1:])
    with pytest.raises(TraceError, match=r"bad\.csv:24: "):
        AzureTrace.load(bad)


def test_crlf_and_missing_final_newline(small, tmp_path):
    lines = open(small[0]).read().splitlines()
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    np.testing.assert_array_equal(AzureTrace.load(crlf).counts, small[1])
    nofinal = tmp_path / "nofinal.csv"
    nofinal.write_text("\n".join(lines))
    np.testing.assert_array_equal(AzureTrace.load(nofinal).counts, small[1])
    # CR LF lines, the file cut before the last LF (it was refused: "the line ends with CR
    # LF, the header with LF alone", of a CR LF header); a header alone so cut is empty
    cut = tmp_path / "crlf_cut.csv"
    cut.write_bytes(("\r\n".join(lines) + "\r").encode())
    np.testing.assert_array_equal(AzureTrace.load(cut).counts, small[1])
    head = tmp_path / "head_cut.csv"
    head.write_bytes((lines[0] + "\r").encode())
    assert AzureTrace.load(head).counts.shape == (0, MINUTES)


def test_header_only_is_empty(tmp_path):
    tr = AzureTrace.load(_write(tmp_path / "e.csv", []))
    assert tr.n_functions == 0 and tr.counts.shape == (0, MINUTES)


@pytest.mark.parametrize("mutate, words", [
    (lambda f: f[:-1], "expected 1444 columns"),                 # one minute short
    (lambda f: f + ["7"], "expected 1444 columns"),              # one extra
    (lambda f: f[:10] + ["3.5"] + f[11:], 'minute 6 (column "7"): \'3.5\''),    # not an integer
    (lambda f: f[:10] + [""] + f[11:], 'minute 6 (column "7"): \'\''),          # empty
    (lambda f: f[:10] + ["-2"] + f[11:], 'minute 6 (column "7"): negative invocation count -2'),
    (lambda f: f[:10] + [" 2"] + f[11:], "minute 6 "),           # stray space
    (lambda f: f[:1443] + ["99999999999"],
     'minute 1439 (column "1440"): count 99999999999 is too large'),
    (lambda f: f[:1443] + ["4294967296"], "too large"),
])
def test_malformed_row_names_file_and_line(tmp_path, mutate, words):
    rows = [_row(i, np.arange(MINUTES) % 3) for i in range(5)]
    fields = rows[2].split(",")
    rows[2] = ",".join(mutate(fields))
    path = _write(tmp_path / "m.csv", rows)
    with pytest.raises(TraceError) as ei:
        AzureTrace.load(path)
    msg = str(ei.value)
    assert f"{path}:4:" in msg  # header is line 1, rows[2] is line 4
    assert words in msg


def test_columns_never_shift_between_rows(tmp_path):
    # one row short and the next one long: the total still matches, but it is an error
    rows = [_row(i, np.ones(MINUTES, int)) for i in range(3)]
    rows[0] = rows[0][: rows[0].rfind(",")]
    rows[1] = rows[1] + ",1"
    with pytest.raises(TraceError, match=r"m\.csv:2: expected 1444 columns.*found 1443"):
        AzureTrace.load(_write(tmp_path / "m.csv", rows))


def test_blank_line_inside_is_an_error(tmp_path):
    rows = [_row(0, np.zeros(MINUTES, int)), "", _row(1, np.zeros(MINUTES, int))]
    with pytest.raises(TraceError, match=r":3: the line is blank \(a row of 1444 columns"):
        AzureTrace.load(_write(tmp_path / "b.csv", rows))


@pytest.mark.parametrize("header, words", [
    ("HashOwner,HashApp,HashFunction," + ",".join(map(str, range(1, 1441))), "must start with"),
    ("a,b,c,d," + ",".join(map(str, range(1, 1441))), "must start with"),
    ("HashOwner,HashApp,HashFunction,Trigger," + ",".join(map(str, range(1, 1440))),
     "1443 columns, expected 1444"),
    ("HashOwner,HashApp,HashFunction,Trigger," + ",".join(map(str, range(0, 1440))),
     "header column 5 is '0'"),
    ("", "must start with"),
])
def test_wrong_header(tmp_path, header, words):
    path = _write(tmp_path / "h.csv", [_row(0, np.zeros(MINUTES, int))], header=header)
    with pytest.raises(TraceError, match=words) as ei:
        AzureTrace.load(path)
    assert f"{path}:1:" in str(ei.value)


@pytest.mark.parametrize("at", [0, 2])
def test_a_header_line_again_is_refused_not_read_as_a_function(tmp_path, at):
    """Two day files joined (``cat d01.csv d02.csv``), or the header written twice: the
    second header is refused naming its line. Its minutes "1".."1440" were read as a
    function's counts (1,037,520 invocations of a function "HashOwner"), the busiest of
    the day."""
    rows = [_row(i, np.zeros(MINUTES, int)) for i in range(4)]
    rows.insert(at, ("\ufeff" if at else "") + HEADER)
    with pytest.raises(TraceError, match=rf":{at + 2}: a header line again"):
        AzureTrace.load(_write(tmp_path / "two.csv", rows))


def test_an_id_past_its_bound_is_refused_before_it_is_kept(tmp_path):
    """One id of 2,000 bytes: refused naming its line (each id column became a numpy
    string array as wide as the longest id: one of 2 MB asked 37 GiB for 5,000 rows)."""
    rows = [_row(i, np.zeros(MINUTES, int)) for i in range(3)]
    rows[1] = "x" * 2000 + rows[1]
    with pytest.raises(TraceError, match=r":3: its ids \(the first 4 columns\) are 2,"):
        AzureTrace.load(_write(tmp_path / "long.csv", rows))


def test_lines_ending_in_cr_alone_are_named_without_splitting_the_file(tmp_path):
    """A file whose lines end in CR alone is one line: refused saying so, from its first
    bytes (its whole text was split into fields first: 70 MB took 929 MB)."""
    rows = [_row(i, np.zeros(MINUTES, int)) for i in range(20)]
    path = _write(tmp_path / "cr.csv", rows, newline="\r")
    with pytest.raises(TraceError, match=r"cr.csv:1: no header line .*end in CR alone"):
        AzureTrace.load(path)
    small = _write(tmp_path / "small.csv", rows[:1], newline="\r")  # (under the header's
    with pytest.raises(TraceError, match=r"small.csv:1: header has .*end in CR alone"):  # max)
        AzureTrace.load(small)
    joined = tmp_path / "joined.csv"  # (a row of many joined: counted, not split)
    joined.write_text(HEADER + "\n" + ",".join(rows) + "\n")
    with pytest.raises(TraceError, match=r":2: expected 1444 columns .*found 28880"):
        AzureTrace.load(joined)


def test_missing_file_and_unreadable_gzip(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        AzureTrace.load(tmp_path / "nope.csv")
    bad = tmp_path / "x.csv.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage")
    with pytest.raises(TraceError, match="cannot read"):
        AzureTrace.load(bad)


def test_window_selection(small):
    tr = AzureTrace.load(small[0])
    w = tr.window(100, 30)
    assert w.start_minute == 100 and w.n_minutes == 30
    np.testing.assert_array_equal(w.counts, small[1][:, 100:130])
    w2 = w.window(110, 5)
    np.testing.assert_array_equal(w2.counts, small[1][:, 110:115])
    assert tr.window(1430).n_minutes == 10
    for bad in [(-1, 5), (1440, 1), (1430, 11), (0, 0)]:
        with pytest.raises(ValueError):
            tr.window(*bad)
    with pytest.raises(ValueError):
        w.window(99, 2)


def test_rank_selection(small):
    tr = AzureTrace.load(small[0])
    tot = small[1].sum(axis=1, dtype=np.uint64)
    top = tr.ranked(top=5)
    np.testing.assert_array_equal(top.totals(), np.sort(tot)[::-1][:5])
    assert top.functions[0] == tr.functions[int(np.argmax(tot))]
    mid = tr.ranked(ranks=(5, 12))
    np.testing.assert_array_equal(mid.totals(), np.sort(tot)[::-1][5:12])
    assert np.all(np.diff(tr.ranked().totals().astype(np.int64)) <= 0)
    with pytest.raises(ValueError):
        tr.ranked(top=0)
    with pytest.raises(ValueError):
        tr.ranked(ranks=(3, 3))
    # ranking uses the minutes held: a window ranks by its own totals
    w = tr.window(0, 10).ranked(top=1)
    assert w.totals()[0] == small[1][:, :10].sum(axis=1).max()


def test_trigger_summary(small):
    tr = AzureTrace.load(small[0])
    s = tr.trigger_summary()
    assert sum(f for f, _ in s.values()) == 30
    assert sum(i for _, i in s.values()) == int(small[1].sum(dtype=np.uint64))
    assert s["timer"][0] == 5


def test_find_trace_file_both_name_forms(tmp_path, monkeypatch, small):
    monkeypatch.delenv("AZURE_TRACE_DIR", raising=False)
    data = open(small[0], "rb").read()
    (tmp_path / trace_file_name(3)).write_bytes(data)
    (tmp_path / trace_file_name(4, svls=True)).write_bytes(data)
    assert find_trace_file(3, tmp_path).name == "invocations_per_function_md.anon.d03.csv"
    assert find_trace_file(4, tmp_path).name == "invocations_per_function_md.svls.anon.d04.csv"
    monkeypatch.setenv("AZURE_TRACE_DIR", str(tmp_path))
    assert find_trace_file(3) == tmp_path / trace_file_name(3)
    assert AzureTrace.load(4).n_functions == 30
    with pytest.raises(TraceError, match=r"day 9 .*d09\.csv.*README"):
        find_trace_file(9)
    with pytest.raises(TraceError, match="integer >= 1"):
        find_trace_file(0)


def test_bulk_parse_over_several_blocks(tmp_path):
    # 3,000 rows: correctness of bulk parsing over several blocks (not a timing test)
    c = _counts(3000, seed=2)
    rows = [_row(i, c[i]) for i in range(len(c))]
    tr = AzureTrace.load(_write(tmp_path / "mid.csv", rows))
    np.testing.assert_array_equal(tr.counts, c)


def test_trace_info_columns_stay_aligned_with_wide_characters():
    """Function names of wide characters (CJK, emoji: two terminal columns each) are cut
    and padded by the columns they take, so the table stays aligned (it counted them as
    one each)."""
    from clockwork.workloads.trace_cli import _cell

    assert _cell("函数函数函数函数", 12) == "函数函数函数"  # 6 x 2 columns
    assert _cell("😀f", 12) == "😀f" + " " * 9
    assert _cell("plain", 5) == "plain" and _cell("longer", 3) == "lon"
    assert _cell("函a", 2) == "函"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_file_is_said_as_such(tmp_path, encoding):
    """A trace saved as UTF-16 (a spreadsheet's "Unicode text") is named as UTF-16, with
    or without its byte-order mark (it was said to have no header line: 12,262 bytes
    without a line end)."""
    rows = [_row(i, np.zeros(MINUTES, int)) for i in range(3)]
    path = tmp_path / "u16.csv"
    path.write_bytes((HEADER + "\n" + "\n".join(rows) + "\n").encode(encoding))
    with pytest.raises(TraceError, match=r"u16.csv:1: the file is UTF-16 text; save it as "
                       "UTF-8"):
        AzureTrace.load(path)


def test_trace_info_ranks_start_at_1(small):
    """``clockwork trace info``'s table of top functions ranks them from 1 (the busiest
    was rank 0)."""
    from clockwork.workloads.trace_cli import format_info

    text = format_info(AzureTrace.load(small[0]), top=3)
    table = text.split("functions by invocations\n")[1].splitlines()
    assert [row.split()[0] for row in table] == ["rank", "1", "2", "3"], text
