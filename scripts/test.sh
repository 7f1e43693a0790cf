#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: set-up (idempotent), formatting and lint,
# Rust unit and end-to-end tests, and the Python exporter's tests; with GPEN_VIDEO_SLURM_TEST=1
# (as .ci/run sets it) also the cluster check of deploy/slurm-array.sbatch on a single-node
# Slurm it starts (scripts/slurm-test.sh: installs slurm-wlm and munge, about 15 s more).
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLES=test scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
cargo fmt --all -- --check
cargo clippy --release --locked --all-targets -- -D warnings
cargo test --release --locked
.deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'
if [ "${GPEN_VIDEO_SLURM_TEST:-0}" = 1 ]; then
  scripts/slurm-test.sh
fi
echo "all tests passed"
