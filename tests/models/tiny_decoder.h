#pragma once

// The small random decoders of the models component's unit tests: a Llama-shaped
// config of 2 layers, 6 heads over 2 key/value heads by default, sized and tied as each
// test needs.

#include <torchattn/models.h>

#include <cstdint>
#include <optional>
#include <string>

struct TinyDecoder {
  std::string model_type = "llama";
  int64_t hidden = 48, heads = 6, kv_heads = 2, intermediate = 64, positions = 512;
  bool tied = false;
  std::optional<int64_t> window = std::nullopt;
};

inline torchattn::models::DecoderConfig tiny_decoder_config(const TinyDecoder& d) {
  torchattn::models::DecoderConfig c;
  c.model_type = d.model_type;
  c.vocab_size = 96;
  c.hidden_size = d.hidden;
  c.intermediate_size = d.intermediate;
  c.num_layers = 2;
  c.num_heads = d.heads;
  c.num_kv_heads = d.kv_heads;
  c.max_position_embeddings = d.positions;
  c.rope_theta = 10000.0;
  c.windows.assign(2, d.window);
  c.tie_word_embeddings = d.tied;
  c.eos_token_ids = {};
  return c;
}
