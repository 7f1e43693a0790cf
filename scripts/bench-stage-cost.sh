#!/usr/bin/env bash
# Cost per face of each stage, this build against another, in turn (A B A B ...): each run's
# --stats-json gives every stage's CPU seconds (cpu_s: its threads' own clocks, so time spent
# waiting for a core on a busy machine is not counted; builds before the pools give only busy_s,
# the stage thread's wall time while working, which is used for them); divided by the faces
# restored, that is the stage's core-ms per face. Prints the median of each, the median of the
# A/B ratios taken pair by pair, and both builds' faces/s (whole run) with their ratio.
#   scripts/bench-stage-cost.sh BASELINE_BINARY SOURCE [PAIRS] [run flags...]
#   scripts/bench-stage-cost.sh old/gpen-video samples/group-1080p.mp4 3 --model models/standin/identity-512.onnx --preset ultrafast
# BASE_FLAGS="--mesh old/face-mesh.onnx" adds flags to the baseline's runs only (an older model),
# A_FLAGS to this build's only: two models on one build (the baseline binary is this one):
#   A_FLAGS="--model models/standin/codeformer-512.onnx" \
#   BASE_FLAGS="--model models/standin/plain-512-batch1.onnx" \
#   scripts/bench-stage-cost.sh target/release/gpen-video samples/test/group.mkv 9
# The `model` row is the enhancement workers' wall ms per face (their calls into ONNX Runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?baseline binary}; src=${2:?source}; pairs=${3:-3}; shift 3 || shift $#
new=target/release/gpen-video
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$pairs"); do
  for side in A B; do
    bin=$new; read -ra extra <<< "${A_FLAGS:-}"
    [ "$side" = B ] && bin=$base && read -ra extra <<< "${BASE_FLAGS:-}"
    rm -f "$tmp/out.mkv"  # (an existing OUT is refused; older builds have no -y)
    "$bin" "$src" "$tmp/out.mkv" -q --stats-json "$tmp/$side-$i.json" "$@" "${extra[@]}" >/dev/null 2>&1
  done
done
python3 - "$tmp" "$pairs" <<'PY'
import json, statistics, sys
tmp, pairs = sys.argv[1], int(sys.argv[2])
def cost(path):
    d = json.load(open(path))
    faces = max(d["faces"], 1)
    c = {s["name"]: 1000 * s.get("cpu_s", s["busy_s"]) / faces for s in d["stages"]}
    c["model"] = sum(w["ms_per_batch"] * w["batches"] for w in d.get("workers", [])) / faces
    return c, d["faces"], d["faces_per_s"]
runs = {side: [cost(f"{tmp}/{side}-{i}.json") for i in range(1, pairs + 1)] for side in "AB"}
# Every stage either build has, in the order they run (a stage one build lacks counts 0 there).
names = list(dict.fromkeys([*runs["A"][0][0], *runs["B"][0][0]]))
print(f"faces per run: A {runs['A'][0][1]}, B {runs['B'][0][1]}; {pairs} pairs, medians")
print(f"{'stage':<10} {'A ms/face':>10} {'B ms/face':>10} {'A/B':>7}")
for n in names + ["total"]:
    get = (lambda r: sum(v for k, v in r[0].items() if k != "model")) if n == "total" else (lambda r: r[0].get(n, 0.0))
    a = [get(r) for r in runs["A"]]; b = [get(r) for r in runs["B"]]
    ratio = statistics.median(x / y for x, y in zip(a, b) if y > 0) if all(b) else float("nan")
    print(f"{n:<10} {statistics.median(a):>10.2f} {statistics.median(b):>10.2f} {ratio:>7.3f}")
fa = [r[2] for r in runs["A"]]; fb = [r[2] for r in runs["B"]]
print(f"faces/s    {statistics.median(fa):>10.1f} {statistics.median(fb):>10.1f} "
      f"{statistics.median(x / y for x, y in zip(fa, fb)):>7.3f}")
PY
