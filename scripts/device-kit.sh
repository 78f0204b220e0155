#!/usr/bin/env bash
# The device kit: what a bare GPU machine of this workplace needs to run the GPU probe and the
# realtime bench, carried with the working tree (docs/benchmarks.md, "GPU probe and device kit").
#
#   scripts/device-kit.sh [--webrtc|--no-webrtc]   # here: wheels into .whl/, sizes, the command
#   scripts/device-kit.sh run                       # there (or here with DEVICE=cpu): install, probe, bench
#
# That machine's image has Python 3.12, torch 2.11 (CUDA), transformers 5.17, numpy, onnxruntime,
# uvloop, httpx, pyyaml, prometheus-client, psutil, pillow, click, h11, anyio, matplotlib; it
# reaches no registry. So the wheels the server and the model code need beyond that are
# downloaded here for CPython 3.12 / x86_64 into the ignored .whl/, installed there with
# `pip install --no-index --target`, and put first on PYTHONPATH. torch does not travel (GBs):
# the image's runs, and `run` checks it (benchmarks/gpu_probe.py --check: torch >= 2.11).
# transformers does (the project pins 5.24; the image's 5.17 predates the model code's checks).
#
# `run` does, in this order, within TOTAL_S seconds (default 470; the printed command also wraps
# it in `timeout 480`): install the wheels, check the environment, the GPU probe (at most
# PROBE_S, default 210 s), then `sgl-omni bench realtime` at 1/8/16/32/64 sessions on the
# random-weight 30B profile with the time that is left. What ran is under $OUT (the device's
# result folder; bench-results/device here) even when a later step is cut off.
# DEVICE=cpu runs the same steps at shrink 16 in float32 (the dry run, on a Python 3.12 venv with
# torch 2.11: PYTHON=.venv312/bin/python DEVICE=cpu scripts/device-kit.sh run).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl
AIM_MIB=40           # what the kit aims at; the hard limit is the carry's 64 MiB with the tree
CARRY_LIMIT_MIB=64
PYTHON=${PYTHON:-python3}

# Server and model code beyond the image: every name pinned by constraints.txt. transformers 5.24
# runs on the image's huggingface_hub (1.33) and tokenizers (0.23.2): within its requirements.
CORE=(transformers msgspec fastapi starlette opentelemetry-api pydantic pydantic_core annotated-types
      typing-inspection typing_extensions uvicorn websockets soxr soundfile cffi pycparser silero-vad
      python-multipart python-stretch)
# WebRTC calls (`POST /v1/realtime/calls`) and mp3/opus speech; the server answers 501
# `webrtc_unavailable` (and speech offers wav/pcm/flac) without them.
WEBRTC=(aiortc av aioice pylibsrtp pyee cryptography pyOpenSSL google-crc32c dnspython ifaddr)

pin() {  # NAME -> NAME==VERSION from constraints.txt (names compared as pip compares them)
  local want version
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  version=$(awk -F'==' -v want="$want" '{name=tolower($1); gsub(/[_.]/, "-", name); if (name == want) print $2}' constraints.txt)
  [ -n "$version" ] || { echo "device-kit: $1 is not pinned in constraints.txt" >&2; exit 1; }
  echo "$1==$version"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

download() {
  local include_webrtc=$1 names=("${CORE[@]}") specs=()
  [ "$include_webrtc" = yes ] && names+=("${WEBRTC[@]}")
  for name in "${names[@]}"; do specs+=("$(pin "$name")"); done
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  # --no-deps: the list above is the closure beyond the image (one version of each: two would
  # stop the install there). The platforms are those of the image's glibc (2.39) and older.
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    --platform any -d "$WHEELS" "${specs[@]}" 2> >(grep -v "^WARNING: Location" >&2)
}

# What the image has (.library/device/KINDS.md, read 2026-11-17), for the closure check below.
IMAGE="accelerate anyio annotated-doc certifi click filelock fsspec h11 hf-xet httpcore httpx huggingface-hub
  idna jinja2 markupsafe matplotlib numpy onnxruntime packaging pillow prometheus-client psutil pyyaml regex
  requests safetensors tokenizers torch tqdm transformers typer typing-extensions urllib3 uvloop zipp"

closure() {  # every requirement of a carried wheel is carried too, or on the image
  "$PYTHON" - "$WHEELS" "$IMAGE" <<'PY'
import pathlib, sys, zipfile
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
norm = lambda name: name.lower().replace("_", "-").replace(".", "-")
wheels = sorted(pathlib.Path(sys.argv[1]).glob("*.whl"))
have = {norm(w.name.split("-")[0]) for w in wheels} | {norm(n) for n in sys.argv[2].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        for line in archive.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if (req.marker is None or req.marker.evaluate(env)) and norm(req.name) not in have:
                    missing.append(f"{req.name} (for {wheel.name.split('-')[0]})")
if missing:
    sys.exit("device-kit: neither carried nor on the image: " + ", ".join(sorted(set(missing))))
print(f"device-kit: closure ok: every requirement of the {len(wheels)} wheels is carried or on the image")
PY
}

wheel_bytes() { find "$WHEELS" -type f -name '*.whl' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }

kit() {
  local webrtc=${1:-auto}
  if [ "$webrtc" = no ]; then
    download no
  else
    download yes
    if [ "$webrtc" = auto ] && [ "$(wheel_bytes)" -gt $((AIM_MIB * 1048576)) ]; then
      echo "device-kit: with WebRTC (aiortc, av) the wheels take $(mib "$(wheel_bytes)") MiB > $AIM_MIB MiB: WebRTC left out"
      download no
      webrtc=no
    fi
  fi
  closure
  echo "device-kit: wheels in $WHEELS/ (CPython 3.12, x86_64):"
  find "$WHEELS" -type f -name '*.whl' -printf '%s %f\n' | sort -rn | awk '{ printf "  %7.2f MiB  %s\n", $1 / 1048576, $2 }'
  local wheels tree
  wheels=$(wheel_bytes)
  # What travels besides the carried folder: tracked files and untracked ones git does not ignore.
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  echo "device-kit: total $(mib "$wheels") MiB of wheels (aim <= $AIM_MIB MiB) + $(mib "$tree") MiB of working tree" \
       "= $(mib $((wheels + tree))) MiB of the $CARRY_LIMIT_MIB MiB carry limit"
  if [ $((wheels + tree)) -gt $((CARRY_LIMIT_MIB * 1048576)) ]; then
    echo "device-kit: over the carry limit: run with --no-webrtc" >&2
    exit 1
  fi
  [ "$webrtc" = no ] && echo "device-kit: WebRTC is not carried: /v1/realtime/calls answers 501 webrtc_unavailable there"
  echo
  echo "device-kit: carry: [\"$WHEELS\"]  (install prefix on the device: /tmp/sgl-omni-site)"
  echo "device-kit: the command (kind nvidia-h200: the bench's 64 sessions need its memory; timeout_s 540; results under \$OUT):"
  echo "  timeout -k 10 480 bash scripts/device-kit.sh run"
  echo "device-kit: the same here on CPU (the dry run):"
  echo "  PYTHON=.venv312/bin/python DEVICE=cpu OUT=bench-results/device-cpu timeout -k 10 480 bash scripts/device-kit.sh run"
}

run() {
  local started=$SECONDS total=${TOTAL_S:-470} probe_s=${PROBE_S:-210}
  local device=${DEVICE:-cuda} prefix=${PREFIX:-/tmp/sgl-omni-site} out=${OUT:-bench-results/device}
  mkdir -p "$out"
  exec > >(tee -a "$out/device-kit.log") 2>&1  # the log comes back with the results
  echo "device-kit run: installing $(find "$WHEELS" -type f -name '*.whl' | wc -l) wheels into $prefix"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --find-links "$WHEELS" --target "$prefix" "$WHEELS"/*.whl 2> >(grep -v "^WARNING: Location" >&2)
  export PYTHONPATH="$prefix:$PWD" PYTHONUNBUFFERED=1
  "$PYTHON" -m benchmarks.gpu_probe --check --device "$device"
  # 64 sessions of at most 8k tokens: 48 GiB of thinker KV beside the 66 GiB of weights on one H200.
  local shrink=() bench=(--sessions 1,8,16,32,64 --max-sessions 64 --max-seq-len 8192)
  if [ "$device" = cpu ]; then
    shrink=(--shrink 16)
    bench=(--device cpu --dtype float32 --shrink 16 --sessions 1 --quick)
  fi
  echo "device-kit run: GPU probe (at most ${probe_s} s)"
  timeout -k 5 "$probe_s" "$PYTHON" -m benchmarks.gpu_probe --device "$device" "${shrink[@]}" --out "$out" \
    || echo "device-kit run: the probe ended with status $? (the bench runs anyway)"
  local left=$((total - (SECONDS - started)))
  if [ "$left" -lt 90 ]; then
    echo "device-kit run: ${left} s left: no realtime bench"
    return 0
  fi
  echo "device-kit run: realtime bench (${left} s left)"
  # Levels still to start `--deadline` s after the bench began are skipped (the server's model
  # build and warm-up come first: about a minute on an H200).
  timeout -k 5 "$left" "$PYTHON" -m benchmarks.random_30b "${bench[@]}" --deadline $((left - 40)) \
    --out "$out/bench" --name realtime-30b \
    || echo "device-kit run: the bench ended with status $?"
}

case "${1:-}" in
  run) run ;;
  --webrtc) kit yes ;;
  --no-webrtc) kit no ;;
  "") kit auto ;;
  *) echo "usage: scripts/device-kit.sh [--webrtc|--no-webrtc] | run" >&2; exit 2 ;;
esac
