// The CPU kernels of decoding: decode_attention against ATen's math over many shapes,
// grouped heads, masks of every broadcast, strided views and rows with no key to see,
// on one thread and across threads; and parallel_for_unless_stalled, which covers
// every index exactly once, parallel or not, and runs on the calling thread alone
// after joins that waited for a worker that was not scheduled.

#include "common/tolerances.h"

#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace K = torchattn::kernels::cpu;

// softmax(q k^T * scale + mask) v in float64 with ATen's ops, rows with no visible key
// set to zero; key heads repeated for grouped queries.
torch::Tensor decode_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& mask, double scale) {
  const int64_t G = q.size(1) / k.size(1);
  auto kk = k.to(torch::kFloat64).repeat_interleave(G, 1), vv = v.to(torch::kFloat64).repeat_interleave(G, 1);
  auto s = torch::matmul(q.to(torch::kFloat64), kk.transpose(-2, -1)) * scale;
  if (mask.defined()) {
    s = mask.scalar_type() == torch::kBool ? s.masked_fill(mask.logical_not(), -INFINITY)
                                           : s + mask.to(torch::kFloat64);
  }
  const auto dead = s.isneginf().all(-1, true);
  auto p = torch::softmax(s.masked_fill(dead, 0), -1);
  return torch::matmul(p, vv).masked_fill(dead, 0);
}

struct DecodeCase {
  int64_t B, H, Hkv, Tq, Tk, d, dv;
  std::string mask;  // "", "bool_key", "bool_full", "float_key", "bool_dead"
  bool strided;
};

std::string describe_decode(const DecodeCase& c) {
  // A stream, not string operator+ chains: GCC 12 at -O3 warns inside libstdc++'s
  // operator+(const char*, std::string&&) where nothing overflows (its bug 105651).
  std::ostringstream out;
  out << "B" << c.B << " H" << c.H << "/" << c.Hkv << " Tq" << c.Tq << " Tk" << c.Tk << " d" << c.d << "/" << c.dv
      << " mask=" << c.mask << (c.strided ? " strided" : "");
  return out.str();
}

TEST(DecodeAttention, MatchesTheMathOverShapesMasksAndLayouts) {
  std::vector<DecodeCase> cases;
  for (const int64_t Tq : {int64_t{1}, int64_t{3}, int64_t{16}}) {
    for (const auto& [H, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 4}, {9, 3}, {8, 1}}) {
      for (const int64_t Tk : {int64_t{1}, int64_t{7}, int64_t{130}, int64_t{2100}}) {
        for (const std::string mask : {"", "bool_key", "bool_full", "float_key", "bool_dead"}) {
          cases.push_back({2, H, Hkv, Tq, Tk, 64, 64, mask, (Tk + H) % 2 == 0});
        }
      }
    }
  }
  cases.push_back({1, 2, 2, 1, 9, 5, 3, "", false});  // odd head sizes, dv != d
  cases.push_back({3, 2, 1, 2, 33, 40, 24, "float_key", true});
  int checked = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(describe_decode(c));
    torch::manual_seed(checked);
    torch::Tensor q = torch::randn({c.B, c.H, c.Tq, c.d});
    torch::Tensor k, v;
    if (c.strided) {
      // Views into larger storages, as a static cache's keys are: strided heads and tokens.
      k = torch::randn({c.B, c.Hkv, c.Tk + 5, c.d}).narrow(2, 2, c.Tk);
      v = torch::randn({c.B, c.Tk, c.Hkv, c.dv}).transpose(1, 2);
      q = torch::randn({c.B, c.Tq, c.H, c.d}).transpose(1, 2);
    } else {
      k = torch::randn({c.B, c.Hkv, c.Tk, c.d});
      v = torch::randn({c.B, c.Hkv, c.Tk, c.dv});
    }
    torch::Tensor mask;
    if (c.mask == "bool_key") mask = (torch::rand({c.B, 1, 1, c.Tk}) > 0.3).index_put_({"...", 0}, true);
    if (c.mask == "bool_full") mask = (torch::rand({c.B, c.H, c.Tq, c.Tk}) > 0.5).index_put_({"...", -1}, true);
    if (c.mask == "float_key") mask = torch::randn({1, 1, 1, c.Tk});
    if (c.mask == "bool_dead") {
      mask = torch::rand({c.B, 1, c.Tq, c.Tk}) > 0.5;
      mask.index_put_({0, 0, 0}, false);  // the first row of the first sequence sees no key
    }
    ASSERT_TRUE(K::decode_attention_applies(q, k, v, mask));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto out = K::decode_attention(q, k, v, mask, scale);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{c.B, c.H, c.Tq, c.dv}));
    const auto expected = decode_math(q, k, v, mask, scale);
    EXPECT_LT((out.to(torch::kFloat64) - expected).abs().max().item<double>(), 2e-5);
    if (c.mask == "bool_dead") {
      EXPECT_EQ(out[0][0][0].abs().max().item<float>(), 0.0f);
    }
    // ATen's fused kernel where it takes the case: the same numbers within float32 rounding.
    if (c.Hkv == c.H && c.mask != "bool_dead") {
      const auto aten = at::scaled_dot_product_attention(q, k, v,
                                                         mask.defined() ? std::optional<at::Tensor>(mask)
                                                                        : std::nullopt);
      EXPECT_LT((out - aten).abs().max().item<float>(), 2e-5f);
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

// A static cache's row: its keys a window in the middle of a capacity whose other
// slots hold anything (here NaN). Bool and additive (-inf) masks hide them; the row is
// the same bits as over the same values with zeros there, and finite.
TEST(DecodeAttention, KeysOutsideTheVisibleRangeAreNotRead) {
  torch::manual_seed(21);
  const int64_t Tk = 300, lo = 40, hi = 170;
  const auto q = torch::randn({2, 4, 1, 64});
  auto k = torch::zeros({2, 2, Tk, 64}), v = torch::zeros({2, 2, Tk, 64});
  k.narrow(2, lo, hi - lo).normal_();
  v.narrow(2, lo, hi - lo).normal_();
  auto keep = torch::zeros({2, 1, 1, Tk}, torch::kBool);
  keep.narrow(3, lo, hi - lo).fill_(true);
  keep.index_put_({0, 0, 0, lo + 5}, false);  // a hidden key between visible ones
  const auto additive = torch::zeros({2, 1, 1, Tk}).masked_fill(keep.logical_not(), -INFINITY);
  for (const auto& mask : {keep, additive}) {
    SCOPED_TRACE(mask.scalar_type() == torch::kBool ? "bool mask" : "additive mask");
    const auto clean = K::decode_attention(q, k, v, mask, 0.125);
    auto k_nan = k.clone(), v_nan = v.clone();
    for (auto* t : {&k_nan, &v_nan}) {
      t->narrow(2, 0, lo).fill_(NAN);
      t->narrow(2, hi, Tk - hi).fill_(NAN);
    }
    const auto out = K::decode_attention(q, k_nan, v_nan, mask, 0.125);
    EXPECT_TRUE(torch::equal(out, clean));
    EXPECT_LT((clean.to(torch::kFloat64) - decode_math(q, k, v, mask, 0.125)).abs().max().item<double>(), 2e-5);
  }
}

// A key hidden by a large finite mask (finfo.min, -1e9, as Hugging Face masks are) weighs
// exactly 0 and its value is not read: NaN there leaves the row as over zeros; so does a
// key more than 87 below the row's max.
TEST(DecodeAttention, KeysFarBelowTheMaxWeighNothing) {
  torch::manual_seed(22);
  const int64_t Tk = 40;
  const auto q = torch::randn({1, 2, 1, 16}), k = torch::randn({1, 2, Tk, 16});
  auto v = torch::randn({1, 2, Tk, 16});
  auto mask = torch::zeros({1, 1, 1, Tk});
  mask.narrow(3, 10, 5).fill_(-1e9);
  mask.narrow(3, 20, 3).fill_(std::numeric_limits<float>::lowest());
  mask.index_put_({0, 0, 0, 30}, -120.0f);  // 120 below the other scores (|score| < 10 here)
  const auto clean = K::decode_attention(q, k, v, mask, 0.25);
  auto v_nan = v.clone();
  for (const int64_t j : {10, 12, 14, 20, 22, 30}) v_nan.narrow(2, j, 1).fill_(NAN);
  const auto out = K::decode_attention(q, k, v_nan, mask, 0.25);
  EXPECT_TRUE(torch::equal(out, clean));
  EXPECT_LT((clean.to(torch::kFloat64) - decode_math(q, k, v, mask, 0.25)).abs().max().item<double>(), 2e-5);
}

TEST(DecodeAttention, AppliesOnlyToWhatItComputes) {
  const auto q = torch::randn({1, 2, 1, 8}), k = torch::randn({1, 2, 5, 8}), v = torch::randn({1, 2, 5, 8});
  EXPECT_TRUE(K::decode_attention_applies(q, k, v, {}));
  EXPECT_FALSE(K::decode_attention_applies(q.to(torch::kFloat64), k, v, {}));        // float32 only
  EXPECT_FALSE(K::decode_attention_applies(torch::randn({1, 2, 17, 8}), k, v, {}));  // more rows: fused kernels
  EXPECT_FALSE(K::decode_attention_applies(torch::randn({1, 3, 1, 8}), k, v, {}));   // heads not a multiple
  EXPECT_FALSE(K::decode_attention_applies(q, k, v, torch::zeros({1, 1, 1, 4})));    // mask of another length
  EXPECT_FALSE(K::decode_attention_applies(q, k, v, torch::zeros({1, 1, 1, 5}, torch::kLong)));
  EXPECT_FALSE(K::decode_attention_applies(q.clone().requires_grad_(), k, v, {}));  // autograd: ATen
  EXPECT_FALSE(K::decode_attention_applies(q, k.transpose(-2, -1).contiguous().transpose(-2, -1), v, {}));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(K::decode_attention_applies(q.clone().requires_grad_(), k, v, {}));
}

// parallel_for_unless_stalled covers [0, n) once, in any split; and after joins that
// waited on a worker that was not scheduled (simulated: the worker's chunk sleeps),
// it runs on the calling thread alone, as one call f(0, n).
TEST(StallAware, CoversEveryIndexAndGoesSerialAfterStalls) {
  // The test needs two intra-op threads, whatever the machine has; restored at the end.
  struct Threads {
    int previous = at::get_num_threads();
    Threads() { at::set_num_threads(2); }
    ~Threads() { at::set_num_threads(previous); }
  } threads_for_this_test;
  std::vector<std::atomic<int>> seen(10000);
  K::parallel_for_unless_stalled(10000, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) seen[i]++;
  });
  for (const auto& s : seen) ASSERT_EQ(s.load(), 1);

  // Two regions whose worker "is not scheduled" for 20 ms while the caller's share takes no time.
  for (int region = 0; region < 4 && !K::stalled_recently(); ++region) {
    K::parallel_for_unless_stalled(64, 1, [&](int64_t, int64_t) {
      if (at::get_thread_num() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
  }
  EXPECT_TRUE(K::stalled_recently());
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> calls;
  std::vector<int> threads;
  K::parallel_for_unless_stalled(64, 1, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    calls.emplace_back(b, e);
    threads.push_back(at::get_thread_num());
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], (std::pair<int64_t, int64_t>{0, 64}));
  EXPECT_EQ(threads[0], 0);
}

// parallel_for_work: little work is one call on the calling thread; more covers every
// index exactly once, in chunks of no more than about 2^18 multiply-adds.
TEST(StallAware, ParallelForWorkRunsSmallWorkInOneCall) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  K::parallel_for_work(64, 1000, [&](int64_t b, int64_t e) { calls.emplace_back(b, e); });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{64}));
  std::mutex m;
  std::vector<int> seen(5000, 0);
  int64_t largest = 0;
  K::parallel_for_work(5000, 4096, [&](int64_t b, int64_t e) {
    const std::lock_guard<std::mutex> lock(m);
    largest = std::max(largest, e - b);
    for (int64_t i = b; i < e; ++i) ++seen[i];
  });
  for (const int c : seen) ASSERT_EQ(c, 1);
  // at::parallel_for splits the range over the threads, each part at least the grain
  // (64 items of 4096), so one thread means one part.
  if (at::get_num_threads() > 1 && !K::stalled_recently()) {
    EXPECT_LT(largest, 5000);
  }
}

}  // namespace
