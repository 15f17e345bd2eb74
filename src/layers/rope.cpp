#include <torchattn/rope.h>

#include "base/checks.h"
#include "layers/rope_checks.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

namespace torchattn::functional {

std::pair<at::Tensor, at::Tensor> rotary_tables(const RoPEOptions& options, int64_t head_dim, int64_t length,
                                                const at::Device& device) {
  layers::check_rope("rotary_tables", options, head_dim);
  const int64_t rotary_dim = options.rotary_dim().value_or(head_dim);
  TORCH_CHECK(length > 0, "rotary_tables: expected length > 0, got ", length);
  // Computed on the CPU whatever the device, then moved: CUDA's powf, sinf, cosf and
  // division differ from the CPU's by a few ULP, so tables made on the device would
  // differ from the CPU's (and from references computed on the CPU) by about 6e-8.
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  // transformers' default RoPE, op for op: 1.0 / (theta ** (arange(0, dim, 2).float() / dim)).
  const at::Tensor inv_freq = at::reciprocal(at::pow(options.theta(), at::arange(0, rotary_dim, 2, f32) / rotary_dim));
  const at::Tensor angles = at::arange(length, f32).unsqueeze(1) * inv_freq.unsqueeze(0);  // [length, rotary_dim / 2]
  return {angles.cos().to(device), angles.sin().to(device)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                        const RoPEOptions& options) {
  constexpr const char* fn = "apply_rotary";
  base::check_floating(fn, "x", x);
  TORCH_CHECK(x.dim() >= 2, fn, ": expected x of shape [B, ..., T, head_dim], got ", x.sizes());
  const int64_t T = x.size(-2), head_dim = x.size(-1);
  const int64_t rot = options.rotary_dim().value_or(head_dim);
  layers::check_rope(fn, options, head_dim);
  TORCH_CHECK(positions.scalar_type() == at::kLong, fn, ": expected int64 positions, got ", positions.scalar_type());
  TORCH_CHECK((positions.dim() == 1 && positions.size(0) == T) ||
                  (positions.dim() == 2 && x.dim() >= 3 && (positions.size(0) == x.size(0) || positions.size(0) == 1) &&
                   positions.size(1) == T),
              fn, ": expected positions of shape [T] = [", T, "] or [B, T] = [", (x.dim() >= 3 ? x.size(0) : 1), ", ",
              T, "], got ", positions.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == rot / 2 && sin.sizes() == cos.sizes(), fn,
              ": expected cos and sin tables of shape [length, rotary_dim / 2 = ", rot / 2, "], got ", cos.sizes(),
              " and ", sin.sizes());

  // Positions past the tables: on the CPU (where it costs no synchronisation) an
  // error naming them, not index_select's "index out of range in self".
  if (positions.is_cpu() && positions.numel() > 0) {
    const auto [min, max] = at::aminmax(positions);
    const int64_t low = min.item<int64_t>(), high = max.item<int64_t>();
    TORCH_CHECK(low >= 0 && high < cos.size(0), fn, ": expected positions in [0, ", cos.size(0),
                ") (the cos and sin tables' length), got positions from ", low, " to ", high,
                "; make the tables longer: rotary_tables(options, head_dim, length)");
  }
  // [T, r] or [B|1, 1, ..., 1, T, r]: broadcasts over x's leading dimensions.
  std::vector<int64_t> shape = positions.sizes().vec();
  if (positions.dim() == 2) {
    shape.insert(shape.begin() + 1, x.dim() - 3, 1);
  }
  shape.push_back(rot / 2);
  const at::Tensor flat = positions.reshape({-1});
  const at::Tensor c = cos.index_select(0, flat).view(shape).to(x.scalar_type());
  const at::Tensor s = sin.index_select(0, flat).view(shape).to(x.scalar_type());

  // The pairs (x1, x2) turn by each position's angle: x1 cos - x2 sin, x2 cos + x1 sin
  // (transformers' x * cos + rotate_half(x) * sin, with the same roundings).
  const at::Tensor x_rot = rot == head_dim ? x : x.narrow(-1, 0, rot);
  at::Tensor rotated;
  if (options.interleaved()) {
    const at::Tensor pairs = x_rot.unflatten(-1, {rot / 2, 2});
    const at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    rotated = at::stack({x1 * c - x2 * s, x2 * c + x1 * s}, -1).flatten(-2);
  } else {
    const at::Tensor x1 = x_rot.narrow(-1, 0, rot / 2), x2 = x_rot.narrow(-1, rot / 2, rot / 2);
    rotated = at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
  }
  return rot == head_dim ? rotated : at::cat({rotated, x.narrow(-1, rot, head_dim - rot)}, -1);
}

}  // namespace torchattn::functional
