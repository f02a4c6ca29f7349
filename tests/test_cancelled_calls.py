"""Requests whose callers went away: a cancelled call, a closed connection. The
scheduler takes a queued one out of its queue and answers it ERROR ``CANCELLED``
(``Policy.cancel``), so that it takes no GPU time and no place before the requests
whose callers still wait; one in an INFER already sent runs on. Live, over the
controller's own ``Infer`` and KServe's ``ModelInfer``, calls cancelled by their
clients leave nothing queued."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clockwork.actions import ActionType, RequestStatus
from controller.policy import CANCELLED
from tests.conftest import local_cluster, poll
from tests.test_repository import Driver, of, policy, req

# (batches of one: the GPU drains ~100 requests a second, so that a queue builds even
# from a client slowed by a loaded host: ResNet-size inputs, 600 KB a request)
ONE_AT_A_TIME = {"max_batch": 1}


def _warm_then_burst(n: int):
    """The Clockwork scheduler with model "a" loaded (request 1 served), then ``n``
    requests 10, 11, ... with a minute's SLO at once: (policy, driver, now, burst)."""
    p = policy("clockwork", models=("a",))
    d = Driver(p)
    d.request(req(1, "a"))
    d.run()
    t = d.t
    burst = [req(i, "a", t, slo=60_000 * 1_000_000) for i in range(10, 10 + n)]
    for r in burst:
        d.request(r)
    return p, d, t, burst


def test_a_queued_request_whose_caller_went_away_leaves_the_queue():
    """A burst for one model: some requests go out in INFERs, the rest queue. Cancelling
    all of them answers the queued ones ERROR ``CANCELLED`` at once and leaves the queue
    empty; those in INFERs run and succeed; each is answered once, and a request after
    them runs as if they had never come."""
    p, d, t, burst = _warm_then_burst(100)
    inflight = {r.id for a in of(d.pending, ActionType.INFER, "a") for r in a.requests}
    waiting = {r.id for r in burst} - inflight - set(d.replies)
    assert inflight and waiting and p.model_view("a").queued == len(waiting)
    d.take(p.cancel(burst, t))
    cancelled = {i for i, rep in d.replies.items() if rep.message == CANCELLED}
    assert cancelled == waiting
    assert all(d.replies[i].status == RequestStatus.ERROR for i in cancelled)
    assert p.model_view("a").queued == 0 and p.queued() == 0
    d.take(p.cancel(burst, t))  # (again: nothing is answered twice)
    d.request(req(500, "a", t))
    d.run()
    assert all(d.replies[i].status == RequestStatus.SUCCESS for i in inflight | {500})
    assert set(d.replies) == {1, 500, *range(10, 110)}


def test_a_withdrawn_request_whose_infer_fails_is_not_run_again():
    """Requests withdrawn while their INFER is out run on; if that INFER then fails (here
    its worker is lost), they are answered ERROR ``CANCELLED`` instead of being queued
    again (they went back to the queue and ran for nobody)."""
    from clockwork.actions import ErrorCode
    from tests.test_repository import fail

    p, d, t, burst = _warm_then_burst(4)
    infer = of(d.pending, ActionType.INFER, "a")[0]
    ids = {r.id for r in infer.requests}
    d.take(p.cancel(burst, t))
    assert not ids & set(d.replies)  # (in the INFER: not answered by the cancel)
    d.pending.remove(infer)
    d.take(p.on_result(fail(infer, t + 1_000_000, ErrorCode.WORKER_LOST), t + 1_000_000))
    assert {i: d.replies[i].message for i in ids} == {i: CANCELLED for i in ids}
    assert p.queued() == 0
    d.run()
    assert set(d.replies) == {1, *range(10, 14)}


@pytest.mark.parametrize("name", ["clipper", "tfserving", "infaas"])
def test_a_baseline_keeps_the_requests_of_callers_gone(name):
    """The baselines do not take cancelled requests out (``Policy.cancel``'s default):
    they run or time out as if their callers waited."""
    p = policy(name, models=("a",))
    assert p.cancel([req(1, "a")], 0) == [] and p.drain_replies() == []


@pytest.mark.parametrize("api", ["clockwork", "kserve", "rest"])
def test_calls_cancelled_by_their_clients_leave_nothing_queued(api):
    """Hundreds of calls with a minute's SLO queue on one GPU (the project's
    ``AsyncClient``; the stock ``tritonclient`` gRPC client on KServe's ``ModelInfer``;
    its HTTP client on KServe's REST infer, one connection a call, which it closes when
    the call is cancelled); their client cancels them all: those still queued leave the
    queue without running (they all ran, taking the GPU from whatever came after them),
    the controller counts them ``requests_cancelled``, and a new call is answered."""
    import clockwork
    from tests.test_kserve import _http_address

    with local_cluster(workers=1, gpus=1, models="vgg16", scheduler=ONE_AT_A_TIME) as c:
        url = _http_address(c) if api == "rest" else c.address

        async def flood() -> None:  # (gRPC KServe is served on the controller's port too)
            client, infer = _client(api, url)
            calls = [asyncio.create_task(infer()) for _ in range(600)]
            with clockwork.Client(c.address, timeout=30) as cl:
                await asyncio.to_thread(poll, lambda: cl.model_status("vgg16").queued > 100)
            for one in calls:
                one.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await client.close()

        asyncio.run(flood())
        _cancelled_leave_nothing(c)


def _client(api: str, url: str):
    """(client, a function that starts one vgg16 call with a minute's SLO) for ``api``."""
    import clockwork

    if api == "clockwork":
        client = clockwork.AsyncClient(url, timeout=120)
        return client, lambda: client.infer("vgg16", slo_ms=60_000)
    if api == "kserve":
        import tritonclient.grpc.aio as tc

        client = tc.InferenceServerClient(url)
    else:
        import tritonclient.http.aio as tc

        client = tc.InferenceServerClient(url, conn_limit=700, conn_timeout=120)
    x = tc.InferInput("data", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    return client, lambda: client.infer("vgg16", [x], parameters={"slo_ms": 60_000})


def _cancelled_leave_nothing(c) -> None:
    """Once the flood's callers went away: vgg16's queue empties, more than 50 of its
    requests were withdrawn without running, and a new call is answered."""
    import clockwork

    with clockwork.Client(c.address, timeout=30) as cl:
        def empty():
            """the queue of vgg16 empty once its callers went away"""
            return cl.model_status("vgg16").queued == 0
        poll(empty, deadline_s=10)
        n = cl.stats()
        assert n.get("requests_cancelled", 0) > 50, n
        assert n.get("requests_success", 0) < n["requests"] - 50, n
        cl.infer("vgg16", slo_ms=1000)


def _queued_over(c, n: int) -> None:
    import clockwork

    with clockwork.Client(c.address, timeout=30) as cl:
        poll(lambda: cl.model_status("vgg16").queued > n)


def test_a_stream_whose_client_abandons_it_leaves_nothing_queued():
    """The project's stream client: 600 requests with a minute's SLO, then ``close()``
    cancelled (it abandons what is unanswered, and cancels the call): the controller
    withdraws the stream's queued requests."""
    import clockwork

    with local_cluster(workers=1, gpus=1, models="vgg16", scheduler=ONE_AT_A_TIME) as c:
        async def flood() -> None:
            async with clockwork.AsyncClient(c.address, timeout=120) as client:
                s = client.stream()
                futs = [s.submit("vgg16", slo_ms=60_000) for _ in range(600)]
                await asyncio.to_thread(_queued_over, c, 100)
                closing = asyncio.create_task(s.close())
                await asyncio.sleep(0)
                closing.cancel()
                await asyncio.gather(closing, *futs, return_exceptions=True)

        asyncio.run(flood())
        _cancelled_leave_nothing(c)


def test_a_kserve_stream_stopped_with_its_requests_cancelled_leaves_nothing_queued():
    """The stock ``tritonclient`` gRPC client: 600 requests on ``ModelStreamInfer``, then
    ``stop_stream(cancel_requests=True)``: the controller withdraws the stream's queued
    requests."""
    import tritonclient.grpc as tc

    with local_cluster(workers=1, gpus=1, models="vgg16", scheduler=ONE_AT_A_TIME) as c:
        client = tc.InferenceServerClient(c.address)
        x = tc.InferInput("data", [1, 3, 224, 224], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
        client.start_stream(callback=lambda result, error: None)
        for _ in range(600):
            client.async_stream_infer("vgg16", [x], parameters={"slo_ms": 60_000})
        _queued_over(c, 100)
        client.stop_stream(cancel_requests=True)
        client.close()
        _cancelled_leave_nothing(c)

