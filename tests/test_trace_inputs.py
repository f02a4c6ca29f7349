"""Bad Azure trace files and bad ``trace synth`` arguments: one line naming the file (and
line) and exit 2, never a traceback, never a file held whole past its bound."""

from __future__ import annotations

import gzip
import subprocess
import sys
import zlib

import numpy as np
import pytest

from clockwork.cluster.cli import main
from clockwork.workloads import azure
from clockwork.workloads.azure import HEADER, MINUTES, AzureTrace, TraceError


def _text(rows: int = 40, newline: str = "\n") -> str:
    rng = np.random.default_rng(3)
    c = rng.poisson(rng.gamma(0.3, 20.0, (rows, 1)), (rows, MINUTES))
    lines = [HEADER] + [",".join([f"o{i:063x}", f"a{i:063x}", f"f{i:063x}", "http"]
                                 + [str(v) for v in c[i]]) for i in range(rows)]
    return newline.join(lines) + newline


def _corrupt_gzip(tmp_path):
    """A gzip file with one byte flipped in its deflate stream so that inflating it fails
    (not only its CRC). The search starts just past the 10-byte gzip header, where the
    block's code tables are: a flipped byte there breaks inflating at once (further in, a
    flip mostly decodes to other bytes and only the CRC fails: seconds of search)."""
    data = gzip.compress(_text().encode(), mtime=0)
    for off in range(12, len(data) - 8):
        bad = bytearray(data)
        bad[off] ^= 0xFF
        try:
            gzip.decompress(bytes(bad))
        except zlib.error:
            p = tmp_path / "corrupt.csv.gz"
            p.write_bytes(bytes(bad))
            return p
        except (OSError, EOFError):
            continue
    raise AssertionError("no flipped byte made inflating fail")


def test_corrupt_gzip_is_a_trace_error_naming_the_file(tmp_path):
    p = _corrupt_gzip(tmp_path)
    with pytest.raises(TraceError, match=r"corrupt\.csv\.gz: damaged gzip data"):
        AzureTrace.load(p)


def test_corrupt_gzip_on_the_command_line_is_one_line_exit_2(tmp_path):
    p = _corrupt_gzip(tmp_path)
    for argv in (["trace", "info", str(p)],
                 ["simulate", "azure_sample", "--set", "duration_s=1",
                  "--set", f"workloads.0.trace={p}"]):
        r = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", *argv],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert str(p) in lines[0] and "damaged gzip data" in lines[0]


def test_gzip_that_inflates_past_the_bound_is_refused(tmp_path, monkeypatch):
    text = _text().encode()
    p = tmp_path / "t.csv.gz"
    p.write_bytes(gzip.compress(text, mtime=0))
    assert len(AzureTrace.load(p)) == 40  # within the bound: read as ever
    monkeypatch.setattr(azure, "MAX_TRACE_BYTES", len(text) - 1, raising=False)
    monkeypatch.setattr(azure, "_GZ_READ", 4096, raising=False)
    read = []
    real = gzip.GzipFile.read

    def spy(self, n=-1):
        read.append(n)
        return real(self, n)

    monkeypatch.setattr(gzip.GzipFile, "read", spy)
    with pytest.raises(TraceError, match=r"t\.csv\.gz decompresses to more than"):
        AzureTrace.load(p)
    assert read and all(0 < n <= 4096 for n in read)  # never asked for all of it at once


def test_plain_file_past_the_bound_is_refused_unread(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text(_text())
    monkeypatch.setattr(azure, "MAX_TRACE_BYTES", p.stat().st_size - 1, raising=False)
    with pytest.raises(TraceError, match=r"t\.csv holds more than"):
        AzureTrace.load(p)


def test_the_bound_fits_a_real_day():
    assert azure.MAX_TRACE_BYTES == 1 << 30  # (a real day is 120-160 MB; documented)


def test_crlf_rows_under_an_lf_header_say_so(tmp_path):
    text = _text()
    head, body = text.split("\n", 1)
    p = tmp_path / "mixed.csv"
    p.write_bytes((head + "\n" + body.replace("\n", "\r\n")).encode())
    with pytest.raises(TraceError, match=r"mixed\.csv:2: the line ends with CR LF"):
        AzureTrace.load(p)
    rc = main(["trace", "info", str(p)])
    assert rc == 2


def test_zero_padded_counts_past_10_digits_say_so(tmp_path):
    lines = _text().split("\n")
    f = lines[3].split(",")
    f[4 + 6] = "0" * 11 + "7"  # minute 7
    lines[3] = ",".join(f)
    p = tmp_path / "padded.csv"
    p.write_text("\n".join(lines))
    with pytest.raises(TraceError, match=r'padded\.csv:4: minute 6 \(column "7"\): count '
                                         r"'000000000007' has 12 digits"):
        AzureTrace.load(p)


# ---------------------------------------------------------------------- trace synth

def test_synth_too_many_functions_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["trace", "synth", "--functions", str(10**12), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--functions 1,000,000,000,000" in err[0] and "100,000" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_synth_bound_in_the_api():
    from clockwork.workloads import synth

    assert synth.MAX_FUNCTIONS == 100_000
    with pytest.raises(ValueError, match="at most 100,000"):
        synth.days_of(synth.MAX_FUNCTIONS + 1)
    with pytest.raises(ValueError, match="at most 100,000"):
        synth.write_synthetic("unused", synth.MAX_FUNCTIONS + 1)
    # days too: 100,000 days of 10 functions wrote 84,000 files (3.3 GB) in two minutes
    with pytest.raises(ValueError, match="days must be at most 366"):
        synth.days_of(10, synth.MAX_DAYS + 1)


def test_synth_days_bound_is_one_line(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trace", "synth", "--functions", "10", "--days", "100000", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--days 100,000 is over the most, 366" in err[0], err
    assert not out.exists() or not any(out.iterdir())


def test_synth_writes_each_day_before_making_the_next(tmp_path, monkeypatch):
    import gc
    import weakref

    from clockwork.workloads import synth

    saved: list = []
    real_save = AzureTrace.save

    def save(self, path):
        gc.collect()
        alive = [r for r in saved if r() is not None]
        assert not alive, f"{len(alive)} earlier day(s) still in memory"
        saved.append(weakref.ref(self))
        return real_save(self, path)

    monkeypatch.setattr(AzureTrace, "save", save)
    paths = synth.write_synthetic(tmp_path / "s", 50, 4, seed=3)
    assert len(saved) == 4 and [p.name for p in paths] == [
        f"invocations_per_function_md.anon.d0{d}.csv" for d in range(1, 5)]
    monkeypatch.setattr(AzureTrace, "save", real_save)
    # the same bytes as the days made all at once
    for p, tr in zip(paths, synth.generate(50, 4, seed=3), strict=True):
        assert tr.save(tmp_path / "again.csv").read_bytes() == p.read_bytes()


def test_synth_still_makes_the_shipped_sample(tmp_path):
    from clockwork.resources import checkout_root
    from clockwork.workloads import synth

    root = checkout_root()
    if root is None:
        pytest.skip("not a checkout")
    (p,) = synth.write_synthetic(tmp_path, 500, 1, seed=1, gzip=True)
    assert p.read_bytes() == (root / "traces" / "samples" / p.name).read_bytes()


@pytest.mark.parametrize("value, shown", [("5", "5"), ('""', "''"), ('["a"]', "['a']")])
@pytest.mark.parametrize("key", ["trace", "trace_dir"])
def test_a_trace_path_that_is_no_string_is_named(key, value, shown, capsys, tmp_path):
    """A number, an empty string or a list as a trace path: one line naming the key (it
    was Python's "expected str, bytes or os.PathLike object, not int")."""
    f = tmp_path / "s.toml"
    where = f"{key} = {value}" + ("\nday = 1" if key == "trace_dir" else "")
    f.write_text('duration_s = 1\n[[models]]\nname = "resnet50_v2"\n[[workloads]]\n'
                 f'kind = "azure"\n{where}\n')
    assert main(["simulate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{key} must be a path (a non-empty string), got {shown}" in \
        err[0], err


def test_a_trace_of_no_functions_is_refused_by_name(capsys, tmp_path):
    """A trace file with its header only: ``simulate`` refuses it naming the file (it ran,
    and warned that the rates were too low or the run too short); ``trace info`` shows
    its 0 functions."""
    from clockwork.workloads.azure import HEADER

    t = tmp_path / "header_only.csv"
    t.write_text(HEADER + "\n")
    f = tmp_path / "s.toml"
    f.write_text('duration_s = 1\n[[models]]\nname = "resnet50_v2"\n[[workloads]]\n'
                 f'kind = "azure"\ntrace = "{t}"\n')
    assert main(["simulate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"trace {t} has no functions" in err[0], err
    assert main(["trace", "info", str(t)]) == 0
    assert "functions     0" in capsys.readouterr().out


@pytest.mark.parametrize("count", [-1, 5_000_000_000, 12_345_678_901])
def test_a_trace_saved_with_a_count_out_of_range_is_refused(tmp_path, count):
    """``AzureTrace.save`` of a count outside 0..2^32-1 raises ValueError before anything
    is written: it wrote its last ten digits (12345678901 read back 2345678901), -1
    wrapped around (3709551615), or a file ``load`` then refused."""
    import numpy as np

    from clockwork.workloads.azure import AzureTrace

    ids = [np.array([x]) for x in ("o", "a", "f", "http")]
    c = np.zeros((1, 1440), np.int64)
    c[0, 0] = count
    with pytest.raises(ValueError, match="counts must be from 0 to 4,294,967,295"):
        AzureTrace(*ids, c).save(tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("models", [5, None, [1, 2], {"a": 1}])
def test_build_workload_names_a_models_value_that_is_no_name(models):
    """``build_workload`` (the public builder) with ``models`` neither a name nor a list
    of names: ``WorkloadError`` saying so (a bare TypeError, "'int' object is not
    iterable", came from deep inside)."""
    from clockwork.workloads import build_workload
    from clockwork.workloads.base import WorkloadError

    with pytest.raises(WorkloadError, match="workload models must be a name or glob"):
        build_workload({"kind": "poisson", "rate_rps": 10, "models": models}, {"m": "m"})
