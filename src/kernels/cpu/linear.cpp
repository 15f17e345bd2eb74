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
  const at::Tensor weights[] = {weight}, biases[] = {bias};
  return small_linear(x_in, weights, biases);
}

at::Tensor small_linear(const at::Tensor& x_in, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases) {
  TORCH_CHECK(!weights.empty() && biases.size() == weights.size(),
              "small_linear: expected one bias (or an undefined tensor) per weight, got ", weights.size(),
              " weights and ", biases.size(), " biases");
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(small_linear_applies(x_in, weights[i], biases[i]),
                "small_linear: expected a few float32 CPU rows and no gradient");
  }
  const at::Tensor x = x_in.contiguous();
  const int64_t in = weights[0].size(1), rows = x.numel() / in;
  int64_t out = 0;
  for (const auto& w : weights) out += w.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());
  const float* xs = x.const_data_ptr<float>();
  float* ys = y.mutable_data_ptr<float>();
  // Output features [begin, end) of one layer, written at its columns (col0 on): one
  // row of x (a decoding step) in one matvec; more, for each row of x over blocks of
  // weight rows that stay in cache (about 64 KiB) while every row of x reads them, so
  // each weight row comes from memory once. matvec gives a row the same bits wherever
  // it falls, so neither the blocks, the threads' split nor the number of rows of x
  // changes a result.
  const int64_t block = rows == 1 ? out : std::max<int64_t>(4, (int64_t{1} << 14) / std::max<int64_t>(in, 1) / 4 * 4);
  const auto layer = [&](size_t i, int64_t col0, int64_t begin, int64_t end) {
    const float* w = weights[i].const_data_ptr<float>();
    const float* b = biases[i].defined() ? biases[i].const_data_ptr<float>() : nullptr;
    for (int64_t o = begin; o < end; o += block) {
      const int64_t e = std::min(end, o + block);
      for (int64_t r = 0; r < rows; ++r) {
        float* yo = ys + r * out + col0;
        matvec(xs + r * in, w + o * in, in, e - o, yo + o);
        if (b != nullptr) {
          for (int64_t k = o; k < e; ++k) yo[k] += b[k];
        }
      }
    }
  };
  // Every layer's output features split over the threads at once; each weight row is
  // read once and dotted with every row of x (which stays in cache). While the
  // intra-op threads are not getting the cores (another process), on the calling
  // thread alone: the same results (see stall_aware.h).
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  parallel_for_unless_stalled(out, grain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t n = weights[i].size(0), b = std::max(begin, first), e = std::min(end, first + n);
      if (b < e) layer(i, first, b - first, e - first);
      first += n;
    }
  });
  return y;
}

}  // namespace torchattn::kernels::cpu
