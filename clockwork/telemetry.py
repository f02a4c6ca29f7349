"""Request and action records, their log files, and the run summary.

Columns follow Clockwork's telemetry. Times are int ns relative to the run's start
(latency in ns too). In memory the rows are numpy columns, appended in chunks (no Python
object is kept per row): int64 times and ids, small ints for status, batch size, worker
and GPU, model names as int codes into a names table. On disk a run's logs are either
TSV with a header line (``requests.tsv``, ``actions.tsv``; the default) or numpy ``.npz``
files of the same columns plus the names tables (``requests.npz``, ``actions.npz``);
``read_logs`` reads either.
"""

from __future__ import annotations

import contextlib
import errno
import math
import numbers
import os
import secrets
import shutil
import tempfile
import tokenize
import weakref
import zipfile
import zlib
from pathlib import Path

import numpy as np
import orjson

from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
from clockwork.filenames import printable
from clockwork.requests import Reply
from clockwork.time import MAX_TIME_S

REQUEST_COLUMNS = ("request_id", "model", "arrival", "deadline", "latency", "status",
                   "deadline_met", "cold_start", "batch_size", "gpu")
ACTION_COLUMNS = ("action_id", "type", "status", "worker", "gpu", "model", "batch_size",
                  "sent", "earliest", "latest", "expected_duration", "measured_duration",
                  "expected_completion", "measured_completion", "prediction_error")
# the columns' types in memory and in .npz files; ``model`` is a code into the names
# table, ``status`` the RequestStatus / ErrorCode number, ``type`` the ActionType number
_I8, _I32, _I64, _BOOL = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64), np.dtype(bool)
REQUEST_DTYPES = (_I64, _I32, _I64, _I64, _I64, _I8, _BOOL, _BOOL, _I32, _I32)
ACTION_DTYPES = (_I64, _I8, _I8, _I32, _I32, _I32, _I32) + (_I64,) * 8
LOG_FORMATS = ("tsv", "npz")
ROWS_PREFIX = "clockwork-rows-"  # the folder a log's rows wait in (``spill_dir``)

_STATUS = {s.value: s.name for s in RequestStatus}
_TYPE_NAME = {t.value: t.name for t in ActionType}
_ERROR_NAME = {e.value: e.name for e in ErrorCode}
_NO_BOUND = 1 << 62  # an action's ``latest`` at or above this: no bound (-1 in the log)

# rows wait in a flat Python list until this many have come, then move into the columns;
# the columns grow by chunks of at most _CHUNK_ROWS rows (no copy when they grow)
_BUF_ROWS = 4096
_CHUNK_ROWS = 1 << 16
_ROWS_PER_WRITE = 4096  # TSV rows per write call (whole lines only)

_REQUEST_TSV = "%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\n"
_ACTION_TSV = "%d\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n"


def check_log_format(fmt: str) -> str:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    return fmt


class ColumnLog:
    """Rows of integers kept as numpy columns. ``buf`` takes a row's values flattened
    (``buf.extend(row)``; callers call ``drain`` when it holds ``limit`` values or more);
    ``drain`` converts them in one go and copies them into preallocated chunks.

    With ``spill`` (a path prefix), the rows go to one file per column instead
    (``<spill>.<column>``, raw values appended at each ``drain``) and nothing but the
    last ``limit`` values stays in memory; ``arrays`` then returns read-only memory maps
    of those files, so a run of any length keeps its log in bounded memory (the page
    cache holds what the machine can spare)."""

    __slots__ = ("names", "dtypes", "width", "buf", "limit", "_chunks", "_fill", "_rows",
                 "_spill", "_files", "_on_disk", "_disk_maps", "spill_error")

    def __init__(self, names: tuple, dtypes: tuple, spill: Path | None = None,
                 buf_rows: int = _BUF_ROWS) -> None:
        self.names = names
        self.dtypes = dtypes
        self.width = len(names)
        self.buf: list = []
        self.limit = buf_rows * self.width
        self._chunks: list[list[np.ndarray]] = []  # per chunk: one array per column
        self._fill = 0  # rows used in the last chunk
        self._rows = 0  # rows in the chunks (or, spilling, in the files)
        self._spill = spill
        self._files: list | None = None  # spilling: the column files, open for appending
        self._on_disk = 0  # rows in the files after spilling failed (then in memory)
        self._disk_maps: list[np.ndarray] | None = None  # ... mapped as spilling stopped
        self.spill_error: OSError | None = None  # why spilling stopped, if it did
        if spill is not None:
            self._open_files()

    def __len__(self) -> int:
        return self._rows + len(self.buf) // self.width

    def _paths(self) -> list[Path]:
        sp = self._spill
        return [sp.with_name(f"{sp.name}.{n}") for n in self.names]

    def _open_files(self) -> None:
        # new files (new inodes): maps handed out by ``arrays`` before a ``clear`` keep
        # the old files' contents (unlinked, freed when the last map goes)
        paths = self._paths()
        for p in paths:
            p.unlink(missing_ok=True)
        # unbuffered: a row counted is on disk, and a failed write fails that drain only;
        # open for reading too: the rows are read back through them (``_mapped``)
        self._files = _with_more_files(lambda: [p.open("w+b", buffering=0) for p in paths])

    def drain(self) -> None:
        buf = self.buf
        if not buf:
            return
        flat = np.fromiter(buf, dtype=np.int64, count=len(buf)).reshape(-1, self.width)
        buf.clear()  # (the same list: callers may hold it)
        k = len(flat)
        if self._files is not None and self._append_to_files(
                [flat[:, j].astype(dt) for j, dt in enumerate(self.dtypes)]):
            self._rows += k
            return
        i = 0
        while i < k:
            if not self._chunks or self._fill == len(self._chunks[-1][0]):
                cap = min(_CHUNK_ROWS, max(_BUF_ROWS, self._rows))
                self._chunks.append([np.empty(cap, dt) for dt in self.dtypes])
                self._fill = 0
            chunk, f = self._chunks[-1], self._fill
            take = min(k - i, len(chunk[0]) - f)
            part = flat[i:i + take]
            for j, col in enumerate(chunk):
                col[f:f + take] = part[:, j]
            self._fill += take
            self._rows += take
            i += take

    def _append_to_files(self, cols: list[np.ndarray]) -> bool:
        """Spilling: append a column each to the files (contiguous arrays of the columns'
        types, written as they are); False if a write failed (a full disk): then spilling
        has stopped and the caller keeps these rows in memory."""
        try:
            for f, c in zip(self._files, cols, strict=True):
                if f.write(c) != c.nbytes:
                    raise OSError(errno.ENOSPC, f"short write to {f.name}")
        except OSError as e:  # keep what is in the files, the rest in memory
            self._stop_spilling(e)
            return False
        return True

    def _stop_spilling(self, e: OSError) -> None:
        """Writing a column file failed (a full disk): the rows of the earlier drains stay
        in the files, this drain's and all later ones are kept in memory (nothing is lost;
        ``spill_error`` says why)."""
        self.spill_error = e
        # (the rows written mapped through the files before they close: read by name later,
        # they were lost with a folder removed meanwhile)
        self._disk_maps = self._mapped(self._rows) if self._rows else None
        for f in self._files or ():
            try:
                f.close()
            except OSError:
                pass
        self._files = None
        self._on_disk, self._rows = self._rows, 0

    def _mapped(self, n: int) -> list[np.ndarray]:
        """Read-only maps of the column files' first ``n`` rows: through the files still
        open for appending when they are (their folder may have been removed meanwhile, by
        a clean-up job, say: they were opened again by name, and the run's every row was
        lost), else by name."""
        if not n:
            return [np.zeros(0, dt) for dt in self.dtypes]
        # (a file object is left at its end by the map: where the next rows go anyway)
        files = self._paths() if self._files is None else self._files
        return _with_more_files(lambda: [np.memmap(f, dtype=dt, mode="r", shape=(n,))
                                         for f, dt in zip(files, self.dtypes, strict=True)])

    def files_gone(self) -> bool:
        """Spilling: whether the column files are no longer where they were made (their
        folder removed while they are open: their rows are still read through them)."""
        return self._files is not None and not self._paths()[0].exists()

    def arrays(self) -> list[np.ndarray]:
        """The columns (views; the chunks are merged into one on the way; spilling:
        read-only maps of the column files)."""
        self.drain()
        if self._files is not None:
            return self._mapped(self._rows)
        if self._on_disk:  # spilling stopped: the files' rows, then the memory's
            disk, self._on_disk, self._disk_maps = self._disk_maps, 0, None
            mem = self._memory_arrays()
            self._chunks = [[np.concatenate([d, m]) for d, m in zip(disk, mem, strict=True)]]
            self._fill = self._rows = len(self._chunks[0][0])
        return self._memory_arrays()

    def _memory_arrays(self) -> list[np.ndarray]:
        chunks = self._chunks
        if not chunks:
            return [np.zeros(0, dt) for dt in self.dtypes]
        if len(chunks) > 1:
            merged = []
            for j in range(self.width):  # column by column: the old chunks go as we merge
                parts = [c[j] for c in chunks[:-1]] + [chunks[-1][j][:self._fill]]
                merged.append(np.concatenate(parts))
                for c in chunks:
                    c[j] = None
            self._chunks = [merged]
            self._fill = self._rows
        elif len(chunks[0][0]) - self._fill > self._fill // 4:  # (a chunk is made for at
            # least _BUF_ROWS rows: a small run's result kept ~0.5 MiB of slack per log)
            self._chunks = [[a[:self._fill].copy() for a in chunks[0]]]
        out = [a[:self._fill] for a in self._chunks[0]]
        for a in out:  # (views of the log's own rows: what its summary and files read)
            a.flags.writeable = False
        return out

    def set_arrays(self, arrays: list[np.ndarray]) -> None:
        self.clear()
        cols = [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(arrays, self.dtypes, strict=True)]
        if len({len(c) for c in cols}) > 1:
            raise ValueError("columns of different lengths")
        if not len(cols[0]):
            return
        if self._files is not None and self._append_to_files(cols):
            self._rows = len(cols[0])
            return
        self._chunks = [cols]
        self._fill = self._rows = len(cols[0])

    def clear(self) -> None:
        self.buf.clear()
        self._chunks = []
        self._fill = self._rows = self._on_disk = 0
        self._disk_maps = None
        if self._files is not None:
            self.close()
            self._open_files()

    def __getstate__(self) -> dict:
        """Pickled (a run's result sent to another process) as rows in memory: a spilled
        log's column files are its own process's."""
        return {"names": self.names, "dtypes": self.dtypes, "buf_rows": self.limit // self.width,
                "columns": [np.array(a) for a in self.arrays()],  # (copies of any maps)
                "spill_error": self.spill_error}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["names"], state["dtypes"], None, state["buf_rows"])
        self.set_arrays(state["columns"])
        self.spill_error = state["spill_error"]

    def seal(self) -> None:
        """Spilling, once no more rows are to come: the files are closed and their rows
        kept as read-only maps, which outlive the files' removal; rows that come after
        are kept in memory."""
        if self._files is None:
            return
        cols = self.arrays()
        for f in self._files:
            f.close()
        self._files = None
        self._chunks = [cols] if len(cols[0]) else []
        self._fill = self._rows = len(cols[0])

    def close(self) -> None:
        """Spilling: close the column files (they stay on disk until removed) and forget
        their rows; rows that come after are kept in memory."""
        for f in self._files or ():
            f.close()
        if self._files is not None:
            self._files = None
            self._rows = 0


class Telemetry:
    """Collects one row per answered request and per finished action. ``log_format``:
    how ``write`` and ``flush`` store the logs (``"tsv"`` or ``"npz"``). ``spill_dir``:
    keep the rows in column files in a new folder inside it instead of in memory (see
    ``ColumnLog``; ~75 bytes of disk per request at paper scale); the folder is removed
    when this object is (or at ``close``). Pickled, it carries its rows in memory. ``buffer_rows``: rows of each log held as Python values before
    they are converted into columns in one go (fewer: each conversion is shorter, as an
    event loop wants; more: fewer conversions, as the simulator wants)."""

    def __init__(self, origin: int = 0, log_format: str = "tsv",
                 spill_dir: str | Path | None = None, buffer_rows: int = _BUF_ROWS) -> None:
        self.origin = origin
        self.log_format = check_log_format(log_format)
        self.rows_removed = False  # ``close`` removed the spilled rows
        self.models: list = []  # model names by code
        self._model_code: dict = {}
        req_spill = act_spill = None
        self.spill_folder: Path | None = None
        if spill_dir is not None:
            Path(spill_dir).mkdir(parents=True, exist_ok=True)
        try:  # (from before the folder is made: a Ctrl-C as it was made left it behind)
            while spill_dir is not None and self.spill_folder is None:
                # (as tempfile.mkdtemp, but named before it exists, for the except below)
                self.spill_folder = Path(spill_dir) / (ROWS_PREFIX + secrets.token_hex(6))
                try:
                    self.spill_folder.mkdir(mode=0o700)
                except FileExistsError:
                    self.spill_folder = None
            if self.spill_folder is not None:
                req_spill = self.spill_folder / "requests"
                act_spill = self.spill_folder / "actions"
            self._req = ColumnLog(REQUEST_COLUMNS, REQUEST_DTYPES, req_spill, buffer_rows)
            self._act = ColumnLog(ACTION_COLUMNS, ACTION_DTYPES, act_spill, buffer_rows)
            self._finalizer = None if self.spill_folder is None else weakref.finalize(
                self, _remove_spill, self._req, self._act, self.spill_folder)
        except BaseException:  # (a Ctrl-C too: the folder is not left behind)
            if self.spill_folder is not None:
                shutil.rmtree(self.spill_folder, ignore_errors=True)
            raise
        self._rbuf, self._rlimit = self._req.buf, self._req.limit
        self._abuf, self._alimit = self._act.buf, self._act.limit
        self._sent: dict[int, Action] = {}
        self._flushed = False  # flush() has started the TSV files
        self.notes: list[str] = []  # what reading logs left out (read_logs), for the reader

    def __getstate__(self) -> dict:
        """Pickled with its rows in memory (``ColumnLog``): the copy owns no spill folder."""
        state = self.__dict__.copy()
        state["_finalizer"] = state["spill_folder"] = None
        state["_rbuf"] = state["_abuf"] = None  # (the logs' own buffers: set again below)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rbuf, self._abuf = self._req.buf, self._act.buf

    @property
    def spill_error(self) -> OSError | None:
        """With ``spill_dir``: why rows stopped going to files (a full disk), if they did;
        the rows after that were kept in memory."""
        return self._req.spill_error or self._act.spill_error

    def close(self) -> None:
        """With ``spill_dir``: remove the rows' folder now, and its rows with it (columns
        already handed out stay readable); rows that come after are kept in memory.
        Without: nothing."""
        if self._finalizer is not None and self._finalizer.alive:
            self._finalizer()
            self.rows_removed = True

    def seal(self) -> None:
        """With ``spill_dir``, once no more rows are to come (a simulated run ended): the
        rows stay readable (maps of their files) and the rows' folder is removed now,
        not when this object is garbage-collected (a process ended by a signal, as a
        ``multiprocessing`` pool ends its workers on leaving its ``with``, left it on
        disk, a whole run's rows); ``close`` then has nothing to remove. Without
        ``spill_dir``: nothing."""
        if self._finalizer is None or not self._finalizer.alive:
            return
        self._req.seal()
        self._act.seal()
        self._finalizer.detach()
        shutil.rmtree(self.spill_folder, ignore_errors=True)  # (the maps keep their data)
        self.spill_folder = None

    def rows_files_gone(self) -> bool:
        """With ``spill_dir``: whether the rows' files were removed while open (their rows
        are still read through them: written whole at the end)."""
        return self._req.files_gone() or self._act.files_gone()

    def keep(self) -> None:
        """With ``spill_dir``: close the rows' files and leave their folder where it is
        (``read_rows`` reads it; a write of the logs failed, say), not removed at exit.
        Without: nothing."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            self._req.close()
            self._act.close()

    def _code(self, model) -> int:
        code = self._model_code.get(model)
        if code is None:
            code = self._model_code[model] = len(self.models)
            self.models.append(model)
            if self.spill_folder is not None:  # (the codes in it readable after a crash)
                try:
                    with (self.spill_folder / "model_names").open("a") as f:
                        f.write(f"{model}\n")
                except OSError:
                    pass  # (the end's .npz names them all)
        return code

    # requests ------------------------------------------------------------------------

    def reply(self, rep: Reply) -> None:
        r = rep.request
        o = self.origin
        arrival = r.arrival
        deadline = arrival + r.slo
        t = rep.time
        status = int(rep.status)
        m = self._model_code.get(r.model)
        if m is None:
            m = self._code(r.model)
        buf = self._rbuf
        buf.extend((r.id, m, arrival - o, deadline - o, t - arrival, status,
                    status == 0 and t <= deadline, r.cold, rep.batch_size, rep.gpu))
        if len(buf) >= self._rlimit:
            self._req.drain()

    # actions -------------------------------------------------------------------------

    def sent(self, a: Action) -> None:
        self._sent[a.id] = a

    def result(self, res: Result, received: int) -> None:
        a = self._sent.pop(res.id, None)
        if a is None:
            return
        o = self.origin
        end = res.end
        status = res.status
        kind = a.type
        m = self._model_code.get(a.model)
        if m is None:
            m = self._code(a.model)
        buf = self._abuf
        buf.extend((a.id, kind, status, a.worker, a.gpu, m, a.batch_size, a.sent_at - o,
                    a.earliest - o if a.earliest else 0,
                    a.latest - o if a.latest < _NO_BOUND else -1, a.expected_duration,
                    res.held, a.expected_end - o, end - o if end else received - o,
                    end - a.expected_end if not status and kind != ActionType.EVICT else 0))
        if len(buf) >= self._alimit:
            self._act.drain()

    def unfinished_actions(self) -> int:
        return len(self._sent)

    def forget_unfinished(self) -> int:
        """The controller that sent the actions not finished yet is gone (a simulated
        controller restart): they will never be logged. Returns how many there were."""
        n = len(self._sent)
        self._sent.clear()
        return n

    # the logs ------------------------------------------------------------------------

    def request_columns(self) -> dict[str, np.ndarray]:
        """The request log as columns (``model``: codes into ``models``)."""
        return dict(zip(REQUEST_COLUMNS, self._req.arrays(), strict=True))

    def action_columns(self) -> dict[str, np.ndarray]:
        """The action log as columns (``model``: codes into ``models``; ``type`` and
        ``status``: ActionType and ErrorCode numbers)."""
        return dict(zip(ACTION_COLUMNS, self._act.arrays(), strict=True))

    @property
    def requests(self) -> list[tuple]:
        """The request rows as tuples (made on each access): request_id, model, arrival,
        deadline, latency, status (int), deadline_met, cold_start (bools), batch_size, gpu."""
        cols = [c.tolist() for c in self._req.arrays()]
        models = self.models
        cols[1] = [models[c] for c in cols[1]]
        return list(zip(*cols, strict=True))

    @requests.setter
    def requests(self, rows) -> None:
        self._req.clear()
        for r in rows:
            self._rbuf.extend((r[0], self._code(r[1]), *r[2:]))
        self._req.drain()

    @property
    def actions(self) -> list[tuple]:
        """The action rows as tuples (made on each access), ACTION_COLUMNS order, with
        ``type`` and ``status`` as names."""
        cols = [c.tolist() for c in self._act.arrays()]
        models = self.models
        cols[1] = [_TYPE_NAME[c] for c in cols[1]]
        cols[2] = [_ERROR_NAME.get(c, c) for c in cols[2]]
        cols[5] = [models[c] for c in cols[5]]
        return list(zip(*cols, strict=True))

    @actions.setter
    def actions(self, rows) -> None:
        self._act.clear()
        for r in rows:
            kind = ActionType[r[1]] if isinstance(r[1], str) else r[1]
            status = ErrorCode[r[2]] if isinstance(r[2], str) else r[2]
            self._abuf.extend((r[0], kind, status, *r[3:5], self._code(r[5]), *r[6:]))
        self._act.drain()

    # output --------------------------------------------------------------------------

    def write(self, out: Path, log_format: str | None = None) -> None:
        """Every row so far into ``out`` as ``log_format`` (default ``self.log_format``):
        requests.tsv and actions.tsv, or requests.npz and actions.npz; the other
        format's files, left there by an earlier run, are removed. ValueError once
        ``close`` removed the spilled rows (logs without them would sit beside a summary
        that counts them)."""
        fmt = check_log_format(log_format or self.log_format)
        if self.rows_removed:
            raise ValueError("the run's rows were removed (Telemetry.close with spill_dir): "
                             "its logs can no longer be written")
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for other in LOG_FORMATS:
            if other != fmt:
                for name in ("requests", "actions"):
                    (out / f"{name}.{other}").unlink(missing_ok=True)
        if fmt == "npz":
            self._write_npz(out)
        else:
            self._write_tsv(out, append=False)

    def flush(self, out: Path, final: bool = False) -> None:
        """TSV: append the rows collected since the last flush to ``out``'s logs and
        forget them (a long-running controller's memory stays flat); the first flush
        starts the files with their headers. npz: the rows collected move to their column
        files (on disk when spilling) until ``final``, which writes every row (the .npz
        files are written once, at the end). ``write`` is the
        all-at-once form; ``flush_steps`` the same work in steps."""
        for _ in self.flush_steps(out, final):
            pass

    def flush_steps(self, out: Path, final: bool = False, rows_per_step: int = _ROWS_PER_WRITE):
        """``flush`` as a generator: the rows are taken (and forgotten here) when the first
        step runs, and each step appends at most ``rows_per_step`` of them to one of the
        files, so that an event loop can serve everyone else between steps (formatting a
        busy second's rows takes milliseconds per thousand). Run it to the end: rows of
        an abandoned one are lost. npz: one step, at ``final``."""
        out = Path(out)
        first = not self._flushed
        if self.log_format == "npz" and not final:
            # the rows collected since into their column files (spilling: on disk, where a
            # crash leaves them; up to a buffer's worth waited in memory until the next)
            self._req.drain()
            self._act.drain()
            return
        if first:  # (npz: at the final flush, the one that writes)
            out.mkdir(parents=True, exist_ok=True)
            _keep_earlier_logs(out)
        self._flushed = True
        if self.log_format == "npz":
            self.write(out)
            return
        # views that outlive the clear (in memory: the chunks' arrays; spilling: maps of
        # the old files, which clear replaces with new ones)
        req, act, models = self._req.arrays(), self._act.arrays(), list(self.models)
        self._req.clear()
        self._act.clear()
        if self.spill_folder is None:  # no row left uses the codes: a new table, so that a
            # long-running controller does not keep (and copy at every flush) every name
            # it ever logged (its spilled rows' model_names file, when spilling, keeps them)
            self.models, self._model_code = [], {}
        yield from _tsv_steps(out, req, act, models, not first, rows_per_step)

    def _write_tsv(self, out: Path, append: bool) -> None:
        for _ in _tsv_steps(out, self._req.arrays(), self._act.arrays(), list(self.models),
                            append, _ROWS_PER_WRITE):
            pass

    def _write_npz(self, out: Path) -> None:
        names = np.array([str(m) for m in self.models], dtype=str)
        _write_npz(out / "requests.npz", {
            **self.request_columns(), "model_names": names,
            "status_codes": np.array(list(_STATUS), dtype=np.int8),
            "status_names": np.array(list(_STATUS.values()), dtype=str)})
        _write_npz(out / "actions.npz", {
            **self.action_columns(), "model_names": names,
            "type_codes": np.array(list(_TYPE_NAME), dtype=np.int8),
            "type_names": np.array(list(_TYPE_NAME.values()), dtype=str),
            "status_codes": np.array(list(_ERROR_NAME), dtype=np.int8),
            "status_names": np.array(list(_ERROR_NAME.values()), dtype=str)})

    def summary(self, duration_s: float, extra: dict | None = None) -> dict:
        return summary_of(self.request_columns(), self.action_columns(), duration_s, extra)


def _with_more_files(call):
    """``call()`` (opening or mapping spilled column files), once more after raising the
    process's soft limit on open files to its hard limit if it ran out: each column is a
    file, and the read-only maps a kept result holds its rows in keep one open each (25
    a run). Still out: an ``OSError`` (EMFILE) that says so."""
    try:
        return call()
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return call()
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
    except (ImportError, ValueError):  # (no resource module, or a limit not raised)
        pass
    raise OSError(errno.EMFILE, "too many open files: rows kept in files (spill_dir) hold "
                  "one open file per column, 25 a run, for as long as its result is kept; "
                  "drop the results no longer needed, or raise the limit (ulimit -n)")


def _remove_spill(req: ColumnLog, act: ColumnLog, folder: Path) -> None:
    req.close()
    act.close()
    shutil.rmtree(folder, ignore_errors=True)  # (maps still open keep their data)


def _tsv_steps(out: Path, req: list, act: list, model_names: list, append: bool, rows: int):
    """Write (or with ``append``, add to) requests.tsv and actions.tsv from the columns
    ``req`` and ``act`` (model codes into ``model_names``), ``rows`` rows per write;
    a generator that yields after each write."""
    models = np.array(model_names + [None], dtype=object)[:-1]  # (1-d even for tuples)
    status = np.array([_STATUS.get(v, v) for v in range(-128, 128)], dtype=object)

    def req_blocks():
        for i in range(0, len(req[0]), rows):
            cols = [c[i:i + rows] for c in req]
            lists = [c.tolist() for c in cols]
            lists[1] = models[cols[1]].tolist()
            lists[5] = status[cols[5].astype(np.int64) + 128].tolist()
            yield lists

    kinds = np.array([_TYPE_NAME.get(v, v) for v in range(-128, 128)], dtype=object)
    errors = np.array([_ERROR_NAME.get(v, v) for v in range(-128, 128)], dtype=object)

    def act_blocks():
        for i in range(0, len(act[0]), rows):
            cols = [c[i:i + rows] for c in act]
            lists = [c.tolist() for c in cols]
            lists[1] = kinds[cols[1].astype(np.int64) + 128].tolist()
            lists[2] = errors[cols[2].astype(np.int64) + 128].tolist()
            lists[5] = models[cols[5]].tolist()
            yield lists

    yield from _write_tsv(out / "requests.tsv", REQUEST_COLUMNS, _REQUEST_TSV, req_blocks(), append)
    yield from _write_tsv(out / "actions.tsv", ACTION_COLUMNS, _ACTION_TSV, act_blocks(), append)


def _keep_earlier_logs(out: Path) -> None:
    """A controller's first flush into a folder that holds an earlier run's logs (a
    controller restarted with the same --log-dir), TSV or npz: those become
    ``requests.N.tsv`` and ``actions.N.tsv`` (or ``requests.N.npz``, ``actions.N.npz``),
    N the next number free in both formats, not overwritten (nor, in the other format,
    removed)."""
    old = [out / f"{n}.{fmt}" for n in ("requests", "actions") for fmt in LOG_FORMATS]
    old += [out / "summary.json", out / "run.json"]  # (a finished run's: its table)
    if not any(p.exists() for p in old):
        return
    n = 1
    while any((out / f"{p.stem}.{n}{p.suffix}").exists() for p in old):
        n += 1
    for p in old:
        if p.exists():
            p.rename(out / f"{p.stem}.{n}{p.suffix}")


def _write_all(f, data: bytes) -> None:
    """All of ``data`` to the unbuffered file ``f`` (a raw write may take only part); if
    that fails (a full disk), the file is cut back to where it was, so that it still
    ends with a whole line, and the error raised."""
    start = f.tell()
    view = memoryview(data)
    try:
        while view:
            n = f.write(view)
            if not n:
                raise OSError(errno.ENOSPC, "no byte written")
            view = view[n:]
    except OSError:
        try:
            f.truncate(start)
        except OSError:
            pass
        raise


def _write_tsv(path: Path, columns: tuple, fmt: str, blocks, append: bool = False):
    """Whole rows only: unbuffered, each write a run of complete lines written entirely or
    taken back (``_write_all``), so a process killed while writing, or a write that
    fails, leaves every row it wrote intact and none half-written. ``blocks``: lists of
    column values, ``fmt`` one line's %-format. A generator: yields after each write."""
    line = fmt.__mod__
    with _naming(path), path.open("ab" if append else "wb", buffering=0) as f:
        if not append or not f.tell():  # (a new file: one that went missing since)
            _write_all(f, ("\t".join(columns) + "\n").encode())
        for cols in blocks:
            _write_all(f, "".join(map(line, zip(*cols, strict=True))).encode())
            yield


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A compressed .npz (what ``np.savez_compressed`` writes, at zlib level 1: about the
    size of its level 6 in a quarter of the time), written under a temporary name and
    renamed into place (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with _naming(path):
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, allowZip64=True,
                                 compresslevel=1) as z:
                for name, a in arrays.items():
                    with z.open(name + ".npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)
        except BaseException:  # (a full disk, a signal: the part written goes, not left)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)


@contextlib.contextmanager
def _naming(path: Path):
    """An ``OSError`` without a file name (a write that failed: a full disk) raised as
    the same error naming ``path``, so that the one line a command prints says which
    file it could not write."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e


def is_log_file(path: Path) -> bool:
    """Whether ``path`` names one of a log pair's files rather than a run folder: a
    request or action log under its own name or renamed by its suffix, as a rotated log
    is (``requests.tsv.1``, ``actions.1.npz``)."""
    return (path.name.startswith(("requests.", "actions.")) and not path.is_dir()
            and any(f".{fmt}" in path.suffixes for fmt in LOG_FORMATS))


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip")  # (logrotate's ``compress``, say)


def log_pair(path: Path) -> tuple[Path, Path, str]:
    """``(requests file, actions file, format)`` of the logs ``path`` names: a run
    folder's (``requests.tsv``/``actions.tsv`` or the npz pair, whichever request log is
    newer), or, for one of a pair's files (``is_log_file``), that pair: the file and the
    other one of the same name after ``requests``/``actions`` (``requests.tsv.1`` and
    ``actions.tsv.1``). Raises ``FileNotFoundError`` without a request log."""
    if not is_log_file(path):
        fmt = _format_in(path)
        return path / f"requests.{fmt}", path / f"actions.{fmt}", fmt
    if path.suffix in COMPRESSED_SUFFIXES:
        raise ValueError(f"{path}: a compressed log ({path.suffix}): decompress it, and the "
                         "other file of its pair, first")
    tail = path.name.split(".", 1)[1]
    requests, actions = (path.with_name(f"{k}.{tail}") for k in ("requests", "actions"))
    if not requests.is_file():
        raise FileNotFoundError(f"no {requests.name} beside {path.name} in {path.parent}"
                                if requests != path else f"no such file: {path}")
    return requests, actions, "npz" if ".npz" in path.suffixes else "tsv"


def read_logs(run_dir: str | Path) -> Telemetry:
    """A run directory's logs as a ``Telemetry`` (its columns; ``log_format`` the format
    found): requests.npz/actions.npz or requests.tsv/actions.tsv, whichever ``requests``
    file is newer if both are there; or, ``run_dir`` one file of a pair, that pair
    (``log_pair``). A missing actions file reads as no actions.
    Without either, the rows a controller writing npz logs left in a ``clockwork-rows-*``
    folder there (killed before it wrote its logs; ``read_rows``). Raises
    ``FileNotFoundError`` without any of these, ``ValueError`` for a file that is not
    such a log."""
    run_dir = Path(run_dir)
    try:
        requests, actions, fmt = log_pair(run_dir)
    except FileNotFoundError:
        rows = None if is_log_file(run_dir) else rows_folder(run_dir)
        if rows is None:
            raise
        return read_rows(rows)
    tel = Telemetry(0, fmt)
    read = _read_npz if fmt == "npz" else _read_tsv
    read(tel, requests, tel._req)
    _check_values(requests, dict(zip(tel._req.names, tel._req.arrays(), strict=True)))
    if actions.exists():
        read(tel, actions, tel._act)
    return tel


def rows_folder(run_dir: Path) -> Path | None:
    """The newest ``clockwork-rows-*`` folder in ``run_dir`` that holds a request log's
    rows (``Telemetry(spill_dir=run_dir)``), or None."""
    found = [(p.stat().st_mtime_ns, p) for p in run_dir.glob(ROWS_PREFIX + "*")
             if (p / "requests.status").is_file()] if run_dir.is_dir() else []
    return max(found)[1] if found else None


def read_rows(folder: str | Path) -> Telemetry:
    """The rows a ``Telemetry`` with a ``spill_dir`` keeps in ``folder`` (one file of raw
    native-endian values per column, ``model_names`` one name a line), as a
    ``Telemetry`` with its rows in memory: what a controller writing npz logs leaves
    when it is killed before it writes them. A log's rows are those all of its column
    files hold (a kill part way through appending leaves some columns a few rows
    longer: those rows are left out, and ``notes`` says so). ``ValueError`` for values
    no writer writes (as ``read_logs``)."""
    folder = Path(folder)
    names_file = folder / "model_names"
    try:
        text = names_file.read_text(encoding="utf-8") if names_file.exists() else ""
    except UnicodeDecodeError:
        raise _BadLog(f"{names_file}: not a list of model names (not UTF-8 text)") from None
    models = text.split("\n")
    if models and models[-1] == "":
        models.pop()
    tel = Telemetry(0, "npz")
    for m in models:
        tel._code(m)
    for log, kind in ((tel._req, "requests"), (tel._act, "actions")):
        paths = [folder / f"{kind}.{c}" for c in log.names]
        sizes = [p.stat().st_size if p.exists() else 0 for p in paths]
        n = min(size // dt.itemsize for size, dt in zip(sizes, log.dtypes, strict=True))
        if any(size != n * dt.itemsize for size, dt in zip(sizes, log.dtypes, strict=True)):
            tel.notes.append(f"{folder}: the {kind} log's column files hold different "
                             f"numbers of rows (a writer stopped part way): the {n:,} "
                             "rows all of them hold are read")
        cols = []
        for p, dt, name in zip(paths, log.dtypes, log.names, strict=True):
            col = np.fromfile(p, dtype=np.uint8 if dt == _BOOL else dt, count=n) if n else (
                np.zeros(0, dt))
            if dt == _BOOL:
                if len(col) and int(col.max()) > 1:
                    raise _BadLog(f"{p}: column '{name}': {int(col.max())} is not 0 or 1")
                col = col.astype(bool)
            cols.append(col)
        log.set_arrays(cols)
        where = f"{folder / kind}.model"
        _check_codes(where, tel._act.arrays()[5] if kind == "actions"
                     else tel._req.arrays()[1], len(models))
    _check_values(folder / "requests.status", tel.request_columns())
    return tel


def _check_values(path: Path, cols: dict[str, np.ndarray]) -> None:
    """ValueError unless every request row read from ``path`` (``cols``: some of its
    columns) has a known status (one the writer never writes would count as neither a
    success nor a failure, and the table would contradict itself) and was not answered
    before it came. (An action log's numbers without a name are read back as they are: a
    writer may know action types and codes this reader does not.)"""
    status = cols.get("status", np.zeros(0, np.int8))
    latency = cols.get("latency", np.zeros(0, np.int64))
    codes = np.fromiter(_STATUS, np.int64)
    step = 1 << 20  # rows at a time (a run's log may not fit twice in memory)
    for k in range(0, len(status), step):
        bad = ~np.isin(status[k:k + step], codes)
        if bad.any():
            i = k + int(np.argmax(bad))
            known = ", ".join(f"{c} {n}" for c, n in sorted(_STATUS.items()))
            raise _BadLog(f"{path}: row {i + 1}: column 'status': {int(status[i])} is not a "
                          f"request status ({known})")
    if len(latency) and latency.min() < 0:
        i = int(np.argmin(latency))
        raise _BadLog(f"{path}: row {i + 1}: column 'latency': {int(latency[i])} ns, "
                      "answered before it arrived")


def _format_in(run_dir: Path) -> str:
    """The format of a run directory's logs: the one whose requests file is newer if both
    are there; raises ``FileNotFoundError`` without one."""
    found = [(p.stat().st_mtime_ns, fmt) for fmt in LOG_FORMATS
             if (p := run_dir / f"requests.{fmt}").exists()]
    if not found:
        raise FileNotFoundError(f"no requests.tsv or requests.npz in {run_dir}")
    return max(found)[1]


# what np.load raises for a file that is not a whole .npz (truncated: BadZipFile, EOFError;
# a member's .npy header garbled: TokenError or SyntaxError from its parsing; a compressed
# member garbled: zlib.error)
_UNREADABLE_NPZ = (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile,
                   tokenize.TokenError, SyntaxError, zlib.error)


class _BadLog(ValueError):
    """A log file that cannot be read as one; the message names the file (and line)."""


def _undecodable_line(path: Path, after: int) -> int:
    """The number of the first line of ``path`` after line ``after`` that is not UTF-8
    text (a block of lines failed to decode: which one of them)."""
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if n > after:
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    return n
    return after + 1


def _value_range(dt: np.dtype) -> tuple[int, int]:
    """The smallest and largest value a log column of type ``dt`` holds."""
    if dt == _BOOL:
        return 0, 1
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _range_words(dt: np.dtype) -> str:
    """What a value of a log column of type ``dt`` must be, after "is not"."""
    lo, hi = _value_range(dt)
    return "0 or 1" if dt == _BOOL else f"within {lo:,}..{hi:,}"


def _kind_words(dt: np.dtype) -> str:
    """``dt`` in words, for a column that should hold integers."""
    what = {"f": "floating-point", "U": "text", "S": "bytes", "O": "object", "c": "complex",
            "V": "structured", "M": "datetime", "m": "timedelta"}.get(dt.kind, "")
    return f"{what} values ({dt})" if what else f"{dt} values"


def _check_form(where: str, name: str, shape: tuple, dtype: np.dtype) -> None:
    """ValueError naming ``where`` and column ``name`` unless its ``shape`` is one value a
    row and its ``dtype`` integers (or bools): of an array, or of a .npy header."""
    if len(shape) != 1:
        raise _BadLog(f"{where}: column '{name}' has shape {shape}, not one value a row")
    if dtype.kind not in "biu":
        raise _BadLog(f"{where}: column '{name}' holds {_kind_words(dtype)}, not integers")


def _fit_column(where: str, name: str, a: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Column ``name`` as read from ``where``, as type ``dt``: ValueError naming both
    unless it is one-dimensional, of integers (or bools), every value within ``dt``."""
    _check_form(where, name, a.shape, a.dtype)
    if a.dtype == dt:
        return a
    if len(a) and not np.can_cast(a.dtype, dt):
        lo, hi = _value_range(dt)
        amin, amax = int(a.min()), int(a.max())
        if amin < lo or amax > hi:
            raise _BadLog(f"{where}: column '{name}' holds {amin if amin < lo else amax}, "
                          f"not {_range_words(dt)}")
    return a.astype(dt)


def _check_codes(where: str, codes: np.ndarray, n_names: int) -> None:
    """ValueError unless every model code is an index into the ``n_names`` model names."""
    if len(codes):
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= n_names:
            raise _BadLog(f"{where}: column 'model' holds code {lo if lo < 0 else hi}, but "
                             f"model_names has {n_names} name(s) (codes 0..{n_names - 1})")


def _model_names(where: str, z) -> list[str]:
    a = z["model_names"]
    if a.ndim != 1 or a.dtype.kind not in "US":
        raise _BadLog(f"{where}: model_names is {a.dtype} of shape {a.shape}, not a list "
                         "of names")
    return a.tolist()


def _npy_header(z, name: str) -> tuple[tuple, np.dtype]:
    """The shape and type of member ``name`` of an open .npz, from its header alone."""
    fmt = np.lib.format
    with z.zip.open(name + ".npy") as f:
        version = fmt.read_magic(f)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(f)
    return shape, dtype


def _memory_room() -> int | None:
    """Bytes this process can still take, as far as it can tell: the memory the machine
    has available, and what is left of an address-space limit (``ulimit -v``); None if
    neither is known."""
    import resource

    room = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    room = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            room = soft - used if room is None else min(room, soft - used)
    except (OSError, ValueError, IndexError):
        pass
    return room


def _check_npz_columns(path: Path, z, want: tuple, dtypes: dict, extra_per_row: int = 0
                       ) -> None:
    """Before any of them is read: the columns ``want`` of the open .npz at ``path`` are
    there, one-dimensional, integers (or bools), of one length, and they (with
    ``extra_per_row`` bytes a row more) fit in the memory this process can take.
    ValueError naming the file and the column otherwise."""
    rows = None
    need = 0
    for c in want:
        if c not in z.files:
            raise _BadLog(f"{path}: not a log file (no column '{c}')")
        shape, dtype = _npy_header(z, c)
        _check_form(str(path), c, shape, dtype)
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            raise _BadLog(f"{path}: columns of different lengths ('{want[0]}' has "
                             f"{rows:,} rows, '{c}' {shape[0]:,})")
        need += shape[0] * (dtype.itemsize + (dtypes[c].itemsize if dtype != dtypes[c] else 0))
    need += (rows or 0) * extra_per_row
    room = _memory_room()
    if room is not None and need > room:
        raise _BadLog(f"{path}: its {rows:,} rows need {need / 2**30:,.2f} GiB of memory "
                         f"to read, more than the {max(room, 0) / 2**30:,.2f} GiB this process "
                         "can take")


def _load_npz_columns(path: Path, z, want: tuple, dtypes: dict) -> dict[str, np.ndarray]:
    """The columns ``want`` of the open .npz at ``path``, checked (``_check_npz_columns``
    first) and as their log types."""
    out = {}
    for c in want:
        try:
            a = z[c]
        except MemoryError:
            raise _BadLog(f"{path}: column '{c}' does not fit in this process's memory"
                             ) from None
        out[c] = _fit_column(str(path), c, a, dtypes[c])
    return out


def _read_npz(tel: Telemetry, path: Path, log: ColumnLog) -> None:
    dtypes = dict(zip(log.names, log.dtypes, strict=True))
    try:
        with np.load(path, allow_pickle=False) as z:
            # (model codes become names' codes: int64, then the column's type)
            _check_npz_columns(path, z, log.names, dtypes, extra_per_row=16)
            cols = list(_load_npz_columns(path, z, log.names, dtypes).values())
            names = _model_names(str(path), z)
    except _BadLog:
        raise
    except _UNREADABLE_NPZ as e:
        raise _BadLog(f"{path}: not a log file ({e})") from None
    codes = np.array([tel._code(n) for n in names] + [0], dtype=np.int64)[:-1]
    m = log.names.index("model")
    _check_codes(str(path), cols[m], len(names))
    cols[m] = codes[cols[m]] if len(cols[m]) else cols[m]
    log.set_arrays(cols)


_TSV_READ_ROWS = 1 << 16  # rows parsed at a time (Python objects for these only)


def _read_tsv(tel: Telemetry, path: Path, log: ColumnLog) -> None:
    """A TSV log into ``log``'s columns, ``_TSV_READ_ROWS`` lines at a time: only those
    lines are ever Python objects, so a log of any length reads in about its columns'
    memory. A row that is not one (a field too many or too few, a value that is not a
    number, or one outside its column's type) is a ValueError naming the file, line and
    column. A last line without its end of line (every row is written with one: a
    writer killed part way through a line) is left out, and ``tel.notes`` says so."""
    status_of = {v: k for k, v in (_STATUS if log.names == REQUEST_COLUMNS
                                   else _ERROR_NAME).items()}
    type_of = {v: k for k, v in _TYPE_NAME.items()}
    ranges = [None if dt == _I64 else _value_range(dt) for dt in log.dtypes]

    def columns(rows: list[list[str]]) -> list[np.ndarray] | None:
        """The rows' columns; None if some row is bad (``_bad_tsv_row`` says which)."""
        if any(len(r) != log.width for r in rows):
            return None
        out = []
        for name, dt, lim, values in zip(log.names, log.dtypes, ranges,
                                         zip(*rows, strict=True), strict=True):
            try:
                if name == "model":
                    col = np.array([tel._code(v) for v in values], dtype=np.int64)
                elif name == "status":
                    col = np.array([status_of[v] if v in status_of else int(v)
                                    for v in values], dtype=np.int64)
                elif name == "type":
                    col = np.array([type_of[v] if v in type_of else int(v) for v in values],
                                   dtype=np.int64)
                else:
                    col = np.fromiter(map(int, values), np.int64, len(values))
            except (ValueError, OverflowError):  # (not a number, or past int64)
                return None
            if lim is not None and name != "model" and (
                    int(col.min()) < lim[0] or int(col.max()) > lim[1]):
                return None
            out.append(col.astype(dt))
        return out

    parts: list[list[np.ndarray]] = []
    lineno = 1  # the line before the block being read
    try:
        with path.open(encoding="utf-8") as f:
            header = f.readline().rstrip("\n").split("\t")
            if tuple(header) != log.names:
                raise _BadLog(_header_line(path, header, log.names))
            while True:
                lines = f.readlines(_TSV_READ_ROWS * 64)  # (a size hint: whole lines)
                if not lines:
                    break
                if not lines[-1].endswith("\n"):  # the file's last line, cut off
                    cut = lines.pop()
                    if cut.strip():
                        tel.notes.append(
                            f"{path}: line {lineno + len(lines) + 1} has no end of line (the "
                            "writer was stopped while writing it): left out")
                rows = [line.rstrip("\n").split("\t") for line in lines if line.strip()]
                if rows:
                    cols = columns(rows)
                    if cols is None:
                        raise _bad_tsv_row(path, log, lines, lineno + 1, status_of, type_of)
                    parts.append(cols)
                lineno += len(lines)
    except UnicodeDecodeError as e:
        raise _BadLog(f"{path}: not a log file: bytes that are not UTF-8 text on line "
                      f"{_undecodable_line(path, 0)} ({e.reason})") from None
    if not parts:
        log.set_arrays([np.zeros(0, dt) for dt in log.dtypes])
        return
    cols = []
    for j in range(log.width):  # column by column: the parts go as they are joined
        cols.append(np.concatenate([p[j] for p in parts]) if len(parts) > 1 else parts[0][j])
        for p in parts:
            p[j] = None
    log.set_arrays(cols)


def _bad_tsv_row(path: Path, log: ColumnLog, lines: list[str], first: int, status_of: dict,
                 type_of: dict) -> ValueError:
    """What is wrong with the first bad row of ``lines`` (line ``first`` of ``path`` on):
    the slow path, run only when a block of rows failed."""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{first + i}"
        row = line.rstrip("\n").split("\t")
        if len(row) != log.width:
            return _BadLog(f"{where}: {len(row)} tab-separated fields, expected {log.width}")
        for name, dt, v in zip(log.names, log.dtypes, row, strict=True):
            if name == "model" or (name == "status" and v in status_of) or (
                    name == "type" and v in type_of):
                continue
            try:
                x = int(v)
            except ValueError:
                what = ("a status name or a number" if name == "status" else
                        "an action type name or a number" if name == "type" else "an integer")
                return _BadLog(f"{where}: column '{name}': {v.strip()!r} is not {what}")
            lo, hi = _value_range(dt)
            if not lo <= x <= hi:
                return _BadLog(f"{where}: column '{name}': {x} is not {_range_words(dt)}")
    return _BadLog(f"{path}: lines {first}-{first + len(lines) - 1}: not a log's rows")


def _header_line(path: Path, header: list[str], names: tuple) -> str:
    """What is wrong with a TSV log's header: the columns missing, the ones it has that
    a log has not, or the first out of order (an older or another version's log)."""
    if not set(header) & set(names):
        return f"{path}: not a log file (header {header[:3]}...)"
    missing = [n for n in names if n not in header]
    extra = [h for h in header if h not in names]
    if missing or extra:
        what = "; ".join(([f"no column {', '.join(map(repr, missing))}"] if missing else [])
                         + ([f"unknown column(s) {', '.join(map(repr, extra))}"] if extra else []))
    elif (i := next((i for i, (h, n) in enumerate(zip(header, names, strict=False))
                     if h != n), None)) is not None:
        what = f"column {i + 1} is {header[i]!r}, where a log has {names[i]!r}"
    else:  # (a column twice)
        what = f"{len(header)} columns, where a log has {len(names)}"
    return f"{path}: not a log file of this version ({what})"


def _pct(values: np.ndarray, q: float) -> float:
    """``values``' q-th percentile in ms; ``values`` is a scratch copy: partitioned in place
    (the same figure, without a second copy of a long run's latencies)."""
    return round(float(np.percentile(values, q, overwrite_input=True)) / 1e6, 6) if len(values) else 0.0


def summarize(requests, actions, duration_s: float, extra: dict | None = None) -> dict:
    """The run summary (keys listed in docs/contracts.md), from request and action rows
    (as ``Telemetry.requests`` / ``.actions``). Deterministic."""
    tel = Telemetry(0)
    tel.requests = requests
    tel.actions = actions
    return tel.summary(duration_s, extra)


def _check_seconds(value: object, what: str) -> None:
    """ValueError unless ``value`` is a finite number of seconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            0 <= value < math.inf):
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")


def summary_of(req: dict, act: dict, duration_s: float, extra: dict | None = None) -> dict:
    """``summary``'s figures from columns (``Telemetry.request_columns()`` /
    ``action_columns()``, or a selection of their rows)."""
    status, lat = req["status"], req["latency"]
    n = len(status)
    ok = status == RequestStatus.SUCCESS
    succeeded = int(ok.sum())
    dropped = int((status == RequestStatus.TIMEOUT).sum())
    invalid = int((status == RequestStatus.INVALID_REQUEST).sum())
    failed = n - succeeded - dropped
    slo_met = int(req["deadline_met"].sum())
    lat_ok = lat[ok]
    kind, ran, err = act["type"], act["status"] == ErrorCode.SUCCESS, act["prediction_error"]
    counts = {"infer": int((kind == ActionType.INFER).sum()),
              "load": int((kind == ActionType.LOAD).sum()),
              "evict": int((kind == ActionType.EVICT).sum()),
              "rejected": int(len(kind) - ran.sum())}
    exec_err = np.abs(err[ran & (kind == ActionType.INFER)])
    load_err = np.abs(err[ran & (kind == ActionType.LOAD)])
    _check_seconds(duration_s, "duration_s")
    # (a run of no length has no rate: 0, not its counts over a made-up second)
    d = duration_s if duration_s > 0 else math.inf
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
        "cold_starts": int(req["cold_start"].sum()),
        "actions": counts,
        "prediction_error_ms": {
            "exec_p50": _pct(exec_err, 50),
            "exec_p99": _pct(exec_err, 99),
            "load_p99": _pct(load_err, 99),
        },
        "duration_s": duration_s,
    }
    if extra:
        summary.update(extra)
    return summary


WRITING_MARK = "run.writing"  # in a run's folder while its files are written
# a run's files in its folder (each log in either format), WRITING_MARK aside
RUN_FILES = ("summary.json", "run.json",
             *(f"{n}.{f}" for n in ("requests", "actions") for f in LOG_FORMATS))


PROCESS_LOGS = "logs"  # in a live run's folder: its processes' output (NAME.log)


def process_logs(out: Path) -> list[Path]:
    """The processes' output files (``NAME.log``) of a live run in ``out/logs``."""
    logs = out / PROCESS_LOGS
    return [p for p in logs.glob("*.log") if p.is_file()] if logs.is_dir() else []


def write_run(out: str | Path, telemetry: Telemetry, summary: dict, run: dict,
              own_process_logs: bool = False, log_format: str | None = None) -> Path:
    """A run's files in ``out``: the two logs (as ``log_format``, default
    ``telemetry.log_format``), run.json and
    summary.json. They are written first into a hidden folder inside ``out``
    (``NEW_RUN_PREFIX``), and only once all are written do they replace the earlier run's
    (summary.json, run.json and the logs of both formats), by renames, summary.json last,
    with an empty ``WRITING_MARK`` file there meanwhile (``clockwork report`` refuses such
    a folder as incomplete). So a write that fails or is interrupted (a full disk, a
    Ctrl-C) leaves the earlier run whole, and its own files are removed; ``out`` never
    holds an earlier run's files beside this run's. Both JSON files are encoded before
    anything is written (a value JSON cannot hold changes nothing). An error names the
    file as it would be in ``out``. An empty ``out`` is a ValueError (it wrote into the
    current folder). An earlier live run's process output (``process_logs``) goes with
    its files, unless ``own_process_logs``: this run's processes wrote it there."""
    if not str(out).strip():
        raise ValueError(f"the run's folder must be a path, got {str(out)!r}")
    out = Path(out)
    if log_format is not None:  # (before anything is written)
        check_log_format(log_format)
    summary_bytes, run_bytes = _json_bytes(summary), _json_bytes(run)
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:  # (what the run's files would replace: files only)
        if (out / name).is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(out / name))
    with _naming(out / NEW_RUN_PREFIX):
        new = Path(tempfile.mkdtemp(prefix=NEW_RUN_PREFIX, dir=out))
    try:
        with _in_place(new, out):
            telemetry.write(new, log_format)
            for name, data in (("run.json", run_bytes), ("summary.json", summary_bytes)):
                with _naming(new / name):
                    (new / name).write_bytes(data)
        mark = out / WRITING_MARK
        with _naming(mark):
            mark.touch()
        for name in RUN_FILES:  # (the earlier run's, both log formats)
            (out / name).unlink(missing_ok=True)
        if not own_process_logs:  # (an earlier live run's controller and worker output)
            for p in process_logs(out):
                p.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # (only if nothing else is in it)
                (out / PROCESS_LOGS).rmdir()
        for f in sorted(new.iterdir(), key=lambda f: f.name == "summary.json"):
            os.replace(f, out / f.name)  # (summary.json last)
        mark.unlink(missing_ok=True)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return out


NEW_RUN_PREFIX = ".run-new-"  # a run's files being written, inside its folder


@contextlib.contextmanager
def _in_place(new: Path, out: Path):
    """An ``OSError`` naming a file in ``new`` raised as naming that file in ``out``, where
    the user asked for it (the writers name the file of an error that names none:
    ``_naming``)."""
    try:
        yield
    except OSError as e:
        name = e.filename
        if isinstance(name, str | os.PathLike) and Path(name).parent == new:
            raise OSError(e.errno, e.strerror or os.strerror(e.errno or 0),
                          str(out / Path(name).name)) from e
        raise


def _json_bytes(data: dict) -> bytes:
    try:
        return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    except TypeError:  # a string JSON cannot hold: a file name not in UTF-8, say
        return orjson.dumps(_printable(data),
                            option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def _printable(v):
    """``v`` with each string UTF-8 cannot encode (a file name that is not UTF-8, say)
    written with those bytes escaped (``filenames.printable``): a scenario file
    ``bad\\xff.toml`` is named so, not refused once the run is done."""
    if isinstance(v, str):
        return printable(v)
    if isinstance(v, dict):
        return {_printable(k): _printable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_printable(x) for x in v]
    return v


def write_json(path: Path, data: dict) -> None:
    path.write_bytes(_json_bytes(data))


def write_atomic(path: Path, data: bytes | dict) -> None:
    """``data`` (bytes, or a dict written as JSON) into ``path`` through a temporary file
    beside it renamed into place: a reader never sees half a file, and a write that
    fails (a full disk) leaves the file as it was and no temporary one. An ``OSError``
    names ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        try:
            tmp.write_bytes(data if isinstance(data, bytes) else _json_bytes(data))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e


def _check_counts(s: dict, keys: tuple, required: bool = False) -> None:
    """ValueError unless each of ``keys`` that ``s`` has is a whole number >= 0 (a count);
    with ``required``, ValueError for one it lacks too."""
    for k in keys:
        if k not in s:
            if required:
                raise ValueError(f"it has no {k!r}: not a run summary")
            continue
        v = s[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{k!r} is {v!r}, not a count (a whole number >= 0)")


def format_summary(s: dict) -> str:
    """A human-readable table of a summary. ValueError for a count that is not a whole
    number >= 0 (a hand-edited summary); a latency it lacks is n/a, not 0."""
    # (the request counts, from the request log: a live run's counter differences, as
    # its actions', are shown as they come)
    _check_counts(s, ("submitted", "succeeded", "slo_met", "dropped", "failed"), required=True)
    _check_counts(s, ("cold_starts",))
    lat = s.get("latency_ms", {})
    if not isinstance(lat, dict):
        raise TypeError(f"'latency_ms' is {lat!r}, not an object of percentiles")
    acts = s.get("actions", {})
    if acts is None:  # (a live run whose controller went away: its counts are unknown)
        acts_text = f"n/a ({s.get('actions_where') or 'the controller did not say'})"
    else:
        acts_text = (f"{acts.get('infer', 0):,} / {acts.get('load', 0):,} / "
                     f"{acts.get('evict', 0):,} / {acts.get('rejected', 0):,}")
    # no requests, no answers: a percentage or a latency of nothing is not 0
    attainment = f"{100 * s['slo_attainment']:.4f} %" if s["submitted"] else "n/a (no requests)"
    keys = ("p50", "p99", "p999", "max")
    if not s["submitted"]:
        latency = "n/a (no requests)"
    elif not s["succeeded"]:
        latency = "n/a (none succeeded)"
    elif not any(k in lat for k in keys):  # (a hand-made summary without them)
        latency = "n/a (not in the summary)"
    else:
        latency = " / ".join(f"{lat[k]:.2f}" if k in lat else "n/a" for k in keys) + " ms"
    rows = [
        ("requests submitted", f"{s['submitted']:,}"),
        ("  succeeded", f"{s['succeeded']:,}"),
        ("  met SLO", f"{s['slo_met']:,}"),
        ("  dropped (timeout)", f"{s['dropped']:,}"),
        ("  failed", f"{s['failed']:,}"),
        ("SLO attainment", attainment),
        ("goodput", f"{s['goodput_rps']:,.1f} r/s"),
        ("throughput", f"{s['throughput_rps']:,.1f} r/s"),
        ("latency p50 / p99 / p99.9 / max", latency),
        ("cold-start requests", f"{s.get('cold_starts', 0):,}"),
        ("actions infer / load / evict / rejected", acts_text),
        ("duration", f"{s['duration_s']:.1f} s"),
    ]
    stopped = s.get("stopped")
    if isinstance(stopped, dict):  # (a live run cut short)
        rows.append(("stopped early", f"at {stopped.get('at_s')} s: {stopped.get('reason')}"))
    if isinstance(s.get("incomplete"), str):  # (report's figures of a run's rows alone)
        rows.append(("incomplete", s["incomplete"]))
    # (a live replay's dropped requests the controller never answered; each inserted
    # right under dropped, so the later stands first)
    for key, label in (("not_sent", "    not sent: SLO over before"),
                       ("no_answer", "    given up: no answer")):
        n = s.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            at = [k for k, _ in rows].index("  dropped (timeout)") + 1
            rows.insert(at, (label, f"{n:,}"))
    lag = s.get("send_lag_ms")
    if isinstance(lag, dict) and lag.get("max"):
        rows.append(("sent late p50 / p99 / max",
                     f"{lag.get('p50')} / {lag.get('p99')} / {lag.get('max')} ms"))
    told = [f for f in s.get("failures") or [] if isinstance(f, dict)
            and isinstance(f.get("count"), int) and isinstance(f.get("message"), str)]
    at = [k for k, _ in rows].index("  failed") + 1
    rows[at:at] = [("    told", f"{f['count']:,} x {f['message']}") for f in told[:3]]
    if "workers_suspected" in s:  # live runs: the controller's liveness verdicts
        rows.append(("workers suspected (then reset)", f"{s['workers_suspected']:,}"))
        if "weights_kept" in s:
            rows.append(("  copies kept through the resets", f"{s['weights_kept']:,}"))
    oc = s.get("outputs")
    if oc:
        rows.append(("outputs checked / wrong vs reference",
                     f"{oc['checked']:,} / {oc['wrong']:,} (max |error| {oc['max_abs_err']:.1e}"
                     + (f"; {oc['unchecked']:,} without a reference)" if oc["unchecked"] else ")")))
    pe = s.get("prediction_error_ms")
    if pe:  # (no request served, no INFER succeeded: nothing was predicted, not 0.000)
        rows.append(("EXEC prediction error p50 / p99",
                     f"{pe['exec_p50']:.3f} / {pe['exec_p99']:.3f} ms" if s.get("succeeded")
                     else "n/a (no INFER succeeded)"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def timeline(run_dir: Path, bucket_s: float = 60.0, duration_s: float | None = None
             ) -> list[dict]:
    """Per-interval figures of a run directory's logs (TSV or npz): arrivals, goodput,
    SLO attainment, cold-start requests, LOADs and EVICTs, by arrival (requests) and
    completion (actions) time. Reads only the columns it needs from npz logs, and counts
    in one pass (a log of hundreds of millions of rows is fine)."""
    check_timeline_interval(bucket_s)  # (before the logs are read)
    req, act = read_columns(run_dir, TIMELINE_COLUMNS[0], TIMELINE_COLUMNS[1])
    return timeline_of(req, act, bucket_s, duration_s)


def check_timeline_interval(bucket_s: float) -> None:
    """ValueError unless the interval is a number of seconds, at least TIMELINE_MIN_S
    and at most a year."""
    if isinstance(bucket_s, bool) or not isinstance(bucket_s, numbers.Real):
        raise ValueError(f"the timeline's interval must be a number of seconds, got "
                         f"{bucket_s!r}")
    if not bucket_s >= TIMELINE_MIN_S:
        raise ValueError(f"the timeline's interval must be at least {TIMELINE_MIN_S} s, got "
                         f"{bucket_s}")
    if not bucket_s <= MAX_TIME_S:  # (its nanoseconds would not fit an int64)
        raise ValueError(f"the timeline's interval must be at most {MAX_TIME_S:,} s (a year), "
                         f"got {bucket_s:g}")


# the request and the action columns ``timeline_of`` reads
TIMELINE_COLUMNS = (("arrival", "deadline_met", "cold_start"), ("type", "measured_completion"))
TIMELINE_MIN_S = 0.001  # the shortest interval of a timeline (start_s is rounded to it)
TIMELINE_MAX_ROWS = 1_000_000  # the most rows a timeline makes


def timeline_of(req: dict, act: dict, bucket_s: float = 60.0,
                duration_s: float | None = None) -> list[dict]:
    """``timeline``'s figures from columns (``Telemetry.request_columns()`` /
    ``action_columns()``, or at least ``TIMELINE_COLUMNS`` of them). Interval i is
    [i, i + 1) x ``bucket_s`` from the logs' time 0, and its goodput is over its length;
    ``duration_s``: the time (from time 0, in seconds) the run ended, if known: the
    interval it ends (or cuts short: its goodput is over the part before the end) is the
    last, those after the last arrival and answer there and empty, and what happens
    after it (the drain's actions completing) counts in it; what happens before time 0 (a
    live request whose client stamped it as sent before the controller started) counts in
    the first, so that the intervals add up to the summary. ``slo_met``: the interval's
    requests that met their SLO. An
    interval without requests has ``slo_attainment`` 1.0 (nothing missed; ``format_timeline``
    shows n/a). ValueError for an interval under ``TIMELINE_MIN_S`` or over a year, or
    one that makes more than ``TIMELINE_MAX_ROWS`` rows."""
    check_timeline_interval(bucket_s)
    if duration_s is not None:
        _check_seconds(duration_s, "duration_s")
    req = _timeline_columns("request", req, TIMELINE_COLUMNS[0])
    act = _timeline_columns("action", act, TIMELINE_COLUMNS[1])
    width = round(bucket_s * 1e9)
    # (an end past what int64 nanoseconds hold, ~292 years, cuts nothing)
    end = round(duration_s * 1e9) if duration_s is not None and 0 < duration_s < 9e9 else None
    rb = np.maximum(req["arrival"] // width, 0)
    ab = np.maximum(act["measured_completion"] // width, 0)
    n = int(max(rb.max(initial=-1), ab.max(initial=-1))) + 1
    if end is not None:  # the last interval is the one the run ends in, however quiet
        # (the rows stopped at the last arrival or answer: a workload that stops early
        # showed a timeline shorter than the run, its goodput over fewer seconds)
        n = int(-(-end // width))
        rb, ab = np.minimum(rb, n - 1), np.minimum(ab, n - 1)
    if n <= 0:
        return []
    if n > TIMELINE_MAX_ROWS:
        raise ValueError(f"intervals of {bucket_s:g} s make {n:,} rows (at most "
                         f"{TIMELINE_MAX_ROWS:,}): take a longer interval")
    rb = rb.astype(np.intp)
    count = np.bincount(rb, minlength=n)
    met = np.bincount(rb[req["deadline_met"].astype(bool)], minlength=n)
    cold = np.bincount(rb[req["cold_start"].astype(bool)], minlength=n)
    kinds = act["type"]
    ab = ab.astype(np.intp)
    loads = np.bincount(ab[kinds == ActionType.LOAD], minlength=n)
    evicts = np.bincount(ab[kinds == ActionType.EVICT], minlength=n)
    out = []
    for i in range(n):
        k, m = int(count[i]), int(met[i])
        span = width  # ns
        if end is not None and 0 < end - i * width < width:
            span = end - i * width  # (the run ended inside it)
        out.append({
            "start_s": round(i * bucket_s, 3),
            "requests": k,
            "goodput_rps": round(m * 1e9 / span, 3),
            "slo_met": m,
            "slo_attainment": round(m / k, 6) if k else 1.0,
            "cold_starts": int(cold[i]),
            "loads": int(loads[i]),
            "evicts": int(evicts[i]),
        })
    return out


def _timeline_columns(what: str, cols: dict, names: tuple) -> dict[str, np.ndarray]:
    """The columns ``timeline_of`` reads, as int64 (bools as bools): ValueError unless
    each is a one-dimensional array of integers (or bools) and all are of one length."""
    out = {}
    for c in names:
        a = np.asarray(cols[c])
        if a.ndim != 1 or a.dtype.kind not in "biu":
            raise ValueError(f"the {what} column '{c}' is {_kind_words(a.dtype)} of shape "
                             f"{a.shape}, not one integer a row")
        if a.dtype.kind == "u" and len(a) and int(a.max()) > _value_range(_I64)[1]:
            raise ValueError(f"the {what} column '{c}' holds {int(a.max())}, past int64")
        out[c] = a if a.dtype.kind in "bi" else a.astype(_I64)
        if len(a) != len(out[names[0]]):
            raise ValueError(f"the {what} columns are of different lengths ('{names[0]}' "
                             f"{len(out[names[0]]):,}, '{c}' {len(a):,})")
    return out


def read_columns(run_dir: str | Path, request_columns: tuple, action_columns: tuple,
                 notes: list[str] | None = None
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Some columns of a run directory's logs (or a pair's), as ``read_logs`` finds them: from npz logs
    only those columns are read; TSV logs are read whole. ``model`` comes as codes.
    ``notes``: what reading left out is appended there (``Telemetry.notes``)."""
    run_dir = Path(run_dir)
    try:
        pair = log_pair(run_dir)
    except FileNotFoundError:
        pair = None, None, None  # no log files: read_logs reads a rows folder, or raises
    if pair[2] == "npz":
        out = []
        for name, want, names, path in (("requests", request_columns, REQUEST_COLUMNS, pair[0]),
                                        ("actions", action_columns, ACTION_COLUMNS, pair[1])):
            if not set(want) <= set(names):
                raise ValueError(f"unknown {name} column(s): {sorted(set(want) - set(names))}")
            dts = dict(zip(names, REQUEST_DTYPES if name == "requests" else ACTION_DTYPES,
                           strict=True))
            if name == "actions" and not path.exists():
                out.append({c: np.zeros(0, dts[c]) for c in want})
                continue
            try:
                with np.load(path, allow_pickle=False) as z:
                    # (a request log's status and latency are read too, when it has them, to
                    # be checked as read_logs checks them)
                    read = tuple(want) + tuple(
                        c for c in ("status", "latency")
                        if name == "requests" and c not in want and c in z.files)
                    # (the requests' columns, read first, leave less room for the actions')
                    _check_npz_columns(path, z, read, dts)
                    cols = _load_npz_columns(path, z, read, dts)
                    if "model" in cols:
                        _check_codes(str(path), cols["model"], len(_model_names(str(path), z)))
                    if name == "requests":
                        _check_values(path, cols)
                    out.append({c: cols[c] for c in want})
            except _BadLog:
                raise
            except _UNREADABLE_NPZ as e:
                raise ValueError(f"{path}: not a log file ({e})") from None
        return out[0], out[1]
    tel = read_logs(run_dir)
    if notes is not None:
        notes.extend(tel.notes)
    req, act = tel.request_columns(), tel.action_columns()
    return {c: req[c] for c in request_columns}, {c: act[c] for c in action_columns}


def format_timeline(rows: list[dict], actions_logged: bool = True) -> str:
    """``timeline``'s rows as a table. SLO % of an interval without requests: n/a (as
    the summary's table says for a run without requests). ``actions_logged`` False (the
    action log has no rows of the run's actions, as a live replay's): loads and evicts
    n/a instead of 0."""
    head = f"{'start_s':>9} {'requests':>9} {'goodput r/s':>12} {'SLO %':>9} {'cold':>6} {'loads':>6} {'evicts':>6}"
    lines = [head]
    # whole seconds as such; intervals of a fraction of a second to the millisecond
    dec = 0 if all(float(r["start_s"]).is_integer() for r in rows) else 3
    for r in rows:
        k = r["requests"]
        # (from the counts: the attainment, rounded already, could round a digit off)
        slo = f"{100 * r['slo_met'] / k:>9.3f}" if k else f"{'n/a':>9}"
        acts = (f"{r['loads']:>6,} {r['evicts']:>6,}" if actions_logged
                else f"{'n/a':>6} {'n/a':>6}")
        lines.append(f"{r['start_s']:>9.{dec}f} {r['requests']:>9,} {r['goodput_rps']:>12,.1f} "
                     f"{slo} {r['cold_starts']:>6,} {acts}")
    return "\n".join(lines)


def no_requests_warning(summary: dict, duration_s: float) -> str | None:
    """The warning for a run in which no request was submitted (its figures are empty;
    a sweep may hold such a point: not an error), or None."""
    if summary.get("submitted"):
        return None
    return (f"warning: no requests were submitted in duration_s = {duration_s:g} s (rates "
            "too low or the run too short): the figures are empty")


def emit_run(result, scenario, headline: str, out: str | Path | None = None,
             as_json: bool = False, who: str = "clockwork") -> None:
    """Show a finished run (simulated or live) on the command line: print summary.json
    (``as_json``) or the scenario's name with ``headline`` and the SLO table, then
    optionally write its files to ``out`` (printed first, so that a write that fails, a
    full disk, does not lose the figures too). ``result`` has ``.summary`` and
    ``.write(dir)``. A live replay with no request submitted is warned of, as command
    ``who`` (a simulated run says it among its warnings)."""
    import sys

    if as_json:
        sys.stdout.write(_json_bytes(result.summary).decode())  # (summary.json's bytes)
    else:
        title = scenario.data.get("name") or Path(scenario.source).stem
        print(f"{title}: {headline}")
        print(format_summary(result.summary))
    # (a live replay's; a simulated run's is among its warnings, said before it ran)
    said = (no_requests_warning(result.summary, scenario.duration_s)
            if hasattr(result, "answered_once") else None)
    if said:
        print(f"{who}: {said}", file=sys.stderr)
    if out:
        sys.stdout.flush()
        earlier = [n for n in ("summary.json", "requests.tsv", "requests.npz")
                   if (Path(out) / n).exists()]
        written = result.write(out)
        fmt = getattr(getattr(result, "telemetry", None), "log_format", "tsv")
        if earlier:  # (a run's files are replaced as a whole: said, not silent)
            print(f"replaced the earlier run in {written} ({', '.join(earlier)} and the "
                  "files beside them)", file=sys.stderr)
        print(f"wrote {written}/summary.json, requests.{fmt}, actions.{fmt}, run.json",
              file=sys.stderr)
