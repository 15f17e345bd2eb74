// The attention engine: the Reference backend (the notebooks' math step by step)
// and the SDPA backend (fused kernels, see detail/sdpa_kernel.h), over one
// description of the mask (detail/mask_spec.h).

#include <torchattn/functional.h>

#include "detail/checks.h"
#include "detail/engine.h"
#include "detail/sdpa_kernel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <vector>

namespace torchattn {

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

double dropout_p(const functional::AttentionConfig& config) {
  return config.training ? config.dropout : 0.0;
}

// The SDPA backend: Backend::SDPA is ATen's own choice of kernel; Auto avoids
// cuDNN's per-shape plans unless the shapes are static (a cache of fixed size
// decoding one token at a time).
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& keep,
                bool is_causal, const functional::AttentionConfig& config, bool static_shapes) {
  const bool allow_cudnn = config.backend == Backend::SDPA || (static_shapes && q.size(-2) == 1);
  return detail::fused_attention(q, k, v, keep, dropout_p(config), is_causal, config.scale, allow_cudnn);
}

// Attention with a key padding mask. Rows that would see no key are attended over
// all keys instead (finite softmax, finite gradients) and then zeroed.
at::Tensor padded_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const detail::MaskSpec& spec, const functional::AttentionConfig& config,
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
  const at::Tensor causal_hide = detail::hidden_keys(spec, Tq, Tk, q.device());
  at::Tensor hide = causal_hide.defined() ? at::logical_or(pad_hide, causal_hide) : pad_hide.expand(full);
  const at::Tensor dead = hide.all(-1, /*keepdim=*/true);  // [B, 1.., Tq, 1]
  hide = at::logical_and(hide, dead.logical_not());
  const at::Tensor additive = is_bool ? at::Tensor() : key_padding_mask.masked_fill(key_padding_mask.isneginf(), 0).view(shape);

  at::Tensor out;
  if (functional::resolve_backend(config) == Backend::Reference) {
    at::Tensor scores = masked_scaled_scores(q, k, hide, config.scale);
    if (additive.defined()) {
      scores = scores + additive;
    }
    out = weighted_values(at::softmax(scores, -1), v, dropout_p(config));
  } else {
    at::Tensor mask = at::zeros(hide.sizes(), q.options()).masked_fill_(hide, -std::numeric_limits<double>::infinity());
    if (additive.defined()) {
      mask = mask + additive;
    }
    out = sdpa(q, k, v, mask, /*is_causal=*/false, config, /*static_shapes=*/false);
  }
  return out.masked_fill(dead, 0);
}

} // namespace

namespace detail {

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                  const functional::AttentionConfig& config, const at::Tensor& key_padding_mask) {
  check_qkv("attention", q, k, &v);
  check_scale("attention", config.scale);
  TORCH_CHECK(!key_padding_mask.defined() || q.dim() >= 3,
              "attention: a key_padding_mask needs batched q [B, ..., Tq, d], got q ", q.sizes());
  const int64_t Tq = q.size(-2), Tk = k.size(-2);
  check_mask_spec("attention", spec, Tq, Tk);
  const bool sdpa_backend = functional::resolve_backend(config) == Backend::SDPA;
  if (q.dim() == 3 && sdpa_backend) {
    // ATen's fused CPU kernels take [B, H, T, d]; a single-head [B, T, d] would fall
    // back to the math kernel, which builds the T x T weights.
    return attend(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), spec, config, key_padding_mask).squeeze(1);
  }
  if (key_padding_mask.defined()) {
    return padded_attention(q, k, v, spec, config, key_padding_mask);
  }
  if (!sdpa_backend) {
    const at::Tensor hide = hidden_keys(spec, Tq, Tk, q.device());
    return weighted_values(at::softmax(masked_scaled_scores(q, k, hide, config.scale), -1), v, dropout_p(config));
  }
  if (spec.is_static()) {
    return sdpa(q, k, v, hidden_keys(spec, Tq, Tk, q.device()).logical_not(), /*is_causal=*/false, config, true);
  }
  // SDPA's is_causal aligns top-left, which is our mask only when Tq == Tk. A single
  // new token sees every cached key, so it needs no mask. Other cached chunks pass
  // the bottom-right block as a boolean mask (true = attend).
  std::optional<at::Tensor> keep;
  bool is_causal = false;
  if (spec.causal) {
    if (spec.past == 0) {
      is_causal = true;
    } else if (Tq > 1) {
      keep = hidden_keys(spec, Tq, Tk, q.device()).logical_not();
    }
  }
  return sdpa(q, k, v, keep, is_causal, config, false);
}

} // namespace detail

namespace functional {

at::Tensor attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& causal_mask,
                             int64_t past, std::optional<double> scale) {
  detail::MaskSpec spec;
  spec.causal = causal_mask.defined();
  spec.buffer = spec.causal ? &causal_mask : nullptr;
  spec.past = past;
  detail::check_mask_spec("attention", spec, q.size(-2), k.size(-2));
  return at::softmax(masked_scaled_scores(q, k, detail::hidden_keys(spec, q.size(-2), k.size(-2), q.device()), scale),
                     -1);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& causal_mask,
                     int64_t past, const AttentionConfig& config, const at::Tensor& key_padding_mask) {
  detail::MaskSpec spec;
  spec.causal = causal_mask.defined();
  spec.buffer = spec.causal ? &causal_mask : nullptr;
  spec.past = past;
  return detail::attend(q, k, v, spec, config, key_padding_mask);
}

} // namespace functional

} // namespace torchattn
