#pragma once

// The checks of the modules' cached, paged and cross-attention entry points: the
// caches they are given, made for this module, for this input, in this mode.

#include <torchattn/cross_kv.h>
#include <torchattn/kv_cache.h>
#include <torchattn/paged_kv_cache.h>

#include "base/checks.h"

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

namespace torchattn::modules {

// forward_cached on an encoder (causal(false)): its tokens attend to later tokens, so
// chunked encoding cannot give the full forward's rows.
inline void check_causal_for_cache(const char* module, bool causal, const char* fn = "forward_cached") {
  TORCH_CHECK(causal, module, ": ", fn,
              " needs a causal module, this one has causal(false): each token "
              "attends to later tokens too, so a sequence encoded in chunks cannot give the full forward's rows; "
              "call forward() on the whole sequence");
}

// make_kv_cache's capacity: 0 for context_length, else in [1, context_length].
// Returns the cache's tokens.
inline int64_t check_capacity(const char* module, int64_t capacity, int64_t context_length) {
  TORCH_CHECK(capacity >= 0 && capacity <= context_length, module,
              ": make_kv_cache expected a capacity in [1, context_length=", context_length,
              "] (or 0 for context_length), got ", capacity);
  return capacity == 0 ? context_length : capacity;
}

// The cache passed to forward_cached: made by this module (`owner`) for x's batch,
// of at most context_length tokens, with room for x's tokens, usable in the current inference mode; and the module in
// eval mode unless it has no dropout.
inline void check_cache(const char* module, const KVCache& cache, const at::Tensor& x, int64_t context_length,
                        uint64_t owner, bool training, double dropout) {
  TORCH_CHECK(cache.defined(), module, ": expected a cache from make_kv_cache(batch_size), got an empty KVCache");
  TORCH_CHECK(cache.owner() == 0 || cache.owner() == owner, module,
              ": this KV cache was made by another module (each attention layer needs its own cache, from its own "
              "make_kv_cache)");
  TORCH_CHECK(cache.capacity() <= context_length, module,
              ": expected a cache of at most context_length=", context_length, " tokens, got one of ",
              cache.capacity());
  const int64_t B = x.dim() == 3 ? x.size(0) : 1;
  TORCH_CHECK(cache.batch_size() == B, module, ": expected input with the cache's batch_size=", cache.batch_size(),
              ", got ", B);
  const int64_t T = x.size(-2);
  TORCH_CHECK(cache.length() + T <= cache.capacity(), module, ": the KV cache holds ", cache.length(), " tokens; ", T,
              " more would pass its capacity of ", cache.capacity(), " (call cache.reset(), or make a larger cache)");
  // Under autograd the cache's storage would be saved for backward and then
  // overwritten by the next call.
  TORCH_CHECK(!c10::GradMode::is_enabled(), module,
              ": forward_cached is for inference: call it under torch::NoGradGuard or c10::InferenceMode");
  TORCH_CHECK(!cache.key_storage().is_inference() || c10::InferenceMode::is_enabled(), module,
              ": this KV cache was made under c10::InferenceMode, so it holds inference tensors, which can only be "
              "written under InferenceMode; call forward_cached under c10::InferenceMode too, or make the cache under "
              "torch::NoGradGuard");
  TORCH_CHECK(!training || dropout == 0.0, module, ": forward_cached in training mode would apply dropout=", dropout,
              " to the attention weights; call module->eval() before generating");
}

// cross_kv: context [B, S, kdim] or [S, kdim] of the module's dtype and device (taken
// from `weight`); value_context the same tokens with vdim features, required when vdim
// differs from kdim; context_padding_mask bool [B, S] (or [1, S]; [S] unbatched) keeping
// some token of each sequence.
inline void check_cross_context(const char* module, const at::Tensor& context, const at::Tensor& value_context,
                                const at::Tensor& context_padding_mask, int64_t kdim, int64_t vdim,
                                const at::Tensor& weight) {
  TORCH_CHECK(context.defined() && (context.dim() == 2 || context.dim() == 3), module,
              ": cross_kv expected context of rank 2 [S, kdim] or 3 [B, S, kdim], got ",
              context.defined() ? context.sizes() : c10::IntArrayRef{});
  TORCH_CHECK(context.size(-1) == kdim && context.size(-2) >= 1, module, ": cross_kv expected context with kdim=", kdim,
              " features and at least one token, got ", context.sizes());
  TORCH_CHECK(context.scalar_type() == weight.scalar_type() && context.device() == weight.device(), module,
              ": cross_kv expected context of the module's dtype ", weight.scalar_type(), " on ", weight.device(),
              ", got ", context.scalar_type(), " on ", context.device());
  if (value_context.defined()) {
    TORCH_CHECK(value_context.dim() == context.dim() && value_context.size(-1) == vdim &&
                    value_context.sizes().slice(0, context.dim() - 1) == context.sizes().slice(0, context.dim() - 1),
                module, ": cross_kv expected value_context of the context's tokens with vdim=", vdim, " features, got ",
                value_context.sizes(), " beside context ", context.sizes());
    TORCH_CHECK(value_context.scalar_type() == context.scalar_type() && value_context.device() == context.device(),
                module, ": cross_kv expected value_context of the context's dtype and device");
  } else {
    TORCH_CHECK(vdim == kdim, module, ": cross_kv needs a value_context [..., S, vdim=", vdim,
                "] when vdim differs from kdim=", kdim);
  }
  if (context_padding_mask.defined()) {
    TORCH_CHECK(context_padding_mask.scalar_type() == at::kBool, module,
                ": expected a bool context_padding_mask (true = a padding token of the context), got ",
                context_padding_mask.scalar_type());
    base::check_key_mask_shape(module, "context_padding_mask", context_padding_mask, context);
    base::check_some_key_kept(module, context_padding_mask);
  }
}

// forward_cross: a CrossKV of this module's heads ([B, num_kv_heads, S, head_dim]) for
// x's batch, on x's device and of its dtype.
inline void check_cross_kv(const char* module, const CrossKV& kv, const at::Tensor& x, int64_t num_kv_heads,
                           int64_t head_dim) {
  TORCH_CHECK(kv.keys.defined() && kv.values.defined() && kv.keys.dim() == 4 && kv.keys.size(1) == num_kv_heads &&
                  kv.keys.size(3) == head_dim,
              module, ": forward_cross expected a CrossKV from this module's cross_kv (keys [B, ", num_kv_heads,
              ", S, ", head_dim, "]), got keys ", kv.keys.defined() ? kv.keys.sizes() : c10::IntArrayRef{});
  const int64_t B = x.dim() == 3 ? x.size(0) : 1;
  TORCH_CHECK(kv.batch_size() == B, module, ": forward_cross expected x of the CrossKV's batch_size=", kv.batch_size(),
              ", got ", B);
  TORCH_CHECK(kv.keys.device() == x.device() && kv.keys.scalar_type() == x.scalar_type(), module,
              ": forward_cross expected a CrossKV on x's device and of its dtype");
}

// forward_paged: x [N, d_in] of the module's dtype and device, the step's N tokens;
// the cache's `layer` made for this module (`mine`: its heads, dtype, device, owner);
// positions within context_length; inference only. That the step is the cache's
// current one is checked where every step passes, PagedKVCache::write.
inline void check_paged(const char* module, const at::Tensor& x, int64_t d_in, int64_t context_length,
                        const at::Tensor& weight, const PagedKVCache& cache, const PagedStep& step, int64_t layer,
                        const PagedLayer& mine, bool training, double dropout) {
  TORCH_CHECK(x.defined() && x.dim() == 2, module,
              ": forward_paged expected x of rank 2 [N, d_in] (the step's "
              "tokens packed one after another), got ",
              x.defined() ? x.sizes() : c10::IntArrayRef{});
  base::check_floating(module, "input", x);
  TORCH_CHECK(x.size(1) == d_in, module, ": expected input with d_in=", d_in, " features, got ", x.size(1));
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && x.device() == weight.device(), module,
              ": expected input of the module's dtype ", weight.scalar_type(), " on ", weight.device(), ", got ",
              x.scalar_type(), " on ", x.device());
  TORCH_CHECK(x.size(0) == step.num_tokens(), module, ": forward_paged expected the step's ", step.num_tokens(),
              " tokens, got x with ", x.size(0));
  TORCH_CHECK(layer >= 0 && layer < cache.num_layers(), module, ": expected a layer in [0, ", cache.num_layers(),
              ") of the cache, got ", layer);
  const PagedLayer& l = cache.layer(layer);
  TORCH_CHECK(l.owner == 0 || l.owner == mine.owner, module, ": layer ", layer,
              " of this paged cache belongs to another module (each attention layer has its own layer of the "
              "cache; pass this module's index)");
  TORCH_CHECK(l.num_kv_heads == mine.num_kv_heads && l.head_dim == mine.head_dim &&
                  l.options.dtype() == mine.options.dtype() && l.options.device() == mine.options.device(),
              module, ": layer ", layer, " of this paged cache holds ", l.num_kv_heads, " heads of ", l.head_dim, " (",
              l.options.dtype(), " on ", l.options.device(), "), the module has ", mine.num_kv_heads, " of ",
              mine.head_dim, " (", mine.options.dtype(), " on ", mine.options.device(),
              "); make the cache after moving the module");
  TORCH_CHECK(step.max_position() < context_length, module, ": a sequence of the step reaches ",
              step.max_position() + 1, " tokens, past context_length=", context_length);
  TORCH_CHECK(!c10::GradMode::is_enabled(), module,
              ": forward_paged is for inference: call it under torch::NoGradGuard or c10::InferenceMode");
  TORCH_CHECK(!cache.keys(layer).is_inference() || c10::InferenceMode::is_enabled(), module,
              ": this paged cache was made under c10::InferenceMode, so it holds inference tensors, which can only "
              "be written under InferenceMode; call forward_paged under c10::InferenceMode too");
  TORCH_CHECK(!training || dropout == 0.0, module, ": forward_paged in training mode with dropout=", dropout,
              " would drop attention weights while decoding; call module->eval()");
}

}  // namespace torchattn::modules
