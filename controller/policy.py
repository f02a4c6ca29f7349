"""The interface every scheduling policy implements (Clockwork's and the baselines).

A policy is a pure core: it takes events and the current time and returns the
actions to send. It never reads a clock, sleeps or does I/O. Times are int
nanoseconds on the caller's clock (the one ``now`` is read from).

The event methods (``on_request``, ``on_result``, ``on_tick``, ``set_gpu_available``)
change the policy; ``next_wakeup`` and ``drain_replies`` are how the shell learns what
to do next. The read-only methods (``queued``, ``model_view``, ``pages_used``,
``stats``) are for status calls, metrics and experiments: they change nothing, so a
shell may call them at any time between events, as often as it likes. Shells use only
this interface; they never read a policy's own attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from clockwork.actions import Action, Result
from clockwork.requests import Reply, Request


@dataclass(frozen=True)
class GpuSpec:
    """One GPU the controller may use."""

    worker: int
    gpu: int
    pages: int


@dataclass(frozen=True, slots=True)
class ModelView:
    """What a policy believes about one model at the moment of the call (a snapshot;
    it does not follow later events).

    GPUs are the policy's indices: the position of the GPU in the ``GpuSpec`` list the
    policy was built with (the controller-wide GPU index)."""

    loaded_on: tuple[int, ...]  # GPUs holding a copy of its weights or loading one, ascending
    loading_on: tuple[int, ...]  # those of ``loaded_on`` whose LOAD is not yet reported done
    queued: int  # its requests waiting: accepted, not answered, not part of an INFER in flight


class Policy(ABC):
    @abstractmethod
    def on_request(self, request: Request, now: int) -> list[Action]:
        """A client request arrived."""

    @abstractmethod
    def on_result(self, result: Result, now: int) -> list[Action]:
        """A worker reported an action's result."""

    @abstractmethod
    def on_tick(self, now: int) -> list[Action]:
        """Time passed (called at or after ``next_wakeup()``)."""

    @abstractmethod
    def next_wakeup(self) -> int | None:
        """When the policy wants ``on_tick`` again; None if only events matter."""

    @abstractmethod
    def drain_replies(self) -> list[Reply]:
        """Answers produced since the last call, each request exactly once."""

    def set_gpu_available(self, gpu_index: int, available: bool, now: int) -> list[Action]:
        """The shell lost a GPU's worker (False) or got it back with an empty weights
        cache (True). A policy that does not override this learns of a lost GPU only
        from the failed results of the actions sent to it."""
        return []

    # ------------------------------------------------------------------ read-only views

    @abstractmethod
    def queued(self) -> int:
        """Requests waiting now, over all models: accepted by ``on_request`` (or returned
        to a queue after a failed INFER), not yet answered, and not part of an INFER in
        flight. Read-only."""

    @abstractmethod
    def model_view(self, model: str) -> ModelView | None:
        """A snapshot of one model instance (``ModelView``); None for a name the policy
        was not built with. Read-only."""

    @abstractmethod
    def pages_used(self, gpu_index: int) -> int:
        """Pages of GPU ``gpu_index``'s weights cache taken in the policy's view (copies
        loaded or loading, pages promised to a LOAD already sent). Read-only."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """The policy's counters since it was built, a fresh dict: ``infer``, ``load``,
        ``evict`` (actions of each type sent) and ``rejected`` (results with an error
        status, of any type). Counts only; read-only."""
