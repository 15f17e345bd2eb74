#pragma once

// Do a model folder's files belong together? A tokenizer.json copied from another model
// loads as a tokenizer and gives ids the model reads as other tokens: text that looks
// generated but is garbage. LanguageModel::from_pretrained, SentenceEncoder::from_pretrained
// and torchattn_generate run these checks before loading the weights.
//
//   const auto config = torchattn::models::read_decoder_config("smollm2/config.json");
//   torchattn::models::Tokenizer tok("smollm2/tokenizer.json");
//   torchattn::models::check_tokenizer("smollm2", config, tok);  // a c10::Error if they differ

#include <torchattn/models/config.h>
#include <torchattn/models/tokenizer.h>

#include <string>

namespace torchattn::models {

/// A decoder folder (config.json read into `config`, tokenizer.json into `tokenizer`):
/// the tokenizer is a byte-level BPE; every id it gives is below config's vocab_size;
/// the bos, eos and pad token ids of config.json and generation_config.json (where the
/// folder has one) are ids of the tokenizer; a chat template of the <|im_start|> kind
/// has its <|im_start|> and <|im_end|> tokens in the tokenizer. Otherwise a c10::Error
/// naming the files, what was expected and what came.
void check_tokenizer(const std::string& folder, const DecoderConfig& config, const Tokenizer& tokenizer);

/// A BERT-family encoder folder: the tokenizer is a WordPiece; every id it gives is
/// below config's vocab_size; it has the [CLS], [SEP] and [UNK] tokens, and a [PAD]
/// token or config.json's pad_token_id is one of its ids. Errors as above.
void check_tokenizer(const std::string& folder, const BertConfig& config, const Tokenizer& tokenizer);

}  // namespace torchattn::models
