"""Every ``clockwork`` verb's arguments, in one place.

This module imports only the standard library (and two constants), so
``clockwork --help`` and every ``clockwork VERB --help`` work whatever optional part is
missing. Each verb names its implementation as ``"module:function"``; :func:`clockwork.cluster.cli.main`
imports it only when the verb runs (see ``NEEDS`` for what each verb needs installed).
"""

from __future__ import annotations

import argparse
import textwrap

from clockwork.cluster.cli import argtypes as t
from clockwork.extras import pip_extra
from clockwork.protocol.pacing import ACTION_INTERVAL_US, REPLY_INTERVAL_US, RESULT_INTERVAL_US
from clockwork.sizes import (
    DEFAULT_BATCH_SIZES,
    MAX_CLOCK_OFFSET_MS,
    MAX_GPUS_PER_WORKER,
    MAX_PAGES,
)

DEVICES = ("emulated", "cpu", "cuda")
COMPILE_DEVICES = ("cpu", "cuda")

SPILL_HELP = ("keep the request and action rows in files in a temporary folder inside DIR "
              "instead of in memory, so that a long run's memory stays flat (~50 bytes of "
              "disk per request and ~90 per action; the folder is removed at the end). Same "
              "results and logs. For runs of tens of millions of requests, whose rows would "
              "otherwise fill the memory")
# a replay (a client) keeps the request rows only: the actions are the controller's
REPLAY_SPILL_HELP = ("keep the request rows in files in a temporary folder inside DIR instead "
                     "of in memory, so that a long replay's memory stays flat (~50 bytes of "
                     "disk per request; the folder is removed at the end). Same results and "
                     "logs")
SET_HELP = ("override a dotted scenario key, e.g. --set cluster.workers=4 "
            "--set workloads.0.rate_rps=500 (repeatable; clockwork settings lists every key)")

# what a verb's implementation needs beyond the base install: (import name, pip extra)
NEEDS = {
    "grpc": f"grpcio (part of the base install: {pip_extra()})",
    "google": f"protobuf (part of the base install: {pip_extra()})",
    "tvm": f"Apache TVM: {pip_extra('tvm')} (the PyPI package is apache-tvm, not tvm)",
    "onnx": f"onnx: {pip_extra('tvm')}",
    "cupy": f"cupy: {pip_extra('cuda12', 'cuda13')} (match the CUDA version nvidia-smi "
            "shows)",
    "matplotlib": f"matplotlib: {pip_extra('plots')}",
    "tqdm": f"tqdm (part of the base install: {pip_extra()})",
    "ray": f"ray: {pip_extra('ray')}",
}


def _add_server_security(p, who: str) -> None:
    """Authentication and TLS flags of a server (SECURITY.md)."""
    g = p.add_argument_group("security (see SECURITY.md)")
    if who == "controller":
        tok = g.add_mutually_exclusive_group()
        tok.add_argument("--token-file", type=t.readable_file, metavar="FILE",
                         help="clients must send this file's token (authorization: Bearer "
                         "TOKEN) on every gRPC port and REST path but the health probes; "
                         "required when --host is not a loopback address")
        tok.add_argument("--token", default=None, metavar="TOKEN",
                         help="the same, given on the command line (visible to other local "
                         "users in the process list: prefer --token-file)")
    g.add_argument("--cluster-secret-file", type=t.readable_file, metavar="FILE",
                   help="the secret shared by the controller and its workers (else "
                   "$CLOCKWORK_CLUSTER_SECRET); each side proves it to the other on every "
                   "call; required off loopback")
    g.add_argument("--insecure-no-auth", action="store_true",
                   help="listen off loopback without " + ("a token or cluster secret"
                                                          if who == "controller" else
                                                          "a cluster secret"))
    g.add_argument("--tls-cert", type=t.pem_certificate, metavar="PEM",
                   help="TLS on every port this process listens on: certificate chain")
    g.add_argument("--tls-key", type=t.pem_key, metavar="PEM", help="... and its key")
    g.add_argument("--tls-ca", type=t.pem_certificate, metavar="PEM",
                   help="require client certificates signed by this CA (mutual TLS)"
                   + ("" if who == "controller" else "; the controller presents its "
                      "--tls-cert"))
    if who == "controller":
        g.add_argument("--worker-tls-ca", type=t.pem_certificate, metavar="PEM",
                       help="dial the workers with TLS, verified against this CA (the "
                       "controller's --tls-cert/--tls-key are its client certificate)")


def _add_client_security(p) -> None:
    """A client's token and TLS flags."""
    g = p.add_argument_group("security (see SECURITY.md)")
    tok = g.add_mutually_exclusive_group()
    tok.add_argument("--token-file", type=t.readable_file, metavar="FILE",
                     help="send this file's token (default: $CLOCKWORK_TOKEN, if set)")
    tok.add_argument("--token", default=None, metavar="TOKEN",
                     help="send this token (default: $CLOCKWORK_TOKEN, if set; on the "
                     "command line it is visible in the process list: prefer --token-file "
                     "or the variable)")
    g.add_argument("--tls", action="store_true",
                   help="connect with TLS, verified against the system's CAs")
    g.add_argument("--tls-ca", type=t.pem_certificate, metavar="PEM",
                   help="connect with TLS, verified against this CA")
    g.add_argument("--tls-cert", type=t.pem_certificate, metavar="PEM",
                   help="connect with TLS, presenting this client certificate (a "
                   "controller started with --tls-ca requires one; with --tls-key)")
    g.add_argument("--tls-key", type=t.pem_key, metavar="PEM",
                   help="... and its private key")


def _verb(sub, name: str, impl: str, help: str, description: str, requires: tuple = (),
          **kw) -> argparse.ArgumentParser:
    """A verb: ``impl`` is its ``module:function``; ``requires`` the optional modules it
    imports late (checked before it runs, so a missing one is a clear message up front)."""
    p = sub.add_parser(name, help=help, description=description, **kw)
    p.set_defaults(impl=impl, requires=requires)
    return p


def add_simulate(sub) -> None:
    p = _verb(sub, "simulate", "clockwork.cluster.cli.commands:cmd_simulate",
              "run a scenario in the simulator (virtual clock, emulated GPUs)",
              "Run a scenario in the discrete-event simulator: the production scheduler and "
              "worker semantics on a virtual clock. Prints the SLO table; with --out also "
              "writes summary.json, requests.tsv, actions.tsv and run.json.")
    p.add_argument("scenario", help="scenario TOML file, or the name of a shipped scenario "
                   "(clockwork scenarios lists them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--out", type=t.out_dir, metavar="DIR", help="write logs and summary.json here")
    p.add_argument("--log-format", choices=("tsv", "npz"), default=None,
                   help="with --out (needs it): the logs as requests.tsv/actions.tsv "
                   "(default) or as numpy columns, requests.npz/actions.npz (smaller, faster "
                   "to write)")
    p.add_argument("--spill-dir", type=t.out_dir, metavar="DIR", help=SPILL_HELP)
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress line")
    shown.add_argument("--progress", action="store_true",
                       help="progress line even without a TTY (then a line every 30 s; "
                       "none while the run is set up)")


def add_report(sub) -> None:
    p = _verb(sub, "report", "clockwork.cluster.cli.commands:cmd_report",
              "print a run's summary as a table",
              "Print the summary.json of a run directory as a table; --timeline reads "
              "its logs (requests.tsv/actions.tsv or requests.npz/actions.npz).")
    p.add_argument("dir", help="a run directory (from --out, or a controller's --log-dir), "
                   "a summary.json file, or one file of a log pair (requests.tsv, or renamed "
                   "as a rotated log is: requests.tsv.1): that pair's figures")
    p.add_argument("--timeline", type=t.timeline_seconds, nargs="?", const=60.0, default=None,
                   metavar="SECONDS", help="also print per-interval figures (requests, goodput, "
                   "SLO attainment, cold starts, loads, evicts); interval default 60 s, at least "
                   "0.001 s, at most a year, and at most 1,000,000 intervals over the run")


def add_scenarios(sub) -> None:
    p = _verb(sub, "scenarios", "clockwork.cluster.scenarios_cli:cmd_scenarios",
              "list the shipped scenarios, or copy them out to edit",
              "Without arguments, list the scenarios that ship with clockwork (usable by name: "
              "clockwork simulate NAME). 'copy' writes them, and the trace sample they use, "
              "into a folder.")
    ssub = p.add_subparsers(dest="scenarios_command", metavar="SUBCOMMAND")
    ssub.add_parser("list", help="list the shipped scenarios (the default)")
    c = ssub.add_parser("copy", help="copy shipped scenarios (or a shipped sweep file) into "
                        "a folder")
    c.add_argument("names", nargs="*", metavar="NAME",
                   help="scenario names, or the name of a shipped sweep (e.g. example)")
    c.add_argument("--all", action="store_true", help="copy every shipped scenario")
    c.add_argument("--to", type=t.out_dir, required=True, metavar="DIR",
                   help="destination folder")
    c.add_argument("--force", action="store_true",
                   help="overwrite files in DIR that differ from the shipped ones")


TRACE_EPILOG = """examples:
  clockwork trace synth --functions 40000 --days 14 --seed 1 --out traces/azure
  clockwork trace info traces/samples/invocations_per_function_md.anon.d01.csv.gz
  clockwork trace info 1 --top 20        # day 1 from traces/azure or $AZURE_TRACE_DIR

The real dataset: Microsoft AzurePublicDataset, "Azure Functions Trace 2019"
(see traces/README.md).
"""


def add_trace(sub) -> None:
    p = _verb(sub, "trace", "", "synthesise or inspect Azure Functions traces",
              "Azure Functions Trace 2019 files: make synthetic ones in the same CSV "
              "format, or summarise a file (real or synthetic).",
              epilog=TRACE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")

    s = tsub.add_parser(
        "synth", help="write synthetic day files in the dataset's format",
        description="Write invocations_per_function_md.anon.d01.csv ... dNN.csv into DIR: "
        "seeded synthetic days whose statistics follow Shahrad et al. (ATC'20) — trigger "
        "mix, functions per app, heavy-tailed daily counts, diurnal shape, periodic timers, "
        "bursts (the parameters are documented in clockwork/workloads/synth.py). The same "
        "seed gives byte-identical files. 40,000 functions take a few seconds per day.")
    s.set_defaults(impl="clockwork.workloads.trace_cli:cmd_synth")
    s.add_argument("--functions", type=t.positive_int, default=1000, metavar="N",
                   help="functions (rows) per day (default 1000, at most 100,000; the real days have ~46,000)")
    s.add_argument("--days", type=t.positive_int, default=1, metavar="D",
                   help="number of day files, d01..dD (default 1, at most 366)")
    s.add_argument("--seed", type=t.seed, default=0, metavar="S",
                   help="random seed (default 0)")
    s.add_argument("--out", type=t.out_dir, required=True, metavar="DIR",
                   help="output folder (created if missing), e.g. traces/azure")
    s.add_argument("--gzip", action="store_true",
                   help="write .csv.gz (the reader and the azure workload read both)")
    s.add_argument("--force", action="store_true",
                   help="replace the files of these days already in DIR (either name form, "
                   ".csv or .csv.gz: a real trace's too); without it such a folder is "
                   "refused before anything is made. Other days' files are left")

    i = tsub.add_parser(
        "info", help="summarise a trace file: rows, totals, triggers, top functions",
        description="Load a day file (checking every row) and print its size, total and "
        "peak invocations, the per-trigger breakdown, the busiest functions and the load "
        "time.")
    i.set_defaults(impl="clockwork.workloads.trace_cli:cmd_info")
    i.add_argument("file", metavar="FILE|DAY",
                   help="a day file, or a day number looked up in --trace-dir, then "
                   "$AZURE_TRACE_DIR, then traces/azure (both name forms)")
    i.add_argument("--top", type=t.nonneg_int, default=10, metavar="K",
                   help="list the K busiest functions (default 10; 0 for none)")
    i.add_argument("--start-minute", type=t.nonneg_int, default=0, metavar="M",
                   help="only minutes from M (0-based; default 0) ...")
    i.add_argument("--minutes", type=t.positive_int, default=None, metavar="N",
                   help="... for N minutes (default: to the end of the day)")
    i.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="also look for day files here (for a DAY argument)")


NAME_HELP = ("an ONNX model's name (default: the file's stem; one the repository would "
             "refuse, e.g. with a space, needs --name)")


def add_compile(sub) -> None:
    p = _verb(sub, "compile", "clockwork.cluster.models_cli:cmd_compile",
              "compile a zoo model or an ONNX file into a model package (needs TVM)",
              "Build a zoo model with TVM Relax (seeded random weights), or import an "
              "ONNX model (its initializers become the weights), and write a model package: "
              "model.so (one function per batch size), weights.bin (laid out in 16 MiB pages) "
              "and model.json. Zoo models: mlp, resnet_tiny, resnet18, mobilenet_tiny, "
              "transformer_tiny.", requires=("tvm",))
    p.add_argument("model", help="zoo model name, or path/to/model.onnx")
    p.add_argument("--device", default="cpu", choices=COMPILE_DEVICES,
                   help="what the package runs on: cpu (this host's CPU; TVM target llvm) or "
                   "cuda (an NVIDIA GPU; cross-compiles without one) (default cpu)")
    p.add_argument("--batch-sizes", type=t.batch_sizes, default=list(DEFAULT_BATCH_SIZES),
                   metavar="B1,B2,...", help="default 1,2,4,8,16")
    p.add_argument("--out", type=t.out_dir, metavar="DIR", help="package directory (default packages/DEVICE/MODEL, "
                   "MODEL the model's name)")
    p.add_argument("--name", type=t.model_name, metavar="NAME", help=NAME_HELP)
    p.add_argument("--seed", type=t.seed, default=0,
                   help="weights seed for zoo models (default 0)")


def add_profile(sub) -> None:
    p = _verb(sub, "profile", "clockwork.cluster.models_cli:cmd_profile",
              "measure LOAD and EXEC of a model and write its profile (needs TVM)",
              "Measure LOAD and EXEC per batch size over many runs on a real device and "
              "write profiles/DEVICE/MODEL.json in the scheduler's format (figures are p99s; "
              "p50/p99/max are in 'source'). Compiles the zoo model (or imports the ONNX file) "
              "first unless --package is given.", requires=("tvm",))
    p.add_argument("model", help="zoo model name, or path/to/model.onnx")
    p.add_argument("--device", default="cpu", choices=COMPILE_DEVICES,
                   help="where to measure: cpu (this host) or cuda (needs an NVIDIA GPU "
                   "here) (default cpu)")
    p.add_argument("--package", metavar="DIR", help="profile this compiled package instead")
    p.add_argument("--name", type=t.model_name, metavar="NAME", help=NAME_HELP)
    p.add_argument("--batch-sizes", type=t.batch_sizes, default=None,
                   metavar="B1,B2,...", help="when compiling (default 1,2,4,8,16); a "
                   "--package is measured at the batch sizes it was compiled for (a warning "
                   "says so if this is given)")
    # (each run's time is kept until the percentiles are taken: bounded)
    p.add_argument("--runs", type=t.int_in(1, 1_000_000), default=200,
                   help="EXEC runs per batch size, 1 to 1,000,000 (default 200)")
    p.add_argument("--load-runs", type=t.int_in(1, 1_000_000), default=50,
                   help="LOAD runs, 1 to 1,000,000 (default 50)")
    p.add_argument("--out", type=t.out_file, metavar="FILE",
                   help="default profiles/DEVICE/MODEL.json: in the set --profiles DEVICE "
                   "reads (./profiles/DEVICE comes before the shipped set of that name); "
                   "a new profiles/DEVICE/ starts as a copy of the set the name finds now, "
                   "so it keeps that set's other models")


def add_serve(sub) -> None:
    p = _verb(sub, "serve", "clockwork.cluster.serve:cmd_serve",
              "start a controller and local workers (one command)",
              "Start the workers a scenario's [cluster] describes (without a scenario: one "
              "worker with 1 GPU, emulated unless --device says otherwise) and a controller "
              "serving its [[models]] (without: every profile of the device's set, "
              "v100-reference for an emulated worker, cpu or cuda for --device cpu or cuda), "
              "print the controller's address, and stop everything on "
              "Ctrl-C / SIGTERM. A worker that exits is started again on its port (its GPUs "
              "empty; the controller takes it back); one restarted 5 times within 60 s that "
              "exits again, or the controller exiting, stops everything, exit 1.")
    p.add_argument("scenario", nargs="?", help="scenario TOML file or shipped scenario name "
                   "(optional)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="with a scenario (needs one): " + SET_HELP)
    p.add_argument("--device", default=None, choices=DEVICES,
                   help="worker device (default: the scenario's cluster.device, else emulated); "
                   "cpu runs TVM-compiled packages on this host (missing zoo packages are "
                   "compiled first; needs the tvm extra)")
    p.add_argument("--packages", metavar="DIR", default=None,
                   help="cpu/cuda: model packages as DIR/<model>/ (default packages/DEVICE)")
    p.add_argument("--host", type=t.listen_host, default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; IPv6 as ::1 or [::1])")
    p.add_argument("--port", type=t.port, default=None,
                   help="controller port (0: pick one; default 12346, or any free port with "
                   "--replay)")
    p.add_argument("--worker-port", type=t.port, default=0,
                   help="worker ports: worker i listens on WORKER_PORT + 10 i, its fast "
                   "link on WORKER_PORT + 10 i + 1 (default 0: free ports)")
    p.add_argument("--http-port", type=t.optional_port, default=None,
                   help="KServe v2 REST, /metrics and health (default 8000, off with "
                   "--replay; 0: pick one, -1: off)")
    p.add_argument("--kserve-port", type=t.optional_port, default=None,
                   help="KServe v2 gRPC port (default 8001, as Triton, off with --replay; "
                   "0: pick one, -1: off); also served on the controller port")
    p.add_argument("--ray", nargs="?", const="local", default=None, type=t.ray_address,
                   metavar="ADDRESS", help="run the workers on a Ray cluster: one worker per "
                   "node, a Ray actor holding the node's GPUs (emulated ones: the custom "
                   "resource clockwork_gpu) and 1 CPU (a node without a free one gets no "
                   "worker until it has one), restarted by Ray when it dies; the controller "
                   "runs here. ADDRESS: auto, HOST:PORT or ray://HOST:PORT; without it a "
                   "local Ray instance is started. Needs the ray extra (also: the scenario's "
                   "cluster.backend = \"ray\")")
    p.add_argument("--replay", action="store_true",
                   help="run the scenario's [[workloads]] against the cluster, print the SLO "
                   "table, and stop (one command: cluster + load + report)")
    p.add_argument("--out", type=t.out_dir, metavar="DIR",
                   help="with --replay (needs it): write logs and summary.json here, and the "
                   "controller's and workers' output as logs/NAME.log (on Ray, the workers' "
                   "output is in Ray's logs)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true",
                       help="with --replay (needs it): no progress line")
    shown.add_argument("--progress", action="store_true",
                       help="with --replay (needs it): the progress line even without a TTY "
                       "(a line every 30 s)")
    p.add_argument("--spill-dir", type=t.out_dir, metavar="DIR",
                   help="with --replay (needs it): " + REPLAY_SPILL_HELP)
    p.add_argument("--log-dir", type=t.out_dir, metavar="DIR",
                   help="the controller writes requests.tsv and "
                   "actions.tsv (its own view: every request and action) here")
    g = p.add_argument_group("security (see SECURITY.md; the workers listen on 127.0.0.1, "
                             "with a cluster secret made for this cluster unless given)")
    tok = g.add_mutually_exclusive_group()
    tok.add_argument("--token-file", type=t.readable_file, metavar="FILE",
                     help="clients must send this file's token; required when --host is not "
                     "a loopback address")
    tok.add_argument("--token", default=None, metavar="TOKEN",
                     help="the same, given on the command line (visible to other local "
                     "users in the process list: prefer --token-file)")
    g.add_argument("--cluster-secret-file", type=t.readable_file, metavar="FILE",
                   help="the cluster secret the controller and its workers prove to each "
                   "other (default: one made for this cluster); give it to add a worker "
                   "started by hand (clockwork worker --cluster-secret-file FILE, then "
                   "Client.add_worker)")
    g.add_argument("--insecure-no-auth", action="store_true",
                   help="listen off loopback without a token")
    g.add_argument("--tls-cert", type=t.pem_certificate, metavar="PEM",
                   help="TLS on the controller's ports: certificate chain")
    g.add_argument("--tls-key", type=t.pem_key, metavar="PEM", help="... and its key")


def add_controller(sub) -> None:
    p = _verb(sub, "controller", "controller.command:cmd_controller",
              "run the controller (scheduler + client API)",
              "Run the Clockwork controller: it connects to the workers, serves the "
              "clockwork.v1 client API and KServe v2 (gRPC and REST), and makes every "
              "scheduling decision.")
    p.add_argument("--host", type=t.listen_host, default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; IPv6 as ::1 or [::1])")
    p.add_argument("--port", type=t.port, default=12346,
                   help="port (default 12346; 0 picks a free one; printed)")
    p.add_argument("--http-port", type=t.optional_port, default=8000,
                   help="KServe v2 REST port (default 8000; 0 picks a free one; -1: none)")
    p.add_argument("--kserve-port", type=t.optional_port, default=8001,
                   help="KServe v2 gRPC port (default 8001, as Triton; 0 picks a free one; "
                   "-1: none). KServe v2 gRPC is also served on --port")
    p.add_argument("--workers", required=True, type=t.address_list, metavar="HOST:PORT,...",
                   help="worker addresses")
    p.add_argument("--profiles", type=t.nonempty, default="v100-reference",
                   help="profile set: a shipped set's name or a folder (default v100-reference)")
    p.add_argument("--models", default=None,
                   help="model instances, name[:copies],... (default: every profile, one copy)")
    p.add_argument("--settings", metavar="FILE", default=None, type=t.settings_file,
                   help="the [scheduler] table (policy and settings) as data: a TOML file "
                   "with a [scheduler] table (a scenario file works, or a shipped "
                   "scenario's name, as for simulate) or a JSON file "
                   "{\"scheduler\": {...}} (what clockwork serve writes); the flags below "
                   "override it")
    p.add_argument("--policy", type=t.nonempty, default=None,
                   help="scheduling policy: clockwork, clipper, tfserving, infaas (default: "
                   "the settings file's, else clockwork)")
    # (their defaults: SchedulerConfig's, checked by tests/test_cli.py)
    p.add_argument("--schedule-ahead-ms", type=t.nonneg_float, default=None, metavar="MS",
                   help="keep each GPU's EXEC lane planned this far into the future, no "
                   "further ([scheduler] schedule_ahead_ms; default: the --settings file's, "
                   "else 10)")
    p.add_argument("--default-slo-ms", type=t.positive_float, default=None, metavar="MS",
                   help="the SLO of a request that gives none ([scheduler] default_slo_ms; "
                   "default: the --settings file's, else 100)")
    p.add_argument("--max-batch", type=t.positive_int, default=None, metavar="N",
                   help="the largest batch size used, of each profile's compiled sizes "
                   "([scheduler] max_batch; default: the --settings file's, else 16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any [scheduler] setting of a scenario file, e.g. max_exec_ms=25, "
                   "buffer_ms=5, batch_first=false, or a baseline's own (batch_timeout_us=...); "
                   "clockwork settings scheduler lists them")
    p.add_argument("--connect-timeout", type=t.positive_float, default=30.0,
                   help="seconds to wait for every worker to answer at start (default 30); "
                   "a worker that answers but first reads model packages new to it (a cuda "
                   "package's first kernel build: a minute or more) is waited for while "
                   "it keeps answering")
    p.add_argument("--fresh-caches", action="store_true",
                   help="empty the workers' weights caches at start. Default: a worker "
                   "that still holds models loaded for an earlier controller (this one "
                   "restarted) keeps them, and the clockwork policy serves them with no "
                   "LOAD (the baselines always start empty)")
    p.add_argument("--log-dir", type=t.out_dir, default=None, metavar="DIR",
                   help="write requests.tsv and actions.tsv (the simulator's logs) here")
    p.add_argument("--log-flush-s", type=t.positive_float, default=None, metavar="S",
                   help="with --log-dir (needs it): append the rows every S seconds (a "
                   "crash loses at most the last S seconds, never half a row) and at "
                   "SIGTERM (default 1)")
    p.add_argument("--log-format", choices=("tsv", "npz"), default=None,
                   help="with --log-dir (needs it): tsv (default; flushed every "
                   "--log-flush-s) or npz (requests.npz/actions.npz, written once at stop; "
                   "until then the rows wait in raw column files in a clockwork-rows-* "
                   "folder in DIR, not in memory, put there every --log-flush-s; a crash "
                   "leaves them there without the .npz files: clockwork report DIR reads "
                   "them)")
    p.add_argument("--action-interval-us", type=t.pacing_interval_us, default=ACTION_INTERVAL_US,
                   help="pacing: at most one action message per worker per interval; under "
                   "load actions share messages, but none is held past one interval "
                   "before its latest start (at least 11 ms after it is made with the "
                   "default settings, so intervals from ~11 ms pace no INFER; default "
                   f"{ACTION_INTERVAL_US:g}; 0: off; at most 1000000)")
    p.add_argument("--reply-interval-us", type=t.pacing_interval_us, default=REPLY_INTERVAL_US,
                   help="pacing: on a busy InferStream at most one reply message per "
                   "interval, but a successful reply still in time goes no later than one "
                   "interval before its request's SLO ends (default "
                   f"{REPLY_INTERVAL_US:g}; 0: off; at most 1000000)")
    p.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                   help="a bound on clients (repeatable): requests outstanding per stream, "
                   "connection and in all, admission slices, reply message and buffer "
                   "sizes, gRPC and REST message sizes and timeouts, e.g. --limit "
                   "stream_outstanding=10000 --limit rest_max_body_bytes=8388608; "
                   "clockwork settings limits lists every key and default")
    _add_server_security(p, "controller")


def add_worker(sub) -> None:
    p = _verb(sub, "worker", "clockwork.cluster.cli.commands:cmd_worker",
              "run a worker (GPUs that execute the controller's actions)",
              "Run a Clockwork worker: it executes timestamped LOAD/EVICT/INFER actions from "
              "the controller on its GPUs: emulated (profiled timings, the default), cpu "
              "(TVM-compiled model packages run on this host) or cuda.",
              requires=("worker.service",))
    p.add_argument("--host", type=t.listen_host, default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; IPv6 as ::1 or [::1])")
    p.add_argument("--port", type=t.port, default=12345,
                   help="port (default 12345; 0 picks a free one; printed)")
    p.add_argument("--advertise", type=t.address, action="append", default=[],
                   metavar="HOST:PORT",
                   help="an address the controller reaches this worker at that is not "
                   "this machine's name and --port (a NAT, a container's port mapping); "
                   "with a cluster secret the controller's proof names the address it "
                   "dialled, and a proof for any other worker is refused (repeatable)")
    p.add_argument("--link-port", type=t.optional_port, default=0,
                   help="port of the fast link: the controller sends actions and reads "
                   "results on a TCP connection here instead of the gRPC stream, after "
                   "authenticating on gRPC (default 0: a free port, printed; -1: off, "
                   "everything on the gRPC port; with --tls-cert it speaks TLS too)")
    p.add_argument("--device", default="emulated", choices=DEVICES,
                   help="emulated (default), cpu (needs the tvm extra) or cuda")
    p.add_argument("--packages", metavar="DIR", default=None,
                   help="cpu/cuda: model packages as DIR/<model>/ (default packages/DEVICE; "
                   "build them with 'clockwork compile'); a DIR that does not exist is a "
                   "warning: the worker starts, and LOADs fail until the packages are there")
    p.add_argument("--gpus", type=t.int_in(1, MAX_GPUS_PER_WORKER), default=1,
                   help=f"number of GPUs, 1 to {MAX_GPUS_PER_WORKER} (default 1)")
    p.add_argument("--pages", type=t.int_in(1, MAX_PAGES), default=None,
                   help="weights-cache pages per GPU, 16 MiB each (default: the profile "
                   "set's; a cpu worker allocates them at start)")
    p.add_argument("--profiles", type=t.nonempty, default=None,
                   help="profile set (a shipped set's name or a folder; default v100-reference, "
                   "or the device's own: cpu, cuda)")
    p.add_argument("--noise", type=t.noise, default=0.0,
                   help="emulated duration noise: each action takes its profiled duration x "
                   "(1 + N(0, NOISE)), at least 10 %% of it (default 0: none)")
    p.add_argument("--slow-prob", type=t.probability, default=0.0,
                   help="emulated stragglers: this fraction of actions take --slow-factor x "
                   "(default 0)")
    p.add_argument("--slow-factor", type=t.slow_factor, default=3.0,
                   help="emulated stragglers take this many times their duration "
                   "(default 3)")
    p.add_argument("--result-interval-us", type=t.pacing_interval_us, default=RESULT_INTERVAL_US,
                   help="pacing: at most one result message to the controller per interval; "
                   "under load results share messages, but a successful INFER's result goes "
                   "no later than one interval before its batch's deadline, and echoes and "
                   f"states never wait (default {RESULT_INTERVAL_US:g}; 0: one message "
                   "whenever results are ready; at most 1000000)")
    p.add_argument("--seed", type=t.nonneg_int, default=0,
                   help="seed of the emulated noise and stragglers; GPU g draws from seed x "
                   "1000 + g (default 0)")
    p.add_argument("--clock-offset-ms", type=t.float_in(-MAX_CLOCK_OFFSET_MS,
                                                         MAX_CLOCK_OFFSET_MS), default=0.0,
                   help="add this to the worker's clock (to test clock-offset handling; "
                   "default 0; at least minus this host's uptime: its clock never reads "
                   "below 0)")
    _add_server_security(p, "worker")


def add_infer(sub) -> None:
    p = _verb(sub, "infer", "clockwork.cluster.live:cmd_infer",
              "send an inference request to a live controller",
              "Send requests (zeros of the model's input shape) to a controller and print "
              "the answers.")
    p.add_argument("model", nargs="?", help="model instance name")
    p.add_argument("--controller", default="127.0.0.1:12346", type=t.controller_url,
                   help="the controller's gRPC port (its --port or --kserve-port, not the "
                   "REST --http-port) as HOST:PORT, optionally after grpc://, http:// or "
                   "clockwork://, or grpcs:// or https:// (TLS) (default 127.0.0.1:12346)")
    p.add_argument("--slo-ms", type=t.slo_ms, default=None,
                   help="SLO in ms, at most a day (default: the controller's)")
    p.add_argument("-n", type=t.positive_int, default=1,
                   help="how many requests, one after another (default 1)")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--timeout", type=t.positive_float, default=30.0,
                   help="seconds per call (default 30)")
    _add_client_security(p)


def add_workers(sub) -> None:
    p = _verb(sub, "workers", "clockwork.cluster.live:cmd_workers",
              "list, add or remove a live controller's workers",
              textwrap.fill(  # (raw: the examples below keep their lines)
              "List a running controller's workers (each one's state: serving, suspect, "
              "resetting, lost, held by another controller, awaited, draining, removed; "
              "its GPUs, link and round trip), add a worker started by hand (with the "
              "cluster's secret, where the controller has one), or remove one for good "
              "(nothing more is placed on its GPUs, its requests in flight are placed "
              "again or answered -- with --drain they finish there first --, and the "
              "controller never reconnects to it; the worker process runs on).", 80),
              epilog="examples:\n"
              "  clockwork workers                                   # list\n"
              "  clockwork workers add 10.0.0.7:12400 --token-file t\n"
              "  clockwork workers remove 10.0.0.7:12400 --token-file t\n"
              "  clockwork workers remove 10.0.0.7:12400 --drain     # gently",
              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=("list", "add", "remove"), default="list",
                   help="list (default), add or remove")
    p.add_argument("address", nargs="?", metavar="ADDRESS",
                   help="the worker's HOST:PORT (add and remove)")
    p.add_argument("--controller", default="127.0.0.1:12346", type=t.controller_url,
                   help="the controller's gRPC port (its --port or --kserve-port, not the "
                   "REST --http-port) as HOST:PORT, optionally after grpc://, http:// or "
                   "clockwork://, or grpcs:// or https:// (TLS) (default 127.0.0.1:12346)")
    p.add_argument("--timeout", type=t.positive_float, default=30.0,
                   help="seconds for the call (an add tries to reach the worker this long; "
                   "a drain waits at most this long; default 30)")
    p.add_argument("--drain", action="store_true",
                   help="remove: gently -- nothing more is placed on its GPUs at once, but "
                   "the actions it has in flight finish there (their requests answered "
                   "from it) before it is taken out; what is still in flight when "
                   "--timeout runs out fails as without --drain")
    _add_client_security(p)


def add_replay(sub) -> None:
    p = _verb(sub, "replay", "clockwork.cluster.replay:cmd_replay",
              "run a scenario's workloads against a live controller",
              "Drive the scenario's [[workloads]] against a live controller on the real clock; "
              "writes the same summary.json/logs as simulate.")
    p.add_argument("scenario", help="scenario TOML file or shipped scenario name")
    p.add_argument("--controller", default="127.0.0.1:12346", type=t.controller_url,
                   help="the controller's gRPC port (its --port or --kserve-port, not the "
                   "REST --http-port) as HOST:PORT, optionally after grpc://, http:// or "
                   "clockwork://, or grpcs:// or https:// (TLS) (default 127.0.0.1:12346)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--out", type=t.out_dir, metavar="DIR", help="write logs and summary.json here")
    p.add_argument("--check-outputs", type=t.in_dir, metavar="PACKAGES", default=None,
                   help="send real inputs and check every answer against the zoo model's "
                   "numpy reference, with the weights of the packages in this folder "
                   "(real devices; e.g. packages/cpu)")
    p.add_argument("--spill-dir", type=t.out_dir, metavar="DIR", help=REPLAY_SPILL_HELP)
    p.add_argument("--max-outstanding", type=t.positive_int, default=20000,
                   help="bound on requests in flight (default 20000)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress line")
    shown.add_argument("--progress", action="store_true",
                       help="the progress line even without a TTY (a line every 30 s)")
    _add_client_security(p)


SWEEP_EPILOG = """a sweep file (TOML):
  scenarios = ["poisson_warm", "bursty"]      # shipped names or paths
  seeds = [1, 2, 3]                           # optional: each point once per seed
  overrides = ["duration_s=20"]               # optional: --set for every point
  out = "sweeps/example"                      # optional (--out wins)
  [grid]                                      # every combination is a point
  "workloads.0.slo_ms" = [25, 50, 100]

examples:
  clockwork sweep example --jobs 2            # the shipped example (clockwork/data/sweeps)
  clockwork sweep my_sweep.toml --out runs/s --plot
  clockwork sweep my_sweep.toml --list        # the points, done or not, and their commands
"""


def _add_parallel(p) -> None:
    p.add_argument("--jobs", "-j", type=t.positive_int, default=None, metavar="N",
                   help="simulations run at once (default: the CPUs this process may use)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="where simulations run: local (processes on this machine; the "
                   "default) or ray (tasks on a Ray cluster, see --ray)")
    p.add_argument("--ray", nargs="?", const="local", default=None, type=t.ray_address,
                   metavar="ADDRESS",
                   help="run the simulations as Ray tasks (one CPU each) on the Ray cluster "
                   "at ADDRESS (auto, HOST:PORT, ray://HOST:PORT; without one: a local Ray "
                   "instance); the nodes need clockwork-py installed and the scenario files "
                   "at the same paths (relative ones are taken from this folder)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress bar or status lines")
    shown.add_argument("--progress", action="store_true",
                       help="progress bar even without a TTY")


def add_sweep(sub) -> None:
    p = _verb(sub, "sweep", "clockwork.cluster.sweep:cmd_sweep",
              "run a grid of simulations (scenarios x overrides x seeds) in parallel",
              "Run every point of a sweep file -- scenarios x combinations of [grid] values x\n"
              "seeds, each one `clockwork simulate SCENARIO --set ...` -- as parallel simulations,\n"
              "and gather their summaries into OUT/results.tsv and OUT/results.json (one row per\n"
              "point: scenario, overrides, seed, requests, goodput, SLO attainment, latency\n"
              "percentiles, cold starts). Each point writes OUT/points/<name>/ with summary.json\n"
              "last; a point already done (on its scenario file, profile set and traces as\n"
              "they are now) is not run again,\n"
              "so an interrupted sweep resumes where it stopped and deleting a point's folder\n"
              "reruns just that point. Exit 1 if a point failed.",
              epilog=SWEEP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
              requires=("tqdm",))
    p.add_argument("file", help="sweep TOML file, or the name of a shipped sweep")
    p.add_argument("--out", type=t.nonempty_path, metavar="DIR",
                   help="output folder (default: the file's out, else sweeps/<file stem>)")
    p.add_argument("--plot", action="store_true",
                   help="also draw SLO attainment and goodput against the first grid key "
                   "into OUT/sweep.png (needs matplotlib: the plots extra)")
    p.add_argument("--list", action="store_true",
                   help="list the points (done or not) and their commands; run nothing")
    _add_parallel(p)


PLAN_EPILOG = """the answer:
  The GPU count is varied through cluster.workers (gpus_per_worker stays the scenario's;
  GPUs = workers x gpus_per_worker, the same as workers in every shipped scenario;
  --min-gpus is rounded up to whole workers, --max-gpus down). A scenario with
  [[add_workers]] or [[remove_workers]] is refused (--set add_workers=[] plans
  without them). A count meets the target when every seed's SLO attainment is >= --attainment.
  Attainment need not grow with GPUs (seeds, placement, cold starts), so the answer N
  is defined by the counts the search decided on (the curve printed): N meets the
  target, one worker fewer (N - gpus_per_worker GPUs) is in the curve and misses it
  (unless N is --min-gpus), and no count of the curve below N meets it (a count
  simulated ahead, off that path, that meets it too is named in a note). A scenario
  that submits no requests is refused (exit 2) once its first count ran. The search doubles the
  count from --min-gpus until one meets the target, then bisects the gap (midpoints
  rounded down), one count at a time: the answer and the curve are the same whatever
  --jobs. More jobs simulate ahead, in parallel, the counts it may need next (up to
  max(1, jobs // seeds) a round): fewer rounds, the same answer.

examples:
  clockwork plan azure_sample --slo-ms 100 --attainment 0.999 --set duration_s=10 \\
      --set workloads.0.minutes=1 --set workloads.0.interval_s=10     # 3 GPUs
  clockwork plan poisson_warm --set workloads.0.rate_rps=3600 --max-gpus 16 --plot plan.png
"""


def add_plan(sub) -> None:
    p = _verb(sub, "plan", "clockwork.cluster.plan:cmd_plan",
              "find the fewest GPUs that meet an SLO attainment target (parallel simulation)",
              "Capacity planning: simulate the scenario at several GPU counts (in parallel, each\n"
              "count with --seeds seeds) and print the smallest count N that meets the target --\n"
              "every seed's SLO attainment >= --attainment -- with the curve of GPUs against\n"
              "attainment, goodput and cold starts. Exit 0 with an answer, 1 when even --max-gpus\n"
              "misses the target (or a simulation fails while running), 2 for a bad argument or\n"
              "a scenario setting the simulator refuses (checked before anything runs).",
              epilog=PLAN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
              requires=("tqdm",))
    p.add_argument("scenario", help="scenario TOML file or shipped scenario name")
    p.add_argument("--slo-ms", type=t.slo_ms, default=None, metavar="MS",
                   help="the SLO, at most a day: set every workload's slo_ms (default: the scenario's; "
                   "not together with a --set of a workload's slo_ms)")
    p.add_argument("--attainment", type=t.probability, default=0.999, metavar="FRACTION",
                   help="the target SLO attainment, 0..1 (default 0.999)")
    p.add_argument("--min-gpus", type=t.positive_int, default=1, metavar="N",
                   help="smallest GPU count to consider (default 1)")
    p.add_argument("--max-gpus", type=t.positive_int, default=64, metavar="N",
                   help="largest GPU count to consider (default 64)")
    p.add_argument("--seeds", type=t.positive_int, default=2, metavar="K",
                   help="seeds per count: the scenario's seed and the K-1 after it "
                   "(default 2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--out", type=t.out_dir, metavar="DIR",
                   help="keep every simulation here (OUT/points/...; a rerun reuses those "
                   "whose scenario, profile set and traces are unchanged) "
                   "and write OUT/plan.json and OUT/curve.tsv")
    p.add_argument("--plot", type=t.figure_file, metavar="FILE", default=None,
                   help="draw the curve (attainment and goodput against GPUs) into FILE "
                   "(its missing folders made), in the format its extension names (.png, .pdf, .svg, ...; needs "
                   "matplotlib: the plots extra)")
    p.add_argument("--json", action="store_true",
                   help="print the answer and the curve as JSON instead of the table")
    _add_parallel(p)


def add_settings(sub) -> None:
    p = _verb(sub, "settings", "clockwork.cluster.settings_doc:cmd_settings",
              "print every setting: scenario keys, scheduler and controller limits",
              "Print the reference of every setting, as the installed version checks them: "
              "each scenario key ([cluster], [[models]], [[workloads]], [scheduler] of every "
              "policy, [faults]), the controller's --limit keys, and the fields of profile "
              "files, with type, default, allowed range and meaning (markdown).")
    p.add_argument("topic", nargs="*", default=[], metavar="TOPIC",
                   help="print only the sections these words name, e.g. cluster, models, "
                   "workloads, scheduler, clipper, faults, kill, limits, profile, top level")


VERBS = [add_simulate, add_report, add_sweep, add_plan, add_scenarios, add_serve, add_replay,
         add_infer, add_workers, add_controller, add_worker, add_trace, add_compile,
         add_profile, add_settings]
