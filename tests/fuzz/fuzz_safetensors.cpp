// libFuzzer target: the safetensors parser on arbitrary bytes. The only exception it
// accepts is c10::Error (a damaged file, named); every tensor that loads is read
// through, so a view past the bytes would be a sanitizer finding.

#include <torchattn/safetensors.h>

#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    for (const auto& [name, t] : torchattn::parse_safetensors(data, size, "fuzz")) {
      if (t.numel() > 0 && t.scalar_type() != at::kBool) {
        (void)at::sum(t.to(at::kDouble)).item<double>();
      } else {
        (void)t.any();
      }
    }
  } catch (const c10::Error&) {
    // A damaged file, reported.
  }
  return 0;
}
