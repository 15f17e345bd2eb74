// The attention entry (backends::attend): checks the call and hands it to the table of
// paths (selector.h), which chooses how it runs.

#include "backends/attend.h"

#include "backends/selector.h"
#include "base/checks.h"

#include <c10/util/Exception.h>

namespace torchattn::backends {

Backend resolve_backend(const functional::AttentionOptions& config) {
  if (config.backend != Backend::Auto) {
    return config.backend;
  }
  return (config.training && config.dropout > 0.0) ? Backend::Reference : Backend::SDPA;
}

namespace {

void check_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                const functional::AttentionOptions& config) {
  constexpr const char* fn = "attention";
  base::check_qkv(fn, q, k, &v);
  base::check_scale(fn, config.scale);
  check_mask_spec(fn, spec, q, k.size(-2));
  TORCH_CHECK(q.dim() == k.dim() && (q.dim() != 4 || (k.size(1) > 0 && q.size(1) % k.size(1) == 0)), fn,
              ": expected q's heads a multiple of k's (grouped-query attention), got q ", q.sizes(), " and k ",
              k.sizes());
}

}  // namespace

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                  const functional::AttentionOptions& config) {
  check_call(q, k, v, spec, config);
  return run_attention(AttentionCall{q, k, v, spec, config, resolve_backend(config)});
}

std::vector<std::string> explain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                                 const functional::AttentionOptions& config) {
  check_call(q, k, v, spec, config);
  return explain_attention(AttentionCall{q, k, v, spec, config, resolve_backend(config)});
}

}  // namespace torchattn::backends
