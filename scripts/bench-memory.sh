#!/usr/bin/env bash
# Resident memory over a long run: generates (once) a long clip with two faces, runs gpen-video
# on it while sampling its resident set size (and the anonymous part of it) every second, and
# prints, after a warm-up, the median RSS of the first and of the last minute, their difference
# and the growth rate (least-squares slope over every sample after the warm-up). Flat memory is
# what a streaming pipeline promises; a steady climb is a leak or allocator fragmentation. Steps
# that come with pool buffers made after the warm-up (counted from the debug log) are frames in
# flight after a stall (another process taking the CPU): a high-water mark under the pools'
# bound, not a leak; compare runs that made none.
#
#   scripts/bench-memory.sh [SECONDS] [-- extra gpen-video flags]
#
# SECONDS (default 270) is the clip's length (854x480, 25 fps, two faces, audio); the clip is
# kept in samples/long-SECONDS.mp4. Environment passes through, so allocator settings can be
# compared (e.g. MALLOC_ARENA_MAX=2 scripts/bench-memory.sh). Also:
#   MODEL=PATH        the model (default: the identity stand-in)
#   GPEN_VIDEO=PATH   the binary (default target/release/gpen-video)
#   BASELINE=PATH     a second binary (an older build) run right after on the same clip and
#                     flags, its line printed under the first: an A/B in one invocation
#                     (a build older than the pool log counts no pool buffers)
#   WARM=S            seconds left out at the start (default 10)
#   RSS_LOG=DIR       keep each run's series there (seconds, RSS KiB, anonymous KiB)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-270}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bin=${GPEN_VIDEO:-target/release/gpen-video}
model=${MODEL:-models/standin/identity-256.onnx}
warm=${WARM:-10}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -z "${BASELINE:-}" ] || [ -x "$BASELINE" ] || { echo "BASELINE=$BASELINE is not an executable" >&2; exit 1; }
# shellcheck disable=SC1091
[ -f .deps/env.sh ] && source .deps/env.sh
clip=samples/long-$secs.mp4
if [ ! -f "$clip" ]; then
  echo "[memory] making $clip ($secs s)" >&2
  ffmpeg -hide_banner -loglevel error -y -loop 1 -i samples/astronaut.png \
    -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$secs" -filter_complex "
      color=c=0x30383a:s=854x480:r=25:d=${secs}[bg];[0:v]split=2[a0][b0];
      [a0]scale=300:300[a];[b0]scale=140:140[b];
      [bg][a]overlay=x=60+40*sin(2*PI*t/9):y=90:shortest=1[o1];
      [o1][b]overlay=x=600:y=120+30*sin(2*PI*t/7),noise=alls=5:allf=t,format=yuv420p[v]" \
    -map '[v]' -map 1:a -t "$secs" -c:v libx264 -preset veryfast -crf 23 -c:a aac -b:a 64k \
    "$clip.tmp.mp4"
  mv "$clip.tmp.mp4" "$clip"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# measure TAG LABEL BINARY [flags...]: one run, one line (the series kept as TAG.rss).
measure() {
  local tag=$1 label=$2 exe=$3 pid t=0
  shift 3
  : > "$tmp/rss"
  local t0
  t0=$(date +%s.%N)
  # The pools log each buffer they make (debug): after the warm-up, each is a step of RSS.
  RUST_LOG=${RUST_LOG:-gpen_video=info,gpen_video::frame=debug,warn} \
    "$exe" "$clip" "$tmp/out.mp4" --model "$model" -q "$@" 2>"$tmp/log" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    awk -v t=$t '/^VmRSS:/ {r = $2} /^RssAnon:/ {a = $2} END {if (r) print t, r, a}' \
      "/proc/$pid/status" >> "$tmp/rss" 2>/dev/null || true
    sleep 1
    t=$((t + 1))
  done
  wait "$pid" || { cat "$tmp/log" >&2; exit 1; }
  rm -f "$tmp/out.mp4"
  [ -z "${RSS_LOG:-}" ] || { mkdir -p "$RSS_LOG"; cp "$tmp/rss" "$RSS_LOG/$tag.rss"; }
  local late=0 ts
  while read -r ts _; do
    if awk -v a="$(date -d "$ts" +%s.%N)" -v b="$t0" -v w="$warm" 'BEGIN { exit !(a - b > w) }'; then
      late=$((late + 1))
    fi
  done < <(grep 'pool buffer made' "$tmp/log" || true)
  awk -v warm="$warm" -v label="$label" -v late="$late" '
    function median(lo, hi, col,   k, i, j, v, a) {
      k = 0
      for (i = lo; i <= hi; i++) a[++k] = (col == 2 ? r[i] : an[i])
      for (i = 2; i <= k; i++) { v = a[i]; for (j = i - 1; j > 0 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    { s[NR] = $1; r[NR] = $2 / 1024; an[NR] = $3 / 1024; if (r[NR] > peak) peak = r[NR] }
    END {
      n = NR
      if (n < warm + 4) { printf "%s: run of %d s is too short for a %d s warm-up\n", label, n, warm; exit }
      w = (n - warm >= 120) ? 60 : int((n - warm) / 2)
      a = median(warm + 1, warm + w, 2); b = median(n - w + 1, n, 2)
      aa = median(warm + 1, warm + w, 3); ba = median(n - w + 1, n, 3)
      for (i = warm + 1; i <= n; i++) { m++; sx += s[i]; sy += r[i]; sxx += s[i] * s[i]; sxy += s[i] * r[i] }
      slope = (m * sxy - sx * sy) / (m * sxx - sx * sx)
      printf "%s: run of %d s: RSS median first %d s after %d s warm-up %.1f MiB, last %d s %.1f MiB: %+.1f MiB (anonymous %+.1f); slope %+.2f MiB/min; peak %.1f MiB; pool buffers made after warm-up: %d\n",
        label, s[n], w, warm, a, w, b, b - a, ba - aa, slope * 60, peak, late
    }' "$tmp/rss"
}

measure run "$bin" "$bin" "$@"
if [ -n "${BASELINE:-}" ]; then
  measure baseline "baseline $BASELINE" "$BASELINE" "$@"
fi
