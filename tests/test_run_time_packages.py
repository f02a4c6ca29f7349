"""A model package a worker first meets while it serves (a model loaded at run time, a
Hello naming new instances) is read on a thread, not on the worker's event loop: reading
a real-size package (its library, its weights into host memory; a cuda package's kernels
when they were not built at start) takes from a fraction of a second to seconds, and the
other models' actions must run on time meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.inprocess import answer, controller_with

READ_S = 1.5  # how long reading the new package takes here


def test_a_package_loaded_at_run_time_is_read_beside_the_other_models_actions(
        tmp_path, cpu_package, monkeypatch):
    """An in-process controller and cpu worker (one event loop for both) serve ``mlp``; a
    model loaded at run time has a package that takes 1.5 s to read. While it is read,
    the loop keeps turning (no gap over 0.5 s) and an ``mlp`` request sent then is
    answered before the read ends; then the new model serves. Before, the worker read
    the package inside its InstanceUpdate, on the loop: everything stood still."""
    pytest.importorskip("tvm")
    from worker.devices import cpu
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    cpu_package("resnet_tiny", tmp_path)
    real = cpu.CpuDevice._package
    reading = threading.Event()
    read_end: list[float] = []

    def slow(self, path):
        if path.name == "resnet_tiny" and path.resolve() not in self.packages:
            reading.set()
            time.sleep(READ_S)
            read_end.append(time.monotonic())
        return real(self, path)

    monkeypatch.setattr(cpu.CpuDevice, "_package", slow)

    async def main():
        wnode = WorkerNode(1, 4, "cpu", "cpu", packages=str(tmp_path))
        gaps: list[float] = []
        ticking = True

        async def tick() -> None:
            last = time.monotonic()
            while ticking:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with controller_with([wnode], "cpu", models="mlp") as node:
            ticker = asyncio.create_task(tick())
            try:
                assert (await answer(node, "mlp")).status == 0  # (its weights loaded)
                load = asyncio.create_task(node.load_model("tiny", profile="resnet_tiny"))
                assert await asyncio.to_thread(reading.wait, 30), "the package was not read"
                assert (await answer(node, "mlp")).status == 0
                answered = time.monotonic()
                assert await load == ["tiny"]
                assert read_end and answered < read_end[0], \
                    "the resident model waited for the new package to be read"
                assert (await answer(node, "tiny")).status == 0
                assert wnode.real[0].models.keys() == {"mlp", "tiny"}
            finally:
                ticking = False
                await ticker
        assert max(gaps) < 0.5, f"the event loop stood still for {max(gaps):.2f} s"

    asyncio.run(asyncio.wait_for(main(), 120))


def test_only_packages_not_yet_read_are_prepared(tmp_path, cpu_package):
    """``WorkerNode.unprepared``: the packages of the instances a message brings that a
    device has not read yet, each once; none for an emulated worker."""
    pytest.importorskip("tvm")
    from clockwork.protocol import clockwork_pb2 as pb
    from worker.service import WorkerNode

    cpu_package("mlp", tmp_path)
    cpu_package("resnet_tiny", tmp_path)
    node = WorkerNode(1, 4, "cpu", "cpu", packages=str(tmp_path))
    insts = [pb.Instance(name="a", profile="mlp"), pb.Instance(name="b", profile="mlp"),
             pb.Instance(name="t", profile="resnet_tiny"),
             pb.Instance(name="x", profile="mlp", package="no_such_package")]
    assert node.unprepared(insts) == [(tmp_path / "mlp").resolve(),
                                      (tmp_path / "resnet_tiny").resolve()]
    node.prepare_paths([(tmp_path / "mlp").resolve()])
    assert node.unprepared(insts) == [(tmp_path / "resnet_tiny").resolve()]
    assert node.real[0].models == {}  # prepared, not registered
    assert WorkerNode(1, 4).unprepared(insts) == []


def test_actions_for_an_instance_still_being_added_wait_for_it(tmp_path, cpu_package,
                                                               monkeypatch):
    """After an InstanceUpdate the controller does not wait for (the one a worker that
    reconnected while a model was loaded gets), the policy's LOAD of the new instance
    may follow at once: it waits until the update is applied (it was answered
    UNKNOWN_MODEL while the package was read), and so does every message after it,
    in order, but a probe; a message before it is handled at once."""
    pytest.importorskip("tvm")
    from clockwork.actions import ActionType, ErrorCode
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol.holding import Holder
    from worker.devices import cpu
    from worker.service import WorkerNode, _Session, now_ns

    cpu_package("mlp", tmp_path)
    cpu_package("resnet_tiny", tmp_path)
    real = cpu.CpuDevice._package

    def slow(self, path):
        if path.name == "resnet_tiny" and path.resolve() not in self.packages:
            time.sleep(0.5)
        return real(self, path)

    monkeypatch.setattr(cpu.CpuDevice, "_package", slow)

    def load(action_id: int, model: str) -> pb.ControllerMessage:
        b = pb.ActionBatch()
        b.actions.add(id=action_id, type=ActionType.LOAD, gpu=0, model=model,
                      latest=now_ns() + 10**10, version=1)
        return pb.ControllerMessage(actions=b)

    async def main():
        node = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        timer = asyncio.create_task(node.run_timer())
        node.hello(pb.Hello(worker_id=0, reset=True,
                            instances=[pb.Instance(name="mlp", profile="mlp")]))
        s = _Session(node, False, lambda *a: None, Holder.of(pb.Hello(), "peer"))
        results = []
        try:
            update = pb.InstanceUpdate(seq=0, add=[pb.Instance(name="tiny",
                                                               profile="resnet_tiny")])
            assert await s.deliver(pb.ControllerMessage(update=update))
            assert not s.states  # (its package is being read)
            assert await s.deliver(load(1, "mlp"))  # handled at once
            assert await s.deliver(load(2, "tiny"))  # waits for the update
            b = pb.ActionBatch()
            b.actions.add(id=3, type=ActionType.INFER, gpu=0, model="mlp", batch_size=1,
                          latest=now_ns() + 10**10, version=1)
            assert await s.deliver(pb.ControllerMessage(actions=b))  # waits too, in order
            assert await s.deliver(pb.ControllerMessage(echo=pb.ClockEcho()))
            assert len(s.echoes) == 1  # a probe is answered at once all the same
            deadline = time.monotonic() + 30
            while len(results) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                msg = node.take_message([])
                if msg is not None:
                    results += [(r.id, ErrorCode(r.status).name, len(s.states))
                                for r in msg.results.results]
            # mlp's LOAD done while the update waited for its package; tiny's LOAD after
            # it, and mlp's INFER behind that after it too
            assert sorted(results) == [(1, "SUCCESS", 0), (2, "SUCCESS", 1),
                                       (3, "SUCCESS", 1)], results
            assert [st.update_seq for st in s.states] == [0] and len(s.echoes) == 1
            assert sorted(node.instances) == ["mlp", "tiny"]
        finally:
            timer.cancel()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_package_name_too_long_for_the_file_system_is_a_missing_package(tmp_path):
    """An instance naming a package longer than a file name may be (a client's
    ``load_model(..., package="x" * 300)``) is one the worker cannot add, in a Hello and
    in an InstanceUpdate alike; looking for it raised OSError out of the stream's
    reader, which ended the controller's connection."""
    pytest.importorskip("tvm")
    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol.holding import Holder
    from worker.service import WorkerNode, _Session

    node = WorkerNode(1, 4, "cpu", "cpu", packages=str(tmp_path))
    bad = pb.Instance(name="m", profile="mlp", package="x" * 300)
    assert node.unprepared([bad]) == []
    assert list(node.hello(pb.Hello(worker_id=0, reset=True, instances=[bad])).missing) == ["m"]

    async def main():
        s = _Session(node, False, lambda *a: None, Holder.of(pb.Hello(), "peer"))
        update = pb.InstanceUpdate(seq=1, add=[bad])
        assert await s.deliver(pb.ControllerMessage(update=update))
        assert [list(st.missing) for st in s.states] == [["m"]]

    asyncio.run(main())


def test_a_name_given_another_package_by_a_later_hello_runs_that_package(tmp_path,
                                                                        cpu_package):
    """A Hello that names an instance again with another package (a controller restarted
    with other models, or a model loaded again otherwise while the worker was away) has
    the device run that package, and keeps none of the old weights for it: the device
    went on running the package first registered under the name (SUCCESS, with the other
    model's outputs), whether the Hellos between had dropped the name or not."""
    pytest.importorskip("tvm")
    import numpy as np

    from clockwork.actions import ActionType, ErrorCode
    from clockwork.models.package import read_package, reference_weights
    from clockwork.models.zoo import get_model
    from clockwork.protocol import clockwork_pb2 as pb
    from worker.service import WorkerNode, now_ns

    cpu_package("mlp", tmp_path)
    cpu_package("resnet_tiny", tmp_path)
    cpu_package("mlp", tmp_path / "other")  # the same model in another package
    (tmp_path / "other" / "mlp").rename(tmp_path / "mlp_b")

    def reference(model: str, package: str) -> np.ndarray:
        meta = read_package(tmp_path / package)
        x = np.zeros((1, *meta["inputs"][0]["shape"]), meta["inputs"][0]["dtype"])
        return get_model(model).reference(x, reference_weights(meta, tmp_path / package))[0]

    async def main():
        node = WorkerNode(1, 8, "cpu", "cpu", packages=str(tmp_path))
        timer = asyncio.create_task(node.run_timer())
        ids = iter(range(1, 100))

        def hello(*instances, adopt=False):
            st = node.hello(pb.Hello(worker_id=0, reset=True, adopt=adopt, instances=[
                pb.Instance(name=n, profile=p, package=k) for n, p, k in instances]))
            assert not st.missing

        async def run_x(load: bool = True):
            b = pb.ActionBatch()
            if load:
                b.actions.add(id=next(ids), type=ActionType.LOAD, gpu=0, model="x",
                              latest=now_ns() + 10**10, version=1)
            b.actions.add(id=next(ids), type=ActionType.INFER, gpu=0, model="x",
                          latest=now_ns() + 10**10, batch_size=1, version=1,
                          want_outputs=True)
            node.submit(b)
            got = []
            deadline = time.monotonic() + 30
            while len(got) < len(b.actions) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                msg = node.take_message()  # (outputs in the message)
                if msg is not None:
                    got += list(msg.results.results)
            assert [ErrorCode(r.status).name for r in got] == ["SUCCESS"] * len(got), got
            out = got[-1].outputs[0]
            return np.frombuffer(out.data, out.dtype).reshape(tuple(out.shape))

        try:
            hello(("x", "mlp", ""))
            np.testing.assert_allclose((await run_x())[0], reference("mlp", "mlp"),
                                       rtol=1e-4, atol=1e-4)
            hello(("other", "mlp", ""))  # x no longer named
            hello(("x", "resnet_tiny", ""))
            np.testing.assert_allclose((await run_x())[0],
                                       reference("resnet_tiny", "resnet_tiny"),
                                       rtol=1e-4, atol=1e-4)
            hello(("x", "mlp", "mlp"))
            await run_x()
            hello(("x", "mlp", "mlp_b"), adopt=True)  # same profile, another package
            assert node.real[0].models["x"].package.path.name == "mlp_b"
            assert not node.executors[0].weights  # (the old package's weights not kept)
            await run_x()
        finally:
            timer.cancel()

    asyncio.run(asyncio.wait_for(main(), 120))


def _mlp_package(path) -> None:
    """A fake cuda package laid out as the cpu profile of ``mlp`` (tests/fake_cuda.py)."""
    from tests.fake_cuda import fake_package

    fake_package(path, pages=1, batch_sizes=(1, 2, 4, 8, 16), n_in=64, out_name="output",
                 model="mlp")


def _cuda_building(monkeypatch, on_build) -> None:
    """Workers made from here on open a fake cuda device (tests/fake_cuda.py) whose kernel
    build of a package (TVM's ``load_module``: NVRTC, really) first runs
    ``on_build(path)`` on the thread that builds it."""
    from tests.fake_cuda import fake_cuda_device
    from worker import service

    def open_device(kind, pages, index=0):
        dev, _, tvm = fake_cuda_device(pages)
        load_module = tvm.runtime.load_module

        def build(path):
            on_build(path)
            return load_module(path)

        tvm.runtime.load_module = build
        return dev

    monkeypatch.setattr(service, "_open_device", open_device)


def test_a_slow_first_kernel_build_at_run_time_holds_up_only_that_load(tmp_path,
                                                                      monkeypatch):
    """A cuda worker (the fake stream API, tests/fake_cuda.py) serves ``mlp``, its kernels
    built before it listens. A model loaded at run time names a package new to it, whose
    kernels take longer to build than ``UPDATE_TIMEOUT_S`` (0.5 s here; 30 s really,
    and a real-size model's first NVRTC build takes a minute or more). The worker
    builds on a thread and answers the controller's echoes meanwhile: the load waits
    for the build and then serves, an ``mlp`` request sent meanwhile is answered before
    the build ends, and the worker is never suspect nor lost. Before, the load failed
    (UNAVAILABLE, "did not take the model within 30 s") while the build went on.
    Controller and worker in this process."""
    from controller import links
    from controller import service as controller_service
    from worker import service

    silent_s = 0.5
    monkeypatch.setattr(controller_service, "UPDATE_TIMEOUT_S", silent_s)
    monkeypatch.setattr(links, "ECHO_S", 0.05)
    building, answered = threading.Event(), threading.Event()
    built: list[float] = []

    def slow_build(path):
        if "mlp_late" in str(path):
            t0 = time.monotonic()
            building.set()
            assert answered.wait(30), "mlp was not answered while the build ran"
            # the build's length: three times what the controller waits for a silent
            # worker (simulated work, not a wait for the other side)
            threading.Event().wait(max(0.0, t0 + 3 * silent_s - time.monotonic()))
            built.append(time.monotonic())

    _cuda_building(monkeypatch, slow_build)

    async def main():
        wnode = service.WorkerNode(1, 8, "cpu", "cuda", packages=str(tmp_path))
        _mlp_package(tmp_path / "mlp")
        await asyncio.to_thread(wnode.prepare_packages)
        _mlp_package(tmp_path / "mlp_late")  # compiled into the package directory while
        # the worker serves
        async with controller_with([wnode], "cpu", models="mlp") as node:
            try:
                assert (await answer(node, "mlp")).status == 0
                load = asyncio.create_task(node.load_model("late", profile="mlp",
                                                           package="mlp_late"))
                assert await asyncio.to_thread(building.wait, 30), "the build did not start"
                assert (await answer(node, "mlp")).status == 0  # beside the build
                assert not built, "the resident model waited for the build"
                answered.set()
                assert await load == ["late"]
                assert built, "the load was answered before its package was built"
                assert (await answer(node, "late")).status == 0
                assert node.counters.get("worker_suspects", 0) == 0
                assert node.counters.get("worker_losses", 0) == 0
                assert wnode.real[0].models.keys() == {"mlp", "late"}
            finally:
                answered.set()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_hello_naming_a_package_built_after_the_worker_started_is_waited_for(
        tmp_path, monkeypatch, capsys):
    """A cuda worker (the fake stream API) starts with an empty package directory; the
    ``mlp`` package is compiled into it afterwards and a controller starts serving it.
    The controller's Hello names a package the worker has not read, whose kernel build
    outlasts what the controller waits for a Hello's answer (``HELLO_WAIT_S``: 0.2 s
    here; 5 s really, and a real-size model's first NVRTC build takes a minute or more).
    The worker builds on a thread and answers ClockSync meanwhile: the controller waits
    on the same connection while the worker answers, says so, and then serves. Before,
    it gave up on each connection after 5 s and opened another, each reading the same
    package again, and failed to start once ``--connect-timeout`` had passed."""
    from controller import links
    from worker import service

    monkeypatch.setattr(links, "HELLO_WAIT_S", 0.2)
    syncs: list[float] = []
    builds: list[float] = []
    checked = threading.Event()  # three ClockSyncs since the build began
    clock_sync = service.WorkerServicer.ClockSync

    async def counted_sync(self, request, context):
        syncs.append(time.monotonic())
        if builds and sum(t > builds[0] for t in syncs) >= 3:
            checked.set()
        return await clock_sync(self, request, context)

    monkeypatch.setattr(service.WorkerServicer, "ClockSync", counted_sync)
    sessions: list = []

    class Session(service._Session):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            sessions.append(self)

    monkeypatch.setattr(service, "_Session", Session)

    def slow_build(path):
        # the build lasts until the controller has checked on the worker three times
        # after it began (ClockSync; none is made otherwise once the Hello is sent)
        builds.append(time.monotonic())
        assert checked.wait(30), "the controller did not check on the worker"

    _cuda_building(monkeypatch, slow_build)

    async def main():
        wnode = service.WorkerNode(1, 8, "cpu", "cuda", packages=str(tmp_path))
        await asyncio.to_thread(wnode.prepare_packages)  # (nothing to build yet)
        _mlp_package(tmp_path / "mlp")  # compiled into the directory while it serves
        async with controller_with([wnode], "cpu", models="mlp",
                                   connect_timeout=0.5) as node:
            assert (await answer(node, "mlp")).status == 0
            assert len(builds) == 1
            assert sum(t > builds[0] for t in syncs) >= 3
            assert len(sessions) == 1, "the controller connected again"
            assert node.counters.get("worker_connects", 0) == 1

    asyncio.run(asyncio.wait_for(main(), 60))
    err = capsys.readouterr().err
    assert "has not answered our Hello" in err and "but answers: waiting" in err
    assert err.count("has not answered our Hello") == 1


@pytest.mark.parametrize("lively", [False, True], ids=["silent", "lively"])
def test_a_worker_silent_while_it_takes_a_load_fails_that_load(monkeypatch, lively):
    """The bounds on that wait: a worker that takes a load, then says nothing -- no
    answer, no echo -- for ``UPDATE_TIMEOUT_S`` (0.5 s here) fails the load
    (UNAVAILABLE), which leaves nothing; the worker serves on once it speaks again. One
    that answers its echoes but never the load fails it after ``UPDATE_MAX_S`` (0.6 s
    here; half an hour really) the same way. Controller and emulated worker in this
    process."""
    from controller import links
    from controller import service as controller_service
    from controller.service import RepositoryError
    from worker import service

    monkeypatch.setattr(controller_service, "UPDATE_TIMEOUT_S", 10.0 if lively else 0.5)
    monkeypatch.setattr(links, "UPDATE_MAX_S", 0.6 if lively else 30.0)
    monkeypatch.setattr(links, "ECHO_S", 0.05)
    handle = service._Session.handle
    mute: list[bool] = []

    def muted(self, msg, tail=None):
        kind = msg.WhichOneof("kind")
        if kind == "update" and any(i.name == "mute" for i in msg.update.add):
            mute.append(True)
            return True  # taken, never answered
        if mute and kind == "echo" and not lively:
            return True  # and silent from then on
        return handle(self, msg, tail)

    monkeypatch.setattr(service._Session, "handle", muted)

    async def main():
        wnode = service.WorkerNode(gpus=1, pages=100)
        async with controller_with([wnode], "v100-reference", models="resnet50_v2") as node:
            said = "in 0.6 s" if lively else "not heard from for 0.5 s"
            with pytest.raises(RepositoryError, match=f"did not take the model.*{said}") as e:
                await asyncio.wait_for(node.load_model("mute", profile="mobilenet_v2"), 10)
            assert e.value.code.name == "UNAVAILABLE"
            assert node.model_state("mute") is None and "mute" not in node.instances
            mute.clear()
            assert (await answer(node, "resnet50_v2")).status == 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_worker_that_fails_to_apply_a_load_answers_it_at_once(monkeypatch):
    """A worker whose InstanceUpdate raised logged it and never answered, while it went
    on answering echoes: the controller, which waits as long as it hears from a worker,
    held the load (and any unload of the model) for ``UPDATE_MAX_S``. The worker now
    answers such an update with every instance it named missing: the load fails at once
    (NOT_FOUND) and leaves nothing. Controller and emulated worker in this process."""
    from controller import links
    from controller import service as controller_service
    from controller.service import RepositoryError
    from worker import service

    monkeypatch.setattr(controller_service, "UPDATE_TIMEOUT_S", 30.0)
    monkeypatch.setattr(links, "UPDATE_MAX_S", 60.0)
    update = service.WorkerNode.update

    def broken(self, u):
        if any(i.name == "boom" for i in u.add):
            raise RuntimeError("a bug in update")
        return update(self, u)

    monkeypatch.setattr(service.WorkerNode, "update", broken)

    async def main():
        wnode = service.WorkerNode(gpus=1, pages=100)
        async with controller_with([wnode], "v100-reference", models="resnet50_v2") as node:
            with pytest.raises(RepositoryError, match="adding it failed there") as e:
                await asyncio.wait_for(node.load_model("boom", profile="mobilenet_v2"), 10)
            assert e.value.code.name == "NOT_FOUND"
            assert node.model_state("boom") is None and "boom" not in node.instances
            assert await node.load_model("fine", profile="mobilenet_v2") == ["fine"]
            assert (await answer(node, "fine")).status == 0

    asyncio.run(asyncio.wait_for(main(), 60))
