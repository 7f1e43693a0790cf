#!/usr/bin/env bash
# Load benchmark of `gpen-video serve` with a real load generator (wrk, from Debian): starts the
# service on a free loopback port with the model, posts the set-up's portrait (scaled to SIDE
# px, PNG) at concurrency 1, 4 and 16 for SECONDS each, and prints images/s, P50 and P99
# latency (wrk's) and the mean batch fill (the service's /metrics); beside it the ceiling:
# `gpen-video batch` over a folder of the same pictures (the same engine fed from disk, no HTTP).
# Then the memory check: 10,000 requests (by the service's own count) at concurrency 16 with the
# identity stand-in, the service's resident memory sampled after each thousand: flat is the
# promise.
#
#   scripts/bench-serve.sh [SECONDS] [-- extra serve flags, e.g. --device cuda:0]
#
# SECONDS: each concurrency's run (default 20). Also from the environment:
#   MODEL=PATH      the model for the latency runs (default models/gpen-bfr-256-random.onnx)
#   SIDE=N          the portrait's side in pixels (default 512)
#   REQUESTS=N      the memory run's requests (default 10000; 0 skips it)
#   GPEN_VIDEO=PATH the binary (default target/release/gpen-video, built if missing)
# Installs wrk with apt when missing (as root, or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-20}
[ $# -gt 0 ] && shift
[ "${1:-}" = -- ] && shift
extra=("$@")
model=${MODEL:-models/gpen-bfr-256-random.onnx}
side=${SIDE:-512}
requests=${REQUESTS:-10000}
log() { printf '[bench-serve] %s\n' "$*" >&2; }

if ! command -v wrk >/dev/null; then
  log "installing wrk"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
# shellcheck disable=SC1091
[ -f .deps/env.sh ] && source .deps/env.sh
bin=${GPEN_VIDEO:-target/release/gpen-video}
[ -x "$bin" ] || cargo build --release --locked
[ -f "$model" ] || { log "$model is missing: run scripts/setup.sh"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpen-serve-bench.XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
image=$tmp/portrait.png
ffmpeg -v error -y -i samples/astronaut.png -vf "scale=$side:$side" "$image"
cat >"$tmp/post.lua" <<'LUA'
local f = io.open(os.getenv("IMAGE"), "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "image/png"
LUA

# start MODEL: a service on a free port, ready; sets $pid and $url.
start() {
  "$bin" serve --listen 127.0.0.1:0 --model "$1" --queue 1024 ${extra[@]+"${extra[@]}"} 2>"$tmp/serve.log" &
  pid=$!
  for _ in $(seq 600); do
    url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$tmp/serve.log" | head -1)
    [ -n "$url" ] && curl -sf "$url/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "the service did not start: $(tail -3 "$tmp/serve.log")"
  exit 1
}
stop() {
  kill -TERM "$pid"
  wait "$pid" || { log "serve exited with $?"; exit 1; }
  pid=""
}
metric() { curl -sf "$url/metrics" | awk -v n="$1" 'index($0, n) == 1 { print $NF; exit }'; }

printf '%-12s %10s %10s %10s %10s\n' concurrency "images/s" "P50 ms" "P99 ms" "batch fill"
start "$model"
# One request first: sessions warm, nothing timed.
curl -sf --data-binary @"$image" "$url/v1/restore" -o /dev/null
for c in 1 4 16; do
  t=$((c < 4 ? c : 4))
  b0=$(metric 'gpen_worker_batches_total'); f0=$(metric 'gpen_worker_faces_total')
  IMAGE=$image wrk -t "$t" -c "$c" -d "${secs}s" --timeout 30s --latency -s "$tmp/post.lua" "$url/v1/restore" >"$tmp/wrk-$c.txt"
  b1=$(metric 'gpen_worker_batches_total'); f1=$(metric 'gpen_worker_faces_total')
  python3 - "$tmp/wrk-$c.txt" "$c" "$b0" "$b1" "$f0" "$f1" "$(metric gpen_queue_capacity)" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
c, b0, b1, f0, f1 = sys.argv[2], *map(float, sys.argv[3:7])
def ms(label):
    m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if not m:
        return float("nan")
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
fill = (f1 - f0) / (4 * (b1 - b0)) if b1 > b0 else float("nan")
note = f"  ({non2xx.group(1)} not 200)" if non2xx else ""
print(f"{c:<12} {rps:>10.1f} {ms(50):>10.1f} {ms(99):>10.1f} {fill:>10.2f}{note}")
PY
done
stop

# The ceiling: the same engine over a folder of the same pictures, from disk.
n=$((secs * 4 > 64 ? secs * 4 : 64))
mkdir -p "$tmp/in" "$tmp/out"
for i in $(seq -w 1 "$n"); do ln "$image" "$tmp/in/p$i.png"; done
t0=$(date +%s%N)
"$bin" batch "$tmp/in" "$tmp/out" --model "$model" -q ${extra[@]+"${extra[@]}"} >/dev/null 2>&1
t1=$(date +%s%N)
python3 -c "import sys; n, ns = int(sys.argv[1]), int(sys.argv[2]); print(f'{\"batch (ceiling)\":<12} {n / (ns / 1e9):>10.1f}   ({n} pictures, {ns / 1e9:.1f} s)')" "$n" $((t1 - t0))

if [ "$requests" -gt 0 ]; then
  start models/standin/identity-256.onnx
  rss() { awk '/VmRSS/ { print $2 }' "/proc/$pid/status"; }
  printf 'memory over %s requests (identity stand-in, concurrency 16): RSS MiB after each thousand\n' "$requests"
  done_n=0 line=""
  while [ "$done_n" -lt "$requests" ]; do
    IMAGE=$image wrk -t 4 -c 16 -d 2s --timeout 30s -s "$tmp/post.lua" "$url/v1/restore" >/dev/null
    now=$(metric 'gpen_requests_total{outcome="ok"}')
    now=${now%.*}
    while [ $((done_n + 1000)) -le "$now" ] && [ "$done_n" -lt "$requests" ]; do
      done_n=$((done_n + 1000))
      line="$line $((done_n / 1000))k:$(($(rss) / 1024))"
    done
  done
  echo "  $line"
  stop
fi
