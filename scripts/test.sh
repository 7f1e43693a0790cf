#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: set-up (idempotent), formatting and lint,
# Rust unit and end-to-end tests, and the Python exporter's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLES=test scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
scripts/container-pins.sh
cargo fmt --all -- --check
cargo clippy --release --locked --all-targets -- -D warnings
cargo test --release --locked
.deps/venv/bin/python -m unittest discover -s models -p 'test_*.py'
echo "all tests passed"
