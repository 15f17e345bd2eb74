#include "backends/varlen_flash.h"

#include "backends/grouped_heads.h"
#include "backends/score_scale.h"

#include <ATen/Context.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#ifdef TORCHATTN_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#endif

namespace torchattn::backends {

bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                          const functional::AttentionOptions& config) {
#ifdef TORCHATTN_WITH_CUDA
  if (!q.defined() || !k.defined() || !v.defined() || !q.is_cuda() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    return false;
  }
  const auto dtype = q.scalar_type();
  if ((dtype != at::kHalf && dtype != at::kBFloat16) || k.scalar_type() != dtype || v.scalar_type() != dtype ||
      k.device() != q.device() || v.device() != q.device()) {
    return false;
  }
  const int64_t d = q.size(3);
  if (q.size(0) != 1 || k.size(0) != 1 || v.size(0) != 1 || k.size(1) == 0 || q.size(1) % k.size(1) != 0 ||
      v.size(1) != k.size(1) || k.size(3) != d || v.size(3) != d || d % 8 != 0 || d > 256 || k.size(2) != q.size(2) ||
      v.size(2) != q.size(2)) {
    return false;
  }
  if (spec.window || spec.is_static() || spec.past != 0 || spec.has_key_masks()) return false;
  if (config.softcap || config.sinks.defined()) return false;
  if (dropout_p(config) > 0.0) return false;
  if (config.backend == Backend::Reference) return false;
  if (!at::globalContext().userEnabledFlashSDP()) return false;
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index()));
  return major >= 8;
#else
  (void)q, (void)k, (void)v, (void)spec, (void)config;
  return false;
#endif
}

at::Tensor varlen_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::vector<int64_t>& lengths, bool causal, const functional::AttentionOptions& config) {
  TORCH_CHECK(!lengths.empty(), "varlen_flash: expected at least one document");
  std::vector<int32_t> offsets{0};
  int64_t longest = 0;
  for (const int64_t L : lengths) {
    offsets.push_back(static_cast<int32_t>(offsets.back() + L));
    longest = std::max(longest, L);
  }
  TORCH_CHECK(offsets.back() == q.size(2), "varlen_flash: expected documents summing to the ", q.size(2),
              " tokens, got ", offsets.back());
  const at::Tensor cu = at::tensor(offsets, q.options().dtype(at::kInt));
  const double scale = score_scale(config, q.size(3));
  // [1, H, N, d] -> [N, H, d], FlashAttention's packed layout (the last dim contiguous).
  auto packed = [](const at::Tensor& t) {
    at::Tensor p = t.squeeze(0).transpose(0, 1);
    return p.stride(-1) == 1 ? p : p.contiguous();
  };
  const auto out = std::get<0>(at::_flash_attention_forward(packed(q), packed(k), packed(v), cu, cu, longest, longest,
                                                            /*dropout_p=*/0.0, causal, /*return_debug_mask=*/false,
                                                            scale));
  return out.transpose(0, 1).unsqueeze(0);
}

}  // namespace torchattn::backends
