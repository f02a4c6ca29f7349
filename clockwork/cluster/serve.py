"""``clockwork serve``: start local workers and a controller as child processes (a
``LocalCluster``, ``clockwork.cluster.local``; with ``--ray`` a ``RayCluster``), print the
controller's address, and stop them all on Ctrl-C / SIGTERM; with ``--replay``, replay
the scenario's workloads against it. Also what a scenario asks of a live cluster
(``cluster_from_scenario``) and the checks made before anything starts.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from clockwork.cluster.local import (
    LINK_PORT_OFFSET,
    WORKER_PORT_STEP,
    ChildRefused,
    LocalCluster,
    how_it_ended,
)
from clockwork.extras import pip_extra
from clockwork.scenario import (
    ScenarioError,
    clock_offsets_error,
    joining_workers,
    leaving_workers,
    load_scenario,
)
from clockwork.signals import stop_signals
from clockwork.sizes import DEFAULT_BATCH_SIZES

# ``clockwork serve`` (no --replay) restarts a worker that exits, at most this many times
# within RESTART_WINDOW_S seconds; one more exit in that time stops the cluster (exit 1)
WORKER_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def models_arg(models: list[dict]) -> str:
    return ",".join(f"{m['name']}:{int(m.get('copies', 1))}" for m in models)


def _profiles_of(sc) -> str:
    """The scenario's profile set as the controller and workers (started in this
    folder, with no scenario) are to name it: as written when that finds the set the
    scenario's own lookup finds (``clockwork.profiles.find_profile_set`` with its
    folder), else that folder's absolute path (a set beside the scenario file)."""
    from clockwork.profiles import find_profile_set
    from clockwork.resources import scenario_folder

    written = str(sc.cluster["profiles"])
    found = find_profile_set(written, scenario_folder(sc))
    if found is None or found == find_profile_set(written):
        return written
    return os.path.abspath(found)


# in ``serve --replay --out OUT``: the controller's own logs (``--log-dir``), unless given
CONTROLLER_LOGS = "controller"
# the names of a controller's logs there: requests.tsv, a restarted one's earlier
# actions.1.tsv, a rotated requests.tsv.1, npz (nothing else there is touched)
_CONTROLLER_LOG = re.compile(r"(requests|actions)(\.\d+)?\.(tsv|npz)(\.\d+)?")


def clear_run_folder(out: Path, who: str) -> None:
    """An earlier run's files in ``out`` (its summary, logs, the processes' logs in
    ``out/logs`` and the controller's in ``out/controller``) removed before a live run
    writes its own logs there: a folder holds one run, and a run that fails or is
    interrupted leaves no earlier summary beside its logs. Says so on stderr when there
    were any."""
    from clockwork.telemetry import RUN_FILES, process_logs

    own = out / CONTROLLER_LOGS
    old = [out / n for n in RUN_FILES if (out / n).is_file()] + process_logs(out) + (
        [p for p in own.iterdir() if p.is_file() and _CONTROLLER_LOG.fullmatch(p.name)]
        if own.is_dir() else [])
    for p in old:
        p.unlink()
    if old:
        print(f"{who}: replacing the earlier run in {out}", file=sys.stderr)


def _scenario_worker_flags(seed: int, c: Mapping, i: int) -> list[str]:
    """Worker ``i``'s flags from a scenario's seed and ``[cluster]`` table: a seed of its
    own, the emulated timing noise and stragglers (every worker's), its clock offset."""
    w = ["--seed", str(seed * 1000 + i)]
    if float(c.get("noise", 0.0)):
        w += ["--noise", str(float(c["noise"]))]
    if float(c.get("slow_prob", 0.0)):
        w += ["--slow-prob", str(float(c["slow_prob"])),
              "--slow-factor", str(float(c.get("slow_factor", 3.0)))]
    offsets = c.get("clock_offsets_ms") or []
    if i < len(offsets) and float(offsets[i]):
        w += ["--clock-offset-ms", str(float(offsets[i]))]
    return w


def cluster_from_scenario(sc, replay: bool = True) -> tuple[dict, list[str]]:
    """What a scenario's ``[cluster]``, ``[[models]]`` and ``[scheduler]`` mean for a live
    ``LocalCluster``: (its keyword arguments, the settings a live cluster does not apply:
    ``live_ignored``, its ``[faults]`` too unless ``replay`` plays them).
    The whole ``[scheduler]`` table goes to the controller as data (``scheduler``, written
    to its settings file); timing noise and stragglers to the emulated workers; network
    jitter is not emulated live."""
    c = sc.cluster
    workers = int(c["workers"])
    flags_of = functools.partial(_scenario_worker_flags, sc.seed, dict(c))
    wargs = [flags_of(i) for i in range(workers)]
    device = str(c.get("device", "emulated"))
    kw = {"workers": workers, "gpus": int(c["gpus_per_worker"]), "profiles": _profiles_of(sc),
          "models": models_arg(sc.models), "pages": c.get("weights_cache_pages"),
          "scheduler": dict(sc.scheduler), "controller_args": [], "worker_args": wargs,
          "device": device,
          "packages": str(c["packages"]) if c.get("packages") else None,
          "worker_flags_of": flags_of}
    return kw, live_ignored(sc, replay)


def live_ignored(sc, replay: bool = True) -> list[str]:
    """The scenario's settings a live cluster does not apply, where they are not at their
    defaults (the simulator's network and drain, how it models a fault's detection), and
    ``[faults]`` when the cluster only serves (``replay`` False: nothing plays them):
    said, not ignored."""
    from clockwork.settings import ClusterSettings, FaultSettings, ScenarioSettings

    def changed(model, table: Mapping, keys, prefix: str) -> list[str]:
        return [f"{prefix}{k}" for k in keys
                if k in table and table[k] != model.model_fields[k].default]

    out = changed(ClusterSettings, sc.cluster,
                  ("network_latency_ms", "jitter_ms", "clock_error_ms"), "cluster.")
    out += changed(ScenarioSettings, sc.data, ("drain_s",), "")
    faults = sc.faults or {}
    out += changed(FaultSettings, faults, ("detect_ms", "reconnect_s"), "faults.")
    if not replay:
        out += [f"faults.{k} (played by --replay only)" for k in ("kill", "hang")
                if faults.get(k)]
        if sc.data.get("repository"):
            out.append("repository (played by --replay only)")
        for key in ("add_workers", "remove_workers"):
            if sc.data.get(key):
                out.append(f"{key} (played by --replay only)")
    return out


def scheduler_error(table: Mapping[str, object]) -> str | None:
    """What the controller would refuse in a scenario's ``[scheduler]`` table (an unknown
    policy, key or value), in one line as ``clockwork simulate`` says it; None if nothing.
    Checked before the cluster starts: the controller reads the table from a settings
    file serve writes, and its refusal came after the workers had started, naming that
    file."""
    from controller import split_settings, table_policy

    try:
        split_settings(*table_policy(table))
    except (TypeError, ValueError) as e:
        return f"[scheduler]: {str(e).removeprefix('scheduler: ')}"  # (as simulate's)
    return None


def models_error(sc) -> str | None:
    """What the cluster could not serve among the scenario's models (one not in its
    profile set, one larger than each GPU's weights cache), as ``clockwork simulate``
    says it; None if nothing. Checked before anything starts: a model that never fits
    would only have its every request answered with an error."""
    from clockwork.profiles import load_profile_set
    from clockwork.resources import scenario_folder
    from clockwork.scenario import cache_fit_error

    try:
        pset = load_profile_set(str(sc.cluster["profiles"]), scenario_folder(sc))
        return cache_fit_error(sc, pset)
    except ValueError as e:
        return str(e)


def events_error(sc, replay: bool) -> str | None:
    """What is wrong with the scenario's ``[[repository]]``, ``[[add_workers]]`` or
    ``[[remove_workers]]`` events or controller restarts for a replay (a name not served
    at that point, a time past the end, a policy that cannot change its models or grow,
    a worker not there to remove, a restart with events or faults it does not go with),
    as ``clockwork simulate`` says it; None if nothing (or nothing plays them: no
    replay)."""
    from clockwork.scenario import fault_worker_error, repository_plan, restarts_error
    from controller import events_policy_error, table_policy

    if not replay:
        return None
    why = restarts_error(sc)
    if why or not any(sc.data.get(k) for k in ("repository", "add_workers",
                                               "remove_workers")):
        return why
    try:
        repository_plan(sc)
        joins = joining_workers(sc)
        leaving_workers(sc)
    except ScenarioError as e:
        return str(e)
    why = fault_worker_error(sc)
    if why:
        return why
    return events_policy_error(table_policy(sc.scheduler)[0], bool(sc.data.get("repository")),
                               bool(joins))


def controller_security_error(args: argparse.Namespace) -> str | None:
    """What the controller would refuse in serve's security flags -- a token it cannot
    use, ``--tls-cert`` without ``--tls-key``, a ``--host`` off loopback without a token
    (the controller's own rule, ``exposure_error``) -- in one line; None if nothing.
    The workers always listen on loopback, behind the cluster secret serve makes."""
    from clockwork.protocol.security import (
        SecurityError,
        TlsFiles,
        exposure_error,
        server_token,
    )

    try:
        token = server_token(getattr(args, "token", None), getattr(args, "token_file", None),
                             warn=False)  # (its controller warns, reading the file again)
        TlsFiles.from_flags(getattr(args, "tls_cert", None), getattr(args, "tls_key", None),
                            None, warn=False)  # (its controller warns of the dates)
    except SecurityError as e:
        return str(e)
    return exposure_error("controller", args.host, token, None,
                          getattr(args, "insecure_no_auth", False))


def tvm_missing() -> bool:
    """Whether Apache TVM cannot be imported (the tvm extra is not installed): a cpu or
    cuda worker runs TVM-compiled packages, and missing packages are compiled with it."""
    try:
        import tvm  # noqa: F401
    except ImportError:
        return True
    return False


def ensure_packages(models: str | None, profiles: str, device: str, packages: str) -> None:
    """Compile (with TVM) every zoo model the cluster serves that has no package yet in
    ``packages``; batch sizes from the model's profile so package and profile agree."""
    from pathlib import Path

    from clockwork.profiles import load_profile_set

    pset = load_profile_set(profiles)
    names = sorted({part.split(":")[0].strip() for part in (models or "").split(",")
                    if part.strip()} or pset.profiles)
    todo = [m for m in names if not (Path(packages) / m / "model.json").exists()]
    if not todo:
        return
    if tvm_missing():  # (compile_model imports it only once it runs)
        raise RuntimeError(f"no model packages for {', '.join(todo)} in {packages}, and TVM "
                           f"is not installed to build them: {pip_extra('tvm')}")
    from clockwork.models.package import compile_model
    from clockwork.models.zoo import ZOO

    for m in todo:
        if m not in ZOO:
            raise RuntimeError(f"no model package for {m!r} in {packages} (build it with "
                               f"'clockwork compile MODEL|FILE.onnx --out {packages}/{m}')")
        sizes = (pset.profiles[m].batch_sizes if m in pset.profiles
                 else list(DEFAULT_BATCH_SIZES))
        print(f"clockwork serve: compiling {m} for {device} (batch sizes "
              f"{','.join(map(str, sizes))}) into {packages}/{m} ...", file=sys.stderr, flush=True)
        from clockwork.cluster.models_cli import DEVICES
        compile_model(m, sizes, Path(packages) / m, target=DEVICES[device])


def worker_ports_error(first: int, workers: int, listeners: dict[str, int],
                       host: str = "127.0.0.1") -> str:
    """Why ``workers`` workers cannot listen on 127.0.0.1 from port ``first`` on (worker i
    on ``first + WORKER_PORT_STEP * i``) beside the controller's ``listeners`` (flag ->
    port, 0 or -1: none of its own) on ``host``; "" if they can, or for ``first`` 0 (free
    ports)."""
    if not first:
        return ""
    step = WORKER_PORT_STEP
    rule = (f"--worker-port {first}: worker i listens on {first} + {step} i, its fast "
            f"link on {first} + {step} i + {LINK_PORT_OFFSET}")
    last = first + step * (workers - 1) + LINK_PORT_OFFSET
    if last > 65535:
        return f"{rule}, so its {workers} workers need ports up to {last}, past 65535"
    if host not in ("127.0.0.1", "localhost", "0.0.0.0", "::", "", "[::]"):
        return ""  # (the controller's ports are another address's)
    for flag, p in listeners.items():
        i, at = divmod(p - first, step)
        if p > 0 and p >= first and at in (0, LINK_PORT_OFFSET) and i < workers:
            what = "port" if at == 0 else "fast link's port"
            return f"{flag} {p} is worker {i}'s {what} ({rule})"
    return ""


def _worker_port_hint(refusal: str, first: int) -> str:
    """What serve's flags mean for a worker that could not listen on its port: its own
    line names its own flag (``--port``), which serve's user did not give; "" for any
    other refusal."""
    m = re.match(r"worker(\d+): (?:clockwork worker: )?cannot listen on \S+ \(--port\)", refusal)
    link = re.match(r"worker(\d+): (?:clockwork worker: )?--link-port \d+: cannot listen", refusal)
    if not (m or link) or not first:
        return ""
    i = int((m or link).group(1))
    if link:
        return (f"worker{i}'s fast link's port is --worker-port {first} + {WORKER_PORT_STEP} "
                f"x {i} + {LINK_PORT_OFFSET}: give --worker-port other ports, or 0 for free "
                "ones")
    return (f"worker{i}'s port is --worker-port {first} + {WORKER_PORT_STEP} x {i}: give "
            "--worker-port other ports, or 0 for free ones")


def _listener(port: int | None, default: int, replaying: bool) -> int:
    """A serve listener's port: as given, else ``default`` (-1, off, with --replay)."""
    return port if port is not None else (-1 if replaying else default)


# what one local worker process takes (an emulated worker: ~65 MB resident measured)
WORKER_MEMORY_BYTES = 80 << 20


def local_workers_error(n: int, available: int | None = None) -> str | None:
    """Why ``n`` worker processes cannot be started on this machine (their memory, at
    ``WORKER_MEMORY_BYTES`` each, past what is available: ``MemAvailable``, or
    ``available`` bytes), or None (also where it cannot be read)."""
    if available is None:
        try:
            with open("/proc/meminfo") as f:
                available = next(int(line.split()[1]) * 1024 for line in f
                                 if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
    need = n * WORKER_MEMORY_BYTES
    if need <= available:
        return None
    return (f"{n:,} local worker processes need ~{need / 2**30:.1f} GiB (~"
            f"{WORKER_MEMORY_BYTES >> 20} MiB each), more than the {available / 2**30:.1f} "
            "GiB this machine has available: give fewer workers (cluster.workers), more "
            "GPUs each (cluster.gpus_per_worker), or spread them over machines (--ray)")


# how a scenario with no [[workloads]] is refused (served without --replay all the same)
_NO_WORKLOADS = "workloads: must be at least one [[workloads]] table"


def _served_scenario(path: str, overrides: list[str], replay: bool):
    """The scenario ``serve`` starts a cluster from. Without ``--replay`` its workloads
    are not run, so one with no ``[[workloads]]`` (a cluster and its models only) is
    served as it is (it was refused: a placeholder workload had to be written in)."""
    try:
        return load_scenario(path, overrides)
    except ScenarioError as e:
        if replay or f"{_NO_WORKLOADS}, got " not in str(e):  # (--set workloads=[] too)
            raise
    sc = load_scenario(path, overrides, pinned=[("workloads", [{"kind": "poisson",
                                                                "rate_rps": 1.0}])])
    sc.data["workloads"] = []
    return sc


def cmd_serve(args: argparse.Namespace) -> int:
    """``clockwork serve``; a controller that had to be killed as the cluster stopped
    (it did not end within ``CONTROLLER_STOP_S`` of SIGTERM, or a second signal came)
    makes a clean stop exit 1: its logs may be cut short."""
    return_killed = [False]
    rc = _serve(args, return_killed)
    return 1 if rc == 0 and return_killed[0] else rc


def _serve(args: argparse.Namespace, return_killed: list[bool]) -> int:
    workers, gpus, profiles, models, pages = 1, 1, "v100-reference", None, None
    device = getattr(args, "device", None)
    device_from = "--device"  # where the device was named (for messages)
    packages = getattr(args, "packages", None)
    worker_args: list[list[str]] = []
    worker_flags_of = None
    sc = None
    extra: list[str] = []
    scheduler = None
    notes: list[str] = []  # what the scenario sets that the cluster will not use
    # options that mean something only with another one: refused, not ignored
    if args.set and not args.scenario:
        print("clockwork serve: --set needs a scenario (it overrides the scenario's keys: "
              "clockwork serve SCENARIO --set KEY=VALUE)", file=sys.stderr)
        return 2
    if getattr(args, "out", None) and not getattr(args, "replay", False):
        print("clockwork serve: --out needs --replay (the replay's logs and summary.json go "
              "there; a serving cluster's logs: --log-dir)", file=sys.stderr)
        return 2
    if getattr(args, "spill_dir", None) and not getattr(args, "replay", False):
        print("clockwork serve: --spill-dir needs --replay (it holds the replay's rows; "
              "the controller's own, --log-dir, are flushed to their files as it runs)",
              file=sys.stderr)
        return 2
    for flag, does in (("quiet", "hides"), ("progress", "shows")):
        if getattr(args, flag, False) and not getattr(args, "replay", False):
            print(f"clockwork serve: --{flag} needs --replay (it {does} the replay's progress "
                  "line; a serving cluster prints none)", file=sys.stderr)
            return 2
    if args.scenario:
        try:
            sc = _served_scenario(args.scenario, args.set, bool(getattr(args, "replay", False)))
        except ScenarioError as e:
            print(f"clockwork serve: {e}", file=sys.stderr)
            return 2
        kw, ignored = cluster_from_scenario(sc, bool(getattr(args, "replay", False)))
        if ignored:  # (said once everything is checked, as the cluster starts)
            notes.append(f"not applied by a live cluster: {', '.join(ignored)}")
        why = (scheduler_error(kw["scheduler"]) or models_error(sc)
               or events_error(sc, bool(getattr(args, "replay", False)))
               or clock_offsets_error(sc))
        if why:
            print(f"clockwork serve: {why}", file=sys.stderr)
            return 2
        from controller import table_policy, unused_line

        line = unused_line(*table_policy(kw["scheduler"]))
        if line:
            notes.append(line)
        workers, gpus, profiles = kw["workers"], kw["gpus"], kw["profiles"]
        pages, models = kw["pages"], kw["models"]
        if device is None and kw["device"] != "emulated":
            device, device_from = kw["device"], "cluster.device ="
        packages = packages or kw["packages"]
        extra += kw["controller_args"]
        scheduler = kw["scheduler"]
        worker_args = kw["worker_args"]
        worker_flags_of = kw["worker_flags_of"]
    elif getattr(args, "replay", False):
        print("clockwork serve: --replay needs a scenario file", file=sys.stderr)
        return 2
    why = controller_security_error(args)
    if why:
        print(f"clockwork serve: {why}", file=sys.stderr)
        return 2
    if sc is not None and getattr(args, "replay", False):
        from clockwork.cluster.faults import no_live_form
        from clockwork.scenario import faults_error

        # (before a process starts, a package is compiled or --out is cleared)
        why = no_live_form(sc.faults or {}) or faults_error(sc)
        if why:
            print(f"clockwork serve: {why}", file=sys.stderr)
            return 2
    ray_address = getattr(args, "ray", None)  # "local": start a Ray instance here
    if ray_address is None and sc is not None and sc.cluster.get("backend") == "ray":
        # (the cluster RAY_ADDRESS names, as sweep --backend ray takes it: inside a Ray
        # job, the job's; else one started here)
        ray_address = os.environ.get("RAY_ADDRESS", "").strip() or "local"
    if ray_address is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            from clockwork.cluster.cli.verbs import NEEDS
            print(f"clockwork serve: needs {NEEDS['ray']}", file=sys.stderr)
            return 2
        from clockwork.cluster.parallel import ray_unreachable

        why = ray_unreachable(ray_address)
        if why:
            print(f"clockwork serve: --ray: {why}", file=sys.stderr)
            return 2
        if sc is not None and any(sc.faults.get(k) for k in ("kill", "hang", "slow_network")):
            print("clockwork serve: [faults] kill, hang and slow_network are not played on a "
                  "Ray cluster (Ray restarts a worker that dies by itself; controller_restart "
                  "is played); remove them, or run without --ray", file=sys.stderr)
            return 2
        if sc is not None and sc.data.get("add_workers"):
            print("clockwork serve: [[add_workers]] events are not played on a Ray cluster "
                  "(its workers join as Ray nodes join: start a node with the GPU resource "
                  "while the cluster serves); remove them, or run without --ray",
                  file=sys.stderr)
            return 2
    if getattr(args, "replay", False) and getattr(args, "out", None) \
            and not getattr(args, "log_dir", None):
        # the controller's own view beside the replay's: every action, with its prediction
        # error (the replay's action log has none: its client sees no actions)
        args.log_dir = str(Path(args.out) / CONTROLLER_LOGS)
        if Path(args.log_dir).exists() and not Path(args.log_dir).is_dir():
            print(f"clockwork serve: --out {args.out}: {args.log_dir} is a file, where the "
                  "controller's logs go: move it, or give --log-dir another folder",
                  file=sys.stderr)
            return 2
    if getattr(args, "log_dir", None):
        if getattr(args, "out", None) and Path(args.out).resolve() == Path(args.log_dir).resolve():
            print("clockwork serve: --log-dir and --out name one folder: the controller's logs "
                  "and the replay's would overwrite each other; give them two",
                  file=sys.stderr)
            return 2
        extra += ["--log-dir", str(args.log_dir)]
    # the controller's listeners; the workers stay on loopback, behind the cluster secret
    for flag in ("token_file", "tls_cert", "tls_key"):
        if getattr(args, flag, None):
            extra += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if getattr(args, "insecure_no_auth", False):
        extra += ["--insecure-no-auth"]
    if ray_address is not None and getattr(args, "tls_cert", None):
        # (each worker actor listens on its node's address, authenticated by the cluster
        # secret; it has no certificate for that address, so TLS would not cover it)
        print("clockwork serve: --tls-cert with --ray: the worker actors listen on their "
              "nodes' addresses without TLS (the cluster secret authenticates them, nothing "
              "encrypts their traffic); for TLS everywhere, run clockwork worker --tls-cert "
              "on each node and clockwork controller --worker-tls-ca (SECURITY.md)",
              file=sys.stderr)
        return 2
    if getattr(args, "replay", False) and getattr(args, "tls_cert", None):
        print("clockwork serve: --replay drives its own cluster over loopback; --tls-cert and "
              "--tls-key are for a cluster that serves clients", file=sys.stderr)
        return 2
    device = device or "emulated"
    if device == "cuda" and ray_address in (None, "local"):  # no GPU here: say so before
        # compiling or starting anything (on a Ray cluster the GPUs are the nodes')
        try:
            from worker.devices.cuda import probe
            probe()
        except Exception as e:  # noqa: BLE001 - DeviceUnavailable says what to do instead
            print(f"clockwork serve: {e}", file=sys.stderr)
            return 2
    if device != "emulated" and ray_address is None and tvm_missing():
        # the workers run TVM-compiled packages (and missing ones are compiled here first):
        # said before compiling or starting anything (a Ray cluster's nodes have their own)
        from clockwork.cluster.cli.verbs import NEEDS
        print(f"clockwork serve: {device_from} {device} needs {NEEDS['tvm']}", file=sys.stderr)
        return 2
    # the workers a replay's [[add_workers]] start too (before the run)
    joining = len(joining_workers(sc)) if sc is not None and getattr(args, "replay", False) else 0
    if ray_address is None:
        why = local_workers_error(workers + joining)
        if why:
            print(f"clockwork serve: {why}", file=sys.stderr)
            return 2
    if device != "emulated":
        if sc is None:
            profiles = device  # the device's own measured profile set (profiles/cpu, ...)
        packages = packages or f"packages/{device}"
        try:
            ensure_packages(models, profiles, device, packages)
        except (RuntimeError, ValueError, OSError) as e:
            print(f"clockwork serve: {e}", file=sys.stderr)
            return 2
    secret = None  # (None: LocalCluster makes one for the cluster)
    if getattr(args, "cluster_secret_file", None):
        from clockwork.protocol.security import SecurityError, cluster_secret
        try:
            secret = cluster_secret(args.cluster_secret_file, env={}).decode("ascii")
        except SecurityError as e:
            print(f"clockwork serve: {e}", file=sys.stderr)
            return 2
        except UnicodeDecodeError:
            print(f"clockwork serve: --cluster-secret-file {args.cluster_secret_file}: not "
                  "ASCII text (the workers are given it in their environment)", file=sys.stderr)
            return 2
    from clockwork.telemetry import PROCESS_LOGS

    replaying = getattr(args, "replay", False)
    if replaying and args.out:
        try:
            clear_run_folder(Path(args.out), "clockwork serve")
        except OSError as e:
            print(f"clockwork serve: --out {args.out}: {e}", file=sys.stderr)
            return 2
    port = args.port if args.port is not None else (0 if replaying else 12346)
    kw = {"echo": not replaying, "controller_args": extra,
          # (a replay's clients use the controller port: the other listeners are off
          # unless asked for, e.g. to watch /metrics during the replay)
          "http_port": _listener(args.http_port, 8000, replaying), "device": device,
          "kserve_port": _listener(args.kserve_port, 8001, replaying),
          "worker_args": worker_args, "worker_flags_of": worker_flags_of,
          "packages": packages, "scheduler": scheduler, "token": getattr(args, "token", None),
          "cluster_secret": secret,
          "worker_host": "127.0.0.1",
          # a replay's report folder keeps what the controller and workers said
          "log_dir": Path(args.out) / PROCESS_LOGS if replaying and args.out else None}
    if ray_address is None:
        why = worker_ports_error(args.worker_port, workers + joining, {
            "--port": port, "--http-port": kw["http_port"], "--kserve-port": kw["kserve_port"]},
            args.host)
        if why:
            print(f"clockwork serve: {why}", file=sys.stderr)
            return 2
    for note in notes:
        print(f"clockwork serve: {note}", file=sys.stderr)
    if ray_address is None:
        cluster = LocalCluster(workers, gpus, profiles, models, pages, args.host, port,
                               args.worker_port, **kw)
    else:  # one worker per Ray node (its GPUs), the controller here
        from clockwork.cluster.ray_cluster import RayCluster  # (Ray: imported when asked for)

        cluster = RayCluster(address=None if ray_address == "local" else ray_address,
                              workers=workers, gpus=gpus, profiles=profiles, models=models,
                              pages=pages, host=args.host, port=port,
                              worker_port=args.worker_port, timeout=60.0, **kw)
    stop = threading.Event()
    hard = threading.Event()  # a second signal: a replay ends, a stopping controller dies
    cluster.hard = hard  # (also when a start that was interrupted stops the cluster)
    starting = [True]  # a start, or a worker's restart, under way: a signal ends its wait

    def on_signal(signum, frame):
        if stop.is_set():
            hard.set()
        stop.set()
        if starting[0]:  # (a start may wait minutes: for Ray's actors, cuda kernel builds)
            starting[0] = False
            raise _StartInterrupted

    old = {s: signal.signal(s, on_signal) for s in stop_signals()}
    try:
        try:
            try:
                cluster.start()
            finally:
                starting[0] = False
        except _StartInterrupted:
            print("clockwork serve: interrupted while the cluster started", file=sys.stderr)
            return 130
        except ChildRefused as e:
            if not e.echoed:  # (echoed: the child's own line, named, is on stderr)
                print(f"clockwork serve: {e}", file=sys.stderr)
            hint = _worker_port_hint(str(e), args.worker_port)
            if hint:
                print(f"clockwork serve: {hint}", file=sys.stderr)
            return 2
        except (TimeoutError, RuntimeError, ConnectionError) as e:
            print(f"clockwork serve: {e}", file=sys.stderr)
            return 1
        if getattr(args, "replay", False):
            return _replay_against(cluster, sc, args, stop, hard)
        try:  # (standard output that fails, a full disk: the lines lost, not the cluster)
            print(f"clockwork serve: controller at {cluster.address} ({cluster.shape()}: "
                  f"{', '.join(cluster.worker_addresses)}); Ctrl-C stops", flush=True)
            print(f"controller listening on {cluster.address}", flush=True)
        except OSError as e:
            print(f"clockwork serve: cannot write to standard output ({e.strerror or e}); "
                  f"serving on: controller at {cluster.address}", file=sys.stderr)
        restarts: dict[int, list[float]] = {}  # worker -> when it was restarted
        while not stop.is_set():
            code = cluster.controller.proc.poll()
            if code is not None:
                print(f"clockwork serve: the controller {how_it_ended(code)}; stopping",
                      file=sys.stderr)
                return 2 if code == 2 else 1  # 2: it refused its settings or a port
            for i in range(len(cluster.workers)):
                if stop.is_set():
                    break
                if cluster.workers[i].proc.poll() is not None:
                    # (a restart waits for the new worker to listen: a cuda one may take
                    # minutes, each line it says giving it more; a stop asked meanwhile
                    # ends the wait, as at the start: it was taken up only after the
                    # restart gave up, and said as its failure, exit 1)
                    starting[0] = not stop.is_set()
                    try:
                        rc = _restart_worker(cluster, i, restarts.setdefault(i, []))
                    except _StartInterrupted:
                        return 0  # (stopped as while serving: the new worker with it)
                    finally:
                        starting[0] = False
                    if rc is not None:
                        return rc
            stop.wait(0.5)
        return 0
    finally:
        cluster.stop()  # (a second signal meanwhile kills the controller at once)
        for s, h in old.items():
            signal.signal(s, h)
        if cluster.controller is not None and getattr(cluster.controller, "killed", False):
            how = ("a second signal came before it stopped" if hard.is_set() else
                   "it did not stop in time")
            print(f"clockwork serve: the controller was killed ({how}); its last log lines "
                  "and --log-dir logs may be missing", file=sys.stderr)
            return_killed[0] = True
        print("clockwork serve: stopped", file=sys.stderr, flush=True)


class _StartInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while the cluster started: what started is stopped, exit 130
    (while a worker is restarted: the cluster is stopped, exit 0, as while serving).
    (A KeyboardInterrupt: no ``except Exception`` on the way takes it for a failed step,
    and Ray's waits pass it through as it is -- any other exception a signal handler
    raises in them comes out as a SystemError.)"""


def _restart_worker(cluster: LocalCluster, i: int, times: list[float]) -> int | None:
    """Worker ``i`` exited while the cluster serves: start it again on its port with its
    flags (its GPUs come back empty; the controller reconnects to that address and takes
    it back), saying so in one line; ``times``: when it was restarted before (updated).
    A new one that exits before it listens counts as one more exit (restarted again,
    within the same bound). Returns None, or serve's exit code when it gives up: the
    worker was restarted ``WORKER_RESTARTS`` times in the last ``RESTART_WINDOW_S``
    seconds already, or the new one could not be started (2: it refused its settings or
    its port; 1: it did not say it listens in time, or could not be run)."""
    while True:
        child = cluster.workers[i]
        code = child.proc.returncode
        now = time.monotonic()
        times[:] = [t for t in times if now - t < RESTART_WINDOW_S]
        if len(times) >= WORKER_RESTARTS:
            print(f"clockwork serve: {child.name} {how_it_ended(code)}, restarted "
                  f"{len(times)} times in {RESTART_WINDOW_S:g} s; stopping", file=sys.stderr)
            return 1
        times.append(now)
        print(f"clockwork serve: {child.name} {how_it_ended(code)}; restarting it on "
              f"{cluster.worker_addresses[i]} (restart {len(times)} of at most "
              f"{WORKER_RESTARTS} in {RESTART_WINDOW_S:g} s)", file=sys.stderr, flush=True)
        try:
            cluster.restart_worker(i)
        except ChildRefused as e:
            if not e.echoed:
                print(f"clockwork serve: {e}", file=sys.stderr)
            print(f"clockwork serve: {child.name} could not be restarted; stopping",
                  file=sys.stderr)
            return 2
        except RuntimeError:
            if cluster.workers[i].proc.poll() is None:  # (not its exit: cannot happen)
                raise
            continue  # it exited while starting: one more exit
        except (TimeoutError, OSError) as e:
            print(f"clockwork serve: {child.name} could not be restarted ({e}); stopping",
                  file=sys.stderr)
            return 1
        return None


def _crashed_workers(cluster: LocalCluster, faults, crashed: dict[int, str]) -> None:
    """Say (once each, and note in ``crashed``) a worker whose process has exited during
    a replay other than by the scenario's own kill (``faults.down``): under --replay
    nothing else watched them, and a run that lost half its GPUs ended exit 0 with no
    word unless --out kept the controller's log."""
    for i, w in enumerate(cluster.workers):
        code = w.proc.poll() if w.proc is not None else None
        if code is None or i in crashed or i in faults.down:
            continue
        crashed[i] = how_it_ended(code)
        print(f"clockwork serve: worker {i} {crashed[i]} during the replay; it is not "
              "restarted (--replay), so the rest of the run has fewer GPUs", file=sys.stderr,
              flush=True)


def _crashed_controller(cluster: LocalCluster, faults) -> list[str]:
    """How the controller's process ended, if it did outside the scenario's restarts
    (``faults.controller_down``), said at once; else []."""
    ctrl = cluster.controller
    code = ctrl.proc.poll() if ctrl is not None else None
    if code is None or faults.controller_down:
        return []
    how = how_it_ended(code)
    print(f"clockwork serve: the controller {how} during the replay, outside the "
          "scenario's controller restarts; the replay goes on, its requests waiting for a "
          "controller until their SLO is over", file=sys.stderr, flush=True)
    return [how]


def _replay_against(cluster: LocalCluster, sc, args: argparse.Namespace,
                    stop: threading.Event, hard: threading.Event) -> int:
    """``clockwork serve SCENARIO --replay``: drive the workloads, print the table, stop.
    ``stop`` set (Ctrl-C, SIGTERM, SIGHUP): no more requests are sent, the answers due
    are awaited, and the figures so far are shown (and written with --out), exit 130;
    ``hard`` set (a second signal): the replay ends at once, nothing kept, exit 130."""
    import asyncio

    from clockwork.cluster.replay import replay, run_status
    from clockwork.errors import ClockworkError
    from clockwork.telemetry import emit_run

    also = "".join(f", {name} at {cluster.printed_address(what)}"
                   for name, what, port in (("REST", "http", cluster.http_port),
                                            ("KServe gRPC", "kserve grpc",
                                             cluster.kserve_port)) if port != -1)
    print(f"clockwork serve: {cluster.shape()}, controller at {cluster.address}{also}; "
          f"replaying {len(sc.workloads)} workload(s) for "
          f"{sc.duration_s:.0f} s", file=sys.stderr, flush=True)
    progress = args.progress or (not args.quiet and sys.stderr.isatty())
    from clockwork.cluster.faults import Interrupted, LiveFaults
    from clockwork.protocol.security import client_token
    from clockwork.scenario import joining_workers, leaving_workers, repository_plan

    token = client_token(getattr(args, "token", None), getattr(args, "token_file", None),
                         warn=False)  # (its controller has said it of the same file)
    try:
        faults = LiveFaults(cluster, sc.faults, sc.duration_s, repository_plan(sc), token,
                            {m["name"]: int(m.get("copies", 1)) for m in sc.models},
                            joining_workers(sc), stopped=stop.is_set,
                            leaves=leaving_workers(sc))
    except Interrupted:
        print("\nclockwork serve: interrupted before the replay started", file=sys.stderr)
        return 130
    except (ValueError, ScenarioError, ClockworkError, RuntimeError, TimeoutError) as e:
        # (a joining worker's process that could not start, ChildRefused included)
        from clockwork.cluster.replay import exit_code

        print(f"clockwork serve: {e}", file=sys.stderr)
        if isinstance(e, ChildRefused):  # (its settings or port: the user's to correct)
            return 2
        return exit_code(e) if not isinstance(e, RuntimeError | TimeoutError) else 1
    try:
        # real devices: answers carry real outputs; check every one against the reference
        check = cluster.packages if cluster.device != "emulated" else None
        crashed: dict[int, str] = {}  # worker -> how its process ended, unplanned
        # a controller the scenario restarts: the replay's stream waits for it however it
        # went away, so an exit outside the plan is watched for here
        restarts = bool((sc.faults or {}).get("controller_restart"))
        lost_controller: list[str] = []  # how it ended, unplanned (said once)

        async def until_stopped():
            task = asyncio.ensure_future(replay(
                sc, cluster.address, 20000, progress, check,
                on_start=faults.start if faults else None, token=token, stop=stop.is_set,
                spill_dir=getattr(args, "spill_dir", None),
                # (a controller the scenario restarts: the stream waits for the new one)
                reconnect=restarts, earlier_counts=lambda: (faults.settle(), faults.counts)[1]))
            while not task.done():
                if hard.is_set():  # (the signal handler only sets it)
                    task.cancel()
                    break
                if not stop.is_set():
                    _crashed_workers(cluster, faults, crashed)
                    if restarts and not lost_controller:
                        lost_controller.extend(_crashed_controller(cluster, faults))
                await asyncio.wait({task}, timeout=0.1)
            return await task

        res = asyncio.run(until_stopped())
    except asyncio.CancelledError:
        print("\nclockwork serve: interrupted; the replay stopped", file=sys.stderr)
        return 130
    except (ScenarioError, ClockworkError, ValueError) as e:
        from clockwork.cluster.replay import exit_code

        print(f"clockwork serve: {e}", file=sys.stderr)
        return exit_code(e)
    finally:
        faults.stop()
    from clockwork.signals import stops_held

    res.own_process_logs = True  # (its processes' output, in --out's logs/)
    with stops_held():  # (a first signal as the files are written: held until they are)
        emit_run(res, sc, f"live cluster, {res.wall_s:.1f} s wall; every request answered "
                 f"exactly once: {res.answered_once}", args.out, who="clockwork serve")
    if args.out and getattr(args, "log_dir", None):
        earlier = sorted(p.name for p in Path(args.log_dir).glob("requests.[0-9]*.*"))
        also = (f"; the earlier controllers' are numbered: clockwork report "
                f"{Path(args.log_dir) / earlier[0]}, ..." if earlier else "")
        print(f"clockwork serve: the controller's logs: {args.log_dir} (every action, with "
              f"its prediction error; clockwork report {args.log_dir}{also})",
              file=sys.stderr)
    status = run_status(res)
    if crashed:  # (a worker whose process died: the rest of the run had fewer GPUs)
        print(f"clockwork serve: {len(crashed)} worker process(es) exited during the "
              "replay, unplanned, and were not restarted (--replay restarts none), so this "
              "run is not the scenario's: "
              + "; ".join(f"worker {i} {how}" for i, how in sorted(crashed.items())),
              file=sys.stderr)
        status = status or 1
    if lost_controller:
        print(f"clockwork serve: the controller {lost_controller[0]} during the replay, "
              "unplanned (not by the scenario's controller_restart; the replay waited for "
              "the next one the scenario starts, if any), so this run is not the "
              "scenario's", file=sys.stderr)
        status = status or 1
    if faults.failed:  # the run did not follow its scenario's plan: said last, exit 1
        print(f"clockwork serve: {len(faults.failed)} of the scenario's [faults] / "
              "[[repository]] / [[add_workers]] / [[remove_workers]] events could not be "
              "played, so this run is "
              "not the scenario's: "
              + "; ".join(faults.failed), file=sys.stderr)
        status = status or 1
    return status
