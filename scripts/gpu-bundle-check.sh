#!/usr/bin/env bash
# The GPU bundle's proof without a GPU: copies a bundle built by scripts/gpu-bundle.sh (its
# parts, run.sh, MANIFEST.sha256, tools/) into a fresh root and runs `run.sh --device cpu` there
# with `env -i`, from an empty folder. The root (a tmpfs in a private mount namespace, entered
# with chroot) holds only glibc, libstdc++/libgcc_s and the libraries of the runner's own tools
# (bash, coreutils, tar, python3: what every Ubuntu base image has); /usr/bin and python's
# standard library are bound read-only. No FFmpeg library, no checkout, no .deps: gpen-video
# gets all else from the bundle or fails. Checks that the runner reached its table, that the CPU
# benches ran and that CUDA failed with gpen-video's own message. Needs root (or sudo) for unshare.
#
#   scripts/gpu-bundle-check.sh [BUNDLE_DIR]     (default out/gpu-bundle-small)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-out/gpu-bundle-small}
[ -f "$bundle/MANIFEST.sha256" ] || { echo "gpu-bundle-check.sh: error: no bundle in $bundle: run scripts/gpu-bundle.sh --small" >&2; exit 1; }
bundle=$(cd "$bundle" && pwd)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
result=$PWD/out/gpu-bundle-check
rm -rf "$result"
mkdir -p "$result"

# the libraries of the tools the runner uses, besides glibc (resolved here, copied into the root)
tools=(bash cat tar sha256sum sed grep sort tail head tr cut ls mkdir rm touch date timeout env
  sleep kill tee wc dirname basename readlink stat python3 ldd)
libs=()
for t in "${tools[@]}"; do
  p=$(PATH=/usr/bin:/bin command -v "$t" 2>/dev/null || true)
  [ -n "$p" ] && [ -f "$p" ] || continue
  while read -r l; do libs+=("$l"); done < <(ldd "$(readlink -f "$p")" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p')
done
py=$(readlink -f "$(PATH=/usr/bin:/bin command -v python3)")
pystd=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
multi=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)

inner=$(mktemp)
cat >"$inner" <<'INNER'
set -euo pipefail
r=$ROOT_DIR
mount -t tmpfs -o size=6g tmpfs "$r"
mkdir -p "$r"/{usr/bin,usr/lib/$MULTI,usr/lib64,usr/lib/python-std,proc,sys,dev,tmp,etc,incoming,empty}
ln -s usr/bin "$r/bin"; ln -s usr/lib "$r/lib"; ln -s usr/lib64 "$r/lib64"
mount --bind /usr/bin "$r/usr/bin"; mount -o remount,bind,ro "$r/usr/bin"
mkdir -p "$r$PYSTD"
mount --bind "$PYSTD" "$r$PYSTD"; mount -o remount,bind,ro "$r$PYSTD"
mount --rbind /dev "$r/dev"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
# glibc (every shared object of the libc6 package) and the loader
for f in $(dpkg -L libc6 | grep -E '\.so(\.|$)'); do
  [ -e "$f" ] || continue
  d=$r$(dirname "$f"); mkdir -p "$d"; cp -a "$f" "$d/"
done
[ -e "$r/usr/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$r/usr/lib64/"
# what an Ubuntu base image also has, and the runner's tools' libraries
for f in /usr/lib/$MULTI/libstdc++.so.6 /usr/lib/$MULTI/libgcc_s.so.1 $TOOL_LIBS; do
  [ -e "$f" ] && cp -L "$f" "$r/usr/lib/$MULTI/$(basename "$f")"
done
cp -r "$BUNDLE/." "$r/incoming/"
chmod 1777 "$r/tmp"
rc=0
chroot "$r" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/empty /bin/bash -c \
  'cd /empty && /incoming/run.sh --device cpu --out /empty/out' >"$RESULT/run.log" 2>&1 || rc=$?
cp -r "$r/empty/out" "$RESULT/" 2>/dev/null || true
# what the root held (to show nothing of FFmpeg was there)
ls "$r/usr/lib/$MULTI" >"$RESULT/root-libs.txt"
exit $rc
INNER
echo "[gpu-bundle-check] running the bundle in a clean root (env -i, empty folder, no FFmpeg, no checkout)" >&2
t0=$(date +%s)
rootdir=$(mktemp -d)
rc=0
$sudo env ROOT_DIR="$rootdir" MULTI="$multi" PYSTD="$pystd" TOOL_LIBS="$(printf '%s\n' "${libs[@]}" | sort -u | tr '\n' ' ')" \
  BUNDLE="$bundle" RESULT="$result" unshare --mount --propagation private bash "$inner" || rc=$?
rmdir "$rootdir" 2>/dev/null || true
rm -f "$inner"
secs=$(($(date +%s) - t0))
cat "$result/run.log"
fail() { echo "gpu-bundle-check: FAILED: $*" >&2; exit 1; }
[ $rc -eq 0 ] || fail "run.sh exited $rc in the clean root (log above, $result/run.log)"
if grep -qE '^libav|^libsw|^libx264|^libonnxruntime' "$result/root-libs.txt"; then
  fail "the clean root held FFmpeg or ONNX Runtime libraries: $(grep -E '^libav|^libsw|^libx264|^libonnx' "$result/root-libs.txt" | tr '\n' ' ')"
fi
steps=$result/out/steps.tsv
[ -f "$steps" ] && [ -f "$result/out/table.txt" ] || fail "the runner did not reach its table"
for s in bench-fp32-b1 bench-fp32-b4 bench-fp16-b4 bench-fp16-bytes-b4 feeder whole-file; do
  grep -q "^$s"$'\tcpu\t[0-9]*\tok' "$steps" || fail "step $s did not succeed on the CPU (see $result/out/$s.log)"
done
grep -q $'^cuda-fp32-b4\tcuda:0\t4\tfailed\t.*CUDA execution provider could not start on cuda:0' "$steps" ||
  fail "the CUDA step did not fail with gpen-video's 'CUDA execution provider could not start' message"
for s in nvdec-fp16-b4 feeder-gpu-detect trt-fp16-b4-cold; do
  grep -q "^$s"$'\tcuda:0\t4\tfailed' "$steps" || fail "step $s should fail without a GPU and be reported"
done
grep -q '^whole-file ' "$result/out/table.txt" || fail "the table lacks the whole-file row"
grep -q '^feeder: without the model' "$result/out/table.txt" || fail "the table lacks the feeder's figure"
grep -q '^feeder: a host of 16 cores would feed about' "$result/out/table.txt" ||
  fail "the table lacks what a 16-core host would feed"
echo "gpu-bundle-check: ok in $secs s: the bundle ran to its table in a clean root; CUDA refused with gpen-video's message and the runner went on"
