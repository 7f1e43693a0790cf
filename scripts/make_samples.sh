#!/usr/bin/env bash
# Sample clips made with FFmpeg from samples/astronaut.png (NASA, public domain, shipped in the
# scikit-image wheel). In: `all` (default), `test`, or `closeup` (the test clips and the 4K
# close-up). Out, under samples/ (skipped when present):
#   astronaut-1080p.mp4  1920x1080, 30 fps, 10 s, one face, camera motion, blur, noise, AAC audio
#   group-1080p.mp4      1920x1080, 30 fps, 4 s, four faces of different sizes, AAC audio
#   twofaces-720p.mp4    1280x720, 25 fps, 8 s, one large and one small face, slow drift, AAC audio
#   closeup-4k.mp4       3840x2160, 30 fps, 6 s, one face 1,000 px across (only with the argument closeup)
#   test/astronaut.mp4   640x360, 30 fps, 2 s, motion, AAC audio (fast end-to-end tests)
#   test/group.mkv       640x360, 25 fps, 1 s, four faces, audio and a subtitle track
#   test/vfr.mkv         640x360, variable frame rate, 40 frames, audio
#   test/noface.mp4      320x240, 1 s, a plain test pattern, no face
#   test/rotated.mp4     stored 360x640 sideways, shown upright by its display matrix
set -euo pipefail
cd "$(dirname "$0")/../samples"
what=${1:-all}
src=astronaut.png
ff() { ffmpeg -hide_banner -loglevel error -y "$@"; }
make() { # make OUT ARGS...: write OUT atomically, only when missing
  local out=$1; shift
  [ -f "$out" ] && return 0
  mkdir -p "$(dirname "$out")"
  local tmp
  tmp="$(dirname "$out")/.tmp.$(basename "$out")"
  ff "$@" "$tmp" && mv "$tmp" "$out"
  echo "[samples] wrote samples/$out" >&2
}

# One moving, slightly rotating, blurred and noisy portrait on a plain background.
moving() { # W H SECONDS FPS PORTRAIT_SIZE
  local w=$1 h=$2 t=$3 fps=$4 s=$5
  echo "color=c=0x2a3440:s=${w}x${h}:r=${fps}:d=${t}[bg];
    [0:v]scale=${s}:${s},format=rgba,rotate=a='0.04*sin(2*PI*t/4)':c=none[fg];
    [bg][fg]overlay=x='(W-w)/2+W*0.08*sin(2*PI*t/5)':y='(H-h)/2+H*0.05*sin(2*PI*t/3)':shortest=1,
    gblur=sigma=1.2,noise=alls=7:allf=t,format=yuv420p[v]"
}
# Four portraits of different sizes side by side.
group() { # W H SECONDS FPS
  local w=$1 h=$2 t=$3 fps=$4
  local a=$((h * 9 / 10)) b=$((h * 6 / 10)) c=$((h * 4 / 10)) d=$((h * 3 / 10))
  echo "color=c=0x404040:s=${w}x${h}:r=${fps}:d=${t}[bg];
    [0:v]split=4[a0][b0][c0][d0];[a0]scale=$a:$a[a];[b0]scale=$b:$b[b];[c0]scale=$c:$c[c];[d0]scale=$d:$d[d];
    [bg][a]overlay=x=W*0.01:y=(H-h)/2+t*4:shortest=1[o1];[o1][b]overlay=x=W*0.01+$a:y=(H-h)/2[o2];
    [o2][c]overlay=x=W*0.02+$a+$b:y=H*0.1[o3];[o3][d]overlay=x=W*0.02+$a+$b:y=H*0.6-t*4,format=yuv420p[v]"
}
# Two portraits, one large and one small, drifting slowly.
twofaces() { # W H SECONDS FPS
  local w=$1 h=$2 t=$3 fps=$4
  local a=$((h * 8 / 10)) b=$((h * 25 / 100))
  echo "color=c=0x36403a:s=${w}x${h}:r=${fps}:d=${t}[bg];
    [0:v]split=2[a0][b0];[a0]scale=$a:$a[a];[b0]scale=$b:$b[b];
    [bg][a]overlay=x=W*0.05+t*6:y=(H-h)/2:shortest=1[o1];
    [o1][b]overlay=x=W*0.72:y=H*0.2+t*5,noise=alls=5:allf=t,format=yuv420p[v]"
}
x264=(-c:v libx264 -preset veryfast -crf 21 -pix_fmt yuv420p)
aac() { echo "sine=frequency=$1:sample_rate=48000:duration=$2"; }

if [ "$what" = all ]; then
  make astronaut-1080p.mp4 -loop 1 -i $src -f lavfi -i "$(aac 440 10)" \
    -filter_complex "$(moving 1920 1080 10 30 1000)" -map '[v]' -map 1:a -t 10 "${x264[@]}" \
    -c:a aac -b:a 96k -movflags +faststart
  make group-1080p.mp4 -loop 1 -i $src -f lavfi -i "$(aac 330 4)" \
    -filter_complex "$(group 1920 1080 4 30)" -map '[v]' -map 1:a -t 4 "${x264[@]}" \
    -c:a aac -b:a 96k -movflags +faststart
  make twofaces-720p.mp4 -loop 1 -i $src -f lavfi -i "$(aac 500 8)" \
    -filter_complex "$(twofaces 1280 720 8 25)" -map '[v]' -map 1:a -t 8 "${x264[@]}" \
    -c:a aac -b:a 96k -movflags +faststart
fi
# A 4K close-up (a face about 1,000 pixels across, as a phone records a talking head), made
# only when asked (`scripts/make_samples.sh closeup`): the large-face benchmarks' clip.
if [ "$what" = closeup ]; then
  make closeup-4k.mp4 -loop 1 -i $src -f lavfi -i "$(aac 440 6)" \
    -filter_complex "$(moving 3840 2160 6 30 2100)" -map '[v]' -map 1:a -t 6 "${x264[@]}" \
    -c:a aac -b:a 96k -movflags +faststart
fi
make test/astronaut.mp4 -loop 1 -i $src -f lavfi -i "$(aac 440 2)" \
  -filter_complex "$(moving 640 360 2 30 340)" -map '[v]' -map 1:a -t 2 "${x264[@]}" \
  -c:a aac -b:a 64k -movflags +faststart
printf '1\n00:00:00,000 --> 00:00:00,900\nfour faces\n' > test/.subs.srt
make test/group.mkv -loop 1 -i $src -f lavfi -i "$(aac 550 1)" -i test/.subs.srt \
  -filter_complex "$(group 640 360 1 25)" -map '[v]' -map 1:a -map 2:s -t 1 "${x264[@]}" \
  -c:a aac -b:a 64k -c:s srt
# Variable frame rate: frames at irregular times (setpts from a wobbling clock), kept as they are.
make test/vfr.mkv -loop 1 -i $src -f lavfi -i "$(aac 660 2)" \
  -filter_complex "$(moving 640 360 2 20 340);[v]settb=1/1000,setpts='N*50+floor(N/4)*25'[w]" -map '[w]' \
  -map 1:a -frames:v 40 -fps_mode passthrough "${x264[@]}" -c:a aac -b:a 64k
make test/noface.mp4 -f lavfi -i testsrc2=s=320x240:r=30:d=1 "${x264[@]}"
# A phone-style clip: stored sideways (360x640), with a display matrix that turns it upright.
if [ ! -f test/rotated.mp4 ]; then
  make test/.sideways.mp4 -i test/astronaut.mp4 -vf transpose=1 -frames:v 30 "${x264[@]}" -c:a copy
  make test/rotated.mp4 -i test/.sideways.mp4 -c copy -metadata:s:v rotate=90
  rm -f test/.sideways.mp4
fi
