"""Convert MediaPipe's face landmark model (face_landmark.tflite, 468 points) to ONNX.

    python models/mesh_export.py mediapipe-0.10.21-*.whl models/face-mesh.onnx
    python models/mesh_export.py face_landmark.tflite models/face-mesh.onnx

In: the `mediapipe` wheel (the file is taken from mediapipe/modules/face_landmark/) or the
.tflite file itself. Out: an ONNX model with input `input` float32 [N,3,192,192] (RGB in [0,1],
NCHW, N free) and outputs `landmarks` [N,1404] (468 points x (x, y, z) in the 192-pixel crop's
pixels) and `presence` [N,1] (the face-presence logit: sigmoid > 0.5 is a face).

The graph uses seven TFLite operators, each written here with onnx.helper (numpy + onnx, the
weights read from the flatbuffer with the `tflite` package): DEQUANTIZE (float16 weights ->
float32 constants), CONV_2D, DEPTHWISE_CONV_2D (grouped Conv), PRELU (as Relu and depthwise 1x1
Convs, which ONNX Runtime fuses), ADD, MAX_POOL_2D and PAD.
TFLite's tensors are NHWC; the ONNX graph is NCHW throughout (weights transposed once), with
TFLite's SAME padding written out as explicit, possibly asymmetric, pads.
"""
from __future__ import annotations

import sys
import zipfile

import numpy as np
import onnx
import tflite
from onnx import TensorProto, helper, numpy_helper

MEMBER = "mediapipe/modules/face_landmark/face_landmark.tflite"
OPS = {getattr(tflite.BuiltinOperator, n): n for n in dir(tflite.BuiltinOperator) if not n.startswith("_")}
ACT = {0: None, 1: "Relu"}


def read(src: str) -> bytes:
    if src.endswith(".whl"):
        with zipfile.ZipFile(src) as z:
            return z.read(MEMBER)
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


def convert(data: bytes) -> onnx.ModelProto:
    model = tflite.Model.GetRootAsModel(data, 0)
    if model.SubgraphsLength() != 1:
        raise SystemExit("expected one subgraph")
    g = model.Subgraphs(0)

    def tensor(i):
        return g.Tensors(i)

    def name(i):
        return f"t{i}"

    def shape(i):
        return list(tensor(i).ShapeAsNumpy())

    consts = {}

    def const_of(i):
        """The constant value of tensor i (float16 buffers as float32), or None."""
        if i in consts:
            return consts[i]
        t = tensor(i)
        buf = model.Buffers(t.Buffer()).DataAsNumpy()
        if isinstance(buf, int) or buf is None or len(buf) == 0:
            return None
        dtype = {tflite.TensorType.FLOAT32: np.float32, tflite.TensorType.FLOAT16: np.float16,
                 tflite.TensorType.INT32: np.int32}[t.Type()]
        v = np.frombuffer(buf.tobytes(), dtype=dtype).reshape(shape(i))
        consts[i] = v.astype(np.float32) if dtype == np.float16 else v
        return consts[i]

    nodes, inits = [], []
    hw = {}  # tensor -> (H, W) of NHWC activations
    in_idx = g.Inputs(0)
    _, h0, w0, c0 = (int(v) for v in shape(in_idx))
    hw[in_idx] = (h0, w0)

    def init(nm, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def act(out, fused):
        if fused == 0:
            return out
        if fused not in ACT:
            raise SystemExit(f"fused activation {fused} not handled")
        nodes.append(helper.make_node(ACT[fused], [out + "_pre"], [out]))
        return out + "_pre"

    for k in range(g.OperatorsLength()):
        op = g.Operators(k)
        code = model.OperatorCodes(op.OpcodeIndex())
        kind = OPS[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        ins, outs = list(op.InputsAsNumpy()), list(op.OutputsAsNumpy())
        o = outs[0]
        opts = op.BuiltinOptions()
        if kind == "DEQUANTIZE":
            consts[o] = const_of(ins[0])
            continue
        x = name(ins[0])
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            if kind == "CONV_2D":
                p = tflite.Conv2DOptions()
            else:
                p = tflite.DepthwiseConv2DOptions()
            p.Init(opts.Bytes, opts.Pos)
            w = const_of(ins[1])
            b = const_of(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
            if kind == "CONV_2D":
                wt = w.transpose(0, 3, 1, 2)  # OHWI -> OIHW
                group = 1
            else:
                # 1 x H x W x (C*mult) -> (C*mult) x 1 x H x W, one group per input channel.
                wt = w.transpose(3, 0, 1, 2)
                group = shape(ins[0])[3]
            kh, kw = wt.shape[2], wt.shape[3]
            stride = (p.StrideH(), p.StrideW())
            dil = (p.DilationHFactor() or 1, p.DilationWFactor() or 1)
            in_hw = hw[ins[0]]
            if p.Padding() == tflite.Padding.SAME:
                pads = same_pads(in_hw, (kh, kw), stride, dil)
            else:
                pads = [0, 0, 0, 0]
            inputs = [x, init(f"w{k}", wt)]
            if b is not None:
                inputs.append(init(f"b{k}", b))
            out = act(name(o), p.FusedActivationFunction())
            nodes.append(helper.make_node("Conv", inputs, [out], kernel_shape=[int(kh), int(kw)], strides=[int(v) for v in stride],
                                          dilations=[int(v) for v in dil], pads=[int(v) for v in pads], group=int(group)))
        elif kind == "PRELU":
            # PReLU(x) = Relu(x) + (-a) * Relu(-x), the products as depthwise 1x1 convolutions:
            # ONNX Runtime keeps those in its blocked layout and fuses the Relu and the Add into
            # them, where its PRelu took 60 % of the model's time with the layout changes
            # around it (2.6x faster on one CPU thread; the same values within float rounding).
            alpha = const_of(ins[1]).reshape(-1)  # [1,1,C] -> [C]
            c = alpha.size
            neg = init(f"n{k}", -np.ones((c, 1, 1, 1), np.float32))
            scale = init(f"a{k}", (-alpha).astype(np.float32).reshape(c, 1, 1, 1))
            pos, flipped, below = f"{name(o)}_pos", f"{name(o)}_neg", f"{name(o)}_below"
            nodes.append(helper.make_node("Relu", [x], [pos]))
            nodes.append(helper.make_node("Conv", [x, neg], [flipped + "_c"], kernel_shape=[1, 1], group=c))
            nodes.append(helper.make_node("Relu", [flipped + "_c"], [flipped]))
            nodes.append(helper.make_node("Conv", [flipped, scale], [below], kernel_shape=[1, 1], group=c))
            nodes.append(helper.make_node("Add", [pos, below], [name(o)]))
        elif kind == "ADD":
            p = tflite.AddOptions()
            p.Init(opts.Bytes, opts.Pos)
            out = act(name(o), p.FusedActivationFunction())
            other = const_of(ins[1])
            y = name(ins[1]) if other is None else init(f"c{k}", other.transpose(0, 3, 1, 2))
            nodes.append(helper.make_node("Add", [x, y], [out]))
        elif kind == "MAX_POOL_2D":
            p = tflite.Pool2DOptions()
            p.Init(opts.Bytes, opts.Pos)
            kh, kw = p.FilterHeight(), p.FilterWidth()
            stride = (p.StrideH(), p.StrideW())
            pads = same_pads(hw[ins[0]], (kh, kw), stride) if p.Padding() == tflite.Padding.SAME else [0] * 4
            out = act(name(o), p.FusedActivationFunction())
            nodes.append(helper.make_node("MaxPool", [x], [out], kernel_shape=[int(kh), int(kw)],
                                          strides=[int(v) for v in stride], pads=[int(v) for v in pads]))
        elif kind == "PAD":
            pads = const_of(ins[1])  # [4,2] NHWC (before, after)
            n_, h_, w_, c_ = pads
            onnx_pads = [int(v) for v in (n_[0], c_[0], h_[0], w_[0], n_[1], c_[1], h_[1], w_[1])]
            nodes.append(helper.make_node("Pad", [x, init(f"p{k}", np.array(onnx_pads, np.int64))], [name(o)]))
        else:
            raise SystemExit(f"operator {kind} not handled")
        s = shape(o)
        if len(s) == 4:
            hw[o] = (int(s[1]), int(s[2]))

    outs = [g.Outputs(i) for i in range(g.OutputsLength())]
    by_name = {tensor(i).Name().decode(): i for i in outs}
    lm, pr = by_name["conv2d_21"], by_name["conv2d_31"]
    nodes.append(helper.make_node("Flatten", [name(lm)], ["landmarks"], axis=1))
    nodes.append(helper.make_node("Flatten", [name(pr)], ["presence"], axis=1))
    # The graph input is the model's NHWC input, read from NCHW.
    nodes.insert(0, helper.make_node("Identity", ["input"], [name(in_idx)]))
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", c0, h0, w0])
    y1 = helper.make_tensor_value_info("landmarks", TensorProto.FLOAT, ["N", 1404])
    y2 = helper.make_tensor_value_info("presence", TensorProto.FLOAT, ["N", 1])
    graph = helper.make_graph(nodes, "face_mesh", [x], [y1, y2], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    m.producer_name = "gpen-video mesh_export.py"
    for key, value in {
        "gpen_video.kind": "face mesh",
        "gpen_video.source": "MediaPipe face_landmark.tflite (Apache-2.0), converted op by op",
        "gpen_video.input": "[N,3,192,192] RGB in [0,1]",
        "gpen_video.outputs": "landmarks [N,1404] (468 x (x,y,z), crop pixels); presence [N,1] logit",
        # What the set-up checks to convert again a model an older converter wrote.
        "gpen_video.export": "2: PReLU as Relu and depthwise 1x1 convolutions",
    }.items():
        e = m.metadata_props.add()
        e.key, e.value = key, value
    onnx.checker.check_model(m)
    return m


def main(src: str, dst: str) -> None:
    m = convert(read(src))
    data = m.SerializeToString()
    try:
        if open(dst, "rb").read() == data:
            return
    except FileNotFoundError:
        pass
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    import os
    os.replace(tmp, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
