"""Large REST inference bodies with JSON tensors, decoded in child processes.

Reading a JSON tensor (orjson) and making its arrays (numpy) hold Python's GIL from start
to end: a 16-image ResNet-size body (46 MB of JSON) takes ~250 ms here, and on a worker
thread of the controller that is ~250 ms in which its event loop -- every other client's
requests, on every protocol, the workers' results, the scheduler -- waits. A child process
decodes it beside the loop instead: the loop writes the body to the child's pipe and reads
the arrays back (a pickle: ~1 ms for 10 MB), and the operating system shares the cores.

:class:`JsonDecoders` keeps up to ``processes`` children (``python -m
controller.json_offload``), started when first needed and reused; each decodes one body at
a time with the same function the controller would run itself
(``kserve_validate.rest_request`` on ``json_loads``), so the answers and the refusals are
the same. A child that dies (killed, out of memory) or cannot start is replaced at the next
body; the body it was given is decoded in the controller, on a thread, as it is with no
children (``processes`` 0).

On a child's stdin, a body is two 8-byte little-endian lengths (its JSON header's, then
the binary data's after it) followed by those bytes; on its stdout the answer is an 8-byte
length followed by a pickle of ``("ok", (inputs, parameters, requested outputs,
{output: binary?}, binary by default, {"id": ...} or {}))`` or ``("err", kind, message)``
(a ``KServeError``'s). A child exits when its stdin ends (the controller stopped or died);
it ignores Ctrl-C, which its controller handles.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

from controller.kserve_status import INVALID, KServeError
from controller.kserve_validate import json_loads, rest_request

_LENGTHS = struct.Struct("<QQ")
_LENGTH = struct.Struct("<Q")
_ROOT = str(Path(__file__).resolve().parents[1])  # where the ``controller`` package lies
NICE = 10  # a child's niceness, added to the controller's


def decode(header: bytes | memoryview, binary: bytes | memoryview) -> tuple:
    """A REST inference body's JSON ``header`` and the ``binary`` data after it ->
    (inputs, parameters, requested outputs, {output: binary?}, binary by default,
    ``{"id": ...}`` or ``{}``); ``KServeError`` (INVALID_ARGUMENT) for a bad body."""
    try:
        req = json_loads(header)
    except ValueError as e:
        raise KServeError(INVALID, f"request body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise KServeError(INVALID, "request body must be a JSON object")
    inputs, params, names, binary_of, binary_all = rest_request(req, binary)
    return inputs, params, names, binary_of, binary_all, ({"id": req["id"]} if "id" in req
                                                          else {})


class _Child:
    """One decoding process and its pipes. Its methods block (the pipes are read and
    written by plain system calls, which let go of Python's lock and copy nothing): they
    run on worker threads."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "controller.json_offload"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     bufsize=0)

    def ask(self, header: bytes | memoryview, binary: bytes | memoryview) -> tuple:
        """Decode one body: the child's answer; EOFError or OSError if the child is gone."""
        fd = self.proc.stdin.fileno()
        for part in (_LENGTHS.pack(len(header), len(binary)), header, binary):
            view = memoryview(part).cast("B")
            while view:
                view = view[os.write(fd, view):]
        (n,) = _LENGTH.unpack(self._read(_LENGTH.size))
        return pickle.loads(self._read(n))

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        fd = self.proc.stdout.fileno()
        while got < n:
            k = os.readv(fd, [view[got:]])
            if not k:
                raise EOFError("the decoding process ended")
            got += k
        return buf

    def kill(self) -> None:
        """End it now (what it was asked is not answered), and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def close(self) -> None:
        """End it: its stdin closed (it exits), killed if it has not within a second."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


def _ask(child: _Child | None, header, binary) -> tuple[_Child, tuple]:
    """On a worker thread: (the child, its answer), starting a child for None; a child
    that fails is ended."""
    if child is None:
        child = _Child()
    try:
        return child, child.ask(header, binary)
    except BaseException:
        child.kill()
        raise


def _end_abandoned(cf: concurrent.futures.Future) -> None:
    """Done callback of an ask whose caller went away: its child is ended."""
    if not cf.cancelled() and cf.exception() is None:
        cf.result()[0].close()


class JsonDecoders:
    """Up to ``processes`` children that decode REST inference bodies (see the module
    docstring); 0: every body is decoded in this process, on a worker thread."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._gate = asyncio.Semaphore(max(1, processes))
        # one thread per child, blocked in its pipes' system calls while it decodes
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max(1, processes), thread_name_prefix="json-offload")
        self._idle: list[_Child] = []
        self._said = False  # that a child could not be used (said once)
        self.closed = False

    async def decode(self, header: bytes | memoryview, binary: bytes | memoryview) -> tuple:
        """``decode(header, binary)``, in a child when there is one to use, else on a
        worker thread of this process."""
        if self.processes and not self.closed:
            async with self._gate:
                answer = await self._ask(header, binary)
            if answer is not None:
                if answer[0] == "err":
                    raise KServeError(answer[1], answer[2])
                return answer[1]
        return await asyncio.get_running_loop().run_in_executor(None, decode, header, binary)

    async def _ask(self, header, binary) -> tuple | None:
        """A child's answer, or None when none could be used (then this body is decoded
        here)."""
        cf = self._threads.submit(_ask, self._idle.pop() if self._idle else None, header,
                                  binary)
        try:
            child, answer = await asyncio.wrap_future(cf)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
            # gone (killed, out of memory), or it never started (its child is ended)
            if not self._said:
                self._said = True
                print(f"controller: a JSON decoding process failed ({e!r}); that body is "
                      "decoded in the controller, and a new process is started for the next",
                      file=sys.stderr, flush=True)
            return None
        except BaseException:  # cancelled: the child is ended once it has answered
            cf.add_done_callback(_end_abandoned)
            raise
        if self.closed:
            self._threads.submit(child.close)
        else:
            self._idle.append(child)
        return answer

    async def close(self) -> None:
        """End the children (a body being decoded still gets its answer)."""
        self.closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(asyncio.wrap_future(self._threads.submit(c.close))
                               for c in idle))
        self._threads.shutdown(wait=False)


def _serve(stdin, stdout) -> None:
    """A child: decode each body read from ``stdin`` and write its answer, until EOF."""
    while True:
        head = stdin.read(_LENGTHS.size)
        if len(head) < _LENGTHS.size:
            return
        h, b = _LENGTHS.unpack(head)
        body = stdin.read(h + b)
        if len(body) < h + b:
            return
        view = memoryview(body)
        try:
            inputs, *rest = decode(view[:h], view[h:])
            for t in inputs:  # (binary inputs are views of the body: bytes to travel)
                if isinstance(t.data, memoryview):
                    t.data = t.data.tobytes()
            answer = ("ok", (inputs, *rest))
        except KServeError as e:
            answer = ("err", e.kind, e.message)
        out = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(_LENGTH.pack(len(out)))
        stdout.write(out)
        stdout.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # bulk work: the controller and workers go first
        os.nice(NICE)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
