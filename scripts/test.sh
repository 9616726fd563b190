#!/usr/bin/env bash
# Sets up .venv-test (CPU jax, the TPU compiler for ahead-of-time checks, test tools) and runs the
# tests. A venv of its own: with libtpu installed, every jax program run without JAX_PLATFORMS=cpu
# would start with libtpu's complaints about the TPU it cannot find; .venv stays free of it.
# uv installs the 2 GB of packages in about a third of pip's time (16 s against 55 s on CI's
# 2 cores, from an empty cache), which CI's 20 minutes need.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-test
.venv-test/bin/python -m pip install --quiet --upgrade pip uv
.venv-test/bin/python -m uv pip install --quiet --python .venv-test/bin/python -e ".[test,tpu]"
# The test processes (two workers, and the multidevice suite's subprocess) share XLA's
# compilations through a persistent cache in a fresh temporary folder, removed at the end:
# references, quantization and kernels at shared shapes compile once. 5% of CI's time.
cache=$(mktemp -d "${TMPDIR:-/tmp}/kernelhub-test-xla.XXXXXX")
trap 'rm -rf "$cache"' EXIT
# Python's compiled modules go to the same folder (and so nowhere else): on a host that sets
# PYTHONDONTWRITEBYTECODE, as these machines do, every Python process the tests start (the two
# workers, the CLI, example and import checks, the multidevice suite) compiled the sources of
# jax and the test tools again: about 3 s each, a third of those tests' time.
JAX_COMPILATION_CACHE_DIR=$cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_PLATFORMS=cpu \
  PYTHONPYCACHEPREFIX=$cache/python PYTHONDONTWRITEBYTECODE= \
  .venv-test/bin/python -m pytest -n 2 --dist loadgroup "$@"
# The whole run (no arguments) also runs the lowering and export tests on jax 0.11.
if [ $# -eq 0 ]; then
  bash scripts/test_newest_jax.sh
fi
