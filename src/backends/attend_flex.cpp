#include "backends/attend_flex.h"

#include "backends/grouped_heads.h"
#include "backends/score_scale.h"

#include <ATen/ops/_to_copy.h>
#include <c10/util/Exception.h>

namespace torchattn::backends {

at::Tensor attend_flex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                       const functional::AttentionOptions& config) {
  constexpr const char* fn = "attention with a flex variant (AttentionOptions::flex)";
  TORCH_CHECK(q.dim() == 4, fn, ": expected q of [B, H, T, d], got ", q.sizes());
  TORCH_CHECK(!spec.is_static(), fn,
              ": expected a dynamic-shape KV cache (make_kv_cache(batch, /*static_shapes=*/false)), got a "
              "static-shape one");
  TORCH_CHECK(!spec.key_padding.defined() && !spec.key_bias.defined(), fn,
              ": expected no key padding mask or key bias (write them into mask_mod or score_mod)");
  // A score bias other than ALiBi's slopes: forward_packed's ALiBi, made per document.
  TORCH_CHECK(!spec.score_bias.defined(), fn,
              ": expected no score bias (ALiBi in forward_packed: write it as a score_mod)");
  TORCH_CHECK(!config.sinks.defined(), fn, ": expected no attention sinks");
  TORCH_CHECK(dropout_p(config) == 0.0, fn, ": expected no dropout in training, got dropout ", config.dropout);
  // The module's window, softcap and ALiBi go with the call: the variant applies them
  // around its mods (flex_variant).
  FlexCall call;
  call.q_offset = spec.past;
  call.causal = spec.causal;
  call.scale = score_scale(config, q.size(-1));
  call.window = spec.window.value_or(0);
  call.softcap = config.softcap.value_or(0.0);
  if (spec.alibi_slopes.defined()) {
    const at::Tensor s = spec.alibi_slopes.to(at::kCPU, at::kDouble).contiguous();
    call.alibi_slopes.assign(s.const_data_ptr<double>(), s.const_data_ptr<double>() + s.numel());
  }
  return config.flex(q, k, v, call);
}

void check_no_flex(const functional::AttentionOptions& config, const char* what) {
  TORCH_CHECK(!config.flex, what, ": runs no flex variant (AttentionOptions::flex); use forward or forward_cached");
}

}  // namespace torchattn::backends
