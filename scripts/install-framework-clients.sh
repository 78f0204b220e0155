#!/usr/bin/env bash
# The agent frameworks tests/frameworks drives, each in its own venv under .venv-frameworks/<name>
# (their dependencies conflict with the server's pins: openai, numpy, protobuf...). Idempotent: a
# venv is rebuilt only when its pins change (the stamp file holds them). A framework that cannot be
# installed leaves .venv-frameworks/<name>.failed with pip's output, and its test module is skipped
# with that reason; this script itself never fails `make test`.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
ROOT=.venv-frameworks

install_framework() {
  local name=$1
  shift
  local pins="$*"
  local venv=$ROOT/$name
  if [ "$(cat "$venv/.installed" 2>/dev/null)" = "$pins" ]; then
    return 0
  fi
  echo "install-framework-clients: $name ($pins)"
  rm -rf "$venv" "$venv.failed"
  mkdir -p "$ROOT"
  if "$PYTHON" -m venv "$venv" >"$venv.log" 2>&1 \
      && "$venv/bin/pip" install -q $pins >>"$venv.log" 2>&1; then
    echo "$pins" >"$venv/.installed"
    rm -f "$venv.log"
  else
    mv "$venv.log" "$venv.failed"
    echo "install-framework-clients: $name could not be installed; see $venv.failed" >&2
  fi
}

install_framework openai-agents "openai-agents==0.24.0"
install_framework pipecat "pipecat-ai[openai]==1.14.0"
install_framework livekit "livekit-agents==1.8.9 livekit-plugins-openai==1.8.9"
exit 0
