#pragma once

// Attention over a PagedKVCache on the CPU for the rows of one step: each query row reads
// its sequence's keys and values from the pool's blocks (nothing gathered), softmax in
// two passes, vectorized across the keys of a block (keys are kept transposed within
// a block, [head_dim, block_size], so that a block's scores are broadcast-FMAs with no
// horizontal sums) with AVX-512 or AVX2 where the CPU has them (simd.h).
//
// Each row's arithmetic depends on its own query, position and keys only: a row gives
// the same bits in any step, beside any rows, in a chunk of any size.

#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torchattn::kernels::cpu {

/// The most new tokens of one sequence the kernel takes per step; a longer prefill
/// chunk goes to ATen's fused kernels over its gathered keys.
inline constexpr int64_t kPagedKernelRows = 64;

/// Whether paged_attention applies: q a float32 CPU [N, H, d] with unit stride in d;
/// keys a float32 CPU [num_blocks, Hkv, d, block_size] and values [num_blocks, Hkv,
/// block_size, d], both contiguous (a layer's storage); H a multiple of Hkv; no
/// gradient to compute.
bool paged_attention_applies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values);

/// The keys and visible rows of one step (see PagedStep): sequence s brings the q rows
/// query_start[s] .. query_start[s + 1] (n_s rows, the last n_s of its L_s tokens), and
/// its token p sits in the pool at slot key_slots[key_start[s] + p] (block * block_size
/// + offset). Row i of s stands at position L_s - n_s + i and sees keys max(0,
/// position - window + 1) .. position.
struct PagedRows {
  const int64_t* key_slots = nullptr;
  const std::vector<int64_t>* query_start = nullptr;
  const std::vector<int64_t>* key_start = nullptr;
  std::optional<int64_t> window;
};

/// What changes the scores beyond q k^T * scale, in the order the attention paths
/// apply it (see backends/blocked.cpp): softcap * tanh(s / softcap) (Gemma 2), then
/// + slope_h * (key position - query position) (ALiBi); and sink logits that join each
/// row's softmax denominator (gpt-oss). The pointers: float32 [H], one per query head;
/// null: none.
struct PagedScores {
  std::optional<double> softcap;
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;
};

/// The vector instructions of the kernel (cpu_features.h): the widest the CPU has by
/// default.
using PagedIsa = Isa;
/// The ones this CPU runs, narrowest first (supported_isas(): Scalar always).
std::vector<PagedIsa> paged_isas();

/// Computes the rows of the sequences listed in `which` (each with at most
/// kPagedKernelRows rows) into out [N, H, d] (float32, contiguous); other rows are left
/// as they are. scale: the factor of the scores; extra: softcap, ALiBi and sinks.
/// isa: another of paged_isas() than the widest (tests). Requires
/// paged_attention_applies.
void paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const PagedRows& rows,
                     const std::vector<int64_t>& which, double scale, at::Tensor& out,
                     std::optional<PagedIsa> isa = std::nullopt, const PagedScores& extra = {});

}  // namespace torchattn::kernels::cpu
