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
children (``processes`` 0). So is a child that has not answered within
``answer_timeout_s`` (hung, stopped): it is killed first (it held its slot, and every body
queued behind it, for good).

On a child's stdin, a body is two 8-byte little-endian lengths (its JSON header's, then
the binary data's after it) followed by those bytes; on a pipe of its own (the descriptor
its argument names) the answer is an 8-byte length followed by a pickle of ``("ok", (inputs, parameters, requested outputs,
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
import threading
from pathlib import Path

from controller.kserve_status import INVALID, KServeError
from controller.kserve_validate import json_loads, json_problem, rest_request

_LENGTHS = struct.Struct("<QQ")
_LENGTH = struct.Struct("<Q")
_ROOT = str(Path(__file__).resolve().parents[1])  # where the ``controller`` package lies
NICE = 10  # a child's niceness, added to the controller's
ANSWER_BASE_S = 2.0  # a child that has not answered within this
ANSWER_BYTES_PER_S = 8 << 20  # ... plus a second per this much body is hung (~180 MB/s here)
START_S = 10.0  # ... plus this for a child started for the body (Python and numpy start)


def answer_timeout_s(n: int, new: bool = False) -> float:
    """How long a child (``new``: started for it) may take to answer a body of ``n``
    bytes before it is taken as hung (killed; the body decoded in the controller)."""
    return ANSWER_BASE_S + n / ANSWER_BYTES_PER_S + (START_S if new else 0.0)


def decode(header: bytes | memoryview, binary: bytes | memoryview) -> tuple:
    """A REST inference body's JSON ``header`` and the ``binary`` data after it ->
    (inputs, parameters, requested outputs, {output: binary?}, binary by default,
    ``{"id": ...}`` or ``{}``); ``KServeError`` (INVALID_ARGUMENT) for a bad body."""
    try:
        req = json_loads(header)
    except ValueError as e:
        raise KServeError(INVALID, json_problem("request body", e)) from None
    if not isinstance(req, dict):
        raise KServeError(INVALID, "request body must be a JSON object")
    inputs, params, names, binary_of, binary_all = rest_request(req, binary)
    return inputs, params, names, binary_of, binary_all, ({"id": req["id"]} if "id" in req
                                                          else {})


class _Child:
    """One decoding process and its pipes. Its methods block (the pipes are read and
    written by plain system calls, which let go of Python's lock and copy nothing): they
    run on worker threads. Its answers come on a pipe of their own (the descriptor
    number is its argument), so that nothing else it might print (to stdout, which goes
    nowhere) is read as one; ``-P``: no module of the working folder is imported."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
        r, w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "controller.json_offload", str(w)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, bufsize=0,
                pass_fds=(w,))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.answers = r

    def ask(self, header: bytes | memoryview, binary: bytes | memoryview) -> tuple:
        """Decode one body: the child's answer; EOFError or OSError if the child is gone,
        ValueError if what it says is not an answer."""
        fd = self.proc.stdin.fileno()
        for part in (_LENGTHS.pack(len(header), len(binary)), header, binary):
            view = memoryview(part).cast("B")
            while view:
                view = view[os.write(fd, view):]
        (n,) = _LENGTH.unpack(self._read(_LENGTH.size))
        if n > 8 * (len(header) + len(binary)) + (1 << 20):  # (arrays from that JSON: less)
            raise ValueError(f"the decoding process announced an answer of {n} bytes")
        return pickle.loads(self._read(n))

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = os.readv(self.answers, [view[got:]])
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
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        if self.answers >= 0:
            with contextlib.suppress(OSError):
                os.close(self.answers)
            self.answers = -1


def _ask(held: list, header, binary) -> tuple[_Child, tuple]:
    """On a worker thread: (the child ``held[0]``, its answer), starting a child for
    None (put in ``held``: the loop kills it if it does not answer in time); a child that
    fails is ended."""
    child = held[0]
    if child is None:
        child = held[0] = _Child()
    try:
        return child, child.ask(header, binary)
    except BaseException:
        child.kill()
        raise


def _in_background(f) -> None:
    threading.Thread(target=f, daemon=True, name="json-offload-end").start()


def _close_child_of(f: concurrent.futures.Future) -> None:
    """``_ask``'s future, done: the child of an answer no one waits for any more is
    ended (one that failed was ended by ``_ask``)."""
    if not f.cancelled() and f.exception() is None:
        _in_background(f.result()[0].close)


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
                answer = None if self.closed else await self._ask(header, binary)
            if answer is not None:
                if answer[0] == "err":
                    raise KServeError(answer[1], answer[2])
                return answer[1]
        return await asyncio.get_running_loop().run_in_executor(None, decode, header, binary)

    async def _ask(self, header, binary) -> tuple | None:
        """A child's answer, or None when none could be used (then this body is decoded
        here)."""
        held = [self._idle.pop() if self._idle else None]
        limit = answer_timeout_s(len(header) + len(binary), new=held[0] is None)
        cf = self._threads.submit(_ask, held, header, binary)
        try:
            async with asyncio.timeout(limit):
                child, answer = await asyncio.wrap_future(cf)
        except Exception as e:  # noqa: BLE001 - its child is ended: decoded here instead
            # (gone: killed, out of memory; never started; said something else; or hung:
            # killed now, which ends the ask on its thread)
            if isinstance(e, TimeoutError):
                e = TimeoutError(f"no answer in {limit:.3g} s")
                if held[0] is not None:  # (only the signal: its ask's thread, woken by
                    # the end of its pipes, reaps it and closes them -- closed here too,
                    # a descriptor's number could be another child's by then)
                    with contextlib.suppress(ProcessLookupError):
                        held[0].proc.kill()
                cf.add_done_callback(_close_child_of)  # (one started only now: ended)
            if not self._said:
                self._said = True
                print(f"controller: a JSON decoding process failed ({e!r}); that body is "
                      "decoded in the controller, and a new process is started for the next",
                      file=sys.stderr, flush=True)
            return None
        except BaseException:  # cancelled: its child is ended once the ask is over
            def end(f: concurrent.futures.Future, child=held[0]) -> None:
                if f.cancelled():  # (never ran: the child it was given is idle)
                    if child is not None:
                        _in_background(child.close)
                else:
                    _close_child_of(f)

            cf.add_done_callback(end)
            raise
        if self.closed:
            _in_background(child.close)
        else:
            self._idle.append(child)
        return answer

    async def close(self) -> None:
        """End the idle children; one still decoding is ended once it has answered (its
        body gets the answer), and a body waiting for one is decoded in this process."""
        self.closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(asyncio.to_thread(c.close) for c in idle))
        self._threads.shutdown(wait=False)


def _serve(stdin, answers) -> None:
    """A child: decode each body read from ``stdin`` and write its answer to
    ``answers``, until EOF."""
    while _serve_one(stdin, answers):
        pass


def _serve_one(stdin, answers) -> bool:
    """One body and its answer (this body's objects go when it returns); False at EOF."""
    head = stdin.read(_LENGTHS.size)
    if len(head) < _LENGTHS.size:
        return False
    h, b = _LENGTHS.unpack(head)
    body = stdin.read(h + b)
    if len(body) < h + b:
        return False
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
    answers.write(_LENGTH.pack(len(out)))
    answers.write(out)
    answers.flush()
    return True


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # bulk work: the controller and workers go first
        os.nice(NICE)
    with open(int(sys.argv[1]), "wb", buffering=0) as out:
        _serve(sys.stdin.buffer, out)
