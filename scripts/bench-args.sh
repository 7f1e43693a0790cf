# Sourced by the paired benches (bench-vs-ffmpeg.sh, bench-vs-deface.sh, bench-host-cost.sh).
# `bench_args DEFAULT_SOURCE DEFAULT_PAIRS [SOURCE] [PAIRS] [-- extra flags]` sets `src`, `pairs`,
# `bin` (GPEN_VIDEO, else this checkout's release build), `model` (MODEL, else the identity
# stand-in) and `extra` (the flags after `--`), loads ONNX Runtime's environment and makes a
# temporary folder `tmp`, removed on exit. A missing build or source ends the script with a
# message saying what to run.
# shellcheck shell=bash
bench_args() {
  local default_src=$1 default_pairs=$2
  shift 2
  src=${1:-$default_src}
  pairs=${2:-$default_pairs}
  shift $(( $# >= 2 ? 2 : $# ))
  [ "${1:-}" = "--" ] && shift
  extra=("$@")
  bin=${GPEN_VIDEO:-target/release/gpen-video}
  model=${MODEL:-models/standin/identity-512.onnx}
  [ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
  [ -f "$src" ] || { echo "$src missing: run scripts/make_samples.sh" >&2; exit 1; }
  # shellcheck disable=SC1091
  [ -f .deps/env.sh ] && source .deps/env.sh
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
}
