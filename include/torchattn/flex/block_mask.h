#pragma once

// The block mask of flex_attention (flex_attention.h): which blocks of keys each block
// of queries computes, as PyTorch's torch.nn.attention.flex_attention.BlockMask records
// them, and the mask_mod that the partial blocks call.

#include <torchattn/flex/mods.h>
#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchattn {

/// A mask_mod that hides nothing (flex_attention without a block mask).
struct VisibleKeys {
  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t /*q_idx*/, int64_t /*kv_idx*/) const { return true; }
  flex::KeyRange keys(int64_t /*q_idx*/) const { return {}; }
};

/// The sizes a block mask was made for: batch and heads (1: the same for every one),
/// the query and key lengths, and the block size of both.
struct BlockMaskShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t block_size = 128;

  // Rounded up without overflow, whatever the sizes (a block_size near 2^63 included).
  int64_t q_blocks() const { return q_len / block_size + (q_len % block_size != 0 ? 1 : 0); }
  int64_t kv_blocks() const { return kv_len / block_size + (kv_len % block_size != 0 ? 1 : 0); }
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
  static_assert(flex::CheckedMaskMod<MaskMod>::value || true);  // a wrong mask_mod: one error, named there
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
  /// mask_mod as the kernels ask it for a partial block's key: with b = 0 where the
  /// mask was made for B = 1 and h = 0 where for H = 1, as create_block_mask asked it, so
  /// that a broadcast mask is one pattern for every batch and head whatever the block
  /// size (a mask_mod that reads b or h needs a mask made for B or H).
  bool visible(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) const {
    return mask_mod(shape.batch == 1 ? 0 : b, shape.heads == 1 ? 0 : h, q_idx, kv_idx);
  }

  KeyBlocks key_blocks(int64_t b, int64_t h, int64_t qb) const {
    const int64_t nk = shape.kv_blocks();
    const int64_t row = ((shape.batch == 1 ? 0 : b) * shape.heads + (shape.heads == 1 ? 0 : h)) * shape.q_blocks() + qb;
    return {{full_kv_indices.template const_data_ptr<int32_t>() + row * nk,
             kv_indices.template const_data_ptr<int32_t>() + row * nk},
            {full_kv_num_blocks.template const_data_ptr<int32_t>()[row],
             kv_num_blocks.template const_data_ptr<int32_t>()[row]}};
  }
};

namespace flex {

/// The total of n, checked for overflow: false where it passes int64.
inline bool product(std::initializer_list<int64_t> n, int64_t& out) {
  out = 1;
  for (const int64_t x : n) {
    if (__builtin_mul_overflow(out, x, &out)) return false;
  }
  return true;
}

/// create_block_mask's checks of its sizes, and the block size it uses: past both
/// lengths, max(q_len, kv_len) + 1 (any such size makes one block each way, never
/// full: the same mask). The index tensors must fit in memory and int32.
inline int64_t checked_block_size(int64_t B, int64_t H, int64_t q_len, int64_t kv_len, int64_t block_size) {
  TORCH_CHECK(B >= 1 && H >= 1, "create_block_mask: expected B and H of at least 1, got B ", B, " and H ", H);
  TORCH_CHECK(q_len >= 1 && kv_len >= 1, "create_block_mask: expected q_len and kv_len of at least 1, got q_len ",
              q_len, " and kv_len ", kv_len);
  TORCH_CHECK(block_size >= 1, "create_block_mask: expected a block_size of at least 1, got ", block_size);
  const int64_t longest = std::max(q_len, kv_len);
  const int64_t bs = block_size > longest ? longest + 1 : block_size;
  const BlockMaskShape shape{B, H, q_len, kv_len, bs};
  const int64_t nq = shape.q_blocks(), nk = shape.kv_blocks();
  TORCH_CHECK(nk <= std::numeric_limits<int32_t>::max(), "create_block_mask: kv_len ", kv_len, " in blocks of ", bs,
              " makes ", nk, " key blocks, past what the int32 indices hold; take a larger block_size");
  int64_t entries = 0, bytes = 0;
  const bool fits = product({B, H, nq, nk}, entries) && product({entries, 2 * int64_t{sizeof(int32_t)}}, bytes);
  const double need = static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(nq) *
                      static_cast<double>(nk) * 2.0 * sizeof(int32_t);
  const double memory = static_cast<double>(kernels::cpu::physical_memory_bytes());
  TORCH_CHECK(fits && static_cast<double>(bytes) <= memory, "create_block_mask: B ", B, " x H ", H, " x ", nq,
              " query blocks x ", nk, " key blocks need ", need / 1e9,
              " GB of block indices, more than this machine's ", memory / 1e9,
              " GB of memory; make it for B or H of 1 (one pattern for every batch or head), or take a "
              "larger block_size than ",
              bs);
  return bs;
}

}  // namespace flex

/// The block mask of mask_mod, any callable (int64_t b, int64_t h, int64_t q_idx,
/// int64_t kv_idx) -> bool, true where query q_idx of batch b and head h sees key
/// kv_idx. B or H of 1: one pattern for every batch or head (mask_mod called with 0,
/// here and by the kernels). Evaluates mask_mod once per (b, h, q_idx, kv_idx): B * H *
/// q_len * kv_len calls; a RangedMask (mods.h) once per (b, h, q_idx), by its runs of
/// keys. A block_size past both lengths makes one block each way, as
/// max(q_len, kv_len) + 1 does: that is the size recorded. A mask whose block indices
/// would not fit in memory (B x H x query blocks x key blocks) is an error naming them.
template <class MaskMod>
BlockMask<MaskMod> create_block_mask(MaskMod mask_mod, int64_t B, int64_t H, int64_t q_len, int64_t kv_len,
                                     int64_t block_size = 128) {
  if constexpr (!flex::CheckedMaskMod<MaskMod>::value) {
    return {};  // the signature's error is CheckedMaskMod's
  } else {
    block_size = flex::checked_block_size(B, H, q_len, kv_len, block_size);
    flex::check_mod(mask_mod, {B, H, q_len, kv_len});
    BlockMask<MaskMod> m{{B, H, q_len, kv_len, block_size}, {}, {}, {}, {}, std::move(mask_mod)};
    const int64_t nq = m.shape.q_blocks(), nk = m.shape.kv_blocks();
    const auto options = at::TensorOptions().dtype(at::kInt);
    try {
      m.kv_num_blocks = at::zeros({B, H, nq}, options);
      m.full_kv_num_blocks = at::zeros({B, H, nq}, options);
      m.kv_indices = at::empty({B, H, nq, nk}, options);
      m.full_kv_indices = at::empty({B, H, nq, nk}, options);
    } catch (const std::exception&) {  // within the machine's memory, but not free now
      TORCH_CHECK(false, "create_block_mask: B ", B, " x H ", H, " x ", nq, " query blocks x ", nk,
                  " key blocks of int32 block indices could not be allocated (the memory in use leaves too little); "
                  "make it for B or H of 1, or take a larger block_size than ",
                  block_size);
    }
    auto* partial_count = m.kv_num_blocks.template mutable_data_ptr<int32_t>();
    auto* full_count = m.full_kv_num_blocks.template mutable_data_ptr<int32_t>();
    auto* partial_index = m.kv_indices.template mutable_data_ptr<int32_t>();
    auto* full_index = m.full_kv_indices.template mutable_data_ptr<int32_t>();
    std::vector<int64_t> seen(static_cast<size_t>(nk));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t qb = 0; qb < nq; ++qb) {
          std::fill(seen.begin(), seen.end(), 0);
          const int64_t q0 = qb * block_size, rows = std::min(q_len - q0, block_size);
          if constexpr (std::is_same_v<MaskMod, VisibleKeys>) {  // every key: counted, not asked
            for (int64_t kb = 0; kb < nk; ++kb) {
              seen[static_cast<size_t>(kb)] = rows * std::min(kv_len - kb * block_size, block_size);
            }
          } else if constexpr (flex::RangedMask<MaskMod>) {  // one run of keys per query: counted
            for (int64_t i = q0; i < q0 + rows; ++i) {
              const flex::KeyRange run = m.mask_mod.keys(i) & flex::KeyRange{0, kv_len};
              for (int64_t kb = run.begin / block_size; run.begin < run.end && kb * block_size < run.end; ++kb) {
                seen[static_cast<size_t>(kb)] += std::min(run.end, (kb + 1) * block_size) -
                                                 std::max(run.begin, kb * block_size);
              }
            }
          } else {
            for (int64_t i = q0; i < q0 + rows; ++i) {
              for (int64_t j = 0; j < kv_len; ++j) {
                if (m.mask_mod(b, h, i, j)) ++seen[static_cast<size_t>(j / block_size)];
              }
            }
          }
          // A block is full when every one of its block_size x block_size places is
          // visible: never at a length's end, where some are past it.
          const auto full = [&](int64_t kb) {
            const int64_t cols = std::min(kv_len - kb * block_size, block_size);
            return rows == block_size && cols == block_size && seen[static_cast<size_t>(kb)] == rows * cols;
          };
          const int64_t row = (b * H + h) * nq + qb;
          int32_t* p = partial_index + row * nk;
          int32_t* f = full_index + row * nk;
          int32_t np = 0, nf = 0;
          for (int64_t kb = 0; kb < nk; ++kb) {
            if (full(kb)) {
              f[nf++] = static_cast<int32_t>(kb);
            } else if (seen[static_cast<size_t>(kb)] > 0) {
              p[np++] = static_cast<int32_t>(kb);
            }
          }
          partial_count[row] = np;
          full_count[row] = nf;
          // The blocks left after the counted ones, ascending (as PyTorch's stable sort).
          int32_t rp = np, rf = nf;
          for (int64_t kb = 0; kb < nk; ++kb) {
            const bool is_full = full(kb);
            if (is_full || seen[static_cast<size_t>(kb)] == 0) p[rp++] = static_cast<int32_t>(kb);
            if (!is_full) f[rf++] = static_cast<int32_t>(kb);
          }
        }
      }
    }
    return m;
  }
}

namespace flex {

/// The checks of a block mask's tensors (a BlockMask's fields are public: one built or
/// changed by hand must still be one the kernels can walk): int32 CPU tensors of
/// [batch, heads, q_blocks] and [batch, heads, q_blocks, kv_blocks], contiguous, counts
/// in [0, kv_blocks], the counted indices in [0, kv_blocks), and no key block listed
/// twice for one query block, in one list or as both full and partial. A block_size past
/// both lengths is one create_block_mask never records (it clamps to max + 1).
inline void check_block_mask(const BlockMaskShape& shape, const at::Tensor& full_count, const at::Tensor& full_index,
                             const at::Tensor& partial_count, const at::Tensor& partial_index) {
  TORCH_CHECK(shape.block_size >= 1 && shape.batch >= 1 && shape.heads >= 1,
              "flex_attention: expected a block_mask of block_size, batch and heads of at least 1, got block_size ",
              shape.block_size, ", batch ", shape.batch, " and heads ", shape.heads);
  TORCH_CHECK(shape.block_size <= std::max(shape.q_len, shape.kv_len) + 1, "flex_attention: block_mask's block_size ",
              shape.block_size, " is past both lengths (q_len ", shape.q_len, ", kv_len ", shape.kv_len, "): give ",
              std::max(shape.q_len, shape.kv_len) + 1, ", the same one block each way (create_block_mask records it)");
  const int64_t nq = shape.q_blocks(), nk = shape.kv_blocks();
  const char* names[2] = {"full_kv_num_blocks", "kv_num_blocks"};
  const at::Tensor* counts[2] = {&full_count, &partial_count};
  const at::Tensor* indices[2] = {&full_index, &partial_index};
  for (int kind = 0; kind < 2; ++kind) {
    const at::Tensor& count = *counts[kind];
    const at::Tensor& index = *indices[kind];
    TORCH_CHECK(count.defined() && index.defined() && count.scalar_type() == at::kInt &&
                    index.scalar_type() == at::kInt && count.device().is_cpu() && index.device().is_cpu() &&
                    count.is_contiguous() && index.is_contiguous() &&
                    count.sizes() == at::IntArrayRef({shape.batch, shape.heads, nq}) &&
                    index.sizes() == at::IntArrayRef({shape.batch, shape.heads, nq, nk}),
                "flex_attention: expected block_mask's ", names[kind], " of int32 [", shape.batch, ", ", shape.heads,
                ", ", nq, "] and its indices [..., ", nk, "] on the CPU, contiguous (as create_block_mask makes them)");
  }
  // Per query block, each key block listed: 0 none, 1 full, 2 partial.
  std::vector<uint8_t> listed(static_cast<size_t>(nk), 0);
  for (int64_t r = 0; r < full_count.numel(); ++r) {
    for (int kind = 0; kind < 2; ++kind) {
      const int32_t c = counts[kind]->const_data_ptr<int32_t>()[r];
      const int32_t* ix = indices[kind]->const_data_ptr<int32_t>() + r * nk;
      TORCH_CHECK(c >= 0 && c <= nk, "flex_attention: block_mask's ", names[kind], " holds ", c, ", expected 0 to ",
                  nk);
      for (int32_t j = 0; j < c; ++j) {
        TORCH_CHECK(ix[j] >= 0 && ix[j] < nk, "flex_attention: block_mask's ", names[kind], " lists the key block ",
                    ix[j], ", expected 0 to ", nk - 1);
        uint8_t& seen = listed[static_cast<size_t>(ix[j])];
        const int64_t qb = r % nq, h = r / nq % shape.heads, b = r / nq / shape.heads;
        TORCH_CHECK(seen == 0, "flex_attention: block_mask lists the key block ", ix[j], " twice for query block ", qb,
                    " (batch ", b, ", head ", h, "): ",
                    seen == kind + 1 ? std::string("twice in ") + names[kind]
                                     : "as both full (full_kv_indices) and partial (kv_indices)",
                    "; a key block is listed once, full or partial");
        seen = static_cast<uint8_t>(kind + 1);
      }
    }
    for (int kind = 0; kind < 2; ++kind) {
      const int32_t c = counts[kind]->const_data_ptr<int32_t>()[r];
      const int32_t* ix = indices[kind]->const_data_ptr<int32_t>() + r * nk;
      for (int32_t j = 0; j < c; ++j) listed[static_cast<size_t>(ix[j])] = 0;
    }
  }
}

}  // namespace flex

}  // namespace torchattn
