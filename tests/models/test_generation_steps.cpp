// generate's token choice: plain greedy decoding takes the argmax inside the model's
// step (and so inside a CUDA graph) and hands GenerationSteps the ids; every other
// setting hands it the logits. Both choose the same tokens, stop at the same token and
// call on_token alike; chosen() names ids of the wrong shape or type.

#include "common/expect_error.h"
#include "models/generation/generation_steps.h"
#include "models/tiny_decoder.h"

#include <torchattn/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace {

namespace models = torchattn::models;

TEST(GenerationSteps, ArgmaxInTheStepChoosesWhatTheSamplerChooses) {
  torch::manual_seed(41);
  models::CausalLM model(tiny_decoder_config({}), 64);
  {
    torch::NoGradGuard no_grad;
    model->embed_tokens->weight.mul_(4);  // clear greedy choices
  }
  // Left-padded batch: prompts of different lengths.
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 17, 3}, {40, 2}, {7}};
  std::vector<std::pair<size_t, int64_t>> streamed_ids, streamed_logits;
  auto options = models::GenerationOptions().max_new_tokens(12).stop_at_eos(false);
  // logprobs(-1): the ids come from the step's argmax; logprobs(0): from the logits.
  const auto by_ids = models::generate(*model, prompts,
                                       models::GenerationOptions(options).on_token(
                                           [&](size_t b, int64_t id) { streamed_ids.emplace_back(b, id); }));
  const auto by_logits = models::generate(*model, prompts,
                                          models::GenerationOptions(options).logprobs(0).on_token(
                                              [&](size_t b, int64_t id) { streamed_logits.emplace_back(b, id); }));
  ASSERT_EQ(by_ids.size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(by_ids[b].ids, by_logits[b].ids) << "prompt " << b;
    EXPECT_EQ(by_ids[b].ids.size(), 12u);
    EXPECT_TRUE(by_ids[b].logprobs.empty());
    EXPECT_EQ(by_logits[b].logprobs.size(), 12u);
  }
  EXPECT_EQ(streamed_ids, streamed_logits);
  // A stop token ends a sequence the same way on both paths.
  const int64_t stop = by_ids[0].ids[3];
  const auto stopped = models::generate(*model, prompts, models::GenerationOptions(options).stop_token_ids({stop}));
  const auto stopped_logits = models::generate(*model, prompts,
                                               models::GenerationOptions(options).stop_token_ids({stop}).logprobs(0));
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(stopped[b].ids, stopped_logits[b].ids);
    EXPECT_EQ(stopped[b].stopped, stopped_logits[b].stopped);
  }
  EXPECT_TRUE(stopped[0].stopped);
  EXPECT_EQ(stopped[0].ids.size(), 4u);
}

TEST(GenerationSteps, SaysWhenTheStepMayTakeTheArgmaxAndChecksTheIds) {
  const std::vector<std::vector<int64_t>> prompts = {{1, 2}, {3}};
  const auto greedy = models::GenerationOptions();
  EXPECT_TRUE(models::generation::GenerationSteps(prompts, greedy, {}).greedy_on_device());
  for (const auto& other :
       {models::GenerationOptions().do_sample(true), models::GenerationOptions().logprobs(0),
        models::GenerationOptions().logit_bias({{3, 1.0}}), models::GenerationOptions().presence_penalty(0.5),
        models::GenerationOptions().frequency_penalty(0.5)}) {
    EXPECT_FALSE(models::generation::GenerationSteps(prompts, other, {}).greedy_on_device());
  }
  models::generation::GenerationSteps steps(prompts, greedy, {7});
  expect_error([&] { steps.chosen(torch::tensor({1, 2, 3}, torch::kLong), 0); },
               "GenerationSteps: expected the chosen ids as int64 [2], got Long [3]");
  expect_error([&] { steps.chosen(torch::tensor({1.0, 2.0}), 0); },
               "GenerationSteps: expected the chosen ids as int64 [2], got Float [2]");
  EXPECT_EQ(steps.chosen(torch::tensor({7, 4}, torch::kLong), 0), (std::vector<int64_t>{7, 4}));
  EXPECT_FALSE(steps.finished());
  EXPECT_EQ(steps.chosen(torch::tensor({9, 7}, torch::kLong), 0), (std::vector<int64_t>{0, 7}))
      << "a finished prompt gets the filler";
  EXPECT_TRUE(steps.finished());
  const auto results = steps.results();
  EXPECT_EQ(results[0].ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(results[1].ids, (std::vector<int64_t>{4, 7}));
}

}  // namespace
