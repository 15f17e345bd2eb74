// Checkpoints: exact round trips, strict loading (missing, extra, misshapen keys
// named with their path; nothing changed by a failed load), the options a
// checkpoint records (num_heads, scale, ...) checked on load, whole models through
// torchattn::load_state_dict, and damaged files; the options of today's models
// (window, RoPE, head_dim, kdim and vdim, num_kv_heads) recorded and checked.

#include "common/temp_path.h"
#include <torchattn/torchattn.h>

#include "common/expect_error.h"
#include "common/module_snapshot.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

using torchattn::RoPEOptions;

namespace {

TEST(Checkpoint, SaveLoadRoundTripIsExact) {
  const auto path = temp_path("roundtrip.pt");
  torch::manual_seed(41);
  torchattn::MultiHeadAttention a(torchattn::MultiHeadAttentionOptions(6, 6, 8, 3).qkv_bias(true));
  torch::save(a, path);
  torch::manual_seed(42);
  torchattn::MultiHeadAttention b(torchattn::MultiHeadAttentionOptions(6, 6, 8, 3).qkv_bias(true));
  torch::load(b, path);
  auto sa = snapshot(*a), sb = snapshot(*b);
  for (auto& [k, v] : sa) EXPECT_TRUE(torch::equal(sb.at(k), v)) << k;
  auto x = torch::randn({2, 8, 6});
  EXPECT_TRUE(torch::equal(a(x), b(x)));
  std::filesystem::remove(path);
}

TEST(Checkpoint, MissingExtraAndMisshapenKeysAreNamedAndLeaveTheModuleUnchanged) {
  const auto path = temp_path("strict.pt");
  torch::manual_seed(43);
  torch::save(torchattn::CausalAttention(torchattn::CausalAttentionOptions(4, 3, 6).qkv_bias(false)), path);

  torchattn::CausalAttention with_bias(torchattn::CausalAttentionOptions(4, 3, 6).qkv_bias(true));
  auto before = snapshot(*with_bias);
  EXPECT_NE(error_of([&] {
              torch::load(with_bias, path);
            }).find("CausalAttention: checkpoint is missing key 'W_query.bias'"),
            std::string::npos);
  expect_unchanged(*with_bias, before);

  torch::save(torchattn::CausalAttention(torchattn::CausalAttentionOptions(4, 3, 6).qkv_bias(true)), path);
  torchattn::CausalAttention no_bias(torchattn::CausalAttentionOptions(4, 3, 6));
  before = snapshot(*no_bias);
  EXPECT_NE(error_of([&] {
              torch::load(no_bias, path);
            }).find("CausalAttention: checkpoint has unexpected key 'W_query.bias'"),
            std::string::npos);
  expect_unchanged(*no_bias, before);

  torchattn::CausalAttention wider(torchattn::CausalAttentionOptions(4, 5, 6).qkv_bias(true));
  before = snapshot(*wider);
  EXPECT_NE(error_of([&] {
              torch::load(wider, path);
            }).find("CausalAttention: checkpoint key 'W_query.weight' has shape [3, 4], expected [5, 4]"),
            std::string::npos);
  expect_unchanged(*wider, before);

  torchattn::CausalAttention longer(torchattn::CausalAttentionOptions(4, 3, 9).qkv_bias(true));
  EXPECT_NE(error_of([&] {
              torch::load(longer, path);
            }).find("checkpoint key 'mask' has shape [6, 6], expected [9, 9]"),
            std::string::npos);

  torch::save(torchattn::MultiHeadAttention(4, 4, 6, 0.0, 2), path);
  torchattn::MultiHeadAttention mha(4, 4, 6, 0.0, 2);
  mha->to(torch::kFloat64);
  EXPECT_NE(error_of([&] { torch::load(mha, path); }).find("has dtype Float, expected Double"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Checkpoint, TruncatedOrCorruptedFilesAreErrorsNotCrashes) {
  const auto path = temp_path("good.pt"), bad = temp_path("bad.pt");
  torch::manual_seed(44);
  torchattn::MultiHeadAttention m(8, 8, 16, 0.0, 2);
  torch::save(m, path);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  auto before = snapshot(*m);
  int errors = 0, loads = 0;
  auto try_load = [&](const std::string& content) {
    std::ofstream(bad, std::ios::binary) << content;
    torchattn::MultiHeadAttention target(8, 8, 16, 0.0, 2);
    try {
      torch::load(target, bad);
      ++loads;
    } catch (const c10::Error&) {
      ++errors;
    } catch (const std::exception& e) {
      // LibTorch's loader reports damage inside the archive's TorchScript code with
      // torch::jit::ErrorReport, a std::exception: still an error with a message.
      EXPECT_NE(std::string(e.what()), "");
      ++errors;
    }
  };
  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 30, bytes.size() - 1}) {
    const int e = errors;
    try_load(bytes.substr(0, cut));
    EXPECT_EQ(errors, e + 1) << "a file truncated to " << cut << " bytes loaded";
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string corrupt = bytes;
    for (int j = 0; j < 8; ++j) corrupt[rng() % corrupt.size()] ^= static_cast<char>(1 + rng() % 255);
    try_load(corrupt);  // an exception with a message, or a load; a crash fails the run
  }
  std::printf("[checkpoint] 40 corrupted files: %d errors, %d loads (damage inside tensor data can load)\n", errors - 6,
              loads);
  expect_unchanged(*m, before);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// The slip: a 4-head checkpoint has the tensor shapes of an 8-head module.
TEST(Checkpoint, OptionsThatKeepTheShapesAreRecordedAndChecked) {
  const auto path = temp_path("options.pt");
  torch::manual_seed(45);
  torch::save(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(8, 8, 6, 4)), path);

  torchattn::MultiHeadAttention eight_heads(torchattn::MultiHeadAttentionOptions(8, 8, 6, 8));
  auto before = snapshot(*eight_heads);
  EXPECT_EQ(error_of([&] { torch::load(eight_heads, path); }),
            "MultiHeadAttention: checkpoint of the module was saved with num_heads=4, this module has num_heads=8 "
            "(the tensors have the same shapes, but the numbers would differ)");
  expect_unchanged(*eight_heads, before);

  torchattn::MultiHeadAttention scaled(torchattn::MultiHeadAttentionOptions(8, 8, 6, 4).scale(0.5));
  EXPECT_NE(error_of([&] { torch::load(scaled, path); })
                .find("MultiHeadAttention: checkpoint of the module was saved with scale=default, this module has "
                      "scale=0.5"),
            std::string::npos);

  torch::save(torchattn::CausalAttention(torchattn::CausalAttentionOptions(4, 3, 6).scale(1.0)), path);
  torchattn::CausalAttention unscaled(torchattn::CausalAttentionOptions(4, 3, 6));
  EXPECT_NE(error_of([&] {
              torch::load(unscaled, path);
            }).find("CausalAttention: checkpoint of the module was saved with scale=1, this module has scale=default"),
            std::string::npos);
  torch::save(torchattn::SelfAttentionV2(torchattn::SelfAttentionV2Options(4, 3).scale(0.1)), path);
  torchattn::SelfAttentionV2 sa(torchattn::SelfAttentionV2Options(4, 3).scale(0.1));
  torch::load(sa, path);  // the same scale, to 17 digits
  torchattn::SelfAttentionV2 sa2(torchattn::SelfAttentionV2Options(4, 3).scale(0.1 + 1e-16));
  EXPECT_NE(error_of([&] { torch::load(sa2, path); })
                .find("saved with scale=0.10000000000000001, this module has "
                      "scale=0.1000000000000001"),
            std::string::npos);
  std::filesystem::remove(path);
}

// The checkpoint code asks each module through CheckpointFacts, knowing no module type:
// the names each records (in order), the causal mask it implies without its buffer,
// and the hint that explains a tensor's shape.
TEST(Checkpoint, EachModuleSaysItsFactsThroughOneInterface) {
  auto names = [](const torchattn::CheckpointFacts& facts) {
    std::vector<std::string> out;
    for (const auto& [name, value] : facts.checkpoint_options()) out.push_back(name);
    return out;
  };
  const std::vector<std::string> attention{"causal", "window", "rope_theta", "rope_interleaved", "rope_rotary_dim"};
  torchattn::MultiHeadAttention mha(
      torchattn::MultiHeadAttentionOptions(8, 8, 6, 4).num_kv_heads(2).mask_buffer(false));
  std::vector<std::string> mha_names{"num_heads", "num_kv_heads", "head_dim", "qk_norm", "qk_norm_eps", "alibi",
                                     "softcap",   "sinks",        "scale",    "kdim",    "vdim"};
  mha_names.insert(mha_names.end(), attention.begin(), attention.end());
  EXPECT_EQ(names(*mha), mha_names);
  EXPECT_EQ(mha->implied_causal_mask(), 6);
  EXPECT_EQ(mha->shape_hint("W_value.weight"), " (W_value projects to num_kv_heads * head_dim = 2 * 2 features)");
  EXPECT_EQ(mha->shape_hint("W_query.weight"), "");
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(4, 3, 6));
  std::vector<std::string> ca_names{"scale"};
  ca_names.insert(ca_names.end(), attention.begin(), attention.end());
  EXPECT_EQ(names(*ca), ca_names);
  EXPECT_EQ(ca->implied_causal_mask(), 0);  // it has its mask buffer
  torchattn::SelfAttentionV2 sa(torchattn::SelfAttentionV2Options(4, 3).scale(0.25));
  EXPECT_EQ(sa->checkpoint_options(), (torchattn::CheckpointOptions{{"scale", "0.25"}}));
  EXPECT_EQ(sa->implied_causal_mask(), 0);
}

// A checkpoint written before options were recorded (LibTorch's own Module::save)
// loads as it did.
TEST(Checkpoint, FilesWithoutOptionsLoadAsBefore) {
  const auto path = temp_path("no_options.pt");
  torch::manual_seed(46);
  torchattn::MultiHeadAttention saved(torchattn::MultiHeadAttentionOptions(8, 8, 6, 4));
  torch::serialize::OutputArchive archive;
  saved->torch::nn::Module::save(archive);  // tensors only
  archive.save_to(path);
  torchattn::MultiHeadAttention loaded(torchattn::MultiHeadAttentionOptions(8, 8, 6, 4));
  torch::load(loaded, path);
  auto x = torch::randn({2, 6, 8});
  EXPECT_TRUE(torch::equal(loaded(x), saved(x)));
  std::filesystem::remove(path);
}

// A model built from torchattn modules and LibTorch's own.
struct TinyModelImpl : torch::nn::Module {
  explicit TinyModelImpl(int64_t heads_of_block1) {
    embed = register_module("embed", torch::nn::Linear(8, 8));
    blocks = register_module("blocks", torch::nn::ModuleList());
    blocks->push_back(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(8, 8, 6, 4)));
    blocks->push_back(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(8, 8, 6, heads_of_block1)));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = embed(x);
    for (const auto& b : *blocks) h = h + b->as<torchattn::MultiHeadAttentionImpl>()->forward(h);
    return head(h);
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(TinyModel);

TEST(Checkpoint, WholeModelsNameTheKeyWithItsPath) {
  const auto path = temp_path("model.pt");
  torch::manual_seed(47);
  torch::save(TinyModel(4), path);

  // torch::load: the torchattn module names its path in the saved model.
  TinyModel eight(8);
  EXPECT_EQ(error_of([&] { torch::load(eight, path); }),
            "MultiHeadAttention: checkpoint of 'blocks.1' was saved with num_heads=4, this module has num_heads=8 "
            "(the tensors have the same shapes, but the numbers would differ)");

  // torchattn::load_state_dict on the whole tree: the same error, and nothing at all
  // changed, LibTorch's own submodules included.
  TinyModel eight_again(8);
  auto before = snapshot(*eight_again);
  EXPECT_EQ(error_of([&] { torchattn::load_state_dict(*eight_again, path); }),
            "load_state_dict: checkpoint of 'blocks.1' was saved with num_heads=4, this module has num_heads=8 "
            "(the tensors have the same shapes, but the numbers would differ)");
  expect_unchanged(*eight_again, before);

  // Missing and misshapen keys anywhere in the tree are named with their path.
  TinyModel four(4);
  four->blocks[0]->as<torchattn::MultiHeadAttentionImpl>()->W_query->weight.data().zero_();
  torch::save(four, path);
  TinyModel bigger_head(4);
  bigger_head->head = bigger_head->replace_module("head", torch::nn::Linear(8, 5));
  before = snapshot(*bigger_head);
  EXPECT_EQ(error_of([&] { torchattn::load_state_dict(*bigger_head, path); }),
            "load_state_dict: checkpoint key 'head.weight' has shape [3, 8], expected [5, 8]");
  expect_unchanged(*bigger_head, before);

  // And a matching model loads exactly.
  TinyModel same(4);
  torchattn::load_state_dict(*same, path);
  auto x = torch::randn({2, 5, 8});
  EXPECT_TRUE(torch::equal(same(x), four(x)));
  EXPECT_TRUE(
      torch::equal(same->blocks[0]->as<torchattn::MultiHeadAttentionImpl>()->W_query->weight, torch::zeros({8, 8})));
  std::filesystem::remove(path);
}

// torchattn::load_state_dict reads a torch::save archive of a torchattn module too,
// with the same strictness, and damaged archives are errors.
TEST(Checkpoint, LoadStateDictReadsTorchSaveArchives) {
  const auto path = temp_path("archive.pt");
  torch::manual_seed(48);
  torchattn::CausalAttention saved(torchattn::CausalAttentionOptions(4, 3, 6).qkv_bias(true));
  torch::save(saved, path);
  torchattn::CausalAttention loaded(torchattn::CausalAttentionOptions(4, 3, 6).qkv_bias(true));
  torchattn::load_state_dict(*loaded, path);
  auto x = torch::randn({1, 6, 4});
  EXPECT_TRUE(torch::equal(loaded(x), saved(x)));
  torchattn::CausalAttention no_bias(torchattn::CausalAttentionOptions(4, 3, 6));
  EXPECT_EQ(error_of([&] { torchattn::load_state_dict(*no_bias, path); }),
            "load_state_dict: checkpoint has unexpected key 'W_query.bias'");
  std::filesystem::remove(path);
}

// Each new option is recorded and checked; W_key of the wrong number of kv heads (or
// of another context width) is named with the option that explains its shape.
TEST(ModernAttention, CheckpointsRecordTheNewOptions) {
  const auto path = temp_path("modern_options.pt");
  const auto base =
      torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).num_kv_heads(2).rope(RoPEOptions(1e4)).window(4);
  torch::save(torchattn::MultiHeadAttention(base), path);
  torchattn::MultiHeadAttention same(base);
  torch::load(same, path);
  struct Case {
    torchattn::MultiHeadAttentionOptions options;
    std::string message;
  };
  const std::vector<Case> cases{
      {torchattn::MultiHeadAttentionOptions(base).window(6), "saved with window=4, this module has window=6"},
      {torchattn::MultiHeadAttentionOptions(base).window(std::nullopt),
       "saved with window=4, this module has window=none"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e5)),
       "saved with rope_theta=10000, this module has rope_theta=100000"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e4).interleaved(true)),
       "saved with rope_interleaved=false, this module has rope_interleaved=true"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e4).rotary_dim(2)),
       "saved with rope_rotary_dim=none, this module has rope_rotary_dim=2"},
      {torchattn::MultiHeadAttentionOptions(base).rope(std::nullopt),
       "saved with rope_theta=10000, this module has rope_theta=none"},
      {torchattn::MultiHeadAttentionOptions(base).window(std::nullopt).causal(false),
       "saved with causal=true, this module has causal=false"},
      {torchattn::MultiHeadAttentionOptions(base).head_dim(8), "saved with head_dim=4, this module has head_dim=8"},
  };
  for (const auto& c : cases) {
    torchattn::MultiHeadAttention m(c.options);
    EXPECT_NE(error_of([&] {
                torch::load(m, path);
              }).find("MultiHeadAttention: checkpoint of the module was " + c.message),
              std::string::npos)
        << c.message << "\n got: " << error_of([&] { torch::load(m, path); });
  }
  // Cross-attention's context widths: recorded as the widths W_key and W_value read
  // (d_in where unset, so an explicit kdim equal to d_in loads a file saved without one).
  const auto cross = torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false).kdim(12).vdim(8);
  torch::save(torchattn::MultiHeadAttention(cross), path);
  torchattn::MultiHeadAttention cross_kdim10(torchattn::MultiHeadAttentionOptions(cross).kdim(10));
  EXPECT_EQ(
      error_of([&] { torch::load(cross_kdim10, path); }),
      "MultiHeadAttention: checkpoint of the module was saved with kdim=12, this module has kdim=10 (the tensors' "
      "shapes differ with it)");
  torchattn::MultiHeadAttention cross_vdim(torchattn::MultiHeadAttentionOptions(cross).vdim(std::nullopt));
  EXPECT_EQ(error_of([&] { torch::load(cross_vdim, path); }),
            "MultiHeadAttention: checkpoint of the module was saved with vdim=8, this module has vdim=16 (the tensors' "
            "shapes differ with it)");
  torch::save(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false)), path);
  torchattn::MultiHeadAttention explicit_width(
      torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false).kdim(16));
  torch::load(explicit_width, path);
  torch::save(torchattn::MultiHeadAttention(base), path);
  // num_kv_heads changes W_key's shape: the recorded option names it first, and a file
  // without options (LibTorch's own Module::save; a Python state dict) explains the shape.
  torchattn::MultiHeadAttention one_kv_head(torchattn::MultiHeadAttentionOptions(base).num_kv_heads(1));
  EXPECT_NE(error_of([&] { torch::load(one_kv_head, path); })
                .find("MultiHeadAttention: checkpoint of the module was saved with num_kv_heads=2, this module has "
                      "num_kv_heads=1"),
            std::string::npos);
  torch::serialize::OutputArchive archive;
  torchattn::MultiHeadAttention(base)->torch::nn::Module::save(archive);
  archive.save_to(path);
  EXPECT_EQ(error_of([&] { torch::load(one_kv_head, path); }),
            "MultiHeadAttention: checkpoint key 'W_key.weight' has shape [8, 16], expected [4, 16] (W_key projects to "
            "num_kv_heads * head_dim = 1 * 4 features)");
  torchattn::save_state_dict(*torchattn::MultiHeadAttention(base), path);  // a Python-style dict: no options
  EXPECT_EQ(error_of([&] { torchattn::load_state_dict(*one_kv_head, path); }),
            "load_state_dict: key 'W_key.weight' has shape [8, 16] in '" + path +
                "', expected [4, 16] (W_key projects to num_kv_heads * head_dim = 1 * 4 features)");
  std::filesystem::remove(path);
}

}  // namespace
