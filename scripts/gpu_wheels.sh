#!/usr/bin/env bash
# Fetches, here (with network), the wheels scripts/gpu_bench.sh installs on the GPU machine,
# which has no network and lacks them: kernelhub's beartype, and tokamax (the scoreboard's peer)
# with the dependencies its image does not have. They go to .gpu-wheels/ (ignored by git), which
# the device call carries: run(command="scripts/gpu_bench.sh", carry=[".gpu-wheels"]).
#
# Pinned: the versions the CPU test environment holds (tokamax needs qwix and pydantic; the
# GPU image has absl-py, flax, numpy, protobuf, tqdm, jaxtyping and typing-extensions).
# Python 3.12 x86-64 wheels, as the GPU image's python3 takes them. About 7 MB.
#
# tokamax: PyPI's newest release, 0.0.17 (it asks for jax>=0.11.1: the GPU image's 0.11.2). Its
# Python files import flax (on the image) and xprof, which gpu_bench.sh stands in for. Until
# 0.0.14 PyPI had only 0.0.12, which jax 0.11 breaks, and the scoreboard ran GitHub main (0.0.13);
# TOKAMAX_SOURCE still builds a wheel from a checkout instead (e.g. to compare against unreleased
# main; this machine has PyPI but no GitHub: `git clone` the `fetch` mirror of openxla/tokamax):
#   TOKAMAX_SOURCE=/path/to/tokamax scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TOKAMAX=tokamax==0.0.17
rm -f .gpu-wheels/tokamax-*.whl
if [ -n "${TOKAMAX_SOURCE:-}" ]; then
  # A pure-Python wheel; this host's python may be older than the >=3.12 it asks for.
  "${PYTHON:-python3}" -m pip wheel --no-deps --ignore-requires-python -w .gpu-wheels \
    "$TOKAMAX_SOURCE"
  TOKAMAX=
fi

WHEELS=(${TOKAMAX} qwix==0.1.8 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5 einshape==1.0 immutabledict==4.3.1
        tensorboardX==2.6.5 beartype==0.23.1)

mkdir -p .gpu-wheels
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .gpu-wheels "${WHEELS[@]}"
ls -l .gpu-wheels
