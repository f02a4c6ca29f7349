"""Composition roots: the only part of ``clockwork`` that puts the controller and the
workers together — the ``clockwork`` command (``cli``), the simulator (``sim``: the
production scheduler and worker semantics on a virtual clock), the local live cluster
(``serve``), workload replay against a live controller (``replay``), and the model and
settings-documentation commands.

Everything else in ``clockwork/`` is the vocabulary both sides speak and the client; it
imports nothing from ``controller/`` or ``worker/``.
"""
