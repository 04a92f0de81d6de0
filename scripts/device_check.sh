#!/usr/bin/env bash
# The GPU machine's one command (device tool: `run`, carry [".whl"]): install the device kit (make device-kit:
# the wheels the GPU image lacks and this project's three) into a scratch folder, then run scripts/gpu_check.py,
# which writes gpu_check.json (one JSON line, rewritten as each section finishes) and gpu_check.md under $OUT.
#     bash scripts/device_check.sh --sections consistency   # on the GPU machine (the whole check: over 12 minutes on one H200)
#     OUT=$PWD/outputs/device KIT=.whl-floor PYTHON=.venv-floor/bin/python bash scripts/device_check.sh --tiny   # CPU rehearsal
# Arguments go to gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-.whl}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-$(mktemp -d)}
: "${OUT:?set OUT to the folder for gpu_check.json and gpu_check.md}"
ls "$KIT"/*.whl > /dev/null  # no kit: make device-kit
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/*.whl
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
exec "$PYTHON" scripts/gpu_check.py --out "$OUT" "$@"
