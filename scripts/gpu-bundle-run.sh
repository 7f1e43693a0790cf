#!/usr/bin/env bash
# The GPU check bundle's runner (scripts/gpu-bundle.sh copies it into the bundle as run.sh): on a
# bare machine, joins and checks the bundle's parts, unpacks them, sets the loader path to the
# bundle's libraries and to the CUDA/cuDNN/TensorRT libraries of the system python's nvidia-*
# pip packages (found, not assumed), prints nvidia-smi, then runs in one go, most telling
# first (a spent --budget drops the rest): the model alone in fp16 at batches 4 and 16, bench
# fp16 at batch 4 (end to end beside the model alone), the feeder (every stage but the model:
# what this host's cores feed the GPU, core-ms per face per stage), the byte-I/O model, fp16
# batch 16 and fp32 batch 4, one NVDEC run, the whole-file run of the sample (once whole, once
# in four segments at a time), the service
# (serve-check.py: images/s and P50/P99 at concurrency 1, 4, 16, then SIGTERM), the feeder
# with detection on the GPU, the rest of the batch/precision grid and one TensorRT run (cold,
# then from its engine cache: engine build time apart), and prints
# a table. A step
# that fails is reported with its message and the rest still runs. Exit 0 when it got to the
# table, 2 when every GPU step failed on --device cuda:N.
#
#   ./run.sh [--device cuda:0|cpu] [--out DIR] [--work DIR] [--budget S] [--frames N]
#            [--repeat R] [--whole-frames N] [--step-timeout S] [--only STEP,STEP...]
#
# Run it from anywhere: it finds the parts beside itself. --out (default ./gpu-check-out) gets
# one log and JSON per step, steps.tsv, summary.json and table.txt. --device cpu runs the
# benches on the CPU with 2 frames (fp16 at batch 4 and fp32 at 1 and 4: not fp16 at 1 or 16, nor
# fp32 at 16), the ceiling at batch 1 only (the proof without a GPU), and
# still tries CUDA, TensorRT and NVDEC on cuda:0, which must fail with gpen-video's message.
# --budget (default 360 s; 1200 with --device cpu)
# skips the steps still to come once it is spent, and no step runs past it by more than 60 s.
# --only runs just the named steps (a rerun of what failed, or a short lease's first look).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
device=cuda:0
out=$PWD/gpu-check-out
work=$here/unpacked
budget=""
frames="" repeat="" whole_frames="" step_timeout="" only=""
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --frames) frames=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --whole-frames) whole_frames=$2; shift 2 ;;
    --step-timeout) step_timeout=$2; shift 2 ;;
    --only) only=,$2,; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
die() { echo "run.sh: error: $*" >&2; exit 1; }
say() { printf '== %s\n' "$*"; }
t_start=$(date +%s)

# --- join and check the parts ------------------------------------------------------------------
manifest=$here/MANIFEST.sha256
[ -f "$manifest" ] || die "$manifest missing: send the bundle's MANIFEST.sha256 with run.sh"
mapfile -t parts < <(sed -n 's/^[0-9a-f]\{64\}  \(.*\.part-[0-9]*\)$/\1/p' "$manifest")
[ ${#parts[@]} -gt 0 ] || die "$manifest lists no parts"
missing=()
for p in "${parts[@]}"; do [ -f "$here/$p" ] || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] || die "missing in $here: ${missing[*]} (of ${#parts[@]} parts): send each, then run again"
say "checking ${#parts[@]} parts and the runner's files against MANIFEST.sha256"
if ! (cd "$here" && sha256sum --quiet -c MANIFEST.sha256); then
  die "checksum mismatch above: send the named files again (a part must arrive whole, byte for byte)"
fi
stamp=$work/.unpacked-$(sha256sum "$manifest" | cut -c1-16)
if [ ! -f "$stamp" ]; then
  zstd_cmd=()
  if [ -x "$here/tools/zstd" ] && LD_LIBRARY_PATH=$here/tools/lib "$here/tools/zstd" -V >/dev/null 2>&1; then
    zstd_cmd=(env "LD_LIBRARY_PATH=$here/tools/lib" "$here/tools/zstd")
  elif command -v zstd >/dev/null; then
    zstd_cmd=(zstd)
  else
    die "no zstd: neither the bundle's tools/zstd (with tools/lib) runs nor is one installed"
  fi
  say "unpacking into $work"
  rm -rf "$work"
  mkdir -p "$work"
  (cd "$here" && cat "${parts[@]}") | "${zstd_cmd[@]}" -d -q --long=27 -c | tar -x -C "$work"
  touch "$stamp"
fi
B=$work/gpen-bundle
[ -x "$B/bin/gpen-video" ] || die "$B/bin/gpen-video missing after unpacking: the bundle is incomplete"
mkdir -p "$out"
out=$(cd "$out" && pwd)
sed -n '1,4p' "$B/BUNDLE.txt" 2>/dev/null || true

# --- loader path: the bundle's libraries, then the python nvidia-* packages' -------------------
cuda_dirs=${CUDA_LIB_DIRS:-}
if command -v python3 >/dev/null; then
  found=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = []
for f in (site.getsitepackages, site.getusersitepackages):
    try:
        r = f()
        roots += [r] if isinstance(r, str) else list(r)
    except Exception:
        pass
roots += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
try:
    import nvidia  # namespace package of the nvidia-* wheels
    roots += [os.path.dirname(p) for p in nvidia.__path__]
except Exception:
    pass
dirs = []
for r in dict.fromkeys(roots):
    for top in ["nvidia", "tensorrt_libs", "tensorrt"]:
        base = os.path.join(r, top)
        for d, subdirs, files in os.walk(base):
            if d[len(base):].count(os.sep) > 3:
                subdirs[:] = []
                continue
            if any(f.startswith("lib") and ".so" in f for f in files) and d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
  cuda_dirs=${cuda_dirs:+$cuda_dirs:}$found
else
  echo "warning: no python3: the nvidia-* pip libraries cannot be found (set CUDA_LIB_DIRS)" >&2
fi
ldpath=$B/lib:$B/ort${cuda_dirs:+:$cuda_dirs}
# libstdc++/libgcc_s: the system's (newer on a newer distribution) unless it lacks them
if LD_LIBRARY_PATH=$ldpath ldd "$B/bin/gpen-video" "$B"/ort/libonnxruntime.so.* 2>&1 |
  grep -E 'libstdc\+\+|libgcc_s' | grep -q 'not found'; then
  ldpath=$ldpath:$B/lib-fallback
  echo "using the bundle's libstdc++/libgcc_s (the system's are missing or too old)"
fi
if LD_LIBRARY_PATH=$ldpath ldd "$B/bin/gpen-video" 2>&1 | grep -q 'not found'; then
  LD_LIBRARY_PATH=$ldpath ldd "$B/bin/gpen-video" 2>&1 | grep 'not found' >&2
  die "gpen-video's libraries above are missing from the bundle: rebuild it with scripts/gpu-bundle.sh"
fi
say "loader path: bundle lib, ort${cuda_dirs:+, and ${cuda_dirs//:/, }}"
gpu_libs_ok=1
for prov in cuda tensorrt; do
  f=$B/ort/libonnxruntime_providers_$prov.so
  [ -f "$f" ] || continue
  miss=$(LD_LIBRARY_PATH=$ldpath ldd "$f" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | sort -u | tr '\n' ' ')
  if [ -n "$miss" ]; then
    echo "note: ONNX Runtime's $prov provider needs ${miss}which this machine's loader path lacks (libcuda.so.1 comes with the NVIDIA driver, the rest from the nvidia-* pip packages: this onnxruntime-gpu is built for CUDA 13, libcudart.so.13 and libcublas.so.13): $prov runs will fail"
    [ $prov = cuda ] && gpu_libs_ok=0
  fi
done
have_cudnn=0
for d in ${cuda_dirs//:/ }; do compgen -G "$d/libcudnn.so.9*" >/dev/null && have_cudnn=1; done
[ $have_cudnn = 1 ] || echo "note: no libcudnn.so.9 in the nvidia-* pip libraries found: CUDA convolutions will fail to start"

# gpen-video with the bundle's loader path (only gpen-video: the system's tools keep their own)
gv=(env "LD_LIBRARY_PATH=$ldpath" "ORT_DYLIB_PATH=$B/ort/libonnxruntime.so" "$B/bin/gpen-video")

if command -v nvidia-smi >/dev/null; then
  say "nvidia-smi"
  nvidia-smi || true
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
else
  say "no nvidia-smi on this machine"
fi
"${gv[@]}" --version 2>/dev/null || true

# --- the steps ----------------------------------------------------------------------------------
gpu=$device
if [ "$device" = cpu ] || [[ $device == cpu:* ]]; then
  gpu=cuda:0
  frames=${frames:-2} repeat=${repeat:-1} whole_frames=${whole_frames:-4} step_timeout=${step_timeout:-300}
  budget=${budget:-1200}
else
  frames=${frames:-150} repeat=${repeat:-2} whole_frames=${whole_frames:-0} step_timeout=${step_timeout:-150}
  budget=${budget:-360}
fi
sample=$(ls "$B"/samples/* | head -1)
m32=$(ls "$B"/models/gpen-*-fp32.onnx | head -1)
m16=$(ls "$B"/models/gpen-*-fp16.onnx | head -1)
m16b=$(ls "$B"/models/gpen-*-fp16-bytes.onnx 2>/dev/null | head -1 || true)
det=$B/models/centerface.onnx
# -q: no bar or information lines; --stats: the whole summary in each step's log all the same.
common=(--detector "$det" --preset veryfast -q --stats)
steps=$out/steps.tsv
printf 'step\tdevice\tbatch\tstatus\twall_s\tgpu_peak_mib\tgpu_busy_pct\tjson\tmessage\n' >"$steps"
ran_gpu_ok=0

# step NAME DEVICE BATCH JSON TIMEOUT -- command...: runs it with a GPU sampler (memory used and
# busy share, every 250 ms), records a line in steps.tsv (the peak memory and the mean busy share:
# a GPU far from busy while the run is slow says the host limits it); a failure is printed with
# the tool's message and does not stop the run.
step() {
  local name=$1 dev=$2 batch=$3 json=$4 tmo=$5; shift 6
  local now; now=$(date +%s)
  if [ -n "$only" ] && [[ $only != *",$name,"* ]]; then
    printf '%s\t%s\t%s\tskipped\t-\t-\t-\t-\tnot in --only\n' "$name" "$dev" "$batch" >>"$steps"
    return 0
  fi
  if [ $((now - t_start)) -ge "$budget" ]; then
    printf '%s\t%s\t%s\tskipped\t-\t-\t-\t-\tbudget of %s s spent\n' "$name" "$dev" "$batch" "$budget" >>"$steps"
    say "$name: skipped (budget of $budget s spent)"
    return 0
  fi
  # no step runs more than a minute past the budget
  local left=$((budget - (now - t_start) + 60))
  [ "$tmo" -gt "$left" ] && tmo=$left
  say "$name ($dev, batch $batch; at most $tmo s)"
  local smi="" smi_pid=""
  if command -v nvidia-smi >/dev/null && [ "$dev" != cpu ]; then
    smi=$out/$name.gpumem
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -lms 250 >"$smi" 2>/dev/null &
    smi_pid=$!
  fi
  local t0 t1 rc=0
  t0=$(date +%s%N)
  timeout -k 15 "$tmo" "$@" >"$out/$name.log" 2>&1 || rc=$?
  t1=$(date +%s%N)
  [ -n "$smi_pid" ] && { kill "$smi_pid" 2>/dev/null || true; wait "$smi_pid" 2>/dev/null || true; }
  local peak=- busy=-
  if [ -n "$smi" ] && [ -s "$smi" ]; then
    peak=$(cut -d, -f1 "$smi" | tr -d ' ' | sort -n | tail -1)
    busy=$(awk -F', *' '$2 ~ /^[0-9]+$/ { s += $2; n++ } END { if (n) printf "%.0f", s / n; else print "-" }' "$smi")
  fi
  local ds=$(((t1 - t0) / 100000000)) wall
  wall=$((ds / 10)).$((ds % 10))
  local status=ok msg=""
  if [ $rc -ne 0 ]; then
    status=failed
    { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status=timeout
    msg=$(grep -m1 '^error' "$out/$name.log" || tail -1 "$out/$name.log")
    [ $status = timeout ] && msg="no result within $tmo s${msg:+; last: $msg}"
    echo "   $status (exit $rc) after ${wall} s: $msg"
  else
    grep -v '^\s*$' "$out/$name.log" | tail -n 12 | sed 's/^/   /'
    [ "$dev" != cpu ] && ran_gpu_ok=1
  fi
  msg=${msg//$'\t'/ }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$dev" "$batch" "$status" "$wall" "$peak" "$busy" "$json" "$msg" >>"$steps"
}

bench_dev=$device
# bench_step PREC BATCH: the model at that precision and batch, alone (the ceiling) and end to end
bench_step() {
  local prec=$1 b=$2 model=$m32 pflag=() stage=all
  [ "$prec" = fp16 ] && model=$m16 pflag=(--fp16)
  local j=$out/bench-$prec-b$b.json
  # on a CPU (the proof without a GPU) only one bench times the ceiling (at least 3 s)
  [ "$gpu" != "$device" ] && [ "$prec-$b" != fp32-1 ] && stage=pipeline
  step "bench-$prec-b$b" "$bench_dev" "$b" "$j" "$step_timeout" -- \
    "${gv[@]}" bench "$sample" --model "$model" "${pflag[@]}" --batch "$b" --device "$bench_dev" \
    --frames "$frames" --repeat "$repeat" --stage "$stage" --json "$j" "${common[@]}"
}
# In the order of what a first GPU must answer, so a spent budget drops the least of it: the
# default path (fp16, batch 4) end to end beside the model alone; the stages around the model on
# this host's cores (feeder: does the host or the GPU limit?); the byte path; larger batches; fp32.
# The model alone in fp16 at batches 4 and 16 (no decoding, detection or encoding): the GPU's
# ceiling, quick to get, whatever else fails (not on a CPU: bench-fp32-b1 times its ceiling).
for b in 4 16; do
  [ "$gpu" = "$device" ] || break
  step ceiling-fp16-b$b "$bench_dev" $b "$out/ceiling-fp16-b$b.json" "$step_timeout" -- \
    "${gv[@]}" bench "$sample" --model "$m16" --fp16 --batch $b --device "$bench_dev" --stage enhance \
    --frames "$frames" --repeat "$repeat" --json "$out/ceiling-fp16-b$b.json" "${common[@]}"
done
bench_step fp16 4
# The stages around the model without it, on this machine's cores: beside the model's own
# faces/s above, which side limits a GPU run.
step feeder "$device" 4 "$out/feeder.json" "$step_timeout" -- \
  "${gv[@]}" bench "$sample" --model "$m32" --batch 4 --device "$device" --stage feeder \
  --frames "$frames" --repeat "$repeat" --json "$out/feeder.json" "${common[@]}"
# Detection and the face mesh on the GPU (--detect-device gpu) instead of this host's cores. On
# the first H200 lent it fed no batch within 45 s: the detector's windows round tracked faces
# changed size from frame to frame. Faces are now followed by the mesh (192 x 192 crops, batches
# padded to powers of two) and the detector runs whole-frame passes of one size only, so the GPU
# sees a few input shapes; capped short all the same.
step feeder-gpu-detect "$gpu" 4 "$out/feeder-gpu-detect.json" 90 -- \
  "${gv[@]}" bench "$sample" --model "$m32" --batch 4 --device "$gpu" --stage feeder --detect-device gpu \
  --frames "$frames" --repeat 1 --json "$out/feeder-gpu-detect.json" "${common[@]}"
# The same fp16 model with byte I/O (crops cross as uint8, converted where the model runs):
# beside bench-fp16-b4, what the smaller transfers and the host's saved float work give.
if [ -n "$m16b" ]; then
  step bench-fp16-bytes-b4 "$bench_dev" 4 "$out/bench-fp16-bytes-b4.json" "$step_timeout" -- \
    "${gv[@]}" bench "$sample" --model "$m16b" --fp16 --batch 4 --device "$bench_dev" \
    --frames "$frames" --repeat "$repeat" --stage pipeline --json "$out/bench-fp16-bytes-b4.json" "${common[@]}"
fi
# fp16 at batch 16 on a CPU (the proof without a GPU) proves nothing fp16-b4 and fp32-b16 do
# not, and costs more than both (fp16 runs emulated there): not on a CPU.
[ "$gpu" = "$device" ] && bench_step fp16 16
bench_step fp32 4
if [ "$gpu" != "$device" ]; then
  # no GPU expected: CUDA must refuse with gpen-video's message, and the run goes on
  step cuda-fp32-b4 "$gpu" 4 "$out/cuda-fp32-b4.json" 120 -- \
    "${gv[@]}" bench "$sample" --model "$m32" --batch 4 --device "$gpu" --frames "$frames" --repeat 1 \
    --json "$out/cuda-fp32-b4.json" "${common[@]}"
fi
step nvdec-fp16-b4 "$gpu" 4 "$out/nvdec-fp16-b4.json" "$step_timeout" -- \
  "${gv[@]}" bench "$sample" --model "$m16" --fp16 --batch 4 --device "$gpu" --hwaccel cuda --stage pipeline \
  --frames "$frames" --repeat "$repeat" --json "$out/nvdec-fp16-b4.json" "${common[@]}"
whole=(--device "$device")
[ "$whole_frames" != 0 ] && whole+=(--frames "$whole_frames")
wm=$m16 wf=(--fp16)
[ "$gpu" != "$device" ] && wm=$m32 wf=()
step whole-file "$device" 16 "$out/whole-file.stats.json" "$step_timeout" -- \
  "${gv[@]}" "$sample" "$out/whole-file.mp4" -y --model "$wm" "${wf[@]}" --batch 16 "${whole[@]}" \
  --stats-json "$out/whole-file.stats.json" "${common[@]}"
# The same with the restorer's change pasted as it comes (no identity guard, no colour fix: the
# defaults' cost on this host, the guard's identity model on the CPU beside the GPU's model).
step whole-file-as-given "$device" 16 "$out/whole-file-as-given.stats.json" "$step_timeout" -- \
  "${gv[@]}" "$sample" "$out/whole-file-as-given.mp4" -y --model "$wm" "${wf[@]}" --batch 16 "${whole[@]}" \
  --identity-guard off --color-fix off --stats-json "$out/whole-file-as-given.stats.json" "${common[@]}"
# The same without the budget of decoded frames in flight (every queue may fill, as before the
# budget): faces/s above the budgeted run's would say the budget starves the GPU.
step whole-file-unbudgeted "$device" 16 "$out/whole-file-unbudgeted.stats.json" "$step_timeout" -- \
  env GPEN_VIDEO_IN_FLIGHT=100000 "${gv[@]}" "$sample" "$out/whole-file-unbudgeted.mp4" -y --model "$wm" "${wf[@]}" \
  --batch 16 "${whole[@]}" --stats-json "$out/whole-file-unbudgeted.stats.json" "${common[@]}"
# The same file in one-second segments, four at once on the one GPU (--jobs 4: four pipelines,
# each its own detection frame after frame): how far several pipelines feed the GPU past one.
step whole-file-4jobs "$device" 16 "$out/whole-file-4jobs.stats.json" "$step_timeout" -- \
  "${gv[@]}" "$sample" "$out/whole-file-4jobs.mp4" -y --model "$wm" "${wf[@]}" --batch 16 "${whole[@]}" \
  --segment 1 --jobs 4 --stats-json "$out/whole-file-4jobs.stats.json" "${common[@]}"
# Identity kept measured (the identity stage, on this host's CPU, beside the GPU's model): its
# core-ms a face and the faces/s against whole-file's, when the bundle has the identity model.
if [ -f "$B/models/face-id.onnx" ]; then
  step whole-file-identity "$device" 16 "$out/whole-file-identity.stats.json" "$step_timeout" -- \
    "${gv[@]}" "$sample" "$out/whole-file-identity.mp4" -y --model "$wm" "${wf[@]}" --batch 16 "${whole[@]}" \
    --identity --stats-json "$out/whole-file-identity.stats.json" "${common[@]}"
fi
# A user's batch-1 files of other contracts (CodeFormer's double weight and three outputs;
# GPEN-BFR's constant reshapes): `models add` writes checked copies with a symbolic batch (under
# this run's own XDG folders), which then run at batch 16 on the device.
if [ -f "$B/models/user/codeformer-512.onnx" ]; then
  ug=(env "XDG_CONFIG_HOME=$out/xdg/config" "XDG_DATA_HOME=$out/xdg/data" "${gv[@]}")
  "${ug[@]}" models add "$B/models/user/codeformer-512.onnx" --name codeformer >"$out/user-models-add.log" 2>&1 &&
    "${ug[@]}" models add "$B/models/user/ff-gpen-bfr-256.onnx" --name gpen-bfr-256 >>"$out/user-models-add.log" 2>&1 ||
    echo "   models add failed: $(tail -1 "$out/user-models-add.log")"
  step user-codeformer "$device" 16 "$out/user-codeformer.stats.json" "$step_timeout" -- \
    "${ug[@]}" "$sample" "$out/user-codeformer.mp4" -y --model codeformer --fidelity 0.7 --batch 16 "${whole[@]}" \
    --stats-json "$out/user-codeformer.stats.json" "${common[@]}"
  step user-gpen-bfr-256 "$device" 16 "$out/user-gpen-bfr-256.stats.json" "$step_timeout" -- \
    "${ug[@]}" "$sample" "$out/user-gpen-bfr-256.mp4" -y --model gpen-bfr-256 --batch 16 "${whole[@]}" \
    --stats-json "$out/user-gpen-bfr-256.stats.json" "${common[@]}"
fi
# The service: a portrait posted at concurrency 1, 4 and 16 (images/s, P50/P99 latency, batch
# fill), then SIGTERM, which must end it with exit 0 (serve-check.py).
if command -v python3 >/dev/null && [ -f "$B/serve-check.py" ]; then
  sreq=64
  [ "$gpu" != "$device" ] && sreq=8
  step serve "$device" 4 "$out/serve.json" "$step_timeout" -- \
    python3 "$B/serve-check.py" --image "$B/portraits/portrait.jpg" --json "$out/serve.json" \
    --requests "$sreq" -- "${gv[@]}" --model "$wm" "${wf[@]}" --batch 4 --device "$device" --detector "$det"
fi
# the rest of the batch and precision grid (on a CPU, the proof without a GPU, only fp32 at batch
# 1, which times the ceiling there: fp16 is proven by fp16-b4, batch 16 by the whole-file steps)
if [ "$gpu" = "$device" ]; then
  bench_step fp16 1
  bench_step fp32 16
fi
bench_step fp32 1
# TensorRT last (the slowest to start): a cold run builds the engine into the cache beside the
# model, the warm run loads it; the difference is the build time.
rm -rf "${m16%.onnx}.trt-cache"
step trt-fp16-b4-cold "$gpu" 4 "$out/trt-fp16-b4-cold.json" $((step_timeout + 150)) -- \
  "${gv[@]}" bench "$sample" --model "$m16" --trt --fp16 --batch 4 --device "$gpu" --stage enhance \
  --repeat 1 --json "$out/trt-fp16-b4-cold.json" "${common[@]}"
if grep -q $'^trt-fp16-b4-cold\t[^\t]*\t[^\t]*\tok' "$steps"; then
  step trt-fp16-b4-warm "$gpu" 4 "$out/trt-fp16-b4-warm.json" "$step_timeout" -- \
    "${gv[@]}" bench "$sample" --model "$m16" --trt --fp16 --batch 4 --device "$gpu" --stage enhance \
    --repeat 1 --json "$out/trt-fp16-b4-warm.json" "${common[@]}"
fi

# --- the table -----------------------------------------------------------------------------------
say "table (JSON per step in $out)"
if command -v python3 >/dev/null; then
  python3 - "$steps" "$out" "$(date +%s)" "$t_start" <<'PY' | tee "$out/table.txt"
import csv, json, os, sys
steps, out, t_end, t_start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = list(csv.DictReader(open(steps), delimiter="\t"))
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception:
        return None
def num(x, fmt):
    return "-" if x is None else format(x, fmt)
hdr = ["step", "device", "batch", "status", "faces/s", "ceiling f/s", "ms/batch", "eff.", "fps",
       "GPU MiB", "GPU busy %", "wall s"]
lines, summary = [], []
for r in rows:
    j = load(r["json"]) if r["json"] not in ("", "-") else None
    pipe = ceil = None
    fps = fs = ms = eff = gmib = None
    if isinstance(j, dict) and "rows" in j:
        for row in j["rows"]:
            if row.get("measure") == "pipeline":
                pipe = row
            else:
                ceil = row
        src = pipe or ceil or {}
        fps = (pipe or {}).get("fps")
        fs = (pipe or {}).get("faces_per_s")
        ms = (ceil or pipe or {}).get("ms_per_batch")
        effs = [e.get("efficiency") for e in j.get("efficiency", [])]
        eff = effs[0] if effs else None
        g = [x.get("gpu_mib") for x in (pipe, ceil) if x and x.get("gpu_mib") is not None]
        gmib = max(g) if g else None
        feed = (j.get("feeder") or [None])[0]
        if feed and not j["rows"]:
            fs, fps = feed.get("faces_per_s"), feed.get("fps")
    elif isinstance(j, dict) and isinstance(j.get("joined"), dict):  # a segmented run's --stats-json
        # over the step's wall time, the engines' loading included
        wall = float(r["wall_s"]) if r["wall_s"] not in ("", "-") else 0.0
        if wall > 0:
            fps, fs = j["joined"]["frames"] / wall, j["joined"]["faces"] / wall
    elif isinstance(j, dict):  # the whole-file run's --stats-json
        fps, fs = j.get("fps"), j.get("faces_per_s")
    peak = None if r["gpu_peak_mib"] in ("", "-") else int(float(r["gpu_peak_mib"]))
    if peak is not None:
        gmib = max(gmib or 0, peak)
    cf = (ceil or {}).get("faces_per_s")
    busy = None if r["gpu_busy_pct"] in ("", "-") else int(float(r["gpu_busy_pct"]))
    lines.append([r["step"], r["device"], r["batch"], r["status"], num(fs, ".1f"), num(cf, ".1f"),
                  num(ms, ".1f"), num(eff, ".2f"), num(fps, ".1f"), num(gmib, "d"), num(busy, "d"),
                  r["wall_s"]])
    summary.append({"step": r["step"], "device": r["device"], "batch": int(r["batch"]),
                    "status": r["status"], "wall_s": r["wall_s"], "faces_per_s": fs,
                    "ceiling_faces_per_s": cf, "ms_per_batch": ms, "efficiency": eff, "fps": fps,
                    "gpu_mib": gmib, "gpu_busy_pct": busy, "message": r["message"], "result": j})
w = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)]
fmt = lambda cells: "  ".join(str(c).ljust(w[i]) if i < 4 else str(c).rjust(w[i])
                              for i, c in enumerate(cells))
print(fmt(hdr))
for l in lines:
    print(fmt(l))
by = {r["step"]: r for r in summary}
c, wm = by.get("trt-fp16-b4-cold"), by.get("trt-fp16-b4-warm")
if c and wm and c["status"] == wm["status"] == "ok":
    print(f"TensorRT engine build (cold run minus warm run): {float(c['wall_s']) - float(wm['wall_s']):.1f} s")
f = (by.get("feeder") or {}).get("result") or {}
for feed in f.get("feeder", []):
    stages = ", ".join(f"{n} {ms:.2f}" for n, ms in feed.get("stage_core_ms", []))
    print(f"feeder: without the model {feed['faces_per_s']:.1f} faces/s ({feed['fast_faces_per_s']:.1f} "
          f"with the fastest preset); core-ms per face: {stages}; whole process "
          f"{feed['fast_process_core_ms']:.1f}: one core feeds about {feed['per_core_faces_per_s']:.0f} "
          f"faces/s, these {feed['cores']} cores about {feed['per_core_faces_per_s'] * feed['cores']:.0f}; "
          f"detection at most {feed['detect_limit']:.0f} per job")
    busy = feed.get("fast_stage_busy") or []
    if busy:
        print("feeder: measured, each stage's threads busy / its input queue full (%): "
              + ", ".join(f"{n} {100 * b:.0f}/{100 * q:.0f}" for n, b, q in busy)
              + f"; the process kept {feed.get('fast_cores_busy', 0):.1f} of {feed['cores']} cores busy")
    host = feed.get("host_16")
    if host:
        print(f"feeder: a host of 16 cores would feed about {host[0]:.0f} faces/s, limited by {host[1]}")
    gpu_host = feed.get("gpu_host_16")
    if gpu_host:
        model = sum(ms for _, ms in feed.get("fast_stage_model_ms", []))
        print(f"feeder: with detection's and the mesh's model runs ({model:.1f} core-ms a face here) left "
              f"to a GPU, 16 cores would feed about {gpu_host[0]:.0f} faces/s, limited by {gpu_host[1]}")
for name in ("whole-file", "whole-file-unbudgeted"):
    j = (by.get(name) or {}).get("result") or {}
    if isinstance(j, dict) and j.get("frames_in_flight_budget") is not None:
        rss = j.get("peak_rss_bytes") or 0
        print(f"{name}: decoded frames in flight at most {j.get('frames_in_flight_max')} of a budget of "
              f"{j['frames_in_flight_budget']}; peak memory {rss / 2**20:.0f} MiB; stage queues full: "
              + ", ".join(f"{s['name']} {100 * s['queue_fill']:.0f} %" for s in j.get("stages", [])))
for r in summary:
    if r["status"] != "ok":
        print(f"{r['step']}: {r['status']}: {r['message']}")
print(f"total {t_end - t_start} s; faces/s and fps: end to end; ceiling: the model alone; "
      "eff.: their ratio; GPU MiB: peak of nvidia-smi's memory.used during the step; GPU busy %: "
      "mean of its utilization.gpu (far under 100 with faces/s under the ceiling: the host limits)")
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"steps": summary, "total_s": t_end - t_start}, f, indent=1)
PY
else
  column -t -s $'\t' "$steps" 2>/dev/null || cat "$steps"
fi
if [ "$gpu" = "$device" ] && [ $ran_gpu_ok = 0 ]; then
  echo "no GPU step succeeded on $device$([ $gpu_libs_ok = 0 ] && echo ' (CUDA libraries missing: see the note above)')" >&2
  exit 2
fi
exit 0
