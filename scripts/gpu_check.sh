#!/usr/bin/env bash
# Runtime checks that need a CUDA GPU (none of the tests do). From the repo root:
#   scripts/gpu_check.sh [--out gpu_check.json]    # within 5 minutes on one GPU
# Prints a table and a JSON report (also written to --out); exits non-zero if
# placed results differ from unplaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' \
  || { echo "gpu_check: no CUDA device visible" >&2; exit 3; }
exec timeout 300 "$PY" scripts/gpu_check.py "$@"
