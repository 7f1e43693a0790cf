#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: set-up (idempotent), formatting and lint,
# Rust unit and end-to-end tests, the service's page in a real browser (scripts/browser-test.sh),
# the container image's build stage (scripts/container-build-stage.py)
# and the Python exporter's tests; Debian's postgresql for the replicas' tests. Two more checks, both set by
# .ci/run: GPEN_VIDEO_SLURM_TEST=1 runs deploy/slurm-array.sbatch on a single-node Slurm it
# starts (scripts/slurm-test.sh: installs slurm-wlm and munge, about 15 s more);
# GPEN_VIDEO_BUNDLE_CHECK=1 builds the small GPU bundle and runs it with --device cpu in a clean
# root (scripts/gpu-bundle.sh --small --check-cpu; about 1-3 minutes and a 250 MB onnxruntime-gpu
# wheel download, cached in .deps/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLES=test scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
scripts/container-pins.sh
# Photos of real people for the identity tests (Rust and the conversion's): face_recognition's
# test images (its sdist, 3 MB; White House photographs, public domain), unpacked into
# samples/people/.
[ -f .deps/wheels/face_recognition-1.3.0.tar.gz ] ||
  .deps/venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --no-binary=:all: \
    "face_recognition==1.3.0" -d .deps/wheels
mkdir -p samples/people
[ -f samples/people/biden.jpg ] ||
  tar -xzf .deps/wheels/face_recognition-1.3.0.tar.gz -C samples/people --strip-components=3 \
    face_recognition-1.3.0/tests/test_images/obama.jpg face_recognition-1.3.0/tests/test_images/obama2.jpg \
    face_recognition-1.3.0/tests/test_images/obama3.jpg face_recognition-1.3.0/tests/test_images/biden.jpg
cargo fmt --all -- --check
cargo clippy --release --locked --all-targets -- -D warnings
# A small GFPGANv1Clean (the real structure at 512, random weights, batch declared 1) for the
# Rust tests (models/gfpgan_export.py; about a second).
[ -f models/gfpgan-512-narrow-random.onnx ] ||
  .deps/venv/bin/python models/gfpgan_export.py --size 512 --narrow 0.03125 --batch1 \
    --out models/gfpgan-512-narrow-random.onnx
# PostgreSQL for the replicas' tests (tests/replicas.rs: each starts a cluster of its own with
# initdb in a temporary folder, on a loopback port): Debian's package, installed where missing.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
cargo test --release --locked
# The service's page in Debian's chromium, headless, driven by Playwright (installs both).
scripts/browser-test.sh
# The container image's build stage, from exactly the files the image's context gives it (about
# a minute: only gpen-video compiles); scripts/container-check.sh builds the whole image.
scripts/container-build-stage.py
# TFLite's own interpreter, the reference the face-mesh and hand conversions are tested against.
.deps/venv/bin/python -c "import ai_edge_litert" 2>/dev/null ||
  .deps/venv/bin/python -m pip install -q --disable-pip-version-check "ai-edge-litert==2.3.0"
.deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'
if [ "${GPEN_VIDEO_SLURM_TEST:-0}" = 1 ]; then
  scripts/slurm-test.sh
fi
if [ "${GPEN_VIDEO_BUNDLE_CHECK:-0}" = 1 ]; then
  scripts/gpu-bundle.sh --small --check-cpu
fi
echo "all tests passed"
