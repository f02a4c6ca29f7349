"""The worker's event loop (clockwork.protocol.precise_loop): epoll for the sockets, a
microsecond wait on the epoll descriptor."""

from __future__ import annotations

import asyncio
import selectors
import socket

from clockwork.protocol.precise_loop import PreciseEpollSelector, run_precise


def test_a_ready_socket_ends_the_wait_and_a_quiet_one_times_out():
    a, b = socket.socketpair()
    sel = PreciseEpollSelector()
    try:
        sel.register(a, selectors.EVENT_READ, "a")
        assert sel.select(0.0005) == []  # nothing ready: the wait ends empty
        b.send(b"x")
        got = sel.select(30.0)  # ready: returns at once with the event
        assert [(k.data, ev) for k, ev in got] == [("a", selectors.EVENT_READ)]
        assert sel.select(None)  # no timeout: still ready
    finally:
        sel.close()
        a.close()
        b.close()


def test_the_loop_runs_timers_and_sockets_in_order():
    async def main():
        loop = asyncio.get_running_loop()
        order = []
        now = loop.time()  # (one instant: the thread may be paused between the calls)
        for d in (0.0003, 0.0001, 0.0002):
            loop.call_at(now + d, order.append, d)
        r, w = await asyncio.open_connection(*(await _echo_server()))
        w.write(b"ping")
        assert await r.readexactly(4) == b"ping"
        await asyncio.sleep(0.002)
        w.close()
        return order, type(loop._selector).__name__

    order, selector = run_precise(main())
    assert order == [0.0001, 0.0002, 0.0003] and selector == "PreciseEpollSelector"


async def _echo_server():
    async def echo(r, w):
        w.write(await r.readexactly(4))
        await w.drain()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server.sockets[0].getsockname()[:2]
