#pragma once

#include <torchattn/backend.h>
#include <torchattn/cross_kv.h>
#include <torchattn/kv_cache.h>
#include <torchattn/paged_kv_cache.h>
#include <torchattn/qk_norm.h>
#include <torchattn/rms_norm.h>
#include <torchattn/rope.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_module_holder.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace torchattn {

class PackedLinear;

namespace detail {
class RotaryCache;
}

/// Options for `MultiHeadAttention` (notebook 003), and the attention of today's
/// models on top of it:
///
///   torchattn::MultiHeadAttention mha(
///       torchattn::MultiHeadAttentionOptions(768, 768, 1024, 12).dropout(0.1));
///   // Llama-style: grouped-query heads, rotary positions, no biases.
///   torchattn::MultiHeadAttentionOptions(576, 576, 8192, 9)
///       .num_kv_heads(3).rope(torchattn::RoPEOptions(100000.0)).out_bias(false);
///   // BERT-style: every token sees every token.
///   torchattn::MultiHeadAttentionOptions(384, 384, 512, 12).causal(false).qkv_bias(true);
struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(int64_t d_in, int64_t d_out, int64_t context_length, int64_t num_heads)
      : d_in_(d_in), d_out_(d_out), context_length_(context_length), num_heads_(num_heads) {}

  /// Features per input token.
  TORCH_ARG(int64_t, d_in);
  /// Features per output token; a multiple of num_heads unless head_dim is set.
  TORCH_ARG(int64_t, d_out);
  /// Most tokens a sequence may have; the size of the `mask` buffer and of a KV cache.
  TORCH_ARG(int64_t, context_length);
  /// Query heads; each sees head_dim features (d_out / num_heads unless set).
  TORCH_ARG(int64_t, num_heads);
  /// Features per head, apart from d_out (Qwen3: 128 with d_out 1024 and 16 heads;
  /// Gemma 2: 256 with d_out 2304 and 8 heads): W_query gives num_heads * head_dim
  /// features, W_key and W_value num_kv_heads * head_dim, and out_proj maps
  /// num_heads * head_dim back to d_out. >= 1. Default: unset, d_out / num_heads.
  TORCH_ARG(std::optional<int64_t>, head_dim) = std::nullopt;
  /// Key/value heads (grouped-query attention, as Llama, Qwen2, Mistral): each is
  /// shared by num_heads / num_kv_heads query heads, W_key and W_value give
  /// num_kv_heads * head_dim features and a KV cache holds num_kv_heads heads (1 is
  /// multi-query attention). A divisor of num_heads. Default: unset, num_heads.
  TORCH_ARG(std::optional<int64_t>, num_kv_heads) = std::nullopt;
  /// Dropout on the attention weights in training mode, in [0, 1). Default: 0.0.
  TORCH_ARG(double, dropout) = 0.0;
  /// Bias in W_query, W_key and W_value. Default: false.
  TORCH_ARG(bool, qkv_bias) = false;
  /// Bias in out_proj. Default: true, the notebooks' out_proj (Llama's o_proj has none).
  TORCH_ARG(bool, out_bias) = true;
  /// true (default): query i sees keys 0..i. false: every query sees every key (an
  /// encoder, as BERT); no `mask` buffer is registered. Key padding masks apply either way.
  TORCH_ARG(bool, causal) = true;
  /// A sliding window, as Mistral's: the query at position i sees keys j with
  /// i - window < j <= i. Needs causal(true). Default: unset, every earlier key.
  TORCH_ARG(std::optional<int64_t>, window) = std::nullopt;
  /// Rotary position embeddings of queries and keys (after the projections, before
  /// the scores; cached keys are stored rotated). Positions count from 0, continue
  /// from the cache in forward_cached, and in a padded batch count each sequence's
  /// real tokens only. Default: unset, no rotation (the notebooks).
  TORCH_ARG(std::optional<RoPEOptions>, rope) = std::nullopt;
  /// An RMSNorm of the queries and of the keys after the projections, before RoPE
  /// (Qwen3, OLMo 2): submodules `q_norm` and `k_norm` (RMSNorm, weights of ones at
  /// first), named as transformers names them. Default: unset, none (the notebooks).
  TORCH_ARG(std::optional<QKNormOptions>, qk_norm) = std::nullopt;
  /// Gemma 2's logit softcapping (> 0): the scaled scores become softcap *
  /// tanh(scores / softcap) before the masks (Gemma 2: 50). No fused kernel takes it:
  /// attention runs a block of queries at a time (memory grows with T, not T^2; backward
  /// recomputes each block; forward_paged's CPU kernel takes it in place). Default:
  /// unset, none.
  TORCH_ARG(std::optional<double>, softcap) = std::nullopt;
  /// gpt-oss' attention sinks: a parameter `sinks` of num_heads logits (zeros at first),
  /// named as transformers names it, that joins each row's softmax denominator, so a
  /// query may give its keys less than all of its weight. Computed in blocks as softcap.
  /// Default: false.
  TORCH_ARG(bool, sinks) = false;
  /// ALiBi (BLOOM, MPT): no position embeddings; each head adds slope * (key position -
  /// query position) to its scaled scores, the slopes of the ALiBi paper for any head
  /// count (as BLOOM computes them); positions count each sequence's real tokens. The
  /// bias is [B, num_heads, T, keys] per call (a fused kernel takes it as a mask;
  /// forward_paged's CPU kernel adds it in place). Needs causal(true); not with rope.
  /// Default: false.
  TORCH_ARG(bool, alibi) = false;
  /// Cross-attention (forward_cross): the features of the context that W_key and
  /// W_value read, as torch.nn.MultiheadAttention's kdim and vdim (an encoder's width;
  /// Whisper's and BART's decoders: d_model). Unset: d_in. forward, forward_cached
  /// and forward_paged read keys from x, so they need both equal to d_in.
  TORCH_ARG(std::optional<int64_t>, kdim) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, vdim) = std::nullopt;
  /// Multiplies the scores (> 0). Default: unset, meaning divide by sqrt(head_dim).
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Which implementation computes attention. Default: Backend::Auto.
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// true (default): the notebooks' registered buffer `mask` = triu(ones(C, C), 1),
  /// C = context_length, in the state dict as in Python. false: no buffer (module
  /// memory does not grow with context_length); the causal mask comes from token
  /// positions, with the same outputs, gradients and cached decoding. A checkpoint
  /// with a `mask` key loads into it when that key holds the causal mask.
  TORCH_ARG(bool, mask_buffer) = true;
  /// CPU inference: where no gradient is computed and the operands are float32 CPU,
  /// W_query, W_key and W_value run as one product on a oneDNN-packed copy of their
  /// weights, and out_proj on one of its own (see PackedLinear): faster for an
  /// encoder's sentence, a prefill or a batch of decoding steps, for a second copy of
  /// the weights in memory, made at the first such call (and again after the weights
  /// change). Equal within float32 rounding, not bit for bit; each token's row is the
  /// same alone or in any batch. Training, gradients and other dtypes and devices take
  /// the usual path. May be changed on a built module (`mha->options.pack_weights(...)`);
  /// turned off, the copies are dropped at the next forward. Default: false.
  TORCH_ARG(bool, pack_weights) = false;
  /// With pack_weights: the fewest rows (tokens in a call, over the batch) that take
  /// the packed products; fewer take functional::linear, whose matrix-vector kernel is
  /// faster for a single decoding step (2 keeps it there). Default: 1, every call, so
  /// that a token's numbers never depend on how many share its call. >= 1.
  TORCH_ARG(int64_t, pack_min_rows) = 1;
};

/// Multi-head causal self-attention (notebook 003's `MultiHeadAttention`): the
/// projections are split into heads with view/transpose, each head attends
/// causally, the heads are merged and passed through `out_proj`.
///
/// Submodules `W_query`, `W_key`, `W_value`, `out_proj` (nn::Linear), `dropout`
/// (nn::Dropout) and the buffer `mask` = triu(ones(context_length, context_length), 1)
/// (causal, mask_buffer(true)), in the notebook's order: same seed, same weights,
/// same state-dict keys.
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl> {
 public:
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options);
  /// Mirrors Python's
  /// `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`.
  MultiHeadAttentionImpl(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, int64_t num_heads,
                         bool qkv_bias = false)
      : MultiHeadAttentionImpl(
            MultiHeadAttentionOptions(d_in, d_out, context_length, num_heads).dropout(dropout).qkv_bias(qkv_bias)) {}

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

  /// x: [B, T, d_in] or [T, d_in] with T <= context_length
  ///   ->  [B, T, d_out] or [T, d_out].
  ///
  /// key_padding_mask: optional bool [B, T] (or [1, T], the same for every sequence;
  /// [T] for an unbatched x); true marks a padding key that no query attends to, as
  /// torch.nn.MultiheadAttention's key_padding_mask. (at::scaled_dot_product_attention's
  /// bool attn_mask means the opposite, true = attend.) A floating mask is an error.
  /// On the CPU, a mask that ignores every key of a sequence is an error too.
  /// key_bias: optional, the same shapes, of x's dtype: added to the scaled scores of
  /// each key (0 keeps, -inf hides, other values weigh it).
  /// A query left with no key to see (every key it may see ignored or -inf) has a
  /// context row of zeros, so it outputs out_proj's bias; never NaN. Both masks are
  /// empty by default, so the module works in Sequential and AnyModule with one
  /// argument.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

  /// Cross-attention (the decoder of BART, T5 or Whisper over its encoder's output):
  /// the queries from x, the keys and values from a context of its own length and
  /// width (kdim, vdim), every query seeing every real token of the context (no
  /// causal mask, no positions). Needs causal(false); not with rope.
  ///
  /// cross_kv: context [B, S, kdim] (or [S, kdim]) -> its keys and values, computed
  /// once for all the decoding steps (see CrossKV). context_padding_mask: optional
  /// bool [B, S] ([S] unbatched), true = padding, at least one real token per
  /// sequence. value_context: optional [B, S, vdim] for W_value when it differs
  /// from the keys' input (vdim != kdim); undefined: the context.
  CrossKV cross_kv(const at::Tensor& context, const at::Tensor& context_padding_mask = {},
                   const at::Tensor& value_context = {});
  /// x: [B, T, d_in] (or [T, d_in] with an unbatched kv) -> [B, T, d_out], each row
  /// attending over the whole context. Gradients flow to x, the weights and, through
  /// kv, the context.
  at::Tensor forward_cross(const at::Tensor& x, const CrossKV& kv);
  /// forward_cross(x, cross_kv(context, context_padding_mask)).
  at::Tensor forward_cross(const at::Tensor& x, const at::Tensor& context, const at::Tensor& context_padding_mask = {});

  /// An empty cache for `batch_size` sequences:
  /// [batch_size, num_kv_heads, context_length, head_dim], of the module's dtype and device.
  /// static_shapes: a cache whose steps have fixed shapes and no host
  /// synchronisation, for CUDA graphs (see KVCache and DecodeGraph).
  KVCache make_kv_cache(int64_t batch_size, bool static_shapes = false) const;

  /// x_new: [B, T_new, d_in] or [T_new, d_in], the tokens after those in `cache`.
  /// Returns their outputs, [B, T_new, d_out] or [T_new, d_out]: the same rows a
  /// full forward over the whole sequence gives.
  ///
  /// key_padding_mask: optional bool [B, T_new] (or [1, T_new]; [T_new] unbatched),
  /// true = that new token is padding. The cache remembers it: later tokens never
  /// attend to it. A left-padded batch of prompts of different lengths so decodes
  /// together, each sequence as it would alone. (A chunk of a left-padded prompt may
  /// hold only padding, so unlike forward this does not reject a mask that ignores
  /// every key of a sequence: outputs for padding tokens are rows of no meaning.)
  ///
  /// Only for causal modules: with causal(false) (an encoder) every token attends to
  /// later ones too, so chunks cannot give the full forward's rows; it is an error
  /// that says to call forward() on the whole sequence.
  ///
  /// Errors: autograd on (use NoGradGuard or InferenceMode), training mode with
  /// dropout > 0 (call eval()), a cache made by another module, or made under
  /// InferenceMode and used outside it.
  at::Tensor forward_cached(const at::Tensor& x_new, KVCache& cache, const at::Tensor& key_padding_mask = {});

  /// This layer's keys and values in a PagedKVCache: num_kv_heads, head_dim, the
  /// module's dtype and device, and its id (a cache checks whose layer it is).
  PagedLayer paged_layer() const;

  /// A paged cache for this module alone (one layer): see PagedKVCache. A model makes
  /// one cache for all its layers from their paged_layer()s.
  PagedKVCache make_paged_kv_cache(const PagedKVCacheOptions& options) const;

  /// x: [N, d_in], the new tokens of the step's sequences packed one after another
  /// (step from cache.begin_step: step.query_start says whose rows are whose).
  /// Returns [N, d_out]: each sequence's rows are those forward_cached gives it alone
  /// with a contiguous KVCache holding the same tokens (and so those of a full
  /// forward). Every option applies: grouped-query heads, RoPE at each token's position
  /// in its own sequence, windows. `layer`: which of the cache's layers is this
  /// module's.
  ///
  /// Errors: autograd on (use NoGradGuard or InferenceMode), training mode with
  /// dropout > 0, causal(false), a cache layer of another module or shape, a step that
  /// is not the cache's current one or does not match x, a position past
  /// context_length.
  at::Tensor forward_paged(const at::Tensor& x, PagedKVCache& cache, const PagedStep& step, int64_t layer = 0);

  /// options.head_dim(), else d_out / num_heads.
  int64_t head_dim() const { return options.head_dim().value_or(options.d_out() / options.num_heads()); }
  int64_t num_kv_heads() const { return options.num_kv_heads().value_or(options.num_heads()); }

  MultiHeadAttentionOptions options;
  torch::nn::Linear W_query{nullptr};
  torch::nn::Linear W_key{nullptr};
  torch::nn::Linear W_value{nullptr};
  torch::nn::Linear out_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
  /// With sinks: the [num_heads] sink logits (parameter `sinks`); undefined without.
  at::Tensor sinks;
  /// With qk_norm: the queries' and the keys' RMSNorm; null without.
  RMSNorm q_norm{nullptr};
  RMSNorm k_norm{nullptr};
  /// The `mask` buffer; undefined with mask_buffer(false).
  at::Tensor mask;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})

 private:
  // forward, forward_cached and forward_paged: kdim and vdim equal to d_in.
  void check_self_attention(const char* fn) const;
  // cross_kv and forward_cross: causal(false), no rope.
  void check_cross_attention(const char* fn) const;
  // forward and forward_cached after their checks: x [B, T, d_in] or [T, d_in].
  at::Tensor attend(const at::Tensor& x, const at::Tensor& key_padding_mask, const at::Tensor& key_bias,
                    KVCache* cache);
  // Identifies this module's caches (a new id at every reset(), so clones differ).
  uint64_t cache_owner_ = 0;
  // The RoPE cos/sin tables per device, or null without rope.
  std::shared_ptr<const detail::RotaryCache> rotary_;
  // The packed copies of W_query|W_key|W_value and of out_proj (empty until a forward
  // with pack_weights).
  std::shared_ptr<PackedLinear> packed_qkv_;
  std::shared_ptr<PackedLinear> packed_out_;
  // With alibi: the [num_heads] slopes, float32 on the CPU.
  at::Tensor alibi_slopes_;
};

TORCH_MODULE(MultiHeadAttention);

}  // namespace torchattn
