"""Bounds on the sizes a run is given: beyond them a value is a mistake (a typo, a
stand-in for "many"), and building the run would exhaust memory before it starts. The
largest shipped set-ups are far below them (the paper's 150 workers, 3,601 copies of a
model). Each holds per key (the scenario's schema, the command line) and, where keys
multiply, in all, each product within a few GiB of memory (measured: ~60 KiB a GPU,
~3.5 KiB an instance, ~1 KiB an outstanding request).

Standard library only; nothing else of the project is imported here."""

MAX_WORKERS = 10_000
MAX_GPUS_PER_WORKER = 64
MAX_COPIES = 100_000  # per [[models]] entry
MAX_CONCURRENCY = 100_000  # outstanding requests per instance of a closed loop
MAX_GPUS = 65_536  # workers x gpus_per_worker
MAX_INSTANCES = 1_000_000  # the copies of every [[models]] entry together
MAX_OUTSTANDING = 1_000_000  # a closed loop's concurrency x the instances it selects
