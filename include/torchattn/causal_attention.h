#pragma once

#include <torchattn/attention_options.h>
#include <torchattn/backend.h>
#include <torchattn/checkpoint_facts.h>
#include <torchattn/kv_cache.h>
#include <torchattn/linear.h>
#include <torchattn/rope.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_module_holder.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace torchattn {

namespace block {
class RotaryCache;
}  // namespace block
namespace modules {
struct HeldAttention;
}  // namespace modules

/// Options for `CausalAttention` (notebooks 000, 001, 003).
///
///   torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(3, 2, 6).dropout(0.1));
struct CausalAttentionOptions {
  CausalAttentionOptions(int64_t d_in, int64_t d_out, int64_t context_length)
      : d_in_(d_in), d_out_(d_out), context_length_(context_length) {}

  /// Features per input token.
  TORCH_ARG(int64_t, d_in);
  /// Features per output token.
  TORCH_ARG(int64_t, d_out);
  /// Most tokens a sequence may have; the size of the `mask` buffer and of the RoPE
  /// tables, and the largest KV cache (make_kv_cache's default).
  TORCH_ARG(int64_t, context_length);
  /// Dropout on the attention weights in training mode, in [0, 1). Default: 0.0.
  TORCH_ARG(double, dropout) = 0.0;
  /// Bias in W_query, W_key and W_value. Default: false.
  TORCH_ARG(bool, qkv_bias) = false;
  /// true (default): token t sees tokens 0..t. false: every token sees every token;
  /// no `mask` buffer is registered. Key padding masks apply either way.
  TORCH_ARG(bool, causal) = true;
  /// A sliding window: the query at position i sees keys j with i - window < j <= i.
  /// Needs causal(true). Default: unset, every earlier key.
  TORCH_ARG(std::optional<int64_t>, window) = std::nullopt;
  /// Rotary position embeddings of queries and keys (d_out is one head), as
  /// MultiHeadAttentionOptions::rope. Default: unset, no rotation (the notebooks).
  TORCH_ARG(std::optional<RoPEOptions>, rope) = std::nullopt;
  /// Multiplies the scores (> 0). Default: unset, meaning divide by sqrt(d_out);
  /// `.scale(1.0)` is notebook 000's unscaled attention.
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Which implementation computes attention. Default: Backend::Auto.
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// true (default): the notebooks' buffer `mask` = triu(ones(C, C), 1), C =
  /// context_length, in the state dict. false: no buffer, the same numbers; a
  /// checkpoint's `mask` key loads into it when it holds the causal mask.
  TORCH_ARG(bool, mask_buffer) = true;
};

/// Single-head causal self-attention (notebook 003's `CausalAttention`): token t
/// attends to tokens 0..t only.
///
/// Submodules `W_query`, `W_key`, `W_value` (torchattn::Linear: nn::Linear's names and draws, nn.Linear's numbers),
/// `dropout` (nn::Dropout) and the buffer `mask`, in the notebook's order: same seed, same weights, same state-dict
/// keys. forward may be called from many threads on a module in eval mode; a cache belongs to one thread.
class CausalAttentionImpl : public torch::nn::Cloneable<CausalAttentionImpl>, public CheckpointFacts {
 public:
  explicit CausalAttentionImpl(const CausalAttentionOptions& options);
  /// Mirrors Python's `CausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)`.
  CausalAttentionImpl(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, bool qkv_bias = false)
      : CausalAttentionImpl(CausalAttentionOptions(d_in, d_out, context_length).dropout(dropout).qkv_bias(qkv_bias)) {}

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
  int64_t implied_causal_mask() const override;

  /// x: [B, T, d_in] or [T, d_in] with T <= context_length
  ///   ->  [B, T, d_out] or [T, d_out].
  ///
  /// key_padding_mask: optional bool [B, T] ([1, T]: every sequence; [T] unbatched),
  /// true = a padding key no query sees, as torch.nn.MultiheadAttention's. A floating
  /// mask is an error, and on the CPU so is one that ignores every key of a sequence.
  /// key_bias: optional, the same shapes, of x's dtype, added to the scaled scores (0
  /// keeps, -inf hides). A query with no key to see outputs zeros, never NaN.
  /// See docs/masks.md.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

  /// Documents packed end to end with no padding: x [N, d_in] and cu_seqlens [S + 1],
  /// int32 or int64 on the CPU or x's device, document s being rows cu_seqlens[s] ..
  /// cu_seqlens[s + 1] (0 first, N last, every document at least one token and at most
  /// context_length)  ->  [N, d_out], each document's rows what forward gives for it
  /// alone (causal or not, window and RoPE positions from 0 per document); dropout as
  /// forward on each document alone, one after another, from the same generator. See
  /// MultiHeadAttention::forward_packed.
  at::Tensor forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens);

  /// An empty cache for `batch_size` sequences: [batch_size, capacity, d_out], of the
  /// module's dtype and device; capacity in [1, context_length], 0 (the default) for
  /// context_length. static_shapes: fixed-shape steps for CUDA graphs (see DecodeGraph).
  KVCache make_kv_cache(int64_t batch_size, bool static_shapes = false, int64_t capacity = 0) const;

  /// x_new: [B, T_new, d_in] or [T_new, d_in], the tokens after those in `cache`.
  /// Returns their outputs, [B, T_new, d_out] or [T_new, d_out]: the same rows a
  /// full forward over the whole sequence gives.
  ///
  /// key_padding_mask: optional bool [B, T_new] (or [1, T_new]; [T_new] unbatched),
  /// true = that new token is padding; the cache remembers it, so a left-padded batch
  /// decodes each sequence as it would alone. Rows of padding tokens mean nothing.
  ///
  /// Errors: causal(false), autograd on (use NoGradGuard or InferenceMode), training
  /// mode with dropout > 0 (call eval()), a cache made by another module, or made
  /// under InferenceMode and used outside it.
  at::Tensor forward_cached(const at::Tensor& x_new, KVCache& cache, const at::Tensor& key_padding_mask = {});

  CausalAttentionOptions options;
  Linear W_query{nullptr};
  Linear W_key{nullptr};
  Linear W_value{nullptr};
  torch::nn::Dropout dropout{nullptr};
  /// The `mask` buffer; undefined with mask_buffer(false).
  at::Tensor mask;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})

 private:
  // forward and forward_cached after their checks: x [B, T, d_in] or [T, d_in].
  at::Tensor attend(const at::Tensor& x, const at::Tensor& key_padding_mask, const at::Tensor& key_bias,
                    KVCache* cache);
  // Builds held_ (reset()): the single-head block and attention options every call uses.
  void hold_attention();
  // The held attention options with the settings of options that a call follows
  // (backend, scale, dropout, training), written only where they changed.
  const functional::AttentionOptions& call_options();
  // Identifies this module's caches (a new id at every reset(), so clones differ).
  uint64_t cache_owner_ = 0;
  // The RoPE cos/sin tables per device, or null without rope.
  std::shared_ptr<const block::RotaryCache> rotary_;
  // What every call attends with (modules/held_attention.h), built by reset().
  std::shared_ptr<modules::HeldAttention> held_;
};

TORCH_MODULE(CausalAttention);

}  // namespace torchattn
