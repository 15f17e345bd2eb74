#pragma once

#include <torchattn/backend.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_module_holder.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <optional>

namespace torchattn {

/// Options for `SelfAttentionV2`, notebook 001's self-attention over all tokens.
///
///   torchattn::SelfAttentionV2 sa(torchattn::SelfAttentionV2Options(3, 2).qkv_bias(false));
struct SelfAttentionV2Options {
  SelfAttentionV2Options(int64_t d_in, int64_t d_out) : d_in_(d_in), d_out_(d_out) {}

  /// Features per input token.
  TORCH_ARG(int64_t, d_in);
  /// Features per output token (and of queries, keys and values).
  TORCH_ARG(int64_t, d_out);
  /// Bias in W_query, W_key and W_value. Default: false.
  TORCH_ARG(bool, qkv_bias) = false;
  /// Multiplies the scores (> 0). Default: unset, meaning 1/sqrt(d_out) with the square root
  /// taken in float32, as the notebook's `torch.sqrt(torch.tensor(d_out))` does (this
  /// matters only for float64 inputs).
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Which implementation computes attention. Default: Backend::Auto.
  TORCH_ARG(Backend, backend) = Backend::Auto;
};

/// Self-attention without a mask (notebook 001's `SelfAttentionV2`):
/// softmax(W_query(x) W_key(x)^T / sqrt(d_out)) W_value(x).
///
/// Submodules `W_query`, `W_key`, `W_value` (nn::Linear, created in that order), so
/// `torch::manual_seed(s)` before construction gives the Python weights.
class SelfAttentionV2Impl : public torch::nn::Cloneable<SelfAttentionV2Impl> {
 public:
  explicit SelfAttentionV2Impl(const SelfAttentionV2Options& options);
  /// Mirrors Python's `SelfAttentionV2(d_in, d_out, qkv_bias=False)`.
  SelfAttentionV2Impl(int64_t d_in, int64_t d_out, bool qkv_bias = false)
      : SelfAttentionV2Impl(SelfAttentionV2Options(d_in, d_out).qkv_bias(qkv_bias)) {}

  /// Builds the layers and buffers from `options`: the constructor calls it, and clone()
  /// on a fresh copy. On a built module it is an error saying so (construct another
  /// module for new weights).
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// Saves the parameters and buffers as LibTorch does, and the options that change
  /// the numbers without changing a tensor's shape (see `load`).
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Loads a checkpoint strictly: a missing key, an extra key, a shape, dtype or
  /// rank that differs, or a saved option that differs from this module's (such as
  /// num_heads or scale) is a c10::Error naming the key with its path in the saved
  /// model, and the module is left unchanged. (LibTorch's default silently replaces
  /// tensors of other shapes.) Checkpoints without options load as before.
  void load(torch::serialize::InputArchive& archive) override;

  /// x: [B, T, d_in] or [T, d_in]  ->  [B, T, d_out] or [T, d_out].
  ///
  /// key_padding_mask: optional bool [B, T] (or [1, T], the same for every sequence;
  /// [T] for an unbatched x); true marks a padding key that no query attends to, as
  /// torch.nn.MultiheadAttention's key_padding_mask. (at::scaled_dot_product_attention's
  /// bool attn_mask means the opposite, true = attend.) A floating mask is an error.
  /// On the CPU, a mask that ignores every key of a sequence is an error too.
  /// key_bias: optional, the same shapes, of x's dtype: added to the scaled scores of
  /// each key (0 keeps, -inf hides, other values weigh it).
  /// A query left with no key to see (every key it may see ignored or -inf) outputs
  /// a row of zeros, never NaN. Both masks are empty by default, so the module works
  /// in Sequential and AnyModule with one argument.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

  SelfAttentionV2Options options;
  torch::nn::Linear W_query{nullptr};
  torch::nn::Linear W_key{nullptr};
  torch::nn::Linear W_value{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})
};

TORCH_MODULE(SelfAttentionV2);

}  // namespace torchattn
