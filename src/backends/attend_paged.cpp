#include "backends/attend_paged.h"
#include "backends/attend_flex.h"

#include "backends/alibi.h"
#include "backends/attend.h"
#include "backends/mask_spec.h"
#include "backends/selector.h"

#include <ATen/core/List.h>

#include <optional>
#include <vector>

namespace torchattn::backends {

at::Tensor paged_by_token(const at::Tensor& storage, bool keys) {
  return keys ? storage.permute({0, 3, 1, 2}) : storage.permute({0, 2, 1, 3});
}

at::Tensor attend_paged(const at::Tensor& q, const PagedKeys& pool, const std::optional<int64_t>& window,
                        const functional::AttentionOptions& config, const at::Tensor& alibi_slopes) {
  check_no_flex(config, "forward_paged");
  MaskSpec spec;
  spec.causal = true;
  spec.window = window;
  spec.alibi_slopes = alibi_slopes;
  AttentionCall call{q, pool.keys, pool.values, spec, config, resolve_backend(config)};
  call.paged = &pool;
  return run_attention(call);
}

void attend_gathered(const AttentionCall& call, const std::vector<int64_t>& sequences, at::Tensor& out) {
  const PagedKeys& pool = *call.paged;
  const auto& qs = *pool.query_start;
  const auto& ks = *pool.key_start;
  const int64_t block_size = pool.keys.size(3);
  const at::Tensor& alibi = call.spec.alibi_slopes;
  const at::Tensor slopes =  // ALiBi's slopes on q's device, once for the gathered sequences
      alibi.defined() && !sequences.empty() ? alibi.to(call.q.device()) : at::Tensor();
  for (const int64_t s : sequences) {
    // This sequence's keys gathered into [1, Hkv, L, d], its rows as [1, H, n, d]: the
    // last n of L positions, as forward_cached sees a chunk after L - n cached tokens.
    const int64_t n = qs[s + 1] - qs[s], L = ks[s + 1] - ks[s];
    const at::Tensor slots = pool.key_slots.narrow(0, ks[s], L);
    const c10::List<std::optional<at::Tensor>> where({slots.div(block_size, "floor"), slots.remainder(block_size)});
    const at::Tensor k = paged_by_token(pool.keys, true).index(where).transpose(0, 1).unsqueeze(0);
    const at::Tensor v = paged_by_token(pool.values, false).index(where).transpose(0, 1).unsqueeze(0);
    MaskSpec spec;
    spec.causal = true;
    spec.past = L - n;
    spec.window = call.spec.window;
    if (slopes.defined()) spec.score_bias = alibi_bias(slopes, at::Tensor(), n, L, call.q.scalar_type());
    const at::Tensor rows = attend(call.q.narrow(0, qs[s], n).transpose(0, 1).unsqueeze(0), k, v, spec, call.config);
    out.narrow(0, qs[s], n).copy_(rows[0].transpose(0, 1));
  }
}

}  // namespace torchattn::backends
