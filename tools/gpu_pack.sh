#!/usr/bin/env bash
# Builds the CUDA configuration on this machine (no GPU needed) against the GPU
# machine's own torch version, and packs what `tools/test_gpu.sh --pack DIR` needs to
# run its stages there without building: a GPU lent for 15 minutes then goes to the
# tests, not to a 5-minute build.
#
#   bash tools/gpu_pack.sh [--torch 2.11.0] [--python PY] [--out .gpu-pack]
#
#   --torch V    the torch version of the GPU machine's python3 (a CUDA 13 build: the
#                PyPI wheel of the same version has the same C++ ABI); default 2.11.0
#   --python PY  a Python whose torch is that CUDA build (skips making the venv below)
#   --out DIR    the pack (default .gpu-pack/, git-ignored): name it in the device
#                tool's carry, then run there: bash tools/test_gpu.sh --pack DIR ...
#
# Without --python it makes .venv-gpu-pack with torch==V and transformers==5.17.0 (the
# GPU machine's) from the package index. It configures $BUILD (default
# build-gpu-pack/) as `make test-gpu` does, builds the binaries the stages run, and
# copies them stripped into DIR/build/ (the layout test_gpu.sh expects of a build), the
# shared libraries they need that are not glibc's, GCC's or torch's into DIR/lib (ICU,
# the CUDA runtime: the GPU machine has no libicu), the fortunes text (train_gpt's data)
# and the CPU loss curve of the train stage's configuration, so that the GPU machine
# trains on CUDA only. Then DIR.tar.xz, about 20 MB, to carry (the device tool takes
# 64 MiB in all; test_gpu.sh --pack DIR.tar.xz unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=2.11.0
python=""
pack=.gpu-pack
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch_version="${2:?--torch needs a version}"; shift 2 ;;
    --python) python="${2:?--python needs a Python}"; shift 2 ;;
    --out) pack="${2:?--out needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_pack: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
BUILD=${BUILD:-build-gpu-pack}
JOBS=${JOBS:-$(nproc)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "gpu_pack: no nvcc at $CUDA_HOME/bin/nvcc; set CUDA_HOME" >&2; exit 1; }
bash tools/setup.sh >/dev/null

if [ -z "$python" ]; then
  python=.venv-gpu-pack/bin/python
  if [ ! -x "$python" ]; then
    python3 -m venv .venv-gpu-pack
    .venv-gpu-pack/bin/pip install -q "torch==$torch_version" transformers==5.17.0 safetensors==0.8.0
  fi
fi
have=$("$python" -c 'import torch; print(torch.__version__.split("+")[0], torch.version.cuda or "none")')
[ "${have%% *}" = "$torch_version" ] || { echo "gpu_pack: $python has torch $have, not $torch_version" >&2; exit 1; }
[ "${have##* }" != none ] || { echo "gpu_pack: $python's torch has no CUDA" >&2; exit 1; }
torch_dir=$("$python" -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_dir" \
  -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
  -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" -DTORCHATTN_REQUIRE_CUDA_BUILD=ON \
  -DTORCHATTN_PYTHON="$(command -v "$python" || realpath "$python")" -DTORCHATTN_REQUIRE_TESTS=ON >/dev/null
targets=(torchattn_tests torchattn_models_tests torchattn_serve_tests transformers_parity generate_device_check
         torchattn_generate train_gpt torchattn_bench)
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

rm -rf "$pack"
mkdir -p "$pack/build"
for t in "${targets[@]}"; do
  src=$(find "$BUILD/tests" "$BUILD/apps" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$src" ] || { echo "gpu_pack: $t was not built" >&2; exit 1; }
  dst="$pack/build/${src#"$BUILD"/}"
  mkdir -p "$(dirname "$dst")"
  strip -o "$dst" "$src"
  # The shared libraries the GPU machine may lack (the CUDA runtime of this toolkit,
  # Debian's): all but glibc's, GCC's and torch's own (that machine has its torch).
  ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libutil|libstdc\+\+|libgcc_s|libgomp)\.so|/torch/lib/|/nvidia/' |
    while read -r so; do mkdir -p "$pack/lib" && cp -L "$so" "$pack/lib/"; done
done
cp -r /usr/share/games/fortunes "$pack/fortunes"

{
  echo "torch $have ($python)"
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} >"$pack/build/torchattn-prebuilt.txt"
# The train stage's CPU reference curve, made here with the packed binary.
PYTHON="$python" JOBS="$JOBS" bash tools/test_gpu.sh --out "$BUILD/pack-out" --pack "$pack" curve
tar -cJf "$pack.tar.xz" -C "$(dirname "$pack")" "$(basename "$pack")"
echo "gpu_pack: $(du -sh "$pack" | cut -f1) in $pack, $(du -sh "$pack.tar.xz" | cut -f1) in $pack.tar.xz; on the GPU \
machine: bash tools/test_gpu.sh --pack $pack.tar.xz [STAGE ...]"
