#pragma once

// Text that is not UTF-8 is an error naming its first bad byte and that byte's offset
// (Hugging Face tokenizers cannot take such text: Python's str and Rust's &str are UTF-8).

#include <torchattn/models/tokenizer.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <string_view>

namespace torchattn::models::text {

/// fn: the caller ("Tokenizer::encode"); what: the text as the caller names it ("text 3").
inline void check_utf8(const char* fn, std::string_view text, const std::string& what = "text") {
  const auto bad = find_invalid_utf8(text);
  if (!bad) return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[*bad])));
  TORCH_CHECK(false, fn, ": expected UTF-8 text, got ", what, " with the byte ", byte, " at offset ", *bad,
              ", which is not valid UTF-8 (Hugging Face tokenizers take only UTF-8 text)");
}

}  // namespace torchattn::models::text
