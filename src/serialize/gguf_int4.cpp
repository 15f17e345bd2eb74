// GgufFile::int4_weights: ggml's 4-bit blocks as torchattn's int4 weights, their 4-bit
// values as the file holds them.
//
// int4 (WeightFormat::Int4, kernels/cpu/int4_rows.h) keeps groups of 32 inputs: 16
// bytes, byte j holding value j in its low nibble and value j + 16 in its high one, and
// a float16 pair (d, m) per group, x = d q + m. Q4_0 and Q4_1 blocks are such groups
// (Q4_0: x = d (q - 8), so m = -8 d); Q4_K's super-blocks of 256 are eight sub-blocks
// of 32 with 6-bit scales and mins, x = (d sc) q - (dmin m), their nibbles in runs of
// 32 bytes (sub-block 2i in the low nibbles, 2i + 1 in the high ones).

#include <torchattn/gguf.h>

#include "serialize/gguf_blocks.h"

#include <torchattn/weight_format.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
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

// v rounded to float16's bits; false where it is past float16's range.
bool to_half(float v, uint16_t& bits) {
  const c10::Half h(v);
  bits = h.x;
  return std::isfinite(static_cast<float>(h));
}

// One Q4_K super-block (144 bytes) as eight int4 groups: 128 bytes of nibbles at q and
// 16 float16 (d, m) pairs at dm. False where a group's d sc or dmin m passes float16.
bool q4_k_groups(const uint8_t* block, uint8_t* q, uint16_t* dm) {
  const float d = widened(half_at(block)), dmin = widened(half_at(block + 2));
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  bool fits = true;
  for (int64_t s = 0; s < 8; ++s) {
    uint8_t sc = 0, m = 0;
    serialize::k_scale_min(static_cast<int>(s), scales, sc, m);
    // d sc and dmin m are exact in float32 (11 and 6 significant bits): one rounding.
    fits = to_half(d * static_cast<float>(sc), dm[2 * s]) && fits;
    fits = to_half(-(dmin * static_cast<float>(m)), dm[2 * s + 1]) && fits;
    const uint8_t* run = qs + 32 * (s / 2);
    const int shift = static_cast<int>(4 * (s % 2));
    uint8_t* out = q + 16 * s;
    for (int64_t j = 0; j < 16; ++j) {
      out[j] = static_cast<uint8_t>(((run[j] >> shift) & 0x0F) | (((run[j + 16] >> shift) & 0x0F) << 4));
    }
  }
  return fits;
}

// One Q4_0 (18 bytes) or Q4_1 (20 bytes) block as one int4 group. False where Q4_0's
// -8 d passes float16 (below 8192 = 65504 / 8 it is exact).
bool q4_block_group(bool q4_0, const uint8_t* block, uint8_t* q, uint16_t* dm) {
  dm[0] = half_at(block);
  bool fits = true;
  if (q4_0) {
    fits = to_half(-8.0f * widened(dm[0]), dm[1]);
  } else {
    dm[1] = half_at(block + 2);
  }
  std::memcpy(q, block + (q4_0 ? 2 : 4), kGroup / 2);
  return fits;
}

}  // namespace

bool GgufFile::int4_type(uint32_t type) {
  return type == static_cast<uint32_t>(GgufType::Q4_0) || type == static_cast<uint32_t>(GgufType::Q4_1) ||
         type == static_cast<uint32_t>(GgufType::Q4_K);
}

std::pair<at::Tensor, at::Tensor> GgufFile::int4_weights(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  TORCH_CHECK(int4_type(t.type), "gguf: '", path_, "': tensor '", name, "' is ", gguf_type_name(t.type),
              "; int4_weights takes Q4_0, Q4_1 and Q4_K (dequantize reads the others)");
  TORCH_CHECK(t.shape.size() == 2, "gguf: '", path_, "': tensor '", name, "' has ", t.shape.size(),
              " dimensions; int4_weights takes [out, in]");
  const serialize::GgufTypeTraits& traits = *serialize::gguf_traits(t.type);
  const int64_t out = t.shape[0], in = t.shape[1];
  // The parser took rows of whole blocks, and every block is whole groups of 32.
  const int64_t blocks_a_row = in / traits.block_size, groups_a_block = traits.block_size / kGroup;
  const int64_t groups = in / kGroup;
  at::Tensor data = at::empty({out, in / 2}, at::kByte);
  at::Tensor scale = at::empty({out, groups, 2}, at::kHalf);
  const uint8_t* src = data_ + t.offset;
  uint8_t* q = data.mutable_data_ptr<uint8_t>();
  auto* dm = reinterpret_cast<uint16_t*>(scale.mutable_data_ptr<at::Half>());
  const bool q4_k = t.type == static_cast<uint32_t>(GgufType::Q4_K);
  const bool q4_0 = t.type == static_cast<uint32_t>(GgufType::Q4_0);
  std::atomic<int64_t> first_bad{out * blocks_a_row};
  at::parallel_for(0, out * blocks_a_row, std::max<int64_t>(1, 16384 / traits.block_size), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* block = src + b * traits.type_size;
      uint8_t* qb = q + b * groups_a_block * (kGroup / 2);
      uint16_t* dmb = dm + b * groups_a_block * 2;
      const bool fits = q4_k ? q4_k_groups(block, qb, dmb) : q4_block_group(q4_0, block, qb, dmb);
      if (!fits) {
        int64_t seen = first_bad.load();
        while (b < seen && !first_bad.compare_exchange_weak(seen, b)) {}
      }
    }
  });
  TORCH_CHECK(first_bad.load() == out * blocks_a_row, "gguf: '", path_, "': tensor '", name, "' block ",
              first_bad.load(), ": a group's ", q4_k ? "d sc or dmin m" : "-8 d",
              " is past float16's range, which int4's scales hold");
  return {data, scale};
}

}  // namespace torchattn
