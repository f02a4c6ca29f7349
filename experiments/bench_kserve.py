"""Benchmark: the controller's KServe v2 front end against the KServe Python server.

Two servers (and, on request, two bare ones as floors), each a process (or processes) of
its own, reached on loopback (the peer listens on every address of the machine:
``kserve.ModelServer`` takes no host), driven by the same stock client (``tritonclient.grpc.aio`` /
``tritonclient.http.aio``, binary tensor data on REST: the
``Inference-Header-Content-Length`` extension, which kserve 0.21 implements; with
``--protocols json`` or a ``SIZE/json/N`` cell, REST with the tensors as JSON lists):

- ours: a ``LocalCluster`` (one emulated worker, ``--gpus`` GPUs, as in
  ``experiments/bench_rest.py``; KServe gRPC on the controller's main port, REST on its
  ``--http-port``) whose two models do no work: their emulated execution of a batch of 1
  takes ``--exec-us`` µs (EXEC). The client sends no SLO; the controller's default SLO is
  ``--slo-ms`` (long, as the peer has none). Its CPU time is the controller's and the
  worker's;
- the peer: ``kserve.ModelServer`` (kserve 0.21, one uvicorn worker, its gRPC server in the
  same process) serving ``kserve.Model`` subclasses whose ``predict`` does no work: it
  answers with the input (tiny) or a constant array of the output's shape (resnet). Its
  per-request INFO logging is turned off. Note: kserve 0.21 turns a binary REST input into
  a Python list (``InferRequest.from_bytes``), ~0.1 s of CPU for the resnet input;
- the floor (``--servers ours,peer,floor``; gRPC only): a bare ``grpc.aio`` server of the
  same service that answers ``ModelInfer`` from the request alone (the input again for
  tiny, zeros for resnet) with no checks, no model and nothing else: what the Python gRPC
  stack alone costs per call on this machine, which neither the peer nor ours can go
  below;
- the hop (``--servers ...,hop``; gRPC only): the floor plus, for each call, the round trip
  our design makes to a worker process: a 12-byte frame over loopback TCP to a second
  process that sends it back after EXEC (``--exec-us``) on a microsecond timer, as our
  emulated worker does. What any server that hands each request to another process costs
  at least, in CPU and in latency.

The two models, on both servers: ``tiny`` (input ``x`` [1, 64] float32, 256 bytes; output
``y`` as the input) and ``resnet`` (input ``x`` [1, 3, 224, 224] float32, 602,112 bytes;
output ``y`` [1, 1000] float32, what a ResNet answers).

Each cell (size x protocol x concurrency) is run ``--repeats`` times on each server,
interleaved (ours then the peer, then the peer then ours, ...). A run: ``--concurrency``
closed-loop clients (each sends one batch-1 request and the next when the answer arrives)
spread over ``--procs`` client processes (started once, reused), ``--warmup`` seconds of
load, then ``--duration`` seconds in which the answers, their latencies (client-measured,
send to answer) and the servers' CPU time (/proc) are counted. Failed requests are counted
by their error message (must be 0). The per-run lines also give the client processes' CPU
time and the CPU time the idle server used meanwhile (should be ~0).

The table at the end (markdown) has, per cell, the median over the repeats (the best run
in parentheses) of requests/s, p50 and p99 latency (ms), ours/peer requests/s, ours p50
minus EXEC (at concurrency 1: what our front end adds over a server that does no work,
to compare with the peer's p50), the errors and the servers' CPU µs per request; with the
floor and the hop, also their requests/s, p50 and CPU µs per request (gRPC cells).

To measure another version of our code, run it with that version first on ``PYTHONPATH``
(the cluster's processes take their packages from the folder the cluster code was
imported from)::

    (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/experiments/bench_kserve.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    from experiments.bench_rest import cpu_s
except ImportError:  # run by path without the repository on PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parent.parent))
    from experiments.bench_rest import cpu_s


def _argtypes():
    """``clockwork/cluster/cli/argtypes.py`` of this script's checkout (it needs only the
    standard library): the code under test, first on PYTHONPATH, may be older and lack
    some of them."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "clockwork" / "cluster" / "cli" / "argtypes.py"
    spec = importlib.util.spec_from_file_location("bench_kserve_argtypes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


t = _argtypes()

# model -> (input shape, output shape), without the batch dimension
SIZES = {"tiny": ([64], [64]), "resnet": ([3, 224, 224], [1000])}
PROTOCOLS = ("grpc", "rest", "json")  # json: REST with the tensors as JSON lists
PROTOCOL_LABEL = {"grpc": "gRPC", "rest": "REST binary", "json": "REST JSON"}
SERVERS = ("ours", "peer", "floor", "hop")
BARE = ("floor", "hop")  # gRPC only


# ---------------------------------------------------------------- the peer (kserve)

def serve_peer(http_port: int, grpc_port: int) -> None:
    """The peer's process: ``kserve.ModelServer`` with a no-op model per size. Its
    per-request INFO logging (access log, gRPC method, latency) is turned off (ours logs
    nothing per request either)."""
    import logging

    sys.argv = sys.argv[:1]  # kserve parses sys.argv at import
    import kserve
    from kserve import InferOutput, InferRequest, InferResponse

    class NoOp(kserve.Model):
        def __init__(self, name: str, out_shape: list[int]) -> None:
            super().__init__(name)
            self.out = np.zeros([1, *out_shape], np.float32)
            self.echo = name == "tiny"  # answers with its input
            self.ready = True

        async def predict(self, payload: InferRequest, headers=None,
                          response_headers=None) -> InferResponse:
            y = payload.inputs[0].as_numpy() if self.echo else self.out
            out = InferOutput("y", list(y.shape), "FP32")
            out.set_data_from_numpy(y)  # raw bytes (data=y breaks kserve 0.21's to_grpc)
            return InferResponse(
                response_id=payload.id or "", model_name=self.name, infer_outputs=[out],
                use_binary_outputs=payload.use_binary_outputs,
                requested_outputs=payload.request_outputs)

    server = kserve.ModelServer(http_port=http_port, grpc_port=grpc_port, workers=1,
                                enable_latency_logging=False, grace_period=1)
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([NoOp(m, out) for m, (_, out) in SIZES.items()])


# ---------------------------------------------------------------- the floor (bare grpc.aio)

def serve_floor(grpc_port: int, hop_exec_us: float | None = None) -> None:
    """The floor's process: ``inference.GRPCInferenceService`` on a bare ``grpc.aio``
    server. Health and readiness say yes; ``ModelInfer`` answers output ``y``: the first
    input's bytes again (tiny) or zeros of the output's shape (resnet). Nothing is checked
    and nothing else is done.

    With ``hop_exec_us`` (the *hop* server), each ``ModelInfer`` first makes the round trip
    that our design cannot do without: a small frame over loopback TCP to a second process
    (:func:`serve_echo`, started here as a child), which waits ``hop_exec_us`` µs on a
    microsecond timer, as our emulated worker does, and sends it back; the call is
    answered when it returns. The tensor stays in this process, as ours keeps an emulated
    model's."""
    import grpc

    from clockwork.protocol import kserve_pb2 as kpb
    from clockwork.protocol import kserve_pb2_grpc as kpbg

    zeros = {m: bytes(4 * int(np.prod(out))) for m, (_, out) in SIZES.items()}
    shapes = {m: [1, *out] for m, (_, out) in SIZES.items()}
    link: dict = {}  # the hop's connection: writer, pending futures by call number

    class Floor(kpbg.GRPCInferenceServiceServicer):
        async def ServerLive(self, request, context):  # noqa: N802
            return kpb.ServerLiveResponse(live=True)

        async def ServerReady(self, request, context):  # noqa: N802
            return kpb.ServerReadyResponse(ready=True)

        async def ModelReady(self, request, context):  # noqa: N802
            return kpb.ModelReadyResponse(ready=request.name in SIZES)

        async def ModelInfer(self, request, context):  # noqa: N802
            m = request.model_name
            if link:
                link["n"] += 1
                k = link["n"]
                fut = link["pending"][k] = asyncio.get_running_loop().create_future()
                link["writer"].write(HOP_FRAME.pack(HOP_FRAME.size - 4, k))
                await fut
            resp = kpb.ModelInferResponse(model_name=m, id=request.id)
            out = resp.outputs.add()
            out.name, out.datatype = "y", "FP32"
            out.shape.extend(shapes.get(m, ()))
            resp.raw_output_contents.append(
                request.raw_input_contents[0] if m == "tiny" else zeros.get(m, b""))
            return resp

    async def read_replies(reader: asyncio.StreamReader) -> None:
        pending = link["pending"]
        while True:
            _, k = HOP_FRAME.unpack(await reader.readexactly(HOP_FRAME.size))
            fut = pending.pop(k)
            if not fut.done():
                fut.set_result(None)

    async def main() -> None:
        if hop_exec_us is not None:
            port = free_port()
            echo = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                     "--serve-echo", str(port), f"{hop_exec_us:g}"])
            for _ in range(200):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            else:
                echo.kill()
                raise SystemExit("hop: the echo process did not listen")
            link.update(writer=writer, pending={}, n=0,
                        task=asyncio.create_task(read_replies(reader)))
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        kpbg.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


HOP_FRAME = struct.Struct("<IQ")  # length of what follows, call number


def serve_echo(port: int, exec_us: float) -> None:
    """The hop's second process: on a microsecond-precise loop (as our worker's), each
    frame read is sent back ``exec_us`` µs later, timed by a loop timer."""
    from clockwork.protocol.precise_loop import run_precise

    delay = exec_us / 1e6

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()  # (asyncio's TCP sockets have TCP_NODELAY set)
        try:
            while True:
                frame = await reader.readexactly(HOP_FRAME.size)
                loop.call_later(delay, writer.write, frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(conn, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    run_precise(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """A server other than ours as a child process of this file: ``peer``
    (``--serve-peer``), ``floor`` (``--serve-floor``) or ``hop`` (``--serve-hop``, the floor
    and its echo process, ``exec_us`` µs per round trip), in a process group of its own."""

    def __init__(self, log: Path, kind: str = "peer", exec_us: float = 0.0) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log = log
        self.mode = {"peer": ["--serve-peer", str(self.http_port), str(self.grpc_port)],
                     "floor": ["--serve-floor", str(self.grpc_port)],
                     "hop": ["--serve-hop", str(self.grpc_port), f"{exec_us:g}"]}[kind]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start its process (apart from ``__init__``: a caller keeps the Peer before
        it starts, so that an interrupt as it starts still finds it to stop)."""
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), *self.mode],
                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """Stop the server and what it started (the hop's echo process); returns when none
        of them runs any more."""
        if self.proc is None:
            return
        tree = tree_pids([self.proc.pid])
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        try:  # what it started (the hop's echo process)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        wait_gone(tree, 10.0)


# ---------------------------------------------------------------- ours

def write_profiles(d: Path, exec_us: float) -> None:
    """The profile set of ours: one profile per ``SIZES`` entry, ``exec_us`` µs per batch
    of 1 (10 µs more per further row), as ``bench_rest.write_profiles``."""
    (d / "set.json").write_text(json.dumps({"device": "test", "weights_cache_pages": 64}))
    ns = int(exec_us * 1000)
    for name, (ins, outs) in SIZES.items():
        (d / f"{name}.json").write_text(json.dumps({
            "model": name, "device": "test", "weights_bytes": 1 << 20, "load_ns": 2_000_000,
            "exec_ns": {str(b): ns + 10_000 * (b - 1) for b in (1, 2, 4, 8, 16)},
            "inputs": [{"name": "x", "shape": ins, "dtype": "float32"}],
            "outputs": [{"name": "y", "shape": outs, "dtype": "float32"}]}))


# ---------------------------------------------------------------- CPU time of process trees

def tree_pids(roots: list[int]) -> list[int]:
    """``roots`` and their descendants."""
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def wait_gone(pids: list[int], timeout: float) -> None:
    """Until none of ``pids`` runs (gone, or a zombie left for its parent to reap), at most
    ``timeout`` seconds: a SIGKILL is delivered when kill returns, not yet done."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                break  # gone
            if state in ("Z", "X"):
                break
            time.sleep(0.01)


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            total += cpu_s(p)
        except OSError:
            pass
    return total


# ---------------------------------------------------------------- clients

def client_loop(conn) -> None:
    """A client process: runs the jobs it receives (dicts; None ends it) and sends back
    each one's result. Ctrl-C is its parent's to handle (the terminal sends it to the
    whole group): it ends when its parent closes its pipe or kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (job := conn.recv()) is not None:
        fn = ready_job if job["kind"] == "ready" else load_job
        conn.send(asyncio.run(fn(job)))
    conn.close()


def _client(proto: str, url: str, n: int):
    if proto == "grpc":
        import tritonclient.grpc.aio as tc

        return tc, tc.InferenceServerClient(url)
    import tritonclient.http.aio as tc

    return tc, tc.InferenceServerClient(url, conn_limit=max(n, 1), conn_timeout=60.0)


async def ready_job(job: dict) -> str:
    """Polls the server's readiness and its models' until all are ready; "" or why not."""
    deadline = time.monotonic() + job["timeout"]
    why = "not ready"
    for proto, url in job["urls"].items():
        _, cl = _client(proto, url, 1)
        try:
            while True:
                try:
                    if await cl.is_server_ready() and all(
                            [await cl.is_model_ready(m) for m in SIZES]):
                        break
                    why = f"{proto}: not ready"
                except Exception as e:  # noqa: BLE001 - not listening yet
                    why = f"{proto}: {type(e).__name__}: {str(e)[:200]}"
                if time.monotonic() > deadline:
                    return why
                await asyncio.sleep(0.05)
        finally:
            await cl.close()
    return ""


async def load_job(job: dict) -> dict:
    """``job["n"]`` closed-loop clients until ``job["end"]`` (time.time()); returns the
    latencies (ms) of the answers that arrived inside [warm_end, end), the failures there
    by message, and this process's CPU seconds over that window."""
    proto, n, model = job["proto"], job["n"], job["model"]
    start, warm_end, end = job["start"], job["warm_end"], job["end"]
    ins, outs = SIZES[model]
    tc, cl = _client(proto, job["url"], n)
    x = tc.InferInput("x", [1, *ins], "FP32")
    data = np.ones([1, *ins], np.float32)
    kw = {}
    if proto == "grpc":
        x.set_data_from_numpy(data)
        want = [tc.InferRequestedOutput("y")]
    else:
        binary = proto == "rest"
        x.set_data_from_numpy(data, binary_data=binary)
        want = [tc.InferRequestedOutput("y", binary_data=binary)]
        if not binary:  # (tritonclient names no type; kserve 0.21 reads a body without
            kw["headers"] = {"Content-Type": "application/json"}  # one as binary data)
    out_shape = (1, *outs)
    lat: list[float] = []
    fails: dict[str, int] = {}
    cpu = [0.0, 0.0]

    async def one_client() -> None:
        while (t0 := time.time()) < end:
            p0 = time.perf_counter()
            why = ""
            try:
                r = await cl.infer(model, [x], outputs=want, **kw)
                y = r.as_numpy("y")
                if y is None or y.shape != out_shape:
                    why = f"output y: {None if y is None else y.shape}"
            except Exception as e:  # noqa: BLE001 - counted, by message
                why = f"{type(e).__name__}: {str(e)[:100]}"
            ms = (time.perf_counter() - p0) * 1e3
            t1 = t0 + ms / 1e3
            if warm_end <= t1 < end:
                if why:
                    fails[why] = fails.get(why, 0) + 1
                else:
                    lat.append(ms)

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, warm_end - time.time()))
        cpu[0] = time.process_time()
        await asyncio.sleep(max(0.0, end - time.time()))
        cpu[1] = time.process_time()

    await asyncio.sleep(max(0.0, start - time.time()))
    await asyncio.gather(cpu_window(), *(one_client() for _ in range(n)))
    await cl.close()
    return {"lat": lat, "fails": fails, "cpu_s": cpu[1] - cpu[0]}


class Clients:
    """``procs`` client processes, started once and given one job per run."""

    def __init__(self, procs: int) -> None:
        from clockwork.signals import stops_held

        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(procs):
            a, b = ctx.Pipe()
            p = ctx.Process(target=client_loop, args=(b,), daemon=True)
            with stops_held():  # (a start cut short: the child's EOFError traceback)
                p.start()
            self.pipes.append(a)
            self.procs.append(p)

    def ready(self, urls: dict[str, str], timeout: float = 60.0) -> None:
        self.pipes[0].send({"kind": "ready", "urls": urls, "timeout": timeout})
        why = self.pipes[0].recv()
        if why:
            raise RuntimeError(f"server not ready in {timeout:.0f} s: {why}")

    def load(self, job: dict, concurrency: int, during) -> dict:
        """Runs ``concurrency`` clients spread over the processes; ``during(warm_end,
        end)`` runs meanwhile in this process (CPU readings). Returns the merged result."""
        k = len(self.pipes)
        per = [concurrency // k + (i < concurrency % k) for i in range(k)]
        used = [p for p, n in zip(self.pipes, per, strict=True) if n]
        for pipe, n in zip(self.pipes, per, strict=True):
            if n:
                pipe.send(dict(job, kind="load", n=n))
        extra = during(job["warm_end"], job["end"])
        lat: list[float] = []
        fails: dict[str, int] = {}
        client_cpu = 0.0
        for pipe in used:
            r = pipe.recv()
            lat += r["lat"]
            client_cpu += r["cpu_s"]
            for m, c in r["fails"].items():
                fails[m] = fails.get(m, 0) + c
        return {"lat": lat, "fails": fails, "client_cpu_s": client_cpu, **extra}

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for p in self.procs:
            p.join(10)


# ---------------------------------------------------------------- the runs

def one_run(clients: Clients, server: str, urls: dict, pids: dict, cell: tuple,
            args) -> dict:
    model, proto, conc = cell
    start = time.time() + 0.3
    warm_end = start + args.warmup
    end = warm_end + args.duration
    others = [p for s, ps in pids.items() if s != server for p in ps]

    def during(warm_end: float, end: float) -> dict:
        time.sleep(max(0.0, warm_end - time.time()))
        mine, theirs = tree_pids(pids[server]), tree_pids(others)
        c0, o0 = tree_cpu(mine), tree_cpu(theirs)
        time.sleep(max(0.0, end - time.time()))
        return {"server_cpu_s": tree_cpu(mine) - c0, "idle_cpu_s": tree_cpu(theirs) - o0}

    job = {"proto": proto, "url": urls[server][proto], "model": model, "start": start,
           "warm_end": warm_end, "end": end}
    r = clients.load(job, conc, during)
    n = len(r["lat"])
    a = np.array(r["lat"]) if n else np.array([float("nan")])
    return {"server": server, "size": model, "proto": proto, "concurrency": conc,
            "requests": n, "rps": n / args.duration,
            "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "failed": sum(r["fails"].values()), "failures": r["fails"],
            "server_cpu_us": r["server_cpu_s"] / max(n, 1) * 1e6,
            "client_cpu_us": r["client_cpu_s"] / max(n, 1) * 1e6,
            "idle_other_cpu_ms": r["idle_cpu_s"] * 1e3}


def _items(option: str, text: str, item) -> list:
    """``text`` as a comma-separated list of ``item``s; a bad one raises
    ``argparse.ArgumentTypeError`` naming ``option``."""
    try:
        return t.comma_list(item)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"argument {option}: {e}") from None


def parse_cell(text: str) -> tuple[str, str, int]:
    """A ``--cells`` item: SIZE/PROTOCOL/CLIENTS."""
    parts = text.split("/")
    try:
        if len(parts) != 3 or parts[0] not in SIZES or parts[1] not in PROTOCOLS:
            raise argparse.ArgumentTypeError
        return parts[0], parts[1], t.positive_int(parts[2])
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"want SIZE/PROTOCOL/CLIENTS with SIZE in {list(SIZES)}, PROTOCOL in "
            f"{list(PROTOCOLS)} and CLIENTS >= 1, got {text!r}") from None


def cells_of(args) -> list[tuple]:
    """The cells (size, protocol, clients): ``--cells``, else ``--sizes`` x ``--protocols``
    x ``--concurrency``. A bad one raises ``argparse.ArgumentTypeError``."""
    if args.cells:
        return _items("--cells", args.cells, parse_cell)
    sizes = _items("--sizes", args.sizes, t.one_of(*SIZES))
    protos = _items("--protocols", args.protocols, t.one_of(*PROTOCOLS))
    concs = _items("--concurrency", args.concurrency, t.positive_int)
    return [(s, p, c) for s in sizes for p in protos for c in concs]


def servers_of(args) -> list[str]:
    """``--servers``, in order. A bad one raises ``argparse.ArgumentTypeError``."""
    return _items("--servers", args.servers, t.one_of(*SERVERS))


def run_all(args) -> list[dict]:
    from clockwork.cluster.local import LocalCluster

    cells = cells_of(args)
    servers = servers_of(args)
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_profiles(Path(tmp), args.exec_us)
        others: dict = {}
        clients = cluster = None
        try:  # (everything started inside: an interrupt at start stops what had started)
            for s in servers:
                if s != "ours":
                    others[s] = Peer(Path(tmp) / f"{s}.log", s, args.exec_us)
                    others[s].start()
            clients = Clients(args.procs)
            cluster = LocalCluster(workers=1, gpus=args.gpus, profiles=tmp, http_port=0,
                                   timeout=60.0,
                                   controller_args=["--default-slo-ms", f"{args.slo_ms:g}"])
            urls, pids = {}, {}
            if "ours" in servers:
                cluster.start()
                http = cluster.printed_address("http")
                urls["ours"] = {"grpc": cluster.address, "rest": http, "json": http}
                pids["ours"] = [cluster.controller.proc.pid] + [
                    w.proc.pid for w in cluster.workers]
            for s, p in others.items():
                urls[s] = {"grpc": f"127.0.0.1:{p.grpc_port}"}
                if s not in BARE:
                    urls[s]["rest"] = urls[s]["json"] = f"127.0.0.1:{p.http_port}"
                pids[s] = [p.proc.pid]
            for s in servers:
                try:
                    clients.ready(urls[s])
                except RuntimeError as e:
                    log = others[s].log.read_text()[-3000:] if s in others else ""
                    raise RuntimeError(f"{s}: {e}\n{log}") from None
            for s in SERVERS:
                pids.setdefault(s, [])
            for rep in range(args.repeats):
                for cell in cells:
                    order = servers if rep % 2 == 0 else servers[::-1]
                    for s in order:
                        if cell[1] not in urls[s]:
                            continue  # the floor and the hop speak gRPC only
                        r = one_run(clients, s, urls, pids, cell, args)
                        r["repeat"] = rep
                        results.append(r)
                        print_run(r)
        finally:
            if clients is not None:
                with contextlib.suppress(OSError):  # (a client process gone: the rest on)
                    clients.close()
            if cluster is not None:
                cluster.stop()
            for p in others.values():
                p.stop()
            _stop_stray_servers()
    return results


def _stop_stray_servers() -> None:
    """Kill the server processes of this script still running as children of this
    process (each in a session of its own, with what it started): one whose ``Popen`` an
    interrupt cut short has no ``Peer.proc`` to stop it by."""
    me = os.getpid()
    for pid in tree_pids([me]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                serving = pid != me and b"--serve-" in f.read()
        except OSError:
            continue
        if serving:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def print_run(r: dict) -> None:
    print(f"[{r['server']:4}] {r['size']:6} {r['proto']:4} c={r['concurrency']:<3} "
          f"rep {r['repeat'] + 1}: {r['rps']:8,.0f} req/s  p50 {r['p50_ms']:7.2f} ms  "
          f"p99 {r['p99_ms']:7.2f} ms  server {r['server_cpu_us']:6.0f} µs CPU/req  "
          f"clients {r['client_cpu_us']:5.0f} µs CPU/req  idle other "
          f"{r['idle_other_cpu_ms']:.0f} ms CPU  {r['failed']} failed"
          + (f" {r['failures']}" if r["failed"] else ""), flush=True)


def by_cell(results: list[dict]) -> dict[tuple, list[dict]]:
    """The runs by (size, protocol, clients, server)."""
    by: dict[tuple, list[dict]] = {}
    for r in results:
        by.setdefault((r["size"], r["proto"], r["concurrency"], r["server"]), []).append(r)
    return by


def table(results: list[dict], args) -> str:
    """The markdown table: per cell, medians over the repeats (best in parentheses)."""
    exec_ms = args.exec_us / 1e3
    by = by_cell(results)

    def med(rs, k):
        return statistics.median(r[k] for r in rs) if rs else float("nan")

    def fig(rs, k, fmt, best):
        if not rs:
            return "–"
        return f"{med(rs, k):{fmt}} ({best(r[k] for r in rs):{fmt}})"

    bare = [s for s in BARE if s in servers_of(args)]
    lines = [
        "| size | protocol | clients | ours req/s | peer req/s | ours/peer | ours p50 ms "
        "| ours p50 − EXEC | peer p50 ms | ours p99 ms | peer p99 ms | errors ours/peer "
        "| server CPU µs/req ours/peer |"
        + "".join(f" {s} req/s | {s} p50 ms | {s} CPU µs/req |" for s in bare),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|" + "--:|--:|--:|" * len(bare)]
    for cell in cells_of(args):
        o, p = by.get((*cell, "ours"), []), by.get((*cell, "peer"), [])
        ratio = (f"{med(o, 'rps') / med(p, 'rps'):.2f}" if o and p and med(p, "rps")
                 else "–")
        p50x = f"{med(o, 'p50_ms') - exec_ms:.2f}" if o else "–"
        errs = "/".join(str(sum(r["failed"] for r in rs)) if rs else "–" for rs in (o, p))
        cpu = "/".join(f"{med(rs, 'server_cpu_us'):.0f}" if rs else "–" for rs in (o, p))
        line = (
            f"| {cell[0]} | {PROTOCOL_LABEL[cell[1]]} | {cell[2]} "
            f"| {fig(o, 'rps', ',.0f', max)} | {fig(p, 'rps', ',.0f', max)} | {ratio} "
            f"| {fig(o, 'p50_ms', '.2f', min)} | {p50x} | {fig(p, 'p50_ms', '.2f', min)} "
            f"| {fig(o, 'p99_ms', '.2f', min)} | {fig(p, 'p99_ms', '.2f', min)} "
            f"| {errs} | {cpu} |")
        for s in bare:
            f = by.get((*cell, s), [])
            cpu_f = f"{med(f, 'server_cpu_us'):.0f}" if f else "–"
            line += (f" {fig(f, 'rps', ',.0f', max)} | {fig(f, 'p50_ms', '.2f', min)} "
                     f"| {cpu_f} |")
        lines.append(line)
    return "\n".join(lines)


def against_targets(results: list[dict], args) -> list[str]:
    """Lines that check the medians against the targets: from 8 clients ours (and the
    hop) serve at least the peer's requests/s; at 1 client on gRPC ours p50 − EXEC (and
    the hop's) is at most the peer's p50."""
    exec_ms = args.exec_us / 1e3
    by = by_cell(results)

    def med(cell, server, k):
        rs = by.get((*cell, server), [])
        return statistics.median(r[k] for r in rs) if rs else None

    lines = []
    for s in ("ours", "hop"):
        busy = [c for c in cells_of(args) if c[2] >= 8 and med(c, s, "rps") is not None
                and med(c, "peer", "rps")]
        if busy:
            short = [f"{c[0]}/{c[1]}/{c[2]} {med(c, s, 'rps') / med(c, 'peer', 'rps'):.2f}"
                     for c in busy if med(c, s, "rps") < med(c, "peer", "rps")]
            lines.append(f"target, {s} >= the peer's requests/s from 8 clients: "
                         f"{len(busy) - len(short)} of {len(busy)} cells"
                         + (f"; short: {', '.join(short)}" if short else ""))
        one = [c for c in cells_of(args) if c[2] == 1 and c[1] == "grpc"
               and med(c, s, "p50_ms") is not None and med(c, "peer", "p50_ms") is not None]
        for c in one:
            mine, theirs = med(c, s, "p50_ms") - exec_ms, med(c, "peer", "p50_ms")
            lines.append(f"target, {s} p50 - EXEC <= the peer's p50 at 1 client, "
                         f"{c[0]}/{c[1]}: {mine:.2f} against {theirs:.2f} ms: "
                         f"{'met' if mine <= theirs else 'NOT met'}")
    return lines


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-peer":
        serve_peer(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-floor":
        serve_floor(int(sys.argv[2]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-hop":
        serve_floor(int(sys.argv[2]), hop_exec_us=float(sys.argv[3]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-echo":
        serve_echo(int(sys.argv[2]), float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints a line per run and a markdown table at the end (see the module "
               "docstring).")
    ap.add_argument("--sizes", default="tiny,resnet",
                    help="input sizes: tiny (64 float32), resnet (float32 [1,3,224,224])")
    ap.add_argument("--protocols", default="grpc,rest",
                    help="grpc, rest (REST with binary tensor data), json (REST with the "
                         "tensors as JSON lists; not in the default grid)")
    ap.add_argument("--concurrency", default="1,8,32,64",
                    help="closed-loop clients per run (each >= 1), comma-separated")
    ap.add_argument("--cells", default="",
                    help="instead of the grid: SIZE/PROTOCOL/CLIENTS,... (tiny/grpc/8; "
                    "CLIENTS >= 1)")
    ap.add_argument("--servers", default="ours,peer",
                    help="comma-separated, in the order of the first repeat: ours, peer, "
                    "floor (a bare grpc.aio server that checks and runs nothing: the "
                    "Python gRPC stack's own cost), hop (the floor plus a round trip to a "
                    "second process that waits EXEC: the least our design's worker hop "
                    "costs); floor and hop serve gRPC cells only")
    ap.add_argument("--duration", type=t.positive_float, default=5.0,
                    help="seconds measured per run, after the warm-up (> 0)")
    ap.add_argument("--warmup", type=t.nonneg_float, default=1.0,
                    help="seconds of load before measuring, per run (>= 0)")
    ap.add_argument("--repeats", type=t.positive_int, default=2,
                    help="runs per cell and server, interleaved (>= 1)")
    ap.add_argument("--procs", type=t.positive_int, default=1,
                    help="client processes the clients are spread over (>= 1)")
    ap.add_argument("--gpus", type=t.positive_int, default=1,
                    help="ours: emulated GPUs (>= 1)")
    ap.add_argument("--exec-us", type=t.positive_float, default=100.0,
                    help="ours: emulated execution time of a batch of 1 (EXEC), µs "
                    "(>= 0.001)")
    ap.add_argument("--slo-ms", type=t.positive_float, default=10_000.0,
                    help="ours: the controller's default SLO (the client sends none; the "
                    "peer has none), ms (> 0)")
    ap.add_argument("--json", type=t.out_file, metavar="FILE",
                    help="also write every run's figures there")
    args = ap.parse_args()
    try:
        cells = cells_of(args)
        servers = servers_of(args)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if len(set(servers)) < len(servers):  # (each cell ran it twice; the medians mixed)
        ap.error(f"argument --servers: a server given twice: {args.servers}")
    if all(s in BARE for s in servers) and all(p != "grpc" for _, p, _ in cells):
        ap.error("the floor and the hop serve gRPC only, and no cell is gRPC: nothing to "
                 "measure")
    if int(args.exec_us * 1000) < 1:  # the profiles hold whole nanoseconds, at least 1
        ap.error(f"argument --exec-us: must be at least 0.001 (1 ns), got {args.exec_us:g}")
    from importlib.metadata import version

    import controller

    code = str(Path(controller.__file__).resolve().parent.parent)
    print(f"bench_kserve: ours from {code}; kserve {version('kserve')} "
          f"(ModelServer, 1 uvicorn worker); tritonclient {version('tritonclient')} "
          f"(grpc.aio / http.aio, REST with binary tensor data); "
          f"EXEC {args.exec_us:g} µs; load average {open('/proc/loadavg').read().strip()}",
          flush=True)
    results = run_all(args)
    print()
    print(f"median of {args.repeats} run(s) per cell and server (best run in parentheses); "
          f"{args.duration:g} s measured after {args.warmup:g} s warm-up; {args.procs} client "
          f"process(es); EXEC = {args.exec_us / 1e3:g} ms")
    print(table(results, args))
    for line in against_targets(results, args):
        print(line)
    slow = sorted({f"{r['server']} {r['size']}/{r['proto']}/{r['concurrency']}"
                   for r in results if not r["p99_ms"] <= args.warmup * 1e3})
    if slow:
        print(f"note: a run's p99 exceeded the warm-up ({args.warmup:g} s) in: "
              f"{', '.join(slow)}: its closed loop had not reached a steady state when "
              f"measuring began, so its latencies are those of the first rounds (too low); "
              f"rerun those cells with a longer --warmup")
    print(f"load average after: {open('/proc/loadavg').read().strip()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "code": code,
                                               "runs": results}, indent=1))
    failed = sum(r["failed"] for r in results)
    return 0 if failed == 0 and all(r["requests"] for r in results) else 1


if __name__ == "__main__":
    from common import script  # (this folder is the script's: Ctrl-C and SIGTERM in one line)

    script(main)
