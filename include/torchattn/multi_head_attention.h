#pragma once

#include <torchattn/attention_options.h>
#include <torchattn/backend.h>
#include <torchattn/checkpoint_facts.h>
#include <torchattn/cross_kv.h>
#include <torchattn/kv_cache.h>
#include <torchattn/linear.h>
#include <torchattn/packed_linear.h>
#include <torchattn/paged_kv_cache.h>
#include <torchattn/qk_norm.h>
#include <torchattn/rms_norm.h>
#include <torchattn/rope.h>
#include <torchattn/safetensors.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_module_holder.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace torchattn {

namespace block {
class RotaryCache;
}  // namespace block
namespace modules {
struct HeldAttention;
}  // namespace modules

/// Options for `MultiHeadAttention` (notebook 003) and the attention of today's models
/// (see docs/modules.md):
///
///   // Llama-style: grouped-query heads, rotary positions, no biases, no mask buffer.
///   torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(576, 576, 8192, 9)
///       .num_kv_heads(3).rope(torchattn::RoPEOptions(100000.0)).out_bias(false).mask_buffer(false));
struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(int64_t d_in, int64_t d_out, int64_t context_length, int64_t num_heads)
      : d_in_(d_in), d_out_(d_out), context_length_(context_length), num_heads_(num_heads) {}

  /// Features per input token.
  TORCH_ARG(int64_t, d_in);
  /// Features per output token; a multiple of num_heads unless head_dim is set.
  TORCH_ARG(int64_t, d_out);
  /// Most tokens a sequence may have; the size of the `mask` buffer and of the RoPE
  /// tables, and the largest KV cache (make_kv_cache's default).
  TORCH_ARG(int64_t, context_length);
  /// Query heads; each sees head_dim features (d_out / num_heads unless set).
  TORCH_ARG(int64_t, num_heads);
  /// Features per head, apart from d_out (as Qwen3): W_query gives num_heads * head_dim
  /// features, W_key and W_value num_kv_heads * head_dim, out_proj maps them back to
  /// d_out. >= 1. Default: unset, d_out / num_heads.
  TORCH_ARG(std::optional<int64_t>, head_dim) = std::nullopt;
  /// Key/value heads (grouped-query attention, as Llama; 1 is multi-query), each shared
  /// by num_heads / num_kv_heads query heads; a KV cache holds this many.
  /// A divisor of num_heads. Default: unset, num_heads.
  TORCH_ARG(std::optional<int64_t>, num_kv_heads) = std::nullopt;
  /// Dropout on the attention weights in training mode, in [0, 1). Default: 0.0.
  TORCH_ARG(double, dropout) = 0.0;
  /// Bias in W_query, W_key and W_value. Default: false.
  TORCH_ARG(bool, qkv_bias) = false;
  /// Bias in out_proj. Default: true, the notebooks' (Llama's o_proj has none).
  TORCH_ARG(bool, out_bias) = true;
  /// true (default): query i sees keys 0..i. false: every query sees every key (an
  /// encoder, as BERT); no `mask` buffer is registered. Key padding masks apply either way.
  TORCH_ARG(bool, causal) = true;
  /// A sliding window, as Mistral's: the query at position i sees keys j with
  /// i - window < j <= i. Needs causal(true). Default: unset, every earlier key.
  TORCH_ARG(std::optional<int64_t>, window) = std::nullopt;
  /// Rotary position embeddings of queries and keys, after the projections. Positions
  /// count from 0, continue from the cache, and count each sequence's real tokens
  /// only. Default: unset, no rotation (the notebooks).
  TORCH_ARG(std::optional<RoPEOptions>, rope) = std::nullopt;
  /// An RMSNorm of the queries and of the keys after the projections, before RoPE (as
  /// Qwen3): submodules `q_norm` and `k_norm`. Default: unset, none (the notebooks).
  TORCH_ARG(std::optional<QKNormOptions>, qk_norm) = std::nullopt;
  /// Logit softcapping (> 0, as Gemma 2): the scaled scores become
  /// softcap * tanh(scores / softcap) before the masks. Default: unset, none.
  TORCH_ARG(std::optional<double>, softcap) = std::nullopt;
  /// Attention sinks (as gpt-oss): a parameter `sinks` of num_heads logits (zeros at
  /// first) in each row's softmax denominator, so a query may give its keys less than
  /// all of its weight. Default: false.
  TORCH_ARG(bool, sinks) = false;
  /// ALiBi (as BLOOM): no position embeddings; each head adds slope * (key position -
  /// query position) to its scaled scores, positions counting real tokens only.
  /// Needs causal(true); not with rope. Default: false.
  TORCH_ARG(bool, alibi) = false;
  /// A flex_attention variant (torchattn::flex_variant, flex_attention.h, made in the
  /// caller's translation unit): the user's own score_mod and mask_mod in place of the
  /// attention's scores and masks, in forward, forward_cached (decoding passes each
  /// query's position as q_idx) and forward_packed (each document alone, from 0). With
  /// causal(true) the causal mask applies too, and window, softcap and alibi compose
  /// with the mods (the window hides keys as the causal mask does; score_mod sees the
  /// score after the softcap and ALiBi's distance). Not with sinks, key padding masks,
  /// static-shape caches, forward_paged, ALiBi in forward_packed or dropout in training
  /// (write them into the mods). Default: empty, none.
  TORCH_ARG(FlexVariant, flex) = {};
  /// Cross-attention (forward_cross): the features of the context that W_key and
  /// W_value read, as torch.nn.MultiheadAttention's kdim and vdim. Unset: d_in.
  /// forward, forward_cached and forward_paged need both equal to d_in.
  TORCH_ARG(std::optional<int64_t>, kdim) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, vdim) = std::nullopt;
  /// Multiplies the scores (> 0). Default: unset, meaning divide by sqrt(head_dim).
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Which implementation computes attention. Default: Backend::Auto.
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// true (default): the notebooks' buffer `mask` = triu(ones(C, C), 1), C =
  /// context_length, in the state dict. false: no buffer, the same numbers; a
  /// checkpoint's `mask` key loads into it when it holds the causal mask.
  TORCH_ARG(bool, mask_buffer) = true;
  /// true (default): the projections' weights drawn as nn::Linear draws them. false:
  /// built for loading: nothing drawn and no memory allocated, each weight a placeholder
  /// for a checkpoint to replace (LinearOptions::init); a forward before is an error.
  TORCH_ARG(bool, init) = true;
  /// CPU inference of the four projections (no gradient, float32): which calls run on an
  /// inference copy of their weights and in which format (LinearInference, the linear
  /// layer's own: pack, format, int8_inputs), equal within the format's rounding. May be
  /// changed on a built module (`mha->options.projections().pack.on = true`). Default:
  /// no copy. See docs/modules.md.
  TORCH_ARG(LinearInference, projections) = {};
};

/// Multi-head causal self-attention (notebook 003's `MultiHeadAttention`).
///
/// Submodules `W_query`, `W_key`, `W_value`, `out_proj` (torchattn::Linear: nn::Linear's
/// names and draws, nn.Linear's numbers, and each its own weight format), `dropout` (nn::Dropout)
/// and the buffer `mask` (causal, mask_buffer(true)), in the notebook's order: same
/// seed, same weights, same state-dict keys. forward may be called from
/// many threads on a module in eval mode; a cache belongs to one thread.
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl>, public CheckpointFacts {
 public:
  explicit MultiHeadAttentionImpl(MultiHeadAttentionOptions options);
  /// Mirrors Python's
  /// `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`.
  MultiHeadAttentionImpl(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, int64_t num_heads,
                         bool qkv_bias = false)
      : MultiHeadAttentionImpl(
            MultiHeadAttentionOptions(d_in, d_out, context_length, num_heads).dropout(dropout).qkv_bias(qkv_bias)) {}

  /// Builds the layers and buffers from `options` (the constructor and clone() call it).
  /// On a built module it is an error: construct another module for new weights.
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// Saves the parameters, buffers and the options that `load` checks.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// torch::nn::Module's moves. Off the CPU afterwards, W_query, W_key and W_value lie
  /// end to end in one storage (torchattn::place_together: the same parameters and
  /// values), so that decoding computes them as one product; not once frozen, nor
  /// with kdim or vdim other than d_in.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  /// Loads strictly: a missing or extra key, a differing shape, dtype or rank, or a
  /// saved option that differs (such as num_heads) is a c10::Error naming the key, and
  /// the module is left unchanged. See docs/checkpoints.md.
  void load(torch::serialize::InputArchive& archive) override;

  /// For inference only, in less memory: packs the projections now in
  /// options.projections().format (bfloat16 or int8; packing turns on) and frees the
  /// float32 weights of W_query, W_key, W_value and out_proj (each keeps its shape as
  /// a stride-0 view of one zero). Afterwards a forward with a gradient to compute,
  /// cross-attention, save and load are errors. Needs kdim and vdim equal to d_in.
  void freeze_weights();
  /// freeze_weights from weights already in options.projections().format (a saved frozen
  /// module: frozen_state's tensors, looked up as prefix + their names in `weights`)
  /// instead of rounding the float32 ones; the biases are the module's own. A missing,
  /// misshapen or mistyped tensor, or a bad scale, is an error naming it.
  void freeze_weights(const std::map<std::string, at::Tensor>& weights, const std::string& prefix = "");
  /// The frozen copies as kept, under the parameters' names: "W_query.weight",
  /// "W_key.weight", "W_value.weight", "out_proj.weight" in weight_format (int8 [out,
  /// in] with "<name>_scale" float32 [out, groups of 64 inputs] beside each). What a
  /// saved frozen model holds in place of the float32 weights. Needs freeze_weights.
  NamedTensors frozen_state() const;
  /// Bytes of the packed copies (options.projections(), freeze_weights); 0 while none is made.
  int64_t packed_bytes() const;
  /// Whether freeze_weights ran.
  bool frozen() const { return !W_query.is_empty() && W_query->frozen(); }

  /// What checkpoints record and check beside the tensors (CheckpointFacts).
  CheckpointOptions checkpoint_options() const override;
  int64_t implied_causal_mask() const override;
  std::string shape_hint(const std::string& key) const override;

  /// x: [B, T, d_in] or [T, d_in] with T <= context_length
  ///   ->  [B, T, d_out] or [T, d_out].
  ///
  /// key_padding_mask: optional bool [B, T] ([1, T]: every sequence; [T] unbatched),
  /// true = a padding key no query sees, as torch.nn.MultiheadAttention's. A floating
  /// mask is an error, and on the CPU so is one that ignores every key of a sequence.
  /// key_bias: optional, the same shapes, of x's dtype, added to the scaled scores (0
  /// keeps, -inf hides). A query with no key to see outputs out_proj's bias, never NaN.
  /// See docs/masks.md.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

  /// Documents packed end to end with no padding (padding-free training, FlashAttention's
  /// varlen form): x [N, d_in] and cu_seqlens [S + 1], int32 or int64 on the CPU or x's
  /// device, document s being rows cu_seqlens[s] .. cu_seqlens[s + 1] (0 first, N last,
  /// every document at least one token and at most context_length)
  ///   ->  [N, d_out], each document's rows what forward gives for it alone: causal or not
  /// as the module, RoPE and ALiBi positions from 0 in each document, the window, grouped
  /// heads, softcap, sinks and QK-norm as for the document alone. With dropout, the masks
  /// are those of forward on each document alone, one after another, from the same
  /// generator. The work grows with the sum of the documents' squared lengths and no
  /// [N, N] mask is made. cu_seqlens is read on the host (a device tensor is copied).
  at::Tensor forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens);

  /// Cross-attention (a decoder over its encoder's output, as BART's): queries from x,
  /// keys and values from a context, every query seeing every real context token.
  /// Needs causal(false); not with rope.
  ///
  /// cross_kv: context [B, S, kdim] (or [S, kdim]) -> its keys and values, computed
  /// once for all the decoding steps (see CrossKV). context_padding_mask: optional
  /// bool [B, S] ([S] unbatched), true = padding, at least one real token per
  /// sequence. value_context: optional [B, S, vdim] for W_value; undefined: the context.
  CrossKV cross_kv(const at::Tensor& context, const at::Tensor& context_padding_mask = {},
                   const at::Tensor& value_context = {});
  /// x: [B, T, d_in] (or [T, d_in] with an unbatched kv) -> [B, T, d_out], each row
  /// attending over the whole context. Gradients flow to x, the weights and, through
  /// kv, the context.
  at::Tensor forward_cross(const at::Tensor& x, const CrossKV& kv);
  /// forward_cross(x, cross_kv(context, context_padding_mask)).
  at::Tensor forward_cross(const at::Tensor& x, const at::Tensor& context, const at::Tensor& context_padding_mask = {});

  /// An empty cache for `batch_size` sequences:
  /// [batch_size, num_kv_heads, capacity, head_dim], of the module's dtype and device;
  /// capacity in [1, context_length], 0 (the default) for context_length: the tokens
  /// it holds at most, so that a short generation holds a short cache.
  /// static_shapes: fixed-shape steps for CUDA graphs (see DecodeGraph).
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

  /// This layer's entry in a PagedKVCache: num_kv_heads, head_dim, dtype, device, owner.
  PagedLayer paged_layer() const;

  /// A paged cache for this module alone; a model makes one from its layers' paged_layer()s.
  PagedKVCache make_paged_kv_cache(const PagedKVCacheOptions& options) const;

  /// x: [N, d_in], the new tokens of the step's sequences packed one after another
  /// (step from cache.begin_step: step.query_start says whose rows are whose).
  /// Returns [N, d_out]: each sequence's rows equal forward_cached's for it alone.
  /// `layer`: which of the cache's layers is this module's. See docs/serving.md.
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
  Linear W_query{nullptr};
  Linear W_key{nullptr};
  Linear W_value{nullptr};
  Linear out_proj{nullptr};
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
  // Builds held_ (reset()): the blocks and attention options every call uses.
  void hold_attention();
  // The held attention options with the settings of options that a call follows
  // (backend, scale, dropout, softcap, training; inference: no dropout), written only
  // where they changed.
  const functional::AttentionOptions& call_options(bool inference);
  // Each projection's inference settings follow options.projections(), not once frozen
  // (given to the Linears only where they changed).
  void sync_linears();
  // Refuses `what` (save, load, cross-attention) once frozen.
  void check_not_frozen(const char* what) const;
  // After a move: q, k and v placed together off the CPU (see to()).
  void place_projections();
  // Identifies this module's caches (a new id at every reset(), so clones differ).
  uint64_t cache_owner_ = 0;
  // The RoPE cos/sin tables per device, or null without rope.
  std::shared_ptr<const block::RotaryCache> rotary_;
  // With alibi: the [num_heads] slopes, float32 on the CPU.
  at::Tensor alibi_slopes_;
  // What every call attends with (modules/held_attention.h), built by reset().
  std::shared_ptr<modules::HeldAttention> held_;
};

TORCH_MODULE(MultiHeadAttention);

}  // namespace torchattn
