#!/usr/bin/env bash
# The service's page in a real browser (scripts/browser-test.py): installs what it needs,
# idempotently (Debian's chromium through apt, Playwright for Python into the set-up's venv,
# which drives the system browser and never downloads one of its own), builds the binary and
# runs the test. Screenshots go to out/browser (pass --shots DIR to put them elsewhere).
#
#   scripts/browser-test.sh [--shots DIR]
#   scripts/browser-test.sh --install    # only install chromium and Playwright, then stop
set -euo pipefail
cd "$(dirname "$0")/.."
PLAYWRIGHT_VERSION=1.49.1
py=.deps/venv/bin/python
[ -x "$py" ] || { echo "browser-test.sh: error: $py missing: run scripts/setup.sh first" >&2; exit 1; }
if ! command -v chromium >/dev/null; then
  echo "[browser-test] installing chromium (apt)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
if ! "$py" -c "import playwright, importlib.metadata as m, sys; sys.exit(m.version('playwright') != '$PLAYWRIGHT_VERSION')" 2>/dev/null; then
  echo "[browser-test] installing playwright==$PLAYWRIGHT_VERSION (pip; no browser download)" >&2
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$py" -m pip install -q --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION"
fi
[ "${1:-}" = --install ] && exit 0
cargo build --release --locked -q
# shellcheck disable=SC1091
source .deps/env.sh
exec "$py" scripts/browser-test.py --browser "$(command -v chromium)" "$@"
