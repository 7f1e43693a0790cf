#!/usr/bin/env bash
# Whole-process speed of gpen-video against a plain FFmpeg re-encode with the same encoder
# settings (libx264, preset medium, crf 18, audio copied), run in turn, pair by pair, so a
# machine whose speed drifts skews both alike. Prints each pair's wall times and the median
# of the per-pair ratios gpen-video fps / ffmpeg fps (above 1: gpen-video is faster).
#
#   scripts/bench-vs-ffmpeg.sh [SOURCE] [PAIRS] [-- extra gpen-video flags]
#
# SOURCE defaults to samples/astronaut-1080p.mp4 (scripts/make_samples.sh makes it and
# samples/twofaces-720p.mp4); the model defaults to the identity stand-in, so what is timed is
# everything but the model: decoding, detection, alignment, paste and encoding.
# GPEN_VIDEO=path/to/binary times another build (an earlier commit, say) the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-args.sh
source scripts/bench-args.sh
bench_args samples/astronaut-1080p.mp4 4 "$@"
set -- "${extra[@]}"
now() { date +%s.%N; }
run_gpen() { rm -f "$tmp/g.mp4"; "$bin" "$src" "$tmp/g.mp4" --model "$model" -q "$@" 2>/dev/null; }
run_ffmpeg() {
  ffmpeg -hide_banner -loglevel error -y -i "$src" -map 0:v:0 -map '0:a?' -c:v libx264 -preset medium \
    -crf 18 -c:a copy "$tmp/f.mp4"
}
# Warm-up (page cache, ONNX Runtime's first load), not counted.
run_gpen --frames 30 "$@"
run_ffmpeg
ratios=()
for i in $(seq 1 "$pairs"); do
  t0=$(now); run_gpen "$@"; t1=$(now); run_ffmpeg; t2=$(now)
  g=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
  f=$(awk -v a="$t1" -v b="$t2" 'BEGIN {print b - a}')
  r=$(awk -v g="$g" -v f="$f" 'BEGIN {print f / g}')
  ratios+=("$r")
  printf 'pair %d: gpen-video %.2f s, ffmpeg %.2f s, fps ratio %.3f\n' "$i" "$g" "$f" "$r"
done
printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median fps ratio (gpen-video / ffmpeg) over %d pairs: %.3f\n", NR, m}'
