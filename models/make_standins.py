"""Stand-in enhancers with GPEN's I/O contract, a few KB each (no weights worth the name).

In: an output folder. Out: ONNX files whose input `input` and output `output` are float32
[N,3,S,S] in [-1,1], like GPEN-BFR:
  identity-512.onnx / identity-256.onnx  a 1x1 convolution with the identity matrix (dynamic batch)
  negate-512.onnx / negate-256.onnx       y = -x: a known, visible change (colours inverted)
  texture-256.onnx                        y = x + 0.15 sin(40 x): noise-sensitive detail (flickers
                                          on a still, noisy face, like a GAN's)
  stable-256.onnx                         y = 0.95 x + 0.03: a change smooth in the input (stable)
  identity-512-batch1.onnx                identity with the batch fixed at 1 (like the official export)
  bad-shape.onnx                          input [N,3,512,256]: not square, must be refused
  nan-256.onnx                            y = (x - x) / (x - x): NaN everywhere (a broken model)
  half-output-256.onnx                    output float16 instead of float32: must be refused
  identity-512-bytes.onnx / negate-256-bytes.onnx  identity and negate with byte I/O (uint8
                                          levels in and out, the conversions in the graph: see
                                          byte_io.py)
  codeformer-512.onnx                     CodeFormer's contract (facefusion's codeformer.onnx):
                                          inputs `input` float32 [1,3,512,512] and `weight` float64
                                          [1] (the fidelity), outputs `logits` [1,256,1024],
                                          `output` [1,3,512,512] and `lq_feat` [1,256,16,16] (the
                                          image output second here, so it is found by its shape);
                                          y = x (1 - 2 w): fidelity 0 gives the input back, 1
                                          negates it
  cast-sharpen-256.onnx                   y = x + 0.6 (x - blur3x3(x)) + 20 levels of red: a restorer
                                          that casts colour and sharpens (one depthwise Conv)
  blur-256.onnx                           y = a 5x5 box blur of x: a restorer that loses detail
  person-256.onnx (made on request: `person RAW OUT`)  y = one fixed face whatever the input:
                                          a restorer that returns another real person's aligned
                                          face (RAW: that face as planar RGB24 bytes at 256,
                                          written by the test that asks for it)
  person-fidelity-256.onnx (on request: `person-fidelity RAW OUT`)  y = w x + (1 - w) face, with
                                          CodeFormer's `weight` input (float64 [1]): another
                                          person's face at fidelity 0, the input itself at 1
Files of the contracts of facefusion's enhancers, batch fixed at 1 as those files declare it
(input `input` float32 [1,3,S,S]; the image output first, or the one shaped like the input):
  ff-gfpgan-512.onnx                      GFPGAN 1.2/1.3/1.4's: y = 0.6 x - 0.2
  ff-gpen-bfr-256.onnx                    GPEN-BFR's: y = -x through Reshape to [1,3,S*S] and back
                                          (constant shapes that name the batch: a symbolic batch
                                          needs them freed)
  ff-restoreformer-512.onnx               RestoreFormer++'s: y = 0.5 x, its output named `1233`
                                          (as a traced export names it)
  ff-tied-256.onnx                        a graph that ties its batch to 1 (Reshape to [3,S,S],
                                          Neg, Unsqueeze): a symbolic batch must be refused
  plain-512-batch1.onnx                   GPEN's contract with the work of codeformer-512.onnx at
                                          its default fidelity (y = x (1 - 2 * 0.5), the two
                                          extra outputs as zeros): the pair measures what the
                                          weight input costs
Each file's metadata says it is a stand-in, so nobody mistakes it for a restorer.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from byte_io import save, wrap  # noqa: E402


def build(name: str, kind: str, size: int, batch="N", width=None) -> onnx.ModelProto:
    width = width or size
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, width])
    out_type = TensorProto.FLOAT16 if kind == "half-output" else TensorProto.FLOAT
    y = helper.make_tensor_value_info("output", out_type, [batch, 3, size, width])
    inits, nodes = [], []
    if kind == "identity":
        w = np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1)
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("Conv", ["input", "w"], ["output"], kernel_shape=[1, 1]))
    elif kind == "negate":
        nodes.append(helper.make_node("Neg", ["input"], ["output"]))
    elif kind == "texture":
        # y = x + 0.15 sin(40 x): detail that follows every small change of the input, as a
        # GAN's invented texture does on a noisy face (it differs from frame to frame).
        inits.append(numpy_helper.from_array(np.array(40.0, np.float32), "freq"))
        inits.append(numpy_helper.from_array(np.array(0.15, np.float32), "amp"))
        nodes.append(helper.make_node("Mul", ["input", "freq"], ["phase"]))
        nodes.append(helper.make_node("Sin", ["phase"], ["wave"]))
        nodes.append(helper.make_node("Mul", ["wave", "amp"], ["detail"]))
        nodes.append(helper.make_node("Add", ["input", "detail"], ["output"]))
    elif kind == "stable":
        # y = 0.95 x + 0.03: a change smooth in the input (stable from frame to frame).
        inits.append(numpy_helper.from_array(np.array(0.95, np.float32), "gain"))
        inits.append(numpy_helper.from_array(np.array(0.03, np.float32), "lift"))
        nodes.append(helper.make_node("Mul", ["input", "gain"], ["scaled"]))
        nodes.append(helper.make_node("Add", ["scaled", "lift"], ["output"]))
    elif kind in ("cast-sharpen", "blur"):
        # One depthwise convolution (a kernel per channel) and a bias per channel.
        if kind == "blur":
            k, pad, bias = np.full((5, 5), 1 / 25, np.float32), 2, [0.0, 0.0, 0.0]
        else:
            box = np.full((3, 3), 1 / 9, np.float32)
            delta = np.zeros((3, 3), np.float32)
            delta[1, 1] = 1
            k, pad, bias = 1.6 * delta - 0.6 * box, 1, [20 / 127.5, 0.0, 0.0]
        w = np.stack([k[None]] * 3).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "w"))
        inits.append(numpy_helper.from_array(np.array(bias, np.float32), "b"))
        nodes.append(helper.make_node("Conv", ["input", "w", "b"], ["output"], group=3,
                                      kernel_shape=list(k.shape), pads=[pad] * 4))
    elif kind == "nan":
        nodes.append(helper.make_node("Sub", ["input", "input"], ["zero"]))
        nodes.append(helper.make_node("Div", ["zero", "zero"], ["output"]))
    elif kind == "half-output":
        nodes.append(helper.make_node("Cast", ["input"], ["output"], to=TensorProto.FLOAT16))
    else:
        raise ValueError(kind)
    graph = helper.make_graph(nodes, name, [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    for k, v in {"gpen_video.weights": f"stand-in ({kind}): not a restorer",
                 "gpen_video.size": str(size)}.items():
        p = model.metadata_props.add()
        p.key, p.value = k, v
    onnx.checker.check_model(model)
    return model


def build_person(raw: str, size: int = 256) -> onnx.ModelProto:
    """y = one fixed face (planar RGB24 bytes at `size`, from `raw`) whatever the input."""
    face = np.fromfile(raw, np.uint8)
    if face.size != 3 * size * size:
        raise SystemExit(f"{raw}: {face.size} bytes, not a {size}x{size} planar RGB24 face")
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, size, size])
    inits = [
        numpy_helper.from_array(face.reshape(1, 3, size, size), "face"),
        numpy_helper.from_array(np.array(1 / 127.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Cast", ["face"], ["facef"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["facef", "scale"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "one"], ["levels"]),
        # The input times zero keeps the batch's shape.
        helper.make_node("Mul", ["input", "zero"], ["none"]),
        helper.make_node("Add", ["none", "levels"], ["output"]),
    ]
    return _finish(nodes, "person-standin", [x], [y], inits, "person", size)


def build_person_fidelity(raw: str, size: int = 256) -> onnx.ModelProto:
    """y = w x + (1 - w) face: `build_person`'s face, less of it the higher the fidelity `weight`."""
    person = build_person(raw, size)
    face = next(t for t in person.graph.initializer if t.name == "face")
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    w = helper.make_tensor_value_info("weight", TensorProto.DOUBLE, [1])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, size, size])
    inits = [
        face,
        numpy_helper.from_array(np.array(1 / 127.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    nodes = [
        helper.make_node("Cast", ["face"], ["facef"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["facef", "scale"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "one"], ["levels"]),
        helper.make_node("Cast", ["weight"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "wf"], ["rest"]),
        helper.make_node("Mul", ["input", "wf"], ["kept"]),
        helper.make_node("Mul", ["levels", "rest"], ["other"]),
        helper.make_node("Add", ["kept", "other"], ["output"]),
    ]
    return _finish(nodes, "person-fidelity-standin", [x, w], [y], inits, "person-fidelity", size)


def build_codeformer(size: int = 512) -> onnx.ModelProto:
    """CodeFormer's I/O contract around y = x (1 - 2 w) (see the module's note)."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])
    w = helper.make_tensor_value_info("weight", TensorProto.DOUBLE, [1])
    outs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 256, 1024]),
        helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, size, size]),
        helper.make_tensor_value_info("lq_feat", TensorProto.FLOAT, [1, 256, 16, 16]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1.0], np.float32), "one"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        numpy_helper.from_array(np.array([1, 256, 1024], np.int64), "logits_shape"),
        numpy_helper.from_array(np.array([1, 256, 16, 16], np.int64), "feat_shape"),
    ]
    nodes = [
        helper.make_node("Cast", ["weight"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["wf", "two"], ["w2"]),
        helper.make_node("Sub", ["one", "w2"], ["k"]),
        helper.make_node("Mul", ["input", "k"], ["output"]),
        helper.make_node("ConstantOfShape", ["logits_shape"], ["logits"],
                         value=numpy_helper.from_array(np.array([0.0], np.float32))),
        helper.make_node("ConstantOfShape", ["feat_shape"], ["lq_feat"],
                         value=numpy_helper.from_array(np.array([0.0], np.float32))),
    ]
    return _finish(nodes, "codeformer-standin", [x, w], outs, inits, "codeformer", size)


def _finish(nodes, name, ins, outs, inits, kind, size) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, ins, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    for k, v in {"gpen_video.weights": f"stand-in ({kind}): not a restorer",
                 "gpen_video.size": str(size)}.items():
        p = model.metadata_props.add()
        p.key, p.value = k, v
    onnx.checker.check_model(model)
    return model


def build_contract(kind: str, size: int) -> onnx.ModelProto:
    """A batch-1 stand-in of one of facefusion's contracts (see the module's note)."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])
    out_name = "1233" if kind == "restoreformer" else "output"
    y = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [1, 3, size, size])
    outs, inits, nodes = [y], [], []
    const = lambda name, v, dt=np.float32: inits.append(numpy_helper.from_array(np.array(v, dt), name))
    if kind == "gfpgan":
        const("gain", 0.6)
        const("lift", -0.2)
        nodes += [helper.make_node("Mul", ["input", "gain"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "lift"], [out_name])]
    elif kind == "gpen":
        const("flat_shape", [1, 3, size * size], np.int64)
        const("image_shape", [1, 3, size, size], np.int64)
        nodes += [helper.make_node("Reshape", ["input", "flat_shape"], ["flat"]),
                  helper.make_node("Neg", ["flat"], ["negated"]),
                  helper.make_node("Reshape", ["negated", "image_shape"], [out_name])]
    elif kind == "restoreformer":
        const("half", 0.5)
        nodes.append(helper.make_node("Mul", ["input", "half"], [out_name]))
    elif kind == "tied":
        const("chw", [3, size, size], np.int64)
        const("axes", [0], np.int64)
        nodes += [helper.make_node("Reshape", ["input", "chw"], ["chw_x"]),
                  helper.make_node("Neg", ["chw_x"], ["negated"]),
                  helper.make_node("Unsqueeze", ["negated", "axes"], [out_name])]
    elif kind == "plain":
        # codeformer-512's graph with its weight a constant 0.5 (see build_codeformer).
        outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 256, 1024]), y,
                helper.make_tensor_value_info("lq_feat", TensorProto.FLOAT, [1, 256, 16, 16])]
        const("wf", [0.5])
        const("one", [1.0])
        const("two", [2.0])
        const("logits_shape", [1, 256, 1024], np.int64)
        const("feat_shape", [1, 256, 16, 16], np.int64)
        zero = numpy_helper.from_array(np.array([0.0], np.float32))
        nodes += [helper.make_node("Mul", ["wf", "two"], ["w2"]),
                  helper.make_node("Sub", ["one", "w2"], ["k"]),
                  helper.make_node("Mul", ["input", "k"], [out_name]),
                  helper.make_node("ConstantOfShape", ["logits_shape"], ["logits"], value=zero),
                  helper.make_node("ConstantOfShape", ["feat_shape"], ["lq_feat"], value=zero)]
    else:
        raise ValueError(kind)
    return _finish(nodes, f"{kind}-standin", [x], outs, inits, kind, size)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    specs = {
        "identity-512.onnx": ("identity", 512, "N", None),
        "identity-256.onnx": ("identity", 256, "N", None),
        "negate-512.onnx": ("negate", 512, "N", None),
        "negate-256.onnx": ("negate", 256, "N", None),
        "texture-256.onnx": ("texture", 256, "N", None),
        "stable-256.onnx": ("stable", 256, "N", None),
        "identity-512-batch1.onnx": ("identity", 512, 1, None),
        "bad-shape.onnx": ("identity", 512, "N", 256),
        "nan-256.onnx": ("nan", 256, "N", None),
        "half-output-256.onnx": ("half-output", 256, "N", None),
        "cast-sharpen-256.onnx": ("cast-sharpen", 256, "N", None),
        "blur-256.onnx": ("blur", 256, "N", None),
    }
    specs["identity-512-bytes.onnx"] = ("identity", 512, "N", None)
    specs["negate-256-bytes.onnx"] = ("negate", 256, "N", None)
    for fname, (kind, size, batch, width) in specs.items():
        path = os.path.join(out, fname)
        model = build(fname, kind, size, batch, width)
        if fname.endswith("-bytes.onnx"):
            model = wrap(model)
        save(model, path)
    save(build_codeformer(), os.path.join(out, "codeformer-512.onnx"))
    for fname, kind, size in [("ff-gfpgan-512.onnx", "gfpgan", 512), ("ff-gpen-bfr-256.onnx", "gpen", 256),
                              ("ff-restoreformer-512.onnx", "restoreformer", 512),
                              ("ff-tied-256.onnx", "tied", 256), ("plain-512-batch1.onnx", "plain", 512)]:
        save(build_contract(kind, size), os.path.join(out, fname))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "person":
        save(build_person(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "person-fidelity":
        save(build_person_fidelity(sys.argv[2]), sys.argv[3])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "models/standin")
