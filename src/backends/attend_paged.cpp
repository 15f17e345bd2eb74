#include "backends/attend_paged.h"
#include "backends/attend_flex.h"

#include "backends/alibi.h"
#include "backends/attend.h"
#include "backends/mask_spec.h"
#include "backends/score_scale.h"

#include "kernels/cpu/paged_attention.h"

#include <ATen/ops/empty.h>

#include <cmath>
#include <vector>

namespace torchattn::backends {

at::Tensor paged_by_token(const at::Tensor& storage, bool keys) {
  return keys ? storage.permute({0, 3, 1, 2}) : storage.permute({0, 2, 1, 3});
}

at::Tensor attend_paged(const at::Tensor& q, const PagedKeys& pool, const std::optional<int64_t>& window,
                        const functional::AttentionOptions& config, const at::Tensor& alibi_slopes) {
  check_no_flex(config, "forward_paged");
  const at::Tensor& keys = pool.keys;
  const at::Tensor& values = pool.values;
  const int64_t N = q.size(0), H = q.size(1), d = q.size(2);
  const int64_t block_size = keys.size(3);
  at::Tensor out = at::empty({N, H, d}, q.options());
  const auto& qs = *pool.query_start;
  const auto& ks = *pool.key_start;
  const int64_t sequences = static_cast<int64_t>(qs.size()) - 1;

  std::vector<int64_t> kernel_rows, attend_rows;
  const bool kernel = config.backend == Backend::Auto && kernels::cpu::paged_attention_applies(q, keys, values);
  for (int64_t s = 0; s < sequences; ++s) {
    const bool short_rows = qs[s + 1] - qs[s] <= kernels::cpu::kPagedKernelRows;
    (kernel && short_rows ? kernel_rows : attend_rows).push_back(s);
  }
  if (!kernel_rows.empty()) {
    kernels::cpu::PagedRows rows{pool.key_slots_cpu.const_data_ptr<int64_t>(), &qs, &ks, window};
    const double scale = backends::score_scale(config, d);
    // The kernel reads the slopes and sinks as float32 [H] on the CPU (q is float32 there).
    const at::Tensor slopes = alibi_slopes.defined() ? alibi_slopes.to(at::kFloat).contiguous() : at::Tensor();
    const at::Tensor sinks = config.sinks.defined() ? config.sinks.to(at::kFloat).contiguous() : at::Tensor();
    const kernels::cpu::PagedScores extra{config.softcap, slopes.defined() ? slopes.const_data_ptr<float>() : nullptr,
                                          sinks.defined() ? sinks.const_data_ptr<float>() : nullptr};
    kernels::cpu::paged_attention(q, keys, values, rows, kernel_rows, scale, out, std::nullopt, extra);
  }
  const at::Tensor slopes_here =  // ALiBi's slopes on q's device, once for the gathered sequences
      alibi_slopes.defined() && !attend_rows.empty() ? alibi_slopes.to(q.device()) : at::Tensor();
  for (const int64_t s : attend_rows) {
    // This sequence's keys gathered into [1, Hkv, L, d], its rows as [1, H, n, d]: the
    // last n of L positions, as forward_cached sees a chunk after L - n cached tokens.
    const int64_t n = qs[s + 1] - qs[s], L = ks[s + 1] - ks[s];
    const at::Tensor slots = pool.key_slots.narrow(0, ks[s], L);
    const c10::List<std::optional<at::Tensor>> where({slots.div(block_size, "floor"), slots.remainder(block_size)});
    const at::Tensor k = paged_by_token(keys, true).index(where).transpose(0, 1).unsqueeze(0);
    const at::Tensor v = paged_by_token(values, false).index(where).transpose(0, 1).unsqueeze(0);
    MaskSpec spec;
    spec.causal = true;
    spec.past = L - n;
    spec.window = window;
    if (slopes_here.defined()) spec.score_bias = alibi_bias(slopes_here, at::Tensor(), n, L, q.scalar_type());
    const at::Tensor rows = attend(q.narrow(0, qs[s], n).transpose(0, 1).unsqueeze(0), k, v, spec, config);
    out.narrow(0, qs[s], n).copy_(rows[0].transpose(0, 1));
  }
  return out;
}

}  // namespace torchattn::backends
