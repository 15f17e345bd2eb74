#pragma once

// The devices every device-parametrized test runs on: the CPU always, CUDA when
// this LibTorch and machine have it. Set TORCHATTN_REQUIRE_CUDA=1 (make test-gpu
// does) to fail, not quietly shrink, when CUDA is missing.

#include <torch/cuda.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace devices {

inline std::vector<torch::Device> all() {
  std::vector<torch::Device> out{torch::kCPU};
  if (torch::cuda::is_available()) {
    out.emplace_back(torch::kCUDA);
  }
  return out;
}

// "" for the CPU (test names as before devices were added), "cuda_" for CUDA.
inline std::string prefix(const torch::Device& device) {
  return device.is_cpu() ? "" : device.str() + "_";
}

} // namespace devices
