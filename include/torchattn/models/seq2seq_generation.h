#pragma once

// Generation with an encoder-decoder (Seq2SeqLM): the prompts encoded once (padded on
// the right, as BART's tokenizers pad), each decoder layer's cross-attention keys and
// values computed once from the encoder's output, then the decoder run token by token
// from decoder_start_token_id with self-attention KV caches; greedy or sampled, with
// the config's forced tokens, as transformers' generate with num_beams=1. A folder's
// other generation settings (num_beams, min_length, no_repeat_ngram_size,
// repetition_penalty, length_penalty) are not applied: transformers' generate gives
// these tokens when they are off.
//
//   auto model = torchattn::models::Seq2SeqLM(torchattn::models::read_bart_config("bart/config.json"));
//   model->load_hf_weights("bart");
//   auto out = torchattn::models::generate(*model, {{0, 713, 16, 2}},
//                                          torchattn::models::GenerationOptions().max_new_tokens(20));
//   // out[0].ids: the new tokens (decoder_start_token_id left out)

#include <torchattn/models/generation.h>
#include <torchattn/models/seq2seq_lm.h>

#include <cstdint>
#include <vector>

namespace torchattn::models {

/// prompts: token ids, each non-empty, each at most max_position_embeddings long, each
/// id below vocab_size. max_new_tokens: at most max_position_embeddings (the decoder's
/// positions). Each prompt gets the tokens it gets alone (up to float rounding of the
/// batch's products, which can turn a near-tie of the top two logits). GenerationResult
/// as for a decoder: ids are the new tokens, the stop token included if one came.
std::vector<GenerationResult> generate(Seq2SeqLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options = {});

}  // namespace torchattn::models
