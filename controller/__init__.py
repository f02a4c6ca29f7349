"""The controller package (scheduling policies as pure cores, the service shell around
them); this module is the policy registry: ``POLICIES``, ``make_policy``,
``policy_class``, and the ``[scheduler]`` settings check ``split_settings`` that every
shell runs before building one."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from functools import cache

from clockwork.profiles import ModelProfile
from clockwork.settings import SettingsError, from_table, table_keys, unknown_key_line
from controller.config import SchedulerConfig
from controller.policy import GpuSpec, Policy

# policy name -> (module, class), imported on first use (the baselines stay unimported
# unless asked for)
_CLASSES = {
    "clockwork": ("controller.scheduler", "ClockworkScheduler"),
    "clipper": ("controller.baselines.clipper", "ClipperPolicy"),
    "tfserving": ("controller.baselines.tfserving", "TfServingPolicy"),
    "infaas": ("controller.baselines.infaas", "InfaasPolicy"),
}


def policy_class(name: str) -> type[Policy]:
    """The class of policy ``name`` (for what it can do before one is built, such as
    ``Policy.adopts_weights``)."""
    _check_policy(name)
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def events_policy_error(name: str, models: bool, workers: bool) -> str | None:
    """What policy ``name`` cannot do of a scenario's run-time events, in one line (the
    simulator's and ``clockwork serve``'s words): change its models while it runs
    (``models``: ``[[repository]]`` entries; ``Policy.add_model`` / ``remove_model``), or
    take GPUs added while it runs (``workers``: ``[[add_workers]]``; ``Policy.add_gpu``);
    None if it can."""
    cls = policy_class(name)
    if models and (cls.add_model is Policy.add_model or cls.remove_model is Policy.remove_model):
        return (f"repository: the {name} policy cannot unload or load models while it runs: "
                "remove the [[repository]] entries, or use another policy")
    if workers and cls.add_gpu is Policy.add_gpu:
        return (f"add_workers: the {name} policy cannot add workers while it runs: remove "
                "the [[add_workers]] entries")
    return None


def _clockwork(profiles, gpus, cfg, settings=None) -> Policy:
    if settings:
        raise SettingsError(unknown_key_line((sorted(settings)[0],), table_keys(SchedulerConfig),
                                             "scheduler"))
    return policy_class("clockwork")(profiles, gpus, cfg)


def _baseline(name: str) -> Callable[..., Policy]:
    def build(profiles, gpus, cfg, settings=None) -> Policy:
        return policy_class(name)(profiles, gpus, cfg, settings)
    return build


POLICIES: dict[str, Callable[..., Policy]] = {
    "clockwork": _clockwork,
    "clipper": _baseline("clipper"),
    "tfserving": _baseline("tfserving"),
    "infaas": _baseline("infaas"),
}


@cache
def policy_config(name: str) -> type | None:
    """The schema of a policy's own ``[scheduler]`` settings, beside ``SchedulerConfig``'s
    (None: the policy has none)."""
    if name == "clipper":
        from controller.baselines.clipper import ClipperConfig
        return ClipperConfig
    if name == "tfserving":
        from controller.baselines.tfserving import TfServingConfig
        return TfServingConfig
    if name == "infaas":
        from controller.baselines.infaas import InfaasConfig
        return InfaasConfig
    return None


def __getattr__(name: str) -> object:
    # POLICY_SETTINGS: policy -> the [scheduler] keys of its own schema (from the schemas)
    if name == "POLICY_SETTINGS":
        return {p: tuple(table_keys(c)) for p in POLICIES if (c := policy_config(p))}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_policy(name: str) -> None:
    if name not in POLICIES:
        close = difflib.get_close_matches(str(name), list(POLICIES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingsError(f"unknown scheduler policy {name!r}{hint}; known: "
                            f"{', '.join(sorted(POLICIES))}")


def split_settings(name: str, table: Mapping[str, object]) -> tuple[dict, dict]:
    """Split a ``[scheduler]`` table (without ``policy``) into SchedulerConfig keys and
    the named policy's own settings, after checking the whole table against both
    schemas: an unknown key or a bad value raises ``SettingsError`` (a ``ValueError``)
    with one line, e.g. ``unknown scheduler setting 'max_batc' (did you mean
    'max_batch'?)`` or ``max_batch: must be an integer >= 1, got 'abc'``."""
    _check_policy(name)
    own_cls = policy_config(name)
    own = set(table_keys(own_cls)) if own_cls else set()
    shared = set(table_keys(SchedulerConfig))
    common: dict = {}
    extra: dict = {}
    for k, v in table.items():
        if k in own:
            extra[k] = v
        elif k in shared:
            common[k] = v
        else:
            others = [p for p in sorted(POLICIES)
                      if (c := policy_config(p)) is not None and k in table_keys(c)]
            if others:
                raise SettingsError(f"unknown scheduler setting {k!r} for policy {name!r} "
                                    f"(it is a setting of {', '.join(others)})")
            # (policy is split off before: it is known, and the likeliest key misspelt)
            raise SettingsError(unknown_key_line((k,), sorted(shared | own | {"policy"}),
                                                 "scheduler"))
    SchedulerConfig.from_ms(**common)
    if own_cls is not None:
        from_table(own_cls, extra)
    return common, extra


def table_policy(table: Mapping[str, object]) -> tuple[str, dict]:
    """A scenario's ``[scheduler]`` table as (its policy's name, "clockwork" when not
    given; the rest, the settings ``split_settings`` and ``unused_settings`` read)."""
    rest = dict(table)
    return str(rest.pop("policy", "clockwork")), rest


# the SchedulerConfig keys a baseline policy reads: the default SLO, the largest batch,
# and the liveness probes and the wait with no worker that every controller loop runs;
# the others are the clockwork policy's own
BASELINE_SHARED = frozenset({"default_slo_ms", "max_batch", "liveness", "probe_slack_ms",
                             "probe_slack_frac", "probe_timeout_ms", "probe_idle_ms",
                             "no_worker_wait_ms"})


def unused_settings(name: str, table: Mapping[str, object]) -> list[str]:
    """The keys of a ``[scheduler]`` table (without ``policy``) that policy ``name`` takes
    but does not use: the clockwork policy's own settings given to a baseline (a table
    kept while the policy is switched: accepted, so a sweep may vary the policy; a
    shell says them, as they change nothing)."""
    if name == "clockwork":
        return []
    shared = set(table_keys(SchedulerConfig))
    out = []
    for k in table:
        ms_key = k[:-3] + "_ms" if k.endswith("_us") else k
        if ms_key in shared and ms_key not in BASELINE_SHARED:
            out.append(k)
    return out


def unused_line(name: str, table: Mapping[str, object]) -> str | None:
    """``unused_settings`` in one line for a shell's warning, or None."""
    unused = unused_settings(name, table)
    if not unused:
        return None
    return (f"warning: [scheduler] {', '.join(unused)} not used by policy {name!r} (the "
            f"clockwork policy's settings; it uses {', '.join(sorted(BASELINE_SHARED))} "
            "and its own)")


def make_policy(name: str, profiles: Sequence[ModelProfile], gpus: Sequence[GpuSpec],
                cfg: SchedulerConfig | None = None,
                settings: Mapping[str, object] | None = None) -> Policy:
    """Build a policy. ``settings``: the policy's own ``[scheduler]`` keys (see
    ``policy_config`` / ``split_settings``)."""
    _check_policy(name)
    return POLICIES[name](profiles, gpus, cfg or SchedulerConfig(), settings)
