"""Import a user's ONNX model into a model package (the same kind ``compile_model`` writes).

The graph is imported with TVM's Relax ONNX frontend once per batch size, with the batch
(first) dimension of the input made concrete, and with the initializers kept as function
parameters (``keep_params_in_input=True``) rather than folded in as constants, except the
small integer ones (shapes, axes, indices), which become constants. Each import's
``main`` becomes ``forward_b<B>(input, *weights)`` of one module, and the initializers
become the package's weights, laid out in pages like a zoo model's. So the cpu device
LOADs and EXECs an imported model exactly as it does a zoo model.

Supported: one graph input (anything that is not an initializer) whose dimensions are
all fixed except the first, the batch dimension (symbolic or fixed; it is replaced);
one or more outputs, each with the batch as its first dimension.
"""

from __future__ import annotations

import time
from pathlib import Path

from clockwork.models.package import PackageError, check_batch_sizes, function_name, write_package
from clockwork.profiles import PAGE_SIZE
from clockwork.settings import TENSOR_DTYPES


class OnnxImportError(PackageError):
    """The file is not a readable ONNX model, or uses something the importer does not."""


def _dtype_name(elem_type: int) -> str:
    import onnx

    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _dims(value_info) -> list[int | str | None]:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.shape.dim]


def load_onnx(path: str | Path):
    """Read and check an ONNX file; raises :class:`OnnxImportError` with a clear reason."""
    import onnx

    p = Path(path)
    if p.is_dir():
        raise OnnxImportError(f"{p} is a folder, not an ONNX file")
    if not p.is_file():
        raise OnnxImportError(f"{p}: no such ONNX file")
    try:
        model = onnx.load(str(p))
        # (checked from the file: a model over 2 GiB, its weights in external data, is
        # refused by the in-memory check as "too large")
        onnx.checker.check_model(str(p))
    except Exception as e:  # protobuf DecodeError, ValidationError, ...
        raise OnnxImportError(f"{p}: not a valid ONNX model ({type(e).__name__}: {e})") from e
    return model


SHAPE_CONSTANT_MAX = 1024  # elements: an integer initializer this small is a shape, not a weight


def _shape_constants(model):
    """``model`` with its small integer initializers (shapes, axes, indices: what a graph
    exported as ``x.view(x.size(0), -1)`` feeds a Reshape) as Constant nodes: with every
    initializer a run-time parameter, TVM's importer cannot read the target shape of such
    a Reshape. Weights (floating point, or larger) stay parameters."""
    import onnx
    from onnx import TensorProto, helper

    ints = (TensorProto.INT64, TensorProto.INT32)
    g = model.graph
    small = [t for t in g.initializer
             if t.data_type in ints and len(t.dims) <= 1
             and (t.dims[0] if t.dims else 1) <= SHAPE_CONSTANT_MAX]
    if not small:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = {t.name for t in small}
    keep = [t for t in out.graph.initializer if t.name not in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    inputs = [i for i in out.graph.input if i.name not in names]  # (older exports list them)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    nodes = [helper.make_node("Constant", [], [t.name], value=t, name=f"{t.name}__constant")
             for t in small]
    rest = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes + rest)
    return out


def _safe_takes(mod):
    """``mod`` with every ``take`` (ONNX Gather, after its negative indices are made
    positive) in ``clip`` mode instead of ``fast``: an index out of range, which a client
    can send to an embedding model, then reads the nearest row instead of memory past the
    table (another model's weights) or killing the worker with SIGSEGV. In-range indices
    give the same answers. (ONNX would refuse the request; the answer for such an index
    is not defined there.)"""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    take = tvm.ir.Op.get("relax.take")

    @mutator
    class SafeTake(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if (isinstance(call, relax.Call) and call.op.same_as(take)
                    and call.attrs.mode == "fast"):
                return relax.op.take(call.args[0], call.args[1], axis=call.attrs.axis,
                                     mode="clip")
            return call

    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = SafeTake().visit_expr(func)
    return mod


def _graph_input(model, path: Path):
    init = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    if len(inputs) != 1:
        raise OnnxImportError(f"{path}: {len(inputs)} graph inputs "
                              f"({', '.join(i.name for i in inputs)}); only one is supported")
    spec = inputs[0]
    if not spec.type.HasField("tensor_type"):
        raise OnnxImportError(f"{path}: input {spec.name!r} is not a tensor")
    dims = _dims(spec)
    if len(dims) < 1:
        raise OnnxImportError(f"{path}: input {spec.name!r} has no shape; a batch dimension "
                              "and fixed other dimensions are needed")
    rest = dims[1:]
    if not all(isinstance(d, int) and d > 0 for d in rest):
        raise OnnxImportError(f"{path}: input {spec.name!r} has shape {dims}; every dimension "
                              "but the first (the batch) must be fixed")
    return spec.name, [int(d) for d in rest], _served_dtype(
        _dtype_name(spec.type.tensor_type.elem_type), f"input {spec.name!r}", path)


def _served_dtype(dtype: str, what: str, path: Path) -> str:
    """``dtype`` if a tensor may have it (the KServe v2 protocol's element types), else
    refused by name: a bfloat16 model compiled, then failed in every profile and could
    never be served."""
    if dtype not in TENSOR_DTYPES:
        raise OnnxImportError(f"{path}: {what} has element type {dtype}; the element types "
                              f"a model's tensors may have are {', '.join(TENSOR_DTYPES)}")
    return dtype


def _output_specs(func, names: list[str], batch: int, path: Path) -> list[dict]:
    from tvm import relax

    ret = func.ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(names):
        raise OnnxImportError(f"{path}: {len(fields)} outputs imported, the graph names "
                              f"{len(names)}")
    out = []
    for name, t in zip(names, fields, strict=True):
        if not isinstance(t, relax.TensorType) or t.shape is None:
            raise OnnxImportError(f"{path}: output {name!r} has no static tensor shape ({t})")
        try:
            shape = [int(s) for s in t.shape]
        except (TypeError, ValueError):
            raise OnnxImportError(f"{path}: output {name!r} has a symbolic shape "
                                  f"{list(t.shape)} at batch size {batch}") from None
        if not shape or shape[0] != batch:
            raise OnnxImportError(f"{path}: output {name!r} has shape {shape} at batch size "
                                  f"{batch}; its first dimension must be the batch")
        out.append({"name": name, "shape": shape[1:],
                    "dtype": _served_dtype(str(t.dtype), f"output {name!r}", path)})
    return out


def compile_onnx(path: str | Path, batch_sizes: list[int], out: str | Path,
                 target: str = "llvm", page_size: int = PAGE_SIZE,
                 model_name: str | None = None) -> Path:
    """Import the ONNX model at ``path`` for ``batch_sizes`` and write its package to ``out``.

    The package's model name is ``model_name`` or the file's stem.
    """
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    t0 = time.perf_counter()
    path = Path(path)
    batch_sizes = check_batch_sizes(batch_sizes)
    model = _shape_constants(load_onnx(path))
    in_name, in_shape, in_dtype = _graph_input(model, path)
    out_names = [o.name for o in model.graph.output]

    bb = relax.BlockBuilder()  # every batch size's functions, in one module
    weights: list | None = None
    outputs: list[dict] | None = None
    for b in batch_sizes:
        try:
            mod = from_onnx(model, shape_dict={in_name: [b, *in_shape]},
                            dtype_dict={in_name: in_dtype}, keep_params_in_input=True)
        except Exception as e:  # unsupported operator, shape error, ...
            raise OnnxImportError(f"{path}: TVM's ONNX frontend failed at batch size {b} "
                                  f"({type(e).__name__}: {e})") from e
        mod = _safe_takes(mod)
        mod, params = relax.frontend.detach_params(mod)
        # the TIR functions some operators import as (Clip, Pad, ...): one per batch size,
        # named after it (their shapes differ), and main calls those
        tir = {}
        for gv in mod.functions:
            if gv.name_hint != "main":
                name = f"{gv.name_hint}_{function_name(b)}"
                tir[gv.name_hint] = bb.add_func(mod[gv].with_attr("global_symbol", name), name)
        func = mod["main"]
        values = params.get("main", [])
        names = [v.name for v in func.params[1:]]
        if len(names) != len(values):
            raise OnnxImportError(f"{path}: {len(names)} weight parameters but "
                                  f"{len(values)} values")
        b_outputs = _output_specs(func, out_names, b, path)
        if weights is None:  # every import holds the same initializers: keep the first's
            weights = [(n, v.numpy()) for n, v in zip(names, values, strict=True)]
            outputs = b_outputs
        elif ([(n, tuple(v.shape), str(v.dtype)) for n, v in zip(names, values, strict=True)]
              != [(n, a.shape, str(a.dtype)) for n, a in weights] or b_outputs != outputs):
            raise OnnxImportError(f"{path}: weights or outputs differ between batch sizes")
        if tir:
            func = _calling(func, tir)
        bb.add_func(func.with_attr("global_symbol", function_name(b)), function_name(b))

    irmod = bb.get()
    return write_package(
        out, model=model_name or path.stem, irmod=irmod, target=target,
        batch_sizes=batch_sizes, weights=weights,
        inputs=[{"name": in_name, "shape": in_shape, "dtype": in_dtype}], outputs=outputs,
        page_size=page_size, started=t0,
        extra={"onnx": {"file": str(path.resolve()), "opset": [
            {"domain": o.domain, "version": int(o.version)} for o in model.opset_import]}})


def _calling(func, functions: dict):
    """``func`` with its calls of module functions by name made to ``functions``'
    (name -> the GlobalVar of the function that takes its place)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Renamed(PyExprMutator):
        def visit_global_var_(self, op):
            return functions.get(op.name_hint, op)

    return _Renamed().visit_expr(func)


__all__ = ["OnnxImportError", "compile_onnx", "load_onnx"]
