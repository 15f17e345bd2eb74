#pragma once

// The devices every device-parametrized test is instantiated for: the CPU always, and
// CUDA in a build against a CUDA LibTorch (tests/CMakeLists.txt defines
// TORCHATTN_TESTS_CUDA there). On a machine without a CUDA device, a CUDA instance
// reports itself skipped (skip_unless_present, from its fixture's SetUp); with
// TORCHATTN_REQUIRE_CUDA=1 (make test-gpu) it fails instead.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace devices {

inline bool cuda_build() {
#ifdef TORCHATTN_TESTS_CUDA
  return true;
#else
  return false;
#endif
}

inline bool cuda_required() {
  const char* required = std::getenv("TORCHATTN_REQUIRE_CUDA");
  return required != nullptr && std::string(required) == "1";
}

// CUDA as cuda:0, the device a tensor moved to "cuda" reports: tests compare
// y.device() with it.
inline std::vector<torch::Device> all() {
  std::vector<torch::Device> out{torch::kCPU};
  if (cuda_build() || torch::cuda::is_available()) {
    out.emplace_back(torch::kCUDA, 0);
  }
  return out;
}

// The devices this machine has: for loops inside one test.
inline std::vector<torch::Device> present() {
  std::vector<torch::Device> out{torch::kCPU};
  if (torch::cuda::is_available()) {
    out.emplace_back(torch::kCUDA, 0);
  }
  return out;
}

// "" for the CPU (test names as before devices were added), "cuda_" for CUDA.
inline std::string prefix(const torch::Device& device) { return device.is_cpu() ? "" : std::string("cuda_"); }

// The test-name suffix of a suite parametrized by the device alone: "cpu", "cuda".
template <typename Info>
std::string name(const Info& info) {
  return info.param.is_cpu() ? std::string("cpu") : std::string("cuda");
}

// From a fixture's SetUp: a CUDA instance without a CUDA device is skipped, and
// says why; under TORCHATTN_REQUIRE_CUDA=1 it fails.
inline void skip_unless_present(const torch::Device& device) {
  if (!device.is_cuda() || torch::cuda::is_available()) {
    return;
  }
  if (cuda_required()) {
    FAIL() << "TORCHATTN_REQUIRE_CUDA=1 but this LibTorch sees no CUDA device";
  }
  GTEST_SKIP() << "no CUDA device on this machine";
}

}  // namespace devices
