// The CUDA flash-decoding kernel of static-shape steps (kernels/cuda/): against the
// float64 math of the same inputs, with the hidden keys of the library's own
// description (backends::hidden_keys), over dtypes, grouped heads, masks (not causal,
// causal, sliding window, the notebooks' buffer, a buffer of any pattern), query
// rows, key counts across chunk edges, head dimensions, strided views, and rows
// that see no key. Built in a CUDA configuration only; skipped without a GPU (and
// failing under TORCHATTN_REQUIRE_CUDA=1).

#include "common/devices.h"
#include "common/tolerances.h"

#include "backends/mask_spec.h"
#include "kernels/cuda/static_decode_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace kcuda = torchattn::kernels::cuda;

enum class StaticMode { NotCausal, Causal, Window, Buffer, BufferWindow, AnyBuffer };

std::string static_mode_name(StaticMode m) {
  switch (m) {
    case StaticMode::NotCausal:
      return "not_causal";
    case StaticMode::Causal:
      return "causal";
    case StaticMode::Window:
      return "window";
    case StaticMode::Buffer:
      return "buffer";
    case StaticMode::BufferWindow:
      return "buffer_window";
    case StaticMode::AnyBuffer:
      return "any_buffer";
  }
  return "?";
}

struct StaticCase {
  int64_t B, H, Hkv, Tq, Tk, D, Dv, p0;
};

// softmax(q k^T * scale, hidden at -inf) v in float64, rows with no visible key zero.
// hide: bool, broadcastable to [B, H, Tq, Tk], true = hidden.
torch::Tensor static_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& hide, double scale) {
  const int64_t G = q.size(1) / k.size(1);
  auto kk = k.to(torch::kFloat64).repeat_interleave(G, 1), vv = v.to(torch::kFloat64).repeat_interleave(G, 1);
  auto s = torch::matmul(q.to(torch::kFloat64), kk.transpose(-2, -1)) * scale;
  s = s.masked_fill(hide, -INFINITY);
  const auto dead = s.isneginf().all(-1, true);
  auto p = torch::softmax(s.masked_fill(dead, 0), -1);
  return torch::matmul(p, vv).masked_fill(dead, 0);
}

using StaticParam = std::tuple<torch::Dtype, StaticMode>;

class StaticDecodeKernel : public ::testing::TestWithParam<StaticParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(torch::Device(torch::kCUDA, 0)); }
};

TEST_P(StaticDecodeKernel, EqualsTheMathOfItsMask) {
  const auto [dtype, mode] = GetParam();
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t window = 37;
  // Key counts across the kernel's chunks of 128, one key, head dims not multiples of
  // 32, grouped heads, up to the most rows, positions at the start, middle and end.
  const std::vector<StaticCase> cases = {
      {1, 4, 4, 1, 1, 64, 64, 0},     {2, 4, 4, 1, 127, 64, 64, 50},    {1, 8, 2, 1, 128, 64, 64, 127},
      {2, 6, 3, 3, 129, 40, 40, 90},  {1, 4, 1, 5, 300, 128, 128, 200}, {1, 2, 2, 16, 1000, 256, 256, 984},
      {3, 9, 3, 1, 513, 64, 32, 512}, {1, 4, 4, 7, 260, 80, 96, 0},     {2, 2, 1, 2, 2048, 64, 64, 1500},
  };
  torch::manual_seed(7);
  for (const StaticCase& c : cases) {
    const std::string where = "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + "/" + std::to_string(c.Hkv) +
                              " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) +
                              " d=" + std::to_string(c.D) + "/" + std::to_string(c.Dv) + " p0=" + std::to_string(c.p0);
    // q as the modules make it: a transposed view of [B, Tq, H, d].
    auto q = torch::randn({c.B, c.Tq, c.H, c.D}).to(cuda, dtype).transpose(1, 2);
    // k and v: the first Tk slots of a longer cache (a strided view).
    auto k = torch::randn({c.B, c.Hkv, c.Tk + 5, c.D}).to(cuda, dtype).narrow(2, 0, c.Tk);
    auto v = torch::randn({c.B, c.Hkv, c.Tk + 5, c.Dv}).to(cuda, dtype).narrow(2, 0, c.Tk);

    torchattn::backends::MaskSpec spec;
    spec.positions = torch::full({1}, c.p0, torch::TensorOptions().dtype(torch::kLong).device(cuda));
    spec.causal = mode != StaticMode::NotCausal;
    if (mode == StaticMode::Window || mode == StaticMode::BufferWindow) {
      spec.window = window;
    }
    torch::Tensor buffer;
    if (mode == StaticMode::Buffer || mode == StaticMode::BufferWindow) {
      const int64_t C = c.Tk + 3;
      buffer = torch::triu(torch::ones({C, C}), 1).to(cuda, dtype);
    } else if (mode == StaticMode::AnyBuffer) {
      // Any pattern, rows entirely hidden among them, and fewer rows than the last
      // queries' positions: those see no key.
      const int64_t rows = c.p0 + (c.Tq + 1) / 2;
      buffer = (torch::rand({rows, c.Tk}) < 0.7).to(dtype).to(cuda);
      if (rows > c.p0) {
        buffer[c.p0].fill_(1);
      }
    }
    if (buffer.defined()) {
      spec.buffer = &buffer;
    }
    torch::Tensor hide;
    if (mode == StaticMode::AnyBuffer) {
      // hidden_keys' index_select needs every row; past the end, hidden.
      const auto rows_idx = torch::arange(c.p0, c.p0 + c.Tq, torch::TensorOptions().dtype(torch::kLong));
      hide = torch::ones({c.Tq, c.Tk}, torch::kBool);
      for (int64_t i = 0; i < c.Tq; ++i) {
        if (rows_idx[i].item<int64_t>() < buffer.size(0)) {
          hide[i] = buffer[rows_idx[i].item<int64_t>()].cpu().ne(0);
        }
      }
      hide = hide.to(cuda);
    } else {
      hide = torchattn::backends::hidden_keys(spec, c.Tq, c.Tk, cuda);
    }

    kcuda::StaticDecodeMask mask;
    mask.positions = spec.positions;
    mask.causal = spec.causal;
    mask.window = spec.window.value_or(0);
    mask.buffer = buffer;
    ASSERT_TRUE(kcuda::static_decode_applies(q, k, v, mask)) << where;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D)) * 1.25;
    torch::NoGradGuard no_grad;
    const auto out = kcuda::static_decode_attention(q, k, v, mask, scale);
    ASSERT_EQ(out.scalar_type(), dtype);
    ASSERT_TRUE(out.is_contiguous());
    const auto expected = static_math(q, k, v, hide, scale);
    EXPECT_TRUE(tol::close(out, expected, tol::for_dtype(dtype))) << static_mode_name(mode) << " " << where;
  }
}

std::string static_param_name(const ::testing::TestParamInfo<StaticParam>& info) {
  const auto dtype = std::get<0>(info.param);
  const std::string d = dtype == torch::kFloat32 ? "f32" : dtype == torch::kFloat16 ? "f16" : "bf16";
  return d + "_" + static_mode_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Cuda, StaticDecodeKernel,
                         ::testing::Combine(::testing::Values(torch::kFloat32, torch::kFloat16, torch::kBFloat16),
                                            ::testing::Values(StaticMode::NotCausal, StaticMode::Causal,
                                                              StaticMode::Window, StaticMode::Buffer,
                                                              StaticMode::BufferWindow, StaticMode::AnyBuffer)),
                         static_param_name);

class StaticDecodeKernelApplies : public ::testing::Test {
 protected:
  void SetUp() override { devices::skip_unless_present(torch::Device(torch::kCUDA, 0)); }
};

// What it does not take goes elsewhere (attend falls back), never into the kernel.
TEST_F(StaticDecodeKernelApplies, RefusesWhatItCannotRun) {
  const torch::Device cuda(torch::kCUDA, 0);
  const auto on_cuda = torch::TensorOptions().device(cuda);
  auto q = torch::zeros({1, 4, 1, 64}, on_cuda), k = torch::zeros({1, 2, 10, 64}, on_cuda);
  kcuda::StaticDecodeMask mask;
  mask.positions = torch::zeros({1}, on_cuda.dtype(torch::kLong));
  mask.causal = true;
  EXPECT_TRUE(kcuda::static_decode_applies(q, k, k, mask));
  EXPECT_FALSE(kcuda::static_decode_applies(q.cpu(), k.cpu(), k.cpu(), mask));                    // not CUDA
  EXPECT_FALSE(kcuda::static_decode_applies(q.to(torch::kFloat64), k, k, mask));                  // dtype
  EXPECT_FALSE(kcuda::static_decode_applies(torch::zeros({1, 4, 17, 64}, on_cuda), k, k, mask));  // too many rows
  EXPECT_FALSE(kcuda::static_decode_applies(torch::zeros({1, 3, 1, 64}, on_cuda), k, k, mask));   // 3 % 2 heads
  EXPECT_FALSE(kcuda::static_decode_applies(torch::zeros({1, 4, 1, 512}, on_cuda),
                                            torch::zeros({1, 2, 10, 512}, on_cuda),
                                            torch::zeros({1, 2, 10, 512}, on_cuda), mask));  // head dim
  {
    auto qg = q.clone().requires_grad_(true);
    EXPECT_FALSE(kcuda::static_decode_applies(qg, k, k, mask));  // a gradient to compute
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(kcuda::static_decode_applies(qg, k, k, mask));
  }
  kcuda::StaticDecodeMask host_position = mask;
  host_position.positions = torch::zeros({1}, torch::kLong);
  EXPECT_FALSE(kcuda::static_decode_applies(q, k, k, host_position));
  kcuda::StaticDecodeMask short_buffer = mask;
  short_buffer.buffer = torch::zeros({10, 9}, on_cuda);  // fewer columns than keys
  EXPECT_FALSE(kcuda::static_decode_applies(q, k, k, short_buffer));
  kcuda::StaticDecodeMask not_causal = mask;
  not_causal.causal = false;
  not_causal.buffer = torch::zeros({10, 10}, on_cuda);
  EXPECT_FALSE(kcuda::static_decode_applies(q, k, k, not_causal));
}

}  // namespace
