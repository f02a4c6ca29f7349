"""Scheduler settings (Clockwork INFER5's defaults), int ns inside.

``SchedulerConfig`` is the schema of the clockwork policy's ``[scheduler]`` table (and of
``clockwork controller --set``): each field's description documents the setting, and a
time setting ``x`` is written ``x_ms`` in milliseconds (``SchedulerConfig.from_ms``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import model_validator
from pydantic.dataclasses import dataclass

from clockwork.settings import CONFIG, from_table, setting
from clockwork.time import MAX_SLO_NS, ms


@dataclass(frozen=True, slots=True, config=CONFIG)
class SchedulerConfig:
    """A frozen, hashable pydantic dataclass with slots: its attributes are read in the
    scheduler's hot path, and a slotted dataclass's are read as fast as a plain one's. Construct with int ns
    (``SchedulerConfig(default_slo=ms(50))``) or from a table in milliseconds
    (``SchedulerConfig.from_ms(default_slo_ms=50)``)."""

    settings_name: ClassVar[str] = "scheduler"

    schedule_ahead: int = setting(
        ms(10), "Keep each GPU's EXEC lane planned this far into the future, no further; "
        "more than `future_ms` (an idle GPU's work is planned to start that far ahead).",
        units=("ms",), ge=0, allowed_text="> future_ms (at most a year)")
    default_slo: int = setting(
        ms(100), "SLO of a request that gives none (or 0).", units=("ms",), gt=0,
        le=MAX_SLO_NS)
    max_batch: int = setting(
        16, "Largest batch size used (of the profile's compiled sizes).",
        ge=1)
    max_exec: int = setting(
        ms(25), "Batch sizes above 1 whose EXEC estimate exceeds this are not used.",
        units=("ms",), ge=0)
    buffer: int = setting(
        ms(5), "Network and output allowance taken off a request's SLO (at most a tenth "
        "of the SLO).", units=("ms",), ge=0)
    latest_delta: int = setting(
        ms(10), "How late after its predicted start an action may still start before the "
        "worker rejects it. With `future_ms` it must cover the network delay to the "
        "workers: an action that takes longer to arrive is refused (the controller and "
        "the simulator warn).", units=("ms",), ge=0)
    future: int = setting(
        ms(1), "An idle GPU is predicted to start new work this long after now.",
        units=("ms",), ge=0)
    lag: int = setting(
        ms(10), "Outstanding work this overdue is assumed done when predicting a lane.",
        units=("ms",), ge=0)
    max_load_slo: int = setting(
        ms(25), "Cap on the window a cold request allows for LOAD demand.", units=("ms",), ge=0)
    estimate_window: int = setting(
        10, "Measurements kept per estimate (a model's LOAD, its EXEC per batch size).",
        ge=1, le=10_000)
    estimate_percentile: float = setting(
        0.99, "The estimate is this percentile of the window.", gt=0, le=1)
    estimate_stale: int = setting(
        ms(1000), "A request that only an inflated EXEC estimate makes infeasible, when no "
        "EXEC of its model was measured for this long, resets the model's estimates to "
        "the profile (a straggler's figure would otherwise keep every request out); and "
        "a batch size whose estimate is inflated and not measured for this long is set "
        "to its window's median as the model's other sizes are measured (a straggler's "
        "figure would otherwise keep that size from ever running again).",
        units=("ms",), ge=0)
    batch_first: bool = setting(
        True, "Run a larger batch first when the most urgent request can wait for it "
        "(between the models whose copies share a GPU).")
    load_check_interval: int = setting(
        ms(2), "How often unmet LOAD demand is re-examined.", units=("ms",), ge=ms(0.1))
    probe_slack: int = setting(
        ms(10), "Liveness: an action still unanswered this long after its predicted end "
        "(or `probe_slack_frac` of its duration, if longer) makes the controller probe its "
        "worker.", units=("ms",), ge=0)
    probe_slack_frac: float = setting(
        0.5, "Liveness: see `probe_slack_ms`.", ge=0, le=1000)
    probe_timeout: int = setting(
        ms(50), "Liveness: a worker that does not answer a probe within this is suspect: "
        "its in-flight requests are re-planned elsewhere until it answers again. A probe "
        "lost on a network that drops packets waits for TCP to resend it (often 200 ms or "
        "more on Linux): there, set this above that (e.g. 500).",
        units=("ms",), gt=0)
    liveness: bool = setting(
        True, "Probe workers whose actions are overdue and stop using those that do not "
        "answer (a hung worker); off: only a closed connection takes a worker out.")
    probe_idle: int = setting(
        ms(500), "Liveness: this often, a worker with nothing in flight that was not heard "
        "from for as long is probed, so that one hung while idle is found before requests "
        "are placed on it (0: only workers with overdue actions are probed).",
        units=("ms",), ge=0)
    no_worker_wait: int = setting(
        ms(2000), "When every worker is lost or suspect (none takes work), a request that "
        "arrives is answered at once `ERROR` `no_worker` (503); one already queued waits "
        "this long for a worker to come back (a restarted one takes a second or two), "
        "then it is answered so too, rather than held until its SLO ends (up to a day) "
        "or, with a baseline policy, for ever (0: it waits for its SLO).",
        units=("ms",), ge=0)

    @model_validator(mode="after")
    def _plans_past_an_idle_start(self) -> SchedulerConfig:
        # an idle GPU's lane is predicted free `future` from now: a plan no longer than
        # that would never send an INFER (each wake moving on by a nanosecond)
        if self.schedule_ahead <= self.future:
            raise ValueError(f"schedule_ahead_ms ({self.schedule_ahead / 1e6:g}) must be "
                             f"more than future_ms ({self.future / 1e6:g})")
        return self

    @classmethod
    def from_ms(cls, **kw: Any) -> SchedulerConfig:
        """Build from a scenario's ``[scheduler]`` table (``*_ms`` keys in milliseconds);
        a bad key or value raises ``SettingsError`` (a ``ValueError``) with one line."""
        return from_table(cls, kw)


def reach_note(cfg: SchedulerConfig, one_way_ns: int) -> str:
    """What a policy with windows (``Policy.timed_windows``) cannot do when its actions
    take ``one_way_ns`` to reach a worker: an action may start at most ``future`` +
    ``latest_delta`` after it is sent (an idle GPU's), so one that arrives later is
    refused ``*_TOO_LATE``, every one of them, and no request is served. "" when it
    reaches in time."""
    reach = cfg.future + cfg.latest_delta
    if one_way_ns <= reach:
        return ""
    return (f"actions take ~{one_way_ns / 1e6:.3g} ms to reach the worker, longer than "
            f"scheduler future_ms + latest_delta_ms ({reach / 1e6:g} ms) allow: each would "
            "arrive after its window and be refused (*_TOO_LATE), and no request served; "
            f"raise latest_delta_ms above {(one_way_ns - cfg.future) / 1e6:.3g}")


def jitter_note(cfg: SchedulerConfig, one_way_ns: int, jitter_ns: int) -> str:
    """As ``reach_note`` for a link whose actions take ``one_way_ns`` plus up to
    ``jitter_ns`` more: "" when the slowest reaches in time (or none does: ``reach_note``
    says so), else what becomes of those that do not."""
    reach = cfg.future + cfg.latest_delta
    slowest = one_way_ns + jitter_ns
    if not jitter_ns or one_way_ns > reach or slowest <= reach:
        return ""
    return (f"actions take up to ~{slowest / 1e6:.3g} ms to reach the worker with "
            f"jitter_ms, longer than scheduler future_ms + latest_delta_ms "
            f"({reach / 1e6:g} ms) allow: those that take longer may arrive after their "
            "window and be refused (*_TOO_LATE); raise latest_delta_ms above "
            f"{(slowest - cfg.future) / 1e6:.3g} for none to be")


def usable_batch_sizes(batch_sizes: list[int], max_batch: int) -> list[int]:
    """The compiled batch sizes a policy runs: those up to ``max_batch``, or the smallest
    when ``max_batch`` is below every one (a batch of 1 with no function for it crashed
    the scheduler)."""
    return [b for b in batch_sizes if b <= max_batch] or [batch_sizes[0]]
