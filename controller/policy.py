"""The interface every scheduling policy implements (Clockwork's and the baselines).

A policy is a pure core: it takes events and the current time and returns the
actions to send. It never reads a clock, sleeps or does I/O.
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
