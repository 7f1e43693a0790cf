#!/usr/bin/env bash
# How well the stages around the model feed it, this build against another, on the two
# samples the feeding work is measured on (the 1080p group, four faces a frame; the 720p pair,
# one large face and one small), all paired or in one run:
#   1. each stage's core-ms per face and the whole run's faces/s with the identity stand-in
#      and --preset ultrafast, A B A B ... (scripts/bench-stage-cost.sh);
#   2. the identity run at the default settings as a fraction of plain ffmpeg's fps with the
#      same encoder settings, for both builds (scripts/bench-vs-ffmpeg.sh);
#   3. this build's feeder figure (gpen-video bench --stage feeder).
#   scripts/bench-feed.sh BASELINE_BINARY [PAIRS]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?baseline binary (an earlier build of gpen-video)}
pairs=${2:-3}
new=target/release/gpen-video
model=models/standin/identity-512.onnx
# shellcheck disable=SC1091
[ -f .deps/env.sh ] && source .deps/env.sh
for src in samples/group-1080p.mp4 samples/twofaces-720p.mp4; do
  [ -f "$src" ] || { echo "$src missing: run scripts/make_samples.sh" >&2; exit 1; }
  echo "== $src: core-ms per face and faces/s, identity, --preset ultrafast (A this build, B $base)"
  scripts/bench-stage-cost.sh "$base" "$src" "$pairs" --model "$model" --preset ultrafast
  for side in this "$base"; do
    bin=$new; [ "$side" != this ] && bin=$side
    echo "== $src: $side, default settings against plain ffmpeg"
    GPEN_VIDEO=$bin MODEL=$model scripts/bench-vs-ffmpeg.sh "$src" "$pairs" | tail -1
  done
  echo "== $src: feeder (this build)"
  "$new" bench "$src" --model "$model" --stage feeder --repeat "$pairs" 2>/dev/null
done
