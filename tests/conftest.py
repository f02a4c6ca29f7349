from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from clockwork.profiles import ModelProfile, TensorSpec


def make_profile(name: str = "m", exec1: int = 2_900_000, load: int = 8_000_000,
                 pages: int = 7, batches=(1, 2, 4, 8, 16)) -> ModelProfile:
    return ModelProfile(
        model=name, device="test", weights_bytes=pages * 16 * 1024 * 1024, load_ns=load,
        exec_ns={b: round(exec1 * (0.6 + 0.4 * b)) for b in batches},
        inputs=[TensorSpec("data", (3, 224, 224), "float32")],
        outputs=[TensorSpec("output", (1000,), "float32")],
    )


@pytest.fixture
def profile():
    return make_profile()


CPU_BATCHES = [1, 2, 4, 8, 16]  # the batch sizes of the shipped cpu profiles


@pytest.fixture(scope="session")
def cpu_package(tmp_path_factory):
    """``cpu_package(model, root)``: the zoo model's CPU package for ``CPU_BATCHES``, copied
    into ``root / model``. Each model is compiled once per test session (TVM takes
    seconds a model) and every test gets its own copy. Needs TVM."""
    import shutil

    pytest.importorskip("tvm")
    from clockwork.models.package import compile_model

    cache = tmp_path_factory.mktemp("cpu-package-cache")

    def get(model: str, root):
        built = cache / model
        if not (built / "model.json").exists():
            compile_model(model, CPU_BATCHES, built)
        shutil.copytree(built, root / model)
        return root / model

    return get


@contextmanager
def local_cluster(**kw):
    """A LocalCluster of real processes on loopback for the test's duration; on the way
    out every process must have stopped."""
    from clockwork.cluster.local import LocalCluster

    kw.setdefault("timeout", 30.0)
    c = LocalCluster(**kw)
    with c:
        yield c
    for ch in [c.controller, *c.workers]:
        assert ch is None or ch.proc.poll() is not None, f"{ch.name} still running"


def poll(what, deadline_s: float = 15.0, every_s: float = 0.02):
    """``what()`` until it is truthy (returned), or fail at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what.__doc__ or what}")
        time.sleep(every_s)


def wait_output(child, text: str, timeout: float = 20.0) -> str:
    """The first line of a ``clockwork.cluster.local._Child``'s output that contains
    ``text`` (waits up to ``timeout`` seconds for it)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in list(child.output):
            if text in line:
                return line
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{child.name} printed no {text!r}:\n" + "".join(child.output[-20:]))
        time.sleep(0.05)


def replay_with_no_controller(tmp_path, scenario: str) -> subprocess.CompletedProcess:
    """``clockwork replay`` of the scenario text ``scenario`` against an address where no
    controller listens (127.0.0.1:1): what it says before it connects."""
    path = tmp_path / "s.toml"
    path.write_text(scenario)
    return subprocess.run([sys.executable, "-m", "clockwork.cluster.cli", "replay", str(path),
                           "--controller", "127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60)


def cli_command(*argv: str, mem_bytes: int | None = None,
                file_bytes: int | None = None, descriptors: int | None = None) -> list[str]:
    """The command line of ``python -m clockwork.cluster.cli ARGV`` in a child that sets up
    itself what a ``preexec_fn`` would: Python's own SIGINT handler (a test process may
    ignore SIGINT, and a child inherits that), with ``mem_bytes`` a cap on its address
    space, with ``file_bytes`` one on the size of the files it writes, with
    ``descriptors`` one on its open files. A ``preexec_fn`` makes ``subprocess`` fork() where it would vfork(), and in a
    test process that has used gRPC, gRPC's fork handlers restart its poller in the
    child, which can abort it before exec (exit -6, "epoll_wait error: Bad file
    descriptor")."""
    cap = (f"resource.setrlimit(resource.RLIMIT_AS, ({mem_bytes}, {mem_bytes})); "
           if mem_bytes else "")
    if file_bytes:
        cap += f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_bytes}, {file_bytes})); "
    if descriptors:
        cap += (f"resource.setrlimit(resource.RLIMIT_NOFILE, ({descriptors}, "
                f"{descriptors})); ")
    code = ("import resource, runpy, signal; "
            "signal.signal(signal.SIGINT, signal.default_int_handler); " + cap +
            "runpy.run_module('clockwork.cluster.cli', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code, *argv]


def script_command(path, *argv: str) -> list[str]:
    """The command line of ``python PATH ARGV`` in a child that first takes Python's own
    SIGINT handler, as ``cli_command`` does: a test process may ignore SIGINT (a test
    before it in the same xdist worker ran code that does), and a child started plainly
    inherits that, so a SIGINT the test sends it is ignored (the script ran on to its end,
    exit 0)."""
    code = ("import runpy, signal, sys; "
            "signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return [sys.executable, "-c", code, str(path), *argv]


def scenario_apart_from_its_files(root, set_dir: str, trace_dir: str):
    """``root/sub/s.toml``: seed 1, 2 s, 20 copies of ResNet18 v2 and an Azure workload,
    whose profile set (a copy of ``v100-reference`` at ``root/set_dir``) and trace (the
    shipped sample at ``root/trace_dir/t.csv.gz``) it names relative to ``root``, not to
    its own folder (run from ``root``, a scenario's relative paths mean ``root``)."""
    import shutil

    from clockwork.resources import data_root, profiles_root

    shutil.copytree(profiles_root() / "v100-reference", root / set_dir)
    (root / trace_dir).mkdir(parents=True)
    shutil.copy(data_root() / "traces/samples/invocations_per_function_md.anon.d01.csv.gz",
                root / trace_dir / "t.csv.gz")
    (root / "sub").mkdir()
    (root / "sub" / "s.toml").write_text(f"""
seed = 1
duration_s = 2.0
[cluster]
profiles = "./{set_dir}"
[[models]]
name = "resnet18_v2"
copies = 20
[[workloads]]
kind = "azure"
trace = "{trace_dir}/t.csv.gz"
minutes = 1
interval_s = 2.0
models = "*"
slo_ms = 100
""", encoding="utf-8")
    return root / "sub" / "s.toml"


def sigterm_once_made(args: list[str], folder, env: dict | None = None,
                      made_s: float = 60.0, end_s: float = 60.0,
                      prefix: str = "") -> tuple[int, str]:
    """``clockwork ARGS`` in a process of its own, sent SIGTERM as soon as something
    whose name starts with ``prefix`` is made in ``folder`` (waits up to ``made_s`` for
    that, and ``end_s`` for it to end): (its exit status, what it wrote to stderr). (Give
    the prefix of what is awaited when ``folder`` is the process's TMPDIR: Python's
    tempfile first makes and removes a probe file of 8 random letters there, and a signal
    that comes meanwhile leaves it behind.)"""
    import signal
    import subprocess

    p = subprocess.Popen([sys.executable, "-m", "clockwork.cluster.cli", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + made_s
        while not any(f.name.startswith(prefix) for f in folder.iterdir()):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=end_s)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, err
