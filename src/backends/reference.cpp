#include "backends/reference.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>

#include <cmath>
#include <limits>

namespace torchattn::backends {

at::Tensor masked_scaled_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& hide,
                                std::optional<double> scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (hide.defined()) {
    scores.masked_fill_(hide, -std::numeric_limits<double>::infinity());
  }
  return scale ? scores * *scale : scores / std::sqrt(static_cast<double>(k.size(-1)));
}

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& hide,
                               const at::Tensor& bias, std::optional<double> scale, double dropout_p) {
  at::Tensor scores = masked_scaled_scores(q, k, hide, scale);
  if (bias.defined()) {
    scores = scores + bias;
  }
  at::Tensor weights = at::softmax(scores, -1);
  if (dropout_p > 0.0) {
    weights = at::dropout(weights, dropout_p, /*train=*/true);
  }
  return at::matmul(weights, v);
}

}  // namespace torchattn::backends
