"""Regenerate ``clockwork_pb2.py`` / ``clockwork_pb2_grpc.py`` from ``clockwork.proto`` and
``kserve_pb2.py`` / ``kserve_pb2_grpc.py`` from ``kserve.proto`` (KServe v2 / OIP).

    pip install -e '.[dev]'          # grpcio-tools
    python -m clockwork.protocol.generate

The generated modules are committed, so a plain install needs only grpcio and protobuf.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc

    here = Path(__file__).resolve().parent
    root = here.parent.parent
    for name in ("clockwork.proto", "kserve.proto"):
        rc = protoc.main(["grpc_tools.protoc", f"-I{root}", f"--python_out={root}",
                          f"--grpc_python_out={root}", str(here / name)])
        if rc:
            return int(rc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
