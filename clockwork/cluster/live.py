"""The live cluster's user commands: ``clockwork infer``, ``clockwork workers``
(composition root; talks to the controller over gRPC only)."""

from __future__ import annotations

import argparse
import sys


def cmd_infer(args: argparse.Namespace) -> int:
    from clockwork.errors import ClockworkError, InvalidRequest, Unauthenticated

    c = _client(args, "infer")
    if c is None:
        return 2
    with c:
        try:
            if args.list:
                print("instance\tprofile\tbatch sizes\tinputs\toutputs")
                for m in c.list_models():
                    print(f"{m.name}\t{m.profile}\tbatch {m.batch_sizes}\t"
                          f"in {m.inputs}\tout {m.outputs}")
                return 0
            if not args.model:
                print("clockwork infer: give a MODEL (or --list)", file=sys.stderr)
                return 2
            for _ in range(args.n):
                r = c.infer(args.model, None, slo_ms=args.slo_ms)
                outs = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in r.outputs.items())
                print(f"{args.model}: ok in {r.latency_ms:.2f} ms (controller "
                      f"{r.server_latency_ms:.2f} ms, batch {r.batch_size}, gpu {r.gpu}"
                      f"{', cold' if r.cold else ''}) outputs: {outs}")
        except ClockworkError as e:
            print(f"clockwork infer: {type(e).__name__}: {e}", file=sys.stderr)
            # (2: what the user must correct, a token refused or a request the controller
            # turns away as asked, an unknown model; 1: a failure while running)
            return 2 if isinstance(e, Unauthenticated | InvalidRequest) else 1
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    """``clockwork workers [list | add ADDRESS | remove ADDRESS]``."""
    from clockwork.errors import ClockworkError, InvalidRequest, Unauthenticated

    what = args.action
    if args.drain and what != "remove":
        print(f"clockwork workers: --drain goes with remove, not {what}", file=sys.stderr)
        return 2
    if (what == "list") != (args.address is None):
        print(f"clockwork workers: {what} " + ("takes no ADDRESS" if what == "list" else
                                                "needs the worker's ADDRESS (HOST:PORT)"),
              file=sys.stderr)
        return 2
    c = _client(args, "workers")
    if c is None:
        return 2
    with c:
        try:
            if what == "add":
                got = c.add_worker(args.address)
                print(f"worker {_index(got['worker'])} ({args.address}): "
                      + ("added" if got["added"] else "a worker of the controller already")
                      + f", GPUs {_gpus(got['gpus'])}")
            elif what == "remove":
                try:
                    got = c.remove_worker(args.address, drain=args.drain)
                except KeyboardInterrupt:
                    if args.drain:  # (the controller's drain does not end with this call)
                        print(f"clockwork workers: interrupted; a drain of {args.address} "
                              "the controller began goes on, and it is removed at its end "
                              "(clockwork workers shows it draining until then)",
                              file=sys.stderr)
                        return 130
                    raise
                print(f"worker {_index(got['worker'])} ({args.address}): "
                      + ("removed" if got["removed"] else "removed already")
                      + (f", GPUs {_gpus(got['gpus'])}" if got["gpus"] else "")
                      + _removal(got, args.drain))
            else:
                _print_workers(c.workers())
        except ClockworkError as e:
            print(f"clockwork workers: {type(e).__name__}: {e}", file=sys.stderr)
            return 2 if isinstance(e, Unauthenticated | InvalidRequest) else 1
    return 0


def _client(args: argparse.Namespace, verb: str):
    """The ``clockwork.Client`` the command's flags describe (controller, timeout, token,
    TLS); None after saying why the token cannot be read or the TLS flags not used."""
    from clockwork.client import Client
    from clockwork.protocol.security import SecurityError, client_token

    try:  # (a token that cannot be read, a client certificate without its key)
        token = client_token(getattr(args, "token", None), getattr(args, "token_file", None))
        return Client(args.controller, timeout=args.timeout, token=token, **client_tls(args))
    except SecurityError as e:
        print(f"clockwork {verb}: {e}", file=sys.stderr)
        return None


def client_tls(args: argparse.Namespace) -> dict:
    """The TLS keywords of ``Client`` / ``AsyncClient`` that a client command's flags
    give (``--tls``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``); ``SecurityError``,
    naming the flags, for a certificate without its key or a key without its
    certificate."""
    from clockwork.protocol.security import SecurityError

    got = {k: getattr(args, k, None) for k in ("tls_ca", "tls_cert", "tls_key")}
    if (got["tls_cert"] is None) != (got["tls_key"] is None):
        raise SecurityError("--tls-cert and --tls-key go together: a client certificate "
                            "needs its private key (give both, or neither)")
    return got | {"tls": bool(getattr(args, "tls", False))}


def _removal(got: dict, drain: bool) -> str:
    """How a removal went, for ``clockwork workers remove``: drained, or what failed."""
    if not got["removed"] or got["worker"] < 0:
        return ""
    if got["drained"]:
        return ", drained: its actions in flight finished there"
    said = ("; not drained (lost meanwhile, or --timeout ran out)" if drain else "")
    if got["failed"]:
        said += (f"; {got['failed']} action(s) in flight failed (their requests placed "
                 "again or answered)")
    return said


def _index(i: int) -> str:
    """A worker's index, ``-`` for one listed at the controller's start, never in."""
    return str(i) if i >= 0 else "-"


def _gpus(gpus: list[int]) -> str:
    return ",".join(map(str, gpus)) or "none"


def _print_workers(rows: list[dict]) -> None:
    """One line a worker, aligned: index, address, state, GPUs, link, round trip, time in
    that state, and why (lost, held, awaited)."""
    head = ("worker", "address", "state", "gpus", "link", "rtt ms", "for", "detail")
    table = [head] + [
        (_index(r["worker"]), r["address"], r["state"],
         _gpus(r["gpus"]) if r["gpus"] else "-", r["link"] or "-",
         f"{r['rtt_ms']:.2f}" if r["rtt_ms"] else "-",
         _span(r["for_s"]) if r["for_s"] else "-", r["detail"]) for r in rows]
    widths = [max(len(row[k]) for row in table) for k in range(len(head) - 1)]
    for row in table:
        print(("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=False))
               + "  " + row[-1]).rstrip())
    if not rows:
        print("(no workers)")


def _span(s: float) -> str:
    """``s`` seconds in words: 42 s, 12 min, 3.5 h, 2.1 d."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
