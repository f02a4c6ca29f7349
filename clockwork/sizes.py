"""Bounds on the sizes a run is given: beyond them a value is a mistake (a typo, a
stand-in for "many"), and building the run would exhaust memory before it starts. The
largest shipped set-ups are far below them (the paper's 150 workers, 3,601 copies of a
model). Each holds per key (the scenario's schema, the command line) and, where keys
multiply, in all, each product within a few GiB of memory (measured: ~60 KiB a GPU,
~3.5 KiB an instance, ~1 KiB an outstanding request). Below them, the bound on a
message between the controller and a worker.

Standard library only; nothing else of the project is imported here."""

PAGE_SIZE = 16 * 1024 * 1024  # bytes: a weights-cache page, Clockwork's
# the batch sizes a model is compiled for unless told otherwise (compile, profile, serve)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)

MAX_WORKERS = 10_000
# an emulated GPU's straggler factor and duration noise: beyond them an action would last
# longer than any run (1e300 x its profile: the run ended asking for a longer drain)
MAX_SLOW_FACTOR = 1000.0
MAX_NOISE = 10.0
MAX_GPUS_PER_WORKER = 64
INT32_MAX = 2**31 - 1  # protobuf's int32 fields, gRPC's C int options, its message bound
MAX_PAGES = INT32_MAX  # weights-cache pages per GPU (a worker reports them in an int32)
# a worker's clock offset (--clock-offset-ms): ~31 years either way keeps its clock, in
# int64 ns, far from overflowing
MAX_CLOCK_OFFSET_MS = 10**12
# a worker whose clock reads further than this from the controller's is refused (twice
# the offset a worker may be given, for hosts' clocks that differ as well)
CLOCK_OFFSET_MAX_NS = 2 * MAX_CLOCK_OFFSET_MS * 1_000_000
MAX_COPIES = 100_000  # per [[models]] entry
# instances one LoadModel call may make (a scenario or --models: MAX_COPIES)
MAX_LOAD_COPIES = 1024
MAX_CONCURRENCY = 100_000  # outstanding requests per instance of a closed loop
MAX_GPUS = 65_536  # workers x gpus_per_worker
MAX_INSTANCES = 1_000_000  # the copies of every [[models]] entry together
MAX_OUTSTANDING = 1_000_000  # a closed loop's concurrency x the instances it selects

# A run's seed (`seed`, a sweep's `seeds`, the seeds a plan runs): what a TOML integer, the
# summary's JSON and numpy's SeedSequence all hold (orjson refused 2^64 only after the
# run, as it wrote summary.json).
MAX_SEED = 2**63 - 1

# Levels of arrays and inline tables a TOML file (a scenario, a sweep file) or a --set value
# may nest: the deepest shipped file nests 4; Python's TOML parser and the checks after it
# recurse once a level, and ran out of stack (RecursionError) at ~500.
MAX_TOML_DEPTH = 100

# Simulations one `clockwork sweep` lists (scenarios x grid combinations x seeds), and seeds
# `clockwork plan --seeds` runs at each GPU count: counted before any is built (a grid of
# 10^10 points ran out of memory listing them). Checking a sweep loads every combination's
# scenario (~0.5 ms each); each point is at least a process start (~0.4 s) and a simulation.
MAX_POINTS = 100_000

# Requests a run's workloads may offer (expected; a closed loop as its clients each sending
# again every retry_ms, or think_ms if longer, as when every request fails): each costs
# ~75 bytes of rows in memory (--spill-dir keeps them in files) and ~40 us of one core, so
# 10^9 is ~70 GiB and ~11 hours; the paper-scale Azure replay offers ~2 * 10^8. A larger
# figure is a unit slip (rate_rps = 1e12 ran until killed, memory growing). Checked
# before the run: the `*_rps` keys of all [[workloads]] entries x duration_s when the
# scenario is read, and each workload's own figure (default rates, a trace's counts x
# load_factor) when it is built.
MAX_OFFERED_REQUESTS = 1_000_000_000

# Arrivals an azure replay draws for one trace minute: a minute's arrivals are drawn,
# sorted and held at once (~145 bytes each at the peak, measured: 5 * 10^7 is ~7 GiB), a
# whole minute even when the run ends inside it. The paper-scale replay draws ~6 * 10^5 a
# minute, experiments/fig11_scale.py --full ~2.1 * 10^7 in its peak minute. For gamma
# arrivals, the gaps drawn (a minute's arrivals plus 6 standard deviations) count.
MAX_MINUTE_ARRIVALS = 50_000_000

# Steps a stepped schedule (slo_exp_1's and slo_exp_2's SLO, azure_scalability's load
# factor) takes in a run: each value is kept (period_s = 1e-9 for a minute asked for
# 6 * 10^10 of them: a MemoryError). Steps after the value passes its maximum, which ends
# the run, do not count.
MAX_STEPS = 1_000_000

# On and off periods a bursty workload's schedules take in a run (expected; each instance
# its own with independent = true): on_s = off_s = 1e-9 for 2 s asked for 2 * 10^9 and
# never finished. The paper-size 6-hour run with 10 s / 20 s periods over 4,000
# independent instances takes ~6 * 10^6.
MAX_PERIODS = 100_000_000

# the largest gRPC message (and fast-link frame) between a cluster's processes and from
# its clients, by default: a request of ~64 MiB of tensors
MAX_MESSAGE_BYTES = 64 << 20
# the initial metadata of the controller's InferStream: the largest message it takes
# (its grpc_max_receive_bytes), so that a client refuses a larger request itself instead
# of sending it (gRPC would end the whole stream, every request on it failing)
STREAM_LIMIT_KEY = "clockwork-max-receive-bytes"
# ... and its default SLO in ns (what a request without one gets), so that a client gives
# up on such a request that is not answered within it (and a grace), as on one with its own
STREAM_DEFAULT_SLO_KEY = "clockwork-default-slo-ns"

# Actions in one message from the controller to a worker. A worker handles a message's
# actions in one go, its event loop busy meanwhile (~4-7 us an action: 1,024 take ~4-7 ms;
# 100,000 took ~0.4-1 s, past the controller's 50 ms liveness probe timeout); it refuses a
# larger message whole, ending that connection (worker/service.py). The controller's
# messages carry what it planned for the worker's GPUs since its last one (at most ~50
# actions measured, 64 GPUs a worker at full load: tests/test_worker_message_bounds.py);
# it splits a longer list (one that grew while a write waited) into messages of at most
# this many.
MAX_ACTIONS_PER_MESSAGE = 1024

# UTF-8 bytes of a gRPC error's message: it travels in a header (grpc-message, each byte
# outside printable ASCII percent-encoded as 3), and clients drop a call whose headers pass
# 8-16 KiB (RESOURCE_EXHAUSTED in place of the error). A message that echoes what a client
# sent (a 20,000-character input or model name) is cut to this many, inside 8 KiB even
# percent-encoded.
MAX_STATUS_DETAILS = 2000


def status_details(message: str) -> str:
    """``message`` cut to ``MAX_STATUS_DETAILS`` bytes of UTF-8 (``...`` at the cut, on a
    character's boundary)."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_DETAILS:
        return message
    return data[:MAX_STATUS_DETAILS - 3].decode("utf-8", "ignore") + "..."

# Rows one batch may have where a command line gives batch sizes (`clockwork compile` and
# `clockwork profile --batch-sizes`): the paper's models run at most 16; a batch beyond
# this is a typo, and compiling or profiling it failed deep inside TVM (an integer TVM
# cannot hold) or after allocating its input (4 Gi rows: 1 TiB).
MAX_BATCH_SIZE = 65_536
# Bytes of one row of a profile's tensor: a row must fit in a message (gRPC's messages
# stop short of 2 GiB). A shape of 2^60 elements was taken, and every request of the
# model failed "internal error" (MemoryError building its answer).
MAX_TENSOR_ROW_BYTES = INT32_MAX


# progress lines this far apart (s) when stderr is not a terminal (simulate, sweep, replay)
PROGRESS_LOG_S = 30.0
