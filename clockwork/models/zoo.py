"""The model zoo, built in code with TVM's Relax ``nn`` frontend (no downloads).

Each entry gives a Relax ``nn.Module``, the per-sample input shape, seeded random
weights (a dict name -> numpy array, names as ``export_tvm`` reports them) and a
numpy reference forward pass that the tests compare the compiled model against.
Sizes are tiny so that compiling takes well under a second, except ``resnet18``, a
real-size ResNet-18 (~11 M parameters, weights over 3 pages of 16 MiB).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ZooModel:
    name: str
    input_name: str
    input_shape: tuple[int, ...]  # without the batch dimension
    dtype: str
    build: Callable[[], object]  # -> tvm.relax.frontend.nn.Module
    reference: Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]


# -- numpy reference ops --------------------------------------------------------------


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w.T
    return y + b if b is not None else y


def _conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1,
            padding: int = 0, groups: int = 1) -> np.ndarray:
    """NCHW x OIHW (I = C / groups), float64 accumulate."""
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    _, _, kh, kw = w.shape
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride].astype(np.float64)  # N C H' W' kh kw
    n, c, h, wd = win.shape[:4]
    o = w.shape[0]
    win = win.reshape(n, groups, c // groups, h, wd, kh, kw)
    wg = w.astype(np.float64).reshape(groups, o // groups, c // groups, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg).reshape(n, o, h, wd)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y.astype(np.float32)


# -- MLP ------------------------------------------------------------------------------

MLP_DIMS = (64, 128, 128, 10)


def _build_mlp():
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            d = MLP_DIMS
            self.fc1 = nn.Linear(d[0], d[1])
            self.fc2 = nn.Linear(d[1], d[2])
            self.fc3 = nn.Linear(d[2], d[3])

        def forward(self, x):
            x = nn.op.relu(self.fc1(x))
            x = nn.op.relu(self.fc2(x))
            return self.fc3(x)

    return MLP()


def _ref_mlp(x, p):
    x = _relu(_linear(x, p["fc1.weight"], p["fc1.bias"]))
    x = _relu(_linear(x, p["fc2.weight"], p["fc2.bias"]))
    return _linear(x, p["fc3.weight"], p["fc3.bias"])


# -- a small ResNet (basic blocks, BatchNorm folded into conv bias) --------------------

RESNET_WIDTHS = (8, 16)
RESNET_CLASSES = 10
RESNET_HW = 16


def _basic_block(nn):
    """The ResNet BasicBlock (two 3x3 convs; a 1x1 projection shortcut when the shape
    changes) as a Relax nn.Module class; shared by resnet_tiny and resnet18."""

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            self.conv1 = nn.Conv2D(cin, cout, 3, stride=stride, padding=1)
            self.conv2 = nn.Conv2D(cout, cout, 3, padding=1)
            self.proj = nn.Conv2D(cin, cout, 1, stride=stride) if (stride != 1 or cin != cout) else None

        def forward(self, x):
            y = nn.op.relu(self.conv1(x))
            y = self.conv2(y)
            skip = self.proj(x) if self.proj is not None else x
            return nn.op.relu(y + skip)

    return Block


def _build_resnet():
    from tvm.relax.frontend import nn

    Block = _basic_block(nn)

    class TinyResNet(nn.Module):
        def __init__(self) -> None:
            w0, w1 = RESNET_WIDTHS
            self.stem = nn.Conv2D(3, w0, 3, padding=1)
            self.block1 = Block(w0, w0, 1)
            self.block2 = Block(w0, w1, 2)
            self.fc = nn.Linear(w1, RESNET_CLASSES)

        def forward(self, x):
            x = nn.op.relu(self.stem(x))
            x = self.block2(self.block1(x))
            hw = RESNET_HW // 2
            x = nn.op.sum(x, axis=[2, 3]) * (1.0 / (hw * hw))  # global average pool
            return self.fc(x)

    return TinyResNet()


def _ref_block(x, p, prefix, stride):
    y = _relu(_conv2d(x, p[f"{prefix}.conv1.weight"], p[f"{prefix}.conv1.bias"], stride, 1))
    y = _conv2d(y, p[f"{prefix}.conv2.weight"], p[f"{prefix}.conv2.bias"], 1, 1)
    if f"{prefix}.proj.weight" in p:
        x = _conv2d(x, p[f"{prefix}.proj.weight"], p[f"{prefix}.proj.bias"], stride, 0)
    return _relu(y + x)


def _ref_resnet(x, p):
    x = _relu(_conv2d(x, p["stem.weight"], p["stem.bias"], 1, 1))
    x = _ref_block(x, p, "block1", 1)
    x = _ref_block(x, p, "block2", 2)
    x = x.mean(axis=(2, 3))
    return _linear(x, p["fc.weight"], p["fc.bias"])


# -- ResNet-18 (real size: ~11.2 M parameters, 3 pages of 16 MiB) ------------------------
#
# The ImageNet ResNet-18 (7x7/2 stem conv, 3x3/2 max pool, four stages of two basic blocks,
# widths 64/128/256/512, global average pool, fc) on a 3x32x32 input with 10 classes.
# BatchNorm is folded into the conv biases. The ImageNet stem (downsample by 4) is kept
# rather than the CIFAR 3x3/1 stem: with it batch-1 EXEC is ~16 ms on 2 cores; the CIFAR
# stem costs 16x the FLOPs (~250 ms). Weights are the same either way.

R18_WIDTHS = (64, 128, 256, 512)
R18_HW = 32
R18_CLASSES = 10


def _r18_blocks() -> list[tuple[str, int, int, int]]:
    """(name, cin, cout, stride) of the eight basic blocks."""
    out, cin = [], R18_WIDTHS[0]
    for i, w in enumerate(R18_WIDTHS):
        for j in range(2):
            out.append((f"layer{i + 1}.{j}", cin, w, 2 if (i > 0 and j == 0) else 1))
            cin = w
    return out


def _build_resnet18():
    from tvm import relax
    from tvm.relax.frontend import nn

    Block = _basic_block(nn)

    class Stage(nn.Module):
        def __init__(self, blocks: list) -> None:
            # attribute names "0", "1" so that parameters read layer1.0.conv1.weight etc.
            for i, b in enumerate(blocks):
                setattr(self, str(i), b)
            self.n = len(blocks)

        def forward(self, x):
            for i in range(self.n):
                x = getattr(self, str(i))(x)
            return x

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            self.stem = nn.Conv2D(3, R18_WIDTHS[0], 7, stride=2, padding=3)
            blocks = _r18_blocks()
            for i in range(len(R18_WIDTHS)):
                setattr(self, f"layer{i + 1}",
                        Stage([Block(cin, cout, s) for name, cin, cout, s in blocks
                               if name.startswith(f"layer{i + 1}.")]))
            self.fc = nn.Linear(R18_WIDTHS[-1], R18_CLASSES)

        def forward(self, x):
            x = nn.op.relu(self.stem(x))
            x = nn.op.wrap_nested(relax.op.nn.max_pool2d(x._expr, pool_size=3, strides=2,
                                                         padding=1), name="max_pool2d")
            for i in range(len(R18_WIDTHS)):
                x = getattr(self, f"layer{i + 1}")(x)
            hw = R18_HW // 32  # stem /2, pool /2, three strided stages /8
            x = nn.op.sum(x, axis=[2, 3]) * (1.0 / (hw * hw))
            return self.fc(x)

    return ResNet18()


def _max_pool2d(x: np.ndarray, k: int, stride: int, padding: int) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)),
               constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride].max(axis=(-2, -1))


def _ref_resnet18(x, p):
    x = _relu(_conv2d(x, p["stem.weight"], p["stem.bias"], 2, 3))
    x = _max_pool2d(x, 3, 2, 1)
    for name, _, _, stride in _r18_blocks():
        x = _ref_block(x, p, name, stride)
    return _linear(x.mean(axis=(2, 3)), p["fc.weight"], p["fc.bias"])


# -- a small MobileNetV2-like net (inverted residual, depthwise conv, relu6) ------------

MOBILENET_HW = 16


def _build_mobilenet():
    from tvm.relax.frontend import nn

    class TinyMobileNet(nn.Module):
        def __init__(self) -> None:
            self.stem = nn.Conv2D(3, 8, 3, stride=2, padding=1)
            self.expand = nn.Conv2D(8, 32, 1)
            self.dw = nn.Conv2D(32, 32, 3, padding=1, groups=32)
            self.project = nn.Conv2D(32, 8, 1)
            self.head = nn.Conv2D(8, 32, 1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = nn.op.relu6(self.stem(x))
            y = nn.op.relu6(self.expand(x))
            y = nn.op.relu6(self.dw(y))
            x = x + self.project(y)
            x = nn.op.relu6(self.head(x))
            hw = MOBILENET_HW // 2
            x = nn.op.sum(x, axis=[2, 3]) * (1.0 / (hw * hw))
            return self.fc(x)

    return TinyMobileNet()


def _relu6(x):
    return np.clip(x, 0, 6)


def _ref_mobilenet(x, p):
    x = _relu6(_conv2d(x, p["stem.weight"], p["stem.bias"], 2, 1))
    y = _relu6(_conv2d(x, p["expand.weight"], p["expand.bias"]))
    y = _relu6(_conv2d(y, p["dw.weight"], p["dw.bias"], 1, 1, groups=32))
    x = x + _conv2d(y, p["project.weight"], p["project.bias"])
    x = _relu6(_conv2d(x, p["head.weight"], p["head.bias"]))
    return _linear(x.mean(axis=(2, 3)), p["fc.weight"], p["fc.bias"])


# -- a small transformer encoder (one pre-LN layer, 2 heads, mean pooling) -------------

TF_SEQ, TF_DIM, TF_HEADS, TF_FF = 8, 32, 2, 64


def _build_transformer():
    from tvm.relax.frontend import nn

    class TinyEncoder(nn.Module):
        def __init__(self) -> None:
            self.ln1 = nn.LayerNorm(TF_DIM)
            self.qkv = nn.Linear(TF_DIM, 3 * TF_DIM)
            self.attn_out = nn.Linear(TF_DIM, TF_DIM)
            self.ln2 = nn.LayerNorm(TF_DIM)
            self.ff1 = nn.Linear(TF_DIM, TF_FF)
            self.ff2 = nn.Linear(TF_FF, TF_DIM)
            self.fc = nn.Linear(TF_DIM, 10)

        def forward(self, x):
            b = x.shape[0]
            dh = TF_DIM // TF_HEADS
            qkv = nn.op.reshape(self.qkv(self.ln1(x)), (b, TF_SEQ, 3, TF_HEADS, dh))
            qkv = nn.op.permute_dims(qkv, (2, 0, 3, 1, 4))  # 3 b h s dh
            q, k, v = nn.op.split(qkv, 3, axis=0)
            q = nn.op.reshape(q, (b, TF_HEADS, TF_SEQ, dh))
            k = nn.op.reshape(k, (b, TF_HEADS, TF_SEQ, dh))
            v = nn.op.reshape(v, (b, TF_HEADS, TF_SEQ, dh))
            att = nn.op.matmul(q, nn.op.permute_dims(k, (0, 1, 3, 2))) * (1.0 / dh**0.5)
            y = nn.op.matmul(nn.op.softmax(att, axis=-1), v)  # b h s dh
            y = nn.op.reshape(nn.op.permute_dims(y, (0, 2, 1, 3)), (b, TF_SEQ, TF_DIM))
            x = x + self.attn_out(y)
            x = x + self.ff2(nn.op.relu(self.ff1(self.ln2(x))))
            x = nn.op.sum(x, axis=[1]) * (1.0 / TF_SEQ)
            return self.fc(x)

    return TinyEncoder()


def _layer_norm(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _ref_transformer(x, p):
    bsz = x.shape[0]
    dh = TF_DIM // TF_HEADS
    x = x.astype(np.float64)
    qkv = _linear(_layer_norm(x, p["ln1.weight"], p["ln1.bias"]), p["qkv.weight"], p["qkv.bias"])
    qkv = qkv.reshape(bsz, TF_SEQ, 3, TF_HEADS, dh).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(bsz, TF_SEQ, TF_DIM)
    x = x + _linear(y, p["attn_out.weight"], p["attn_out.bias"])
    h = _relu(_linear(_layer_norm(x, p["ln2.weight"], p["ln2.bias"]), p["ff1.weight"], p["ff1.bias"]))
    x = x + _linear(h, p["ff2.weight"], p["ff2.bias"])
    return _linear(x.mean(axis=1), p["fc.weight"], p["fc.bias"]).astype(np.float32)


ZOO: dict[str, ZooModel] = {
    "mlp": ZooModel("mlp", "x", (MLP_DIMS[0],), "float32", _build_mlp, _ref_mlp),
    "resnet_tiny": ZooModel("resnet_tiny", "x", (3, RESNET_HW, RESNET_HW), "float32",
                            _build_resnet, _ref_resnet),
    "resnet18": ZooModel("resnet18", "x", (3, R18_HW, R18_HW), "float32", _build_resnet18,
                         _ref_resnet18),
    "mobilenet_tiny": ZooModel("mobilenet_tiny", "x", (3, MOBILENET_HW, MOBILENET_HW), "float32",
                               _build_mobilenet, _ref_mobilenet),
    "transformer_tiny": ZooModel("transformer_tiny", "x", (TF_SEQ, TF_DIM), "float32",
                                 _build_transformer, _ref_transformer),
}


def get_model(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}") from None


def random_weights(specs: list[tuple[str, tuple[int, ...], str]], seed: int) -> dict[str, np.ndarray]:
    """Seeded weights: He-scaled normals for weights (fan-in = all but the first dim),
    1 + small normals for norm scales (1-D ``*.weight``), small normals for biases."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, dtype in specs:
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif name.endswith(".weight"):
            a = 1.0 + rng.standard_normal(shape) * 0.1
        else:
            a = rng.standard_normal(shape) * 0.1
        out[name] = a.astype(dtype)
    return out


__all__ = ["ZOO", "ZooModel", "get_model", "random_weights"]
