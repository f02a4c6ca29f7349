"""How a KServe request fails: the one table (controller/kserve_status.py), and a live
overload far beyond a GPU's capacity answered with no INTERNAL / 500 at all."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from clockwork.actions import ErrorCode, RequestStatus
from controller.inflight import error_message, failed_code
from controller.kserve_status import (
    DEADLINE,
    INTERNAL,
    INTERNAL_MESSAGE,
    INVALID,
    NOT_FOUND,
    UNAVAILABLE,
    of_answer,
)
from tests.conftest import local_cluster

ROOT = Path(__file__).resolve().parent.parent
ERR = RequestStatus.ERROR


def _worker_error(code: ErrorCode, text: str = "started 3 ms past its window") -> str:
    from clockwork.actions import ActionType, Result

    return error_message(Result(1, ActionType.INFER, code, 0, 0, "m", message=text))


def test_the_table():
    def kind(status, reason="", message=""):
        return of_answer(status, reason, message).kind

    assert kind(RequestStatus.TIMEOUT, "", "SLO cannot be met") == DEADLINE
    assert kind(RequestStatus.INVALID_REQUEST, "unknown_model", "unknown model 'x'") == NOT_FOUND
    assert kind(RequestStatus.INVALID_REQUEST, "bad_input", "input 'x' ...") == INVALID
    assert kind(RequestStatus.INVALID_REQUEST, "bad_slo", "slo_ms must be ...") == INVALID
    assert kind(ERR, "overloaded", "overloaded: 4 requests outstanding") == UNAVAILABLE
    assert kind(ERR, "shutdown", "controller is shutting down") == UNAVAILABLE
    # a worker's *_TOO_LATE: the SLO could not be met, never INTERNAL
    for code in ErrorCode:
        if code.name.endswith("_TOO_LATE"):
            e = of_answer(ERR, "", _worker_error(code))
            assert e.kind == DEADLINE, code
            assert e.message == f"TIMEOUT: SLO cannot be met (worker error {code.name})"
    # ... as the scheduler answers it now (TIMEOUT): the same, the worker's text left out
    for code in ErrorCode:
        if code.name.endswith(("_TOO_LATE", "_TOO_EARLY")):
            e = of_answer(RequestStatus.TIMEOUT, "", _worker_error(code, "secret detail"))
            assert (e.kind, e.message) == (
                DEADLINE, f"TIMEOUT: SLO cannot be met (worker error {code.name})"), code
    for code in (ErrorCode.WORKER_LOST, ErrorCode.WEIGHTS_NOT_PRESENT,
                 ErrorCode.WEIGHTS_CHANGED, ErrorCode.EXEC_WEIGHTS_MISSING,  # a lost worker, weights gone
                 # a model whose LOADs were refused 3 times (a full cache, no package): it
                 # was INTERNAL "internal error", the reason gone
                 ErrorCode.LOAD_INSUFFICIENT_CACHE, ErrorCode.UNKNOWN_MODEL):
        e = of_answer(ERR, "", _worker_error(code, "worker lost"))
        assert (e.kind, e.message) == (UNAVAILABLE, f"ERROR: worker error {code.name}")
    # a bug: a stable message, nothing of the exception or the worker's text
    for status, message in ((ERR, _worker_error(ErrorCode.INVALID_INPUT, "secret detail")),
                            (ERR, "the controller could not admit this request: "
                                  "KeyError('secret detail')"),
                            (ERR, "the worker's outputs do not fit: secret detail"),
                            (99, "secret detail")):
        e = of_answer(status, "", message)
        assert (e.kind, e.message) == (INTERNAL, INTERNAL_MESSAGE)


def test_failed_code_reads_error_message_back():
    for code in ErrorCode:
        assert failed_code(_worker_error(code, "x: y")) is code
    assert failed_code("worker error NOT_A_CODE: x") is None
    assert failed_code("SLO cannot be met") is None


def test_every_policy_error_answer_is_in_the_table():
    """Each ``_answer(..., RequestStatus.ERROR, now, "...")`` a policy can give with a
    literal message, or a message constant of its module, maps to a
    status that is not INTERNAL (policies answer ERROR only for load they shed or cannot
    place); ``error_message(result)`` is covered above."""
    import importlib

    seen = 0
    policies = [ROOT / "controller" / "scheduler.py",
                *(ROOT / "controller" / "baselines").glob("*.py")]
    for path in policies:
        text = path.read_text()
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for m in re.finditer(r"RequestStatus\.ERROR,\s*now,\s*(\"[^\"]*\"|[A-Z][A-Z_]+\b|"
                             r"error_message)", text):
            seen += 1
            if m.group(1) == "error_message":
                continue
            message = (getattr(importlib.import_module(module), m.group(1))  # (its name
                       if m.group(1)[0] != '"' else json.loads(m.group(1)))  # there)
            assert of_answer(ERR, "", message).kind == UNAVAILABLE, (path, message)
    assert seen >= 5


# ---------------------------------------------------------------------- live overload

EXEC_NS = {"1": 30_000_000, "2": 33_000_000}
# the most requests per second the GPU can serve: the best batch size's rows per EXEC
CAPACITY_RPS = max(int(b) / (ns / 1e9) for b, ns in EXEC_NS.items())


@pytest.fixture(scope="module")
def slow_profiles(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("profiles")
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    for name, exec_ns in (("slow", EXEC_NS), ("glacial", {"1": 500_000_000})):
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": 1 << 20,
            "load_ns": 2_000_000, "exec_ns": exec_ns,
            "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": [4], "dtype": "float32"}]}))
    return d


def _rest_post(url: str, body: bytes):
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _stream_errors(address: str, n: int) -> list[str]:
    """Send ``n`` requests to ``slow`` on one ModelStreamInfer stream -> the error
    messages of their answers (None for a success)."""
    import queue

    import tritonclient.grpc as tgrpc

    c = tgrpc.InferenceServerClient(address)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put(error))
    try:
        x = tgrpc.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        for i in range(n):
            c.async_stream_infer("slow", [x], request_id=str(i), parameters={"slo_ms": 50})
        errors = [got.get(timeout=10) for _ in range(n)]
    finally:
        c.stop_stream()
        c.close()
    return [None if e is None else str(e) for e in errors]


def test_overload_has_no_internal_errors(slow_profiles):
    """A 1-GPU emulated cluster whose model serves at most ~60 requests/s, stragglers on
    the worker (EXEC_TOO_LATE rejections follow them), a bound of 4 outstanding requests,
    and 256 closed-loop tritonclient gRPC callers with a 50 ms SLO (offering far over 5x
    the capacity): every answer is OK, DEADLINE_EXCEEDED or UNAVAILABLE; REST, beside
    it, is 200, 504 or 503 (with Retry-After; one is made sure of first: a request to
    ``glacial``, 0.5 s per EXEC, holds one of the 4 places while 3 more wait behind it;
    a ModelStreamInfer stream then is answered UNAVAILABLE per request)."""
    tgrpc = pytest.importorskip("tritonclient.grpc")
    aio = pytest.importorskip("tritonclient.grpc.aio")
    from tritonclient.utils import InferenceServerException

    from clockwork.client import Client

    worker = ["--slow-prob", "0.3", "--slow-factor", "3", "--seed", "3"]
    with local_cluster(workers=1, gpus=1, profiles=str(slow_profiles), http_port=0,
                       worker_args=[worker],
                       controller_args=["--limit", "global_outstanding=4"]) as cluster:
        http = "http://" + cluster.printed_address("http") + "/v2/models/slow/infer"
        rest_body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                            "data": [0, 0, 0, 0]}],
                                "parameters": {"slo_ms": 50}}).encode()

        async def main():
            c = aio.InferenceServerClient(cluster.address)
            x = tgrpc.InferInput("x", [1, 4], "FP32")
            x.set_data_from_numpy(np.zeros((1, 4), np.float32))
            grpc_tally: collections.Counter = collections.Counter()
            rest_tally: collections.Counter = collections.Counter()
            retry_after = set()
            end = 0.0

            async def caller():
                while time.monotonic() < end:
                    try:
                        await c.infer("slow", [x], parameters={"slo_ms": 50},
                                      client_timeout=10)
                        grpc_tally["OK"] += 1
                    except InferenceServerException as e:
                        grpc_tally[e.status()] += 1

            async def rest_caller():
                loop = asyncio.get_running_loop()
                while time.monotonic() < end:
                    status, headers, _ = await loop.run_in_executor(
                        None, _rest_post, http, rest_body)
                    rest_tally[status] += 1
                    if status == 503:
                        retry_after.add(headers.get("Retry-After"))

            # four requests outstanding (one runs 0.5 s, three wait): REST is shed
            slow4 = [asyncio.ensure_future(c.infer("glacial", [x], parameters={"slo_ms": 9000},
                                                    client_timeout=30)) for _ in range(4)]
            with Client(cluster.address) as k:
                while k.stats().get("requests", 0) < 4:
                    await asyncio.sleep(0.01)  # polling a condition, not a wait for time
            shed = await asyncio.get_running_loop().run_in_executor(
                None, _rest_post, http.replace("/slow/", "/glacial/"), rest_body)
            stream_shed = await asyncio.get_running_loop().run_in_executor(
                None, _stream_errors, cluster.address, 3)
            for r in await asyncio.gather(*slow4, return_exceptions=True):  # a straggler
                if isinstance(r, Exception):  # can make them late, never INTERNAL
                    assert r.status() == "StatusCode.DEADLINE_EXCEEDED", r

            end = time.monotonic() + 3.0
            t0 = time.monotonic()
            await asyncio.gather(rest_caller(), *(caller() for _ in range(256)))
            elapsed = time.monotonic() - t0
            await c.close()
            return grpc_tally, rest_tally, retry_after, elapsed, shed, stream_shed

        grpc_tally, rest_tally, retry_after, elapsed, shed, stream_shed = asyncio.run(main())
        with Client(cluster.address) as k:
            counters = k.stats()
    total = sum(grpc_tally.values())
    assert total / elapsed >= 5 * CAPACITY_RPS, (total, elapsed)
    assert set(grpc_tally) <= {"OK", "StatusCode.DEADLINE_EXCEEDED",
                               "StatusCode.UNAVAILABLE"}, grpc_tally
    assert grpc_tally["StatusCode.DEADLINE_EXCEEDED"] > 0, grpc_tally
    assert grpc_tally["StatusCode.UNAVAILABLE"] > 0, grpc_tally
    assert grpc_tally["OK"] > 0, grpc_tally
    assert set(rest_tally) <= {200, 503, 504} and rest_tally[504] > 0, rest_tally
    assert retry_after <= {"1"}, retry_after
    status, headers, body = shed
    assert (status, headers.get("Retry-After")) == (503, "1"), shed
    assert json.loads(body)["error"].startswith("ERROR: overloaded: "), shed
    assert stream_shed == [f"UNAVAILABLE: [request id: {i}] ERROR: overloaded: 4 requests "
                           "outstanding in the controller (limit global_outstanding)"
                           for i in range(3)], stream_shed
    # worker rejections (too late) were answered TIMEOUT by the scheduler (DEADLINE_EXCEEDED
    # above, never INTERNAL)
    assert counters.get("infer_rejected", 0) > 0, counters
    assert counters.get("requests_timeout", 0) > 0, counters


def test_a_call_whose_deadline_passed_before_its_answer_logs_nothing(tmp_path):
    """tritonclient gRPC calls with a ResNet-size batch of 16 and a client timeout of 1-8
    ms: most reach the controller after their deadline, and the TIMEOUT the scheduler
    answers at once can no longer be sent. That failed send was logged as an internal
    error with two tracebacks (a few calls in 200): operators hunted a bug that was not
    there. The client sees DEADLINE_EXCEEDED either way."""
    tgrpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    from clockwork.client import Client

    (tmp_path / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    (tmp_path / "big.json").write_text(json.dumps({
        "model": "big", "device": "test", "weights_bytes": 1 << 20, "load_ns": 2_000_000,
        "exec_ns": {"1": 3_000_000, "16": 20_000_000},
        "inputs": [{"name": "x", "shape": [3, 224, 224], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [4], "dtype": "float32"}]}))
    with local_cluster(workers=1, gpus=1, profiles=str(tmp_path)) as cluster:
        c = tgrpc.InferenceServerClient(cluster.address)
        x = tgrpc.InferInput("x", [16, 3, 224, 224], "FP32")
        x.set_data_from_numpy(np.zeros((16, 3, 224, 224), np.float32))
        statuses = collections.Counter()
        for i in range(200):
            try:
                c.infer("big", [x], client_timeout=0.001 * (1 + i % 8),
                        parameters={"slo_ms": 10_000})
                statuses["OK"] += 1
            except InferenceServerException as e:
                statuses[e.status()] += 1
        c.close()
        with Client(cluster.address) as k:  # (one more call: the controller is past them)
            k.stats()
        out = "".join(cluster.controller.output)
    assert set(statuses) <= {"OK", "StatusCode.DEADLINE_EXCEEDED"}, statuses
    assert "ExecuteBatchError" not in out and "Traceback" not in out, out[-3000:]


def test_a_model_unloaded_after_its_request_was_checked_is_said_as_the_front_end_says_it():
    """A request for a model unloaded between the front end's check and the controller's
    answer reads as any request for an unknown model (its text had INVALID_REQUEST
    before it, a second wording of one 404)."""
    e = of_answer(RequestStatus.INVALID_REQUEST, "unknown_model", "unknown model 'tt' (7 served)")
    assert (e.kind, e.message) == (NOT_FOUND, "unknown model 'tt' (7 served)")
    e = of_answer(RequestStatus.INVALID_REQUEST, "", "bad input")
    assert e.message == "INVALID_REQUEST: bad input"
