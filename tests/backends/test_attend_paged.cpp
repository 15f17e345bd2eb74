// A paged step at the backends' level (backends/attend_paged.cpp): a pool laid out as
// PagedKVCache lays it out, blocks in shuffled order, and sequences that decode one row,
// prefill a short chunk (the paged kernel on the CPU with Backend::Auto) and a long one
// (gathered for the dispatcher), each against the same attention in float64 over that sequence's keys.

#include "backends/attend_paged.h"

#include "common/tolerances.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using torchattn::Backend;
using torchattn::backends::PagedKeys;

constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 8, kBlock = 16;

struct Sequence {
  int64_t rows, keys;  // the last `rows` of `keys` tokens are the step's new rows
};

// Causal attention of the rows (positions keys - rows .. keys - 1) over k, v [L, Hkv, d],
// in float64: q [n, H, d] -> [n, H, d].
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        std::optional<int64_t> window) {
  const int64_t n = q.size(0), L = k.size(0), group = kHeads / kKvHeads;
  const auto qd = q.to(torch::kFloat64).transpose(0, 1);                                       // [H, n, d]
  const auto kd = k.to(torch::kFloat64).transpose(0, 1).repeat_interleave(group, 0);           // [H, L, d]
  const auto vd = v.to(torch::kFloat64).transpose(0, 1).repeat_interleave(group, 0);           // [H, L, d]
  auto scores = torch::matmul(qd, kd.transpose(1, 2)) / std::sqrt(static_cast<double>(kDim));  // [H, n, L]
  const auto pos = torch::arange(L - n, L, torch::kLong).unsqueeze(1);
  const auto key = torch::arange(L, torch::kLong).unsqueeze(0);
  auto hidden = key > pos;
  if (window) hidden = hidden.logical_or(key <= pos - *window);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vd).transpose(0, 1);
}

using Param = std::tuple<Backend, std::optional<int64_t>>;
class AttendPaged : public ::testing::TestWithParam<Param> {};

TEST_P(AttendPaged, EachSequenceSeesItsOwnKeysWhereverItsBlocksLie) {
  const auto [backend, window] = GetParam();
  torch::manual_seed(3);
  // A decoding row, a short chunk (the kernel's on the CPU), a chunk longer than
  // kernels::cpu::kPagedKernelRows (gathered), a fresh prompt.
  const std::vector<Sequence> seqs{{1, 37}, {9, 40}, {70, 100}, {5, 5}};
  int64_t blocks = 0;
  for (const auto& s : seqs) blocks += (s.keys + kBlock - 1) / kBlock;
  blocks += 3;  // blocks no sequence uses
  const auto order = torch::randperm(blocks, torch::kLong);
  torch::Tensor keys = torch::randn({blocks, kKvHeads, kDim, kBlock});
  torch::Tensor values = torch::randn({blocks, kKvHeads, kBlock, kDim});
  std::vector<int64_t> query_start{0}, key_start{0};
  std::vector<torch::Tensor> slots, qs, ks, vs;
  int64_t next_block = 0;
  for (const auto& s : seqs) {
    const int64_t nb = (s.keys + kBlock - 1) / kBlock;
    const auto table = order.narrow(0, next_block, nb);
    next_block += nb;
    const auto p = torch::arange(s.keys, torch::kLong);
    const auto slot = table.index({p.div(kBlock, "floor")}) * kBlock + p.remainder(kBlock);
    const auto k = torch::randn({s.keys, kKvHeads, kDim}), v = torch::randn({s.keys, kKvHeads, kDim});
    const c10::List<std::optional<at::Tensor>> where({slot.div(kBlock, "floor"), slot.remainder(kBlock)});
    torchattn::backends::paged_by_token(keys, true).index_put_(where, k);
    torchattn::backends::paged_by_token(values, false).index_put_(where, v);
    slots.push_back(slot);
    qs.push_back(torch::randn({s.rows, kHeads, kDim}));
    ks.push_back(k);
    vs.push_back(v);
    query_start.push_back(query_start.back() + s.rows);
    key_start.push_back(key_start.back() + s.keys);
  }
  const auto key_slots = torch::cat(slots);
  const PagedKeys pool{keys, values, key_slots, key_slots, &query_start, &key_start};
  torchattn::functional::AttentionOptions config;
  config.backend = backend;
  const auto out = torchattn::backends::attend_paged(torch::cat(qs), pool, window, config);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{query_start.back(), kHeads, kDim}));
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto got = out.narrow(0, query_start[s], seqs[s].rows);
    const auto want = reference(qs[s], ks[s], vs[s], window).to(torch::kFloat32);
    EXPECT_TRUE(tol::close(got, want, tol::for_dtype(torch::kFloat32)))
        << "sequence " << s << ": largest difference " << (got - want).abs().max().item<float>();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttendPaged,
                         ::testing::Combine(::testing::Values(Backend::Auto, Backend::SDPA, Backend::Reference),
                                            ::testing::Values(std::nullopt, std::optional<int64_t>(9))),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Backend backend = std::get<0>(info.param);
                           const std::optional<int64_t> window = std::get<1>(info.param);
                           return std::string(torchattn::to_string(backend)) +
                                  (window ? "Window" + std::to_string(*window) : "Causal");
                         });

}  // namespace
