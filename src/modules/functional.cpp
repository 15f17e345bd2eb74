// Every function of functional.h: the notebooks' math here, the rest handed to the
// attention entry (backends/attend.h) and the linear kernels (layers/linear.h).

#include <torchattn/functional.h>

#include "backends/attend.h"
#include "backends/attend_documents.h"
#include "backends/mask_spec.h"
#include "backends/reference.h"
#include "base/checks.h"
#include "layers/linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>
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
  base::check_qkv(fn, q, k, nullptr);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (scale) {
    scores = scores / std::sqrt(static_cast<double>(k.size(-1)));
  }
  if (mask.defined()) {
    base::check_broadcasts(fn, "mask", mask, scores);
    scores = scores + (1 - mask) * -1e9;
  }
  return at::softmax(scores, -1);
}

at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 bool scale) {
  base::check_qkv("dot_product_attention", q, k, &v);
  return at::matmul(dot_product_attention_weights(q, k, mask, scale), v);
}

at::Tensor causal_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool scale) {
  base::check_qkv("causal_dot_product_attention", q, k, &v);
  const int64_t T = q.size(-2);
  TORCH_CHECK(k.size(-2) == T, "causal_dot_product_attention: expected k with Tq=", T,
              " tokens (a square causal mask), got ", k.size(-2));
  return dot_product_attention(q, k, v, at::tril(at::ones({T, T}, q.options())), scale);
}

at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& hide) {
  base::check_floating("masked_softmax", "scores", scores);
  base::check_broadcasts("masked_softmax", "hide", hide, scores);
  return at::softmax(scores.masked_fill(hide.to(at::kBool), -std::numeric_limits<double>::infinity()), -1);
}

at::Tensor softmax_mask_renormalize(const at::Tensor& scores, const at::Tensor& keep) {
  base::check_floating("softmax_mask_renormalize", "scores", scores);
  base::check_broadcasts("softmax_mask_renormalize", "keep", keep, scores);
  at::Tensor masked = at::softmax(scores, -1) * keep;
  return masked / masked.sum(-1, /*keepdim=*/true);
}

Backend resolve_backend(const AttentionOptions& config) { return backends::resolve_backend(config); }

at::Tensor attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& causal_mask, int64_t past,
                             std::optional<double> scale) {
  base::check_qkv("attention", q, k, nullptr);
  backends::MaskSpec spec;
  spec.causal = causal_mask.defined();
  spec.buffer = spec.causal ? &causal_mask : nullptr;
  spec.past = past;
  backends::check_mask_spec("attention", spec, q, k.size(-2));
  const at::Tensor hide = backends::hidden_keys(spec, q.size(-2), k.size(-2), q.device());
  return at::softmax(backends::masked_scaled_scores(q, k, hide, scale), -1);
}

namespace {

// attention()'s arguments as the backends' MaskSpec (the buffer by reference).
backends::MaskSpec call_spec(const at::Tensor& causal_mask, int64_t past, const at::Tensor& key_padding_mask,
                             const at::Tensor& key_bias) {
  backends::MaskSpec spec;
  spec.causal = causal_mask.defined();
  spec.buffer = spec.causal ? &causal_mask : nullptr;
  spec.past = past;
  spec.key_padding = key_padding_mask;
  spec.key_bias = key_bias;
  return spec;
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& causal_mask,
                     int64_t past, const AttentionOptions& config, const at::Tensor& key_padding_mask,
                     const at::Tensor& key_bias) {
  return backends::attend(q, k, v, call_spec(causal_mask, past, key_padding_mask, key_bias), config);
}

std::vector<std::string> attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& causal_mask, int64_t past, const AttentionOptions& config,
                                        const at::Tensor& key_padding_mask, const at::Tensor& key_bias) {
  return backends::explain(q, k, v, call_spec(causal_mask, past, key_padding_mask, key_bias), config);
}

at::Tensor attention_packed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            bool causal, const AttentionOptions& config) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined() && q.dim() >= 2,
              "attention_packed: expected defined q [..., N, d], k and v");
  TORCH_CHECK(k.dim() == q.dim() && v.dim() == q.dim() && k.size(-2) == q.size(-2) && v.size(-2) == q.size(-2),
              "attention_packed: expected q, k and v with the same N tokens along dim -2, got q ", q.sizes(), ", k ",
              k.sizes(), ", v ", v.sizes());
  const std::vector<int64_t> offsets = base::check_cu_seqlens("attention_packed", cu_seqlens, q.movedim(-2, 0),
                                                              /*max_len=*/0, "q", "tokens (dim -2)");
  std::vector<int64_t> lengths;
  for (size_t s = 0; s + 1 < offsets.size(); ++s) lengths.push_back(offsets[s + 1] - offsets[s]);
  return backends::attend_documents(
      q, k, v, lengths,
      [causal](int64_t) {
        backends::MaskSpec spec;
        spec.causal = causal;
        return spec;
      },
      config);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return layers::linear(x, weight, bias);
}

}  // namespace torchattn::functional
