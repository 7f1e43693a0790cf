#!/usr/bin/env bash
# Whole-process speed of gpen-video against deface 1.5 (CenterFace on ONNX Runtime, blurring the
# faces it finds: a peer that does far less per face), both writing libx264 at preset medium, crf
# 18 with the audio kept, run in turn, pair by pair. Prints each pair's wall times and the median
# of the per-pair ratios deface time / gpen-video time (above 1: gpen-video is faster).
#
#   scripts/bench-vs-deface.sh [SOURCE] [PAIRS] [-- extra gpen-video flags]
#
# deface is installed from PyPI into .deps/deface-venv on first use (pip, idempotent). The model
# defaults to the identity stand-in (MODEL=... for another); GPEN_VIDEO=path times another build.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-args.sh
source scripts/bench-args.sh
bench_args samples/group-1080p.mp4 3 "$@"
set -- "${extra[@]}"
venv=.deps/deface-venv
if [ ! -x "$venv/bin/deface" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "deface==1.5.0"
fi
now() { date +%s.%N; }
run_gpen() { rm -f "$tmp/g.mp4"; "$bin" "$src" "$tmp/g.mp4" --model "$model" --preset medium --crf 18 -q "$@" 2>/dev/null; }
run_deface() {
  "$venv/bin/deface" "$src" -o "$tmp/d.mp4" --keep-audio \
    --ffmpeg-config '{"codec": "libx264", "ffmpeg_params": ["-preset", "medium", "-crf", "18"]}' \
    >/dev/null 2>&1
}
# Warm-up (page cache, ONNX Runtime's first load), not counted.
run_gpen --frames 30 "$@"
ratios=()
for i in $(seq 1 "$pairs"); do
  t0=$(now); run_gpen "$@"; t1=$(now); run_deface; t2=$(now)
  g=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
  d=$(awk -v a="$t1" -v b="$t2" 'BEGIN {print b - a}')
  r=$(awk -v g="$g" -v d="$d" 'BEGIN {printf "%.3f", d / g}')
  printf 'pair %d: gpen-video %.2f s, deface %.2f s, ratio %s\n' "$i" "$g" "$d" "$r"
  ratios+=("$r")
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
echo "$src: gpen-video is ${median}x deface's speed (median of $pairs pairs; deface time / gpen-video time)"
