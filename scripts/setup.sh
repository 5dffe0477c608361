#!/usr/bin/env bash
# Set up a development environment in .venv: torch (CPU build, pinned), the front end, the package.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install --quiet torch==2.13.0

# The front end: node is needed only to build it (wheels carry the bundle).
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run build

"$VENV/bin/pip" install --quiet -e ".[dev]"
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
