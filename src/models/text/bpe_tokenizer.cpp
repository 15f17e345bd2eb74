#include "models/text/bpe_tokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <climits>
#include <c10/util/Exception.h>

namespace torchattn::models::text {

namespace {

using json = nlohmann::json;

[[noreturn]] void unsupported(const std::string& what) {
  TORCH_CHECK(false, "tokenizer: " + what +
                         "; this library reads byte-level BPE tokenizers (GPT-2, SmolLM2, Qwen2) and WordPiece "
                         "tokenizers (BERT)");
}

std::string utf8(UChar32 c) {
  std::string out(4, '\0');
  int32_t n = 0;
  U8_APPEND_UNSAFE(reinterpret_cast<uint8_t*>(out.data()), n, c);
  out.resize(static_cast<size_t>(n));
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for
// code points from 256 up.
struct ByteLevel {
  std::array<std::string, 256> encode;
  std::unordered_map<UChar32, uint8_t> decode;
  ByteLevel() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const UChar32 c = printable ? b : next++;
      encode[b] = utf8(c);
      decode[c] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel table;
  return table;
}

std::string nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) TORCH_CHECK(false, "tokenizer: ICU has no NFC normalizer");
  const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(
                                                  icu::StringPiece(text.data(), static_cast<int32_t>(text.size()))),
                                              status);
  if (U_FAILURE(status)) TORCH_CHECK(false, "tokenizer: NFC normalization failed");
  std::string s;
  out.toUTF8String(s);
  return s;
}

std::string pair_key(const std::string& a, const std::string& b) {
  std::string k = a;
  k.push_back('\0');
  k += b;
  return k;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const json& t) : vocab_(t, "BPE") {
  const json& model = t.at("model");
  const std::string kind = get_or<std::string>(model, "type", "?");
  if (kind != "BPE") unsupported("the model is " + kind + ", not BPE");
  if (!get_or<std::string>(model, "continuing_subword_prefix", std::string()).empty())
    unsupported("a BPE with a continuing_subword_prefix");
  ignore_merges_ = get_or<bool>(model, "ignore_merges", false);

  int rank = 0;
  for (const auto& m : model.at("merges")) {
    const auto [a, b] = merge_pieces(m);
    ranks_.emplace(pair_key(a, b), rank++);
  }
  // Normalizer: none or NFC.
  const json& norm = field(t, "normalizer");
  if (!norm.is_null()) {
    const auto kind = get_or<std::string>(norm, "type", std::string());
    if (kind == "NFC") {
      nfc_ = true;
    } else {
      unsupported("the normalizer " + kind);
    }
  }
  // Pre-tokenizer: ByteLevel, or a Sequence of Digits, Split and ByteLevel.
  const json& pre = field(t, "pre_tokenizer");
  if (!pre.is_object()) unsupported("a tokenizer without a pre-tokenizer");
  std::vector<json> steps;
  if (get_or<std::string>(pre, "type", "") == "Sequence") {
    for (const auto& p : pre.at("pretokenizers")) steps.push_back(p);
  } else {
    steps.push_back(pre);
  }
  bool byte_level_seen = false;
  for (const auto& p : steps) {
    const auto kind = get_or<std::string>(p, "type", std::string());
    if (kind == "ByteLevel") {
      byte_level_seen = true;
      add_prefix_space_ = get_or<bool>(p, "add_prefix_space", false);
      if (get_or<bool>(p, "use_regex", true)) {
        if (pattern_) unsupported("two regex splits");
        pattern_ = SplitPattern::GPT2;
      }
    } else if (kind == "Digits") {
      if (!get_or<bool>(p, "individual_digits", false)) unsupported("a Digits pre-tokenizer without individual_digits");
      split_digits_ = true;
    } else if (kind == "Split") {
      if (get_or<std::string>(p, "behavior", "") != "Isolated" || get_or<bool>(p, "invert", false) ||
          !p.contains("pattern") || !p.at("pattern").contains("Regex")) {
        unsupported("a Split pre-tokenizer other than an isolated regex");
      }
      if (pattern_) unsupported("two regex splits");
      pattern_ = pattern_from_regex(p.at("pattern").at("Regex").get<std::string>());
    } else {
      unsupported("the pre-tokenizer " + kind);
    }
  }
  if (!byte_level_seen) unsupported("a pre-tokenizer without ByteLevel");
  if (!field(t, "decoder").is_object() || get_or<std::string>(field(t, "decoder"), "type", "") != "ByteLevel") {
    unsupported("a decoder other than ByteLevel");
  }
  // Post-processor: ByteLevel (nothing to add) or a template around the text.
  for (const auto& p : post_processor_steps(t)) {
    const auto kind = get_or<std::string>(p, "type", std::string());
    if (kind == "ByteLevel") continue;
    if (kind != "TemplateProcessing") unsupported("the post-processor " + kind);
    template_ids(p, prefix_ids_, suffix_ids_);
  }
}

std::optional<int64_t> BpeTokenizer::id_of(const std::string& token) const { return vocab_.id_of(token); }

void BpeTokenizer::bpe(const std::string& word, std::vector<int64_t>& out) const {
  if (cache_.find(word, out)) return;
  std::vector<int64_t> ids;
  const auto whole = vocab_.piece(word);
  if (ignore_merges_ && whole) {
    ids.push_back(*whole);
  } else {
    // Symbols: the word's characters; then merge the lowest-ranked adjacent pair,
    // leftmost first, until no pair has a rank.
    std::vector<std::string> symbols;
    const auto* s = reinterpret_cast<const uint8_t*>(word.data());
    const int32_t n = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < n;) {
      const int32_t start = i;
      UChar32 c;
      U8_NEXT_OR_FFFD(s, i, n, c);
      (void)c;
      symbols.emplace_back(word.substr(static_cast<size_t>(start), static_cast<size_t>(i - start)));
    }
    while (symbols.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto r = ranks_.find(pair_key(symbols[i], symbols[i + 1]));
        if (r != ranks_.end() && r->second < best) {
          best = r->second;
          at = i;
        }
      }
      if (best == INT_MAX) break;
      symbols[at] += symbols[at + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const auto& sym : symbols) {
      const auto v = vocab_.piece(sym);
      TORCH_CHECK(v.has_value(), "tokenizer: the piece '", sym, "' is not in the vocabulary");
      ids.push_back(*v);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.keep(word, ids);
}

std::vector<int64_t> BpeTokenizer::encode_plain(std::string_view segment) const {
  std::vector<int64_t> out;
  const std::string text = nfc_ ? nfc(segment) : std::string(segment);
  std::vector<std::string> pieces{add_prefix_space_ && !text.empty() && text[0] != ' ' ? " " + text : text};
  auto refine = [&](auto&& fn) {
    std::vector<std::string> next;
    for (const auto& p : pieces) {
      for (auto& q : fn(p)) next.push_back(std::move(q));
    }
    pieces = std::move(next);
  };
  if (split_digits_) refine([](const std::string& p) { return split_digits(p); });
  if (pattern_) refine([&](const std::string& p) { return split(p, *pattern_); });
  const ByteLevel& bl = byte_level();
  for (const auto& p : pieces) {
    if (p.empty()) continue;
    std::string mapped;
    for (unsigned char b : p) mapped += bl.encode[b];
    bpe(mapped, out);
  }
  return out;
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> out = add_special_tokens ? prefix_ids_ : std::vector<int64_t>{};
  vocab_.split_added(
      text,
      [&](std::string_view plain) {
        const auto ids = encode_plain(plain);
        out.insert(out.end(), ids.begin(), ids.end());
      },
      [&](int64_t id) { out.push_back(id); });
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const ByteLevel& bl = byte_level();
  std::string out;
  for (const int64_t id : ids) {
    const std::string& token = vocab_.token(id);
    if (vocab_.is_added(id)) {
      if (!skip_special_tokens || !vocab_.is_special(id)) out += token;
      continue;
    }
    const auto* s = reinterpret_cast<const uint8_t*>(token.data());
    const int32_t n = static_cast<int32_t>(token.size());
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U8_NEXT_OR_FFFD(s, i, n, c);
      const auto it = bl.decode.find(c);
      if (it != bl.decode.end()) out.push_back(static_cast<char>(it->second));
    }
  }
  return out;
}

}  // namespace torchattn::models::text
