"""Workers leaving a running cluster for good (``clockwork.v1`` RemoveWorker,
``Client.remove_worker``): the controller places nothing more on their GPUs, fails what
they have in flight back into the policy, closes their connection and does not reconnect;
the worker process is free for any controller (added again, it gets a new index).
Real processes on loopback; the loop's own rule is in ``test_loops.py``."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from clockwork.client import Client
from clockwork.errors import ClockworkError, InvalidRequest
from tests.conftest import local_cluster, poll


def _ready(c) -> int:
    try:
        with urllib.request.urlopen(f"http://{c.printed_address('http')}/v2/health/ready",
                                    timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_removed_worker_takes_nothing_more_and_can_be_added_again():
    """Two workers serving two copies of one model while clients send requests; worker 1
    is removed mid-stream: every request is answered (SUCCESS or an error, none left
    waiting), the model is served on worker 0 only, the removal says so once and again
    answers removed False, the controller stays ready and reconnects nothing. The
    worker, free again, is added back as worker 2 and serves."""
    with local_cluster(workers=2, gpus=1, models="resnet50_v2:2") as c, \
            Client(c.address, timeout=10) as k:
        poll(lambda: _ready(c) == 200, 20)
        for _ in range(4):
            k.infer("resnet50_v2", slo_ms=1000)
            k.infer("resnet50_v2:1", slo_ms=1000)
        stop = threading.Event()
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

        senders = [threading.Thread(target=send, daemon=True) for _ in range(3)]
        for t in senders:
            t.start()
        poll(lambda: answered[0] > 50, 20)
        before = answered[0]
        got = k.remove_worker(c.worker_addresses[1])
        assert got == {"worker": 1, "gpus": [1], "removed": True}
        poll(lambda: answered[0] > before + 100, 30)
        stop.set()
        for t in senders:
            t.join(30)
        assert not lost and all(not t.is_alive() for t in senders)
        assert len(failed) < 20, failed[:3]
        for m in ("resnet50_v2", "resnet50_v2:1"):
            k.infer(m, slo_ms=1000)  # raises unless served
            assert list(k.model_status(m).loaded_on) == [0]
        assert k.remove_worker(c.worker_addresses[1]) == {"worker": 1, "gpus": [1],
                                                         "removed": False}
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
