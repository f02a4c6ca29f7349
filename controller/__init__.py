"""The controller: scheduling policies (pure cores) and, later, the service shell."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from clockwork.profiles import ModelProfile
from controller.config import SchedulerConfig
from controller.policy import GpuSpec, Policy


def _clockwork(profiles, gpus, cfg, settings=None) -> Policy:
    from controller.scheduler import ClockworkScheduler

    if settings:
        raise ValueError(f"unknown scheduler setting(s) {', '.join(sorted(settings))}")
    return ClockworkScheduler(profiles, gpus, cfg)


def _clipper(profiles, gpus, cfg, settings=None) -> Policy:
    from controller.baselines.clipper import ClipperPolicy

    return ClipperPolicy(profiles, gpus, cfg, settings)


def _tfserving(profiles, gpus, cfg, settings=None) -> Policy:
    from controller.baselines.tfserving import TfServingPolicy

    return TfServingPolicy(profiles, gpus, cfg, settings)


def _infaas(profiles, gpus, cfg, settings=None) -> Policy:
    from controller.baselines.infaas import InfaasPolicy

    return InfaasPolicy(profiles, gpus, cfg, settings)


POLICIES: dict[str, Callable[..., Policy]] = {
    "clockwork": _clockwork,
    "clipper": _clipper,
    "tfserving": _tfserving,
    "infaas": _infaas,
}

# [scheduler] keys that belong to one baseline, not to SchedulerConfig
POLICY_SETTINGS: dict[str, tuple[str, ...]] = {
    "clipper": ("batch_wait_ms", "aimd_step", "aimd_backoff", "initial_batch", "drop_expired",
                "replicas"),
    "tfserving": ("max_batch_size", "batch_timeout_us", "batch_timeout_ms",
                  "max_enqueued_batches", "inflight_per_gpu"),
    "infaas": ("monitor_interval_ms", "batch_slo_fraction", "scale_up_util", "scale_down_util",
               "scale_down_intervals", "inflight_per_gpu"),
}


def split_settings(name: str, table: Mapping[str, object]) -> tuple[dict, dict]:
    """Split a ``[scheduler]`` table (without ``policy``) into SchedulerConfig keys and
    the named policy's own settings."""
    own = set(POLICY_SETTINGS.get(name, ()))
    common = {k: v for k, v in table.items() if k not in own}
    extra = {k: v for k, v in table.items() if k in own}
    return common, extra


def make_policy(name: str, profiles: Sequence[ModelProfile], gpus: Sequence[GpuSpec],
                cfg: SchedulerConfig | None = None,
                settings: Mapping[str, object] | None = None) -> Policy:
    """Build a policy. ``settings``: the policy's own ``[scheduler]`` keys (see
    ``POLICY_SETTINGS`` / ``split_settings``)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduler policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(profiles, gpus, cfg or SchedulerConfig(), settings)
