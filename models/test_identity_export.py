"""Tests of the face-identity conversion (models/identity_export.py): dlib's 128-D face
descriptor as ONNX, on real photographs of three people, and against a direct numpy
transcription of dlib's layers.

    .deps/venv/bin/python -m unittest discover -s models -p 'test_identity_export.py'

Needs the set-up's files: the face_recognition_models 0.3.0 sdist under .deps/wheels and
models/face-id.onnx (scripts/setup.sh), models/centerface.onnx and samples/astronaut.png
(scripts/setup.sh), the face_recognition 1.3.0 sdist under .deps/wheels for its test photos
(scripts/test.sh downloads it), and ffmpeg to decode the photos.

The photos: obama.jpg, obama2.jpg, obama3.jpg and biden.jpg from face_recognition's
tests/test_images (official White House photographs, US government works in the public
domain) and samples/astronaut.png (Eileen Collins, NASA, public domain; from scikit-image).
Faces are found by the repository's own detector, CenterFace (five landmarks, decoded as
src/faces/detect.rs does), and cut into dlib's 150x150 chip by a similarity fit of those five
points to identity_export.CHIP_TEMPLATE, as the Rust side is to do; large faces are halved
(2x2 means) until a chip pixel covers at most two image pixels and then sampled bilinearly,
as dlib's extract_image_chip samples from an image pyramid.
"""
import glob
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import identity_export  # noqa: E402

PHOTOS = [  # (name, person, file: relative to face_recognition's tests/test_images or ROOT)
    ("obama", "Obama", "obama.jpg"),
    ("obama2", "Obama", "obama2.jpg"),
    ("obama3", "Obama", "obama3.jpg"),
    ("biden", "Biden", "biden.jpg"),
    ("astronaut", "Collins", "samples/astronaut.png"),
]
# dlib's threshold is 0.6; the pairs are asked to clear it by a margin.
SAME_BELOW, OTHER_ABOVE = 0.5, 0.7


def decode(path: str, size=None) -> np.ndarray:
    """An image file as H x W x 3 RGB uint8 (FFmpeg decodes it; `size` = (w, h) scales it)."""
    probe = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                            "stream=width,height", "-of", "csv=p=0", path],
                           check=True, capture_output=True, text=True).stdout.split(",")
    w, h = size or (int(probe[0]), int(probe[1]))
    vf = ["-vf", f"scale={w}:{h}:flags=area"] if size else []
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", path, *vf, "-f", "rawvideo",
                          "-pix_fmt", "rgb24", "-"], check=True, capture_output=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(h, w, 3)


def centerface_points(session, path: str, long_side: int = 640) -> np.ndarray:
    """The five landmarks (left eye, right eye, nose, left and right mouth corner; image pixels)
    of the best-scoring face CenterFace finds, decoded as src/faces/detect.rs decode_maps does."""
    w0, h0 = decode(path).shape[1::-1]
    k = long_side / max(w0, h0)
    w, h = max(32, round(w0 * k / 32) * 32), max(32, round(h0 * k / 32) * 32)
    x = decode(path, (w, h)).astype(np.float32).transpose(2, 0, 1)[None]
    heat, scale, offset, lms = session.run(None, {session.get_inputs()[0].name: x})
    r, c = np.unravel_index(int(np.argmax(heat[0, 0])), heat.shape[2:])
    assert heat[0, 0, r, c] > 0.5, f"no face in {path}"
    s0, s1 = np.exp(scale[0, 0, r, c]) * 4, np.exp(scale[0, 1, r, c]) * 4
    x1 = (c + offset[0, 1, r, c] + 0.5) * 4 - s1 / 2
    y1 = (r + offset[0, 0, r, c] + 0.5) * 4 - s0 / 2
    pts = np.array([[lms[0, 2 * j + 1, r, c] * s1 + x1, lms[0, 2 * j, r, c] * s0 + y1]
                    for j in range(5)], np.float64)
    return pts * [w0 / w, h0 / h]


def fit_similarity(src: np.ndarray, dst: np.ndarray):
    """Least-squares similarity dst ~ M src + t (M = [[a, -b], [b, a]])."""
    ms, md = src.mean(0), dst.mean(0)
    a, b = src - ms, dst - md
    n = (a ** 2).sum()
    p = (a * b).sum() / n
    q = (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).sum() / n
    m = np.array([[p, -q], [q, p]])
    return m, md - m @ ms


def face_chip(img: np.ndarray, points: np.ndarray, size: int = identity_export.SIZE) -> np.ndarray:
    """dlib's face chip (size x size RGB uint8) for five landmarks."""
    m, t = fit_similarity(identity_export.chip_template(size), points)  # chip -> image
    src = img.astype(np.float64)
    while np.sqrt(abs(np.linalg.det(m))) > 2:  # a level of the pyramid: 2x2 means
        h, w = src.shape[0] // 2, src.shape[1] // 2
        src = src[:2 * h, :2 * w].reshape(h, 2, w, 2, 3).mean((1, 3))
        m, t = m / 2, (t - 0.5) / 2
    u, v = np.meshgrid(np.arange(size), np.arange(size))
    xy = np.stack([u.ravel(), v.ravel()], 1) @ m.T + t
    h, w = src.shape[:2]
    x, y = np.clip(xy[:, 0], 0, w - 1), np.clip(xy[:, 1], 0, h - 1)
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]
    out = (src[y0, x0] * (1 - fx) * (1 - fy) + src[y0, x1] * fx * (1 - fy)
           + src[y1, x0] * (1 - fx) * fy + src[y1, x1] * fx * fy)
    return np.clip(np.round(out), 0, 255).astype(np.uint8).reshape(size, size, 3)


def dlib_forward(net: dict, chip: np.ndarray) -> np.ndarray:
    """dlib's forward pass, layer by layer as dlib computes it (no folding), in numpy: the
    reference the ONNX graph is held to."""
    x = ((chip.astype(np.float32) - net["mean"]) / np.float32(256)).transpose(2, 0, 1)
    tags = {}
    for L in net["layers"]:
        kind = L["kind"]
        if kind == "tag":
            tags[L["tag"]] = x
        elif kind == "skip":
            x = tags[L["tag"]]
        elif kind == "con":
            w, s, p = L["w"], L["stride"], L["pad"]
            k = w.shape[2]
            xp = np.pad(x, ((0, 0), (p, p), (p, p)))
            win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))[:, ::s, ::s]
            x = np.einsum("chwij,ocij->ohw", win, w, optimize=True) + L["b"][:, None, None]
            if L["relu"]:
                x = np.maximum(x, 0)
        elif kind == "affine":
            if not L["disabled"]:
                x = x * L["gamma"][:, None, None] + L["beta"][:, None, None]
        elif kind == "relu":
            if not L["disabled"]:
                x = np.maximum(x, 0)
        elif kind in ("max_pool", "avg_pool"):
            if L["k"] == 0:
                x = x.mean((1, 2), keepdims=True)
            else:
                k, s = L["k"], L["stride"]
                win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::s, ::s]
                x = win.max((3, 4)) if kind == "max_pool" else win.mean((3, 4))
        elif kind == "add_prev":  # tt::add: zero-padded at the end to the larger size
            y = tags[L["tag"]]
            out = np.zeros([max(a, b) for a, b in zip(x.shape, y.shape)], np.float32)
            out[:x.shape[0], :x.shape[1], :x.shape[2]] += x
            out[:y.shape[0], :y.shape[1], :y.shape[2]] += y
            x = out
        elif kind == "fc":
            x = x.reshape(-1) @ L["w"]
    return x


class IdentityOnRealFaces(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        wheels = os.path.join(ROOT, ".deps/wheels")
        cls.dat = identity_export.read(os.path.join(wheels, "face_recognition_models-0.3.0.tar.gz"))
        cls.session = ort.InferenceSession(os.path.join(ROOT, "models/face-id.onnx"),
                                           providers=["CPUExecutionProvider"])
        detector = ort.InferenceSession(os.path.join(ROOT, "models/centerface.onnx"),
                                        providers=["CPUExecutionProvider"])
        cls.tmp = tempfile.TemporaryDirectory()
        sdist = glob.glob(os.path.join(wheels, "face_recognition-1.3.0.tar.gz"))[0]
        with tarfile.open(sdist) as t:
            for m in t.getmembers():
                if "/tests/test_images/" in m.name and m.isfile():
                    with open(os.path.join(cls.tmp.name, os.path.basename(m.name)), "wb") as f:
                        f.write(t.extractfile(m).read())
        cls.chips = []
        for _, _, rel in PHOTOS:
            path = os.path.join(ROOT if "/" in rel else cls.tmp.name, rel)
            cls.chips.append(face_chip(decode(path), centerface_points(detector, path)))
        batch = np.stack(cls.chips).astype(np.float32).transpose(0, 3, 1, 2)
        cls.embeddings = cls.session.run(None, {"input": batch})[0]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_same_people_are_near_and_different_people_far(self):
        e = self.embeddings
        d = np.linalg.norm(e[:, None] - e[None], axis=2)
        names = [n for n, _, _ in PHOTOS]
        print("\nEuclidean distances of dlib descriptors (same person < 0.6):")
        print(" " * 10 + "".join(f"{n:>10}" for n in names))
        for n, row in zip(names, d):
            print(f"{n:>10}" + "".join(f"{v:10.3f}" for v in row))
        for i, (a, pa, _) in enumerate(PHOTOS):
            for j, (b, pb, _) in enumerate(PHOTOS[:i]):
                if pa == pb:
                    self.assertLess(d[i, j], SAME_BELOW, f"{a} and {b} are both {pa}")
                else:
                    self.assertGreater(d[i, j], OTHER_ABOVE, f"{a} ({pa}) and {b} ({pb})")

    def test_the_graph_equals_dlibs_layers_computed_directly(self):
        net = identity_export.parse(self.dat)
        for chip, onnx_out in zip(self.chips[::2], self.embeddings[::2]):
            ref = dlib_forward(net, chip)
            np.testing.assert_allclose(onnx_out, ref, atol=2e-5, rtol=0)

    def test_the_batch_is_free_and_the_descriptor_raw(self):
        one = self.session.run(None, {"input": self.chips[0][None].astype(np.float32).transpose(0, 3, 1, 2)})[0]
        self.assertEqual(one.shape, (1, 128))
        np.testing.assert_allclose(one[0], self.embeddings[0], atol=1e-5, rtol=0)
        i, o = self.session.get_inputs()[0], self.session.get_outputs()[0]
        self.assertEqual((i.name, i.shape[1:], o.name, o.shape[1:]), ("input", [3, 150, 150], "embedding", [128]))
        # dlib's loss_metric hands out the fc layer's output as it is: norms are not 1.
        norms = np.linalg.norm(self.embeddings, axis=1)
        self.assertTrue(np.all(np.abs(norms - 1) > 0.1), norms)

    def test_the_conversion_is_reproducible_and_marked(self):
        m = identity_export.convert(self.dat)
        with open(os.path.join(ROOT, "models/face-id.onnx"), "rb") as f:
            self.assertEqual(m.SerializeToString(), f.read())
        marks = {p.key: p.value for p in m.metadata_props}
        self.assertIn("gpen_video.export", marks, "the set-up converts a model without it again")
        self.assertEqual(marks["gpen_video.template"], "dlib_150")

    def test_the_template_agrees_with_dlibs_five_point_shape(self):
        # dlib's 5-point template (eye corners and the base of the nose, from the same mean face):
        # each eye's corners straddle our eye centre, and the nose base lies below the tip.
        p = np.array([[0.8595674595992, 0.2134981538014], [0.6460604764104, 0.2289674387677],
                      [0.1205750620789, 0.2137274526848], [0.3340850613712, 0.2290642403242],
                      [0.4901123135679, 0.6277975316475]])
        five = (0.25 + p) / 1.5 * 149
        t = identity_export.CHIP_TEMPLATE
        np.testing.assert_allclose(t[0], (five[2] + five[3]) / 2, atol=1.5)
        np.testing.assert_allclose(t[1], (five[0] + five[1]) / 2, atol=1.5)
        self.assertAlmostEqual(t[2][0], five[4][0], delta=0.1)
        self.assertTrue(0 < five[4][1] - t[2][1] < 15)


if __name__ == "__main__":
    unittest.main()
