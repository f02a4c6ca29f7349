"""Misbehaving clients and workers against a live controller (real processes on loopback,
real clients): the controller stays up, its memory stays bounded, other clients keep
being served, and every request is answered exactly once.

Each test measures healthy clients (4 concurrent unary ``Infer`` calls in a closed loop,
model ``small``) without the fault, then with it, and checks the p99 latency with the
fault against ``_p99_bound`` of the one without. The controller's memory is its VmRSS
from /proc. The figures are printed (``pytest -s``)."""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import clockwork  # noqa: E402
from clockwork.cluster.local import _Child, _cli  # noqa: E402
from clockwork.errors import ClockworkError, Overloaded  # noqa: E402
from clockwork.protocol import clockwork_pb2 as pb  # noqa: E402
from clockwork.protocol import clockwork_pb2_grpc as pbg  # noqa: E402
from clockwork.protocol.versions import PROTOCOL  # noqa: E402
from tests.conftest import local_cluster  # noqa: E402

pytestmark = pytest.mark.faults

MiB = 1 << 20
STATUS_KEYS = ("requests_success", "requests_timeout", "requests_error",
               "requests_invalid_request", "requests_overloaded")


# The 200,000-request message keeps both cores busy for ~3 s (the controller admitting
# and answering it, the flood client reading the answers): every process waits for CPU,
# and a request crosses four of them. Its p99 bound is absolute, and the discriminating
# check is that no healthy call runs into its gRPC deadline (SLO + 1 s). Measured over
# seven runs: admitted whole, the message held the event loop ~3 s (88 healthy calls
# answered in 4 s, 16 of them at their deadline, p99 1,106 ms); in slices of 1,000 p99
# 175-890 ms, worst 0.42-1.04 s; in slices of 100 (the default) p99 245-553 ms, worst
# 0.37-0.75 s.
SATURATED_P99_MS = 1000.0


def _p99_bound(base_p99: float) -> float:
    """How much worse the healthy clients' p99 may be while a fault runs, in ms: four
    times the p99 without it plus 50 ms (two shared cores run the controller, a worker,
    the clients and the fault; without the bounds these tests check, the same faults cost
    seconds, or the controller)."""
    return 4 * base_p99 + 50.0


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> Path:
    """A profile set with fast models: ``small`` (16-byte outputs), ``big`` (256 KiB
    outputs: replies that fill memory fast) and ``slow`` (20 ms per batch)."""
    d = tmp_path_factory.mktemp("profiles")
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    for name, out, exec1 in (("small", 4, 800_000), ("big", 65536, 800_000),
                             ("slow", 4, 20_000_000)):
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": MiB, "load_ns": 2_000_000,
            "exec_ns": {str(b): exec1 + 50_000 * b for b in (1, 2, 4, 8, 16)},
            "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": [out], "dtype": "float32"}]}))
    return d


def _cluster(profiles: Path, *limits: str, args: tuple = (), **kw):
    argv = [x for lim in limits for x in ("--limit", lim)] + list(args)
    return local_cluster(workers=1, gpus=2, profiles=str(profiles), controller_args=argv,
                         **kw)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class Healthy:
    """Closed-loop unary clients; every call's latency (ms) and outcome is recorded: a
    call that returns or raises a ``ClockworkError`` has been answered once."""

    def __init__(self, address: str, conc: int = 4, model: str = "small") -> None:
        self.address, self.conc, self.model = address, conc, model
        self.lat: list[float] = []
        self.outcomes: dict[str, int] = {}
        self.errors: list[str] = []  # the first few, for the report
        self.sent = 0

    async def run(self, seconds: float) -> Healthy:
        async with clockwork.AsyncClient(self.address, timeout=10) as c:
            end = time.monotonic() + seconds

            async def loop() -> None:
                while time.monotonic() < end:
                    self.sent += 1
                    t0 = time.perf_counter()
                    try:
                        await c.infer(self.model, slo_ms=100)
                        what = "ok"
                    except ClockworkError as e:
                        what = type(e).__name__
                        if len(self.errors) < 3:
                            self.errors.append(str(e))
                    self.lat.append((time.perf_counter() - t0) * 1e3)
                    self.outcomes[what] = self.outcomes.get(what, 0) + 1

            await asyncio.gather(*(loop() for _ in range(self.conc)))
        assert len(self.lat) == self.sent == sum(self.outcomes.values())
        return self

    def p(self, q: float) -> float:
        return float(np.percentile(self.lat, q))

    def text(self) -> str:
        return (f"n={len(self.lat)} p50={self.p(50):.1f} ms p99={self.p(99):.1f} ms "
                f"max={max(self.lat):.1f} ms {self.outcomes} {self.errors}")


async def _baseline(address: str) -> Healthy:
    await Healthy(address).run(1.0)  # warm: models loaded, connections up
    return await Healthy(address).run(2.0)


async def _settled(address: str, timeout: float = 10.0) -> dict[str, int]:
    """The controller's counters once nothing is outstanding; checks that every request
    it counted has exactly one answer."""
    async with clockwork.AsyncClient(address, timeout=10) as c:
        end = time.monotonic() + timeout
        while True:
            r = await c._stub.Stats(pb.StatsRequest())
            if r.outstanding == 0 or time.monotonic() > end:
                break
            await asyncio.sleep(0.05)
    counters = dict(r.counters)
    assert r.outstanding == 0, f"{r.outstanding} requests never answered: {counters}"
    assert counters.get("replies_duplicate", 0) == 0
    assert counters.get("requests", 0) == sum(counters.get(k, 0) for k in STATUS_KEYS), counters
    return counters


def _report(name: str, base: Healthy, fault: Healthy, bound: float | None = None,
            **figures) -> None:
    """Print the figures; check the healthy p99 with the fault against ``bound`` (ms;
    default ``_p99_bound`` of the p99 without it)."""
    bound = _p99_bound(base.p(99)) if bound is None else bound
    more = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in figures.items())
    print(f"\n[{name}] healthy without the fault: {base.text()}\n"
          f"[{name}] healthy with the fault:    {fault.text()}\n[{name}] {more} "
          f"p99_bound_ms={bound:.1f}")
    assert fault.p(99) <= bound, f"healthy p99 {fault.p(99):.1f} ms > bound {bound:.1f} ms"


# ---------------------------------------------------------------------- slow reader


def test_client_that_never_reads_is_cut_off_and_memory_stays_bounded(profiles):
    """An InferStream client sends 1,000 requests for ``big`` (256 KiB replies: 250 MiB in
    all) and never reads. Its replies are buffered up to stream_reply_buffer_bytes (16 MiB
    here), then the stream is ended with RESOURCE_EXHAUSTED, the buffer freed and the
    rest of its replies discarded (each request still answered once inside). Without the
    cap the controller grew by ~570 MiB in 3 s on the development machine."""
    cap = 16 * MiB
    with _cluster(profiles, f"stream_reply_buffer_bytes={cap}") as c:
        pid = c.controller.proc.pid

        async def main():
            base = await _baseline(c.address)
            rss0 = _rss_mb(pid)
            ch = grpc.aio.insecure_channel(c.address)
            sent = 0

            async def requests():
                nonlocal sent
                for _ in range(100):
                    yield pb.InferRequestBatch(requests=[
                        pb.InferRequest(model="big", slo_ms=100, client_id=sent + k + 1)
                        for k in range(10)])
                    sent += 10
                    await asyncio.sleep(0.01)
                await asyncio.Event().wait()  # keep the stream open, never read

            call = pbg.ClockworkStub(ch).InferStream(requests())
            seen = [rss0]
            w = asyncio.create_task(_peak_rss(pid, seen))
            fault = await Healthy(c.address).run(3.0)
            w.cancel()
            peak = seen[0]
            rss1 = _rss_mb(pid)
            # the stream was ended: reading it now gives what was in flight, then the status
            got = 0
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for b in call:
                    got += len(b.responses)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "not reading its replies" in err.value.details()
            await ch.close()
            counters = await _settled(c.address)
            assert counters["streams_slow_reader"] == 1
            _report("slow reader", base, fault, rss_before_mb=rss0, rss_peak_mb=peak,
                    rss_after_mb=rss1, sent=sent, read_after_cut=got,
                    discarded=counters.get("replies_discarded", 0))
            assert counters.get("replies_discarded", 0) >= 1
            assert peak - rss0 < cap / MiB + 48, "controller memory grew past the cap"

        asyncio.run(asyncio.wait_for(main(), 60))


async def _peak_rss(pid: int, seen: list) -> None:
    """Keep ``seen[0]`` the largest RSS (MiB) of process ``pid`` found, until cancelled."""
    while True:
        seen[0] = max(seen[0], _rss_mb(pid))
        await asyncio.sleep(0.02)


async def _unread_flood(address: str, pid: int, streams: int, slow_readers: int) -> float:
    """``streams`` InferStream calls each send 300,000 requests for a model not served
    (each answered at once, a reply of ~80 bytes) and never read them, until the
    controller has cut ``slow_readers`` streams: how much its memory grew (MiB, peak)."""
    await _baseline(address)
    rss0 = _rss_mb(pid)
    ch = grpc.aio.insecure_channel(address)

    async def requests():
        for i in range(300):
            yield pb.InferRequestBatch(requests=[
                pb.InferRequest(model="nosuch", client_id=1000 * i + k + 1)
                for k in range(1000)])
            await asyncio.sleep(0)
        await asyncio.Event().wait()  # keep the stream open, never read

    calls = [pbg.ClockworkStub(ch).InferStream(requests()) for _ in range(streams)]
    seen = [rss0]
    w = asyncio.create_task(_peak_rss(pid, seen))
    async with clockwork.AsyncClient(address, timeout=10) as cl:
        while (await cl.stats()).get("streams_slow_reader", 0) < slow_readers:
            await asyncio.sleep(0.05)
    w.cancel()
    peak = seen[0]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await ch.close()
    return peak - rss0


@pytest.mark.parametrize("limit,streams", [("stream_reply_buffer_bytes", 1),
                                           ("replies_buffer_bytes", 3)])
def test_clients_that_never_read_tiny_replies_are_cut_off_within_the_bound(profiles, limit,
                                                                          streams):
    """Streams whose clients never read their ~80-byte replies. The replies waiting are
    counted with what holding each costs in memory (1 KiB), so one stream is cut once
    they hold about stream_reply_buffer_bytes (8 MiB here): the controller grew by 6 MiB
    (counted by their encoded size alone, ~100,000 of them were held first, and it grew by
    69 MiB). Three streams, each allowed 64 MiB, all together 8 MiB
    (replies_buffer_bytes): each is cut at its share, and the controller grew by ~13 MiB,
    not by three streams' worth (118 MiB without the bound of all)."""
    cap = 8 * MiB
    with _cluster(profiles, f"{limit}={cap}") as c:
        grew = asyncio.run(asyncio.wait_for(
            _unread_flood(c.address, c.controller.proc.pid, streams, streams), 120))
        print(f"{streams} unread stream(s): the controller grew by {grew:.0f} MiB")
        assert grew < cap / MiB + 24, f"the controller grew by {grew:.0f} MiB"


# ---------------------------------------------------------------------- huge REST body


def test_rest_body_of_200_mb_is_refused_at_once(profiles):
    """A REST request announcing a 200 MB body is answered 413 as soon as its head is
    read (rest_max_body_bytes, 64 MiB by default), while the client is still sending;
    what it sends is drained, not kept. Healthy gRPC and REST clients carry on."""
    size = 200 * 1000 * 1000
    with _cluster(profiles, http_port=0) as c:
        pid = c.controller.proc.pid
        host, port = c.printed_address("http").rsplit(":", 1)

        async def main():
            base = await _baseline(c.address)
            rss0 = _rss_mb(pid)
            box: dict = {}

            def big_request() -> None:
                s = socket.create_connection((host, int(port)))
                s.sendall(b"POST /v2/models/small/infer HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\n"
                          + f"Content-Length: {size}\r\n\r\n".encode())
                t0 = time.monotonic()
                chunk = bytes(MiB)

                def send() -> None:
                    n = 0
                    try:
                        while n < size:
                            n += s.send(chunk[:min(MiB, size - n)])
                    except OSError:
                        pass
                    box["sent"] = n

                th = threading.Thread(target=send)
                th.start()
                head = b""
                while b"\r\n\r\n" not in head:
                    more = s.recv(4096)
                    if not more:
                        break
                    head += more
                box["answer_s"] = time.monotonic() - t0
                box["status"] = head.split(b" ", 2)[1] if head else b""
                th.join(10)
                s.close()

            t = asyncio.get_running_loop().run_in_executor(None, big_request)
            fault = await Healthy(c.address).run(2.0)
            await t
            rss1 = _rss_mb(pid)
            # the REST front end still answers
            rest = await asyncio.get_running_loop().run_in_executor(None, _rest_infer, host,
                                                                    int(port))
            counters = await _settled(c.address)
            _report("200 MB REST body", base, fault, answer_ms=box["answer_s"] * 1e3,
                    client_sent_mb=box.get("sent", 0) / 1e6, rss_before_mb=rss0,
                    rss_after_mb=rss1)
            assert box["status"] == b"413"
            assert box["answer_s"] < 1.0
            assert rss1 - rss0 < 32, "the body was kept in memory"
            assert rest == 200
            assert counters.get("http_413") == 1

        asyncio.run(asyncio.wait_for(main(), 60))


def test_bodies_announced_but_not_sent_take_no_memory(profiles):
    """Twelve REST requests announce bodies of rest_max_body_bytes (64 MiB) and send 10
    bytes of them: the controller holds what arrived, not what was announced (a version
    that made room for the whole body first took 768 MiB for them, held until
    rest_read_timeout), and still answers."""
    with _cluster(profiles, http_port=0) as c:
        host, port = c.printed_address("http").rsplit(":", 1)
        pid = c.controller.proc.pid
        assert _rest_infer(host, int(port)) == 200
        rss0 = _rss_mb(pid)
        socks = []
        try:
            for _ in range(12):
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(b"POST /v2/models/small/infer HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 67108864\r\n"
                          b"\r\n{\"inputs\":")
                socks.append(s)
            # (a request answered after them: the controller has read their heads by now)
            assert _rest_infer(host, int(port)) == 200
            rss1 = _rss_mb(pid)
        finally:
            for s in socks:
                s.close()
        assert rss1 - rss0 < 64, (rss0, rss1)


def test_rest_head_limits_timeouts_and_json_off_the_loop(profiles):
    """The REST server's other bounds: too many headers 400 (aiohttp's parser), a chunked
    body accepted (this one reaches the JSON decoder: 400 not JSON), an idle connection
    closed after rest_idle_timeout_s, a body that does not arrive within
    rest_read_timeout_s 408 and the connection closed at once; an inference body whose
    JSON is over rest_json_offload_bytes (0 here: every one) is decoded in a decoding
    process of the controller's and answered as usual."""
    limits = ("rest_max_headers=10", "rest_idle_timeout_s=0.3", "rest_read_timeout_s=0.3",
              "rest_json_offload_bytes=0")
    with _cluster(profiles, *limits, http_port=0) as c:
        host, port = c.printed_address("http").rsplit(":", 1)

        def exchange(data: bytes) -> tuple[bytes, float]:
            """Send ``data``, read until the server closes: (what it sent, seconds)."""
            with socket.create_connection((host, int(port)), timeout=5) as s:
                t0 = time.monotonic()
                s.sendall(data)
                got = b""
                while more := s.recv(65536):
                    got += more
                return got, time.monotonic() - t0

        head = b"POST /v2/models/small/infer HTTP/1.1\r\nHost: x\r\n"
        many = head + b"".join(b"X-%d: y\r\n" % i for i in range(20)) + b"\r\n"
        got = exchange(many)[0]
        assert got.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), got
        assert got.endswith(b'{"error":"more than 10 headers (rest_max_headers)"}'), got
        chunked = (head + b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n0\r\n\r\n")
        got = exchange(chunked)[0]
        assert got.startswith(b"HTTP/1.1 400 ") and b"not JSON" in got, got
        got, took = exchange(b"")
        assert got == b"" and 0.2 < took < 3.0  # idle: closed without a word
        got, took = exchange(head + b"Content-Length: 100\r\n\r\n{\"inputs\"")
        assert got.startswith(b"HTTP/1.1 408 ") and 0.2 < took < 3.0
        assert _rest_infer(host, int(port)) == 200
        assert any(b"controller.json_offload" in _cmdline(p)
                   for p in _children_of(c.controller.proc.pid))
        with clockwork.Client(c.address, timeout=10) as cl:
            counters = cl.stats()
        assert counters["http_400"] == counters["http_408"] == 1


def test_grpc_message_over_the_receive_limit_is_refused(profiles):
    """grpc_max_receive_bytes bounds a client's message: a larger one fails that call
    with RESOURCE_EXHAUSTED, which the client raises as InvalidRequest (sending it again
    cannot help); the controller and the client's next calls are fine. A limit under the
    4 MiB the client's stream packs requests into is refused."""
    with _cluster(profiles, "grpc_max_receive_bytes=4194304") as c:
        with clockwork.Client(c.address, timeout=10) as cl:
            with pytest.raises(clockwork.errors.InvalidRequest,
                               match="larger than the controller takes in one message: "
                                     ".*RESOURCE_EXHAUSTED|larger than max") as e:
                cl.infer("small", {"x": np.zeros(1_200_000, np.float32)})
            assert e.value.model == "small"  # (it was "" for a request without an SLO)
            assert cl.infer("small", np.zeros(4, np.float32)).status == 0
    from clockwork.settings import SettingsError
    from controller.limits import limits_from_flags

    with pytest.raises(SettingsError, match="grpc_max_receive_bytes"):
        limits_from_flags(["grpc_max_receive_bytes=65536"])


@pytest.mark.parametrize("item", ["grpc_max_receive_bytes=4294967296",
                                  "grpc_max_streams_per_connection=4294967296",
                                  "grpc_max_calls=536870912"])
def test_grpc_limits_past_a_c_int_are_refused_by_name(item):
    """gRPC's server options are C ints (``grpc_max_calls`` four times over): a larger
    value was taken, then the controller's start ended in a traceback (OverflowError
    from grpc.aio.server) instead of one line naming the key."""
    import grpc

    from clockwork.settings import SettingsError
    from controller.limits import limits_from_flags

    with pytest.raises(SettingsError, match=item.split("=")[0]):
        limits_from_flags([item])
    key = item.split("=")[0]
    most = (2**31 - 1) // (4 if key == "grpc_max_calls" else 1)
    ok = limits_from_flags([f"{key}={most}"])

    async def made():  # (the largest taken makes a server)
        grpc.aio.server(options=ok.grpc_server_options())

    asyncio.run(made())


def test_a_request_over_the_receive_limit_on_a_stream_fails_alone(profiles):
    """On a stream, a request larger than grpc_max_receive_bytes is answered
    INVALID_REQUEST (bad_input) by the client itself, which the controller's stream says
    the limit to, and is not sent: the requests before and after it are served (sent,
    gRPC ended the whole stream, and all ~600 failed, as InvalidRequest)."""
    from clockwork.client import AsyncClient

    async def main(address):
        async with AsyncClient(address, timeout=30) as cl:
            s = cl.stream()
            before = [s.submit("small", np.zeros(4, np.float32), slo_ms=30000)
                      for _ in range(50)]
            big = s.submit("small", {"x": np.zeros(3_000_000, np.float32)}, slo_ms=30000)
            after = [s.submit("small", np.zeros(4, np.float32), slo_ms=30000)
                     for _ in range(50)]
            await s.close()
            return [f.result() for f in before + after], big.result()

    with _cluster(profiles, "grpc_max_receive_bytes=8388608") as c:
        served, big = asyncio.run(main(c.address))
    assert [r.status for r in served] == [0] * 100, [r.message for r in served if r.status]
    assert (big.status, big.reason) == (6, "bad_input"), big
    assert "more than the controller takes in one message (8,388,608" in big.message


def _wide_profiles(tmp_path: Path, exec_ns: int) -> Path:
    """A profile set of one model, ``wide``, of 600,000-byte inputs taking ``exec_ns``."""
    d = tmp_path / "wide"
    d.mkdir()
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    (d / "wide.json").write_text(json.dumps({
        "model": "wide", "device": "test", "weights_bytes": MiB, "load_ns": 2_000_000,
        "exec_ns": {"1": exec_ns},
        "inputs": [{"name": "x", "shape": [150_000], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [4], "dtype": "float32"}]}))
    return d


@pytest.mark.parametrize("ids", [(0, 0, 0), (5, (1 << 63) | 1, 6)],
                         ids=["all-zero", "top-bit-set"])
def test_a_stream_that_repeats_client_ids_is_held_to_the_bytes_bound(tmp_path, ids):
    """A stream whose requests all have client id 0 (a client that does not set it), or
    whose invalid request's id has the top bit set (as the controller's own tokens for
    requests with inputs do): an answer gives back its own request's input bytes, not
    another's. A 600 KB request runs; an invalid one is answered; a second 600 KB one is
    turned away (1 MiB bound), not admitted beside the first (the invalid one's answer
    gave back the first's bytes, and the bound held nothing back); the answers carry the
    client's ids."""
    import asyncio

    from clockwork.protocol import clockwork_pb2 as pb
    from clockwork.protocol import clockwork_pb2_grpc as pbg

    def wide(cid: int, model: str = "wide") -> pb.InferRequest:
        r = pb.InferRequest(model=model, slo_ms=20000, client_id=cid)
        if model == "wide":
            r.inputs.add(name="x", dtype="float32", shape=[150_000], data=bytes(600_000))
        return r

    async def main(address):
        sends: asyncio.Queue = asyncio.Queue()

        async def messages():
            while (m := await sends.get()) is not None:
                yield m
        async with grpc.aio.insecure_channel(address) as ch:
            call = pbg.ClockworkStub(ch).InferStream(messages())
            got = []

            async def next_answer():
                batch = await call.read()
                got.extend(batch.responses)
            await sends.put(pb.InferRequestBatch(requests=[wide(ids[0])]))
            await sends.put(pb.InferRequestBatch(requests=[wide(ids[1], "nope")]))
            await next_answer()  # the invalid one
            await sends.put(pb.InferRequestBatch(requests=[wide(ids[2])]))
            while len(got) < 3:
                await next_answer()
            await sends.put(None)
            return got

    with local_cluster(workers=1, gpus=1, profiles=str(_wide_profiles(tmp_path, 2_000_000_000)),
                       models="wide", controller_args=["--limit",
                                                       "global_outstanding_bytes=1048576"]) as c:
        with clockwork.Client(c.address, timeout=30) as cl:  # (loaded: its LOAD done)
            cl.infer("wide", np.zeros(150_000, np.float32), slo_ms=20000)
        got = asyncio.run(main(c.address))
    assert [(r.status, r.reason, r.client_id) for r in got] == [
        (6, "unknown_model", ids[1]), (1, "overloaded", ids[2]), (0, "", ids[0])], got


def test_requests_input_bytes_outstanding_are_bounded(tmp_path):
    """global_outstanding_bytes bounds the input bytes of the requests admitted and not
    answered, on every front end (clockwork.v1 unary and stream, KServe gRPC): with
    1 MiB, of three 600 KB requests sent at once to a slow model one runs and two are
    answered overloaded at once (the request counts alone let 300 streams of ResNet-size
    requests take the controller to 5.7 GB); every byte is given back (the gauge reads 0
    after), and the next one runs."""
    import asyncio
    import re
    import urllib.request

    tgrpc_aio = pytest.importorskip("tritonclient.grpc.aio")
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    from clockwork.client import AsyncClient
    from clockwork.errors import Overloaded

    d = _wide_profiles(tmp_path, 300_000_000)
    x = np.zeros(150_000, np.float32)

    async def main(address, kserve):
        async with AsyncClient(address, timeout=30) as cl:
            await cl.infer("wide", x, slo_ms=5000)  # (loaded)
            unary = await asyncio.gather(*(cl.infer("wide", x, slo_ms=5000)
                                           for _ in range(3)), return_exceptions=True)
            s = cl.stream()
            futs = [s.submit("wide", x, slo_ms=5000) for _ in range(3)]
            await s.close()
            stream = [f.result() for f in futs]
        k = tgrpc_aio.InferenceServerClient(kserve)
        try:
            def one():
                i = tgrpc.InferInput("x", [1, 150_000], "FP32")
                i.set_data_from_numpy(x[None])
                return k.infer("wide", [i], parameters={"slo_ms": 5000})
            ks = await asyncio.gather(*(one() for _ in range(3)), return_exceptions=True)
        finally:
            await k.close()
        return unary, stream, ks

    with local_cluster(workers=1, gpus=1, profiles=str(d), models="wide", kserve_port=0,
                       controller_args=["--http-port", "0", "--limit",
                                        "global_outstanding_bytes=1048576"]) as c:
        unary, stream, ks = asyncio.run(main(c.address, c.printed_address("kserve grpc")))
        metrics = urllib.request.urlopen(f"http://{c.printed_address('http')}/metrics",
                                         timeout=10).read().decode()
        with clockwork.Client(c.address, timeout=30) as cl:
            assert cl.infer("wide", x, slo_ms=5000).status == 0
    assert sum(not isinstance(r, Exception) for r in unary) == 1, unary
    assert [type(r) for r in unary if isinstance(r, Exception)] == [Overloaded] * 2, unary
    assert "global_outstanding_bytes" in str(next(r for r in unary if isinstance(r, Overloaded)))
    assert sorted((r.status, r.reason) for r in stream) == [
        (0, ""), (1, "overloaded"), (1, "overloaded")], stream
    assert sum(not isinstance(r, Exception) for r in ks) == 1, ks
    assert all(isinstance(r, InferenceServerException) and r.status() == "StatusCode.UNAVAILABLE"
               for r in ks if isinstance(r, Exception)), ks
    assert re.search(r"^clockwork_requests_outstanding_bytes 0\.0$", metrics, re.M), metrics


def _children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def _rest_infer(host: str, port: int) -> int:
    import http.client

    body = json.dumps({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32",
                                   "data": [0, 0, 0, 0]}]})
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("POST", "/v2/models/small/infer", body,
                 {"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


# ---------------------------------------------------------------------- 200,000 at once

FLOOD = r"""
import asyncio, json, sys, time
import grpc
from clockwork.protocol import clockwork_pb2 as pb
addr, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    data = open(path, "rb").read()  # one InferRequestBatch, made beforehand
    ch = grpc.aio.insecure_channel(addr)  # gRPC's default 4 MB receive limit
    call = ch.stream_stream("/clockwork.v1.Clockwork/InferStream",
                            response_deserializer=pb.InferResponseBatch.FromString)(iter([data]))
    t0 = time.monotonic()
    got, msgs, status = {}, 0, {}
    async for b in call:
        msgs += 1
        for r in b.responses:
            got[r.client_id] = got.get(r.client_id, 0) + 1
            status[r.status] = status.get(r.status, 0) + 1
    print(json.dumps({"answered": len(got), "messages": msgs,
                      "twice": sum(1 for v in got.values() if v != 1),
                      "ids": sorted(got) == list(range(1, n + 1)),
                      "seconds": time.monotonic() - t0, "status": status}))
asyncio.run(main())
"""


def test_stream_message_of_200k_requests_is_admitted_in_slices(profiles, tmp_path):
    """One InferStream message of 200,000 requests (4 MB) is admitted 100 at a time
    (admit_slice), the event loop serving everyone else between slices; its replies come
    back in messages under reply_message_bytes to a client with gRPC's default 4 MB
    receive limit, each request answered once. The requests carry an SLO no request can
    meet (answered TIMEOUT on arrival), so the GPUs stay free for the healthy clients:
    this measures the controller, not the scheduler. Admitted whole instead, the
    message stalled the controller for ~3 s (healthy calls ran into their 1.1 s gRPC
    deadline). The liveness probe timeout is raised: on two shared cores the four busy
    processes starve one another long enough to make a healthy worker look hung. The
    healthy p99 bound is SATURATED_P99_MS (see there)."""
    n = 200_000
    limits = (f"stream_outstanding={n}", f"connection_outstanding={n}",
              f"global_outstanding={2 * n}")
    msg = pb.InferRequestBatch(requests=[pb.InferRequest(model="big", slo_ms=0.001,
                                                         client_id=i + 1) for i in range(n)])
    path = tmp_path / "message.bin"
    path.write_bytes(msg.SerializeToString())
    with _cluster(profiles, *limits, args=("--set", "probe_timeout_ms=1000")) as c:
        async def main():
            base = await _baseline(c.address)
            flood = await asyncio.create_subprocess_exec(
                sys.executable, "-c", FLOOD, c.address, str(path), str(n),
                stdout=subprocess.PIPE)
            fault = await Healthy(c.address).run(4.0)
            out, _ = await flood.communicate()
            res = json.loads(out.decode().strip().splitlines()[-1])
            counters = await _settled(c.address)
            _report("200k-request message", base, fault, bound=SATURATED_P99_MS,
                    flood_seconds=res["seconds"],
                    flood_reply_messages=res["messages"], message_bytes=path.stat().st_size,
                    slices=n // 100)
            assert res["answered"] == n and res["twice"] == 0 and res["ids"]
            assert res["status"] == {"4": n}  # TIMEOUT: no such SLO can be met
            assert res["messages"] >= 2  # the 4 MB+ of replies was split
            assert counters["msgs_admitted_in_slices"] == 1
            assert max(fault.lat) < 1100.0  # no healthy call stalled to its deadline

        asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------------- stream limits


def test_stream_over_its_outstanding_limit_is_answered_overloaded(profiles):
    """stream_outstanding=50 and connection_outstanding=80: a stream message of 200
    requests and another stream's 50 on the same connection get 80 admitted in all and
    170 answered at once ``overloaded`` (the client raises ``Overloaded`` for unary
    calls); a client on another connection is not affected; nothing is lost."""
    with _cluster(profiles, "stream_outstanding=50", "connection_outstanding=80") as c:
        async def main():
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                await cl.infer("slow", slo_ms=2000)  # loaded: the next ones only wait
                s1, s2 = cl.stream(), cl.stream()
                f1 = [s1.submit("slow", slo_ms=2000) for _ in range(200)]
                f2 = [s2.submit("slow", slo_ms=2000) for _ in range(50)]
                # a channel of its own (gRPC shares connections between channels)
                async with grpc.aio.insecure_channel(
                        c.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                    r = await pbg.ClockworkStub(ch).Infer(
                        pb.InferRequest(model="slow", slo_ms=2000), timeout=10)
                    assert r.status == 0
                r1 = await asyncio.wait_for(asyncio.gather(*f1), 20)
                r2 = await asyncio.wait_for(asyncio.gather(*f2), 20)
                await s1.close()
                await s2.close()
            for rs in (r1, r2):  # each request answered once, by id
                assert sorted(r.client_id for r in rs) == list(range(1, len(rs) + 1))
            rs = r1 + r2
            over = [r for r in rs if r.reason == "overloaded"]
            assert len(over) == 170 and all(r.status == 1 for r in over)
            assert all(r.status == 0 for r in rs if r.reason != "overloaded")
            assert len([r for r in r1 if r.reason != "overloaded"]) <= 50
            counters = await _settled(c.address)
            assert counters["requests_overloaded"] == 170
            print(f"\n[stream limits] admitted {len(rs) - len(over)}, overloaded "
                  f"{len(over)} (stream 1: {sum(r.reason == 'overloaded' for r in r1)}, "
                  f"stream 2: {sum(r.reason == 'overloaded' for r in r2)})")

        asyncio.run(asyncio.wait_for(main(), 60))
    err = clockwork.errors.error_for(1, "overloaded", "overloaded: ...")
    assert isinstance(err, Overloaded)


def test_a_stream_whose_client_clock_lies_is_answered_and_ends(profiles):
    """``client_time_ns`` at the ends of int64 (a message stamped far in the future, then
    one far in the past): neither is a clock reading, so both are ignored; the requests
    are answered as they arrived (not a day late), the stream ends, and nothing stays
    outstanding. (It once made a latency beyond int64: the reply was lost, the stream
    hung and its slot of global_outstanding was never given back.)"""
    with _cluster(profiles, "global_outstanding=2") as c:
        async def main():
            async with grpc.aio.insecure_channel(c.address) as ch:
                stub = pbg.ClockworkStub(ch)

                async def gen():
                    yield pb.InferRequestBatch(client_time_ns=2**63 - 1)
                    yield pb.InferRequestBatch(client_time_ns=-2**63, requests=[
                        pb.InferRequest(model="slow", slo_ms=5000, client_id=i)
                        for i in (1, 2)])

                got = []
                async for b in stub.InferStream(gen(), timeout=10):
                    got += [(r.client_id, r.status, r.latency_ns) for r in b.responses]
                assert sorted(i for i, _, _ in got) == [1, 2]
                assert all(s == 0 and lat < 5e9 for _, s, lat in got), got
            counters = await _settled(c.address)
            assert counters.get("replies_bad_answer", 0) == 0
            assert counters["client_times_ignored"] == 2
            async with clockwork.AsyncClient(c.address, timeout=10) as cl:
                assert (await cl.infer("slow", slo_ms=2000)).status == 0  # a slot is free

        asyncio.run(asyncio.wait_for(main(), 30))


def test_client_times_that_are_no_clock_reading_are_ignored(profiles):
    """A stream's ``client_time_ns`` that cannot be a clock reading (below 1, 2^62 or
    more) is ignored: that message's requests are served as they arrive. One far behind
    the stream's clock (stamped 1 on a clock at 10^15) is charged the window, 60 s, not
    the day it claims: answered TIMEOUT with a latency under 61 s. The later messages,
    stamped by the client's real clock, are served, and one stamped 3 s ago has that
    delay charged. Every time not taken as it is, is counted (``client_times_ignored``);
    none reached the controller's statistics as a day (before, one stamp of 2^63 - 1
    made every later request of the stream TIMEOUT at once, a day late)."""
    with _cluster(profiles) as c:
        async def main():
            async with grpc.aio.insecure_channel(c.address) as ch:
                stub = pbg.ClockworkStub(ch)
                offset = 10**15  # the client's clock: any monotonic clock
                absurd = (2**63 - 1, 1, -2**63, -1, 2**62)

                def msg(t: int, i: int, slo_ms: float = 5000) -> pb.InferRequestBatch:
                    return pb.InferRequestBatch(client_time_ns=t, requests=[
                        pb.InferRequest(model="small", slo_ms=slo_ms, client_id=i)])

                async def gen():
                    yield msg(time.monotonic_ns() + offset, 0)
                    for i, t in enumerate(absurd, 1):
                        yield msg(t, i)
                    for i in range(6, 9):
                        yield msg(time.monotonic_ns() + offset, i)
                    yield msg(time.monotonic_ns() + offset - 3 * 10**9, 9, slo_ms=1000)

                got = {}
                async for b in stub.InferStream(gen(), timeout=10):
                    got.update((r.client_id, (r.status, r.latency_ns)) for r in b.responses)
                assert sorted(got) == list(range(10))
                late = got.pop(9)  # sent 3 s ago by its clock: late, charged its delay
                # (beyond the fastest message's transit: this one's may be shorter, by
                # a fraction of a millisecond: 2.99984 s was seen)
                assert late[0] == 4 and 2.99e9 <= late[1] < 4e9, late
                behind = got.pop(2)  # stamped 1: charged the 60 s window, no more
                assert behind[0] == 4 and 60e9 <= behind[1] < 61e9, behind
                assert all(s == 0 and lat < 5e9 for s, lat in got.values()), got
            counters = await _settled(c.address)
            assert counters["client_times_ignored"] == len(absurd)
            assert counters.get("requests_timeout", 0) == 2

        asyncio.run(asyncio.wait_for(main(), 30))


def test_a_stream_clock_is_capped_and_follows_a_step():
    """``ClientClock`` on its own (times in s here, as ns): within the window a message
    is charged its delay beyond the fastest; past it, behind is charged the window (no
    cliff at 60 s: held 61 s is not served as fresh) and ahead nothing; three messages
    in a row that agree on a new offset over 2 s of arrivals (a clock step, or a first
    stamp that lied) make it the stream's, so an honest stream recovers; a backlog read
    after a stall is no step."""
    from controller.intake import CLIENT_CLOCK_WINDOW_NS as W
    from controller.intake import ClientClock

    s = 10**9
    c = ClientClock()
    t0 = 10**6 * s  # the client's clock, far from the controller's (arrivals at 1000 s on)
    assert c.late(1000 * s, t0) == 0 and c.why == ""
    assert c.late(1010 * s, t0 + 9 * s) == 1 * s  # 1 s on its way beyond the fastest
    assert c.late(1020 * s, t0 + 20 * s) == 0 and c.fastest == 1000 * s - t0  # faster
    assert c.late(1100 * s, t0 + 41 * s) == 59 * s  # held 59 s: charged 59 s
    assert c.late(1100 * s, t0 + 39 * s) == W and "behind" in c.why  # 61 s: the window
    assert c.late(1101 * s, t0 + 101 * s) == 0 and c.why == ""
    # the client's clock steps 300 s forward: ignored twice, then the stream's
    for k in range(3):
        got = c.late((1102 + k) * s, t0 + (402 + k) * s)
        assert got == 0 and c.why, (k, c.why)
    assert "stepped" in c.why and c.fastest == 1104 * s - (t0 + 404 * s)
    assert c.late(1110 * s, t0 + 408 * s) == 2 * s and c.why == ""  # charged as before
    # a first stamp that lied (far in the future): charged the window twice, then right
    c = ClientClock()
    assert c.late(1000 * s, t0 + 3600 * s) == 0
    assert [c.late((1001 + k) * s, t0 + (1 + k) * s) for k in range(3)] == [W, W, 0]
    assert c.late(1010 * s, t0 + 10 * s) == 0 and c.late(1011 * s, t0 + 10 * s) == 1 * s
    # stamps past the window that do not agree are no step
    c = ClientClock()
    c.late(1000 * s, t0)
    assert [c.late(1001 * s, t0 - k * 100 * s) for k in (1, 2, 3, 4)] == [W] * 4
    assert c.fastest == 1000 * s - t0
    for bad in (-1, -(2**63), 2**62, 2**63 - 1):  # no clock reading: as sent on arrival
        assert c.late(1002 * s, bad) == 0 and "no clock reading" in c.why
    assert c.late(1002 * s, 0) == 0 and c.why == ""  # 0: no time given
    # a backlog read at once after a 90 s stall (sent every 10 ms, read 0.1 ms apart):
    # each message is charged its delay, at most the window -- none is taken for a step
    c = ClientClock()
    ms = 10**6
    for i in range(1000):  # sent and read as they go
        assert c.late(i * 10 * ms, i * 10 * ms) == 0
    sent = range(10_000 * ms, 100_000 * ms, 10 * ms)
    got = [c.late(100_000 * ms + k * ms // 10, t) for k, t in enumerate(sent)]
    want = [min(100_000 * ms + k * ms // 10 - t, W) for k, t in enumerate(sent)]
    assert got == want and c.fastest == 0


def test_a_stream_clock_says_a_message_charged_a_second_or_more():
    """A charge of 1 s or more within the window is said (``note``: the controller counts
    and logs it, ``client_times_late``), not taken for an ignored time (``why``): a client
    clock stepped back 30 s had every later message charged 30 s, its whole stream
    timing out with nothing in the log. Under a second, nothing is said; past the
    window the charge is the window, and its text says so."""
    from controller.intake import ClientClock

    s, ms = 10**9, 10**6
    c = ClientClock()
    assert c.late(1000 * s, 5000 * s) == 0
    assert c.late(1001 * s, 5001 * s - 999 * ms) == 999 * ms and c.note == c.why == ""
    assert c.late(1002 * s, 4972 * s) == 30 * s and c.why == ""  # stepped back 30 s
    assert "30 s behind" in c.note and "monotonic" in c.note
    assert c.late(1003 * s, 4973 * s) == 30 * s and c.note  # (each later one)
    assert c.late(1004 * s, 5004 * s) == 0 and c.note == ""
    assert c.late(1100 * s, 5000 * s) == 60 * s and "charged 60 s" in c.why


def test_a_streams_earlier_requests_move_by_what_its_clock_fell_since_each():
    """``ClientClock.shifted`` adds up each fall of the stream's offset (a message faster
    than every earlier one) within the window, not a clock step; ``Admitted`` moves each
    admission's requests still pending by the falls since it, once (what
    ``ControllerNode.arrived_earlier`` is given)."""
    from types import SimpleNamespace

    from controller.intake import Admitted, ClientClock

    ms = 10**6
    c = ClientClock()
    t = 5000 * ms  # (the client's clock)
    assert c.late(1000 * ms, t) == 0 and c.shifted == 0  # offset -4000 ms
    assert c.late(1000 * ms, t + 300 * ms) == 0 and c.shifted == 300 * ms  # 300 less
    assert c.late(1010 * ms, t + 300 * ms) == 10 * ms and c.shifted == 300 * ms  # (behind)
    assert c.late(1010 * ms, t + 510 * ms) == 0 and c.shifted == 500 * ms  # 200 less
    moved = []
    node = SimpleNamespace(next_id=0, pending={},
                           arrived_earlier=lambda ids, by: moved.append((list(ids), by)))
    a = Admitted()
    for shifted in (0, 0, 300 * ms, 500 * ms):  # four admissions of two ids each
        first, node.next_id = node.next_id, node.next_id + 2
        a.add(node, first, shifted)
    a.arrived_earlier(node, 600 * ms)
    assert sorted(moved) == [([0, 1, 2, 3], 600 * ms), ([4, 5], 300 * ms),
                             ([6, 7], 100 * ms)], moved
    moved.clear()
    a.arrived_earlier(node, 600 * ms)  # (nothing new: nothing moves again)
    assert moved == [] and a.applied == 600 * ms
    # all told, at most the window with what a request was charged on arrival: three
    # falls of 59 s moved the first admission 118 s
    from controller.intake import CLIENT_CLOCK_WINDOW_NS as W

    s = 10**9
    moved.clear()
    b = Admitted()
    first, node.next_id = node.next_id, node.next_id + 1
    b.add(node, first, 0, late=2 * s)  # (charged 2 s on arrival)
    b.arrived_earlier(node, 59 * s)
    b.arrived_earlier(node, 118 * s)
    assert moved == [([first], W - 2 * s)], moved  # (58 s: 60 with the 2 s charged)


# ---------------------------------------------------------------------- a bad worker


class FakeWorker(pbg.WorkerServicer):
    """A worker speaking the real protocol, badly. Connection 1 answers every action
    with an unknown action type; connection 2 answers LOADs correctly and INFERs with
    an output tensor of a dtype that is no number type; from connection 3 on it answers
    every action SUCCESS at once. It echoes clock echoes (so it is never suspect)."""

    def __init__(self) -> None:
        self.connections = 0
        self.actions = 0

    async def ClockSync(self, request, context):  # noqa: N802
        return pb.ClockSyncResponse(worker_time=time.monotonic_ns())

    async def Connect(self, request_iterator, context):  # noqa: N802
        self.connections += 1
        conn = self.connections
        it = request_iterator.__aiter__()
        hello = await anext(it)
        assert hello.WhichOneof("kind") == "hello"
        yield pb.WorkerMessage(state=pb.WorkerState(
            device="emulated", profiles="test", gpus=[pb.GpuState(gpu=0, pages=64)],
            worker_time=time.monotonic_ns(), protocol=PROTOCOL))
        out: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            async for msg in it:
                kind = msg.WhichOneof("kind")
                if kind == "echo":
                    e = pb.ClockEcho()
                    e.CopyFrom(msg.echo)
                    e.worker_time = time.monotonic_ns()
                    await out.put(pb.WorkerMessage(echo=e))
                elif kind == "actions":
                    res = [self._result(conn, a) for a in msg.actions.actions]
                    await out.put(pb.WorkerMessage(results=pb.ResultBatch(results=res)))
            await out.put(None)

        task = asyncio.create_task(read())
        try:
            while (m := await out.get()) is not None:
                yield m
        finally:
            task.cancel()

    def _result(self, conn: int, a: pb.ActionMsg) -> pb.ResultMsg:
        self.actions += 1
        now = time.monotonic_ns()
        r = pb.ResultMsg(id=a.id, type=a.type, status=0, gpu=a.gpu, model=a.model,
                         batch_size=a.batch_size, received=now - a.expected_duration,
                         begin=now - a.expected_duration, end=now,
                         duration=a.expected_duration)  # (its work inside its span)
        if conn == 1:
            r.type = 99
        elif conn == 2 and a.type == 2:
            r.outputs.add(name="y", shape=[a.batch_size, 4], dtype="object",
                          data=bytes(16 * a.batch_size))
        return r


def test_malformed_worker_results_reset_the_link_and_lose_nothing(profiles, tmp_path):
    """A fake worker answers with malformed results: each is logged, counted
    (results_malformed) and dropped, its link is reset (the worker treated as lost: its
    actions fail, their requests are retried or answered) and reconnected; the
    controller stays up, and once the worker answers properly requests succeed. Every
    client request is answered exactly once."""
    async def main():
        fake = FakeWorker()
        server = grpc.aio.server()
        pbg.add_WorkerServicer_to_server(fake, server)
        wport = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ctl = _Child("controller", _cli() + [
            "controller", "--host", "127.0.0.1", "--port", "0",
            "--workers", f"127.0.0.1:{wport}", "--profiles", str(profiles),
            "--models", "small", "--http-port", "-1", "--kserve-port", "-1"])
        try:
            address = await asyncio.get_running_loop().run_in_executor(
                None, ctl.wait_address, 30.0)
            answers: dict[str, int] = {}
            async with clockwork.AsyncClient(address, timeout=10) as cl:
                end = time.monotonic() + 20
                # unary calls until the worker behaves and one has succeeded
                while time.monotonic() < end:
                    try:
                        await cl.infer("small", slo_ms=200)
                        answers["ok"] = answers.get("ok", 0) + 1
                        if fake.connections >= 3:
                            break
                    except ClockworkError as e:
                        answers[type(e).__name__] = answers.get(type(e).__name__, 0) + 1
                    await asyncio.sleep(0.02)
                assert fake.connections >= 3, f"{fake.connections} connection(s): {answers}"
                # a client's malformed input is answered too, alone
                s = cl.stream()
                bad = pb.Tensor(name="x", shape=[4], dtype="object", data=bytes(16))
                futs = [s.submit("small", np.zeros(4, np.float32), slo_ms=200)
                        for _ in range(20)]
                s._queue[3].inputs[0].CopyFrom(bad)
                rs = await asyncio.wait_for(asyncio.gather(*futs), 10)
                await s.close()
            assert sorted(r.client_id for r in rs) == list(range(1, 21))
            assert rs[3].status == 6 and "dtype" in rs[3].message
            assert all(r.status == 0 for i, r in enumerate(rs) if i != 3)
            counters = await _settled(address)
            assert ctl.proc.poll() is None, "the controller died"
            log = "".join(ctl.output)
            print(f"\n[malformed worker] connections={fake.connections} unary={answers} "
                  f"results_malformed={counters.get('results_malformed')} "
                  f"worker_losses={counters.get('worker_losses')}")
            assert counters["results_malformed"] >= 2
            assert counters["worker_losses"] >= 2 and counters["worker_connects"] >= 3
            assert "unknown action type 99" in log and "not a little-endian number" in log
        finally:
            ctl.stop()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_worker_answers_a_malformed_action_and_keeps_its_stream(profiles):
    """A real worker sent an action of unknown type next to a good LOAD answers the bad
    one INVALID_INPUT, runs the LOAD, and its stream goes on (it echoes after)."""
    w = _Child("worker", _cli() + ["worker", "--host", "127.0.0.1", "--port", "0",
                                   "--profiles", str(profiles)])
    try:
        address = w.wait_address(30.0)

        async def main():
            async with grpc.aio.insecure_channel(address) as ch:
                call = pbg.WorkerStub(ch).Connect()
                await call.write(pb.ControllerMessage(hello=pb.Hello(protocol=PROTOCOL,
                    worker_id=0, reset=True, instances=[pb.Instance(name="small",
                                                                    profile="small")])))
                assert (await call.read()).WhichOneof("kind") == "state"
                far = time.monotonic_ns() + 10**10
                await call.write(pb.ControllerMessage(actions=pb.ActionBatch(actions=[
                    pb.ActionMsg(id=1, type=42, gpu=0, model="small", latest=far),
                    pb.ActionMsg(id=2, type=0, gpu=0, model="small", latest=far,
                                 expected_duration=2_000_000)])))
                results = {}
                while len(results) < 2:
                    m = await call.read()
                    for r in m.results.results:
                        results[r.id] = r
                assert results[1].status == 30 and "unknown action type 42" in \
                    results[1].message
                assert results[2].status == 0
                await call.write(pb.ControllerMessage(echo=pb.ClockEcho(seq=7)))
                m = await call.read()
                assert m.WhichOneof("kind") == "echo" and m.echo.seq == 7
                call.cancel()

        asyncio.run(asyncio.wait_for(main(), 20))
        assert w.proc.poll() is None
        assert "malformed action 1" in "".join(w.output)
    finally:
        w.stop()


# ---------------------------------------------------------------------- idle streams

_IDLE_STREAMS = r"""
import asyncio, sys
import grpc
from clockwork.protocol import clockwork_pb2 as pb, clockwork_pb2_grpc as pbg
from clockwork.protocol import kserve_pb2 as kpb, kserve_pb2_grpc as kpbg

N, SIZE = int(sys.argv[2]), int(sys.argv[3])


async def main():
    hold = asyncio.Event()
    ch = grpc.aio.insecure_channel(sys.argv[1], options=[("grpc.max_send_message_length",
                                                          64 << 20)])
    kserve, ours = kpbg.GRPCInferenceServiceStub(ch), pbg.ClockworkStub(ch)

    def one_then_idle(msg):
        async def gen():
            yield msg
            await hold.wait()
        return gen()

    calls = []
    for i in range(N):  # one large message each, for a model not served: answered at once
        if i % 2:
            m = kpb.ModelInferRequest(model_name="nowhere", id=str(i))
            t = m.inputs.add(name="x", datatype="FP32", shape=[1, SIZE // 4])
            m.raw_input_contents.append(bytes(SIZE))
            call = kserve.ModelStreamInfer(one_then_idle(m))
        else:
            m = pb.InferRequestBatch(requests=[pb.InferRequest(
                model="nowhere", client_id=1, inputs=[pb.Tensor(
                    name="x", shape=[SIZE // 4], dtype="float32", data=bytes(SIZE))])])
            call = ours.InferStream(one_then_idle(m))
        await call.read()  # its answer: the message was read
        calls.append(call)
    print("idle", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    hold.set()
    await ch.close()


asyncio.run(main())
"""


def test_idle_streams_hold_no_message_they_were_sent(profiles, monkeypatch):
    """Streams left open and idle after one large message each (KServe ModelStreamInfer
    and InferStream; the client vanished or waits): the controller keeps none of those
    messages. grpc.aio's request iterator held each stream's last message while it waited
    for the next."""
    n, size = 8, 16 * MiB
    # (memory freed goes back to the system at once: glibc's threshold for that otherwise
    # rises with the first large block freed, and RSS would count what is merely cached)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(MiB))
    with _cluster(profiles) as c:
        pid = c.controller.proc.pid
        before = _rss_mb(pid)
        client = subprocess.Popen([sys.executable, "-c", _IDLE_STREAMS, c.address, str(n),
                                   str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert client.stdout.readline().strip() == "idle"
            held = _rss_mb(pid) - before
            print(f"\n[idle streams] {n} idle streams after one {size // MiB} MiB message "
                  f"each: controller +{held:.0f} MB")
            # (held: 151 MB before, 15-70 MB now, from run to run)
            assert held < 0.75 * n * size / MiB, held
        finally:
            client.communicate("\n", timeout=30)


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_a_client_that_stops_answering_is_let_go(profiles):
    """A client process stopped (SIGSTOP: a hung process, a host gone) with idle streams
    and connections open: the controller's keepalive pings go unanswered and it closes
    them ~15 s later (gRPC servers ping no one by default: they stayed open for hours,
    with whatever their streams held)."""
    import os
    import signal

    with _cluster(profiles) as c:
        pid = c.controller.proc.pid
        base = _fds(pid)
        clients = []
        try:
            for n in (4, 2, 2, 2):  # (a process, and so a connection, each)
                p = subprocess.Popen([sys.executable, "-c", _IDLE_STREAMS, c.address, str(n),
                                      "1024"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
                clients.append(p)
                assert p.stdout.readline().strip() == "idle"
            assert _fds(pid) > base  # their connections
            for p in clients:
                os.kill(p.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            while _fds(pid) > base and time.monotonic() - t0 < 45:
                time.sleep(0.5)
            took = time.monotonic() - t0
            print(f"\n[stopped clients] connections let go {took:.1f} s after they stopped")
            assert _fds(pid) <= base, f"{_fds(pid) - base} more fds after {took:.0f} s"
        finally:
            for p in clients:
                p.kill()
                p.wait()


_CALLS = r"""
import asyncio, sys
import grpc
from clockwork.protocol import clockwork_pb2 as pb, clockwork_pb2_grpc as pbg


async def main():
    hold = asyncio.Event()

    async def idle():
        yield pb.InferRequestBatch(requests=[pb.InferRequest(model="nowhere", client_id=1)])
        await hold.wait()

    own = [("grpc.use_local_subchannel_pool", 1)]  # (a connection each)
    async with grpc.aio.insecure_channel(sys.argv[1], options=own) as a, \
            grpc.aio.insecure_channel(sys.argv[1], options=own) as b:
        stub, other = pbg.ClockworkStub(a), pbg.ClockworkStub(b)
        streams = [stub.InferStream(idle()) for _ in range(2)]
        for s in streams:
            await asyncio.wait_for(s.read(), 10)
        # the connection has its 2 calls open: a third waits for one of them
        try:
            await stub.Stats(pb.StatsRequest(), timeout=1.0)
            print("third call on the connection: answered")
        except grpc.aio.AioRpcError as e:
            print("third call on the connection:", e.code().name)
        # another connection: the controller's 3 calls in all are open with it
        x = other.InferStream(idle())
        await asyncio.wait_for(x.read(), 10)
        for n in ("fourth", "fifth"):  # (grpc.aio before 1.80 let the second one in)
            try:
                await other.Stats(pb.StatsRequest(), timeout=5.0)
                print(f"{n} call in all: answered")
            except grpc.aio.AioRpcError as e:
                print(f"{n} call in all:", e.code().name)
        streams[0].cancel()
        x.cancel()
        await asyncio.sleep(0.5)
        r = await stub.Stats(pb.StatsRequest(), timeout=5.0)
        print("after two ended:", "answered" if r is not None else "none")
        hold.set()


asyncio.run(main())
"""


def test_grpc_calls_are_bounded_per_connection_and_in_all(profiles):
    """``grpc_max_streams_per_connection``: a connection's call beyond it waits for one to
    end (HTTP/2's stream limit); ``grpc_max_calls``: a call beyond it over all
    connections is refused RESOURCE_EXHAUSTED at once. Nothing bounded either before:
    5,000 idle streams took 145 MB."""
    with _cluster(profiles, "grpc_max_streams_per_connection=2", "grpc_max_calls=3") as c:
        out = subprocess.run([sys.executable, "-c", _CALLS, c.address], capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.splitlines() == [
            "third call on the connection: DEADLINE_EXCEEDED",
            "fourth call in all: RESOURCE_EXHAUSTED",
            "fifth call in all: RESOURCE_EXHAUSTED",
            "after two ended: answered"], out.stdout + out.stderr


def test_a_burst_of_unary_calls_is_answered_whole(profiles):
    """3,000 unary inferences sent at once on one connection (well within grpc_max_calls):
    every one is answered. gRPC's server cancels calls that arrived but that the server
    has not taken up yet, at random above 1,000 waiting and all above 3,000 (its
    max_pending_requests): with no option set, ~3 % of a burst of 1,500 and more of
    this one ended CANCELLED before the controller saw them. The liveness probe timeout
    is raised: while the controller takes up the burst, a worker starved of CPU on two
    shared cores can miss a 50 ms probe and be suspect for a moment (CI: 13 calls
    answered ``no_worker``)."""
    n = 3000
    with _cluster(profiles, args=("--set", "probe_timeout_ms=1000")) as c:
        async def main() -> dict[str, int]:
            got: dict[str, int] = {}
            async with grpc.aio.insecure_channel(c.address) as ch:
                stub = pbg.ClockworkStub(ch)
                req = pb.InferRequest(model="small", slo_ms=30_000)

                async def one() -> None:
                    try:
                        r = await stub.Infer(req, timeout=60)
                        what = "ok" if r.status == 0 else f"status {r.status} {r.reason}"
                    except grpc.aio.AioRpcError as e:
                        what = e.code().name
                    got[what] = got.get(what, 0) + 1

                await asyncio.gather(*(one() for _ in range(n)))
            return got

        got = asyncio.run(main())
        assert got == {"ok": n}, "".join(c.controller.output[-20:])


@pytest.mark.parametrize("calls,burst", [(100, 400), (10, 200)])
def test_a_burst_past_grpc_max_calls_is_refused_overloaded_not_cancelled(profiles, calls,
                                                                         burst):
    """400 inferences at once against grpc_max_calls=100: each one answered or refused
    ``Overloaded``. gRPC's server cancelled the calls waiting past its pending-request
    limit, which was grpc_max_calls: 262 of 400 ended CANCELLED (ControllerUnavailable),
    unseen by the controller; at four times grpc_max_calls, 152 of 200 at
    grpc_max_calls=10 (ControllerUnavailable "controller is shutting down")."""
    with _cluster(profiles, f"grpc_max_calls={calls}") as c:
        async def main() -> collections.Counter:
            async with clockwork.AsyncClient(c.address, timeout=30) as ac:
                got = await asyncio.gather(*(ac.infer("small", slo_ms=10_000)
                                             for _ in range(burst)), return_exceptions=True)
            return collections.Counter("ok" if not isinstance(r, Exception) else
                                       type(r).__name__ for r in got)

        got = asyncio.run(main())
        assert set(got) <= {"ok", "Overloaded"} and got["ok"] >= calls, got


def test_a_call_over_grpc_max_calls_is_overloaded_for_the_python_client(profiles):
    """The Python client names the refusal for grpc_max_calls: an inference is
    ``Overloaded`` (load shedding, as for the other bounds), another call
    ``ControllerUnavailable`` naming the limit (both said 'controller unavailable:
    StatusCode.RESOURCE_EXHAUSTED: Concurrent RPC limit exceeded!')."""
    with _cluster(profiles, "grpc_max_calls=2") as c:
        async def main():
            async with clockwork.AsyncClient(c.address, timeout=10) as ac:
                streams = [ac.stream(), ac.stream()]  # the two calls the controller takes
                for s in streams:
                    assert (await s.submit("small", slo_ms=1000)).status == 0
                with clockwork.Client(c.address, timeout=10) as cl:
                    with pytest.raises(Overloaded, match="grpc_max_calls") as e:
                        await asyncio.to_thread(cl.infer, "small", slo_ms=1000)
                    assert e.value.model == "small"
                    with pytest.raises(clockwork.errors.ControllerUnavailable,
                                       match="grpc_max_calls"):
                        await asyncio.to_thread(cl.stats)
                for s in streams:
                    await s.close()

        asyncio.run(main())


@pytest.mark.parametrize("key", ["rest_max_header_bytes", "rest_max_headers"])
def test_rest_header_limits_past_what_the_parser_takes_are_refused_by_name(key):
    """A REST header bound of 2^64 was taken, and then aiohttp's parser failed every
    REST connection (OverflowError, reset with no answer, nothing logged); at most
    2^31 - 1 is taken now, the largest working."""
    from clockwork.settings import SettingsError
    from controller.limits import limits_from_flags

    with pytest.raises(SettingsError, match=key):
        limits_from_flags([f"{key}={2**64}"])
    assert getattr(limits_from_flags([f"{key}={2**31 - 1}"]), key) == 2**31 - 1
