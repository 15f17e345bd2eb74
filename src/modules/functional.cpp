#include <torchattn/functional.h>

#include "base/checks.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchattn::functional {

at::Tensor make_causal_mask(int64_t T, double neg_large, at::TensorOptions options) {
  TORCH_CHECK(T > 0, "make_causal_mask: expected T > 0, got ", T);
  TORCH_CHECK(std::isfinite(neg_large), "make_causal_mask: expected a finite neg_large, got ", neg_large);
  return at::triu(at::ones({T, T}, options), 1) * neg_large;
}

at::Tensor causal_mask_buffer(int64_t T, at::TensorOptions options) {
  TORCH_CHECK(T > 0, "causal_mask_buffer: expected T > 0, got ", T);
  return at::triu(at::ones({T, T}, options), 1);
}

at::Tensor dot_product_attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, bool scale) {
  constexpr const char* fn = "dot_product_attention";
  detail::check_qkv(fn, q, k, nullptr);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (scale) {
    scores = scores / std::sqrt(static_cast<double>(k.size(-1)));
  }
  if (mask.defined()) {
    detail::check_broadcasts(fn, "mask", mask, scores);
    scores = scores + (1 - mask) * -1e9;
  }
  return at::softmax(scores, -1);
}

at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 bool scale) {
  detail::check_qkv("dot_product_attention", q, k, &v);
  return at::matmul(dot_product_attention_weights(q, k, mask, scale), v);
}

at::Tensor causal_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool scale) {
  detail::check_qkv("causal_dot_product_attention", q, k, &v);
  const int64_t T = q.size(-2);
  TORCH_CHECK(k.size(-2) == T, "causal_dot_product_attention: expected k with Tq=", T,
              " tokens (a square causal mask), got ", k.size(-2));
  return dot_product_attention(q, k, v, at::tril(at::ones({T, T}, q.options())), scale);
}

at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& hide) {
  detail::check_floating("masked_softmax", "scores", scores);
  detail::check_broadcasts("masked_softmax", "hide", hide, scores);
  return at::softmax(scores.masked_fill(hide.to(at::kBool), -std::numeric_limits<double>::infinity()), -1);
}

at::Tensor softmax_mask_renormalize(const at::Tensor& scores, const at::Tensor& keep) {
  detail::check_floating("softmax_mask_renormalize", "scores", scores);
  detail::check_broadcasts("softmax_mask_renormalize", "keep", keep, scores);
  at::Tensor masked = at::softmax(scores, -1) * keep;
  return masked / masked.sum(-1, /*keepdim=*/true);
}

}  // namespace torchattn::functional
