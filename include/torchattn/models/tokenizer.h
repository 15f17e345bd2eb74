#pragma once

// A Hugging Face `tokenizer.json`: byte-level BPE (GPT-2, SmolLM2, Qwen2), SentencePiece
// BPE (Llama 2, Mistral) or WordPiece (BERT, MiniLM), as transformers' fast tokenizers
// encode and decode.
//
//   torchattn::models::Tokenizer tok("all-MiniLM-L6-v2/tokenizer.json");
//   std::vector<int64_t> ids = tok.encode("Hello, world!");  // [CLS] hello , world ! [SEP]
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchattn {
class GgufFile;
}  // namespace torchattn

namespace torchattn::models {

namespace text {
class TokenizerModel;
}  // namespace text

class Tokenizer {
 public:
  /// Reads `path` (a tokenizer.json). Another kind (a SentencePiece Unigram, a
  /// normalizer or pre-tokenizer it does not read) is a c10::Error saying what it is.
  explicit Tokenizer(const std::string& path);

  /// The same from a tokenizer.json's text in memory; `name` is used in errors.
  static Tokenizer from_json(std::string_view json_text, const std::string& name = "<memory>");

  /// The tokenizer a GGUF file's metadata describes, as transformers builds it from the
  /// file: tokenizer.ggml.model "gpt2" (byte-level BPE: its tokens, merges and control
  /// tokens, tokenizer.ggml.pre "smollm", "gpt2" or "default" (GPT-2's split) or "qwen2"
  /// (Qwen2's), a BOS token first where add_bos_token says so) or "llama" (SentencePiece
  /// BPE: its pieces, the merges their scores imply, byte fallback, a "▁" before each
  /// stretch of text between special tokens as sentencepiece and llama.cpp put it unless
  /// add_space_prefix is false, a BOS token first unless add_bos_token says otherwise).
  /// Another model or pre-tokenizer is an error naming it and `name`.
  static Tokenizer from_gguf(const torchattn::GgufFile& file, const std::string& name);

  /// Token ids of `text` (UTF-8), as transformers' `tokenizer(text)["input_ids"]`;
  /// add_special_tokens: the template's ([CLS] ... [SEP] for BERT; none for SmolLM2).
  /// max_length: at most this many ids, special tokens included: the text's tokens
  /// are cut at the end, as `tokenizer(text, truncation=True, max_length=n)`.
  /// Text that is not valid UTF-8 is an error naming the first bad byte and its offset
  /// (Hugging Face tokenizers take only UTF-8 strings).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true,
                              std::optional<int64_t> max_length = std::nullopt) const;

  /// Text of `ids`, as transformers' `tokenizer.decode(ids, skip_special_tokens)`.
  /// For byte-level BPE, the tokens' bytes, which may end inside a UTF-8 character.
  /// A token's text can depend on the tokens around it (SentencePiece strips the space
  /// of the first): to decode a token at a time, use DecodeStream.
  /// An id outside the vocabulary is an error naming it.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  /// What one token adds to the text before it: decode({id}), but for a SentencePiece
  /// token's leading space, which decode strips from a text's first token, and a byte
  /// token's byte (which may be part of a UTF-8 character). For logprobs' token strings.
  /// An id outside the vocabulary is an error naming it.
  std::string token_text(int64_t id) const;

  /// The id of a token given as text ("<|im_end|>", "[PAD]"), if it has one.
  std::optional<int64_t> id_of(const std::string& token) const;

  /// Ids run from 0 to vocab_size() - 1.
  int64_t vocab_size() const;

  /// The special tokens encode(text) puts before the text's tokens ([CLS] for BERT;
  /// none for SmolLM2), and after them ([SEP]).
  const std::vector<int64_t>& prefix_ids() const;
  const std::vector<int64_t>& suffix_ids() const;

  /// "BPE" (byte-level or SentencePiece) or "WordPiece".
  const std::string& kind() const { return kind_; }

 private:
  Tokenizer() = default;
  void init(const void* parsed_json, const std::string& name);
  std::shared_ptr<const text::TokenizerModel> model_;
  std::string kind_;
};

/// Text of ids that come one at a time (a generation's), in complete UTF-8 characters:
/// what push returns, and then finish, adds up to `tokenizer.decode(ids,
/// skip_special_tokens)`. As tokenizers' DecodeStream: each push decodes the token with
/// the ones since the last text it gave and the one before, and gives what the new token
/// added, or "" while the text ends inside a character. (Two exceptions: SentencePiece
/// byte tokens that make a character and then bytes that never make one: decode turns
/// the whole run into U+FFFD; the stream has given the character, and then one U+FFFD a
/// byte of the rest. And more than 8 tokens since the last text given (bytes that never
/// make a character, skipped special tokens): their text is given then, U+FFFD and all,
/// so that a push decodes a bounded number of tokens.)
///
///   DecodeStream stream(tok);
///   for (int64_t id : ids) std::cout << stream.push(id);
///   std::cout << stream.finish();
class DecodeStream {
 public:
  /// `tokenizer` must outlive the stream. `context`: ids before the stream's first (a
  /// prompt's last): the stream gives the text its ids add after them (a SentencePiece
  /// token's space kept, as in `decode(context + ids)`; without context the first one's
  /// is stripped, as in `decode(ids)`). A context whose text ends inside a character is
  /// not used.
  explicit DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = false,
                        std::vector<int64_t> context = {});
  /// The text `id` completes; an id outside the vocabulary is an error naming it.
  std::string push(int64_t id);
  /// What is held back (the bytes of a character never completed), as decode gives it;
  /// the stream starts afresh.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  // ids_'s tokens since the last text given.
  std::vector<int64_t> held() const;

  std::vector<int64_t> ids_;  // the tokens decoded together: those since the last text given, and one before
  std::string prefix_;        // the text of ids_[0, prefix_index_)
  size_t prefix_index_ = 0;
};

/// The offset of the first byte of `text` that does not belong to a well-formed UTF-8
/// character (a stray continuation byte, a truncated or overlong sequence, a surrogate,
/// a code point past U+10FFFF), or nullopt when all of it is UTF-8.
std::optional<size_t> find_invalid_utf8(std::string_view text);

}  // namespace torchattn::models
