#include "models/text/pretokenize.h"

#include <c10/util/Exception.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <stdexcept>

namespace torchattn::models::text {

namespace {

// The text as code points, with each one's byte offset.
struct CodePoints {
  std::vector<UChar32> c;
  std::vector<size_t> at;  // at[i]: byte offset of c[i]; at[size] = text size
};

CodePoints decode(std::string_view text) {
  CodePoints out;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < n;) {
    out.at.push_back(static_cast<size_t>(i));
    UChar32 c;
    U8_NEXT_OR_FFFD(s, i, n, c);
    out.c.push_back(c);
  }
  out.at.push_back(text.size());
  return out;
}

// \p{L} and \p{N}: ICU's general-category masks of letters (Lu Ll Lt Lm Lo) and
// numbers (Nd Nl No).
bool is_letter(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_L_MASK) != 0; }

bool is_number(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0; }

bool is_space(UChar32 c) { return u_isUWhiteSpace(c); }

bool is_newline(UChar32 c) { return c == '\r' || c == '\n'; }

bool is_other(UChar32 c) {  // [^\s\p{L}\p{N}]
  return !is_space(c) && !is_letter(c) && !is_number(c);
}

// The matcher: each function returns the end of a match starting at i, or i for none.
struct Matcher {
  const std::vector<UChar32>& c;
  size_t n;

  template <typename Pred>
  size_t run(size_t i, Pred p) const {
    while (i < n && p(c[i])) ++i;
    return i;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (ASCII).
  size_t contraction(size_t i, bool ignore_case) const {
    if (i + 1 >= n || c[i] != '\'') return i;
    auto lower = [&](UChar32 x) { return ignore_case && x >= 'A' && x <= 'Z' ? x + 32 : x; };
    const UChar32 a = lower(c[i + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const UChar32 b = lower(c[i + 2]);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    return i;
  }

  // ` ?X+` for a class X.
  template <typename Pred>
  size_t space_then_run(size_t i, Pred p) const {
    const size_t from = (c[i] == ' ' && i + 1 < n && p(c[i + 1])) ? i + 1 : i;
    const size_t end = run(from, p);
    return end > from ? end : i;
  }

  // \s+(?!\S): a whitespace run, less its last character when a non-space follows.
  size_t spaces_not_before_text(size_t i) const {
    const size_t end = run(i, is_space);
    if (end == i) return i;
    if (end == n) return end;
    return end - 1 > i ? end - 1 : i;
  }

  size_t spaces(size_t i) const { return run(i, is_space); }

  size_t gpt2(size_t i) const {
    size_t e;
    if ((e = contraction(i, false)) > i) return e;
    if ((e = space_then_run(i, is_letter)) > i) return e;
    if ((e = space_then_run(i, is_number)) > i) return e;
    if ((e = space_then_run(i, is_other)) > i) return e;
    if ((e = spaces_not_before_text(i)) > i) return e;
    return spaces(i);
  }

  size_t qwen2(size_t i) const {
    size_t e;
    if ((e = contraction(i, true)) > i) return e;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_newline(c[i]) && !is_letter(c[i]) && !is_number(c[i]) && i + 1 < n && is_letter(c[i + 1])) {
      return run(i + 1, is_letter);
    }
    if (is_letter(c[i])) return run(i, is_letter);
    if (is_number(c[i])) return i + 1;  // \p{N}: one at a time
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if ((e = space_then_run(i, is_other)) > i) return run(e, is_newline);
    // \s*[\r\n]+: up to the last newline of the whitespace run
    const size_t end = run(i, is_space);
    for (size_t j = end; j > i; --j) {
      if (is_newline(c[j - 1])) return j;
    }
    if ((e = spaces_not_before_text(i)) > i) return e;
    return spaces(i);
  }
};

}  // namespace

SplitPattern pattern_from_regex(const std::string& regex) {
  if (regex == R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)") {
    return SplitPattern::GPT2;
  }
  if (regex ==
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)") {
    return SplitPattern::Qwen2;
  }
  TORCH_CHECK(false, "tokenizer: the split pattern " + regex +
                         " is not one this tokenizer knows (GPT-2's or Qwen2's); pass --prompt-ids instead");
}

std::vector<std::string> split(std::string_view text, SplitPattern pattern) {
  const CodePoints cp = decode(text);
  const Matcher m{cp.c, cp.c.size()};
  std::vector<std::string> out;
  for (size_t i = 0; i < m.n;) {
    size_t e = pattern == SplitPattern::GPT2 ? m.gpt2(i) : m.qwen2(i);
    if (e == i) e = i + 1;  // cannot happen: the last alternative matches any character class left
    out.emplace_back(text.substr(cp.at[i], cp.at[e] - cp.at[i]));
    i = e;
  }
  return out;
}

std::vector<std::string> split_digits(std::string_view text) {
  const CodePoints cp = decode(text);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cp.c.size(); ++i) {
    if (u_charType(cp.c[i]) == U_DECIMAL_DIGIT_NUMBER) {
      if (i > start) out.emplace_back(text.substr(cp.at[start], cp.at[i] - cp.at[start]));
      out.emplace_back(text.substr(cp.at[i], cp.at[i + 1] - cp.at[i]));
      start = i + 1;
    }
  }
  if (start < cp.c.size()) out.emplace_back(text.substr(cp.at[start], cp.at.back() - cp.at[start]));
  return out;
}

}  // namespace torchattn::models::text
