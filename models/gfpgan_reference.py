"""Reference forward pass of GFPGANv1Clean in plain numpy (float64 by default).

In: a state dict with the official names (the keys of GFPGANv1.3.pth / GFPGANv1.4.pth, numpy
arrays) and images [N,3,S,S] RGB in [-1,1]; out: the restored images [N,3,S,S] (not clamped),
the first output of GFPGANv1Clean.forward(x, return_rgb=False, randomize_noise=False).

A direct transcription of TencentARC/GFPGAN gfpgan/archs/gfpganv1_clean_arch.py (GFPGANv1Clean,
ResBlock, StyleGAN2GeneratorCSFT) and gfpgan/archs/stylegan2_clean_arch.py (ModulatedConv2d
with the per-sample modulated / demodulated weight and the grouped convolution, StyleConv,
ToRGB, ConstantInput), Apache-2.0, in GFPGANer's configuration (input_is_latent=True,
different_w=True; sft_half as given), with F.interpolate(mode='bilinear', align_corners=False)
written out from PyTorch's definition (source index (dst + 0.5) / scale_factor - 0.5, clamped
at 0, neighbours clamped at the edge). Noise: the decoder's fixed noise buffers
(`stylegan_decoder.noises.noiseK`, the official randomize_noise=False path), zeros where the
state dict has none. Written independently of the ONNX builder in gfpgan_export.py, so the two
check each other. Slow: meant for small configurations in tests.
"""
from __future__ import annotations

import math

import numpy as np


def conv2d(x, w, b=None, padding=0, groups=1):
    """F.conv2d (stride 1) for x [N,C,H,W], w [O,C/groups,kh,kw]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    assert c == cg * groups, (c, cg, groups)
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow), dtype=x.dtype)
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "oc,nchw->nohw", ws[:, :, i, j], xs[:, :, i:i + oh, j:j + ow], optimize=True)
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def leaky_relu(x, slope=0.2):
    return np.where(x >= 0, x, x * slope)


def _linear_taps(n_in, n_out, scale_factor):
    """Indices and weights of PyTorch's 1-D linear interpolation (align_corners=False): the
    source coordinate of output i is (i + 0.5) / scale_factor - 0.5, negative ones clamped to
    0; the upper neighbour is clamped to the last input."""
    src = (np.arange(n_out) + 0.5) / scale_factor - 0.5
    src = np.maximum(src, 0.0)
    i0 = np.floor(src).astype(np.int64)
    i0 = np.minimum(i0, n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = src - i0
    return i0, i1, lam


def interpolate_bilinear(x, scale_factor):
    """F.interpolate(x, scale_factor=s, mode='bilinear', align_corners=False)."""
    n, c, h, w = x.shape
    oh, ow = int(math.floor(h * scale_factor)), int(math.floor(w * scale_factor))
    r0, r1, rl = _linear_taps(h, oh, scale_factor)
    c0, c1, cl = _linear_taps(w, ow, scale_factor)
    rows = x[:, :, r0, :] * (1 - rl)[None, None, :, None] + x[:, :, r1, :] * rl[None, None, :, None]
    return rows[:, :, :, c0] * (1 - cl) + rows[:, :, :, c1] * cl


class Reference:
    def __init__(self, state_dict, sft_half=True, dtype=np.float64):
        self.sd = {k: np.asarray(v, dtype=dtype) for k, v in state_dict.items()}
        self.sft_half = sft_half
        self.used: set[str] = set()  # the state-dict entries the forward pass read
        n = sum(1 for k in self.sd if k.startswith("stylegan_decoder.to_rgbs.") and
                k.endswith(".modulated_conv.weight"))
        self.log_size = n + 2
        self.num_layers = 2 * n + 1

    def p(self, name):
        self.used.add(name)
        return self.sd[name]

    # --- U-Net ----------------------------------------------------------------------------
    def conv(self, prefix, x, bias=True):
        w = self.p(prefix + ".weight")
        return conv2d(x, w, self.p(prefix + ".bias") if bias else None, padding=w.shape[-1] // 2)

    def res_block(self, prefix, x, scale_factor):
        out = leaky_relu(self.conv(prefix + ".conv1", x))
        out = interpolate_bilinear(out, scale_factor)
        out = leaky_relu(self.conv(prefix + ".conv2", out))
        skip = self.conv(prefix + ".skip", interpolate_bilinear(x, scale_factor), bias=False)
        return out + skip

    # --- StyleGAN2 decoder ----------------------------------------------------------------
    def linear(self, prefix, x):
        return x @ self.p(prefix + ".weight").T + self.p(prefix + ".bias")

    def modulated_conv(self, prefix, x, style, demodulate, upsample=False):
        b, c = x.shape[:2]
        w = self.p(prefix + ".weight")  # [1, O, C, k, k]
        _, cout, _, k, _ = w.shape
        s = self.linear(prefix + ".modulation", style).reshape(b, 1, c, 1, 1)
        weight = w * s  # [b, O, C, k, k]
        if demodulate:
            demod = 1.0 / np.sqrt((weight ** 2).sum(axis=(2, 3, 4)) + 1e-8)
            weight = weight * demod.reshape(b, cout, 1, 1, 1)
        weight = weight.reshape(b * cout, c, k, k)
        if upsample:
            x = interpolate_bilinear(x, 2)
        h, wd = x.shape[2:]
        out = conv2d(x.reshape(1, b * c, h, wd), weight, padding=k // 2, groups=b)
        return out.reshape(b, cout, *out.shape[2:])

    def style_conv(self, prefix, x, style, noise, upsample=False):
        out = self.modulated_conv(prefix + ".modulated_conv", x, style, True, upsample) * 2 ** 0.5
        out = out + self.p(prefix + ".weight") * noise
        out = out + self.p(prefix + ".bias")
        return leaky_relu(out)

    def to_rgb(self, prefix, x, style, skip=None):
        out = self.modulated_conv(prefix + ".modulated_conv", x, style, False)
        out = out + self.p(prefix + ".bias")
        if skip is not None:
            out = out + interpolate_bilinear(skip, 2)
        return out

    def noise(self, k):
        name = f"stylegan_decoder.noises.noise{k}"
        if name in self.sd:
            return self.p(name)
        r = 2 ** ((k + 5) // 2)
        return np.zeros((1, 1, r, r))

    def decoder(self, latent, conditions):
        d = "stylegan_decoder"
        b = latent.shape[0]
        out = np.repeat(self.p(f"{d}.constant_input.weight"), b, axis=0)
        out = self.style_conv(f"{d}.style_conv1", out, latent[:, 0], self.noise(0))
        skip = self.to_rgb(f"{d}.to_rgb1", out, latent[:, 1])
        i = 1
        for lvl in range(self.log_size - 2):
            out = self.style_conv(f"{d}.style_convs.{2 * lvl}", out, latent[:, i],
                                  self.noise(2 * lvl + 1), upsample=True)
            if i < len(conditions):
                if self.sft_half:
                    half = out.shape[1] // 2
                    same, sft = out[:, :half], out[:, half:]
                    out = np.concatenate([same, sft * conditions[i - 1] + conditions[i]], axis=1)
                else:
                    out = out * conditions[i - 1] + conditions[i]
            out = self.style_conv(f"{d}.style_convs.{2 * lvl + 1}", out, latent[:, i + 1],
                                  self.noise(2 * lvl + 2))
            skip = self.to_rgb(f"{d}.to_rgbs.{lvl}", out, latent[:, i + 2], skip)
            i += 2
        return skip

    def __call__(self, x):
        x = np.asarray(x, dtype=next(iter(self.sd.values())).dtype)
        levels = self.log_size - 2
        feat = leaky_relu(self.conv("conv_body_first", x))
        unet_skips = []
        for i in range(levels):
            feat = self.res_block(f"conv_body_down.{i}", feat, 0.5)
            unet_skips.insert(0, feat)
        feat = leaky_relu(self.conv("final_conv", feat))
        style_code = self.linear("final_linear", feat.reshape(feat.shape[0], -1))
        style_code = style_code.reshape(style_code.shape[0], -1, 512)  # different_w
        conditions = []
        for i in range(levels):
            feat = feat + unet_skips[i]
            feat = self.res_block(f"conv_body_up.{i}", feat, 2)
            for branch in ("condition_scale", "condition_shift"):
                h = leaky_relu(self.conv(f"{branch}.{i}.0", feat))
                conditions.append(self.conv(f"{branch}.{i}.2", h))
        # input_is_latent=True: the style codes go to the decoder as latents (no style MLP)
        return self.decoder(style_code, conditions)


def forward(state_dict, x, sft_half=True, dtype=np.float64):
    return Reference(state_dict, sft_half=sft_half, dtype=dtype)(x)
