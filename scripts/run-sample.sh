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
# Without a restorer of one's own, the identity stand-in is named (gpen-video refuses to pick a
# stand-in by itself), and said loudly: it changes nothing.
model=()
if [ ! -f models/GPEN-BFR-512.onnx ] && [ -z "${GPEN_VIDEO_MODEL:-}" ] && [[ " $* " != *" --model"* ]]; then
  echo "note: no restorer here (models/GPEN-BFR-512.onnx): this run names the identity stand-in, which" \
    "changes nothing; get GPEN-BFR-512 with \`target/release/gpen-video models fetch GPEN-BFR-512\`," \
    "or pass --model NAME|PATH" >&2
  model=(--model models/standin/identity-512.onnx)
fi
# The sample's output is this script's own: a rerun replaces it (-y).
target/release/gpen-video samples/astronaut-1080p.mp4 out/astronaut-1080p-restored.mp4 -y "${model[@]}" "$@"
echo "wrote out/astronaut-1080p-restored.mp4"
