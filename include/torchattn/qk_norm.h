#pragma once

// QK-norm: an RMSNorm of the queries and of the keys after their projections, before
// RoPE and the scores (Qwen3, OLMo 2). MultiHeadAttentionOptions::qk_norm takes it.

#include <torch/arg.h>

namespace torchattn {

///   MultiHeadAttentionOptions(1024, 1024, 40960, 16).num_kv_heads(8).head_dim(128)
///       .qk_norm(QKNormOptions().eps(1e-6))            // Qwen3: each head's features
///   QKNormOptions().per_head(false)                    // OLMo 2: all the heads' features at once
struct QKNormOptions {
  /// The norms' epsilon (> 0): x / sqrt(mean(x^2) + eps). Default: 1e-6.
  TORCH_ARG(double, eps) = 1e-6;
  /// true (Qwen3): over each head's head_dim features, `q_norm.weight` and
  /// `k_norm.weight` of head_dim shared by the heads. false (OLMo 2): over all the
  /// heads' features of a token, `q_norm.weight` of num_heads * head_dim and
  /// `k_norm.weight` of num_kv_heads * head_dim. Default: true.
  TORCH_ARG(bool, per_head) = true;
};

}  // namespace torchattn
