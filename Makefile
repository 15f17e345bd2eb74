# The two commands of the quick start, `make demo` and `make test`, each set up a
# fresh machine (scripts/setup.sh), configure, build and run.

BUILD   ?= build
JOBS    ?= 2
PY      := .venv/bin/python
CMAKE_PREFIX = $(shell $(PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')

.PHONY: all setup configure build demo test bench golden install clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_PREFIX_PATH="$(CMAKE_PREFIX)" -DTORCHATTN_PYTHON=$(CURDIR)/$(PY)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/apps/demo/torchattn_demo

test: build
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest --output-on-failure --timeout 1200

bench: build
	bash apps/bench/run.sh

golden: setup
	$(PY) tools/make_golden.py

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),install)

clean:
	rm -rf $(BUILD)
