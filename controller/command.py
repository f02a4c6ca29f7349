"""``clockwork controller``: the command. Its scheduler settings (``--settings FILE``,
``--policy``, ``--set`` and the flags that name a setting), its security (token, cluster
secret, TLS) and its bounds are read and checked here, a ``ControllerNode`` is made of
them, and ``serve_controller`` runs it until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from clockwork.profiles import ProfileError
from clockwork.protocol.addresses import join
from clockwork.protocol.listen import ListenError
from clockwork.protocol.parent import stop_when_orphaned
from clockwork.protocol.security import (
    ClusterAuth,
    SecurityError,
    TlsFiles,
    channel_credentials,
    client_ssl_context,
    cluster_secret,
    exposure_error,
    plaintext_workers_warning,
    server_token,
)
from clockwork.signals import said_why, stop_event_on_signals
from controller import split_settings, unused_line
from controller.config import SchedulerConfig
from controller.grpc_api import Interrupted, serve_controller
from controller.limits import limits_from_flags
from controller.links import ListedTwice
from controller.service import LOG_FLUSH_S, ControllerNode


class LogsLost(Exception):
    """The controller stopped, and its --log-dir logs are not whole (a write failed)."""


def parse_settings(items: list[str]) -> dict:
    """``["max_exec_ms=25", "batch_first=false"]`` -> {"max_exec_ms": 25, ...} (values as
    TOML would read them: booleans, integers, floats, else strings). The keys and values
    are checked against the policy's schemas by ``controller.split_settings``; here a
    malformed item raises ``ValueError`` with one line."""
    from clockwork.scenario import parse_value
    from clockwork.settings import SettingsError

    out = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise SettingsError(f"--set wants KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(text.strip())
    return out


def read_settings_file(path: str) -> dict:
    """The ``[scheduler]`` table of a settings file (``clockwork controller --settings``),
    as data: a JSON file (suffix ``.json``; ``{"scheduler": {...}}``, what ``clockwork
    serve`` writes) or else a TOML file with a ``[scheduler]`` table (a scenario file
    works: only that table is read, and one without it gives the defaults, as
    ``simulate`` runs it). The table may name the ``policy``. Its keys and
    values are checked by ``controller.split_settings`` (``scheduler_settings``); a file
    that cannot be read or parsed, or has no ``scheduler`` table, raises
    ``SettingsError`` with one line naming the file."""
    from pathlib import Path

    from clockwork.scenario import parse_json, parse_toml
    from clockwork.settings import SettingsError

    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SettingsError(f"--settings {path}: cannot read it ({e.strerror or e})") from None
    where = f"--settings {path}"
    json_file = p.suffix.lower() == ".json"
    if json_file:
        data = parse_json(raw, where, SettingsError)
    else:
        data = parse_toml(raw, where, SettingsError)
    table = data.get("scheduler") if isinstance(data, dict) else None
    if (table is None and not json_file and isinstance(data, dict)
            and {"cluster", "models", "workloads"} & data.keys()):
        table = {}  # a scenario without [scheduler]: the defaults, as simulate runs it
    if not isinstance(table, dict):
        raise SettingsError(f"--settings {path}: no [scheduler] table (JSON: "
                            '{"scheduler": {"policy": ..., "<setting>": ...}})')
    return dict(table)


def scheduler_settings(args: argparse.Namespace) -> tuple[str, SchedulerConfig, dict]:
    """The controller's policy name, ``SchedulerConfig`` and the policy's own settings,
    from ``--settings FILE`` and, over it, ``--policy``, ``--schedule-ahead-ms``,
    ``--default-slo-ms``, ``--max-batch`` and ``--set``; checked by
    ``controller.split_settings`` (a bad key or value raises ``SettingsError`` with one
    line, prefixed with the file when the file holds it)."""
    from clockwork.settings import SettingsError

    table: dict = {}
    policy = args.policy
    if args.settings:
        table = read_settings_file(args.settings)
        in_file = str(table.pop("policy", "clockwork"))
        policy = policy or in_file
        try:
            split_settings(policy, table)  # the file alone, so errors can name it
        except SettingsError as e:
            raise SettingsError(f"--settings {args.settings}: {e}") from None
    policy = policy or "clockwork"
    table.update({k: v for k, v in (
        ("schedule_ahead_ms", args.schedule_ahead_ms), ("default_slo_ms", args.default_slo_ms),
        ("max_batch", args.max_batch)) if v is not None})
    sets = parse_settings(args.set)
    for key, flag in (("schedule_ahead_ms", "--schedule-ahead-ms"),
                      ("default_slo_ms", "--default-slo-ms"), ("max_batch", "--max-batch")):
        given = getattr(args, key)
        if key in sets and given is not None and sets[key] != given:
            raise SettingsError(f"--set {key}={sets[key]} and {flag} {given:g} give it two "
                                "values: give one")
    if "policy" in sets:  # (it was "unknown scheduler setting 'policy'", known keys listed)
        raise SettingsError(f"--set policy={sets['policy']}: the policy is given with "
                            f"--policy {sets['policy']} (or as policy in --settings FILE)")
    table.update(sets)
    common, own = split_settings(policy, table)  # checks the policy name too
    line = unused_line(policy, table)
    if line:
        print(f"clockwork controller: {line}", file=sys.stderr)
    return policy, SchedulerConfig.from_ms(**common), own


def _security(args: argparse.Namespace, workers: list[str]):
    """(client token, cluster secret, TLS files) from the flags, checked against the
    default rule (off loopback: a token, and the cluster secret for far workers, unless
    --insecure-no-auth); raises ``SecurityError`` with one line."""
    token = server_token(getattr(args, "token", None), getattr(args, "token_file", None))
    secret = cluster_secret(getattr(args, "cluster_secret_file", None))
    tls = TlsFiles.from_flags(getattr(args, "tls_cert", None), getattr(args, "tls_key", None),
                              getattr(args, "tls_ca", None))
    why = exposure_error("controller", args.host, token, secret,
                         getattr(args, "insecure_no_auth", False), workers)
    if why is not None:
        raise SecurityError(why)
    return token, secret, tls


def _worker_credentials(args: argparse.Namespace, tls: TlsFiles | None):
    """With --worker-tls-ca: TLS to the workers, verified against that CA, presenting our
    --tls-cert/--tls-key as client certificate (for workers started with --tls-ca): the
    gRPC credentials and the fast links' context; (None, None) without."""
    ca = getattr(args, "worker_tls_ca", None)
    if not ca:
        return None, None
    cert, key = (tls.cert, tls.key) if tls else (None, None)
    return channel_credentials(ca, cert, key), client_ssl_context(ca, cert, key)


def cmd_controller(args: argparse.Namespace) -> int:
    workers = list(args.workers)  # host:port list, checked by the argument parser
    for flag, given in (("--log-format", getattr(args, "log_format", None)),
                        ("--log-flush-s", getattr(args, "log_flush_s", None))):
        if given is not None and not args.log_dir:
            print(f"clockwork controller: {flag} needs --log-dir (the logs are written "
                  "only there)", file=sys.stderr)
            return 2
    flush_s = getattr(args, "log_flush_s", None)
    try:
        policy, cfg, own = scheduler_settings(args)
        limits = limits_from_flags(getattr(args, "limit", None) or [])
        node = ControllerNode(workers, args.profiles, args.models, policy, cfg,
                              args.connect_timeout, args.log_dir, args.action_interval_us,
                              args.reply_interval_us, own,
                              LOG_FLUSH_S if flush_s is None else flush_s,
                              getattr(args, "log_format", None) or "tsv",
                              adopt_weights=not getattr(args, "fresh_caches", False))
    except (ProfileError, ValueError) as e:
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 2
    node.limits = limits
    try:
        token, secret, tls = _security(args, workers)
        node.worker_credentials, node.worker_tls = _worker_credentials(args, tls)
    except SecurityError as e:
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 2
    node.clients_tls = tls is not None
    line = plaintext_workers_warning(node.clients_tls, node.worker_credentials, workers)
    if line:
        node.plaintext_said = frozenset(workers)
        print(f"clockwork controller: warning: {line}", file=sys.stderr, flush=True)
    node.cluster_auth = ClusterAuth(secret) if secret is not None else None
    node.insecure_no_auth = getattr(args, "insecure_no_auth", False)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop_event_on_signals(loop, stop)  # (SIGHUP too: its logs written, as on SIGTERM)
        orphan = asyncio.ensure_future(stop_when_orphaned(stop, "controller"))

        def ready(port: int) -> None:
            sec = "".join(s for on, s in ((token, ", token required"), (tls, ", TLS"),
                                           (secret, ", cluster secret")) if on)
            awaited = f" ({len(node.awaited)} more awaited)" if node.awaited else ""
            print(f"clockwork controller listening on {join(args.host, port)} ({len(node.links)} "
                  f"worker(s){awaited}, {len(node.gpu_index)} GPU(s), {len(node.profiles)} "
                  f"model instance(s){sec})", flush=True)

        try:
            await serve_controller(node, args.host, args.port, ready, stop,
                                   args.http_port if args.http_port >= 0 else None,
                                   args.kserve_port if args.kserve_port >= 0 else None,
                                   token, tls)
        finally:
            orphan.cancel()
        # (an operator tells a stop from a crash by it; a clean stop said nothing)
        waiting = (f"; {node.answered_at_stop} request(s) still waiting answered ERROR "
                   "shutdown" if node.answered_at_stop else "")
        print(f"clockwork controller: stopped{said_why(stop)}{waiting}", file=sys.stderr,
              flush=True)
        if node.logs_lost:  # (exit 1: an operator's script must not take them as whole)
            raise LogsLost(node.logs_lost)

    try:
        asyncio.run(main())
    except Interrupted as e:
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 130
    except (ListenError, ListedTwice) as e:  # (the user's to correct, as an argument)
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 2
    except LogsLost as e:
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 1
    except (ConnectionError, ValueError) as e:
        print(f"clockwork controller: {e}", file=sys.stderr)
        return 1
    return 0
