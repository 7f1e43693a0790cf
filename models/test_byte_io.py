"""Byte I/O (byte_io.py): in, stand-in models with GPEN's float contract; out, checks that the
wrapped model takes and gives uint8 levels and gives the float model's output, converted to
levels, clipped and rounded.
    .deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'
"""
import os
import sys
import unittest

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_io  # noqa: E402
import make_standins  # noqa: E402


def run(model, x):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(["output"], {"input": x})[0]


class ByteIo(unittest.TestCase):
    def test_wrapped_model_is_the_float_model_in_levels(self):
        rng = np.random.default_rng(0)
        x8 = rng.integers(0, 256, size=(2, 3, 16, 16), dtype=np.uint8)
        for kind in ("negate", "stable", "texture"):
            flt = make_standins.build(kind, kind, 16)
            want = run(flt, x8.astype(np.float32) * np.float32(1 / 127.5) - np.float32(1))
            want = np.round(np.clip((want + 1) * np.float32(127.5), 0, 255)).astype(np.uint8)
            wrapped = byte_io.wrap(make_standins.build(kind, kind, 16))
            got = run(wrapped, x8)
            self.assertEqual(got.dtype, np.uint8)
            self.assertTrue(np.array_equal(got, want), kind)
            meta = {p.key: p.value for p in wrapped.metadata_props}
            self.assertEqual(meta["gpen_video.io"], "bytes")

    def test_refuses_a_model_without_float_io(self):
        with self.assertRaises(ValueError):
            byte_io.wrap(byte_io.wrap(make_standins.build("identity", "identity", 16)))


if __name__ == "__main__":
    unittest.main()
