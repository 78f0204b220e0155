#!/usr/bin/env bash
# Headless Chromium for the browser test (tests/webrtc/test_browser.py), from Debian's packages.
# Idempotent; ~20 s when it installs. Without it the browser test is skipped, saying why.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: cannot install chromium here (needs root and apt-get); the browser test will be skipped" >&2
  exit 0
fi
echo "setup-browser: installing chromium with apt-get (for the browser test)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium >/dev/null || {
  echo "setup-browser: apt-get install chromium failed; the browser test will be skipped" >&2
  exit 0
}
chromium --version
