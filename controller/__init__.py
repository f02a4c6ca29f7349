"""The controller: scheduling policies (pure cores) and, later, the service shell."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clockwork.profiles import ModelProfile
from controller.config import SchedulerConfig
from controller.policy import GpuSpec, Policy


def _clockwork(profiles, gpus, cfg) -> Policy:
    from controller.scheduler import ClockworkScheduler

    return ClockworkScheduler(profiles, gpus, cfg)


POLICIES: dict[str, Callable[[Sequence[ModelProfile], Sequence[GpuSpec], SchedulerConfig], Policy]] = {
    "clockwork": _clockwork,
}


def make_policy(name: str, profiles: Sequence[ModelProfile], gpus: Sequence[GpuSpec],
                cfg: SchedulerConfig | None = None) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduler policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(profiles, gpus, cfg or SchedulerConfig())
