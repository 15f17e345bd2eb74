#include "backends/named_flex.h"

#include "backends/grouped_heads.h"
#include "backends/score_scale.h"

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <ATen/ops/_to_copy.h>
#include <c10/util/Exception.h>

#include <vector>

namespace torchattn::backends {

namespace {

// flex_attention with score_mod and the spec's keys: all, causal after `past` keys, or
// a window; k and v hold the keys the call may see (a static cache's written ones).
template <class ScoreMod>
at::Tensor with_spec_mask(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                          int64_t past, ScoreMod score_mod, const FlexOptions& options) {
  if (!spec.causal) return flex_attention(q, k, v, std::move(score_mod), options).output;
  const int64_t Tq = q.size(2), Tk = k.size(2);
  if (spec.window) {
    return flex_attention(q, k, v, std::move(score_mod),
                          create_block_mask(flex::SlidingWindow(*spec.window, past), 1, 1, Tq, Tk), options)
        .output;
  }
  return flex_attention(q, k, v, std::move(score_mod), create_block_mask(flex::Causal(past), 1, 1, Tq, Tk), options)
      .output;
}

}  // namespace

bool named_flex_applies(const at::Tensor& q, const MaskSpec& spec, const functional::AttentionOptions& config) {
  const bool alibi = spec.alibi_slopes.defined();
  const bool variant = config.softcap.has_value() || alibi || spec.window.has_value();
  return variant && !(config.softcap && alibi) && config.backend == Backend::Auto && !config.sinks.defined() &&
         !config.flex && dropout_p(config) == 0.0 && q.dim() == 4 && q.is_cpu() &&
         (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) && !spec.has_key_masks();
}

at::Tensor named_flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                                const functional::AttentionOptions& config) {
  const int64_t Tq = q.size(2);
  // A static cache's step sees its first position + Tq slots, the queries the last Tq of
  // them: a dynamic call over those (the others, never written, never read).
  int64_t past = spec.past;
  at::Tensor keys = k, values = v;
  if (spec.is_static()) {
    past = spec.positions.is_cpu() ? *spec.positions.const_data_ptr<int64_t>() : spec.positions.item<int64_t>();
    TORCH_CHECK(past >= 0 && past <= k.size(2) - Tq, "attention: a static cache's position ", past, " with ", Tq,
                " new rows is past its capacity of ", k.size(2), " slots");
    keys = k.narrow(2, 0, past + Tq);
    values = v.narrow(2, 0, past + Tq);
  }
  const FlexOptions options = FlexOptions().with_scale(score_scale(config, q.size(-1)));
  if (config.softcap) return with_spec_mask(q, keys, values, spec, past, flex::Softcap(*config.softcap), options);
  if (spec.alibi_slopes.defined()) {
    const at::Tensor s = spec.alibi_slopes.to(at::kCPU, at::kDouble).contiguous();
    std::vector<double> slopes(s.const_data_ptr<double>(), s.const_data_ptr<double>() + s.numel());
    // The queries are the last Tq keys (alibi_bias's positions without padding).
    return with_spec_mask(q, keys, values, spec, past, flex::Alibi(std::move(slopes), keys.size(2) - Tq), options);
  }
  return with_spec_mask(q, keys, values, spec, past, IdentityScore{}, options);
}

}  // namespace torchattn::backends
