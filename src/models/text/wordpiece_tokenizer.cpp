#include "models/text/wordpiece_tokenizer.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <cstring>

namespace torchattn::models::text {

namespace {

using json = nlohmann::json;

[[noreturn]] void unsupported(const std::string& what) {
  TORCH_CHECK(false, "tokenizer: ", what,
              "; this library reads WordPiece tokenizers of BERT's kind (BertNormalizer, "
              "BertPreTokenizer, WordPiece) and byte-level BPE tokenizers (GPT-2, SmolLM2, Qwen2)");
}

std::u32string to_utf32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < n;) {
    UChar32 c;
    U8_NEXT_OR_FFFD(s, i, n, c);
    out.push_back(static_cast<char32_t>(c));
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  char buf[4];
  int32_t n = 0;
  U8_APPEND_UNSAFE(reinterpret_cast<uint8_t*>(buf), n, static_cast<UChar32>(c));
  out.append(buf, static_cast<size_t>(n));
}

std::string to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : text) append_utf8(out, c);
  return out;
}

// The character classes of Hugging Face tokenizers' BERT normalizer and pre-tokenizer.
bool is_whitespace(char32_t c) {
  return c == '\t' || c == '\n' || c == '\r' || u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (u_charType(static_cast<UChar32>(c))) {  // Unicode's "Other": Cc, Cf, Cn, Co, Cs
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_UNASSIGNED:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      return true;
    default:
      return false;
  }
}

bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_punctuation(char32_t c) {
  if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  switch (u_charType(static_cast<UChar32>(c))) {  // Pc, Pd, Ps, Pe, Pi, Pf, Po
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// NFD, then without nonspacing marks (Mn).
std::u32string strip_accents(const std::u32string& text) {
  if (std::all_of(text.begin(), text.end(), [](char32_t c) { return c < 128; })) return text;
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  TORCH_CHECK(U_SUCCESS(status), "tokenizer: ICU has no NFD normalizer");
  icu::UnicodeString s = icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()),
                                                       static_cast<int32_t>(text.size()));
  const icu::UnicodeString d = nfd->normalize(s, status);
  TORCH_CHECK(U_SUCCESS(status), "tokenizer: NFD normalization failed");
  std::u32string out;
  for (int32_t i = 0; i < d.length();) {
    const UChar32 c = d.char32At(i);
    i += U16_LENGTH(c);
    if (u_charType(c) != U_NON_SPACING_MARK) out.push_back(static_cast<char32_t>(c));
  }
  return out;
}

// Each character's full lowercase mapping on its own (no context, as Rust's
// char::to_lowercase).
void append_lowercase(std::u32string& out, char32_t c) {
  if (c < 128) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  UChar in[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(in, n, static_cast<UChar32>(c));
  UChar lower[8];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t m = u_strToLower(lower, 8, in, n, "", &status);
  if (U_FAILURE(status)) {
    out.push_back(c);
    return;
  }
  for (int32_t i = 0; i < m;) {
    UChar32 l;
    U16_NEXT(lower, i, m, l);
    out.push_back(static_cast<char32_t>(l));
  }
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const json& t) : vocab_(t, "WordPiece") {
  const json& model = t.at("model");
  if (get_or<std::string>(model, "type", "?") != "WordPiece") unsupported("the model is not WordPiece");
  prefix_ = get_or<std::string>(model, "continuing_subword_prefix", "##");
  max_chars_ = get_or<size_t>(model, "max_input_chars_per_word", 100);
  const std::string unk = get_or<std::string>(model, "unk_token", "[UNK]");
  const auto unk_id = vocab_.piece(unk);
  if (!unk_id) unsupported("the unknown token '" + unk + "' is not in the vocabulary");
  unk_id_ = *unk_id;

  const json& norm = field(t, "normalizer");
  if (norm.is_null()) {
    normalizer_ = false;
  } else {
    if (get_or<std::string>(norm, "type", "") != "BertNormalizer") {
      unsupported("the normalizer " + get_or<std::string>(norm, "type", "?") + " (expected BertNormalizer)");
    }
    clean_text_ = get_or<bool>(norm, "clean_text", true);
    chinese_ = get_or<bool>(norm, "handle_chinese_chars", true);
    lowercase_ = get_or<bool>(norm, "lowercase", true);
    strip_accents_ = get_or<bool>(norm, "strip_accents", lowercase_);  // null: as lowercase
  }
  const json& pre = field(t, "pre_tokenizer");
  if (!pre.is_object() || get_or<std::string>(pre, "type", "") != "BertPreTokenizer") {
    unsupported("a pre-tokenizer other than BertPreTokenizer");
  }
  const json& dec = field(t, "decoder");
  if (dec.is_object()) {
    if (get_or<std::string>(dec, "type", "") != "WordPiece") unsupported("a decoder other than WordPiece");
    cleanup_ = get_or<bool>(dec, "cleanup", true);
  }
  const json& post = field(t, "post_processor");
  if (post.is_object()) {
    const auto kind = get_or<std::string>(post, "type", "");
    if (kind == "TemplateProcessing") {
      template_ids(post, prefix_ids_, suffix_ids_);
    } else if (kind == "BertProcessing") {
      prefix_ids_.push_back(post.at("cls").at(1).get<int64_t>());
      suffix_ids_.push_back(post.at("sep").at(1).get<int64_t>());
    } else {
      unsupported("the post-processor " + kind);
    }
  }
}

std::optional<int64_t> WordPieceTokenizer::id_of(const std::string& token) const { return vocab_.id_of(token); }

std::u32string WordPieceTokenizer::normalize(std::u32string_view text) const {
  std::u32string out;
  out.reserve(text.size());
  for (const char32_t c : text) {
    if (clean_text_ && (c == 0 || c == 0xFFFD || is_control(c))) continue;
    if (clean_text_ && is_whitespace(c)) {
      out.push_back(' ');
    } else if (chinese_ && is_chinese(c)) {
      out.push_back(' ');
      out.push_back(c);
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  if (strip_accents_) out = strip_accents(out);
  if (lowercase_) {
    std::u32string lower;
    lower.reserve(out.size());
    for (const char32_t c : out) append_lowercase(lower, c);
    out.swap(lower);
  }
  return out;
}

void WordPieceTokenizer::word_pieces(const std::u32string& word, std::vector<int64_t>& out) const {
  if (word.size() > max_chars_) {
    out.push_back(unk_id_);
    return;
  }
  std::vector<int64_t> pieces;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int64_t found = -1;
    for (; end > start; --end) {
      std::string piece = start > 0 ? prefix_ : std::string();
      piece += to_utf8(std::u32string_view(word).substr(start, end - start));
      if (const auto id = vocab_.piece(piece)) {
        found = *id;
        break;
      }
    }
    if (found < 0) {  // a part matches nothing: the whole word is unknown
      out.push_back(unk_id_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

void WordPieceTokenizer::encode_plain(std::string_view segment, std::vector<int64_t>& out) const {
  const std::u32string text = normalizer_ ? normalize(to_utf32(segment)) : to_utf32(segment);
  std::u32string word;
  for (const char32_t c : text) {
    if (is_whitespace(c)) {
      if (!word.empty()) word_pieces(word, out);
      word.clear();
    } else if (is_punctuation(c)) {
      if (!word.empty()) word_pieces(word, out);
      word.assign(1, c);
      word_pieces(word, out);
      word.clear();
    } else {
      word.push_back(c);
    }
  }
  if (!word.empty()) word_pieces(word, out);
}

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> out = add_special_tokens ? prefix_ids_ : std::vector<int64_t>{};
  vocab_.split_added(
      text, [&](std::string_view plain) { encode_plain(plain, out); }, [&](int64_t id) { out.push_back(id); });
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  static const std::pair<const char*, const char*> kCleanup[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string out;
  bool first = true;
  for (const int64_t id : ids) {
    std::string token = vocab_.token(id);
    if (skip_special_tokens && vocab_.is_special(id)) continue;
    if (!first) {
      if (token.starts_with(prefix_)) {
        token.erase(0, prefix_.size());
      } else {
        token.insert(0, " ");
      }
    }
    first = false;
    if (cleanup_) {
      for (const auto& [from, to] : kCleanup) {
        for (size_t at = token.find(from); at != std::string::npos; at = token.find(from, at + std::strlen(to))) {
          token.replace(at, std::strlen(from), to);
        }
      }
    }
    out += token;
  }
  return out;
}

}  // namespace torchattn::models::text
