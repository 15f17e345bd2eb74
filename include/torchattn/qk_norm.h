#pragma once

// QK-norm (MultiHeadAttentionOptions::qk_norm): an RMSNorm of the queries and of the
// keys after their projections, before RoPE.

#include <torch/arg.h>

namespace torchattn {

///   MultiHeadAttentionOptions(1024, 1024, 40960, 16).head_dim(128).qk_norm(QKNormOptions())  // Qwen3
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
