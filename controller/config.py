"""Scheduler settings (Clockwork INFER5's defaults), int ns inside.

``SchedulerConfig`` is the schema of the clockwork policy's ``[scheduler]`` table (and of
``clockwork controller --set``): each field's description documents the setting, and a
time setting ``x`` is written ``x_ms`` in milliseconds (``SchedulerConfig.from_ms``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from clockwork.settings import CONFIG, Settings, from_table, setting
from clockwork.time import ms


class SchedulerConfig(Settings):
    """Frozen and hashable; attributes are plain values (read in the scheduler's hot
    path). Construct with int ns (``SchedulerConfig(default_slo=ms(50))``) or from a
    table in milliseconds (``SchedulerConfig.from_ms(default_slo_ms=50)``)."""

    model_config = ConfigDict(**CONFIG, frozen=True)
    settings_name: ClassVar[str] = "scheduler"

    schedule_ahead: int = setting(
        ms(10), "Keep each GPU's schedule filled this far into the future: INFERs and "
        "LOADs are sent to a worker at most this long before they are due to start.",
        units=("ms",), ge=0)
    default_slo: int = setting(
        ms(100), "SLO of a request that does not carry one.", units=("ms",), gt=0)
    max_batch: int = setting(
        16, "Largest batch size used (a model's compiled batch sizes above it are not).",
        ge=1)
    max_exec: int = setting(
        ms(25), "Batch sizes > 1 whose estimated EXEC exceeds this are not used.",
        units=("ms",), ge=0)
    buffer: int = setting(
        ms(5), "Network and output allowance taken off each request's SLO when deciding "
        "whether it can still be met (at most a tenth of the SLO).", units=("ms",), ge=0)
    latest_delta: int = setting(
        ms(10), "An action may start this late (after its expected start) before the "
        "worker rejects it.", units=("ms",), ge=0)
    future: int = setting(
        ms(1), "An idle GPU is predicted to start a new action this long after now (the "
        "time for the action to reach the worker).", units=("ms",), ge=0)
    lag: int = setting(
        ms(10), "Outstanding work this far past its predicted end is assumed done.",
        units=("ms",), ge=0)
    max_load_slo: int = setting(
        ms(25), "Cap on the time a cold request allows for LOAD demand.", units=("ms",), ge=0)
    estimate_window: int = setting(
        10, "Measurements per estimate: each LOAD and EXEC (per batch size) estimate is a "
        "percentile of this many latest measurements.", ge=1)
    estimate_percentile: float = setting(
        0.99, "The percentile of the window used as the estimate.", gt=0, le=1)
    batch_first: bool = setting(
        True, "Run a larger batch first when the most urgent request can wait for it.")
    load_check_interval: int = setting(
        ms(2), "How often unmet LOAD demand is re-examined.", units=("ms",), ge=0)

    @classmethod
    def from_ms(cls, **kw: Any) -> SchedulerConfig:
        """Build from a scenario's ``[scheduler]`` table (``*_ms`` keys in milliseconds);
        a bad key or value raises ``SettingsError`` (a ``ValueError``) with one line."""
        return from_table(cls, kw)
