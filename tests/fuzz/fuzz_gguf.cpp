// libFuzzer target: the GGUF reader (include/torchattn/gguf.h) on arbitrary bytes. The
// only exception it accepts is c10::Error (a damaged file, named); every metadata value
// is read through its accessor and every tensor that opens is dequantized and summed (its
// last row apart too, a 4-bit one as int4 weights, a matrix as int8 weights), so a read past the bytes would
// be a sanitizer finding.

#include <torchattn/gguf.h>

#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = torchattn::GgufFile::parse(data, size, "fuzz");
    for (const auto& [key, value] : f.metadata()) {
      if (value.kind == torchattn::GgufValue::Kind::String) (void)f.string(key).size();
    }
    for (const auto& t : f.tensors()) {
      (void)at::sum(f.dequantize(t.name).to(at::kDouble)).item<double>();
      (void)f.raw(t.name).sum().item<int64_t>();
      if (!t.shape.empty() && t.shape[0] > 0) {
        try {
          (void)at::sum(f.dequantize_rows(t.name, t.shape[0] - 1, 1).to(at::kDouble)).item<double>();
        } catch (const c10::Error&) {
          // rows that are not whole blocks: refused, named
        }
      }
      if (t.shape.size() == 2) {
        try {
          const auto [q, dm] = f.int4_weights(t.name);
          (void)q.sum().item<int64_t>();
          (void)at::sum(dm.to(at::kDouble)).item<double>();
        } catch (const c10::Error&) {
          // a scale past float16's range, inputs not a multiple of 32: refused, named
        }
      }
      if (t.shape.size() == 2) {
        try {
          const auto [q8, s8] = f.int8_weights(t.name);
          (void)q8.sum().item<int64_t>();
          (void)at::sum(s8.to(at::kDouble)).item<double>();
        } catch (const c10::Error&) {
          // a non-finite value, or rows that are not whole blocks: refused, named
        }
      }
      f.release(t.name);
    }
  } catch (const c10::Error&) {
    // A damaged file, reported.
  }
  return 0;
}
