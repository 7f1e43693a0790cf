#!/usr/bin/env bash
# Builds the container image of deploy/Containerfile (its CPU variant) on this machine and runs
# the Containerfile's self-test stages, with no registry of container images: the Debian 12 base
# image is made locally with debootstrap from Debian's packages and imported into podman, and the
# image is built with `podman build --isolation chroot` (no `podman run` needed, so it works where
# containers cannot be started). The `test` stage runs, inside the image and as its user,
# `gpen-video --version`, `gpen-video models verify` and two short runs with stand-in models; the
# `check` stage inspects their outputs with ffprobe/ffmpeg. From scratch it takes about 22 minutes
# on two cores (15 of them compiling gpen-video), under a minute when podman's layer cache holds
# the stages, so it is not part of scripts/test.sh.
#
#   scripts/container-check.sh            # as root (or with sudo rights) on Debian 12
#   ORT=gpu scripts/container-check.sh    # the GPU variant instead (large; runs no GPU code here)
#
# Environment: ORT (cpu|gpu, default cpu), IMAGE (tag, default localhost/gpen-video:$ORT),
# BASE_IMAGE (default localhost/debian-bookworm:base, built when missing; REBASE=1 rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."
ORT=${ORT:-cpu}
IMAGE=${IMAGE:-localhost/gpen-video:$ORT}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-bookworm:base}
log() { printf '[container-check] %s\n' "$*" >&2; }
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
start=$(date +%s)

# --- tools: podman and debootstrap from Debian's packages --------------------------------------
missing=()
for p in podman debootstrap; do
  command -v "$p" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
pod() { $sudo podman "$@"; }

# --- the base image: a minimal Debian 12 root with the same apt sources as debian:bookworm-slim --
if [ "${REBASE:-0}" = 1 ] || ! pod image exists "$BASE_IMAGE"; then
  root=$(mktemp -d)
  trap '$sudo rm -rf "$root"' EXIT
  log "debootstrap --variant=minbase bookworm (Debian's packages) -> $BASE_IMAGE"
  $sudo debootstrap --variant=minbase bookworm "$root/rootfs" >"$root/debootstrap.log" 2>&1 || {
    tail -20 "$root/debootstrap.log" >&2; log "debootstrap failed (log above)"; exit 1; }
  # debootstrap writes only `deb MIRROR bookworm main`; add the updates and security suites from
  # the same mirror, as the official image has them (rustc-web 1.96 is in bookworm-security).
  mirror=$(awk '$1 == "deb" { print $2; exit }' "$root/rootfs/etc/apt/sources.list")
  [ -n "$mirror" ] || { log "no mirror in the debootstrap root's sources.list"; exit 1; }
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$mirror" "$mirror" "$mirror" | $sudo tee "$root/rootfs/etc/apt/sources.list" >/dev/null
  $sudo find "$root/rootfs/var/cache/apt/archives" "$root/rootfs/var/lib/apt/lists" -type f -delete
  # The build downloads crates and wheels over TLS: the base trusts what this machine trusts (its
  # CA bundle, which holds any local TLS-inspecting proxy's certificate), through the
  # ca-certificates package the stages install and pip's PIP_CERT. The public base needs neither.
  change=()
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    $sudo mkdir -p "$root/rootfs/usr/local/share/ca-certificates"
    $sudo cp /etc/ssl/certs/ca-certificates.crt "$root/rootfs/usr/local/share/ca-certificates/build-host.crt"
    change=(--change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt")
  fi
  $sudo tar -C "$root/rootfs" -c . | pod import "${change[@]}" - "$BASE_IMAGE" >/dev/null
  $sudo rm -rf "$root"
  trap - EXIT
fi

build() { # build TARGET TAG
  pod build --isolation chroot -f deploy/Containerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg ORT="$ORT" --target "$1" -t "$2" .
}
log "building $IMAGE (ORT=$ORT) from $BASE_IMAGE"
build runtime "$IMAGE"
log "running the image's self-test (stages test and check)"
# Tagged, so its stages stay cached for the next run; /check in it holds the outputs it read.
build check "$IMAGE-check"

size=$(pod image inspect --format '{{.Size}}' "$IMAGE")
log "image $IMAGE: $((size / 1000000)) MB; $(($(date +%s) - start)) s in all"
pod images --filter "reference=$IMAGE"
echo "container check passed"
