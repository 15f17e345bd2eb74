// flex_attention's compile-time refusals (include/torchattn/flex/mods.h, dual.h). Built
// as it is (the target flex_signatures_ok, part of every build), it holds the right way
// to write each mod and must compile. With -DFLEX_REFUSED (the target
// flex_signatures_refused, built by ctest -R flex_signatures through
// tests/compile_errors.cmake) each block below is written the way a user slips, and each
// must be one compile error naming what is expected, none from inside the kernels:
//   1. a score_mod that casts its score to a number (static_cast, a functional cast),
//      which would drop the backward's derivative;
//   2. a score_mod of three arguments; 3. one that takes a float score, not a generic
//      one; 4. a mask_mod of two arguments; 5. a mask_mod that returns nothing.

#include <torchattn/flex_attention.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex_signatures {

at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto causal = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return kv_idx <= q_idx; };
  const auto mask = torchattn::create_block_mask(causal, 1, 1, q.size(2), k.size(2));
#ifndef FLEX_REFUSED
  const auto halve = [](auto score, int64_t, int64_t, int64_t, int64_t) { return score * 0.5; };
  at::Tensor out = torchattn::flex_attention(q, k, v, halve, mask).output;
  out = out.add(torchattn::flex_attention(
                    q, k, v, [](auto score, int64_t, int64_t, int64_t, int64_t) { return score; }, mask)
                    .output);
  const auto window = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return q_idx - kv_idx < 4; };
  return out.add(
      torchattn::flex_attention(q, k, v, torchattn::create_block_mask(window, 1, 1, q.size(2), k.size(2))).output);
#else
  // 1. Casts: the derivative would be lost.
  const auto cast = [](auto score, int64_t, int64_t, int64_t, int64_t) {
    return decltype(score)(static_cast<float>(score) * 0.5f);
  };
  at::Tensor out = torchattn::flex_attention(q, k, v, cast, mask).output;
  const auto functional_cast = [](auto score, int64_t, int64_t, int64_t, int64_t) {
    return decltype(score)(double(score) + 1.0);
  };
  out = out.add(torchattn::flex_attention(q, k, v, functional_cast, mask).output);
  // 2. Three arguments.
  const auto three = [](auto score, int64_t q_idx, int64_t kv_idx) { return score + (q_idx - kv_idx); };
  out = out.add(torchattn::flex_attention(q, k, v, three, mask).output);
  // 3. A float score, not a generic one.
  const auto plain = [](float score, int64_t, int64_t, int64_t, int64_t) { return score * 0.5f; };
  out = out.add(torchattn::flex_attention(q, k, v, plain, mask).output);
  // 4. A mask_mod of two arguments.
  const auto two = [](int64_t q_idx, int64_t kv_idx) { return kv_idx <= q_idx; };
  out = out.add(
      torchattn::flex_attention(q, k, v, torchattn::create_block_mask(two, 1, 1, q.size(2), k.size(2))).output);
  // 5. A mask_mod that returns nothing.
  const auto nothing = [](int64_t, int64_t, int64_t, int64_t) {};
  return out.add(
      torchattn::flex_attention(q, k, v, torchattn::create_block_mask(nothing, 1, 1, q.size(2), k.size(2))).output);
#endif
}

}  // namespace flex_signatures
