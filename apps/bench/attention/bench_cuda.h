#pragma once

// torchattn_bench --device cuda: the GPU benchmark (bench_cuda.cpp), written to JSON
// for report_cuda.py (apps/bench/results/benchmarks-cuda.md).

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace bench {

struct CudaBenchOptions {
  /// Write the results here as JSON; empty: print only.
  std::string json_path;
  /// Smoke sizes and few repetitions: checks the harness, measures nothing useful.
  bool quick = false;
  /// Largest T of the sweep.
  int64_t max_T = 32768;
};

/// The benchmark on the first CUDA device; returns the process exit code. A failed
/// check prints what disagreed and returns 1. Built against a CPU LibTorch (no
/// TORCHATTN_BENCH_CUDA) or with no GPU visible, it says so and returns 2.
int run_cuda_bench(const CudaBenchOptions& options);

/// The same sections on `device`. CUDA is the benchmark; the CPU runs the harness
/// (every check, the JSON) at the sizes asked for, with wall-clock times and no
/// memory figures: a way to test it on a machine without a GPU, not a CPU benchmark.
int run_device_bench(const c10::Device& device, const CudaBenchOptions& options);

}  // namespace bench
