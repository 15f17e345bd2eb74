// What a decoder says of inputs it cannot take, on the user's surface: token ids outside
// the vocabulary (every entry: forward, forward_packed, perplexity) and
// packed_next_token_loss's logits, ids and offsets, named as values, never as a printed
// tensor; a WeightFormat or Init outside its enum; frozen weights of another format.

#include "common/expect_error.h"
#include "models/tiny_decoder.h"

#include <torchattn/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

namespace models = torchattn::models;

models::CausalLM tiny() {
  torch::manual_seed(96);
  models::CausalLM model(tiny_decoder_config({}), 64);
  model->eval();
  return model;
}

TEST(DecoderInputs, IdsOutsideTheVocabularyAreNamed) {
  models::CausalLM model = tiny();
  torch::NoGradGuard no_grad;
  expect_error([&] { model->forward(torch::tensor({{1, 2, 96}}, torch::kLong)); },
               "CausalLM: expected token ids in [0, 96) (the config's vocab_size), got 96 at [0, 2] of the ids [1, 3]");
  expect_error([&] { model->forward(torch::tensor({{1, -1, 3}, {4, 5, 6}}, torch::kLong)); },
               "got -1 at [0, 1] of the ids [2, 3]");
  expect_error([&] { model->forward_packed(torch::tensor({3, 4, 500, 6}, torch::kLong), torch::tensor({0, 2, 4})); },
               "CausalLM: expected token ids in [0, 96) (the config's vocab_size), got 500 at [2] of the ids [4]");
  // perplexity names the place in the caller's ids, not in one of its windows.
  expect_error([&] { models::perplexity(model, std::vector<int64_t>{1, 2, 3, 4, 5, 97, 6, 7, 8}, 4); },
               "perplexity: expected token ids in [0, 96) (the model's vocab_size), got 97 at [5] of the 9 ids");
  // The ids the vocabulary holds, at both ends, pass.
  EXPECT_EQ(model->forward(torch::tensor({{0, 95}}, torch::kLong)).size(-1), 96);
}

TEST(DecoderInputs, PackedLossNamesTheOffsetsAsValues) {
  const auto logits = torch::randn({5, 96});
  const auto ids = torch::tensor({1, 2, 3, 4, 5}, torch::kLong);
  expect_error([&] { models::packed_next_token_loss(logits, ids, torch::tensor({0, 3, 4})); },
               "packed_next_token_loss: expected cu_seqlens from 0 to the 5 tokens, got [0, 3, 4]");
  expect_error([&] { models::packed_next_token_loss(logits, ids, torch::tensor({0, 3, 3, 5})); },
               "packed_next_token_loss: expected cu_seqlens increasing, got [0, 3, 3, 5]");
  expect_error([&] { models::packed_next_token_loss(logits, ids, torch::tensor({0, 1, 2, 3, 4, 5})); },
               "packed_next_token_loss: expected a document of two tokens or more, got cu_seqlens [0, 1, 2, 3, 4, 5]");
  std::vector<int64_t> many(41);
  for (int64_t i = 0; i < 41; ++i) many[i] = i / 8;  // 0 .. 5, not increasing
  many.back() = 5;
  const std::string error = error_of([&] { models::packed_next_token_loss(logits, ids, torch::tensor(many)); });
  EXPECT_HAS(error, ", ... (41 values)]");
  EXPECT_EQ(error.find("Long{"), std::string::npos) << error;
  EXPECT_EQ(error.find("[ CPULongType"), std::string::npos) << error;
}

TEST(DecoderInputs, PackedLossNamesItsIdsAndOffsets) {
  const auto logits = torch::randn({5, 96});
  const auto cu = torch::tensor({0, 5});
  expect_error(
      [&] { models::packed_next_token_loss(logits, torch::tensor({1, 2, 96, 4, 5}, torch::kLong), cu); },
      "packed_next_token_loss: expected ids in [0, 96) (the logits' vocabulary), got 96 at [2] of the ids [5]");
  expect_error([&] { models::packed_next_token_loss(logits, torch::tensor({1, -5, 3, 4, 5}, torch::kLong), cu); },
               "got -5 at [1]");
  expect_error([&] { models::packed_next_token_loss(logits, torch::tensor({1.0, 2.0, 3.0, 4.0, 5.0}), cu); },
               "packed_next_token_loss: expected ids int64 or int32 (token ids), got Float");
  const auto ids = torch::tensor({1, 2, 3, 4, 5}, torch::kLong);
  expect_error([&] { models::packed_next_token_loss(logits, ids, torch::tensor({0.0, 5.0})); },
               "packed_next_token_loss: expected cu_seqlens [S + 1] int32 or int64, got Float [2]");
  expect_error([&] { models::packed_next_token_loss(logits, ids, torch::tensor({{0, 5}})); }, "got Long [1, 2]");
  expect_error([&] { models::packed_next_token_loss(torch::randint(0, 5, {5, 96}), ids, cu); },
               "packed_next_token_loss: expected floating logits (the model's output), got Long");
  EXPECT_TRUE(torch::isfinite(models::packed_next_token_loss(logits, ids.to(torch::kInt), cu)).item<bool>());
}

// A WeightFormat outside the enum, named by the argument that took it.
TEST(DecoderInputs, WeightFormatOutsideTheEnumIsNamed) {
  const auto format = static_cast<torchattn::WeightFormat>(42);
  expect_error([&] { models::CausalLM(tiny_decoder_config({}), 64, format); },
               "CausalLM(config, context_length, frozen): frozen: expected WeightFormat::Float32, BFloat16, Int8, "
               "DynamicInt8 or Int4, got the value 42");
  models::CausalLM model = tiny();
  expect_error([&] { model->load_frozen_state({}, format); }, "CausalLM: load_frozen_state: format: expected");
  expect_error([&] { models::load_causal_lm(tiny_decoder_config({}), 64, "no-such-folder", format); },
               "models::load_causal_lm: format: expected WeightFormat::Float32");
  models::DecoderLayer layer(tiny_decoder_config({}), 0, 64);
  expect_error([&] { layer->freeze_weights(format); }, "DecoderLayer::freeze_weights: format: expected");
  // An Init outside its enum is named, not built as Init::ForLoading.
  expect_error([&] { models::CausalLM(tiny_decoder_config({}), 64, static_cast<models::Init>(7)); },
               "CausalLM(config, context_length, init): init: expected Init::Random or Init::ForLoading, got the "
               "value 7 (an integer cast to Init?)");
}

// Frozen weights of another format are named in the formats' words (int8, not Char),
// and a part of a frozen model moved to another dtype is named at its next forward,
// not in the kernel's words.
TEST(DecoderInputs, FrozenWeightsOfAnotherFormatOrDtypeAreNamed) {
  models::CausalLM model = tiny();
  model->freeze_weights(torchattn::WeightFormat::Int8);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : model->frozen_state()) by_name.emplace(name, t);
  auto* layer = model->layers[0]->as<models::DecoderLayerImpl>();
  expect_error([&] { layer->check_frozen(torchattn::WeightFormat::BFloat16, by_name, "layers.0."); },
               "CausalLM: expected the frozen 'layers.0.self_attn.W_query.weight' bfloat16 (the "
               "weight format asked for), got int8 weights (saved in another format?)");
  model->norm->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  expect_error([&] { model->forward(torch::tensor({{1, 2, 3}}, torch::kLong)); },
               "weights frozen, which take float32 inputs on the CPU; got Double on cpu (a part of the model moved "
               "with to()? Load the model again to run it otherwise)");
}

}  // namespace
