// GgufFile::int4_weights: any tensor of a GGUF file as torchattn's int4 weights; ggml's
// 4-bit blocks with their 4-bit values as the file holds them, the other types quantized
// from their float32 values.
//
// int4 (WeightFormat::Int4, kernels/cpu/int4_rows.h) keeps groups of 32 inputs: 16
// bytes, byte j holding value j in its low nibble and value j + 16 in its high one, and
// a float16 pair (d, m) per group, x = d q + m. Q4_0 and Q4_1 blocks are such groups
// (Q4_0: x = d (q - 8), so m = -8 d); Q4_K's super-blocks of 256 are eight sub-blocks
// of 32 with 6-bit scales and mins, x = (d sc) q - (dmin m), their nibbles in runs of
// 32 bytes (sub-block 2i in the low nibbles, 2i + 1 in the high ones).

#include <torchattn/gguf.h>

#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/vec.h"
#include "serialize/gguf_blocks.h"

#include <torchattn/weight_format.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace torchattn {

namespace {

constexpr int64_t kGroup = kInt4GroupSize;

uint16_t half_at(const uint8_t* p) {
  uint16_t bits = 0;
  std::memcpy(&bits, p, 2);  // little-endian, as GGUF (and x86)
  return bits;
}

float widened(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }

// An infinity or a NaN: the exponent's bits all ones.
bool non_finite(uint16_t half) { return (half & 0x7c00u) == 0x7c00u; }

// One Q4_K super-block (144 bytes) as eight int4 groups: 128 bytes of nibbles at q and
// the groups' 16 (d, m) values, float32, at dm (made float16 by the caller). d sc and
// dmin m are exact in float32 (11 and 6 significant bits): one rounding, to float16.
void q4_k_groups(const uint8_t* block, uint8_t* q, float* dm) {
  const float d = widened(half_at(block)), dmin = widened(half_at(block + 2));
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  for (int64_t s = 0; s < 8; ++s) {
    uint8_t sc = 0, m = 0;
    serialize::k_scale_min(static_cast<int>(s), scales, sc, m);
    dm[2 * s] = d * static_cast<float>(sc);
    dm[2 * s + 1] = -(dmin * static_cast<float>(m));
    const uint8_t* run = qs + 32 * (s / 2);
    const int shift = static_cast<int>(4 * (s % 2));
    uint8_t* out = q + 16 * s;
    for (int64_t j = 0; j < 16; ++j) {
      out[j] = static_cast<uint8_t>(((run[j] >> shift) & 0x0F) | (((run[j + 16] >> shift) & 0x0F) << 4));
    }
  }
}

// The 4-bit blocks of a Q4_0, Q4_1 or Q4_K tensor [out, in] as int4 groups, their values
// kept. A block whose float16 (d, m) would not be finite is an error naming it.
std::pair<at::Tensor, at::Tensor> four_bit_blocks(const std::string& path, const std::string& name,
                                                  const GgufTensorInfo& t, const uint8_t* src) {
  const serialize::GgufTypeTraits& traits = *serialize::gguf_traits(t.type);
  const int64_t out = t.shape[0], in = t.shape[1];
  // The parser took rows of whole blocks, and every block is whole groups of 32.
  const int64_t blocks = out * (in / traits.block_size), groups_a_block = traits.block_size / kGroup;
  at::Tensor data = at::empty({out, in / 2}, at::kByte);
  at::Tensor scale = at::empty({out, in / kGroup, 2}, at::kHalf);
  uint8_t* q = data.mutable_data_ptr<uint8_t>();
  auto* dm = reinterpret_cast<uint16_t*>(scale.mutable_data_ptr<at::Half>());
  const bool q4_k = t.type == static_cast<uint32_t>(GgufType::Q4_K);
  const bool q4_0 = t.type == static_cast<uint32_t>(GgufType::Q4_0);
  std::atomic<int64_t> first_bad{blocks};
  // Blocks a batch: the scales made float16 together (F16C where the CPU has it:
  // kernels::cpu::narrow_halves), from a buffer on the stack.
  constexpr int64_t kBatch = 64;
  at::parallel_for(0, blocks, std::max<int64_t>(1, 16384 / traits.block_size), [&](int64_t b0, int64_t b1) {
    float f[kBatch * 16];
    uint16_t h[kBatch];
    for (int64_t c0 = b0; c0 < b1; c0 += kBatch) {
      const int64_t c1 = std::min(b1, c0 + kBatch);
      int64_t bad = -1;
      if (q4_k) {  // every (d, m) made here: straight into dm, then checked
        for (int64_t b = c0; b < c1; ++b) {
          q4_k_groups(src + b * traits.type_size, q + b * groups_a_block * (kGroup / 2), f + (b - c0) * 16);
        }
        kernels::cpu::narrow_halves(f, (c1 - c0) * 16, dm + c0 * 16);
        for (int64_t i = 0; i < (c1 - c0) * 16 && bad < 0; ++i) {
          if (non_finite(dm[c0 * 16 + i])) bad = c0 + i / 16;
        }
      } else {  // Q4_0 and Q4_1: one group a block, d as the file holds it
        for (int64_t b = c0; b < c1; ++b) {
          const uint8_t* block = src + b * traits.type_size;
          dm[2 * b] = half_at(block);
          if (q4_0) f[b - c0] = -8.0f * widened(dm[2 * b]);  // exact below 8192 = 65504 / 8
          if (!q4_0) dm[2 * b + 1] = half_at(block + 2);
          std::memcpy(q + b * (kGroup / 2), block + (q4_0 ? 2 : 4), kGroup / 2);
        }
        if (q4_0) {
          kernels::cpu::narrow_halves(f, c1 - c0, h);
          for (int64_t b = c0; b < c1; ++b) {
            dm[2 * b + 1] = h[b - c0];
            if (bad < 0 && non_finite(h[b - c0])) bad = b;
          }
        }
      }
      if (bad >= 0) {
        int64_t seen = first_bad.load();
        while (bad < seen && !first_bad.compare_exchange_weak(seen, bad)) {}
      }
    }
  });
  TORCH_CHECK(first_bad.load() == blocks, "gguf: '", path, "': tensor '", name, "' block ", first_bad.load(),
              ": a group's ", q4_k ? "d sc or dmin m" : "-8 d", " is past float16's range, which int4's scales hold");
  return {data, scale};
}

}  // namespace

bool GgufFile::int4_type(uint32_t type) {
  return type == static_cast<uint32_t>(GgufType::Q4_0) || type == static_cast<uint32_t>(GgufType::Q4_1) ||
         type == static_cast<uint32_t>(GgufType::Q4_K);
}

std::pair<at::Tensor, at::Tensor> GgufFile::int4_weights(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  TORCH_CHECK(t.shape.size() == 2, "gguf: '", path_, "': tensor '", name, "' has ", t.shape.size(),
              " dimensions; int4_weights takes [out, in]");
  if (int4_type(t.type)) return four_bit_blocks(path_, name, t, data_ + t.offset);
  const int64_t out = t.shape[0], in = t.shape[1];
  TORCH_CHECK(in % kGroup == 0, "gguf: '", path_, "': tensor '", name, "' of ", gguf_type_name(t.type), " [", out, ", ",
              in, "] has ", in, " inputs, not a multiple of ", kGroup, ": int4 cannot hold it (int8 can)");
  // Quantized a slice of rows at a time (int4's groups lie within a row, so a slice's
  // rows quantize as the whole's): one slice in float32 (at most 1M values, 4 MB), its
  // buffer reused by the allocator, where the whole tensor would be 67 MB at 1B
  // (ffn_down) of fresh pages.
  const int64_t rows_a_step = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(in, 1));
  at::Tensor data = at::empty({out, in / 2}, at::kByte);
  at::Tensor scale = at::empty({out, in / kGroup, 2}, at::kHalf);
  for (int64_t first = 0; first < out; first += rows_a_step) {
    const int64_t n = std::min(rows_a_step, out - first);
    std::pair<at::Tensor, at::Tensor> slice;
    try {
      slice = kernels::cpu::quantize_int4_groups(dequantize_rows(name, first, n));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "gguf: '", path_, "': tensor '", name, "' rows [", first, ", ", first + n,
                  "): ", e.what_without_backtrace());
    }
    data.narrow(0, first, n).copy_(slice.first);
    scale.narrow(0, first, n).copy_(slice.second);
  }
  return {data, scale};
}

}  // namespace torchattn
