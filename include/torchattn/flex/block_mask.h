#pragma once

// The block mask of flex_attention (flex_attention.h): which blocks of keys each block
// of queries computes, as PyTorch's torch.nn.attention.flex_attention.BlockMask records
// them, and the mask_mod that the partial blocks call.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchattn {

/// A mask_mod that hides nothing (flex_attention without a block mask).
struct VisibleKeys {
  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t /*q_idx*/, int64_t /*kv_idx*/) const { return true; }
};

/// The sizes a block mask was made for: batch and heads (1: the same for every one),
/// the query and key lengths, and the block size of both.
struct BlockMaskShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t block_size = 128;

  int64_t q_blocks() const { return (q_len + block_size - 1) / block_size; }
  int64_t kv_blocks() const { return (kv_len + block_size - 1) / block_size; }
};

/// Per block of queries (a block: block_size positions, the last one shorter), the
/// blocks of keys it computes, as PyTorch's BlockMask (BLOCK_SIZE both ways):
/// - partial: some keys of the block visible, not all: mask_mod decides per key;
///   kv_num_blocks [batch, heads, q_blocks] int32 counts them, and kv_indices [batch,
///   heads, q_blocks, kv_blocks] int32 lists them first, ascending;
/// - full: every key of the block visible to every query of the block: computed without
///   mask_mod; full_kv_num_blocks and full_kv_indices, the same way;
/// - empty: every other block: never computed.
/// A block at the end of either length counts its positions past the length as hidden,
/// so it is never full (PyTorch's count too). The entries of kv_indices past the count
/// are the blocks left (ascending): read only the first kv_num_blocks.
template <class MaskMod>
struct BlockMask {
  BlockMaskShape shape;
  at::Tensor kv_num_blocks;
  at::Tensor kv_indices;
  at::Tensor full_kv_num_blocks;
  at::Tensor full_kv_indices;
  MaskMod mask_mod;

  /// The blocks of keys that block qb of queries of batch b and head h computes:
  /// index[0], count[0] the full ones, index[1], count[1] the partial ones (the tensors
  /// checked, as flex::check_block_mask does).
  struct KeyBlocks {
    const int32_t* index[2];
    int32_t count[2];
  };
  KeyBlocks key_blocks(int64_t b, int64_t h, int64_t qb) const {
    const int64_t nk = shape.kv_blocks();
    const int64_t row = ((shape.batch == 1 ? 0 : b) * shape.heads + (shape.heads == 1 ? 0 : h)) * shape.q_blocks() + qb;
    return {{full_kv_indices.template const_data_ptr<int32_t>() + row * nk,
             kv_indices.template const_data_ptr<int32_t>() + row * nk},
            {full_kv_num_blocks.template const_data_ptr<int32_t>()[row],
             kv_num_blocks.template const_data_ptr<int32_t>()[row]}};
  }
};

/// The block mask of mask_mod, any callable (int64_t b, int64_t h, int64_t q_idx,
/// int64_t kv_idx) -> bool, true where query q_idx of batch b and head h sees key
/// kv_idx. B or H of 1: one pattern for every batch or head (mask_mod called with 0).
/// Evaluates mask_mod once per (b, h, q_idx, kv_idx): B * H * q_len * kv_len calls.
template <class MaskMod>
BlockMask<MaskMod> create_block_mask(MaskMod mask_mod, int64_t B, int64_t H, int64_t q_len, int64_t kv_len,
                                     int64_t block_size = 128) {
  TORCH_CHECK(B >= 1 && H >= 1, "create_block_mask: expected B and H of at least 1, got B ", B, " and H ", H);
  TORCH_CHECK(q_len >= 1 && kv_len >= 1, "create_block_mask: expected q_len and kv_len of at least 1, got q_len ",
              q_len, " and kv_len ", kv_len);
  TORCH_CHECK(block_size >= 1, "create_block_mask: expected a block_size of at least 1, got ", block_size);
  BlockMask<MaskMod> m{{B, H, q_len, kv_len, block_size}, {}, {}, {}, {}, std::move(mask_mod)};
  const int64_t nq = m.shape.q_blocks(), nk = m.shape.kv_blocks(), whole = block_size * block_size;
  const auto options = at::TensorOptions().dtype(at::kInt);
  m.kv_num_blocks = at::zeros({B, H, nq}, options);
  m.full_kv_num_blocks = at::zeros({B, H, nq}, options);
  m.kv_indices = at::empty({B, H, nq, nk}, options);
  m.full_kv_indices = at::empty({B, H, nq, nk}, options);
  auto* partial_count = m.kv_num_blocks.template mutable_data_ptr<int32_t>();
  auto* full_count = m.full_kv_num_blocks.template mutable_data_ptr<int32_t>();
  auto* partial_index = m.kv_indices.template mutable_data_ptr<int32_t>();
  auto* full_index = m.full_kv_indices.template mutable_data_ptr<int32_t>();
  std::vector<int64_t> seen(static_cast<size_t>(nk));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t qb = 0; qb < nq; ++qb) {
        std::fill(seen.begin(), seen.end(), 0);
        const int64_t rows = std::min(q_len, (qb + 1) * block_size) - qb * block_size;
        if constexpr (std::is_same_v<MaskMod, VisibleKeys>) {  // every key: counted, not asked
          for (int64_t kb = 0; kb < nk; ++kb) {
            seen[static_cast<size_t>(kb)] = rows * (std::min(kv_len, (kb + 1) * block_size) - kb * block_size);
          }
        } else {
          for (int64_t i = qb * block_size; i < qb * block_size + rows; ++i) {
            for (int64_t j = 0; j < kv_len; ++j) {
              if (m.mask_mod(b, h, i, j)) ++seen[static_cast<size_t>(j / block_size)];
            }
          }
        }
        const int64_t row = (b * H + h) * nq + qb;
        int32_t* p = partial_index + row * nk;
        int32_t* f = full_index + row * nk;
        int32_t np = 0, nf = 0;
        for (int64_t kb = 0; kb < nk; ++kb) {
          const int64_t n = seen[static_cast<size_t>(kb)];
          if (n == whole) {
            f[nf++] = static_cast<int32_t>(kb);
          } else if (n > 0) {
            p[np++] = static_cast<int32_t>(kb);
          }
        }
        partial_count[row] = np;
        full_count[row] = nf;
        // The blocks left after the counted ones, ascending (as PyTorch's stable sort).
        int32_t rp = np, rf = nf;
        for (int64_t kb = 0; kb < nk; ++kb) {
          const int64_t n = seen[static_cast<size_t>(kb)];
          if (!(n > 0 && n < whole)) p[rp++] = static_cast<int32_t>(kb);
          if (n != whole) f[rf++] = static_cast<int32_t>(kb);
        }
      }
    }
  }
  return m;
}

namespace flex {

/// The checks of a block mask's tensors (a BlockMask's fields are public: one built or
/// changed by hand must still be one the kernels can walk): int32 CPU tensors of
/// [batch, heads, q_blocks] and [batch, heads, q_blocks, kv_blocks], contiguous, counts
/// in [0, kv_blocks] and the counted indices in [0, kv_blocks).
inline void check_block_mask(const BlockMaskShape& shape, const at::Tensor& count, const at::Tensor& index,
                             const char* name) {
  const int64_t nq = shape.q_blocks(), nk = shape.kv_blocks();
  TORCH_CHECK(shape.block_size >= 1 && shape.batch >= 1 && shape.heads >= 1,
              "flex_attention: expected a block_mask of block_size, batch and heads of at least 1");
  TORCH_CHECK(count.defined() && index.defined() && count.scalar_type() == at::kInt &&
                  index.scalar_type() == at::kInt && count.device().is_cpu() && index.device().is_cpu() &&
                  count.is_contiguous() && index.is_contiguous() &&
                  count.sizes() == at::IntArrayRef({shape.batch, shape.heads, nq}) &&
                  index.sizes() == at::IntArrayRef({shape.batch, shape.heads, nq, nk}),
              "flex_attention: expected block_mask's ", name, " of int32 [", shape.batch, ", ", shape.heads, ", ", nq,
              "] and its indices [..., ", nk, "] on the CPU, contiguous (as create_block_mask makes them)");
  const int32_t* c = count.const_data_ptr<int32_t>();
  const int32_t* ix = index.const_data_ptr<int32_t>();
  for (int64_t r = 0; r < count.numel(); ++r) {
    TORCH_CHECK(c[r] >= 0 && c[r] <= nk, "flex_attention: block_mask's ", name, " holds ", c[r], ", expected 0 to ",
                nk);
    for (int32_t j = 0; j < c[r]; ++j) {
      TORCH_CHECK(ix[r * nk + j] >= 0 && ix[r * nk + j] < nk, "flex_attention: block_mask's ", name,
                  " lists the key block ", ix[r * nk + j], ", expected 0 to ", nk - 1);
    }
  }
}

}  // namespace flex

}  // namespace torchattn
