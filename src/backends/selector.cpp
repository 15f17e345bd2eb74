// The table of attention paths (selector.h): what each applies to, in order, and how it
// runs. The only file of the backends that calls torchattn's attention kernels.

#include "backends/selector.h"

#include "backends/alibi.h"
#include "backends/attend_documents.h"
#include "backends/attend_flex.h"
#include "backends/attend_paged.h"
#include "backends/blocked.h"
#include "backends/grouped_heads.h"
#include "backends/named_flex.h"
#include "backends/reference.h"
#include "backends/score_scale.h"
#include "backends/sdpa.h"
#include "backends/varlen_flash.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/needs_grad.h"
#include "kernels/cuda/static_decode_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <array>
#include <limits>
#include <sstream>
#include <vector>

namespace torchattn::backends {

namespace {

// --- What the paths ask of a call ---------------------------------------------------

bool dense(const AttentionCall& c) { return c.documents == nullptr && c.paged == nullptr; }

// A dense call whose masks are still a MaskSpec (not yet lowered to ATen's form).
bool on_spec(const AttentionCall& c) { return dense(c) && c.aten == nullptr; }

// The most queries of a static-shape step that Backend::Auto keeps away from ATen's
// fused kernels on CUDA. Such a step attends over the cache's whole capacity through a
// mask, and ATen's fused kernel that takes a mask (memory-efficient) spreads its work
// over the queries: one query x H heads keeps H blocks busy over every key, about 150
// us a layer at 2048 keys on an H200 (`make bench DEVICE=cuda`, decode `graph`). Such
// a step runs torchattn's flash-decoding kernel (kernels/cuda/), or where that does
// not apply (key masks, a gradient) the Reference's batched products, which spread
// the keys over the whole GPU.
constexpr int64_t kStaticMathQueries = 16;

// The most query rows of a decoding step (a step of speculated tokens or a short chunk
// after cached keys; more are a prefill's): the decode kernel's, whose steps with key
// masks it keeps.
constexpr int64_t kDecodeRows = kernels::cpu::kDecodeAttentionRows;

bool static_step_on_cuda(const AttentionCall& c) {
  return c.config.backend == Backend::Auto && c.q.is_cuda() && c.spec.is_static() && c.q.size(-2) <= kStaticMathQueries;
}

// ATen's mask has a head dimension of its own (ALiBi's distances): grouped heads do not
// fold and the decode kernel does not take it.
bool per_head_mask(const AttentionCall& c) {
  const auto& m = c.aten->mask;
  return m && m->dim() == 4 && m->size(1) > 1;
}

// [B or 1, Tk] -> [B or 1, 1, ..., 1, Tk]: broadcasts over heads and queries of q.
at::Tensor per_key(const at::Tensor& m, const at::Tensor& q) {
  std::vector<int64_t> shape(q.dim(), 1);
  shape.front() = m.size(0);
  shape.back() = m.size(1);
  return m.view(shape);
}

// Key masks (padding, additive bias, a score bias) as one hidden pattern and one bias.
// Rows that would see no key (`dead`) are attended over all keys instead (finite
// softmax, finite gradients) and then zeroed.
struct KeyMasks {
  at::Tensor hide, bias, dead;
};

KeyMasks key_masks(const AttentionCall& c) {
  const MaskSpec& spec = c.spec;
  const int64_t Tq = c.q.size(-2), Tk = c.k.size(-2);
  // Hidden: the causal pattern, padding keys, and keys whose bias is -inf.
  KeyMasks m{hidden_keys(spec, Tq, Tk, c.q.device()), {}, {}};
  auto hide_also = [&](const at::Tensor& h) { m.hide = m.hide.defined() ? at::logical_or(m.hide, h) : h; };
  if (spec.key_padding.defined()) hide_also(per_key(spec.key_padding, c.q));
  if (spec.key_bias.defined()) {
    const at::Tensor neg_inf = spec.key_bias.isneginf();
    hide_also(per_key(neg_inf, c.q));
    m.bias = per_key(spec.key_bias.masked_fill(neg_inf, 0), c.q);
  }
  if (spec.score_bias.defined()) m.bias = m.bias.defined() ? m.bias + spec.score_bias : spec.score_bias;
  if (!m.hide.defined()) {  // only a score bias: every key visible
    m.hide = per_key(at::zeros({1, Tk}, c.q.options().dtype(at::kBool)), c.q);
  }
  m.dead = m.hide.all(-1, /*keepdim=*/true);  // [B or 1, 1.., Tq or 1, 1]
  m.hide = at::logical_and(m.hide, m.dead.logical_not());
  return m;
}

#ifdef TORCHATTN_WITH_CUDA
// The flash-decoding kernel's description of a static-shape spec without key masks.
kernels::cuda::StaticDecodeMask static_decode_mask(const MaskSpec& spec) {
  kernels::cuda::StaticDecodeMask m;
  m.positions = spec.positions;
  m.causal = spec.causal;
  if (spec.causal) {
    m.window = spec.window.value_or(0);
    if (spec.buffer != nullptr) m.buffer = *spec.buffer;
  }
  return m;
}
#endif

// --- The paths ------------------------------------------------------------------------

// Packed documents.
bool varlen_flash_path(const AttentionCall& c) {
  return c.documents != nullptr && c.q.is_cuda() && varlen_flash_applies(c.q, c.k, c.v, c.spec, c.config);
}
at::Tensor run_varlen_flash(const AttentionCall& c) {
  return varlen_flash(c.q, c.k, c.v, *c.documents->lengths, c.spec.causal, c.config);
}
bool documents_path(const AttentionCall& c) { return c.documents != nullptr; }

// A paged step.
bool paged_kernel_path(const AttentionCall& c) {
  if (c.paged == nullptr || c.config.backend != Backend::Auto ||
      !kernels::cpu::paged_attention_applies(c.q, c.paged->keys, c.paged->values)) {
    return false;
  }
  const auto& qs = *c.paged->query_start;
  for (size_t s = 0; s + 1 < qs.size(); ++s) {
    if (qs[s + 1] - qs[s] <= kernels::cpu::kPagedKernelRows) return true;
  }
  return false;
}
at::Tensor run_paged_kernel(const AttentionCall& c) {
  const PagedKeys& pool = *c.paged;
  const auto& qs = *pool.query_start;
  const auto& ks = *pool.key_start;
  const int64_t N = c.q.size(0), H = c.q.size(1), d = c.q.size(2);
  at::Tensor out = at::empty({N, H, d}, c.q.options());
  std::vector<int64_t> kernel_rows, gathered;
  for (int64_t s = 0; s + 1 < static_cast<int64_t>(qs.size()); ++s) {
    (qs[s + 1] - qs[s] <= kernels::cpu::kPagedKernelRows ? kernel_rows : gathered).push_back(s);
  }
  kernels::cpu::PagedRows rows{pool.key_slots_cpu.const_data_ptr<int64_t>(), &qs, &ks, c.spec.window};
  // The kernel reads the slopes and sinks as float32 [H] on the CPU (q is float32 there).
  const at::Tensor& alibi = c.spec.alibi_slopes;
  const at::Tensor slopes = alibi.defined() ? alibi.to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor sinks = c.config.sinks.defined() ? c.config.sinks.to(at::kFloat).contiguous() : at::Tensor();
  const kernels::cpu::PagedScores extra{c.config.softcap, slopes.defined() ? slopes.const_data_ptr<float>() : nullptr,
                                        sinks.defined() ? sinks.const_data_ptr<float>() : nullptr};
  kernels::cpu::paged_attention(c.q, pool.keys, pool.values, rows, kernel_rows, score_scale(c.config, d), out,
                                std::nullopt, extra);
  if (!gathered.empty()) attend_gathered(c, gathered, out);
  return out;
}
bool paged_path(const AttentionCall& c) { return c.paged != nullptr; }
at::Tensor run_paged_gathered(const AttentionCall& c) {
  std::vector<int64_t> all(c.paged->query_start->size() - 1);
  for (size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int64_t>(s);
  at::Tensor out = at::empty({c.q.size(0), c.q.size(1), c.q.size(2)}, c.q.options());
  attend_gathered(c, all, out);
  return out;
}

// A user's flex variant, and the library's own flex instances.
bool user_flex_path(const AttentionCall& c) { return dense(c) && static_cast<bool>(c.config.flex); }
at::Tensor run_user_flex(const AttentionCall& c) { return attend_flex(c.q, c.k, c.v, c.spec, c.config); }

bool named_flex_path(const AttentionCall& c) {
  return on_spec(c) && c.q.dim() == 4 && named_flex_applies(c.q, c.spec, c.config);
}
at::Tensor run_named_flex(const AttentionCall& c) { return named_flex_attention(c.q, c.k, c.v, c.spec, c.config); }

// ALiBi elsewhere: its distances as a score bias, at the keys' real positions.
bool alibi_path(const AttentionCall& c) { return on_spec(c) && c.spec.alibi_slopes.defined(); }
LoweredCall lower_alibi(const AttentionCall& c) {
  LoweredCall low;
  low.spec = c.spec;
  low.spec->score_bias = alibi_bias(c.spec.alibi_slopes.to(c.q.device()), c.spec.key_padding, c.q.size(-2),
                                    c.k.size(-2), c.q.scalar_type(), c.spec.positions);
  low.spec->alibi_slopes = at::Tensor();
  return low;
}

// Softcapping and sinks: no fused kernel takes them; blocks of queries (every backend:
// the Reference's math, without Tq x Tk memory).
bool blocked_path(const AttentionCall& c) { return on_spec(c) && needs_blocked_attention(c.config); }
at::Tensor run_blocked(const AttentionCall& c) { return blocked_attention(c.q, c.k, c.v, c.spec, c.config); }

// ATen's fused CPU kernels take [B, H, T, d]; a single-head [B, T, d] would fall back
// to the math kernel, which builds the T x T weights.
bool single_head_path(const AttentionCall& c) { return on_spec(c) && c.q.dim() == 3 && c.backend == Backend::SDPA; }
LoweredCall lower_single_head(const AttentionCall& c) {
  LoweredCall low;
  low.q = c.q.unsqueeze(1);
  low.k = c.k.unsqueeze(1);
  low.v = c.v.unsqueeze(1);
  low.squeeze_heads = true;
  return low;
}

// Key masks.
bool reference_key_masks_path(const AttentionCall& c) {
  return on_spec(c) && c.spec.has_key_masks() && (c.backend == Backend::Reference || static_step_on_cuda(c));
}
at::Tensor run_reference_key_masks(const AttentionCall& c) {
  const KeyMasks m = key_masks(c);
  const int64_t G = query_groups(c.q, c.k);
  return reference_attention(c.q, repeat_kv(c.k, G), repeat_kv(c.v, G), m.hide, m.bias, c.config.scale,
                             dropout_p(c.config))
      .masked_fill(m.dead, 0);
}
bool key_masks_path(const AttentionCall& c) { return on_spec(c) && c.spec.has_key_masks(); }
LoweredCall lower_key_masks(const AttentionCall& c) {
  const KeyMasks m = key_masks(c);
  at::Tensor mask =
      at::zeros(m.hide.sizes(), c.q.options()).masked_fill_(m.hide, -std::numeric_limits<double>::infinity());
  if (m.bias.defined()) mask = mask + m.bias;
  LoweredCall low;
  low.aten = AtenMask{mask, false};
  low.zero_rows = m.dead;
  return low;
}

// A static-shape decoding step on CUDA.
bool static_decode_path(const AttentionCall& c) {
#ifdef TORCHATTN_WITH_CUDA
  return on_spec(c) && c.backend != Backend::Reference && static_step_on_cuda(c) && dropout_p(c.config) == 0.0 &&
         kernels::cuda::static_decode_applies(c.q, c.k, c.v, static_decode_mask(c.spec));
#else
  (void)c;
  return false;
#endif
}
at::Tensor run_static_decode(const AttentionCall& c) {
#ifdef TORCHATTN_WITH_CUDA
  return kernels::cuda::static_decode_attention(c.q, c.k, c.v, static_decode_mask(c.spec),
                                                score_scale(c.config, c.q.size(-1)));
#else
  TORCH_INTERNAL_ASSERT(false, "the static decode path runs in CUDA builds only");
  return c.q;
#endif
}

// The Reference backend's math (and Auto's static-shape steps on CUDA).
bool reference_path(const AttentionCall& c) {
  return on_spec(c) && (c.backend == Backend::Reference || static_step_on_cuda(c));
}
at::Tensor run_reference(const AttentionCall& c) {
  const int64_t G = query_groups(c.q, c.k);
  return reference_attention(c.q, repeat_kv(c.k, G), repeat_kv(c.v, G),
                             hidden_keys(c.spec, c.q.size(-2), c.k.size(-2), c.q.device()), {}, c.config.scale,
                             dropout_p(c.config));
}

// What flex's plain instances (run_named_flex with neither softcap nor ALiBi) take: q
// [B, H, Tq, d] float32 on the CPU over k [B, Hkv, Tk, d] and v [B, Hkv, Tk, dv], H a
// multiple of Hkv, Tq <= Tk, none of them empty (a head size of 0: ATen's); Auto, no
// gradient, dropout, key masks or variant of the score. The two rows below ask their own cheap conditions first, so
// that a call runs these checks once on its way through the table.
bool plain_flex_call(const AttentionCall& c) {
  const MaskSpec& spec = c.spec;
  const at::Tensor &q = c.q, &k = c.k, &v = c.v;
  const auto cpu_float = [](const at::Tensor& x) {
    return x.dim() == 4 && x.is_cpu() && x.scalar_type() == at::kFloat;
  };
  return on_spec(c) && !spec.has_key_masks() && !spec.alibi_slopes.defined() && !c.config.softcap &&
         !c.config.sinks.defined() && !c.config.flex && c.config.backend == Backend::Auto &&
         dropout_p(c.config) == 0.0 && cpu_float(q) && cpu_float(k) && cpu_float(v) && k.size(1) >= 1 &&
         q.size(1) % k.size(1) == 0 && v.size(1) == k.size(1) && q.size(0) == k.size(0) && v.size(0) == k.size(0) &&
         k.size(3) == q.size(3) && v.size(2) == k.size(2) && q.size(2) >= 1 && q.size(2) <= k.size(2) &&
         q.numel() > 0 && v.numel() > 0 && !kernels::cpu::needs_grad(q) && !kernels::cpu::needs_grad(k) &&
         !kernels::cpu::needs_grad(v);
}
// A causal prefill on the CPU (no gradient) by flex's kernels under flex::Causal, which
// compute only the keys each row sees, aligned bottom-right: a whole sequence, or a
// chunk of more rows than a decoding step after cached keys.
bool causal_flex_path(const AttentionCall& c) {
  return c.spec.causal && !c.spec.is_static() && !c.spec.window && (c.spec.past == 0 || c.q.size(-2) > kDecodeRows) &&
         c.k.size(-2) <= causal_flex_max_keys(kernels::cpu::best_isa()) && plain_flex_call(c);
}

// A decoding step on the CPU: a few query rows (grouped heads fold into one tile) over
// cached keys, a static cache's step, or rows that see every key (cross-attention), by
// flex's kernels, which read each block of keys once a key/value head, split a call of
// few heads over the threads by keys, and open no parallel region for small work.
bool flex_decode_path(const AttentionCall& c) { return c.q.size(-2) <= kDecodeRows && plain_flex_call(c); }

// The spec in ATen's form. SDPA's is_causal aligns top-left, which is our mask only
// when Tq == Tk. A single new token sees every cached key, so it needs no mask. Other
// cached chunks, a window and a static cache's slots pass a boolean mask (true =
// attend).
bool aten_masks_path(const AttentionCall& c) { return on_spec(c); }
LoweredCall lower_aten_masks(const AttentionCall& c) {
  const MaskSpec& spec = c.spec;
  const int64_t Tq = c.q.size(-2), Tk = c.k.size(-2);
  LoweredCall low;
  low.aten = AtenMask{};
  if (spec.is_static() || spec.window) {
    const at::Tensor hide = hidden_keys(spec, Tq, Tk, c.q.device());
    if (hide.defined()) low.aten->mask = hide.logical_not();
  } else if (spec.causal && spec.past == 0) {
    low.aten->is_causal = true;
  } else if (spec.causal && Tq > 1) {
    low.aten->mask = hidden_keys(spec, Tq, Tk, c.q.device()).logical_not();
  }
  return low;
}

// A decoding step on the CPU with key masks (a few query rows, no gradient; those
// without take cpu_flex_decode): torchattn's kernel, which opens no parallel region for
// small work and never reads a key its mask hides.
bool decode_kernel_path(const AttentionCall& c) {
  return c.aten != nullptr && c.config.backend == Backend::Auto && !c.aten->is_causal && dropout_p(c.config) == 0.0 &&
         !per_head_mask(c) &&
         kernels::cpu::decode_attention_applies(c.q, c.k, c.v, c.aten->mask.value_or(at::Tensor()));
}
at::Tensor run_decode_kernel(const AttentionCall& c) {
  return kernels::cpu::decode_attention(c.q, c.k, c.v, c.aten->mask.value_or(at::Tensor()),
                                        score_scale(c.config, c.q.size(-1)));
}

// ATen's fused kernels. Backend::SDPA is ATen's own choice of kernel; Auto takes cuDNN
// only at a whole-sequence shape it has run before (see sdpa.h), never in decoding.
Cudnn cudnn_for(const AttentionCall& c) { return c.config.backend == Backend::SDPA ? Cudnn::Allowed : Cudnn::Repeated; }

// Grouped queries: a single query per head (decoding) folds its G heads into G rows
// over their shared key/value head, [B, H, 1, d] -> [B, Hkv, G, d], so each key and
// value is read once per group.
bool grouped_decode_path(const AttentionCall& c) {
  return c.aten != nullptr && query_groups(c.q, c.k) > 1 && c.q.size(-2) == 1 && !c.aten->is_causal &&
         !per_head_mask(c);
}
at::Tensor run_grouped_decode(const AttentionCall& c) {
  const int64_t B = c.q.size(0), H = c.q.size(1), G = query_groups(c.q, c.k);
  const at::Tensor folded = c.q.reshape({B, H / G, G, c.q.size(-1)});
  // Never a cuDNN plan under Auto, whatever G and the keys are.
  const Cudnn cudnn = cudnn_for(c) == Cudnn::Allowed ? Cudnn::Allowed : Cudnn::Never;
  return fused_attention(folded, c.k, c.v, c.aten->mask, dropout_p(c.config), false, c.config.scale, cudnn)
      .reshape({B, H, 1, c.v.size(-1)});
}
bool aten_path(const AttentionCall& c) { return c.aten != nullptr; }
at::Tensor run_aten(const AttentionCall& c) {
  return fused_attention(c.q, c.k, c.v, c.aten->mask, dropout_p(c.config), c.aten->is_causal, c.config.scale,
                         cudnn_for(c), /*enable_gqa=*/query_groups(c.q, c.k) > 1);
}

// --- The table ----------------------------------------------------------------------

constexpr std::array kPaths = {
    AttentionPath{"cuda_varlen_flash", "packed documents on CUDA, fp16/bf16, no window, softcap, sinks or dropout",
                  "ATen's variable-length flash attention, one launch", varlen_flash_path, run_varlen_flash, nullptr},
    AttentionPath{"documents_each", "packed documents", "each document through the table alone", documents_path,
                  attend_each_document, nullptr},
    AttentionPath{"cpu_paged_kernel", "a paged step, Auto, float32 on the CPU, a sequence of <= 64 new rows",
                  "the CPU paged kernel for those sequences, in place; the others gathered", paged_kernel_path,
                  run_paged_kernel, nullptr},
    AttentionPath{"paged_gather", "a paged step", "each sequence's keys gathered, through the table alone", paged_path,
                  run_paged_gathered, nullptr},
    AttentionPath{"flex_user", "AttentionOptions::flex (the user's variant)", "the variant's flex_attention",
                  user_flex_path, run_user_flex, nullptr},
    AttentionPath{"flex_named",
                  "CPU, float32/64, Auto; softcap, ALiBi or a window; no key masks, sinks or dropout in training",
                  "the library's flex instances (Softcap, Alibi; causal or window block mask)", named_flex_path,
                  run_named_flex, nullptr},
    AttentionPath{"alibi_as_bias", "ALiBi elsewhere", "lowers: ALiBi's distances as a score bias", alibi_path, nullptr,
                  lower_alibi},
    AttentionPath{"blocked", "softcap or sinks", "blocks of queries, the Reference's math per block", blocked_path,
                  run_blocked, nullptr},
    AttentionPath{"single_head_as_heads", "[B, T, d] inputs on SDPA", "lowers: [B, 1, T, d]", single_head_path, nullptr,
                  lower_single_head},
    AttentionPath{"reference_key_masks", "key masks on Reference (or Auto's static step on CUDA)",
                  "the Reference's math with the masks and bias", reference_key_masks_path, run_reference_key_masks,
                  nullptr},
    AttentionPath{"key_masks_as_aten", "key masks (padding, key bias, score bias)",
                  "lowers: one additive mask; rows that see no key zeroed", key_masks_path, nullptr, lower_key_masks},
    AttentionPath{"cuda_static_decode", "Auto, a static-shape step of <= 16 rows on CUDA, no dropout",
                  "torchattn's flash-decoding kernel (CUDA builds)", static_decode_path, run_static_decode, nullptr},
    AttentionPath{"reference", "Reference (or Auto's static step on CUDA)", "the notebooks' math step by step",
                  reference_path, run_reference, nullptr},
    AttentionPath{"cpu_flex_causal",
                  "Auto, causal, float32 on the CPU, no gradient or dropout, no window; a whole sequence or > 16 "
                  "rows after cached keys; keys <= 512 (AVX2) or 16384 (AVX-512)",
                  "flex's kernels under flex::Causal's block mask (the causal prefill)", causal_flex_path,
                  run_named_flex, nullptr},
    AttentionPath{"cpu_flex_decode",
                  "Auto, float32 on the CPU, <= 16 rows (after cached keys, a static cache's, or seeing every key), "
                  "no gradient, dropout, key masks or variant of the score",
                  "flex's kernels (the keys split over threads for few heads)", flex_decode_path, run_named_flex,
                  nullptr},
    AttentionPath{"masks_as_aten", "any other call", "lowers: ATen's is_causal or a bool mask", aten_masks_path,
                  nullptr, lower_aten_masks},
    AttentionPath{"cpu_decode_kernel",
                  "lowered: Auto, <= 16 rows, float32 on the CPU, no gradient or dropout (a step with key masks: a "
                  "batch's padding)",
                  "torchattn's decode kernel", decode_kernel_path, run_decode_kernel, nullptr},
    AttentionPath{"aten_grouped_decode", "lowered: one row, grouped heads, no per-head mask",
                  "ATen's kernel, G heads folded into G rows", grouped_decode_path, run_grouped_decode, nullptr},
    AttentionPath{"aten_sdpa", "lowered: any other",
                  "ATen's scaled_dot_product_attention (cuDNN under Auto: repeated shapes)", aten_path, run_aten,
                  nullptr},
};

}  // namespace

std::span<const AttentionPath> attention_paths() { return kPaths; }

const AttentionPath& select_path(const AttentionCall& call) {
  for (const AttentionPath& path : kPaths) {
    if (path.applies(call)) return path;
  }
  TORCH_INTERNAL_ASSERT(false, "attention: no path applies to the call");
  return kPaths.back();
}

namespace {

// The call a lowering makes, referring to `low` and to what it keeps of `call`.
AttentionCall lowered(const AttentionCall& call, const LoweredCall& low) {
  AttentionCall next{low.q.defined() ? low.q : call.q,
                     low.k.defined() ? low.k : call.k,
                     low.v.defined() ? low.v : call.v,
                     low.spec ? *low.spec : call.spec,
                     call.config,
                     call.backend};
  next.aten = low.aten ? &*low.aten : call.aten;
  next.documents = call.documents;
  next.paged = call.paged;
  return next;
}

}  // namespace

at::Tensor run_attention(const AttentionCall& call) {
  const AttentionPath& path = select_path(call);
  if (path.run != nullptr) return path.run(call);
  const LoweredCall low = path.lower(call);
  at::Tensor out = run_attention(lowered(call, low));
  if (low.zero_rows.defined()) out = out.masked_fill(low.zero_rows, 0);
  if (low.squeeze_heads) out = out.squeeze(1);
  return out;
}

std::vector<std::string> explain_attention(const AttentionCall& call) {
  const AttentionPath& path = select_path(call);
  std::vector<std::string> names{std::string(path.name)};
  if (path.lower != nullptr) {
    const LoweredCall low = path.lower(call);
    const std::vector<std::string> rest = explain_attention(lowered(call, low));
    names.insert(names.end(), rest.begin(), rest.end());
  }
  return names;
}

std::string attention_paths_markdown() {
  std::ostringstream out;
  out << "| # | path | applies to | runs |\n|---|---|---|---|\n";
  int i = 1;
  for (const AttentionPath& p : kPaths)
    out << "| " << i++ << " | `" << p.name << "` | " << p.when << " | " << p.does << " |\n";
  return out.str();
}

int64_t causal_flex_max_keys(kernels::cpu::Isa isa) {
  // Where the causal prefill kernel that flex's causal instance replaced measured faster
  // than ATen's flash kernel, by instruction set (kernel / ATen time, interleaved
  // medians, 2 threads, q [B, H, T, 64] over T keys):
  // - AVX2, AMD EPYC Zen 3 (no AVX-512): T 128 0.43, 512 0.96-1.02 (9 and 32 heads),
  //   1024 1.24, 2048 1.53, 4096 2.01: the kernel reads every visible key once per
  //   block of 4 rows, which outgrows the caches where ATen's blocked GEMMs do not.
  // - AVX-512, AMD EPYC Zen 5 (medians of 9, 3 past 4096): 9 heads over 3, T 128 0.41,
  //   512 0.39, 1024 0.56, 16384 0.87; 12 heads, B=4, T 512 0.46, 1024 0.60; 32 heads
  //   over 8, T 512 0.41, 1024 0.58, 2048 0.68, 4096 0.82, 8192 0.88. Faster at 512 on
  //   an Intel Xeon too, not measured beyond there.
  // Flex under flex::Causal then measured 0.74-0.87x that kernel's time (AMD EPYC Zen 4,
  // AVX-512, B=1 H=12, T 256 to 4096, torchattn_bench_flex --only causal_forward; 0.81-
  // 0.92x capped to AVX2 at T 256 to 1024) and below ATen's at every T measured there
  // (0.54x at 256, 0.90x at 4096), so the limits stand: up to 512 keys with AVX2 and
  // 16384 (the most measured) with AVX-512; ATen's kernel past that (and without AVX2).
  switch (isa) {
    case kernels::cpu::Isa::Avx512Vnni:  // the float kernel runs as on Avx512
    case kernels::cpu::Isa::Avx512:
      return 16384;
    case kernels::cpu::Isa::Avx2:
      return 512;
    case kernels::cpu::Isa::Scalar:
      break;
  }
  return 0;
}

}  // namespace torchattn::backends
