"""The live cluster's user commands: ``clockwork infer``, ``clockwork serve``,
``clockwork replay`` (composition root; talks to the processes over gRPC only)."""

from __future__ import annotations

import argparse
import sys


def cmd_infer(args: argparse.Namespace) -> int:
    from clockwork.client import Client
    from clockwork.errors import ClockworkError, InvalidRequest, Unauthenticated
    from clockwork.protocol.security import SecurityError, client_token

    try:
        token = client_token(getattr(args, "token", None), getattr(args, "token_file", None))
    except SecurityError as e:
        print(f"clockwork infer: {e}", file=sys.stderr)
        return 2
    with Client(args.controller, timeout=args.timeout, token=token,
                tls=getattr(args, "tls", False), tls_ca=getattr(args, "tls_ca", None)) as c:
        try:
            if args.list:
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
