"""Workers joining a running cluster: every policy takes a GPU added at run time
(``Policy.add_gpu``) and places copies on it; the controller loop gives the new worker its
index and GPUs; a live controller connects a worker it is told of while serving
(``clockwork.v1`` AddWorker, ``Client.add_worker``) and schedules work there."""

from __future__ import annotations

import pytest

from clockwork.actions import ActionType
from clockwork.profiles import load_profile_set
from clockwork.requests import Request
from clockwork.time import ms
from controller import make_policy
from controller.loop import ControllerLoop
from controller.policy import GpuSpec
from tests.test_loops import Recorder

PSET = load_profile_set("v100-reference")
R50, R18 = PSET.get("resnet50_v2"), PSET.get("resnet18_v2")


@pytest.mark.parametrize("policy", ["clockwork", "clipper", "tfserving", "infaas"])
def test_a_gpu_added_at_run_time_gets_copies(policy):
    """One GPU with room for one model; both models wanted; a second worker's GPU is
    added and the model that had no room is loaded there (nothing evicted on the first)."""
    room = max(R50.weights_pages, R18.weights_pages)
    specs = [GpuSpec(0, 0, room)]
    t = Recorder()
    loop = ControllerLoop(make_policy(policy, [R50, R18], specs), t, specs)
    now = 0
    loop.requests([Request(i, "resnet50_v2", now, ms(500)) for i in range(4)], now)
    loads0 = [a for _, acts in t.sent for a in acts if a.type == ActionType.LOAD]
    assert [(a.worker, a.model) for a in loads0] == [(0, "resnet50_v2")]
    now = ms(1)
    assert loop.add_worker([GpuSpec(1, 0, room)], now) == 1
    assert loop.gpus_of == [[0], [1]] and loop.up == [True, True]
    rid = 100
    for _ in range(40):  # requests for the other model keep coming; timers fire
        now += ms(5)
        loop.requests([Request(rid, "resnet18_v2", now, ms(500))], now)
        rid += 1
        if loop.armed is not None and loop.armed <= now:
            loop.tick(now)
        if any(a.type == ActionType.LOAD and a.model == "resnet18_v2"
               for _, acts in t.sent for a in acts):
            break
    loads = [(a.worker, a.model) for _, acts in t.sent for a in acts
             if a.type in (ActionType.LOAD, ActionType.EVICT)]
    assert (1, "resnet18_v2") in loads, loads
    assert all(w == 1 for w, m in loads if m == "resnet18_v2"), loads
    assert not any(a.type == ActionType.EVICT for _, acts in t.sent for a in acts)


def test_add_worker_checks_the_worker_index():
    specs = [GpuSpec(0, 0, 100)]
    loop = ControllerLoop(make_policy("clockwork", [R50], specs), Recorder(), specs)
    with pytest.raises(ValueError, match="worker 1"):
        loop.add_worker([GpuSpec(3, 0, 100)], 0)
    assert loop.add_worker([GpuSpec(1, 0, 100), GpuSpec(1, 1, 100)], 0) == 1
    assert loop.gpus_of == [[0], [1, 2]] and loop.n_gpus == 3


def test_live_controller_connects_a_worker_while_serving():
    """A 1-worker cluster whose GPU holds one of its two models; a second worker process is
    started and added while the controller serves: it gets worker index 1 and GPU 1, the
    second model is loaded there (the first stays on GPU 0), both are served; adding it
    again changes nothing; an address nobody listens on is refused in one answer."""
    pytest.importorskip("grpc")
    from clockwork.client import Client
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    room = max(R50.weights_pages, R18.weights_pages)
    with local_cluster(workers=1, gpus=1, models="resnet50_v2,resnet18_v2",
                       pages=room) as c, Client(c.address) as k:
        k.infer("resnet50_v2", slo_ms=1000)  # raises unless served
        assert list(k.model_status("resnet50_v2").loaded_on) == [0]
        got = c.add_worker()
        assert got == {"worker": 1, "gpus": [1], "added": True}
        assert k.add_worker(c.worker_addresses[1]) == {"worker": 1, "gpus": [1],
                                                      "added": False}
        for _ in range(5):
            k.infer("resnet18_v2", slo_ms=1000)  # raises unless served
            k.infer("resnet50_v2", slo_ms=1000)  # raises unless served
        assert list(k.model_status("resnet18_v2").loaded_on) == [1]
        assert list(k.model_status("resnet50_v2").loaded_on) == [0]
        stats = k.stats()
        assert stats.get("workers_added") == 1 and stats.get("evicts_sent", 0) == 0, stats
        with pytest.raises(ControllerUnavailable, match="cannot reach") as e:
            k.add_worker("127.0.0.1:9", timeout=3)
        assert "connection refused" in str(e.value), e.value  # and why


def test_a_worker_added_while_a_model_waits_for_a_copy_joins():
    """Requests for two models keep coming to a worker whose GPU has room for one, so one
    of them waits for a copy; a second worker is added: the policy places that model on
    it at once. The LOAD went out before the controller had the new worker's link (an
    IndexError: the add failed, and every later add was refused "must name worker 1");
    now the worker joins and both models are served."""
    import threading

    pytest.importorskip("grpc")
    from clockwork.client import Client
    from clockwork.errors import ClockworkError
    from tests.conftest import local_cluster

    room = max(R50.weights_pages, R18.weights_pages)
    with local_cluster(workers=1, gpus=1, models="resnet50_v2,resnet18_v2",
                       pages=room) as c, Client(c.address, timeout=10) as k:
        stop = threading.Event()
        waited = threading.Event()

        def send(model: str) -> None:
            with Client(c.address, timeout=10) as mine:
                while not stop.is_set():
                    try:
                        mine.infer(model, slo_ms=2000)
                    except ClockworkError:
                        pass
                    if not k.model_status(model).loaded_on:
                        waited.set()

        senders = [threading.Thread(target=send, args=(m,), daemon=True)
                   for m in ("resnet50_v2", "resnet18_v2") for _ in range(3)]
        for t in senders:
            t.start()
        try:
            assert waited.wait(20), "no model ever waited for a copy"
            assert c.add_worker() == {"worker": 1, "gpus": [1], "added": True}
        finally:
            stop.set()
            for t in senders:
                t.join(30)
        for m in ("resnet50_v2", "resnet18_v2"):
            k.infer(m, slo_ms=2000)  # raises unless served
        assert k.stats().get("workers_added") == 1


def test_a_policy_that_cannot_grow_leaves_the_loop_as_it_was():
    """A policy that cannot add GPUs refuses a new worker; the loop has no trace of it
    (it kept a worker with no GPU, and the next add had to name worker 2)."""
    from controller.scheduler import ClockworkScheduler

    class Fixed(ClockworkScheduler):
        def add_gpu(self, spec, now):
            raise NotImplementedError("fixed")

    specs = [GpuSpec(0, 0, 100)]
    loop = ControllerLoop(Fixed([R50], specs), Recorder(), specs)
    with pytest.raises(NotImplementedError):
        loop.add_worker([GpuSpec(1, 0, 100)], 0)
    assert (loop.gpus_of, loop.up, loop.outstanding, loop.suspect, loop.resetting) == (
        [[0]], [True], [{}], [False], [False])


def test_a_worker_with_more_gpus_than_a_worker_may_have_is_refused():
    """A worker's GPU count comes from the worker: the controller takes 1 to
    MAX_GPUS_PER_WORKER (as ``clockwork worker --gpus`` does), at start and when one is
    added while serving, and says why otherwise. Controller and workers in this process."""
    import asyncio

    from clockwork.sizes import MAX_GPUS_PER_WORKER
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        big = WorkerNode(gpus=MAX_GPUS_PER_WORKER + 1, pages=100)
        big_address, stop_big, served_big = await serve_in_process(big)
        ok = WorkerNode(gpus=MAX_GPUS_PER_WORKER, pages=100)
        address, stop, served = await serve_in_process(ok)
        refused = f"worker {big_address} has 65 GPUs: a worker has 1 to 64"
        node = ControllerNode([big_address], "v100-reference", models="resnet50_v2")
        try:
            with pytest.raises(ValueError, match=f"^{refused}$"):
                await node.start()
        finally:
            await node.stop()
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        try:
            with pytest.raises(RepositoryError) as e:
                await node.add_worker(big_address)
            assert e.value.message == refused
            assert len(node.links) == 1 and len(node.gpu_index) == MAX_GPUS_PER_WORKER
        finally:
            await node.stop()
            for s in (stop, stop_big):
                s.set()
            await served
            await served_big

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_refused_worker_slow_to_end_its_stream_is_answered_why_within_the_deadline():
    """A worker refused at its Hello is told why (a goodbye) and given a second to end its
    stream; an AddWorker whose deadline ends in that second is answered with the reason
    (INVALID_ARGUMENT), not "cannot reach worker" (UNAVAILABLE), as before. The worker
    here speaks the protocol and answers a Hello with no GPU, then never ends its
    stream."""
    import asyncio
    import time

    import grpc

    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol import clockwork_pb2_grpc as pbg
    from clockwork.protocol.versions import PROTOCOL, SOFTWARE
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    class NoGpu(pbg.WorkerServicer):
        async def ClockSync(self, request, context):  # noqa: N802
            return pb.ClockSyncResponse(worker_time=time.monotonic_ns())

        async def Connect(self, request_iterator, context):  # noqa: N802
            it = request_iterator.__aiter__()
            await anext(it)
            yield pb.WorkerMessage(state=pb.WorkerState(
                device="emulated", profiles="v100-reference", worker_time=time.monotonic_ns(),
                protocol=PROTOCOL, software=SOFTWARE))
            await asyncio.sleep(30)  # (reads nothing more, ends nothing)

    async def main():
        server = grpc.aio.server()
        pbg.add_WorkerServicer_to_server(NoGpu(), server)
        deaf = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        try:
            with pytest.raises(RepositoryError) as e:
                await node.add_worker(deaf, timeout=0.5)
            return e.value
        finally:
            await node.stop()
            await server.stop(0)
            stop.set()
            await served

    err = asyncio.run(asyncio.wait_for(main(), 60))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (err.code, err.message)
    assert err.message.startswith("worker 127.0.0.1:") and "GPUs" in err.message, err.message


def test_a_far_worker_without_the_cluster_secret_is_refused_before_it_is_dialed():
    """As for the workers at start: a worker off loopback is joined only with the cluster
    secret (or --insecure-no-auth); without, AddWorker is INVALID_ARGUMENT and nothing is
    dialed -- the Hello would tell that host the models in clear text."""
    import asyncio

    grpc = pytest.importorskip("grpc")
    from clockwork.protocol.security import ClusterAuth
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        dialed = []

        async def connect(link, deadline):  # (no traffic ever leaves loopback here)
            dialed.append(link.address)
            raise ConnectionError(f"cannot reach worker {link.address}")

        node._connect = connect
        try:
            for far in ("192.0.2.1:12345", "[2001:db8::1]:12345"):
                with pytest.raises(RepositoryError) as e:
                    await node.add_worker(far)
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert "cluster secret" in e.value.message and far in e.value.message
            assert dialed == []
            # a loopback worker needs no secret; with the secret, or told to run without
            # authentication, a far worker is dialed (here: unreachable)
            with pytest.raises(RepositoryError) as e:
                await node.add_worker("127.0.0.1:1")
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
            for setting in ("cluster_auth", "insecure_no_auth"):
                node.cluster_auth, node.insecure_no_auth = None, False
                if setting == "cluster_auth":
                    node.cluster_auth = ClusterAuth(b"k" * 20)
                else:
                    node.insecure_no_auth = True
                with pytest.raises(RepositoryError) as e:
                    await node.add_worker("192.0.2.1:12345")
                assert e.value.code == grpc.StatusCode.UNAVAILABLE
            assert dialed == ["127.0.0.1:1", "192.0.2.1:12345", "192.0.2.1:12345"]
            assert len(node.links) == 1
        finally:
            node.cluster_auth = None
            await node.stop()
            stop.set()
            await served

    asyncio.run(main())


def test_another_spelling_of_a_connected_workers_address_adds_nothing():
    """``localhost:P``, ``127.0.0.1:0P`` and a padded address name the worker already
    connected at ``127.0.0.1:P``: AddWorker answers added False and makes no second link (a
    second link took the worker from the first every few seconds, for ever). An address
    that is not HOST:PORT is INVALID_ARGUMENT saying so, and a worker listed twice at start
    is refused before either is dialed."""
    import asyncio

    grpc = pytest.importorskip("grpc")
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        for other in (f"localhost:{port}", address, f"127.0.0.1:0{port}"):
            twice = ControllerNode([address, other], "v100-reference", models="resnet50_v2")
            shown = other.replace(f":0{port}", f":{port}")  # (as the link keeps it)
            with pytest.raises(ValueError, match=f"^workers {address} and {shown} are one "
                                                 "listener .*: list each worker once$"):
                await twice.start()
            await twice.stop()
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        try:
            for alias in (f"localhost:{port}", f"127.0.0.1:0{port}", f" {address} "):
                assert await node.add_worker(alias, timeout=5) == (0, [0], False), alias
            for bad in ("127.0.0.1", f"ipv4:127.0.0.1:{port}", f"dns:///127.0.0.1:{port}",
                        "127.0.0.1:0", "127.0.0.1:70000", f":{port}", f"::1:{port}",
                        # (longer than DNS allows: resolving it raised UnicodeError, which
                        # gRPC answered UNKNOWN)
                        f"{'a' * 3000}:{port}", f"{'a' * 64}.example:{port}",
                        f"a..b:{port}", f".a:{port}"):
                with pytest.raises(RepositoryError) as e:
                    await node.add_worker(bad, timeout=5)
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, bad
                assert "expected HOST:PORT" in e.value.message, (bad, e.value.message)
            # a name of the right lengths that no resolver takes (its IDNA form is too
            # long): not on loopback, refused as any other (UnicodeError, said UNKNOWN)
            with pytest.raises(RepositoryError) as e:
                await node.add_worker(f"{'ü' * 60}:{port}", timeout=5)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert "without the cluster secret" in e.value.message, e.value
            assert len(node.links) == 1 and node.counters.get("workers_added", 0) == 0
            assert node.counters.get("worker_losses", 0) == 0
        finally:
            await node.stop()
            stop.set()
            await served

    asyncio.run(asyncio.wait_for(main(), 60))


def test_adding_a_connected_worker_does_not_wait_for_an_add_in_progress():
    """An add of a worker that cannot be reached (a port that accepts and never answers)
    holds the add lock for up to its timeout; an add of the worker connected already is
    answered at once (added False) meanwhile. Before, it waited behind the other add."""
    import asyncio
    import socket

    pytest.importorskip("grpc")
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)  # (connections wait in its backlog, never answered)
            slow = asyncio.create_task(node.add_worker(
                f"127.0.0.1:{silent.getsockname()[1]}", timeout=30))
            try:
                async with asyncio.timeout(10):  # until it has taken the add lock
                    while not node._add_lock.locked():
                        await asyncio.sleep(0.01)
                got = await asyncio.wait_for(node.add_worker(address, timeout=30), 10)
                assert got == (0, [0], False)
                assert not slow.done()
            finally:
                slow.cancel()
                with pytest.raises((asyncio.CancelledError, RepositoryError)):
                    await slow
                await node.stop()
                stop.set()
                await served

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_add_given_a_day_tries_for_at_most_add_worker_max_s(monkeypatch):
    """An add of a worker that never answers, given a day by its caller, gives up after
    ADD_WORKER_MAX_S (here made 1 s) with why: adds wait for each other, and one such
    held every other for the caller's whole deadline."""
    import asyncio
    import socket
    import time

    import controller.links
    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    monkeypatch.setattr(controller.links, "ADD_WORKER_MAX_S", 1.0, raising=False)

    async def main():
        address, stop, served = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([address], "v100-reference", models="resnet50_v2")
        await node.start()
        try:
            with socket.socket() as silent:
                silent.bind(("127.0.0.1", 0))
                silent.listen(8)  # (connections wait in its backlog, never answered)
                t0 = time.monotonic()
                with pytest.raises(RepositoryError) as e:
                    await asyncio.wait_for(node.add_worker(
                        f"127.0.0.1:{silent.getsockname()[1]}", timeout=86_400), 30)
                return time.monotonic() - t0, e.value
        finally:
            await node.stop()
            stop.set()
            await served

    took, err = asyncio.run(asyncio.wait_for(main(), 60))
    assert took < 10, took
    assert "cannot reach worker 127.0.0.1:" in err.message, err.message


def test_an_add_waits_for_a_worker_that_answers_slowly_past_add_worker_max_s(monkeypatch):
    """ADD_WORKER_MAX_S bounds the tries to reach a worker, not the answer to its Hello:
    a worker that answers (here its Hello in 5 s, as a cuda worker building its kernels
    does) is added within the caller's deadline (it was cut off at the bound)."""
    import asyncio

    import controller.links
    import worker.service as ws
    from controller.service import ControllerNode
    from tests.inprocess import serve_in_process

    monkeypatch.setattr(controller.links, "ADD_WORKER_MAX_S", 3.0)
    slow = []
    read = ws.WorkerNode.read_packages

    async def read_slowly(self, paths):
        if slow:
            await asyncio.sleep(5)  # (it answers ClockSync meanwhile)
        return await read(self, paths)

    monkeypatch.setattr(ws.WorkerNode, "read_packages", read_slowly)

    async def main():
        a1, s1, t1 = await serve_in_process(ws.WorkerNode(gpus=1, pages=100))
        a2, s2, t2 = await serve_in_process(ws.WorkerNode(gpus=1, pages=100))
        node = ControllerNode([a1], "v100-reference", models="resnet50_v2")
        await node.start()
        try:
            slow.append(True)
            return await node.add_worker(a2, timeout=60)
        finally:
            await node.stop()
            for s, t in ((s1, t1), (s2, t2)):
                s.set()
                await t

    assert asyncio.run(asyncio.wait_for(main(), 60)) == (1, [1], True)


def test_an_add_with_a_short_timeout_is_answered_why_within_it():
    """``add_worker`` of an address nobody listens on, with a client timeout of half a
    second: the controller answers why ("cannot reach worker ...") before the client's
    deadline. It used the whole of a deadline under a second, and a third of such calls
    raised the client's own "no answer within the client's timeout" instead. The message
    names the worker, not the controller, as the one that cannot be reached."""
    import clockwork
    from clockwork.errors import ControllerUnavailable
    from tests.conftest import local_cluster

    with local_cluster(workers=1, gpus=1, models="resnet50_v2") as c:
        with clockwork.Client(c.address, timeout=30) as cl:
            said = []
            for _ in range(12):
                with pytest.raises(ControllerUnavailable) as e:
                    cl.add_worker("127.0.0.1:1", timeout=0.5)
                said.append(str(e.value))
    # (the worker named, not the controller: "controller unavailable: ..." before)
    assert all(s.startswith("add worker: cannot reach worker 127.0.0.1:1") for s in said), said


def test_an_add_workers_error_names_whichever_could_not_be_reached():
    """AddWorker's UNAVAILABLE answers name the worker (the controller could not reach
    it): 'add worker: ...'; a call whose connection to the controller broke ('Socket
    closed') is the controller's, not the worker's, as it read after the change that
    named the worker."""
    import grpc

    from clockwork.client import _worker_error

    def err(details):
        return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                    grpc.aio.Metadata(), details)

    said = str(_worker_error(err("cannot reach worker 127.0.0.1:1 in 0.5 s"), "h:1"))
    assert said == "add worker: cannot reach worker 127.0.0.1:1 in 0.5 s"
    said = str(_worker_error(err("Socket closed"), "h:1"))
    assert said.startswith("controller unavailable:") and "Socket closed" in said


def test_a_worker_started_by_hand_joins_a_served_cluster_given_its_secret(tmp_path):
    """``clockwork serve --cluster-secret-file FILE`` and ``clockwork worker
    --cluster-secret-file FILE`` started by hand: ``Client.add_worker`` adds it (serve
    always made a secret of its own, so a worker started by hand was refused: "it did
    not prove the cluster secret", though the README says add_worker adds one)."""
    pytest.importorskip("grpc")
    from clockwork.client import Client
    from clockwork.cluster.local import _Child, _cli
    from clockwork.protocol.security import SECRET_ENV

    secret = tmp_path / "secret"
    secret.write_text("s" * 32 + "\n")
    secret.chmod(0o600)
    env = {SECRET_ENV: None}
    serve = _Child("serve", _cli() + ["serve", "--port", "0", "--http-port", "-1",
                                      "--kserve-port", "-1", "--cluster-secret-file",
                                      str(secret)], extra_env=env)
    worker = _Child("worker", _cli() + ["worker", "--port", "0", "--cluster-secret-file",
                                        str(secret)], extra_env=env)
    try:
        from tests.conftest import wait_output

        # (serve echoes its worker's "listening" line first: this one names the controller)
        line = wait_output(serve, "clockwork serve: controller at", 60)
        address = line.split("controller at ", 1)[1].split()[0]
        at = worker.wait_address(60)
        with Client(address, timeout=30) as k:
            assert k.add_worker(at)["added"]
            assert k.infer("resnet50_v2", slo_ms=1000).status == 0
    finally:
        worker.stop()
        serve.stop()


def test_a_model_loaded_as_a_worker_is_added_reaches_that_worker():
    """A load made just as an added worker's connection is handed back (after its
    catch-up on the instances, before it joins the links the load updates) reaches that
    worker too: it was told of none of it, and its GPUs failed the model's requests
    UNKNOWN_MODEL until it reconnected (a race seen in 5 of 8 tries with loads running
    beside an AddWorker). Controller and workers in this process; the load is made in
    that gap."""
    import asyncio

    from controller.service import ControllerNode
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        first, second = WorkerNode(gpus=1, pages=100), WorkerNode(gpus=1, pages=100)
        a1, stop1, served1 = await serve_in_process(first)
        a2, stop2, served2 = await serve_in_process(second)
        node = ControllerNode([a1], "v100-reference", models="resnet50_v2")
        await node.start()
        unless_stopping, loads = node._unless_stopping, []

        async def connected_then_a_load(coro):
            got = await unless_stopping(coro)
            if not loads:  # (the add's connection: a load lands before it joins)
                loads.append(asyncio.create_task(node.load_model("late", 1, "mobilenet_v2")))
                while "late" not in node.instances:
                    await asyncio.sleep(0)
            return got

        node._unless_stopping = connected_then_a_load
        try:
            await node.add_worker(a2)
            assert await loads[0] == ["late"]
            assert "late" in second.instances and "late" in first.instances
        finally:
            await node.stop()
            for stop, served in ((stop1, served1), (stop2, served2)):
                stop.set()
                await served

    asyncio.run(asyncio.wait_for(main(), 60))
