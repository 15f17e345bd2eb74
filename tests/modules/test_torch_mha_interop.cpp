// torch.nn.MultiheadAttention's packed state dict (torchattn/torch_mha_interop.h):
// in and out exactly, and every misuse a message naming the key or the option. The
// numbers against PyTorch's own module are checked by ctest -R interop.

#include <torchattn/torchattn.h>

#include "common/expect_error.h"
#include "common/module_snapshot.h"
#include "common/temp_path.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

torchattn::MultiHeadAttentionOptions torch_mha_options(int64_t E, int64_t H, bool bias) {
  return torchattn::MultiHeadAttentionOptions(E, E, 8, H).causal(false).qkv_bias(bias).out_bias(bias);
}

TEST(TorchMultiheadAttention, StateDictHasPyTorchsKeysAndRoundTripsExactly) {
  torch::manual_seed(49);
  torchattn::MultiHeadAttention a(torch_mha_options(6, 2, true));
  const auto sd = torchattn::torch_multihead_attention_state_dict(*a);
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd[0].first, "in_proj_weight");
  EXPECT_EQ(sd[0].second.sizes(), (std::vector<int64_t>{18, 6}));
  EXPECT_TRUE(torch::equal(sd[0].second.slice(0, 6, 12), a->W_key->weight));
  EXPECT_EQ(sd[1].first, "in_proj_bias");
  EXPECT_TRUE(torch::equal(sd[1].second.slice(0, 12, 18), a->W_value->bias));
  EXPECT_EQ(sd[2].first, "out_proj.weight");
  EXPECT_EQ(sd[3].first, "out_proj.bias");
  EXPECT_FALSE(sd[0].second.requires_grad());

  const auto path = temp_path("torch_mha.pt");
  torchattn::save_torch_multihead_attention(*a, path);
  torch::manual_seed(50);
  torchattn::MultiHeadAttention b(torch_mha_options(6, 2, true));
  torchattn::load_torch_multihead_attention(*b, path);
  auto x = torch::randn({2, 5, 6});
  EXPECT_TRUE(torch::equal(a(x), b(x)));
  std::filesystem::remove(path);

  // kdim and vdim other than embed_dim: q/k/v_proj_weight, no in_proj_weight.
  torchattn::MultiHeadAttention cross(torch_mha_options(6, 3, false).kdim(4).vdim(5));
  const auto cross_sd = torchattn::torch_multihead_attention_state_dict(*cross);
  ASSERT_EQ(cross_sd.size(), 4u);
  EXPECT_EQ(cross_sd[1].first, "k_proj_weight");
  EXPECT_EQ(cross_sd[1].second.sizes(), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(cross_sd[2].first, "v_proj_weight");
  EXPECT_EQ(cross_sd[3].first, "out_proj.weight");
}

// The state dict holds no head count: save records it (and the other options it
// lacks) beside the file, and loading checks what that file names; without the file
// the head count is the caller's, as the header says.
TEST(TorchMultiheadAttention, TheRecordedHeadCountIsChecked) {
  namespace fs = std::filesystem;
  torch::manual_seed(51);
  torchattn::MultiHeadAttention four(torch_mha_options(8, 4, true));
  const auto path = temp_path("torch_mha_heads.pt");
  const std::string options = torchattn::torch_multihead_attention_options_path(path);
  EXPECT_EQ(options, path + ".options");
  torchattn::save_torch_multihead_attention(*four, path);
  auto read = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto write = [](const std::string& p, const std::string& text) { std::ofstream(p, std::ios::trunc) << text; };
  EXPECT_EQ(read(options), "embed_dim=8;num_heads=4;bias=true;kdim=8;vdim=8\n");

  torchattn::MultiHeadAttention again(torch_mha_options(8, 4, true));
  torchattn::load_torch_multihead_attention(*again, path);
  const auto x = torch::randn({2, 3, 8});
  EXPECT_TRUE(torch::equal(again(x), four(x)));

  torchattn::MultiHeadAttention two(torch_mha_options(8, 2, true));
  const auto before = snapshot(*two);
  const std::string no_two = "load_torch_multihead_attention: '" + options +
                             "' records num_heads=4 (the module the weights were saved from); this MultiHeadAttention "
                             "has num_heads=2: build it with the recorded value (the weights alone do not tell the "
                             "head count)";
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*two, path); }), no_two);
  expect_unchanged(*two, before);
  // A line written by hand (a Python script): any of the names, in any order.
  write(options, "num_heads=4");
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*two, path); }), no_two);
  torchattn::load_torch_multihead_attention(*again, path);
  // A file that is not one is named.
  const std::string bad = "load_torch_multihead_attention: '" + options + "': expected name=value pairs joined by ';'";
  for (const std::string text :
       {"num_heads", "heads=4", "num_heads=4;;", "num_heads=4,bias=true", "num_heads=", "bias=yes", "kdim=-8"}) {
    write(options, text);
    EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*again, path); }), bad) << text;
  }
  write(options, "num_heads=4;num_heads=4");
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*again, path); }),
             "load_torch_multihead_attention: '" + options + "' names num_heads twice");
  write(options, "bias=false");
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*again, path); }),
             "records bias=false (the module the weights were saved from); this MultiHeadAttention has bias=true");
  write(options, std::string(5000, 'x'));
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*again, path); }),
             "load_torch_multihead_attention: '" + options +
                 "' holds 5000 bytes; an options file is one line of at most 4096 bytes");
  // Without the file, the head count is the caller's: a 4-head file loads into 2 heads.
  fs::remove(options);
  torchattn::load_torch_multihead_attention(*two, path);
  EXPECT_TRUE(torch::equal(two->W_query->weight, four->W_query->weight));
  EXPECT_FALSE(torch::allclose(two(x), four(x)));
  fs::remove(path);
}

TEST(TorchMultiheadAttention, MisuseIsNamedAndLeavesTheModuleUnchanged) {
  torch::manual_seed(51);
  torchattn::MultiHeadAttention source(torch_mha_options(6, 2, true));
  const torchattn::NamedTensors sd = torchattn::torch_multihead_attention_state_dict(*source);
  const auto without = [&](const std::string& key) {
    torchattn::NamedTensors out;
    for (const auto& kv : sd)
      if (kv.first != key) out.push_back(kv);
    return out;
  };
  const auto with = [&](const std::string& key, const torch::Tensor& t) {
    torchattn::NamedTensors out = without(key);
    out.emplace_back(key, t);
    return out;
  };
  torchattn::MultiHeadAttention m(torch_mha_options(6, 2, true));
  const auto before = snapshot(*m);
  const auto load = [&](const torchattn::NamedTensors& tensors) {
    return error_of([&] { torchattn::load_torch_multihead_attention(*m, tensors); });
  };

  EXPECT_HAS(load(without("out_proj.bias")),
             "load_torch_multihead_attention: the state dict is missing key 'out_proj.bias' [6] of "
             "nn.MultiheadAttention(6, 2, bias=True) (this MultiHeadAttention has qkv_bias(true) and out_bias(true)");
  EXPECT_HAS(load(with("in_proj_weight", torch::zeros({12, 6}))),
             "load_torch_multihead_attention: key 'in_proj_weight' has shape [12, 6] in the state dict, expected "
             "[18, 6] ([3 * embed_dim, embed_dim] with embed_dim=6, nn.MultiheadAttention(6, 2, bias=True))");
  EXPECT_HAS(load(with("out_proj.weight", torch::zeros({6, 6}, torch::kFloat64))),
             "key 'out_proj.weight' has dtype Double in the state dict, expected the module's Float");
  EXPECT_HAS(load(with("bias_k", torch::zeros({1, 1, 6}))),
             "load_torch_multihead_attention: the state dict has key 'bias_k' [1, 1, 6]: it is of an "
             "nn.MultiheadAttention built with add_bias_kv=True");
  EXPECT_HAS(load(with("extra", torch::zeros({2}))),
             "the state dict has unexpected key 'extra' [2] for nn.MultiheadAttention(6, 2, bias=True); expected "
             "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias");
  expect_unchanged(*m, before);

  // A state dict of another nn.MultiheadAttention: without biases, or with kdim/vdim.
  torchattn::MultiHeadAttention no_bias(torch_mha_options(6, 2, false));
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*no_bias, sd); }),
             "the state dict has unexpected key 'in_proj_bias' [18] for nn.MultiheadAttention(6, 2, bias=False) (a "
             "bias of nn.MultiheadAttention(..., bias=True)");
  torchattn::MultiHeadAttention cross(torch_mha_options(6, 2, true).kdim(4).vdim(5));
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*cross, sd); }),
             "the state dict is missing key 'q_proj_weight' [6, 6] of nn.MultiheadAttention(6, 2, bias=True, kdim=4, "
             "vdim=5) (it has in_proj_weight instead: its module has kdim = vdim = embed_dim, this MultiHeadAttention "
             "kdim=4 and vdim=5)");
  EXPECT_HAS(error_of([&] {
               torchattn::load_torch_multihead_attention(*m, torchattn::torch_multihead_attention_state_dict(*cross));
             }),
             "is missing key 'in_proj_weight' [18, 6] of nn.MultiheadAttention(6, 2, bias=True) (it has q_proj_weight, "
             "k_proj_weight and v_proj_weight instead");

  // Options nn.MultiheadAttention cannot express, loading or saving.
  const std::string no = "nn.MultiheadAttention cannot express this MultiHeadAttention: ";
  torchattn::MultiHeadAttention gqa(torch_mha_options(8, 4, true).num_kv_heads(2));
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*gqa, sd); }),
             "load_torch_multihead_attention: " + no +
                 "it has no grouped-query heads (num_kv_heads must equal num_heads=4), got num_kv_heads=2");
  torchattn::MultiHeadAttention rope(torch_mha_options(8, 2, true).rope(torchattn::RoPEOptions(10000.0)));
  EXPECT_HAS(error_of([&] { torchattn::save_torch_multihead_attention(*rope, temp_path("never.pt")); }),
             "save_torch_multihead_attention: " + no + "it has no rotary positions, got rope (theta=10000)");
  torchattn::MultiHeadAttention wider(torchattn::MultiHeadAttentionOptions(6, 8, 8, 2).causal(false));
  EXPECT_HAS(error_of([&] { torchattn::torch_multihead_attention_state_dict(*wider); }),
             "torch_multihead_attention_state_dict: " + no +
                 "it maps embed_dim features to embed_dim, so it needs d_in == d_out, got d_in=6 and d_out=8");
  torchattn::MultiHeadAttention half_bias(torch_mha_options(6, 2, true).out_bias(false));
  EXPECT_HAS(error_of([&] { torchattn::torch_multihead_attention_state_dict(*half_bias); }),
             no + "its bias= gives both in_proj and out_proj biases or neither, got qkv_bias=true and out_bias=false");
  torchattn::MultiHeadAttention head_dim(torch_mha_options(6, 2, true).head_dim(4));
  EXPECT_HAS(error_of([&] { torchattn::torch_multihead_attention_state_dict(*head_dim); }),
             no + "its heads have embed_dim / num_heads = 6 / 2 features, got head_dim=4");
  torchattn::MultiHeadAttention scaled(torch_mha_options(6, 2, true).scale(1.0));
  EXPECT_HAS(error_of([&] { torchattn::torch_multihead_attention_state_dict(*scaled); }),
             no + "it scales the scores by 1/sqrt(embed_dim / num_heads) = 0.57735, got scale=1");
  torchattn::MultiHeadAttention default_scale(torch_mha_options(8, 2, true).scale(0.5));  // 1/sqrt(4): the same
  EXPECT_EQ(torchattn::torch_multihead_attention_state_dict(*default_scale).size(), 4u);

  // A file that is not a plain dict, or not there.
  EXPECT_HAS(error_of([&] { torchattn::load_torch_multihead_attention(*m, temp_path("absent.pt")); }),
             "load_torch_multihead_attention: cannot open '");
  expect_unchanged(*m, before);
}

}  // namespace
