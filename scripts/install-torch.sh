#!/usr/bin/env bash
# torch for the embedded CPU default, as the CPU wheel: from PyTorch's CPU index when it answers,
# else from pip's own sources (local wheels, a mirror, PyPI). Usage: install-torch.sh PIP
#   TORCH_INDEX=https://download.pytorch.org/whl/cu128 make setup   -> a CUDA build (GPU hosts)
# Already installed at the pinned version: nothing to do, whatever index it came from.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=$1
python=$(dirname "$pip")/python
version=$(sed -n 's/^torch==//p' constraints.txt)
index=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

installed=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "${installed%%+*}" = "$version" ]; then
  echo "install-torch: torch $installed is installed"
  exit 0
fi
if "$python" - "$index" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
PY
then
  echo "install-torch: torch $version from $index (a few hundred MB on a fresh machine)"
  "$pip" install --progress-bar on -c constraints.txt --index-url "$index" "torch==$version"
else
  echo "install-torch: $index is unreachable: torch $version from pip's configured sources (local wheels, PyPI)"
  echo "install-torch: note: on Linux x86_64 PyPI's own torch wheel is the CUDA build (GB of NVIDIA libraries)"
  "$pip" install --progress-bar on -c constraints.txt "torch==$version"
fi
