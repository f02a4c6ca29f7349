"""Real models: zoo packages compiled with TVM, run by the cpu device on a page arena.

Skipped without TVM (``pip install -e .[tvm]``). The tiny packages are compiled once per
session with small (4 KiB) pages, so that tensors span several pages and runs must be
contiguous; the real-size ``resnet18`` once per module, with 16 MiB pages and batch sizes 1, 2.
"""

import numpy as np
import orjson
import pytest

pytest.importorskip("tvm")

from clockwork.cluster.cli import main  # noqa: E402
from clockwork.models.package import read_package, reference_weights  # noqa: E402
from clockwork.models.zoo import ZOO, get_model  # noqa: E402
from clockwork.profiles import PAGE_SIZE  # noqa: E402
from worker.devices.cpu import CpuDevice, DeviceError  # noqa: E402
from worker.memory import TENSOR_ALIGNMENT  # noqa: E402

PS = 4096
BATCHES = [1, 2, 4]
BIG = "resnet18"
TINY = [m for m in ZOO if m != BIG]


@pytest.fixture(scope="session")
def packages(tmp_path_factory):
    from clockwork.models.package import compile_model

    root = tmp_path_factory.mktemp("packages")
    return {m: compile_model(m, BATCHES, root / m, page_size=PS) for m in TINY}


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    from clockwork.models.package import compile_model

    return compile_model(BIG, [1, 2], tmp_path_factory.mktemp("big") / BIG)


def _inputs(meta, b, seed=0):
    spec = meta["inputs"][0]
    rng = np.random.default_rng(seed + b)
    return rng.standard_normal((b, *spec["shape"])).astype(spec["dtype"])


def test_package_metadata(packages):
    for name, path in packages.items():
        meta = read_package(path)
        assert meta["model"] == name and meta["batch_sizes"] == BATCHES
        assert meta["page_size"] == PS
        assert sum(meta["page_runs"]) == meta["weights_pages"]
        assert (path / "weights.bin").stat().st_size == meta["weights_pages"] * PS
        for t in meta["params"]:
            assert t["offset"] % TENSOR_ALIGNMENT == 0
            if t["nbytes"] <= PS:  # the layout rule: small tensors never straddle pages
                assert t["offset"] // PS == (t["offset"] + t["nbytes"] - 1) // PS
        assert meta["outputs"][0]["shape"] == [10]
    assert max(read_package(packages["mlp"])["page_runs"]) > 1  # exercises contiguous runs


def _check_outputs(dev, name, meta, weights, seed=0):
    for b in meta["batch_sizes"]:
        x = _inputs(meta, b, seed)
        y, exec_ns = dev.infer(name, x)
        ref = get_model(meta["model"]).reference(x, weights)
        assert y.shape == (b, *meta["outputs"][0]["shape"])
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        assert exec_ns > 0


def test_outputs_match_reference_after_evict_and_reload_elsewhere(packages):
    metas = {m: read_package(p) for m, p in packages.items()}
    need = sum(m["weights_pages"] for m in metas.values())
    dev = CpuDevice(need + 8, PS)
    for name, path in packages.items():
        dev.register(name, path)
    weights = {m: reference_weights(metas[m], packages[m]) for m in packages}
    first = {}
    for name in packages:
        first[name], load_ns = dev.load(name)
        assert load_ns > 0
        _check_outputs(dev, name, metas[name], weights[name])
    # EVICT everything, take the low pages, LOAD again in reverse order: other pages
    for name in packages:
        dev.evict(name)
        with pytest.raises(DeviceError, match="not in the cache"):
            dev.infer(name, _inputs(metas[name], 1))
    blocker = dev.arena.alloc(5)
    for name in reversed(list(packages)):
        pages, _ = dev.load(name)
        assert pages != first[name]
        _check_outputs(dev, name, metas[name], weights[name], seed=7)
    dev.arena.free(blocker)


def test_weights_are_bound_zero_copy(packages):
    meta = read_package(packages["mlp"])
    dev = CpuDevice(meta["weights_pages"], PS)
    dev.register("m", packages["mlp"])
    pages, _ = dev.load("m")
    x = _inputs(meta, 2)
    y0, _ = dev.infer("m", x)
    bias = next(t for t in meta["params"] if t["name"] == "fc3.bias")
    dev.arena.view(pages, bias["offset"], bias["shape"], bias["dtype"])[:] += 1.0
    y1, _ = dev.infer("m", x)
    np.testing.assert_allclose(y1, y0 + 1.0, rtol=1e-5, atol=1e-5)


def test_device_errors(packages):
    meta = read_package(packages["resnet_tiny"])
    dev = CpuDevice(meta["weights_pages"], PS)
    dev.register("r", packages["resnet_tiny"])
    with pytest.raises(DeviceError, match="unknown model"):
        dev.load("nope")
    dev.load("r")
    with pytest.raises(DeviceError, match="already loaded"):
        dev.load("r")
    with pytest.raises(DeviceError, match="batch size 3"):
        dev.infer("r", _inputs(meta, 3))
    with pytest.raises(DeviceError, match="page"):  # 16 MiB arena vs a 4 KiB-page package
        CpuDevice(1).register("r", packages["resnet_tiny"])


def test_a_broken_package_is_refused_not_run(packages, tmp_path, capsys):
    """A package whose library was cut short (a copy that stopped partway), is not a
    library, or whose model.json lacks a key: the device refuses it (InvalidPackage) and
    `clockwork profile` says so in one line, exit 2. Loading the cut library would have
    killed the process (SIGBUS)."""
    import shutil

    from clockwork.models.package import LIBRARY, METADATA, PackageError

    src = packages["resnet_tiny"]
    cases = {}
    for name, change in (("cut", lambda d: (d / LIBRARY).write_bytes(
                             (src / LIBRARY).read_bytes()[:2000])),
                         ("cut_late", lambda d: (d / LIBRARY).write_bytes(
                             (src / LIBRARY).read_bytes()[:-100])),
                         ("garbage", lambda d: (d / LIBRARY).write_bytes(b"x" * 5000))):
        d = tmp_path / name
        shutil.copytree(src, d)
        change(d)
        cases[name] = d
    for name, d in cases.items():
        with pytest.raises(DeviceError, match="model.so"):
            CpuDevice(1, PS).register("r", d)
        capsys.readouterr()
        assert main(["profile", "resnet_tiny", "--package", str(d), "--runs", "1", "--load-runs", "1",
                     "--out", str(tmp_path / "p.json")]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "model.so" in err, err
    # model.json edited: a key gone, or of the wrong type (page_runs gone, the package
    # loaded, said READY and failed every request at its LOAD; weights_pages "1" was
    # refused as "16777216 bytes, metadata says 1 x 16777216")
    original = orjson.loads((src / METADATA).read_bytes())
    for i, (key, value, said) in enumerate((
            ("weights_pages", None, "no weights_pages"),
            ("page_runs", None, "no page_runs"),
            ("weights_pages", "1", "weights_pages is '1', not a whole number"),
            ("page_runs", [0], "page_runs is [0], not a list"),
            ("functions", {"one": "forward_b1"}, "functions is"),
            ("inputs", [{"name": "x"}], "inputs is not a list of tensors"),
            # a weight's shape that does not make its size, in a package from before
            # digests (it loaded, said READY and failed every EXEC)
            ("params", [{**original["params"][0],
                         "shape": [*original["params"][0]["shape"], 2]},
                        *original["params"][1:]], "which is not its nbytes"),
            # an offset past the weights' pages, or before them (READY, then every LOAD
            # failed, said as a full cache)
            ("params", [{**original["params"][0], "offset": PS * 10},
                        *original["params"][1:]], "does not lie within one run"),
            ("params", [{**original["params"][0], "offset": -64},
                        *original["params"][1:]], "does not lie within one run"))):
        d = tmp_path / f"meta{i}"
        shutil.copytree(src, d)
        meta = dict(original)
        if key == "params":
            del meta["sha256"]
        if value is None:
            del meta[key]
        else:
            meta[key] = value
        (d / METADATA).write_bytes(orjson.dumps(meta))
        with pytest.raises(PackageError) as e:
            CpuDevice(1, PS).register("r", d)
        assert said in str(e.value)
        assert main(["profile", "resnet_tiny", "--package", str(d), "--out",
                     str(tmp_path / "p.json")]) == 2
        assert said in capsys.readouterr().err
    dev = CpuDevice(1, PS)  # the good one still goes
    dev.register("r", src)


def test_a_package_whose_files_are_not_its_own_is_refused(packages, tmp_path, capsys):
    """model.json keeps digests of the library, the weights and the layout fields: a
    package given another package's library (it loaded, said READY and failed every
    request), weights with one byte changed (it answered wrongly) or a layout edited by
    hand is refused when read, by the device and by `clockwork profile`; a package
    without digests (compiled before they were kept) is still read."""
    import shutil

    from clockwork.models.package import LIBRARY, METADATA, WEIGHTS

    src = packages["resnet_tiny"]
    original = orjson.loads((src / METADATA).read_bytes())
    assert set(original["sha256"]) == {LIBRARY, WEIGHTS, "layout"}

    def other_library(d):
        shutil.copy(packages["mobilenet_tiny"] / LIBRARY, d / LIBRARY)

    def flipped_byte(d):
        blob = bytearray((d / WEIGHTS).read_bytes())
        blob[original["params"][0]["offset"]] ^= 0x40
        (d / WEIGHTS).write_bytes(bytes(blob))

    def edited_layout(d):
        meta = dict(original)
        meta["params"] = list(reversed(meta["params"]))
        (d / METADATA).write_bytes(orjson.dumps(meta))

    def bad_digests(d):
        (d / METADATA).write_bytes(orjson.dumps({**original, "sha256": "x"}))

    for change, said in ((other_library, "model.so is not the library"),
                         (flipped_byte, "weights.bin is not the weights"),
                         (edited_layout, "layout fields"),
                         (bad_digests, "sha256 is 'x'")):
        d = tmp_path / change.__name__
        shutil.copytree(src, d)
        change(d)
        with pytest.raises(DeviceError, match=said):
            CpuDevice(1, PS).register("r", d)
        capsys.readouterr()
        assert main(["profile", "resnet_tiny", "--package", str(d), "--runs", "1",
                     "--load-runs", "1", "--out", str(tmp_path / "p.json")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    d = tmp_path / "no_digests"
    shutil.copytree(src, d)
    (d / METADATA).write_bytes(orjson.dumps({k: v for k, v in original.items()
                                             if k != "sha256"}))
    meta = read_package(d)
    dev = CpuDevice(meta["weights_pages"], PS)
    dev.register("r", d)
    dev.load("r")
    _check_outputs(dev, "r", meta, reference_weights(meta, d))


def test_cli_compile_default_pages(tmp_path):
    out = tmp_path / "mlp"
    assert main(["compile", "mlp", "--device", "cpu", "--batch-sizes", "2,1", "--out",
                 str(out)]) == 0
    meta = orjson.loads((out / "model.json").read_bytes())
    assert meta["batch_sizes"] == [1, 2] and meta["weights_pages"] == 1
    assert meta["page_size"] == 16 * 1024 * 1024
    dev = CpuDevice(2)
    dev.register("mlp", out)
    dev.load("mlp")
    _check_outputs(dev, "mlp", meta, reference_weights(meta, out))
    assert main(["compile", "nope", "--out", str(tmp_path / "x")]) == 2


def test_cli_profile_writes_scheduler_profile(packages, tmp_path):
    from clockwork.profiles import load_profile_set

    out = tmp_path / "cpu" / "resnet_tiny.json"
    assert main(["profile", "resnet_tiny", "--package", str(packages["resnet_tiny"]),
                 "--runs", "20", "--load-runs", "3", "--out", str(out)]) == 0
    prof = load_profile_set(str(tmp_path / "cpu")).get("resnet_tiny")
    assert prof.device == "cpu" and prof.batch_sizes == BATCHES
    assert prof.load_ns > 0 and all(v > 0 for v in prof.exec_ns.values())
    assert prof.weights_pages == 1 and prof.inputs[0].shape == (3, 16, 16)
    assert "p50" in prof.source["exec_ns.1"] and "max" in prof.source["load_ns"]
    assert main(["profile", "nope", "--out", str(tmp_path / "x.json")]) == 2


def test_resnet18_real_size_over_three_pages(resnet18):
    meta = read_package(resnet18)
    n_params = sum(int(np.prod(t["shape"])) for t in meta["params"])
    assert 11_000_000 < n_params < 11_500_000 and meta["weights_bytes"] == 4 * n_params
    assert meta["page_size"] == PAGE_SIZE
    assert meta["weights_pages"] == 3 and meta["page_runs"] == [1, 1, 1]  # packed, not 4
    for t in meta["params"]:  # no tensor straddles a page
        assert t["offset"] // PAGE_SIZE == (t["offset"] + t["nbytes"] - 1) // PAGE_SIZE
    assert meta["inputs"][0]["shape"] == [3, 32, 32] and meta["outputs"][0]["shape"] == [10]


def test_resnet18_matches_numpy_after_evict_and_reload_elsewhere(resnet18):
    meta = read_package(resnet18)
    weights = reference_weights(meta, resnet18)
    dev = CpuDevice(2 * meta["weights_pages"] + 1)
    dev.register(BIG, resnet18)
    first, _ = dev.load(BIG)
    _check_outputs(dev, BIG, meta, weights)
    dev.evict(BIG)
    blocker = dev.arena.alloc(1)
    second, _ = dev.load(BIG)
    assert second != first
    _check_outputs(dev, BIG, meta, weights, seed=3)
    dev.arena.free(blocker)


def test_pack_tensors_never_worse_than_the_plain_layout():
    from clockwork.models.package import pack_tensors
    from worker.memory import layout_tensors

    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = [int(s) for s in rng.integers(1, 3 * PS, size=rng.integers(1, 30))]
        offsets, n, runs = pack_tensors(sizes, PS)
        assert n <= layout_tensors(sizes, PS)[1] and sum(runs) == n
        spans = sorted((o, o + s) for o, s in zip(offsets, sizes, strict=True))
        for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False):
            assert a1 <= b0  # no overlap
        for o, s in zip(offsets, sizes, strict=True):
            assert o % TENSOR_ALIGNMENT == 0 and o + s <= n * PS
            if s <= PS:
                assert o // PS == (o + s - 1) // PS
            else:
                assert o % PS == 0


def test_a_package_that_disagrees_with_its_profile_is_named():
    """What makes a package unfit to run under a profile: other inputs or outputs, a batch
    size the profile runs that it lacks, more weight pages than the profile reserves."""
    from clockwork.models.package import profile_disagreement
    from clockwork.profiles import load_profile_set

    prof = load_profile_set("cpu").get("mlp")
    meta = {"inputs": [t.to_json() for t in prof.inputs],
            "outputs": [t.to_json() for t in prof.outputs],
            "batch_sizes": prof.batch_sizes, "weights_pages": prof.weights_pages}
    assert profile_disagreement(meta, prof) == ""
    cases = {"inputs": [{"name": "x", "shape": [8], "dtype": "float32"}],
             "outputs": [{"name": "y", "shape": [10], "dtype": "float32"}],
             "batch_sizes": [1, 2], "weights_pages": prof.weights_pages + 1}
    says = {"inputs": "its inputs", "outputs": "its outputs",
            "batch_sizes": "batch sizes [4, 8, 16]", "weights_pages": "pages"}
    for key, value in cases.items():
        assert says[key] in profile_disagreement({**meta, key: value}, prof), key


def test_a_package_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A package's model.json that is a FIFO (or a device): refused at once, naming it;
    it was read for ever (a worker hung at the controller's Hello, and would not stop on
    SIGTERM)."""
    import os
    import threading

    from clockwork.models.package import METADATA, PackageError, read_package

    d = tmp_path / "pkg"
    d.mkdir()
    os.mkfifo(d / METADATA)
    got: list = []

    def read() -> None:
        try:
            read_package(d)
        except Exception as e:  # noqa: BLE001 - looked at below
            got.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # (the code before: blocked opening the FIFO; a writer frees it)
        fd = os.open(d / METADATA, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(10)
        raise AssertionError("reading the package blocked on its FIFO")
    assert len(got) == 1 and isinstance(got[0], PackageError), got
    assert "not a regular file" in str(got[0]) and METADATA in str(got[0])
