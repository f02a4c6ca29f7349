"""The live cluster's user commands: ``clockwork infer``, ``clockwork serve``,
``clockwork replay`` (composition root; talks to the processes over gRPC only)."""

from __future__ import annotations

import argparse
import sys


def _cmd_infer(args: argparse.Namespace) -> int:
    from clockwork.client import Client
    from clockwork.errors import ClockworkError

    with Client(args.controller, timeout=args.timeout) as c:
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
            return 1
    return 0


def add_infer_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("infer", help="send an inference request to a live controller",
                       description="Send requests (zeros of the model's input shape) to a "
                       "controller and print the answers.")
    p.add_argument("model", nargs="?", help="model instance name")
    p.add_argument("--controller", default="127.0.0.1:12346", help="host:port")
    p.add_argument("--slo-ms", type=float, default=None, help="SLO (default: the controller's)")
    p.add_argument("-n", type=int, default=1, help="how many requests, one after another")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=_cmd_infer)


def _cmd_serve(args: argparse.Namespace) -> int:
    from clockwork.serve import cmd_serve

    return cmd_serve(args)


def _cmd_replay(args: argparse.Namespace) -> int:
    from clockwork.replay import cmd_replay

    return cmd_replay(args)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start a controller and local workers (one command)",
                       description="Start the workers a scenario's [cluster] describes (without a "
                       "scenario: one emulated worker, 1 GPU) and a controller serving its "
                       "[[models]] (without: every reference profile), print the controller's "
                       "address, and stop everything on Ctrl-C / SIGTERM.")
    p.add_argument("scenario", nargs="?", help="scenario TOML (optional)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--device", default=None, choices=["emulated", "cpu", "cuda"],
                   help="worker device (default: the scenario's cluster.device, else emulated); "
                   "cpu runs TVM-compiled packages on this host (missing zoo packages are "
                   "compiled first; needs pip install -e '.[tvm]')")
    p.add_argument("--packages", metavar="DIR", default=None,
                   help="cpu/cuda: model packages as DIR/<model>/ (default packages/DEVICE)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=12346, help="controller port (0: pick one)")
    p.add_argument("--worker-port", type=int, default=0,
                   help="first worker port (default 0: free ports)")
    p.add_argument("--http-port", type=int, default=8000,
                   help="KServe v2 REST, /metrics and health (default 8000; 0: pick one, -1: off)")
    p.add_argument("--kserve-port", type=int, default=8001,
                   help="KServe v2 gRPC port (default 8001, as Triton; 0: pick one, -1: off); "
                   "also served on the controller port")
    p.add_argument("--replay", action="store_true",
                   help="run the scenario's [[workloads]] against the cluster, print the SLO "
                   "table, and stop (one command: cluster + load + report)")
    p.add_argument("--out", metavar="DIR", help="with --replay: write logs and summary.json here")
    p.add_argument("--quiet", action="store_true", help="with --replay: no progress line")
    p.add_argument("--log-dir", metavar="DIR", help="the controller writes requests.tsv and "
                   "actions.tsv (its own view: every request and action) here on shutdown")
    p.set_defaults(func=_cmd_serve)


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="run a scenario's workloads against a live controller",
                       description="Drive the scenario's [[workloads]] against a live controller "
                       "on the real clock; writes the same summary.json/logs as simulate.")
    p.add_argument("scenario", help="scenario TOML")
    p.add_argument("--controller", default="127.0.0.1:12346", help="host:port")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", metavar="DIR", help="write logs and summary.json here")
    p.add_argument("--check-outputs", metavar="PACKAGES", default=None,
                   help="send real inputs and check every answer against the zoo model's "
                   "numpy reference, with the weights of the packages in this folder "
                   "(real devices; e.g. packages/cpu)")
    p.add_argument("--max-outstanding", type=int, default=20000,
                   help="bound on requests in flight (default 20000)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_cmd_replay)
