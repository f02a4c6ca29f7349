"""A controller binds every port it listens on before it contacts a worker: one whose
port is taken exits 2 naming it and leaves the workers to the controller that has
them."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import local_cluster

MODEL = "resnet50_v2"


@pytest.mark.parametrize("flag", ["--http-port", "--port", "--kserve-port"])
def test_a_controller_whose_port_is_taken_leaves_the_workers_alone(flag):
    """A second controller on the first's worker, one of its ports the first's: it
    exits 2 naming the port before it says Hello to the worker (with --http-port taken
    it took the worker over first, evicting the first controller's session, printed
    'listening', and only then exited)."""
    import clockwork

    with local_cluster(workers=1, gpus=1, models=MODEL, kserve_port=0) as c:
        taken = {"--http-port": c.printed_address("http"),
                 "--kserve-port": c.printed_address("kserve grpc"),
                 "--port": c.address}[flag].rpartition(":")[2]
        argv = list(c._controller_argv)
        for f, v in (("--port", "0"), ("--http-port", "0"), ("--kserve-port", "0")):
            argv[argv.index(f) + 1] = v
        argv[argv.index(flag) + 1] = taken
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           env={**os.environ, **{k: v for k, v in c._env.items() if v}})
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert f"cannot listen on 127.0.0.1:{taken} ({flag})" in p.stderr, p.stderr
        assert "listening" not in p.stdout, p.stdout
        with clockwork.Client(c.address, timeout=20) as cl:
            assert cl.infer(MODEL, slo_ms=2000).status == 0
            st = cl.stats()
        assert st.get("worker_losses", 0) == 0 and st["worker_connects"] == 1, st
