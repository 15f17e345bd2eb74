// Generation with KV caches as a user builds it: beam search branches from one
// prefix (cache.clone()), a left-padded batch of prompts of different lengths
// decoding together (forward_cached's key padding mask), and the cache's owner; each
// sequence's real-token positions after a left-padded prefill (token_positions), and
// GQA's smaller cache.

#include "common/devices.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

using torchattn::Backend;
using torchattn::KVCache;

namespace {

// Copying a cache would share its storage; the type says so.
static_assert(!std::is_copy_constructible_v<KVCache>, "a KVCache copy would share storage: use clone()");
static_assert(!std::is_copy_assignable_v<KVCache>, "a KVCache copy would share storage: use clone()");
static_assert(std::is_nothrow_move_constructible_v<KVCache> && std::is_nothrow_move_assignable_v<KVCache>);

// One module, seen through its forward and its cache.
struct Decoder {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<KVCache(int64_t batch)> make_cache;
  std::function<KVCache(int64_t batch, int64_t capacity)> make_cache_of;
  std::function<torch::Tensor(const torch::Tensor&, KVCache&, const torch::Tensor&)> cached;
};

Decoder make_decoder(bool multi_head, Backend backend, bool mask_buffer, const torch::Device& device,
                     bool static_shapes) {
  torch::manual_seed(90);
  if (multi_head) {
    torchattn::MultiHeadAttention m(
        torchattn::MultiHeadAttentionOptions(6, 8, 16, 2).qkv_bias(true).backend(backend).mask_buffer(mask_buffer));
    m->to(device);
    m->eval();
    return {[m](const torch::Tensor& x) mutable { return m(x); },
            [m, static_shapes](int64_t b) { return m->make_kv_cache(b, static_shapes); },
            [m, static_shapes](int64_t b, int64_t n) { return m->make_kv_cache(b, static_shapes, n); },
            [m](const torch::Tensor& x, KVCache& c, const torch::Tensor& p) mutable {
              return m->forward_cached(x, c, p);
            }};
  }
  torchattn::CausalAttention m(torchattn::CausalAttentionOptions(6, 5, 16).backend(backend).mask_buffer(mask_buffer));
  m->to(device);
  m->eval();
  return {[m](const torch::Tensor& x) mutable { return m(x); },
          [m, static_shapes](int64_t b) { return m->make_kv_cache(b, static_shapes); },
          [m, static_shapes](int64_t b, int64_t n) { return m->make_kv_cache(b, static_shapes, n); },
          [m](const torch::Tensor& x, KVCache& c, const torch::Tensor& p) mutable {
            return m->forward_cached(x, c, p);
          }};
}

using GenParam = std::tuple<bool /*multi-head*/, Backend, bool /*mask_buffer*/, bool /*static_shapes*/, torch::Device>;

class Generation : public ::testing::TestWithParam<GenParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<4>(GetParam())); }
  Decoder decoder() const {
    const auto [mh, backend, mask_buffer, static_shapes, device] = GetParam();
    return make_decoder(mh, backend, mask_buffer, device, static_shapes);
  }
  torch::Device device() const { return std::get<4>(GetParam()); }
};

// A cache of the tokens a generation holds (make_kv_cache's capacity, here 8 of the
// context's 16) gives the rows of a cache of the whole context: the same bits where
// the step attends over the cached tokens, within float32 rounding where a static
// cache attends over its whole capacity; and it refuses a ninth token.
TEST_P(Generation, ACacheOfTheTokensItHoldsGivesTheWholeContextsRows) {
  const bool static_shapes = std::get<3>(GetParam());
  auto d = decoder();
  torch::NoGradGuard no_grad;
  torch::manual_seed(91);
  const auto x = torch::randn({2, 8, 6}).to(device());
  KVCache whole = d.make_cache(2), eight = d.make_cache_of(2, 8);
  EXPECT_EQ(whole.capacity(), 16);
  EXPECT_EQ(eight.capacity(), 8);
  for (const auto& [begin, length] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 1}, {6, 1}, {7, 1}}) {
    const auto chunk = x.narrow(1, begin, length);
    const auto a = d.cached(chunk, whole, {}), b = d.cached(chunk, eight, {});
    if (static_shapes) {
      EXPECT_TRUE(torch::allclose(a, b, 0, 1e-6)) << "tokens from " << begin;
    } else {
      EXPECT_TRUE(torch::equal(a, b)) << "tokens from " << begin;
    }
  }
  try {
    d.cached(x.narrow(1, 0, 1), eight, {});
    ADD_FAILURE() << "a ninth token went into a cache of 8";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the KV cache holds 8 tokens; 1 more would pass its capacity of 8"),
              std::string::npos)
        << e.what();
  }
}

// Beam search: three branches continue one cached prefix each their own way; each
// equals the full forward over its own sequence, and the prefix's cache is untouched.
TEST_P(Generation, BeamBranchesFromOnePrefixEqualTheirOwnFullForward) {
  Decoder d = decoder();
  torch::NoGradGuard no_grad;
  auto prefix = torch::randn({1, 5, 6}).to(device());
  KVCache cache = d.make_cache(1);
  d.cached(prefix, cache, {});
  std::vector<torch::Tensor> continuations;
  for (int beam = 0; beam < 3; ++beam) continuations.push_back(torch::randn({1, 3, 6}).to(device()));

  std::vector<KVCache> branches;
  for (int beam = 0; beam < 3; ++beam) branches.push_back(cache.clone());
  for (int beam = 0; beam < 3; ++beam) {
    std::vector<torch::Tensor> rows;
    for (int64_t t = 0; t < 3; ++t) rows.push_back(d.cached(continuations[beam].narrow(1, t, 1), branches[beam], {}));
    auto full = d.forward(torch::cat({prefix, continuations[beam]}, 1));
    EXPECT_TRUE(tol::close(torch::cat(rows, 1), full.narrow(1, 5, 3))) << "beam " << beam;
    EXPECT_EQ(branches[beam].length(), 8);
  }
  // The prefix's cache saw none of it.
  EXPECT_EQ(cache.length(), 5);
  auto next = torch::randn({1, 2, 6}).to(device());
  EXPECT_TRUE(tol::close(d.cached(next, cache, {}), d.forward(torch::cat({prefix, next}, 1)).narrow(1, 5, 2)));
  // A moved-from cache is empty, the moved-to one holds the tokens.
  KVCache moved = std::move(branches[0]);
  EXPECT_EQ(moved.length(), 8);
}

// Prompts of lengths 5, 2 and 4 in one left-padded batch, then four tokens decoded
// together: every real row equals the same sequence run alone.
TEST_P(Generation, LeftPaddedPromptsDecodeTogetherAsEachAlone) {
  Decoder d = decoder();
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> lengths{5, 2, 4};
  const int64_t B = 3, T0 = 5, steps = 4;
  std::vector<torch::Tensor> seqs;
  for (int64_t b = 0; b < B; ++b) seqs.push_back(torch::randn({1, lengths[b] + steps, 6}).to(device()));

  auto prompt = torch::zeros({B, T0, 6}, seqs[0].options());
  auto pad = torch::ones({B, T0}, torch::TensorOptions(torch::kBool).device(device()));
  for (int64_t b = 0; b < B; ++b) {
    prompt[b].narrow(0, T0 - lengths[b], lengths[b]).copy_(seqs[b][0].narrow(0, 0, lengths[b]));
    pad[b].narrow(0, T0 - lengths[b], lengths[b]).fill_(false);
    prompt[b].narrow(0, 0, T0 - lengths[b]).normal_();  // what padding holds must not matter
  }
  KVCache cache = d.make_cache(B);
  auto first = d.cached(prompt, cache, pad);
  EXPECT_TRUE(cache.has_padding());
  std::vector<torch::Tensor> steps_out;
  for (int64_t t = 0; t < steps; ++t) {
    auto token =
        torch::stack({seqs[0][0][lengths[0] + t], seqs[1][0][lengths[1] + t], seqs[2][0][lengths[2] + t]}).unsqueeze(1);
    steps_out.push_back(d.cached(token, cache, {}));  // new tokens are real: no mask needed
  }
  auto decoded = torch::cat(steps_out, 1);  // [B, steps, d_out]
  for (int64_t b = 0; b < B; ++b) {
    auto alone = d.forward(seqs[b]);  // [1, lengths[b] + steps, d_out]
    EXPECT_TRUE(tol::close(first[b].narrow(0, T0 - lengths[b], lengths[b]), alone[0].narrow(0, 0, lengths[b])))
        << "prompt of sequence " << b;
    EXPECT_TRUE(tol::close(decoded[b], alone[0].narrow(0, lengths[b], steps))) << "decoding of sequence " << b;
  }
  // A clone keeps the padding; reset() forgets it.
  KVCache copy = cache.clone();
  EXPECT_TRUE(copy.has_padding());
  EXPECT_TRUE(torch::equal(copy.padding().cpu(), cache.padding().cpu()));
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  if (!cache.static_shapes()) {
    EXPECT_FALSE(cache.has_padding());
  }
  auto unpadded = torch::cat({seqs[0].narrow(1, 0, 6), seqs[1].narrow(1, 0, 6), seqs[2].narrow(1, 0, 6)});
  EXPECT_TRUE(tol::close(d.cached(unpadded, cache, {}), d.forward(unpadded)));
}

// The padding mask of later chunks counts too: a padded token in the middle of a
// chunk is ignored by every later query.
TEST_P(Generation, PaddingInALaterChunkIsRemembered) {
  Decoder d = decoder();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({1, 7, 6}).to(device());
  auto pad = torch::tensor({{false, false, false, true, false, false, false}}).to(device());
  KVCache cache = d.make_cache(1);
  auto a = d.cached(x.narrow(1, 0, 3), cache, {});
  auto b = d.cached(x.narrow(1, 3, 2), cache, pad.narrow(1, 3, 2));
  auto c = d.cached(x.narrow(1, 5, 2), cache, {});
  // The same as a full forward without token 3 for the rows after it.
  auto without = d.forward(torch::cat({x.narrow(1, 0, 3), x.narrow(1, 4, 3)}, 1));
  EXPECT_TRUE(tol::close(a, without.narrow(1, 0, 3)));
  EXPECT_TRUE(tol::close(b.narrow(1, 1, 1), without.narrow(1, 3, 1)));
  EXPECT_TRUE(tol::close(c, without.narrow(1, 4, 2)));
}

std::string gen_name(const ::testing::TestParamInfo<GenParam>& info) {
  const auto [mh, backend, mask_buffer, static_shapes, device] = info.param;
  return devices::prefix(device) + (mh ? "MHA_" : "Causal_") + std::string(torchattn::to_string(backend)) +
         (mask_buffer ? "" : "_noBuffer") + (static_shapes ? "_static" : "");
}

INSTANTIATE_TEST_SUITE_P(Caches, Generation,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         gen_name);

// forward_cached under InferenceMode with a cache made there, as a server would.
TEST(Generation, InferenceModeCachesWorkUnderInferenceMode) {
  torch::manual_seed(91);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(6, 8, 16, 2));
  mha->eval();
  auto x = torch::randn({2, 6, 6});
  c10::InferenceMode guard;
  auto cache = mha->make_kv_cache(2);
  auto a = mha->forward_cached(x.narrow(1, 0, 4), cache);
  auto b = mha->forward_cached(x.narrow(1, 4, 2), cache);
  EXPECT_TRUE(tol::close(torch::cat({a, b}, 1), mha(x)));
}

// In training mode without dropout there is nothing random: forward_cached runs.
TEST(Generation, TrainingModeWithoutDropoutIsAllowed) {
  torch::manual_seed(92);
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(6, 5, 16));
  torch::NoGradGuard no_grad;
  auto cache = ca->make_kv_cache(1);
  auto x = torch::randn({1, 4, 6});
  EXPECT_TRUE(tol::close(ca->forward_cached(x, cache), ca(x)));
}


using MisuseParam = std::tuple<bool /*static_shapes*/, torch::Device>;

class TokenPositions : public ::testing::TestWithParam<MisuseParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<1>(GetParam())); }
};

// transformers' position_ids for a padded batch: attention_mask.cumsum(-1) - 1, so the
// next token of each sequence sits at attention_mask.sum(-1).
torch::Tensor next_positions(const torch::Tensor& attention_mask) { return attention_mask.sum(-1); }

// A left-padded batch of prompts of 3, 5 and 1 tokens, then decoding steps: the
// cache's token_positions() counts each sequence's real tokens as transformers'
// position_ids do; position() stays the write index.
TEST_P(TokenPositions, CountRealTokensAfterALeftPaddedPrefill) {
  const auto [static_shapes, device] = GetParam();
  torch::manual_seed(3);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2));
  mha->to(device);
  mha->eval();
  torch::NoGradGuard no_grad;
  auto attention_mask = torch::tensor({{0, 0, 1, 1, 1}, {1, 1, 1, 1, 1}, {0, 0, 0, 0, 1}}, torch::kLong).to(device);
  auto cache = mha->make_kv_cache(3, static_shapes);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), torch::zeros({3}, torch::kLong)));
  mha->forward_cached(torch::randn({3, 5, 8}).to(device), cache,
                      torchattn::padding_mask_from_attention_mask(attention_mask));
  EXPECT_EQ(cache.token_positions().device(), device);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), next_positions(attention_mask).cpu()));
  EXPECT_EQ(cache.position().item<int64_t>(), 5);
  for (int step = 0; step < 3; ++step) {
    mha->forward_cached(torch::randn({3, 1, 8}).to(device), cache);
    attention_mask = torch::cat({attention_mask, torch::ones({3, 1}, attention_mask.options())}, 1);
    EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), next_positions(attention_mask).cpu())) << "step " << step;
  }
  EXPECT_EQ(cache.position().item<int64_t>(), 8);
  // Unpadded: every sequence's next position is the cache's length.
  cache.reset();
  mha->forward_cached(torch::randn({3, 4, 8}).to(device), cache);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), torch::full({3}, 4, torch::kLong)));
  // A tensor of its own, not a view of the write index.
  cache.token_positions().add_(5);
  EXPECT_EQ(cache.position().item<int64_t>(), 4);
}

INSTANTIATE_TEST_SUITE_P(Caches, TokenPositions,
                         ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         [](const auto& info) {
                           return devices::prefix(std::get<1>(info.param)) +
                                  (std::get<0>(info.param) ? "Static" : "Dynamic");
                         });

// The point of GQA: a cache num_heads / num_kv_heads times smaller.
TEST(ModernAttention, GroupedCachesAreSmallerByTheGroupFactor) {
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(64, 64, 128, 8));
  torchattn::MultiHeadAttention gqa(torchattn::MultiHeadAttentionOptions(64, 64, 128, 8).num_kv_heads(2));
  auto a = mha->make_kv_cache(2), b = gqa->make_kv_cache(2);
  EXPECT_EQ(a.key_storage().numel(), 4 * b.key_storage().numel());
  EXPECT_EQ(b.key_storage().sizes(), (std::vector<int64_t>{2, 2, 128, 8}));
}

}  // namespace
