#include "backends/named_flex.h"

#include "backends/grouped_heads.h"
#include "backends/score_scale.h"

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <ATen/ops/_to_copy.h>

#include <vector>

namespace torchattn::backends {

namespace {

// flex_attention with score_mod and the spec's keys: all, causal after spec.past keys,
// or a window.
template <class ScoreMod>
at::Tensor with_spec_mask(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                          ScoreMod score_mod, const FlexOptions& options) {
  if (!spec.causal) return flex_attention(q, k, v, std::move(score_mod), options).output;
  const int64_t Tq = q.size(2), Tk = k.size(2);
  if (spec.window) {
    return flex_attention(q, k, v, std::move(score_mod),
                          create_block_mask(flex::SlidingWindow(*spec.window, spec.past), 1, 1, Tq, Tk), options)
        .output;
  }
  return flex_attention(q, k, v, std::move(score_mod), create_block_mask(flex::Causal(spec.past), 1, 1, Tq, Tk),
                        options)
      .output;
}

}  // namespace

bool named_flex_applies(const at::Tensor& q, const MaskSpec& spec, const functional::AttentionOptions& config) {
  const bool alibi = spec.alibi_slopes.defined();
  const bool variant = config.softcap.has_value() || alibi || spec.window.has_value();
  return variant && !(config.softcap && alibi) && config.backend == Backend::Auto && !config.sinks.defined() &&
         !config.flex && dropout_p(config) == 0.0 && q.dim() == 4 && q.is_cpu() &&
         (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) && !spec.has_key_masks() &&
         !spec.is_static();
}

at::Tensor named_flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                                const functional::AttentionOptions& config) {
  const FlexOptions options = FlexOptions().with_scale(score_scale(config, q.size(-1)));
  if (config.softcap) return with_spec_mask(q, k, v, spec, flex::Softcap(*config.softcap), options);
  if (spec.alibi_slopes.defined()) {
    const at::Tensor s = spec.alibi_slopes.to(at::kCPU, at::kDouble).contiguous();
    std::vector<double> slopes(s.const_data_ptr<double>(), s.const_data_ptr<double>() + s.numel());
    // The queries are the last Tq keys (alibi_bias's positions without padding).
    return with_spec_mask(q, k, v, spec, flex::Alibi(std::move(slopes), k.size(2) - q.size(2)), options);
  }
  return with_spec_mask(q, k, v, spec, IdentityScore{}, options);
}

}  // namespace torchattn::backends
