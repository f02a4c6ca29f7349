"""Scheduler settings (Clockwork INFER5's defaults), int ns inside."""

from __future__ import annotations

from dataclasses import dataclass, fields

from clockwork.time import ms


@dataclass(frozen=True)
class SchedulerConfig:
    schedule_ahead: int = ms(10)  # keep each GPU busy this far into the future
    default_slo: int = ms(100)
    max_batch: int = 16
    max_exec: int = ms(25)  # batch sizes > 1 whose estimate exceeds this are not used
    buffer: int = ms(5)  # network/output allowance taken off the SLO (at most SLO/10)
    latest_delta: int = ms(10)  # an action may start this late before the worker rejects it
    future: int = ms(1)  # an idle GPU is predicted to start this long after "now"
    lag: int = ms(10)  # outstanding work this overdue is assumed done
    max_load_slo: int = ms(25)  # cap on the time a cold request allows for LOAD demand
    estimate_window: int = 10
    estimate_percentile: float = 0.99
    batch_first: bool = True  # run a larger batch first when the most urgent can wait
    load_check_interval: int = ms(2)  # how often unmet demand is re-examined for LOADs

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and v < 0:
                raise ValueError(f"scheduler setting {f.name} must be >= 0, got {v}")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not 0 < self.estimate_percentile <= 1:
            raise ValueError("estimate_percentile must be in (0, 1]")

    @classmethod
    def from_ms(cls, **kw: float) -> SchedulerConfig:
        """Build from a scenario's ``[scheduler]`` table (``*_ms`` keys in milliseconds)."""
        out: dict = {}
        names = {f.name for f in fields(cls)}
        for k, v in kw.items():
            if k.endswith("_ms") and k[:-3] in names:
                out[k[:-3]] = ms(float(v))
            elif k in names:
                out[k] = v
            else:
                raise ValueError(f"unknown scheduler setting {k!r}")
        return cls(**out)
