"""Convert a float TFLite graph (MediaPipe's models) to ONNX nodes, operator by operator.

In: the bytes of a .tflite file (one subgraph, float32 or float16 weights, NHWC activations).
Out: `Graph`, whose `convert()` fills `nodes` and `inits` (onnx.helper nodes and initialisers)
for every operator, each tensor i named `t{i}`; the caller names the graph's outputs and writes
the model (models/mesh_export.py, models/hand_export.py).

The operators written here, with numpy + onnx (the weights read from the flatbuffer with the
`tflite` package): DEQUANTIZE (float16 weights -> float32 constants), CONV_2D, DEPTHWISE_CONV_2D
(grouped Conv), PRELU (as Relu and depthwise 1x1 Convs, which ONNX Runtime fuses), ADD,
MAX_POOL_2D, PAD, RESIZE_BILINEAR (Resize, linear), RESHAPE, CONCATENATION, MEAN (ReduceMean),
FULLY_CONNECTED (Gemm) and LOGISTIC (Sigmoid); fused RELU and RELU6 activations.
TFLite's tensors are NHWC; the ONNX graph keeps 4-D activations NCHW throughout (weights
transposed once, a RESHAPE of a 4-D tensor reads it back in NHWC order), with TFLite's SAME
padding written out as explicit, possibly asymmetric, pads. The batch dimension stays free.
"""
from __future__ import annotations

import zipfile

import numpy as np
import tflite
from onnx import helper, numpy_helper

OPS = {getattr(tflite.BuiltinOperator, n): n for n in dir(tflite.BuiltinOperator) if not n.startswith("_")}
# NHWC axis -> NCHW axis of a 4-D activation.
NCHW_AXIS = {0: 0, 1: 2, 2: 3, 3: 1}


def read(src: str, member: str) -> bytes:
    """The .tflite file `member` from a wheel, or the file `src` itself."""
    if src.endswith(".whl"):
        with zipfile.ZipFile(src) as z:
            return z.read(member)
    with open(src, "rb") as f:
        return f.read()


def same_pads(in_hw, k_hw, stride_hw, dil_hw=(1, 1)):
    """TFLite SAME padding as ONNX pads [top, left, bottom, right]."""
    pads_begin, pads_end = [], []
    for i, k, s, d in zip(in_hw, k_hw, stride_hw, dil_hw):
        out = -(-i // s)
        ke = (k - 1) * d + 1
        total = max((out - 1) * s + ke - i, 0)
        pads_begin.append(total // 2)
        pads_end.append(total - total // 2)
    return pads_begin + pads_end


def operators(data: bytes) -> dict[str, int]:
    """How many of each TFLite operator the model uses."""
    model = tflite.Model.GetRootAsModel(data, 0)
    g = model.Subgraphs(0)
    count: dict[str, int] = {}
    for k in range(g.OperatorsLength()):
        code = model.OperatorCodes(g.Operators(k).OpcodeIndex())
        kind = OPS[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        count[kind] = count.get(kind, 0) + 1
    return count


class Graph:
    """One TFLite subgraph on its way to ONNX: `convert()` writes `nodes` and `inits`."""

    def __init__(self, data: bytes):
        self.model = tflite.Model.GetRootAsModel(data, 0)
        if self.model.SubgraphsLength() != 1:
            raise SystemExit("expected one subgraph")
        self.g = self.model.Subgraphs(0)
        self.nodes: list = []
        self.inits: list = []
        self.consts: dict = {}
        self.after: list = []
        self.hw: dict = {}  # tensor -> (H, W) of NHWC activations
        self.in_idx = self.g.Inputs(0)
        _, h0, w0, c0 = (int(v) for v in self.shape(self.in_idx))
        self.input_chw = (c0, h0, w0)
        self.hw[self.in_idx] = (h0, w0)

    def tensor(self, i):
        return self.g.Tensors(i)

    @staticmethod
    def name(i) -> str:
        return f"t{i}"

    def shape(self, i):
        return list(self.tensor(i).ShapeAsNumpy())

    def outputs(self) -> dict[str, int]:
        """The graph's outputs, by their TFLite names."""
        outs = [self.g.Outputs(i) for i in range(self.g.OutputsLength())]
        return {self.tensor(i).Name().decode(): i for i in outs}

    def const_of(self, i):
        """The constant value of tensor i (float16 buffers as float32), or None."""
        if i in self.consts:
            return self.consts[i]
        t = self.tensor(i)
        buf = self.model.Buffers(t.Buffer()).DataAsNumpy()
        if isinstance(buf, int) or buf is None or len(buf) == 0:
            return None
        dtype = {tflite.TensorType.FLOAT32: np.float32, tflite.TensorType.FLOAT16: np.float16,
                 tflite.TensorType.INT32: np.int32}[t.Type()]
        v = np.frombuffer(buf.tobytes(), dtype=dtype).reshape(self.shape(i))
        self.consts[i] = v.astype(np.float32) if dtype == np.float16 else v
        return self.consts[i]

    def init(self, nm, arr):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def act(self, out, fused, k):
        """The name the operator itself writes to, its fused activation writing `out` (the
        activation's node goes after the operator's, in `after`)."""
        if fused == tflite.ActivationFunctionType.NONE:
            return out
        if fused == tflite.ActivationFunctionType.RELU:
            self.after.append(helper.make_node("Relu", [out + "_pre"], [out]))
        elif fused == tflite.ActivationFunctionType.RELU6:
            lo = self.init(f"lo{k}", np.array(0.0, np.float32))
            hi = self.init(f"hi{k}", np.array(6.0, np.float32))
            self.after.append(helper.make_node("Clip", [out + "_pre", lo, hi], [out]))
        else:
            raise SystemExit(f"fused activation {fused} not handled")
        return out + "_pre"

    def options(self, op, cls):
        p = cls()
        opts = op.BuiltinOptions()
        p.Init(opts.Bytes, opts.Pos)
        return p

    def convert(self) -> None:
        for k in range(self.g.OperatorsLength()):
            self.after = []
            self.operator(k)
            self.nodes.extend(self.after)

    def operator(self, k) -> None:
        g, name, nodes = self.g, self.name, self.nodes
        op = g.Operators(k)
        code = self.model.OperatorCodes(op.OpcodeIndex())
        kind = OPS[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        ins, outs = list(op.InputsAsNumpy()), list(op.OutputsAsNumpy())
        o = outs[0]
        if kind == "DEQUANTIZE":
            self.consts[o] = self.const_of(ins[0])
            return
        x = name(ins[0])
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            p = self.options(op, tflite.Conv2DOptions if kind == "CONV_2D" else tflite.DepthwiseConv2DOptions)
            w = self.const_of(ins[1])
            b = self.const_of(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
            if kind == "CONV_2D":
                wt = w.transpose(0, 3, 1, 2)  # OHWI -> OIHW
                group = 1
            else:
                # 1 x H x W x (C*mult) -> (C*mult) x 1 x H x W, one group per input channel.
                wt = w.transpose(3, 0, 1, 2)
                group = self.shape(ins[0])[3]
            kh, kw = wt.shape[2], wt.shape[3]
            stride = (p.StrideH(), p.StrideW())
            dil = (p.DilationHFactor() or 1, p.DilationWFactor() or 1)
            if p.Padding() == tflite.Padding.SAME:
                pads = same_pads(self.hw[ins[0]], (kh, kw), stride, dil)
            else:
                pads = [0, 0, 0, 0]
            inputs = [x, self.init(f"w{k}", wt)]
            if b is not None:
                inputs.append(self.init(f"b{k}", b))
            out = self.act(name(o), p.FusedActivationFunction(), k)
            nodes.append(helper.make_node("Conv", inputs, [out], kernel_shape=[int(kh), int(kw)],
                                          strides=[int(v) for v in stride], dilations=[int(v) for v in dil],
                                          pads=[int(v) for v in pads], group=int(group)))
        elif kind == "PRELU":
            # PReLU(x) = Relu(x) + (-a) * Relu(-x), the products as depthwise 1x1 convolutions:
            # ONNX Runtime keeps those in its blocked layout and fuses the Relu and the Add into
            # them, where its PRelu took 60 % of the face mesh's time with the layout changes
            # around it (2.6x faster on one CPU thread; the same values within float rounding).
            alpha = self.const_of(ins[1]).reshape(-1)  # [1,1,C] -> [C]
            c = alpha.size
            neg = self.init(f"n{k}", -np.ones((c, 1, 1, 1), np.float32))
            scale = self.init(f"a{k}", (-alpha).astype(np.float32).reshape(c, 1, 1, 1))
            pos, flipped, below = f"{name(o)}_pos", f"{name(o)}_neg", f"{name(o)}_below"
            nodes.append(helper.make_node("Relu", [x], [pos]))
            nodes.append(helper.make_node("Conv", [x, neg], [flipped + "_c"], kernel_shape=[1, 1], group=c))
            nodes.append(helper.make_node("Relu", [flipped + "_c"], [flipped]))
            nodes.append(helper.make_node("Conv", [flipped, scale], [below], kernel_shape=[1, 1], group=c))
            nodes.append(helper.make_node("Add", [pos, below], [name(o)]))
        elif kind == "ADD":
            p = self.options(op, tflite.AddOptions)
            out = self.act(name(o), p.FusedActivationFunction(), k)
            other = self.const_of(ins[1])
            y = name(ins[1]) if other is None else self.init(f"c{k}", other.transpose(0, 3, 1, 2))
            nodes.append(helper.make_node("Add", [x, y], [out]))
        elif kind == "MAX_POOL_2D":
            p = self.options(op, tflite.Pool2DOptions)
            kh, kw = p.FilterHeight(), p.FilterWidth()
            stride = (p.StrideH(), p.StrideW())
            pads = same_pads(self.hw[ins[0]], (kh, kw), stride) if p.Padding() == tflite.Padding.SAME else [0] * 4
            out = self.act(name(o), p.FusedActivationFunction(), k)
            nodes.append(helper.make_node("MaxPool", [x], [out], kernel_shape=[int(kh), int(kw)],
                                          strides=[int(v) for v in stride], pads=[int(v) for v in pads]))
        elif kind == "PAD":
            pads = self.const_of(ins[1])  # [4,2] NHWC (before, after)
            n_, h_, w_, c_ = pads
            onnx_pads = [int(v) for v in (n_[0], c_[0], h_[0], w_[0], n_[1], c_[1], h_[1], w_[1])]
            nodes.append(helper.make_node("Pad", [x, self.init(f"p{k}", np.array(onnx_pads, np.int64))], [name(o)]))
        elif kind == "RESIZE_BILINEAR":
            p = self.options(op, tflite.ResizeBilinearOptions)
            (h, w), (oh, ow) = self.hw[ins[0]], (int(v) for v in self.const_of(ins[1]))
            if p.AlignCorners():
                mode = "align_corners"
            elif p.HalfPixelCenters():
                mode = "half_pixel"
            else:
                mode = "asymmetric"
            # Scales rather than sizes, so that the batch dimension stays free.
            scales = self.init(f"s{k}", np.array([1, 1, oh / h, ow / w], np.float32))
            nodes.append(helper.make_node("Resize", [x, "", scales], [name(o)], mode="linear",
                                          coordinate_transformation_mode=mode))
        elif kind == "RESHAPE":
            src, dst = self.shape(ins[0]), [int(v) for v in self.shape(o)]
            if len(dst) == 4:
                raise SystemExit("a RESHAPE to 4-D is not handled")
            if len(src) == 4:
                # TFLite reads the tensor in NHWC order.
                nodes.append(helper.make_node("Transpose", [x], [x + "_nhwc"], perm=[0, 2, 3, 1]))
                x = x + "_nhwc"
            # 0 keeps the batch dimension as it comes.
            target = self.init(f"r{k}", np.array([0] + dst[1:], np.int64))
            nodes.append(helper.make_node("Reshape", [x, target], [name(o)]))
        elif kind == "CONCATENATION":
            p = self.options(op, tflite.ConcatenationOptions)
            rank = len(self.shape(o))
            axis = p.Axis() % rank
            if rank == 4:
                axis = NCHW_AXIS[axis]
            out = self.act(name(o), p.FusedActivationFunction(), k)
            nodes.append(helper.make_node("Concat", [name(i) for i in ins], [out], axis=int(axis)))
        elif kind == "MEAN":
            p = self.options(op, tflite.ReducerOptions)
            axes = [int(a) % 4 for a in self.const_of(ins[1]).reshape(-1)]
            if len(self.shape(ins[0])) != 4 or sorted(axes) != [1, 2]:
                raise SystemExit("only a MEAN over a 4-D tensor's height and width is handled")
            nodes.append(helper.make_node("ReduceMean", [x], [name(o)], axes=[2, 3],
                                          keepdims=1 if p.KeepDims() else 0))
        elif kind == "FULLY_CONNECTED":
            p = self.options(op, tflite.FullyConnectedOptions)
            if len(self.shape(ins[0])) != 2 or p.KeepNumDims():
                raise SystemExit("only a FULLY_CONNECTED on a 2-D input is handled")
            w = self.const_of(ins[1])  # [out, in]
            b = self.const_of(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
            inputs = [x, self.init(f"w{k}", w)]
            if b is not None:
                inputs.append(self.init(f"b{k}", b))
            out = self.act(name(o), p.FusedActivationFunction(), k)
            nodes.append(helper.make_node("Gemm", inputs, [out], transB=1))
        elif kind == "LOGISTIC":
            nodes.append(helper.make_node("Sigmoid", [x], [name(o)]))
        else:
            raise SystemExit(f"operator {kind} not handled")
        s = self.shape(o)
        if len(s) == 4:
            self.hw[o] = (int(s[1]), int(s[2]))
