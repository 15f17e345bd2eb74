#include "kernels/cpu/linear.h"

#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/stall_aware.h"
#include "kernels/cpu/vec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace torchattn::kernels::cpu {

int64_t plain_linear_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto plain = [](const at::Tensor& t) {
    return t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && !t.is_nested();
  };
  if (!plain(x) || !plain(weight) || weight.dim() != 2 || !weight.is_contiguous() || x.dim() < 1 ||
      x.size(-1) != weight.size(1) || weight.numel() == 0) {
    return -1;
  }
  if (bias.defined() && (!plain(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0) || !bias.is_contiguous())) {
    return -1;
  }
  if (needs_grad(x) || needs_grad(weight) || needs_grad(bias)) return -1;
  return x.numel() / x.size(-1);
}

bool small_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t rows = plain_linear_rows(x, weight, bias);
  return rows >= 1 && rows <= kSmallLinearRows;
}

at::Tensor small_linear(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(small_linear_applies(x_in, weight, bias),
              "small_linear: expected a few float32 CPU rows and no gradient");
  const at::Tensor x = x_in.contiguous();
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());
  const float* w = weight.const_data_ptr<float>();
  const float* xs = x.const_data_ptr<float>();
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  float* ys = y.mutable_data_ptr<float>();
  // Output features split over the threads; each weight row is read once and
  // dotted with every row of x (which stays in cache).
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  // While the intra-op threads are not getting the cores (another process), on the
  // calling thread alone: the same results (see stall_aware.h).
  parallel_for_unless_stalled(out, grain, [&](int64_t begin, int64_t end) {
    if (rows == 1) {
      // A decoding step's one row: every dot product of the chunk in one dispatch
      // (dots: the same bits as dot), then the bias.
      dots(xs, w + begin * in, in, end - begin, in, ys + begin);
      if (b != nullptr) {
        for (int64_t o = begin; o < end; ++o) ys[o] += b[o];
      }
      return;
    }
    for (int64_t o = begin; o < end; ++o) {
      const float* wo = w + o * in;
      for (int64_t r = 0; r < rows; ++r) {
        const float d = dot(wo, xs + r * in, in);
        ys[r * out + o] = b != nullptr ? d + b[o] : d;
      }
    }
  });
  return y;
}

}  // namespace torchattn::kernels::cpu
