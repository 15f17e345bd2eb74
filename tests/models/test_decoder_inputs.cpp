// What a decoder says of inputs it cannot take, on the user's surface: token ids outside
// the vocabulary (every entry: forward, forward_packed, perplexity) and
// packed_next_token_loss's offsets, named as values, never as a printed tensor.

#include "common/expect_error.h"
#include "models/tiny_decoder.h"

#include <torchattn/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
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
  expect_error([&] { models::perplexity(model, std::vector<int64_t>{1, 2, 3, 4, 97, 5, 6, 7, 8}, 4); }, "got 97 at [");
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

}  // namespace
