#include "backends/sdpa.h"

#include "backends/grouped_heads.h"
#include "backends/repeated_shapes.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/prefill_attention.h"
#include "backends/score_scale.h"

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

int64_t prefill_kernel_max_keys(kernels::cpu::Isa isa) {
  // Where the kernel measured faster than ATen's flash kernel, by instruction set
  // (kernel / ATen time, interleaved medians, 2 threads, q [B, H, T, 64] over T keys):
  // - AVX2, AMD EPYC Zen 3 (no AVX-512): T 128 0.43, 512 0.96-1.02 (9 and 32 heads),
  //   1024 1.24, 2048 1.53, 4096 2.01: the kernel reads every visible key once per
  //   block of 4 rows, which outgrows the caches where ATen's blocked GEMMs do not.
  // - AVX-512, AMD EPYC Zen 5 (medians of 9, 3 past 4096): 9 heads over 3, T 128 0.41,
  //   512 0.39, 1024 0.56, 16384 0.87; 12 heads, B=4, T 512 0.46, 1024 0.60; 32 heads
  //   over 8, T 512 0.41, 1024 0.58, 2048 0.68, 4096 0.82, 8192 0.88. Faster at 512 on
  //   an Intel Xeon too, not measured beyond there.
  // So up to 512 keys with AVX2 and 16384 (the most measured) with AVX-512; ATen's
  // kernel past that (and without AVX2 at all).
  switch (isa) {
    case kernels::cpu::Isa::Avx512Vnni:  // the float kernel runs as on Avx512
    case kernels::cpu::Isa::Avx512:
      return 16384;
    case kernels::cpu::Isa::Avx2:
      return 512;
    case kernels::cpu::Isa::Scalar:
      break;
  }
  return 0;
}

at::Tensor causal_prefill_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const functional::AttentionOptions& config) {
  if (config.backend != Backend::Auto || dropout_p(config) != 0.0 ||
      k.size(-2) > prefill_kernel_max_keys(kernels::cpu::best_isa()) ||
      !kernels::cpu::prefill_attention_applies(q, k, v)) {
    return {};
  }
  return kernels::cpu::prefill_attention(q, k, v, score_scale(config, q.size(-1)));
}

// The SDPA backend: Backend::SDPA is ATen's own choice of kernel; Auto takes cuDNN
// only at a whole-sequence shape it has run before (see sdpa.h), never in decoding
// (cuDNN's per-shape plans, and its known troubles inside CUDA-graph capture with
// masks and long keys, which is what a static-shape decoding step is). `mask` has a
// query dimension of Tq or 1 and a head dimension of 1.
//
// Grouped queries: a single query per head (decoding) folds its G heads into G
// rows over their shared key/value head, [B, H, 1, d] -> [B, Hkv, G, d], so each
// key and value is read once per group; more queries use ATen's enable_gqa.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, bool is_causal,
                          const functional::AttentionOptions& config) {
  // A decoding step on the CPU (a few query rows, no gradient): torchattn's kernel,
  // which opens no parallel region for small work (kernels/cpu/decode_attention.h).
  // A mask of its own per head (ALiBi) neither folds grouped heads nor fits the kernel.
  const bool per_head_mask = mask && mask->dim() == 4 && mask->size(1) > 1;
  if (config.backend == Backend::Auto && !is_causal && dropout_p(config) == 0.0 && !per_head_mask) {
    const at::Tensor m = mask ? *mask : at::Tensor();
    if (kernels::cpu::decode_attention_applies(q, k, v, m)) {
      const double scale = score_scale(config, q.size(-1));
      return kernels::cpu::decode_attention(q, k, v, m, scale);
    }
  }
  // A causal prefill on the CPU (no gradient); is_causal aligns top-left, the kernel
  // bottom-right: the same where Tq == Tk.
  if (is_causal && !mask && q.size(-2) == k.size(-2)) {
    if (at::Tensor out = causal_prefill_kernel(q, k, v, config); out.defined()) {
      return out;
    }
  }
  const Cudnn cudnn = config.backend == Backend::SDPA ? Cudnn::Allowed : Cudnn::Repeated;
  const int64_t G = query_groups(q, k);
  if (G > 1 && q.size(-2) == 1 && !is_causal && !per_head_mask) {
    const int64_t B = q.size(0), H = q.size(1);
    // A decoding step: never a cuDNN plan under Auto, whatever G and the keys are.
    const at::Tensor folded = q.reshape({B, H / G, G, q.size(-1)});
    return fused_attention(folded, k, v, mask, dropout_p(config), false, config.scale,
                           cudnn == Cudnn::Allowed ? Cudnn::Allowed : Cudnn::Never)
        .reshape({B, H, 1, v.size(-1)});
  }
  return fused_attention(q, k, v, mask, dropout_p(config), is_causal, config.scale, cudnn,
                         /*enable_gqa=*/G > 1);
}

}  // namespace torchattn::backends
