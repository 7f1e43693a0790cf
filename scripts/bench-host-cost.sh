#!/usr/bin/env bash
# What a face costs the host's CPU over a plain FFmpeg re-encode with the same encoder settings
# (libx264, preset medium, crf 18, audio copied): the work a GPU machine's cores do around the
# model. Run in turn, pair by pair: `gpen-video bench SOURCE --stage feeder` (every stage, the
# model not run: its whole-process core-ms per face, and the detector's and face mesh's own
# model runs timed apart) and the plain re-encode (its user + system CPU time per face of the
# clip). Prints each pair and the medians of
#   - over ffmpeg: the feeder's whole-process core-ms per face minus ffmpeg's;
#   - host work over ffmpeg: the same without the detector's and mesh's model runs, which a GPU
#     machine runs on its GPU (`--detect-device gpu`), as it runs GPEN;
#   - host path: the feeder's whole-process core-ms per face without those model runs (decoding
#     and encoding included: the figure the host-cost budget is stated in);
#   - host path, every model left out: also without the hands and identity models' runs, whose
#     sessions a GPU machine makes on its GPU as it makes the detector's.
#
#   scripts/bench-host-cost.sh [SOURCE] [PAIRS] [-- extra gpen-video bench flags]
#
# GPEN_VIDEO=path times another build. MODEL=... for another model file (only its input size
# matters here: the feeder does not run it). BASE=path times a second build in the same rounds
# (this build and the base, taking turns at going first, then ffmpeg) and prints the medians of
# both and of the paired differences (this build minus the base): on a shared machine the
# figures move by a core-ms a face from round to round, their differences much less. Give it
# an even number of pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-args.sh
source scripts/bench-args.sh
bench_args samples/group-1080p.mp4 3 "$@"
base=${BASE:-}
[ -z "$base" ] || [ -x "$base" ] || { echo "BASE=$base is not an executable gpen-video build" >&2; exit 1; }
frames=$(ffprobe -v error -select_streams v:0 -count_packets -show_entries stream=nb_read_packets \
  -of csv=p=0 "$src")
run_ffmpeg() {
  /usr/bin/time -f '%U %S' -o "$tmp/cpu" ffmpeg -hide_banner -loglevel error -y -i "$src" \
    -map 0:v:0 -map '0:a?' -c:v libx264 -preset medium -crf 18 -c:a copy "$tmp/f.mp4"
}
# run_feeder BINARY JSON
run_feeder() {
  "$1" bench "$src" --stage feeder --repeat 1 --model "$model" --json "$2" "${extra[@]}" >/dev/null 2>&1
}
# row JSON: one feeder run's figures against the latest ffmpeg run, on one line.
row() {
  python3 - "$1" "$tmp/cpu" "$frames" <<'EOF'
import json, sys
f = json.load(open(sys.argv[1]))["feeder"][0]
user, system = map(float, open(sys.argv[2]).read().split()[-2:])
faces = int(sys.argv[3]) * f["faces_per_s"] / f["fps"]
ffmpeg = (user + system) * 1000 / faces
models = sum(ms for n, ms in f["fast_stage_model_ms"] if n in ("detect", "pass", "mesh"))
every = sum(ms for _, ms in f["fast_stage_model_ms"])
over = f["process_core_ms"] - ffmpeg
print(f"{f['process_core_ms']:.2f} {ffmpeg:.2f} {models:.2f} {over:.2f} {over - models:.2f} "
      f"{f['process_core_ms'] - models:.2f} {f['process_core_ms'] - every:.2f}")
EOF
}
# say LABEL ROW
say() {
  local whole ff models over host path every
  read -r whole ff models over host path every <<<"$2"
  printf '%s: feeder %s core-ms/face, ffmpeg %s, over ffmpeg %s, detector and mesh model runs %s, host work over ffmpeg %s, host path %s, every model left out %s\n' \
    "$1" "$whole" "$ff" "$over" "$models" "$host" "$path" "$every"
}
# medians LABEL ROW...: each figure's median over the rows.
medians() {
  local label=$1
  shift
  printf '%s\n' "$@" | python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
m = [statistics.median(c) for c in zip(*rows)]
print(f"{sys.argv[1]}medians over {len(rows)} pairs, core-ms per face: feeder {m[0]:.2f}, ffmpeg {m[1]:.2f}, "
      f"over ffmpeg {m[3]:.2f}, host work over ffmpeg (detector and mesh model runs left to a GPU) {m[4]:.2f}, "
      f"host path (the feeder without those model runs) {m[5]:.2f}, "
      f"host path with every model left to a GPU (the hands and identity models too) {m[6]:.2f}")
' "$label"
}
# Warm-up (page cache, ONNX Runtime's first load), not counted.
run_ffmpeg
rows=()
base_rows=()
for i in $(seq 1 "$pairs"); do
  # The two builds take turns at going first (the second of two runs back to back reads
  # about 0.6 core-ms a face higher here): an even number of pairs cancels that.
  if [ -n "$base" ] && [ $((i % 2)) = 0 ]; then
    run_feeder "$base" "$tmp/base.json"
    run_feeder "$bin" "$tmp/b.json"
  else
    run_feeder "$bin" "$tmp/b.json"
    [ -z "$base" ] || run_feeder "$base" "$tmp/base.json"
  fi
  run_ffmpeg
  r=$(row "$tmp/b.json")
  say "pair $i" "$r"
  rows+=("$r")
  if [ -n "$base" ]; then
    r=$(row "$tmp/base.json")
    say "pair $i, base" "$r"
    base_rows+=("$r")
  fi
done
if [ -n "$base" ]; then
  medians "base: " "${base_rows[@]}"
  paste -d' ' <(printf '%s\n' "${rows[@]}") <(printf '%s\n' "${base_rows[@]}") | python3 -c '
import statistics, sys
d = [[a - b for a, b in zip(v[:7], v[7:])] for v in (list(map(float, l.split())) for l in sys.stdin if l.strip())]
# Pairs 1, 3, ... ran this build first; 2, 4, ... the base: the mean of the two sides medians
# cancels what going second costs.
sides = [d[0::2], d[1::2]]
m = [statistics.mean(statistics.median(c) for c in cols) for cols in zip(*(zip(*s) for s in sides if s))]
print(f"paired differences, this build minus the base, over {len(d)} pairs (the medians of the pairs it "
      f"went first and second in, averaged), core-ms per face: feeder {m[0]:+.2f}, host path {m[5]:+.2f}, "
      f"host path with every model left out {m[6]:+.2f}")
'
fi
medians "" "${rows[@]}"
