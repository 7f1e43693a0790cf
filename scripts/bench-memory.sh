#!/usr/bin/env bash
# Resident memory over a long run: generates (once) a long clip with two faces, runs gpen-video
# on it while sampling its resident set size every second, and prints the mean RSS of the first
# and the last minute after warm-up, their difference and the growth rate. Flat memory is what a
# streaming pipeline promises; a steady climb is a leak or allocator fragmentation.
#
#   scripts/bench-memory.sh [SECONDS] [-- extra gpen-video flags]
#
# SECONDS (default 270) is the clip's length (854x480, 25 fps, two faces, audio); the clip is
# kept in samples/long-SECONDS.mp4. Environment passes through, so allocator settings can be
# compared (e.g. MALLOC_ARENA_MAX=2 scripts/bench-memory.sh). The model defaults to the identity
# stand-in (MODEL=... for another).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-270}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bin=${GPEN_VIDEO:-target/release/gpen-video}
model=${MODEL:-models/standin/identity-256.onnx}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
# shellcheck disable=SC1091
[ -f .deps/env.sh ] && source .deps/env.sh
clip=samples/long-$secs.mp4
if [ ! -f "$clip" ]; then
  echo "[memory] making $clip ($secs s)" >&2
  ffmpeg -hide_banner -loglevel error -y -loop 1 -i samples/astronaut.png \
    -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$secs" -filter_complex "
      color=c=0x30383a:s=854x480:r=25:d=$secs[bg];[0:v]split=2[a0][b0];
      [a0]scale=300:300[a];[b0]scale=140:140[b];
      [bg][a]overlay=x=60+40*sin(2*PI*t/9):y=90:shortest=1[o1];
      [o1][b]overlay=x=600:y=120+30*sin(2*PI*t/7),noise=alls=5:allf=t,format=yuv420p[v]" \
    -map '[v]' -map 1:a -t "$secs" -c:v libx264 -preset veryfast -crf 23 -c:a aac -b:a 64k \
    "$clip.tmp.mp4"
  mv "$clip.tmp.mp4" "$clip"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" "$clip" "$tmp/out.mp4" --model "$model" -q "$@" 2>"$tmp/log" &
pid=$!
t=0
while kill -0 "$pid" 2>/dev/null; do
  kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ -n "$kb" ] && echo "$t $kb" >> "$tmp/rss"
  sleep 1
  t=$((t + 1))
done
wait "$pid" || { cat "$tmp/log" >&2; exit 1; }
awk -v warm=10 '
  { s[NR] = $1; r[NR] = $2 / 1024 }
  END {
    n = NR; if (n < 2 * (60 + warm)) { w = int((n - warm) / 2) } else { w = 60 }
    for (i = warm + 1; i <= warm + w; i++) { a += r[i] } a /= w
    for (i = n - w + 1; i <= n; i++) { b += r[i] } b /= w
    span = s[n - int(w / 2)] - s[warm + int(w / 2)]
    printf "run of %d s: RSS first %d s after warm-up %.1f MiB, last %d s %.1f MiB, +%.1f MiB (%.3f MiB/s); peak %.1f MiB\n",
      s[n], w, a, w, b, b - a, (b - a) / (span > 0 ? span : 1), 0
  }' "$tmp/rss" | sed "s/peak 0.0 MiB/peak $(sort -k2 -n "$tmp/rss" | tail -1 | awk '{printf "%.1f", $2 / 1024}') MiB/"
