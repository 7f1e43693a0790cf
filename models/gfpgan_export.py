"""Export GFPGAN v1.3 / v1.4 (TencentARC GFPGANv1Clean) to ONNX with a dynamic batch dimension.

    python models/gfpgan_export.py --checkpoint GFPGANv1.4.pth --out models/gfpgan-1.4-dynamic.onnx
    python models/gfpgan_export.py --size 512 --out models/gfpgan-512-random.onnx [--seed 0]
    python models/gfpgan_export.py --size 512 --narrow 0.03125 --batch1 --out models/x.onnx
    ... [--channel-multiplier 2] [--narrow 1] [--no-check]

In: an official checkpoint (GFPGANv1.3.pth, GFPGANv1.4.pth or any GFPGANv1Clean state dict,
read without torch by pth_io.py; official key names, optionally wrapped under "params_ema" /
"params" as GFPGAN's are) or nothing (seeded random weights: gpen_video.weights = "random
weights: for speed only"). Out: an ONNX file in facefusion's GFPGAN contract: input `input`,
output `output`, both float32 [N,3,S,S] (N symbolic; --batch1 declares 1, as the files users
download do, while the graph itself stays batch-agnostic), RGB in [-1,1] (the output is not
clamped, as in the official model: clamp when converting back to pixels). Metadata as in
gpen_export.py: gpen_video.weights (random, or the checkpoint's name and sha256),
gpen_video.size, gpen_video.template = "ffhq" (GFPGAN aligns to FFHQ's five points).

The graph is written op by op with onnx.helper from numpy weights (no torch), faithful to
gfpgan/archs/gfpganv1_clean_arch.py and gfpgan/archs/stylegan2_clean_arch.py (Apache-2.0) in
GFPGANer's configuration (input_is_latent=True, different_w=True, sft_half=True), with these
equivalent rewrites:
  - the modulated convolutions are batch-agnostic (StyleGAN2-ADA fused_modconv=False): x * style
    (per input channel) -> [bilinear x2] -> Conv with the shared weight -> * demod (per output
    channel, sqrt(2) / sqrt(sum_c style_c^2 * sum_k w^2 + 1e-8): StyleConv's 2**0.5 folded in),
    instead of one grouped convolution with per-sample weights;
  - F.interpolate(scale_factor=2, bilinear, align_corners=False) is Resize(linear, half_pixel),
    whose source coordinates (x + 0.5) / 2 - 0.5 clamped to the image are PyTorch's;
    F.interpolate(scale_factor=0.5, same mode) samples at 2x + 0.5, i.e. the mean of each 2x2
    block (no antialiasing in either): AveragePool 2x2, stride 2;
  - the style MLP is not in the graph (input_is_latent=True: GFPGAN never runs it), nor are the
    U-Net's intermediate toRGB convolutions (return_rgb=False).
Noise: the official inference draws fresh noise for every StyleConv at every call
(randomize_noise=True), so its output is not a function of its input. This export is
deterministic: it adds the decoder's fixed noise buffers (stylegan_decoder.noises.noiseK, the
official randomize_noise=False path; a checkpoint's own buffers, seeded N(0,1) maps with random
weights, zeros for a checkpoint without them), scaled by each StyleConv's learned strength.
models/gfpgan_reference.py makes the same choice.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gfpgan_arch  # noqa: E402
import gpen_export  # noqa: E402
import pth_io  # noqa: E402

OPSET = 17
IR_VERSION = 8
SQRT2 = math.sqrt(2.0)
LRELU = gfpgan_arch.LRELU
_Graph = gpen_export._Graph  # the same op-by-op graph writer as the GPEN exporter


def _unsq(g: _Graph, x: str, name: str) -> str:
    axes = g.const(name + "/axes", np.array([2, 3], dtype=np.int64), feat=False)
    return g.op("Unsqueeze", [x, axes], name)


def _lrelu(g: _Graph, x: str, name: str) -> str:
    return g.op("LeakyRelu", [x], name, alpha=LRELU)


def _conv(g: _Graph, sd, prefix: str, x: str, bias: bool = True) -> str:
    """nn.Conv2d(k, stride 1, padding k // 2)."""
    w = sd[prefix + ".weight"]
    k = w.shape[-1]
    inputs = [x, g.const(prefix + ".weight", w, True)]
    if bias:
        inputs.append(g.const(prefix + ".bias", sd[prefix + ".bias"], True))
    return g.op("Conv", inputs, prefix, kernel_shape=[k, k], pads=[k // 2] * 4)


def _upsample(g: _Graph, x: str, name: str) -> str:
    """F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False)."""
    scales = g.const(name + "/scales", np.array([1, 1, 2, 2], np.float32), False)
    return g.op("Resize", [x, "", scales], name, mode="linear",
                coordinate_transformation_mode="half_pixel")


def _downsample(g: _Graph, x: str, name: str) -> str:
    """F.interpolate(x, scale_factor=0.5, mode='bilinear', align_corners=False): 2x2 means."""
    return g.op("AveragePool", [x], name, kernel_shape=[2, 2], strides=[2, 2])


def _res_block(g: _Graph, sd, prefix: str, x: str, up: bool) -> str:
    resample = _upsample if up else _downsample
    out = _lrelu(g, _conv(g, sd, prefix + ".conv1", x), prefix + ".conv1/act")
    out = resample(g, out, prefix + "/resample")
    out = _lrelu(g, _conv(g, sd, prefix + ".conv2", out), prefix + ".conv2/act")
    skip = _conv(g, sd, prefix + ".skip", resample(g, x, prefix + "/resample_skip"), bias=False)
    return g.op("Add", [out, skip], prefix + "/add")


def _modulated_conv(g: _Graph, sd, prefix: str, x: str, latent: str, demodulate: bool,
                    upsample: bool, gain: float = 1.0, bias=None) -> str:
    """ModulatedConv2d, batch-agnostic; `gain` multiplies the output (folded into the
    demodulation), `bias` (ToRGB's) goes into Conv's bias input."""
    w = sd[prefix + ".weight"][0].astype(np.float64)  # [O, C, k, k]
    cout, cin, k, _ = w.shape
    mw = sd[prefix + ".modulation.weight"].astype(np.float64)  # nn.Linear(512, C)
    s = g.op("MatMul", [latent, g.const(prefix + ".modulation/w", mw.T, False)],
             prefix + ".modulation/matmul")
    s = g.op("Add", [s, g.const(prefix + ".modulation/b", sd[prefix + ".modulation.bias"], False)],
             prefix + ".modulation")
    y = g.op("Mul", [x, _unsq(g, s, prefix + "/style_4d")], prefix + "/mul_style")
    if upsample:
        y = _upsample(g, y, prefix + "/upsample")
    inputs = [y, g.const(prefix + "/weight", w, True)]
    if bias is not None:
        inputs.append(g.const(prefix + "/bias", bias, True))
    y = g.op("Conv", inputs, prefix + "/conv", kernel_shape=[k, k], pads=[k // 2] * 4)
    if demodulate:
        wsq = (w ** 2).sum(axis=(2, 3)).T  # [C, O]
        s2 = g.op("Mul", [s, s], prefix + "/style_sq")
        d = g.op("MatMul", [s2, g.const(prefix + "/wsq", wsq, False)], prefix + "/demod_sum")
        d = g.op("Add", [d, g.const(prefix + "/eps", np.array(1e-8, np.float32), False)],
                 prefix + "/demod_eps")
        d = g.op("Sqrt", [d], prefix + "/demod_sqrt")
        d = g.op("Div", [g.const(prefix + "/gain", np.array(gain, np.float32), False), d],
                 prefix + "/demod")
        y = g.op("Mul", [y, _unsq(g, d, prefix + "/demod_4d")], prefix + "/mul_demod")
    else:
        assert gain == 1.0
    return y


def _style_conv(g: _Graph, sd, prefix: str, x: str, latent: str, noise, upsample: bool) -> str:
    """StyleConv: modulated conv * sqrt(2) + strength * noise + bias, leaky ReLU 0.2."""
    y = _modulated_conv(g, sd, prefix + ".modulated_conv", x, latent, True, upsample, gain=SQRT2)
    n = float(sd[prefix + ".weight"].reshape(-1)[0]) * np.asarray(noise, np.float64)
    if np.any(n != 0):
        y = g.op("Add", [y, g.const(prefix + "/noise", n, True)], prefix + "/add_noise")
    y = g.op("Add", [y, g.const(prefix + ".bias", sd[prefix + ".bias"], True)],
             prefix + "/add_bias")
    return _lrelu(g, y, prefix + "/act")


def _to_rgb(g: _Graph, sd, prefix: str, x: str, latent: str, skip: str | None) -> str:
    y = _modulated_conv(g, sd, prefix + ".modulated_conv", x, latent, False, False,
                        bias=sd[prefix + ".bias"].reshape(-1))
    if skip is not None:
        y = g.op("Add", [y, _upsample(g, skip, prefix + "/upsample_skip")], prefix + "/add_skip")
    return y


def build_model(sd, size: int | None = None, channel_multiplier: float | None = None,
                narrow: float | None = None, sft_half: bool | None = None,
                batch1: bool = False, metadata: dict | None = None) -> onnx.ModelProto:
    """The ONNX model of GFPGANv1Clean(size, 512, cm, different_w=True, narrow=narrow,
    sft_half=sft_half) with weights `sd` (official names, numpy arrays); unset arguments are
    read from the weights' shapes."""
    size0, cm0, nw0, sh0 = gfpgan_arch.infer_config(sd)
    size = size or size0
    cm = channel_multiplier if channel_multiplier is not None else cm0
    nw = narrow if narrow is not None else nw0
    sft_half = sh0 if sft_half is None else sft_half
    check_state_dict(sd, size, cm, nw, sft_half)
    log_size = int(math.log2(size))
    levels = log_size - 2
    g = _Graph(fp16=False)
    d = "stylegan_decoder"

    # U-Net encoder
    feat = _lrelu(g, _conv(g, sd, "conv_body_first", "input"), "conv_body_first/act")
    unet_skips = []
    for i in range(levels):
        feat = _res_block(g, sd, f"conv_body_down.{i}", feat, up=False)
        unet_skips.insert(0, feat)
    feat = _lrelu(g, _conv(g, sd, "final_conv", feat), "final_conv/act")
    # style codes (different_w): final_linear -> [N, num_latent * 512], a latent per layer
    flat = g.op("Flatten", [feat], "flatten", axis=1)
    code = g.op("MatMul", [flat, g.const("final_linear/w", sd["final_linear.weight"].T, False)],
                "final_linear/matmul")
    code = g.op("Add", [code, g.const("final_linear.bias", sd["final_linear.bias"], False)],
                "final_linear")
    axis = g.const("latent/axis", np.array([1], np.int64), False)
    dim = gfpgan_arch.STYLE_DIM
    latents = [g.op("Slice", [code, g.const(f"latent{j}/start", np.array([j * dim]), False),
                              g.const(f"latent{j}/end", np.array([(j + 1) * dim]), False), axis],
                    f"latent{j}") for j in range(gfpgan_arch.num_latent(size))]
    # U-Net decoder and the SFT conditions
    conditions = []
    for i in range(levels):
        feat = g.op("Add", [feat, unet_skips[i]], f"conv_body_up.{i}/add_skip")
        feat = _res_block(g, sd, f"conv_body_up.{i}", feat, up=True)
        for branch in ("condition_scale", "condition_shift"):
            h = _lrelu(g, _conv(g, sd, f"{branch}.{i}.0", feat), f"{branch}.{i}.1")
            conditions.append(_conv(g, sd, f"{branch}.{i}.2", h))
    # StyleGAN2 decoder with SFT (input_is_latent=True: no style MLP)
    noise = [sd.get(f"{d}.noises.noise{k}", np.zeros(gfpgan_arch.noise_shape(k), np.float32))
             for k in range(gfpgan_arch.num_layers(size))]
    const = g.const(f"{d}.constant_input.weight", sd[f"{d}.constant_input.weight"], True)
    out = _style_conv(g, sd, f"{d}.style_conv1", const, latents[0], noise[0], upsample=False)
    skip = _to_rgb(g, sd, f"{d}.to_rgb1", out, latents[1], None)
    j = 1
    for lvl in range(levels):
        p = f"{d}.style_convs.{2 * lvl}"
        out = _style_conv(g, sd, p, out, latents[j], noise[2 * lvl + 1], upsample=True)
        scale, shift = conditions[2 * lvl], conditions[2 * lvl + 1]
        if sft_half:
            half = int(sd[p + ".bias"].shape[1]) // 2
            axis = g.const(p + "/sft_axis", np.array([1], np.int64), False)
            bounds = [g.const(p + f"/sft_at{v}", np.array([v], np.int64), False)
                      for v in (0, half, 2 * half)]
            same = g.op("Slice", [out, bounds[0], bounds[1], axis], p + "/same")
            sft = g.op("Slice", [out, bounds[1], bounds[2], axis], p + "/sft_in")
            sft = g.op("Mul", [sft, scale], p + "/sft_scale")
            sft = g.op("Add", [sft, shift], p + "/sft_shift")
            out = g.op("Concat", [same, sft], p + "/sft", axis=1)
        else:
            out = g.op("Mul", [out, scale], p + "/sft_scale")
            out = g.op("Add", [out, shift], p + "/sft")
        out = _style_conv(g, sd, f"{d}.style_convs.{2 * lvl + 1}", out, latents[j + 1],
                          noise[2 * lvl + 2], upsample=False)
        skip = _to_rgb(g, sd, f"{d}.to_rgbs.{lvl}", out, latents[j + 2], skip)
        j += 2
    g.op("Identity", [skip], "output_identity", out="output")

    n = 1 if batch1 else "N"
    x_info = helper.make_tensor_value_info("input", TensorProto.FLOAT, [n, 3, size, size])
    y_info = helper.make_tensor_value_info("output", TensorProto.FLOAT, [n, 3, size, size])
    graph = helper.make_graph(g.nodes, f"gfpgan_v1_clean_{size}", [x_info], [y_info],
                              initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gpen-video models/gfpgan_export.py")
    model.ir_version = IR_VERSION
    for k, v in (metadata or {}).items():
        prop = model.metadata_props.add()
        prop.key, prop.value = k, str(v)
    return model


# ---------------------------------------------------------------------------------------------
# checkpoints


def check_state_dict(sd, size: int, channel_multiplier: float, narrow: float,
                     sft_half: bool) -> None:
    """Like load_state_dict(strict=True): every parameter present with the official shape, no
    unknown keys; the noise buffers may be absent (zeros are used then) but not misshapen."""
    spec = gfpgan_arch.state_dict_spec(size, channel_multiplier, narrow, sft_half)
    missing = [n for n, (_, kind) in spec.items() if kind == "param" and n not in sd]
    unexpected = [n for n in sd if n not in spec]
    bad = [f"{n}: {tuple(np.shape(sd[n]))} != {s}" for n, (s, _) in spec.items()
           if n in sd and tuple(np.shape(sd[n])) != s]
    if missing or unexpected or bad:
        raise ValueError(
            f"state dict does not match GFPGANv1Clean-{size} (channel_multiplier="
            f"{channel_multiplier}, narrow={narrow}, sft_half={sft_half}): missing "
            f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
            f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}, wrong shapes {bad[:5]}")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int,
                    help="output size S (default 512; inferred from --checkpoint when omitted)")
    ap.add_argument("--out", required=True, help="output .onnx path")
    ap.add_argument("--checkpoint", help="official GFPGANv1.3.pth / GFPGANv1.4.pth (else "
                                         "random weights)")
    ap.add_argument("--key", help="entry of the checkpoint holding the state dict (default: "
                                  "params_ema, else params, else the file itself)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--channel-multiplier", type=float,
                    help=f"random weights: decoder channel multiplier (default "
                         f"{gfpgan_arch.CHANNEL_MULTIPLIER}; inferred from a checkpoint)")
    ap.add_argument("--narrow", type=float,
                    help=f"random weights: channel width ratio (default {gfpgan_arch.NARROW:g}; "
                         "inferred from a checkpoint)")
    ap.add_argument("--batch1", action="store_true",
                    help="declare the batch dimension as 1 (the graph stays batch-agnostic)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the onnxruntime run on a sample input")
    args = ap.parse_args(argv)

    t0 = time.time()
    if args.checkpoint:
        sd = gpen_export.unwrap_checkpoint(pth_io.load(args.checkpoint), args.key)
        if "stylegan_decoder.constant_input.weight" not in sd:
            ap.error(f"{args.checkpoint} holds no GFPGANv1Clean state dict")
        size, cm, nw, sft_half = gfpgan_arch.infer_config(sd)
        for flag, given, found in (("--size", args.size, size),
                                   ("--channel-multiplier", args.channel_multiplier, cm),
                                   ("--narrow", args.narrow, nw)):
            if given is not None and given != found:
                ap.error(f"{flag} {given:g} but the checkpoint has {found:g}")
        weights = (f"checkpoint {os.path.basename(args.checkpoint)} "
                   f"sha256 {sha256_file(args.checkpoint)}")
        has_noise = all(f"stylegan_decoder.noises.noise{k}" in sd
                        for k in range(gfpgan_arch.num_layers(size)))
        noise = ("the checkpoint's fixed noise buffers (randomize_noise=False)" if has_noise
                 else "none: the checkpoint has no noise buffers (zeros)")
    else:
        size = args.size or gfpgan_arch.SIZE
        cm = args.channel_multiplier if args.channel_multiplier is not None \
            else gfpgan_arch.CHANNEL_MULTIPLIER
        nw = args.narrow if args.narrow is not None else gfpgan_arch.NARROW
        sft_half = gfpgan_arch.SFT_HALF
        try:
            sd = gfpgan_arch.random_state_dict(size, args.seed, cm, nw, sft_half)
        except ValueError as e:
            ap.error(str(e))
        weights = "random weights: for speed only"
        noise = "seeded N(0,1) noise buffers, fixed (randomize_noise=False)"
    cm, nw = (int(v) if float(v).is_integer() else v for v in (cm, nw))
    counts = gfpgan_arch.count_parameters(size, cm, nw, sft_half)
    meta = {
        "gpen_video.weights": weights,
        "gpen_video.model": f"GFPGANv1Clean-{size}",
        "gpen_video.size": size,
        "gpen_video.template": "ffhq",
        "gpen_video.template_points": json.dumps(gpen_export.TEMPLATES["ffhq"]),
        "gpen_video.io": "float32 NCHW RGB in [-1,1]; output not clamped",
        "gpen_video.precision": "fp32",
        "gpen_video.parameters": counts["total"],
        "gpen_video.channel_multiplier": cm,
        "gpen_video.narrow": nw,
        "gpen_video.sft_half": str(sft_half).lower(),
        "gpen_video.noise": noise,
    }
    if not args.checkpoint:
        meta["gpen_video.seed"] = args.seed
    model = build_model(sd, size, cm, nw, sft_half, batch1=args.batch1, metadata=meta)
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, args.out)
    print(f"GFPGANv1Clean-{size} (channel_multiplier={cm}, narrow={nw}, sft_half={sft_half}), "
          f"weights: {weights}")
    print(f"parameters: {counts['total']:,} ({counts['total'] / 1e6:.2f} M), of which "
          f"{counts['unused']:,} not in the graph (style MLP, U-Net toRGB); noise buffers: "
          f"{counts['buffers']:,} values; noise: {noise}")
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB, batch "
          f"{'declared 1' if args.batch1 else 'dynamic'}, opset {OPSET}) in "
          f"{time.time() - t0:.1f} s")

    if not args.no_check:
        x = gpen_export.sample_input(size)
        y = gpen_export.session(args.out).run(["output"], {"input": x})[0]
        finite = bool(np.isfinite(y).all())
        print(f"sample output: finite={finite} min={y.min():.3f} max={y.max():.3f} "
              f"mean={y.mean():.3f} std={y.std():.3f} "
              f"(share in [-1,1]: {np.mean(np.abs(y) <= 1):.3f})")
        if not finite:
            print("error: non-finite output", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
