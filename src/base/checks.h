#pragma once

// Argument checks shared by the functional layer and the modules. Each message names
// the function, the argument, what was expected and what came.

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::base {

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

// cu_seqlens of documents packed in x [N, ...] (FlashAttention's varlen form): [S + 1]
// int32 or int64 on the CPU or x's device, 0 first, N last, increasing (every
// document at least one token), each document at most max_len tokens where max_len >
// 0. `x_name` and `rows` name x and its N in the messages ("x's N rows" by default).
// Returns the offsets on the host (a device tensor is copied: one synchronisation).
inline std::vector<int64_t> check_cu_seqlens(const char* fn, const at::Tensor& cu_seqlens, const at::Tensor& x,
                                             int64_t max_len, const char* x_name = "x", const char* rows = "rows") {
  TORCH_CHECK(cu_seqlens.defined(), fn, ": expected cu_seqlens, got an undefined tensor");
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2, fn,
              ": expected cu_seqlens of shape [S + 1] with S >= 1 documents, got ", cu_seqlens.sizes());
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong, fn,
              ": expected cu_seqlens int32 or int64, got ", cu_seqlens.scalar_type());
  TORCH_CHECK(cu_seqlens.is_cpu() || cu_seqlens.device() == x.device(), fn, ": expected cu_seqlens on the CPU or on ",
              x_name, "'s device ", x.device(), ", got ", cu_seqlens.device());
  const at::Tensor host = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = host.const_data_ptr<int64_t>();
  const int64_t n = host.size(0), N = x.size(0);
  std::vector<int64_t> offsets(p, p + n);
  TORCH_CHECK(offsets.front() == 0, fn, ": expected cu_seqlens to start at 0, got ", offsets.front());
  TORCH_CHECK(offsets.back() == N, fn, ": expected cu_seqlens to end at ", x_name, "'s ", N, " ", rows, ", got ",
              offsets.back());
  for (int64_t s = 0; s + 1 < n; ++s) {
    const int64_t len = offsets[s + 1] - offsets[s];
    TORCH_CHECK(len > 0, fn, ": expected cu_seqlens increasing (every document at least one token), got ", offsets[s],
                " then ", offsets[s + 1], " at document ", s);
    TORCH_CHECK(max_len <= 0 || len <= max_len, fn, ": expected documents of at most context_length=", max_len,
                " tokens, got ", len, " in document ", s);
  }
  return offsets;
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

}  // namespace torchattn::base
