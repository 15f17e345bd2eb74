// torchattn::Linear (include/torchattn/linear.h): LibTorch's nn::Linear's names and draws
// and PyTorch's nn.Linear's numbers; built for loading it draws and allocates nothing;
// it owns its weight formats (freeze quantizes, bind keeps a checkpoint's tensors as
// they are, not copied) and chooses the kernel; linear_group runs frozen layers as one
// product with each layer's own bits.

#include "common/devices.h"
#include "common/expect_error.h"

#include "kernels/cpu/quantized_linear.h"
#include "layers/placed_together.h"

#include <torchattn/linear.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

using torchattn::Int8Inputs;
using torchattn::Linear;
using torchattn::LinearOptions;
using torchattn::WeightFormat;
namespace kc = torchattn::kernels::cpu;

at::Tensor generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

TEST(LinearLayer, DrawsAsNnLinearAndComputesAsPyTorchsLinear) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    torch::manual_seed(81);
    torch::nn::Linear theirs(torch::nn::LinearOptions(13, 7).bias(bias));
    const auto after_theirs = generator_state();
    torch::manual_seed(81);
    Linear ours(LinearOptions(13, 7).bias(bias));
    EXPECT_TRUE(torch::equal(generator_state(), after_theirs)) << "a different number of draws";
    EXPECT_TRUE(torch::equal(ours->weight, theirs->weight));
    EXPECT_EQ(ours->bias.defined(), bias);
    if (bias) {
      EXPECT_TRUE(torch::equal(ours->bias, theirs->bias));
    }
    // The same names and order in the state dict.
    std::vector<std::string> names, their_names;
    for (const auto& p : ours->named_parameters()) names.push_back(p.key());
    for (const auto& p : theirs->named_parameters()) their_names.push_back(p.key());
    EXPECT_EQ(names, their_names);
    // at::linear's numbers, with and without a gradient, 2-d and 3-d.
    for (const auto& x : {torch::randn({5, 13}), torch::randn({2, 3, 13})}) {
      const auto want = at::linear(x, theirs->weight, bias ? std::optional<at::Tensor>(theirs->bias) : std::nullopt);
      EXPECT_TRUE(torch::equal(ours(x), want));
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(ours(x), want));
      EXPECT_TRUE(torch::allclose(ours->forward_fast(x), want, 1e-5, 1e-6));
    }
  }
  std::ostringstream printed;
  printed << *Linear(LinearOptions(3, 2).bias(false));
  EXPECT_EQ(printed.str(), "torchattn::Linear(in_features=3, out_features=2, bias=false)");
}

TEST(LinearLayer, BuiltForLoadingDrawsAndHoldsNothingAndRefusesToRun) {
  torch::manual_seed(82);
  const auto before = generator_state();
  Linear l(LinearOptions(4096, 1024).init(false));
  EXPECT_TRUE(torch::equal(generator_state(), before)) << "random numbers were drawn";
  EXPECT_TRUE(torchattn::is_placeholder(l->weight));
  EXPECT_TRUE(torchattn::is_placeholder(l->bias));
  EXPECT_EQ(l->weight.sizes(), (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(l->weight.storage().nbytes(), 4u) << "a placeholder holds one float";
  EXPECT_TRUE(l->weight.requires_grad()) << "a parameter to load and train, as nn::Linear's";
  expect_error([&] { (void)l(torch::randn({1, 4096})); }, "before its weights were loaded (built with init(false)");
  // Loading replaces the placeholders (as models::load_weights does): then it runs.
  const auto w = torch::randn({1024, 4096}), b = torch::randn({1024});
  {
    torch::NoGradGuard no_grad;
    l->weight.set_data(w);
    l->bias.set_data(b);
  }
  EXPECT_FALSE(torchattn::is_placeholder(l->weight));
  const auto x = torch::randn({2, 4096});
  EXPECT_TRUE(torch::equal(l(x), at::linear(x, w, b)));
}

// bind keeps the tensors it is given (the checkpoint's: not copied), freeze quantizes the
// layer's own; both give quantized_linear's numbers and free the float32 weight.
TEST(LinearLayer, BindKeepsTheGivenWeightsAndFreezeQuantizesItsOwn) {
  torch::manual_seed(83);
  Linear frozen(LinearOptions(130, 20)), bound(LinearOptions(130, 20).init(false));
  {
    torch::NoGradGuard no_grad;
    bound->bias.set_data(frozen->bias.detach().clone());
  }
  auto [q, scale] = kc::quantize_int8_groups(frozen->weight.detach());
  bound->bind(WeightFormat::Int8, q, scale, Int8Inputs::Quantized);
  frozen->freeze(WeightFormat::Int8, Int8Inputs::Quantized);
  EXPECT_TRUE(frozen->frozen() && bound->frozen());
  EXPECT_TRUE(torchattn::is_placeholder(frozen->weight));
  EXPECT_FALSE(frozen->weight.requires_grad());
  EXPECT_EQ(bound->frozen_weight().first.data_ptr(), q.data_ptr()) << "bind copied the int8 weights";
  EXPECT_EQ(bound->frozen_weight().second.data_ptr(), scale.data_ptr()) << "bind copied the scales";
  EXPECT_TRUE(torch::equal(frozen->frozen_weight().first, q));
  torch::NoGradGuard no_grad;
  for (const int64_t rows : {1, 7, 40}) {
    const auto x = torch::randn({rows, 130});
    const auto want = kc::quantized_linear(x, q, scale, frozen->bias);
    EXPECT_TRUE(torch::equal(frozen(x), want)) << rows << " rows";
    EXPECT_TRUE(torch::equal(bound(x), want)) << rows << " rows";
    EXPECT_TRUE(torch::equal(bound->forward_fast(x), want)) << rows << " rows";
  }
  EXPECT_EQ(frozen->format_bytes(), 20 * 130 + 20 * 3 * 4 + 20 * 4);
  expect_error([&] { frozen->freeze(WeightFormat::BFloat16); }, "already int8, asked for bfloat16");
  expect_error([&] { frozen->set_inference({.on = true}, WeightFormat::BFloat16); },
               "kept in int8 (frozen); asked for bfloat16");
}

TEST(LinearLayer, BindRefusesWhatItCannotKeepAndChangesNothing) {
  Linear l(LinearOptions(64, 8).bias(false));
  const auto w = l->weight.detach().clone();
  const auto cast = static_cast<WeightFormat>(-1);
  expect_error([&] { l->freeze(cast); }, "Linear: freeze: expected WeightFormat::Float32, BFloat16, Int8, "
                                         "DynamicInt8 or Int4, got the value -1 (an integer cast to WeightFormat?)");
  expect_error([&] { l->set_inference({.on = true}, cast); }, "Linear: set_inference: expected WeightFormat::");
  expect_error([&] { torchattn::PackedLinear engine(static_cast<WeightFormat>(5)); },
               "PackedLinear: expected WeightFormat::");
  auto [q, scale] = kc::quantize_int8_groups(w);
  expect_error([&] { l->bind(WeightFormat::Int8, q.to(torch::kFloat), scale, Int8Inputs::Float, "layers.3.up"); },
               "expected the frozen 'layers.3.up' int8 (the weight format asked for), got float32 weights");
  expect_error([&] { l->bind(WeightFormat::Int8, q.narrow(0, 0, 4), scale, Int8Inputs::Float, "up"); },
               "expected the frozen 'up' [8, 64] (the model's shape), got [4, 64]");
  expect_error([&] { l->bind(WeightFormat::Int8, q, -scale - 1, Int8Inputs::Float, "up"); },
               "expected 'up_scale' as int8 quantization makes them (finite, in [0, 2.68e36]");
  EXPECT_FALSE(l->frozen());
  EXPECT_TRUE(torch::equal(l->weight, w)) << "a refused bind changed the weights";
  Linear unloaded(LinearOptions(64, 8).init(false));
  expect_error([&] { unloaded->bind(WeightFormat::Int8, q, scale, Int8Inputs::Float, "up"); },
               "load the bias before binding the weights");
}

// Layers frozen to one format run as one product whose columns are each layer's own
// bits; layers that are not frozen run each its own forward.
TEST(LinearLayer, AGroupGivesEachLayersOwnBits) {
  torch::manual_seed(84);
  for (const auto format : {WeightFormat::Int8, WeightFormat::BFloat16}) {
    for (const auto inputs : {Int8Inputs::Float, Int8Inputs::Quantized}) {
      Linear q(LinearOptions(96, 48)), k(LinearOptions(96, 16).bias(false)), v(LinearOptions(96, 16));
      const auto x = torch::randn({3, 5, 96});
      {
        torch::NoGradGuard no_grad;
        const auto group = torchattn::linear_group(x, {q.get(), k.get(), v.get()}, /*fast=*/false);
        for (size_t i = 0; i < 3; ++i) {
          Linear l = i == 0 ? q : i == 1 ? k : v;
          EXPECT_TRUE(torch::equal(group[i], l(x)));
        }
        // Decoding's few rows in float32: one product too, each the bits of forward_fast.
        for (const auto& in : {x.narrow(1, 0, 1), x.narrow(0, 0, 1)}) {
          const auto fast = torchattn::linear_group(in, {q.get(), k.get(), v.get()}, /*fast=*/true);
          for (size_t i = 0; i < 3; ++i) {
            Linear l = i == 0 ? q : i == 1 ? k : v;
            EXPECT_TRUE(torch::equal(fast[i], l->forward_fast(in))) << in.sizes() << ", layer " << i;
          }
          EXPECT_EQ(fast[0].data_ptr<float>() + 48, fast[1].data_ptr<float>()) << "not one product";
        }
      }
      for (auto* l : {&q, &k, &v}) (*l)->freeze(format, inputs);
      torch::NoGradGuard no_grad;
      for (const auto& in : {x, x.narrow(1, 0, 1)}) {  // prefill's rows and a decoding step's
        const auto group = torchattn::linear_group(in, {q.get(), k.get(), v.get()}, /*fast=*/true);
        ASSERT_EQ(group.size(), 3u);
        EXPECT_TRUE(torch::equal(group[0], q(in)));
        EXPECT_TRUE(torch::equal(group[1], k(in)));
        EXPECT_TRUE(torch::equal(group[2], v(in)));
        EXPECT_EQ(group[0].data_ptr<float>() + 48, group[1].data_ptr<float>()) << "not one product";
      }
    }
  }
}

TEST(LinearLayer, PackedInferenceFollowsItsPolicyAndLetsGradientsThrough) {
  torch::manual_seed(85);
  Linear l(LinearOptions(64, 32));
  const auto x = torch::randn({4, 64});
  const auto exact = l(x).detach();
  l->set_inference({.on = true, .min_rows = 2}, WeightFormat::BFloat16);
  {
    torch::NoGradGuard no_grad;
    const auto packed = l(x);
    EXPECT_FALSE(torch::equal(packed, exact)) << "the bfloat16 copy did not run";
    EXPECT_TRUE(torch::allclose(packed, exact, 2e-2, 2e-2));
    EXPECT_GT(l->format_bytes(), 0);
    EXPECT_TRUE(torch::equal(l(x.narrow(0, 0, 1)), at::linear(x.narrow(0, 0, 1), l->weight, l->bias)))
        << "one row is under min_rows: float32";
  }
  // With a gradient to compute, the float32 weights, and gradients reach them.
  const auto y = l(x);
  EXPECT_TRUE(torch::equal(y.detach(), exact));
  y.sum().backward();
  EXPECT_TRUE(l->weight.grad().defined());
  l->set_inference({.on = false}, WeightFormat::BFloat16);
  EXPECT_EQ(l->format_bytes(), 0) << "packing off: the copy goes";
}

namespace placed {

// Three layers as an attention's q, k and v: grouped-query sizes, with or without bias.
std::vector<Linear> qkv(bool bias, torch::Device device = torch::kCPU) {
  std::vector<Linear> out;
  for (const int64_t features : {48, 16, 16}) {
    Linear l(LinearOptions(32, features).bias(bias));
    l->to(device);
    out.push_back(l);
  }
  return out;
}

}  // namespace placed

// place_together lays the weights end to end in one storage (biases in another)
// without changing what any layer holds or computes, or which tensors its parameters
// are; a second call copies nothing; training still reaches every parameter.
TEST(LinearLayer, PlaceTogetherSharesOneStorageAndChangesNoValue) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    torch::manual_seed(86);
    auto layers = placed::qkv(bias);
    Linear &q = layers[0], &k = layers[1], &v = layers[2];
    const auto x = torch::randn({2, 5, 32});
    std::vector<at::Tensor> before, params;
    for (auto& l : layers) {
      before.push_back(l(x).detach());
      for (const auto& p : l->parameters()) params.push_back(p);
    }
    EXPECT_FALSE(torchattn::placed_together({q.get(), k.get(), v.get()}));
    torchattn::place_together({q.get(), k.get(), v.get()});
    EXPECT_TRUE(torchattn::placed_together({q.get(), k.get(), v.get()}));
    EXPECT_FALSE(torchattn::placed_together({k.get(), q.get(), v.get()})) << "order matters";
    EXPECT_TRUE(k->weight.is_alias_of(q->weight));
    EXPECT_EQ(k->weight.data_ptr<float>(), q->weight.data_ptr<float>() + 48 * 32);
    EXPECT_EQ(v->weight.data_ptr<float>(), k->weight.data_ptr<float>() + 16 * 32);
    if (bias) {
      EXPECT_EQ(v->bias.data_ptr<float>(), q->bias.data_ptr<float>() + 64);
    }
    size_t i = 0;
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_TRUE(layers[j]->weight.requires_grad() && layers[j]->weight.is_leaf());
      EXPECT_TRUE(torch::equal(layers[j](x), before[j]));
      for (const auto& p : layers[j]->parameters()) EXPECT_TRUE(p.is_same(params[i++])) << "a parameter was replaced";
    }
    const float* q_data = q->weight.data_ptr<float>();
    torchattn::place_together({q.get(), k.get(), v.get()});
    EXPECT_EQ(q->weight.data_ptr<float>(), q_data) << "placed already: nothing is copied";
    // A CPU group keeps each layer's own bits, placed or not.
    {
      torch::NoGradGuard no_grad;
      for (const auto& in : {x, x.narrow(1, 0, 1)}) {
        const auto group = torchattn::linear_group(in, {q.get(), k.get(), v.get()}, /*fast=*/true);
        for (size_t j = 0; j < 3; ++j) EXPECT_TRUE(torch::equal(group[j], layers[j]->forward_fast(in)));
      }
    }
    // Training: each parameter gets its own gradient, and an optimizer's step writes
    // through to the shared storage.
    const auto loss = q(x).sum() + k(x).square().sum() + v(x).mean();
    loss.backward();
    for (auto& l : layers) ASSERT_TRUE(l->weight.grad().defined() && l->weight.grad().sizes() == l->weight.sizes());
    const auto k_before = k->weight.detach().clone();
    torch::optim::SGD(k->parameters(), 0.5).step();
    EXPECT_TRUE(torch::equal(k->weight.detach(), k_before - 0.5 * k->weight.grad()));
    EXPECT_TRUE(torchattn::placed_together({q.get(), k.get(), v.get()}));
  }
}

// end_to_end needs one storage, consecutive offsets and the same sizes but the first:
// a [2, 8] right after a [4, 16] is not a [6, 16]. place_together inside the caller's
// InferenceMode keeps the parameters normal tensors (usable for training later).
TEST(LinearLayer, EndToEndNeedsOneShapeAndPlacingKeepsNormalTensors) {
  const auto base = torch::randn({4 * 16 + 2 * 16});
  const auto a = base.narrow(0, 0, 64).view({4, 16});
  EXPECT_TRUE(torchattn::layers::end_to_end({a, base.narrow(0, 64, 32).view({2, 16})}));
  EXPECT_FALSE(torchattn::layers::end_to_end({a, base.narrow(0, 64, 16).view({2, 8})})) << "other trailing sizes";
  EXPECT_FALSE(torchattn::layers::end_to_end({a, base.narrow(0, 80, 16).view({1, 16})})) << "a gap";
  EXPECT_FALSE(torchattn::layers::end_to_end({a, torch::randn({2, 16})})) << "another storage";
  EXPECT_TRUE(
      torch::equal(torchattn::layers::joined_view({a, base.narrow(0, 64, 32).view({2, 16})}), base.view({6, 16})));

  torch::manual_seed(89);
  auto layers = placed::qkv(/*bias=*/true);
  {
    c10::InferenceMode inference;
    torchattn::place_together({layers[0].get(), layers[1].get(), layers[2].get()});
  }
  for (auto& l : layers) {
    EXPECT_FALSE(l->weight.is_inference());
    EXPECT_FALSE(l->bias.is_inference());
  }
  layers[1](torch::randn({2, 32})).sum().backward();
  EXPECT_TRUE(layers[1]->weight.grad().defined());
}

TEST(LinearLayer, PlaceTogetherRefusesLayersThatCannotShareAndNamesThem) {
  torch::manual_seed(87);
  Linear a(LinearOptions(32, 8)), b(LinearOptions(24, 8)), c(LinearOptions(32, 8).bias(false));
  Linear d(LinearOptions(32, 8)), e(LinearOptions(32, 8).init(false));
  expect_error([&] { torchattn::place_together({a.get(), b.get()}); },
               "place_together: layer 1 takes 24 input features, layer 0 32");
  expect_error([&] { torchattn::place_together({a.get(), c.get()}); },
               "place_together: layer 1 has no bias, layer 0 has one");
  d->to(torch::kFloat64);
  expect_error([&] { torchattn::place_together({a.get(), d.get()}); },
               "place_together: layer 1 has Double weights on cpu, layer 0 Float on cpu");
  expect_error([&] { torchattn::place_together({a.get(), e.get()}); },
               "place_together: layer 1 has no weights of its own (frozen, or built for loading and not loaded)");
  EXPECT_FALSE(a->weight.is_alias_of(d->weight)) << "a refusal changes nothing";
}

#ifdef TORCHATTN_TESTS_CUDA
// Off the CPU, placed layers run as one GEMM: each output a view of one product,
// equal to the layer's own within the dtype's rounding.
TEST(LinearLayer, PlacedLayersOnAGpuRunAsOneProduct) {
  devices::skip_unless_present(torch::kCUDA);
  if (testing::Test::IsSkipped() || testing::Test::HasFatalFailure()) return;
  for (const bool bias : {true, false}) {
    torch::manual_seed(88);
    auto layers = placed::qkv(bias, torch::kCUDA);
    torchattn::place_together({layers[0].get(), layers[1].get(), layers[2].get()});
    const auto x = torch::randn({3, 1, 32}).to(torch::kCUDA);
    torch::NoGradGuard no_grad;
    const auto group = torchattn::linear_group(x, {layers[0].get(), layers[1].get(), layers[2].get()}, true);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_TRUE(torch::allclose(group[j], layers[j](x), 1e-5, 1e-5)) << "layer " << j;
    }
    EXPECT_EQ(group[1].data_ptr<float>(), group[0].data_ptr<float>() + 48) << "not one product";
  }
}
#endif

}  // namespace
