"""Large REST inference bodies with JSON tensors are decoded in child processes
(``controller/json_offload.py``): the same answers and refusals as decoding them in the
controller, a child that dies is replaced without losing the body it had, one whose
caller went away is ended, and no child outlives ``close``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import numpy as np
import orjson
import pytest

from controller.json_offload import JsonDecoders, decode
from controller.kserve_status import KServeError


def _body(data, datatype="FP32", shape=(2, 3), **extra) -> bytes:
    return orjson.dumps({"id": "r1", "inputs": [{"name": "x", "datatype": datatype,
                                                 "shape": list(shape), "data": data}],
                         **extra})


BODIES = [
    (_body([[1.5, 2, 3], [4, 5, 6e30]]), b""),
    (_body(list(range(6)), "INT64"), b""),
    # a JSON input and a binary one after the header
    (orjson.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]},
        {"name": "y", "datatype": "UINT8", "shape": [3],
         "parameters": {"binary_data_size": 3}}],
        "outputs": [{"name": "o", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": False, "slo_ms": 20}}), b"\x01\x02\x03"),
    (b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [2], "data": [NaN, 1]}]}', b""),
]
BAD = [
    (b"{not json", b""),
    (b"[1, 2]", b""),
    (_body([1, 2, 3], shape=(2, 3)), b""),  # 3 values for 6
    (_body([1, True, 0, 1, 0, 1]), b""),  # a bool among the numbers
    (_body([1, 2, 3, 4, 5, 6], "INT8", id=5), b""),
    (orjson.dumps({"inputs": [{"name": "y", "datatype": "UINT8", "shape": [3],
                               "parameters": {"binary_data_size": 3}}]}), b"\x01"),
]


def _same(a, b) -> None:
    (ia, *ra), (ib, *rb) = a, b
    assert ra == rb
    assert [(t.name, t.datatype, t.shape) for t in ia] == [(t.name, t.datatype, t.shape)
                                                          for t in ib]
    for ta, tb in zip(ia, ib, strict=True):
        assert bytes(memoryview(ta.data).cast("B")) == bytes(memoryview(tb.data).cast("B"))
        assert type(ta.data) is type(tb.data) or isinstance(tb.data, memoryview)


def _refusal(header, binary) -> str:
    with pytest.raises(KServeError) as e:
        decode(header, binary)
    return e.value.kind, e.value.message


def _children(decoders: JsonDecoders) -> set[int]:
    return {c.proc.pid for c in decoders._idle}


def test_a_child_answers_and_refuses_as_the_controller_would():
    async def main():
        d = JsonDecoders(2)
        try:
            got = await asyncio.gather(*(d.decode(h, b) for h, b in BODIES))
            for (h, b), g in zip(BODIES, got, strict=True):
                _same(g, decode(h, b))
            assert got[0][-1] == {"id": "r1"} and got[2][-1] == {}
            for h, b in BAD:
                with pytest.raises(KServeError) as e:
                    await d.decode(h, b)
                assert (e.value.kind, e.value.message) == _refusal(h, b)
            pids = _children(d)
            assert pids and os.getpid() not in pids  # decoded in children of ours
        finally:
            await d.close()
        return pids

    for pid in asyncio.run(main()):
        assert not os.path.exists(f"/proc/{pid}"), "a child outlived close"


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_hung_child_is_replaced_and_its_body_decoded_all_the_same(
        sig, monkeypatch, capsys):
    """A child that dies, or does not answer (stopped: it held its slot, and every body
    queued behind it, for good, and the clients got no answer at all), is ended (past
    its answer time, for a hung one) and its body decoded in this process; a new child
    decodes the next ones."""
    from controller import json_offload

    monkeypatch.setattr(json_offload, "ANSWER_BASE_S", 0.5)

    async def main():
        d = JsonDecoders(1)
        try:
            h, b = BODIES[0]
            await d.decode(h, b)
            (pid,) = _children(d)
            os.kill(pid, getattr(signal, sig))
            got = await asyncio.gather(d.decode(h, b), d.decode(h, b))  # (one waits)
            for g in got:
                _same(g, decode(h, b))
            assert await asyncio.to_thread(_gone, pid)  # ended (and reaped)
            _same(await d.decode(h, b), decode(h, b))
            (new,) = _children(d)  # a new child decodes the next bodies
            assert new != pid
        finally:
            await d.close()

    asyncio.run(main())
    err = capsys.readouterr().err
    assert err.count("a JSON decoding process failed") == 1, err
    assert ("no answer in 0.5" in err) == (sig == "SIGSTOP"), err


def _gone(pid: int) -> bool:
    for _ in range(500):
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.01)
    return False


BIG = _body(np.zeros(2_000_000).tolist(), shape=(2_000_000,))  # ~0.1 s to decode


def _watch_children(monkeypatch) -> tuple[list, threading.Event]:
    """(the children started from here on, an event set when the first has started)."""
    from controller import json_offload

    spawned: list = []
    first = threading.Event()
    init = json_offload._Child.__init__

    def counted(self):
        init(self)
        spawned.append(self)
        first.set()

    monkeypatch.setattr(json_offload._Child, "__init__", counted)
    return spawned, first


def test_a_child_whose_caller_went_away_is_ended_and_close_ends_the_rest(monkeypatch):
    spawned, first = _watch_children(monkeypatch)

    async def main():
        d = JsonDecoders(2)
        task = asyncio.create_task(d.decode(BIG, b""))
        assert await asyncio.to_thread(first.wait, 30)  # its child has started
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        h, b = BODIES[0]
        _same(await d.decode(h, b), decode(h, b))  # another child
        kept = _children(d)
        await d.close()
        return kept

    kept = asyncio.run(main())
    assert len(spawned) == 2 and kept == {spawned[1].proc.pid}
    for child in spawned:  # (each ends in the background: the abandoned one once it answered)
        assert child.proc.wait(30) is not None


def test_no_processes_decodes_on_a_thread():
    async def main():
        d = JsonDecoders(0)
        h, b = BODIES[2]
        _same(await d.decode(h, b), decode(h, b))
        assert not _children(d)
        await d.close()

    asyncio.run(main())


def test_what_a_child_prints_is_not_taken_for_an_answer(tmp_path, monkeypatch):
    """A child whose Python prints to its stdout as it starts (here a sitecustomize on
    PYTHONPATH; a module of the controller's working folder named like one the child
    imports did the same) still answers: answers come on a pipe of their own. Before,
    the printed bytes were read as an answer's length and every large body failed."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nprint('hello from sitecustomize')\nsys.stdout.flush()\n"
        "os.write(1, b'and from fd 1\\n')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    async def main():
        d = JsonDecoders(1)
        try:
            h, b = BODIES[0]
            _same(await d.decode(h, b), decode(h, b))
            assert _children(d), "not decoded in a child"
        finally:
            await d.close()

    asyncio.run(main())


def test_close_while_a_body_is_decoded_gives_it_its_answer(monkeypatch):
    """``close`` while a child decodes: that body still gets its answer, a body that
    comes after is decoded in this process, and the child ends. (It raised from the
    thread pool shut down under it, and the child was left running.)"""
    spawned, first = _watch_children(monkeypatch)

    async def main():
        d = JsonDecoders(1)
        task = asyncio.create_task(d.decode(BIG, b""))
        assert await asyncio.to_thread(first.wait, 30)
        await d.close()
        got = await task
        assert got[0][0].shape == [2_000_000] and not got[0][0].data.any()
        h, b = BODIES[0]
        _same(await d.decode(h, b), decode(h, b))  # (here: no child is started)

    asyncio.run(main())
    assert len(spawned) == 1
    assert spawned[0].proc.wait(30) is not None
