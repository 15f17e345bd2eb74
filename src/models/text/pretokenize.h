#pragma once

// The regular expressions that byte-level BPE tokenizers split text with before
// merging, matched by hand over Unicode code points (ICU gives the character
// classes: \p{L} letters, \p{N} numbers, \s White_Space), with the semantics of the
// regex engines Hugging Face tokenizers use: leftmost alternative first, greedy
// repetition, backtracking only where a pattern needs it.

#include <string>
#include <string_view>
#include <vector>

namespace torchattn::models::text {

enum class SplitPattern {
  /// GPT-2 (and SmolLM2, via ByteLevel's use_regex):
  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  GPT2,
  /// Qwen2 (a Split pre-tokenizer):
  /// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,
};

/// The pattern whose regex text (as tokenizer.json writes it) is `regex`; throws a
/// c10::Error naming it when it is none of the above.
SplitPattern pattern_from_regex(const std::string& regex);

/// The pieces of `text` (UTF-8) the pattern matches, left to right, covering it.
std::vector<std::string> split(std::string_view text, SplitPattern pattern);

/// Every digit its own piece (the Digits pre-tokenizer with individual_digits), the
/// rest kept in runs.
std::vector<std::string> split_digits(std::string_view text);

}  // namespace torchattn::models::text
