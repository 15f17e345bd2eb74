// The attention dispatcher (backends::attend): turns one description of what each query sees (MaskSpec)
// into the masks a backend takes, and dispatches to the Reference backend (the
// notebooks' math, backends/reference.h) or the SDPA backend (ATen's fused kernels,
// backends/sdpa.h).

#include "backends/alibi.h"
#include "backends/blocked.h"
#include "backends/grouped_heads.h"
#include "backends/reference.h"
#include "backends/sdpa.h"
#include "base/checks.h"
#include "backends/attend.h"
#include "backends/attend_flex.h"
#include "backends/named_flex.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cuda/static_decode_attention.h"
#include "backends/score_scale.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <vector>

namespace torchattn {

namespace {

// [B or 1, Tk] -> [B or 1, 1, ..., 1, Tk]: broadcasts over heads and queries of q.
at::Tensor per_key(const at::Tensor& m, const at::Tensor& q) {
  std::vector<int64_t> shape(q.dim(), 1);
  shape.front() = m.size(0);
  shape.back() = m.size(1);
  return m.view(shape);
}

// The most queries of a static-shape step that Backend::Auto keeps away from ATen's
// fused kernels on CUDA. Such a step attends over the cache's whole capacity through a
// mask, and ATen's fused kernel that takes a mask (memory-efficient) spreads its work
// over the queries: one query x H heads keeps H blocks busy over every key, about 150
// us a layer at 2048 keys on an H200 (`make bench DEVICE=cuda`, decode `graph`). Such
// a step runs torchattn's flash-decoding kernel (kernels/cuda/), or where that does
// not apply (key masks, a gradient) the Reference's batched products, which spread
// the keys over the whole GPU.
constexpr int64_t kStaticMathQueries = 16;

bool static_step_on_cuda(const at::Tensor& q, const backends::MaskSpec& spec,
                         const functional::AttentionOptions& config) {
  return config.backend == Backend::Auto && q.is_cuda() && spec.is_static() && q.size(-2) <= kStaticMathQueries;
}

#ifdef TORCHATTN_WITH_CUDA
// The flash-decoding kernel's description of a static-shape spec without key masks.
kernels::cuda::StaticDecodeMask static_decode_mask(const backends::MaskSpec& spec) {
  kernels::cuda::StaticDecodeMask m;
  m.positions = spec.positions;
  m.causal = spec.causal;
  if (spec.causal) {
    m.window = spec.window.value_or(0);
    if (spec.buffer != nullptr) {
      m.buffer = *spec.buffer;
    }
  }
  return m;
}
#endif

// Attention with key masks (padding, additive bias). Rows that would see no key are
// attended over all keys instead (finite softmax, finite gradients) and then zeroed.
at::Tensor key_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const backends::MaskSpec& spec, const functional::AttentionOptions& config) {
  const int64_t Tq = q.size(-2), Tk = k.size(-2);
  // Hidden: the causal pattern, padding keys, and keys whose bias is -inf.
  at::Tensor hide = backends::hidden_keys(spec, Tq, Tk, q.device());
  at::Tensor bias;
  auto hide_also = [&](const at::Tensor& h) { hide = hide.defined() ? at::logical_or(hide, h) : h; };
  if (spec.key_padding.defined()) {
    hide_also(per_key(spec.key_padding, q));
  }
  if (spec.key_bias.defined()) {
    const at::Tensor neg_inf = spec.key_bias.isneginf();
    hide_also(per_key(neg_inf, q));
    bias = per_key(spec.key_bias.masked_fill(neg_inf, 0), q);
  }
  if (spec.score_bias.defined()) {
    bias = bias.defined() ? bias + spec.score_bias : spec.score_bias;
  }
  if (!hide.defined()) {  // only a score bias: every key visible
    hide = per_key(at::zeros({1, Tk}, q.options().dtype(at::kBool)), q);
  }
  const at::Tensor dead = hide.all(-1, /*keepdim=*/true);  // [B or 1, 1.., Tq or 1, 1]
  hide = at::logical_and(hide, dead.logical_not());

  at::Tensor out;
  if (backends::resolve_backend(config) == Backend::Reference || static_step_on_cuda(q, spec, config)) {
    const int64_t G = backends::query_groups(q, k);
    out = backends::reference_attention(q, backends::repeat_kv(k, G), backends::repeat_kv(v, G), hide, bias,
                                        config.scale, backends::dropout_p(config));
  } else {
    at::Tensor mask = at::zeros(hide.sizes(), q.options()).masked_fill_(hide, -std::numeric_limits<double>::infinity());
    if (bias.defined()) {
      mask = mask + bias;
    }
    out = backends::sdpa_attention(q, k, v, mask, /*is_causal=*/false, config);
  }
  return out.masked_fill(dead, 0);
}

}  // namespace

namespace backends {

Backend resolve_backend(const functional::AttentionOptions& config) {
  if (config.backend != Backend::Auto) {
    return config.backend;
  }
  return (config.training && config.dropout > 0.0) ? Backend::Reference : Backend::SDPA;
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                  const functional::AttentionOptions& config) {
  constexpr const char* fn = "attention";
  base::check_qkv(fn, q, k, &v);
  base::check_scale(fn, config.scale);
  check_mask_spec(fn, spec, q, k.size(-2));
  TORCH_CHECK(q.dim() == k.dim() && (q.dim() != 4 || (k.size(1) > 0 && q.size(1) % k.size(1) == 0)), fn,
              ": expected q's heads a multiple of k's (grouped-query attention), got q ", q.sizes(), " and k ",
              k.sizes());
  const int64_t Tq = q.size(-2), Tk = k.size(-2);
  if (config.flex) return attend_flex(q, k, v, spec, config);
  if (named_flex_applies(q, spec, config)) return named_flex_attention(q, k, v, spec, config);
  if (spec.alibi_slopes.defined()) {
    // ALiBi elsewhere: its distances as a score bias, at the keys' real positions.
    MaskSpec biased = spec;
    biased.score_bias = alibi_bias(spec.alibi_slopes.to(q.device()), spec.key_padding, Tq, Tk, q.scalar_type(),
                                   spec.positions);
    biased.alibi_slopes = at::Tensor();
    return attend(q, k, v, biased, config);
  }
  if (needs_blocked_attention(config)) {
    // Softcapping and sinks: no fused kernel takes them; blocks of queries (every
    // backend: the Reference's math, without Tq x Tk memory).
    return blocked_attention(q, k, v, spec, config);
  }
  const Backend backend = resolve_backend(config);
  if (q.dim() == 3 && backend == Backend::SDPA) {
    // ATen's fused CPU kernels take [B, H, T, d]; a single-head [B, T, d] would fall
    // back to the math kernel, which builds the T x T weights.
    return attend(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), spec, config).squeeze(1);
  }
  if (spec.has_key_masks()) {
    return key_masked_attention(q, k, v, spec, config);
  }
#ifdef TORCHATTN_WITH_CUDA
  if (backend != Backend::Reference && static_step_on_cuda(q, spec, config) && dropout_p(config) == 0.0) {
    const kernels::cuda::StaticDecodeMask m = static_decode_mask(spec);
    if (kernels::cuda::static_decode_applies(q, k, v, m)) {
      const double scale = score_scale(config, q.size(-1));
      return kernels::cuda::static_decode_attention(q, k, v, m, scale);
    }
  }
#endif
  if (backend == Backend::Reference || static_step_on_cuda(q, spec, config)) {
    const int64_t G = query_groups(q, k);
    return reference_attention(q, repeat_kv(k, G), repeat_kv(v, G), hidden_keys(spec, Tq, Tk, q.device()), {},
                               config.scale, dropout_p(config));
  }
  if (spec.is_static() || spec.window) {
    const at::Tensor hide = hidden_keys(spec, Tq, Tk, q.device());
    return sdpa_attention(q, k, v, hide.defined() ? std::optional<at::Tensor>(hide.logical_not()) : std::nullopt,
                          /*is_causal=*/false, config);
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
      // A long chunk after earlier keys on the CPU (no gradient): torchattn's causal
      // kernel, aligned bottom-right, as sdpa_attention takes one from the start.
      if (Tq > kernels::cpu::kDecodeAttentionRows) {
        if (at::Tensor out = causal_prefill_kernel(q, k, v, config); out.defined()) {
          return out;
        }
      }
      keep = hidden_keys(spec, Tq, Tk, q.device()).logical_not();
    }
  }
  return sdpa_attention(q, k, v, keep, is_causal, config);
}

}  // namespace backends

}  // namespace torchattn
