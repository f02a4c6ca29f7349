"""Azure Functions Trace 2019: reading, writing and selecting invocation counts.

The dataset (Microsoft's AzurePublicDataset, see ``traces/README.md``) has one file per
day, ``invocations_per_function_md.anon.dNN.csv`` (older copies
``invocations_per_function_md.svls.anon.dNN.csv``). Its header is
``HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440``; each row is one function and
each minute column counts that function's invocations in that minute of the day.

``AzureTrace.load`` parses a real-size day (about 46,000 rows x 1440 minutes) in a few
seconds: the numeric columns are decoded in bulk with numpy, blocks of lines at a time,
and every row is checked to have exactly 1444 columns of non-negative integers. A
malformed row raises ``TraceError`` naming the file and the 1-based line number; nothing
is ever shifted or skipped silently.

Files may be gzip-compressed (``.csv.gz``; detected by content), as the shipped samples are.
A file is read whole, so its size is bounded: at most ``MAX_TRACE_BYTES`` (1 GiB) of CSV,
after decompression (a full-size day, 40,000-46,000 functions, is 120-160 MB; a larger
file, or a ``.gz`` that inflates past it, is refused with ``TraceError`` before it is held
in memory). Damaged gzip data is a ``TraceError`` too.

Minutes are counted from 0 here (``start_minute = 0`` is the column named ``1``).
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clockwork.resources import checkout_root, resolve_data_path

MINUTES = 1440
ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
HEADER = ",".join(ID_COLUMNS + tuple(str(m) for m in range(1, MINUTES + 1)))
NCOLS = len(ID_COLUMNS) + MINUTES
NAME_FORMS = ("invocations_per_function_md.anon.d{day:02d}.csv",
              "invocations_per_function_md.svls.anon.d{day:02d}.csv")
_BLOCK_BYTES = 8 << 20
#: the most bytes of CSV a trace file may hold (after decompression): a real day is 120-160 MB
MAX_TRACE_BYTES = 1 << 30
_GZ_READ = 16 << 20  # decompressed bytes read at a time
_U32_MAX = 2**32 - 1
# the id columns of one row, in bytes with their commas: the dataset's are three 64-digit
# hashes and a trigger (~210); one id of 2 MB made every id column a numpy string array
# of that width (37 GiB for 5,000 rows)
ID_BYTES_MAX = 1024
# the header line, in bytes (its own is ~6,400): past it the first line is no header (a
# file whose lines end in CR alone is one line; split whole, 70 MB took 929 MB)
HEADER_BYTES_MAX = 2 * len(HEADER)


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file (and line)."""


def trace_file_name(day: int, svls: bool = False) -> str:
    return NAME_FORMS[1 if svls else 0].format(day=int(day))


def trace_dirs(trace_dir: str | Path | None = None) -> list[Path]:
    """Where day files are looked for, in order: ``trace_dir``, ``$AZURE_TRACE_DIR``,
    ``./traces/azure``, and ``traces/azure`` in the project checkout."""
    dirs = []
    if trace_dir is not None:
        dirs.append(Path(trace_dir))
    env = os.environ.get("AZURE_TRACE_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(Path("traces/azure"))
    if (checkout := checkout_root()) is not None:
        dirs.append(checkout / "traces" / "azure")
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def find_trace_file(day: int, trace_dir: str | Path | None = None) -> Path:
    """The invocation file of day ``day`` (1-based), in either name form (or ``.gz``)."""
    if isinstance(day, bool) or not isinstance(day, int | np.integer) or day < 1:
        raise TraceError(f"trace day must be an integer >= 1, got {day!r}")
    dirs = trace_dirs(trace_dir)
    for d in dirs:
        try:
            found = [p for form in NAME_FORMS for suffix in ("", ".gz")
                     if (p := d / (form.format(day=int(day)) + suffix)).is_file()]
        except OSError as e:  # (a folder it may not look into: PermissionError)
            raise TraceError(f"cannot look for day {day}'s trace file in {d}: "
                             f"{e.strerror or e}") from None
        if len(found) > 1:
            # (one was taken, silently: a stale .csv beside a new .csv.gz, say)
            raise TraceError(f"{len(found)} trace files for day {day} in {d} "
                             f"({', '.join(p.name for p in found)}): keep only the one to "
                             "replay there")
        if found:
            return found[0]
    raise TraceError(
        f"no Azure trace file for day {day} ({trace_file_name(day)} or "
        f"{trace_file_name(day, svls=True)}) in {', '.join(str(d) for d in dirs)}; "
        "see traces/README.md for where to get it, or make one with `clockwork trace synth`")


def resolve_trace_path(path: str | Path, base: str | Path | None = None) -> Path:
    """A trace path as given (or relative to the current folder), else relative to
    ``base`` (the scenario file's folder), the shipped data (``traces/samples/...``) or
    the project checkout (see ``clockwork.resources.resolve_data_path``)."""
    try:
        p = resolve_data_path(path, base)
    except FileNotFoundError as e:
        raise TraceError(f"trace file {e} (see traces/README.md)") from None
    if not p.is_file():
        raise TraceError(f"trace file {p} is not a file (see traces/README.md)")
    return p


# ---------------------------------------------------------------------- reading

def _too_big(path: Path, what: str) -> TraceError:
    return TraceError(f"trace file {path} {what} more than {MAX_TRACE_BYTES >> 20:,} MiB of "
                      "CSV, the most a day file may hold (a real day is 120-160 MB): not an "
                      "Azure Functions day file, or a damaged one")


def _read_text(path: Path) -> bytes:
    """The CSV bytes of a trace file (gunzipped if it starts with gzip's magic), at most
    ``MAX_TRACE_BYTES`` of them: a larger file, or gzip data that inflates past that, is
    refused as soon as that is known, never held whole."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                if os.fstat(f.fileno()).st_size > MAX_TRACE_BYTES:
                    raise _too_big(path, "holds")
                f.seek(0)
                return f.read()
            f.seek(0)
            parts: list[bytes] = []
            total = 0
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                while chunk := g.read(_GZ_READ):
                    total += len(chunk)
                    if total > MAX_TRACE_BYTES:
                        raise _too_big(path, "decompresses to")
                    parts.append(chunk)
    except zlib.error as e:
        raise TraceError(f"cannot read trace file {path}: damaged gzip data ({e})") from None
    except (OSError, EOFError) as e:
        raise TraceError(f"cannot read trace file {path}: {getattr(e, 'strerror', None) or e}"
                         ) from e
    buf = b"".join(parts)
    del parts
    return buf


# ---------------------------------------------------------------------- parsing

def _diagnose(line: bytes, path: str, lineno: int) -> TraceError:
    """The precise complaint about one bad line (the slow path, run only on errors)."""
    where = f"{path}:{lineno}"
    if line.endswith(b"\r"):
        return TraceError(f"{where}: the line ends with CR LF (\\r\\n), the header with LF "
                          "alone: give every line the same ending")
    if not line.strip():
        return TraceError(f"{where}: the line is blank (a row of {NCOLS} columns expected: "
                          "remove it)")
    ncols = line.count(b",") + 1  # (counted before the line is split: it may be huge)
    if ncols != NCOLS:
        return TraceError(f"{where}: expected {NCOLS} columns (4 ids + {MINUTES} minutes), "
                          f"found {ncols}")
    fields = line.decode("utf-8", "replace").split(",")
    for j, f in enumerate(fields[len(ID_COLUMNS):]):
        at = f'minute {j} (column "{j + 1}")'  # (minutes count from 0, as start_minute)
        if f.isascii() and f.isdigit():
            if int(f) > _U32_MAX:
                return TraceError(f"{where}: {at}: count {f} is too large (max {_U32_MAX})")
            if len(f) > 10:
                return TraceError(f"{where}: {at}: count {f!r} has {len(f)} digits: at "
                                  "most 10 (zero padding past 10 digits is not read)")
            continue
        if f[:1] == "-" and f[1:].isascii() and f[1:].isdigit():
            return TraceError(f"{where}: {at}: negative invocation count {f}")
        return TraceError(f"{where}: {at}: {f!r} is not a non-negative integer")
    return TraceError(f"{where}: malformed row")


def _check_header(first: bytes, path: str) -> None:
    text = first.decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r")
    if text == HEADER:
        return
    cols = text.split(",")
    if tuple(cols[:4]) != ID_COLUMNS:
        found = ",".join(cols[:4])
        found = ascii(found[:60]) + (" ..." if len(found) > 60 else "")  # (a binary file's)
        raise TraceError(f"{path}:1: header must start with {','.join(ID_COLUMNS)}, "
                         f"found {found}; is this an Azure Functions 2019 "
                         "invocations_per_function file?")
    if len(cols) != NCOLS:
        cr = "\r" in text  # (a small file whose lines end in CR alone: one line)
        raise TraceError(f"{path}:1: header has {len(cols)} columns, expected {NCOLS} "
                         f"(4 ids + minutes 1..{MINUTES})"
                         + ("; its lines end in CR alone: give them LF (or CR LF) endings"
                            if cr else ""))
    for j, c in enumerate(cols[4:], start=1):
        if c != str(j):
            raise TraceError(f"{path}:1: header column {j + 4} is {c!r}, expected {str(j)!r}")
    raise TraceError(f"{path}:1: unexpected header")


def _parse_block(buf: bytes, lo: int, hi: int, path: str, first_lineno: int
                 ) -> tuple[list[list[str]], np.ndarray]:
    """Parse the complete lines in ``buf[lo:hi]`` (``hi`` just past a newline): their id
    columns and their counts (int64, checked to fit uint32)."""
    a = np.frombuffer(buf, np.uint8, hi - lo, lo)
    nl = np.flatnonzero(a == 10)
    k = len(nl)
    com = np.flatnonzero(a == 44)
    per_line = np.diff(np.searchsorted(com, nl), prepend=0)
    line_start = np.empty(k, np.int64)
    line_start[0] = 0
    line_start[1:] = nl[:-1] + 1

    def fail(i: int) -> TraceError:
        return _diagnose(bytes(a[line_start[i]:nl[i]]), path, first_lineno + i)

    bad = np.flatnonzero(per_line != NCOLS - 1)
    if bad.size:
        raise fail(int(bad[0]))
    com = com.reshape(k, NCOLS - 1)
    bad = np.flatnonzero(com[:, 3] - line_start > ID_BYTES_MAX)
    if bad.size:
        i = int(bad[0])
        raise TraceError(f"{path}:{first_lineno + i}: its ids (the first 4 columns) are "
                         f"{int(com[i, 3] - line_start[i]):,} bytes, at most "
                         f"{ID_BYTES_MAX:,} (the dataset's hashes take ~210)")
    starts = com[:, 3:] + 1
    ends = np.empty_like(starts)
    ends[:, :-1] = com[:, 4:]
    ends[:, -1] = nl
    lens = ends - starts
    bad = np.flatnonzero(((lens < 1) | (lens > 10)).any(axis=1))
    if bad.size:
        raise fail(int(bad[0]))
    d = a - np.uint8(48)
    nondigit = (d > 9).view(np.uint8)
    seg = np.empty(2 * k, np.int64)
    seg[0::2] = line_start
    seg[1::2] = starts[:, 0]
    # non-digit bytes in each line's numeric part: exactly the 1439 commas + the newline
    nd = np.add.reduceat(nondigit, seg, dtype=np.int64)[1::2]
    bad = np.flatnonzero(nd != MINUTES)
    if bad.size:
        raise fail(int(bad[0]))
    ends = ends.ravel()
    lens = lens.ravel()
    val = d[ends - 1].astype(np.int64)
    idx = np.flatnonzero(lens > 1)
    j, p = 2, 10
    while idx.size:
        val[idx] += d[ends[idx] - j].astype(np.int64) * p
        idx = idx[lens[idx] > j]
        j += 1
        p *= 10
    if val.size and int(val.max()) > _U32_MAX:
        raise fail(int(np.flatnonzero(val > _U32_MAX)[0]) // MINUTES)
    ids = [buf[lo + s:lo + c].decode("utf-8", "replace").split(",")
           for s, c in zip(line_start.tolist(), com[:, 3].tolist(), strict=True)]
    again = next((i for i, row in enumerate(ids)
                  if row[1:] == _HEADER_IDS[1:] and row[0].lstrip("\ufeff") == ID_COLUMNS[0]),
                 None)
    if again is not None:  # (its minutes "1".."1440" read as counts: a function made up)
        raise TraceError(f"{path}:{first_lineno + again}: a header line again (files joined "
                         "together?): a trace file holds one day, one header, first")
    return ids, val.reshape(k, MINUTES)


_HEADER_IDS = list(ID_COLUMNS)


def _parse(buf: bytes, path: str) -> tuple[list[list[str]], np.ndarray]:
    if buf[:2] in (b"\xff\xfe", b"\xfe\xff") or buf[:4] in (b"H\x00a\x00", b"\x00H\x00a"):
        # (UTF-16, with its byte-order mark or without: the header's "Ha")
        raise TraceError(f"{path}:1: the file is UTF-16 text; save it as UTF-8 (or ASCII), "
                         "as the Azure Functions files are")
    first_end = buf.find(b"\n", 0, HEADER_BYTES_MAX + 1)
    if first_end < 0:
        if len(buf) > HEADER_BYTES_MAX:
            raise TraceError(
                f"{path}:1: no header line ({HEADER_BYTES_MAX:,} bytes without a line end)"
                + (": its lines end in CR alone; give them LF (or CR LF) endings"
                   if b"\r" in buf[:HEADER_BYTES_MAX] else ""))
        first_end = len(buf)
    _check_header(buf[:first_end], path)
    if b"\r" in buf[:first_end + 1]:
        buf = buf.replace(b"\r\n", b"\n")
        if buf.endswith(b"\r"):  # (the last line's CR LF cut short: its LF missing)
            buf = buf[:-1]
        first_end = buf.find(b"\n")
        if first_end < 0:
            first_end = len(buf)
    end = len(buf)  # (less the blank lines at its end, a slice at a time from the end)
    while end > first_end:
        s = max(first_end, end - 65536)
        kept = len(buf[s:end].rstrip(b"\n"))
        if kept:
            end = s + kept
            break
        end = s
    ids: list[list[str]] = []
    if end <= first_end + 1:
        return ids, np.zeros((0, MINUTES), np.uint32)
    rows = buf.count(b"\n", first_end + 1, end) + 1
    counts = np.empty((rows, MINUTES), np.uint32)
    if end == len(buf):
        buf = buf + b"\n"
    end += 1  # include the final newline
    pos = first_end + 1
    row = 0
    while pos < end:
        cut = buf.find(b"\n", min(pos + _BLOCK_BYTES, end - 1)) + 1
        if cut <= 0 or cut > end:
            cut = end
        bids, block = _parse_block(buf, pos, cut, path, row + 2)
        ids.extend(bids)
        counts[row:row + len(bids)] = block
        row += len(bids)
        pos = cut
    return ids, counts


# ---------------------------------------------------------------------- the trace

@dataclass(eq=False)
class AzureTrace:
    """Invocation counts of ``n`` functions over consecutive minutes of one day.

    ``counts[i, j]`` is function ``i``'s count in minute ``start_minute + j`` (0-based
    minute of the day). ``owners``/``apps``/``functions``/``triggers`` are the id columns.
    """

    owners: np.ndarray
    apps: np.ndarray
    functions: np.ndarray
    triggers: np.ndarray
    counts: np.ndarray
    start_minute: int = 0
    source: str = ""
    load_s: float = field(default=0.0, repr=False)

    # -------------------------------------------------------------- I/O

    @classmethod
    def load(cls, path_or_day: str | Path | int, trace_dir: str | Path | None = None
             ) -> AzureTrace:
        """Read a day file, by path or by day number (see ``find_trace_file``)."""
        import time

        if isinstance(path_or_day, int | np.integer) and not isinstance(path_or_day, bool):
            path = find_trace_file(int(path_or_day), trace_dir)
        else:
            path = resolve_trace_path(path_or_day)
        t0 = time.perf_counter()
        buf = _read_text(path)
        ids, counts = _parse(buf, str(path))
        del buf
        cols = list(zip(*ids, strict=True)) if ids else [(), (), (), ()]
        arrs = [np.array(c, dtype=str) if c else np.zeros(0, dtype="<U1") for c in cols]
        tr = cls(arrs[0], arrs[1], arrs[2], arrs[3], counts, 0, str(path))
        tr.load_s = time.perf_counter() - t0
        return tr

    def save(self, path: str | Path) -> Path:
        """Write this (whole-day) trace in the dataset's CSV format (gzip if the name ends
        in ``.gz``; byte-identical for identical traces)."""
        if self.n_minutes != MINUTES or self.start_minute != 0:
            raise ValueError("only a whole day (1440 minutes from minute 0) can be saved")
        c = np.asarray(self.counts)
        if c.size and (c.min() < 0 or c.max() > _U32_MAX):  # (written cut or wrapped around)
            raise ValueError(f"counts must be from 0 to {_U32_MAX:,} (as the dataset's), "
                             f"got {int(c.min()) if c.min() < 0 else int(c.max()):,}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # written aside and moved into place whole: a run stopped midway (Ctrl-C) left a
        # file of the rows written so far, which reads as a valid, smaller day
        part = path.with_name(f".{path.name}.part-{os.getpid()}")
        try:
            self._write(part, path.suffix == ".gz")
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return path

    def _write(self, path: Path, gz: bool) -> None:
        with open(path, "wb") as raw:
            f = gzip.GzipFile("", "wb", 6, raw, mtime=0) if gz else raw
            f.write(HEADER.encode() + b"\n")
            step = 1024
            for lo in range(0, self.n_functions, step):
                hi = min(lo + step, self.n_functions)
                body, row_ends = _format_rows(self.counts[lo:hi])
                prev = 0
                for i, e in enumerate(row_ends.tolist()):
                    r = lo + i
                    f.write(f"{self.owners[r]},{self.apps[r]},{self.functions[r]},"
                            f"{self.triggers[r]},".encode())
                    f.write(body[prev:e])
                    prev = e
            if f is not raw:
                f.close()

    # -------------------------------------------------------------- shape

    @property
    def n_functions(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_minutes(self) -> int:
        return int(self.counts.shape[1])

    def __len__(self) -> int:
        return self.n_functions

    def totals(self) -> np.ndarray:
        """Invocations per function over the minutes held (uint64)."""
        return self.counts.sum(axis=1, dtype=np.uint64)

    def per_minute(self) -> np.ndarray:
        """Invocations per minute over all functions held (uint64)."""
        return self.counts.sum(axis=0, dtype=np.uint64)

    # -------------------------------------------------------------- selection

    def select(self, rows: Sequence[int] | np.ndarray) -> AzureTrace:
        """The functions at ``rows`` (indices or a boolean mask), in that order."""
        rows = np.asarray(rows)
        return AzureTrace(self.owners[rows], self.apps[rows], self.functions[rows],
                          self.triggers[rows], self.counts[rows], self.start_minute,
                          self.source, self.load_s)

    def window(self, start_minute: int = 0, minutes: int | None = None) -> AzureTrace:
        """Minutes ``[start_minute, start_minute + minutes)`` of the day (0-based);
        ``minutes=None`` runs to the end of what is held."""
        lo = int(start_minute) - self.start_minute
        end = self.start_minute + self.n_minutes
        if lo < 0 or start_minute >= end:
            raise ValueError(f"start_minute {start_minute} is outside the minutes held "
                             f"[{self.start_minute}, {end})")
        n = self.n_minutes - lo if minutes is None else int(minutes)
        if n < 1:
            raise ValueError(f"a window of {minutes} minutes is empty: give at least 1")
        if lo + n > self.n_minutes:
            raise ValueError(f"window of {minutes} minutes from minute {start_minute} runs "
                             f"past minute {end} (the day has {MINUTES})")
        return AzureTrace(self.owners, self.apps, self.functions, self.triggers,
                          self.counts[:, lo:lo + n], int(start_minute), self.source, self.load_s)

    def rank_order(self) -> np.ndarray:
        """Row indices by total invocations, busiest first (ties keep file order)."""
        return np.argsort(-self.totals().astype(np.float64), kind="stable")

    def ranked(self, top: int | None = None, ranks: tuple[int, int] | None = None
               ) -> AzureTrace:
        """Functions sorted busiest first; ``top=N`` keeps the N busiest, ``ranks=(a, b)``
        keeps ranks ``a <= r < b`` (rank 0 is the busiest)."""
        if top is not None and ranks is not None:
            raise ValueError("give top or ranks, not both")
        order = self.rank_order()
        if top is not None:
            if top < 1:
                raise ValueError(f"top must be >= 1, got {top}")
            order = order[:top]
        elif ranks is not None:
            a, b = (int(x) for x in ranks)
            if not 0 <= a < b:
                raise ValueError(f"rank range must satisfy 0 <= start < stop, got {ranks}")
            order = order[a:b]
        return self.select(order)

    def repeated_ids(self, rows: np.ndarray | None = None) -> int:
        """How many rows (of ``rows``, indices; default all) have the owner, app, function
        and trigger of a row before them (the dataset's files have none: each names one
        function)."""
        cols = (self.owners, self.apps, self.functions, self.triggers)
        if rows is not None:
            cols = tuple(c[rows] for c in cols)
        n = len(cols[0])
        if n < 2:
            return 0
        return n - len(set(zip(*(c.tolist() for c in cols), strict=True)))

    def trigger_summary(self) -> dict[str, tuple[int, int]]:
        """Trigger -> (functions, invocations), busiest trigger first."""
        tot = self.totals()
        names, inv = np.unique(self.triggers, return_inverse=True)
        nf = np.bincount(inv, minlength=len(names))
        ni = np.bincount(inv, weights=tot.astype(np.float64), minlength=len(names))
        out = {str(n): (int(f), int(round(i))) for n, f, i in zip(names, nf, ni, strict=True)}
        return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def _format_rows(counts: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Decimal text of a block of rows: fields joined by ',' and each row ended by
    '\\n'. Returns the bytes and the end offset of each row."""
    v = np.ascontiguousarray(counts, dtype=np.uint64).ravel()
    ndig = np.ones(v.shape, np.int64)
    for k in range(1, 10):
        ndig += v >= 10**k
    ends = np.cumsum(ndig + 1)  # offset just past each field's separator
    out = np.empty(int(ends[-1]) if v.size else 0, np.uint8)
    last = ends - 2  # last digit
    out[ends - 1] = ord(",")
    out[ends.reshape(counts.shape)[:, -1] - 1] = ord("\n")
    idx = np.arange(v.size)
    q = v.copy()
    k = 0
    while idx.size:
        out[last[idx] - k] = (q[idx] % 10).astype(np.uint8) + 48
        q[idx] //= 10
        k += 1
        idx = idx[ndig[idx] > k]
    return out.tobytes(), ends.reshape(counts.shape)[:, -1]
