#!/usr/bin/env bash
# System packages the test suite uses, from Debian's packages (idempotent):
#   espeak-ng  - speaks the test utterances (required by the realtime speech tests)
#   chromium   - the browser test (optional: skipped with a stated reason without it)
#   redis-server, haproxy - the replicas test (tests/deploy: two replicas behind deploy/haproxy.cfg)
#   sipp (sip-tester) - a real SIP user agent calling the SIP endpoint (tests/telephony/test_sip_calls.py)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: installing espeak-ng with apt-get (the realtime tests speak with it)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends espeak-ng >/dev/null
  else
    echo "install-test-deps: espeak-ng is missing; install it (e.g. sudo apt-get install espeak-ng)" >&2
    exit 1
  fi
fi
missing=()
declare -A package=([redis-server]=redis-server [haproxy]=haproxy [sipp]=sip-tester)
for tool in redis-server haproxy sipp; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package[$tool]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: installing ${missing[*]} with apt-get (the replicas and SIP tests run them)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install-test-deps: ${missing[*]} missing; install them (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
bash .ci/setup-browser.sh
