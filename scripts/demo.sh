#!/usr/bin/env bash
# Sets up .venv and runs the quick CPU benchmark: kernelhub against a batched matmul and ragged_dot.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
JAX_PLATFORMS=cpu .venv/bin/kernelhub list
JAX_PLATFORMS=cpu .venv/bin/kernelhub bench --quick "$@"
JAX_PLATFORMS=cpu .venv/bin/kernelhub bench --ragged --quick
