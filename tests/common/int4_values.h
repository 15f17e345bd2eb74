#pragma once

// The values of int4 weights (WeightFormat::Int4: data uint8 [out, in / 2], scale float16
// [out, in / 32, 2]), x = d q + m for each group of 32, as float32 [out, in]: byte j of a
// group holds value j in its low nibble and value j + 16 in its high one.

#include <torch/torch.h>

inline at::Tensor int4_values(const at::Tensor& data, const at::Tensor& scale) {
  const at::Tensor low = data.bitwise_and(15).to(torch::kFloat), high = data.bitwise_right_shift(4).to(torch::kFloat);
  const int64_t out = data.size(0), groups = scale.size(1);
  const at::Tensor q = torch::cat({low.view({out, groups, 16}), high.view({out, groups, 16})}, 2);
  const at::Tensor dm = scale.to(torch::kFloat);
  return (q * dm.select(2, 0).unsqueeze(2) + dm.select(2, 1).unsqueeze(2)).view({out, groups * 32});
}

// The most by which int4 weights rounded from exact (d, m) pairs to float16 can differ
// from the exact values, per value [out, in]: 15 |d| 2^-11 + |m| 2^-11 of its group
// (with a margin of 0.1% for the bound's own rounding).
inline at::Tensor int4_half_rounding_bound(const at::Tensor& scale) {
  const at::Tensor dm = scale.to(torch::kFloat).abs();
  return ((dm.select(2, 0) * 15 + dm.select(2, 1)) * std::ldexp(1.0, -11) * 1.001).repeat_interleave(32, 1);
}
