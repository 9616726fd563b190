#!/usr/bin/env bash
# Sets up .venv (CPU jax, the TPU compiler for ahead-of-time checks, test tools) and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test,tpu]"
JAX_PLATFORMS=cpu .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
