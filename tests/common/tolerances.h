#pragma once

// Tolerances, stated once. Each comparison passes when
//   |actual - expected| <= atol + rtol * |expected|   elementwise.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>

namespace tol {

struct Tolerance {
  double rtol;
  double atol;
};

// float32: the library against the same ops in Python, or ATen's fused kernel
// against the notebook math; float64 leaves room for reordered sums only.
inline Tolerance for_dtype(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return {1e-10, 1e-12};
    case torch::kFloat32:
      return {1e-5, 1e-6};
    case torch::kBFloat16:
      return {2e-2, 2e-2};
    case torch::kFloat16:
      return {5e-3, 5e-3};
    default:
      return {0.0, 0.0};
  }
}

// float64 through an RMSNorm that computes in float32 (QK-norm, as transformers'
// RMSNorm does) on a device other than the reference's CPU: the device's float32
// reduction and rsqrt round differently from the CPU's, by about a float32 ulp of the
// normalized queries and keys.
inline Tolerance float64_through_float32_norm() { return {1e-6, 1e-7}; }

inline ::testing::AssertionResult close(const torch::Tensor& actual, const torch::Tensor& expected, Tolerance t) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream s;
    s << "shape " << actual.sizes() << " != expected " << expected.sizes();
    return ::testing::AssertionFailure() << s.str();
  }
  auto a = actual.detach().to(torch::kFloat64).cpu();
  auto e = expected.detach().to(torch::kFloat64).cpu();
  auto err = (a - e).abs();
  auto bound = t.atol + t.rtol * e.abs();
  if ((err <= bound).all().item<bool>() && !a.isnan().any().item<bool>()) {
    return ::testing::AssertionSuccess();
  }
  std::ostringstream s;
  s << "max abs error " << err.max().item<double>() << " exceeds atol=" << t.atol << " rtol=" << t.rtol << "\nactual:\n"
    << a << "\nexpected:\n"
    << e;
  return ::testing::AssertionFailure() << s.str();
}

inline ::testing::AssertionResult close(const torch::Tensor& actual, const torch::Tensor& expected) {
  return close(actual, expected, for_dtype(expected.scalar_type()));
}

}  // namespace tol
