"""The bound on actions in one controller -> worker message
(``clockwork.sizes.MAX_ACTIONS_PER_MESSAGE``): a real worker process takes a message of
that many, and refuses a larger one -- which would hold its event loop past the
controller's probe timeout -- ending that connection with the reason, on the gRPC stream
and on the fast link alike, and serving on; the controller never writes a larger one."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from clockwork.actions import NEVER, Action, ActionType, ErrorCode
from clockwork.cluster.local import _Child, _cli
from clockwork.protocol import clockwork_pb2 as pb
from clockwork.protocol import clockwork_pb2_grpc as pbg
from clockwork.protocol.framing import dial
from clockwork.protocol.versions import PROTOCOL
from clockwork.sizes import MAX_ACTIONS_PER_MESSAGE

MAX = MAX_ACTIONS_PER_MESSAGE


def _evicts(first: int, n: int) -> pb.ControllerMessage:
    """``n`` EVICTs (each answered at once: nothing is loaded) from id ``first``."""
    far = time.monotonic_ns() + 10**11
    return pb.ControllerMessage(actions=pb.ActionBatch(actions=[
        pb.ActionMsg(id=first + i, type=int(ActionType.EVICT), gpu=0, model="a", latest=far)
        for i in range(n)]))


def test_the_controllers_largest_messages_are_far_below_the_bound(tmp_path):
    """The controller's messages to a worker, at full load on the most GPUs a worker has
    (``MAX_GPUS_PER_WORKER``, 64): the actions a worker is sent at one instant, or within
    one pacing interval (2 ms: a busy link's actions wait for it and share a message),
    are a small fraction of the bound (measured: 45)."""
    import csv
    from collections import Counter

    from clockwork.cluster.cli import main
    from clockwork.protocol.pacing import ACTION_INTERVAL_US
    from clockwork.sizes import MAX_GPUS_PER_WORKER

    assert main(["simulate", "fig5_1gpu", "--set", f"cluster.gpus_per_worker={MAX_GPUS_PER_WORKER}",
                 "--set", "duration_s=10", "--out", str(tmp_path), "--quiet"]) == 0
    per_interval = Counter()
    with open(tmp_path / "actions.tsv") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            per_interval[row["worker"], int(row["sent"]) // int(ACTION_INTERVAL_US * 1000)] += 1
    assert sum(per_interval.values()) > 10_000  # it was busy
    assert max(per_interval.values()) <= MAX // 10, per_interval.most_common(3)


@pytest.mark.parametrize("fast", [False, True], ids=["grpc stream", "fast link"])
def test_worker_refuses_a_message_of_too_many_actions_and_serves_on(fast):
    w = _Child("worker", _cli() + ["worker", "--host", "127.0.0.1", "--port", "0"])
    try:
        address = w.wait_address(30.0)

        async def main():
            async with grpc.aio.insecure_channel(address) as ch:
                call = pbg.WorkerStub(ch).Connect()
                await call.write(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL,
                    worker_id=0, reset=True, fast_link=fast,
                    instances=[pb.Instance(name="a", profile="resnet50_v2")])))
                st = (await call.read()).state
                if fast:
                    assert st.link_port
                    link = await dial("127.0.0.1", st.link_port, st.link_ticket,
                                      pb.WorkerMessage.FromString)
                    write, read = link.write, link.read
                else:
                    write, read = call.write, call.read
                # as many as the bound: taken, every action answered
                await write(_evicts(1, MAX))
                got = set()
                while len(got) < MAX:
                    m = await asyncio.wait_for(read(), 20)
                    got.update(r.id for r in m.results.results)
                assert got == set(range(1, MAX + 1))
                # one more: refused whole, the connection ends with why
                await write(_evicts(MAX + 1, MAX + 1))
                if fast:
                    assert await asyncio.wait_for(link.read(), 20) is None  # closed
                    link.close()
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    while True:
                        m = await asyncio.wait_for(call.read(), 20)
                        assert not m.results.results  # none of it ran
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"a message of {MAX + 1} actions: at most {MAX} per message" in \
                    e.value.details()
                # the worker serves on: a new connection is answered
                call = pbg.WorkerStub(ch).Connect()
                await call.write(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL, worker_id=0, reset=True)))
                assert (await asyncio.wait_for(call.read(), 20)).WhichOneof("kind") == "state"
                call.cancel()

        asyncio.run(asyncio.wait_for(main(), 60))
        assert w.proc.poll() is None
        # (its line reaches us through a pipe and a thread: waited for, line by line)
        want = f"worker: refused a message of {MAX + 1} actions"
        deadline = time.monotonic() + 20
        while want not in (log := "".join(w.output)):
            left = deadline - time.monotonic()
            assert left > 0, log
            with contextlib.suppress(queue.Empty):
                w.lines.get(timeout=left)
        assert "Traceback" not in log, log
    finally:
        w.stop()


def test_controller_splits_a_long_action_list_into_messages_under_the_bound():
    """Actions that piled up while a write waited go in messages of at most the bound, in
    order (one message of them all was refused by the worker)."""
    from controller.service import ControllerNode, WorkerLink

    written, counted = [], []

    class Call:
        async def write(self, msg):
            written.append([a.id for a in msg.actions.actions])

    node = SimpleNamespace(count=counted.append, _add_inputs=None)
    link = WorkerLink(0, "127.0.0.1:1", state=pb.WorkerState(device="emulated"))
    acts = [Action(id=i, type=ActionType.EVICT, worker=0, gpu=0, model="a", earliest=0,
                   latest=NEVER, expected_duration=1000) for i in range(1, 2 * MAX + 2)]
    asyncio.run(ControllerNode._write_actions(node, link, Call(), acts))
    assert [len(ids) for ids in written] == [MAX, MAX, 1]
    assert [i for ids in written for i in ids] == [a.id for a in acts]
    assert counted == ["msgs_to_workers"] * 3
    written.clear()
    asyncio.run(ControllerNode._write_actions(node, link, Call(), acts[:5]))
    assert written == [[1, 2, 3, 4, 5]]  # the usual case: one message


@pytest.mark.parametrize("outputs, device, said", [
    ([("evil", np.int8, (1, 3))], "cpu", "outputs evil int8[3], the model's are output"),
    ([("output", np.float32, (1, 1000)), ("x0", np.float32, (1, 2))], "cpu", "outputs "),
    ([("output", np.float32, (1, 0))], "cpu", "outputs output float32[0]"),
    ([], "cpu", "no outputs, though a request wanted them"),
])
def test_a_success_whose_outputs_do_not_fit_the_model_fails_its_infer(outputs, device, said):
    """A successful INFER whose outputs are not the model's (another name or dtype, a
    tensor more, a row of no values; none at all from a real device where a request
    wanted them) is taken as failed on the copy's device, counted and said: each was
    answered SUCCESS with what came (zeros where nothing came)."""
    from clockwork.protocol.wire import tensor_to_msg
    from clockwork.requests import Request
    from clockwork.tensors import Tensor
    from controller.service import ControllerNode, WorkerLink
    from tests.conftest import make_profile

    req = Request(1, "m", 0, 100_000_000)
    req.want_outputs = True
    a = Action(id=7, type=ActionType.INFER, worker=0, gpu=0, model="m", earliest=0,
               latest=NEVER, expected_duration=1000, batch_size=1, requests=[req])
    msg = pb.ResultMsg(id=7, type=int(ActionType.INFER), status=0, gpu=0, model="m",
                       batch_size=1, begin=10, end=20, duration=5,
                       outputs=[tensor_to_msg(Tensor.of(n, np.zeros(s, dt)))
                                for n, dt, s in outputs])
    got, counted, said_lines = [], [], []
    node = SimpleNamespace(
        ctrl=SimpleNamespace(outstanding={0: {7: a}},
                             results=lambda w, rs, now: got.extend(rs)),
        count=counted.append, _bad_worker_msg=said_lines.append,
        profiles={"m": make_profile("m")})
    link = WorkerLink(0, "127.0.0.1:1", state=pb.WorkerState(device=device))
    assert ControllerNode._on_results(node, link, [msg]) == ""
    (r,) = got
    assert r.status == ErrorCode.INVALID_INPUT and r.outputs is None, r
    assert said in r.message and counted == ["results_bad_outputs"], (r.message, counted)
    assert len(said_lines) == 1 and said in said_lines[0]
    # the model's own outputs (and none from an emulated device) pass as they are
    msg.ClearField("outputs")
    fine = [("output", np.float32, (1, 1000))] if device != "emulated" else []
    msg.outputs.extend(tensor_to_msg(Tensor.of(n, np.zeros(s, dt))) for n, dt, s in fine)
    got.clear()
    node.ctrl.outstanding[0][7] = a
    ControllerNode._on_results(node, link, [msg])
    assert got[0].status == ErrorCode.SUCCESS and len(got[0].outputs) == 1


def test_a_result_for_no_outstanding_action_is_logged_at_most_once_a_minute(capsys):
    """A result for no action outstanding (a duplicate, or one sent before a reset) is
    ignored and counted each time, and said in the log, one line a minute however many
    come (it was counted only: nothing told the operator which worker sent them)."""
    from clockwork.actions import Result
    from clockwork.protocol.ratelog import LogLimiter
    from controller import service
    from controller.service import ControllerNode, WorkerLink

    counted = []
    node = SimpleNamespace(
        count=counted.append, links=[WorkerLink(0, "10.0.0.7:9000", state=pb.WorkerState())],
        _unknown_results=LogLimiter("controller", every=service.UNKNOWN_LOG_S))
    r = Result(id=41, type=ActionType.INFER, status=ErrorCode.SUCCESS, worker=0, gpu=0,
               model="m")
    for _ in range(3):
        ControllerNode.unknown(node, 0, r)
    err = capsys.readouterr().err.splitlines()
    assert counted == ["results_unknown"] * 3
    assert len(err) == 1 and "worker 10.0.0.7:9000" in err[0] and "INFER 41" in err[0], err
