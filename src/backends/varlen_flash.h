#pragma once

// Documents packed end to end on CUDA through ATen's variable-length flash attention:
// at::_flash_attention_forward with cum_seq_q and cum_seq_k (FlashAttention-2's varlen
// kernels), one launch for every document, each attending within itself alone,
// nothing of N x N made; its backward is ATen's autograd formula for that operator.
// attend_documents takes it where it applies, else runs the documents one by one.

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torchattn::backends {

/// Whether the varlen kernel takes the call: a CUDA build; q [1, H, N, d], k [1, Hk, N, d]
/// and v [1, Hk, N, d] CUDA half or bfloat16 on a GPU of compute capability 8.0 or more,
/// H a multiple of Hk, d a multiple of 8 up to 256, with ATen's flash attention enabled
/// (at::globalContext().userEnabledFlashSDP()); `spec` (a document's) causal or not,
/// with no window, bias or key mask (a causal buffer is read as the notebooks' causal
/// pattern, which forward_packed's documents never outgrow); `config` without
/// softcap, sinks or dropout (flash's own dropout masks would not be those of the
/// documents alone), backend Auto or SDPA.
bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                          const functional::AttentionOptions& config);

/// q, k, v as above, the documents' tokens along dim 2 in order, document s of
/// lengths[s] tokens: [1, H, N, d], each document's rows its attention within itself
/// (causal or not). Requires varlen_flash_applies.
at::Tensor varlen_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::vector<int64_t>& lengths, bool causal, const functional::AttentionOptions& config);

}  // namespace torchattn::backends
