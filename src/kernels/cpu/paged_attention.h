#pragma once

// Attention over a PagedKVCache on the CPU for the rows of a step that decode (one
// token) or bring a short chunk: each query row reads its sequence's keys and values
// from the pool through the step's key slots, so nothing is gathered. Row for row the
// same arithmetic as decode_attention over a contiguous cache (the same scores, the
// same order of sums), so a decoding step gives the bits the contiguous path gives.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torchattn::kernels::cpu {

/// The most new tokens of one sequence the kernel takes; a longer prefill chunk goes
/// to ATen's fused kernels over its gathered keys.
inline constexpr int64_t kPagedKernelRows = 16;

/// Whether paged_attention applies: q a float32 CPU [N, H, d] with unit stride in d;
/// keys and values float32 CPU [slots, Hkv, d] contiguous (a layer's storage,
/// flattened); H a multiple of Hkv; no gradient to compute.
bool paged_attention_applies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values);

/// The keys and visible rows of one step (see PagedStep): sequence s brings the q rows
/// query_start[s] .. query_start[s + 1] (n_s rows, the last n_s of its L_s tokens), and
/// its keys are at key_slots[key_start[s] .. key_start[s + 1]) (L_s of them, oldest
/// first). Row i of s stands at position L_s - n_s + i and sees keys max(0, position -
/// window + 1) .. position.
struct PagedRows {
  const int64_t* key_slots = nullptr;
  const std::vector<int64_t>* query_start = nullptr;
  const std::vector<int64_t>* key_start = nullptr;
  std::optional<int64_t> window;
};

/// Computes the rows of the sequences listed in `which` (each with at most
/// kPagedKernelRows rows) into out [N, H, d] (float32, contiguous); other rows are left
/// as they are. scale: the factor of the scores. Requires paged_attention_applies.
void paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const PagedRows& rows,
                     const std::vector<int64_t>& which, double scale, at::Tensor& out);

} // namespace torchattn::kernels::cpu
