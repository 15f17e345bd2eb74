#!/usr/bin/env bash
# `make test-gpu`: the suite, the CUDA benchmark and a memcheck run on a machine with
# an NVIDIA GPU, against a CUDA LibTorch that is already installed. Downloads nothing.
#
#   1. configures build-gpu/ against the LibTorch of `$PYTHON` (default python3, whose
#      torch must have CUDA) or of $Torch_DIR, with -j$(nproc);
#   2. runs the whole suite (ctest) with TORCHATTN_REQUIRE_CUDA=1: every
#      device-parametrized test runs on the CPU and on CUDA, and a missing GPU fails;
#   3. runs the CUDA benchmark (apps/bench/results/benchmarks-cuda.md and .png); GPU_BENCH=0 skips it;
#   4. runs the CUDA tests under `compute-sanitizer --tool memcheck`.
#
# GoogleTest, CLI11, Gloo and nlohmann/json's headers: from the system, or from GPU_DEPS,
# a folder holding a copy of them laid out as on Debian
# (GPU_DEPS/usr/include/{gtest,CLI,gloo,nlohmann},
# GPU_DEPS/usr/lib/x86_64-linux-gnu/{libgtest*.a,cmake/GTest}, GPU_DEPS/usr/share/cmake/CLI11).
# Without GoogleTest there is nothing to test and this fails; without nlohmann/json the
# library (its safetensors reader) does not build; without CLI11 the benchmark and apps
# are not built and step 3 fails; without ICU's headers torchattn_generate is not built.
# When $PYTHON has no transformers, the transformers and generate tests are left out,
# and the configure step says so.
#
#   make test-gpu GPU_DEPS=/path/to/deps            (or: GPU_DEPS=... bash tools/test_gpu.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}

if [ -n "${Torch_DIR:-}" ]; then
  prefix="$Torch_DIR"
else
  prefix=$("$PYTHON" - <<'PY'
import torch, sys
if not torch.version.cuda:
    sys.exit(f"test-gpu: {sys.executable}'s torch {torch.__version__} has no CUDA; set PYTHON or Torch_DIR")
print(torch.utils.cmake_prefix_path)
PY
)
fi
if [ -n "${GPU_DEPS:-}" ]; then
  deps=$(cd "$GPU_DEPS" && pwd)/usr
  [ -d "$deps/include/gtest" ] || { echo "test-gpu: no GoogleTest under GPU_DEPS=$GPU_DEPS (expected $deps/include/gtest)"; exit 1; }
  prefix="$prefix;$deps"
  export CPATH="$deps/include${CPATH:+:$CPATH}"
fi
# Fortunes (train_gpt's default text) from the deps folder when the system has none.
if [ -n "${GPU_DEPS:-}" ] && [ -d "$deps/share/games/fortunes" ] && [ ! -d /usr/share/games/fortunes ]; then
  export TORCHATTN_FORTUNES="$deps/share/games/fortunes"
fi

echo "test-gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DTORCHATTN_PYTHON="$(command -v "$PYTHON")" -DTORCHATTN_REQUIRE_TESTS=ON \
  -DTORCHATTN_REQUIRE_TRANSFORMERS="$("$PYTHON" -c 'import transformers, safetensors' 2>/dev/null && echo ON || echo OFF)"
cmake --build "$BUILD" -j "$JOBS"

echo "test-gpu: the suite, every device-parametrized test on CPU and CUDA"
(cd "$BUILD" && TORCHATTN_REQUIRE_CUDA=1 ctest --output-on-failure --timeout 1200)

if [ "${GPU_BENCH:-1}" != 0 ]; then
  echo "test-gpu: the CUDA benchmark"
  BUILD="$BUILD" PYTHON="$PYTHON" bash apps/bench/run.sh --device cuda
fi

if command -v compute-sanitizer >/dev/null; then
  echo "test-gpu: CUDA tests under compute-sanitizer memcheck"
  # No caching allocator: memcheck sees each allocation's real bounds.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCHATTN_REQUIRE_CUDA=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
    --leak-check no "$BUILD/tests/torchattn_tests" --gtest_brief=1 \
    --gtest_filter='*cuda_*:*Cuda*:DecodeGraphModel.*:KernelChoice.*'
else
  echo "test-gpu: compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 1
fi
echo "test-gpu: passed"
