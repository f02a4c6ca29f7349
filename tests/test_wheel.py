"""A non-editable install (a built wheel in a fresh virtual environment) carries the data it
needs: shipped scenarios by name, profile sets and the trace sample, all found through
importlib.resources inside the installed package, from a folder that is not the checkout.

The wheel is built from a copy of the sources (so no stale ``build/`` of the checkout can
leak into it); the dependencies come from the package registry (pip's cache makes later
runs quick). Without a reachable registry the installed-package tests are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "clockwork" / "data"
CLIENTS = ("tritonclient[grpc,http]>=2.73", "kserve>=0.21")
SAMPLE = "traces/samples/invocations_per_function_md.anon.d01.csv.gz"
NETWORK_TROUBLE = ("Could not find a version that satisfies", "No matching distribution found",
                   "Failed to establish a new connection", "NewConnectionError",
                   "Temporary failure in name resolution", "Name or service not known",
                   "Network is unreachable", "Max retries exceeded", "ConnectTimeout",
                   "ReadTimeout", "ProxyError", "Connection refused", "SSLError")


def run(cmd: list[str], timeout: float, cwd: Path, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """``cmd`` in its own process group; on timeout the whole group is killed (serve
    starts worker and controller processes) and the test fails with what it printed."""
    p = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def clean_env(venv: Path | None = None) -> dict:
    """The environment minus anything that could point back into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CLOCKWORK_PROFILES",
                        "AZURE_TRACE_DIR", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def _setuptools_major() -> int:
    """This environment's setuptools' major version (0: none)."""
    if find_spec("setuptools") is None:
        return 0
    from importlib.metadata import version

    return int(version("setuptools").split(".")[0])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps`` of a copy of the sources."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / f, src / f)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for d in ("clockwork", "controller", "worker"):
        shutil.copytree(REPO / d, src / d, symlinks=True, ignore=ignore)
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(out), "-q"]
    if _setuptools_major() >= 77:  # the build-system's requirement (the SPDX license)
        cmd.append("--no-build-isolation")  # this environment's setuptools: no download
    r = run(cmd, 180, src, clean_env())
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    wheels = list(out.glob("clockwork_py-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment outside the checkout with the wheel installed (its
    dependencies from the registry)."""
    root = tmp_path_factory.mktemp("venv")
    assert not root.resolve().is_relative_to(REPO)
    v = root / "env"
    r = run([sys.executable, "-m", "venv", v], 120, root, clean_env())
    assert r.returncode == 0, f"venv failed:\n{r.stdout}\n{r.stderr}"
    env = clean_env(v)
    env["PIP_DEFAULT_TIMEOUT"] = "20"

    def pip_install(*args, timeout: float) -> None:
        """``pip install ARGS`` in the venv; skips the tests where the registry cannot be
        reached (or is too slow), fails them on any other error."""
        what = " ".join(getattr(a, "name", str(a)) for a in args)
        cmd = [v / "bin" / "python", "-m", "pip", "install", *args, "--retries", "1",
               "--disable-pip-version-check", "-q"]
        try:
            r = run(cmd, timeout, root, env)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip install {what} ran past {timeout:.0f} s "
                        "(package registry unreachable or too slow)")
        if r.returncode != 0:
            text = r.stdout + r.stderr
            lines = [ln for ln in text.splitlines() if any(m in ln for m in NETWORK_TROUBLE)]
            if lines:
                pytest.skip(f"cannot install from the registry: {lines[0].strip()}")
            pytest.fail(f"pip install {what} failed:\n{text}")

    # as the README's commands do, a current pip first: over these dependencies its
    # resolver takes half the time of the one a new venv bundles
    pip_install("-U", "pip", timeout=120)
    # exactly what a user does: the project beside the current stock KServe v2 / Triton
    # clients, in one environment (they pin protobuf < 7); --no-compile: pip's
    # byte-compiling of every installed file took half the set-up and changes nothing
    # the tests look at (what they import is compiled as they import it)
    pip_install(wheel, *CLIENTS, "--no-compile", timeout=420)
    return v


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    assert not d.resolve().is_relative_to(REPO)
    return d


def clockwork(venv: Path, cwd: Path, *args: str, timeout: float = 120
              ) -> subprocess.CompletedProcess:
    return run([venv / "bin" / "clockwork", *args], timeout, cwd, clean_env(venv))


def py(venv: Path, cwd: Path, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run([venv / "bin" / "python", "-c", code], timeout, cwd, clean_env(venv))


# ------------------------------------------------------------------ the wheel itself

def test_wheel_holds_every_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"clockwork/data/{p.relative_to(DATA).as_posix()}"
               for p in DATA.rglob("*") if p.is_file()}
    assert shipped and shipped <= names, sorted(shipped - names)
    for suffix in (".json", ".toml", ".csv.gz"):
        assert any(n.endswith(suffix) for n in shipped), suffix
    assert f"clockwork/data/{SAMPLE}" in names
    assert "clockwork/data/profiles/v100-reference/set.json" in names
    assert "clockwork/data/scenarios/demo_live.toml" in names
    assert "clockwork/resources.py" in names and "clockwork/cluster/scenarios_cli.py" in names
    # the protocol (for clients in other languages), the typing marker, the license, the
    # version written once (clockwork.__version__)
    assert {"clockwork/protocol/clockwork.proto", "clockwork/protocol/kserve.proto",
            "clockwork/py.typed"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)[-8:]
    from clockwork import __version__
    assert wheel.name.startswith(f"clockwork_py-{__version__}-"), wheel.name


# ------------------------------------------------------------------ the installed package

FIND_DATA = """
import json, importlib.resources as ir
import clockwork
from clockwork import resources
from clockwork.profiles import load_profile_set
files = ir.files("clockwork")
print(json.dumps({
    "package": clockwork.__file__,
    "data_root": str(resources.data_root()),
    "checkout": resources.checkout_root() and str(resources.checkout_root()),
    "v100": str(files.joinpath("data/profiles/v100-reference/resnet50_v2.json")),
    "v100_is_file": files.joinpath("data/profiles/v100-reference/resnet50_v2.json").is_file(),
    "cpu_set": str(load_profile_set("cpu").path),
    "v100_set": sorted(load_profile_set("v100-reference").profiles),
    "scenario": str(resources.resolve_scenario("demo_live")),
    "names": [n for n, _ in resources.list_scenarios()],
    "trace": str(resources.resolve_data_path("SAMPLE")),
}))
""".replace("SAMPLE", SAMPLE)


def test_installed_package_finds_its_data(venv, elsewhere):
    r = py(venv, elsewhere, FIND_DATA)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    site = venv.resolve()
    pkg = Path(got["package"]).resolve()
    assert pkg.is_relative_to(site) and not pkg.is_relative_to(REPO)
    assert got["checkout"] is None
    for key in ("data_root", "v100", "cpu_set", "scenario", "trace"):
        p = Path(got[key]).resolve()
        assert p.is_relative_to(pkg.parent), (key, p)
    assert got["v100_is_file"]
    assert "resnet50_v2" in got["v100_set"]
    assert set(got["names"]) == {p.stem for p in (DATA / "scenarios").glob("*.toml")}


def test_installed_simulate_by_name(venv, elsewhere):
    r = clockwork(venv, elsewhere, "simulate", "poisson_warm", "--set", "duration_s=5", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SLO attainment" in r.stdout and "requests submitted" in r.stdout
    # a scenario that reads the shipped trace sample
    r = clockwork(venv, elsewhere, "simulate", "azure_sample", "--set", "duration_s=3", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SLO attainment" in r.stdout


def test_installed_settings_reference(venv, elsewhere):
    """The reference the help texts point at, from the installed package (no docs/)."""
    r = clockwork(venv, elsewhere, "settings", "limits")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("## Controller limits") and "`stream_outstanding`" in r.stdout
    r = clockwork(venv, elsewhere, "settings")
    assert r.returncode == 0 and "## `[[workloads]]`" in r.stdout, r.stderr


def test_installed_unknown_scenario_is_one_line(venv, elsewhere):
    r = clockwork(venv, elsewhere, "simulate", "poisson_wram")
    assert r.returncode != 0
    assert "poisson_warm" in r.stderr and "Traceback" not in r.stderr


def test_installed_serve_replay(venv, elsewhere):
    r = clockwork(venv, elsewhere, "serve", "demo_live", "--replay", "--set", "duration_s=5",
                  "--port", "0", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every request answered exactly once: True" in r.stdout
    assert "SLO attainment" in r.stdout


COPY = """
import sys
from clockwork.cluster.cli import main
sys.exit(main(["scenarios", *sys.argv[1:]]))
"""


def test_installed_scenarios_list_and_copy(venv, elsewhere):
    r = run([venv / "bin" / "python", "-c", COPY], 60, elsewhere, clean_env(venv))
    assert r.returncode == 0, r.stderr
    assert "demo_live" in r.stdout and "poisson_warm" in r.stdout
    r = run([venv / "bin" / "python", "-c", COPY, "copy", "azure_sample", "--to", "mine"], 60,
            elsewhere, clean_env(venv))
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "mine" / "azure_sample.toml").is_file()
    assert (elsewhere / "mine" / SAMPLE).is_file()
    r = clockwork(venv, elsewhere, "simulate", "mine/azure_sample.toml", "--set", "duration_s=2",
                  "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr


CLIENT_CHECK = """
import sys
from importlib.metadata import version
import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th
import clockwork.protocol.clockwork_pb2  # noqa: F401
from clockwork.client import Client

grpc_addr, http_addr, controller = sys.argv[1:4]
print("versions", version("tritonclient"), version("kserve"), version("protobuf"))
x = np.zeros((1, 3, 224, 224), np.float32)
g = tg.InferenceServerClient(grpc_addr)
i = tg.InferInput("data", list(x.shape), "FP32")
i.set_data_from_numpy(x)
r = g.infer("resnet50_v2", [i], parameters={"slo_ms": 1000})
print("grpc", r.as_numpy(r.get_response().outputs[0].name).shape)
h = th.InferenceServerClient(http_addr)
i = th.InferInput("data", list(x.shape), "FP32")
i.set_data_from_numpy(x, binary_data=True)
r = h.infer("resnet50_v2", [i], parameters={"slo_ms": 1000})
print("http", r.as_numpy(r.get_response()["outputs"][0]["name"]).shape)
with Client(controller) as c:
    print("client", c.infer("resnet50_v2", slo_ms=1000).batch_size)
"""


# kserve and tritonclient.grpc cannot share one process (both register the protobuf package
# ``inference``), so the kserve SDK is imported beside the project in a process of its own.
KSERVE_CHECK = """
import kserve
from clockwork.client import Client  # noqa: F401
from clockwork.protocol import clockwork_pb2  # noqa: F401
from clockwork.cluster.sim import simulate
print("kserve ok", simulate("poisson_warm", ["duration_s=1"]).summary["submitted"] > 0)
"""


def test_installed_beside_stock_clients(venv, elsewhere):
    """pip install WHEEL 'tritonclient[grpc,http]>=2.73' 'kserve>=0.21' in one fresh venv:
    clockwork --help, a live cluster, and tritonclient grpc + http inference against it."""
    r = run([venv / "bin" / "python", "-c", "from importlib.metadata import version as v; "
             "print(v('tritonclient'), v('kserve'), v('protobuf'))"], 60, elsewhere,
            clean_env(venv))
    triton, kserve_v, proto = r.stdout.split()
    assert tuple(map(int, triton.split(".")[:2])) >= (2, 73)
    assert tuple(map(int, kserve_v.split(".")[:2])) >= (0, 21)
    assert clockwork(venv, elsewhere, "--help").returncode == 0
    r = run([venv / "bin" / "python", "-c", KSERVE_CHECK], 120, elsewhere, clean_env(venv))
    assert "kserve ok True" in r.stdout, r.stdout + r.stderr[-2000:]
    p = subprocess.Popen([str(venv / "bin" / "clockwork"), "serve", "--port", "0",
                          "--http-port", "0", "--kserve-port", "0"], cwd=elsewhere,
                         env=clean_env(venv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    addrs: dict[str, str] = {}
    seen = []
    try:
        for line in p.stdout:  # the controller prints its three listeners, then serves
            seen.append(line)
            for key, marker in (("controller", "clockwork controller listening on "),
                                ("grpc", "kserve grpc listening on "),
                                ("http", "http listening on ")):
                if marker in line:
                    addrs[key] = line.split(marker)[1].split()[0]
            if len(addrs) == 3:
                break
        assert len(addrs) == 3, "".join(seen)
        r = run([venv / "bin" / "python", "-c", CLIENT_CHECK, addrs["grpc"], addrs["http"],
                 addrs["controller"]], 120, elsewhere, clean_env(venv))
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]
        assert f"versions {triton} {kserve_v} {proto}" in r.stdout
        assert "grpc (1, 1000)" in r.stdout and "http (1, 1000)" in r.stdout, r.stdout
        assert "client 1" in r.stdout, r.stdout
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
