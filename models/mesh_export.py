"""Convert MediaPipe's face landmark model (face_landmark.tflite, 468 points) to ONNX.

    python models/mesh_export.py mediapipe-0.10.21-*.whl models/face-mesh.onnx
    python models/mesh_export.py face_landmark.tflite models/face-mesh.onnx

In: the `mediapipe` wheel (the file is taken from mediapipe/modules/face_landmark/) or the
.tflite file itself. Out: an ONNX model with input `input` float32 [N,3,192,192] (RGB in [0,1],
NCHW, N free) and outputs `landmarks` [N,1404] (468 points x (x, y, z) in the 192-pixel crop's
pixels) and `presence` [N,1] (the face-presence logit: sigmoid > 0.5 is a face).

The graph uses seven TFLite operators, each written to ONNX by models/tflite_onnx.py (numpy +
onnx, the weights read from the flatbuffer with the `tflite` package): DEQUANTIZE (float16
weights -> float32 constants), CONV_2D, DEPTHWISE_CONV_2D (grouped Conv), PRELU (as Relu and
depthwise 1x1 Convs, which ONNX Runtime fuses), ADD, MAX_POOL_2D and PAD.
TFLite's tensors are NHWC; the ONNX graph is NCHW throughout (weights transposed once), with
TFLite's SAME padding written out as explicit, possibly asymmetric, pads.
"""
from __future__ import annotations

import os
import sys

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tflite_onnx import Graph, read as read_member  # noqa: E402

MEMBER = "mediapipe/modules/face_landmark/face_landmark.tflite"


def read(src: str) -> bytes:
    return read_member(src, MEMBER)


def convert(data: bytes) -> onnx.ModelProto:
    gr = Graph(data)
    gr.convert()
    nodes, inits, name = gr.nodes, gr.inits, gr.name
    in_idx = gr.in_idx
    c0, h0, w0 = gr.input_chw
    by_name = gr.outputs()
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
    os.replace(tmp, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
