#pragma once

#include <torchattn/backend.h>
#include <torchattn/checkpoint_facts.h>
#include <torchattn/linear.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_module_holder.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace torchattn {

namespace modules {
struct HeldAttention;
}  // namespace modules

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
  /// Multiplies the scores (> 0). Default: unset, meaning 1/sqrt(d_out) (the root taken
  /// in float32, as the notebook's; see docs/modules.md).
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Which implementation computes attention. Default: Backend::Auto.
  TORCH_ARG(Backend, backend) = Backend::Auto;
};

/// Self-attention without a mask (notebook 001's `SelfAttentionV2`):
/// softmax(W_query(x) W_key(x)^T / sqrt(d_out)) W_value(x).
///
/// Submodules `W_query`, `W_key`, `W_value` (torchattn::Linear: nn::Linear's names and draws, nn.Linear's numbers;
/// created in that order), so `torch::manual_seed(s)` before construction gives the Python weights. forward may be
/// called from many threads on a module in eval mode.
class SelfAttentionV2Impl : public torch::nn::Cloneable<SelfAttentionV2Impl>, public CheckpointFacts {
 public:
  explicit SelfAttentionV2Impl(const SelfAttentionV2Options& options);
  /// Mirrors Python's `SelfAttentionV2(d_in, d_out, qkv_bias=False)`.
  SelfAttentionV2Impl(int64_t d_in, int64_t d_out, bool qkv_bias = false)
      : SelfAttentionV2Impl(SelfAttentionV2Options(d_in, d_out).qkv_bias(qkv_bias)) {}

  /// Builds the layers and buffers from `options` (the constructor and clone() call it).
  /// On a built module it is an error: construct another module for new weights.
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// Saves the parameters, buffers and the options that `load` checks.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Loads strictly: a missing or extra key, a differing shape, dtype or rank, or a
  /// saved option that differs (such as scale) is a c10::Error naming the key, and
  /// the module is left unchanged. See docs/checkpoints.md.
  void load(torch::serialize::InputArchive& archive) override;

  /// What checkpoints record and check beside the tensors (CheckpointFacts).
  CheckpointOptions checkpoint_options() const override;

  /// x: [B, T, d_in] or [T, d_in]  ->  [B, T, d_out] or [T, d_out].
  ///
  /// key_padding_mask: optional bool [B, T] ([1, T]: every sequence; [T] unbatched),
  /// true = a padding key no query sees, as torch.nn.MultiheadAttention's. A floating
  /// mask is an error, and on the CPU so is one that ignores every key of a sequence.
  /// key_bias: optional, the same shapes, of x's dtype, added to the scaled scores (0
  /// keeps, -inf hides). A query with no key to see outputs zeros, never NaN.
  /// See docs/masks.md.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

  SelfAttentionV2Options options;
  Linear W_query{nullptr};
  Linear W_key{nullptr};
  Linear W_value{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})

 private:
  // What every call attends with (modules/held_attention.h), built by reset().
  std::shared_ptr<modules::HeldAttention> held_;
};

TORCH_MODULE(SelfAttentionV2);

}  // namespace torchattn
