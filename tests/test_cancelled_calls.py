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


def test_a_queued_request_whose_caller_went_away_leaves_the_queue():
    """A burst for one model: some requests go out in INFERs, the rest queue. Cancelling
    all of them answers the queued ones ERROR ``CANCELLED`` at once and leaves the queue
    empty; those in INFERs run and succeed; each is answered once, and a request after
    them runs as if they had never come."""
    p = policy("clockwork", models=("a",))
    d = Driver(p)
    d.request(req(1, "a"))
    d.run()
    t = d.t
    burst = [req(i, "a", t, slo=10_000 * 1_000_000) for i in range(10, 110)]
    for r in burst:
        d.request(r)
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


@pytest.mark.parametrize("name", ["clipper", "tfserving", "infaas"])
def test_a_baseline_keeps_the_requests_of_callers_gone(name):
    """The baselines do not take cancelled requests out (``Policy.cancel``'s default):
    they run or time out as if their callers waited."""
    p = policy(name, models=("a",))
    assert p.cancel([req(1, "a")], 0) == [] and p.drain_replies() == []


@pytest.mark.parametrize("api", ["clockwork", "kserve"])
def test_calls_cancelled_by_their_clients_leave_nothing_queued(api):
    """Hundreds of calls with a minute's SLO queue on one GPU (the project's
    ``AsyncClient``; the stock ``tritonclient`` gRPC client on KServe's ``ModelInfer``);
    their client cancels them all: those still queued leave the queue without running
    (they all ran, taking the GPU from whatever came after them), the controller counts
    them ``requests_cancelled``, and a new call is answered."""
    import tritonclient.grpc.aio as tc

    import clockwork

    with local_cluster(workers=1, gpus=1, models="vgg16") as c:
        async def flood() -> None:  # (KServe is served on the controller's port too)
            if api == "clockwork":
                client = clockwork.AsyncClient(c.address, timeout=120)
                calls = [asyncio.create_task(client.infer("vgg16", slo_ms=60_000))
                         for _ in range(600)]
            else:
                client = tc.InferenceServerClient(c.address)
                x = tc.InferInput("data", [1, 3, 224, 224], "FP32")
                x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
                calls = [asyncio.create_task(client.infer("vgg16", [x],
                                                          parameters={"slo_ms": 60_000}))
                         for _ in range(600)]
            with clockwork.Client(c.address, timeout=30) as cl:
                await asyncio.to_thread(poll, lambda: cl.model_status("vgg16").queued > 300)
            for one in calls:
                one.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await client.close()

        asyncio.run(flood())
        with clockwork.Client(c.address, timeout=30) as cl:
            def empty():
                """the queue of vgg16 empty once its callers went away"""
                return cl.model_status("vgg16").queued == 0
            poll(empty, deadline_s=10)
            n = cl.stats()
            # (the queued ones did not run: a GPU drains 300 of them in about a second)
            assert n.get("requests_cancelled", 0) > 200, n
            assert n["requests_success"] < n["requests"] - 200, n
            cl.infer("vgg16", slo_ms=1000)  # (raises unless answered SUCCESS)
