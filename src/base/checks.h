#pragma once

// Argument checks shared by the functional layer and the modules. Each message names
// the function, the argument, what was expected and what came.

#include <torchattn/cross_kv.h>
#include <torchattn/kv_cache.h>
#include <torchattn/paged_kv_cache.h>
#include <torchattn/rope.h>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace torchattn::detail {

inline void check_floating(const char* fn, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), fn, ": expected a defined tensor for ", arg);
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), fn, ": expected a floating-point ", arg,
              " (float, double, bfloat16 or half), got ", t.scalar_type());
}

// `mask` must broadcast to `target`'s shape without changing it.
inline void check_broadcasts(const char* fn, const char* arg, const at::Tensor& mask, const at::Tensor& target) {
  bool ok = mask.dim() <= target.dim();
  for (int64_t i = 1; ok && i <= mask.dim(); ++i) {
    const int64_t m = mask.size(-i);
    ok = m == 1 || m == target.size(-i);
  }
  TORCH_CHECK(ok, fn, ": expected ", arg, " broadcastable to ", target.sizes(), ", got ", mask.sizes());
}

// q: [..., Tq, d], k: [..., Tk, d], v: [..., Tk, dv] (v optional).
inline void check_qkv(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor* v) {
  check_floating(fn, "q", q);
  check_floating(fn, "k", k);
  TORCH_CHECK(q.dim() >= 2, fn, ": expected q with at least 2 dimensions [..., Tq, d], got ", q.sizes());
  TORCH_CHECK(k.dim() >= 2, fn, ": expected k with at least 2 dimensions [..., Tk, d], got ", k.sizes());
  TORCH_CHECK(q.size(-1) == k.size(-1), fn, ": expected q and k with the same feature size d, got q ", q.sizes(),
              " and k ", k.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), fn, ": expected q and k of one dtype, got q ", q.scalar_type(),
              " and k ", k.scalar_type());
  if (v != nullptr) {
    check_floating(fn, "v", *v);
    TORCH_CHECK(v->dim() >= 2 && v->size(-2) == k.size(-2), fn,
                ": expected v with as many tokens as k (dimension -2), got k ", k.sizes(), " and v ", v->sizes());
    TORCH_CHECK(v->scalar_type() == q.scalar_type(), fn, ": expected v of q's dtype ", q.scalar_type(), ", got ",
                v->scalar_type());
  }
}

// theta > 0 and finite; rotary_dim (default head_dim) even, in [2, head_dim].
inline void check_rope(const char* fn, const RoPEOptions& rope, int64_t head_dim) {
  TORCH_CHECK(std::isfinite(rope.theta()) && rope.theta() > 0.0, fn, ": expected rope theta > 0, got ", rope.theta());
  const int64_t rot = rope.rotary_dim().value_or(head_dim);
  TORCH_CHECK(rot >= 2 && rot % 2 == 0 && rot <= head_dim, fn,
              ": expected an even rope rotary_dim in [2, head_dim=", head_dim, "], got ", rot);
}

// window >= 1, and only for causal attention.
inline void check_window(const char* module, const std::optional<int64_t>& window, bool causal) {
  if (!window) {
    return;
  }
  TORCH_CHECK(*window >= 1, module, ": expected window >= 1, got ", *window);
  TORCH_CHECK(causal, module, ": window=", *window,
              " needs causal(true): a sliding window limits how far back a query sees, and causal(false) sees "
              "every key");
}

inline void check_positive(const char* module, const char* arg, int64_t value) {
  TORCH_CHECK(value > 0, module, ": expected ", arg, " > 0, got ", value);
}

// reset() builds a module's layers and buffers on a module that has none: the constructor
// calls it, and LibTorch's clone() on a copy it has emptied. On a built module it would
// register them a second time (LibTorch's "already defined"). M: a torch::nn::Module
// (a template, so that this header needs no torch/nn include).
template <typename M>
void check_reset_unbuilt(const char* module, const M& m) {
  TORCH_CHECK(m.children().empty() && m.named_parameters(/*recurse=*/false).is_empty() &&
                  m.named_buffers(/*recurse=*/false).is_empty(),
              module,
              "::reset: expected a module without its layers (reset() builds them once: the constructor and "
              "clone() call it), got a built one; for new random weights construct another ",
              module, " from its options, for a copy call clone()");
}

inline void check_dropout(const char* module, double p) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, module, ": expected dropout in [0, 1), got ", p);
}

inline void check_scale(const char* module, const std::optional<double>& scale) {
  // Positive: the Reference fills hidden scores with -inf before scaling, as the notebooks do.
  TORCH_CHECK(!scale || (std::isfinite(*scale) && *scale > 0.0), module, ": expected a positive, finite scale, got ",
              scale.value_or(0.0));
}

// x: [B, T, d_in] or [T, d_in], floating, of the module's dtype and device (taken
// from `weight`), with T <= context_length when one is given (> 0).
inline void check_input(const char* module, const at::Tensor& x, int64_t d_in, int64_t context_length,
                        const at::Tensor& weight) {
  TORCH_CHECK(x.defined(), module, ": expected a defined input tensor");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, module, ": expected input of rank 2 [T, d_in] or 3 [B, T, d_in], got rank ",
              x.dim(), " with shape ", x.sizes());
  check_floating(module, "input", x);
  TORCH_CHECK(x.size(-1) == d_in, module, ": expected input with d_in=", d_in, " features, got ", x.size(-1));
  const int64_t T = x.size(-2);
  TORCH_CHECK(T > 0, module, ": expected at least one token, got input ", x.sizes());
  TORCH_CHECK(context_length <= 0 || T <= context_length, module, ": expected at most context_length=", context_length,
              " tokens, got ", T);
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), module, ": expected input of the module's dtype ",
              weight.scalar_type(), ", got ", x.scalar_type(), " (use module->to(dtype) or x.to(dtype))");
  TORCH_CHECK(x.device() == weight.device(), module, ": expected input on the module's device ", weight.device(),
              ", got ", x.device());
}

// forward_cached on an encoder (causal(false)): its tokens attend to later tokens, so
// chunked encoding cannot give the full forward's rows.
inline void check_causal_for_cache(const char* module, bool causal, const char* fn = "forward_cached") {
  TORCH_CHECK(causal, module, ": ", fn,
              " needs a causal module, this one has causal(false): each token "
              "attends to later tokens too, so a sequence encoded in chunks cannot give the full forward's rows; "
              "call forward() on the whole sequence");
}

// The cache passed to forward_cached: made by this module (`owner`) for x's batch,
// with room for x's tokens, usable in the current inference mode; and the module in
// eval mode unless it has no dropout.
inline void check_cache(const char* module, const KVCache& cache, const at::Tensor& x, int64_t context_length,
                        uint64_t owner, bool training, double dropout) {
  TORCH_CHECK(cache.defined(), module, ": expected a cache from make_kv_cache(batch_size), got an empty KVCache");
  TORCH_CHECK(cache.owner() == 0 || cache.owner() == owner, module,
              ": this KV cache was made by another module (each attention layer needs its own cache, from its own "
              "make_kv_cache)");
  TORCH_CHECK(cache.capacity() == context_length, module, ": expected a cache of context_length=", context_length,
              ", got one of ", cache.capacity());
  const int64_t B = x.dim() == 3 ? x.size(0) : 1;
  TORCH_CHECK(cache.batch_size() == B, module, ": expected input with the cache's batch_size=", cache.batch_size(),
              ", got ", B);
  const int64_t T = x.size(-2);
  TORCH_CHECK(cache.length() + T <= context_length, module, ": the KV cache holds ", cache.length(), " tokens; ", T,
              " more would pass context_length=", context_length, " (call cache.reset())");
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

// A key mask of a module's forward: undefined, or [B, T] / [1, T] for a batched x
// ([T] for an unbatched one), on x's device.
inline void check_key_mask_shape(const char* module, const char* arg, const at::Tensor& mask, const at::Tensor& x) {
  const int64_t T = x.size(-2);
  const bool batched = x.dim() == 3;
  const bool ok = batched ? mask.dim() == 2 && (mask.size(0) == x.size(0) || mask.size(0) == 1) && mask.size(1) == T
                          : mask.dim() == 1 && mask.size(0) == T;
  TORCH_CHECK(ok, module, ": expected ", arg, " of shape ",
              (batched ? "[B, T] = [" + std::to_string(x.size(0)) + ", " + std::to_string(T) + "] (or [1, " +
                             std::to_string(T) + "])"
                       : "[T] = [" + std::to_string(T) + "]"),
              ", got ", mask.sizes());
  TORCH_CHECK(mask.device() == x.device(), module, ": expected ", arg, " on ", x.device(), ", got ", mask.device());
}

// key_padding_mask: bool, true = ignore the key (torch.nn.MultiheadAttention's meaning).
// A floating tensor here is someone's keep-mask or additive mask: neither is this.
inline void check_key_padding_mask(const char* module, const at::Tensor& mask, const at::Tensor& x) {
  if (!mask.defined()) {
    return;
  }
  const bool integral = at::isIntegralType(mask.scalar_type(), /*includeBool=*/false);
  TORCH_CHECK(mask.scalar_type() == at::kBool, module,
              ": expected a bool key_padding_mask (true = ignore that key, as in torch.nn.MultiheadAttention), got ",
              mask.scalar_type(),
              (integral ? "; a Hugging Face attention_mask (1 = token, 0 = padding) means the opposite: pass "
                          "attention_mask == 0, or torchattn::padding_mask_from_attention_mask(attention_mask), "
                          "not attention_mask.to(torch::kBool)"
                        : "; an additive mask (0 keeps, -inf hides) goes in key_bias, forward's third "
                          "argument: forward(x, {}, bias)"));
  check_key_mask_shape(module, "key_padding_mask", mask, x);
}

// key_bias: of x's dtype, added to the scores of each key.
inline void check_key_bias(const char* module, const at::Tensor& bias, const at::Tensor& x) {
  if (!bias.defined()) {
    return;
  }
  TORCH_CHECK(bias.scalar_type() == x.scalar_type(), module, ": expected key_bias of the input's dtype ",
              x.scalar_type(), " (added to the scores: 0 keeps, -inf hides), got ", bias.scalar_type(),
              (bias.scalar_type() == at::kBool ? "; a bool mask of keys to ignore is key_padding_mask" : ""));
  check_key_mask_shape(module, "key_bias", bias, x);
}

// A key_padding_mask of forward that ignores every key of a sequence is an error:
// such a mask is almost always at::scaled_dot_product_attention's convention
// (true = attend) passed here. (forward_cached does not check: one chunk of a
// left-padded prompt may hold only padding.) Checked on the CPU only, where it
// costs no synchronisation.
inline void check_some_key_kept(const char* module, const at::Tensor& key_padding_mask) {
  if (!key_padding_mask.defined() || !key_padding_mask.is_cpu()) {
    return;
  }
  const at::Tensor ignored = (key_padding_mask.dim() == 1 ? key_padding_mask.unsqueeze(0) : key_padding_mask).all(-1);
  if (!ignored.any().item<bool>()) {
    return;
  }
  TORCH_CHECK(false, module, ": key_padding_mask ignores every key of sequence ",
              ignored.nonzero().min().item<int64_t>(),
              "; true marks a padding key to ignore (as in torch.nn.MultiheadAttention), the opposite of "
              "at::scaled_dot_product_attention's attn_mask (true = attend): pass mask.logical_not(); a Hugging Face "
              "attention_mask (1 = token) converts with attention_mask == 0, not .to(torch::kBool)");
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
    check_key_mask_shape(module, "context_padding_mask", context_padding_mask, context);
    check_some_key_kept(module, context_padding_mask);
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
// the step current; positions within context_length; inference only.
inline void check_paged(const char* module, const at::Tensor& x, int64_t d_in, int64_t context_length,
                        const at::Tensor& weight, const PagedKVCache& cache, const PagedStep& step, int64_t layer,
                        const PagedLayer& mine, bool training, double dropout) {
  TORCH_CHECK(x.defined() && x.dim() == 2, module,
              ": forward_paged expected x of rank 2 [N, d_in] (the step's "
              "tokens packed one after another), got ",
              x.defined() ? x.sizes() : c10::IntArrayRef{});
  check_floating(module, "input", x);
  TORCH_CHECK(x.size(1) == d_in, module, ": expected input with d_in=", d_in, " features, got ", x.size(1));
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && x.device() == weight.device(), module,
              ": expected input of the module's dtype ", weight.scalar_type(), " on ", weight.device(), ", got ",
              x.scalar_type(), " on ", x.device());
  TORCH_CHECK(cache.is_current(step), module,
              ": forward_paged expected the cache's current step (from "
              "cache.begin_step, with no fork, remove, truncate or other begin_step since), got another");
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

}  // namespace torchattn::detail
