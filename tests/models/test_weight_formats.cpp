// CausalLM::freeze_weights and LoadOptions::weight_format on small random decoders
// (tied and untied heads): the frozen model's logits equal those of a float32 model
// holding the format's rounded weights (int8: each group of 64 inputs times its
// scale), greedy decoding included; its memory shrinks; and what it refuses.

#include "common/expect_error.h"
#include "models/tiny_decoder.h"
#include "common/temp_path.h"

#include "kernels/cpu/quantized_linear.h"

#include <torchattn/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace models = torchattn::models;
using torchattn::WeightFormat;

models::CausalLM small_model(bool tied) {
  // down_proj: three groups of 64 inputs, the last short.
  const auto c = tiny_decoder_config({.intermediate = 130, .positions = 128, .tied = tied});
  torch::manual_seed(61);
  models::CausalLM model(c, 128);
  {
    torch::NoGradGuard no_grad;
    model->embed_tokens->weight.mul_(4);  // clear greedy choices
  }
  model->eval();
  return model;
}

// The weights a format keeps, as float32 (the definition in weight_format.h).
torch::Tensor rounded(const torch::Tensor& w, WeightFormat format) {
  if (format == WeightFormat::BFloat16) return w.to(torch::kBFloat16).to(torch::kFloat);
  const int64_t out = w.size(0), in = w.size(1), groups = (in + 63) / 64;
  const auto padded = torch::constant_pad_nd(w, {0, groups * 64 - in}).reshape({out, groups, 64});
  const auto scale = padded.abs().amax(2, true) / 127.0f;
  const auto q = torch::round(padded / torch::where(scale > 0, scale, torch::ones_like(scale))).clamp(-127, 127);
  return (q * scale).reshape({out, groups * 64}).narrow(1, 0, in);
}

class FrozenDecoder : public ::testing::TestWithParam<std::tuple<WeightFormat, bool>> {};

TEST_P(FrozenDecoder, EqualsTheFloatModelOfItsRoundedWeights) {
  const auto [format, tied] = GetParam();
  models::CausalLM frozen = small_model(tied), plain = small_model(tied);
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : plain->named_parameters()) {
      const std::string& name = item.key();
      // Every linear layer's weight, and a tied head's table (the embeddings with it).
      const bool linear = name.ends_with("proj.weight") || name.ends_with("W_query.weight") ||
                          name.ends_with("W_key.weight") || name.ends_with("W_value.weight") ||
                          name == "lm_head.weight" || (tied && name == "embed_tokens.weight");
      if (linear) item.value().copy_(rounded(item.value(), format));
    }
  }
  const int64_t before = frozen->weight_bytes();
  frozen->freeze_weights(format);
  EXPECT_EQ(frozen->weight_format(), format);
  EXPECT_LT(frozen->weight_bytes(), before * (format == WeightFormat::Int8 ? 0.45 : 0.6));
  torch::NoGradGuard no_grad;
  // int8's inputs are quantized too where int8 products pay (AVX-512 VNNI, AVX2), in any number of rows
  // (Int8Inputs::Quantized, exact to its definition in tests/kernels/test_int8_products.cpp):
  // within their rounding. Else the products of float32 inputs: within float32 sums.
  const bool quantized_inputs = format == WeightFormat::Int8 && torchattn::kernels::cpu::int8_products_auto();
  for (const int64_t length : {8, 20}) {  // 16 rows (the matrix-vector kernels), 40 (prefill's)
    const auto ids = torch::randint(0, 96, {2, length}, torch::kLong);
    const auto want = plain->forward(ids), got = frozen->forward(ids);
    const double error = ((got - want).abs().max() / want.abs().max()).item<double>();
    std::printf("[weight formats] %s, %ld rows: logits within %.2e of the float model's largest\n",
                std::string(torchattn::to_string(format)).c_str(), static_cast<long>(2 * length), error);
    EXPECT_LT(error, quantized_inputs ? 2e-2 : 1e-5) << 2 * length << " rows";
    if (quantized_inputs) {
      EXPECT_GT(error, 1e-5) << "the inputs of " << 2 * length << " rows were not quantized";
    }
  }
  // Greedy decoding through the caches (one row a step: the matrix-vector kernel), as
  // the float model's; with quantized inputs (their rounding moves this tiny model's
  // near ties), as the frozen model's own forwards over the whole sequence each step:
  // a row's int8 products are the same bits in a prefill and in a decoding step.
  const auto options = models::GenerationOptions().max_new_tokens(12).stop_at_eos(false);
  const std::vector<std::vector<int64_t>> prompts{{5, 17, 3, 40, 2}, {9, 9, 61}};
  const auto got = models::generate(*frozen, prompts, options);
  const auto want = models::generate(*plain, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!quantized_inputs) {
      EXPECT_EQ(got[i].ids, want[i].ids) << "prompt " << i;
      continue;
    }
    std::vector<int64_t> ids = prompts[i];
    for (int step = 0; step < 12; ++step) {
      const auto logits = frozen->forward(torch::tensor(ids, torch::kLong).unsqueeze(0));
      ids.push_back(logits[0][-1].argmax().item<int64_t>());
    }
    EXPECT_EQ(got[i].ids, std::vector<int64_t>(ids.begin() + static_cast<int64_t>(prompts[i].size()), ids.end()))
        << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FrozenDecoder,
                         ::testing::Combine(::testing::Values(WeightFormat::BFloat16, WeightFormat::Int8),
                                            ::testing::Bool()));

// A frozen model's frozen_state, through a safetensors file, into a model built afresh
// (other random weights): the same bits, so the same logits and greedy tokens.
TEST_P(FrozenDecoder, SavedFrozenStateLoadsIntoAFreshModelAsItWas) {
  const auto [format, tied] = GetParam();
  models::CausalLM saved = small_model(tied);
  saved->freeze_weights(format);
  const auto state = saved->frozen_state();
  // Every frozen weight in its format (int8 with its scales), the rest float32.
  int64_t frozen_weights = 0, scales = 0;
  for (const auto& [name, t] : state) {
    if (name.ends_with(torchattn::kFrozenScaleSuffix)) {
      ++scales;
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
    } else if (t.scalar_type() != torch::kFloat) {
      ++frozen_weights;
      EXPECT_EQ(t.scalar_type(), format == WeightFormat::Int8 ? torch::kChar : torch::kBFloat16) << name;
    }
  }
  EXPECT_EQ(frozen_weights, 2 * 7 + 1);  // two layers of q, k, v, o, gate, up, down; the head
  EXPECT_EQ(scales, format == WeightFormat::Int8 ? frozen_weights : 0);
  const auto path = temp_path(std::string("frozen_") + (tied ? "tied_" : "untied_") +
                              std::string(torchattn::to_string(format)) + ".safetensors");
  torchattn::save_safetensors(path, state);
  torch::manual_seed(1234);  // other weights: all must come from the file
  models::CausalLM loaded = small_model(tied);
  loaded->load_frozen_state(torchattn::load_safetensors(path), format);
  EXPECT_EQ(loaded->weight_format(), format);
  EXPECT_EQ(loaded->weight_bytes(), saved->weight_bytes());
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, 96, {2, 20}, torch::kLong);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), saved->forward(ids)));
  const auto options = models::GenerationOptions().max_new_tokens(12).stop_at_eos(false);
  const std::vector<std::vector<int64_t>> prompts{{5, 17, 3, 40, 2}, {9, 9, 61}};
  EXPECT_EQ(models::generate(*loaded, prompts, options)[0].ids, models::generate(*saved, prompts, options)[0].ids);
  std::filesystem::remove(path);
}

// What a damaged file, or another model's, does: an error naming the tensor, and the
// model unchanged (still float32, loadable).
TEST(FrozenDecoder, ABadFrozenStateIsAnErrorNamingTheTensor) {
  models::CausalLM saved = small_model(/*tied=*/false);
  saved->freeze_weights(WeightFormat::Int8);
  const auto state = saved->frozen_state();
  auto with = [&](const std::string& name, const torch::Tensor& t) {
    auto copy = state;
    for (auto& [n, v] : copy) {
      if (n == name) v = t;
    }
    return copy;
  };
  auto without = [&](const std::string& name) {
    auto copy = state;
    std::erase_if(copy, [&](const auto& item) { return item.first == name; });
    return copy;
  };
  const std::string scale = "layers.1.down_proj.weight_scale";
  auto get = [&](const std::string& name) {
    for (const auto& [n, v] : state) {
      if (n == name) return v;
    }
    return torch::Tensor();
  };
  models::CausalLM fresh = small_model(false);
  auto load = [&](const torchattn::NamedTensors& t, WeightFormat f = WeightFormat::Int8) {
    return error_of([&] { fresh->load_frozen_state(t, f); });
  };
  auto nan_scale = get(scale).clone();
  nan_scale[3][1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_HAS(load(with(scale, nan_scale)),
             "CausalLM: expected '" + scale +
                 "' as int8 quantization makes them (finite, in [0, 2.68e36] (the largest float32 / 127), 0 only "
                 "over a group of zero weights, and otherwise over a group whose largest |value| is 127, where "
                 "quantization puts each group's largest weight), got nan at row 3, group 1 (a damaged file?)");
  EXPECT_HAS(load(with(scale, -get(scale))), "got -");
  EXPECT_HAS(load(with(scale, -get(scale))), " at row 0, group 0 (a damaged file?)");
  // Finite but out of quantization's reach: past the largest float32 / 127, or 0 over
  // weights that are not all 0.
  auto huge_scale = get(scale).clone();
  huge_scale[5][2] = 1e37f;
  EXPECT_HAS(load(with(scale, huge_scale)), "got 1e+37 at row 5, group 2 (a damaged file?)");
  auto zero_scale = get(scale).clone();
  zero_scale[7][0] = 0.0f;
  EXPECT_HAS(load(with(scale, zero_scale)), "got 0 at row 7, group 0 (a damaged file?)");
  // Values that quantization cannot have made for their scale: a group whose largest
  // |value| is not 127 (its bytes halved, or zeroed but for a few).
  const std::string data = "layers.1.down_proj.weight";
  auto halved = get(data).clone();
  halved[6].narrow(0, 64, 64).div_(2, "trunc");
  const float kept = get(scale)[6][1].item<float>();
  EXPECT_HAS(load(with(data, halved)), "got " + c10::str(kept) + " at row 6, group 1 (a damaged file?)");
  // A zero scale over a group of zeros is what quantization makes of zero weights.
  auto zero_group = get("layers.1.down_proj.weight").clone();
  zero_group[7].narrow(0, 0, 64).zero_();
  auto both = with("layers.1.down_proj.weight", zero_group);
  for (auto& [n, v] : both) {
    if (n == scale) v = zero_scale;
  }
  EXPECT_EQ(error_of([&] { small_model(false)->load_frozen_state(both, WeightFormat::Int8); }), "(no error)");
  EXPECT_HAS(load(with(scale, get(scale).narrow(1, 0, 2))),
             "CausalLM: expected '" + scale +
                 "' float32 [48, 3] (a scale per group of 64 inputs), got [48, 2] of Float");
  EXPECT_HAS(load(without(scale)), "CausalLM: the frozen int8 weights have no '" + scale + "'");
  EXPECT_HAS(load(with("layers.0.self_attn.W_key.weight", get("layers.0.self_attn.W_query.weight"))),
             "CausalLM: expected the frozen 'layers.0.self_attn.W_key.weight' [16, 48] (the model's shape), got "
             "[48, 48] (weights of another model?)");
  EXPECT_HAS(load(with("norm.weight", torch::ones({64}))),
             "CausalLM: load_frozen_state: expected 'norm.weight' float32 [48], got Float [64] (weights of another "
             "model?)");
  auto extra = state;
  extra.emplace_back("layers.2.down_proj.weight", get("layers.1.down_proj.weight"));
  EXPECT_HAS(load(extra), "CausalLM: load_frozen_state: unexpected 'layers.2.down_proj.weight' [48, 130] (weights "
                          "of another model?)");
  EXPECT_HAS(load(state, WeightFormat::BFloat16),
             "CausalLM: expected the frozen 'layers.0.self_attn.W_query.weight' bfloat16 (the weight format asked "
             "for), got int8 weights (saved in another format?)");
  EXPECT_HAS(load(state, WeightFormat::Float32),
             "CausalLM: load_frozen_state takes bfloat16, int8 or int4 weights, got "
             "float32");
  // None of these changed the model: the good state still loads.
  EXPECT_EQ(fresh->weight_format(), WeightFormat::Float32);
  fresh->load_frozen_state(state, WeightFormat::Int8);
  EXPECT_HAS(load(state), "CausalLM: load_frozen_state needs a model not yet frozen");
  models::CausalLM plain = small_model(false);
  EXPECT_HAS(error_of([&] { plain->frozen_state(); }),
             "CausalLM: frozen_state needs freeze_weights first (the weights are float32)");
}

TEST(FrozenDecoder, RefusesWhatNeedsTheFloatWeights) {
  models::CausalLM model = small_model(/*tied=*/true);
  expect_error([&] { model->freeze_weights(WeightFormat::Float32); },
               "CausalLM: freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 weights, got float32");
  models::CausalLM bf16 = small_model(false);
  bf16->to(torch::kBFloat16);
  expect_error([&] { bf16->freeze_weights(WeightFormat::Int8); },
               "CausalLM: freeze_weights needs a float32 model on the CPU, got weights of BFloat16 on cpu");
  model->freeze_weights(WeightFormat::Int8);
  model->freeze_weights(WeightFormat::Int8);  // again: nothing to do
  expect_error([&] { model->freeze_weights(WeightFormat::BFloat16); },
               "CausalLM: freeze_weights: the weights are already int8, asked for bfloat16");
  expect_error([&] { model->load_hf_weights("model.safetensors"); },
               "CausalLM: load_hf_weights needs float32 weights to load into; freeze_weights (int8) freed them");
  expect_error(
      [&] { model->freeze_weights(static_cast<WeightFormat>(6)); },
      "CausalLM: freeze_weights: expected WeightFormat::Float32, BFloat16, Int8, DynamicInt8 or Int4, got the value 6");
  // A frozen model stays on the CPU in float32: a move elsewhere changes nothing.
  {
    torch::NoGradGuard no_grad;
    const auto ids = torch::tensor({{1, 2, 3}}, torch::kLong);
    const auto before = model->forward(ids);
    expect_error([&] { model->to(torch::kDouble); },
                 "CausalLM: to(Double): the model's weights are frozen in int8 (freeze_weights), which runs on the CPU "
                 "with float32 activations; load the model again without LoadOptions::weight_format to move it");
    expect_error([&] { model->to(torch::Device("cuda:0")); }, "CausalLM: to(cuda:0): the model's weights are frozen");
    expect_error([&] { model->to(torch::kCPU, torch::kHalf); }, "CausalLM: to(cpu, Half): the model's");
    model->to(torch::kCPU, torch::kFloat);  // where it is: fine
    EXPECT_TRUE(torch::equal(model->forward(ids), before)) << "a refused move changed the model";
  }
  // Training: the embeddings need a gradient, the frozen layers refuse it.
  expect_error([&] { model->forward(torch::tensor({{1, 2, 3}}, torch::kLong)); },
               "the layer keeps only its int8 weights, for inference: no gradient flows through them");
  // LoadOptions: checked before the folder is read.
  expect_error(
      [] {
        models::LanguageModel::from_pretrained(
            "no-such-folder", models::LoadOptions().dtype(torch::kBFloat16).weight_format(WeightFormat::Int8));
      },
      "LoadOptions::weight_format: int8 weights run on the CPU with float32 activations (device cpu, dtype "
      "float32), got device cpu and dtype BFloat16");
}

// PyTorch's scheme quantizes at load and keeps the tied table float32 (quantize_dynamic
// leaves nn.Embedding alone); its packed form is not saved.
TEST(FrozenDecoder, DynamicInt8KeepsTheTiedTableAndIsNotSaved) {
  models::CausalLM model = small_model(/*tied=*/true);
  const auto ids = torch::tensor({{1, 2, 3, 4}}, torch::kLong);
  torch::Tensor plain;
  {
    torch::NoGradGuard no_grad;
    plain = model->forward(ids);
  }
  const auto table = model->embed_tokens->weight.detach().clone();
  model->freeze_weights(WeightFormat::DynamicInt8);
  EXPECT_EQ(model->weight_format(), WeightFormat::DynamicInt8);
  EXPECT_TRUE(torch::equal(model->embed_tokens->weight, table));
  EXPECT_EQ(model->layers[0]->as<models::DecoderLayerImpl>()->gate_proj->weight.stride(0), 0);  // released
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids);
  // Quantized, and close: 8 bits of each weight and input.
  EXPECT_FALSE(torch::equal(logits, plain));
  EXPECT_LT((logits - plain).abs().max().item<double>(), 0.05 * plain.abs().max().item<double>());
  expect_error([&] { model->frozen_state(); },
               "CausalLM: frozen_state: dynamic-int8 weights live in the quantized engine's packed form and are not "
               "saved");
  models::CausalLM fresh = small_model(true);
  expect_error([&] { fresh->load_frozen_state({}, WeightFormat::DynamicInt8); },
               "CausalLM: load_frozen_state takes bfloat16, int8 or int4 weights, got dynamic-int8");
  expect_error([&] { models::CausalLM(fresh->config(), 16, WeightFormat::DynamicInt8); },
               "CausalLM: a model built for frozen weights takes bfloat16, int8 or int4 (load_frozen_state), got "
               "dynamic-int8");
}

// place_projections_together (what a move to a GPU does): every layer's q, k and v
// share one storage end to end, gate and up another; on the CPU the logits, the cached
// decoding and the parameters' names are what they were, bit for bit; a frozen model
// has no float32 weights to place and says so.
TEST(PlacedProjections, ShareStoragesAndChangeNoLogitOnTheCpu) {
  models::CausalLM model = small_model(/*tied=*/false);
  const auto ids = torch::tensor({{5, 9, 17, 3, 40, 2}}, torch::kLong);
  torch::NoGradGuard no_grad;
  const auto before = model->forward(ids);
  auto caches = model->make_kv_caches(1);
  model->forward(ids.narrow(1, 0, 5), &caches);
  const auto step_before = model->forward(ids.narrow(1, 5, 1), &caches);
  const auto names = model->named_parameters().keys();

  model->place_projections_together();
  for (const auto& layer : *model->layers) {
    auto* l = layer->as<models::DecoderLayerImpl>();
    EXPECT_TRUE(torchattn::placed_together(
        {l->self_attn->W_query.get(), l->self_attn->W_key.get(), l->self_attn->W_value.get()}));
    EXPECT_TRUE(torchattn::placed_together({l->gate_proj.get(), l->up_proj.get()}));
  }
  EXPECT_TRUE(torch::equal(model->forward(ids), before));
  caches = model->make_kv_caches(1);
  model->forward(ids.narrow(1, 0, 5), &caches);
  EXPECT_TRUE(torch::equal(model->forward(ids.narrow(1, 5, 1), &caches), step_before));
  EXPECT_EQ(model->named_parameters().keys(), names);

  models::CausalLM frozen = small_model(false);
  frozen->freeze_weights(WeightFormat::BFloat16);
  expect_error([&] { frozen->place_projections_together(); },
               "place_together: layer 0 has no weights of its own (frozen, or built for loading and not loaded)");
}

}  // namespace
