#!/usr/bin/env bash
# The whole GPU check in one command, on a machine with an NVIDIA GPU and jax[cuda] installed
# (no network needed; kernelhub is used from this checkout through PYTHONPATH, nothing installed):
#
#   scripts/gpu_bench.sh                 # tests, bench, sweep and tune
#   scripts/gpu_bench.sh tests           # or any of: tests bench sweep tune
#
# tests: tests/test_contract.py and tests/test_triton_gpu.py with the GPU as jax's default backend
#        (extra pytest arguments in $KERNELHUB_GPU_PYTEST_ARGS, e.g. "-k triton -x")
# bench: TFLOP/s of gmm forward/backward and tgmm against cuBLAS dense and ragged_dot
# sweep: a few block configs per shape, to tune kernelhub/_pallas/gpu/config.py
# tune:  kernelhub tune at the benchmark's MoE shapes (forward and both gradients, skewed and
#        balanced group sizes): tuning.json is the table to ship as
#        kernelhub/tuning/defaults/<device kind>.json (docs/tuning.md), tuning.md its figures
#
# KERNELHUB_GPU_SMOKE=1 runs the same stages without a GPU (interpret mode, tiny benchmark
# shapes): a check of this script, not a measurement.
#
# Results go to $OUT when set, else benchmarks/gpu/: environment.txt, tests.log, bench.log,
# gpu_bench.md/.json/.png, gpu_sweep.md and summary.txt (each stage's status and duration).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RESULTS=${OUT:-benchmarks/gpu}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The benchmark holds big inputs for the peers; let XLA take what it needs instead of 75%.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests bench sweep tune)
summary="$RESULTS/summary.txt"
: >"$summary"
failed=0

note() { echo "$*" | tee -a "$summary"; }

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || echo "(not a git checkout)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PYTHON" - <<'EOF'
import importlib
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
for name in ("jaxlib", "jaxtyping", "beartype", "numpy", "pytest", "hypothesis", "matplotlib", "triton"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except ImportError:
        print(name, "MISSING")
EOF
} >"$RESULTS/environment.txt" 2>&1
cat "$RESULTS/environment.txt"

smoke=()
if [ "${KERNELHUB_GPU_SMOKE:-0}" = 1 ]; then
  smoke=(--gpu-smoke)
  note "smoke mode: no GPU needed, nothing here is a measurement"
elif ! "$PYTHON" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
  note "no GPU is jax's default backend here: this script is for the GPU machine (see docs/gpu.md)"
  exit 2
fi

run_stage() {
  local name=$1
  shift
  local started=$SECONDS
  "$@" 2>&1 | tee "$RESULTS/$name.log"
  local status=${PIPESTATUS[0]}
  note "$name: exit $status after $((SECONDS - started))s"
  [ "$status" -eq 0 ] || failed=1
}

for stage in "${stages[@]}"; do
  case $stage in
    tests)
      if "$PYTHON" -c "import pytest, hypothesis" 2>/dev/null; then
        # shellcheck disable=SC2086  # the extra arguments are meant to split
        run_stage tests "$PYTHON" -m pytest -q -p no:cacheprovider \
          tests/test_contract.py tests/test_triton_gpu.py --durations=15 \
          --junitxml="$RESULTS/tests.xml" ${KERNELHUB_GPU_PYTEST_ARGS:-}
      else
        note "tests: skipped, pytest or hypothesis is not installed here"
        failed=1
      fi
      ;;
    bench)
      run_stage bench "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts bench "${smoke[@]}"
      ;;
    sweep)
      run_stage sweep "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts sweep "${smoke[@]}"
      ;;
    tune)
      # name:shape:groups:local groups, as the GPU benchmark's SHAPES (deepseek-v3 sharded 8 ways)
      if [ ${#smoke[@]} -gt 0 ]; then
        tune_shapes=("smoke:96x32x48:4:4")
        tune_flags=(--platform triton --repeats 1 --draws 1)
      else
        tune_shapes=("mixtral:8192x4096x14336:8:8" "deepseek-v3:16384x7168x2048:256:32"
                     "qwen3-moe:8192x2048x768:128:128")
        tune_flags=()
      fi
      rm -f "$RESULTS/tuning.json"
      for entry in "${tune_shapes[@]}"; do
        IFS=: read -r tune_name tune_shape tune_groups tune_local <<<"$entry"
        run_stage "tune-$tune_name" "$PYTHON" -m kernelhub.cli tune --shape "$tune_shape" \
          --groups "$tune_groups" --local-groups "$tune_local" --ops gmm tgmm --dtypes bf16 \
          --skew 0 2 "${tune_flags[@]}" --output "$RESULTS/tuning.json" \
          --markdown "$RESULTS/tuning-$tune_name.md"
      done
      "$PYTHON" -c "import jax; from kernelhub._grouped_matmul import tables; print('ship tuning.json as kernelhub/tuning/defaults/' + tables._file_name(jax.devices()[0].device_kind))" | tee -a "$summary"
      ;;
    *)
      note "unknown stage $stage (expected tests, bench, sweep or tune)"
      failed=1
      ;;
  esac
done
exit $failed
