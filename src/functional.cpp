#include <torchattn/functional.h>

#include "detail/checks.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <vector>

namespace torchattn::functional {

namespace {

// q: [..., Tq, d], k: [..., Tk, d], v: [..., Tk, dv] (v optional).
void check_qkv(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor* v) {
  detail::check_floating(fn, "q", q);
  detail::check_floating(fn, "k", k);
  TORCH_CHECK(q.dim() >= 2, fn, ": expected q with at least 2 dimensions [..., Tq, d], got ", q.sizes());
  TORCH_CHECK(k.dim() >= 2, fn, ": expected k with at least 2 dimensions [..., Tk, d], got ", k.sizes());
  TORCH_CHECK(q.size(-1) == k.size(-1), fn, ": expected q and k with the same feature size d, got q ",
              q.sizes(), " and k ", k.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), fn, ": expected q and k of one dtype, got q ",
              q.scalar_type(), " and k ", k.scalar_type());
  if (v != nullptr) {
    detail::check_floating(fn, "v", *v);
    TORCH_CHECK(v->dim() >= 2 && v->size(-2) == k.size(-2), fn,
                ": expected v with as many tokens as k (dimension -2), got k ", k.sizes(), " and v ",
                v->sizes());
    TORCH_CHECK(v->scalar_type() == q.scalar_type(), fn, ": expected v of q's dtype ", q.scalar_type(),
                ", got ", v->scalar_type());
  }
}

// The [Tq, Tk] block of the causal buffer seen by queries at positions past .. past+Tq-1.
at::Tensor causal_block(const char* fn, const at::Tensor& causal_mask, int64_t past, int64_t Tq, int64_t Tk) {
  TORCH_CHECK(causal_mask.dim() == 2 && causal_mask.size(0) == causal_mask.size(1), fn,
              ": expected a square [C, C] causal_mask, got ", causal_mask.sizes());
  TORCH_CHECK(past >= 0, fn, ": expected past >= 0, got ", past);
  TORCH_CHECK(Tk == past + Tq, fn, ": expected Tk == past + Tq (", past, " + ", Tq, "), got Tk=", Tk);
  TORCH_CHECK(Tk <= causal_mask.size(0), fn, ": expected at most context_length=", causal_mask.size(0),
              " key positions, got ", Tk);
  return causal_mask.slice(0, past, past + Tq).slice(1, 0, Tk);
}

} // namespace

at::Tensor make_causal_mask(int64_t T, double neg_large, at::TensorOptions options) {
  TORCH_CHECK(T > 0, "make_causal_mask: expected T > 0, got ", T);
  TORCH_CHECK(std::isfinite(neg_large), "make_causal_mask: expected a finite neg_large, got ", neg_large);
  return at::triu(at::ones({T, T}, options), 1) * neg_large;
}

at::Tensor causal_mask_buffer(int64_t T, at::TensorOptions options) {
  TORCH_CHECK(T > 0, "causal_mask_buffer: expected T > 0, got ", T);
  return at::triu(at::ones({T, T}, options), 1);
}

at::Tensor dot_product_attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask,
                                         bool scale) {
  constexpr const char* fn = "dot_product_attention";
  check_qkv(fn, q, k, nullptr);
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

at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& mask, bool scale) {
  check_qkv("dot_product_attention", q, k, &v);
  return at::matmul(dot_product_attention_weights(q, k, mask, scale), v);
}

at::Tensor causal_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        bool scale) {
  check_qkv("causal_dot_product_attention", q, k, &v);
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

Backend resolve_backend(const AttentionConfig& config) {
  if (config.backend != Backend::Auto) {
    return config.backend;
  }
  return (config.training && config.dropout > 0.0) ? Backend::Reference : Backend::SDPA;
}

namespace {

// The notebooks' scores: q k^T, hidden entries (bool `hide`, broadcastable; undefined
// for none) filled with -inf, then divided by sqrt(d_k), or multiplied by a given scale.
at::Tensor masked_scaled_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& hide,
                                std::optional<double> scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (hide.defined()) {
    scores.masked_fill_(hide, -std::numeric_limits<double>::infinity());
  }
  return scale ? scores * *scale : scores / std::sqrt(static_cast<double>(k.size(-1)));
}

// Dropout (training only, p > 0) on the weights, then weights @ v.
at::Tensor weighted_values(at::Tensor weights, const at::Tensor& v, double p) {
  if (p > 0.0) {
    weights = at::dropout(weights, p, /*train=*/true);
  }
  return at::matmul(weights, v);
}

} // namespace

at::Tensor attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& causal_mask,
                             int64_t past, std::optional<double> scale) {
  const at::Tensor hide = causal_mask.defined()
                              ? causal_block("attention", causal_mask, past, q.size(-2), k.size(-2)).to(at::kBool)
                              : at::Tensor();
  return at::softmax(masked_scaled_scores(q, k, hide, scale), -1);
}

namespace {

// Attention with a key padding mask. Rows that would see no key are attended over
// all keys instead (finite softmax, finite gradients) and then zeroed.
at::Tensor padded_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& causal_mask, int64_t past, const AttentionConfig& config,
                            const at::Tensor& key_padding_mask) {
  constexpr const char* fn = "attention";
  const int64_t B = q.size(0), Tq = q.size(-2), Tk = k.size(-2);
  TORCH_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(0) == B && key_padding_mask.size(1) == Tk, fn,
              ": expected key_padding_mask of shape [B, Tk] = [", B, ", ", Tk, "], got ", key_padding_mask.sizes());
  const bool is_bool = key_padding_mask.scalar_type() == at::kBool;
  TORCH_CHECK(is_bool || key_padding_mask.scalar_type() == q.scalar_type(), fn,
              ": expected a bool key_padding_mask (true = ignore) or a floating one of q's dtype ", q.scalar_type(),
              " (added to the scores), got ", key_padding_mask.scalar_type());
  TORCH_CHECK(key_padding_mask.device() == q.device(), fn, ": expected key_padding_mask on ", q.device(), ", got ",
              key_padding_mask.device());

  // [B, Tk] -> [B, 1, ..., 1, Tk], broadcasting over heads and queries.
  std::vector<int64_t> shape(q.dim(), 1);
  shape.front() = B;
  shape.back() = Tk;
  const at::Tensor pad_hide = (is_bool ? key_padding_mask : key_padding_mask.isneginf()).view(shape);
  std::vector<int64_t> full = shape;  // [B, 1, ..., Tq, Tk]
  full[full.size() - 2] = Tq;
  at::Tensor hide = causal_mask.defined()
                        ? at::logical_or(pad_hide, causal_block(fn, causal_mask, past, Tq, Tk).to(at::kBool))
                        : pad_hide.expand(full);
  const at::Tensor dead = hide.all(-1, /*keepdim=*/true);  // [B, 1.., Tq, 1]
  hide = at::logical_and(hide, dead.logical_not());
  const at::Tensor additive = is_bool ? at::Tensor() : key_padding_mask.masked_fill(key_padding_mask.isneginf(), 0).view(shape);

  const double p = config.training ? config.dropout : 0.0;
  at::Tensor out;
  if (resolve_backend(config) == Backend::Reference) {
    at::Tensor scores = masked_scaled_scores(q, k, hide, config.scale);
    if (additive.defined()) {
      scores = scores + additive;
    }
    out = weighted_values(at::softmax(scores, -1), v, p);
  } else {
    at::Tensor mask = at::zeros(hide.sizes(), q.options()).masked_fill_(hide, -std::numeric_limits<double>::infinity());
    if (additive.defined()) {
      mask = mask + additive;
    }
    out = at::scaled_dot_product_attention(q, k, v, mask, p, /*is_causal=*/false, config.scale);
  }
  return out.masked_fill(dead, 0);
}

} // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& causal_mask, int64_t past, const AttentionConfig& config,
                     const at::Tensor& key_padding_mask) {
  check_qkv("attention", q, k, &v);
  detail::check_scale("attention", config.scale);
  TORCH_CHECK(!key_padding_mask.defined() || q.dim() >= 3,
              "attention: a key_padding_mask needs batched q [B, ..., Tq, d], got q ", q.sizes());
  if (q.dim() == 3 && resolve_backend(config) == Backend::SDPA) {
    // ATen's fused CPU kernels take [B, H, T, d]; a single-head [B, T, d] would fall
    // back to the math kernel, which builds the T x T weights.
    return attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), causal_mask, past, config, key_padding_mask)
        .squeeze(1);
  }
  if (key_padding_mask.defined()) {
    return padded_attention(q, k, v, causal_mask, past, config, key_padding_mask);
  }
  const double p = config.training ? config.dropout : 0.0;
  if (resolve_backend(config) == Backend::Reference) {
    return weighted_values(attention_weights(q, k, causal_mask, past, config.scale), v, p);
  }

  // SDPA: its is_causal aligns top-left, which is our mask only when Tq == Tk. A single
  // new token sees every cached key, so it needs no mask. Other cached chunks pass
  // the bottom-right block of the buffer as a boolean mask (true = attend).
  std::optional<at::Tensor> attn_mask;
  bool is_causal = false;
  if (causal_mask.defined()) {
    const int64_t Tq = q.size(-2);
    at::Tensor block = causal_block("attention", causal_mask, past, Tq, k.size(-2));
    if (past == 0) {
      is_causal = true;
    } else if (Tq > 1) {
      attn_mask = block.eq(0);
    }
  }
  return at::scaled_dot_product_attention(q, k, v, attn_mask, p, is_causal, config.scale);
}

} // namespace torchattn::functional
