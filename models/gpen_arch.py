"""GPEN-BFR architecture description: official state-dict names and shapes, parameter counts,
seeded random weights.

Mirrors yangxy/GPEN face_model/gpen_model.py (class FullGenerator with isconcat=True). Nothing
here allocates a network: the spec is a list of (name, shape, kind) with kind "param" (an
nn.Parameter, counted by PyTorch as a parameter) or "buffer" (a registered buffer: the fixed
blur / upsample kernels, which official checkpoints also contain).

Pure numpy; no torch.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

STYLE_DIM = 512
N_MLP = 8
LR_MLP = 0.01
BLUR_KERNEL = (1, 3, 3, 1)

# Official GPEN-BFR configurations: size -> (channel_multiplier, narrow).
CONFIGS = {
    256: (1, 0.5),
    512: (2, 1.0),
    1024: (2, 1.0),
    2048: (2, 1.0),
}


def channels(channel_multiplier: int, narrow: float) -> dict[int, int]:
    """The `channels` table of the official Generator / FullGenerator."""
    return {
        4: int(512 * narrow),
        8: int(512 * narrow),
        16: int(512 * narrow),
        32: int(512 * narrow),
        64: int(256 * channel_multiplier * narrow),
        128: int(128 * channel_multiplier * narrow),
        256: int(64 * channel_multiplier * narrow),
        512: int(32 * channel_multiplier * narrow),
        1024: int(16 * channel_multiplier * narrow),
        2048: int(8 * channel_multiplier * narrow),
    }


def config(size: int, channel_multiplier: int | None = None, narrow: float | None = None):
    """(channel_multiplier, narrow) for a size, official values unless overridden."""
    cm, nw = CONFIGS.get(size, (2, 1.0))
    if channel_multiplier is not None:
        cm = channel_multiplier
    if narrow is not None:
        nw = narrow
    return cm, nw


def state_dict_spec(size: int, channel_multiplier: int | None = None,
                    narrow: float | None = None) -> "OrderedDict[str, tuple[tuple[int, ...], str]]":
    """Every entry of FullGenerator(size, 512, 8, cm, narrow=narrow).state_dict(), in PyTorch's
    order (a module's own parameters, then its buffers, then its children in registration
    order), as name -> (shape, "param" | "buffer")."""
    cm, nw = config(size, channel_multiplier, narrow)
    ch = channels(cm, nw)
    log_size = int(math.log2(size))
    if 2 ** log_size != size or size < 8:
        raise ValueError(f"size must be a power of two >= 8, got {size}")
    fm = 2  # feat_multiplier with isconcat=True
    spec: "OrderedDict[str, tuple[tuple[int, ...], str]]" = OrderedDict()

    def add(name, shape, kind="param"):
        spec[name] = (tuple(int(s) for s in shape), kind)

    def modconv(prefix, cin, cout, k, upsample=False):
        # ModulatedConv2d: own param `weight`; children: blur (if upsample), modulation
        add(f"{prefix}.weight", (1, cout, cin, k, k))
        if upsample:
            add(f"{prefix}.blur.kernel", (4, 4), "buffer")
        add(f"{prefix}.modulation.weight", (cin, STYLE_DIM))
        add(f"{prefix}.modulation.bias", (cin,))

    def styled(prefix, cin, cout, upsample=False):
        modconv(f"{prefix}.conv", cin, cout, 3, upsample)
        add(f"{prefix}.noise.weight", (1,))
        add(f"{prefix}.activate.bias", (cout * fm,))

    def to_rgb(prefix, cin, upsample=True):
        add(f"{prefix}.bias", (1, 3, 1, 1))
        if upsample:
            add(f"{prefix}.upsample.kernel", (4, 4), "buffer")
        modconv(f"{prefix}.conv", cin, 3, 1)

    g = "generator"
    for i in range(1, N_MLP + 1):  # style.0 is PixelNorm (no state)
        add(f"{g}.style.{i}.weight", (STYLE_DIM, STYLE_DIM))
        add(f"{g}.style.{i}.bias", (STYLE_DIM,))
    add(f"{g}.input.input", (1, ch[4], 4, 4))
    styled(f"{g}.conv1", ch[4], ch[4])
    to_rgb(f"{g}.to_rgb1", ch[4] * fm, upsample=False)
    in_ch = ch[4]
    for i in range(3, log_size + 1):
        out_ch = ch[2 ** i]
        k = 2 * (i - 3)
        styled(f"{g}.convs.{k}", in_ch * fm, out_ch, upsample=True)
        styled(f"{g}.convs.{k + 1}", out_ch * fm, out_ch)
        in_ch = out_ch
    in_ch = ch[4]
    for i in range(3, log_size + 1):
        out_ch = ch[2 ** i]
        to_rgb(f"{g}.to_rgbs.{i - 3}", out_ch * fm)
    # encoder: ecd0 = Sequential(ConvLayer(3, ch[size], 1)) -> [EqualConv2d(no bias), FusedLeakyReLU]
    add("ecd0.0.0.weight", (ch[size], 3, 1, 1))
    add("ecd0.0.1.bias", (ch[size],))
    in_ch = ch[size]
    for i in range(log_size, 2, -1):
        out_ch = ch[2 ** (i - 1)]
        name = f"ecd{log_size - i + 1}.0"
        # ConvLayer(downsample=True) -> [Blur, EqualConv2d(no bias), FusedLeakyReLU]
        add(f"{name}.0.kernel", (4, 4), "buffer")
        add(f"{name}.1.weight", (out_ch, in_ch, 3, 3))
        add(f"{name}.2.bias", (out_ch,))
        in_ch = out_ch
    add("final_linear.0.weight", (STYLE_DIM, ch[4] * 16))
    add("final_linear.0.bias", (STYLE_DIM,))
    return spec


def count_parameters(size: int, channel_multiplier: int | None = None,
                     narrow: float | None = None) -> dict[str, int]:
    """Parameter count as `sum(p.numel() for p in model.parameters())` gives it.

    Returns {"total", "noise_weights" (the scalar NoiseInjection.weight parameters, included in
    total), "buffers" (blur kernels, not included)}."""
    spec = state_dict_spec(size, channel_multiplier, narrow)
    total = sum(int(np.prod(s)) for s, kind in spec.values() if kind == "param")
    noise = sum(int(np.prod(s)) for n, (s, kind) in spec.items() if n.endswith(".noise.weight"))
    buffers = sum(int(np.prod(s)) for s, kind in spec.values() if kind == "buffer")
    return {"total": total, "noise_weights": noise, "buffers": buffers}


def make_kernel(k=BLUR_KERNEL) -> np.ndarray:
    """make_kernel of the official code: outer product, normalised to sum 1 (float32)."""
    k = np.asarray(k, dtype=np.float32)
    k = k[None, :] * k[:, None]
    return (k / k.sum()).astype(np.float32)


def buffer_value(name: str) -> np.ndarray:
    """The value PyTorch registers for a buffer of the spec."""
    if name.endswith(".blur.kernel") and ".conv." in name:
        return make_kernel() * 4.0  # Blur(..., upsample_factor=2)
    if name.endswith(".upsample.kernel"):
        return make_kernel() * 4.0  # Upsample(factor=2)
    return make_kernel()  # Blur in a downsampling ConvLayer


def random_state_dict(size: int, seed: int = 0, channel_multiplier: int | None = None,
                      narrow: float | None = None, realistic: bool = True
                      ) -> "OrderedDict[str, np.ndarray]":
    """Seeded random weights with official names (float32), buffers included.

    Follows the official initialisation (weights ~ N(0,1) used with the equalised-lr scale,
    mapping weights N(0,1)/lr_mul, modulation bias 1, other biases 0) with two changes when
    `realistic` (default), so the random model behaves like a trained one in magnitude:
      - NoiseInjection weights (official init 0, which would cut the encoder off the decoder)
        ~ U(0.2, 0.6), and biases ~ N(0, 0.1^2) instead of 0;
      - ToRGB weights scaled by 0.3, so the output image has a standard deviation of about
        0.3-0.6 (92-100 % of values inside [-1, 1]) instead of several units.
    """
    rng = np.random.default_rng(seed)
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for name, (shape, kind) in state_dict_spec(size, channel_multiplier, narrow).items():
        if kind == "buffer":
            out[name] = buffer_value(name)
            continue
        if name.endswith(".noise.weight"):
            v = rng.uniform(0.2, 0.6, shape) if realistic else np.zeros(shape)
        elif name.endswith("modulation.bias"):
            v = np.ones(shape)
        elif name.endswith(".bias"):
            v = rng.normal(0.0, 0.1, shape) if realistic else np.zeros(shape)
            if ".style." in name:
                v = v / LR_MLP  # used as bias * lr_mul
        elif ".style." in name:
            v = rng.standard_normal(shape) / LR_MLP
        else:
            v = rng.standard_normal(shape)
            if realistic and ".to_rgb" in name and name.endswith("conv.weight"):
                v = v * 0.3
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    return out
