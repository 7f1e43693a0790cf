"""Reference forward pass of GPEN's FullGenerator in plain numpy (float64 by default).

A direct transcription of yangxy/GPEN face_model/gpen_model.py (FullGenerator, Generator,
StyledConv, ModulatedConv2d with the per-sample modulated/demodulated weight and grouped
convolution, NoiseInjection with isconcat, ToRGB, ConvLayer, EqualLinear, PixelNorm) and of
op/upfirdn2d.py (upfirdn2d_native) and op/fused_act.py (fused_leaky_relu). It reads weights by
their official state-dict names and is written independently of the ONNX builder in
gpen_export.py, so the two can check each other. Slow but small: meant for tests at size 256.
"""
from __future__ import annotations

import itertools
import math

import numpy as np


def conv2d(x, w, stride=1, padding=0):
    """F.conv2d for x [N,C,H,W], w [O,C,kh,kw] (cross-correlation)."""
    n, c, h, wd = x.shape
    o, c2, kh, kw = w.shape
    assert c == c2, (c, c2)
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (x.shape[2] - kh) // stride + 1
    ow = (x.shape[3] - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("oc,nchw->nohw", w[:, :, i, j], patch, optimize=True)
    return out


def conv_transpose2d(x, w, stride=2):
    """F.conv_transpose2d with padding 0, w [C_in, O, kh, kw]."""
    n, c, h, wd = x.shape
    c2, o, kh, kw = w.shape
    assert c == c2
    out = np.zeros((n, o, (h - 1) * stride + kh, (wd - 1) * stride + kw), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i:i + stride * (h - 1) + 1:stride, j:j + stride * (wd - 1) + 1:stride] += \
                np.einsum("co,nchw->nohw", w[:, :, i, j], x, optimize=True)
    return out


def upfirdn2d(x, kernel, up=1, down=1, pad=(0, 0)):
    """upfirdn2d_native of the official code, with (pad0, pad1) on both axes."""
    pad0, pad1 = pad
    n, c, h, w = x.shape
    kh, kw = kernel.shape
    # upsample by zero insertion
    u = np.zeros((n, c, h * up, w * up), dtype=x.dtype)
    u[:, :, ::up, ::up] = x
    u = np.pad(u, ((0, 0), (0, 0), (max(pad0, 0), max(pad1, 0)), (max(pad0, 0), max(pad1, 0))))
    u = u[:, :, max(-pad0, 0):u.shape[2] - max(-pad1, 0), max(-pad0, 0):u.shape[3] - max(-pad1, 0)]
    # convolution with the flipped kernel, i.e. correlation with flip(kernel), per channel
    k = kernel[::-1, ::-1]
    oh, ow = u.shape[2] - kh + 1, u.shape[3] - kw + 1
    out = np.zeros((n, c, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out += k[i, j] * u[:, :, i:i + oh, j:j + ow]
    return out[:, :, ::down, ::down]


def fused_leaky_relu(x, bias, negative_slope=0.2, scale=2 ** 0.5):
    b = bias.reshape((1, -1) + (1,) * (x.ndim - 2))
    y = x + b
    return scale * np.where(y >= 0, y, y * negative_slope)


class Reference:
    def __init__(self, state_dict, size, channel_multiplier, narrow, style_dim=512, n_mlp=8,
                 lr_mlp=0.01, dtype=np.float64):
        self.sd = {k: np.asarray(v, dtype=dtype) for k, v in state_dict.items()}
        self.size, self.style_dim, self.n_mlp, self.lr_mlp = size, style_dim, n_mlp, lr_mlp
        self.dtype = dtype
        self.log_size = int(math.log(size, 2))
        self.channels = {
            4: int(512 * narrow), 8: int(512 * narrow), 16: int(512 * narrow),
            32: int(512 * narrow), 64: int(256 * channel_multiplier * narrow),
            128: int(128 * channel_multiplier * narrow), 256: int(64 * channel_multiplier * narrow),
            512: int(32 * channel_multiplier * narrow), 1024: int(16 * channel_multiplier * narrow),
            2048: int(8 * channel_multiplier * narrow),
        }
        k = np.array([1, 3, 3, 1], dtype=dtype)
        k = k[None, :] * k[:, None]
        self.blur_kernel = k / k.sum()

    # --- building blocks -------------------------------------------------------------------
    def equal_linear(self, prefix, x, lr_mul=1.0, activation=False):
        w = self.sd[prefix + ".weight"]
        b = self.sd[prefix + ".bias"]
        scale = (1 / math.sqrt(w.shape[1])) * lr_mul
        out = x @ (w * scale).T
        if activation:
            return fused_leaky_relu(out, b * lr_mul)
        return out + b * lr_mul

    def modulated_conv(self, prefix, x, style, demodulate=True, upsample=False):
        batch, in_channel, height, width = x.shape
        weight0 = self.sd[prefix + ".weight"]  # [1, O, C, k, k]
        _, out_channel, _, k, _ = weight0.shape
        scale = 1 / math.sqrt(in_channel * k ** 2)
        s = self.equal_linear(prefix + ".modulation", style)  # [B, C]
        outs = []
        for bi in range(batch):  # the grouped convolution, one group per sample
            weight = scale * weight0[0] * s[bi][None, :, None, None]  # [O, C, k, k]
            if demodulate:
                demod = 1 / np.sqrt((weight ** 2).sum(axis=(1, 2, 3)) + 1e-8)
                weight = weight * demod[:, None, None, None]
            xi = x[bi:bi + 1]
            if upsample:
                out = conv_transpose2d(xi, weight.transpose(1, 0, 2, 3), stride=2)
                # Blur(blur_kernel, pad=(pad0, pad1), upsample_factor=2)
                factor = 2
                p = (4 - factor) - (k - 1)
                pad = ((p + 1) // 2 + factor - 1, p // 2 + 1)
                out = upfirdn2d(out, self.blur_kernel * factor ** 2, pad=pad)
            else:
                out = conv2d(xi, weight, padding=k // 2)
            outs.append(out)
        return np.concatenate(outs, axis=0)

    def styled_conv(self, prefix, x, style, noise, upsample=False):
        out = self.modulated_conv(prefix + ".conv", x, style, upsample=upsample)
        nw = self.sd[prefix + ".noise.weight"]
        out = np.concatenate([out, nw * noise], axis=1)  # NoiseInjection(isconcat=True)
        return fused_leaky_relu(out, self.sd[prefix + ".activate.bias"])

    def to_rgb(self, prefix, x, style, skip=None):
        out = self.modulated_conv(prefix + ".conv", x, style, demodulate=False)
        out = out + self.sd[prefix + ".bias"]
        if skip is not None:
            factor = 2
            p = 4 - factor
            pad = ((p + 1) // 2 + factor - 1, p // 2)
            out = out + upfirdn2d(skip, self.blur_kernel * factor ** 2, up=2, pad=pad)
        return out

    def conv_layer(self, prefix, x, downsample):
        if downsample:
            w = self.sd[prefix + ".1.weight"]
            k = w.shape[-1]
            p = (4 - 2) + (k - 1)
            x = upfirdn2d(x, self.blur_kernel, pad=((p + 1) // 2, p // 2))
            scale = 1 / math.sqrt(w.shape[1] * k ** 2)
            out = conv2d(x, w * scale, stride=2, padding=0)
            return fused_leaky_relu(out, self.sd[prefix + ".2.bias"])
        w = self.sd[prefix + ".0.weight"]
        k = w.shape[-1]
        scale = 1 / math.sqrt(w.shape[1] * k ** 2)
        out = conv2d(x, w * scale, stride=1, padding=k // 2)
        return fused_leaky_relu(out, self.sd[prefix + ".1.bias"])

    # --- networks ------------------------------------------------------------------------
    def generator(self, style_in, noise):
        g = "generator"
        x = style_in
        x = x / np.sqrt(np.mean(x ** 2, axis=1, keepdims=True) + 1e-8)  # PixelNorm
        for i in range(1, self.n_mlp + 1):
            x = self.equal_linear(f"{g}.style.{i}", x, lr_mul=self.lr_mlp, activation=True)
        latent = x  # a single style: every layer gets the same latent
        batch = latent.shape[0]
        const = self.sd[f"{g}.input.input"]
        out = np.repeat(const, batch, axis=0)
        out = self.styled_conv(f"{g}.conv1", out, latent, noise[0])
        skip = self.to_rgb(f"{g}.to_rgb1", out, latent)
        n_levels = self.log_size - 2
        for lvl in range(n_levels):
            out = self.styled_conv(f"{g}.convs.{2 * lvl}", out, latent, noise[1 + 2 * lvl],
                                   upsample=True)
            out = self.styled_conv(f"{g}.convs.{2 * lvl + 1}", out, latent, noise[2 + 2 * lvl])
            skip = self.to_rgb(f"{g}.to_rgbs.{lvl}", out, latent, skip)
        return skip

    def __call__(self, inputs):
        x = np.asarray(inputs, dtype=self.dtype)
        noise = []
        x = self.conv_layer("ecd0.0", x, downsample=False)
        noise.append(x)
        for i in range(1, self.log_size - 1):
            x = self.conv_layer(f"ecd{i}.0", x, downsample=True)
            noise.append(x)
        flat = x.reshape(x.shape[0], -1)
        outs = self.equal_linear("final_linear.0", flat, activation=True)
        noise = list(itertools.chain.from_iterable(itertools.repeat(v, 2) for v in noise))[::-1]
        return self.generator(outs, noise[1:])


def forward(state_dict, x, size, channel_multiplier, narrow, dtype=np.float64):
    return Reference(state_dict, size, channel_multiplier, narrow, dtype=dtype)(x)
