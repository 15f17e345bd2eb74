// The row softmax the CPU attention kernels share (detail/kernels/cpu/row_softmax.h), on every
// instruction set this CPU has: a row's weighted values, its keys cut into blocks
// anywhere (the online softmax's running max and sum), equal ATen's softmax in float64
// within float32 rounding, with hidden keys, a sink, blocks that hide every key and
// rows of every length around the vector widths; the whole row as one block gives the
// two-pass numbers; a row that sees nothing gives zeros and a NaN score shows as NaN.

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace K = torchattn::kernels::cpu;
using K::Isa;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TORCHATTN_SIMD_KERNELS_BEGIN

// out[dv] = softmax(s) v of one row, its keys in blocks [cuts[i], cuts[i + 1]), as a
// kernel uses RowSoftmax: each block's numerators, the output so far rescaled, the
// block's values added; a sink first where given. numerators: the last block's.
struct WeightedRow {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(float* s, const std::vector<int64_t>& cuts, const float* v, int64_t dv, const float* sink,
                  float* out) {
    K::RowSoftmax<S> row;
    if (sink != nullptr) row.add_sink(*sink);
    for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t lo = cuts[i], hi = cuts[i + 1];
      const float rescale = row.add(s + lo, hi - lo);
      for (int64_t c = 0; c < dv; ++c) out[c] *= rescale;
      for (int64_t j = lo; j < hi; ++j) {
        if (s[j] == 0.0f) continue;  // a hidden key's value is not read
        for (int64_t c = 0; c < dv; ++c) out[c] += s[j] * v[j * dv + c];
      }
    }
    const float inv = row.inverse();
    for (int64_t c = 0; c < dv; ++c) out[c] *= inv;
  }
};

TORCHATTN_SIMD_KERNELS_END

// softmax([sink,] s) v in float64; a sink has no value.
torch::Tensor expected_row(const torch::Tensor& s, const torch::Tensor& v, const float* sink) {
  torch::Tensor logits = s.to(torch::kFloat64);
  torch::Tensor values = v.to(torch::kFloat64);
  if (sink != nullptr) {
    logits = torch::cat({torch::full({1}, static_cast<double>(*sink), logits.options()), logits});
    values = torch::cat({torch::zeros({1, v.size(1)}, values.options()), values});
  }
  return torch::matmul(torch::softmax(logits, 0), values);
}

TEST(RowSoftmax, BlocksCutAnywhereGiveTheSoftmaxOnEveryIsa) {
  int checked = 0;
  for (const Isa isa : K::supported_isas()) {
    for (const int64_t n : {1, 7, 8, 15, 16, 17, 33, 100, 301}) {
      for (const std::string cut : {"whole", "every 5", "every 16", "first hidden"}) {
        for (const bool with_sink : {false, true}) {
          SCOPED_TRACE("isa " + std::string(K::isa_name(isa)) + " n " + std::to_string(n) + " cut " + cut +
                       (with_sink ? " sink" : ""));
          torch::manual_seed(checked);
          const int64_t dv = 3;
          torch::Tensor s = torch::randn({n}) * 4;
          s.masked_fill_(torch::rand({n}) < 0.2, kNegInf);
          s[n - 1] = 1.5f;  // one key seen at least
          if (cut == "first hidden" && n > 2) s.narrow(0, 0, n / 2).fill_(kNegInf);
          const torch::Tensor v = torch::randn({n, dv});
          std::vector<int64_t> cuts{0};
          const int64_t step = std::max<int64_t>(1, cut == "every 5"        ? 5
                                                    : cut == "every 16"     ? 16
                                                    : cut == "first hidden" ? n / 2
                                                                            : n);
          for (int64_t c = step; c < n; c += step) cuts.push_back(c);
          cuts.push_back(n);
          const float sink = 0.75f;
          const torch::Tensor expected = expected_row(s, v, with_sink ? &sink : nullptr);
          torch::Tensor scratch = s.clone(), out = torch::empty({dv});
          K::simd::run_on<WeightedRow>(isa, scratch.data_ptr<float>(), cuts, v.const_data_ptr<float>(), dv,
                                       with_sink ? &sink : nullptr, out.data_ptr<float>());
          EXPECT_LT((out.to(torch::kFloat64) - expected).abs().max().item<double>(), 2e-6);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(K::supported_isas().size()) * 9 * 4 * 2);
}

TORCHATTN_SIMD_KERNELS_BEGIN

struct Numerators {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static float run(float* s, int64_t n) {
    K::RowSoftmax<S> row;
    EXPECT_EQ(row.add(s, n), 0.0f);  // nothing accumulated before the first block
    return row.inverse();
  }
};

TORCHATTN_SIMD_KERNELS_END

TEST(RowSoftmax, OneBlockGivesTheTwoPassNumbers) {
  // Scalar: exp(s - max) key by key and their sum in key order, to the bit.
  torch::manual_seed(3);
  const int64_t n = 37;
  torch::Tensor s = torch::randn({n}) * 3;
  s[5] = kNegInf;
  const torch::Tensor got = s.clone();
  const float inv = K::simd::run_on<Numerators>(Isa::Scalar, got.data_ptr<float>(), n);
  const float* x = s.const_data_ptr<float>();
  float top = kNegInf, sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, x[j]);
  for (int64_t j = 0; j < n; ++j) {
    const float p = x[j] == kNegInf ? 0.0f : std::exp(x[j] - top);
    EXPECT_EQ(got[j].item<float>(), p) << "key " << j;
    sum += p;
  }
  EXPECT_EQ(inv, 1.0f / sum);
}

TEST(RowSoftmax, ARowThatSeesNothingGivesZerosAndANaNScoreShows) {
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE("isa " + std::string(K::isa_name(isa)));
    const int64_t n = 21, dv = 2;
    torch::Tensor s = torch::full({n}, kNegInf);
    // The values of hidden keys are never read: NaN there changes nothing.
    const torch::Tensor v = torch::full({n, dv}, std::numeric_limits<float>::quiet_NaN());
    torch::Tensor out = torch::empty({dv});
    const std::vector<int64_t> cuts{0, 9, n};
    K::simd::run_on<WeightedRow>(isa, s.data_ptr<float>(), cuts, v.const_data_ptr<float>(), dv, nullptr,
                                 out.data_ptr<float>());
    EXPECT_TRUE(torch::equal(out, torch::zeros({dv})));
    EXPECT_TRUE(torch::equal(s, torch::zeros({n})));

    torch::Tensor with_nan = torch::randn({n});
    with_nan[4] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(K::simd::run_on<Numerators>(isa, with_nan.data_ptr<float>(), n)));
  }
}

}  // namespace
