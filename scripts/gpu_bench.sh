#!/usr/bin/env bash
# The GPU run in one command, on a machine with an NVIDIA GPU and jax[cuda] installed (no
# network needed; kernelhub is used from this checkout through PYTHONPATH):
#
#   scripts/gpu_bench.sh                 # tests, then the roofline scoreboard (under 9 minutes)
#   scripts/gpu_bench.sh tune            # or any of: tests roofline epilogue quantized bench
#                                        # sweep tune profile counters
#
# tests:    tests/test_contract.py, tests/test_triton_gpu.py (and tests/test_mosaic_gpu.py when
#           present) with the real kernels, the GPU as jax's default backend (extra pytest
#           arguments in $KERNELHUB_GPU_PYTEST_ARGS, e.g. "-k triton -x"): the Mosaic GPU
#           kernels' tests in a process of their own, after the others (tests-mosaic and
#           tests-others run one part alone)
# roofline: the scoreboard: every pass of kernelhub's implementations, cuBLAS dense,
#           lax.ragged_dot and tokamax against the chip's roofline (roofline.json/.md/.png);
#           kernelhub:mosaic in a second process merged into the same files; the formats in
#           $KERNELHUB_GPU_DTYPES (default "bf16 fp8")
# epilogue: fused epilogues against the same math unfused, forward and forward + grad
# quantized: the quantized gmm forward per format (8-bit with one scale per row and column, scale
#           blocks, MXFP8, 4-bit weights): the Triton kernel beside the Mosaic GPU kernel (every
#           format), dense bf16 and dense 8-bit; at $KERNELHUB_GPU_SHAPES where set
# bench:    the older table, TFLOP/s against cuBLAS dense and ragged_dot (gpu_bench.md)
# sweep:    a few block configs per shape (gpu_sweep.md)
# profile:  Mosaic GPU's on-device profiler over one call of each pass at the fine-grained
#           shapes (or $KERNELHUB_GPU_SHAPES): profile.md, where each kernel's time goes
# counters: Nsight Compute's counters (DRAM and L2 throughput, hit rates, occupancy) of one
#           launch of each Mosaic GPU and Triton kernel at the same shapes: counters.md
# tune:     kernelhub tune of both Hopper kernels (mosaic, triton; or $KERNELHUB_GPU_TUNE_PLATFORMS)
#           in bf16 (or $KERNELHUB_GPU_TUNE_DTYPES, e.g. fp8; with
#           KERNELHUB_GPU_TUNE_WEIGHTS_ONLY=1 an 8-bit dtype quantizes only the weights;
#           with KERNELHUB_GPU_TUNE_SCALE_BLOCK=128 its scales come in blocks of 128)
#           at the scoreboard's shapes (or those named in $KERNELHUB_GPU_TUNE_SHAPES; gmm's
#           three kernels, every pass, balanced and skewed sizes): tuning.json,
#           the table to ship as kernelhub/tuning/defaults/<device kind>.json (its times also
#           pick, per call, the faster kernel); then the scoreboard's rows of those kernels
#           again under it (roofline-tuned.*; the default row is the one a plain call lowers) and,
#           time left, kernelhub bench --tuning (tuning-bench.md)
#
# Time: the whole command keeps within $KERNELHUB_GPU_BUDGET seconds (default 500): each stage
# gets a share of what is left, and is stopped when it runs over (what it wrote stays: the
# scoreboard rewrites its files after every pass, and the rows it had no time for say so).
#
# tokamax and beartype are not on the GPU image: the wheels in .gpu-wheels/ (scripts/
# gpu_wheels.sh fetches them here; carry the folder) are installed when either is missing.
#
# KERNELHUB_GPU_SMOKE=1 runs the same stages without a GPU (interpret mode, tiny shapes): a
# check of this script, not a measurement; results then go to /tmp/kernelhub-gpu-smoke.
#
# Results go to $OUT when set, else benchmarks/gpu/<date>-<gpu>/. Under $OUT (whose files come
# back from the device machine, at most 8) the logs are packed into results.tar.gz beside
# summary.txt, roofline.json/.md/.png and the tuning files.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BUDGET=${KERNELHUB_GPU_BUDGET:-500}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The scoreboard holds big inputs for the peers; let XLA take what it needs instead of 75%.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
export PYTHONUNBUFFERED=1

smoke=()
if [ "${KERNELHUB_GPU_SMOKE:-0}" = 1 ]; then
  smoke=(--gpu-smoke)
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
fi

if ! "$PYTHON" -c "import tokamax, beartype" 2>/dev/null && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kernelhub-wheels .gpu-wheels/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/kernelhub-wheels"
fi
# tokamax (0.0.13 to 0.0.17) imports xprof's kernel-stats tool for its own benchmarking, which
# the scoreboard does not use; xprof (32 MB, with cloud-storage dependencies) is not on the GPU
# image. A stand-in module lets `import tokamax` through; calling the tool says why it fails.
if ! "$PYTHON" -c "import xprof" 2>/dev/null; then
  mkdir -p /tmp/kernelhub-stand-ins/xprof/cli
  touch /tmp/kernelhub-stand-ins/xprof/__init__.py /tmp/kernelhub-stand-ins/xprof/cli/__init__.py
  printf '%s\n' 'def get_kernel_stats_tool(*args, **kwargs):' \
    '    raise NotImplementedError("xprof is not installed: a stand-in from gpu_bench.sh")' \
    >/tmp/kernelhub-stand-ins/xprof/cli/tools.py
  export PYTHONPATH="$PYTHONPATH:/tmp/kernelhub-stand-ins"
fi

if [ -n "${OUT:-}" ]; then
  RESULTS=$OUT
elif [ ${#smoke[@]} -gt 0 ]; then
  RESULTS=/tmp/kernelhub-gpu-smoke
else
  RESULTS=benchmarks/gpu/$("$PYTHON" -c "import jax; from kernelhub._cli.bench.gpu_scoreboard import folder_name; print(folder_name(jax.devices()[0].device_kind))" 2>/dev/null || echo run)
fi
mkdir -p "$RESULTS"

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests roofline)
summary="$RESULTS/summary.txt"
: >"$summary"
failed=0

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((BUDGET - SECONDS)); }

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || echo "(not a git checkout)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  # Whether a kernel profile can be taken here (issue 34 asks what limits each figure).
  for profiler in nsys ncu; do
    echo "$profiler: $(command -v "$profiler" || ls /usr/local/cuda*/bin/"$profiler" 2>/dev/null | head -1 || true)"
  done
  "$PYTHON" - <<'EOF'
import importlib
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
for name in ("jaxlib", "jaxtyping", "beartype", "numpy", "pytest", "xdist", "hypothesis",
             "matplotlib", "triton", "tokamax", "qwix"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as error:
        print(name, "MISSING", type(error).__name__, str(error)[:200])
EOF
} >"$RESULTS/environment.txt" 2>&1
cat "$RESULTS/environment.txt"

if [ ${#smoke[@]} -gt 0 ]; then
  note "smoke mode: no GPU needed, nothing here is a measurement"
elif ! "$PYTHON" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
  note "no GPU is jax's default backend here: this script is for the GPU machine (see docs/gpu.md)"
  exit 2
fi

# run_stage NAME SECONDS COMMAND...: runs COMMAND for at most SECONDS, its output in NAME.log.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  if [ "$limit" -lt 10 ]; then
    note "$name: skipped, the budget of ${BUDGET}s is spent"
    failed=1
    return
  fi
  timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$RESULTS/$name.log"
  local status=${PIPESTATUS[0]}
  [ "$status" -eq 124 ] && note "$name: stopped at its limit of ${limit}s"
  note "$name: exit $status after $((SECONDS - started))s"
  [ "$status" -eq 0 ] || failed=1
}

# A share of what is left, in seconds: share PERCENT.
share() { echo $(($(left) * $1 / 100)); }

roofline() {  # roofline NAME SECONDS [extra arguments]
  local name=$1 limit=$2
  shift 2
  # A later process merging into this table (--gpu-merge) finds the earlier one's rows there.
  mkdir -p "$RESULTS/$name"
  [ -f "$RESULTS/$name.json" ] && cp "$RESULTS/$name.json" "$RESULTS/$name/roofline.json"
  # The scoreboard stops starting passes 60s before the hard stop: a pass in flight (compiling
  # a shape's implementations) ends and the files are written.
  run_stage "$name" "$limit" "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-parts roofline \
    --gpu-out "$RESULTS/$name" --gpu-budget $((limit > 90 ? limit - 60 : limit / 2)) "${smoke[@]}" "$@"
  for file in roofline.json roofline.md roofline.png; do
    [ -f "$RESULTS/$name/$file" ] && mv "$RESULTS/$name/$file" "$RESULTS/${name}${file#roofline}"
  done
  rmdir "$RESULTS/$name" 2>/dev/null
}

# The Mosaic GPU kernels run in processes of their own, after the others: a fault in a kernel
# (a CUDA error ends the process that met it) then costs only their rows. (The first H100 run
# lost its whole tests stage to one misaligned TMA store under pytest-xdist.)
MOSAIC=kernelhub:mosaic
# Named without a measuring stage, the tests take the whole budget: the others 40% of it (all
# of it alone), the Mosaic GPU kernels what is left; before a scoreboard, 24% and 21%.
tests_only=1
for stage in "${stages[@]}"; do
  case $stage in tests|tests-others|tests-mosaic) ;; *) tests_only=0 ;; esac
done

for stage in "${stages[@]}"; do
  case $stage in
    tests|tests-others|tests-mosaic)
      if "$PYTHON" -c "import pytest, hypothesis" 2>/dev/null; then
        files=(tests/test_contract.py tests/test_triton_gpu.py tests/test_gpu_scoreboard.py)
        mosaic_files=(tests/test_contract.py)
        [ -f tests/test_mosaic_gpu.py ] && mosaic_files+=(tests/test_mosaic_gpu.py)
        workers=()
        "$PYTHON" -c "import xdist" 2>/dev/null && [ ${#smoke[@]} -eq 0 ] && workers=(-n 8)
        per_test=()
        "$PYTHON" -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 240)
        # About 40% of the budget in all: the scoreboard after them is what this run is for.
        if [ "$stage" != tests-mosaic ]; then
          others_share=24
          [ $tests_only -eq 1 ] && others_share=40
          [ ${#stages[@]} -eq 1 ] && [ "$stage" = tests-others ] && others_share=95
          # shellcheck disable=SC2086  # the extra arguments are meant to split
          run_stage tests "$(share $others_share)" "$PYTHON" -m pytest -q -p no:cacheprovider \
            "${workers[@]}" "${per_test[@]}" "${files[@]}" -k "not mosaic" --durations=15 \
            --junitxml="$RESULTS/tests.xml" ${KERNELHUB_GPU_PYTEST_ARGS:-}
        fi
        if [ "$stage" != tests-others ]; then
          # One process, no workers: the first fault's test is the last one named in the log.
          # Without a measuring stage (`gpu_bench.sh tests`), what the others left: before a
          # tune of kernels that changed since their last GPU run.
          # shellcheck disable=SC2086
          mosaic_share=21
          [ $tests_only -eq 1 ] && mosaic_share=95
          run_stage tests-mosaic "$(share $mosaic_share)" "$PYTHON" -m pytest -v -p no:cacheprovider \
            "${per_test[@]}" "${mosaic_files[@]}" -k mosaic --durations=15 \
            --junitxml="$RESULTS/tests-mosaic.xml" ${KERNELHUB_GPU_PYTEST_ARGS:-}
        fi
      else
        note "tests: skipped, pytest or hypothesis is not installed here"
        failed=1
      fi
      ;;
    roofline)
      read -r -a roofline_dtypes <<<"${KERNELHUB_GPU_DTYPES:-bf16 fp8}"
      # Narrower runs: $KERNELHUB_GPU_SHAPES (scoreboard shape names), $KERNELHUB_GPU_EXCLUDE
      # (implementations the first process leaves out: on the fp8 rows XLA's compile-time
      # GEMM autotuning of kernelhub:xla and cublas_dense took most of the first H200 try),
      # and $KERNELHUB_GPU_MOSAIC_SHARE (percent of the stage's time the Mosaic GPU rows get).
      read -r -a roofline_shapes <<<"${KERNELHUB_GPU_SHAPES:-}"
      read -r -a roofline_exclude <<<"${KERNELHUB_GPU_EXCLUDE:-}"
      narrowed=()
      [ ${#roofline_shapes[@]} -gt 0 ] && narrowed=(--gpu-shapes "${roofline_shapes[@]}")
      mosaic_share=${KERNELHUB_GPU_MOSAIC_SHARE:-30}
      # $KERNELHUB_GPU_HEURISTIC_ROWS=1: the tabled kernels again under the heuristic
      # (kernelhub:<platform>@heuristic), the shipped table's before and after in one run.
      mosaic_rows=("$MOSAIC")
      if [ "${KERNELHUB_GPU_HEURISTIC_ROWS:-0}" = 1 ]; then
        narrowed+=(--gpu-heuristic-rows)
        mosaic_rows+=("$MOSAIC@heuristic")
      fi
      roofline roofline "$(($(left) * (100 - mosaic_share) / 100))" \
        --gpu-exclude "${mosaic_rows[@]}" "${roofline_exclude[@]}" \
        --gpu-dtypes "${roofline_dtypes[@]}" "${narrowed[@]}"
      # lax.ragged_dot again beside them: the reference their results are checked against.
      roofline roofline "$(($(left) - 15))" --gpu-merge --gpu-implementations "${mosaic_rows[@]}" \
        lax.ragged_dot --gpu-dtypes "${roofline_dtypes[@]}" "${narrowed[@]}"
      ;;
    epilogue)
      # Fused against unfused epilogues, forward and forward + grad (issue #35's GPU rows), on
      # each GPU kernel; at $KERNELHUB_GPU_SHAPES (benchmark shape names) where set.
      read -r -a epilogue_shapes <<<"${KERNELHUB_GPU_SHAPES:-}"
      run_stage epilogue "$(($(left) - 15))" "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts bench --gpu-tables epilogue \
        ${epilogue_shapes[@]+--gpu-shapes "${epilogue_shapes[@]}"} "${smoke[@]}"
      ;;
    quantized)
      read -r -a quantized_shapes <<<"${KERNELHUB_GPU_SHAPES:-}"
      run_stage quantized "$(($(left) - 15))" "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts bench --gpu-tables quantized \
        ${quantized_shapes[@]+--gpu-shapes "${quantized_shapes[@]}"} "${smoke[@]}"
      ;;
    bench)
      run_stage bench "$(($(left) - 15))" "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts bench "${smoke[@]}"
      ;;
    sweep)
      run_stage sweep "$(($(left) - 15))" "$PYTHON" -m kernelhub._cli.bench.gpu --gpu-out "$RESULTS" --gpu-parts sweep "${smoke[@]}"
      ;;
    tune)
      # name:shape:groups:local groups, as the scoreboard's shapes (deepseek-v3: 32 of 256
      # experts), the fine-grained (memory-bound) ones first
      # Both Hopper kernels at every shape, into one table: its entries' times decide, per
      # call and pass, which of them a plain call lowers (docs/dispatch.md, "Per call").
      read -r -a tune_platforms <<<"${KERNELHUB_GPU_TUNE_PLATFORMS:-mosaic triton}"
      # bf16, or e.g. "fp8": both operands quantized in the call (kernelhub tune --dtypes)
      read -r -a tune_dtypes <<<"${KERNELHUB_GPU_TUNE_DTYPES:-bf16}"
      # 1: bf16 activations beside 8-bit weights (weight-only quantization; tune --weights-only)
      tune_quantization=()
      [ "${KERNELHUB_GPU_TUNE_WEIGHTS_ONLY:-0}" = 1 ] && tune_quantization=(--weights-only)
      # e.g. 128: the scales in blocks along the contraction (tune --scale-block), which a
      # table's key names: the only way such calls get a measured choice of kernel
      [ -n "${KERNELHUB_GPU_TUNE_SCALE_BLOCK:-}" ] && \
        tune_quantization+=(--scale-block "$KERNELHUB_GPU_TUNE_SCALE_BLOCK")
      if [ ${#smoke[@]} -gt 0 ]; then
        tune_shapes=("smoke:96x32x48:4:4")
        tune_platforms=(triton)
        tune_flags=(--repeats 1 --draws 1)
      else
        tune_shapes=()
        for entry in "deepseek-v3:16384x7168x2048:256:32" "qwen3-moe:8192x2048x768:128:128" \
                     "gpt-oss:8192x2880x5760:128:128" "mixtral:8192x4096x14336:8:8" \
                     "odd:1000x520x200:7:7"; do
          # $KERNELHUB_GPU_TUNE_SHAPES (names) picks some: a session's device time does not
          # hold all ten tuning runs; the shipped table keeps the others' measured entries.
          case " ${KERNELHUB_GPU_TUNE_SHAPES:-${entry%%:*}} " in
            *" ${entry%%:*} "*) tune_shapes+=("$entry") ;;
          esac
        done
        tune_flags=(--repeats 5 --draws 1)
      fi
      rm -f "$RESULTS/tuning.json"
      tune_started=$SECONDS
      # The table is this stage's product: most of the time goes to it.
      tune_budget=$(share 80)
      runs_left=$((${#tune_shapes[@]} * ${#tune_platforms[@]}))
      for entry in "${tune_shapes[@]}"; do
        IFS=: read -r tune_name tune_shape tune_groups tune_local <<<"$entry"
        for tune_platform in "${tune_platforms[@]}"; do
          # No run may take the others' time: twice its fair share of what is left, at most.
          # It saves each kernel's entry as decided and starts none it would not likely finish
          # 20s before its limit (--time-limit): a run stopped at the limit keeps the rest.
          tune_left=$((tune_budget - (SECONDS - tune_started)))
          tune_limit=$((tune_left * 2 / (runs_left + 1)))
          tune_limit=$((tune_limit < tune_left ? tune_limit : tune_left))
          runs_left=$((runs_left - 1))
          run_stage "tune-$tune_name-$tune_platform" "$tune_limit" \
            "$PYTHON" -m kernelhub.cli tune --shape "$tune_shape" --platform "$tune_platform" \
            --groups "$tune_groups" --local-groups "$tune_local" --ops gmm \
            --dtypes "${tune_dtypes[@]}" "${tune_quantization[@]}" \
            --skew 0 2 "${tune_flags[@]}" --output "$RESULTS/tuning.json" \
            --time-limit "$((tune_limit > 40 ? tune_limit - 20 : tune_limit / 2 + 1))" \
            --markdown "$RESULTS/tuning-$tune_name-$tune_platform.md"
        done
      done
      # gmm's three kernels are tgmm's too: its keys get the same entries; the shipped table's
      # entries stay where none was tuned, so tuning.json is the file to ship.
      [ -f "$RESULTS/tuning.json" ] && "$PYTHON" -m kernelhub._cli.bench.gpu_scoreboard_table \
        --complete "$RESULTS/tuning.json" --over-shipped | tee -a "$summary"
      "$PYTHON" -c "import jax; from kernelhub._grouped_matmul import tables; print('ship tuning.json as kernelhub/tuning/defaults/' + tables._file_name(jax.devices()[0].device_kind))" | tee -a "$summary"
      if [ -f "$RESULTS/tuning.json" ] && [ "$(left)" -ge 90 ]; then
        # The same kernels under the table at the shapes tuned: the roofline fractions after
        # tuning (in the dtypes tuned: the scoreboard's names, bf16 or fp8).
        export KERNELHUB_TUNING="$RESULTS/tuning.json"
        tuned_shapes=()
        if [ ${#smoke[@]} -eq 0 ]; then
          tuned_shapes=(--gpu-shapes)
          for entry in "${tune_shapes[@]}"; do tuned_shapes+=("${entry%%:*}"); done
        fi
        # The scoreboard has bf16 and fp8 rows, both operands quantized (not int8, e5m2,
        # weights only or scale blocks): the other dtypes tuned have no rows to time again.
        scored=()
        if [ ${#tune_quantization[@]} -eq 0 ]; then
          for dtype_name in "${tune_dtypes[@]}"; do
            case $dtype_name in bf16|fp8) scored+=("$dtype_name") ;; esac
          done
        fi
        if [ ${#scored[@]} -gt 0 ]; then
          roofline roofline-tuned "$(share 70)" --gpu-dtypes "${scored[@]}" "${tuned_shapes[@]}" \
            --gpu-implementations "${tune_platforms[@]/#/kernelhub:}"
        else
          note "roofline-tuned: the scoreboard has no rows of ${tune_dtypes[*]} ${tune_quantization[*]}"
        fi
        unset KERNELHUB_TUNING
        : >"$RESULTS/tuning-bench.md"
        for entry in "${tune_shapes[@]}"; do
          IFS=: read -r tune_name tune_shape tune_groups tune_local <<<"$entry"
          # bench --tuning takes no group_offset: the sharded shape's rows are in roofline-tuned.
          [ "$tune_groups" = "$tune_local" ] || continue
          # bench --tuning times float operands only.
          [ "${tune_dtypes[*]}" = bf16 ] || continue
          run_stage "tuning-bench-$tune_name" "$(($(left) - 15))" "$PYTHON" -m kernelhub.cli \
            bench --tuning --tuning-table "$RESULTS/tuning.json" --shape "$tune_shape" \
            --groups "$tune_groups" --dtypes bf16 --out-dtype bf16 --ops gmm tgmm \
            --platform triton --reps 5 --draws 1 --out "$RESULTS/tuning-bench-$tune_name.md"
          cat "$RESULTS/tuning-bench-$tune_name.md" >>"$RESULTS/tuning-bench.md" 2>/dev/null
        done
      fi
      ;;
    profile)
      # Mosaic GPU's on-device profiler over one call of each pass (issue 34: what limits
      # each figure): profile.md, the share of each kernel's time per region.
      if [ ${#smoke[@]} -gt 0 ]; then
        note "profile: skipped in smoke mode (the on-device profiler needs a GPU)"
      else
        read -r -a profile_shapes <<<"${KERNELHUB_GPU_SHAPES:-deepseek-v3 qwen3-moe}"
        # The traces (8-12 MB a pass) stay off $OUT, whose 8 returned files they crowded out on
        # 2026-11-27: profile.md sums them.
        traces=$(mktemp -d)
        profile_time=$(($(left) - 15))
        # Counters later in this call get half of what is left.
        [[ " ${stages[*]} " == *" counters "* ]] && profile_time=$(share 50)
        run_stage profile "$profile_time" "$PYTHON" -m kernelhub._cli.bench.mosaic_profile \
          --shapes "${profile_shapes[@]}" --out "$traces"
        [ -f "$traces/profile.md" ] && cp "$traces/profile.md" "$RESULTS/"
      fi
      ;;
    counters)
      # Nsight Compute's counters of one launch per kernel and pass (issue 34: is DRAM busy
      # while a kernel runs at half of HBM's rate?): counters.md; ncu's CSVs (one run per shape)
      # go with the logs.
      if [ ${#smoke[@]} -gt 0 ]; then
        note "counters: skipped in smoke mode (Nsight Compute needs a GPU)"
      else
        read -r -a counter_shapes <<<"${KERNELHUB_GPU_SHAPES:-deepseek-v3 qwen3-moe}"
        run_stage counters "$(($(left) - 15))" "$PYTHON" -m kernelhub._cli.bench.kernel_counters \
          --shapes "${counter_shapes[@]}" --out "$RESULTS"
      fi
      ;;
    *)
      note "unknown stage $stage (expected tests, tests-others, tests-mosaic, roofline, epilogue, quantized, bench, sweep, tune, profile or counters)"
      failed=1
      ;;
  esac
done

# The scoreboard's table last: the device call's reply carries the end of the output.
for table in "$RESULTS/roofline.md" "$RESULTS/roofline-tuned.md"; do
  [ -f "$table" ] && echo && sed -n '/^| dtype/,$p' "$table"
done
echo
cat "$summary"

if [ -n "${OUT:-}" ]; then
  # At most 8 files come back from $OUT: the results stay, the logs go into one archive. The
  # archive holds the results too: a caller that runs this script twice into folders of one
  # $OUT can pass 8 files, and then only the archives are sure to come back.
  (cd "$RESULTS" && logs=$(find . -maxdepth 1 -type f ! -name summary.txt \
      ! -name 'roofline*.json' ! -name 'roofline*.md' ! -name roofline.png ! -name tuning.json \
      ! -name tuning-bench.md ! -name profile.md ! -name counters.md ! -name results.tar.gz \
      -printf '%f\n') &&
    find . -maxdepth 1 -type f ! -name results.tar.gz -printf '%f\n' | tar -czf results.tar.gz -T - &&
    printf '%s\n' "$logs" | xargs -r rm -f --)
fi
exit $failed
