"""Prometheus metrics of the controller, served at ``/metrics`` on its HTTP port.

Each ``ControllerNode`` has its own ``prometheus_client.CollectorRegistry``
(``ControllerMetrics.registry``; several controllers in one process do not clash) and the
route answers what ``prometheus_client.generate_latest(registry)`` would (text format
0.0.4; ``write_families`` writes most of it, faster). The
full list, with units and labels, is in docs/architecture.md ("Metrics").

Triton's names where the meaning is the same, so dashboards built for Triton work
(labels ``model``, ``version`` -- always ``"1"``; requests for unknown models are not
counted there):

- ``nv_inference_request_success`` / ``nv_inference_request_failure``: answered requests;
- ``nv_inference_count`` (inferences: the rows of successful requests) and
  ``nv_inference_exec_count`` (successful INFER batches);
- ``nv_inference_request_duration_us`` (arrival -> answer), ``nv_inference_queue_duration_us``
  (arrival -> the batch's EXEC began), ``nv_inference_compute_infer_duration_us`` (the
  batch's EXEC time, charged to each request of the batch, as Triton does): cumulative
  microseconds of successful requests;
- ``nv_inference_pending_request_count``: controller requests waiting (``Policy.model_view``:
  rows, unlike the other ``nv_inference_*``: the scheduler queues rows);
- ``nv_gpu_utilization`` (0..1, EXEC busy time over the last ``UTIL_WINDOW_S``),
  ``nv_gpu_memory_used_bytes`` / ``nv_gpu_memory_total_bytes`` (weights-cache pages x
  16 MiB), labelled ``gpu_uuid`` (``worker<W>-gpu<G>``) alone, as Triton, values in
  decimal digits (``clockwork_gpu_*`` carry ``worker`` and ``gpu``).

A KServe request of several rows is several controller requests (one per row): Triton's
figures count it once, as Triton counts a batched request (``Rows``); the
``clockwork_*`` figures count controller requests.

Triton's counters are exposed as Triton exposes them: ``# TYPE ... counter`` under their
exact sample names (no ``_total`` suffix; the client library would write the family's
head as ``<name>_total``, which a scraper reads as another family, so ``write_families``
writes them).

Ours, ``clockwork_*``: requests by model and status, controller-side latency histogram,
SLO attainment and requests that met their SLO, cold starts, actions by type and status,
actions sent, EXEC prediction error, GPU busy time, weights-cache pages, queue depth
(``Policy.queued()``), requests outstanding, workers connected, workers lost, suspect,
re-admitted and refused on reconnecting, weights kept through re-admissions, uptime; plus the
client library's ``process_*`` metrics of the controller process.

The hooks (``reply``, ``answered``, ``result``, ``action_sent``) run for every request
answered and every action: they only add into plain ints of a per-model slot object
(cached in a dict) and lists; the metric families are built from them at scrape time by
a custom collector. (A ``prometheus_client`` ``Counter`` child's ``inc`` takes a lock and
costs several times a dict increment; a ``Histogram.observe`` more still.)
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from clockwork.actions import ActionType, ErrorCode
from clockwork.profiles import PAGE_SIZE

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15,
                   0.25, 0.5, 1.0)
ERROR_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2)
VERSION = "1"  # the model version reported everywhere (KServe metadata too)
UTIL_WINDOW_S = 2.0  # nv_gpu_utilization: busy time over this much of the recent past
_BUCKET_NS = 250_000_000  # ... counted in buckets of this width
_NB = 16  # slots of the per-GPU ring (> the window's buckets: old slots are reused)
_INFER = ActionType.INFER
MODEL_SLICE = 64  # render_async: model instances read per turn of the event loop
# render_async: the event loop is let go after about this long of writing the text
WRITE_SLICE_NS = 250_000



# clockwork_worker_events{event}: the controller's counters they read
# the states clockwork_worker_state has a series for (``WorkerLinks.worker_rows``)
WORKER_STATES = ("serving", "suspect", "resetting", "lost", "held", "awaited", "draining")
WORKER_EVENTS = (("lost", "worker_losses"), ("suspect", "worker_suspects"),
                 ("readmitted", "worker_readmissions"), ("refused", "worker_refusals"),
                 ("removed", "workers_removed"))

class _Model:
    """What the hooks count for one model instance (plain ints: cheap to add to)."""

    __slots__ = ("status", "success", "duration_ns", "slo_met", "cold", "execs", "queue_ns",
                 "compute_ns", "labels", "mlabels", "fail_ns", "last", "batches", "merged",
                 "extra_rows", "open_rows")

    def __init__(self, name: str) -> None:
        self.labels = {"model": name, "version": VERSION}  # (shared by its samples)
        self.mlabels = {"model": name}
        # (``status``, ``slo_met``, ``cold`` count controller requests -- a KServe request's
        # rows each; the others, Triton's figures, count client requests: ``Rows``)
        self.status: dict[str, int] = {}  # answered requests by status name
        self.success = 0
        self.duration_ns = 0  # arrival -> answer, successful requests
        self.slo_met = 0
        self.cold = 0
        self.execs = 0  # successful INFER batches
        self.queue_ns = 0  # arrival -> EXEC begin, requests of successful INFERs
        self.compute_ns = 0  # EXEC duration x requests, successful INFERs
        self.fail_ns = 0  # arrival -> answer, requests the policy answered otherwise
        self.last = 0  # when the last successful request was answered (controller clock)
        self.batches: dict[int, list[int]] = {}  # batch size -> [successful INFERs, EXEC ns]
        self.merged = 0  # rows past the first of the requests of several rows answered
        self.extra_rows = 0  # rows past the first of the successful ones
        self.open_rows = 0  # rows answered of requests of several rows not all answered

    def requests(self) -> int:
        """Client requests answered (a request of several rows once, when all its rows
        are: the count never goes down, as a Prometheus counter must not)."""
        return sum(self.status.values()) - self.merged - self.open_rows

    def failures(self) -> int:
        return max(0, self.requests() - self.success)


class Rows:
    """One KServe request of several rows (each a controller request), for Triton's
    figures, which count requests: its rows' answers are gathered here
    (``ControllerMetrics.row``, ``answered``, ``result``) and counted as one request when
    the front end has them all (``ControllerMetrics.request_done``): a success if every
    row succeeded, its duration from its arrival to its last row's answer, its queue and
    compute times the mean over its rows (Triton charges a request the execution that
    ran it); ``nv_inference_count`` and ``inference_count`` count its rows."""

    __slots__ = ("model", "n", "ids", "ok", "answered", "latency", "last", "queue_ns",
                 "compute_ns")

    def __init__(self, model: str, n: int) -> None:
        self.model, self.n = model, n
        self.ids: list[int] = []  # its rows' controller request ids, as admitted
        self.ok = 0  # rows answered SUCCESS
        self.answered = 0  # rows answered through ``answered`` (in the model's open_rows)
        self.latency = 0  # arrival -> the latest row's answer
        self.last = 0  # when its last successful row was answered
        self.queue_ns = 0  # over its rows that ran in successful INFERs
        self.compute_ns = 0


class _Hist:
    """Bucket counts of int-ns observations (bounds given in seconds)."""

    __slots__ = ("bounds", "bounds_ns", "counts", "sum_ns")

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds = tuple(sorted(bounds_s))
        self.bounds_ns = [round(b * 1e9) for b in self.bounds]
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound
        self.sum_ns = 0

    def copy(self) -> _Hist:
        h = _Hist.__new__(_Hist)
        h.bounds, h.bounds_ns, h.counts, h.sum_ns = (self.bounds, self.bounds_ns,
                                                     list(self.counts), self.sum_ns)
        return h

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        acc, buckets = 0, []
        for b, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            buckets.append((floatToGoString(b), acc))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.sum_ns / 1e9)


class _Rows(Metric):
    """A family of samples all named ``sample``, kept as ``rows`` of (labels dict, value):
    the ``Sample`` objects the client library reads are made only when it asks
    (``samples``), and ``write_families`` writes the rows without them. ``rows`` may be
    an iterator, read once: made as they are written (a slice at a time, with the event
    loop free between slices), then kept as a list. No timestamps, no special samples."""

    def __init__(self, name: str, doc: str, typ: str, sample: str, rows,
                 plain: bool = False) -> None:
        self._made = None
        super().__init__(name, doc, typ)
        self.sample, self.rows = sample, rows
        self.plain = plain  # values in plain decimal digits (see write_families)

    @property
    def samples(self) -> list:
        if self._made is None:
            if type(self.rows) is not list:
                self.rows = list(self.rows)
            self._made = [Sample(self.sample, lb, v) for lb, v in self.rows]
        return self._made

    @samples.setter
    def samples(self, value: list) -> None:  # (Metric.__init__ sets it empty)
        self._made = value or None


def _family(name: str, doc: str, typ: str, sample: str, rows, plain: bool = False) -> Metric:
    """A family of samples named ``sample``, ``rows``: (labels dict, value). Triton's
    counters are counters with samples named exactly ``name`` (no ``_total``).
    ``plain``: values written in decimal digits, never an exponent (see
    ``write_families``). ``rows`` may be an iterator (see ``_Rows``)."""
    return _Rows(name, doc, typ, sample, rows, plain)


def _plain_number(v: float) -> str:
    """``v`` in decimal digits, at most 6 after the point: ``50331648``, ``0.00001``."""
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.6f}".rstrip("0").rstrip(".") or "0"


class _One:
    """A collector of the families given (what ``generate_latest`` renders)."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


_HEAD_TYPE = {"unknown": "untyped", "gauge": "gauge", "counter": "counter"}


def write_families(families: list, labels_text: dict, values_text: dict,
                   out: list[str]) -> Iterator[None]:
    """The text exposition of ``families``, byte for byte what
    ``prometheus_client.generate_latest`` writes for them (but the heads of Triton's
    counters, under their exact names, where the library would write ``<name>_total``),
    ~8x faster for the families of one sample per model (thousands of lines: the library
    took ~40-65 ms for 5,500, while the controller's event loop waited for the
    interpreter lock, and requests missed their SLO when /metrics was scraped). The families ``_family`` made (``_Rows``:
    untyped, gauge or counter) are written here: each label set's ``{...}`` as the library
    writes it (asked of it once per label set, kept in ``labels_text``), each value by the
    library's ``floatToGoString`` (kept in ``values_text``) -- or, for a ``plain`` family,
    in decimal digits (Triton's ``nv_gpu_*`` as its C++ library writes them: tools that
    read them with a regular expression, as perf_analyzer's ``--collect-metrics``, took
    ``5.0331648e+07`` bytes for 5 and ``1e-05`` of utilization for all of it). Any other
    family is the library's own text.

    Appended to ``out`` a piece at a time: yields after each family that is not
    ``_Rows`` and after every 64 rows (``render_async`` lets the event loop go between
    pieces). An iterator of rows is read here, and the family keeps the rows read as its
    list."""
    for f in families:
        if type(f) is not _Rows:
            out.append(generate_latest(_One([f])).decode())
            yield
            continue
        kind = _HEAD_TYPE[f.type]
        # (a counter's head names its samples: ``x_total`` for ours, the exact name for
        # Triton's, as Triton writes them)
        head = f.sample if kind == "counter" else f.name
        doc = f.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {head} {doc}\n# TYPE {head} {kind}\n")
        name, plain, rows = f.sample, f.plain, f.rows
        kept = rows if type(rows) is list else []
        add = None if kept is rows else kept.append
        for i, row in enumerate(rows, 1):
            if add is not None:
                add(row)
            labels, v = row
            key = tuple(labels.items())  # (another order: another key, the same text)
            text = labels_text.get(key)
            if text is None:
                text = labels_text[key] = _labels_text(labels)
            if plain:
                value = _plain_number(v)
            elif (value := values_text.get(v)) is None:
                value = values_text[v] = floatToGoString(v)
            out.append(f"{name}{text} {value}\n")
            if not i & 63:
                yield
        f.rows = kept


def _labels_text(labels: dict) -> str:
    """The ``{...}`` of a sample line with ``labels`` as the library writes it ("" for
    none)."""
    line = generate_latest(_One([_untyped("x", "", [(labels, 0)])])).decode()
    line = line.splitlines()[-1]
    return line[1:line.rindex(" ")]


def _untyped(name: str, doc: str, rows) -> Metric:
    return _family(name, doc, "unknown", name, rows)


def _triton_counter(name: str, doc: str, rows) -> Metric:
    """One of Triton's counters: samples named exactly ``name``."""
    return _family(name, doc, "counter", name, rows)


def _name(enum, v) -> str:
    try:
        return enum(v).name
    except ValueError:
        return str(int(v))


class ControllerMetrics:
    """The controller's metrics; ``node`` is a ``ControllerNode`` (read at scrape time:
    ``policy``, ``pending``, ``links``, ``gpu_index``, ``profiles``, ``cfg``)."""

    def __init__(self, node) -> None:
        self.node = node
        self.start_ns = time.monotonic_ns()
        cfg = getattr(node, "cfg", None)
        self.default_slo = getattr(cfg, "default_slo", 0)  # for requests with slo 0
        self.models: dict[str, _Model] = {}
        self.latency = _Hist(LATENCY_BUCKETS)  # successful requests, arrival -> answer
        # |lane held - expected| EXEC of successful INFERs
        self.pred_error = _Hist(ERROR_BUCKETS)
        self.actions: dict[tuple, int] = {}  # (ActionType, ErrorCode) -> finished actions
        self.sent: dict[str, int] = {}  # type name -> actions sent
        self.busy_ns: dict[tuple[int, int], int] = {}  # (worker, gpu) -> EXEC ns since start
        # (worker, gpu) -> [bucket ids, busy ns per bucket]: a ring of _NB slots
        self.recent: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        self.groups: dict[int, Rows] = {}  # admitted row's request id -> its request
        self._labels_text: dict = {}  # (write_families)
        self._values_text: dict = {}
        self.registry = CollectorRegistry()
        self._collector = _Collector(self)
        self.registry.register(self._collector)
        self._process = ProcessCollector(registry=self.registry)

    # hooks (hot path) ---------------------------------------------------------------

    def _model(self, model: str) -> _Model:
        m = self.models.get(model)
        if m is None:
            m = self.models[model] = _Model(model)
        return m

    def forget(self, model: str) -> None:
        """``model`` is no longer served (unloaded): its series leave ``/metrics``."""
        self.models.pop(model, None)

    def request_rows(self, model: str, n: int) -> Rows | None:
        """A KServe request of ``n`` rows of ``model`` (None for one row: counted by the
        hooks alone); each row admitted is given to ``row``, and the whole to
        ``request_done`` once every row is answered."""
        return Rows(model, n) if n > 1 else None

    def row(self, g: Rows, rid: int) -> None:
        """Row ``rid`` of ``g`` was admitted (its answer reaches ``answered``)."""
        self.groups[rid] = g
        g.ids.append(rid)

    def request_done(self, g: Rows | None) -> None:
        """Every row of ``g`` is answered (rows refused at admission, never given to
        ``row``, count as failed): one request in Triton's figures."""
        if g is None:
            return
        groups = self.groups
        for rid in g.ids:  # (rows answered without the hooks: admission failed)
            groups.pop(rid, None)
        m = self.models.get(g.model)
        if m is None:  # (unloaded, its series gone: not brought back)
            return
        n = g.n
        m.open_rows -= g.answered
        m.merged += n - 1
        if g.ok == n:
            m.success += 1
            m.extra_rows += n - 1
            m.duration_ns += g.latency
            m.queue_ns += g.queue_ns // n
            m.compute_ns += g.compute_ns // n
            if g.last > m.last:
                m.last = g.last
        else:
            m.fail_ns += g.latency

    def reply(self, model: str, status: str, latency_ns: int | None) -> None:
        """A request answered without a ``Reply`` (refused at admission: invalid,
        overloaded); ``model`` is "" for an unknown model. ``latency_ns`` (successful
        requests only) counts into the latency figures."""
        m = self.models.get(model) or self._model(model)
        st = m.status
        st[status] = st.get(status, 0) + 1
        if latency_ns is not None:
            m.success += 1
            m.duration_ns += latency_ns
            h = self.latency
            h.counts[bisect.bisect_left(h.bounds_ns, latency_ns)] += 1
            h.sum_ns += latency_ns

    def answered(self, rep, status: str) -> None:
        """The policy answered ``rep.request`` (``rep``: a ``Reply``; ``status``: the
        status's lower-case name)."""
        r = rep.request
        m = self.models.get(r.model) or self._model(r.model)
        st = m.status
        st[status] = st.get(status, 0) + 1
        groups = self.groups
        g = groups.pop(r.id, None) if groups else None  # a row of a request of several
        if g is not None:
            g.answered += 1
            m.open_rows += 1
        lat = rep.time - r.arrival
        if not rep.status:
            h = self.latency
            h.counts[bisect.bisect_left(h.bounds_ns, lat)] += 1
            h.sum_ns += lat
            if lat <= (r.slo or self.default_slo):
                m.slo_met += 1
            if g is None:
                m.success += 1
                m.duration_ns += lat
                m.last = rep.time
            else:
                g.ok += 1
                g.last = rep.time
                if lat > g.latency:
                    g.latency = lat
        elif g is None:
            m.fail_ns += lat
        elif lat > g.latency:
            g.latency = lat
        if r.cold:
            m.cold += 1

    def action_sent(self, type_name: str) -> None:
        s = self.sent
        s[type_name] = s.get(type_name, 0) + 1

    def result(self, action, result) -> None:
        t = result.type
        key = (t, result.status)
        a = self.actions
        a[key] = a.get(key, 0) + 1
        if t == _INFER and not result.status:
            d = result.duration
            gk = (result.worker, result.gpu)
            busy = self.busy_ns
            busy[gk] = busy.get(gk, 0) + d
            ring = self.recent.get(gk)
            if ring is None:
                ring = self.recent[gk] = ([-1] * _NB, [0] * _NB)
            k = result.end // _BUCKET_NS
            i = k % _NB
            ids, vals = ring
            if ids[i] != k:
                ids[i] = k
                vals[i] = d
            else:
                vals[i] += d
            if action is not None:
                err = result.held - action.expected_duration  # (what was predicted)
                if err < 0:
                    err = -err
                h = self.pred_error
                h.counts[bisect.bisect_left(h.bounds_ns, err)] += 1
                h.sum_ns += err
                reqs = action.requests
                if reqs:
                    m = self.models.get(action.model) or self._model(action.model)
                    n = len(reqs)
                    m.execs += 1
                    groups = self.groups
                    if groups:  # (rows of requests of several rows: charged to those)
                        begin, q = result.begin, 0
                        for r in reqs:
                            g = groups.get(r.id)
                            if g is None:
                                q += begin - r.arrival
                            else:
                                n -= 1
                                # (a worker's clock estimated behind: never below 0, a
                                # uint64 in the statistics, as the sum below)
                                w = begin - r.arrival
                                if w > 0:
                                    g.queue_ns += w
                                g.compute_ns += d
                    else:
                        q = n * result.begin - sum([r.arrival for r in reqs])
                    m.compute_ns += d * n
                    if q > 0:
                        m.queue_ns += q
                    b = m.batches.get(action.batch_size)
                    if b is None:
                        b = m.batches[action.batch_size] = [0, 0]
                    b[0] += 1
                    b[1] += d

    # scrape -------------------------------------------------------------------------

    def statistics(self, model: str) -> dict:
        """Triton's ``ModelStatistics`` of one model instance, less ``name`` and
        ``version`` (the statistics extension; field names of grpc_service.proto, REST's
        JSON form): ``inference_count`` successful requests, ``execution_count``
        successful INFER batches, ``last_inference`` ms since the epoch of the last
        success (0: none yet); ``inference_stats``: ``success`` (arrival -> answer),
        ``fail`` (every other answer; refusals at admission count 0 ns), ``queue``
        (arrival -> the batch's EXEC began), ``compute_infer`` (the batch's EXEC, charged
        to each of its requests), ``compute_input``/``compute_output`` (0 ns: inputs and
        outputs travel with the action and its result), each ``{count, ns}`` with count
        the successful requests, as Triton; ``batch_stats`` per batch size that ran
        (the profile's sizes: padding rows included), ``compute_infer`` = {INFERs, EXEC
        ns}. A request of several rows counts once (``Rows``), its rows in
        ``inference_count``, as Triton counts a batched request's samples."""
        m = self.models.get(model)
        if m is None:
            m = _Model(model)
        fails = m.failures()
        last = 0
        if m.last:  # controller clock (monotonic) -> wall clock
            last = (time.time_ns() - (time.monotonic_ns() - m.last)) // 1_000_000

        def dur(count: int, ns: int) -> dict:
            return {"count": count, "ns": ns}

        n = m.success
        return {
            "last_inference": last, "inference_count": n + m.extra_rows,
            "execution_count": m.execs,
            "inference_stats": {
                "success": dur(n, m.duration_ns), "fail": dur(fails, m.fail_ns),
                "queue": dur(n, m.queue_ns), "compute_input": dur(n, 0),
                "compute_infer": dur(n, m.compute_ns), "compute_output": dur(n, 0),
                "cache_hit": dur(0, 0), "cache_miss": dur(0, 0)},
            "batch_stats": [{"batch_size": b, "compute_input": dur(c, 0),
                             "compute_infer": dur(c, ns), "compute_output": dur(c, 0)}
                            for b, (c, ns) in sorted(m.batches.items())],
        }

    def render(self) -> bytes:
        """The exposition (what ``/metrics`` answers)."""
        return self.text(list(self.registry.collect()))

    async def render_async(self) -> bytes:
        """``render``'s text, made on the event loop a slice at a time with the loop free
        between slices: the models' counts are read ``MODEL_SLICE`` instances at a time,
        and the text is written for about ``WRITE_SLICE_NS`` at a time (its rows made as
        they are written). 5,000 instances are ~65,000 lines, ~40-60 ms of CPU: written on
        a worker thread, as it was, the loop waited for the interpreter lock again and
        again meanwhile, up to ~20 ms at a time; 20,481 read at once held it ~0.25 s."""
        col = self._collector
        names = col.model_names()
        rows: list[tuple] = []
        for i in range(0, len(names), MODEL_SLICE):
            if i:
                await asyncio.sleep(0)
            rows += col.model_rows(names[i:i + MODEL_SLICE])
        families = [*col.families(rows, col.state()), *self._process.collect()]
        out: list[str] = []
        done: list[bytes] = []  # (each slice's text encoded at its end: 4 MB at once, ~10 ms)
        clock = time.perf_counter_ns
        until = clock() + WRITE_SLICE_NS
        for _ in self._write(families, out):
            if clock() >= until:
                done.append("".join(out).encode("utf-8"))
                out.clear()
                await asyncio.sleep(0)
                until = clock() + WRITE_SLICE_NS
        done.append("".join(out).encode("utf-8"))
        return b"".join(done)

    def text(self, families: list) -> bytes:
        """The exposition of ``families`` (collected from ``registry``)."""
        out: list[str] = []
        for _ in self._write(families, out):
            pass
        return "".join(out).encode("utf-8")

    def _write(self, families: list, out: list[str]) -> Iterator[None]:
        """``write_families`` with the label and value texts kept between scrapes. Once
        they outnumber this scrape's samples two to one (instances unloaded since, values
        gone by), only this scrape's are kept: dropping them all only when they were
        eight times as many let a controller that loads and unloads new names between
        scrapes hold texts of ~8x its samples (~500 B a name unloaded, 20,000 names
        a cycle), and writing them all anew takes seconds for hundreds of thousands."""
        labels_text, values_text = self._labels_text, self._values_text
        yield from write_families(families, labels_text, values_text, out)
        rows = [f.rows for f in families if type(f) is _Rows]
        if len(labels_text) + len(values_text) <= 2 * sum(map(len, rows)) + 64:
            return
        keep_labels: dict = {}
        keep_values: dict = {}
        for i, (labels, v) in enumerate(itertools.chain.from_iterable(rows), 1):
            key = tuple(labels.items())
            if (text := labels_text.get(key)) is not None:
                keep_labels[key] = text
            if (text := values_text.get(v)) is not None:
                keep_values[v] = text
            if not i & 1023:
                yield
        self._labels_text, self._values_text = keep_labels, keep_values

    def utilization(self, key: tuple[int, int], now: int) -> float:
        """EXEC busy fraction of GPU ``key`` over the last ``UTIL_WINDOW_S`` (results
        count in the bucket of their end; at most one bucket less while warming up)."""
        ring = self.recent.get(key)
        if ring is None:
            return 0.0
        kn = now // _BUCKET_NS
        first = kn - round(UTIL_WINDOW_S * 1e9 / _BUCKET_NS) + 1
        span = now - max(first * _BUCKET_NS, self.start_ns)
        if span <= 0:
            return 0.0
        busy = sum(v for k, v in zip(*ring, strict=True) if first <= k <= kn)
        return min(1.0, busy / span)


class _Collector:
    """Builds the families from ``ControllerMetrics``'s counts and the node's state: what
    is read of them is taken first (``model_rows``, ``_state``: on the event loop), the
    families are built from that copy alone (``families``: safe off the loop)."""

    def __init__(self, m: ControllerMetrics) -> None:
        self.m = m

    def describe(self) -> list:
        return []  # nothing to check against other collectors (the registry is ours)

    def collect(self) -> list[Metric]:
        return self.families(self.model_rows(self.model_names()), self.state())

    def model_names(self) -> list[str]:
        """Every model instance counted (served from the start, or answered since; ""
        for requests of unknown models), sorted."""
        m = self.m
        models = m.models
        for n in getattr(m.node, "profiles", ()):  # every instance served, from the start
            if n not in models:
                m._model(n)
        return sorted(models)

    def model_rows(self, names: list[str]) -> list[tuple]:
        """What the families read of each of ``names`` (those still counted), as plain
        values: (name, labels, model labels, successes, failures, rows of successes,
        execs, duration ns, queue ns, compute ns, requests queued (None: no policy or
        no view of it), (status, count)..., met SLO, answered (invalid not counted),
        cold starts)."""
        models = self.m.models
        policy = getattr(self.m.node, "policy", None)
        view = policy.model_view if policy is not None else None
        out = []
        for n in names:
            s = models.get(n)
            if s is None:
                continue
            v = view(n) if view is not None and n else None
            status = s.status
            out.append((n, s.labels, s.mlabels, s.success, s.failures(),
                        s.success + s.extra_rows, s.execs, s.duration_ns, s.queue_ns,
                        s.compute_ns, None if v is None else v.queued,
                        tuple(sorted(status.items())), s.slo_met,
                        sum(status.values()) - status.get("invalid_request", 0), s.cold))
        return out

    def state(self) -> dict:
        """The rest of what the families read, copied."""
        m, node = self.m, self.m.node
        now = time.monotonic_ns()
        policy = getattr(node, "policy", None)
        gpus = []
        for (w, g), idx, pages in self._gpus():
            used = policy.pages_used(idx) if policy is not None and idx is not None else None
            gpus.append((w, g, round(m.utilization((w, g), now), 6), m.busy_ns.get((w, g), 0),
                         pages, used))
        links = getattr(node, "links", [])
        available = getattr(node, "available", None)
        counted = getattr(node, "counters", {})
        return {
            "now": now, "gpus": gpus,
            "latency": m.latency.copy(), "pred_error": m.pred_error.copy(),
            "actions": list(m.actions.items()), "sent": sorted(m.sent.items()),
            "queued": policy.queued() if policy is not None else 0,
            "outstanding": len(getattr(node, "pending", ())),
            "outstanding_bytes": getattr(getattr(node, "gate", None), "bytes", 0),
            "connected": sum(1 for lk in links if lk.connected),
            "available": sum(1 for lk in links if lk.connected and (
                available is None or available(lk))),
            "held": sum(1 for lk in links if not lk.connected and getattr(lk, "held", "")),
            "awaited": len(getattr(node, "awaited", ())),
            # each worker not removed: (index, address, state) as ListWorkers says it
            "workers": node.worker_states() if hasattr(node, "worker_states") else [],
            "counted": {key: counted.get(key, 0) for key in (
                *(k for _, k in WORKER_EVENTS), "weights_kept", "weights_adopted",
                "log_flush_errors")},
        }

    def families(self, rows: list[tuple], st: dict) -> list[Metric]:
        """The families of ``model_rows``' rows and ``state``'s copy (reads nothing
        else)."""
        m = self.m
        now = st["now"]
        out: list[Metric] = []
        add = out.append
        per = [r for r in rows if r[0]]  # "": unknown models

        # --- Triton's names
        add(_triton_counter("nv_inference_request_success",
                            "Number of successful inference requests, all batch sizes",
                            ((r[1], r[3]) for r in per)))
        add(_triton_counter("nv_inference_request_failure",
                            "Number of failed inference requests, all batch sizes",
                            ((r[1], r[4]) for r in per)))
        add(_triton_counter("nv_inference_count",
                            "Number of inferences performed (the rows of successful requests)",
                            ((r[1], r[5]) for r in per)))
        add(_triton_counter("nv_inference_exec_count",
                            "Number of model executions performed (successful INFER batches)",
                            ((r[1], r[6]) for r in per)))
        add(_triton_counter("nv_inference_request_duration_us",
                            "Cumulative inference request duration in microseconds "
                            "(arrival to answer)", ((r[1], r[7] // 1000) for r in per)))
        add(_triton_counter("nv_inference_queue_duration_us",
                            "Cumulative inference queuing duration in microseconds "
                            "(arrival to the batch's EXEC start)",
                            ((r[1], r[8] // 1000) for r in per)))
        add(_triton_counter("nv_inference_compute_infer_duration_us",
                            "Cumulative compute inference duration in microseconds (the batch's "
                            "EXEC time, for each request of the batch)",
                            ((r[1], r[9] // 1000) for r in per)))
        add(_family("nv_inference_pending_request_count",
                    "Instantaneous number of pending requests awaiting execution per-model",
                    "gauge", "nv_inference_pending_request_count",
                    ((r[1], r[10]) for r in per if r[10] is not None)))

        # (Triton's label alone, as Triton writes it: perf_analyzer reads these with a
        # regular expression that wants `{gpu_uuid="..."}` and nothing else)
        util_rows: list = []
        used_rows: list = []
        total_rows: list = []
        wall = max(1, now - m.start_ns)
        frac_rows: list = []
        busy_rows: list = []
        pused_rows: list = []
        ptotal_rows: list = []
        for w, g, util, b, pages, used in st["gpus"]:  # (rows: 45 us a GPU as the library's)
            ids = {"gpu_uuid": f"worker{w}-gpu{g}"}
            wg = {"worker": str(w), "gpu": str(g)}
            util_rows.append((ids, util))
            frac_rows.append((wg, round(min(1.0, b / wall), 6)))
            busy_rows.append((wg, b / 1e9))
            if pages is not None:
                total_rows.append((ids, pages * PAGE_SIZE))
                ptotal_rows.append((wg, pages))
            if used is not None:
                used_rows.append((ids, used * PAGE_SIZE))
                pused_rows.append((wg, used))
        frac = _family("clockwork_gpu_busy_fraction",
                       "Measured EXEC time / wall time since the controller started", "gauge",
                       "clockwork_gpu_busy_fraction", frac_rows)
        busy = _family("clockwork_gpu_busy_seconds",
                       "Measured EXEC time since the controller started", "counter",
                       "clockwork_gpu_busy_seconds_total", busy_rows)
        pused = _family("clockwork_gpu_pages_used",
                        "Weights-cache pages in use in the scheduler's view (loaded, "
                        "loading, promised to a LOAD sent)", "gauge",
                        "clockwork_gpu_pages_used", pused_rows)
        ptotal = _family("clockwork_gpu_pages", "Weights-cache pages of the GPU", "gauge",
                         "clockwork_gpu_pages", ptotal_rows)
        add(_family("nv_gpu_utilization", f"GPU utilization rate [0.0 - 1.0]: EXEC busy "
                    f"time over the last {UTIL_WINDOW_S:g} s", "gauge", "nv_gpu_utilization",
                    util_rows, plain=True))
        add(_family("nv_gpu_memory_used_bytes", "GPU weights-cache memory in use, bytes "
                    "(pages x 16 MiB)", "gauge", "nv_gpu_memory_used_bytes", used_rows,
                    plain=True))
        add(_family("nv_gpu_memory_total_bytes", "GPU weights-cache memory, bytes (pages x "
                    "16 MiB)", "gauge", "nv_gpu_memory_total_bytes", total_rows, plain=True))

        # --- ours
        add(_family("clockwork_requests", "Answered requests by model instance and status",
                    "counter", "clockwork_requests_total",
                    (({"model": r[0], "status": status}, v) for r in rows
                     for status, v in r[11])))
        add(st["latency"].family("clockwork_request_latency_seconds",
                                 "Controller-side latency of successful requests"))
        add(_family("clockwork_requests_slo_met",
                    "Requests answered successfully within their SLO", "counter",
                    "clockwork_requests_slo_met_total", ((r[2], r[12]) for r in per)))
        add(_family("clockwork_slo_attainment",
                    "Requests that met their SLO / requests answered (invalid requests not "
                    "counted), since the controller started", "gauge",
                    "clockwork_slo_attainment",
                    ((r[2], round(r[12] / r[13], 9)) for r in per if r[13])))
        add(_family("clockwork_cold_starts",
                    "Requests answered that arrived when no copy of the model was loaded",
                    "counter", "clockwork_cold_starts_total", ((r[2], r[14]) for r in per)))

        act = CounterMetricFamily("clockwork_actions_total",
                                  "Finished actions by type and result status",
                                  labels=("type", "status"))
        for k, v in sorted(((_name(ActionType, t), _name(ErrorCode, s)), v)
                           for (t, s), v in st["actions"]):
            act.add_metric(k, v)
        add(act)
        sent = CounterMetricFamily("clockwork_actions_sent_total", "Actions sent to workers",
                                   labels=("type",))
        for t, v in st["sent"]:
            sent.add_metric((t,), v)
        add(sent)
        add(st["pred_error"].family("clockwork_exec_prediction_error_seconds",
                                    "|measured - expected| EXEC duration of successful INFERs "
                                    "(the time the EXEC lane was held)"))
        out += (frac, busy, pused, ptotal)

        add(GaugeMetricFamily("clockwork_queue_depth",
                              "Requests waiting in the scheduling policy (Policy.queued())",
                              value=st["queued"]))
        add(GaugeMetricFamily("clockwork_requests_outstanding",
                              "Requests accepted, not yet answered", value=st["outstanding"]))
        add(GaugeMetricFamily("clockwork_requests_outstanding_bytes",
                              "Input bytes of the requests admitted, not yet answered (the "
                              "limit global_outstanding_bytes bounds them)",
                              value=st["outstanding_bytes"]))
        add(GaugeMetricFamily("clockwork_workers_connected", "Workers connected now",
                              value=st["connected"]))
        add(GaugeMetricFamily("clockwork_workers_available",
                              "Workers that take work now: connected and not suspect (a "
                              "hung worker stays connected until its connection times "
                              "out, but is not available once it misses a probe)",
                              value=st["available"]))
        add(GaugeMetricFamily("clockwork_workers_held_elsewhere",
                              "Workers not connected because another controller holds "
                              "them (its connection to them is live; ours once it ends)",
                              value=st["held"]))
        add(GaugeMetricFamily("clockwork_workers_awaited",
                              "Workers listed at start that did not answer then: the "
                              "controller serves without them and adds each once it "
                              "answers (/readyz says 503 until none is left)",
                              value=st["awaited"]))
        ws = GaugeMetricFamily("clockwork_worker_state",
                               "Each worker's state, 1 for the one it is in (serving, suspect, "
                               "resetting, lost, held, awaited, draining), as clockwork "
                               "workers lists "
                               "it; a removed worker has no series",
                               labels=["worker", "address", "state"])
        for w, address, state in st["workers"]:
            for name in WORKER_STATES:
                ws.add_metric((str(w), address, name), 1.0 if name == state else 0.0)
        add(ws)
        counted = st["counted"]
        ev = CounterMetricFamily("clockwork_worker_events",
                                 "Workers lost (connection closed), found suspect (no answer to "
                                 "a liveness probe), re-admitted after it, and refused on "
                                 "reconnecting (each attempt: it cannot serve a model loaded "
                                 "while it was away, or has other GPUs), and removed (taken "
                                 "out for good: RemoveWorker)", labels=["event"])
        for event, key in WORKER_EVENTS:
            ev.add_metric((event,), counted[key])
        add(ev)
        add(CounterMetricFamily("clockwork_weights_kept",
                                "Copies re-admitted workers kept through their reset "
                                "(served again with no LOAD)", value=counted["weights_kept"]))
        add(CounterMetricFamily("clockwork_weights_adopted",
                                "Copies workers still held from an earlier controller, "
                                "taken over at start (served with no LOAD)",
                                value=counted["weights_adopted"]))
        add(CounterMetricFamily("clockwork_log_flush_errors",
                                "Writes of the --log-dir logs that failed (a full disk, the "
                                "folder gone): their rows were lost",
                                value=counted["log_flush_errors"]))
        add(GaugeMetricFamily("clockwork_uptime_seconds",
                              "Seconds since the controller started",
                              value=(now - m.start_ns) / 1e9))
        return out

    def _gpus(self) -> list[tuple[tuple[int, int], int | None, int | None]]:
        """(worker, gpu), the policy's index, the weights-cache pages (None: unknown)."""
        node = self.m.node
        index = dict(getattr(node, "gpu_index", {}))
        pages: dict[tuple[int, int], int] = {}
        links = getattr(node, "links", [])
        gone = {lk.index for lk in links if getattr(lk, "removed", False)}
        for lk in links:
            st = getattr(lk, "state", None)
            if st is not None:
                for g in st.gpus:
                    pages[(lk.index, g.gpu)] = g.pages
        keys = sorted(k for k in set(index) | set(self.m.busy_ns) if k[0] not in gone)
        return [(k, index.get(k), pages.get(k)) for k in keys]


def parse_text(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Samples of an exposition, read with ``prometheus_client``'s parser: sample name ->
    [(labels, value)], under the names the text gives them, as Prometheus stores them.
    Raises ValueError on a malformed exposition (tests, the benchmark). (The parser
    names every counter's samples ``<name>_total``: Triton's counters, written under
    their exact names, are given those back.)"""
    from prometheus_client.parser import text_string_to_metric_families

    written = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name if s.name in written or fam.name not in written else fam.name
            out.setdefault(name, []).append((dict(s.labels), float(s.value)))
    return out
