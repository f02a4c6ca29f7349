"""Observability of the live controller: /metrics, /healthz, /readyz, --log-dir."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

import pytest

grpc = pytest.importorskip("grpc")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import clockwork  # noqa: E402
from clockwork.errors import UnknownModel  # noqa: E402
from clockwork.profiles import PAGE_SIZE  # noqa: E402
from controller.metrics import parse_text  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def _value(samples, name: str, **labels) -> float:
    return sum(v for lb, v in samples.get(name, []) if all(lb.get(k) == x
                                                           for k, x in labels.items()))


MS = 1_000_000


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _fake_node(policy=None):
    from types import SimpleNamespace

    return SimpleNamespace(policy=policy, pending={1: None}, links=[], gpu_index={(0, 0): 0},
                           profiles={"a": None, "b": None},
                           cfg=SimpleNamespace(default_slo=100 * MS))


def test_hooks_to_exposition_exact_values():
    # every figure from hand-made events; two controllers in one process do not clash
    from types import SimpleNamespace

    from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
    from clockwork.requests import Reply, Request
    from controller.metrics import ControllerMetrics
    from controller.policy import ModelView

    policy = SimpleNamespace(queued=lambda: 4, pages_used=lambda i: 7,
                             model_view=lambda n: ModelView((0,), (), 3 if n == "a" else 0))
    m, other = ControllerMetrics(_fake_node(policy)), ControllerMetrics(_fake_node())
    assert m.registry is not other.registry
    m.start_ns -= 10_000 * MS  # started 10 s ago: a full utilization window behind us
    end = time.monotonic_ns()  # the EXEC ended now: nv_gpu_utilization sees it
    begin = end - 11 * MS  # the lane held 11 ms, the device worked 10 of them
    t0 = begin - 5 * MS
    reqs = [Request(i, "a", t0 + i * MS, 100 * MS) for i in range(3)]
    reqs[1].slo = 14 * MS  # answered 15 ms after arrival: missed
    reqs[2].cold = True
    act = Action(1, ActionType.INFER, 0, 0, "a", 0, 1 << 62, 9 * MS, batch_size=4,
                 requests=reqs)
    m.action_sent("INFER")
    m.result(act, Result(1, ActionType.INFER, ErrorCode.SUCCESS, 0, 0, "a", 4,
                         begin=begin, end=end, duration=10 * MS))
    m.result(None, Result(2, ActionType.LOAD, ErrorCode.LOAD_TOO_LATE, 0, 0, "b"))
    answer = end + MS
    for r in reqs:
        m.answered(Reply(r, RequestStatus.SUCCESS, answer, gpu=0, batch_size=4), "success")
    late = Request(9, "a", t0, 0)  # slo 0: the default
    m.answered(Reply(late, RequestStatus.TIMEOUT, t0 + 50 * MS), "timeout")
    m.reply("a", "overloaded", None)
    m.reply("a", "invalid_request", None)
    m.reply("", "invalid_request", None)  # an unknown model: no nv_* sample

    text = m.render().decode()
    # Triton's counters as Triton writes them: typed counter, exact sample names (they
    # were untyped; the library would head them x_total, another family to a scraper)
    for name in ("nv_inference_request_success", "nv_inference_count",
                 "nv_inference_compute_infer_duration_us"):
        assert f"# TYPE {name} counter\n{name}{{" in text, name
    f = _families(text)
    exact = parse_text(text)
    lab = {"model": "a", "version": "1"}

    def one(name, **labels):
        got = [v for lb, v in exact[name] if all(lb.get(k) == x for k, x in labels.items())]
        assert len(got) == 1, (name, labels, exact[name])
        return got[0]

    lat = [answer - r.arrival for r in reqs]
    assert one("nv_inference_request_success", **lab) == 3
    assert one("nv_inference_request_failure", **lab) == 3  # timeout, overloaded, invalid
    assert one("nv_inference_count", **lab) == 3
    assert one("nv_inference_exec_count", **lab) == 1
    assert one("nv_inference_request_duration_us", **lab) == sum(lat) // 1000
    assert one("nv_inference_queue_duration_us", **lab) == sum(begin - r.arrival
                                                               for r in reqs) // 1000
    assert one("nv_inference_compute_infer_duration_us", **lab) == 3 * 10_000
    assert one("nv_inference_pending_request_count", **lab) == 3
    assert one("nv_inference_request_success", model="b", version="1") == 0
    assert not [s for s in f["nv_inference_request_failure"].samples if s.labels["model"] == ""]
    g = {"gpu_uuid": "worker0-gpu0"}  # (Triton's one label)
    assert 10 / 2000 <= one("nv_gpu_utilization", **g) <= 10 / 1750 + 1e-6
    assert one("nv_gpu_memory_used_bytes", **g) == 7 * PAGE_SIZE
    assert one("clockwork_gpu_pages_used", worker="0", gpu="0") == 7
    assert f["nv_gpu_utilization"].type == "gauge"

    def ours(name, **labels):
        return _value(parse_text(text), name, **labels)

    assert ours("clockwork_requests_total", model="a", status="success") == 3
    assert ours("clockwork_requests_total", model="", status="invalid_request") == 1
    assert ours("clockwork_requests_slo_met_total", model="a") == 2
    assert ours("clockwork_slo_attainment", model="a") == pytest.approx(2 / 5)
    assert ours("clockwork_cold_starts_total", model="a") == 1
    assert ours("clockwork_actions_total", type="INFER", status="SUCCESS") == 1
    assert ours("clockwork_actions_total", type="LOAD", status="LOAD_TOO_LATE") == 1
    assert ours("clockwork_actions_sent_total", type="INFER") == 1
    assert ours("clockwork_exec_prediction_error_seconds_count") == 1
    # the lane's 11 ms against the 9 predicted (not the device's 10)
    assert ours("clockwork_exec_prediction_error_seconds_sum") == pytest.approx(0.002)
    b = [v for lb, v in parse_text(text)["clockwork_exec_prediction_error_seconds_bucket"]
         if lb["le"] in ("0.001", "0.0025", "+Inf")]
    assert b == [0, 1, 1]
    assert ours("clockwork_request_latency_seconds_count") == 3
    assert ours("clockwork_request_latency_seconds_sum") == pytest.approx(sum(lat) / 1e9)
    assert ours("clockwork_gpu_busy_seconds_total", worker="0", gpu="0") == pytest.approx(0.01)
    assert ours("clockwork_queue_depth") == 4 and ours("clockwork_requests_outstanding") == 1
    assert "process_cpu_seconds_total" in text  # the library's process collector

    quiet = parse_text(other.render().decode())  # the other controller saw nothing
    assert _value(quiet, "nv_inference_request_success") == 0
    assert _value(quiet, "clockwork_requests_total") == 0
    with pytest.raises(ValueError):
        parse_text("bad line here\n")


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_queue_depth_is_the_policys_for_every_policy(policy):
    # the gauge reads Policy.queued(): baselines report their queues too (they read 0 once)
    from types import SimpleNamespace

    from clockwork.requests import Request
    from controller import make_policy
    from controller.metrics import ControllerMetrics
    from controller.policy import GpuSpec
    from tests.conftest import make_profile

    p = make_policy(policy, [make_profile("a")], [GpuSpec(0, 0, 100)])
    node = SimpleNamespace(policy=p, pending={}, links=[], gpu_index={})
    m = ControllerMetrics(node)
    assert _value(parse_text(m.render().decode()), "clockwork_queue_depth") == 0
    sent = []
    for i in range(40):  # one GPU, a LOAD first: most of them wait
        sent += p.on_request(Request(i, "a", 0, 10**9), 0)
    running = sum(len(a.requests) for a in sent if a.requests)
    assert p.queued() == 40 - running > 0
    assert _value(parse_text(m.render().decode()), "clockwork_queue_depth") == p.queued()


def test_worker_events_and_kept_weights_are_the_controllers_counters():
    """clockwork_worker_events_total{event}, clockwork_weights_kept_total and
    clockwork_weights_adopted_total read the controller's counters (absent ones are 0)."""
    from controller.metrics import ControllerMetrics

    node = _fake_node()
    node.counters = {"worker_suspects": 3, "worker_readmissions": 2, "weights_kept": 41,
                     "weights_adopted": 7}
    samples = parse_text(ControllerMetrics(node).render().decode())
    assert _value(samples, "clockwork_worker_events_total", event="suspect") == 3
    assert _value(samples, "clockwork_worker_events_total", event="readmitted") == 2
    assert _value(samples, "clockwork_worker_events_total", event="lost") == 0
    assert _value(samples, "clockwork_weights_kept_total") == 41
    assert _value(samples, "clockwork_weights_adopted_total") == 7


def test_metrics_health_and_logs(tmp_path):
    logs = tmp_path / "logs"
    with local_cluster(workers=2, gpus=1, models="resnet50_v2:2,mobilenet_v2", http_port=0,
                       controller_args=["--log-dir", str(logs)]) as c:
        base = "http://" + c.printed_address("http")
        code, _, body = _get(base + "/healthz")
        assert code == 200
        code, _, body = _get(base + "/readyz")
        assert code == 200, body
        code, ctype, text = _get(base + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        before = parse_text(text)
        assert _value(before, "clockwork_requests_total") == 0
        assert _value(before, "clockwork_workers_connected") == 2

        with clockwork.Client(c.address, timeout=10) as cl:
            for _ in range(5):
                cl.infer("resnet50_v2", slo_ms=200)
            for _ in range(3):
                cl.infer("mobilenet_v2", slo_ms=200)
            with pytest.raises(UnknownModel):
                cl.infer("no_such_model")

        code, _, text = _get(base + "/metrics")
        assert code == 200
        s = parse_text(text)  # every sample line is `name{labels} value`
        assert _value(s, "clockwork_requests_total", model="resnet50_v2", status="success") == 5
        assert _value(s, "clockwork_requests_total", model="mobilenet_v2", status="success") == 3
        assert _value(s, "clockwork_requests_total", status="invalid_request") == 1
        assert _value(s, "clockwork_request_latency_seconds_count") == 8
        inf = [v for lb, v in s["clockwork_request_latency_seconds_bucket"] if lb["le"] == "+Inf"]
        assert inf == [8]
        assert _value(s, "clockwork_actions_total", type="INFER", status="SUCCESS") >= 1
        assert _value(s, "clockwork_actions_total", type="LOAD", status="SUCCESS") >= 2
        assert _value(s, "clockwork_actions_sent_total", type="INFER") >= 1
        assert _value(s, "clockwork_exec_prediction_error_seconds_count") >= 1
        assert "clockwork_queue_depth" in s
        busy = s["clockwork_gpu_busy_fraction"]
        assert len(busy) == 2 and all(0 <= v <= 1 for _, v in busy)
        assert sum(v for _, v in busy) > 0

        # Triton's names, parsed by the client library as a scraper would
        f = _families(text)
        for name in ("nv_inference_request_success", "nv_inference_request_failure",
                     "nv_inference_count", "nv_inference_exec_count",
                     "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_infer_duration_us"):
            assert f[name].type == "counter" and name in s, name  # (exact names)
            # every instance served (resnet50_v2:2 -> resnet50_v2, resnet50_v2:1), used or not
            assert {x.labels["model"] for x in f[name].samples} == {
                "resnet50_v2", "resnet50_v2:1", "mobilenet_v2"}
            assert {x.labels["version"] for x in f[name].samples} == {"1"}
        for model, n in (("resnet50_v2", 5), ("mobilenet_v2", 3)):
            assert _value(s, "nv_inference_request_success", model=model, version="1") == n
            assert _value(s, "nv_inference_count", model=model) == n
            assert _value(s, "nv_inference_request_failure", model=model) == 0
            assert 1 <= _value(s, "nv_inference_exec_count", model=model) <= n
            assert _value(s, "clockwork_requests_slo_met_total", model=model) == n
            assert _value(s, "clockwork_slo_attainment", model=model) == 1.0
            assert _value(s, "nv_inference_pending_request_count", model=model) == 0
        assert _value(s, "nv_inference_request_success", model="resnet50_v2:1") == 0
        util = s["nv_gpu_utilization"]  # the last EXECs ended within the 2 s window
        assert len(util) == 2 and all(0 <= v <= 1 for _, v in util)
        assert sum(v for _, v in util) > 0
        assert {lb["gpu_uuid"] for lb, _ in util} == {"worker0-gpu0", "worker1-gpu0"}

        # weights-cache pages: the scheduler's copies (ModelStatus) x the models' pages
        with clockwork.Client(c.address, timeout=10) as cl:
            pages = {m.name: m.weights_pages for m in cl.list_models()}
            for _ in range(20):  # a LOAD or EVICT may land between the two reads
                expect = [0, 0]  # GPU index = worker here (one GPU each)
                for name, n in pages.items():
                    for gi in cl.model_status(name).loaded_on:
                        expect[gi] += n
                m = parse_text(_get(base + "/metrics")[2])
                used = [_value(m, "clockwork_gpu_pages_used", worker=str(w)) for w in (0, 1)]
                if used == expect:
                    break
                time.sleep(0.05)
        assert used == expect and sum(used) >= pages["resnet50_v2"] + pages["mobilenet_v2"]
        assert [_value(m, "nv_gpu_memory_used_bytes", gpu_uuid=f"worker{w}-gpu0")
                for w in (0, 1)] == [u * PAGE_SIZE for u in used]
        total = [_value(m, "nv_gpu_memory_total_bytes", gpu_uuid=f"worker{w}-gpu0")
                 for w in (0, 1)]
        assert all(t > 0 for t in total) and total == [
            PAGE_SIZE * _value(m, "clockwork_gpu_pages", worker=str(w)) for w in (0, 1)]
        assert _get(base + "/v2/health/live")[0] == 200  # the KServe routes still answer
    assert c.controller.proc.returncode == 0
    req = (logs / "requests.tsv").read_text().splitlines()
    act = (logs / "actions.tsv").read_text().splitlines()
    assert req[0].startswith("request_id\tmodel\tarrival")
    # every request the controller answered has its row, the one refused at once too
    # (an unknown model: logged as "", latency 0, GPU -1; it had none before)
    assert len(req) == 1 + 9
    rows = [row.split("\t") for row in req[1:]]
    ok = [r for r in rows if r[5] == "SUCCESS"]
    assert len(ok) == 8 and all(r[6] == "1" for r in ok)
    (refused,) = [r for r in rows if r[5] != "SUCCESS"]
    assert (refused[1], refused[4], refused[5], refused[6], refused[9]) == (
        "", "0", "INVALID_REQUEST", "0", "-1"), refused
    assert act[0].startswith("action_id\ttype\tstatus")
    kinds = [row.split("\t")[1] for row in act[1:]]
    assert "INFER" in kinds and "LOAD" in kinds

    # the scraped figures against the controller's own logs, request by request
    rq = [dict(zip(req[0].split("\t"), row.split("\t"), strict=True)) for row in req[1:]]
    ac = [dict(zip(act[0].split("\t"), row.split("\t"), strict=True)) for row in act[1:]]
    for model in ("resnet50_v2", "mobilenet_v2"):
        mine = [r for r in rq if r["model"] == model]
        infers = [a for a in ac if a["model"] == model and a["type"] == "INFER"
                  and a["status"] == "SUCCESS"]
        duration = sum(int(r["latency"]) for r in mine) // 1000
        # (emulated workers: the lane's time, measured_duration, is the work's, which
        # compute_infer counts; a real device's lane time adds the hand-overs)
        compute = sum(int(a["measured_duration"]) * int(a["batch_size"]) for a in infers)
        assert _value(s, "nv_inference_request_duration_us", model=model) == duration
        assert _value(s, "nv_inference_exec_count", model=model) == len(infers)
        assert _value(s, "nv_inference_compute_infer_duration_us", model=model) == compute // 1000
        queue = _value(s, "nv_inference_queue_duration_us", model=model)
        assert 0 <= queue <= duration - compute // 1000 + 1
        assert _value(s, "clockwork_cold_starts_total", model=model) == sum(
            int(r["cold_start"]) for r in mine)
    assert _value(s, "clockwork_cold_starts_total") >= 1  # nothing was loaded at start


def test_fast_exposition_is_the_librarys_byte_for_byte():
    """/metrics writes the one-sample-per-model families itself (the client library took
    ~65 ms for 5,500 samples, holding the interpreter lock the controller's event loop
    needs); its text must be exactly what ``generate_latest`` writes for the same
    families, names that need escaping included, and the label texts it keeps bounded."""
    from prometheus_client import generate_latest

    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from controller.metrics import ControllerMetrics

    odd = ["a", 'q"uote', "back\\slash", "new\nline", "ünï", "a:1"]
    node = _fake_node()
    node.profiles = dict.fromkeys(odd)
    m = ControllerMetrics(node)
    for i, name in enumerate(odd):
        r = Request(i, name, 0, 100 * MS)
        m.answered(Reply(r, RequestStatus.SUCCESS, (i + 1) * MS, gpu=0, batch_size=1),
                   "success")
        m.reply(name, "overloaded", None)
    families = list(m.registry.collect())

    class Same:  # the same families, to the library
        def collect(self):
            return families

    fast = m.text(families)

    def lib(text: bytes) -> bytes:  # (nv_gpu_*: plain digits, not the library's; below)
        return b"".join(ln for ln in text.splitlines(keepends=True)
                        if not ln.startswith(b"nv_gpu_"))

    def triton_heads(text: bytes) -> bytes:  # (the library heads a counter x_total: Triton's
        # are headed with their exact sample names, as Triton writes them)
        return re.sub(rb"^(# (?:HELP|TYPE) nv_inference_[a-z_]+)_total ", rb"\1 ", text,
                      flags=re.M)

    assert lib(fast) == triton_heads(lib(generate_latest(Same()))), \
        (fast, generate_latest(Same()))
    assert fast.count(b"\nnv_inference_count{") == len(odd)
    assert "ünï" in fast.decode() and r'new\nline' in fast.decode()
    # the label texts kept: one per label set; dropped once far more than the samples
    kept = len(m._labels_text)
    assert 0 < kept <= sum(len(f.samples) for f in families)
    for name in odd[1:]:
        m.forget(name)
    m.text(list(m.registry.collect()))
    assert len(m._labels_text) <= kept


def test_label_texts_kept_between_scrapes_are_those_of_the_models_served_lately():
    """A controller that loads new names, is scraped, and unloads them, again and again,
    keeps label texts for about the samples of one scrape, not of eight (its memory grew
    ~500 B a name unloaded: 10-20 MB for every 20,000)."""
    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from controller.metrics import ControllerMetrics

    node = _fake_node()
    node.profiles = {}
    m = ControllerMetrics(node)
    worst = 0.0
    for cycle in range(12):
        names = [f"c{cycle}_{i}" for i in range(150)]
        node.profiles = dict.fromkeys(names)
        for i, name in enumerate(names):
            m.answered(Reply(Request(i, name, 0, 100 * MS), RequestStatus.SUCCESS, MS,
                             gpu=0, batch_size=1), "success")
        families = list(m.registry.collect())
        m.text(families)
        samples = sum(len(f.samples) for f in families)
        worst = max(worst, (len(m._labels_text) + len(m._values_text)) / samples)
        for name in names:
            m.forget(name)
    assert worst <= 2.2, worst


def test_a_suspect_worker_is_connected_but_not_available():
    """clockwork_workers_available counts the workers that take work (connected and not
    suspect); clockwork_workers_connected still counts a hung worker until its connection
    times out (~10 s), so an alert on it missed one."""
    from types import SimpleNamespace

    from controller.metrics import ControllerMetrics

    node = _fake_node()
    node.links = [SimpleNamespace(connected=True, held="", index=i) for i in range(3)]
    node.links[2].connected = False
    node.available = lambda lk: lk.connected and lk.index != 1  # worker 1: suspect
    samples = parse_text(ControllerMetrics(node).render().decode())
    assert _value(samples, "clockwork_workers_connected") == 2
    assert _value(samples, "clockwork_workers_available") == 1


def test_an_action_the_controller_failed_itself_is_counted_as_rejected():
    """An action failed by the controller's loop (its worker lost or suspect: no action
    handed with the result) counts in ``infer_rejected`` as in /metrics and the action log;
    the Stats counters (and so a live replay's summary) left it out."""
    from types import SimpleNamespace

    from clockwork.actions import ActionType, ErrorCode, Result
    from controller.service import ControllerNode

    counted: dict[str, int] = {}
    seen = []
    node = SimpleNamespace(count=lambda k, n=1: counted.__setitem__(k, counted.get(k, 0) + n),
                           metrics=SimpleNamespace(result=lambda a, r: seen.append((a, r))))
    lost = Result(7, ActionType.INFER, ErrorCode.WORKER_LOST, 0, 0, "m",
                  message="worker lost")
    ControllerNode.result(node, None, lost)
    assert counted == {"infer_rejected": 1} and seen == [(None, lost)]


def test_gpu_metrics_read_as_perf_analyzer_reads_them():
    """perf_analyzer --collect-metrics reads nv_gpu_utilization and nv_gpu_memory_*_bytes
    with a regular expression that wants `{gpu_uuid="..."}` alone and a decimal value
    (`(\\d+\\.?\\d*)`): it read none of ours (labels worker and gpu too), and would have
    read 5.0331648e+07 bytes as 5 and a utilization of 1e-05 as 1. Each GPU's line now
    gives its value whole."""
    import re
    from types import SimpleNamespace

    from controller.metrics import PAGE_SIZE, ControllerMetrics, _plain_number

    node = _fake_node(SimpleNamespace(queued=lambda: 0, pages_used=lambda i: 3,
                                      model_view=lambda n: None))
    gpu = SimpleNamespace(gpu=0, pages=1376)
    node.links = [SimpleNamespace(index=0, state=SimpleNamespace(gpus=[gpu]), connected=True)]
    node.ctrl = None
    text = "\n" + ControllerMetrics(node).render().decode()
    for metric in ("nv_gpu_utilization", "nv_gpu_memory_used_bytes",
                   "nv_gpu_memory_total_bytes"):
        # perf_analyzer's (triton_client_backend.h, ParseAndStoreMetric)
        found = re.findall(r"\n" + metric + r"\{gpu_uuid\=\"([^\"]+)\"\} (\d+\.?\d*)", text)
        lines = re.findall(r"\n" + metric + r"\{[^}]*\} (\S+)", text)
        assert found and len(found) == len(lines), (metric, text)
        assert [float(v) for _, v in found] == [float(v) for v in lines], metric
    used = dict(re.findall(r"\nnv_gpu_memory_used_bytes\{gpu_uuid=\"([^\"]+)\"\} (\S+)", text))
    assert used and all(int(v) % PAGE_SIZE == 0 for v in used.values())
    assert [_plain_number(v) for v in (50331648.0, 1e-05, 0.0, 0.5, 1.0)] == [
        "50331648", "0.00001", "0", "0.5", "1"]


def test_a_request_of_several_rows_counts_once_and_its_counters_never_go_down():
    """A KServe request of 4 rows answered row by row (rows split over batches): Triton's
    request counts move once, when the last row is answered -- one failure if a row
    failed, one success otherwise -- and never go down in between (they counted each
    row answered as a failure until the request was complete, then took them back: a
    Prometheus counter that drops reads as a reset). Its rows are inferences."""
    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from controller.metrics import ControllerMetrics

    m = ControllerMetrics(_fake_node())

    def counts() -> tuple[int, int, int]:
        s = m.statistics("a")
        st = s["inference_stats"]
        return st["success"]["count"], st["fail"]["count"], s["inference_count"]

    ok, late = RequestStatus.SUCCESS, RequestStatus.TIMEOUT
    for statuses, delta in (([ok] * 4, (1, 0, 4)), ([ok, late, ok, late], (0, 1, 0))):
        g = m.request_rows("a", 4)
        before = counts()
        rows = [Request(100 + i, "a", 0, 100 * MS) for i in range(4)]
        for r in rows:
            m.row(g, r.id)
        seen = []
        for r, st in zip(rows, statuses, strict=True):
            m.answered(Reply(r, st, 5 * MS), st.name.lower())
            seen.append(counts())
        assert all(c == before for c in seen), seen  # (nothing moves before the whole)
        m.request_done(g)
        assert tuple(a - b for a, b in zip(counts(), before, strict=True)) == delta
        assert not m.groups


def test_scrape_reads_the_models_a_slice_at_a_time_with_the_loop_free_between(monkeypatch):
    """/metrics (``render_async``) reads the models' counts on the event loop in slices of
    ``MODEL_SLICE`` with the loop free between them (20,481 instances held it ~0.25 s
    at once), counts changed between slices are read as they are then, and the text is
    ``render``'s."""
    import asyncio
    import re
    from types import SimpleNamespace

    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from controller import metrics as mod
    from controller.policy import ModelView

    monkeypatch.setattr(mod, "MODEL_SLICE", 7)
    names = [f"m{i:03d}" for i in range(50)]
    policy = SimpleNamespace(queued=lambda: 2, pages_used=lambda i: 3,
                             model_view=lambda n: ModelView((0,), (), len(n)))
    node = _fake_node(policy)
    node.profiles = dict.fromkeys(names)
    m = mod.ControllerMetrics(node)
    for i, name in enumerate(names):
        r = Request(i, name, 0, 100 * MS)
        m.answered(Reply(r, RequestStatus.SUCCESS, (i + 1) * MS, gpu=0, batch_size=1),
                   "success")
    log: list = []
    read = m._collector.model_rows

    def model_rows(some):
        log.append(len(some))
        return read(some)

    monkeypatch.setattr(m._collector, "model_rows", model_rows)

    async def scrape() -> bytes:
        done = False

        async def other():  # another task of the loop: runs whenever the scrape yields
            while not done:
                log.append("other")
                if log.count("other") == 2:  # after the first slice: a later model answered
                    m.reply("m049", "overloaded", None)
                await asyncio.sleep(0)

        t = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        text = await m.render_async()
        done = True
        await t
        return text

    text = asyncio.run(scrape())
    reads = [x for x in log if x != "other"]
    assert sum(reads) == len(names) and max(reads) <= 7
    i = [j for j, x in enumerate(log) if x != "other"]
    assert all(b - a > 1 for a, b in zip(i, i[1:], strict=False)), log  # the loop ran between
    monkeypatch.setattr(m._collector, "model_rows", read)

    def same(t: bytes) -> bytes:  # (process_* and the uptime move between two reads)
        return re.sub(rb"\n(process_|clockwork_uptime)[^\n]*", b"", t)

    assert same(text) == same(m.render())
    samples = parse_text(text.decode())
    assert _value(samples, "clockwork_requests_total", model="m049", status="overloaded") == 1
    assert _value(samples, "nv_inference_pending_request_count", model="m012") == 4
    assert _value(samples, "nv_inference_request_success", model="m000") == 1


def test_scrape_writes_its_text_on_the_loop_a_slice_at_a_time(monkeypatch):
    """/metrics' text is written on the event loop's thread, about ``WRITE_SLICE_NS`` at
    a time, with the loop free between slices (written on a worker thread, 5,000
    instances' ~65,000 lines made the loop wait for the interpreter lock again and again,
    up to ~20 ms at a time), each slice's rows made as they are written; the bytes are
    ``render``'s."""
    import asyncio
    import re
    import threading

    from clockwork.actions import RequestStatus
    from clockwork.requests import Reply, Request
    from controller import metrics as mod

    monkeypatch.setattr(mod, "WRITE_SLICE_NS", 0)  # (let the loop go at every piece)
    names = [f"m{i:03d}" for i in range(300)]
    node = _fake_node()
    node.profiles = dict.fromkeys(names)
    m = mod.ControllerMetrics(node)
    for i, name in enumerate(names):
        r = Request(i, name, 0, 100 * MS)
        m.answered(Reply(r, RequestStatus.SUCCESS, (i + 1) * MS, gpu=0, batch_size=1),
                   "success")
    log: list = []
    real = mod._labels_text

    def labels_text(labels):  # (called once per label set: for each model's rows)
        log.append(threading.get_ident())
        return real(labels)

    monkeypatch.setattr(mod, "_labels_text", labels_text)

    async def scrape() -> tuple[bytes, int]:
        done = False

        async def other():
            while not done:
                log.append("other")
                await asyncio.sleep(0)

        t = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        text = await m.render_async()
        done = True
        await t
        return text, threading.get_ident()

    text, loop_thread = asyncio.run(scrape())
    writes = [j for j, x in enumerate(log) if x != "other"]
    assert len(writes) > 3 * len(names)  # (several families of a row per model)
    assert {log[j] for j in writes} == {loop_thread}
    between = log[writes[0]:writes[-1]].count("other")
    assert between >= len(writes) // 64 - 1, between  # the loop ran between slices

    def same(t: bytes) -> bytes:  # (process_* and the uptime move between two reads)
        return re.sub(rb"\n(process_|clockwork_uptime)[^\n]*", b"", t)

    assert same(text) == same(m.render())
    assert text.count(b"\nnv_inference_request_success{") == len(names)


def test_a_several_row_requests_queue_time_is_never_negative():
    """A KServe request of 2 rows whose batch began, by the controller's estimate of the
    worker's clock, before the rows arrived (a clock estimated behind): its queue time
    is 0, not negative (Triton's statistics are uint64: a negative sum failed the
    statistics call, and perf_analyzer's REST reader refuses it), as for single rows."""
    from clockwork.actions import Action, ActionType, ErrorCode, RequestStatus, Result
    from clockwork.requests import Reply, Request
    from controller.metrics import ControllerMetrics

    m = ControllerMetrics(_fake_node())
    g = m.request_rows("a", 2)
    rows = [Request(200 + i, "a", 50 * MS, 100 * MS) for i in range(2)]
    for r in rows:
        m.row(g, r.id)
    act = Action(1, ActionType.INFER, 0, 0, "a", 0, 1 << 62, 9 * MS, batch_size=2,
                 requests=rows)
    m.result(act, Result(1, ActionType.INFER, ErrorCode.SUCCESS, 0, 0, "a", 2,
                         begin=49 * MS, end=59 * MS, duration=10 * MS))
    for r in rows:
        m.answered(Reply(r, RequestStatus.SUCCESS, 60 * MS), "success")
    m.request_done(g)
    st = m.statistics("a")["inference_stats"]
    assert st["queue"] == {"count": 1, "ns": 0}, st["queue"]
    assert st["compute_infer"]["ns"] == 10 * MS, st
