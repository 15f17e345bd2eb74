#include "serialize/gguf_blocks.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstring>

namespace torchattn::serialize {

namespace {

// Indexed by ggml's type code; null names: codes ggml no longer uses.
constexpr GgufTypeTraits kTypes[] = {
    {"F32", 1, 4, true},         {"F16", 1, 2, true},        {"Q4_0", 32, 18, true},      {"Q4_1", 32, 20, true},
    {nullptr, 0, 0, false},      {nullptr, 0, 0, false},     {"Q5_0", 32, 22, false},     {"Q5_1", 32, 24, false},
    {"Q8_0", 32, 34, true},      {"Q8_1", 32, 40, false},    {"Q2_K", 256, 84, false},    {"Q3_K", 256, 110, false},
    {"Q4_K", 256, 144, true},    {"Q5_K", 256, 176, true},   {"Q6_K", 256, 210, true},    {"Q8_K", 256, 292, false},
    {"IQ2_XXS", 256, 66, false}, {"IQ2_XS", 256, 74, false}, {"IQ3_XXS", 256, 98, false}, {"IQ1_S", 256, 50, false},
    {"IQ4_NL", 32, 18, false},   {"IQ3_S", 256, 110, false}, {"IQ2_S", 256, 82, false},   {"IQ4_XS", 256, 136, false},
    {"I8", 1, 1, false},         {"I16", 1, 2, false},       {"I32", 1, 4, false},        {"I64", 1, 8, false},
    {"F64", 1, 8, false},        {"IQ1_M", 256, 56, false},  {"BF16", 1, 2, true},        {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},      {nullptr, 0, 0, false},     {"TQ1_0", 256, 54, false},   {"TQ2_0", 256, 66, false},
    {nullptr, 0, 0, false},      {nullptr, 0, 0, false},     {nullptr, 0, 0, false},      {"MXFP4", 32, 17, false},
    {"NVFP4", 64, 36, false},    {"Q1_0", 128, 18, false},
};

float half(const uint8_t* p) {
  uint16_t bits = 0;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const float lo = d * static_cast<float>(qs[j] & 0x0F), hi = d * static_cast<float>(qs[j] >> 4);
    y[j] = lo + m;
    y[j + 16] = hi + m;
  }
}

// Q4_K (qh null) and Q5_K: sub-blocks 2i and 2i + 1 from the low and high nibbles of
// the 32 bytes qs[32 i ..], and for Q5_K bit s of qh[l] as value l's fifth bit in
// sub-block s.
void q4_k(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  for (int64_t s = 0; s < 8; ++s) {
    uint8_t sc = 0, m = 0;
    k_scale_min(static_cast<int>(s), scales, sc, m);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int64_t shift = 4 * (s % 2);
    for (int64_t l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0F;
      if (qh != nullptr) v |= ((qh[l] >> s) & 1) << 4;
      const float scaled = ds * static_cast<float>(v);
      y[32 * s + l] = scaled - dm;
    }
  }
}

// Q6_K: 16 groups of 16 values; half h of the block (128 values) is 4 runs of 32: run r
// takes the low (r < 2) or high nibbles of ql[64 h + 32 (r % 2) ..] and bits 2r of
// qh[32 h ..].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t r = 0; r < 4; ++r) {
      const uint8_t* low_bytes = ql + 64 * h + 32 * (r % 2);
      const uint8_t* high_bytes = qh + 32 * h;
      const int low_shift = r < 2 ? 0 : 4, high_shift = static_cast<int>(2 * r);
      for (int64_t half_run = 0; half_run < 2; ++half_run) {   // 16 values share a scale
        const int64_t scale_index = 8 * h + 2 * r + half_run;  // of value 128 h + 32 r + 16 half_run
        const float ds = d * static_cast<float>(scales[scale_index]);
        for (int64_t l = 16 * half_run; l < 16 * half_run + 16; ++l) {
          const int low = (low_bytes[l] >> low_shift) & 0x0F;
          const int high = (high_bytes[l] >> high_shift) & 0x03;
          y[128 * h + 32 * r + l] = ds * static_cast<float>((low | (high << 4)) - 32);
        }
      }
    }
  }
}

}  // namespace

// 6 bits each: the first four in the low bits of bytes 0-7, the last four split between
// bytes 8-11 and the top bits of bytes 0-7.
void k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

const GgufTypeTraits* gguf_traits(uint32_t type) {
  if (type >= sizeof(kTypes) / sizeof(kTypes[0]) || kTypes[type].name == nullptr) return nullptr;
  return &kTypes[type];
}

void dequantize_blocks(uint32_t type, const uint8_t* src, int64_t blocks, float* dst) {
  const GgufTypeTraits* t = gguf_traits(type);
  TORCH_CHECK(t != nullptr && t->read, "dequantize_blocks: type ", type, " is not one torchattn reads");
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * t->type_size;
    float* y = dst + i * t->block_size;
    switch (type) {
      case 0:
        std::memcpy(y, b, 4);
        break;
      case 1:
        *y = half(b);
        break;
      case 30: {
        uint16_t bits = 0;
        std::memcpy(&bits, b, 2);
        *y = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
        break;
      }
      case 8:
        q8_0(b, y);
        break;
      case 2:
        q4_0(b, y);
        break;
      case 3:
        q4_1(b, y);
        break;
      case 12:
        q4_k(b, nullptr, b + 16, y);
        break;
      case 13:
        q4_k(b, b + 16, b + 48, y);
        break;
      case 14:
        q6_k(b, y);
        break;
      default:
        TORCH_CHECK(false, "dequantize_blocks: type ", t->name, " is not one torchattn reads");
    }
  }
}

}  // namespace torchattn::serialize
