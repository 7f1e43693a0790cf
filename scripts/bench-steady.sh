#!/usr/bin/env bash
# Figures for steady faces: landmark jitter on a still, noisy 1080p clip (made here from the
# portrait) with smoothing off and on, and fps on the 1080p sample with and without smoothing
# and with each mask, runs paired and repeated, medians printed.
# Usage: scripts/bench-steady.sh [REPEATS]   (default 3; needs scripts/setup.sh and a release build)
set -euo pipefail

cd "$(dirname "$0")/.."
repeats="${1:-3}"
bin=target/release/gpen-video
model=models/standin/identity-256.onnx
[ -x "$bin" ] || { echo "build first: cargo build --release --locked" >&2; exit 1; }
[ -f "$model" ] || { echo "run scripts/setup.sh first" >&2; exit 1; }
if [ -z "${ORT_DYLIB_PATH:-}" ]; then
  export ORT_DYLIB_PATH="$PWD/.deps/lib/libonnxruntime.so"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A still picture with new sensor noise every frame: every movement of the points is jitter.
ffmpeg -v error -y -loop 1 -i samples/astronaut.png -f lavfi -i color=c=0x405060:s=1920x1080:r=25 \
  -filter_complex "[0:v]scale=640:640[a];[1:v][a]overlay=x=500:y=60,noise=alls=12:allf=t,format=yuv420p[v]" \
  -map "[v]" -frames:v 60 -c:v libx264 -preset ultrafast -crf 20 "$work/still.mp4"

jitter() {
  python3 - "$1" <<'EOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
pts = [f["faces"][0]["landmarks"] for f in d if f["faces"]]
n = len(pts)
mean = [[sum(p[k][c] for p in pts) / n for c in range(2)] for k in range(5)]
se = sum((p[k][0] - mean[k][0]) ** 2 + (p[k][1] - mean[k][1]) ** 2 for p in pts for k in range(5))
rms = math.sqrt(se / (5 * n))
eye = math.hypot(mean[0][0] - mean[1][0], mean[0][1] - mean[1][1])
print(f"{rms:.3f} px, {100 * rms / eye:.2f} % of the eye distance ({eye:.1f} px), {n} frames")
EOF
}

echo "== landmark jitter, still noisy 1080p clip"
for smooth in 0 6; do
  rm -f "$work/o.mp4"
  "$bin" "$work/still.mp4" "$work/o.mp4" -q --model "$model" --smooth "$smooth" --faces-json "$work/f.json" 2>/dev/null
  echo "--smooth $smooth: $(jitter "$work/f.json")"
done

echo "== fps, samples/astronaut-1080p.mp4 (identity-256, 120 frames), median of $repeats paired runs"
configs=("--smooth 0 --mask box" "--smooth 6 --mask box" "--smooth 0 --mask face" "--smooth 6 --mask face")
declare -A fps
for r in $(seq "$repeats"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    rm -f "$work/b.mp4"
    "$bin" samples/astronaut-1080p.mp4 "$work/b.mp4" -q --model "$model" --frames 120 $c \
      --stats-json "$work/s.json" 2>/dev/null
    v=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['frames']/s['wall_s'])" "$work/s.json")
    fps[$c]="${fps[$c]:-} $v"
  done
done
for c in "${configs[@]}"; do
  # shellcheck disable=SC2086
  echo "$c: $(python3 -c "import statistics,sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f} fps')" ${fps[$c]})"
done
