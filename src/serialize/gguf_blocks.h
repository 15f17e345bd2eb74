#pragma once

// ggml's block formats as a GGUF file stores tensors (gguf.h): each type's block of
// values and its bytes, and the dequantization of the types torchattn reads, to the same
// float32 bits as ggml's reference code and the gguf Python package (a product and a sum
// each rounded, never fused: this file is compiled with -ffp-contract=off).

#include <cstdint>

namespace torchattn::serialize {

struct GgufTypeTraits {
  const char* name;
  int64_t block_size;  // values in a block
  int64_t type_size;   // bytes of a block
  bool read;           // whether dequantize_blocks takes it
};

/// ggml's traits of type code `type` (the gguf Python package's GGML_QUANT_SIZES), or
/// null for a code ggml does not name.
const GgufTypeTraits* gguf_traits(uint32_t type);

/// `blocks` consecutive blocks of `type` (traits read) at `src` into `dst`: blocks *
/// block_size floats.
//
//   F32, F16, BF16   one value a block
//   Q8_0             d (f16), q[32] int8:          x = q d
//   Q4_0             d, 16 bytes of nibbles:       x = (q - 8) d   (low nibbles the first 16)
//   Q4_1             d, m (f16), 16 bytes:         x = q d + m
//   Q4_K             d, dmin (f16), 12 bytes of 6-bit scales and mins for 8 sub-blocks
//                    of 32, 128 bytes of nibbles:  x = (d sc) q - (dmin m)
//   Q5_K             as Q4_K with a fifth bit for each value in 32 bytes of qh
//   Q6_K             ql[128] (low 4 bits), qh[64] (high 2), scales int8[16] for 16
//                    groups of 16, d (f16):        x = (d scale) (q - 32)
void dequantize_blocks(uint32_t type, const uint8_t* src, int64_t blocks, float* dst);

/// Q4_K's and Q5_K's scale `sc` and min `m` (6 bits each) of sub-block j (0..7) from
/// the block's 12 packed bytes at `scales`.
void k_scale_min(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m);

}  // namespace torchattn::serialize
