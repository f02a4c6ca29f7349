"""``clockwork replay``: a scenario's ``[[workloads]]`` against a live controller.

The workloads are the simulator's objects (``build_workload`` + ``bind``), driven on the
real clock: open loops by their arrival times, closed loops by the answers. Requests go
over one pipelined ``InferStream`` (several per message), at most ``max_outstanding`` in
flight. Latency is measured here, from each request's arrival time (as the simulator
counts it) to its answer, so it includes the network both ways, and the wait of a
request sent late -- the client fell behind, or ``max_outstanding`` held it back -- which
also counts against its SLO at the controller; how late requests went out is the
summary's ``send_lag_ms``. A controller that goes away ends the replay at once (no more
requests; the summary says ``stopped`` and covers the run until then).
Writes the same outputs as ``simulate``: summary.json, requests.tsv, actions.tsv (empty:
actions are the controller's, in its ``--log-dir``, which ``serve --replay --out OUT``
sets to OUT/controller; their counts come from its Stats), run.json.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clockwork.actions import RequestStatus
from clockwork.models.reference import POOL
from clockwork.protocol.waits import wait_set
from clockwork.requests import DONE, Reply, Request
from clockwork.scenario import Scenario, ScenarioError, instance_names, load_scenario
from clockwork.sizes import PROGRESS_LOG_S
from clockwork.telemetry import Telemetry, emit_run, write_run
from clockwork.time import NS_PER_S, ms, sec

TICK_S = 0.0005  # arrivals due within this of each other are sent in one message
MESSAGES_KEPT, MESSAGE_CHARS = 50, 300  # failure messages counted apart, and their length
# a failure message's figures (a number on its own, not part of a name such as resnet50_v2):
# counted apart they made one kind of failure (EXEC_TOO_LATE: late by 45.634 ms) as many
# kinds as requests
_FIGURE = re.compile(r"(?<![\w.:])\d+(?:\.\d+)?(?![\w.])")  # (nor a copy's, name:3)


def failure_kind(message: str) -> str:
    """A failure message with its figures as ``#``: the kind failures are counted by."""
    return _FIGURE.sub("#", message)
STREAM_INTERVAL_US = 2000.0  # at most one request message per 2 ms (clockwork.protocol.pacing)
LAG_WARN_MS = 10  # requests sent this much later than their arrival (p99): said on stderr
LAG_UNIT_NS = 100_000  # send_lag_ms is counted in steps of 0.1 ms
LONG_WAIT_S = 0.002  # longer waits also wake early for answers (closed loops resend)
STOP_POLL_S = 0.1  # with ``stop``: how often a wait looks whether it was asked

now_ns = time.monotonic_ns


@dataclass
class ReplayResult:
    summary: dict
    telemetry: Telemetry
    scenario: Scenario
    wall_s: float
    answered_once: bool
    interrupted: bool = False  # ``stop`` ended it early (its figures cover until then)
    # the cluster's processes wrote their output into the run's folder (serve --replay)
    own_process_logs: bool = False

    def write(self, out: str | Path) -> Path:
        from clockwork.cluster.sim import run_info

        info = run_info(self.wall_s, self.scenario)
        info["mode"] = "live"
        return write_run(out, self.telemetry, self.summary, info, self.own_process_logs)


async def replay(sc: Scenario, controller: str, max_outstanding: int = 20000,
                 progress: bool = False, check_packages: str | None = None,
                 on_start=None, *, token: str | None = None, tls: bool = False,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None,
                 stream_interval_us: float = STREAM_INTERVAL_US,
                 warn_late: bool = True, stop=None,
                 spill_dir: str | None = None, reconnect: bool = False,
                 earlier_counts=None) -> ReplayResult:
    """Drive ``sc``'s workloads against a live controller. ``check_packages``: send real
    inputs (a seeded pool per model) and check every answer's output against the zoo
    model's numpy reference with that package folder's weights (``summary["outputs"]``).
    ``on_start(t0)``: called with the replay's time zero (``time.monotonic_ns``) as the
    first request is due (``clockwork serve`` starts its ``[faults]`` from it).
    ``token``, ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``: as
    ``clockwork.AsyncClient``'s (default token:
    ``$CLOCKWORK_TOKEN``). ``stream_interval_us``: the request stream's pacing interval
    under load (``clockwork.protocol.pacing``; 0: none). ``warn_late``: say on stderr
    when requests went out late (the summary's ``send_lag_ms`` says it always).
    ``stop``: a callable, looked at while the replay runs (at least every
    ``STOP_POLL_S``); once it returns true no more requests are sent, the answers still
    due are awaited (each no longer than its SLO and the stream's grace), and the result
    covers the run until then (``summary["stopped"]``, ``interrupted``). ``spill_dir``:
    the request rows in files in a temporary folder inside it, not in memory
    (``Telemetry``'s), so that a long replay's memory stays flat. ``reconnect``: the
    controller is restarted during the run (``clockwork serve``'s controller_restart
    faults): what it had not answered as it went away fails (ERROR), the requests due
    meanwhile wait in the stream for the new one (each given up at its SLO plus the
    stream's grace), and the run goes on; without it, a controller that goes away ends
    the run there. ``earlier_counts()``: with ``reconnect``, the counters of each
    controller that went away, read just before (None where they could not be): the
    action counts add them to the last controller's."""
    from clockwork.client import AsyncClient
    from clockwork.errors import ControllerUnavailable
    from clockwork.profiles import load_profile_set
    from clockwork.resources import scenario_folder
    from clockwork.workloads import build_workload, end_note

    instances = instance_names(sc.models)
    pset = load_profile_set(str(sc.cluster["profiles"]), scenario_folder(sc))
    exec1 = {}
    for i, m in instances.items():
        p = pset.get(m)
        exec1[i] = p.exec_ns[p.batch_sizes[0]]
    duration = sec(sc.duration_s)
    root = np.random.SeedSequence(sc.seed)
    s_work, _, _ = root.spawn(3)  # the simulator's split, so the arrivals are the same
    workloads = []
    for i, (spec, seed) in enumerate(zip(sc.workloads, s_work.spawn(len(sc.workloads)),
                                         strict=True)):
        try:  # (what bind refuses too, as the simulator says it)
            w = build_workload(spec, instances, scenario_folder(sc))
            w.bind(0, duration, np.random.default_rng(seed), exec1)
        except ValueError as e:
            raise ScenarioError(f"workloads.{i}: {e}") from e
        workloads.append(w)
        for n in [*getattr(w, "notes", ()), end_note(w, sc.duration_s)]:  # (as the
            if n:  # simulator says them)
                print(f"clockwork replay: warning: workloads.{i} ({w.kind}): {n}",
                      file=sys.stderr, flush=True)

    client = AsyncClient(controller, token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
                         tls_key=tls_key)
    info = await client.list_models_raw()
    served = {m.name for m in info.models}
    missing = sorted(set(instances) - served)
    if missing:
        await client.close()
        raise ScenarioError(f"the controller does not serve {len(missing):,} of the "
                            f"scenario's {len(set(instances)):,} model instances "
                            f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); "
                            "serve them (clockwork serve SCENARIO starts a cluster that does, "
                            "or load them: Client.load_model)")
    default_slo = ms(info.default_slo_ms or 100.0)
    check = None
    specs: dict[str, tuple[str, list]] = {}  # instance -> (profile, input pool)
    if check_packages:
        from clockwork.models.reference import OutputCheck

        check = OutputCheck(check_packages, sc.seed)
        for mi in info.models:  # (the scenario's: a reference costs a forward pass)
            if mi.inputs and mi.name in instances:
                t = mi.inputs[0]
                specs[mi.name] = (mi.profile, check.pool(mi.profile, tuple(t.shape), t.dtype))
        sent_to = sorted({specs[n][0] for n in instances if n in specs})
        if not any((Path(check_packages) / p / "model.json").exists() for p in sent_to):
            await client.close()
            raise ScenarioError(f"--check-outputs {check_packages}: no compiled package "
                                f"there for any model of the scenario "
                                f"({', '.join(sent_to[:5]) or 'none with inputs'}"
                                f"{' ...' if len(sent_to) > 5 else ''}): nothing to check "
                                "against")
    stats0 = await client.stats()
    # (not reconnecting: a replay whose controller went away stops sending and says when;
    # its table is of one controller's run)
    stream = client.stream(stream_interval_us, answer_times=True, reconnect=reconnect)
    answered_ns = stream.answered_ns
    tel = Telemetry(0, spill_dir=spill_dir)
    heap: list = []  # (t, seq, model, slo, widx) relative to t0
    seq = 0
    open_next = [None] * len(workloads)
    for i, w in enumerate(workloads):
        for t, m, slo in w.initial(0):
            seq += 1
            heapq.heappush(heap, (t, seq, m, slo, i))
        open_next[i] = w.next_arrival()
    # unsent: requests the client answered TIMEOUT itself, their SLO over before they
    # could go out (the controller never saw them)
    # no_answer: requests the client gave up on, no answer by their SLO plus its grace
    state = {"sent": 0, "answered": 0, "dup": 0, "unsent": 0, "no_answer": 0}
    lost: list = []  # (when, why) the controller went away: nothing more is sent
    lags: Counter[int] = Counter()  # how late requests went out, in LAG_UNIT_NS
    failures: Counter[str] = Counter()  # what the failed requests were told, by message
    done_evt = asyncio.Event()
    t0 = now_ns()
    if on_start is not None:
        on_start(t0)

    def on_done(resp, exc: BaseException | None, req: Request, widx: int) -> None:
        """``req``'s answer (``resp``) or failure (``exc``), as the stream reads it."""
        nonlocal seq
        now = now_ns()
        if req.state == DONE:  # (marked on the request: no set of every id answered)
            state["dup"] += 1
            return
        req.state = DONE
        state["answered"] += 1
        if exc is not None:
            if isinstance(exc, ControllerUnavailable) and not lost and not reconnect:
                lost.append((now - t0, str(exc)))
            rep = Reply(req, RequestStatus.ERROR, now - t0, str(exc))
        else:
            # (its latency to when its answer was read, the instant the client judged it
            # on time or late by: this callback may run tens of ms later on a busy loop)
            read = answered_ns.pop(resp.client_id, None)
            req.cold = resp.cold
            status = resp.status
            if status == 4 and resp.reason == "late" and resp.gpu < 0:
                state["unsent"] += 1
            elif status == 4 and resp.reason == "no_answer":
                state["no_answer"] += 1
            if status == 4 and resp.reason == "late" and resp.gpu >= 0:
                # the controller's SUCCESS, read past its SLO (the client calls it a late
                # TIMEOUT): logged as the simulator logs it, SUCCESS not within the SLO
                status = 0
            if check is not None and status == 0 and resp.outputs and req.model in specs:
                t = resp.outputs[0]  # (a late one's too: every success is checked)
                check.record(specs[req.model][0], req.id % POOL,
                             np.frombuffer(t.data, dtype=t.dtype).reshape(tuple(t.shape)))
            rep = Reply(req, RequestStatus(status), (now if read is None else read) - t0,
                        resp.message, resp.gpu, resp.batch_size)
        tel.reply(rep)
        if rep.status not in (RequestStatus.SUCCESS, RequestStatus.TIMEOUT):
            why = failure_kind(rep.message[:MESSAGE_CHARS]) or rep.status.name
            if why in failures or len(failures) < MESSAGES_KEPT:
                failures[why] += 1
            else:
                failures["(other messages)"] += 1
        w = workloads[widx]
        for t, m, slo in w.on_reply(req.model, rep.status == RequestStatus.SUCCESS, now - t0):
            seq += 1
            heapq.heappush(heap, (t, seq, m, slo, widx))
        done_evt.set()

    def send(m: str, slo: int, widx: int, now: int, at: int) -> None:
        """Request ``m`` due at ``at`` (from t0), sent ``now``: it counts from ``at``."""
        rid = state["sent"]
        state["sent"] += 1
        late = now - t0 - at
        lags[late // LAG_UNIT_NS if late > 0 else 0] += 1
        req = Request(rid, m, at, slo or default_slo, widx)
        since = t0 + at
        def answer(resp, exc, r=req, i=widx) -> None:
            on_done(resp, exc, r, i)

        if check is not None and m in specs:
            stream.submit(m, specs[m][1][rid % POOL], slo / 1e6 if slo else None,
                          since_ns=since, on_answer=answer)
        else:
            stream.submit(m, None, slo / 1e6 if slo else None, skip_outputs=True,
                          since_ns=since, on_answer=answer)

    last = time.monotonic()
    # on a terminal a line redrawn every second; in a log file a line every 30 s
    every, end = (1.0, "\r") if sys.stderr.isatty() else (PROGRESS_LOG_S, "\n")
    halted = None  # when ``stop`` said to (ns from t0)
    poll = float("inf") if stop is None else STOP_POLL_S
    while True:
        now = now_ns()
        rel = now - t0
        if stop is not None and stop():
            halted = rel
            break
        if lost:  # the controller went away: what was sent fails fast, nothing more goes
            if state["sent"] == state["answered"]:
                break
            done_evt.clear()
            await wait_set(done_evt, 1.0)
            continue
        # due arrivals: open loops' own schedule, then queued closed-loop ones
        for i, w in enumerate(workloads):
            nxt = open_next[i]
            while nxt is not None and nxt[0] <= rel:
                if state["sent"] - state["answered"] >= max_outstanding or lost:
                    break  # (lost: the controller went away, whatever is sent fails)
                send(nxt[1], nxt[2], i, now, nxt[0])
                nxt = w.next_arrival()
            open_next[i] = nxt
        while (heap and heap[0][0] <= rel and state["sent"] - state["answered"] < max_outstanding
               and not lost):
            t, _, m, slo, widx = heapq.heappop(heap)
            send(m, slo, widx, now, t)
        if progress and time.monotonic() - last >= every:
            last = time.monotonic()
            out = state["sent"] - state["answered"]
            sys.stderr.write(f"  replay {rel / NS_PER_S:6.1f} s / {sc.duration_s:.1f} s  "
                             f"{state['sent']:,} sent  {state['answered']:,} answered  "
                             f"{out:,} in flight   {end}")
            sys.stderr.flush()
        pending_open = [n[0] for n in open_next if n is not None and n[0] < duration]
        pending_heap = heap[0][0] if heap and heap[0][0] < duration else None
        if not pending_open and pending_heap is None:
            # nothing more to send (arrivals at/after duration are not admitted)
            if state["sent"] == state["answered"]:
                break
            done_evt.clear()
            await wait_set(done_evt, min(1.0, poll))
            continue
        nxt_t = min(pending_open + ([pending_heap] if pending_heap is not None else []))
        delay = (t0 + nxt_t - now_ns()) / 1e9
        if state["sent"] - state["answered"] >= max_outstanding:
            done_evt.clear()
            await wait_set(done_evt, 0.05)
        elif delay >= LONG_WAIT_S:
            done_evt.clear()
            # wake for the next arrival, or earlier when an answer may add arrivals
            await wait_set(done_evt, min(delay, poll))
        elif delay > 0:
            # arrivals close together go out together, up to TICK_S late: one wake-up and
            # one stream message for several requests instead of one each
            await asyncio.sleep(max(delay, TICK_S))
        else:
            await asyncio.sleep(0)
    wall_s = (now_ns() - t0) / NS_PER_S
    if progress and end == "\r":
        sys.stderr.write("\n")
    if halted is not None:
        print(f"clockwork replay: interrupted {halted / NS_PER_S:.1f} s into the run: no more "
              f"requests are sent; waiting for the {state['sent'] - state['answered']:,} "
              "answers still due", file=sys.stderr, flush=True)
    await stream.close()
    # (the controllers the scenario killed; a new one still starting is waited for first)
    earlier = (await asyncio.to_thread(earlier_counts)) if reconnect and earlier_counts \
        else []
    stats1 = None
    if not lost:
        try:
            stats1 = await client.stats()
        except ControllerUnavailable as e:  # (it went away as the last answers came)
            if not reconnect:
                lost.append((now_ns() - t0, str(e)))
    await client.close()
    d = _counted(stats0, stats1, earlier)
    if d is None:  # (a controller's counts unknown: so are the run's)
        stats1, d = None, {}
    extra = {
        "seed": sc.seed, "policy": sc.scheduler.get("policy", "clockwork"),
        "model_instances": len(instances), "mode": "live",
        "answered_once": state["answered"] == state["sent"] and not state["dup"],
    }
    # (a run the controller's loss cut short: its figures cover the time until then)
    cut = [t for t in (lost[0][0] if lost else None, halted) if t is not None]
    summary = tel.summary(min(sc.duration_s, min(cut) / NS_PER_S) if cut
                          else sc.duration_s, extra)
    summary["actions"] = {
        "infer": d.get("infer_ok", 0) + d.get("infer_rejected", 0),
        "load": d.get("load_ok", 0) + d.get("load_rejected", 0),
        "evict": d.get("evict_ok", 0) + d.get("evict_rejected", 0),
        "rejected": sum(v for k, v in d.items() if k.endswith("_rejected")),
    } if stats1 is not None else None  # (the controller's counts: unknown)
    if stats1 is None and reconnect:  # (one of the controllers did not say them)
        summary["actions_where"] = ("a controller's counters could not be read, as it was "
                                    "killed or at the end")
    summary["send_lag_ms"] = _lag_figures(lags)
    summary["not_sent"] = state["unsent"]
    summary["no_answer"] = state["no_answer"]
    late = summary["send_lag_ms"]
    if warn_late and late["p99"] > LAG_WARN_MS:
        print(f"clockwork replay: requests went out late: p99 {late['p99']:g} ms, max "
              f"{late['max']:g} ms after their arrival times (the client could not keep "
              "up, or max_outstanding held them back); their latencies and SLOs count "
              "from the arrival times", file=sys.stderr, flush=True)
    if warn_late and state["unsent"]:
        print(f"clockwork replay: {state['unsent']:,} request(s) were not sent: their SLO "
              "was over before they could go out (dropped, as the controller would have "
              "answered them; its own counts leave them out)", file=sys.stderr, flush=True)
    if warn_late and state["no_answer"]:
        print(f"clockwork replay: {state['no_answer']:,} request(s) had no answer by their "
              "SLO plus the client's grace and were given up (dropped, TIMEOUT no_answer): "
              + ("those that waited for a new controller while the scenario restarted it, "
                 "and any " if reconnect else "")
              + ("the controller may have answered later (held up, or a policy that keeps "
                 "requests past their SLO, as tfserving and infaas do under overload), and "
                 "its own counts then differ"), file=sys.stderr, flush=True)
    if halted is not None and not (lost and lost[0][0] <= halted):
        summary["stopped"] = {"at_s": round(halted / NS_PER_S, 3), "reason": "interrupted"}
    elif lost:
        at, why = lost[0]
        summary["stopped"] = {"at_s": round(at / NS_PER_S, 3), "reason": why}
        print(f"clockwork replay: the controller went away {at / NS_PER_S:.1f} s into the "
              f"run ({why}); stopped there", file=sys.stderr, flush=True)
    # a worker that did not answer a probe in time: its actions failed, and when it
    # answered again it was reset, keeping the weights it had loaded (how many: kept)
    summary["failures"] = [{"message": m, "count": n} for m, n in failures.most_common(3)]
    summary["workers_suspected"] = d.get("worker_suspects", 0)
    summary["weights_kept"] = d.get("weights_kept", 0)
    if reconnect:  # the copies the new controllers took over, as the simulator counts them
        summary["weights_adopted"] = d.get("weights_adopted", 0) if stats1 is not None \
            else None
    # requests of other clients the controller took in meanwhile: its counters (the
    # actions, the suspects above) are the whole controller's, theirs included
    # (not known across a controller restart: the requests a controller took in after
    # its counters were read, as it went away, are in none of them)
    other = other_requests(d.get("requests", 0), state["sent"] - state["unsent"],
                           state["no_answer"]) \
        if stats1 is not None and not reconnect else None
    summary["other_requests"] = other
    if warn_late and other:
        print(f"clockwork replay: the controller took in {other:,} request(s) of other "
              "clients during the replay: the action counts (and workers suspected, weights "
              "kept) are the whole controller's, theirs included", file=sys.stderr,
              flush=True)
    # the action log (and so prediction errors) is the controller's: its --log-dir
    summary["prediction_error_ms"] = None
    if check is not None:
        summary["outputs"] = check.verify()
    return ReplayResult(summary, tel, sc, wall_s, bool(extra["answered_once"]),
                        halted is not None)


def other_requests(taken_in: int, sent: int, given_up: int = 0) -> int | None:
    """Requests of other clients a controller took in during a replay: its request
    counter's growth ``taken_in`` less the replay's ``sent``; None when the replay gave
    requests up unanswered (``given_up``: an overloaded controller may not have read
    them when its counters were read, so the count is not known; it was said as a
    negative number of other clients' requests) or the difference is below 0."""
    other = taken_in - sent
    return other if other >= 0 and not given_up else None


def _counted(first: dict[str, int], last: dict[str, int] | None,
             earlier: list[dict[str, int] | None]) -> dict[str, int] | None:
    """The controllers' counts over a run: ``last`` (the controller's counters at the end)
    less ``first`` (at the start); with ``earlier``, the counters of controllers that went
    away during it, each read just before: the first of them less ``first``, the others
    and ``last`` whole (a new controller counts from 0). None if one is unknown."""
    if last is None or None in earlier:
        return None
    whole = [*earlier, last]
    d = {k: -v for k, v in first.items()}
    for counts in whole:
        for k, v in counts.items():
            d[k] = d.get(k, 0) + v
    return d


def _lag_figures(lags: Counter[int]) -> dict:
    """p50, p99 and max of how late requests went out, in ms, from counts in steps of
    ``LAG_UNIT_NS`` (a figure is the upper end of its step; 0: none was late)."""
    n = sum(lags.values())
    out: dict = {"p50": 0, "p99": 0, "max": 0}
    seen = 0
    wanted = [("p50", 0.5), ("p99", 0.99)]
    step = LAG_UNIT_NS / 1e6
    for k in sorted(lags):
        seen += lags[k]
        while wanted and seen >= wanted[0][1] * n:
            out[wanted.pop(0)[0]] = round((k + 1) * step, 1) if k else 0
    if lags:
        k = max(lags)
        out["max"] = round((k + 1) * step, 1) if k else 0
    return out


def exit_code(e: Exception) -> int:
    """A replay's error as an exit code: 1 for a controller that could not be reached or
    stopped answering (a failure while running), 2 for what the user must correct (the
    scenario, an argument, a token the controller refuses)."""
    from clockwork.errors import ControllerUnavailable, Unauthenticated

    if isinstance(e, ControllerUnavailable) and not isinstance(e, Unauthenticated):
        return 1
    return 2


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        sc = load_scenario(args.scenario, args.set)
    except ScenarioError as e:
        print(f"clockwork replay: {e}", file=sys.stderr)
        return 2
    from clockwork.errors import ClockworkError

    # what a replay against a running controller cannot do: refused or said, not ignored
    events = [k for k in ("kill", "hang", "slow_network", "controller_restart")
              if sc.faults.get(k)]
    if events:
        print(f"clockwork replay: the scenario has [faults] ({', '.join(events)}), which a "
              "replay against a running controller cannot play (it starts no processes): "
              "clockwork serve SCENARIO --replay plays them on a cluster of its own; or "
              + " ".join(f"--set faults.{k}=[]" for k in events), file=sys.stderr)
        return 2
    changes = [k for k in ("repository", "add_workers", "remove_workers") if sc.data.get(k)]
    if changes:
        print(f"clockwork replay: the scenario has [[{']] and [['.join(changes)}]] events, "
              "which a replay against a running controller does not play (they would change "
              "that controller's models or workers for everyone): clockwork serve SCENARIO "
              "--replay plays them on a cluster of its own; or "
              + " ".join(f"--set {k}=[]" for k in changes), file=sys.stderr)
        return 2
    keys = {k.split("=", 1)[0].strip() for k in args.set or ()}
    settled = sorted(k for k in keys if k.split(".")[0] in ("cluster", "scheduler"))
    if settled:
        print(f"clockwork replay: {', '.join(settled)} not applied: the controller's own "
              "cluster and scheduler serve the replay", file=sys.stderr)
    progress = args.progress or (not args.quiet and sys.stderr.isatty())
    try:
        from clockwork.cluster.live import client_tls
        from clockwork.protocol.security import client_token

        token = client_token(getattr(args, "token", None), getattr(args, "token_file", None))
        res = asyncio.run(_until_signalled(lambda stop, began: replay(
            sc, args.controller, args.max_outstanding, progress, args.check_outputs,
            on_start=began, token=token, **client_tls(args), stop=stop,
            spill_dir=getattr(args, "spill_dir", None))))
    except (ScenarioError, ClockworkError, ValueError) as e:
        print(f"clockwork replay: {e}", file=sys.stderr)
        return exit_code(e)
    except asyncio.CancelledError:  # (a second signal: nothing kept)
        print("\nclockwork replay: interrupted", file=sys.stderr)
        return 130
    from clockwork.signals import stops_held

    # (the loop's signal handlers are gone with it, SIGTERM and SIGHUP back at their
    # defaults, which killed the process as the files were written: the hidden folder
    # and the spilled rows left behind, the table lost; then a first signal, raised as
    # Ctrl-C in the middle of the write, lost the files all the same: it is held until
    # they are written, and a second one stops at once)
    with stops_held():
        emit_run(res, sc, f"live replay against {args.controller} in {res.wall_s:.1f} s "
                 f"wall; every request answered exactly once: {res.answered_once}",
                 args.out, args.json, "clockwork replay")
    return run_status(res)


def run_status(res: ReplayResult) -> int:
    """A finished replay's exit status: 130 interrupted (its figures so far shown and
    written), 1 cut short by the controller or not every request answered once, else 0."""
    if res.interrupted:
        return 130
    return 0 if res.answered_once and "stopped" not in res.summary else 1


async def _until_signalled(start):
    """``await start(stop, began)``, where ``stop()`` turns true at Ctrl-C, SIGTERM or
    SIGHUP (the replay ends, keeping its figures so far) and ``began(t0)`` is called as
    the first request is due. A signal before that, or a second one, cancels it at once
    (the first, while it connected, was only noted, and the replay ran on until the
    connection timed out, ~13 s against a controller that never answered)."""
    from clockwork.signals import stop_signals

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    said: list[int] = []
    sending: list[int] = []

    def on_signal() -> None:
        if said or not sending:
            task.cancel()
        said.append(1)

    sigs = stop_signals()
    for sig in sigs:
        loop.add_signal_handler(sig, on_signal)
    try:
        return await start(lambda: bool(said), lambda _t0: sending.append(1))
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)
