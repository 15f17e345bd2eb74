// torchattn::checkpoint (layers/activation_checkpoint.cpp): gradients of the inputs and
// of every parameter equal the run without it (bit for bit on the CPU), dropout masks
// included, and the random stream goes on after the backward as without it; params
// get gradients when no input needs one; several inputs and outputs, an unused
// output, autocast, grad mode off, and the errors.

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

// A block with dropout inside: MultiHeadAttention (dropout on its weights) and a Linear.
struct CheckpointBlock {
  torchattn::MultiHeadAttention mha{nullptr};
  torch::nn::Linear lin{nullptr};

  CheckpointBlock(const torch::Device& device, torch::Dtype dtype) {
    torch::manual_seed(3);
    mha = torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(16, 16, 32, 4).dropout(0.25));
    lin = torch::nn::Linear(16, 16);
    mha->to(device, dtype);
    lin->to(device, dtype);
    mha->train();
  }
  torch::Tensor operator()(const torch::Tensor& x) { return torch::tanh(lin(mha(x))); }
  std::vector<torch::Tensor> params() {
    auto p = mha->parameters();
    for (const auto& t : lin->parameters()) p.push_back(t);
    return p;
  }
  void zero_grad() {
    for (auto p : params()) p.mutable_grad() = torch::Tensor();
  }
};

struct CheckpointRun {
  torch::Tensor y, dx, after;  // output, input gradient, a draw after the backward
  std::vector<torch::Tensor> dparams;
};

// One forward and backward of the block on x, plain or checkpointed, from seed 11.
CheckpointRun checkpoint_run(CheckpointBlock& block, const torch::Tensor& x0, bool checkpointed,
                             bool input_grad = true) {
  block.zero_grad();
  auto x = x0.clone();
  if (input_grad) x.requires_grad_(true);
  torch::manual_seed(11);
  const auto y = checkpointed
                     ? torchattn::checkpoint([&block](const torch::Tensor& t) { return block(t); }, x, block.params())
                     : block(x);
  (y * y).sum().backward();
  CheckpointRun r;
  r.y = y.detach();
  if (input_grad) r.dx = x.grad();
  for (const auto& p : block.params()) r.dparams.push_back(p.grad().clone());
  r.after = torch::rand({8}, x0.options());
  return r;
}

void expect_same_run(const CheckpointRun& a, const CheckpointRun& b, const torch::Device& device, torch::Dtype dtype) {
  // The CPU runs the same kernels in the same order; a GPU's may sum in another order.
  auto same = [&](const torch::Tensor& u, const torch::Tensor& v) {
    return device.is_cpu() ? ::testing::AssertionResult(torch::equal(u, v)) : tol::close(u, v, tol::for_dtype(dtype));
  };
  EXPECT_TRUE(same(a.y, b.y)) << "output";
  if (a.dx.defined() || b.dx.defined()) {
    EXPECT_TRUE(same(a.dx, b.dx)) << "input gradient";
  }
  ASSERT_EQ(a.dparams.size(), b.dparams.size());
  for (size_t i = 0; i < a.dparams.size(); ++i) EXPECT_TRUE(same(a.dparams[i], b.dparams[i])) << "parameter " << i;
  EXPECT_TRUE(torch::equal(a.after, b.after)) << "the random stream after the backward";
}

class ActivationCheckpoint : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

TEST_P(ActivationCheckpoint, GradientsAndDropoutEqualThePlainRun) {
  const torch::Device device = GetParam();
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    CheckpointBlock block(device, dtype);
    torch::manual_seed(5);
    const auto x0 = torch::randn({2, 9, 16}).to(device, dtype);
    const CheckpointRun plain = checkpoint_run(block, x0, false), ckpt = checkpoint_run(block, x0, true);
    expect_same_run(plain, ckpt, device, dtype);
    // Dropout was on: a run from another seed differs.
    torch::manual_seed(12);
    EXPECT_FALSE(torch::equal(block(x0).detach(), plain.y));
  }
}

// A causal layer without dropout over more than a decoding step's rows: without a
// gradient its forward would take the CPU's own causal path (flex), with one ATen's; the
// checkpointed forward takes what its recomputation will, so the bits still agree.
TEST_P(ActivationCheckpoint, TheForwardTakesTheKernelsOfItsRecomputation) {
  const torch::Device device = GetParam();
  torch::manual_seed(4);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(64, 64, 64, 2));
  mha->to(device);
  mha->eval();
  const auto x0 = torch::randn({2, 40, 64}).to(device);
  auto run = [&](bool checkpointed) {
    mha->zero_grad();
    const auto x = x0.clone().requires_grad_(true);
    auto params = mha->parameters();
    const auto y = checkpointed ? torchattn::checkpoint([&](const torch::Tensor& t) { return mha(t); }, x, params)
                                : mha(x);
    (y * y).sum().backward();
    std::vector<torch::Tensor> out{y.detach(), x.grad()};
    for (const auto& p : params) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = run(false), ckpt = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    if (device.is_cpu()) {
      EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << "tensor " << i;
    } else {
      EXPECT_TRUE(tol::close(plain[i], ckpt[i], tol::for_dtype(torch::kFloat32))) << "tensor " << i;
    }
  }
}

// The reentrant form's pitfall: with no input requiring a gradient its node is never
// recorded and the parameters get none. Here they get the plain run's.
TEST_P(ActivationCheckpoint, ParametersGetGradientsWithoutAnInputGradient) {
  const torch::Device device = GetParam();
  CheckpointBlock block(device, torch::kFloat64);
  torch::manual_seed(6);
  const auto x0 = torch::randn({1, 5, 16}).to(device, torch::kFloat64);
  const CheckpointRun plain = checkpoint_run(block, x0, false, false), ckpt = checkpoint_run(block, x0, true, false);
  for (const auto& g : ckpt.dparams) {
    ASSERT_TRUE(g.defined());
  }
  expect_same_run(plain, ckpt, device, torch::kFloat64);
}

// Several inputs and outputs: an input without a gradient, an output the loss does not
// use, and an output that is an input's view (returned as a copy).
TEST_P(ActivationCheckpoint, SeveralInputsAndOutputs) {
  const torch::Device device = GetParam();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  torch::manual_seed(7);
  const auto a0 = torch::randn({3, 4}, opts), b = torch::randn({3, 4}, opts);
  const auto w = torch::randn({4, 4}, opts).requires_grad_(true);
  auto fn = [&w](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::matmul(in[0] * in[1], w).sin(), in[0] + 1, in[0].view({12})};
  };
  auto grads = [&](bool checkpointed) {
    w.mutable_grad() = torch::Tensor();
    auto a = a0.clone().requires_grad_(true);
    const auto out = checkpointed ? torchattn::checkpoint(fn, {a, b}, {w}) : fn({a, b});
    EXPECT_EQ(out.size(), 3u);
    (out[0].sum() + 2 * out[2].sum()).backward();
    return std::vector<torch::Tensor>{a.grad(), w.grad()};
  };
  const auto plain = grads(false), ckpt = grads(true);
  EXPECT_TRUE(torch::equal(plain[0], ckpt[0]));
  EXPECT_TRUE(torch::equal(plain[1], ckpt[1]));
}

// Autocast in the forward is autocast in the recomputation, though the backward runs
// outside it.
TEST_P(ActivationCheckpoint, RecomputesUnderTheForwardsAutocast) {
  const torch::Device device = GetParam();
  const auto type = device.type();
  CheckpointBlock block(device, torch::kFloat32);
  block.mha->eval();  // the outputs are compared across the two runs alone
  torch::manual_seed(8);
  const auto x0 = torch::randn({2, 6, 16}).to(device);
  auto grads = [&](bool checkpointed) {
    block.zero_grad();
    auto x = x0.clone().requires_grad_(true);
    const bool was = at::autocast::is_autocast_enabled(type);
    const auto was_dtype = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_enabled(type, true);
    at::autocast::set_autocast_dtype(type, torch::kBFloat16);
    torch::Tensor y;
    try {
      y = checkpointed ? torchattn::checkpoint([&block](const torch::Tensor& t) { return block(t); }, x, block.params())
                       : block(x);
    } catch (...) {
      at::autocast::set_autocast_enabled(type, was);
      at::autocast::set_autocast_dtype(type, was_dtype);
      throw;
    }
    at::autocast::set_autocast_enabled(type, was);
    at::autocast::set_autocast_dtype(type, was_dtype);
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.to(torch::kFloat32).pow(2).sum().backward();
    return x.grad();
  };
  const auto plain = grads(false), ckpt = grads(true);
  EXPECT_TRUE(device.is_cpu() ? torch::equal(plain, ckpt) : tol::close(plain, ckpt, tol::for_dtype(torch::kBFloat16)));
}

TEST_P(ActivationCheckpoint, GradModeOffRunsTheFunction) {
  const torch::Device device = GetParam();
  CheckpointBlock block(device, torch::kFloat32);
  block.mha->eval();
  const auto x = torch::randn({1, 4, 16}).to(device).requires_grad_(true);
  torch::NoGradGuard no_grad;
  const auto y = torchattn::checkpoint([&block](const torch::Tensor& t) { return block(t); }, x, block.params());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, block(x)));
}

INSTANTIATE_TEST_SUITE_P(Devices, ActivationCheckpoint, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

TEST(ActivationCheckpointErrors, NameWhatCame) {
  const auto x = torch::randn({2, 2}).requires_grad_(true);
  expect_error([] { torchattn::checkpoint(torchattn::CheckpointFunction(), {torch::zeros({1})}, {}); },
               "checkpoint: expected a function, got an empty one");
  expect_error(
      [&] {
        torchattn::checkpoint([](const std::vector<torch::Tensor>&) { return std::vector<torch::Tensor>{}; }, {x}, {});
      },
      "checkpoint: expected fn to return at least one tensor, got none");
  expect_error(
      [&] {
        torchattn::checkpoint(
            [](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{in[0], {}}; }, {x}, {});
      },
      "checkpoint: expected fn's outputs defined, got an undefined tensor at 1");
  expect_error([&] { torchattn::checkpoint([](const torch::Tensor& t) { return t * 2; }, torch::Tensor(), {}); },
               "checkpoint: expected inputs defined, got an undefined tensor at 0");
  expect_error([&] { torchattn::checkpoint([](const torch::Tensor& t) { return t * 2; }, x, {torch::Tensor()}); },
               "checkpoint: expected params defined, got an undefined tensor at 0");
}

// fn runs again in the backward: one that computes something else then is named, with
// what it gave each time, not left to autograd's words about shapes.
TEST(ActivationCheckpointErrors, AFunctionThatChangesWhenRecomputed) {
  const auto x = torch::randn({2, 3}).requires_grad_(true);
  for (const bool shape : {true, false}) {
    int calls = 0;
    auto out = torchattn::checkpoint(
        [&calls, shape](const std::vector<torch::Tensor>& in) {
          const bool again = calls++ > 0;
          if (!again) return std::vector<torch::Tensor>{in[0] * 2};
          return std::vector<torch::Tensor>{shape ? in[0].sum(0) * 2 : (in[0] * 2).to(torch::kDouble)};
        },
        {x}, {});
    expect_error([&] { out[0].sum().backward(); },
                 shape ? "checkpoint: fn's output 0 was Float [2, 3] on cpu in the forward and Float [3] on cpu when "
                         "recomputed: fn runs again in the backward and must compute the same thing"
                       : "checkpoint: fn's output 0 was Float [2, 3] on cpu in the forward and Double [2, 3] on cpu "
                         "when recomputed");
  }
  int calls = 0;
  auto out = torchattn::checkpoint(
      [&calls](const std::vector<torch::Tensor>& in) {
        if (calls++ == 0) return std::vector<torch::Tensor>{in[0] * 2};
        return std::vector<torch::Tensor>{in[0] * 2, in[0] * 3};
      },
      {x}, {});
  expect_error([&] { out[0].sum().backward(); },
               "checkpoint: fn returned 1 tensors in the forward and 2 when recomputed: fn runs again in the backward");
}

}  // namespace
