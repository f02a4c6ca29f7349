"""The Python client's own contract (``clockwork/client.py``) and its channels'
keepalive. Real processes and real gRPC on loopback; a stalled controller is a
SIGSTOPped process, an unresponsive one a socket that accepts and says nothing."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import clockwork  # noqa: E402
from clockwork.errors import (  # noqa: E402
    ControllerUnavailable,
    InferenceTimeout,
    InvalidRequest,
)
from tests.conftest import local_cluster  # noqa: E402

RESNET_INPUT = np.zeros((3, 224, 224), np.float32)  # 602,112 bytes
HUGE = (64 << 20) // 4 + 1  # float32 elements: more than a 64 MiB gRPC message carries


@pytest.fixture(scope="module")
def cluster():
    # the liveness probe's timeout raised from 50 ms: on two shared cores, with the
    # controller and this test busy with 72 MB of inputs (an emulated worker gets none)
    # and another test process beside them, a worker starved of CPU can miss a 50 ms
    # probe, and every request that arrives while it is suspect is answered no_worker
    # (these tests are not about that)
    with local_cluster(workers=1, gpus=1, models="resnet50_v2,mobilenet_v2",
                       controller_args=["--set", "probe_timeout_ms=1000"]) as c:
        yield c


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once the kernel shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "tT":
        time.sleep(0.001)


@contextmanager
def _silent():
    """The address of a socket that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@contextmanager
def _first_bytes():
    """``(address, got, connected)``: a socket that accepts one connection, records in
    ``got`` the first bytes the client sends on it and then sets ``connected``, and never
    answers. On leaving, the connection is shut (a closed client's connection whose set-up the
    server never answered stays open until gRPC's own timeout, ~15 s, which the thread
    waited out)."""
    got: list[bytes] = []
    connected = threading.Event()
    accepted: list[socket.socket] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        s.settimeout(10)

        def accept():
            conn, _ = s.accept()
            accepted.append(conn)
            with conn:
                conn.settimeout(15)
                got.append(conn.recv(64))
                connected.set()
                with contextlib.suppress(OSError):  # held open until the client gives up
                    while conn.recv(4096):  # (its preface's rest: closing at its first
                        pass  # bytes reset the connection, failing a call UNAVAILABLE)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        yield f"127.0.0.1:{s.getsockname()[1]}", got, connected
        for conn in accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        t.join(15)


# ---------------------------------------------------------------- addresses and TLS

@pytest.mark.parametrize("url,tls", [(" grpcs://{}", True), ("grpcs://{}\n", True),
                                     ("GRPCS://{}", True), ("https://{}", True),
                                     (" grpc://{}", False), ("HTTP://{}", False)])
def test_tls_is_decided_from_the_address_as_it_is_read(url, tls):
    """A ``grpcs://`` address opens its connection with a TLS handshake however it is
    spelled (surrounding whitespace, any case; ``https://`` too), so the bearer token
    never goes out in the clear; ``grpc://`` speaks plain HTTP/2."""
    with _first_bytes() as (address, got, _):
        with clockwork.Client(url.format(address), timeout=0.5, token="s3cret") as c:
            with pytest.raises(ControllerUnavailable):
                c.stats()
    assert got, "the client never connected"
    if tls:
        assert got[0][:1] == b"\x16", got[0]  # a TLS handshake record
    else:
        assert got[0].startswith(b"PRI * HTTP/2.0"), got[0]


def test_an_unknown_scheme_is_named_not_taken_for_ipv6():
    for url in ("ftp://h:1", "grpcss://h:1"):
        for cls in (clockwork.Client, clockwork.AsyncClient):
            with pytest.raises(ValueError, match="unknown scheme") as e:
                cls(url)
            for scheme in ("grpc", "http", "clockwork", "grpcs", "https"):  # all it takes
                assert f" {scheme}://" in str(e.value), e.value


# ---------------------------------------------------------------- keepalive

_QUIET_SERVER = r"""
import grpc
from concurrent.futures import ThreadPoolExecutor
from clockwork.protocol import keepalive
s = grpc.server(ThreadPoolExecutor(2), options=keepalive.SERVER)
port = s.add_insecure_port("127.0.0.1:0")
s.start()
print(port, flush=True)
s.wait_for_termination()
"""


def test_keepalive_gives_up_on_a_silent_peer_within_its_ping_timeout():
    """The channels' keepalive settings, ten times faster (ping after 1 s of silence,
    give up 0.5 s later): a call to a server that stopped (SIGSTOP) fails UNAVAILABLE
    within ~1.5 s, not after gRPC's 60 s ping timeout (``grpc.http2.ping_timeout_ms``,
    which a keepalive ping obeys too). At full scale: ~15 s (checked by hand)."""
    from clockwork.protocol import keepalive

    options = [(k, v // 10 if k.endswith("_ms") else v) for k, v in keepalive.CHANNEL]
    p = subprocess.Popen([sys.executable, "-c", _QUIET_SERVER], stdout=subprocess.PIPE,
                         text=True)
    try:
        port = p.stdout.readline().strip()
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
            call = ch.unary_unary("/clockwork.test/Nothing")
            with pytest.raises(grpc.RpcError) as first:
                call(b"", timeout=10)
            assert first.value.code() == grpc.StatusCode.UNIMPLEMENTED  # connected
            _stop(p.pid)
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as stalled:
                call(b"", timeout=8)
            took = time.monotonic() - t0
        # (UNAVAILABLE, not the call's own 8 s DEADLINE_EXCEEDED: the ping timed out)
        assert stalled.value.code() == grpc.StatusCode.UNAVAILABLE, (stalled.value, took)
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


# ---------------------------------------------------------------- stream messages

def test_a_turn_of_large_requests_goes_in_several_messages(cluster):
    """120 ResNet inputs (72 MB) submitted in one event-loop turn go in messages under
    the stream's byte bound and are all answered (in one message gRPC refused them,
    and the stream died with them); a request too large for any message fails alone,
    at its submit, and the stream carries on."""
    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=10) as c:
            s = c.stream()
            futs = [s.submit("resnet50_v2", RESNET_INPUT, slo_ms=20_000, skip_outputs=True)
                    for _ in range(120)]
            resps = await asyncio.wait_for(asyncio.gather(*futs), 30)
            failed = [(i, r.status, r.reason, r.message) for i, r in enumerate(resps) if r.status]
            assert failed[:3] == [], f"{len(failed)} of 120 failed"
            with pytest.raises(InvalidRequest, match="too large to send"):
                s.submit("mobilenet_v2", np.zeros(HUGE, np.float32), slo_ms=1000)
            assert s.outstanding == 0
            r = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=1000), 10)
            assert r.status == 0
            await s.close()

    asyncio.run(asyncio.wait_for(main(), 40))


def test_an_input_too_large_to_send_is_an_invalid_request(cluster):
    """An input over what one gRPC message may carry is the caller's mistake, refused
    before sending (``InvalidRequest``, not a transient ``ControllerUnavailable``)."""
    huge = np.zeros(HUGE, np.float32)
    with clockwork.Client(cluster.address, timeout=10) as c:
        with pytest.raises(InvalidRequest, match="too large to send") as e:
            c.infer("mobilenet_v2", huge, slo_ms=1000)
        assert e.value.model == "mobilenet_v2"
        assert c.infer("mobilenet_v2", slo_ms=1000).status == 0

    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=10) as c:
            with pytest.raises(InvalidRequest, match="too large to send"):
                await c.infer("mobilenet_v2", {"data": huge}, slo_ms=1000)

    asyncio.run(main())
    # a broadcast view of one number standing for a terabyte: refused before the copy
    # that would take it (a MemoryError from numpy before)
    with clockwork.Client(cluster.address, timeout=10) as c:
        with pytest.raises(InvalidRequest, match="too large to send"):
            c.infer("mobilenet_v2", np.broadcast_to(np.float32(0), (1 << 38,)))


# ---------------------------------------------------------------- closing a stream

def test_closing_a_stream_on_a_stalled_controller_is_bounded_by_the_slos(cluster):
    """``InferStream.close()`` with the controller stopped (SIGSTOP) and requests with an
    SLO outstanding returns once the watchdog has given each up (its SLO plus 1 s, status
    TIMEOUT, ``no_answer``), not when keepalive ends the call; so does a request without
    an SLO on a stream the controller said its default SLO on as it opened (it kept close
    waiting for as long as the controller lived: forever, for one that is up but stuck).
    On a stream opened while the controller is stopped (no default said), such a request
    keeps close waiting, and cancelling close abandons it (``ControllerUnavailable``)."""
    pid = cluster.controller.proc.pid

    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=10) as c:
            s = c.stream()
            assert (await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=1000), 10)).status == 0
            _stop(pid)
            try:
                futs = [s.submit("mobilenet_v2", slo_ms=200) for _ in range(5)]
                futs.append(s.submit("mobilenet_v2"))  # (the default SLO, 100 ms)
                t0 = time.monotonic()
                await asyncio.wait_for(s.close(), 6)
                took = time.monotonic() - t0
                s2 = c.stream()
                no_slo = s2.submit("mobilenet_v2")
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(s2.close(), 0.5)  # (keepalive: ~15 s)
            finally:
                os.kill(pid, signal.SIGCONT)
            # (200 ms + 1 s of grace, then the call is cancelled; without the watchdog's
            # bound close would wait for keepalive, ~15 s)
            assert took < 10.0, took
            for f in futs:
                r = f.result()
                assert r.status == 4 and r.reason == "no_answer", r
            assert "the controller's default SLO 100 ms plus 1 s" in r.message, r
            assert isinstance(no_slo.exception(), ControllerUnavailable), no_slo
            s3 = c.stream()  # the client (and the controller) carry on
            r = await asyncio.wait_for(s3.submit("mobilenet_v2", slo_ms=1000), 10)
            assert r.status == 0
            await s3.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_stream_answers_through_on_answer_once_each(cluster):
    """``submit(on_answer=fn)`` returns None and calls ``fn(response, None)`` once per
    request as the answer is read; one whose SLO ended before it was sent is answered in
    a later round of the event loop, never inside ``submit``; what a callback raises
    (``CancelledError`` too) goes to the event loop's exception handler and the stream
    goes on; a request that fails (its ``close()`` cancelled on a stopped controller) gets
    ``fn(None, error)``, every one of them whatever the others' callbacks raise; a
    callback that submits again on each failure does not recurse; a non-callable is
    refused at ``submit``."""
    pid = cluster.controller.proc.pid

    async def main():
        loop = asyncio.get_running_loop()
        reported = []

        def handler(_loop, ctx):  # (what the stream reports; anything else as usual, e.g.
            # an earlier test's transport collected here)
            if ctx.get("message", "").startswith("InferStream: exception in the on_answer"):
                reported.append(ctx["exception"])
            else:
                _loop.default_exception_handler(ctx)

        loop.set_exception_handler(handler)
        got: dict[int, list] = {}

        def on(i):
            return lambda resp, err: got.setdefault(i, []).append((resp, err))

        def boom(resp, err):
            raise KeyError("from the callback")

        def cancelled(resp, err):
            raise asyncio.CancelledError

        async with clockwork.AsyncClient(cluster.address, timeout=10) as c:
            s = c.stream()
            with pytest.raises(TypeError, match="on_answer must be a callable"):
                s.submit("mobilenet_v2", slo_ms=100, on_answer=True)
            assert s.submit("mobilenet_v2", slo_ms=100,
                            since_ns=time.monotonic_ns() - 10**9, on_answer=on(-1)) is None
            assert got == {}  # (not inside submit)
            await asyncio.sleep(0)
            assert [(r.status, r.reason) for r, _ in got.pop(-1)] == [(4, "late")]
            assert s.submit("mobilenet_v2", slo_ms=5000, on_answer=boom) is None
            assert s.submit("mobilenet_v2", slo_ms=5000, on_answer=cancelled) is None
            for i in range(50):
                assert s.submit("mobilenet_v2", slo_ms=5000, skip_outputs=True,
                                on_answer=on(i)) is None
            await asyncio.wait_for(s.close(), 20)
            assert sorted(got) == list(range(50))
            assert all(len(v) == 1 and v[0][1] is None and v[0][0].status == 0
                       for v in got.values()), got
            assert sorted(type(e).__name__ for e in reported) == ["CancelledError",
                                                                  "KeyError"], reported
            got.clear()
            reported.clear()
            s2 = c.stream()
            assert (await asyncio.wait_for(s2.submit("mobilenet_v2", slo_ms=1000), 10)).status == 0
            _stop(pid)
            try:
                s2.submit("mobilenet_v2", on_answer=cancelled)  # (no SLO: no watchdog)
                for i in range(3):
                    s2.submit("mobilenet_v2", on_answer=on(i))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(s2.close(), 0.5)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert sorted(got) == [0, 1, 2], got
            for i in range(3):
                [(resp, err)] = got[i]
                assert resp is None and isinstance(err, ControllerUnavailable), (resp, err)
            assert [type(e).__name__ for e in reported] == ["CancelledError"], reported
            reported.clear()
            # a closed loop that sends again at once whenever a request is answered late,
            # each time with the same (long past) arrival time: each answer comes in a
            # later round, so no recursion
            tries = []
            s3 = c.stream()
            since = time.monotonic_ns() - 10**9

            def again(resp, err):
                tries.append(resp.reason)
                if len(tries) < 2000:
                    s3.submit("mobilenet_v2", slo_ms=100, since_ns=since, on_answer=again)

            s3.submit("mobilenet_v2", slo_ms=100, since_ns=since, on_answer=again)
            while len(tries) < 2000:
                await asyncio.sleep(0)
            assert set(tries) == {"late"} and reported == [], reported[:3]
            await s3.close()

    asyncio.run(asyncio.wait_for(main(), 40))


def test_closing_a_stream_waits_for_answers_that_take_longer_than_a_second(cluster):
    """A healthy controller's answers are not cut off by close(): requests queued behind
    a long batch of work (here: many, on one GPU) are all answered."""

    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=30) as c:
            s = c.stream()
            futs = [s.submit("resnet50_v2", slo_ms=20_000, skip_outputs=True)
                    for _ in range(3000)]
            t0 = time.monotonic()
            await asyncio.wait_for(s.close(), 60)
            took = time.monotonic() - t0
            statuses = [f.result().status for f in futs]
            assert statuses.count(0) == len(futs), {x: statuses.count(x) for x in statuses}
            return took

    took = asyncio.run(main())
    assert took > 1.0, took  # (else this test shows nothing: more work, or a slower model)


# ---------------------------------------------------------------- deadlines and errors

def test_the_clients_timeout_is_controller_unavailable_and_the_slo_inference_timeout():
    """``infer``'s gRPC deadline is the client's timeout or, when sooner, its SLO plus a
    grace. A controller that says nothing: the client's timeout passing first is
    ``ControllerUnavailable`` (no SLO, or the timeout sooner than the SLO), the SLO's
    deadline passing first ``InferenceTimeout``, with the time the caller waited."""
    with _silent() as address:
        with clockwork.Client(address, timeout=0.3) as c:
            for slo in (None, 5000):
                with pytest.raises(ControllerUnavailable, match="client's timeout"):
                    c.infer("m", slo_ms=slo)
        with clockwork.Client(address, timeout=30) as c:
            with pytest.raises(InferenceTimeout, match="SLO") as e:
                c.infer("m", slo_ms=10)
            # what the caller waited, the SLO and its grace (it said 0)
            assert 1000 <= e.value.latency_ms < 5000, e.value.latency_ms

        async def main():
            async with clockwork.AsyncClient(address, timeout=0.3) as c:
                with pytest.raises(ControllerUnavailable, match="client's timeout"):
                    await c.infer("m")
            async with clockwork.AsyncClient(address, timeout=30) as c:
                with pytest.raises(InferenceTimeout, match="SLO") as e:
                    await c.infer("m", slo_ms=10)
                assert 1000 <= e.value.latency_ms < 5000, e.value.latency_ms

        asyncio.run(main())


@pytest.mark.parametrize("bad", [123, b"s3cret", ["s3cret"]], ids=repr)
def test_a_token_that_is_not_a_string_is_refused_naming_it(bad):
    """``token=`` takes a string: anything else is a ValueError naming the token (an int
    raised the regex's TypeError 'expected string or bytes-like object')."""
    with pytest.raises(ValueError, match="^token: a string, got "):
        clockwork.Client("127.0.0.1:1", token=bad)

    async def make():  # (an AsyncClient is made in its event loop)
        clockwork.AsyncClient("127.0.0.1:1", token=bad)

    with pytest.raises(ValueError, match="^token: a string, got "):
        asyncio.run(make())


def test_a_client_cannot_be_copied_or_pickled():
    """A client owns its connection: copy.copy shared it (closing the copy closed the
    original, whose next call raised gRPC's ValueError), pickle failed deep in gRPC.
    Each is a TypeError saying so."""
    import copy
    import pickle

    c = clockwork.Client("127.0.0.1:1")

    async def make():
        return clockwork.AsyncClient("127.0.0.1:1")

    a = asyncio.run(make())
    for client in (c, a):
        for how in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="owns its connection and cannot be copied"):
                how(client)
    c.close()


def test_an_error_about_a_huge_model_name_repeats_a_little_of_it(cluster):
    """An exception about a model whose name is a megabyte says at most NAME_SHOWN of it
    (its text was the whole name again, more than a megabyte)."""
    from clockwork.errors import NAME_SHOWN

    name = "m" * (1 << 20)
    with clockwork.Client(cluster.address, timeout=20) as c:
        for call in (lambda: c.infer(name), lambda: c.load_model(name),
                     lambda: c.unload_model(name)):
            with pytest.raises(clockwork.errors.ClockworkError) as e:
                call()
            assert len(str(e.value)) < NAME_SHOWN + 4000, len(str(e.value))
        # a message that names the model, cut by the controller, is not prefixed with it
        # again (it showed the name twice: 200 characters, then 130)
        for n in (150, 199, 100_000):  # (the controller cuts a name past 130)
            with pytest.raises(clockwork.errors.UnknownModel) as e:
                c.infer("a" * n)
            assert str(e.value).startswith("unknown model 'aaa"), (n, str(e.value)[:300])


BAD_TIMEOUTS = [float("inf"), float("nan"), -1, 0, -0.0, "5", True, [1], -10**400]


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=lambda v: repr(v)[:20])
def test_a_bad_timeout_is_refused_at_once_naming_it(bad):
    """A client's timeout is None (no limit) or a finite number of seconds > 0; anything
    else is a ValueError that names it, at construction or at the call, instead of every
    call failing at once with an unrelated error."""
    said = f"None (no limit) or a finite number of seconds > 0, got {bad!r}"
    calls = [lambda: clockwork.Client("127.0.0.1:1", timeout=bad),
             lambda: clockwork.AsyncClient("127.0.0.1:1", timeout=bad)]
    c = clockwork.Client("127.0.0.1:1")
    calls += [lambda: c.load_model("m", timeout=bad), lambda: c.unload_model("m", timeout=bad),
              lambda: c.add_worker("127.0.0.1:2", timeout=bad),
              lambda: c.stats(timeout=bad)]  # (stats took 0 as the client's, and raised
    # ControllerUnavailable at once for -1, inf or nan, TypeError for a string)
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert said in str(e.value) and "timeout" in str(e.value)
    c.close()


def test_a_huge_timeout_is_a_day_and_calls_work(cluster):
    """A timeout beyond what gRPC can take (it overflowed: every call failed at once) is
    taken as a day."""
    for t in (1e10, 1e300, 10**400):  # (an int past any float raised OverflowError)
        with clockwork.Client(cluster.address, timeout=t) as c:
            assert c.timeout == 86_400
            assert isinstance(c.stats(), dict)
            assert c.infer("mobilenet_v2").status == 0
            assert c.unload_model("inception_v3", timeout=t) == []  # a profile not served


def test_load_model_takes_any_integral_copies_and_refuses_the_rest(cluster):
    with clockwork.Client(cluster.address, timeout=10) as c:
        try:
            assert [m.name for m in c.load_model("q", copies=np.int64(1),
                                                 profile="mobilenet_v2")] == ["q"]
        finally:
            c.unload_model("q")
        # not served, but known to the repository: its state there (it read as a name
        # never heard of, while repository_index said UNAVAILABLE, unloaded)
        st = c.model_status("q")
        assert not st.known and (st.model.state, st.model.reason) in {
            ("UNAVAILABLE", "unloaded"), ("UNLOADING", "")}, st
        assert st.model.name == "q" and st.model.profile == "mobilenet_v2", st
        st = c.model_status("inception_v3")  # a profile of the set, not loaded
        assert not st.known and st.model.name == "inception_v3" and st.model.state == ""
        assert c.model_status("no_such_model") == type(st)(known=False)
        for bad in (0, -1, 1.5, 2.0, True, "2", 2**31, 2**40):
            with pytest.raises(InvalidRequest, match="copies"):
                c.load_model("q", copies=bad, profile="mobilenet_v2")


def test_arguments_of_the_wrong_type_are_value_errors(cluster):
    """A model that is not a string, or an SLO that is not a number (a bool, a string),
    is refused before anything is sent, and a stream keeps nothing of it."""
    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=10) as c:
            s = c.stream()
            for kw in ({"model": 5}, {"model": None}, {"slo_ms": True}, {"slo_ms": "100"},
                       {"model": "a\udc80"}):  # (a lone surrogate: UnicodeEncodeError)
                args = {"model": "mobilenet_v2", **kw}
                with pytest.raises(ValueError, match="model|slo_ms"):
                    s.submit(args.pop("model"), **args)
                with pytest.raises(ValueError, match="model|slo_ms"):
                    await c.infer(**{"model": "mobilenet_v2", **kw})
            assert s.outstanding == 0
            await s.close()

    asyncio.run(main())
    with clockwork.Client(cluster.address, timeout=10) as c:
        with pytest.raises(ValueError, match="slo_ms"):
            c.infer("mobilenet_v2", slo_ms=True)
        with pytest.raises(ValueError, match="model"):
            c.model_status(None)
        with pytest.raises(ValueError, match="^name must be text UTF-8 can encode"):
            c.load_model("a\udc80", profile="resnet50_v2")
        # (protobuf's own TypeError before, naming no argument)
        async def index(ready_only):
            async with clockwork.AsyncClient(cluster.address, timeout=10) as ac:
                return await ac.repository_index(ready_only)

        for bad in ("yes", 0.5, 2, None, np.zeros(2)):
            with pytest.raises(ValueError, match="ready_only must be True or False"):
                c.repository_index(bad)
            with pytest.raises(ValueError, match="ready_only must be True or False"):
                asyncio.run(index(bad))
        assert [m.state for m in c.repository_index(np.True_)] == \
            [m.state for m in c.repository_index(True)]


def test_a_closed_client_raises_the_same_error_from_both_clients(cluster):
    """Any call on a closed client, blocking or asyncio, raises ``RuntimeError`` ("the
    client is closed"), never reaching gRPC; so does using it as a context manager again,
    and a submit on a stream opened before the close (it returned a future failed
    already, every one sharing one exception)."""
    c = clockwork.Client(cluster.address, timeout=10)
    c.close()
    for call in (lambda: c.infer("mobilenet_v2"), c.stats, c.list_models,
                 lambda: c.load_model("q", profile="mobilenet_v2"), c.__enter__):
        with pytest.raises(RuntimeError, match="client is closed"):
            call()

    async def main():
        ac = clockwork.AsyncClient(cluster.address, timeout=10)
        s = ac.stream()
        await ac.close()
        with pytest.raises(RuntimeError, match="client is closed"):
            s.submit("mobilenet_v2")
        with pytest.raises(RuntimeError, match="client is closed"):
            await ac.__aenter__()
        with pytest.raises(RuntimeError, match="client is closed"):
            await ac.infer("mobilenet_v2")
        with pytest.raises(RuntimeError, match="client is closed"):
            await ac.stats()
        with pytest.raises(RuntimeError, match="client is closed"):
            ac.stream()

    asyncio.run(main())


# ---------------------------------------------------------------- inputs and arguments

class _ArrayLike:
    """An array-like with no ``dtype`` attribute (a DataFrame, a wrapper): numpy reads it
    through ``__array__``."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a


NOT_ARRAYS = [
    ([], "empty list: pass None"),
    ((), "empty tuple: pass None"),
    ({}, "empty mapping: pass None"),
    ([[0.0] * 4] * 3, "item 0 is a list, not an array: a list holds one array per input"),
    ([1.0, 2.0], "item 0 is a float, not an array"),
    ([np.zeros(3, np.float32), [1.0]], "item 1 is a list, not an array"),
    ({"data": [[0.0, 1.0]]}, "input 'data' is a list, not an array"),
    ({0: np.zeros(3, np.float32)}, "input name 0 is not a string"),
    (1.5, "inputs is a float, not an array"),
    ("x", "inputs is a str, not an array"),
    # arrays of no numbers (an object array was sent as its objects' addresses)
    (np.array([object(), "x"], dtype=object), "input 0 has dtype object: not numbers"),
    ({"data": np.array(["a", "b"])}, "input 'data' has dtype <U1: not numbers"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), "has dtype datetime64[D]"),
    # an array-like without a dtype of its own (a DataFrame of strings): what it becomes
    # (its strings' addresses went out, or 'str96' bytes)
    (_ArrayLike(np.array([["x", "y"]], dtype=object)), "input 0 has dtype object"),
    (_ArrayLike(np.array(["ab", "cd"])), "input 0 has dtype <U2"),
]


@pytest.mark.parametrize("inputs,said", NOT_ARRAYS, ids=[said for _, said in NOT_ARRAYS])
def test_inputs_that_are_not_arrays_are_refused_before_sending(inputs, said):
    """Only None sends no inputs: an empty list, tuple or mapping is ``InvalidRequest``
    saying what to pass (it was sent as no inputs, and ran on zeros); an input that is
    not an array (a nested list of numbers was read as a list of several inputs, and
    answered "input 'input0' is not one of [...]") is ``InvalidRequest`` saying to pass
    a numpy array. Both clients and a stream refuse it before anything is sent (nothing
    listens at the address) and a stream keeps nothing of it."""
    with clockwork.Client("127.0.0.1:1", timeout=5) as c:
        with pytest.raises(InvalidRequest, match="resnet50_v2: ") as e:
            c.infer("resnet50_v2", inputs)
        assert said in str(e.value) and e.value.reason == "bad_input"
        assert e.value.status == 6 and e.value.model == "resnet50_v2"

    async def main():
        async with clockwork.AsyncClient("127.0.0.1:1", timeout=5) as c:
            with pytest.raises(InvalidRequest) as e:
                await c.infer("resnet50_v2", inputs)
            assert said in str(e.value)
            s = c.stream()
            with pytest.raises(InvalidRequest) as e:
                s.submit("resnet50_v2", inputs)
            assert said in str(e.value) and s.outstanding == 0
            s._call.cancel()

    asyncio.run(main())


def test_arrays_of_every_accepted_form_are_sent(cluster):
    """What the contract accepts still goes: one array, a list or tuple of one, a
    mapping by the model's input name, a numpy scalar-shaped array, and None."""
    x = np.zeros((3, 224, 224), np.float32)
    with clockwork.Client(cluster.address, timeout=10) as c:
        for inputs in (x, [x], (x,), {"data": x}, x[None], None):
            assert c.infer("resnet50_v2", inputs, slo_ms=5000).status == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 2e6, "x", True, None,
                                 10**400], ids=lambda v: repr(v)[:20])
def test_a_bad_stream_interval_is_refused_naming_it(bad):
    """``stream(interval_us=)`` is a finite number of microseconds from 0 to a second;
    anything else is a ValueError naming interval_us and the range (nan and inf raised
    numpy's or Python's own errors about converting floats, a string a TypeError)."""
    async def main():
        async with clockwork.AsyncClient("127.0.0.1:1", timeout=5) as c:
            with pytest.raises(ValueError) as e:
                c.stream(interval_us=bad)
            assert "interval_us must be a number of microseconds from 0" in str(e.value)
            assert f"got {bad!r}" in str(e.value)
            s = c.stream(interval_us=1000)  # a good one still makes a stream
            assert s.outstanding == 0
            await s.close()

    asyncio.run(main())


def test_a_wrong_port_or_tls_on_one_side_is_named():
    """The client pointed at a gRPC server that is not a controller (a worker's port)
    says it may not be a controller's port; ``grpcs://`` to a controller without TLS
    says the TLS handshake failed and why that happens. Both said only "controller
    unavailable" / "is it running?" before."""
    from tests.inprocess import serve_in_process
    from worker.service import WorkerNode

    async def main():
        address, stop, served = await serve_in_process(WorkerNode(1, 4))
        try:
            def call(url):
                with clockwork.Client(url, timeout=5) as c:
                    with pytest.raises(ControllerUnavailable) as e:
                        c.infer("resnet50_v2")
                return str(e.value)

            return (await asyncio.to_thread(call, address),
                    await asyncio.to_thread(call, f"grpcs://{address}"))
        finally:
            stop.set()
            await served

    plain, tls = asyncio.run(main())
    assert "UNIMPLEMENTED" in plain and "is that a clockwork controller's port?" in plain, plain
    assert "the TLS handshake failed: TLS on one side only" in tls, tls
    # a host whose name holds "tls" that does not resolve is not a TLS failure
    with clockwork.Client("ctrl-tls-ssl.invalid:12346", timeout=5) as c:
        with pytest.raises(ControllerUnavailable) as e:
            c.infer("resnet50_v2")
    assert "TLS handshake" not in str(e.value) and "is it running" in str(e.value), e.value


def test_closing_an_async_client_fails_its_waiting_calls_as_unavailable():
    """``AsyncClient.close()`` while a call waits (here on a server that never answers):
    the call raises ``ControllerUnavailable`` saying the client was closed, and the
    caller's task is not left cancelled. (It raised ``CancelledError``, which passes an
    ``except Exception``.) A cancellation of the caller's own task stays one."""
    with _first_bytes() as (address, _, connected):
        async def main():
            ac = clockwork.AsyncClient(address, timeout=30)
            call = asyncio.create_task(ac.stats())
            assert await asyncio.to_thread(connected.wait, 10)
            await ac.close()
            with pytest.raises(ControllerUnavailable, match="the client was closed while "
                                                             "the call waited"):
                await call
            assert not call.cancelled()

        asyncio.run(main())
    with _first_bytes() as (address, _, connected):
        async def mine():
            ac = clockwork.AsyncClient(address, timeout=30)
            call = asyncio.create_task(ac.stats())
            assert await asyncio.to_thread(connected.wait, 10)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await ac.close()

        asyncio.run(mine())


def test_closing_an_async_client_fails_calls_waiting_for_a_call_slot_alike(monkeypatch):
    """Calls beyond the client's ``MAX_UNARY_CALLS`` wait for a slot; closed meanwhile,
    they raise ``ControllerUnavailable`` as the calls in flight do (they took the slot
    after the close and raised gRPC's own ``UsageError: Channel is closed``)."""
    import clockwork.client

    monkeypatch.setattr(clockwork.client, "MAX_UNARY_CALLS", 1)
    with _first_bytes() as (address, _, connected):
        async def main():
            ac = clockwork.AsyncClient(address, timeout=30)
            calls = [asyncio.create_task(ac.stats()) for _ in range(3)]
            assert await asyncio.to_thread(connected.wait, 10)
            await ac.close()
            return await asyncio.gather(*calls, return_exceptions=True)

        got = asyncio.run(main())
    assert [type(e) for e in got] == [ControllerUnavailable] * 3, got


def test_an_async_client_made_outside_any_event_loop_says_where_to_make_it():
    """Made after an ``asyncio.run()`` ended, outside any loop: a RuntimeError saying to
    make it inside the running loop (it was gRPC's own 'There is no current event loop
    in thread ...', raised from deep inside grpc.aio). A process of its own: the test
    runner's thread may hold a loop."""
    code = ("import asyncio, clockwork\n"
            "async def f(): pass\n"
            "asyncio.run(f())\n"
            "try:\n"
            "    clockwork.AsyncClient('127.0.0.1:1', timeout=1)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.startswith("make the AsyncClient inside a running event loop"), r


def test_an_async_client_made_on_a_loop_in_another_thread_says_so():
    """An ``AsyncClient`` made on an event loop running in another thread than the one
    using it: a call and a stream raise a RuntimeError naming the cause (a call raised
    gRPC's 'attached to a different loop'; a stream's requests never resolved, then
    failed 'the stream's call failed')."""
    other = asyncio.new_event_loop()
    t = threading.Thread(target=other.run_forever, daemon=True)
    t.start()

    async def make():
        return clockwork.AsyncClient("127.0.0.1:1", timeout=5)

    ac = asyncio.run_coroutine_threadsafe(make(), other).result(10)

    async def main():
        with pytest.raises(RuntimeError, match="made in another event loop"):
            ac.stream()
        with pytest.raises(RuntimeError, match="made in another event loop"):
            await ac.infer("resnet50_v2", slo_ms=100)

    try:
        asyncio.run(main())
    finally:
        other.call_soon_threadsafe(other.stop)
        t.join(10)


def _refused_from_a_new_loop(client) -> None:
    """A call and a stream of ``client`` from a new ``asyncio.run`` raise the RuntimeError
    that says it was made in another event loop."""
    async def infer():
        return await client.infer("resnet50_v2", slo_ms=2000)

    async def stream():
        return client.stream()

    for use in (infer, stream):
        with pytest.raises(RuntimeError, match="made in another event loop"):
            asyncio.run(use())


def test_an_async_client_used_from_another_event_loop_says_so(cluster):
    """An AsyncClient belongs to the event loop it was made in: a call or a stream from a
    later ``asyncio.run`` raises a RuntimeError that says so (gRPC's own: 'Event loop is
    closed', with coroutines never awaited); in its own loop it works, close() included."""
    async def make():
        c = clockwork.AsyncClient(cluster.address, timeout=20)
        assert (await c.infer("resnet50_v2", slo_ms=2000)).status == 0
        return c

    client = asyncio.run(make())
    _refused_from_a_new_loop(client)

    async def own():  # the same client made and used in one loop, then closed there
        async with clockwork.AsyncClient(cluster.address, timeout=20) as c:
            s = c.stream()
            assert (await s.submit("resnet50_v2", slo_ms=2000)).status == 0
            await s.close()
            return (await c.infer("resnet50_v2", slo_ms=2000)).status

    assert asyncio.run(own()) == 0

    # made outside any loop (at a module's top, say), used from asyncio.run: said the
    # same (a raw "attached to a different loop" from gRPC, and its stream blamed the
    # controller); made outside a loop and used in the thread's own loop: it works
    loop = asyncio.new_event_loop()  # (the thread's loop, as at a program's start)
    asyncio.set_event_loop(loop)
    outside = clockwork.AsyncClient(cluster.address, timeout=20)
    _refused_from_a_new_loop(outside)
    try:
        assert loop.run_until_complete(
            outside.infer("resnet50_v2", slo_ms=2000)).status == 0
        loop.run_until_complete(outside.close())
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_a_rest_port_given_as_the_controller_is_named_as_such():
    """An HTTP/1.1 server's port (the controller's REST --http-port, say) given to the
    client: the error says that port speaks HTTP/1.1 and names the gRPC ports (it said
    "is it running, and listening there?" of a controller that was)."""
    import http.server
    import threading

    from clockwork.errors import ControllerUnavailable

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with clockwork.Client(f"http://127.0.0.1:{server.server_port}", timeout=10) as c:
            with pytest.raises(ControllerUnavailable) as e:
                c.stats()
        assert "speaks HTTP/1.1, not gRPC" in str(e.value) and "--kserve-port" in str(e.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_bad_copies_count_is_refused_naming_the_controllers_bound():
    """``load_model(copies=0)`` is refused before anything is sent, naming the bound the
    controller applies (1,024 a load), not the wire's 2,147,483,647, in the controller's
    own words (a count past the wire's said "an integer >= 1 (a load makes at most
    1,024)", one under it "an integer from 1 to 1024")."""
    from clockwork.errors import InvalidRequest

    with clockwork.Client("127.0.0.1:1", timeout=5) as c:
        for bad in (0, -3, True, 2.5, 2**31):
            with pytest.raises(InvalidRequest, match=(
                    f"^m: copies must be an integer from 1 to 1024, got {bad!r}$")):
                c.load_model("m", copies=bad)


def test_a_client_certificate_without_its_key_is_refused_not_an_abort():
    """tls_cert without tls_key (or the key alone) is a SecurityError naming both:
    gRPC's core aborted the whole process (a failed check, SIGABRT, exit 134)."""
    code = """
import sys, clockwork
from clockwork.protocol.security import SecurityError
for kw in ({"tls_cert": sys.argv[1]}, {"tls_key": sys.argv[1]}):
    for make in (clockwork.Client, clockwork.AsyncClient):
        try:
            make("127.0.0.1:1", tls=True, **kw)
        except SecurityError as e:
            print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code, __file__], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and all("tls_cert and tls_key go together" in x for x in lines), \
        r.stdout


def test_a_stream_request_with_a_since_ns_that_is_no_clock_reading_is_refused(cluster):
    """``since_ns`` must be an integer time.monotonic_ns() reading: a float (or a number
    out of range) is a ValueError at submit, and the stream's other requests are
    answered (it was raised inside the stream's writer: the whole stream ended, every
    request "closed by the client")."""
    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=30) as c:
            s = c.stream()
            others = [s.submit("mobilenet_v2", slo_ms=2000) for _ in range(3)]
            for bad in (time.monotonic() * 1e9, -(1 << 63), "1", True):
                with pytest.raises(ValueError, match="since_ns must be"):
                    s.submit("mobilenet_v2", slo_ms=2000, since_ns=bad)
            ok = s.submit("mobilenet_v2", slo_ms=2000, since_ns=time.monotonic_ns())
            answers = await asyncio.gather(*others, ok)
            assert [a.status for a in answers] == [0] * 4
            await s.close()

    asyncio.run(main())



def test_an_slo_cut_short_by_the_clients_timeout_says_so():
    """A client timeout shorter than the SLO cuts the request's SLO at the controller
    (its call ends then): a request that cannot be served within what is left of the
    call is answered TIMEOUT, reason ``call_deadline``, saying the client's timeout
    made it so (it said "SLO cannot be met" of a 5 s SLO it could have met)."""
    with local_cluster(workers=1, gpus=1, models="vgg16") as c:
        got = []
        with clockwork.Client(c.address, timeout=0.03) as cl:  # vgg16: LOAD 43 ms, EXEC 9
            for _ in range(5):
                try:
                    cl.infer("vgg16", slo_ms=5000)
                    got.append("ok")
                except clockwork.errors.InferenceTimeout as e:
                    assert "within the call's deadline" in str(e) and "5000 ms" in str(e), e
                    got.append(e.reason)
                except clockwork.errors.ControllerUnavailable:
                    got.append("client timeout")  # (the answer came too late for the call)
        assert "call_deadline" in got and set(got) <= {"call_deadline", "client timeout"}, got
        # without an SLO of its own: the one it runs under is named (it said "its SLO 0 ms")
        said = []
        with clockwork.Client(c.address, timeout=0.03) as cl:
            for _ in range(5):
                with contextlib.suppress(clockwork.errors.ControllerUnavailable):
                    try:
                        cl.infer("vgg16")
                    except clockwork.errors.InferenceTimeout as e:
                        said.append(str(e))
        assert said and all("its SLO 100 ms, the controller's default" in x for x in said), said


def test_a_results_repr_shows_its_outputs_shapes_not_their_values():
    from clockwork.client import InferResult

    r = InferResult("resnet50_v2", {"output": np.zeros((1, 1000), np.float32)}, 1.5, 0.75)
    assert repr(r) == ("InferResult(model='resnet50_v2', outputs={output: float32[1, 1000]}, "
                       "latency_ms=1.500, server_latency_ms=0.750, batch_size=0, gpu=-1, "
                       "cold=False, status=0)")


def test_both_clients_have_the_same_methods(cluster):
    """The two clients are twins: every public method of one is the other's but the
    asyncio one's streams (AsyncClient had no model_status, Client no list_models_raw),
    and those two answer alike."""
    def public(cls):
        return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    # (a stream is asyncio's alone)
    assert public(clockwork.Client) == public(clockwork.AsyncClient) - {"stream"}
    with clockwork.Client(cluster.address, timeout=20) as c:
        st = c.model_status("resnet50_v2")
        raw = c.list_models_raw()

    async def main():
        async with clockwork.AsyncClient(cluster.address, timeout=20) as ac:
            return await ac.model_status("resnet50_v2"), await ac.list_models_raw()

    ast, araw = asyncio.run(main())
    assert st.known and ast.known and st.model.name == ast.model.name == "resnet50_v2"
    assert {m.name for m in raw.models} == {m.name for m in araw.models}


def test_more_unary_calls_than_a_connection_takes_wait_in_the_async_client():
    """6,000 AsyncClient.infer at once on one client: the controller takes 4,096 streams
    a connection and refused the rest, which failed ControllerUnavailable ("RST_STREAM
    ... 7", hundreds to over a thousand of them) although the controller was healthy; the
    contract says they wait in the client. (Liveness probes off: a worker starved of CPU
    by the burst on two cores would be suspect, its requests answered no_worker.)"""
    with local_cluster(workers=1, gpus=1, models="mobilenet_v2",
                       controller_args=["--set", "liveness=false"]) as cl:
        async def main():
            async with clockwork.AsyncClient(cl.address, timeout=120) as c:
                got = await asyncio.gather(
                    *(c.infer("mobilenet_v2", slo_ms=60_000) for _ in range(6000)),
                    return_exceptions=True)
            return collections.Counter(type(r).__name__ + ("" if type(r).__name__ == "InferResult"
                                                           else f": {str(r)[:200]}")
                                       for r in got)

        got = asyncio.run(main())
    assert got == {"InferResult": 6000}, got  # (with each failure's message)


def test_a_stream_answer_read_past_the_default_slo_is_late_as_with_an_slo():
    """On a stream, a success read here after the request's SLO is reported TIMEOUT
    ``late``; a request without an SLO of its own is measured against the controller's
    default (it stayed a success however late: only requests with an SLO were checked).
    The client's event loop is held after the request went out, so the answer is read
    late; the controller answered it in time."""
    import time

    with local_cluster(workers=1, gpus=1, models="mobilenet_v2",
                       controller_args=["--default-slo-ms", "300"]) as c:

        async def main():
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                s = cl.stream()
                first = await asyncio.wait_for(s.submit("mobilenet_v2", slo_ms=5000), 10)
                assert first.status == 0  # (loaded; the default SLO is said by now)
                got = []
                # (SLOs a loaded machine still meets: a tighter one was answered TIMEOUT
                # by the controller itself now and then, not read late)
                for slo in (0, 250):  # the default, then one of its own
                    fut = s.submit("mobilenet_v2", slo_ms=slo)
                    while s._queue:  # until it has gone out
                        await asyncio.sleep(0)
                    time.sleep(0.8)  # the answer comes meanwhile, read after
                    got.append(await asyncio.wait_for(fut, 10))
                await s.close()
                return got

        default, own = asyncio.run(main())
    assert (default.status, default.reason) == (4, "late"), default
    assert "past its 300 ms SLO (the controller's default)" in default.message, default.message
    assert (own.status, own.reason) == (4, "late") and "past its 250 ms SLO" in own.message, own


def test_a_call_the_controllers_grpc_server_cancels_is_a_shutdown():
    """A call that reaches the controller while it stops may be ended by gRPC's server
    with ``CANCELLED`` (not by the controller's ``shutdown`` answer): the client raises
    ``ControllerUnavailable`` with reason ``shutdown``, as for the calls the controller
    ends (it said only "controller unavailable: StatusCode.CANCELLED: CANCELLED",
    reason empty). A cancel of the client's own is not one."""
    from clockwork.client import _unavailable
    from clockwork.errors import STOPPING_MESSAGE

    def ended(details: str):
        return _unavailable(grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, None, None,
                                                 details))

    e = ended("CANCELLED")
    assert isinstance(e, ControllerUnavailable) and e.reason == "shutdown", e
    assert STOPPING_MESSAGE in str(e), e
    assert ended("Locally cancelled by application!").reason != "shutdown"


def test_an_async_call_waiting_for_a_call_slot_is_charged_that_wait(monkeypatch):
    """``AsyncClient.infer`` calls beyond ``MAX_UNARY_CALLS`` (here 1) wait in the client;
    that wait is sent (``queued_ns``), so that the controller counts the SLO from the
    call as the client's own check of a late answer does: a call that waited past its
    SLO is not run and counted a success by the controller while the client raised
    ``InferenceTimeout`` 'late' for it (2,006 of 9,000 such at 9,000 calls at once)."""
    import clockwork.client

    monkeypatch.setattr(clockwork.client, "MAX_UNARY_CALLS", 1)
    with local_cluster(workers=1, gpus=1, models="resnet50_v2") as c:
        async def main():
            async with clockwork.AsyncClient(c.address, timeout=30) as ac:
                await ac.infer("resnet50_v2", slo_ms=1000)  # (warm)
                before = await ac.stats()
                got = await asyncio.gather(*[ac.infer("resnet50_v2", slo_ms=100)
                                             for _ in range(60)], return_exceptions=True)
                return got, before, await ac.stats()

        got, before, after = asyncio.run(main())
    ok = sum(not isinstance(g, BaseException) for g in got)
    late = [g for g in got if isinstance(g, InferenceTimeout)]
    assert ok + len(late) == 60, got  # (one at a time: the last ones waited > 100 ms)
    assert 0 < ok < 60 and late, (ok, late[:1])
    ran = after.get("requests_success", 0) - before.get("requests_success", 0)
    assert ran <= ok + 2, (ran, ok)  # (an answer sent just in time may arrive late)


def test_a_call_racing_close_from_another_thread_is_a_closed_client_error():
    """A call that read the stub just before ``close()`` (from another thread) closed its
    channel: ``ControllerUnavailable`` as for a call that waited (gRPC's plain
    ``ValueError``, "Cannot invoke RPC on closed channel!", escaped: a bad argument's
    exception, to a caller)."""
    c = clockwork.Client("127.0.0.1:1", timeout=5)
    c._channel.close()  # (the race's window: the channel closed, the stub not yet swapped)
    with pytest.raises(ControllerUnavailable, match="the client was closed"):
        c.stats()
    c.close()
    with pytest.raises(RuntimeError, match="the client is closed"):
        c.stats()


_FORKED_CHILD = """
import os, sys
import clockwork
c = clockwork.Client("127.0.0.1:1", timeout=5)
pid = os.fork()
if pid == 0:
    try:
        c.stats()
    except RuntimeError as e:
        os._exit(0 if "forked" in str(e) else 3)
    except BaseException:
        os._exit(4)
    os._exit(5)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


_FORKED_ASYNC_CHILD = """
import asyncio, os, sys
import clockwork

async def made():
    return clockwork.AsyncClient("127.0.0.1:1", timeout=5)

c = asyncio.run(made())
pid = os.fork()
if pid == 0:
    async def use():
        await c.stats()
    try:
        asyncio.run(use())
    except RuntimeError as e:
        os._exit(0 if "forked" in str(e) and "make an AsyncClient" in str(e) else 3)
    except BaseException:
        os._exit(4)
    os._exit(5)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_an_async_client_used_in_a_forked_child_says_it_was_forked():
    """An ``AsyncClient`` made before ``fork()`` and called in the child is
    ``RuntimeError`` naming the fork (it said the client was made in another event loop:
    true of the child's loop, but not the cause)."""
    r = subprocess.run([sys.executable, "-c", _FORKED_ASYNC_CHILD], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_client_used_in_a_forked_child_says_to_make_one_there():
    """A ``Client`` made before ``fork()`` and called in the child is ``RuntimeError``
    saying to make one in that process (gRPC's connection does not survive a fork: such
    calls hung past their timeout, or crashed the child)."""
    r = subprocess.run([sys.executable, "-c", _FORKED_CHILD], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)


def test_a_blocking_client_shared_by_many_threads_makes_refused_streams_again():
    """A ``Client`` shared by more threads than the controller takes streams on one
    connection, the controller held up meanwhile (SIGSTOP): the controller refuses some
    streams unread (HTTP/2 REFUSED_STREAM), which are safe to make again, as an
    ``AsyncClient`` does; the blocking client raised ControllerUnavailable ("Stream
    removed") for them (22 of 60 here)."""
    n = 60
    with local_cluster(models="mobilenet_v2", http_port=-1,
                       controller_args=["--limit", "grpc_max_streams_per_connection=8"]) as c, \
            clockwork.Client(c.address, timeout=60) as cl:
        assert cl.infer("mobilenet_v2", slo_ms=1000).status == 0
        got: collections.Counter = collections.Counter()
        lock, start = threading.Lock(), threading.Barrier(n + 1)

        def one() -> None:
            start.wait()
            try:
                what = cl.infer("mobilenet_v2", slo_ms=30_000).status
            except Exception as e:  # noqa: BLE001 - counted by kind
                what = f"{type(e).__name__}: {e}"[:200]
            with lock:
                got[what] += 1

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        pid = c.controller.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            start.wait()
            time.sleep(1.0)  # (the controller held up while the calls are made)
        finally:
            os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(60)
    assert got == {0: n}, got
