#pragma once

// Text that is not UTF-8: where its first bad byte is (the public find_invalid_utf8),
// and an error naming that byte and its offset (Hugging Face tokenizers cannot take such
// text: Python's str and Rust's &str are UTF-8).

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace torchattn::models::text {

// The well-formed byte sequences of the Unicode standard's table 3-7 (as Rust's str and
// Python's str.decode("utf-8") accept them).
inline std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint8_t low = 0x80, high = 0xBF;  // the second byte's range
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;   // not overlong
      if (b == 0xED) high = 0x9F;  // not a surrogate
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;   // not overlong
      if (b == 0xF4) high = 0x8F;  // at most U+10FFFF
    } else {
      return i;  // a continuation byte, or a byte no UTF-8 has
    }
    if (i + length > n || s[i + 1] < low || s[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += length;
  }
  return std::nullopt;
}


/// fn: the caller ("Tokenizer::encode"); what: the text as the caller names it ("text 3").
inline void check_utf8(const char* fn, std::string_view text, const std::string& what = "text") {
  const auto bad = first_invalid_utf8(text);
  if (!bad) return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[*bad])));
  TORCH_CHECK(false, fn, ": expected UTF-8 text, got ", what, " with the byte ", byte, " at offset ", *bad,
              ", which is not valid UTF-8 (Hugging Face tokenizers take only UTF-8 text)");
}

}  // namespace torchattn::models::text
