#include "backends/sdpa.h"

#include "backends/repeated_shapes.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#ifdef TORCHATTN_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace torchattn::backends {

namespace {

bool is_half(c10::ScalarType t) { return t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16; }

bool aligned_head(int64_t d) { return d > 0 && d % 8 == 0; }

// What the memory-efficient kernel checks and ATen checks before choosing it (cuDNN
// does not): 16-byte aligned data and rows. Views that are not stay with ATen.
bool aligned_for_fused(const at::Tensor& t) {
  if (t.stride(-1) != 1 || (t.storage_offset() * t.element_size()) % 16 != 0) {
    return false;
  }
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * t.element_size()) % 16 != 0) {
      return false;
    }
  }
  return true;
}

// Whether the current CUDA stream is being captured into a graph: cuDNN is kept out of
// captures (its plans are built on first use, and its known troubles there).
bool capturing_cuda_graph() {
#ifdef TORCHATTN_WITH_CUDA
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

// What tells two calls apart for cuDNN's plans: the sizes and strides of q, k, v and
// the mask, dtypes, device, scale, causal, dropout and whether a gradient follows.
std::vector<int64_t> call_shape(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                std::optional<double> scale, bool enable_gqa) {
  int64_t scale_bits = -1;  // unset: the default 1/sqrt(d)
  if (scale) std::memcpy(&scale_bits, &*scale, sizeof(scale_bits));
  std::vector<int64_t> shape = {
      static_cast<int64_t>(q.device().index()),
      static_cast<int64_t>(q.scalar_type()),
      scale ? 1 : 0,
      scale_bits,
      is_causal ? 1 : 0,
      dropout_p > 0.0 ? 1 : 0,
      enable_gqa ? 1 : 0,
      c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()) ? 1 : 0};
  auto add = [&](const at::Tensor& t) {
    shape.push_back(t.dim());
    shape.push_back(static_cast<int64_t>(t.scalar_type()));
    for (int64_t d = 0; d < t.dim(); ++d) {
      shape.push_back(t.size(d));
      shape.push_back(t.stride(d));
    }
  };
  add(q);
  add(k);
  add(v);
  if (mask) add(*mask);
  return shape;
}

}  // namespace

at::Tensor efficient_bias(const at::Tensor& attn_mask, const at::Tensor& q, int64_t Tk) {
  at::Tensor m = attn_mask;
  while (m.dim() < 4) {
    m = m.unsqueeze(0);
  }
  const int64_t Tq = q.size(-2), padded = (Tk + 15) / 16 * 16;
  // Batch and head dimensions stay broadcast where the mask's are.
  at::Tensor b = at::zeros({m.size(0), m.size(1), Tq, padded}, q.options()).narrow(-1, 0, Tk);
  if (m.scalar_type() == at::kBool) {
    b.masked_fill_(m.logical_not().expand({m.size(0), m.size(1), Tq, Tk}), -std::numeric_limits<double>::infinity());
  } else {
    b.copy_(m.expand({m.size(0), m.size(1), Tq, Tk}));  // already additive
  }
  return b.expand({q.size(0), q.size(1), Tq, Tk});
}

FusedKernel choose_fused_kernel(const KernelQuery& q) {
  if (!q.cuda || q.allow_cudnn || q.repeated ||
      q.aten_choice != static_cast<int64_t>(at::SDPBackend::cudnn_attention)) {
    return FusedKernel::ATen;
  }
  const bool same_dims = q.head_dim == q.v_head_dim && aligned_head(q.head_dim);
  // ATen's is_causal is aligned top-left; callers only set it for Tq == Tk.
  const bool causal_ok = !q.is_causal || q.Tq == q.Tk;
  if (q.flash_enabled && is_half(q.dtype) && !q.has_mask && same_dims && q.head_dim <= 256 && causal_ok) {
    return FusedKernel::Flash;
  }
  if (q.efficient_enabled && (is_half(q.dtype) || q.dtype == c10::ScalarType::Float) && same_dims && causal_ok) {
    return FusedKernel::Efficient;
  }
  return FusedKernel::ATen;
}

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                           std::optional<double> scale, Cudnn cudnn, bool enable_gqa) {
  at::Tensor k = k_in, v = v_in;
  FusedKernel kernel = FusedKernel::ATen;
  if (q.is_cuda() && q.dim() == 4 && cudnn != Cudnn::Allowed && q.numel() > 0 && k.numel() > 0 &&
      aligned_for_fused(q) && aligned_for_fused(k) && aligned_for_fused(v)) {
    const auto& ctx = at::globalContext();
    KernelQuery query;
    query.cuda = true;
    query.aten_choice = at::_fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa);
    query.dtype = q.scalar_type();
    query.has_mask = attn_mask.has_value();
    query.is_causal = is_causal;
    query.Tq = q.size(-2);
    query.Tk = k.size(-2);
    query.head_dim = q.size(-1);
    query.v_head_dim = v.size(-1);
    query.flash_enabled = ctx.userEnabledFlashSDP();
    query.efficient_enabled = ctx.userEnabledMemEfficientSDP();
    if (cudnn == Cudnn::Repeated && query.Tq == query.Tk &&
        query.aten_choice == static_cast<int64_t>(at::SDPBackend::cudnn_attention) && !capturing_cuda_graph()) {
      query.repeated = cudnn_shapes().seen_before(
          call_shape(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa));
    }
    kernel = choose_fused_kernel(query);
  }
  if (kernel != FusedKernel::ATen && enable_gqa && k.size(1) != q.size(1)) {
    // The direct calls take as many key/value heads as query heads.
    const int64_t G = q.size(1) / k.size(1);
    k = k.repeat_interleave(G, 1);
    v = v.repeat_interleave(G, 1);
  }
  switch (kernel) {
    case FusedKernel::Flash:
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
                                                                 /*return_debug_mask=*/false, scale));
    case FusedKernel::Efficient: {
      std::optional<at::Tensor> bias;
      if (attn_mask) {
        bias = efficient_bias(*attn_mask, q, k.size(-2));
      }
      const bool needs_lse = c10::GradMode::is_enabled() &&
                             (q.requires_grad() || k.requires_grad() || v.requires_grad());
      return std::get<0>(
          at::_scaled_dot_product_efficient_attention(q, k, v, bias, needs_lse, dropout_p, is_causal, scale));
    }
    case FusedKernel::ATen:
      break;
  }
  return at::scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace torchattn::backends
