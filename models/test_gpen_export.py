"""Tests of the GPEN-BFR ONNX exporter (no torch needed).

    .deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'

Runs in well under a minute on two CPU cores: every network here is GPEN-BFR-256.
"""
import contextlib
import io
import os
import pickle
import pickletools
import sys
import tempfile
import unittest
import zipfile
from collections import OrderedDict

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpen_arch  # noqa: E402
import gpen_export  # noqa: E402
import gpen_reference  # noqa: E402
import pth_io  # noqa: E402


class ParameterCounts(unittest.TestCase):
    def test_official_counts(self):
        expected = {256: 18.88, 512: 71.01, 1024: 71.21, 2048: 71.29}
        for size, millions in expected.items():
            with self.subTest(size=size):
                c = gpen_arch.count_parameters(size)
                self.assertEqual(round(c["total"] / 1e6, 2), millions)
                # one scalar NoiseInjection weight per StyledConv: conv1 + 2 per level
                self.assertEqual(c["noise_weights"], 1 + 2 * (int(np.log2(size)) - 2))

    def test_random_state_dict_matches_spec(self):
        sd = gpen_arch.random_state_dict(256, seed=3)
        spec = gpen_arch.state_dict_spec(256)
        self.assertEqual(list(sd), list(spec))
        params = sum(v.size for k, v in sd.items() if spec[k][1] == "param")
        self.assertEqual(params, gpen_arch.count_parameters(256)["total"])


class Batching(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sd = gpen_arch.random_state_dict(256, seed=0)
        cls.model = gpen_export.build_model(sd, 256)
        onnx.checker.check_model(cls.model)
        cls.sess = gpen_export.session(cls.model)

    def test_io_contract(self):
        g = self.model.graph
        self.assertEqual([i.name for i in g.input], ["input"])
        self.assertEqual([o.name for o in g.output], ["output"])
        for vi in (g.input[0], g.output[0]):
            dims = vi.type.tensor_type.shape.dim
            self.assertEqual(dims[0].dim_param, "N")
            self.assertEqual([d.dim_value for d in dims[1:]], [3, 256, 256])
            self.assertEqual(vi.type.tensor_type.elem_type, onnx.TensorProto.FLOAT)

    def test_batch_equals_single(self):
        x = gpen_export.sample_input(256, batch=4, seed=5)
        y4 = self.sess.run(["output"], {"input": x})[0]
        self.assertEqual(y4.shape, (4, 3, 256, 256))
        self.assertTrue(np.isfinite(y4).all())
        singles = np.concatenate([self.sess.run(["output"], {"input": x[i:i + 1]})[0]
                                  for i in range(4)])
        err = np.abs(y4 - singles).max()
        self.assertLess(err, 1e-4, f"batch 4 vs 4 x batch 1: max abs diff {err}")
        # different faces give different outputs (the batch is not mixed up or broadcast)
        self.assertGreater(np.abs(y4[0] - y4[1]).max(), 1e-2)
        y3 = self.sess.run(["output"], {"input": x[1:4]})[0]
        self.assertEqual(y3.shape, (3, 3, 256, 256))
        self.assertLess(np.abs(y3 - singles[1:4]).max(), 1e-4)

    def test_random_output_is_sane(self):
        y = self.sess.run(["output"], {"input": gpen_export.sample_input(256)})[0]
        self.assertTrue(np.isfinite(y).all())
        self.assertLess(np.abs(y).max(), 4.0)
        self.assertGreater(np.mean(np.abs(y) <= 1.0), 0.95)
        self.assertGreater(y.std(), 0.05)


class Checkpoint(unittest.TestCase):
    def test_official_checkpoint_matches_reference(self):
        """A checkpoint in the official format (torch zip, official names, blur-kernel buffers
        included), exported by the CLI, agrees with the numpy reference forward pass."""
        sd = gpen_arch.random_state_dict(256, seed=11)
        with tempfile.TemporaryDirectory() as d:
            ckpt = os.path.join(d, "GPEN-BFR-256.pth")
            out = os.path.join(d, "gpen.onnx")
            pth_io.save(sd, ckpt)
            loaded = pth_io.load(ckpt)
            self.assertIsInstance(loaded, OrderedDict)
            self.assertEqual(list(loaded), list(sd))
            for k in sd:
                np.testing.assert_array_equal(loaded[k], sd[k])
            with contextlib.redirect_stdout(io.StringIO()) as log:
                rc = gpen_export.main(["--checkpoint", ckpt, "--out", out, "--no-check"])
            self.assertEqual(rc, 0)
            self.assertIn("18.88 M", log.getvalue())
            model = onnx.load(out)
            meta = {p.key: p.value for p in model.metadata_props}
            self.assertEqual(meta["gpen_video.weights"], "checkpoint GPEN-BFR-256.pth")
            self.assertEqual(meta["gpen_video.size"], "256")
            x = gpen_export.sample_input(256, batch=1, seed=2)
            y = gpen_export.session(out).run(["output"], {"input": x})[0]
        ref = gpen_reference.forward(sd, x, 256, channel_multiplier=1, narrow=0.5)
        err = np.abs(y - ref).max()
        self.assertLess(err, 1e-3, f"ONNX vs numpy reference: max abs diff {err}")
        self.assertGreater(np.abs(ref).max(), 0.1)  # not a trivially zero output

    def test_zip_layout_is_torch_save(self):
        sd = OrderedDict(w=np.arange(12, dtype=np.float32).reshape(3, 4),
                         b=np.ones(3, np.float32))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.pth")
            pth_io.save(sd, p)
            with zipfile.ZipFile(p) as zf:
                names = zf.namelist()
                self.assertIn("archive/data.pkl", names)
                self.assertIn("archive/data/0", names)
                self.assertIn("archive/version", names)
                for info in zf.infolist():
                    self.assertEqual(info.compress_type, zipfile.ZIP_STORED)
                    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
                    self.assertEqual(start % 64, 0, info.filename)
                pkl = zf.read("archive/data.pkl")
        globals_ = {arg for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"}
        self.assertEqual(globals_, {"collections OrderedDict", "torch._utils _rebuild_tensor_v2",
                                    "torch FloatStorage"})
        self.assertIn("BINPERSID", {op.name for op, _, _ in pickletools.genops(pkl)})

    def test_legacy_format_and_wrapping(self):
        sd = OrderedDict([("module.a", np.arange(6, dtype=np.float32).reshape(2, 3)),
                          ("module.h", np.ones((2, 2), np.float16)),
                          ("module.s", np.array(3.0, np.float32))])
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "old.pth")
            pth_io.save(sd, p, legacy=True)
            loaded = pth_io.load(p)
        for k in sd:
            self.assertEqual(loaded[k].dtype, sd[k].dtype)
            np.testing.assert_array_equal(loaded[k], sd[k])
        un = gpen_export.unwrap_checkpoint({"g_ema": loaded, "step": 3})
        self.assertEqual(sorted(un), ["a", "h", "s"])

    def test_refuses_foreign_globals(self):
        evil = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueR."
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "evil.pth")
            with zipfile.ZipFile(p, "w") as zf:
                zf.writestr("archive/data.pkl", evil)
            with self.assertRaises(pickle.UnpicklingError):
                pth_io.load(p)

    def test_wrong_architecture_is_refused(self):
        sd = gpen_arch.random_state_dict(256, seed=0)
        del sd["generator.conv1.noise.weight"]
        with self.assertRaises(ValueError):
            gpen_export.build_model(sd, 256)


class Fp16(unittest.TestCase):
    def test_fp16_close_to_fp32(self):
        sd = gpen_arch.random_state_dict(256, seed=0)
        m16 = gpen_export.build_model(sd, 256, fp16=True)
        m32 = gpen_export.build_model(sd, 256)
        onnx.checker.check_model(m16)
        self.assertEqual(m16.graph.input[0].type.tensor_type.elem_type, onnx.TensorProto.FLOAT)
        self.assertEqual(m16.graph.output[0].type.tensor_type.elem_type, onnx.TensorProto.FLOAT)
        x = gpen_export.sample_input(256, batch=2)
        y32 = gpen_export.session(m32).run(["output"], {"input": x})[0]
        for model in (m16, gpen_export.emulate_fp16(m16, m32)):
            y = gpen_export.session(model).run(["output"], {"input": x})[0]
            self.assertTrue(np.isfinite(y).all())
            self.assertLess(np.abs(y - y32).max(), 2e-2)


class Compressible(unittest.TestCase):
    def test_same_graph_finite_and_small_when_compressed(self):
        """--compressible: the same graph and tensor shapes as the plain random export (so the
        same speed), finite image-like output, and weights with at most 1/20 as many distinct
        values as values (a long-window compressor such as `zstd --long` then shrinks the file
        about 100x; plain random weights: nearly every value distinct)."""
        sd = gpen_arch.random_state_dict(256, seed=0)
        plain = gpen_export.build_model(sd, 256)
        tiled = gpen_export.build_model(gpen_export.make_compressible(sd, 2), 256)
        onnx.checker.check_model(tiled)
        self.assertEqual([n.op_type for n in plain.graph.node],
                         [n.op_type for n in tiled.graph.node])
        self.assertEqual([(i.name, list(i.dims), i.data_type) for i in plain.graph.initializer],
                         [(i.name, list(i.dims), i.data_type) for i in tiled.graph.initializer])

        def distinct_share(m):
            arrays = [onnx.numpy_helper.to_array(i).ravel() for i in m.graph.initializer]
            return sum(np.unique(a).size for a in arrays) / sum(a.size for a in arrays)
        self.assertGreater(distinct_share(plain), 0.9)
        self.assertLess(distinct_share(tiled), 0.05)
        y = gpen_export.session(tiled).run(["output"], {"input": gpen_export.sample_input(256)})[0]
        self.assertTrue(np.isfinite(y).all())
        self.assertGreater(np.mean(np.abs(y) <= 1.0), 0.95)
        self.assertGreater(y.std(), 0.05)
        # no denormal (slow-path) or zeroed weights were introduced
        for i in tiled.graph.initializer:
            a = np.abs(onnx.numpy_helper.to_array(i).astype(np.float64)).ravel()
            self.assertFalse(np.any((a > 0) & (a < np.finfo(np.float32).tiny)), i.name)

    def test_refused_with_a_checkpoint(self):
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            gpen_export.main(["--checkpoint", "x.pth", "--compressible", "2", "--out", "x.onnx"])


class Narrow(unittest.TestCase):
    def test_narrow_random_export_has_the_width_asked_for(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "narrow.onnx")
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(gpen_export.main(["--size", "256", "--narrow", "0.125", "--out", out]), 0)
            m = onnx.load(out)
            meta = {p.key: p.value for p in m.metadata_props}
            self.assertEqual(meta["gpen_video.narrow"], "0.125")
            full = gpen_arch.count_parameters(256)["total"]
            self.assertLess(int(meta["gpen_video.parameters"]), full / 3)
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            gpen_export.main(["--checkpoint", "x.pth", "--narrow", "0.5", "--out", "x.onnx"])


if __name__ == "__main__":
    unittest.main()
