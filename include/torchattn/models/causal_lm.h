#pragma once

// A Llama-family decoder (Llama, Qwen2, Qwen3, Mistral; and Gemma 2) built on
// torchattn's MultiHeadAttention: token embeddings, pre-norm layers (RMSNorm ->
// grouped-query attention with RoPE -> residual, RMSNorm -> SwiGLU MLP -> residual), a
// final RMSNorm and an output head (tied to the embeddings or not), with transformers'
// numerics. Gemma 2 (DecoderConfig::gemma_norms): embeddings times sqrt(hidden), norms
// after each sublayer too, GeGLU, softcapped scores and logits.

#include <torchattn/models/config.h>
#include <torchattn/models/rms_norm.h>
#include <torchattn/models/weights.h>

#include <torchattn/torchattn.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchattn::models {

/// How a model's weights start: drawn at random as LibTorch's modules draw them (to
/// train from scratch: the same draws, in the same order, as before this option), or
/// built for loading: nothing drawn and no memory allocated, every weight a
/// placeholder of its shape until a checkpoint replaces it (torchattn::LinearOptions::init).
enum class Init { Random, ForLoading };

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const DecoderConfig& c, int64_t layer, int64_t context_length, Init init = Init::Random);
  /// x: [B, T, hidden] after the tokens in `cache` (null: none) -> [B, T, hidden].
  at::Tensor forward(const at::Tensor& x, torchattn::KVCache* cache, const at::Tensor& key_padding_mask);
  /// x: [N, hidden], documents packed end to end (cu_seqlens as
  /// MultiHeadAttention::forward_packed) -> [N, hidden].
  at::Tensor forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens);
  /// x: [N, hidden], a paged step's tokens (see MultiHeadAttention::forward_paged);
  /// `layer`: this layer's index in the cache -> [N, hidden].
  at::Tensor forward_paged(const at::Tensor& x, torchattn::PagedKVCache& cache, const torchattn::PagedStep& step,
                           int64_t layer);
  /// The MLP alone: x [..., hidden] -> [..., hidden] (no residual).
  at::Tensor mlp(const at::Tensor& x);
  /// See CausalLMImpl::pack_weights.
  void pack_weights(bool on, int64_t min_rows);
  /// See CausalLMImpl::freeze_weights.
  void freeze_weights(torchattn::WeightFormat format);
  /// The same from a saved frozen model's tensors, names under `prefix` (see
  /// CausalLMImpl::load_frozen_state; check_frozen first).
  void freeze_weights(torchattn::WeightFormat format, const std::map<std::string, at::Tensor>& weights,
                      const std::string& prefix);
  /// Checks that `weights` holds this layer's frozen linear weights under `prefix`,
  /// freezing nothing; returns their names (scales included).
  std::vector<std::string> check_frozen(torchattn::WeightFormat format,
                                        const std::map<std::string, at::Tensor>& weights,
                                        const std::string& prefix) const;
  /// Appends the frozen linear weights under `prefix` (see CausalLMImpl::frozen_state).
  void append_frozen(torchattn::NamedTensors& out, const std::string& prefix) const;
  /// The bytes of the frozen copies (0 before freeze_weights).
  int64_t frozen_bytes() const;

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // Gemma 2 only
  torchattn::MultiHeadAttention self_attn{nullptr};
  torchattn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  // attn: the attention's output for x -> the layer's output (residual sums and MLP).
  at::Tensor rest(const at::Tensor& attn, const at::Tensor& x);
  // The gate's activation, in place where `in_place`.
  at::Tensor activate(at::Tensor gate, bool in_place) const;

  bool gelu_tanh_ = false;
};
TORCH_MODULE(DecoderLayer);

class CausalLMImpl : public torch::nn::Module {
 public:
  /// context_length: the most tokens a sequence may have here (prompt and new tokens;
  /// at most the config's max_position_embeddings): the KV caches' size.
  CausalLMImpl(const DecoderConfig& config, int64_t context_length);
  /// The same for frozen weights to come (load_frozen_state in `frozen`, bfloat16 or
  /// int8): built for loading (Init::ForLoading), so that building the model holds no
  /// float32 weights at all.
  CausalLMImpl(const DecoderConfig& config, int64_t context_length, torchattn::WeightFormat frozen);
  /// With `init`: Init::ForLoading draws no random numbers and allocates no weights
  /// (load_hf_weights or load_frozen_state then binds the checkpoint's own tensors;
  /// a forward before is an error); Init::Random is the two-argument constructor.
  CausalLMImpl(const DecoderConfig& config, int64_t context_length, Init init);

  /// on: on the CPU in float32 without gradients, every linear layer runs on a
  /// oneDNN-packed copy of its weights (torchattn::PackedLinear; the attention's three
  /// projections as one product, gate_proj and up_proj as one): faster for prefills
  /// and batched decoding, for a second copy of the weights in memory (made at the
  /// next forward; off drops it). Calls of fewer than min_rows rows keep
  /// functional::linear's matrix-vector kernel, faster for a single sequence's
  /// decoding step (min_rows 2, the default); the output head is packed for any rows.
  /// min_rows 1 sends every call to the packed products, so that each token's products
  /// are the same whatever else shares its call, and through forward_paged (the
  /// serving engine's setting; its attention is torchattn's CPU kernel) its logits too;
  /// forward's attention is ATen's, batch-invariant on some CPUs only.
  /// Off by default: the layers' own products.
  void pack_weights(bool on, int64_t min_rows = 2);
  bool packs_weights() const { return pack_.on; }

  /// For CPU inference in less memory: every linear layer (attention, MLP, the output
  /// head; a tied head's embedding table too) keeps its weights in `format` (bfloat16
  /// or int8, torchattn::WeightFormat) and their float32 copies are freed. Afterwards
  /// the model only infers: a forward with a gradient to compute is an error, and so
  /// are loading weights and saving. Needs a float32 model on the CPU.
  void freeze_weights(torchattn::WeightFormat format);
  /// A frozen model's weights as one file's tensors, under this module's parameter
  /// names: every linear layer's frozen copy as kept (bfloat16 [out, in], or int8 [out,
  /// in] with "<name>_scale" float32 [out, groups of 64 inputs]; a tied head's under
  /// "embed_tokens.weight") and every other parameter (norms, biases, an untied
  /// embedding table) in float32. LanguageModel::save_pretrained writes it.
  torchattn::NamedTensors frozen_state() const;
  /// freeze_weights(format) from frozen_state's tensors instead of float32 weights:
  /// loads the float32 parameters and keeps the frozen copies as they come, nothing
  /// rounded again (a float32 model on the CPU, as built, not yet frozen). Strict and
  /// checked before anything changes: a missing, extra, misshapen or mistyped tensor,
  /// or a scale that int8 quantization cannot make, is an error naming it.
  /// Each layer's tensors are let go as soon as it is frozen (a file's mapped pages
  /// then go back: peak memory of about one copy of the weights).
  void load_frozen_state(torchattn::NamedTensors tensors, torchattn::WeightFormat format);
  /// Each layer's q, k and v projections into one storage, and its MLP's gate and up
  /// into another (torchattn::place_together: values, shapes and parameters kept), so
  /// that decoding on a GPU computes each group as one product. A move to a GPU does it;
  /// on the CPU, where the products' own kernels run, it changes nothing but the
  /// memory's layout. The old storages go: call it before capturing a DecodeGraph over
  /// the model, not while another thread runs it. Needs weights of its own.
  void place_projections_together();
  /// torch::nn::Module's moves; a frozen model (weight_format() not Float32) stays on
  /// the CPU in float32, its formats' only home: a move elsewhere is an error that
  /// changes nothing (it used to be taken, and the next call failed inside a kernel).
  /// On a GPU afterwards, place_projections_together.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  /// Bytes the weights take: the parameters' own memory (freed ones: none) and the
  /// frozen copies of freeze_weights.
  int64_t weight_bytes() const;
  /// The format freeze_weights kept (the decoder layers'), Float32 before it. An Int4
  /// model keeps its output head (a tied embedding table too) in Int8, as llama.cpp's
  /// four-bit files keep theirs in 6 or 8 bits: SmolLM2-135M's perplexity loses 4.6%
  /// with an int4 head, docs/models.md.
  torchattn::WeightFormat weight_format() const;
  int64_t pack_min_rows() const { return pack_.min_rows; }

  /// The rules from a Hugging Face checkpoint's names to this module's
  /// ("model.layers.0.self_attn.q_proj.weight" -> "layers.0.self_attn.W_query.weight"),
  /// for load_weights. A tied head's saved copy and rotary tables are ignored.
  WeightsOptions hf_weights() const;

  /// Loads a Hugging Face checkpoint (a .safetensors file, a sharded index, or a
  /// folder holding either) with hf_weights(): strict, see load_weights.
  void load_hf_weights(const std::string& path);
  /// The same from tensors in memory under a Hugging Face checkpoint's names (a GGUF
  /// file's: gguf_hf_tensors); `source` names them in errors.
  void load_hf_tensors(const torchattn::NamedTensors& tensors, const std::string& source);

  /// One KV cache per layer for `batch` sequences (each layer's make_kv_cache) of
  /// `capacity` tokens (0: context_length).
  std::vector<torchattn::KVCache> make_kv_caches(int64_t batch, bool static_shapes = false, int64_t capacity = 0) const;

  /// One paged cache for every layer (layer i is layers[i]'s), num_blocks blocks of
  /// block_size tokens: see torchattn::PagedKVCache.
  torchattn::PagedKVCache make_paged_kv_cache(const torchattn::PagedKVCacheOptions& options) const;

  /// ids: [N] int64, the new tokens of a paged step's sequences packed one after
  /// another (step from cache.begin_step). Returns the logits [R, vocab] of the rows
  /// `logit_rows` ([R] int64 indices into the N tokens, such as each sequence's last
  /// new token), or of all N rows when it is undefined; in the model's dtype. Each
  /// sequence's logits equal what forward with its own contiguous caches gives it.
  at::Tensor forward_paged(const at::Tensor& ids, torchattn::PagedKVCache& cache, const torchattn::PagedStep& step,
                           const at::Tensor& logit_rows = {});

  /// Documents packed end to end with no padding (padding-free training): ids [N]
  /// int64 and cu_seqlens [S + 1] int32 or int64 (CPU or the model's device; document s
  /// is ids cu_seqlens[s] .. cu_seqlens[s + 1], 0 first, N last, every document at least
  /// one token and at most context_length). Returns logits [N, vocab], each document's
  /// rows what forward gives it alone (positions from 0 in each document), as
  /// transformers' padding-free form (position_ids restarting per document, no
  /// attention mask) gives them.
  at::Tensor forward_packed(const at::Tensor& ids, const at::Tensor& cu_seqlens);

  /// ids: [B, T] int64 after the tokens in `caches` (null: a full forward).
  /// key_padding_mask: [B, T] bool (true = padding) or undefined.
  /// Returns logits [B, T, vocab] (last_only: [B, 1, vocab]), in the model's dtype.
  at::Tensor forward(const at::Tensor& ids, std::vector<torchattn::KVCache>* caches = nullptr,
                     const at::Tensor& key_padding_mask = {}, bool last_only = false);

  const DecoderConfig& config() const { return config_; }
  int64_t context_length() const { return context_length_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torchattn::Linear lm_head{nullptr};  // null when tied to embed_tokens

 private:
  // The output head over final hidden states [..., hidden] -> logits.
  at::Tensor head(const at::Tensor& x);
  // ids -> the embeddings the first layer takes (Gemma 2: scaled).
  at::Tensor embed(const at::Tensor& ids);
  // place_projections_together where a move left float32-format weights off the CPU.
  void placed_after_move();

  // The output head: lm_head, or (tied) a Linear of its own over embed_tokens' table.
  torchattn::Linear output_head() const { return lm_head ? lm_head : tied_head_; }

  DecoderConfig config_;
  int64_t context_length_;
  torchattn::Linear tied_head_{nullptr};  // not a submodule: its weight is embed_tokens'
  torchattn::PackPolicy pack_{.on = false, .min_rows = 2};
};
TORCH_MODULE(CausalLM);

/// The next-token loss of packed documents: the mean cross entropy of logits [N, vocab]
/// (forward_packed's) against ids [N] over the pairs (i, i + 1) inside one document
/// (cu_seqlens as forward_packed; a document's last token predicts nothing), as
/// transformers' loss with labels -100 at each document's first token. Needs at least
/// one document of two tokens or more; ids int64 or int32, in [0, vocab) (checked on
/// the CPU).
at::Tensor packed_next_token_loss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& cu_seqlens);

}  // namespace torchattn::models
