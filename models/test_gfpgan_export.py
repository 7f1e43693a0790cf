"""Tests of the GFPGANv1Clean ONNX exporter (no torch needed).

    .deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'

The ONNX graph is checked against the independent numpy reference (gfpgan_reference.py) on
small networks of the real structure (sizes 32 and 64, narrow channels), so the whole file runs
in a few seconds on two CPU cores; the full 512 configuration is only counted.
"""
import contextlib
import hashlib
import io
import math
import os
import sys
import tempfile
import unittest
from collections import OrderedDict

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gfpgan_arch  # noqa: E402
import gfpgan_export  # noqa: E402
import gfpgan_reference  # noqa: E402
import gpen_export  # noqa: E402
import pth_io  # noqa: E402

# a small network of the real structure: 64x64, 4 levels, every layer kind present
SMALL = dict(size=64, channel_multiplier=2, narrow=0.25)
# the file scripts/test.sh builds for the Rust tests (models.toml: gfpgan-512-narrow-random)
RUST_TEST_FILE = dict(size=512, channel_multiplier=2, narrow=0.03125)


def official_count(size, cm, narrow, sft_half=True, style_dim=512, num_mlp=8):
    """sum(p.numel() for p in GFPGANv1Clean(...).parameters()), written from the constructors
    of gfpganv1_clean_arch.py / stylegan2_clean_arch.py module by module (independently of
    gfpgan_arch.state_dict_spec)."""
    def table(nw):
        return {r: int(512 * nw) if r <= 32 else int(2 ** 14 / r * cm * nw)
                for r in (4, 8, 16, 32, 64, 128, 256, 512, 1024)}
    dec, unet = table(narrow), table(narrow * 0.5)
    log = int(math.log2(size))
    conv = lambda i, o, k, bias=True: o * i * k * k + (o if bias else 0)  # noqa: E731
    linear = lambda i, o: o * i + o  # noqa: E731
    res = lambda i, o: conv(i, i, 3) + conv(i, o, 3) + conv(i, o, 1, bias=False)  # noqa: E731
    modconv = lambda i, o, k: o * i * k * k + linear(style_dim, i)  # noqa: E731
    n = conv(3, unet[size], 1)
    n += sum(res(unet[2 ** i], unet[2 ** (i - 1)]) for i in range(log, 2, -1))
    n += conv(unet[4], unet[4], 3)
    n += sum(res(unet[2 ** (i - 1)], unet[2 ** i]) for i in range(3, log + 1))
    n += sum(conv(unet[2 ** i], 3, 1) for i in range(3, log + 1))  # toRGB
    n += linear(unet[4] * 16, (2 * log - 2) * style_dim)  # final_linear, different_w
    n += num_mlp * linear(style_dim, style_dim)  # style_mlp
    n += dec[4] * 16  # constant_input
    style_conv = lambda i, o: 1 + o + modconv(i, o, 3)  # noqa: E731  noise weight, bias
    to_rgb = lambda i: 3 + modconv(i, 3, 1)  # noqa: E731
    n += style_conv(dec[4], dec[4]) + to_rgb(dec[4])
    for i in range(3, log + 1):
        n += style_conv(dec[2 ** (i - 1)], dec[2 ** i]) + style_conv(dec[2 ** i], dec[2 ** i])
        n += to_rgb(dec[2 ** i])
    for i in range(3, log + 1):  # condition_scale and condition_shift
        c = unet[2 ** i]
        n += 2 * (conv(c, c, 3) + conv(c, c if sft_half else 2 * c, 3))
    return n


class ParameterCounts(unittest.TestCase):
    def test_official_v14_count(self):
        """GFPGANer's network (GFPGANv1.3.pth / GFPGANv1.4.pth): 86.44 M parameters, of which
        2.1 M (the style MLP, the U-Net's toRGB) the restored image does not use, and 15 noise
        buffers (4x4 ... 512x512, 699,024 values)."""
        c = gfpgan_arch.count_parameters(512, 2, 1, True)
        self.assertEqual(c["total"], 86_444_252)
        self.assertEqual(c["total"], official_count(512, 2, 1))
        # style MLP: 8 x Linear(512, 512); toRGB: Conv2d(c, 3, 1) at 8 ... 512
        toRGB = sum(3 * c + 3 for c in (256, 256, 256, 256, 128, 64, 32))
        self.assertEqual(c["unused"], 8 * (512 * 512 + 512) + toRGB)
        self.assertEqual(c["buffers"], 16 + 2 * sum(4 ** i for i in range(3, 10)))
        spec = gfpgan_arch.state_dict_spec(512)
        self.assertEqual(sum(kind == "param" for _, kind in spec.values()), 270)
        self.assertEqual(sum(kind == "buffer" for _, kind in spec.values()), 15)

    def test_other_configurations(self):
        for size, cm, nw, half in ((512, 1, 1, True), (256, 2, 0.5, False), (64, 2, 0.25, True),
                                   (512, 2, 0.03125, True), (1024, 2, 1, True)):
            with self.subTest(size=size, cm=cm, narrow=nw, sft_half=half):
                self.assertEqual(gfpgan_arch.count_parameters(size, cm, nw, half)["total"],
                                 official_count(size, cm, nw, half))

    def test_random_state_dict_matches_spec_and_reference_reads_it(self):
        """The random weights have the spec's names, order and shapes; the reference forward
        pass reads every parameter but the unused ones, and every noise buffer."""
        sd = gfpgan_arch.random_state_dict(seed=3, **SMALL)
        spec = gfpgan_arch.state_dict_spec(**SMALL)
        self.assertEqual(list(sd), list(spec))
        for k, (shape, _) in spec.items():
            self.assertEqual(sd[k].shape, shape, k)
        ref = gfpgan_reference.Reference(sd)
        ref(gpen_export.sample_input(64, batch=1))
        self.assertEqual(ref.used, {k for k in spec if not gfpgan_arch.is_unused(k)})
        self.assertEqual(gfpgan_arch.infer_config(sd), (64, 2, 0.25, True))


class Interpolation(unittest.TestCase):
    def test_reference_matches_pytorch_bilinear(self):
        """F.interpolate(bilinear, align_corners=False) values PyTorch gives: x2 on a 2x2 ramp,
        and x0.5 as 2x2 means."""
        x = np.array([[1.0, 2.0], [3.0, 4.0]])[None, None]
        up = gfpgan_reference.interpolate_bilinear(x, 2)
        np.testing.assert_allclose(up[0, 0], [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5],
                                              [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]])
        y = np.random.default_rng(0).standard_normal((2, 3, 8, 8))
        down = gfpgan_reference.interpolate_bilinear(y, 0.5)
        np.testing.assert_allclose(down, y.reshape(2, 3, 4, 2, 4, 2).mean(axis=(3, 5)))


class Graph(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sd = gfpgan_arch.random_state_dict(seed=0, **SMALL)
        cls.model = gfpgan_export.build_model(cls.sd)
        onnx.checker.check_model(cls.model)
        cls.sess = gpen_export.session(cls.model)

    def test_io_contract(self):
        g = self.model.graph
        self.assertEqual([i.name for i in g.input], ["input"])
        self.assertEqual([o.name for o in g.output], ["output"])
        for vi in (g.input[0], g.output[0]):
            dims = vi.type.tensor_type.shape.dim
            self.assertEqual(dims[0].dim_param, "N")
            self.assertEqual([d.dim_value for d in dims[1:]], [3, 64, 64])
            self.assertEqual(vi.type.tensor_type.elem_type, onnx.TensorProto.FLOAT)
        ops = {n.op_type for n in g.node}
        self.assertTrue({"Resize", "AveragePool", "Slice", "Concat", "Conv"} <= ops, ops)
        self.assertFalse(ops & {"RandomNormal", "RandomNormalLike"})  # deterministic

    def test_equals_reference_batch_of_two(self):
        """Two different faces in one batch: the ONNX graph agrees with the float64 reference
        (the official per-sample grouped convolution) on each, within float32 rounding."""
        x = gpen_export.sample_input(64, batch=2, seed=5)
        y = self.sess.run(["output"], {"input": x})[0]
        ref = gfpgan_reference.forward(self.sd, x)
        err = np.abs(y - ref).max()
        self.assertLess(err, 2e-5 * max(1.0, np.abs(ref).max()), f"max abs diff {err}")
        self.assertGreater(np.abs(ref[0] - ref[1]).max(), 0.05)  # the faces do differ
        self.assertGreater(ref.std(), 0.05)  # not a trivially flat image
        singles = np.concatenate([self.sess.run(["output"], {"input": x[i:i + 1]})[0]
                                  for i in range(2)])
        self.assertLess(np.abs(singles - y).max(), 1e-5)

    def test_sft_on_all_channels(self):
        """sft_half=False (SFT on every channel), a 32x32 network."""
        sd = gfpgan_arch.random_state_dict(32, seed=4, channel_multiplier=2, narrow=0.125,
                                           sft_half=False)
        model = gfpgan_export.build_model(sd)
        x = gpen_export.sample_input(32, batch=2, seed=6)
        y = gpen_export.session(model).run(["output"], {"input": x})[0]
        ref = gfpgan_reference.forward(sd, x, sft_half=False)
        self.assertLess(np.abs(y - ref).max(), 2e-5 * max(1.0, np.abs(ref).max()))

    def test_batch1_declares_one_but_runs_any_batch(self):
        """--batch1 declares [1,3,S,S] (like the published files); with the declared batch
        replaced by a symbol, the same graph runs a batch of 3 and matches batch 1 runs."""
        m1 = gfpgan_export.build_model(self.sd, batch1=True)
        for vi in (m1.graph.input[0], m1.graph.output[0]):
            self.assertEqual([d.dim_value for d in vi.type.tensor_type.shape.dim], [1, 3, 64, 64])
        x = gpen_export.sample_input(64, batch=3, seed=7)
        s1 = gpen_export.session(m1)
        singles = np.concatenate([s1.run(["output"], {"input": x[i:i + 1]})[0] for i in range(3)])
        m = onnx.ModelProto()
        m.CopyFrom(m1)
        for vi in (m.graph.input[0], m.graph.output[0]):
            vi.type.tensor_type.shape.dim[0].dim_param = "batch"
        onnx.checker.check_model(m)
        y3 = gpen_export.session(m).run(["output"], {"input": x})[0]
        self.assertEqual(y3.shape, (3, 3, 64, 64))
        self.assertLess(np.abs(y3 - singles).max(), 1e-5)
        self.assertGreater(np.abs(y3[0] - y3[2]).max(), 0.05)

    def test_rust_test_file_configuration(self):
        """The configuration of models/gfpgan-512-narrow-random.onnx: the real structure at
        512 (7 levels, 16 latents), small, image-like output."""
        sd = gfpgan_arch.random_state_dict(seed=0, **RUST_TEST_FILE)
        model = gfpgan_export.build_model(sd, batch1=True)
        self.assertLess(model.ByteSize(), 10_000_000)
        y = gpen_export.session(model).run(["output"], {"input": gpen_export.sample_input(512)})[0]
        self.assertEqual(y.shape, (1, 3, 512, 512))
        self.assertTrue(np.isfinite(y).all())
        self.assertGreater(np.mean(np.abs(y) <= 1.0), 0.95)
        self.assertGreater(y.std(), 0.05)


class Checkpoint(unittest.TestCase):
    def test_official_checkpoint_round_trip(self):
        """A checkpoint laid out like GFPGAN's (torch zip, {"params_ema": state dict}, noise
        buffers included), exported by the CLI: metadata, and agreement with the reference."""
        sd = gfpgan_arch.random_state_dict(seed=11, **SMALL)
        with tempfile.TemporaryDirectory() as d:
            ckpt = os.path.join(d, "GFPGANv1.4.pth")
            out = os.path.join(d, "gfpgan.onnx")
            pth_io.save({"params_ema": sd}, ckpt)
            loaded = pth_io.load(ckpt)
            self.assertEqual(list(loaded), ["params_ema"])
            self.assertIsInstance(loaded["params_ema"], OrderedDict)
            self.assertEqual(list(loaded["params_ema"]), list(sd))
            for k in sd:
                np.testing.assert_array_equal(loaded["params_ema"][k], sd[k])
            with open(ckpt, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            with contextlib.redirect_stdout(io.StringIO()) as log:
                rc = gfpgan_export.main(["--checkpoint", ckpt, "--out", out, "--no-check"])
            self.assertEqual(rc, 0)
            self.assertIn("channel_multiplier=2, narrow=0.25, sft_half=True", log.getvalue())
            model = onnx.load(out)
            meta = {p.key: p.value for p in model.metadata_props}
            self.assertEqual(meta["gpen_video.weights"],
                             f"checkpoint GFPGANv1.4.pth sha256 {digest}")
            self.assertEqual(meta["gpen_video.size"], "64")
            self.assertEqual(meta["gpen_video.template"], "ffhq")
            self.assertIn("noise buffers", meta["gpen_video.noise"])
            self.assertEqual(model.graph.input[0].type.tensor_type.shape.dim[0].dim_param, "N")
            x = gpen_export.sample_input(64, batch=1, seed=2)
            y = gpen_export.session(out).run(["output"], {"input": x})[0]
        ref = gfpgan_reference.forward(sd, x)
        self.assertLess(np.abs(y - ref).max(), 2e-5 * max(1.0, np.abs(ref).max()))
        # the noise buffers do take part: without them (zeros) the image changes
        no_noise = OrderedDict((k, v) for k, v in sd.items() if ".noises." not in k)
        y0 = gpen_export.session(gfpgan_export.build_model(no_noise)).run(
            ["output"], {"input": x})[0]
        self.assertLess(np.abs(y0 - gfpgan_reference.forward(no_noise, x)).max(), 1e-4)
        self.assertGreater(np.abs(y0 - y).max(), 1e-3)

    def test_params_wrapper_and_flags(self):
        """A checkpoint wrapped as {"params": ...}; a --size contradicting it is refused."""
        sd = gfpgan_arch.random_state_dict(32, seed=1, channel_multiplier=2, narrow=0.125)
        with tempfile.TemporaryDirectory() as d:
            ckpt = os.path.join(d, "g.pth")
            pth_io.save({"params": sd}, ckpt)
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(gfpgan_export.main(
                    ["--checkpoint", ckpt, "--out", os.path.join(d, "g.onnx")]), 0)
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                gfpgan_export.main(["--checkpoint", ckpt, "--size", "512", "--out",
                                    os.path.join(d, "x.onnx")])

    def test_wrong_architecture_is_refused(self):
        sd = gfpgan_arch.random_state_dict(seed=0, **SMALL)
        for change in ("missing", "unexpected", "shape"):
            bad = OrderedDict(sd)
            if change == "missing":
                del bad["condition_shift.1.2.bias"]
            elif change == "unexpected":
                bad["stylegan_decoder.style_convs.0.noise.weight"] = np.zeros(1, np.float32)
            else:
                bad["final_linear.bias"] = bad["final_linear.bias"][:-1]
            with self.subTest(change=change), self.assertRaises(ValueError):
                gfpgan_export.build_model(bad)


class Cli(unittest.TestCase):
    def test_random_export_metadata(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.onnx")
            with contextlib.redirect_stdout(io.StringIO()) as log:
                rc = gfpgan_export.main(["--size", "64", "--narrow", "0.25", "--batch1",
                                         "--seed", "2", "--out", out])
            self.assertEqual(rc, 0, log.getvalue())
            self.assertIn("finite=True", log.getvalue())
            model = onnx.load(out)
        meta = {p.key: p.value for p in model.metadata_props}
        self.assertEqual(meta["gpen_video.weights"], "random weights: for speed only")
        self.assertEqual(meta["gpen_video.size"], "64")
        self.assertEqual(meta["gpen_video.template"], "ffhq")
        self.assertEqual(meta["gpen_video.seed"], "2")
        self.assertEqual(meta["gpen_video.parameters"],
                         str(gfpgan_arch.count_parameters(**SMALL)["total"]))
        dims = model.graph.input[0].type.tensor_type.shape.dim
        self.assertEqual([d.dim_value for d in dims], [1, 3, 64, 64])


if __name__ == "__main__":
    unittest.main()
