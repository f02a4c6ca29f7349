"""Workers leaving a running cluster for good (``clockwork.v1`` RemoveWorker,
``Client.remove_worker``): the controller places nothing more on their GPUs, fails what
they have in flight back into the policy, closes their connection and does not reconnect;
the worker process is free for any controller (added again, it gets a new index).
Real processes on loopback; the loop's own rule is in ``test_loops.py``."""

from __future__ import annotations

import collections
import contextlib
import threading
import urllib.request

import pytest

from clockwork.client import Client
from clockwork.errors import ClockworkError, InvalidRequest
from tests.conftest import local_cluster, poll
from tests.test_add_workers_events import _rows
from tests.test_add_workers_events import _scenario as events_scenario


def _ready(c) -> int:
    try:
        with urllib.request.urlopen(f"http://{c.printed_address('http')}/v2/health/ready",
                                    timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _states(c) -> set[tuple[str, str, str]]:
    """(worker, address, state) of each clockwork_worker_state series at 1 in /metrics."""
    from controller.metrics import parse_text

    with urllib.request.urlopen(f"http://{c.printed_address('http')}/metrics",
                                timeout=5) as r:
        samples = parse_text(r.read().decode())
    return {(lb["worker"], lb["address"], lb["state"])
            for lb, v in samples["clockwork_worker_state"] if v == 1}


@pytest.mark.parametrize("drain", [False, True])
def test_requests_queued_as_the_last_worker_is_removed_are_answered_no_worker(drain):
    """Requests queued when the last worker is removed (plainly or drained): no worker
    is left to serve them, so they are answered at once, ERROR ``no_worker``, as a
    request that comes then is; they waited in the queue until their SLO ran out (30 s
    here: TIMEOUT, or the client gave up)."""
    import asyncio
    import time

    import clockwork
    from clockwork.errors import InferenceError

    async def main(c) -> tuple[dict, float]:
        async with clockwork.AsyncClient(c.address, timeout=60) as ac:
            async def one() -> str:
                try:
                    await ac.infer("resnet50_v2", slo_ms=30_000)
                    return "ok"
                except InferenceError as e:
                    return e.reason
            tasks = [asyncio.ensure_future(one()) for _ in range(3000)]
            deadline = time.monotonic() + 20
            while (await ac.model_status("resnet50_v2")).queued < 20:
                assert time.monotonic() < deadline, "no request queued"
                await asyncio.sleep(0.01)
            got = await ac.remove_worker(c.worker_addresses[0], drain=drain)
            assert got["removed"], got
            t0 = time.monotonic()
            done = await asyncio.wait_for(asyncio.gather(*tasks), 20)
            return collections.Counter(done), time.monotonic() - t0

    with local_cluster(workers=1, gpus=1, models="resnet50_v2", http_port=-1) as c:
        got, took = asyncio.run(main(c))
    assert set(got) <= {"ok", "no_worker"} and got["no_worker"] >= 20, got
    assert took < 10, took


def _sending(c, k: Client, n: int, stop: threading.Event):
    """Once ``c`` is ready and both copies of resnet50_v2 have served (``k``), ``n``
    threads each sending requests to both, one after another, until ``stop``: (the
    answered count in a list, the ClockworkErrors, the other exceptions -- a request never
    answered --, the threads), returned once more than 50 are answered."""
    poll(lambda: _ready(c) == 200, 20)
    for _ in range(4):
        k.infer("resnet50_v2", slo_ms=1000)
        k.infer("resnet50_v2:1", slo_ms=1000)
    answered, failed, lost = [0], [], []

    def send() -> None:
        with Client(c.address, timeout=10) as mine:
            while not stop.is_set():
                for m in ("resnet50_v2", "resnet50_v2:1"):
                    try:
                        mine.infer(m, slo_ms=1000)
                        answered[0] += 1
                    except ClockworkError as e:  # (a request of a failed action)
                        failed.append(e)
                    except Exception as e:  # noqa: BLE001 - one never answered
                        lost.append(e)

    senders = [threading.Thread(target=send, daemon=True) for _ in range(n)]
    for t in senders:
        t.start()
    poll(lambda: answered[0] > 50, 20)
    return answered, failed, lost, senders


def test_a_removed_worker_takes_nothing_more_and_can_be_added_again():
    """Two workers serving two copies of one model while clients send requests; worker 1
    is removed mid-stream: every request is answered (SUCCESS or an error, none left
    waiting), the model is served on worker 0 only, the removal says so once and again
    answers removed False, the controller stays ready and reconnects nothing. The
    worker, free again, is added back as worker 2 and serves."""
    with local_cluster(workers=2, gpus=1, models="resnet50_v2:2") as c, \
            Client(c.address, timeout=10) as k:
        stop = threading.Event()
        answered, failed, lost, senders = _sending(c, k, 3, stop)
        before = answered[0]
        got = k.remove_worker(c.worker_addresses[1])
        assert got.items() >= {"worker": 1, "gpus": [1], "removed": True,
                               "drained": False}.items(), got
        poll(lambda: answered[0] > before + 100, 30)
        stop.set()
        for t in senders:
            t.join(30)
        assert not lost and all(not t.is_alive() for t in senders)
        assert len(failed) < 20, failed[:3]
        for m in ("resnet50_v2", "resnet50_v2:1"):
            k.infer(m, slo_ms=1000)  # raises unless served
            assert list(k.model_status(m).loaded_on) == [0]
        assert k.remove_worker(c.worker_addresses[1]) == {
            "worker": 1, "gpus": [1], "removed": False, "drained": False, "failed": 0}
        assert _ready(c) == 200
        stats = k.stats()
        assert stats.get("workers_removed") == 1
        out = "".join(c.controller.output)
        assert out.count(f"worker {c.worker_addresses[1]} removed") == 1, out[-2000:]
        after = out.split(f"worker {c.worker_addresses[1]} removed")[1]
        assert f"lost worker {c.worker_addresses[1]}" not in after, after
        assert f"worker {c.worker_addresses[1]} reconnected" not in after, after
        # free for a controller again: added back, as a new worker with empty GPUs, it
        # serves (worker 0 removed: nothing else can)
        assert k.add_worker(c.worker_addresses[1]) == {"worker": 2, "gpus": [2],
                                                      "added": True}
        assert k.remove_worker(c.worker_addresses[0])["removed"]
        for m in ("resnet50_v2", "resnet50_v2:1"):
            k.infer(m, slo_ms=2000)  # raises unless served
            assert list(k.model_status(m).loaded_on) == [2]

def test_a_worker_drained_under_load_finishes_its_work_and_fails_nothing():
    """Two workers serving two copies of one model while clients send requests; worker 1
    is removed with ``drain=True``: the call returns once its actions in flight have
    ended there (none failed), no request fails, and the model is then served on worker 0
    only."""
    with local_cluster(workers=2, gpus=1, models="resnet50_v2:2") as c, \
            Client(c.address, timeout=10) as k:
        stop = threading.Event()
        answered, failed, lost, senders = _sending(c, k, 4, stop)
        before = answered[0]
        got = k.remove_worker(c.worker_addresses[1], drain=True)
        assert got == {"worker": 1, "gpus": [1], "removed": True, "drained": True,
                       "failed": 0}, got
        poll(lambda: answered[0] > before + 100, 30)
        stop.set()
        for t in senders:
            t.join(30)
        assert not failed and not lost, (failed + lost)[:3]
        for m in ("resnet50_v2", "resnet50_v2:1"):
            assert list(k.model_status(m).loaded_on) == [0]
        out = "".join(c.controller.output)
        assert f"worker {c.worker_addresses[1]} draining: nothing more is placed" in out, \
            out[-2000:]
        assert (f"worker {c.worker_addresses[1]} removed with its 1 GPU(s): 0 action(s) in "
                "flight failed") in out, out[-2000:]
        assert [w["state"] for w in k.workers()] == ["serving", "removed"]


def _gauge(c, name: str) -> float:
    from controller.metrics import parse_text

    with urllib.request.urlopen(f"http://{c.printed_address('http')}/metrics",
                                timeout=5) as r:
        samples = parse_text(r.read().decode())
    return sum(v for _, v in samples[name])


def test_a_plain_remove_ends_a_drain_and_a_second_drain_keeps_to_its_own_time():
    """Worker 1 stopped (SIGSTOP, liveness off) with an INFER in flight, drained with a
    long timeout: a second drain gives up within its own timeout (it waited on the first
    with no bound: the call timed out as if the controller were down), and a plain remove
    takes the worker out at once, failing that action (it could not end a drain); the
    drain's call then says another call removed it, so one removal is reported once. An
    add of the draining worker is refused."""
    import os
    import signal

    with local_cluster(workers=2, gpus=1, models="resnet50_v2:2",
                       controller_args=["--set", "liveness=false"]) as c, \
            Client(c.address, timeout=30) as k:
        poll(lambda: _ready(c) == 200, 20)
        on1 = next(m for m in ("resnet50_v2", "resnet50_v2:1")
                   if k.infer(m, slo_ms=2000) and list(k.model_status(m).loaded_on) == [1])
        os.kill(c.workers[1].proc.pid, signal.SIGSTOP)
        try:
            def one() -> None:  # (served elsewhere once the worker is out, or refused as
                with Client(c.address, timeout=30) as mine:  # the cluster stops)
                    with contextlib.suppress(ClockworkError):
                        mine.infer(on1, slo_ms=20000)

            threading.Thread(target=one, daemon=True).start()
            poll(lambda: _gauge(c, "clockwork_requests_outstanding") == 1
                 and _gauge(c, "clockwork_queue_depth") == 0, 20)  # (its INFER sent)
            first: list = []
            drain = threading.Thread(target=lambda: first.append(
                k.remove_worker(c.worker_addresses[1], drain=True, timeout=25)))
            drain.start()
            poll(lambda: [w["state"] for w in k.workers()] == ["serving", "draining"], 10)
            with pytest.raises(ClockworkError, match="still draining"):
                k.remove_worker(c.worker_addresses[1], drain=True, timeout=1.5)
            # (an add of it is refused: it said "a worker already", and it left soon after)
            with pytest.raises(ClockworkError, match="it is draining"):
                k.add_worker(c.worker_addresses[1], timeout=5)
            got = k.remove_worker(c.worker_addresses[1], timeout=5)
            assert got == {"worker": 1, "gpus": [1], "removed": True, "drained": False,
                           "failed": 1}, got
            drain.join(10)
            assert first == [{"worker": 1, "gpus": [1], "removed": False, "drained": False,
                              "failed": 0}], first
            assert [w["state"] for w in k.workers()] == ["serving", "removed"]
        finally:
            os.kill(c.workers[1].proc.pid, signal.SIGCONT)


def test_removing_every_worker_leaves_a_controller_that_answers_no_worker():
    """The last worker removed: requests are answered at once with an error (no worker),
    and the readiness probe says 503; an unknown address or a malformed one is refused
    with the reason."""
    with local_cluster(workers=1, gpus=1, models="resnet50_v2") as c, \
            Client(c.address, timeout=10) as k:
        k.infer("resnet50_v2", slo_ms=1000)
        with pytest.raises(InvalidRequest, match="no worker 127.0.0.1:9 in this controller"):
            k.remove_worker("127.0.0.1:9")
        with pytest.raises(InvalidRequest, match="remove worker"):
            k.remove_worker("not an address")
        assert k.remove_worker(c.worker_addresses[0])["removed"]
        with pytest.raises(ClockworkError, match="(?i)no worker"):
            k.infer("resnet50_v2", slo_ms=1000)
        assert _ready(c) == 503


def test_a_lost_worker_removed_is_not_reconnected_and_a_listed_one_no_longer_awaited():
    """Controller and workers in this process. A worker listed at start that never
    answered is listed awaited with why (it said only that it was), and no longer awaited once removed (readiness no longer waits for it); a
    connected worker whose process stops is lost and reconnected to until removed: its
    process started again on the same port is not taken back by the old link, and an add
    makes it worker 2, a new link (the old one holding it, the add would be refused)."""
    import asyncio
    import socket

    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import answer, serve_in_process
    from worker.service import WorkerNode

    with socket.socket() as s:  # a port nobody listens on (closed at once)
        s.bind(("127.0.0.1", 0))
        silent = f"127.0.0.1:{s.getsockname()[1]}"

    async def main():
        a_addr, stop_a, served_a = await serve_in_process(WorkerNode(gpus=1, pages=100))
        b_addr, stop_b, served_b = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([a_addr, b_addr, silent], "v100-reference",
                              models="resnet50_v2", connect_timeout=2.0)
        await node.start()
        try:
            assert list(node.awaited) == [silent]
            row = next(r for r in node.worker_rows() if r["state"] == "awaited")
            assert "(not yet: " in row["detail"] and "refused" in row["detail"], row
            port = silent.rpartition(":")[2]
            got = await asyncio.gather(*(node.remove_worker(f"{host}:{port}")
                                         for host in ["localhost", "127.0.0.1"] * 5))
            assert sorted(got) == [(-1, [], False, False, 0)] * 9 + [(-1, [], True, False, 0)], got
            assert node.counters["workers_removed"] == 1
            assert [(r["worker"], r["state"]) for r in node.worker_rows()] == [
                (0, "serving"), (1, "serving"), (-1, "removed")]
            assert not node.awaited
            assert await node.remove_worker(silent) == (-1, [], False, False, 0)  # (again)
            with pytest.raises(RepositoryError, match="no worker"):
                await node.remove_worker("127.0.0.1:1")
            b = next(lk for lk in node.links if lk.address == b_addr)
            stop_b.set()
            await served_b
            while b.connected or b.reconnecting is None:  # lost: reconnecting
                await asyncio.sleep(0.02)
            assert await node.remove_worker(b_addr) == (b.index, [b.index], True, False, 0)
            assert b.reconnecting.cancelling() or b.reconnecting.done()
            port = int(b_addr.rpartition(":")[2])
            from worker.service import serve_worker
            stop_b2 = asyncio.Event()
            up = asyncio.get_running_loop().create_future()
            served_b2 = asyncio.create_task(serve_worker(
                "127.0.0.1", port, WorkerNode(gpus=1, pages=100), stop=stop_b2, link_port=-1,
                ready=lambda p, _: up.set_result(p)))
            await up
            assert await node.add_worker(b_addr) == (2, [2], True)
            assert not b.connected and node.links[2].connected
            assert (await answer(node, "resnet50_v2")).status == 0
            stop_b2.set()
            await served_b2
        finally:
            await node.stop()
            stop_a.set()
            await served_a

    asyncio.run(asyncio.wait_for(main(), 60))


# two GPUs for a load one carries; worker 1 leaves at 3 s
SCENARIO = """
name = "remove-workers"
seed = 3
duration_s = 6.0

[cluster]
workers = 2
gpus_per_worker = 1

[[models]]
name = "resnet50_v2"
copies = 4

[[workloads]]
kind = "poisson"
models = "*"
rate_rps = 600
slo_ms = 100

[[remove_workers]]
at_s = 3.0
worker = 1
"""


def _scenario(tmp_path, overrides=()):
    return events_scenario(tmp_path, SCENARIO, overrides)


def test_a_worker_removed_in_a_simulated_run_takes_nothing_from_its_time_on(tmp_path):
    """No action is sent to worker 1 after 3 s and no request is answered on its GPU
    past the actions it had then; worker 0 carries the rest, every request answered
    once; two runs are identical."""
    from clockwork.cluster.sim import Simulation, simulate

    sim = Simulation(_scenario(tmp_path))
    res = sim.run()
    assert sim.fault_log[0][0] == 3_000_000_000
    assert sim.fault_log[0][1].startswith("cluster: worker 1 removed; ")
    res.write(tmp_path / "a")
    acts = _rows(tmp_path / "a", "actions.tsv")
    on1 = [int(a["sent"]) for a in acts if a["worker"] == "1"]
    assert on1 and max(on1) < 3e9 and any(s > 2.9e9 for s in on1)
    rows = _rows(tmp_path / "a")
    assert len(rows) == len({r["request_id"] for r in rows}) == res.summary["submitted"]
    late = [r for r in rows if r["gpu"] == "1" and int(r["arrival"]) > 3.1e9]
    assert not late
    after = [r for r in rows if int(r["arrival"]) > 3.2e9]
    assert sum(r["status"] == "SUCCESS" for r in after) >= 0.99 * len(after)
    assert simulate(_scenario(tmp_path)).summary == res.summary


@pytest.mark.parametrize("policy", ["clockwork", "clipper"])
def test_a_worker_drained_in_a_simulated_run_finishes_its_actions_there(tmp_path, policy):
    """``drain = true``: worker 1 takes nothing new from 3 s, its actions in flight then
    end there (none fails: taken out at once, the same run fails them), it is taken out
    once they have, and every request is answered once; two runs are identical."""
    from clockwork.cluster.sim import Simulation, simulate

    over = [f"scheduler.policy={policy}", "workloads.0.rate_rps=1500"]
    sim = Simulation(_scenario(tmp_path, over + ["remove_workers.0.drain=true"]))
    res = sim.run()
    said = [line for _, line in sim.fault_log]
    assert sim.fault_log[0][0] == 3_000_000_000, said
    assert said[0].startswith("cluster: worker 1 draining (") and not said[0].startswith(
        "cluster: worker 1 draining (0 "), said
    assert said[1] == "cluster: worker 1 removed (drained)", said
    assert 3e9 < sim.fault_log[1][0] < 3.1e9
    res.write(tmp_path / "a")
    acts = _rows(tmp_path / "a", "actions.tsv")
    on1 = [a for a in acts if a["worker"] == "1"]
    assert max(int(a["sent"]) for a in on1) < 3e9
    assert all(a["status"] == "SUCCESS" for a in on1), {a["status"] for a in on1}
    assert [a for a in on1 if int(a["measured_completion"]) > 3e9]  # (ran past 3 s)
    rows = _rows(tmp_path / "a")
    assert len(rows) == len({r["request_id"] for r in rows}) == res.summary["submitted"]
    assert simulate(_scenario(tmp_path, over + ["remove_workers.0.drain=true"])
                    ).summary == res.summary
    # taken out at once instead: the actions in flight at 3 s fail
    Simulation(_scenario(tmp_path, over)).run().write(tmp_path / "b")
    assert [a for a in _rows(tmp_path / "b", "actions.tsv")
            if a["worker"] == "1" and a["status"] == "WORKER_LOST"]


def test_a_worker_lost_before_its_drain_is_removed_at_once_not_drained(tmp_path):
    """Killed at 2 s (no restart), drained at 3 s: removed at once, and said not drained,
    as a live run says it (the simulator said it drained)."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(_scenario(tmp_path, ["remove_workers.0.drain=true",
                                          "faults.kill=[{worker=1, at_s=2.0}]"]))
    sim.run()
    said = [line for _, line in sim.fault_log if "worker 1" in line]
    assert said[-1] == "cluster: worker 1 removed (not drained: 0 action(s) failed)", said
    assert not [x for x in said if "draining" in x], said


def test_a_worker_lost_while_draining_in_a_simulated_run_is_said_not_drained(tmp_path):
    """Worker 1 hangs as it is drained: the liveness check fails its actions, and the
    removal says so, as the live run does (it said "removed (drained)")."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(_scenario(tmp_path, [
        "workloads.0.rate_rps=1500", "remove_workers.0.at_s=3.005",
        "remove_workers.0.drain=true", "faults.hang=[{worker=1, at_s=3.0, for_s=1.0}]"]))
    sim.run()
    said = [line for _, line in sim.fault_log if "worker 1" in line]
    failed = next(int(x.split("; ")[1].split()[0]) for x in said if "suspects" in x)
    assert failed > 0 and f"cluster: worker 1 removed (not drained: {failed} action(s) " \
        "failed)" in said, said


@pytest.mark.parametrize("overrides,error", [
    (["remove_workers.0.at_s=6"], "remove_workers.0.at_s: must be before the end"),
    (["remove_workers.0.worker=2"],
     "remove_workers.0.worker: 2 is not in the cluster at 3 s (the 2 at the start are 0 ... 1)"),
    (["add_workers=[{at_s=4}]", "remove_workers.0.worker=2"],
     "remove_workers.0.worker: 2 is not in the cluster at 3 s (the 2 at the start are 0 ... "
     "1; those [[add_workers]] adds follow, each from its at_s: worker 2 at 4 s)"),
    (["remove_workers=[{at_s=1, worker=1}, {at_s=2, worker=1}]"],
     "remove_workers.1.worker: 1 is removed already"),
    (["remove_workers=[{at_s=1, worker=1}, {at_s=2, worker=0}]"],
     "remove_workers.1: removes the last worker in the cluster at 2 s"),
    (["faults.controller_restart=[{at_s=1}]"],
     "remove_workers: not together with faults.controller_restart"),
])
def test_remove_workers_are_checked_before_anything_runs(tmp_path, overrides, error):
    from clockwork.cluster.serve import events_error
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import ScenarioError

    with pytest.raises(ScenarioError) as e:
        Simulation(_scenario(tmp_path, overrides))
    assert error in str(e.value), str(e.value)
    assert error in events_error(_scenario(tmp_path, overrides), replay=True)


def test_a_worker_removed_at_the_time_it_joins_and_one_killed_before_it_leaves(tmp_path):
    """Same-time events go joins first: a worker that joins at 2 s may leave at 2 s (it
    takes nothing). A worker killed (restarted later) and removed meanwhile is not taken
    back by its restart."""
    from clockwork.cluster.sim import Simulation

    sim = Simulation(_scenario(tmp_path, [
        "add_workers=[{at_s=2}]", "remove_workers=[{at_s=2, worker=2}, {at_s=3, worker=1}]",
        "faults.kill=[{worker=1, at_s=2.5, back_s=4}]"]))
    res = sim.run()
    said = [line for _, line in sim.fault_log]
    assert said[:2] == ["cluster: worker 2 joined (1 GPU(s))",
                        "cluster: worker 2 removed; 0 action(s) failed"], said
    assert "controller reconnected to worker 1" not in said, said
    res.write(tmp_path / "a")
    acts = _rows(tmp_path / "a", "actions.tsv")
    assert not [a for a in acts if a["worker"] == "2"]
    assert not [a for a in acts if a["worker"] == "1" and int(a["sent"]) >= 2.5e9]


@pytest.mark.faults
@pytest.mark.parametrize("drain", [False, True])
def test_a_worker_leaves_a_live_run_at_its_time(tmp_path, drain):
    """``clockwork serve --replay``: the controller takes worker 1 out at 3 s (``drain``:
    once its actions in flight have ended there): no request arriving after then is
    answered on its GPU, every request is answered once, and worker 0 serves the rest
    (the run exits 0: the worker process, which runs on, did not crash)."""
    import subprocess
    import sys

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO + ("drain = true\n" if drain else ""))
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--replay", "--quiet", "--out", str(tmp_path / "live")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    import re

    said = re.search(r"clockwork serve: +([\d.]+) s  cluster: worker 1 removed(.*)",
                     p.stderr)
    removed = float(said[1])
    assert said[2] == (" (drained)" if drain else ""), said[0]
    assert 3.0 <= removed < 4.0, removed
    rows = _rows(tmp_path / "live")
    assert len(rows) == len({r["request_id"] for r in rows})
    assert not [r for r in rows if r["gpu"] == "1" and int(r["arrival"]) > (removed + 0.1) * 1e9]
    assert [r for r in rows if r["gpu"] == "1"]  # (it served before)
    # one GPU carries the load (the simulator: all of it); the suite's other processes on
    # a shared host can starve this cluster's for tens of ms, so a few percent may time out
    after = [r for r in rows if int(r["arrival"]) > (removed + 0.5) * 1e9]
    assert sum(r["status"] == "SUCCESS" for r in after) >= 0.85 * len(after)


@pytest.mark.faults
def test_a_drain_in_a_live_run_holds_up_no_later_event(tmp_path):
    """``clockwork serve --replay``: worker 1 hangs at 2 s for 3 s and is drained at
    2.05 s with the actions sent to it meanwhile in flight (liveness off: the drain waits
    for them); worker 2's removal at 3 s is played at its time (it waited for the drain,
    ~3 s late), and so is the hang's end."""
    import re
    import subprocess
    import sys

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("workers = 2", "workers = 3").replace(
        "copies = 4", "copies = 6").replace("at_s = 3.0", "at_s = 2.05")
        + "drain = true\n\n[[remove_workers]]\nat_s = 3.0\nworker = 2\n\n"
        "[scheduler]\nliveness = false\n\n[faults]\nhang = [{worker = 1, at_s = 2.0, "
        "for_s = 3.0}]\n")
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--replay", "--quiet", "--set", "workloads.0.rate_rps=1200",
                        "--out", str(tmp_path / "live")],
                       capture_output=True, text=True, timeout=120)
    said = {m[2]: float(m[1]) for m in re.finditer(
        r"clockwork serve: +([\d.]+) s  (cluster: worker 2 removed|fault: resume worker 1|"
        r"cluster: worker 1 removed)", p.stderr)}
    assert set(said) == {"cluster: worker 2 removed", "fault: resume worker 1",
                         "cluster: worker 1 removed"}, p.stderr[-3000:]
    assert 3.0 <= said["cluster: worker 2 removed"] < 3.9, said
    assert 5.0 <= said["fault: resume worker 1"] < 5.9, said
    assert said["cluster: worker 1 removed"] >= said["fault: resume worker 1"], said
    assert p.returncode == 0, p.stderr[-3000:]


def test_plan_replay_serve_and_ray_say_what_they_do_with_removals(tmp_path):
    """``clockwork plan`` chooses the workers of the whole run: it refuses them; a replay
    against a running controller refuses them (they would change its workers for
    everyone); serve without ``--replay`` says it does not play them."""
    from clockwork.cluster.plan import PlanError, make_plan
    from clockwork.cluster.serve import live_ignored
    from tests.conftest import replay_with_no_controller

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    with pytest.raises(PlanError, match=r"\[\[remove_workers\]\] events.*--set remove_workers=\[\]"):
        make_plan(str(path), [], 0.99, None, 1, 4, 1)
    p = replay_with_no_controller(tmp_path, SCENARIO)
    assert p.returncode == 2 and "[[remove_workers]] events" in p.stderr, p.stderr
    assert "remove_workers (played by --replay only)" in live_ignored(_scenario(tmp_path),
                                                                      replay=False)
    import subprocess
    import sys

    # (on Ray they are played: tests/test_ray.py; [[add_workers]] are not, refused before
    # anything starts: a Ray cluster's workers join as its nodes do)
    p = subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "serve", str(path),
                        "--ray", "--set", "add_workers=[{at_s=1}]"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "[[add_workers]] events are not played on a Ray" \
        in p.stderr, p.stderr


def test_removals_beside_each_other_an_add_and_a_model_that_fit_only_there():
    """Controller and workers in this process. Two removes of one worker at once, under
    two spellings: one removes it, the other answers removed False (both said True, the
    line and the count twice). A remove of an unknown address while an add of another
    worker hangs is answered NOT_FOUND at once (it waited for that add's whole time). A
    model whose only fitting GPU was the removed worker's fits on none: it is answered
    so at once (its requests waited out their SLO for a GPU that never comes back)."""
    import asyncio
    import socket
    import time

    from controller.service import ControllerNode, RepositoryError
    from tests.inprocess import answer, serve_in_process
    from worker.service import WorkerNode

    async def main():
        small, stop_s, served_s = await serve_in_process(WorkerNode(gpus=1, pages=5))
        big, stop_b, served_b = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([small, big], "v100-reference",
                              models="resnet50_v2,mobilenet_v2", connect_timeout=5.0)
        await node.start()
        silent = socket.socket()  # takes connections, never speaks gRPC: an add hangs
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        try:
            assert not node.unfit("resnet50_v2") and node.gpus_in_service() == [0, 1]
            # the GPUs a model's KServe configuration lists: those that can hold it
            # (resnet50_v2 7 pages, mobilenet_v2 1; it listed both for either)
            assert node.gpus_in_service(7) == [1] and node.gpus_in_service(1) == [0, 1]
            port = big.rpartition(":")[2]
            got = await asyncio.gather(node.remove_worker(f"localhost:{port}"),
                                       node.remove_worker(f"127.0.0.1:{port}"))
            assert sorted(got) == [(1, [1], False, False, 0), (1, [1], True, False, 0)]
            assert node.counters["workers_removed"] == 1
            assert node.unfit("resnet50_v2").startswith("fits on no GPU")
            assert node.gpus_in_service() == [0]
            t0 = time.monotonic()
            r = await answer(node, "resnet50_v2")
            assert r.status != 0 and "does not fit on any GPU" in r.message, r
            assert time.monotonic() - t0 < 1.0
            assert (await answer(node, "mobilenet_v2")).status == 0
            adding = asyncio.create_task(node.add_worker(
                f"127.0.0.1:{silent.getsockname()[1]}", timeout=4.0))
            while not node._adds_pending:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            with pytest.raises(RepositoryError, match="no worker 127.0.0.1:1 "):
                await node.remove_worker("127.0.0.1:1", timeout=4.0)
            assert time.monotonic() - t0 < 1.0
            assert await node.remove_worker(big, timeout=4.0) == (1, [1], False, False, 0)
            with pytest.raises(RepositoryError):
                await adding
        finally:
            silent.close()
            await node.stop()
            for stop in (stop_s, stop_b):
                stop.set()
            await served_s
            await served_b

    asyncio.run(asyncio.wait_for(main(), 60))


def test_clockwork_workers_lists_adds_and_removes():
    """``clockwork workers``: each worker's state in a line (serving on its fast link;
    lost, with why, and why reconnecting fails, once its process died), ``remove`` takes one out (listed removed),
    ``add`` puts its restarted process back as a new worker; a wrong use or an unknown
    worker is exit 2 in one line."""
    import subprocess
    import sys

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "workers",
                               *argv, "--controller", c.address], capture_output=True,
                              text=True, timeout=60)

    with local_cluster(workers=2, gpus=1, models="resnet50_v2") as c, \
            Client(c.address, timeout=10) as k:
        a0, a1 = c.worker_addresses
        p = cli()
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0].split()[:5] == ["worker", "address", "state", "gpus", "link"]
        assert lines[1].split()[:5] == ["0", a0, "serving", "0", "fast"], lines
        assert lines[2].split()[:5] == ["1", a1, "serving", "1", "fast"], lines
        c.workers[1].proc.kill()
        c.workers[1].proc.wait()
        poll(lambda: [w["state"] for w in k.workers()] == ["serving", "lost"], 20)
        lost = k.workers()[1]
        assert lost["detail"] and lost["link"] == "" and lost["gpus"] == [1], lost
        # then why reconnecting fails (it said what ended the connection only, for good)
        poll(lambda: "; reconnecting fails: connection refused" in k.workers()[1]["detail"],
             20)
        assert _states(c) == {("0", a0, "serving"), ("1", a1, "lost")}
        p = cli("remove", a1)
        assert (p.returncode, p.stdout) == (0, f"worker 1 ({a1}): removed, GPUs 1\n"), p
        assert [w["state"] for w in k.workers()] == ["serving", "removed"]
        assert _states(c) == {("0", a0, "serving")}  # (a removed worker: no series)
        p = cli("remove", a1)
        assert (p.returncode, p.stdout) == (0, f"worker 1 ({a1}): removed already, GPUs 1\n")
        c.restart_worker(1)
        p = cli("add", a1)
        assert (p.returncode, p.stdout) == (0, f"worker 2 ({a1}): added, GPUs 2\n"), p
        assert [(w["worker"], w["state"], w["link"]) for w in k.workers()] == [
            (0, "serving", "fast"), (1, "removed", ""), (2, "serving", "fast")]
        p = cli("list", "--drain")
        assert (p.returncode, p.stderr) == (
            2, "clockwork workers: --drain goes with remove, not list\n"), p
        p = cli("remove", a1, "--drain")  # (nothing in flight: drained at once)
        assert (p.returncode, p.stdout) == (0, f"worker 2 ({a1}): removed, GPUs 2, drained: "
                                               "its actions in flight finished there\n"), p
        assert k.add_worker(a1)["worker"] == 3  # (its process ran on: free again)
        p = cli("remove", "127.0.0.1:1")
        assert p.returncode == 2 and "InvalidRequest" in p.stderr and "no worker" in p.stderr
        p = cli("add")
        assert p.returncode == 2 and p.stderr == ("clockwork workers: add needs the worker's "
                                                  "ADDRESS (HOST:PORT)\n"), p.stderr


def _churn_early(n: int) -> str:
    """Cold starts on 2 GPUs (400 copies, room for ~200) while ``n`` workers join and
    leave 0.2 s later, all within the first 1.2 s, then 4 s more of the same load."""
    lines = ['name = "churn-early"', "seed = 1", "duration_s = 5.0", "",
             "[cluster]", "workers = 2", "gpus_per_worker = 1", "",
             "[[models]]", 'name = "resnet50_v2"', "copies = 400", "",
             "[[workloads]]", 'kind = "poisson"', 'models = "*"', "rate_rps = 300.0",
             "slo_ms = 100", ""]
    for k in range(n):
        at = 0.5 + 0.5 * k / n
        lines += ["[[add_workers]]", f"at_s = {at:.6f}", "",
                  "[[remove_workers]]", f"at_s = {at + 0.2:.6f}", f"worker = {2 + k}", ""]
    return "\n".join(lines)


def test_a_removed_worker_lets_go_of_its_connection_and_the_list_is_bounded(monkeypatch):
    """A worker added and removed again and again (an autoscaler): each removed one let
    go of its gRPC channel and call (the controller held ~100 KB a cycle for its life:
    55 KB a cycle and 405 rows in ``clockwork workers`` after 400 cycles); ListWorkers
    lists the last ``REMOVED_LISTED`` removed."""
    import asyncio
    import gc
    import weakref

    from controller import links
    from controller.service import ControllerNode
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    monkeypatch.setattr(links, "REMOVED_LISTED", 3)

    async def main():
        a_addr, stop_a, served_a = await serve_in_process(WorkerNode(gpus=1, pages=100))
        b_addr, stop_b, served_b = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([a_addr], "v100-reference", models="resnet50_v2",
                              connect_timeout=2.0)
        await node.start()
        held = []
        try:
            for i in range(6):
                await node.add_worker(b_addr)
                lk = node.links[-1]
                held += [weakref.ref(lk.channel), weakref.ref(lk.call)]
                await node.remove_worker(b_addr, drain=i % 2 == 0)
                assert lk.removed and lk.channel is None and lk.call is None
            for _ in range(50):  # (the channels' close, scheduled at each removal)
                await asyncio.sleep(0.02)
                gc.collect()
                if not any(r() is not None for r in held):
                    break
            assert [r() for r in held] == [None] * len(held)
            rows = node.worker_rows()
            assert [(r["worker"], r["state"]) for r in rows] == [
                (0, "serving"), (4, "removed"), (5, "removed"), (6, "removed")]
            assert rows[-1]["gpus"] == [6]  # (its GPUs still said)
            await node.add_worker(b_addr)  # (added again: as a new worker)
            assert node.worker_rows()[-1]["state"] == "serving"
        finally:
            await node.stop()
            stop_a.set()
            stop_b.set()
            await served_a
            await served_b

    asyncio.run(main())


def test_the_scheduler_walks_no_removed_gpu_once_it_is_removed(monkeypatch):
    """A removed GPU keeps its place in the scheduler's list for good; the LOAD looks
    (every 2 ms while a model wants a copy) walked every GPU ever added, so each look cost
    more with every worker that joined and left. Counted here: the reads of a removed
    GPU's availability over a run with 60 workers joining and leaving among cold starts
    are those of its removal and of a stale entry dropped, at most 2 a GPU (3,096 in all
    before, 2,928 of them in the LOAD looks' walk)."""
    from clockwork.cluster.sim import Simulation
    from clockwork.scenario import load_scenario
    from controller import scheduler as sched_mod
    from controller.state import GpuState

    reads = [0]
    slot = GpuState.available

    class Watched(GpuState):
        __slots__ = ()

        @property
        def available(self):
            if GpuState.gone.__get__(self):
                reads[0] += 1
            return slot.__get__(self)

        @available.setter
        def available(self, value):
            slot.__set__(self, value)

    monkeypatch.setattr(sched_mod, "GpuState", Watched)
    sim = Simulation(load_scenario(data=__import__("tomllib").loads(_churn_early(60))))
    for g in sim.policy.gpus:
        g.__class__ = Watched
    res = sim.run()
    assert len(sim.policy.gpus) == 62 and sum(g.gone for g in sim.policy.gpus) == 60
    assert res.summary["submitted"] > 1000 and res.summary["slo_attainment"] > 0.99
    assert reads[0] <= 2 * 60, reads
    assert [g.index for g in sim.policy._idle.in_service] == [0, 1]


def test_a_request_walks_no_removed_worker():
    """Controller and workers in this process. Worker 0 removed, each request (whether a
    worker is there to take it) and each readiness look read worker 1's link only: a
    removed worker's link keeps its place for good, and walking every link ever made
    cost each request more with every worker that joined and left (3,000 removed: +18 %
    of the controller's CPU a request)."""
    import asyncio

    from controller.links import WorkerLink
    from controller.service import ControllerNode
    from tests.inprocess import answer, serve_in_process
    from worker.service import WorkerNode

    reads = [0]

    class Watched(WorkerLink):
        @property
        def connected(self):
            reads[0] += 1
            return self.__dict__["connected"]

        @connected.setter
        def connected(self, value):
            self.__dict__["connected"] = value

    async def main():
        a, stop_a, served_a = await serve_in_process(WorkerNode(gpus=1, pages=100))
        b, stop_b, served_b = await serve_in_process(WorkerNode(gpus=1, pages=100))
        node = ControllerNode([a, b], "v100-reference", models="resnet50_v2:2",
                              connect_timeout=5.0)
        await node.start()
        try:
            assert await node.remove_worker(a, timeout=4.0) == (0, [0], True, False, 0)
            node.links[0].__class__ = Watched
            for m in ("resnet50_v2", "resnet50_v2:1"):
                assert (await answer(node, m)).status == 0
            assert node.serving()
            assert reads[0] == 0
            assert node.in_service() == [node.links[1]]
            assert await node.add_worker(a, timeout=4.0) == (2, [2], True)
            assert node.in_service() == [node.links[1], node.links[2]]
        finally:
            await node.stop()
            for stop in (stop_a, stop_b):
                stop.set()
            await served_a
            await served_b

    asyncio.run(asyncio.wait_for(main(), 60))
