#!/usr/bin/env bash
# Sets up .venv and runs the quick CPU benchmarks: the grouped matmuls against a batched matmul
# and jax.lax.ragged_dot, then ragged_dot_general against jax.lax's in its three modes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[examples]"
JAX_PLATFORMS=cpu .venv/bin/kernelhub list
JAX_PLATFORMS=cpu .venv/bin/kernelhub bench --quick "$@"
JAX_PLATFORMS=cpu .venv/bin/kernelhub bench --ragged --quick
