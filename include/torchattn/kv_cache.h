#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace torchattn {

/// Keys and values of the tokens seen so far, for generation one chunk at a time
/// (docs/modules.md, KV caches). Storage is allocated once, [B, H, capacity, head_dim]
/// for MultiHeadAttention and [B, capacity, d_out] for CausalAttention (capacity:
/// make_kv_cache's, at most the module's context_length, by default all of it; the
/// token dimension is always -2):
///
///   torch::NoGradGuard no_grad;
///   auto cache = mha->make_kv_cache(/*batch_size=*/1);
///   auto y = mha->forward_cached(prompt, cache);        // [1, T0, d_out]
///   auto z = mha->forward_cached(next_token, cache);    // [1, 1, d_out]
///   cache.length();                                     // T0 + 1
///   cache.reset();                                      // start a new sequence
///
/// A cache belongs to the module that made it (another module's cache is an error)
/// and to one sequence batch; it is not copyable (clone() is a deep copy). Inference
/// only: forward_cached refuses autograd and training mode with dropout; a cache made
/// under InferenceMode is used under InferenceMode. forward_cached(x_new, cache,
/// key_padding_mask) records which new tokens are padding; later calls keep ignoring
/// them.
///
/// Static shapes (`make_kv_cache(B, /*static_shapes=*/true)`): writes at the
/// device-side position() and attends over all capacity() keys with a mask computed
/// on the device: fixed shapes, no host synchronisation, capturable by DecodeGraph
/// (docs/gpu.md).
class KVCache {
 public:
  KVCache() = default;

  /// shape: the full storage shape, the token dimension (-2) holding `capacity`.
  /// owner: an id of the module whose keys it holds (0: any), checked by that module.
  KVCache(c10::IntArrayRef shape, at::TensorOptions options, bool static_shapes = false, uint64_t owner = 0);

  /// Not copyable (a copy would share the storage): clone(). Moves are cheap.
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  KVCache(KVCache&&) noexcept = default;
  KVCache& operator=(KVCache&&) noexcept = default;

  /// A deep copy: its own storage, padding, position and length, the same owner.
  KVCache clone() const;

  /// Tokens cached so far.
  int64_t length() const { return length_; }
  /// Tokens the cache can hold (make_kv_cache's capacity; by default the module's
  /// context_length).
  int64_t capacity() const;
  int64_t batch_size() const;
  bool defined() const { return keys_.defined(); }
  /// The id of the module that made it (0 for a cache built directly).
  uint64_t owner() const { return owner_; }

  /// Forgets every cached token (and their padding); the storage is kept.
  void reset() { truncate(0); }

  /// Keeps the first `length` tokens (0 <= length <= length()) and forgets the rest.
  void truncate(int64_t length);

  /// True for a static-shape cache (see above).
  bool static_shapes() const { return static_shapes_; }

  /// [1] int64 on the cache's device: the number of cached tokens (the next token's
  /// write index), advanced on the device by every append. length() is its host mirror.
  const at::Tensor& position() const { return position_; }

  /// [B] int64 on the cache's device: each sequence's next position counting its real
  /// tokens only, as transformers' position_ids (for learned position embeddings after
  /// a left-padded prefill). Computed on the device, so it advances in a captured graph.
  at::Tensor token_positions() const;

  /// Cached keys / values: [..., length(), d], views of the storage.
  at::Tensor keys() const;
  at::Tensor values() const;

  /// True once any appended token came with a key padding mask (until reset()).
  bool has_padding() const { return padding_.defined(); }
  /// [B, length()] bool, true = a padding token that no query attends to;
  /// undefined when has_padding() is false.
  at::Tensor padding() const;
  /// [B, capacity] bool over the whole storage (static shapes attend over it);
  /// undefined when has_padding() is false.
  const at::Tensor& padding_storage() const { return padding_; }

  /// Appends k, v of shape [..., T_new, d] after the cached tokens and returns the
  /// number of tokens cached before them; an error names a shape, dtype, device or
  /// capacity that does not fit. key_padding_mask: optional [B, T_new] (or [1, T_new])
  /// bool, true = the new token is padding; undefined = none of them is.
  int64_t append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_padding_mask = {});

  /// The full storage (capacity tokens), for moving or inspecting.
  const at::Tensor& key_storage() const { return keys_; }
  const at::Tensor& value_storage() const { return values_; }

 private:
  friend class DecodeGraph;  // advances the host length after a graph replay

  void write_padding(const at::Tensor& index, int64_t t_new, const at::Tensor& key_padding_mask);

  at::Tensor keys_;
  at::Tensor values_;
  at::Tensor position_;
  at::Tensor padding_;  // [B, capacity] bool, allocated at the first padded append
  int64_t length_ = 0;
  bool static_shapes_ = false;
  uint64_t owner_ = 0;
};

}  // namespace torchattn
