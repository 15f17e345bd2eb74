// mask_buffer(false): no context_length^2 buffer, the same numbers, and checkpoints
// with the notebooks' `mask` key load when that key holds the causal mask.

#include "serialize/causal_buffer.h"

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/tolerances.h"
#include "common/temp_path.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace {

using torchattn::Backend;


using SameParam = std::tuple<bool /*multi-head*/, Backend, torch::Device>;
class MaskBufferOff : public ::testing::TestWithParam<SameParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<2>(GetParam())); }
};

// The same weights with and without the buffer: outputs, gradients (with padding)
// and cached decoding agree bit for bit on the Reference, within float32 otherwise.
TEST_P(MaskBufferOff, GivesTheSameOutputsGradientsAndCachedRows) {
  const auto [multi_head, backend, device] = GetParam();
  const int64_t C = 12, d = 8;
  torch::manual_seed(51);
  std::shared_ptr<torch::nn::Module> with, without;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> f_with, f_without;
  std::function<torch::Tensor(const torch::Tensor&, torchattn::KVCache&)> c_without;
  std::function<torchattn::KVCache(bool)> make_cache;
  if (multi_head) {
    torchattn::MultiHeadAttention a(torchattn::MultiHeadAttentionOptions(d, d, C, 2).qkv_bias(true).backend(backend));
    torchattn::MultiHeadAttention b(
        torchattn::MultiHeadAttentionOptions(d, d, C, 2).qkv_bias(true).backend(backend).mask_buffer(false));
    with = a.ptr();
    without = b.ptr();
    f_with = [a](const torch::Tensor& x, const torch::Tensor& p) mutable { return a(x, p); };
    f_without = [b](const torch::Tensor& x, const torch::Tensor& p) mutable { return b(x, p); };
    c_without = [b](const torch::Tensor& x, torchattn::KVCache& c) mutable { return b->forward_cached(x, c); };
    make_cache = [b](bool s) { return b->make_kv_cache(2, s); };
  } else {
    torchattn::CausalAttention a(torchattn::CausalAttentionOptions(d, d, C).qkv_bias(true).backend(backend));
    torchattn::CausalAttention b(
        torchattn::CausalAttentionOptions(d, d, C).qkv_bias(true).backend(backend).mask_buffer(false));
    with = a.ptr();
    without = b.ptr();
    f_with = [a](const torch::Tensor& x, const torch::Tensor& p) mutable { return a(x, p); };
    f_without = [b](const torch::Tensor& x, const torch::Tensor& p) mutable { return b(x, p); };
    c_without = [b](const torch::Tensor& x, torchattn::KVCache& c) mutable { return b->forward_cached(x, c); };
    make_cache = [b](bool s) { return b->make_kv_cache(2, s); };
  }
  {
    torch::NoGradGuard no_grad;
    auto src = with->named_parameters();
    for (auto& p : without->named_parameters()) p.value().copy_(src[p.key()]);
  }
  EXPECT_TRUE(with->named_buffers().contains("mask"));
  EXPECT_TRUE(without->buffers().empty());
  with->to(device);
  without->to(device);

  auto x = torch::randn({2, C, d}).to(device);
  auto pad = torch::zeros({2, C}, torch::kBool);
  pad.narrow(1, 0, 2).fill_(true);
  pad = pad.to(device);
  const auto t = tol::for_dtype(torch::kFloat32);
  for (const auto& p : {torch::Tensor(), pad}) {
    auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    auto ya = f_with(xa, p), yb = f_without(xb, p);
    EXPECT_TRUE(tol::close(yb, ya, t));
    ya.sum().backward();
    yb.sum().backward();
    EXPECT_TRUE(tol::close(xb.grad(), xa.grad(), t));
  }
  torch::NoGradGuard no_grad;
  auto full = f_with(x, {});
  for (bool static_shapes : {false, true}) {
    auto cache = make_cache(static_shapes);
    auto a = c_without(x.narrow(1, 0, 5), cache);
    auto b = c_without(x.narrow(1, 5, 1), cache);
    auto c = c_without(x.narrow(1, 6, 6), cache);
    EXPECT_TRUE(tol::close(torch::cat({a, b, c}, 1), full, t)) << "static_shapes=" << static_shapes;
  }
}

std::string same_param_name(const ::testing::TestParamInfo<SameParam>& info) {
  const auto [mh, backend, device] = info.param;
  return devices::prefix(device) + (mh ? "MHA_" : "Causal_") + std::string(torchattn::to_string(backend));
}

INSTANTIATE_TEST_SUITE_P(Modules, MaskBufferOff,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::ValuesIn(devices::all())),
                         same_param_name);

TEST(MaskBuffer, OffHoldsOnlyTheWeightsAtContextLength32768) {
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(64, 64, 32768, 4).mask_buffer(false));
  EXPECT_TRUE(mha->buffers().empty());
  EXPECT_FALSE(mha->mask.defined());
  int64_t numel = 0;
  for (const auto& p : mha->parameters()) numel += p.numel();
  EXPECT_EQ(numel, 4 * 64 * 64 + 64);  // W_query, W_key, W_value, out_proj (+ its bias)
  torch::NoGradGuard no_grad;
  auto cache = mha->make_kv_cache(1);
  EXPECT_EQ(mha->forward_cached(torch::randn({1, 3, 64}), cache).sizes(), (std::vector<int64_t>{1, 3, 64}));
  std::ostringstream s;
  s << *mha;
  EXPECT_NE(s.str().find("mask_buffer=false"), std::string::npos) << s.str();
}

TEST(MaskBuffer, HoldsCausalMaskChecksEveryRowBlock) {
  namespace D = torchattn::serialize;
  auto m = torchattn::functional::causal_mask_buffer(600);
  EXPECT_TRUE(D::holds_causal_mask(m, 600));
  EXPECT_FALSE(D::holds_causal_mask(m, 599));
  auto bad = m.clone();
  bad[300][301] = 0;  // a visible future key in the second block of rows
  EXPECT_FALSE(D::holds_causal_mask(bad, 600));
  bad = m.clone();
  bad[599][0] = 1;
  EXPECT_FALSE(D::holds_causal_mask(bad, 600));
  EXPECT_TRUE(D::holds_causal_mask(m.to(torch::kBFloat16), 600));
  EXPECT_FALSE(D::holds_causal_mask(m.narrow(0, 0, 599), 600));
}

TEST(MaskBuffer, NotebookCheckpointsLoadWhenTheirMaskIsCausal) {
  torch::manual_seed(52);
  torchattn::MultiHeadAttention with(torchattn::MultiHeadAttentionOptions(6, 6, 10, 2));
  const std::string path = temp_path("with.pt");
  torch::save(with, path);
  torchattn::MultiHeadAttention without(torchattn::MultiHeadAttentionOptions(6, 6, 10, 2).mask_buffer(false));
  torch::load(without, path);
  EXPECT_TRUE(torch::equal(without->W_key->weight, with->W_key->weight));

  // A mask that is not the causal one: the key is named, nothing is loaded.
  {
    torch::NoGradGuard no_grad;
    with->mask[0][1] = 0;
    with->W_key->weight.add_(1);
  }
  torch::save(with, path);
  expect_error(
      [&] { torch::load(without, path); },
      "MultiHeadAttention: checkpoint key 'mask' of shape [10, 10] is not the causal mask triu(ones(10, 10), 1)");
  EXPECT_FALSE(torch::equal(without->W_key->weight, with->W_key->weight));

  // A context length that differs is not the module's causal mask either.
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(6, 6, 12));
  torch::save(ca, path);
  torchattn::CausalAttention ca_off(torchattn::CausalAttentionOptions(6, 6, 10).mask_buffer(false));
  expect_error([&] { torch::load(ca_off, path); }, "CausalAttention: checkpoint key 'mask' of shape [12, 12]");

  // Without a mask, into a module with the buffer: strict, the key is missing.
  torchattn::CausalAttention off(torchattn::CausalAttentionOptions(6, 6, 10).mask_buffer(false));
  torch::save(off, path);
  torchattn::CausalAttention on(torchattn::CausalAttentionOptions(6, 6, 10));
  expect_error([&] { torch::load(on, path); }, "CausalAttention: checkpoint is missing key 'mask'");
  std::remove(path.c_str());
}

TEST(MaskBuffer, PythonStateDictsLoadWhenTheirMaskIsCausal) {
  torch::manual_seed(53);
  torchattn::CausalAttention with(torchattn::CausalAttentionOptions(5, 4, 9));
  const std::string path = temp_path("state.pt");
  torchattn::save_state_dict(*with, path);
  torchattn::CausalAttention without(torchattn::CausalAttentionOptions(5, 4, 9).mask_buffer(false));
  torchattn::load_state_dict(*without, path);
  EXPECT_TRUE(torch::equal(without->W_query->weight, with->W_query->weight));
  {
    torch::NoGradGuard no_grad;
    with->mask.fill_(0);  // no mask at all
  }
  torchattn::save_state_dict(*with, path);
  expect_error([&] { torchattn::load_state_dict(*without, path); },
               "load_state_dict: checkpoint key 'mask' of shape [9, 9] is not the causal mask");
  // Inside a model: the key carries the submodule's name.
  torch::nn::Sequential model(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(4, 4, 6, 2)));
  torchattn::save_state_dict(*model, path);
  torch::nn::Sequential model_off(
      torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(4, 4, 6, 2).mask_buffer(false)));
  torchattn::load_state_dict(*model_off, path);
  std::remove(path.c_str());
}

}  // namespace
