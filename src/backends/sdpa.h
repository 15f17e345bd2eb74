#pragma once

// Which of ATen's fused kernels computes a call the table (selector.h) gives ATen, and
// the call into it.
//
// On CUDA, ATen's at::scaled_dot_product_attention prefers cuDNN where it can
// (Hopper, fp16/bf16). cuDNN builds an execution plan for every new shape: tens of
// milliseconds at every new sequence length, and then the fastest kernel at that
// shape. Backend::SDPA is ATen's own choice. Backend::Auto takes cuDNN only for a
// whole-sequence call (as many queries as keys: training, an encoder, a first
// prefill) whose shape it has run before in this process (repeated_shapes.h); a new
// shape, a decoding step or a cached chunk takes ATen's flash or memory-efficient
// kernel, which have no per-shape set-up, so decoding and serving never stall at a
// new length. No ATen setting is changed: the choice is made per call, and kernels
// the user switched off (at::globalContext().setSDPUseCuDNN(false), ...) stay off.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

namespace torchattn::backends {

enum class FusedKernel {
  ATen,       // at::scaled_dot_product_attention decides
  Flash,      // at::_scaled_dot_product_flash_attention
  Efficient,  // at::_scaled_dot_product_efficient_attention
};

/// What the choice depends on; everything is known on the host.
struct KernelQuery {
  bool cuda = false;
  /// at::_fused_sdp_choice for the call (an at::SDPBackend value; 3 = cuDNN).
  int64_t aten_choice = 0;
  /// The call may use cuDNN: Backend::SDPA.
  bool allow_cudnn = false;
  /// Auto's whole-sequence call at a shape it has run before (Cudnn::Repeated): ATen's
  /// choice, whose cuDNN plan is then built once and kept.
  bool repeated = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool has_mask = false;
  bool is_causal = false;
  int64_t Tq = 0, Tk = 0, head_dim = 0, v_head_dim = 0;
  /// The user's global switches, read, never written.
  bool flash_enabled = true;
  bool efficient_enabled = true;
};

/// When a call may take cuDNN: Backend::SDPA always; Auto at a whole-sequence shape
/// it has run before.
enum class Cudnn { Never, Repeated, Allowed };

/// ATen's choice unless it is cuDNN and cuDNN is neither allowed nor repeated; then flash where it
/// applies (fp16/bf16, no mask, head_dim a multiple of 8 up to 256), else the
/// memory-efficient kernel (fp32/fp16/bf16, head_dim a multiple of 8), else ATen.
FusedKernel choose_fused_kernel(const KernelQuery& query);

/// The memory-efficient kernel's form of a mask broadcastable to [B, H, Tq, Tk], bool
/// (true = attend: 0 or -inf) or floating (added to the scores, as it is): an additive
/// bias of q's dtype expanded to [B, H, Tq, Tk], its rows padded in memory to a
/// multiple of 16 elements.
at::Tensor efficient_bias(const at::Tensor& attn_mask, const at::Tensor& q, int64_t Tk);

/// softmax(q k^T * scale + mask) v by the kernel choose_fused_kernel picks.
/// q: [B, H, Tq, d], k: [B, Hkv, Tk, d], v: [B, Hkv, Tk, dv] (3-D inputs go to ATen).
/// Hkv == H, or with enable_gqa a divisor of H (query heads h * H/Hkv .. share key
/// head h): ATen's grouped path; the flash and efficient calls get the key and
/// value heads repeated.
/// attn_mask: bool (true = attend) or additive floating of q's dtype, broadcastable
/// to [B, H, Tq, Tk], or none. `cudnn` Repeated: where ATen would take cuDNN, Tq == Tk
/// and no CUDA graph is being captured, the call's shape (sizes, strides, dtype,
/// device, mask, scale, causal, dropout, gradient) is looked up in cudnn_shapes() and
/// recorded there.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                           std::optional<double> scale, Cudnn cudnn, bool enable_gqa = false);

}  // namespace torchattn::backends
