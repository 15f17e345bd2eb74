#include "models/text/sentencepiece_bpe.h"

#include "models/text/utf8_check.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <queue>

namespace torchattn::models::text {

namespace {

using json = nlohmann::json;

constexpr std::string_view kSpace = "\xE2\x96\x81";        // U+2581, SentencePiece's space
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

[[noreturn]] void unsupported(const std::string& what) {
  TORCH_CHECK(false, "tokenizer: " + what +
                         "; this library reads SentencePiece-style BPE tokenizers (Llama 2, Mistral) as transformers "
                         "writes them: a Metaspace pre-tokenizer or a Prepend and Replace normalizer, and a decoder of "
                         "Replace, ByteFallback, Fuse and Strip");
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// A list of steps: a Sequence's (under `key`), or the one step itself.
std::vector<json> steps_of(const json& j, const char* key) {
  if (j.is_object() && get_or<std::string>(j, "type", "") == "Sequence") {
    std::vector<json> out;
    for (const auto& s : j.at(key)) out.push_back(s);
    return out;
  }
  return {j};
}

// The string of a Replace's pattern ({"String": s}); a regex is not read.
std::string replace_pattern(const json& step, const std::string& where) {
  const json& pattern = field(step, "pattern");
  if (!pattern.is_object() || !pattern.contains("String")) unsupported("a " + where + " Replace of a regex");
  return pattern.at("String").get<std::string>();
}

// The byte of a byte-fallback token "<0xXX>", as tokenizers' ByteFallback decoder reads it.
std::optional<uint8_t> byte_token(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return std::nullopt;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

size_t utf8_length(unsigned char lead) { return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1; }

}  // namespace

SentencePieceBpe::SentencePieceBpe(const json& t) : vocab_(t, "BPE") {
  const json& model = t.at("model");
  if (!get_or<bool>(model, "byte_fallback", false)) unsupported("a BPE without byte_fallback");
  if (!get_or<std::string>(model, "continuing_subword_prefix", std::string()).empty() ||
      !get_or<std::string>(model, "end_of_word_suffix", std::string()).empty()) {
    unsupported("a BPE with a continuing_subword_prefix or an end_of_word_suffix");
  }
  if (get_or<double>(model, "dropout", 0.0) != 0.0) unsupported("a BPE with dropout");
  fuse_unk_ = get_or<bool>(model, "fuse_unk", false);
  ignore_merges_ = get_or<bool>(model, "ignore_merges", false);
  const auto unk = get_or<std::string>(model, "unk_token", std::string());
  if (!unk.empty()) {
    unk_ = vocab_.piece(unk);
    TORCH_CHECK(unk_.has_value(), "tokenizer: the unk_token '", unk, "' is not in the vocabulary");
  }
  byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[static_cast<size_t>(b)] = vocab_.piece(name);
  }
  int32_t rank = 0;
  for (const auto& m : model.at("merges")) {
    const auto [a, b] = merge_pieces(m);
    const auto left = vocab_.piece(a), right = vocab_.piece(b), merged = vocab_.piece(a + b);
    TORCH_CHECK(left && right && merged, "tokenizer: the merge '", a, "' '", b, "' has a piece ('",
                !left    ? a
                : !right ? b
                         : a + b,
                "') that is not in the vocabulary");
    // A pair given twice keeps its later rank, as tokenizers' merge map does.
    merges_[static_cast<uint64_t>(*left) << 32 | static_cast<uint64_t>(*right)] = {rank++,
                                                                                   static_cast<int32_t>(*merged)};
  }

  for (const auto& step : steps_of(field(t, "normalizer"), "normalizers")) {
    if (step.is_null()) continue;
    const auto kind = get_or<std::string>(step, "type", std::string());
    if (kind == "Prepend" && get_or<std::string>(step, "prepend", "") == kSpace) {
      normalizer_prepend_ = true;
    } else if (kind == "Replace" && replace_pattern(step, "normalizer") == " " &&
               get_or<std::string>(step, "content", "") == kSpace) {
      replace_spaces_ = true;
    } else {
      unsupported("the normalizer " + step.dump());
    }
  }
  const json& pre = field(t, "pre_tokenizer");
  if (!pre.is_null()) {
    const auto steps = steps_of(pre, "pretokenizers");
    if (steps.size() != 1 || get_or<std::string>(steps[0], "type", "") != "Metaspace" ||
        get_or<std::string>(steps[0], "replacement", "") != kSpace) {
      unsupported("the pre-tokenizer " + pre.dump());
    }
    const json& m = steps[0];
    replace_spaces_ = true;
    const std::string scheme = m.contains("prepend_scheme") ? get_or<std::string>(m, "prepend_scheme", "always")
                               : get_or<bool>(m, "add_prefix_space", true) ? "always"
                                                                           : "never";
    if (scheme == "always") {
      prepend_ = Prepend::Always;
    } else if (scheme == "first") {
      prepend_ = Prepend::First;
    } else if (scheme == "never") {
      prepend_ = Prepend::Never;
    } else {
      unsupported("a Metaspace prepend_scheme '" + scheme + "'");
    }
    split_ = get_or<bool>(m, "split", true);
  }
  if (!replace_spaces_) unsupported("a tokenizer that keeps spaces as they are (no Metaspace or Replace)");

  bool fused = false, decode_spaces = false, decode_bytes = false;
  for (const auto& step : steps_of(field(t, "decoder"), "decoders")) {
    const auto kind = get_or<std::string>(step, "type", std::string());
    if (kind == "Replace" && replace_pattern(step, "decoder") == kSpace &&
        get_or<std::string>(step, "content", "") == " " && !fused) {
      decode_spaces = true;
    } else if (kind == "ByteFallback" && !fused) {
      decode_bytes = true;
    } else if (kind == "Fuse") {
      fused = true;
    } else if (kind == "Strip" && fused && get_or<std::string>(step, "content", "") == " " &&
               get_or<int64_t>(step, "stop", 0) == 0) {
      strip_start_ = get_or<int64_t>(step, "start", 0);
    } else {
      unsupported("the decoder step " + step.dump());
    }
  }
  if (!decode_spaces || !decode_bytes) unsupported("a decoder without Replace(\"▁\", \" \") and ByteFallback");

  for (const auto& p : post_processor_steps(t)) {
    const auto kind = get_or<std::string>(p, "type", std::string());
    if (kind != "TemplateProcessing") unsupported("the post-processor " + kind);
    template_ids(p, prefix_ids_, suffix_ids_);
  }
}

std::optional<SentencePieceBpe::Merge> SentencePieceBpe::merge_of(int64_t left, int64_t right) const {
  const auto it = merges_.find(static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right));
  return it == merges_.end() ? std::nullopt : std::optional<Merge>(it->second);
}

void SentencePieceBpe::merge_word(const std::string& word, std::vector<int64_t>& out) const {
  if (cache_.find(word, out)) return;
  std::vector<int64_t> ids;
  const auto whole = vocab_.piece(word);
  if (ignore_merges_ && whole) {
    ids.push_back(*whole);
  } else {
    // Symbols: the word's characters (or their bytes' tokens, or an unknown token), each
    // linked to its neighbours; as tokenizers' Word.
    struct Symbol {
      int64_t id;
      int64_t prev, next;  // -1: none
      size_t len;          // bytes; 0: merged into the symbol on its left
    };
    std::vector<Symbol> symbols;
    const auto add = [&](int64_t id, size_t len) {
      const auto n = static_cast<int64_t>(symbols.size());
      if (n > 0) symbols.back().next = n;
      symbols.push_back({id, n - 1, -1, len});
    };
    std::optional<size_t> unknown;  // bytes of the unknown characters not added yet
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
      const auto id = vocab_.piece(word.substr(i, n));
      bool bytes = !id.has_value();
      for (size_t k = 0; k < n && bytes; ++k) bytes = byte_ids_[static_cast<unsigned char>(word[i + k])].has_value();
      if (id || bytes) {
        if (unknown) add(*unk_, *unknown);
        unknown.reset();
        if (id) {
          add(*id, n);
        } else {
          for (size_t k = 0; k < n; ++k) add(*byte_ids_[static_cast<unsigned char>(word[i + k])], 1);
        }
      } else if (unk_) {
        if (unknown && fuse_unk_) {
          *unknown += n;
        } else {
          if (unknown) add(*unk_, *unknown);
          unknown = n;
        }
      }  // no unknown token: the character is dropped, as tokenizers' BPE drops it
      i += n;
    }
    if (unknown) add(*unk_, *unknown);

    // The lowest-ranked pair first, the leftmost of equal ranks (tokenizers' merge_all,
    // stale entries and all).
    struct Entry {
      int32_t rank;
      int64_t pos;
      int32_t id;
    };
    const auto later = [](const Entry& x, const Entry& y) {
      return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
    };
    std::priority_queue<Entry, std::vector<Entry>, decltype(later)> queue(later);
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      if (const auto m = merge_of(symbols[i].id, symbols[i + 1].id)) {
        queue.push({m->rank, static_cast<int64_t>(i), m->id});
      }
    }
    while (!queue.empty()) {
      const Entry top = queue.top();
      queue.pop();
      Symbol& current = symbols[static_cast<size_t>(top.pos)];
      if (current.len == 0 || current.next == -1) continue;
      const Symbol right = symbols[static_cast<size_t>(current.next)];
      const auto m = merge_of(current.id, right.id);
      if (!m || m->id != top.id) continue;  // an entry left from before a merge
      symbols[static_cast<size_t>(current.next)].len = 0;
      current.id = top.id;
      current.len += right.len;
      current.next = right.next;
      if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
      if (current.prev >= 0) {
        if (const auto p = merge_of(symbols[static_cast<size_t>(current.prev)].id, current.id)) {
          queue.push({p->rank, current.prev, p->id});
        }
      }
      if (current.next >= 0) {
        if (const auto q = merge_of(current.id, symbols[static_cast<size_t>(current.next)].id)) {
          queue.push({q->rank, top.pos, q->id});
        }
      }
    }
    for (const auto& s : symbols) {
      if (s.len > 0) ids.push_back(s.id);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.keep(word, ids);
}

void SentencePieceBpe::encode_plain(std::string_view text, bool at_start, std::vector<int64_t>& out) const {
  std::string s = normalizer_prepend_ && !text.empty() ? std::string(kSpace) + std::string(text) : std::string(text);
  if (replace_spaces_) s = replace_all(s, " ", kSpace);
  if (!s.starts_with(kSpace) && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && at_start))) {
    s.insert(0, kSpace);
  }
  if (!split_) {
    if (!s.empty()) merge_word(s, out);
    return;
  }
  // Split before each "▁", which begins the word after it.
  size_t start = 0;
  for (size_t i = kSpace.size(); i <= s.size(); ++i) {
    if (i == s.size() || s.compare(i, kSpace.size(), kSpace) == 0) {
      if (i > start) merge_word(s.substr(start, i - start), out);
      start = i;
    }
  }
}

std::vector<int64_t> SentencePieceBpe::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> out = add_special_tokens ? prefix_ids_ : std::vector<int64_t>{};
  vocab_.split_added(
      text, [&](std::string_view plain) { encode_plain(plain, plain.data() == text.data(), out); },
      [&](int64_t id) { out.push_back(id); });
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string SentencePieceBpe::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string out, bytes;  // bytes: a run of <0xXX> tokens not yet written
  const auto flush_bytes = [&] {
    if (bytes.empty()) return;
    if (first_invalid_utf8(bytes).has_value()) {
      for (size_t i = 0; i < bytes.size(); ++i) out += kReplacement;
    } else {
      out += bytes;
    }
    bytes.clear();
  };
  for (const int64_t id : ids) {
    const std::string& token = vocab_.token(id);
    if (skip_special_tokens && vocab_.is_special(id)) continue;
    if (const auto b = byte_token(token)) {
      bytes.push_back(static_cast<char>(*b));
      continue;
    }
    flush_bytes();
    out += replace_all(token, kSpace, " ");
  }
  flush_bytes();
  size_t cut = 0;
  while (cut < out.size() && cut < static_cast<size_t>(strip_start_) && out[cut] == ' ') ++cut;
  return out.substr(cut);
}

std::string SentencePieceBpe::token_text(int64_t id) const {
  const std::string& token = vocab_.token(id);
  if (const auto b = byte_token(token)) return std::string(1, static_cast<char>(*b));
  return replace_all(token, kSpace, " ");
}

}  // namespace torchattn::models::text
