// libFuzzer target: torchattn::models' tokenizers on arbitrary bytes. The first byte
// picks what the rest is:
//   0-95:    text for a small WordPiece tokenizer (BERT's normalizer and splits):
//            encode, encode truncated, decode;
//   96-127:  text for a small byte-level BPE tokenizer (GPT-2's split; a piece outside
//            its vocabulary is a named error);
//   128-159: text for a small SentencePiece BPE (byte fallback, "▁" before each stretch
//            between special tokens): decoded whole and a token at a time, the same text;
//   160-191: text for the pre-tokenizer's splits alone (GPT-2's and Qwen2's patterns,
//            digits): the pieces must cover the text exactly;
//   192-223: a tokenizer.json;
//   224-255: a GGUF file's tokenizer (tokenizer.ggml.*: byte-level or SentencePiece).
// The only exception accepted is c10::Error.

#include <torchattn/gguf.h>
#include <torchattn/models/tokenizer.h>

#include "models/text/pretokenize.h"

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

const char* kWordPiece = R"({
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 12,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "##b": 5, "ab": 6, "c": 7, ",": 8,
                      "e": 9, "##e": 10, "\u4e2d": 11, "##c": 12, "!": 13}},
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                 "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "TemplateProcessing",
                     "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                     "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                        "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
  "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
  "added_tokens": [{"id": 0, "content": "[PAD]", "special": true}, {"id": 2, "content": "[CLS]", "special": true},
                   {"id": 3, "content": "[SEP]", "special": true}]
})";

const char* kBpe = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "\u0120a": 5, "1": 6, "!": 7},
            "merges": ["a b", "\u0120 a"]},
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
  "decoder": {"type": "ByteLevel"},
  "post_processor": null,
  "added_tokens": [{"id": 8, "content": "<|end|>", "special": true}]
})";

// Llama 2's shape: <unk>, <s>, </s>, the 256 byte tokens, a few pieces and merges.
std::string sentencepiece_json() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char piece[32];
    std::snprintf(piece, sizeof(piece), R"(, "<0x%02X>": %d)", b, 3 + b);
    vocab += piece;
  }
  vocab += R"(, "▁": 259, "a": 260, "b": 261, "▁a": 262, "ab": 263, "▁ab": 264, "c": 265, "▁▁": 266)";
  return R"({"model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>", "vocab": {)" +
         vocab + R"(}, "merges": ["▁ a", "a b", "▁a b", "▁ ▁"]},
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}],
                     "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                   {"id": 2, "content": "</s>", "special": true}]
})";
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const auto wordpiece = torchattn::models::Tokenizer::from_json(kWordPiece, "wordpiece");
  static const auto bpe = torchattn::models::Tokenizer::from_json(kBpe, "bpe");
  static const auto sentencepiece = torchattn::models::Tokenizer::from_json(sentencepiece_json(), "sentencepiece");
  const uint8_t mode = data[0];
  const std::string_view raw(reinterpret_cast<const char*>(data + 1), size - 1);
  // The tokenizers refuse invalid UTF-8 at once (a c10::Error naming the byte); the
  // text modes go on with its invalid bytes made '?', so that the rest reaches them.
  const auto bad = torchattn::models::find_invalid_utf8(raw);
  if (mode < 160 && bad) {
    try {
      (void)(mode < 96 ? wordpiece : mode < 128 ? bpe : sentencepiece).encode(raw);
      check(false);  // accepted invalid UTF-8
    } catch (const c10::Error&) {}
  }
  std::string valid(raw);
  if (mode < 160) {
    for (auto at = bad; at; at = torchattn::models::find_invalid_utf8(valid)) valid[*at] = '?';
  }
  const std::string_view text = mode < 160 ? std::string_view(valid) : raw;
  try {
    if (mode < 96) {
      const auto ids = wordpiece.encode(text);
      check(ids.size() >= 2 && ids.front() == 2 && ids.back() == 3);
      const auto cut = wordpiece.encode(text, true, 5);
      check(cut.size() <= 5);
      (void)wordpiece.decode(ids, mode & 1);
    } else if (mode < 128) {
      const auto ids = bpe.encode(text);
      (void)bpe.decode(ids);
    } else if (mode < 160) {
      const auto ids = sentencepiece.encode(text);
      check(!ids.empty() && ids.front() == 1);
      for (const bool skip : {false, true}) {
        const std::string whole = sentencepiece.decode(ids, skip);
        torchattn::models::DecodeStream stream(sentencepiece, skip);
        std::string streamed;
        for (const int64_t id : ids) streamed += stream.push(id);
        streamed += stream.finish();
        // Equal but where a byte run ends in bytes that make no character (U+FFFD).
        check(streamed == whole || whole.find("\xEF\xBF\xBD") != std::string::npos);
      }
    } else if (mode < 192) {
      namespace d = torchattn::models::text;
      for (const auto pattern : {d::SplitPattern::GPT2, d::SplitPattern::Qwen2}) {
        std::string joined;
        for (const auto& piece : d::split(text, pattern)) joined += piece;
        check(joined == text);
      }
      std::string joined;
      for (const auto& piece : d::split_digits(text)) joined += piece;
      check(joined == text);
    } else if (mode < 224) {
      const auto tok = torchattn::models::Tokenizer::from_json(text, "fuzz");
      const auto ids = tok.encode("ab, c! 12 \xe4\xb8\xad");
      (void)tok.decode(ids);
    } else {
      const auto file = torchattn::GgufFile::parse(data + 1, size - 1, "fuzz");
      const auto tok = torchattn::models::Tokenizer::from_gguf(file, "fuzz");
      const auto ids = tok.encode(" ab, c!  12 \xe4\xb8\xad\xf0\x9f\x99\x82");
      (void)tok.decode(ids, true);
      torchattn::models::DecodeStream stream(tok);
      for (const int64_t id : ids) (void)stream.push(id);
      (void)stream.finish();
    }
  } catch (const c10::Error&) {
    // A damaged tokenizer, or text it has no pieces for, reported.
  }
  return 0;
}
