"""Convert dlib's face-recognition ResNet (dlib_face_recognition_resnet_model_v1.dat, 128-D
face descriptors; public domain, CC0, by Davis King) to ONNX.

    python models/identity_export.py face_recognition_models-0.3.0.tar.gz models/face-id.onnx
    python models/identity_export.py dlib_face_recognition_resnet_model_v1.dat models/face-id.onnx

In: the `face_recognition_models` sdist (the file is taken from
face_recognition_models/models/ inside it), or the .dat itself (plain or bz2-compressed, as
dlib publishes it). Out: an ONNX model with input `input` float32 [N,3,150,150] (RGB in
[0,255], NCHW, N free: a 150x150 face chip aligned as dlib's get_face_chip_details(shape, 150,
0.25) cuts it, see CHIP_TEMPLATE) and output `embedding` float32 [N,128]: dlib's face
descriptor exactly as its loss_metric layer hands it out, NOT L2-normalised (dlib's own
distance is the Euclidean distance of these raw vectors; two chips are the same person below
0.6, DISTANCE_THRESHOLD, which the model also records).

The .dat is dlib's own serialisation (dlib/serialize.h) of `anet_type` from dlib's
examples/dnn_face_recognition_ex.cpp, read here field by field with numpy (no dlib):
  - integers: a control byte (bit 7 = negative, low 4 bits = byte count) then the magnitude,
    little endian; floats/doubles: a mantissa integer then an exponent integer (value =
    mantissa * 2**exponent); bools: the characters '1' / '0'; strings: an integer length then
    the bytes; tensors: version 2, four integer dims (N, K, R, C), then little-endian float32s.
  - a net nests from the output inwards: add_loss_layer writes its version and the loss, then
    each add_layer / add_tag_layer / add_skip_layer writes its version and then its subnet
    first, so the file holds every wrapper's version (outermost first), then the input layer,
    then each layer's parameters from the input to the output (each followed by its add_layer's
    state: three bools and three, mostly empty, tensors).
The network (checked against the file layer by layer; dlib reads its type from output to input):
  (x - [122.782, 117.001, 104.298]) / 256   (input_rgb_image_sized<150>; the means are the
                                              file's float32 values)
  con 32 7x7 /2, affine, relu, max_pool 3x3 /2
  level 4: 3 x res(32); level 3: res_down(64), 3 x res(64); level 2: res_down(128), 2 x res(128)
  level 1: res_down(256), 2 x res(256); level 0: res_down(256)
  avg_pool_everything, fc_no_bias 128
with res(N) = relu(x + block(x)), res_down(N) = relu(avg_pool 2x2 /2 (x) + block/2(x)),
block = affine(con N 3x3 /1 (relu(affine(con N 3x3 /s (x))))). Strided convolutions and the
pools have no padding (dlib's default padding is k/2 only for stride 1; the file records each
layer's padding and it is used as read). dlib's add_prev sums tensors of different sizes by
zero-padding both to the larger channel count, height and width (at the end), which happens in
every res_down (channels 32->64 etc.; 4x4 pool + 3x3 block in level 1, 2x2 + 1x1 in level 0):
written here as explicit Pads. The `affine` layers (batch norm folded after training:
y = gamma * x + beta per channel) are folded into the convolution before them (weights and
bias scaled, in float64, stored as float32).
"""
from __future__ import annotations

import bz2
import os
import sys
import tarfile
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MEMBER = "face_recognition_models/models/dlib_face_recognition_resnet_model_v1.dat"
SIZE = 150
PADDING = 0.25
DISTANCE_THRESHOLD = 0.6

# dlib's 5-point and 68-point mean face shapes (dlib/image_transforms/interpolation.h,
# get_face_chip_details), in [0,1] of the face box before padding. The points our detector
# gives (eye centres, nose tip, mouth corners) are taken from the 68-point shape: each eye is
# the mean of its six points (36-41, 42-47), the nose tip point 30, the mouth corners 48 and
# 54. "Left" is the image's left (the subject's right), as models/models.toml's templates.
_MEAN_68 = {  # point index: (x, y)
    30: (0.490127, 0.515625),
    36: (0.121737, 0.216423), 37: (0.187122, 0.178758), 38: (0.265825, 0.179852),
    39: (0.334606, 0.231733), 40: (0.260918, 0.245099), 41: (0.182743, 0.244077),
    42: (0.645647, 0.231733), 43: (0.714428, 0.179852), 44: (0.793132, 0.178758),
    45: (0.858516, 0.216423), 46: (0.79751, 0.244077), 47: (0.719335, 0.245099),
    48: (0.254149, 0.780233), 54: (0.726104, 0.780233),
}


def _mean(idx):
    return tuple(float(np.mean([_MEAN_68[i][k] for i in idx])) for k in (0, 1))


FACE_POINTS = [  # left eye, right eye, nose tip, left mouth corner, right mouth corner
    _mean(range(36, 42)), _mean(range(42, 48)), _MEAN_68[30], _MEAN_68[48], _MEAN_68[54]]


def chip_template(size: int = SIZE, padding: float = PADDING) -> np.ndarray:
    """The five points (left eye, right eye, nose tip, left mouth corner, right mouth corner) in
    chip pixels of dlib's `size` x `size` face chip, pixel centres at whole numbers: where
    extract_image_chip(img, get_face_chip_details(shape, size, padding)) puts them.
    get_face_chip_details fits the similarity chip -> image that takes (padding + p) / (1 + 2
    padding) * size onto the landmarks; chip_details keeps its angle and scale s and its
    image point for chip point (size/2, size/2), and the chip's first and last pixels sample
    +-(size*s - 1)/2 image pixels from there (centered_drect), so a template point t lands at
    chip pixel (size-1)/2 + (t - size/2) * s*(size-1)/(size*s - 1): t * (size-1)/size for a face
    larger than the chip (s >> 1), half a pixel less at s = 1. The first is written here (what
    the 150-pixel chip of a face of 150 or more pixels holds, to 0.01 pixel above s = 2)."""
    pts = (padding + np.array(FACE_POINTS)) / (1 + 2 * padding)
    return pts * (size - 1)


CHIP_TEMPLATE = chip_template()


# --- dlib's serialisation --------------------------------------------------------------------

class Reader:
    """dlib/serialize.h's formats over a bytes buffer."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def int(self) -> int:
        ctrl = self.byte()
        n = ctrl & 0x0F
        if n == 0 or n > 8 or ctrl & 0x70:
            raise ValueError(f"bad integer control byte {ctrl:#x} at {self.pos - 1}")
        v = int.from_bytes(self.data[self.pos:self.pos + n], "little")
        self.pos += n
        return -v if ctrl & 0x80 else v

    def float(self) -> float:
        if self.data[self.pos] & 0x70:
            raise ValueError(f"old ASCII float format at {self.pos} (not handled)")
        mantissa, exponent = self.int(), self.int()
        if exponent >= 32000:  # is_inf, is_ninf, is_nan
            return {32000: np.inf, 32001: -np.inf}.get(exponent, np.nan)
        return float(np.ldexp(np.float64(mantissa), exponent))

    def bool(self) -> bool:
        c = self.byte()
        if c not in (ord("0"), ord("1")):
            raise ValueError(f"bad bool {c:#x} at {self.pos - 1}")
        return c == ord("1")

    def string(self) -> str:
        n = self.int()
        s = self.data[self.pos:self.pos + n].decode("ascii")
        self.pos += n
        return s

    def tensor(self) -> np.ndarray:
        if self.int() != 2:
            raise ValueError("unexpected resizable_tensor version")
        dims = [self.int() for _ in range(4)]
        n = int(np.prod(dims))
        v = np.frombuffer(self.data, "<f4", n, self.pos).reshape(dims)
        self.pos += 4 * n
        return v

    def alias(self) -> tuple:
        if self.int() != 1:
            raise ValueError("unexpected alias_tensor version")
        return tuple(self.int() for _ in range(4))

    def expect(self, what: str, *versions: str) -> str:
        v = self.string()
        if v not in versions:
            raise ValueError(f"expected {what} ({' or '.join(versions)}), found {v!r} at {self.pos}")
        return v


# --- the network type, anet_type of dlib's examples/dnn_face_recognition_ex.cpp -------------
# A layer is (wrapper, details): wrapper "layer" (add_layer), "tag" (add_tag_layer) or "skip"
# (add_skip_layer); listed from the input to the output.

def _block(n, stride):
    return [("layer", ("con", n, 3, stride)), ("layer", ("affine",)), ("layer", ("relu",)),
            ("layer", ("con", n, 3, 1)), ("layer", ("affine",))]


def _ares(n):
    return [("tag", 1)] + _block(n, 1) + [("layer", ("add_prev", 1)), ("layer", ("relu",))]


def _ares_down(n):
    return ([("tag", 1)] + _block(n, 2) + [("tag", 2), ("skip", 1), ("layer", ("avg_pool", 2, 2)),
                                           ("layer", ("add_prev", 2)), ("layer", ("relu",))])


def anet_type():
    net = [("layer", ("con", 32, 7, 2)), ("layer", ("affine",)), ("layer", ("relu",)),
           ("layer", ("max_pool", 3, 2))]
    net += _ares(32) * 3                                   # alevel4
    net += _ares_down(64) + _ares(64) * 3                  # alevel3
    net += _ares_down(128) + _ares(128) * 2                # alevel2
    net += _ares_down(256) + _ares(256) * 2                # alevel1
    net += _ares_down(256)                                 # alevel0
    net += [("layer", ("avg_pool", 0, 1)), ("layer", ("fc", 128))]
    return net


def _details(r: Reader, spec) -> dict:
    """One layer's parameters, checked against the network type."""
    kind = spec[0]
    if kind == "con":
        _, n, k, stride = spec
        v = r.expect("con_", "con_4", "con_5", "con_6")
        params = r.tensor()
        got = dict(filters=r.int(), nr=r.int(), nc=r.int(), sy=r.int(), sx=r.int(),
                   py=r.int(), px=r.int())
        filt, bias = r.alias(), r.alias()
        for _ in range(4):  # learning-rate and weight-decay multipliers
            r.float()
        use_bias = r.bool() if v in ("con_5", "con_6") else True
        use_relu = r.bool() if v == "con_6" else False
        pad = 0 if stride != 1 else k // 2  # dlib's default padding for con_<...>
        want = dict(filters=n, nr=k, nc=k, sy=stride, sx=stride, py=pad, px=pad)
        if got != want:
            raise ValueError(f"con layer {got} where the network type has {want}")
        flat = params.reshape(-1)
        w = flat[:int(np.prod(filt))].reshape(filt)
        if filt[0] != n or filt[2:] != (k, k):
            raise ValueError(f"con filters {filt}")
        b = flat[w.size:w.size + n] if use_bias else np.zeros(n, np.float32)
        if flat.size != w.size + (n if use_bias else 0) or (use_bias and bias[:2] != (1, n)):
            raise ValueError("con parameter sizes do not add up")
        return dict(kind="con", w=w, b=b, stride=stride, pad=pad, relu=use_relu)
    if kind == "affine":
        v = r.expect("affine_", "affine_", "affine_2")
        params = r.tensor().reshape(-1)
        gamma, beta = r.alias(), r.alias()
        mode = r.int()
        disabled = r.bool() if v == "affine_2" else False
        if mode != 0:  # CONV_MODE: one gamma and beta per channel
            raise ValueError(f"affine layer in mode {mode}, not CONV_MODE")
        g = int(np.prod(gamma))
        if disabled:
            return dict(kind="affine", disabled=True)
        if params.size != g + int(np.prod(beta)):
            raise ValueError("affine parameter sizes do not add up")
        return dict(kind="affine", gamma=params[:g], beta=params[g:], disabled=False)
    if kind == "relu":
        v = r.expect("relu_", "relu_", "relu_2")
        return dict(kind="relu", disabled=r.bool() if v == "relu_2" else False)
    if kind in ("max_pool", "avg_pool"):
        _, k, stride = spec
        r.expect(kind, kind + "_2")
        got = (r.int(), r.int(), r.int(), r.int(), r.int(), r.int())
        pad = 0 if stride != 1 else k // 2
        if got != (k, k, stride, stride, pad, pad):
            raise ValueError(f"{kind} {got} where the network type has {(k, k, stride, stride, pad, pad)}")
        return dict(kind=kind, k=k, stride=stride, pad=pad)
    if kind == "add_prev":
        r.expect("add_prev", "add_prev_")
        return dict(kind="add_prev", tag=spec[1])
    if kind == "fc":
        v = r.expect("fc_", "fc_2", "fc_3")
        outputs, inputs = r.int(), r.int()
        params = r.tensor().reshape(-1)
        weights, _ = r.alias(), r.alias()
        bias_mode = r.int()
        for _ in range(4):
            r.float()
        if v == "fc_3":
            r.bool()
        if (outputs, bias_mode) != (spec[1], 1) or weights[:2] != (inputs, outputs):
            raise ValueError(f"fc layer ({outputs} outputs, bias mode {bias_mode}, weights {weights})")
        if params.size != inputs * outputs:
            raise ValueError("fc parameter size does not add up")
        return dict(kind="fc", w=params.reshape(inputs, outputs))
    raise AssertionError(kind)


def parse(data: bytes) -> dict:
    """The network's layers (input to output) and its input and loss settings."""
    r = Reader(data)
    if r.int() != 1:
        raise ValueError("not a dlib add_loss_layer (version)")
    loss = r.expect("loss_metric_", "loss_metric_", "loss_metric_2")
    margin, thresh = (r.float(), r.float()) if loss == "loss_metric_2" else (0.1, 0.75)
    net = anet_type()
    # Every wrapper's version, outermost first; the innermost add_layer is the one over the input.
    versions = []
    for i, (wrapper, _) in enumerate(reversed(net)):
        v = r.int()
        innermost = i == len(net) - 1
        ok = {"layer": (2, 3) if innermost else (1, 2), "tag": (1,), "skip": (1,)}[wrapper]
        if v not in ok:
            raise ValueError(f"{wrapper} wrapper version {v} at layer {len(net) - i} from the input")
        versions.append(v)
    versions.reverse()
    r.expect("input layer", "input_rgb_image_sized")
    mean = np.array([r.float(), r.float(), r.float()], np.float32)  # float32 in dlib
    nr, nc = r.int(), r.int()
    if (nr, nc) != (SIZE, SIZE):
        raise ValueError(f"input size {nr}x{nc}")
    layers = []
    for i, ((wrapper, spec), v) in enumerate(zip(net, versions)):
        if wrapper != "layer":
            layers.append(dict(kind=wrapper, tag=spec))
            continue
        layers.append(_details(r, spec))
        for _ in range(3):  # this_layer_setup_called, gradient_input_is_stale, ..._disabled
            r.bool()
        r.tensor()  # x_grad
        r.tensor()  # cached_output
        if i == 0:
            r.tensor()  # grad_final
            if v == 3:
                r.int()  # _sample_expansion_factor
        elif v == 2:
            r.tensor()  # params_grad
    if r.pos != len(data):
        raise ValueError(f"{len(data) - r.pos} bytes left after the network")
    return dict(layers=layers, mean=mean, margin=margin, threshold=thresh)


def read(src: str) -> bytes:
    if src.endswith((".tar.gz", ".tgz")):
        with tarfile.open(src) as t:
            names = [m for m in t.getmembers() if m.name.endswith(MEMBER)]
            if len(names) != 1:
                raise SystemExit(f"{src}: no single {MEMBER}")
            data = t.extractfile(names[0]).read()
    elif src.endswith((".whl", ".zip")):
        with zipfile.ZipFile(src) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith(MEMBER)))
    else:
        with open(src, "rb") as f:
            data = f.read()
    if data[:3] == b"BZh":
        data = bz2.decompress(data)
    return data


# --- ONNX --------------------------------------------------------------------------------------

def convert(data: bytes) -> onnx.ModelProto:
    net = parse(data)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(op, ins, name, **attrs):
        nodes.append(helper.make_node(op, ins, [name], name=name, **attrs))
        return name

    mean = net["mean"].reshape(1, 3, 1, 1)
    x = node("Sub", ["input", init("mean", mean)], "centred")
    x = node("Div", [x, init("scale", np.array(256.0, np.float32))], "normalised")
    shape = (3, SIZE, SIZE)  # (C, H, W) of x
    tags, skip_to = {}, None
    layers = net["layers"]
    i = 0
    convs = 0
    while i < len(layers):
        L = layers[i]
        kind = L["kind"]
        if kind == "tag":
            tags[L["tag"]] = (x, shape)
        elif kind == "skip":
            x, shape = tags[L["tag"]]
        elif kind == "con":
            w = L["w"].astype(np.float64)
            b = L["b"].astype(np.float64)
            nxt = layers[i + 1] if i + 1 < len(layers) else {}
            if nxt.get("kind") == "affine" and not nxt["disabled"] and not L["relu"]:
                # affine(con(x)) = con'(x): per output channel, w' = gamma w, b' = gamma b + beta
                g, beta = nxt["gamma"].astype(np.float64), nxt["beta"].astype(np.float64)
                w, b = w * g[:, None, None, None], b * g + beta
                i += 1
            convs += 1
            k, s, p = w.shape[2], L["stride"], L["pad"]
            x = node("Conv", [x, init(f"conv{convs}.w", w.astype(np.float32)),
                              init(f"conv{convs}.b", b.astype(np.float32))], f"conv{convs}",
                     kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
            shape = (w.shape[0], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1)
            if L["relu"]:
                x = node("Relu", [x], f"conv{convs}.relu")
        elif kind == "affine":
            if not L["disabled"]:
                c = shape[0]
                x = node("Mul", [x, init(f"affine{i}.g", L["gamma"].reshape(1, c, 1, 1))], f"affine{i}.mul")
                x = node("Add", [x, init(f"affine{i}.b", L["beta"].reshape(1, c, 1, 1))], f"affine{i}")
        elif kind == "relu":
            if not L["disabled"]:
                x = node("Relu", [x], f"relu{i}")
        elif kind in ("max_pool", "avg_pool"):
            k, s, p = L["k"], L["stride"], L["pad"]
            if k == 0:  # avg_pool_everything
                x = node("GlobalAveragePool", [x], f"pool{i}")
                shape = (shape[0], 1, 1)
            else:
                if p:
                    raise ValueError("padded pooling is not written (dlib leaves the border out)")
                op = "MaxPool" if kind == "max_pool" else "AveragePool"
                x = node(op, [x], f"pool{i}", kernel_shape=[k, k], strides=[s, s], pads=[0] * 4)
                shape = (shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1)
        elif kind == "add_prev":
            # dlib's tt::add: the sum is as large as the larger of the two in every dimension,
            # each operand zero-padded at the end of channels, rows and columns.
            y, yshape = tags[L["tag"]]
            out = tuple(max(a, b) for a, b in zip(shape, yshape))

            def padded(t, sh, label):
                if sh == out:
                    return t
                pads = [0, 0, 0, 0, 0] + [out[j] - sh[j] for j in range(3)]
                return node("Pad", [t, init(f"{label}.pads", np.array(pads, np.int64))], label)

            x = node("Add", [padded(x, shape, f"add{i}.a"), padded(y, yshape, f"add{i}.b")], f"add{i}")
            shape = out
        elif kind == "fc":
            x = node("Flatten", [x], "flat", axis=1)
            if L["w"].shape[0] != int(np.prod(shape)):
                raise ValueError(f"fc takes {L['w'].shape[0]} inputs, the net gives {shape}")
            x = node("MatMul", [x, init("fc.w", L["w"])], "embedding")
        i += 1
    if x != "embedding":
        raise ValueError("the network does not end in its fc layer")
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])
    out = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 128])
    graph = helper.make_graph(nodes, "face_identity", [inp], [out], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    m.producer_name = "gpen-video identity_export.py"
    t = ";".join(f"{px:.4f},{py:.4f}" for px, py in CHIP_TEMPLATE)
    for key, value in {
        "gpen_video.kind": "face identity",
        "gpen_video.source": "dlib_face_recognition_resnet_model_v1.dat (dlib, public domain / CC0), "
                             "read from dlib's serialisation and converted layer by layer",
        "gpen_video.input": "[N,3,150,150] RGB in [0,255], a dlib face chip (size 150, padding 0.25)",
        "gpen_video.outputs": "embedding [N,128], dlib's raw descriptor (not L2-normalised)",
        "gpen_video.template": "dlib_150",
        "gpen_video.template_points": t + " (left eye, right eye, nose tip, left and right mouth "
                                          "corner; chip pixels, pixel centres at whole numbers)",
        "gpen_video.distance_threshold": f"{net['threshold']:.6g}",
        # What the set-up checks to convert again a model an older converter wrote.
        "gpen_video.export": "1: affine folded into the convolutions, add_prev's zero padding as Pad",
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
