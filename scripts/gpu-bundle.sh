#!/usr/bin/env bash
# Builds the self-contained GPU check bundle for a bare GPU machine (no registry, no FFmpeg, at
# most 60 MiB per transfer): the release binary, every shared library it loads that is not
# glibc (ldd), the onnxruntime-gpu wheel's libonnxruntime.so and CUDA/TensorRT provider
# libraries, GPEN exports (fp32 and fp16, random weights made compressible), CenterFace and a
# sample, as one zstd-compressed tar split into parts, plus the runner (run.sh), a zstd tool and
# MANIFEST.sha256. Then prints the parts' sizes and the transfers they need.
#
#   scripts/gpu-bundle.sh [--small] [--out DIR] [--check-cpu] [--no-build]
#   scripts/gpu-bundle.sh --fetch     # only the onnxruntime-gpu wheel into its cache, then stop
#
# Default: GPEN-512 and samples/group-1080p.mp4 (1080p, about five faces a frame: what a GPU
# is fed) into out/gpu-bundle. --small: GPEN-256 and samples/test/astronaut.mp4 into
# out/gpu-bundle-small (same libraries and runner; what CI checks). --check-cpu: afterwards run
# the runner with --device cpu in a clean root (scripts/gpu-bundle-check.sh): env -i, an empty
# folder, glibc and the runner's own tools only. --fetch: download the wheel only (scripts/test.sh
# starts it before the build, so that the download and the compiling overlap).
# PART_MIB (60) and ZSTD_LEVEL (3: level 19 saves 2 % on the CUDA provider at 60x the time) tune it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
small=0 check=0 build=1 fetch=0 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --small) small=1; shift ;;
    --check-cpu) check=1; shift ;;
    --no-build) build=0; shift ;;
    --fetch) fetch=1; shift ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
log() { printf '[gpu-bundle] %s\n' "$*" >&2; }
die() { echo "gpu-bundle.sh: error: $*" >&2; exit 1; }
ORT_VERSION=1.31.1
part_mib=${PART_MIB:-60}
level=${ZSTD_LEVEL:-3}
py=.deps/venv/bin/python
[ -x "$py" ] || die "$py missing: run scripts/setup.sh first"
# The onnxruntime-gpu wheel, downloaded once into .deps/wheels; its path.
fetch_wheel() {
  local wheels=.deps/wheels whl
  mkdir -p "$wheels"
  whl=$(ls "$wheels"/onnxruntime_gpu-$ORT_VERSION-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    log "downloading onnxruntime-gpu==$ORT_VERSION (about 250 MB, cached in $wheels)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "onnxruntime-gpu==$ORT_VERSION" -d "$wheels" >&2
    whl=$(ls "$wheels"/onnxruntime_gpu-$ORT_VERSION-*.whl | head -1)
  fi
  echo "$whl"
}
if [ $fetch = 1 ]; then
  fetch_wheel >/dev/null
  exit 0
fi
command -v zstd >/dev/null || die "zstd missing: apt-get install zstd"
if [ $small = 1 ]; then
  size=256 sample=samples/test/astronaut.mp4 out=${out:-out/gpu-bundle-small}
else
  size=512 sample=samples/group-1080p.mp4 out=${out:-out/gpu-bundle}
fi
[ -f "$sample" ] || die "$sample missing: run scripts/setup.sh (or scripts/make_samples.sh)"
[ -f models/centerface.onnx ] || die "models/centerface.onnx missing: run scripts/setup.sh"
t0=$(date +%s)

# --- the binary ------------------------------------------------------------------------------
if [ $build = 1 ]; then
  cargo build --release --locked -q
fi
bin=target/release/gpen-video
[ -x "$bin" ] || die "$bin missing: cargo build --release --locked"

# --- onnxruntime-gpu: the wheel's shared libraries --------------------------------------------
whl=$(fetch_wheel)

# --- models: random weights with few distinct rows, so they compress --------------------------
# fp16-bytes: the fp16 model with byte I/O (uint8 crops in and out, converted on the GPU).
models=()
for prec in fp32 fp16 fp16-bytes; do
  m=models/gpen-bfr-$size-compressible-$prec.onnx
  if [ ! -f "$m" ] || [ models/gpen_export.py -nt "$m" ] || [ models/gpen_arch.py -nt "$m" ] ||
    [ models/byte_io.py -nt "$m" ]; then
    log "exporting $m"
    flags=()
    [ $prec != fp32 ] && flags+=(--fp16)
    [ $prec = fp16-bytes ] && flags+=(--bytes)
    "$py" models/gpen_export.py --size $size --compressible 2 "${flags[@]}" --no-check --out "$m" >/dev/null
  fi
  models+=("$m")
done

# --- stage the tree --------------------------------------------------------------------------
rm -rf "$out"
stage=$out/stage/gpen-bundle
mkdir -p "$stage"/{bin,lib,lib-fallback,ort,models,samples} "$out/tools/lib"
cp "$bin" "$stage/bin/"
# The face mesh goes too when the set-up made it (the run falls back to the ellipse without it).
mesh=()
[ -f models/face-mesh.onnx ] && mesh=(models/face-mesh.onnx)
# So do the hand models (MediaPipe's palm detector and hand landmarks, 15 MB together).
for m in models/palm-detect.onnx models/hand-landmarks.onnx; do
  [ -f "$m" ] && mesh+=("$m")
done
# And the identity model (22 MB): the identity guard (on by default) needs it. The quality
# figure's parameters (BRISQUE's, 0.3 MB) go too when the set-up made them.
[ -f models/face-id.onnx ] || die "models/face-id.onnx missing (the identity guard needs it): run scripts/setup.sh"
mesh+=(models/face-id.onnx)
[ -f models/brisque.json ] && mesh+=(models/brisque.json)
cp models/centerface.onnx "${mesh[@]}" "${models[@]}" "$stage/models/"
# Users' batch-1 files of other contracts (stand-ins, under a kilobyte each), for the runner's
# user-model step: `models add` makes a checked copy with a symbolic batch that runs batched.
mkdir -p "$stage/models/user"
cp models/standin/codeformer-512.onnx models/standin/ff-gpen-bfr-256.onnx "$stage/models/user/"
cp "$sample" "$stage/samples/"
# The service check's portrait and script (run.sh's serve step).
mkdir -p "$stage/portraits"
ffmpeg -v error -y -i samples/astronaut.png -vf scale=512:512 -q:v 3 "$stage/portraits/portrait.jpg"
cp scripts/serve-check.py "$stage/serve-check.py"
"$py" - "$whl" "$stage/ort" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
want = ("libonnxruntime.so.", "libonnxruntime_providers_shared.so",
        "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_tensorrt.so")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        base = os.path.basename(n)
        if n.startswith("onnxruntime/capi/") and base.startswith(want):
            with open(os.path.join(dest, base), "wb") as f:
                f.write(z.read(n))
PY
ortlib=$(cd "$stage/ort" && ls libonnxruntime.so.* | head -1)
if [ -z "$ortlib" ] || [ ! -f "$stage/ort/libonnxruntime_providers_cuda.so" ]; then
  die "$whl lacks libonnxruntime.so or the CUDA provider"
fi
ln -s "$ortlib" "$stage/ort/libonnxruntime.so"

# glibc's own libraries come from the target; libstdc++/libgcc_s go to lib-fallback (the runner
# uses the system's, newer on Ubuntu 24.04, and these only where it has none); all else to lib.
glibc='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libnss_[a-z]*|libthread_db)\.so'
copy_deps() { # copy_deps DEST FILE...: the resolved, non-glibc dependencies of FILEs
  local dest=$1
  shift
  ldd "$@" 2>/dev/null | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u |
    while read -r name path; do
      [[ $name =~ $glibc ]] && continue
      case $name in
        libstdc++.so.* | libgcc_s.so.*) cp -L "$path" "$stage/lib-fallback/$name" ;;
        *) cp -L "$path" "$dest/$name" ;;
      esac
    done
}
copy_deps "$stage/lib" "$bin" "$stage/ort/$ortlib" "$stage/ort/libonnxruntime_providers_shared.so"
zstd_bin=$(command -v zstd)
cp -L "$zstd_bin" "$out/tools/zstd"
ldd "$zstd_bin" | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | while read -r name path; do
  [[ $name =~ $glibc ]] || cp -L "$path" "$out/tools/lib/$name"
done
cp scripts/gpu-bundle-run.sh "$out/run.sh"
chmod +x "$out/run.sh"
{
  echo "gpen-video GPU check bundle: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "model GPEN-BFR-$size (random weights, compressible), sample $(basename "$sample"), onnxruntime-gpu $ORT_VERSION"
  echo "libraries: $(ls "$stage/lib" | wc -l) in lib, $(ls "$stage/lib-fallback" | tr '\n' ' ')in lib-fallback"
  echo "from the GPU machine: glibc, the NVIDIA driver (libcuda.so.1, libnvcuvid.so.1), nvidia-* pip libraries:"
  for f in "$stage"/ort/libonnxruntime_providers_{cuda,tensorrt}.so; do
    echo "  $(basename "$f") needs $(readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' |
      grep -Ev "$glibc|libstdc|libgcc_s" | tr '\n' ' ')(and dlopens libcudnn.so.9)"
  done
  echo
  (cd "$stage/.." && find gpen-bundle -type f -printf '%s %p\n' | sort -k2)
} >"$stage/BUNDLE.txt"

# --- compress, split, checksums ------------------------------------------------------------------
log "compressing (zstd -$level --long=27) into ${part_mib} MiB parts"
tar -C "$out/stage" -cf - gpen-bundle | zstd -q -T0 -"$level" --long=27 -c |
  split -b "${part_mib}M" -d -a 2 - "$out/gpen-bundle.tar.zst.part-"
uncompressed=$(du -sb "$stage" | cut -f1)
rm -rf "$out/stage"
(cd "$out" && sha256sum gpen-bundle.tar.zst.part-* run.sh tools/zstd tools/lib/* >MANIFEST.sha256)

# --- sizes and transfers ------------------------------------------------------------------------
{
  echo "bundle $out: $(ls "$out"/gpen-bundle.tar.zst.part-* | wc -l) parts of at most $part_mib MiB, from $uncompressed bytes uncompressed"
  (cd "$out" && for f in gpen-bundle.tar.zst.part-*; do printf '  %-32s %11d bytes\n' "$f" "$(stat -c %s "$f")"; done)
  small_files=$(cd "$out" && cat run.sh MANIFEST.sha256 tools/zstd tools/lib/* | wc -c)
  printf '  %-32s %11d bytes\n' "run.sh MANIFEST.sha256 tools/" "$small_files"
  total=$(cd "$out" && cat gpen-bundle.tar.zst.part-* run.sh MANIFEST.sha256 tools/zstd tools/lib/* | wc -c)
  nparts=$(ls "$out"/gpen-bundle.tar.zst.part-* | wc -l)
  echo "  total $total bytes ($((total / 1048576)) MiB): $nparts transfers of one part each (run.sh, MANIFEST.sha256 and tools/ fit beside any part), then the runner"
  echo "  built in $(($(date +%s) - t0)) s"
} | tee "$out/SIZES.txt"

if [ $check = 1 ]; then
  scripts/gpu-bundle-check.sh "$out"
fi
