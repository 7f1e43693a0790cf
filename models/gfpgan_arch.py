"""GFPGANv1Clean architecture description: official state-dict names and shapes, parameter
counts, seeded random weights.

Mirrors TencentARC/GFPGAN gfpgan/archs/gfpganv1_clean_arch.py (GFPGANv1Clean, ResBlock,
StyleGAN2GeneratorCSFT) and gfpgan/archs/stylegan2_clean_arch.py (StyleGAN2GeneratorClean,
StyleConv, ModulatedConv2d, ToRGB, ConstantInput), both Apache-2.0, in the configuration
GFPGAN v1.2 / v1.3 / v1.4 are published with (gfpgan/utils.py, GFPGANer with arch='clean'):
out_size 512, num_style_feat 512, channel_multiplier 2, num_mlp 8, input_is_latent=True,
different_w=True, narrow 1, sft_half=True. Size, channel multiplier, narrow and sft_half can be
changed here (smaller networks of the same structure, for tests).

Nothing here allocates a network: the spec is an ordered mapping name -> (shape, kind) with
kind "param" (an nn.Parameter: counted by `sum(p.numel() for p in model.parameters())`) or
"buffer" (registered buffers: the decoder's fixed noise maps `stylegan_decoder.noises.noiseK`,
which official checkpoints hold too).

Pure numpy; no torch.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

STYLE_DIM = 512  # num_style_feat
N_MLP = 8  # num_mlp
LRELU = 0.2

# The published configuration (GFPGANer, arch='clean').
SIZE = 512
CHANNEL_MULTIPLIER = 2
NARROW = 1.0
SFT_HALF = True


def channels(channel_multiplier: float, narrow: float) -> dict[int, int]:
    """The `channels` table of StyleGAN2GeneratorClean (the decoder); GFPGANv1Clean's U-Net uses
    the same table with narrow * 0.5."""
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
    }


def num_layers(size: int) -> int:
    """StyleConv layers of the decoder (= its noise maps): conv1 + 2 per level."""
    return (int(math.log2(size)) - 2) * 2 + 1


def num_latent(size: int) -> int:
    """Latent codes of the decoder (different_w: one per StyleConv and ToRGB)."""
    return int(math.log2(size)) * 2 - 2


def noise_shape(layer: int) -> tuple[int, int, int, int]:
    r = 2 ** ((layer + 5) // 2)
    return (1, 1, r, r)


def state_dict_spec(size: int = SIZE, channel_multiplier: float = CHANNEL_MULTIPLIER,
                    narrow: float = NARROW, sft_half: bool = SFT_HALF
                    ) -> "OrderedDict[str, tuple[tuple[int, ...], str]]":
    """Every entry of GFPGANv1Clean(size, 512, cm, different_w=True, narrow=narrow,
    sft_half=sft_half).state_dict(), in PyTorch's order (a module's own parameters, then its own
    buffers, then its children in registration order), as name -> (shape, "param" | "buffer")."""
    log_size = int(math.log2(size))
    if 2 ** log_size != size or not 8 <= size <= 1024:
        raise ValueError(f"size must be a power of two in [8, 1024], got {size}")
    dec = channels(channel_multiplier, narrow)
    unet = channels(channel_multiplier, narrow * 0.5)
    if min(dec[size], unet[size]) < 1 or (sft_half and dec[size] % 2):
        raise ValueError(f"channel_multiplier {channel_multiplier} and narrow {narrow} leave "
                         f"no channels at size {size}")
    spec: "OrderedDict[str, tuple[tuple[int, ...], str]]" = OrderedDict()

    def add(name, shape, kind="param"):
        spec[name] = (tuple(int(s) for s in shape), kind)

    def conv(prefix, cin, cout, k, bias=True):  # nn.Conv2d
        add(f"{prefix}.weight", (cout, cin, k, k))
        if bias:
            add(f"{prefix}.bias", (cout,))

    def linear(prefix, cin, cout):  # nn.Linear
        add(f"{prefix}.weight", (cout, cin))
        add(f"{prefix}.bias", (cout,))

    def modconv(prefix, cin, cout, k):
        # ModulatedConv2d: child `modulation` registered first, but own parameters come first
        add(f"{prefix}.weight", (1, cout, cin, k, k))
        linear(f"{prefix}.modulation", STYLE_DIM, cin)

    def style_conv(prefix, cin, cout):
        add(f"{prefix}.weight", (1,))  # noise strength
        add(f"{prefix}.bias", (1, cout, 1, 1))
        modconv(f"{prefix}.modulated_conv", cin, cout, 3)

    def to_rgb(prefix, cin):
        add(f"{prefix}.bias", (1, 3, 1, 1))
        modconv(f"{prefix}.modulated_conv", cin, 3, 1)

    def res_block(prefix, cin, cout):
        conv(f"{prefix}.conv1", cin, cin, 3)
        conv(f"{prefix}.conv2", cin, cout, 3)
        conv(f"{prefix}.skip", cin, cout, 1, bias=False)

    # U-Net encoder
    conv("conv_body_first", 3, unet[size], 1)
    cin = unet[size]
    for i in range(log_size, 2, -1):
        cout = unet[2 ** (i - 1)]
        res_block(f"conv_body_down.{log_size - i}", cin, cout)
        cin = cout
    conv("final_conv", cin, unet[4], 3)
    # U-Net decoder
    cin = unet[4]
    for i in range(3, log_size + 1):
        cout = unet[2 ** i]
        res_block(f"conv_body_up.{i - 3}", cin, cout)
        cin = cout
    for i in range(3, log_size + 1):  # toRGB: the intermediate images (return_rgb)
        conv(f"toRGB.{i - 3}", unet[2 ** i], 3, 1)
    linear("final_linear", unet[4] * 16, num_latent(size) * STYLE_DIM)  # different_w
    # StyleGAN2 decoder with SFT
    d = "stylegan_decoder"
    for i in range(N_MLP):  # style_mlp: NormStyleCode, (Linear, LeakyReLU) x 8
        linear(f"{d}.style_mlp.{2 * i + 1}", STYLE_DIM, STYLE_DIM)
    add(f"{d}.constant_input.weight", (1, dec[4], 4, 4))
    style_conv(f"{d}.style_conv1", dec[4], dec[4])
    to_rgb(f"{d}.to_rgb1", dec[4])
    cin = dec[4]
    for i in range(3, log_size + 1):
        cout = dec[2 ** i]
        style_conv(f"{d}.style_convs.{2 * (i - 3)}", cin, cout)
        style_conv(f"{d}.style_convs.{2 * (i - 3) + 1}", cout, cout)
        cin = cout
    for i in range(3, log_size + 1):
        to_rgb(f"{d}.to_rgbs.{i - 3}", dec[2 ** i])
    for k in range(num_layers(size)):
        add(f"{d}.noises.noise{k}", noise_shape(k), "buffer")
    # SFT condition branches (scale, shift): Conv, LeakyReLU, Conv
    for name in ("condition_scale", "condition_shift"):
        for i in range(3, log_size + 1):
            c = unet[2 ** i]
            conv(f"{name}.{i - 3}.0", c, c, 3)
            conv(f"{name}.{i - 3}.2", c, c if sft_half else 2 * c, 3)
    return spec


def count_parameters(size: int = SIZE, channel_multiplier: float = CHANNEL_MULTIPLIER,
                     narrow: float = NARROW, sft_half: bool = SFT_HALF) -> dict[str, int]:
    """Parameter count as `sum(p.numel() for p in model.parameters())` gives it.

    Returns {"total", "unused" (parameters the restored image does not depend on, included in
    total: the style MLP, skipped with input_is_latent=True, and the U-Net's intermediate toRGB
    convolutions, used only with return_rgb), "buffers" (the noise maps, not included)}."""
    spec = state_dict_spec(size, channel_multiplier, narrow, sft_half)
    total = sum(int(np.prod(s)) for s, kind in spec.values() if kind == "param")
    unused = sum(int(np.prod(s)) for n, (s, kind) in spec.items()
                 if kind == "param" and is_unused(n))
    buffers = sum(int(np.prod(s)) for s, kind in spec.values() if kind == "buffer")
    return {"total": total, "unused": unused, "buffers": buffers}


def is_unused(name: str) -> bool:
    """Parameters the restored image does not depend on (see count_parameters)."""
    return name.startswith("stylegan_decoder.style_mlp.") or name.startswith("toRGB.")


def infer_config(sd) -> tuple[int, float, float, bool]:
    """(size, channel_multiplier, narrow, sft_half) of a state dict, from its shapes."""
    n = sum(1 for k in sd if k.startswith("stylegan_decoder.to_rgbs.") and
            k.endswith(".modulated_conv.weight"))
    size = 2 ** (n + 2)
    c4 = int(np.shape(sd["stylegan_decoder.constant_input.weight"])[1])
    narrow = c4 / 512
    c_top = int(np.shape(sd[f"stylegan_decoder.to_rgbs.{n - 1}.modulated_conv.weight"])[2])
    candidates = [CHANNEL_MULTIPLIER, 1, 4, 0.5, 0.25, 8]
    cm = next((c for c in candidates if channels(c, narrow)[size] == c_top), CHANNEL_MULTIPLIER)
    if size <= 32:  # no level uses the multiplier: keep the official value
        cm = CHANNEL_MULTIPLIER
    scale = np.shape(sd["condition_scale.0.2.weight"])[0]
    sft_half = scale == np.shape(sd["condition_scale.0.0.weight"])[0]
    return size, cm, narrow, bool(sft_half)


def random_state_dict(size: int = SIZE, seed: int = 0,
                      channel_multiplier: float = CHANNEL_MULTIPLIER, narrow: float = NARROW,
                      sft_half: bool = SFT_HALF) -> "OrderedDict[str, np.ndarray]":
    """Seeded random weights with official names (float32), noise buffers included.

    Scaled so that the random network behaves like a trained one in magnitude (the official
    initialisation, PyTorch's defaults, shrinks the U-Net's activations layer after layer and
    starts the noise strengths at 0): convolutions followed by a leaky ReLU get He-normal
    weights (the two branches of a ResBlock scaled by sqrt(1/2) each, so that their sum keeps
    the variance; by 1/2 in the U-Net's decoding half, whose input is a sum of two feature
    maps), biases ~ N(0, 0.05^2), the SFT scale branch is 1 + small, its shift branch small,
    the modulations have bias 1 as in the official code, the noise strengths ~ U(0.05, 0.2),
    the noise maps and the constant input ~ N(0, 1) as initialised officially, and the ToRGB
    weights are small enough that the image stays mostly inside [-1, 1]."""
    rng = np.random.default_rng(seed)
    he = math.sqrt(2.0 / (1.0 + LRELU ** 2))
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    spec = state_dict_spec(size, channel_multiplier, narrow, sft_half)
    for name, (shape, kind) in spec.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if kind == "buffer":  # noise maps: torch.randn
            v = rng.standard_normal(shape)
        elif name.endswith(".modulation.bias"):
            v = np.ones(shape)
        elif name.endswith(".modulation.weight"):
            v = rng.standard_normal(shape) / math.sqrt(fan_in)
        elif name.endswith("modulated_conv.weight"):
            cin_k = int(np.prod(shape[2:]))
            v = rng.standard_normal(shape) / math.sqrt(cin_k)
            if ".to_rgb" in name:
                v = v * 0.15
        elif name.startswith("stylegan_decoder.style_conv") and name.endswith(".weight"):
            v = rng.uniform(0.05, 0.2, shape)  # noise strength
        elif name.endswith(".bias"):
            v = rng.normal(0.0, 0.05, shape)
            if name.startswith("condition_scale.") and name.endswith(".2.bias"):
                v = v + 1.0
        elif name == "stylegan_decoder.constant_input.weight":
            v = rng.standard_normal(shape)
        elif name.startswith("stylegan_decoder.style_mlp."):
            v = rng.standard_normal(shape) * he / math.sqrt(fan_in)
        elif name.startswith("condition_") and name.endswith(".2.weight"):
            v = rng.standard_normal(shape) * 0.2 / math.sqrt(fan_in)
        elif name.startswith(("conv_body_down.", "conv_body_up.")) and \
                name.endswith((".conv2.weight", ".skip.weight")):
            v = rng.standard_normal(shape) * he * math.sqrt(0.5) / math.sqrt(fan_in)
            if name.startswith("conv_body_up."):  # its input is feature + U-Net skip
                v = v * math.sqrt(0.5)
        elif name.startswith("toRGB.") or name == "final_linear.weight":
            v = rng.standard_normal(shape) / math.sqrt(fan_in)
        else:  # convolutions followed by a leaky ReLU
            v = rng.standard_normal(shape) * he / math.sqrt(fan_in)
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    return out
