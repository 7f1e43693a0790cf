"""Tests of the hand models' conversion (models/hand_export.py): both ONNX models against TFLite's
own interpreter (ai-edge-litert) on real hand photos, OpenCV's handSrc.jpg and handDst.jpg (an
open palm on a plain background; Apache-2.0, from Debian's opencv-doc package).

    .deps/venv/bin/python -m unittest discover -s models -p 'test_hand_export.py'

Needs the set-up's files: the mediapipe wheel under .deps/wheels, models/palm-detect.onnx,
models/hand-landmarks.onnx and samples/hands/ (scripts/setup.sh), and ai-edge-litert
(scripts/test.sh installs it).

Tolerances: pixels (the palm's raw regressors, the landmarks) and logits within 2e-3 of TFLite's
(they come out within 2e-4, float rounding: TFLite's kernels sum in another order);
probabilities and the world points (metres) within 1e-4 (they come out within 3e-6).
"""
import glob
import os
import subprocess
import sys
import unittest
import zipfile

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hand_export  # noqa: E402

PHOTOS = ("handSrc.jpg", "handDst.jpg")
PIXELS, PROBABILITY = 2e-3, 1e-4


def photo(name: str, vf: str, side: int) -> np.ndarray:
    """The photo through FFmpeg's filters `vf` to a `side` x `side` RGB image in [0,1], NHWC."""
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", os.path.join(ROOT, "samples/hands", name), "-vf", vf,
         "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True, capture_output=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(1, side, side, 3).astype(np.float32) / 255.0


def letterboxed(name: str) -> np.ndarray:
    """The 640x480 photo as the palm detector takes it: 192x144, black above and below."""
    return photo(name, "scale=192:144,pad=192:192:0:24", 192)


# Crops of the hand (the photos are 640x480, the fingers pointing right): turned so that the
# fingers point up (as MediaPipe cuts them), mirrored (the other hand), as they are, and one of
# the background alone.
HAND_CROPS = {
    "upright": "crop=440:440:60:20,transpose=2,scale=224:224",
    "mirrored": "crop=440:440:60:20,transpose=2,hflip,scale=224:224",
    "sideways": "crop=440:440:60:20,scale=224:224",
    "background": "crop=150:150:480:320,scale=224:224",
}


class AgainstTFLite(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from ai_edge_litert.interpreter import Interpreter
        wheel = sorted(glob.glob(os.path.join(ROOT, ".deps/wheels/mediapipe-0.10.21-*.whl")))[0]
        with zipfile.ZipFile(wheel) as z:
            cls.palm_tflite, cls.hand_tflite = z.read(hand_export.PALM), z.read(hand_export.HAND)
        cls.interp = {}
        for key, data in (("palm", cls.palm_tflite), ("hand", cls.hand_tflite)):
            cls.interp[key] = Interpreter(model_content=data)
            cls.interp[key].allocate_tensors()
        cpu = ["CPUExecutionProvider"]
        cls.palm = ort.InferenceSession(os.path.join(ROOT, "models/palm-detect.onnx"), providers=cpu)
        cls.hand = ort.InferenceSession(os.path.join(ROOT, "models/hand-landmarks.onnx"), providers=cpu)

    def reference(self, key, x):
        it = self.interp[key]
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        return {d["name"]: it.get_tensor(d["index"])[0] for d in it.get_output_details()}

    def test_the_palm_detector_equals_tflite_on_the_photos(self):
        xs = [letterboxed(n) for n in PHOTOS]
        boxes, scores, anchors = self.palm.run(None, {"input": np.concatenate(xs).transpose(0, 3, 1, 2)})
        self.assertEqual(boxes.shape, (2, 2016, 18))
        self.assertEqual(scores.shape, (2, 2016, 1))
        self.assertEqual(anchors.shape, (2016, 2))
        for i, x in enumerate(xs):
            ref = self.reference("palm", x)
            np.testing.assert_allclose(boxes[i], ref["Identity"], atol=PIXELS, rtol=0)
            np.testing.assert_allclose(scores[i], ref["Identity_1"], atol=PIXELS, rtol=0)
            self.assertGreater(scores[i].max(), 0.0, f"{PHOTOS[i]}: a palm (sigmoid > 0.5)")

    def test_the_anchors_put_the_best_palm_on_the_hand(self):
        # Decoded as the module's docstring says, the best palm of each photo lies on the palm
        # (its part of the 640x480 photo, by eye) with the wrist left of its centre and the
        # middle finger's root right of it: the fingers point right in both photos.
        palms = {"handSrc.jpg": (0, 100, 300, 400), "handDst.jpg": (40, 60, 380, 400)}
        for name, (x0, y0, x1, y1) in palms.items():
            boxes, scores, anchors = self.palm.run(None, {"input": letterboxed(name).transpose(0, 3, 1, 2)})
            best = scores[0, :, 0].argmax()
            b, a = boxes[0, best], anchors[best]
            cx, cy = b[0] / 192 + a[0], b[1] / 192 + a[1]
            wrist_x, middle_x = b[4] / 192 + a[0], b[8] / 192 + a[0]
            px, py = cx * 640, (cy * 192 - 24) / 144 * 480
            self.assertTrue(x0 <= px <= x1 and y0 <= py <= y1, f"{name}: palm centre at {px:.0f},{py:.0f}")
            self.assertLess(wrist_x, cx, name)
            self.assertGreater(middle_x, cx, name)
        np.testing.assert_array_equal(anchors, hand_export.anchors())

    def test_the_hand_landmarks_equal_tflite_on_hand_crops(self):
        for name in PHOTOS:
            xs = {k: photo(name, vf, 224) for k, vf in HAND_CROPS.items()}
            batch = np.concatenate(list(xs.values())).transpose(0, 3, 1, 2)
            landmarks, presence, handedness, world = self.hand.run(None, {"input": batch})
            self.assertEqual(landmarks.shape, (4, 63))
            self.assertEqual(world.shape, (4, 63))
            self.assertEqual(presence.shape, (4, 1))
            self.assertEqual(handedness.shape, (4, 1))
            for i, (kind, x) in enumerate(xs.items()):
                ref = self.reference("hand", x)
                what = f"{name}, {kind}"
                np.testing.assert_allclose(landmarks[i], ref["Identity"], atol=PIXELS, rtol=0, err_msg=what)
                np.testing.assert_allclose(presence[i], ref["Identity_1"], atol=PROBABILITY, rtol=0, err_msg=what)
                np.testing.assert_allclose(handedness[i], ref["Identity_2"], atol=PROBABILITY, rtol=0, err_msg=what)
                np.testing.assert_allclose(world[i], ref["Identity_3"], atol=PROBABILITY, rtol=0, err_msg=what)
            self.assertGreater(presence[0][0], 0.5, f"{name}: the upright crop is a hand")
            self.assertLess(presence[3][0], 0.5, f"{name}: the background is not")
            self.assertGreater(handedness[0][0], 0.5, name)
            self.assertLess(handedness[1][0], 0.5, f"{name}: mirrored, the other hand")

    def test_the_operators_are_the_ones_the_docstring_lists(self):
        from tflite_onnx import operators
        self.assertEqual(set(operators(self.palm_tflite)), {
            "DEQUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "PRELU", "ADD", "MAX_POOL_2D", "PAD",
            "RESIZE_BILINEAR", "RESHAPE", "CONCATENATION"})
        self.assertEqual(set(operators(self.hand_tflite)), {
            "DEQUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "MEAN", "FULLY_CONNECTED", "LOGISTIC"})

    def test_the_conversion_is_reproducible_and_marked(self):
        for convert, data, file in ((hand_export.convert_palm, self.palm_tflite, "palm-detect.onnx"),
                                    (hand_export.convert_hand, self.hand_tflite, "hand-landmarks.onnx")):
            m = convert(data)
            self.assertIn("gpen_video.export", {p.key for p in m.metadata_props},
                          "the set-up converts a model without it again")
            with open(os.path.join(ROOT, "models", file), "rb") as f:
                self.assertEqual(m.SerializeToString(), f.read(), file)


if __name__ == "__main__":
    unittest.main()
