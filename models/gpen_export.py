"""Export GPEN-BFR (yangxy/GPEN FullGenerator) to ONNX with a dynamic batch dimension.

    python models/gpen_export.py --size 512 --out models/gpen-bfr-512-random.onnx [--seed 0]
    python models/gpen_export.py --checkpoint GPEN-BFR-512.pth --out models/gpen-bfr-512.onnx
    python models/gpen_export.py --size 512 --compressible 2 --out models/gpen-bfr-512-tiled.onnx
    ... [--fp16] [--template ffhq|arcface_128] [--no-check]

The graph is written op by op with onnx.helper (numpy + onnx, no torch): input `input`, output
`output`, both float32 [N,3,S,S] (N symbolic), RGB in [-1,1] (the output is not clamped, as in
the official model: clamp when converting back to pixels).

Faithful to face_model/gpen_model.py (FullGenerator, isconcat=True), except that the modulated
convolutions are batch-agnostic (StyleGAN2-ADA fused_modconv=False): x * style (per input
channel) -> Conv with the shared weight (times the equalised-lr scale) -> * demod (per output
channel, rsqrt(sum_c style_c^2 * sum_k (scale*w)^2 + 1e-8)); mathematically identical to the
official grouped convolution. The encoder features are concatenated to the decoder as its
"noise" (NoiseInjection with isconcat: cat(out, noise_weight * feature)). Some constants are
folded: the sqrt(2) gain of FusedLeakyReLU is moved into the preceding linear/conv weights,
biases and demodulation factors (leaky ReLU is positively homogeneous), and conv biases go into
Conv's bias input.

Weights: an official checkpoint (.pth state dict, read without torch by pth_io.py; official key
names, optionally wrapped under a key such as "g_ema" and/or prefixed "module."), or seeded
random weights (metadata gpen_video.weights = "random weights: for speed only").

--fp16: weights and feature maps in float16; the style path (mapping network, modulation,
demodulation: tiny [N,C] tensors whose squares could overflow float16) stays float32 and is cast
to float16 where it meets the feature maps. I/O stays float32 (Cast nodes at both ends), so the
same calling code runs both models.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import OrderedDict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_io  # noqa: E402
import gpen_arch  # noqa: E402
import pth_io  # noqa: E402

OPSET = 17
IR_VERSION = 8
SQRT2 = math.sqrt(2.0)

TEMPLATES = {
    # five points (left eye, right eye, nose, left mouth corner, right mouth corner) in [0,1]
    "ffhq": [[0.37691676, 0.46864664], [0.62285697, 0.46912813], [0.50123859, 0.61331904],
             [0.39308822, 0.72541100], [0.61150205, 0.72490465]],
    "arcface_128": [[0.36167656, 0.40387734], [0.63696719, 0.40235469], [0.50019687, 0.56044219],
                    [0.38710391, 0.72160547], [0.61507734, 0.72034453]],
}


class _Graph:
    def __init__(self, fp16: bool):
        self.fp16 = fp16
        self.nodes: list = []
        self.inits: list = []
        self._names: set = set()
        self.feat_type = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT

    def _unique(self, name: str) -> str:
        base, i = name, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def const(self, name: str, arr, feat: bool) -> str:
        """An initializer; `feat` ones (touching feature maps) are float16 in an fp16 model."""
        arr = np.asarray(arr)
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float16 if (feat and self.fp16) else np.float32)
        name = self._unique(name)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op_type: str, inputs, name: str, out: str | None = None, **attrs) -> str:
        name = self._unique(name)
        out = out or name
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def to_feat(self, x: str, name: str) -> str:
        return self.op("Cast", [x], name, to=TensorProto.FLOAT16) if self.fp16 else x


def _unsq(g: _Graph, x: str, name: str) -> str:
    axes = g.const(name + "/axes", np.array([2, 3], dtype=np.int64), feat=False)
    return g.op("Unsqueeze", [x, axes], name)


def _modulated_conv(g: _Graph, sd, prefix: str, x: str, latent: str, demodulate: bool,
                    upsample: bool, gain: float = 1.0, bias=None) -> str:
    """ModulatedConv2d, batch-agnostic. `gain` multiplies the output (folded into demod or
    the weight); `bias` (3 values, ToRGB only) goes into Conv's bias input."""
    w = sd[prefix + ".weight"][0].astype(np.float64)  # [O, C, k, k]
    cout, cin, k, _ = w.shape
    scale = 1.0 / math.sqrt(cin * k * k)
    ws = w * scale
    # style = modulation(latent): EqualLinear(style_dim, in_channel, bias_init=1), lr_mul 1
    mw = sd[prefix + ".modulation.weight"].astype(np.float64)
    mb = sd[prefix + ".modulation.bias"].astype(np.float64)
    mscale = 1.0 / math.sqrt(mw.shape[1])
    s = g.op("MatMul", [latent, g.const(prefix + ".modulation/w", (mw * mscale).T, False)],
             prefix + ".modulation/matmul")
    s = g.op("Add", [s, g.const(prefix + ".modulation/b", mb, False)], prefix + ".modulation/add")
    s4 = _unsq(g, g.to_feat(s, prefix + "/style_cast"), prefix + "/style_4d")
    xs = g.op("Mul", [x, s4], prefix + "/mul_style")
    if demodulate:
        wsq = (ws ** 2).sum(axis=(2, 3)).T  # [C, O]
        s2 = g.op("Mul", [s, s], prefix + "/style_sq")
        d = g.op("MatMul", [s2, g.const(prefix + "/wsq", wsq, False)], prefix + "/demod_sum")
        d = g.op("Add", [d, g.const(prefix + "/eps", np.array(1e-8, np.float32), False)],
                 prefix + "/demod_eps")
        d = g.op("Sqrt", [d], prefix + "/demod_sqrt")
        if gain != 1.0:
            d = g.op("Div", [g.const(prefix + "/gain", np.array(gain, np.float32), False), d],
                     prefix + "/demod")
        else:
            d = g.op("Reciprocal", [d], prefix + "/demod")
        d4 = _unsq(g, g.to_feat(d, prefix + "/demod_cast"), prefix + "/demod_4d")
    else:
        ws = ws * gain
    if upsample:
        wt = g.const(prefix + "/weight_t", ws.transpose(1, 0, 2, 3), True)  # [C, O, k, k]
        y = g.op("ConvTranspose", [xs, wt], prefix + "/conv_transpose",
                 strides=[2, 2], pads=[0, 0, 0, 0], kernel_shape=[k, k])
        # Blur(kernel, pad=(1, 1), upsample_factor=2): depthwise 4x4 on the 2H+1 output
        kern = gpen_arch.make_kernel() * 4.0
        factor, p = 2, (4 - 2) - (k - 1)
        pad0, pad1 = (p + 1) // 2 + factor - 1, p // 2 + 1
        bk = g.const(prefix + ".blur/kernel",
                     np.broadcast_to(kern[::-1, ::-1], (cout, 1, 4, 4)), True)
        y = g.op("Conv", [y, bk], prefix + ".blur", group=cout, kernel_shape=[4, 4],
                 pads=[pad0, pad0, pad1, pad1])
    else:
        inputs = [xs, g.const(prefix + "/weight", ws, True)]
        if bias is not None:
            inputs.append(g.const(prefix + "/bias", bias, True))
        y = g.op("Conv", inputs, prefix + "/conv", kernel_shape=[k, k],
                 pads=[k // 2] * 4)
    if demodulate:
        y = g.op("Mul", [y, d4], prefix + "/mul_demod")
    return y


def _styled_conv(g: _Graph, sd, prefix: str, x: str, latent: str, noise: str,
                 upsample: bool) -> str:
    """StyledConv with NoiseInjection(isconcat=True) and FusedLeakyReLU(2*out_channel); the
    activation's sqrt(2) is folded into the demodulation, the noise weight and the bias."""
    y = _modulated_conv(g, sd, prefix + ".conv", x, latent, True, upsample, gain=SQRT2)
    nw = float(sd[prefix + ".noise.weight"].reshape(-1)[0])
    n = g.op("Mul", [noise, g.const(prefix + ".noise/weight", np.array(nw * SQRT2), True)],
             prefix + ".noise/mul")
    y = g.op("Concat", [y, n], prefix + ".noise/concat", axis=1)
    b = sd[prefix + ".activate.bias"].astype(np.float64) * SQRT2
    y = g.op("Add", [y, g.const(prefix + ".activate/bias", b.reshape(1, -1, 1, 1), True)],
             prefix + ".activate/add")
    return g.op("LeakyRelu", [y], prefix + ".activate", alpha=0.2)


def _to_rgb(g: _Graph, sd, prefix: str, x: str, latent: str, skip: str | None) -> str:
    bias = sd[prefix + ".bias"].reshape(-1)
    y = _modulated_conv(g, sd, prefix + ".conv", x, latent, False, False, bias=bias)
    if skip is not None:
        # Upsample(blur_kernel): upfirdn2d(up=2, pad=(2, 1)) with kernel*4 == depthwise
        # ConvTranspose(stride 2, 4x4, pads 1) (the kernel is symmetric)
        kern = gpen_arch.make_kernel() * 4.0
        uk = g.const(prefix + ".upsample/kernel", np.broadcast_to(kern, (3, 1, 4, 4)), True)
        up = g.op("ConvTranspose", [skip, uk], prefix + ".upsample", group=3, strides=[2, 2],
                  kernel_shape=[4, 4], pads=[1, 1, 1, 1])
        y = g.op("Add", [y, up], prefix + "/add_skip")
    return y


def _conv_layer(g: _Graph, sd, prefix: str, x: str, downsample: bool) -> str:
    """ConvLayer (EqualConv2d without bias + FusedLeakyReLU), optionally Blur + stride 2;
    sqrt(2) gain folded into weight and bias."""
    if downsample:
        w = sd[prefix + ".1.weight"].astype(np.float64)
        b = sd[prefix + ".2.bias"].astype(np.float64)
        cin = w.shape[1]
        k = w.shape[-1]
        p = (4 - 2) + (k - 1)
        pad0, pad1 = (p + 1) // 2, p // 2
        bk = g.const(prefix + ".0/kernel", np.broadcast_to(gpen_arch.make_kernel(), (cin, 1, 4, 4)),
                     True)
        x = g.op("Conv", [x, bk], prefix + ".0", group=cin, kernel_shape=[4, 4],
                 pads=[pad0, pad0, pad1, pad1])
        stride, pad = 2, 0
    else:
        w = sd[prefix + ".0.weight"].astype(np.float64)
        b = sd[prefix + ".1.bias"].astype(np.float64)
        k = w.shape[-1]
        stride, pad = 1, k // 2
    scale = 1.0 / math.sqrt(w.shape[1] * k * k)
    y = g.op("Conv", [x, g.const(prefix + "/weight", w * scale * SQRT2, True),
                      g.const(prefix + "/bias", b * SQRT2, True)],
             prefix + "/conv", kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    return g.op("LeakyRelu", [y], prefix + "/act", alpha=0.2)


def _equal_linear(g: _Graph, sd, prefix: str, x: str, lr_mul: float = 1.0) -> str:
    """EqualLinear with activation='fused_lrelu' (sqrt(2) folded in)."""
    w = sd[prefix + ".weight"].astype(np.float64)
    b = sd[prefix + ".bias"].astype(np.float64)
    scale = lr_mul / math.sqrt(w.shape[1])
    y = g.op("MatMul", [x, g.const(prefix + "/weight", (w * scale * SQRT2).T, False)],
             prefix + "/matmul")
    y = g.op("Add", [y, g.const(prefix + "/bias", b * lr_mul * SQRT2, False)], prefix + "/add")
    return g.op("LeakyRelu", [y], prefix + "/act", alpha=0.2)


def build_model(sd, size: int, channel_multiplier: int | None = None,
                narrow: float | None = None, fp16: bool = False,
                metadata: dict | None = None) -> onnx.ModelProto:
    """The ONNX model of FullGenerator(size, 512, 8, cm, narrow=narrow) with weights `sd`
    (official names, numpy arrays)."""
    cm, nw = gpen_arch.config(size, channel_multiplier, narrow)
    check_state_dict(sd, size, cm, nw)
    log_size = int(math.log2(size))
    g = _Graph(fp16)

    x = g.to_feat("input", "input_cast")
    # encoder
    feats = [_conv_layer(g, sd, "ecd0.0", x, downsample=False)]
    for i in range(1, log_size - 1):
        feats.append(_conv_layer(g, sd, f"ecd{i}.0", feats[-1], downsample=True))
    flat = g.op("Flatten", [feats[-1]], "flatten", axis=1)
    if fp16:
        flat = g.op("Cast", [flat], "flatten_cast", to=TensorProto.FLOAT)
    code = _equal_linear(g, sd, "final_linear.0", flat)
    # mapping network: PixelNorm + n_mlp EqualLinear(lr_mul=0.01, fused_lrelu)
    sq = g.op("Mul", [code, code], "generator.style.0/sq")
    ms = g.op("ReduceMean", [sq], "generator.style.0/mean", axes=[1], keepdims=1)
    ms = g.op("Add", [ms, g.const("generator.style.0/eps", np.array(1e-8, np.float32), False)],
              "generator.style.0/eps_add")
    latent = g.op("Div", [code, g.op("Sqrt", [ms], "generator.style.0/sqrt")],
                  "generator.style.0")
    for i in range(1, gpen_arch.N_MLP + 1):
        latent = _equal_linear(g, sd, f"generator.style.{i}", latent, lr_mul=gpen_arch.LR_MLP)
    # decoder; noise = encoder features, coarse to fine: [4x4, 8, 8, 16, 16, ..., S, S]
    noise = [f for f in feats for _ in range(2)][::-1][1:]
    const = g.const("generator.input.input", sd["generator.input.input"], True)
    out = _styled_conv(g, sd, "generator.conv1", const, latent, noise[0], upsample=False)
    skip = _to_rgb(g, sd, "generator.to_rgb1", out, latent, None)
    for lvl in range(log_size - 2):
        out = _styled_conv(g, sd, f"generator.convs.{2 * lvl}", out, latent, noise[1 + 2 * lvl],
                           upsample=True)
        out = _styled_conv(g, sd, f"generator.convs.{2 * lvl + 1}", out, latent,
                           noise[2 + 2 * lvl], upsample=False)
        skip = _to_rgb(g, sd, f"generator.to_rgbs.{lvl}", out, latent, skip)
    if fp16:
        g.op("Cast", [skip], "output_cast", out="output", to=TensorProto.FLOAT)
    else:
        g.op("Identity", [skip], "output_identity", out="output")

    x_info = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    y_info = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, size, size])
    graph = helper.make_graph(g.nodes, f"gpen_bfr_{size}", [x_info], [y_info],
                              initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gpen-video models/gpen_export.py")
    model.ir_version = IR_VERSION
    for k, v in (metadata or {}).items():
        p = model.metadata_props.add()
        p.key, p.value = k, str(v)
    return model


# ---------------------------------------------------------------------------------------------
# checkpoints


def check_state_dict(sd, size: int, channel_multiplier: int, narrow: float) -> None:
    """Like load_state_dict(strict=True): every parameter present with the official shape, no
    unknown keys; buffers (blur kernels) may be absent but must hold the fixed values."""
    spec = gpen_arch.state_dict_spec(size, channel_multiplier, narrow)
    missing = [n for n, (_, kind) in spec.items() if kind == "param" and n not in sd]
    unexpected = [n for n in sd if n not in spec]
    bad = [f"{n}: {tuple(np.shape(sd[n]))} != {s}" for n, (s, _) in spec.items()
           if n in sd and tuple(np.shape(sd[n])) != s]
    if missing or unexpected or bad:
        raise ValueError(
            f"state dict does not match GPEN-BFR-{size} (channel_multiplier={channel_multiplier},"
            f" narrow={narrow}): missing {missing[:5]}{'...' if len(missing) > 5 else ''},"
            f" unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''},"
            f" wrong shapes {bad[:5]}")
    for n, (s, kind) in spec.items():
        if kind == "buffer" and n in sd:
            if not np.allclose(np.asarray(sd[n], np.float64), gpen_arch.buffer_value(n), atol=1e-6):
                raise ValueError(f"buffer {n} differs from the official blur kernel")


def unwrap_checkpoint(obj, key: str | None = None):
    """The generator state dict inside a loaded checkpoint: `obj[key]` if key is given, else the
    object itself or, for training checkpoints, its 'g_ema' / 'state_dict' / 'params_ema' /
    'params' entry; a 'module.' prefix (DataParallel) is removed."""
    if key is not None:
        obj = obj[key]
    elif isinstance(obj, dict) and not any(isinstance(v, np.ndarray) for v in obj.values()):
        for k in ("g_ema", "state_dict", "params_ema", "params", "g"):
            if k in obj and isinstance(obj[k], dict):
                obj = obj[k]
                break
    if not isinstance(obj, dict):
        raise ValueError("checkpoint holds no state dict")
    out = {}
    for k, v in obj.items():
        if k.startswith("module."):
            k = k[len("module."):]
        out[k] = np.asarray(v, dtype=np.float32)
    return out


def infer_size(sd) -> int:
    n = sum(1 for k in sd if k.startswith("generator.to_rgbs.") and k.endswith(".conv.weight"))
    return 2 ** (n + 2)


def infer_config(sd, size: int):
    """(channel_multiplier, narrow) matching the checkpoint's shapes; official first."""
    candidates = [gpen_arch.config(size)] + [(cm, nw) for cm in (1, 2, 4) for nw in (0.5, 1.0)]
    for cm, nw in candidates:
        spec = gpen_arch.state_dict_spec(size, cm, nw)
        if all(tuple(np.shape(sd[n])) == s for n, (s, kind) in spec.items()
               if kind == "param" and n in sd):
            return cm, nw
    return gpen_arch.config(size)


def make_compressible(sd, distinct: int):
    """Random weights that compress: every parameter repeats, along its first axis longer than
    `distinct` (output channels, biases, linear rows), its first `distinct` rows, so the exported
    file holds few distinct filters and zstd/zlib shrink it about a hundredfold. Values keep the
    seeded random weights' distribution (finite, not denormal), so the model runs exactly as
    fast as the plain random export: for speed tests that must travel small. Buffers (blur
    kernels) are kept."""
    spec_kinds = {n: kind for n, (_, kind) in gpen_arch.state_dict_spec(infer_size(sd)).items()}
    out = OrderedDict()
    for name, v in sd.items():
        # the first axis longer than `distinct` (modulated conv weights are [1, O, C, k, k])
        axis = next((a for a, n in enumerate(v.shape) if n > distinct), None)
        if spec_kinds.get(name) == "param" and axis is not None:
            v = np.ascontiguousarray(np.take(v, np.arange(v.shape[axis]) % distinct, axis=axis))
        out[name] = v
    return out


# ---------------------------------------------------------------------------------------------
# checks and CLI


def sample_input(size: int, batch: int = 1, seed: int = 1) -> np.ndarray:
    """A smooth, image-like test input in [-1, 1] (seeded)."""
    rng = np.random.default_rng(seed)
    low = rng.uniform(-1, 1, (batch, 3, 8, 8))
    rep = size // 8
    x = np.repeat(np.repeat(low, rep, axis=2), rep, axis=3)
    x = 0.8 * x + 0.2 * rng.uniform(-1, 1, x.shape)
    return np.clip(x, -1, 1).astype(np.float32)


def emulate_fp16(model16: onnx.ModelProto, model32: onnx.ModelProto) -> onnx.ModelProto:
    """An fp32 model that rounds like the fp16 one would on a GPU: the fp32 graph with the
    fp16 model's float16 weights (rounded, kept float32) and a Cast float16 -> float32 round
    trip after every node whose output is float16 in the fp16 model (accumulation inside each
    op stays float32, as in cuDNN's fp16 convolutions). onnxruntime's CPU provider runs fp16
    ops by casting them to fp32 and drops the intermediate roundings, so running the fp16
    model on a CPU shows the weight rounding only; this shows the activation rounding too."""
    inferred = onnx.shape_inference.infer_shapes(model16)
    half = {vi.name for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT16}
    half |= {n.output[0] for n in model16.graph.node if n.op_type == "Cast"
             and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute)}
    half_inits = {i.name for i in model16.graph.initializer if i.data_type == TensorProto.FLOAT16}
    m = onnx.ModelProto()
    m.CopyFrom(model32)
    for init in m.graph.initializer:
        if init.name in half_inits:
            a = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    nodes = []
    renames = {}
    for node in m.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        nodes.append(node)
        out = node.output[0]
        if out in half and out != "output":
            h = helper.make_node("Cast", [out], [out + "/f16"], name=out + "/f16",
                                 to=TensorProto.FLOAT16)
            f = helper.make_node("Cast", [out + "/f16"], [out + "/r16"], name=out + "/r16",
                                 to=TensorProto.FLOAT)
            nodes += [h, f]
            renames[out] = out + "/r16"
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def session(model_or_path, threads: int = 2):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    data = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) \
        else model_or_path
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, choices=sorted(gpen_arch.CONFIGS),
                    help="GPEN-BFR size (inferred from --checkpoint when omitted)")
    ap.add_argument("--out", required=True, help="output .onnx path")
    ap.add_argument("--checkpoint", help="official GPEN-BFR-<size>.pth (else random weights)")
    ap.add_argument("--key", help="entry of the checkpoint holding the generator (e.g. g_ema)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--fp16", action="store_true", help="float16 weights/compute, float32 I/O")
    ap.add_argument("--template", choices=sorted(TEMPLATES), default="ffhq",
                    help="alignment template recorded in the metadata (default ffhq)")
    ap.add_argument("--compressible", type=int, metavar="K", default=0,
                    help="random weights only: repeat K distinct rows per tensor so the file "
                         "compresses ~100x (same speed; for shipping speed-test models)")
    ap.add_argument("--bytes", action="store_true",
                    help="byte I/O: uint8 levels in and out, the conversions in the graph "
                         "(see byte_io.py); a quarter of the bytes cross to the GPU each way")
    ap.add_argument("--narrow", type=float, metavar="W",
                    help="random weights only: this width factor instead of the size's official "
                         "one (e.g. 0.125 at 256: about a sixth of the official width's CPU a face; "
                         "the same structure, for tests that need a real GPEN's floats, not its cost)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the onnxruntime run on a sample input")
    args = ap.parse_args(argv)

    if args.compressible < 0 or (args.compressible and args.checkpoint):
        ap.error("--compressible K (K >= 1) is for random weights only, not with --checkpoint")
    if args.narrow is not None and (args.checkpoint or not 0 < args.narrow <= 1):
        ap.error("--narrow W (0 < W <= 1) is for random weights only, not with --checkpoint")
    t0 = time.time()
    if args.checkpoint:
        sd = unwrap_checkpoint(pth_io.load(args.checkpoint), args.key)
        size = infer_size(sd)
        if args.size and args.size != size:
            ap.error(f"--size {args.size} but the checkpoint is for size {size}")
        cm, nw = infer_config(sd, size)
        weights = f"checkpoint {os.path.basename(args.checkpoint)}"
    else:
        if not args.size:
            ap.error("--size is required without --checkpoint")
        size = args.size
        cm, nw = gpen_arch.config(size, None, args.narrow)
        sd = gpen_arch.random_state_dict(size, seed=args.seed, narrow=args.narrow)
        weights = "random weights: for speed only"
        if args.compressible:
            sd = make_compressible(sd, args.compressible)
            weights = (f"random weights, {args.compressible} distinct rows per tensor "
                       "(compressible): for speed only")
    counts = gpen_arch.count_parameters(size, cm, nw)
    meta = {
        "gpen_video.weights": weights,
        "gpen_video.model": f"GPEN-BFR-{size}",
        "gpen_video.size": size,
        "gpen_video.template": args.template,
        "gpen_video.template_points": json.dumps(TEMPLATES[args.template]),
        "gpen_video.io": "float32 NCHW RGB in [-1,1]; output not clamped",
        "gpen_video.precision": "fp16" if args.fp16 else "fp32",
        "gpen_video.parameters": counts["total"],
        "gpen_video.channel_multiplier": cm,
        "gpen_video.narrow": nw,
    }
    if not args.checkpoint:
        meta["gpen_video.seed"] = args.seed
    model = build_model(sd, size, cm, nw, fp16=args.fp16, metadata=meta)
    if args.bytes:
        model = byte_io.wrap(model)
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, args.out)
    print(f"GPEN-BFR-{size} (channel_multiplier={cm}, narrow={nw}), weights: {weights}")
    print(f"parameters: {counts['total']:,} ({counts['total'] / 1e6:.2f} M), including "
          f"{counts['noise_weights']} scalar NoiseInjection weights; buffers (blur kernels, "
          f"not counted): {counts['buffers']}")
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB, "
          f"{'fp16' if args.fp16 else 'fp32'}, opset {OPSET}) in {time.time() - t0:.1f} s")

    if not args.no_check:
        x = sample_input(size)
        if args.bytes:
            x = np.clip(np.round((x + 1.0) * 127.5), 0, 255).astype(np.uint8)
        y = session(args.out).run(["output"], {"input": x})[0]
        if args.bytes:
            y = y.astype(np.float32) / 127.5 - 1.0
        finite = bool(np.isfinite(y).all())
        print(f"sample output: finite={finite} min={y.min():.3f} max={y.max():.3f} "
              f"mean={y.mean():.3f} std={y.std():.3f} "
              f"(share in [-1,1]: {np.mean(np.abs(y) <= 1):.3f})")
        if not finite:
            print("error: non-finite output", file=sys.stderr)
            return 1
        if args.fp16:
            ref = build_model(sd, size, cm, nw, fp16=False)
            y32 = session(ref).run(["output"], {"input": x})[0]
            err = np.abs(y.astype(np.float64) - y32).max()
            print(f"fp16 vs fp32 on the sample input (onnxruntime CPU, which computes fp16 ops "
                  f"in fp32: weight rounding only): max abs error {err:.2e}, "
                  f"mean {np.abs(y - y32).mean():.2e}")
            ye = session(emulate_fp16(model, ref)).run(["output"], {"input": x})[0]
            err = np.abs(ye.astype(np.float64) - y32).max()
            print(f"fp16 vs fp32 with every fp16 activation rounded (GPU-like, emulated): "
                  f"max abs error {err:.2e}, mean {np.abs(ye - y32).mean():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
