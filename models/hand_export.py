"""Convert MediaPipe's two hand models (palm_detection_full.tflite, hand_landmark_full.tflite) to ONNX.

    python models/hand_export.py mediapipe-0.10.21-*.whl models/palm-detect.onnx models/hand-landmarks.onnx

In: the `mediapipe` 0.10.21 wheel (the files are taken from mediapipe/modules/palm_detection/
and mediapipe/modules/hand_landmark/; later wheels ship no .tflite files). Out: two ONNX models,
both NCHW float32 RGB in [0,1] with the batch dimension N free:

models/palm-detect.onnx, input `input` [N,3,192,192] (the whole frame letterboxed to a square,
keeping its aspect ratio, the border black, as MediaPipe feeds it), outputs:
  - `boxes` [N,2016,18]: raw regressors per anchor, in the 192-pixel input's pixels, relative to
    the anchor: box centre dx, dy, width, height, then 7 palm keypoints (dx, dy each: the wrist,
    the roots of the index, middle, ring and little fingers, and two on the thumb).
  - `scores` [N,2016,1]: the palm logit per anchor (sigmoid > 0.5 is a palm, MediaPipe's
    threshold; MediaPipe clips the logit to [-100, 100] first).
  - `anchors` [2016,2]: the anchor centres (x, y) in [0,1] of the input, the same for every
    frame: MediaPipe's SSD anchors for this model (4 layers, strides 8, 16, 16, 16, 2 anchors
    per cell of each layer, fixed size 1, offset 0.5): 24x24 cells x 2, then 12x12 cells x 6,
    row by row, the anchors of a cell one after another (`anchors()` below).
  Decoding, as MediaPipe's TensorsToDetectionsCalculator does: centre x = boxes[0] / 192 +
  anchor x, centre y = boxes[1] / 192 + anchor y, width = boxes[2] / 192, height = boxes[3] /
  192, keypoint j = (boxes[4 + 2j] / 192 + anchor x, boxes[5 + 2j] / 192 + anchor y), all in
  [0,1] of the letterboxed input; then non-maximum suppression (MediaPipe's: weighted, IoU 0.3).

models/hand-landmarks.onnx, input `input` [N,3,224,224] (a square crop round one hand, rotated
so that the wrist-to-middle-finger line points up, as MediaPipe cuts it from the palm's box:
2.6 times the box, shifted by half its height towards the fingers), outputs:
  - `landmarks` [N,63]: 21 points x (x, y, z), x and y in the 224-pixel crop's pixels, z a
    relative depth on the same scale (the wrist about 0, smaller is nearer the camera). The
    points: 0 wrist; 1-4 thumb; 5-8 index; 9-12 middle; 13-16 ring; 17-20 little finger (each
    finger from its root to its tip).
  - `presence` [N,1]: the hand-presence probability (a sigmoid already applied, unlike the face
    mesh's logit; MediaPipe drops a hand below 0.5).
  - `handedness` [N,1]: the handedness probability (a sigmoid already applied), which MediaPipe
    reads against its handedness.txt (Left, Right) on a mirrored (selfie) image.
  - `world` [N,63]: the same 21 points in metres round the hand's centre (MediaPipe's world
    landmarks).

Operators, each written to ONNX by models/tflite_onnx.py: palm detection uses DEQUANTIZE,
CONV_2D, DEPTHWISE_CONV_2D, PRELU, ADD, MAX_POOL_2D, PAD (of channels), RESIZE_BILINEAR (2x
upsampling, half-pixel centres), RESHAPE (NHWC maps to rows of anchors) and CONCATENATION; the
hand landmarks use DEQUANTIZE, CONV_2D and DEPTHWISE_CONV_2D (with fused RELU6), ADD, MEAN
(global average pooling), FULLY_CONNECTED and LOGISTIC. The last five of those were added for
these models; the face mesh's seven were there before.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tflite_onnx import Graph, read  # noqa: E402

PALM = "mediapipe/modules/palm_detection/palm_detection_full.tflite"
HAND = "mediapipe/modules/hand_landmark/hand_landmark_full.tflite"
# MediaPipe's SSD anchor options for palm_detection_full (its palm detection graph).
STRIDES = (8, 16, 16, 16)
ANCHORS_PER_LAYER = 2  # aspect ratio 1.0 and the interpolated scale's anchor
# What the set-up checks to convert again a model an older converter wrote.
EXPORT = "1: first conversion"


def anchors(size: int = 192) -> np.ndarray:
    """The palm detector's anchor centres [2016,2] (x, y in [0,1]), in the model's output order:
    consecutive layers of one stride share a grid, each adding its anchors to every cell."""
    out = []
    i = 0
    while i < len(STRIDES):
        stride, per_cell = STRIDES[i], 0
        while i < len(STRIDES) and STRIDES[i] == stride:
            per_cell += ANCHORS_PER_LAYER
            i += 1
        cells = -(-size // stride)
        for y in range(cells):
            for x in range(cells):
                out.extend([((x + 0.5) / cells, (y + 0.5) / cells)] * per_cell)
    return np.array(out, np.float32)


def finish(gr: Graph, outputs: list, name: str, meta: dict) -> onnx.ModelProto:
    """The ONNX model of a converted graph: `outputs` lists (ONNX name, TFLite tensor or None for
    a node already written, shape)."""
    c0, h0, w0 = gr.input_chw
    # The graph input is the model's NHWC input, read from NCHW.
    gr.nodes.insert(0, helper.make_node("Identity", ["input"], [gr.name(gr.in_idx)]))
    infos = []
    for onnx_name, t, dims in outputs:
        if t is not None:
            gr.nodes.append(helper.make_node("Identity", [gr.name(t)], [onnx_name]))
        infos.append(helper.make_tensor_value_info(onnx_name, TensorProto.FLOAT, dims))
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", c0, h0, w0])
    graph = helper.make_graph(gr.nodes, name, [x], infos, initializer=gr.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    m.producer_name = "gpen-video hand_export.py"
    for key, value in {**meta, "gpen_video.export": EXPORT}.items():
        e = m.metadata_props.add()
        e.key, e.value = key, value
    onnx.checker.check_model(m)
    return m


def convert_palm(data: bytes) -> onnx.ModelProto:
    gr = Graph(data)
    gr.convert()
    by_name = gr.outputs()
    n = len(anchors())
    gr.nodes.append(helper.make_node("Constant", [], ["anchors"], value=numpy_helper.from_array(anchors(), "anchors")))
    return finish(gr, [("boxes", by_name["Identity"], ["N", n, 18]), ("scores", by_name["Identity_1"], ["N", n, 1]),
                       ("anchors", None, [n, 2])], "palm_detection", {
        "gpen_video.kind": "palm detector",
        "gpen_video.source": "MediaPipe palm_detection_full.tflite (Apache-2.0), converted op by op",
        "gpen_video.input": "[N,3,192,192] RGB in [0,1], the frame letterboxed",
        "gpen_video.outputs": "boxes [N,2016,18] raw (dx,dy,w,h + 7 keypoints, input pixels, from the anchor); "
                              "scores [N,2016,1] logit; anchors [2016,2] centres in [0,1]",
    })


def convert_hand(data: bytes) -> onnx.ModelProto:
    gr = Graph(data)
    gr.convert()
    by_name = gr.outputs()
    return finish(gr, [("landmarks", by_name["Identity"], ["N", 63]), ("presence", by_name["Identity_1"], ["N", 1]),
                       ("handedness", by_name["Identity_2"], ["N", 1]), ("world", by_name["Identity_3"], ["N", 63])],
                  "hand_landmark", {
        "gpen_video.kind": "hand landmarks",
        "gpen_video.source": "MediaPipe hand_landmark_full.tflite (Apache-2.0), converted op by op",
        "gpen_video.input": "[N,3,224,224] RGB in [0,1], a crop round one hand, fingers up",
        "gpen_video.outputs": "landmarks [N,63] (21 x (x,y,z), crop pixels); presence [N,1] probability; "
                              "handedness [N,1] probability; world [N,63] metres",
    })


def write(m: onnx.ModelProto, dst: str) -> None:
    """Writes the model unless the file already holds exactly it."""
    data = m.SerializeToString()
    try:
        with open(dst, "rb") as f:
            if f.read() == data:
                return
    except FileNotFoundError:
        pass
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dst)


def main(src: str, palm_dst: str, hand_dst: str) -> None:
    write(convert_palm(read(src, PALM)), palm_dst)
    write(convert_hand(read(src, HAND)), hand_dst)


if __name__ == "__main__":
    if len(sys.argv) != 4 or not sys.argv[1].endswith(".whl"):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
