"""ONNX import: a small model built with onnx.helper, imported into a model package, run
by the cpu device and compared with onnxruntime (skipped without tvm/onnx/onnxruntime)."""

import json

import numpy as np
import pytest

pytest.importorskip("tvm")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from clockwork.cluster.cli import main  # noqa: E402
from clockwork.models.onnx_import import OnnxImportError, compile_onnx  # noqa: E402
from clockwork.models.package import read_package, reference_weights  # noqa: E402
from worker.devices.cpu import CpuDevice  # noqa: E402

PS = 4096  # small pages, so that the conv weights span a run of several pages
BATCHES = [1, 2, 4]
C_IN, HW, C_MID, CLASSES = 3, 8, 48, 10


def _small_model(batch_dim="N"):
    """Conv(3x3) + Relu + Conv(1x1) + Relu + GlobalAveragePool + Flatten + Gemm."""
    rng = np.random.default_rng(42)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"),
                                       name)

    inits = [init("conv1.weight", (C_MID, C_IN, 3, 3), 0.3), init("conv1.bias", (C_MID,), 0.1),
             init("conv2.weight", (C_MID, C_MID, 1, 1), 0.25), init("conv2.bias", (C_MID,), 0.1),
             init("fc.weight", (CLASSES, C_MID), 0.3), init("fc.bias", (CLASSES,), 0.1)]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.weight", "conv2.bias"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch_dim, C_IN, HW, HW])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch_dim, CLASSES])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "small_cnn.onnx"
    onnx.save(_small_model(), str(path))
    return path


@pytest.fixture(scope="module")
def package(onnx_file, tmp_path_factory):
    return compile_onnx(onnx_file, BATCHES, tmp_path_factory.mktemp("pkg") / "small_cnn",
                        page_size=PS)


def _x(b, seed):
    return np.random.default_rng(seed * 100 + b).standard_normal((b, C_IN, HW, HW)).astype(
        "float32")


def _check_against_ort(dev, name, onnx_file, seed):
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    worst = 0.0
    for b in BATCHES:
        x = _x(b, seed)
        y, exec_ns = dev.infer(name, x)
        (ref,) = sess.run(None, {"image": x})
        assert y.shape == ref.shape == (b, CLASSES) and exec_ns > 0
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        worst = max(worst, float(np.abs(y - ref).max()))
    return worst


def test_package_metadata(package, onnx_file):
    meta = read_package(package)
    assert meta["model"] == "small_cnn" and meta["batch_sizes"] == BATCHES
    assert meta["functions"] == {"1": "forward_b1", "2": "forward_b2", "4": "forward_b4"}
    assert meta["inputs"] == [{"name": "image", "shape": [C_IN, HW, HW], "dtype": "float32"}]
    assert meta["outputs"] == [{"name": "logits", "shape": [CLASSES], "dtype": "float32"}]
    assert [t["name"] for t in meta["params"]] == [
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]
    assert meta["page_size"] == PS and sum(meta["page_runs"]) == meta["weights_pages"]
    assert max(meta["page_runs"]) > 1  # conv2.weight (9 KiB) spans a run of pages
    # the blob holds exactly the ONNX initializers
    weights = reference_weights(meta, package)
    for t in onnx.load(str(onnx_file)).graph.initializer:
        np.testing.assert_array_equal(weights[t.name], numpy_helper.to_array(t))


def test_matches_onnxruntime_after_evict_and_reload_elsewhere(package, onnx_file):
    meta = read_package(package)
    dev = CpuDevice(2 * meta["weights_pages"] + 2, PS)
    dev.register("cnn", package)
    first, _ = dev.load("cnn")
    _check_against_ort(dev, "cnn", onnx_file, seed=1)
    dev.evict("cnn")
    blocker = dev.arena.alloc(meta["weights_pages"] + 1)  # take the pages it had
    second, _ = dev.load("cnn")
    assert not set(second) & set(first)
    _check_against_ort(dev, "cnn", onnx_file, seed=2)
    dev.arena.free(blocker)


def _compiled_and_loaded(model, tmp_path, name: str, batch_sizes=(1, 2)):
    """``model`` saved as NAME.onnx, compiled, and loaded on a CpuDevice as instance NAME:
    (the device, the package's metadata, the .onnx file)."""
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    out = compile_onnx(path, list(batch_sizes), tmp_path / name, page_size=PS)
    meta = read_package(out)
    dev = CpuDevice(meta["weights_pages"], PS)
    dev.register(name, out)
    dev.load(name)
    return dev, meta, path


def test_fixed_batch_of_one_is_replaced(onnx_file, tmp_path):
    dev, meta, _ = _compiled_and_loaded(_small_model(batch_dim=1), tmp_path, "fixed", (2, 1))
    assert meta["batch_sizes"] == [1, 2] and meta["inputs"][0]["shape"] == [C_IN, HW, HW]
    y, _ = dev.infer("fixed", _x(2, 3))
    # onnx_file is the same model (same seeded weights) with a symbolic batch
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, sess.run(None, {"image": _x(2, 3)})[0], rtol=1e-4, atol=1e-4)


def test_a_flatten_exported_with_shape_initializers_imports(tmp_path):
    """``x.view(x.size(0), -1)`` as exporters write it (Shape, Gather, Unsqueeze, Concat,
    Reshape) with its index, axes and shape as integer initializers: imported (they become
    constants; TVM could not read the Reshape's target from run-time parameters), the
    weights are the float initializers only, and the answers are onnxruntime's."""
    rng = np.random.default_rng(4)
    graph = helper.make_graph([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W", "b"], ["y"], transB=1)], "dflat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "ax0"),
         numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
         numpy_helper.from_array(rng.standard_normal((4, 18)).astype("float32"), "W"),
         numpy_helper.from_array(rng.standard_normal(4).astype("float32"), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    dev, meta, path = _compiled_and_loaded(model, tmp_path, "dflat")
    assert [t["name"] for t in meta["params"]] == ["W", "b"]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b in (1, 2):
        x = rng.standard_normal((b, 2, 3, 3)).astype("float32")
        np.testing.assert_allclose(dev.infer("dflat", x)[0], sess.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


def test_operators_imported_as_tir_functions_import(tmp_path):
    """ReLU6 as exporters write it (Clip with constant bounds, as MobileNet v2 uses it),
    Clip of opset 6 (bounds as attributes) and Pad: TVM imports them as TIR functions
    beside main (one per batch size, as their shapes differ), which were refused; the
    answers are onnxruntime's at every batch size."""
    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((6, 5)).astype("float32"), "W")
    lo = numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6, np.float32), "hi")
    cases = {
        "relu6": ([helper.make_node("MatMul", ["x", "W"], ["h"]),
                   helper.make_node("Clip", ["h", "lo", "hi"], ["y"])], [w, lo, hi], 17, 5),
        "clip6": ([helper.make_node("MatMul", ["x", "W"], ["h"]),
                   helper.make_node("Clip", ["h"], ["y"], min=0.0, max=6.0)], [w], 6, 5),
        "pad": ([helper.make_node("MatMul", ["x", "W"], ["h"]),
                 helper.make_node("Pad", ["h", "pads"], ["y"], mode="constant")],
                [w, numpy_helper.from_array(np.array([0, 1, 0, 2], np.int64), "pads")], 17, 8),
    }
    for name, (nodes, inits, opset, width) in cases.items():
        graph = helper.make_graph(
            nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        dev, meta, path = _compiled_and_loaded(model, tmp_path, name, (1, 2, 4))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for b in (1, 2, 4):
            x = (rng.standard_normal((b, 6)) * 4).astype("float32")
            y, _ = dev.infer(name, x)
            np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_package_compiled_again_into_its_folder_is_read_again(tmp_path):
    """A package compiled again into the same folder (other weights, other outputs), and
    an instance registered from it again: the new package is read and runs. The device
    kept the package it had read first for its whole life, and the dynamic loader the
    library first loaded from that path: the old weights were served with no word."""
    def mlp(seed: int, width: int):
        w = np.random.default_rng(seed).standard_normal((6, width)).astype("float32")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["y"])], "m",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
            [numpy_helper.from_array(w, "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, str(tmp_path / "m.onnx"))
        return w

    x = np.random.default_rng(1).standard_normal((2, 6)).astype("float32")
    w = mlp(1, 5)
    pkg = compile_onnx(tmp_path / "m.onnx", [1, 2], tmp_path / "pkg", page_size=PS)
    dev = CpuDevice(4, PS)
    dev.register("m", pkg)
    dev.load("m")
    np.testing.assert_allclose(dev.infer("m", x)[0], x @ w, rtol=1e-5, atol=1e-5)
    dev.evict("m")
    dev.unregister("m")
    w = mlp(2, 7)
    compile_onnx(tmp_path / "m.onnx", [1, 2], tmp_path / "pkg", page_size=PS)
    assert dev.register("m", pkg)["outputs"][0]["shape"] == [7]
    dev.load("m")
    np.testing.assert_allclose(dev.infer("m", x)[0], x @ w, rtol=1e-5, atol=1e-5)


def test_an_embedding_with_an_index_out_of_range_reads_no_further(tmp_path):
    """An embedding (Gather on a table, int64 ids from the client): in-range ids (negative
    ones too) are onnxruntime's answers; ids out of range read the nearest row instead of
    memory past the table (which killed the worker with SIGSEGV)."""
    table = np.arange(50, dtype=np.float32).reshape(10, 5)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "emb",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 5])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    dev, _, path = _compiled_and_loaded(model, tmp_path, "emb")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[0, 9, -1], [3, -10, 4]], np.int64)
    np.testing.assert_array_equal(dev.infer("emb", ids)[0], sess.run(None, {"ids": ids})[0])
    bad = np.array([[12, 100_000_000, -50]], np.int64)
    y, _ = dev.infer("emb", bad)
    np.testing.assert_array_equal(y[0], table[[9, 9, 0]])


def test_bad_files(tmp_path):
    with pytest.raises(OnnxImportError, match="no such ONNX file"):
        compile_onnx(tmp_path / "missing.onnx", [1], tmp_path / "a")
    (tmp_path / "d.onnx").mkdir()  # (said missing, though it is there)
    with pytest.raises(OnnxImportError, match="d.onnx is a folder, not an ONNX file"):
        compile_onnx(tmp_path / "d.onnx", [1], tmp_path / "a")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf \x00\xff")
    with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
        compile_onnx(junk, [1], tmp_path / "b")
    two = _small_model()
    two.graph.input.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["N", 4]))
    path = tmp_path / "two_inputs.onnx"
    onnx.save(two, str(path))
    with pytest.raises(OnnxImportError, match="2 graph inputs"):
        compile_onnx(path, [1], tmp_path / "c")


@pytest.mark.parametrize("where", ["input", "output"])
def test_an_element_type_no_tensor_may_have_is_refused_at_compile(tmp_path, where):
    """A bfloat16 input or output (no KServe v2 element type) is refused by name when the
    model is compiled: its package was written, then profiling it failed with a
    traceback (DLPack refused the dtype) and no profile could ever serve it."""
    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", bf16 if where == "input" else f32, ["N", 8])
    y = helper.make_tensor_value_info("y", bf16 if where == "output" else f32, ["N", 8])
    node = (helper.make_node("Relu", ["x"], ["y"]) if where == "input" else
            helper.make_node("Cast", ["x"], ["y"], to=bf16))
    if where == "input":
        y = helper.make_tensor_value_info("y", bf16, ["N", 8])
    graph = helper.make_graph([node], "g", [x], [y])
    path = tmp_path / "bf16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(OnnxImportError, match=f"{where} '[xy]' has element type bfloat16; "
                                              "the element types a model's tensors may "
                                              "have are bool, "):
        compile_onnx(path, [1, 2], tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_cli_compile_onnx(onnx_file, tmp_path, capsys):
    out = tmp_path / "pkg"
    assert main(["compile", str(onnx_file), "--device", "cpu", "--batch-sizes", "1,2",
                 "--out", str(out)]) == 0
    meta = read_package(out)
    assert meta["batch_sizes"] == [1, 2] and meta["page_size"] == 16 * 1024 * 1024
    assert meta["weights_pages"] == 1
    dev = CpuDevice(1)
    dev.register("cnn", out)
    dev.load("cnn")
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    for b in (1, 2):
        np.testing.assert_allclose(dev.infer("cnn", _x(b, 5))[0],
                                   sess.run(None, {"image": _x(b, 5)})[0], rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert main(["compile", str(tmp_path / "missing.onnx"), "--out", str(tmp_path / "x")]) == 2
    assert "no such ONNX file" in capsys.readouterr().err
    junk = tmp_path / "junk.onnx"
    junk.write_text("not onnx")
    assert main(["compile", str(junk), "--out", str(tmp_path / "y")]) == 2
    assert "not a valid ONNX model" in capsys.readouterr().err
    assert main(["profile", str(tmp_path / "missing.onnx"), "--out",
                 str(tmp_path / "p.json")]) == 2


def test_cli_profile_onnx(onnx_file, tmp_path):
    from clockwork.profiles import load_profile_set

    out = tmp_path / "cpu" / "small_cnn.json"
    assert main(["profile", str(onnx_file), "--batch-sizes", "1,2", "--runs", "5",
                 "--load-runs", "2", "--out", str(out)]) == 0
    prof = load_profile_set(str(tmp_path / "cpu")).get("small_cnn")
    assert prof.batch_sizes == [1, 2] and prof.inputs[0].name == "image"
    assert prof.outputs[0].shape == (CLASSES,) and all(v > 0 for v in prof.exec_ns.values())


def test_cli_profile_of_a_model_without_weights_loads(tmp_path):
    """A graph with no parameters (a Softmax) still takes a page: its profile says one
    byte of weights, and the profile set it lands in still loads (weights_bytes 0 broke
    every model of the set)."""
    from clockwork.profiles import load_profile_set

    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "softmax.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "cpu" / "softmax.json"
    assert main(["profile", str(path), "--batch-sizes", "1", "--runs", "3",
                 "--load-runs", "2", "--out", str(out)]) == 0
    prof = load_profile_set(str(tmp_path / "cpu")).get("softmax")
    assert prof.weights_bytes >= 1 and prof.weights_pages >= 1


def test_cli_an_onnx_files_stem_that_is_not_a_model_name_needs_name(onnx_file, tmp_path,
                                                                    capsys):
    """The package (and profile) of an ONNX file is named by the file's stem, which must
    be a name the repository takes; one it would refuse is refused here, up front, and
    --name gives another."""
    odd = tmp_path / "small cnn.onnx"
    odd.write_bytes(onnx_file.read_bytes())
    for verb, out in (("compile", tmp_path / "pkg"), ("profile", tmp_path / "p.json")):
        assert main([verb, str(odd), "--batch-sizes", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "'small cnn' is not a model name" in err[0], err
        assert "--name" in err[0] and not out.exists()
    assert main(["compile", str(odd), "--batch-sizes", "1", "--name", "small_cnn",
                 "--out", str(tmp_path / "pkg")]) == 0
    assert read_package(tmp_path / "pkg")["model"] == "small_cnn"
    assert main(["profile", str(odd), "--batch-sizes", "1", "--runs", "2", "--load-runs",
                 "1", "--name", "small_cnn", "--out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["model"] == "small_cnn"
    capsys.readouterr()
    for argv in (["compile", "mlp", "--name", "x"],
                 ["profile", str(odd), "--package", str(tmp_path / "pkg"), "--name", "x"]):
        assert main(argv) == 2
        assert "--name" in capsys.readouterr().err
    assert main(["compile", str(odd), "--name=.x"]) == 2  # (argparse's check)
    assert "argument --name: '.x' is not a model name" in capsys.readouterr().err
