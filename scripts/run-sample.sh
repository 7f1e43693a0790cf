#!/usr/bin/env bash
# The main job on the sample clip: set-up (idempotent), a release build, then gpen-video on the
# 1080p astronaut sample. Extra arguments go to gpen-video (e.g. --model models/GPEN-BFR-512.onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
cargo build --release --locked
mkdir -p out
target/release/gpen-video samples/astronaut-1080p.mp4 out/astronaut-1080p-restored.mp4 "$@"
echo "wrote out/astronaut-1080p-restored.mp4"
