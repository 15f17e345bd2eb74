#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace torchattn {

/// Keys and values of the tokens seen so far, for generation one chunk at a time.
///
/// Storage is allocated once, at [B, H, capacity, head_dim] for MultiHeadAttention
/// and [B, capacity, d_out] for CausalAttention (capacity = context_length); the
/// token dimension is always -2. Make one with `module->make_kv_cache(B)` and pass
/// it to `module->forward_cached(x_new, cache)`:
///
///   torch::NoGradGuard no_grad;
///   auto cache = mha->make_kv_cache(/*batch_size=*/1);
///   auto y = mha->forward_cached(prompt, cache);        // [1, T0, d_out]
///   auto z = mha->forward_cached(next_token, cache);    // [1, 1, d_out]
///   cache.length();                                     // T0 + 1
///   cache.reset();                                      // start a new sequence
///
/// The cache is for inference: forward_cached refuses to run with autograd on (use
/// NoGradGuard or InferenceMode). It takes no key padding mask.
///
/// Static shapes (`module->make_kv_cache(B, /*static_shapes=*/true)`): new keys and
/// values are written at the device-side `position()` and attention runs over the
/// whole storage with a causal mask computed on the device. Every call with the same
/// number of new tokens then has the same shapes and no host synchronisation, so a
/// decoding step can be captured in a CUDA graph and replayed (see DecodeGraph);
/// on CUDA a one-token step may use cuDNN, whose plan is built once. Each step
/// attends over `capacity()` keys instead of `length()`: for short sequences in a
/// long context, the dynamic cache does less work.
class KVCache {
 public:
  KVCache() = default;

  /// shape: the full storage shape, the token dimension (-2) holding `capacity`.
  KVCache(c10::IntArrayRef shape, at::TensorOptions options, bool static_shapes = false);

  /// Tokens cached so far.
  int64_t length() const { return length_; }
  /// Tokens the cache can hold (the module's context_length).
  int64_t capacity() const;
  int64_t batch_size() const;
  bool defined() const { return keys_.defined(); }

  /// Forgets every cached token; the storage is kept.
  void reset() { truncate(0); }

  /// Keeps the first `length` tokens (0 <= length <= length()) and forgets the rest.
  void truncate(int64_t length);

  /// True for a static-shape cache (see above).
  bool static_shapes() const { return static_shapes_; }

  /// [1] int64 on the cache's device: the number of cached tokens, which is the
  /// position of the next token. Advanced on the device by every append, so it can
  /// feed position embeddings inside a captured graph. length() is its host mirror.
  const at::Tensor& position() const { return position_; }

  /// Cached keys / values: [..., length(), d], views of the storage. (A static-shape
  /// cache attends over the whole storage instead; these still give the cached part.)
  at::Tensor keys() const;
  at::Tensor values() const;

  /// Appends k, v of shape [..., T_new, d] after the cached tokens and returns the
  /// number of tokens cached before them. Checks shape, dtype, device and capacity
  /// (against the host length). A static-shape cache writes at position() with
  /// index_copy_, a dynamic one at length() with copy_; both advance position().
  int64_t append(const at::Tensor& k, const at::Tensor& v);

  /// The full storage (capacity tokens), for moving or inspecting.
  const at::Tensor& key_storage() const { return keys_; }
  const at::Tensor& value_storage() const { return values_; }

 private:
  friend class DecodeGraph;  // advances the host length after a graph replay

  at::Tensor keys_;
  at::Tensor values_;
  at::Tensor position_;
  int64_t length_ = 0;
  bool static_shapes_ = false;
};

} // namespace torchattn
