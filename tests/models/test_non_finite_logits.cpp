// Logits that are not numbers end generation with an error naming the step and the
// damage, never a garbage text: models::generate on each of its choosing paths (the
// argmax inside the step, the sampler on the logits), perplexity, and the serving
// engine, whose request ends with FinishReason::Error while the engine serves on. The
// damage is a NaN put into a small random decoder's weights: its final norm (every
// logit NaN), or one token's embedding (NaN from the step that reads that token).

#include "common/expect_error.h"
#include "models/tiny_decoder.h"

#include <torchattn/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace models = torchattn::models;

constexpr int64_t kPoisoned = 50;  // the token whose embedding is NaN

models::CausalLM poisoned_token_model() {
  torch::manual_seed(77);
  models::CausalLM model(tiny_decoder_config({}), 64);
  torch::NoGradGuard no_grad;
  model->embed_tokens->weight[kPoisoned].fill_(std::numeric_limits<float>::quiet_NaN());
  return model;
}

TEST(NonFiniteLogits, GenerateNamesTheStepAndThePromptOnEveryPath) {
  models::CausalLM model = poisoned_token_model();
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 17}, {40, kPoisoned}};
  const auto plain = models::GenerationOptions().max_new_tokens(4).stop_at_eos(false);
  // Greedy: the argmax inside the step; with logprobs: the logits; sampled: the sampler.
  for (const auto& options : {plain, models::GenerationOptions(plain).logprobs(0),
                              models::GenerationOptions(plain).do_sample(true).seed(3)}) {
    const std::string error = error_of([&] { models::generate(*model, prompts, options); });
    EXPECT_HAS(error, "generate: the model produced non-finite logits at step 1 (prompt 1): NaN or infinity, so no "
                      "token can be chosen. Its weights are damaged");
  }
  // Step 2: the poisoned token forced as the first new one (a logit bias), read at the second step.
  const auto forced = models::GenerationOptions(plain).logit_bias({{kPoisoned, 100.0}});
  const std::vector<std::vector<int64_t>> one = {{5, 9, 17}};
  EXPECT_HAS(error_of([&] { models::generate(*model, one, models::GenerationOptions(forced)); }),
             "generate: the model produced non-finite logits at step 2 (prompt 0)");
  // The healthy prompt alone generates.
  EXPECT_EQ(models::generate(*model, {{5, 9, 17}}, plain)[0].ids.size(), 4u);
}

TEST(NonFiniteLogits, PerplexityNamesTheFirstTokenItCannotScore) {
  models::CausalLM model = poisoned_token_model();
  std::vector<int64_t> ids(32);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 7) + 1;
  EXPECT_GT(models::perplexity(model, ids, 16).perplexity, 0.0);
  ids[16] = kPoisoned;  // window 2's first token: its logits are NaN, and the next ones'
  expect_error([&] { models::perplexity(model, ids, 16); },
               "perplexity: the model produced non-finite logits at step 17 (window 2 of 2, the logits of ids[17])");
}

TEST(NonFiniteLogits, TheEngineEndsTheRequestWithAnErrorAndServesOn) {
  models::CausalLM model = poisoned_token_model();
  models::Engine engine(model, models::EngineOptions().kv_tokens(512));
  const auto options = models::GenerationOptions().max_new_tokens(4).stop_at_eos(false);
  std::vector<models::TokenEvent> bad, good;
  engine.submit({40, kPoisoned}, options, [&](const models::TokenEvent& e) { bad.push_back(e); });
  engine.submit({5, 9, 17}, options, [&](const models::TokenEvent& e) { good.push_back(e); });
  while (engine.step()) {}
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_FALSE(bad[0].token.has_value());
  EXPECT_EQ(bad[0].finished, models::FinishReason::Error);
  EXPECT_HAS(bad[0].error, "Engine: the model produced non-finite logits at step 1 (request ");
  EXPECT_STREQ(models::finish_reason_name(models::FinishReason::Error), "error");
  ASSERT_EQ(good.size(), 4u) << "the other request goes on";
  EXPECT_EQ(good.back().finished, models::FinishReason::Length);
  // Engine::generate says the error; a later healthy request is served.
  EXPECT_HAS(error_of([&] { engine.generate({{kPoisoned}}, options); }), "non-finite logits at step 1");
  EXPECT_EQ(engine.generate({{5, 9}}, options)[0].ids.size(), 4u);
}

}  // namespace
