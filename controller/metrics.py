"""Prometheus text-format metrics of the controller (no client library needed).

Metrics (exposition format 0.0.4, served at ``/metrics`` on the controller's HTTP port):

- ``clockwork_requests_total{model,status}`` counter: answered requests;
- ``clockwork_request_latency_seconds`` histogram: controller-side latency of successful
  requests (arrival -> answer);
- ``clockwork_queue_depth`` gauge: requests waiting in the scheduling policy
  (``Policy.queued()``: accepted, not answered, not in an INFER in flight);
- ``clockwork_requests_outstanding`` gauge: requests accepted and not yet answered;
- ``clockwork_actions_total{type,status}`` counter: finished actions by result status;
- ``clockwork_actions_sent_total{type}`` counter;
- ``clockwork_gpu_busy_fraction{worker,gpu}`` gauge: measured EXEC time / wall time since
  the controller started;
- ``clockwork_exec_prediction_error_seconds`` histogram: |measured - expected| EXEC
  duration of successful INFERs;
- ``clockwork_workers_connected`` gauge, ``clockwork_uptime_seconds`` gauge.

Hooks are plain dict increments so that they cost little on the controller's hot path.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15,
                   0.25, 0.5, 1.0)
ERROR_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2)


def _esc(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_esc(v)}"' for n, v in zip(names, values, strict=True)) + "}"


def _num(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.labelnames = name, help, labels
        self.values: dict[tuple, float] = {}

    def inc(self, labels: tuple = (), n: float = 1) -> None:
        v = self.values
        v[labels] = v.get(labels, 0) + n

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for k in sorted(self.values, key=str):
            yield f"{self.name}{_labels(self.labelnames, k)} {_num(self.values[k])}"


class Gauge:
    """A gauge whose samples come from a function at scrape time."""

    def __init__(self, name: str, help: str, labels: tuple[str, ...],
                 fn: Callable[[], Iterable[tuple[tuple, float]]]) -> None:
        self.name, self.help, self.labelnames, self.fn = name, help, labels, fn

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        for k, v in self.fn():
            yield f"{self.name}{_labels(self.labelnames, k)} {_num(v)}"


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help = name, help
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        acc = 0
        for b, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += c
            yield f'{self.name}_bucket{{le="{_num(b) if b == math.inf else repr(b)}"}} {acc}'
        yield f"{self.name}_sum {repr(self.sum)}"
        yield f"{self.name}_count {self.count}"


class ControllerMetrics:
    """The controller's metrics; ``node`` is a ``ControllerNode`` (read at scrape time)."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, node) -> None:
        self.node = node
        self.start_ns = time.monotonic_ns()
        self.requests = Counter("clockwork_requests_total",
                                "Answered requests by model instance and status.",
                                ("model", "status"))
        self.latency = Histogram("clockwork_request_latency_seconds",
                                 "Controller-side latency of successful requests.",
                                 LATENCY_BUCKETS)
        self.actions = Counter("clockwork_actions_total",
                               "Finished actions by type and result status.", ("type", "status"))
        self.sent = Counter("clockwork_actions_sent_total", "Actions sent to workers.",
                            ("type",))
        self.pred_error = Histogram("clockwork_exec_prediction_error_seconds",
                                    "|measured - expected| EXEC duration of successful INFERs.",
                                    ERROR_BUCKETS)
        self.busy_ns: dict[tuple[int, int], int] = {}
        self.gauges = [
            Gauge("clockwork_queue_depth", "Requests waiting in the scheduling policy.", (),
                  lambda: [((), self._queued())]),
            Gauge("clockwork_requests_outstanding", "Requests accepted, not yet answered.", (),
                  lambda: [((), len(self.node.pending))]),
            Gauge("clockwork_gpu_busy_fraction",
                  "Measured EXEC time / wall time since the controller started.",
                  ("worker", "gpu"), self._busy),
            Gauge("clockwork_workers_connected", "Workers connected now.", (),
                  lambda: [((), sum(1 for lk in self.node.links if lk.connected))]),
            Gauge("clockwork_uptime_seconds", "Seconds since the controller started.", (),
                  lambda: [((), (time.monotonic_ns() - self.start_ns) / 1e9)]),
        ]

    # hooks --------------------------------------------------------------------------

    def reply(self, model: str, status: str, latency_ns: int | None) -> None:
        self.requests.inc((model, status))
        if latency_ns is not None:
            self.latency.observe(latency_ns / 1e9)

    def action_sent(self, type_name: str) -> None:
        self.sent.inc((type_name,))

    def result(self, action, result) -> None:
        t = result.type.name
        self.actions.inc((t, result.status.name))
        if t == "INFER" and result.status == 0:
            key = (result.worker, result.gpu)
            self.busy_ns[key] = self.busy_ns.get(key, 0) + result.duration
            if action is not None:
                self.pred_error.observe(abs(result.duration - action.expected_duration) / 1e9)

    # scrape -------------------------------------------------------------------------

    def _queued(self) -> int:
        return self.node.policy.queued()

    def _busy(self) -> list[tuple[tuple, float]]:
        wall = max(1, time.monotonic_ns() - self.start_ns)
        keys = sorted(set(self.node.gpu_index) | set(self.busy_ns))
        return [(k, round(min(1.0, self.busy_ns.get(k, 0) / wall), 6)) for k in keys]

    def render(self) -> bytes:
        lines: list[str] = []
        for m in (self.requests, self.latency, self.actions, self.sent, self.pred_error,
                  *self.gauges):
            lines.extend(m.render())
        return ("\n".join(lines) + "\n").encode()


def parse_text(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Parse exposition-format samples: name -> [(labels, value)]. Raises ValueError on a
    malformed line (used by tests and the benchmark)."""
    import re

    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError(f"bad sample line: {line!r}")
        labels = dict(label_re.findall(m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out
