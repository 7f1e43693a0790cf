#!/usr/bin/env bash
# Cluster check of deploy/slurm-array.sbatch on a real single-node Slurm: starts munged,
# slurmctld and slurmd on 127.0.0.1 ports with a generated slurm.conf in a temporary folder,
# submits the landed script unchanged as a 2-task array on the CPU (DEVICE=cpu, --gres=none)
# over a folder of three test clips, checks that every clip is done exactly once (the shards'
# reports and manifests), resubmits and checks that nothing is redone; then over one long clip
# cut into segments (--segment), which both tasks share: one joined output, equal frame for
# frame to a single run's (lossless), each segment restored once, nothing redone on resubmit.
# It stops every daemon it started, also on failure (their logs are printed then).
#
#   scripts/slurm-test.sh        # after scripts/setup.sh; builds the release binary if needed
#   scripts/slurm-test.sh --install   # only install slurm-wlm and munge, then stop
#
# Installs Debian's slurm-wlm and munge when missing (as root, or with sudo). KEEP_SLURM_TMP=1
# keeps the temporary folder; SLURM_TEST_SCRIPT=FILE submits FILE instead of the landed script
# (to see the checks fail on a broken one). scripts/test.sh runs this when
# GPEN_VIDEO_SLURM_TEST=1 (as .ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log() { printf '[slurm-test] %s\n' "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

# --- packages and the binary -----------------------------------------------------------------
missing=()
for p in slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "${1:-}" = --install ] && exit 0
[ -f .deps/env.sh ] || fail "run scripts/setup.sh first (no .deps/env.sh)"
# shellcheck disable=SC1091
source .deps/env.sh
[ -x target/release/gpen-video ] || cargo build --release --locked
for f in samples/test/group.mkv samples/test/noface.mp4 samples/test/rotated.mp4 \
  models/standin/identity-256.onnx models/centerface.onnx; do
  [ -f "$f" ] || fail "$f is missing: run scripts/setup.sh first"
done

# --- a single-node cluster in a temporary folder ----------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpen-slurm.XXXXXX")
chmod 755 "$tmp"
pids=()
cleanup() {
  local rc=$?
  # Daemons in reverse order of start, each by the PID this script got when it started it.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ $rc -ne 0 ]; then
    for f in "$tmp"/*.log "$tmp"/job-*.txt; do
      [ -f "$f" ] || continue
      log "--- $f (last 30 lines)"
      tail -n 30 "$f" >&2 || true
    done
  fi
  if [ "${KEEP_SLURM_TMP:-0}" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

user=$(id -un)
host=$(hostname -s)
read -r ctld_port slurmd_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
mkdir -p "$tmp/munge" "$tmp/ctld" "$tmp/spool" "$tmp/in" "$tmp/out"
chmod 700 "$tmp/munge"
head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"
cpus=$(nproc)
cat >"$tmp/slurm.conf" <<CONF
ClusterName=gpentest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.sock
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
SlurmdParameters=config_overrides
NodeName=gpentest NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=gpentest Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$tmp/slurm.conf

log "starting munged, slurmctld, slurmd (ports $ctld_port, $slurmd_port; $tmp)"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munge.seed" \
  --log-file="$tmp/munged.log" >>"$tmp/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$tmp/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$tmp/munge/munge.sock" ] || fail "munged did not start"
slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/slurmctld.out.log" 2>&1 &
pids+=($!)
slurmd -D -N gpentest -f "$SLURM_CONF" >>"$tmp/slurmd.out.log" 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 120); do
  state=$(sinfo -h -n gpentest -o %T 2>/dev/null || true)
  case $state in idle*) ready=1 && break ;; esac
  sleep 0.5
done
[ $ready = 1 ] || fail "the node did not come up (state: ${state:-none})"
log "node gpentest is idle"

# --- the job: three clips, two tasks on the CPU -------------------------------------------------
cp samples/test/group.mkv samples/test/noface.mp4 samples/test/rotated.mp4 "$tmp/in/"
clips=(group.mkv noface.mp4 rotated.mp4)
script=$(realpath "${SLURM_TEST_SCRIPT:-deploy/slurm-array.sbatch}")
submit() {
  # The landed script as it is; the CPU settings come from the environment and the command
  # line, as on a cluster without GPUs. $2 and $3: the folders (default in/ and out/), $4 more
  # flags.
  IN=${2:-$tmp/in} OUT=${3:-$tmp/out} MODEL=$root/models/standin/identity-256.onnx DEVICE=cpu \
    EXTRA_FLAGS="--threads 1 --preset ultrafast -q ${4:-}" PATH="$root/target/release:$PATH" \
    timeout 300 sbatch --wait --array=0-1 --gres=none --cpus-per-task=1 --mem=1G \
    --time=00:10:00 --chdir="$tmp" --output="$tmp/job-$1-%A_%a.txt" \
    "$script" >"$tmp/sbatch-$1.txt" 2>&1 ||
    fail "round $1: sbatch --wait failed or timed out: $(cat "$tmp/sbatch-$1.txt")"
}

# Prints each shard's report as lines: "done K CLIP", "skipped K CLIP", "failed K CLIP", "shard K
# SPEC", and in round 1 "manifest K ok|differs" (whether the shard's manifest records exactly
# the clips its report says it did).
summary() {
  python3 - "${2:-$tmp/out}" "$1" <<'PY'
import json, sys, pathlib
out, first = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
for k in (0, 1):
    r = json.loads((out / f".report-shard-{k}.json").read_text())
    print("shard", k, r["shard"])
    done = [d["clip"] for d in r["done"]]
    for c in done:
        print("done", k, c)
    for d in r["done"]:
        if d.get("segments"):
            print("segments", k, d["segments"].split(" ")[0])
    for s in r["skipped"]:
        print("skipped", k, s["clip"])
        if "segments restored here" in s["reason"]:
            print("segments", k, s["reason"].split(" ")[0])
    for s in r["failed"]:
        print("failed", k, s["clip"], s["reason"])
    if first:
        m = out / f".gpen-video-manifest.shard-{k}-of-2.json"
        same = m.exists() and sorted(json.loads(m.read_text())["clips"]) == sorted(done)
        print("manifest", k, "ok" if same else "differs")
PY
}

start=$(date +%s)
submit 1
t1=$(($(date +%s) - start))
s1=$(summary 1) || fail "round 1: reports or manifests do not add up"
printf '%s\n' "$s1" >&2
for c in "${clips[@]}"; do
  n=$(grep -c "^done [01] $c\$" <<<"$s1" || true)
  [ "$n" = 1 ] || fail "round 1: $c done $n times (expected exactly once)"
  [ -s "$tmp/out/$c" ] || fail "round 1: no output $c"
done
n=$(grep -c '^done ' <<<"$s1" || true)
[ "$n" = 3 ] || fail "round 1: $n clips done, expected 3"
! grep -q '^failed ' <<<"$s1" || fail "round 1: a clip failed"
for k in 0 1; do
  grep -qx "shard $k $k/2" <<<"$s1" || fail "round 1: the report of task $k is not shard $k/2"
  grep -qx "manifest $k ok" <<<"$s1" || fail "round 1: shard $k's manifest does not record what it did"
  grep -q "^done $k " <<<"$s1" || fail "round 1: shard $k did nothing (both shards own a clip)"
done
before=$(cd "$tmp/out" && stat -c '%n %i %s %Y' "${clips[@]}")

start=$(date +%s)
submit 2
t2=$(($(date +%s) - start))
s2=$(summary 2) || fail "round 2: reports do not add up"
printf '%s\n' "$s2" >&2
n=$(grep -c '^done ' <<<"$s2" || true)
[ "$n" = 0 ] || fail "round 2: $n clips redone after resubmitting"
! grep -q '^failed ' <<<"$s2" || fail "round 2: a clip failed"
for c in "${clips[@]}"; do
  n=$(grep -c "^skipped [01] $c\$" <<<"$s2" || true)
  [ "$n" = 1 ] || fail "round 2: $c skipped $n times (expected once)"
done
after=$(cd "$tmp/out" && stat -c '%n %i %s %Y' "${clips[@]}")
[ "$before" = "$after" ] || fail "round 2: outputs changed: $before vs $after"
log "ok: 3 clips done exactly once by a 2-task array (${t1} s), nothing redone on resubmit (${t2} s)"

# --- one long clip, its segments shared by both tasks ----------------------------------------
mkdir -p "$tmp/long-in" "$tmp/long-out"
ffmpeg -v error -y -f lavfi -i color=c=0x405060:s=320x240:r=25 -i samples/astronaut.png \
  -f lavfi -i sine=f=440:r=48000 \
  -filter_complex "[1:v]scale=180:180,noise=alls=6:allf=t[a];[0:v][a]overlay=x='60+30*sin(t)':y=20,format=yuv420p[v]" \
  -map '[v]' -map 2:a -frames:v 300 -c:v libx264 -preset ultrafast -g 25 -x264-params scenecut=0 \
  -c:a aac -shortest "$tmp/long-in/film.mp4"
long_flags="--crf 0 --segment 2.4"
start=$(date +%s)
submit 3 "$tmp/long-in" "$tmp/long-out" "$long_flags"
t3=$(($(date +%s) - start))
s3=$(summary 3 "$tmp/long-out") || fail "long clip: reports or manifests do not add up"
printf '%s\n' "$s3" >&2
n=$(grep -c '^done [01] film.mp4$' <<<"$s3" || true)
[ "$n" = 1 ] || fail "long clip: joined $n times (expected exactly once)"
! grep -q '^failed ' <<<"$s3" || fail "long clip: a task failed"
segs=$(awk '$1 == "segments" { n += $3 } END { print n + 0 }' <<<"$s3")
tasks=$(grep -c '^segments ' <<<"$s3" || true)
[ "$tasks" = 2 ] || fail "long clip: $tasks tasks restored segments (expected both)"
[ "$segs" = 4 ] || fail "long clip: $segs segments restored in all (expected each of 4 once)"
ls -A "$tmp/long-out" | grep -q '\.segments$' && fail "long clip: the work folder was left behind"
target/release/gpen-video "$tmp/long-in/film.mp4" "$tmp/single.mp4" --model models/standin/identity-256.onnx \
  --device cpu --threads 1 --preset ultrafast -q --crf 0 --segment 0 2>/dev/null
md5() { ffmpeg -v error -i "$1" -map 0:v -f framemd5 - | grep -v '^#'; }
[ "$(md5 "$tmp/single.mp4")" = "$(md5 "$tmp/long-out/film.mp4")" ] ||
  fail "long clip: the joined output's frames differ from a single run's"
before=$(stat -c '%i %s %Y' "$tmp/long-out/film.mp4")
submit 4 "$tmp/long-in" "$tmp/long-out" "$long_flags"
s4=$(summary 4 "$tmp/long-out") || fail "long clip, round 2: reports do not add up"
! grep -q '^done ' <<<"$s4" || fail "long clip: redone after resubmitting"
[ "$before" = "$(stat -c '%i %s %Y' "$tmp/long-out/film.mp4")" ] || fail "long clip: the output changed on resubmit"
log "ok: one long clip in 4 segments shared by a 2-task array and joined once, equal to a single run (${t3} s); nothing redone on resubmit"
