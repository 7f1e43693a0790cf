"""Byte I/O for an enhancer: in, an ONNX file with GPEN's contract (input and output float32
[N,3,S,S] in [-1,1]); out, the same model taking and giving uint8 [N,3,S,S] (planar RGB levels),
the conversions inside the graph: Cast, x / 127.5 - 1 before the model, (y + 1) * 127.5
clipped, rounded and cast after it.

gpen-video feeds such a model the crops as they are (a quarter of the floats' bytes cross to
the device each way) and does no float work on the host; on a GPU the conversions run there.
The file's metadata gains `gpen_video.io = bytes`.

  python3 models/byte_io.py IN.onnx OUT.onnx
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def wrap(model: onnx.ModelProto) -> onnx.ModelProto:
    g = model.graph
    if len(g.input) != 1 or not g.output:
        raise ValueError("expected one input and at least one output")
    inp, out = g.input[0], g.output[0]
    for v, what in ((inp, "input"), (out, "output")):
        if v.type.tensor_type.elem_type != TensorProto.FLOAT:
            raise ValueError(f"{what} `{v.name}` is not float32")
    fin, fout = inp.name + "__float", out.name + "__float"
    # The model's own nodes now read the converted input and write the float output.
    for n in g.node:
        n.input[:] = [fin if x == inp.name else (fout if x == out.name else x) for x in n.input]
        n.output[:] = [fout if x == out.name else x for x in n.output]
    consts = {
        "__byte_io_k": 1.0 / 127.5,
        "__byte_io_one": 1.0,
        "__byte_io_half": 127.5,
        "__byte_io_lo": 0.0,
        "__byte_io_hi": 255.0,
    }
    for name, v in consts.items():
        g.initializer.append(numpy_helper.from_array(np.array(v, np.float32), name))
    pre = [
        helper.make_node("Cast", [inp.name], ["__byte_io_x"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["__byte_io_x", "__byte_io_k"], ["__byte_io_xs"]),
        helper.make_node("Sub", ["__byte_io_xs", "__byte_io_one"], [fin]),
    ]
    post = [
        helper.make_node("Add", [fout, "__byte_io_one"], ["__byte_io_y1"]),
        helper.make_node("Mul", ["__byte_io_y1", "__byte_io_half"], ["__byte_io_y2"]),
        helper.make_node("Clip", ["__byte_io_y2", "__byte_io_lo", "__byte_io_hi"], ["__byte_io_y3"]),
        helper.make_node("Round", ["__byte_io_y3"], ["__byte_io_y4"]),
        helper.make_node("Cast", ["__byte_io_y4"], [out.name], to=TensorProto.UINT8),
    ]
    nodes = pre + list(g.node) + post
    del g.node[:]
    g.node.extend(nodes)
    inp.type.tensor_type.elem_type = TensorProto.UINT8
    out.type.tensor_type.elem_type = TensorProto.UINT8
    # Clip with bounds as inputs and Round need opset 11.
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < 11:
            o.version = 11
    io = [p for p in model.metadata_props if p.key == "gpen_video.io"]
    p = io[0] if io else model.metadata_props.add()
    p.key, p.value = "gpen_video.io", "bytes"
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: str) -> None:
    """Writes `model` to `path` through a temporary file, unless `path` already holds it."""
    data = model.SerializeToString()
    if os.path.exists(path) and open(path, "rb").read() == data:
        return
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def main(src: str, dst: str) -> None:
    save(wrap(onnx.load(src)), dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: byte_io.py IN.onnx OUT.onnx")
    main(sys.argv[1], sys.argv[2])
