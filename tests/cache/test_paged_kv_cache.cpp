// PagedKVCache and MultiHeadAttention::forward_paged: the block bookkeeping (blocks
// taken as tokens are written and returned when a sequence goes, lowest first, copy on
// write after a fork, all-or-nothing steps), what it refuses and says; and every
// sequence of mixed steps (prefill chunks of any size beside decoding tokens, forks)
// against the contiguous KVCache path alone, over options (grouped heads, RoPE,
// windows, biases), dtypes, backends, block sizes and devices, within rounding; and,
// with packed projections on the CPU, each sequence's rows the same bits in any company
// and any chunking.

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/multi_head_attention.h>
#include <torchattn/paged_kv_cache.h>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/paged_write.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using torchattn::PagedKVCache;
using torchattn::PagedKVCacheOptions;
using torchattn::StepTokens;

PagedKVCache small_cache(int64_t num_blocks, int64_t block_size, int64_t layers = 1) {
  std::vector<torchattn::PagedLayer> specs(static_cast<size_t>(layers),
                                           torchattn::PagedLayer{2, 4, torch::TensorOptions().dtype(torch::kFloat), 0});
  return PagedKVCache(specs, PagedKVCacheOptions(num_blocks).block_size(block_size));
}

// Writes `count` tokens of sequence s whose keys and values are all `value`, in every layer.
void write_tokens(PagedKVCache& cache, int64_t s, int64_t count, float value) {
  auto step = cache.begin_step({{s, count}});
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    const auto kv = torch::full({count, 2, 4}, value);
    cache.write(l, step, kv, kv * 2);
  }
}

TEST(PagedKVCache, BlocksAreTakenAsTokensComeAndReturnedWhenASequenceGoes) {
  torch::NoGradGuard no_grad;
  auto cache = small_cache(/*num_blocks=*/8, /*block_size=*/4);
  EXPECT_EQ(cache.free_blocks(), 8);
  EXPECT_EQ(cache.bytes_per_block(), 2 * 4 * 2 * 4 * 4);  // keys and values, 4 tokens of 2 heads of 4 floats
  const int64_t a = cache.add_sequence(), b = cache.add_sequence();
  EXPECT_EQ(cache.used_blocks(), 0);  // an empty sequence holds nothing
  EXPECT_EQ(cache.blocks_needed({{a, 5}, {b, 1}}), 3);
  write_tokens(cache, a, 5, 1.0f);
  write_tokens(cache, b, 1, 2.0f);
  EXPECT_EQ(cache.block_table(a), (std::vector<int64_t>{0, 1}));  // the lowest free blocks first
  EXPECT_EQ(cache.block_table(b), (std::vector<int64_t>{2}));
  EXPECT_EQ(cache.length(a), 5);
  write_tokens(cache, a, 3, 3.0f);  // fills block 1: no new block
  EXPECT_EQ(cache.block_table(a).size(), 2u);
  EXPECT_EQ(cache.used_blocks(), 3);
  // The keys read back in order, each written value where it was written.
  const auto keys = cache.sequence_keys(0, a);
  ASSERT_EQ(keys.sizes(), (std::vector<int64_t>{2, 8, 4}));
  EXPECT_TRUE(torch::equal(keys.narrow(1, 0, 5), torch::full({2, 5, 4}, 1.0f)));
  EXPECT_TRUE(torch::equal(keys.narrow(1, 5, 3), torch::full({2, 3, 4}, 3.0f)));
  EXPECT_TRUE(torch::equal(cache.sequence_values(0, b), torch::full({2, 1, 4}, 4.0f)));
  cache.remove(a);
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_FALSE(cache.contains(a));
  const int64_t c = cache.add_sequence();
  write_tokens(cache, c, 4, 5.0f);
  EXPECT_EQ(cache.block_table(c), (std::vector<int64_t>{0}));  // a's block 0 again
  cache.truncate(c, 1);                                        // keeps its first token, still in block 0
  EXPECT_EQ(cache.block_table(c), (std::vector<int64_t>{0}));
  cache.truncate(c, 0);
  EXPECT_TRUE(cache.block_table(c).empty());
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_EQ(cache.sequences(), (std::vector<int64_t>{b, c}));
}

TEST(PagedKVCache, ForksShareBlocksUntilOneWritesIntoAShared) {
  torch::NoGradGuard no_grad;
  auto cache = small_cache(/*num_blocks=*/6, /*block_size=*/4, /*layers=*/2);
  const int64_t parent = cache.add_sequence();
  write_tokens(cache, parent, 6, 1.0f);  // a full block and half of another
  const int64_t child = cache.fork(parent);
  EXPECT_EQ(cache.block_table(child), cache.block_table(parent));
  EXPECT_EQ(cache.used_blocks(), 2);  // shared, not copied
  // The child writes into the shared half-filled block: that block is copied first (in
  // every layer), the full one stays shared.
  EXPECT_EQ(cache.blocks_needed({{child, 1}}), 1);
  write_tokens(cache, child, 1, 9.0f);
  EXPECT_EQ(cache.used_blocks(), 3);
  EXPECT_EQ(cache.block_table(child)[0], cache.block_table(parent)[0]);
  EXPECT_NE(cache.block_table(child)[1], cache.block_table(parent)[1]);
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(torch::equal(cache.sequence_keys(l, parent), torch::full({2, 6, 4}, 1.0f)));
    const auto k = cache.sequence_keys(l, child);
    EXPECT_TRUE(torch::equal(k.narrow(1, 0, 6), torch::full({2, 6, 4}, 1.0f)));
    EXPECT_TRUE(torch::equal(k.narrow(1, 6, 1), torch::full({2, 1, 4}, 9.0f)));
  }
  // The parent writes too: its half block is its own now, no copy.
  EXPECT_EQ(cache.blocks_needed({{parent, 2}}), 0);
  write_tokens(cache, parent, 2, 7.0f);
  EXPECT_TRUE(torch::equal(cache.sequence_keys(0, child).narrow(1, 6, 1), torch::full({2, 1, 4}, 9.0f)));
  // Blocks are freed when the last sequence holding them goes.
  cache.remove(parent);
  EXPECT_EQ(cache.used_blocks(), 2);
  cache.remove(child);
  EXPECT_EQ(cache.used_blocks(), 0);
  // A fork of a sequence on a block boundary writes a new block of its own, no copy.
  const int64_t p = cache.add_sequence();
  write_tokens(cache, p, 4, 1.0f);
  const int64_t q = cache.fork(p);
  EXPECT_EQ(cache.blocks_needed({{q, 1}}), 1);
  write_tokens(cache, q, 1, 2.0f);
  EXPECT_EQ(cache.used_blocks(), 2);
}

// Prefix caching: published full blocks are found again by their tokens (a whole chain,
// token for token), shared with later sequences, kept when nobody holds them, and given
// back least recently released first when the pool needs them.
TEST(PagedKVCache, PublishedBlocksAreReusedByTheirTokensAndEvictedLeastRecentlyReleasedFirst) {
  torch::NoGradGuard no_grad;
  auto cache = small_cache(/*num_blocks=*/6, /*block_size=*/4, /*layers=*/2);
  const std::vector<int64_t> tokens{10, 11, 12, 13, 20, 21, 22, 23, 30, 31};
  const int64_t a = cache.add_sequence(tokens);
  EXPECT_EQ(cache.length(a), 0);  // nothing published yet
  write_tokens(cache, a, 4, 1.0f);
  write_tokens(cache, a, 6, 2.0f);
  cache.publish(a, tokens);  // its two full blocks; the third, partly filled, is not
  EXPECT_EQ(cache.used_blocks(), 3);
  // Another sequence with the same first 9 tokens takes the two blocks (shared) ...
  std::vector<int64_t> longer(tokens.begin(), tokens.begin() + 9);
  longer.insert(longer.end(), {40, 41, 42});
  const int64_t b = cache.add_sequence(longer);
  EXPECT_EQ(cache.length(b), 8);
  const auto table_a = cache.block_table(a);
  EXPECT_EQ(cache.block_table(b), (std::vector<int64_t>(table_a.begin(), table_a.begin() + 2)));
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(torch::equal(cache.sequence_keys(l, b), cache.sequence_keys(l, a).narrow(1, 0, 8)));
  }
  // ... and writes past them into blocks of its own.
  write_tokens(cache, b, 4, 3.0f);
  EXPECT_EQ(cache.used_blocks(), 4);
  EXPECT_TRUE(torch::equal(cache.sequence_keys(0, a).narrow(1, 8, 2), torch::full({2, 2, 4}, 2.0f)));
  // A prefix that differs in its first block finds nothing; one that equals the first
  // block only, that block; at most all tokens but the last are reused.
  EXPECT_EQ(cache.length(cache.add_sequence({10, 11, 12, 99, 20, 21, 22, 23, 30})), 0);
  EXPECT_EQ(cache.length(cache.add_sequence({10, 11, 12, 13, 20, 21, 22, 99, 30})), 4);
  EXPECT_EQ(cache.length(cache.add_sequence({10, 11, 12, 13, 20, 21, 22, 23})), 4);
  EXPECT_EQ(cache.length(cache.add_sequence({20, 21, 22, 23, 30})), 0);  // a block is found only after its parent
  for (const int64_t s : cache.sequences()) {
    if (s != a && s != b) cache.remove(s);
  }
  // When every sequence holding them is gone, published blocks stay for reuse and count
  // as free.
  cache.remove(a);
  cache.remove(b);
  EXPECT_EQ(cache.free_blocks(), 6);
  EXPECT_EQ(cache.used_blocks(), 0);
  EXPECT_EQ(cache.reusable_blocks(), 2);
  const int64_t c = cache.add_sequence(tokens);
  EXPECT_EQ(cache.length(c), 8);
  EXPECT_EQ(cache.reusable_blocks(), 0);
  EXPECT_TRUE(torch::equal(cache.sequence_values(1, c),
                           torch::cat({torch::full({2, 4, 4}, 2.0f), torch::full({2, 4, 4}, 4.0f)}, 1)));
  cache.remove(c);
  // The pool needs blocks: free ones it used before go first (blocks 2 and 3), then the
  // published ones, least recently released first (a sequence gives its last block back
  // first: the child goes before the first block, which stays findable), before blocks it
  // never used (4 and 5).
  const int64_t d = cache.add_sequence();
  write_tokens(cache, d, 8, 5.0f);
  EXPECT_EQ(cache.block_table(d), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(cache.reusable_blocks(), 2);
  write_tokens(cache, d, 4, 5.0f);
  EXPECT_EQ(cache.block_table(d), (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(cache.reusable_blocks(), 1);
  const int64_t first_only = cache.add_sequence(tokens);
  EXPECT_EQ(cache.block_table(first_only), (std::vector<int64_t>{0}));
  cache.remove(first_only);
  write_tokens(cache, d, 8, 5.0f);
  EXPECT_EQ(cache.block_table(d), (std::vector<int64_t>{2, 3, 1, 0, 4}));
  EXPECT_EQ(cache.length(cache.add_sequence(tokens)), 0);
  // A truncated sequence writing into a published block copies it first.
  cache.remove(d);
  for (const int64_t s : cache.sequences()) cache.remove(s);
  const int64_t e = cache.add_sequence(tokens);
  write_tokens(cache, e, 8, 6.0f);
  cache.publish(e, tokens);
  const auto published = cache.block_table(e);
  cache.truncate(e, 6);
  write_tokens(cache, e, 2, 7.0f);
  EXPECT_NE(cache.block_table(e)[1], published[1]);
  const int64_t f = cache.add_sequence(tokens);
  EXPECT_EQ(cache.block_table(f), published);
  EXPECT_TRUE(torch::equal(cache.sequence_keys(0, f), torch::full({2, 8, 4}, 6.0f)));
  expect_error([&] { cache.publish(e, {1, 2, 3}); }, "PagedKVCache: publish expected the tokens of sequence " +
                                                         std::to_string(e) + " (at least its 8), got 3");
  for (const int64_t q : cache.sequences()) cache.remove(q);
  // A fork made before its parent published, publishing the blocks it shares, adds no
  // second hold: every block comes back.
  const int64_t h = cache.add_sequence();
  write_tokens(cache, h, 4, 8.0f);
  const int64_t k = cache.fork(h);
  const std::vector<int64_t> other{50, 51, 52, 53};
  cache.publish(h, other);
  cache.publish(k, other);
  cache.remove(h);
  cache.remove(k);
  EXPECT_EQ(cache.used_blocks(), 0);
  EXPECT_EQ(cache.free_blocks(), cache.num_blocks());
}

TEST(PagedKVCache, BadUseIsAnErrorNamingWhatIsWrongAndChangesNothing) {
  torch::NoGradGuard no_grad;
  auto cache = small_cache(/*num_blocks=*/2, /*block_size=*/4);
  const int64_t a = cache.add_sequence(), b = cache.add_sequence();
  expect_error([&] { cache.begin_step({{a, 5}, {b, 4}}); }, "the step needs 3 free blocks and the pool has 2 of 2");
  EXPECT_EQ(cache.length(a), 0);  // all or nothing
  EXPECT_EQ(cache.free_blocks(), 2);
  expect_error([&] { cache.begin_step({{a, 0}}); }, "expected at least one new token for sequence 0, got 0");
  expect_error([&] { cache.begin_step({{a, 1}, {a, 1}}); }, "got sequence 0 twice");
  expect_error([&] { cache.begin_step({{7, 1}}); }, "begin_step: no sequence 7 in this cache");
  expect_error([&] { cache.begin_step({}); }, "expected at least one sequence, got none");
  expect_error([&] { cache.remove(7); }, "remove: no sequence 7");
  expect_error([&] { cache.fork(7); }, "fork: no sequence 7");
  expect_error([&] { cache.truncate(a, 1); }, "truncate expected a length in [0, 0] for sequence 0, got 1");
  auto step = cache.begin_step({{a, 2}});
  expect_error([&] { cache.write(0, step, torch::zeros({3, 2, 4}), torch::zeros({3, 2, 4})); },
               "write expected keys and values of shape [2, 2, 4], got [3, 2, 4]");
  expect_error([&] { cache.write(0, step, torch::zeros({2, 2, 4}, torch::kDouble), torch::zeros({2, 2, 4})); },
               "write expected keys and values of dtype float");
  expect_error([&] { cache.write(1, step, torch::zeros({2, 2, 4}), torch::zeros({2, 2, 4})); },
               "expected a layer in [0, 1), got 1");
  cache.add_sequence();  // the cache changed: the step is stale
  EXPECT_FALSE(cache.is_current(step));
  expect_error([&] { cache.write(0, step, torch::zeros({2, 2, 4}), torch::zeros({2, 2, 4})); },
               "this step is not the cache's current one");
  auto other = small_cache(2, 4);
  EXPECT_FALSE(other.is_current(cache.begin_step({{b, 1}})));
  expect_error([] { small_cache(0, 4); }, "expected num_blocks >= 1, got 0");
  expect_error([] { small_cache(2, 0); }, "expected block_size >= 1, got 0");
  PagedKVCache moved = std::move(cache);
  expect_error([&] { (void)cache.free_blocks(); }, "this cache was moved from");
  EXPECT_EQ(moved.free_blocks(), 0);
}

// ---- the CPU kernel, for each instruction set this CPU has ----

// The CPU write (kernels::cpu::paged_write) against index_put_ over the pool's by-token
// views: the same bits in every slot, over dtypes, head sizes, block sizes and k/v that
// are slices of a wider projection (as the packed q|k|v product gives them).
TEST(PagedKernel, WriteGivesTheBitsOfIndexPut) {
  namespace K = torchattn::kernels::cpu;
  torch::manual_seed(7);
  const int64_t nb = 12, Hkv = 3;
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
    for (const auto& [d, bs] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {20, 5}, {64, 16}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " d=" + std::to_string(d) + " bs=" + std::to_string(bs));
      const int64_t N = std::min<int64_t>(nb * bs, 9);
      // N distinct slots, shuffled: token i to slot[i].
      std::vector<int64_t> slot(static_cast<size_t>(nb * bs));
      std::iota(slot.begin(), slot.end(), 0);
      std::shuffle(slot.begin(), slot.end(), std::mt19937(static_cast<unsigned>(d + bs)));
      std::vector<int64_t> blocks, offsets;
      for (int64_t i = 0; i < N; ++i) {
        blocks.push_back(slot[static_cast<size_t>(i)] / bs);
        offsets.push_back(slot[static_cast<size_t>(i)] % bs);
      }
      const auto qkv = torch::randn({N, 3 * Hkv, d}).to(dtype);
      const auto k = qkv.narrow(1, Hkv, Hkv), v = qkv.narrow(1, 2 * Hkv, Hkv);  // strided
      auto keys = torch::randn({nb, Hkv, d, bs}).to(dtype), values = torch::randn({nb, Hkv, bs, d}).to(dtype);
      auto want_keys = keys.clone(), want_values = values.clone();
      const auto b = torch::tensor(blocks), o = torch::tensor(offsets);
      PagedKVCache::by_token(want_keys, true).index_put_({b, o}, k);
      PagedKVCache::by_token(want_values, false).index_put_({b, o}, v);
      ASSERT_TRUE(K::paged_write_applies(k, v, keys, values));
      K::paged_write(k, v, blocks.data(), offsets.data(), keys, values);
      EXPECT_TRUE(torch::equal(keys, want_keys));
      EXPECT_TRUE(torch::equal(values, want_values));
    }
  }
  // Where it does not apply, the cache takes index_put_.
  const auto k = torch::randn({2, 3, 4}), pool_k = torch::zeros({4, 3, 4, 2}), pool_v = torch::zeros({4, 3, 2, 4});
  EXPECT_FALSE(K::paged_write_applies(k, k.to(torch::kDouble), pool_k, pool_v));  // mixed dtypes
  EXPECT_FALSE(K::paged_write_applies(k.transpose(1, 2), k, pool_k, pool_v));     // rows not unit-stride
  EXPECT_FALSE(K::paged_write_applies(k, k, pool_k.transpose(2, 3), pool_v));     // pool not contiguous
  EXPECT_FALSE(K::paged_write_applies(k.to(torch::kInt), k.to(torch::kInt), pool_k.to(torch::kInt),
                                      pool_v.to(torch::kInt)));  // not floating
}

TEST(PagedKernel, EveryInstructionSetGivesTheMathAndEachRowAloneTheSameBits) {
  namespace K = torchattn::kernels::cpu;
  torch::manual_seed(33);
  torch::NoGradGuard no_grad;
  // Odd sizes: head_dim 20 and block_size 5 leave partial vectors everywhere.
  const int64_t nb = 40, Hkv = 2, G = 3, d = 20, bs = 5;
  const auto keys = torch::randn({nb, Hkv, d, bs}), values = torch::randn({nb, Hkv, bs, d});
  // Four sequences: 1 new row after 17 keys, 7 new rows of 7 (a first chunk), 4 after 30,
  // and 20 after 40 (three blocks of rows; with the others, work enough for the threads).
  const std::vector<std::pair<int64_t, int64_t>> seqs{{1, 18}, {7, 7}, {4, 34}, {20, 60}};
  std::vector<int64_t> qs{0}, ks{0}, slots;
  std::vector<int64_t> free_blocks(nb);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(5));
  size_t next = 0;
  for (const auto& [n, L] : seqs) {
    std::vector<int64_t> table;
    for (int64_t p = 0; p < L; ++p) {
      if (p % bs == 0) table.push_back(free_blocks[next++]);
      slots.push_back(table.back() * bs + p % bs);
    }
    qs.push_back(qs.back() + n);
    ks.push_back(ks.back() + L);
  }
  const auto q = torch::randn({qs.back(), Hkv * G, d});
  const double scale = 0.3;
  // What may change the scores (scores here reach about 4: a cap of 2 bites).
  struct Extra {
    std::string name;
    std::optional<double> softcap;
    torch::Tensor slopes, sinks;  // [H] float32, or undefined
  };
  const auto slopes = torch::rand({Hkv * G}) * 0.5, sinks = torch::randn({Hkv * G}) * 2;
  const std::vector<Extra> extras{{"plain", std::nullopt, {}, {}},
                                  {"softcap", 2.0, {}, {}},
                                  {"alibi", std::nullopt, slopes, {}},
                                  {"sinks", std::nullopt, {}, sinks},
                                  {"softcap_alibi_sinks", 1.5, slopes, sinks}};
  for (const auto& extra : extras) {
    for (const std::optional<int64_t> window : {std::optional<int64_t>(), std::optional<int64_t>(6)}) {
      // The math in float64: each sequence's keys gathered, causal from its position.
      auto want = torch::zeros({qs.back(), Hkv * G, d}, torch::kDouble);
      for (size_t s = 0; s < seqs.size(); ++s) {
        const auto [n, L] = seqs[s];
        std::vector<torch::Tensor> k, v;
        for (int64_t p = 0; p < L; ++p) {
          const int64_t slot = slots[static_cast<size_t>(ks[s] + p)];
          k.push_back(keys[slot / bs].select(2, slot % bs));    // [Hkv, d]
          v.push_back(values[slot / bs].select(1, slot % bs));  // [Hkv, d]
        }
        const auto K_ = torch::stack(k, 1).to(torch::kDouble).repeat_interleave(G, 0);  // [H, L, d]
        const auto V_ = torch::stack(v, 1).to(torch::kDouble).repeat_interleave(G, 0);
        const auto Q = q.narrow(0, qs[s], n).transpose(0, 1).to(torch::kDouble);  // [H, n, d]
        auto scores = torch::matmul(Q, K_.transpose(1, 2)) * scale;               // [H, n, L]
        const auto pos = torch::arange(L - n, L).unsqueeze(1), key = torch::arange(L).unsqueeze(0);
        if (extra.softcap) scores = torch::tanh(scores / *extra.softcap) * *extra.softcap;
        if (extra.slopes.defined()) scores = scores + extra.slopes.to(torch::kDouble).view({-1, 1, 1}) * (key - pos);
        auto hide = key > pos;
        if (window) hide = hide.logical_or(key <= pos - *window);
        scores = scores.masked_fill(hide, -INFINITY);
        torch::Tensor p;
        if (extra.sinks.defined()) {  // a column of the sink's logit, dropped after the softmax
          const auto sink = extra.sinks.to(torch::kDouble).view({-1, 1, 1}).expand({Hkv * G, n, 1});
          p = torch::softmax(torch::cat({scores, sink}, -1), -1).narrow(-1, 0, L);
        } else {
          p = torch::softmax(scores, -1);
        }
        want.narrow(0, qs[s], n).copy_(torch::matmul(p, V_).transpose(0, 1));
      }
      const K::PagedScores scores{extra.softcap,
                                  extra.slopes.defined() ? extra.slopes.const_data_ptr<float>() : nullptr,
                                  extra.sinks.defined() ? extra.sinks.const_data_ptr<float>() : nullptr};
      for (const auto isa : K::paged_isas()) {
        SCOPED_TRACE("isa " + std::to_string(static_cast<int>(isa)) + (window ? " window " : " ") + extra.name);
        auto out = torch::zeros_like(q);
        const K::PagedRows rows{slots.data(), &qs, &ks, window};
        K::paged_attention(q, keys, values, rows, {0, 1, 2, 3}, scale, out, isa, scores);
        EXPECT_LT((out.to(torch::kDouble) - want).abs().max().item<double>(), 2e-6);
        // A row alone (as if its chunk were that row, its keys the ones up to its own):
        // the same bits, whatever block of rows or tile it had in the chunk.
        for (const auto& [s, r] : std::vector<std::pair<int64_t, int64_t>>{{1, 6}, {1, 0}, {3, 0}, {3, 9}, {3, 19}}) {
          const int64_t n = seqs[static_cast<size_t>(s)].first, L = seqs[static_cast<size_t>(s)].second;
          const int64_t keys_seen = L - n + r + 1;
          const std::vector<int64_t> qs1{0, 1}, ks1{0, keys_seen};
          const std::vector<int64_t> slots1(slots.begin() + ks[s], slots.begin() + ks[s] + keys_seen);
          const auto q1 = q.narrow(0, qs[s] + r, 1).contiguous();
          auto out1 = torch::zeros_like(q1);
          const K::PagedRows rows1{slots1.data(), &qs1, &ks1, window};
          K::paged_attention(q1, keys, values, rows1, {0}, scale, out1, isa, scores);
          EXPECT_TRUE(torch::equal(out1[0], out[qs[s] + r])) << "sequence " << s << " row " << r;
        }
      }
    }
  }
  expect_error(
      [&] {
        auto out = torch::zeros_like(q);
        const K::PagedRows rows{slots.data(), &qs, &ks, std::nullopt};
        K::paged_attention(q, keys, values, rows, {0}, scale, out, std::nullopt,
                           K::PagedScores{-1.0, nullptr, nullptr});
      },
      "paged_attention: expected softcap > 0, got -1");
  EXPECT_GE(K::paged_isas().size(), 1u);
}

// ---- forward_paged against the contiguous cache ----

struct PagedCase {
  std::string name;
  torch::Dtype dtype;
  torchattn::Backend backend;
  int64_t num_heads, num_kv_heads;
  bool rope;
  std::optional<int64_t> window;
  int64_t block_size;
  bool pack = false;
  bool qk_norm_own_head_dim = false;  // QK-norm and a head_dim apart from d_out (Qwen3)
  std::optional<double> softcap = std::nullopt;
  bool sinks = false;
  bool alibi = false;
};

std::string describe(const PagedCase& c, const torch::Device& device) { return devices::prefix(device) + c.name; }

std::vector<PagedCase> paged_cases() {
  using torchattn::Backend;
  return {
      {"float_auto_mha", torch::kFloat, Backend::Auto, 4, 4, false, std::nullopt, 16},
      {"float_auto_gqa_rope", torch::kFloat, Backend::Auto, 6, 2, true, std::nullopt, 4},
      {"float_auto_mqa_rope_window", torch::kFloat, Backend::Auto, 4, 1, true, int64_t{5}, 3},
      {"float_auto_gqa_rope_packed", torch::kFloat, Backend::Auto, 6, 3, true, std::nullopt, 8, true},
      {"float_sdpa_gqa_rope", torch::kFloat, Backend::SDPA, 6, 2, true, std::nullopt, 4},
      {"double_reference_gqa_rope_window", torch::kDouble, Backend::Reference, 6, 3, true, int64_t{7}, 5},
      {"double_auto_mha_block1", torch::kDouble, Backend::Auto, 2, 2, false, std::nullopt, 1},
      {"float_auto_gqa_rope_qknorm_headdim", torch::kFloat, Backend::Auto, 4, 2, true, std::nullopt, 4, false, true},
      // Gemma 2's softcap beside a window, gpt-oss' sinks, BLOOM's ALiBi.
      {"float_auto_gqa_rope_window_softcap_sinks", torch::kFloat, Backend::Auto, 6, 2, true, int64_t{5}, 4, false,
       false, 0.5, true},
      {"float_auto_gqa_alibi", torch::kFloat, Backend::Auto, 6, 3, false, std::nullopt, 4, false, false, std::nullopt,
       false, true},
      {"float_auto_packed_alibi_softcap_sinks", torch::kFloat, Backend::Auto, 6, 2, false, std::nullopt, 8, true, false,
       0.5, true, true},
      {"double_reference_window_alibi_softcap_sinks", torch::kDouble, Backend::Reference, 4, 2, false, int64_t{7}, 5,
       false, false, 0.5, true, true},
  };
}

class PagedForward : public ::testing::TestWithParam<std::tuple<PagedCase, torch::Device>> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<1>(GetParam())); }
};

TEST_P(PagedForward, EverySequenceEqualsTheContiguousCacheAlone) {
  const auto& [c, device] = GetParam();
  torch::manual_seed(31);
  const int64_t d_in = 24, head_dim = 4, context = 80;
  auto options = torchattn::MultiHeadAttentionOptions(d_in, c.num_heads * head_dim, context, c.num_heads)
                     .num_kv_heads(c.num_kv_heads)
                     .qkv_bias(true)
                     .backend(c.backend)
                     .window(c.window)
                     .projections({.pack = {.on = c.pack}});
  if (c.rope) options.rope(torchattn::RoPEOptions(10000.0));
  if (c.qk_norm_own_head_dim) options.d_out(20).head_dim(6).qk_norm(torchattn::QKNormOptions());
  options.softcap(c.softcap).sinks(c.sinks).alibi(c.alibi);
  torchattn::MultiHeadAttention mha(options);
  if (c.sinks) mha->sinks.data().normal_(0.0, 2.0);
  if (c.qk_norm_own_head_dim) {
    mha->q_norm->weight.data().uniform_(0.5, 1.5);
    mha->k_norm->weight.data().uniform_(0.5, 1.5);
  }
  mha->to(device, c.dtype);
  mha->eval();
  torch::NoGradGuard no_grad;
  const int64_t num_blocks = 100 / c.block_size + 8;  // every token of the test, and a block per sequence spare
  auto cache = mha->make_paged_kv_cache(PagedKVCacheOptions(num_blocks).block_size(c.block_size));

  // Four sequences, each fed in chunks of its own (short, long, single tokens), in
  // steps that mix them; a fifth forks the first after its prompt.
  const std::vector<int64_t> lengths{3, 40, 23, 9};
  std::vector<torch::Tensor> xs;
  for (const int64_t T : lengths) xs.push_back(torch::randn({T, d_in}, torch::TensorOptions(c.dtype).device(device)));
  std::vector<int64_t> ids, done(lengths.size(), 0);
  for (size_t s = 0; s < lengths.size(); ++s) ids.push_back(cache.add_sequence());
  std::vector<std::vector<torch::Tensor>> paged_out(lengths.size() + 1);
  std::vector<std::vector<int64_t>> chunks(lengths.size() + 1);
  std::mt19937 rng(7);
  std::optional<int64_t> fork_id;
  torch::Tensor fork_x;
  int64_t fork_done = 0, fork_from = 0;
  for (int step_index = 0; step_index < 200; ++step_index) {
    std::vector<StepTokens> tokens;
    std::vector<torch::Tensor> parts;
    std::vector<size_t> who;
    for (size_t s = 0; s < lengths.size(); ++s) {
      if (done[s] == lengths[s] || rng() % 3 == 0) continue;
      const int64_t left = lengths[s] - done[s];
      const int64_t pick = rng() % 4;
      const int64_t n = std::min(left, pick == 0   ? int64_t{1}
                                       : pick == 1 ? int64_t{3}
                                       : pick == 2 ? int64_t{17}
                                                   : left);
      tokens.push_back({ids[s], n});
      parts.push_back(xs[s].narrow(0, done[s], n));
      chunks[s].push_back(n);
      who.push_back(s);
      done[s] += n;
    }
    if (fork_id && fork_done < fork_x.size(0)) {
      tokens.push_back({*fork_id, 1});
      parts.push_back(fork_x.narrow(0, fork_done, 1));
      who.push_back(lengths.size());
      chunks[lengths.size()].push_back(1);
      ++fork_done;
    }
    if (tokens.empty()) {
      if (fork_id && fork_done == fork_x.size(0)) break;
      continue;
    }
    auto step = cache.begin_step(tokens);
    const auto y = mha->forward_paged(torch::cat(parts), cache, step);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{step.num_tokens(), options.d_out()}));
    for (size_t i = 0; i < who.size(); ++i) {
      paged_out[who[i]].push_back(y.narrow(0, step.query_start[i], tokens[i].count));
    }
    if (!fork_id && done[0] == lengths[0]) {  // the first sequence's prompt is in: fork it
      fork_id = cache.fork(ids[0]);
      fork_from = lengths[0];
      fork_x = torch::randn({6, d_in}, torch::TensorOptions(c.dtype).device(device));
    }
  }
  ASSERT_TRUE(fork_id.has_value());
  // The contiguous path, each sequence alone, fed in the same chunks.
  const auto tol = tol::for_dtype(c.dtype);
  auto contiguous = [&](const torch::Tensor& x, const std::vector<int64_t>& sizes, torchattn::KVCache& kv) {
    std::vector<torch::Tensor> out;
    int64_t at = 0;
    for (const int64_t n : sizes) {
      out.push_back(mha->forward_cached(x.narrow(0, at, n).unsqueeze(0), kv)[0]);
      at += n;
    }
    return out;
  };
  for (size_t s = 0; s < lengths.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    ASSERT_EQ(done[s], lengths[s]);
    auto kv = mha->make_kv_cache(1);
    const auto want = contiguous(xs[s], chunks[s], kv);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(tol::close(paged_out[s][i], want[i], tol)) << "chunk " << i << " of " << chunks[s][i];
    }
    // And the full forward's rows.
    EXPECT_TRUE(tol::close(torch::cat(paged_out[s]), mha->forward(xs[s]), tol));
    // The cache holds the keys a contiguous cache holds.
    EXPECT_TRUE(tol::close(cache.sequence_keys(0, ids[s]), kv.keys()[0], tol));
  }
  // With packed projections on the CPU every row is computed alike whatever shares its
  // step or chunk: each sequence fed alone, a token at a time, gives the same bits.
  if (c.pack && device.is_cpu() && c.backend == torchattn::Backend::Auto) {
    auto alone = mha->make_paged_kv_cache(PagedKVCacheOptions(num_blocks).block_size(c.block_size));
    for (size_t s = 0; s < lengths.size(); ++s) {
      const int64_t id = alone.add_sequence();
      std::vector<torch::Tensor> rows;
      for (int64_t p = 0; p < lengths[s]; ++p) {
        auto step = alone.begin_step({{id, 1}});
        rows.push_back(mha->forward_paged(xs[s].narrow(0, p, 1), alone, step));
      }
      EXPECT_TRUE(torch::equal(torch::cat(rows), torch::cat(paged_out[s]))) << "sequence " << s;
    }
  }
  // The fork continues from the first sequence's prompt as a clone of its cache would.
  auto kv = mha->make_kv_cache(1);
  (void)contiguous(xs[0], chunks[0], kv);
  auto branch = kv.clone();
  const auto want = contiguous(fork_x, chunks[lengths.size()], branch);
  EXPECT_TRUE(tol::close(torch::cat(paged_out[lengths.size()]), torch::cat(want), tol));
  EXPECT_EQ(cache.length(*fork_id), fork_from + fork_x.size(0));
  for (const int64_t id : cache.sequences()) cache.remove(id);
  EXPECT_EQ(cache.free_blocks(), num_blocks);
}

INSTANTIATE_TEST_SUITE_P(Options, PagedForward,
                         ::testing::Combine(::testing::ValuesIn(paged_cases()), ::testing::ValuesIn(devices::all())),
                         [](const auto& info) { return describe(std::get<0>(info.param), std::get<1>(info.param)); });

TEST(PagedForward, MisuseIsAnErrorNamingTheCause) {
  torch::manual_seed(32);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 6, 2).rope(torchattn::RoPEOptions(1e4)));
  torchattn::MultiHeadAttention other(torchattn::MultiHeadAttentionOptions(8, 8, 6, 2));
  auto cache = mha->make_paged_kv_cache(PagedKVCacheOptions(8).block_size(2));
  const int64_t s = cache.add_sequence();
  {
    torch::NoGradGuard no_grad;
    auto step = cache.begin_step({{s, 3}});
    expect_error([&] { mha->forward_paged(torch::randn({2, 8}), cache, step); },
                 "forward_paged expected the step's 3 tokens, got x with 2");
    expect_error([&] { mha->forward_paged(torch::randn({1, 3, 8}), cache, step); },
                 "forward_paged expected x of rank 2 [N, d_in]");
    expect_error([&] { mha->forward_paged(torch::randn({3, 8}, torch::kDouble), cache, step); },
                 "expected input of the module's dtype Float");
    expect_error([&] { other->forward_paged(torch::randn({3, 8}), cache, step); },
                 "layer 0 of this paged cache belongs to another module");
    expect_error([&] { mha->forward_paged(torch::randn({3, 8}), cache, step, 1); },
                 "expected a layer in [0, 1) of the cache, got 1");
    mha->forward_paged(torch::randn({3, 8}), cache, step);
    auto late = cache.begin_step({{s, 4}});  // 7 tokens: past context_length=6
    expect_error([&] { mha->forward_paged(torch::randn({4, 8}), cache, late); },
                 "a sequence of the step reaches 7 tokens, past context_length=6");
    auto next = cache.begin_step({{s, 1}});
    expect_error([&] { mha->forward_paged(torch::randn({3, 8}), cache, step); },  // x fits the stale step
                 "expected the cache's current step");
  }
  const int64_t fresh = cache.add_sequence();
  auto step = cache.begin_step({{fresh, 1}});
  expect_error([&] { mha->forward_paged(torch::randn({1, 8}), cache, step); },
               "forward_paged is for inference: call it under torch::NoGradGuard");
  torchattn::MultiHeadAttention encoder(torchattn::MultiHeadAttentionOptions(8, 8, 6, 2).causal(false));
  auto encoder_cache = encoder->make_paged_kv_cache(PagedKVCacheOptions(4));
  const int64_t e = encoder_cache.add_sequence();
  torch::NoGradGuard no_grad;
  auto encoder_step = encoder_cache.begin_step({{e, 2}});
  expect_error([&] { encoder->forward_paged(torch::randn({2, 8}), encoder_cache, encoder_step); },
               "forward_paged needs a causal module, this one has causal(false)");
}

}  // namespace
