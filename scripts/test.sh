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
#
# The Rust code compiles once, linted as it compiles: `cargo test --no-run --all-targets` builds
# the crate, the binary, the benchmark and the two test binaries (tests/suite/, every end-to-end
# module in one binary, and tests/alloc.rs) with clippy-driver standing in for rustc on this
# package (what `cargo clippy` does over `cargo check`; the dependencies compile once, with
# rustc, instead of once more for clippy's check), and every later step runs those. A later
# plain `cargo build` compiles gpen-video itself again (its fingerprint names the wrapper). Steps that wait more than they compute run
# beside others: the crates download during the set-up, the later steps' packages install and
# the bundle's wheel downloads during the build; the suite's tests that mostly wait, the Python exporter's tests and
# the wheel's test and the GPU bundle's check run while the other Rust tests do, and the browser
# test while the image's build stage and the Slurm check run (their output is kept and printed
# when each ends). Each step's start is printed as [test] lines with the
# seconds since the start, so a slow CI run says where its time went.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '[test] %4d s: %s\n' "$SECONDS" "$*" >&2; }
# bg NAME CMD...: runs CMD in the background, its output in out/test-logs/NAME.log; `finish NAME`
# waits for it, prints its output and fails the run if it failed.
declare -A pids=()
logs=out/test-logs
# A failing step ends the run: what still runs beside it stops too.
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
bg() {
  local name=$1
  shift
  mkdir -p "$logs"
  "$@" >"$logs/$name.log" 2>&1 &
  pids[$name]=$!
}
finish() {
  local name=$1 rc=0
  wait "${pids[$name]}" || rc=$?
  sed "s/^/[$name] /" "$logs/$name.log" >&2
  [ $rc = 0 ] || { step "$name failed (exit $rc): its output above"; exit $rc; }
  step "$name passed"
}
# What the later steps need installed, beside the build (downloads and unpacking, little CPU):
# Debian's postgresql for the replicas' tests (tests/suite/replicas.rs: each starts a cluster of
# its own with initdb in a temporary folder, on a loopback port), TFLite's interpreter for the
# Python exporter's tests (the reference the face-mesh and hand conversions are tested against),
# chromium and Playwright for the browser test, slurm-wlm and munge for the Slurm check. Each
# is installed only where missing.
packages() {
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
  .deps/venv/bin/python -c "import ai_edge_litert" 2>/dev/null ||
    .deps/venv/bin/python -m pip install -q --disable-pip-version-check "ai-edge-litert==2.3.0"
  scripts/browser-test.sh --install
  if [ "${GPEN_VIDEO_SLURM_TEST:-0}" = 1 ]; then
    scripts/slurm-test.sh --install
  fi
}
# Crates download beside the set-up's packages.
bg crates cargo fetch --locked
step "set-up (scripts/setup.sh)"
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
if [ "${GPEN_VIDEO_BUNDLE_CHECK:-0}" = 1 ]; then
  bg bundle-wheel scripts/gpu-bundle.sh --fetch
fi
bg packages packages
finish crates
step "formatting"
cargo fmt --all -- --check
# Clippy's lints, denied as `cargo clippy --all-targets -- -D warnings` denies them, in the build.
clippy=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) ||
  { step "clippy-driver not found: rustup component add clippy"; exit 1; }
export RUSTC_WORKSPACE_WRAPPER=$clippy CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# A small GFPGANv1Clean (the real structure at 512, random weights, batch declared 1) for the
# Rust tests (models/gfpgan_export.py; about a second).
[ -f models/gfpgan-512-narrow-random.onnx ] ||
  .deps/venv/bin/python models/gfpgan_export.py --size 512 --narrow 0.03125 --batch1 \
    --out models/gfpgan-512-narrow-random.onnx
# A narrow GPEN-BFR-256 (the real structure, random weights, an eighth of the official width:
# a sixth of its CPU a face) for the tests that need a real GPEN's floats, not its cost
# (models/gpen_export.py --narrow; under a second).
[ -f models/gpen-bfr-256-narrow-random.onnx ] ||
  .deps/venv/bin/python models/gpen_export.py --size 256 --narrow 0.125 \
    --out models/gpen-bfr-256-narrow-random.onnx >/dev/null
step "building and linting the crate, its tests and its benchmark (once)"
cargo test --release --locked --no-run --all-targets
# The binary as the scripts below build it: nothing compiles here after the test build.
cargo build --release --locked
finish packages
# The library's and the binary's tests, tests/alloc.rs and the doc tests first, alone:
# tests/alloc.rs counts the allocations of warm pipelines, whose per-frame bookkeeping grows with
# stalls when other work shares the cores (17,614 bytes a frame against its bound of 17,408 in a run with
# the waiting tests below beside it; 15.7 to 16.4 KB alone).
step "Rust tests: the library's, the binary's, tests/alloc.rs, the doc tests"
cargo test --release --locked --lib --bins --test alloc
cargo test --release --locked --doc
bg python-tests .deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'
# The GPU bundle's CPU check (its models exported, packed and compressed, then run in a clean
# root: about a minute, the longest of the checks after the Rust tests) beside the Rust tests,
# on the binary built above (`--no-build`: `cargo test` holds the build folder while it runs).
if [ "${GPEN_VIDEO_BUNDLE_CHECK:-0}" = 1 ]; then
  finish bundle-wheel
  bg bundle scripts/gpu-bundle.sh --small --check-cpu --no-build
fi
# The wheel's test (tests/suite/wheel.rs: packing, pip, unpacking; mostly files, the longest
# test) from the start of the suite, beside it: run last in name order it would run alone at
# its end. The suite's binary as the test build named it.
suite=$(cargo test --release --locked --no-run --test suite 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
[ -x "$suite" ] || { step "no test binary for tests/suite found"; exit 1; }
bg wheel-test "$suite" wheel::
# The suite's tests that mostly wait (replicas:: on their services' leases and polls, one at a
# time; registry:: on servers that stall or never answer: about a third of their time on a
# core) in a process of their own beside the others, where the waits overlap work.
waiting=(replicas:: registry::)
bg waiting-tests "$suite" "${waiting[@]}"
step "Rust tests: tests/suite/ but ${waiting[*]} wheel::; those, the Python exporter's and the wheel's (and the GPU bundle's check) beside them"
cargo test --release --locked --test suite -- --skip wheel:: "${waiting[@]/#/--skip=}"
finish waiting-tests
finish python-tests
finish wheel-test
# The service's page in Debian's chromium, headless, driven by Playwright (installs both), the
# image's build stage and the Slurm check side by side.
bg browser scripts/browser-test.sh
# The container image's build stage, from exactly the files the image's context gives it, on
# the test build (which it reuses: seconds, unless a file the build reads is missing there, which
# fails); scripts/container-check.sh builds the whole image.
step "the container image's build stage, then the Slurm check; the page in a browser beside them"
scripts/container-build-stage.py
if [ "${GPEN_VIDEO_SLURM_TEST:-0}" = 1 ]; then
  step "the Slurm check (scripts/slurm-test.sh)"
  scripts/slurm-test.sh
fi
finish browser
if [ "${GPEN_VIDEO_BUNDLE_CHECK:-0}" = 1 ]; then
  finish bundle
fi
step "all tests passed"
echo "all tests passed"
