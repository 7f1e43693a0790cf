#!/usr/bin/env bash
# GPU check, thin driver around the self-contained bundle (scripts/gpu-bundle.sh builds it, the
# bundle's run.sh does the work on the GPU machine).
#
#   scripts/gpu-check.sh plan [BUNDLE_DIR]      here: build the bundle if missing, list the transfers
#   scripts/gpu-check.sh run [BUNDLE_DIR] [RUNNER ARGS...]
#                                                on the GPU machine, once every part has arrived
#
# BUNDLE_DIR defaults to out/gpu-bundle (GPEN-512, the 1080p group sample). `plan` prints, in order,
# what to send: each part in a transfer of its own (at most 60 MiB each), run.sh, MANIFEST.sha256
# and tools/ (1.7 MB) beside the last, smaller part, then `scripts/gpu-check.sh run` (which can
# go in the last transfer's call). Runner
# arguments (see `out/gpu-bundle/run.sh --help`): --device cuda:0 (default), --out DIR
# (default out/gpu-check), --budget S (360).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-plan}
[ $# -gt 0 ] && shift
bundle=out/gpu-bundle
if [ $# -gt 0 ] && [ -d "$1" ]; then bundle=$1; shift; fi
case $cmd in
  plan)
    [ -f "$bundle/MANIFEST.sha256" ] || scripts/gpu-bundle.sh --out "$bundle"
    mapfile -t parts < <(cd "$bundle" && ls gpen-bundle.tar.zst.part-*)
    n=${#parts[@]}
    echo "send to the GPU machine, in order ($n transfers, then the run):"
    for i in "${!parts[@]}"; do
      extra=""
      [ "$i" -eq $((n - 1)) ] && extra=" + $bundle/run.sh $bundle/MANIFEST.sha256 $bundle/tools (1.7 MB)"
      printf '  %d. %s/%s (%d bytes)%s\n' $((i + 1)) "$bundle" "${parts[$i]}" "$(stat -c %s "$bundle/${parts[$i]}")" "$extra"
    done
    echo "  then run, in the call of the last transfer or the next: scripts/gpu-check.sh run $bundle   (or: $bundle/run.sh --out out/gpu-check)"
    echo "the run joins and checks the parts (a missing or damaged one is named), then benches for about 6 minutes"
    ;;
  run)
    [ -x "$bundle/run.sh" ] || { echo "gpu-check.sh: error: $bundle/run.sh missing: send run.sh, MANIFEST.sha256 and tools/ with the parts" >&2; exit 1; }
    exec "$bundle/run.sh" --out out/gpu-check "$@"
    ;;
  *) echo "gpu-check.sh: unknown command $cmd (plan or run; see the top of this script)" >&2; exit 1 ;;
esac
