// models::Engine (continuous batching over a PagedKVCache) on small random decoders:
// each request gets the tokens it gets alone (through the engine alone, bit for bit;
// and through models::generate with contiguous caches, in float64), whatever joins or
// leaves; long prompts are prefilled in chunks while the others keep decoding; stop
// tokens, max_new_tokens, the context length and cancellation end a request and give
// its blocks back; a full pool makes requests wait or preempts the newest, losing
// nothing; prefix caching reuses published blocks without changing a token; the queue
// limit and bad requests are errors naming the cause. And the models' deprecated cache
// factory names.

#include "models/tiny_decoder.h"
#include "common/expect_error.h"

#include <torchattn/models/engine.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <tuple>
#include <random>
#include <string>
#include <vector>

namespace {

namespace models = torchattn::models;

models::DecoderConfig tiny_config(bool window) {
  return tiny_decoder_config(
      {.model_type = window ? "mistral" : "llama", .window = window ? std::optional<int64_t>(24) : std::nullopt});
}

// A random model whose logits are far from uniform (larger embeddings), so that greedy
// choices are clear.
models::CausalLM tiny_model(torch::Dtype dtype, bool window = false, int64_t context = 512) {
  torch::manual_seed(41);
  models::CausalLM model(tiny_config(window), context);
  {
    torch::NoGradGuard no_grad;
    model->embed_tokens->weight.mul_(4);
  }
  model->to(dtype);
  model->eval();
  return model;
}

std::vector<std::vector<int64_t>> prompts(const std::vector<int64_t>& lengths, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> out;
  for (const int64_t n : lengths) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int64_t>(rng() % 96));
    out.push_back(p);
  }
  return out;
}

std::vector<std::vector<int64_t>> ids_of(const std::vector<models::GenerationResult>& results) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& r : results) out.push_back(r.ids);
  return out;
}

models::EngineOptions small_chunks() {
  return models::EngineOptions().kv_tokens(4096).block_size(8).prefill_chunk(16).max_prefill_tokens(32);
}

TEST(Engine, EachRequestGetsTheTokensItGetsAlone) {
  const auto ps = prompts({1, 5, 16, 17, 40, 130, 3, 64}, 3);
  const auto greedy = models::GenerationOptions().max_new_tokens(20).stop_at_eos(false);
  const auto sampled = models::GenerationOptions(greedy).do_sample(true).temperature(0.8).top_k(30).top_p(0.9).seed(5);
  for (const auto& options : {greedy, sampled}) {
    SCOPED_TRACE(options.do_sample() ? "sampled" : "greedy");
    // float32, packed products: the batch equals the engine alone, bit for bit (the
    // same tokens, always).
    {
      models::Engine engine(tiny_model(torch::kFloat), small_chunks());
      const auto batch = ids_of(engine.generate(ps, options));
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(batch[i], ids_of(engine.generate({ps[i]}, options))[0]) << "prompt " << i;
        EXPECT_EQ(batch[i].size(), 20u);
      }
      EXPECT_EQ(engine.stats().kv_blocks_used, 0);  // every block back
      EXPECT_EQ(engine.stats().finished, static_cast<int64_t>(2 * ps.size()));
    }
    // float64: the same tokens as models::generate, alone, with contiguous caches.
    for (const bool window : {false, true}) {
      SCOPED_TRACE(window ? "sliding window" : "full attention");
      auto model = tiny_model(torch::kDouble, window);
      models::Engine engine(model, small_chunks());
      const auto batch = ids_of(engine.generate(ps, options));
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(batch[i], models::generate(*model, {ps[i]}, options)[0].ids) << "prompt " << i;
      }
    }
  }
}

// Prefix caching: a request whose tokens start with blocks an earlier one published (a
// shared system prompt; the earlier turn of a conversation, its answer included) starts
// with them, and gets the tokens it gets without the cache, bit for bit.
TEST(Engine, PrefixCachingReusesPublishedBlocksAndChangesNoToken) {
  const auto system = prompts({43}, 9)[0];
  auto with = [&](const std::vector<int64_t>& tail) {
    auto p = system;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto tails = prompts({10, 25, 1}, 10);
  const auto greedy = models::GenerationOptions().max_new_tokens(12).stop_at_eos(false);
  const auto sampled = models::GenerationOptions(greedy).do_sample(true).temperature(0.8).top_k(30).seed(3);
  for (const auto& options : {greedy, sampled}) {
    SCOPED_TRACE(options.do_sample() ? "sampled" : "greedy");
    models::Engine cached(tiny_model(torch::kFloat), small_chunks());
    models::Engine plain(tiny_model(torch::kFloat), models::EngineOptions(small_chunks()).prefix_cache(false));
    int64_t reused = 0;
    for (const auto& tail : tails) {
      const auto p = with(tail);
      const auto got = ids_of(cached.generate({p}, options))[0];
      EXPECT_EQ(got, ids_of(plain.generate({p}, options))[0]);
      if (&tail != &tails.front()) {  // the system prompt's 5 blocks of 8, published by the first
        EXPECT_GE(cached.stats().prefix_reused_tokens - reused, 40);
      }
      reused = cached.stats().prefix_reused_tokens;
      // The next turn of this conversation: the prompt, the answer, a new message.
      auto turn = p;
      turn.insert(turn.end(), got.begin(), got.end());
      turn.insert(turn.end(), tail.begin(), tail.end());
      EXPECT_EQ(ids_of(cached.generate({turn}, options))[0], ids_of(plain.generate({turn}, options))[0]);
      EXPECT_GE(cached.stats().prefix_reused_tokens - reused, static_cast<int64_t>(p.size() + got.size()) / 8 * 8 - 8);
      reused = cached.stats().prefix_reused_tokens;
    }
    EXPECT_EQ(plain.stats().prefix_reused_tokens, 0);
    EXPECT_EQ(plain.stats().kv_blocks_reusable, 0);
    // Every block is back: none held, the published ones kept for reuse.
    EXPECT_EQ(cached.stats().kv_blocks_used, 0);
    EXPECT_GT(cached.stats().kv_blocks_reusable, 0);
    EXPECT_EQ(cached.cache().free_blocks(), cached.cache().num_blocks());
  }
  // float64: the same tokens as models::generate with contiguous caches, reused or not.
  auto model = tiny_model(torch::kDouble);
  models::Engine engine(model, small_chunks());
  for (const auto& tail : tails) {
    EXPECT_EQ(ids_of(engine.generate({with(tail)}, greedy))[0], models::generate(*model, {with(tail)}, greedy)[0].ids);
  }
  EXPECT_GE(engine.stats().prefix_reused_tokens, 80);
}

// A pool too small for what was published gives the published blocks back (least
// recently released first, a request's last blocks first) and loses nothing: prompts
// sharing a 24-token start, with tails of their own, in a pool of 12 blocks of 8.
TEST(Engine, APoolFullOfPublishedBlocksGivesThemBackWhenRequestsNeedThem) {
  const auto options_of = [](bool cache) {
    return models::EngineOptions().kv_tokens(96).block_size(8).prefill_chunk(16).prefix_cache(cache);
  };
  models::Engine engine(tiny_model(torch::kFloat), options_of(true));
  models::Engine plain(tiny_model(torch::kFloat), options_of(false));
  const auto options = models::GenerationOptions().max_new_tokens(8).stop_at_eos(false);
  const auto start = prompts({24}, 13)[0];
  // Two at a time (the pool holds both, not what they published as well).
  const auto tails = prompts({30, 40, 20, 35, 45, 25}, 12);
  for (size_t i = 0; i < tails.size(); i += 2) {
    std::vector<std::vector<int64_t>> pair;
    for (size_t j = i; j < i + 2; ++j) {
      auto p = start;
      p.insert(p.end(), tails[j].begin(), tails[j].end());
      pair.push_back(p);
    }
    EXPECT_EQ(ids_of(engine.generate(pair, options)), ids_of(plain.generate(pair, options)));
    EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  }
  EXPECT_GE(engine.stats().prefix_reused_tokens, 24 * 4);  // the shared start, after the first pair
  EXPECT_GT(engine.stats().kv_blocks_reusable, 0);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().num_blocks());
}

TEST(Engine, RequestsJoinAtAnyStepAndLongPromptsArriveInChunks) {
  models::Engine engine(tiny_model(torch::kFloat), small_chunks());
  const auto ps = prompts({4, 9, 6, 200, 2}, 4);
  const auto options = models::GenerationOptions().max_new_tokens(30).stop_at_eos(false);
  std::map<int64_t, std::vector<int64_t>> got, steps_of;  // tokens, and the step each came in
  std::map<int64_t, size_t> which;
  int64_t steps = 0;
  auto submit = [&](size_t i) {
    const int64_t id = engine.submit(ps[i], options, [&](const models::TokenEvent& e) {
      if (e.token) {
        got[e.request].push_back(*e.token);
        steps_of[e.request].push_back(steps);
      }
    });
    which[id] = i;
  };
  submit(0);
  submit(1);
  for (int i = 0; i < 5; ++i, ++steps) engine.step();
  submit(2);
  submit(3);  // 200 tokens: 13 chunks of 16, one a step, while 0, 1 and 2 decode
  for (int i = 0; i < 3; ++i, ++steps) engine.step();
  submit(4);
  while (engine.step()) ++steps;
  ASSERT_EQ(got.size(), ps.size());
  for (const auto& [id, tokens] : got) {
    const size_t i = which.at(id);
    EXPECT_EQ(tokens, ids_of(engine.generate({ps[i]}, options))[0]) << "prompt " << i;
    // Decoding requests got a token at every step, long prompt or not.
    for (size_t t = 1; t < steps_of[id].size(); ++t) EXPECT_EQ(steps_of[id][t], steps_of[id][t - 1] + 1);
  }
  // The long prompt took a step per chunk: its first token came with the 13th.
  const int64_t long_id = std::find_if(which.begin(), which.end(), [](auto& p) { return p.second == 3; })->first;
  EXPECT_EQ(steps_of[long_id].front(), 5 + 13 - 1);
}

// The prompt tokens of a step: idle_prefill_tokens while none decodes, that over the
// decoding requests beside them (at least max_prefill_tokens), chunks cut to fit; a
// long prompt long_prefill_tokens a step while others decode. Measured by the tokens
// the running requests hold after each step; every request's tokens are still the
// engine's alone, bit for bit, however its prompt was cut.
TEST(Engine, PromptTokensPerStepFollowTheBudgetsAndChangeNoToken) {
  const auto options = models::EngineOptions()
                           .kv_tokens(4096)
                           .block_size(8)
                           .prefill_chunk(16)
                           .max_prefill_tokens(4)
                           .idle_prefill_tokens(24)
                           .long_prefill_threshold(40)
                           .long_prefill_tokens(2)
                           .prefix_cache(false);
  models::Engine engine(tiny_model(torch::kFloat), options);
  const auto ps = prompts({20, 20, 20, 100}, 14);
  const auto generation = models::GenerationOptions().max_new_tokens(100).stop_at_eos(false);
  std::vector<std::vector<int64_t>> got(ps.size());
  auto submit = [&](size_t i) {
    engine.submit(ps[i], generation, [&, i](const models::TokenEvent& e) {
      if (e.token) got[i].push_back(*e.token);
    });
  };
  for (size_t i = 0; i < 3; ++i) submit(i);
  // None decodes: 24 prompt tokens, the first chunk of 16 and 8 of the second prompt's.
  engine.step();
  EXPECT_EQ(engine.stats().tokens_held, 24);
  EXPECT_EQ(engine.stats().running, 2);
  while (engine.stats().running < 3 || got[2].empty()) engine.step();
  // Three decode; the 100-token prompt comes: long (more than 40 left) it brings 2
  // tokens a step until 40 are left, then its chunks up to the budget of 24 / 3 = 8
  // (to 64, the end of its fourth chunk, then 8 and 8 of each chunk, then the last 4).
  submit(3);
  std::vector<int64_t> progress;
  while (got[3].empty()) {
    const int64_t held = engine.stats().tokens_held;
    engine.step();
    progress.push_back(engine.stats().tokens_held - held - 3);
  }
  std::vector<int64_t> want(30, 2);
  for (const int64_t n : {4, 8, 8, 8, 8, 4}) want.push_back(n);
  EXPECT_EQ(progress, want);
  while (engine.step()) {}
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(got[i], ids_of(engine.generate({ps[i]}, generation))[0]) << "prompt " << i;
  }
  // Decoding requests beside a long prompt: at most max_prefill_tokens (4) with as many
  // decoding as idle_prefill_tokens covers no more.
  models::Engine fixed(tiny_model(torch::kFloat), models::EngineOptions(options).idle_prefill_tokens(1));
  for (size_t i = 0; i < 3; ++i) fixed.submit(ps[i], generation, nullptr);
  fixed.step();
  EXPECT_EQ(fixed.stats().tokens_held, 4);
}

TEST(Engine, StopTokensLengthsAndCancellationEndARequestAndFreeItsBlocks) {
  auto model = tiny_model(torch::kFloat, false, /*context=*/40);
  models::Engine engine(model, small_chunks());
  const auto ps = prompts({6, 6, 30, 8}, 5);
  const auto alone = ids_of(
      engine.generate({ps[0]}, models::GenerationOptions().max_new_tokens(10).stop_at_eos(false)))[0];
  // A stop token: the request ends with it.
  std::vector<models::TokenEvent> events;
  auto record = [&](const models::TokenEvent& e) { events.push_back(e); };
  engine.submit(ps[0], models::GenerationOptions().max_new_tokens(10).stop_token_ids({alone[3]}), record);
  while (engine.step()) {}
  ASSERT_FALSE(events.empty());
  const size_t stop_at = static_cast<size_t>(std::find(alone.begin(), alone.end(), alone[3]) - alone.begin());
  EXPECT_EQ(events.size(), stop_at + 1);
  EXPECT_EQ(events.back().finished, models::FinishReason::Stop);
  EXPECT_EQ(*events.back().token, alone[3]);
  EXPECT_EQ(events.back().generated, static_cast<int64_t>(stop_at + 1));
  // max_new_tokens, and the context length (30 + 10 = 40).
  events.clear();
  engine.submit(ps[2], models::GenerationOptions().max_new_tokens(10).stop_at_eos(false), record);
  while (engine.step()) {}
  EXPECT_EQ(events.size(), 10u);
  EXPECT_EQ(events.back().finished, models::FinishReason::Length);
  // Cancelled while decoding, and while waiting: the callback hears it, blocks come back.
  events.clear();
  const int64_t a = engine.submit(ps[1], models::GenerationOptions().max_new_tokens(30).stop_at_eos(false), record);
  engine.step();
  engine.step();
  EXPECT_GT(engine.stats().kv_blocks_used, 0);
  engine.cancel(a);
  const int64_t b = engine.submit(ps[3], models::GenerationOptions().max_new_tokens(30).stop_at_eos(false), record);
  engine.cancel(b);
  engine.cancel(12345);  // unknown: ignored
  while (engine.step()) {}
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().finished, models::FinishReason::Cancelled);
  EXPECT_FALSE(events.back().token.has_value());
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const auto& e) { return e.finished == models::FinishReason::Cancelled; }),
            2);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.stats().running + engine.stats().waiting, 0);
}

TEST(Engine, AFullPoolMakesRequestsWaitOrPreemptsTheNewestAndLosesNothing) {
  const auto ps = prompts({20, 24, 18, 30, 22, 26}, 6);
  const auto options = models::GenerationOptions().max_new_tokens(40).stop_at_eos(false);
  auto model = tiny_model(torch::kDouble);
  // 128 tokens of pool for six requests that grow to 58 to 70 tokens each.
  models::Engine engine(model, models::EngineOptions().kv_tokens(128).block_size(8).prefill_chunk(16));
  int64_t most_waiting = 0, most_blocks = 0;
  std::vector<std::vector<int64_t>> got(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    engine.submit(ps[i], options, [&, i](const models::TokenEvent& e) {
      if (e.token) got[i].push_back(*e.token);
    });
  }
  while (engine.step()) {
    most_waiting = std::max(most_waiting, engine.stats().waiting);
    most_blocks = std::max(most_blocks, engine.stats().kv_blocks_used);
    // Memory in use follows the tokens held, never past the pool.
    EXPECT_LE(engine.stats().tokens_held, engine.stats().kv_blocks_used * 8);
  }
  EXPECT_GT(most_waiting, 0);
  EXPECT_LE(most_blocks, 16);
  EXPECT_GT(engine.stats().preempted, 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(got[i], models::generate(*model, {ps[i]}, options)[0].ids) << "prompt " << i;
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

// logit_bias, presence and frequency penalties and logprobs, through the Engine and
// generate, against the same rules written out here over a full forward of the
// sequence so far (float64): the same tokens, and the log-probabilities of the
// model's own distribution.
TEST(Engine, LogitBiasPenaltiesAndLogprobsFollowOpenAIsDefinitions) {
  auto model = tiny_model(torch::kDouble);
  const std::vector<int64_t> prompt = {5, 17, 33, 2};
  const int64_t n = 12, top = 3;
  for (const auto& [bias, presence, frequency] :
       std::vector<std::tuple<models::LogitBias, double, double>>{{{}, 0.0, 0.0},
                                                                  {{{7, 100.0}}, 0.0, 0.0},
                                                                  {{{7, 3.0}, {11, -100.0}}, 0.0, 0.0},
                                                                  {{}, 1.5, 0.0},
                                                                  {{}, 0.0, 0.75},
                                                                  {{{4, 2.0}}, -0.5, 1.25}}) {
    // The reference: argmax of logits + bias - frequency * count - presence * (count > 0).
    std::vector<int64_t> seq = prompt, want;
    std::vector<double> want_logprob;
    std::vector<std::vector<int64_t>> want_top;
    std::map<int64_t, int64_t> counts;
    {
      torch::NoGradGuard no_grad;
      for (int64_t i = 0; i < n; ++i) {
        const auto logits = model->forward(torch::tensor(seq).view({1, -1}))[0][-1];
        auto scores = logits.clone();
        for (const auto& [id, b] : bias) scores[id] += b;
        for (const auto& [id, c] : counts) scores[id] -= frequency * static_cast<double>(c) + presence;
        const int64_t token = scores.argmax().item<int64_t>();
        const auto logp = logits.log_softmax(0);
        want.push_back(token);
        want_logprob.push_back(logp[token].item<double>());
        const auto ids = std::get<1>(logp.topk(top));
        want_top.push_back(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + top));
        seq.push_back(token);
        ++counts[token];
      }
    }
    const auto options = models::GenerationOptions()
                             .max_new_tokens(n)
                             .logit_bias(bias)
                             .presence_penalty(presence)
                             .frequency_penalty(frequency)
                             .logprobs(top);
    std::vector<models::TokenEvent> events;
    models::Engine engine(model, models::EngineOptions().kv_tokens(256));
    engine.submit(prompt, options, [&](const models::TokenEvent& e) { events.push_back(e); });
    while (engine.step()) {}
    ASSERT_EQ(events.size(), static_cast<size_t>(n));
    const auto generated = models::generate(*model, {prompt}, options)[0];
    EXPECT_EQ(generated.ids, want) << "generate, presence " << presence << " frequency " << frequency;
    ASSERT_EQ(generated.logprobs.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(events[i].token && events[i].logprobs);
      EXPECT_EQ(*events[i].token, want[i]) << "step " << i << ", presence " << presence << " frequency " << frequency;
      const auto& lp = *events[i].logprobs;
      EXPECT_EQ(lp.chosen.token, want[i]);
      EXPECT_NEAR(lp.chosen.logprob, want_logprob[i], 1e-5);  // the engine's sampling runs in float32
      EXPECT_NEAR(generated.logprobs[i].chosen.logprob, want_logprob[i], 1e-5);
      ASSERT_EQ(lp.top.size(), static_cast<size_t>(top));
      for (int64_t k = 0; k < top; ++k) EXPECT_EQ(lp.top[k].token, want_top[i][k]) << "step " << i << " top " << k;
      EXPECT_GE(lp.top[0].logprob, lp.top[1].logprob);
    }
  }
  // A bias of 100 forces its token; -100 bans the greedy one.
  const auto plain = models::generate(*model, {prompt}, models::GenerationOptions().max_new_tokens(4))[0].ids;
  const auto banned = models::generate(*model, {prompt},
                                       models::GenerationOptions().max_new_tokens(4).logit_bias(
                                           {{plain[0], -100.0}}))[0]
                          .ids;
  EXPECT_NE(banned[0], plain[0]);
  const auto forced =
      models::generate(*model, {prompt}, models::GenerationOptions().max_new_tokens(4).logit_bias({{9, 100.0}}))[0].ids;
  EXPECT_EQ(forced, std::vector<int64_t>(4, 9));
  // Without logprobs none come.
  EXPECT_TRUE(models::generate(*model, {prompt}, models::GenerationOptions().max_new_tokens(2))[0].logprobs.empty());
}

TEST(Engine, TheQueueLimitAndBadRequestsAreErrorsNamingTheCause) {
  auto model = tiny_model(torch::kFloat, false, /*context=*/64);
  models::Engine engine(model, models::EngineOptions().kv_tokens(96).max_waiting(2));
  const auto options = models::GenerationOptions().max_new_tokens(4);
  auto none = [](const models::TokenEvent&) {};
  expect_error([&] { engine.submit({}, options, none); }, "expected a prompt of at least one token, got none");
  expect_error([&] { engine.submit({1, 96}, options, none); },
               "the prompt has token id 96, outside the vocabulary [0, 96)");
  expect_error([&] { engine.submit({1, 2}, models::GenerationOptions().max_new_tokens(63), none); },
               "2 prompt tokens and max_new_tokens=63 pass the model's context_length of 64");
  expect_error([&] { engine.submit({1, 2}, models::GenerationOptions().max_new_tokens(0), none); },
               "expected max_new_tokens >= 1, got 0");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).do_sample(true).top_p(0.0), none); },
               "expected top_p in (0, 1], got 0");
  models::Engine small(model, models::EngineOptions().kv_tokens(32).block_size(16));
  expect_error([&] { small.submit(std::vector<int64_t>(30, 1), options, none); },
               "30 prompt tokens and max_new_tokens=4 pass the KV pool of 32 tokens");
  engine.submit({1}, options, none);
  engine.submit({2}, options, none);
  EXPECT_THROW(engine.submit({3}, options, none), models::EngineFull);
  while (engine.step()) {}
  engine.submit({3}, options, none);  // room again
  // Options that would be ignored or point past the vocabulary.
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).stop_token_ids({96}), none); },
               "Engine: stop_token_ids has token id 96, outside the vocabulary [0, 96)");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).logit_bias({{-1, 1.0}}), none); },
               "Engine: logit_bias has token id -1, outside the vocabulary [0, 96)");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).logit_bias({{3, NAN}}), none); },
               "logit_bias expected finite biases, got nan for token 3");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).frequency_penalty(INFINITY), none); },
               "expected a finite frequency_penalty, got inf");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).logprobs(21), none); },
               "Engine: expected logprobs in [-1, 20]");
  expect_error([&] { models::check_generation_options(models::GenerationOptions().logprobs(12), 10, "generate"); },
               "generate: expected logprobs in [-1, 10]");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).temperature(0.7), none); },
               "Engine: temperature 0.7 is set but do_sample is false");
  expect_error([&] { engine.submit({1}, models::GenerationOptions(options).top_k(5), none); },
               "Engine: top_k 5 is set but do_sample is false");
  expect_error([&] { models::generate(*model, {{1}}, models::GenerationOptions(options).top_p(0.5)); },
               "generate: top_p 0.5 is set but do_sample is false");
  expect_error([&] { models::Engine(model, models::EngineOptions().kv_tokens(0)); }, "expected kv_tokens >= 1, got 0");
  expect_error([&] { models::Engine(model, models::EngineOptions().prefill_chunk(0)); },
               "expected prefill_chunk >= 1, got 0");
  expect_error([&] { models::Engine(model, models::EngineOptions().idle_prefill_tokens(0)); },
               "expected idle_prefill_tokens >= 1, got 0");
  expect_error([&] { models::Engine(model, models::EngineOptions().long_prefill_threshold(-1)); },
               "expected long_prefill_threshold >= 0, got -1");
  expect_error([&] { models::Engine(model, models::EngineOptions().long_prefill_tokens(0)); },
               "expected long_prefill_tokens >= 1, got 0");
}

}  // namespace
