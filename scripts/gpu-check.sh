#!/usr/bin/env bash
# GPU check: on a machine with NVIDIA GPUs and the GPU build of ONNX Runtime, benchmark the
# exported GPEN-512 (random weights) on the 1080p sample at batches 1, 4 and 16, fp32 and fp16,
# and print the table (JSON per run lands in OUT_DIR).
#
#   ORT_DYLIB_PATH=/path/to/onnxruntime-gpu/capi/libonnxruntime.so scripts/gpu-check.sh [DEVICE] [OUT_DIR]
#
# DEVICE defaults to cuda:0 (cuda:all for every GPU). The CUDA provider library
# (libonnxruntime_providers_cuda.so) must sit beside libonnxruntime.so, and the CUDA runtime,
# cuBLAS and cuDNN libraries must be on the loader path (LD_LIBRARY_PATH). Expects a release
# build and the set-up's samples; exports the GPEN-512 models when python and onnx are there.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=${1:-cuda:0}
out=${2:-out/gpu-check}
bin=${GPEN_VIDEO:-target/release/gpen-video}
sample=${SAMPLE:-samples/astronaut-1080p.mp4}
repeat=${REPEAT:-3}
mkdir -p "$out"
[ -n "${ORT_DYLIB_PATH:-}" ] || { echo "set ORT_DYLIB_PATH to the GPU build's libonnxruntime.so" >&2; exit 1; }
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -f "$sample" ] || { echo "$sample missing: run scripts/make_samples.sh" >&2; exit 1; }
py=${PYTHON:-.deps/venv/bin/python}
for p in "" -fp16; do
  m=models/gpen-bfr-512-random$p.onnx
  if [ ! -f "$m" ]; then
    "$py" models/gpen_export.py --size 512 ${p:+--fp16} --out "$m" >/dev/null
  fi
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
for prec in fp32 fp16; do
  if [ $prec = fp16 ]; then model=models/gpen-bfr-512-random-fp16.onnx; flags=(--fp16); else model=models/gpen-bfr-512-random.onnx; flags=(); fi
  for b in 1 4 16; do
    echo "== $prec batch $b on $dev" >&2
    "$bin" bench "$sample" --model "$model" "${flags[@]}" --batch "$b" --device "$dev" --repeat "$repeat" \
      --preset veryfast --json "$out/bench-$prec-b$b.json" | tee "$out/bench-$prec-b$b.txt"
  done
done
echo "== decode on the GPU (NVDEC), fp16 batch 4" >&2
"$bin" bench "$sample" --model models/gpen-bfr-512-random-fp16.onnx --fp16 --batch 4 --device "$dev" --repeat "$repeat" \
  --preset veryfast --hwaccel cuda --stage pipeline --json "$out/bench-fp16-b4-nvdec.json" | tee "$out/bench-fp16-b4-nvdec.txt" || true
echo "reference: the GPEN throughput report's A100 figure is 36.7 images/s (batch 4, 1024x1024 inputs)"
