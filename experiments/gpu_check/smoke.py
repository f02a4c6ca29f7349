"""The cuda device in one breath: probe, build one package's kernels, LOAD, INFER,
telemetry. Run by check.sh before anything longer.

    python experiments/gpu_check/smoke.py PACKAGE_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from worker.devices.cuda import CudaDevice, _kernel_compiler, probe  # noqa: E402

package = Path(sys.argv[1])
probe()
print("probe: ok; kernels built with", _kernel_compiler())
dev = CudaDevice(4)
t = time.perf_counter()
meta = dev.register("m", package)
print(f"register (kernels built or read from the cache): {time.perf_counter() - t:.2f} s")
pages, load_ns = dev.load("m")
spec = meta["inputs"][0]
y, exec_ns = dev.infer("m", np.ones((1, *spec["shape"]), spec["dtype"]))
print(f"LOAD {load_ns / 1e6:.3f} ms into pages {pages}; INFER {exec_ns / 1e6:.3f} ms, "
      f"output {y.shape}")
print("telemetry:", dev.telemetry())
