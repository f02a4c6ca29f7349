"""Observability of the live controller: /metrics, /healthz, /readyz, --log-dir."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

grpc = pytest.importorskip("grpc")

import clockwork  # noqa: E402
from clockwork.errors import UnknownModel  # noqa: E402
from controller.metrics import Counter, Histogram, parse_text  # noqa: E402
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


def test_registry_renders_parsable_text():
    c = Counter("x_total", "help", ("model", "status"))
    c.inc(("a\"b", "ok"))
    c.inc(("a\"b", "ok"), 2)
    h = Histogram("lat_seconds", "help", (0.001, 0.01))
    for v in (0.0005, 0.005, 0.5):
        h.observe(v)
    text = "\n".join([*c.render(), *h.render()]) + "\n"
    s = parse_text(text)
    assert s["x_total"] == [({"model": 'a\\"b', "status": "ok"}, 3.0)]
    buckets = [v for _, v in s["lat_seconds_bucket"]]
    assert buckets == [1, 2, 3] and s["lat_seconds_count"] == [({}, 3.0)]
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
        assert _get(base + "/v2/health/live")[0] == 200  # the KServe routes still answer
    assert c.controller.proc.returncode == 0
    req = (logs / "requests.tsv").read_text().splitlines()
    act = (logs / "actions.tsv").read_text().splitlines()
    assert req[0].startswith("request_id\tmodel\tarrival")
    assert len(req) == 1 + 8
    assert all(row.split("\t")[5] == "SUCCESS" and row.split("\t")[6] == "1" for row in req[1:])
    assert act[0].startswith("action_id\ttype\tstatus")
    kinds = [row.split("\t")[1] for row in act[1:]]
    assert "INFER" in kinds and "LOAD" in kinds
