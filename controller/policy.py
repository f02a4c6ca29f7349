"""The interface every scheduling policy implements (Clockwork's and the baselines).

A policy is a pure core: it takes events and the current time and returns the
actions to send. It never reads a clock, sleeps or does I/O. Times are int
nanoseconds on the caller's clock (the one ``now`` is read from).

The event methods (``on_request``, ``on_result``, ``on_tick``, ``set_gpu_available``,
``readmit_gpu``, ``add_model``, ``remove_model``) change the policy; ``next_wakeup`` and ``drain_replies`` are how the shell learns what
to do next. The read-only methods (``queued``, ``model_view``, ``pages_used``,
``stats``, ``held_copies``) are for status calls, metrics and experiments: they change nothing, so a
shell may call them at any time between events, as often as it likes. Shells use only
this interface; they never read a policy's own attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from dataclasses import dataclass

from clockwork.actions import Action, Result
from clockwork.profiles import ModelProfile
from clockwork.requests import Reply, Request

# The message of a request answered INVALID_REQUEST because its model was removed
# (``Policy.remove_model``) while it waited, or arrived after (front ends tag such
# answers ``unknown_model``: the model is no longer served).
MODEL_UNLOADED = "model unloaded"
# The message of a request answered ERROR because its caller went away (a cancelled call, a
# closed connection) while it waited in a queue (``Policy.cancel``): nobody reads it; the
# front ends count it with the reason ``cancelled``.
CANCELLED = "cancelled: the client's call ended before the request ran"
# messages of ERROR answers a policy gives for "not here, not now" (front ends answer them
# as unavailable, 503): a model too large for every GPU; a baseline's full batching queue
NO_GPU_FITS = "model does not fit on any GPU"
# every GPU removed for good (their workers taken out of the cluster): what was queued,
# or comes back from their failed actions, is answered as the shell answers a request
# that comes while no worker is left (reason ``no_worker``)
NO_GPU_LEFT = ("no worker is available to serve the model (every worker was removed); try "
               "again once a worker is added")
QUEUE_FULL = "batching queue is full"


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
    removing: bool = False  # removed (``Policy.remove_model``); copies not all evicted yet


class Policy(ABC):
    @abstractmethod
    def on_request(self, request: Request, now: int) -> list[Action]:
        """A client request arrived."""

    def on_requests(self, requests: list[Request], now: int) -> list[Action]:
        """Several requests that arrived at one instant (a message of several, a KServe
        request of several rows): by default each as it came. A policy may queue them
        all before it schedules, so that they can share a batch."""
        out: list[Action] = []
        for r in requests:
            out.extend(self.on_request(r, now))
        return out

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

    def remove_gpu(self, gpu_index: int, now: int) -> list[Action]:
        """The GPU leaves for good (its worker was removed): as lost
        (``set_gpu_available(gpu_index, False, now)``), and it never comes back, so it no
        longer counts when the policy asks whether a model fits on any GPU. A policy that
        does not override this treats it as lost."""
        return self.set_gpu_available(gpu_index, False, now)

    def readmit_gpu(self, gpu_index: int, now: int, kept: Container[str]) -> list[Action]:
        """A lost GPU is back, and its worker kept the weights named in ``kept`` of those
        it was asked to keep (``held_copies(gpu_index)``, at their versions; the worker
        says which it had): those copies are ready at once, with no LOAD; anything else
        is as after ``set_gpu_available(gpu_index, True, now)``. A policy that does not
        override this gets an empty GPU."""
        return self.set_gpu_available(gpu_index, True, now)

    #: whether its actions carry windows a worker enforces (``latest`` before NEVER): such
    #: a policy cannot serve over a link slower than its windows allow (``reach_note``)
    timed_windows = False

    #: whether ``adopt_copies`` takes over weights a worker already holds (a policy that
    #: leaves this False starts with empty caches: the controller has them emptied)
    adopts_weights = False

    #: whether a model's copies stay where they were placed (until evicted) rather than
    #: follow demand: a GPU that joins (``add_gpu``) serves only the models placed after
    #: it joined (the simulator warns a scenario that adds workers)
    places_once = False

    def adopt_copies(self, gpu_index: int, now: int,
                     copies: Sequence[tuple[str, int]]) -> list[Action]:
        """At start, before any request: the GPU's worker still holds these weights,
        each (model, version), fully loaded, from an earlier controller. A policy with
        ``adopts_weights`` makes them its copies, ready at once, exactly as if it had
        loaded them itself (its later LOADs of the model carry higher versions). Only
        called on a policy with ``adopts_weights``."""
        raise NotImplementedError(f"policy {type(self).__name__} does not adopt weights")

    def add_gpu(self, spec: GpuSpec, now: int) -> list[Action]:
        """A GPU joins at run time (its worker was added to the cluster): it gets the next
        index (the number of GPUs so far), an empty weights cache, and is available at
        once. The policy places copies on it by its usual rules (queued requests of
        models without a copy may get one there at once: the actions returned). A policy
        that cannot grow raises ``NotImplementedError``."""
        raise NotImplementedError(f"policy {type(self).__name__} cannot add GPUs at run time")

    def add_model(self, name: str, profile: ModelProfile, now: int) -> list[Action]:
        """A model instance joins at run time, served under ``name`` with ``profile``'s
        figures (the profile's own ``model`` name does not matter). It is schedulable at
        once: a request for it is accepted from the next ``on_request`` on and its weights
        are loaded on demand by the policy's usual rules, exactly as for a model the
        policy was built with. Nothing else changes: no action is sent for it before a
        request arrives, and no other model's queue, copy or estimate is touched.

        Raises ``ValueError`` if ``name`` is known: served, or removed with copies still
        to evict (``model_view(name)`` is not None); the caller waits until it is None.
        A policy that cannot add models raises ``NotImplementedError``."""
        raise NotImplementedError(f"policy {type(self).__name__} cannot add models at run time")

    def remove_model(self, name: str, now: int) -> list[Action]:
        """Stop serving ``name``, freeing its GPU memory:

        * from this call on, a request for it is answered at once ``INVALID_REQUEST``, as
          for a model never served (never queued);
        * every request of it waiting in a queue is answered now, ``INVALID_REQUEST`` with
          message ``MODEL_UNLOADED`` (it is in the next ``drain_replies``);
        * INFERs already sent run to the end and their requests are answered as usual
          (a failed one is not retried: its requests are answered like the queued ones);
        * each copy is EVICTed as soon as nothing runs or loads on it -- in the returned
          actions for copies idle now, else when its last INFER or its LOAD reports --
          and its pages count as free from then (``pages_used``);
        * while copies remain, ``model_view(name)`` has ``removing`` True; once the last
          copy is gone the policy forgets the name (``model_view`` None) and
          ``add_model`` may use it again.

        Other models are not touched, except that the freed pages may now take a LOAD
        they were waiting for. Raises ``KeyError`` for a name not served (never added,
        or removed already). A policy that cannot remove models raises
        ``NotImplementedError``."""
        raise NotImplementedError(f"policy {type(self).__name__} cannot remove models at run time")

    def cancel(self, requests: list[Request], now: int) -> list[Action]:
        """The callers of ``requests`` went away (cancelled calls, closed connections):
        each one still waiting in a queue leaves it and is answered now, ``ERROR`` with
        message ``CANCELLED`` (in the next ``drain_replies``), so that it takes no GPU
        time and no place in the queue from the requests whose callers wait. One in an
        INFER already sent runs on and is answered as usual, or, if that INFER fails, so
        too instead of being tried again; one answered already is left alone (a request
        is answered once). Every shipped policy does so; one that does not override this
        keeps them: they run, or time out, as if their callers still waited."""
        return []

    def answer_queued(self, now: int, why: str) -> list[Action]:
        """No GPU has been available for a while (every worker lost or suspect for the
        loop's ``no_worker_wait``): every request waiting in a queue is answered now,
        ``ERROR`` with message ``why`` (in the next ``drain_replies``), as one arriving
        then is. Every shipped policy does so; one that does not override this keeps
        them until a GPU is back, or their SLO ends."""
        return []

    def arrived_earlier(self, requests: list[Request], by: int, now: int) -> list[Action]:
        """``requests`` were sent ``by`` ns earlier than they were admitted as (a client's
        clock, read on later messages of its stream, says so): each one still waiting in a
        queue counts from then -- its ``arrival``, ``deadline`` and ``drop_at`` move ``by``
        earlier -- and is answered ``TIMEOUT`` (in a later ``drain_replies``) once it can no
        longer finish within its SLO, as if it had been admitted so. Others are left
        alone. A policy that does not override this keeps them as they were admitted."""
        return []

    # ------------------------------------------------------------------ read-only views

    def held_copies(self, gpu_index: int) -> list[tuple[str, int]]:
        """The copies, each (model, version), a lost GPU's worker is asked to keep when it
        is reset or reconnected (if it is the same process, it still has them): what
        ``readmit_gpu`` can take back. Read-only; a policy that does not override this
        keeps nothing."""
        return []

    @abstractmethod
    def queued(self) -> int:
        """Requests waiting now, over all models: accepted by ``on_request`` (or returned
        to a queue after a failed INFER), not yet answered, and not part of an INFER in
        flight. Read-only."""

    @abstractmethod
    def model_view(self, model: str) -> ModelView | None:
        """A snapshot of one model instance (``ModelView``); None for a name the policy
        does not know (never served, or removed and all its copies evicted). Read-only."""

    @abstractmethod
    def pages_used(self, gpu_index: int) -> int:
        """Pages of GPU ``gpu_index``'s weights cache taken in the policy's view (copies
        loaded or loading, pages promised to a LOAD already sent). Read-only."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """The policy's counters since it was built, a fresh dict: ``infer``, ``load``,
        ``evict`` (actions of each type sent) and ``rejected`` (results with an error
        status, of any type). Counts only; read-only."""
