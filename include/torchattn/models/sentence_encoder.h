#pragma once

// Sentence embeddings from a Hugging Face encoder folder (model_type bert: BERT,
// MiniLM, ...), as sentence-transformers' `encode`: tokenize, BertModel, pool (the
// mean over real tokens, or the [CLS] token), L2-normalize.
//
//   auto encoder = torchattn::models::SentenceEncoder::from_pretrained("all-MiniLM-L6-v2");
//   at::Tensor e = encoder.embed({"A man is eating food.", "A man is riding a horse."});  // [2, 384]
//   double similarity = (e[0] * e[1]).sum().item<double>();  // cosine: the rows have norm 1

#include <torchattn/models/bert.h>
#include <torchattn/models/load_options.h>
#include <torchattn/models/tokenizer.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::models {

enum class Pooling {
  Mean,  // the mean of the last hidden states over a text's real tokens
  CLS,   // the first token's ([CLS]) last hidden state
};

struct EmbedOptions {
  /// Texts per forward (>= 1). Texts are sorted by length first, so each batch pads
  /// little; the rows come back in the texts' order.
  TORCH_ARG(int64_t, batch_size) = 32;
  /// Default: unset, as the folder's sentence-transformers files say (1_Pooling's
  /// mode; mean without them).
  TORCH_ARG(std::optional<Pooling>, pooling) = std::nullopt;
  /// L2-normalize each embedding. Default: unset, as the folder says (a Normalize
  /// module in modules.json; no normalization without one).
  TORCH_ARG(std::optional<bool>, normalize) = std::nullopt;
  /// A text of more than max_length() tokens is an error naming both lengths;
  /// truncate(true) keeps its first max_length() tokens instead (as
  /// sentence-transformers always does).
  TORCH_ARG(bool, truncate) = false;
  /// Called with (texts done, texts in all) after each batch.
  TORCH_ARG(std::function<void(int64_t, int64_t)>, on_progress) = nullptr;
};

class SentenceEncoder {
 public:
  /// Loads `folder`: config.json (model_type bert), model.safetensors (or its sharded
  /// index), tokenizer.json (WordPiece), and sentence-transformers' files when present
  /// (modules.json, 1_Pooling/config.json, sentence_bert_config.json's max_seq_length).
  static SentenceEncoder from_pretrained(const std::string& folder, const LoadOptions& options = {});

  /// Embeddings of `texts` (UTF-8; other bytes are an error naming the text, the byte
  /// and its offset): [texts.size(), dimension()] float32 on the model's device. An
  /// empty text is fine ([CLS] [SEP]).
  at::Tensor embed(const std::vector<std::string>& texts, const EmbedOptions& options = {});

  /// The same from token ids, each as tokenizer().encode(text) gives them: with the
  /// template's special tokens ([CLS] ... [SEP]), at most max_length() ids, each below
  /// the config's vocab_size. Ids without those special tokens are an error naming the
  /// text and the token (the model never saw such input; CLS pooling would read a word).
  at::Tensor embed_ids(const std::vector<std::vector<int64_t>>& ids, const EmbedOptions& options = {});

  /// The most tokens of a text, special tokens included: sentence_bert_config.json's
  /// max_seq_length, else the config's max_position_embeddings.
  int64_t max_length() const { return max_length_; }
  int64_t dimension() const { return model_->config().hidden_size; }
  Pooling pooling() const { return pooling_; }
  bool normalizes() const { return normalize_; }

  BertModel& model() { return model_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  SentenceEncoder(BertModel model, Tokenizer tokenizer, int64_t max_length, Pooling pooling, bool normalize);
  void check_special_tokens(size_t i, const std::vector<int64_t>& ids) const;
  BertModel model_;
  Tokenizer tokenizer_;
  int64_t max_length_;
  Pooling pooling_;
  bool normalize_;
  int64_t pad_id_ = 0;
};

}  // namespace torchattn::models
