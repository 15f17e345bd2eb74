// The encoder-decoder model type (Seq2SeqLM, model_type bart) against transformers'
// BartForConditionalGeneration: tests/reference/make_generate_reference.py writes tiny random
// BART checkpoints and what transformers computes with them into
// $TORCHATTN_GENERATE_REFERENCE/tiny_seq2seq (ctest -R generate runs both).
//
// - a teacher-forced decoding's logits within 1e-4 (relative to the largest) in
//   float32, 1e-12 in float64 (against transformers in float64), whole and in steps;
// - greedy generate: 32 tokens of each prompt alone and of both in one right-padded
//   batch, equal to transformers' generate; with the config's EOS and forced BOS/EOS
//   tokens, 12 tokens equal;
// - training: a padded batch's cross-entropy and the gradient of every parameter, in
//   float64, equal to transformers' within 1e-10;
// - cached decoding (KVCache per layer, the encoder's keys and values computed once)
//   equal to recomputing the decoder, and a padded row equal to its prompt alone;
// - config, weights and generate errors naming what is wrong.

#include <torchattn/models.h>

#include <torchattn/safetensors.h>

#include "common/reference_io.h"

#include "common/expect_error.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
namespace models = torchattn::models;
using torchattn::testing::relative_error;
using torchattn::testing::to_ids;

namespace {

fs::path reference() {
  const char* v = std::getenv("TORCHATTN_GENERATE_REFERENCE");
  return fs::path(v == nullptr ? "" : v) / "tiny_seq2seq";
}

c10::impl::GenericDict expected_of(const fs::path& dir) {
  return torchattn::testing::read_pickle(dir / "expected.pt", "ctest -R generate");
}

models::Seq2SeqLM load_model(const fs::path& dir) {
  models::Seq2SeqLM model(models::read_bart_config((dir / "config.json").string()));
  model->load_hf_weights(dir.string());
  model->eval();
  return model;
}

std::vector<std::string> tiny_models() {
  std::vector<std::string> out;
  if (fs::is_directory(reference())) {
    for (const auto& e : fs::directory_iterator(reference())) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TinySeq2Seq : public ::testing::TestWithParam<std::string> {
 protected:
  fs::path dir() const { return reference() / GetParam(); }
};

TEST_P(TinySeq2Seq, TeacherForcedLogitsAreTransformers) {
  const auto expected = expected_of(dir());
  auto model = load_model(dir());
  const auto prompt = expected.at("prompt0").toTensor().unsqueeze(0);
  const auto decoder_ids = expected.at("decoder_ids").toTensor().unsqueeze(0);
  const auto want = expected.at("logits").toTensor();
  c10::InferenceMode inference;
  const double err = relative_error(model->forward(prompt, {}, decoder_ids)[0], want);
  std::printf("[seq2seq] %s: teacher-forced logits error %.2e relative to the largest\n", GetParam().c_str(), err);
  EXPECT_LE(err, 1e-4);
  // float64 against transformers' float64 (this random model's float32 rounding alone is 1e-5).
  model->to(torch::kFloat64);
  const auto want64 = expected.at("logits64").toTensor();
  const double err64 = relative_error(model->forward(prompt, {}, decoder_ids)[0], want64);
  std::printf("[seq2seq] %s: float64 %.2e\n", GetParam().c_str(), err64);
  EXPECT_LE(err64, 1e-12);
  // The same in steps: the first token, then the rest after it in the caches (their
  // positions counted from the cache's length).
  const auto out = model->encode(prompt);
  auto context = model->cross_kvs(out);
  auto caches = model->make_kv_caches(1);
  model->decode(decoder_ids.narrow(1, 0, 1), context, &caches);
  const auto rest = model->decode(decoder_ids.narrow(1, 1, decoder_ids.size(1) - 1), context, &caches)[0];
  EXPECT_LE(relative_error(rest, want64.narrow(0, 1, want64.size(0) - 1)), 1e-12);
}

TEST_P(TinySeq2Seq, GreedyTokensAreTransformersAloneAndInAPaddedBatch) {
  const auto expected = expected_of(dir());
  auto model = load_model(dir());
  const std::vector<std::vector<int64_t>> prompts{to_ids(expected.at("prompt0").toTensor()),
                                                  to_ids(expected.at("prompt1").toTensor())};
  const auto options = models::GenerationOptions().max_new_tokens(32).stop_at_eos(false).forced_tokens(false);
  const auto batch_tokens = expected.at("batch_tokens").toTensor();
  const auto batch = models::generate(*model, prompts, options);
  ASSERT_EQ(batch.size(), 2u);
  for (size_t b = 0; b < prompts.size(); ++b) {
    SCOPED_TRACE("prompt " + std::to_string(b));
    const auto alone = models::generate(*model, {prompts[b]}, options)[0];
    EXPECT_EQ(alone.ids, to_ids(expected.at("tokens" + std::to_string(b)).toTensor()));
    EXPECT_EQ(batch[b].ids, to_ids(batch_tokens[static_cast<int64_t>(b)]));
    EXPECT_EQ(batch[b].prompt_tokens, static_cast<int64_t>(prompts[b].size()));
    EXPECT_FALSE(batch[b].stopped);
  }
}

TEST_P(TinySeq2Seq, TheConfigsEosAndForcedTokensAreTransformers) {
  const auto expected = expected_of(dir());
  auto model = load_model(dir());
  EXPECT_EQ(model->config().forced_eos_token_id, 2);
  EXPECT_EQ(model->config().forced_bos_token_id.has_value(), GetParam() == "bart_relu_scaled")
      << "generation_config.json's forced_bos_token_id";
  for (const int b : {0, 1}) {
    SCOPED_TRACE("prompt " + std::to_string(b));
    std::vector<int64_t> streamed;
    const auto out = models::generate(*model, {to_ids(expected.at("prompt" + std::to_string(b)).toTensor())},
                                      models::GenerationOptions().max_new_tokens(12).on_token(
                                          [&](size_t, int64_t id) { streamed.push_back(id); }))[0];
    EXPECT_EQ(out.ids, to_ids(expected.at("short" + std::to_string(b)).toTensor()));
    EXPECT_EQ(out.ids, streamed);
    EXPECT_TRUE(out.stopped);  // at the EOS, forced as the last token where no other came
  }
}

TEST_P(TinySeq2Seq, CachedDecodingEqualsRecomputingAndAPaddedRowEqualsItsPromptAlone) {
  auto model = load_model(dir());
  c10::InferenceMode inference;
  torch::manual_seed(5);
  const int64_t V = model->config().vocab_size;
  const auto ids = torch::randint(3, V, {2, 9});
  const auto pad = torch::zeros({2, 9}, torch::kBool);
  pad[1].narrow(0, 5, 4).fill_(true);  // the second prompt has 5 tokens, padded on the right
  const auto decoder_ids = torch::randint(3, V, {2, 12});
  const auto full = model->forward(ids, pad, decoder_ids);
  const auto context = model->cross_kvs(model->encode(ids, pad), pad);
  auto caches = model->make_kv_caches(2);
  std::vector<torch::Tensor> parts{model->decode(decoder_ids.narrow(1, 0, 4), context, &caches)};
  for (int64_t t = 4; t < 12; ++t) parts.push_back(model->decode(decoder_ids.narrow(1, t, 1), context, &caches));
  EXPECT_LE(relative_error(torch::cat(parts, 1), full), 1e-5);
  EXPECT_EQ(caches.front().length(), 12);
  const auto alone = model->forward(ids.narrow(0, 1, 1).narrow(1, 0, 5), {}, decoder_ids.narrow(0, 1, 1));
  // Within this random model's float32 rounding (1e-5, above): the padded batch's
  // attention takes the decode kernel (key masks), the prompt alone flex's kernels, sums
  // in another order.
  EXPECT_LE(relative_error(full.narrow(0, 1, 1), alone), 2e-5);
  // The padding matters: without the mask the second row's logits differ.
  EXPECT_GT(relative_error(model->forward(ids, {}, decoder_ids).narrow(0, 1, 1), alone), 1e-3);
}

// This module's parameter name -> transformers' ("encoder.layers.0.self_attn.W_query.weight"
// -> "model.encoder.layers.0.self_attn.q_proj.weight").
std::string hf_name(std::string name) {
  for (const auto& [ours, theirs] :
       {std::pair<std::string, std::string>{"W_query", "q_proj"}, {"W_key", "k_proj"}, {"W_value", "v_proj"}}) {
    if (const auto at = name.find("." + ours + "."); at != std::string::npos) name.replace(at + 1, ours.size(), theirs);
  }
  return "model." + name;
}

TEST_P(TinySeq2Seq, TrainingLossAndTheGradientOfEveryParameterAreTransformers) {
  const auto expected = expected_of(dir());
  auto model = load_model(dir());
  model->to(torch::kFloat64);
  const auto padding = expected.at("train.mask").toTensor().eq(0);  // transformers' attention_mask: 1 = a token
  const auto logits = model->forward(expected.at("train.batch").toTensor(), padding,
                                     expected.at("train.decoder_ids").toTensor());
  const auto loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1),
                                                         expected.at("train.labels").toTensor().flatten());
  EXPECT_NEAR(loss.item<double>(), expected.at("train.loss").toTensor().item<double>(), 1e-12);
  loss.backward();
  size_t theirs = 0;
  for (const auto& e : expected) theirs += e.key().toStringRef().rfind("grad.", 0) == 0;
  size_t compared = 0;
  double worst = 0.0;
  for (const auto& p : model->named_parameters()) {
    const std::string key = "grad." + hf_name(p.key());
    ASSERT_TRUE(expected.contains(key)) << key;
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const auto want = expected.at(key).toTensor();
    // W_key's bias adds the same to every score of a row: its gradient is zero up to
    // rounding (1e-17 on both sides), compared absolutely.
    const bool zero = want.abs().max().item<double>() < 1e-12;
    const double err = zero ? p.value().grad().abs().max().item<double>() : relative_error(p.value().grad(), want);
    EXPECT_LE(err, zero ? 1e-12 : 1e-10) << p.key();
    worst = std::max(worst, err);
    ++compared;
  }
  EXPECT_EQ(compared, theirs);
  std::printf("[seq2seq] %s: %zu parameters' gradients, largest error %.2e relative\n", GetParam().c_str(), compared,
              worst);
}

INSTANTIATE_TEST_SUITE_P(Generate, TinySeq2Seq, ::testing::ValuesIn(tiny_models()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Seq2SeqReference, IsPresent) {
  ASSERT_EQ(tiny_models().size(), 2u) << "no reference in '" << reference().string()
                                      << "' (ctest -R generate makes it)";
}

// ---- errors ----

// A folder holding a copy of the tiny folder `name`'s config.json with `edits` made
// (key, JSON value; an empty value removes the key), and `generation_config` as its
// generation_config.json when not empty. Removed when it goes out of scope.
struct EditedConfig {
  fs::path dir;
  EditedConfig(const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits,
               const std::string& generation_config = "") {
    static int count = 0;
    dir = fs::temp_directory_path() /
          ("torchattn_seq2seq_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    fs::create_directories(dir);
    std::ifstream in(reference() / name / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& [key, value] : edits) {
      const std::string quoted = "\"" + key + "\"";
      if (const auto at = text.find(quoted); at != std::string::npos) {
        const auto end = text.find_first_of(",\n}", text.find(':', at));
        text.erase(at, end - at + (text[end] == ',' ? 1 : 0));
      }
      if (!value.empty()) text.insert(text.find('{') + 1, "\n  " + quoted + ": " + value + ",");
    }
    std::ofstream(dir / "config.json") << text;
    if (!generation_config.empty()) std::ofstream(dir / "generation_config.json") << generation_config;
  }
  ~EditedConfig() { fs::remove_all(dir); }
  std::string config() const { return (dir / "config.json").string(); }
};

TEST(Seq2SeqErrors, ConfigsThisLibraryCannotRunAreErrorsNamingTheField) {
  const auto read = [](const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits,
                       const std::string& generation = "") {
    const EditedConfig e(name, edits, generation);
    return error_of([&] { models::read_bart_config(e.config()); });
  };
  EXPECT_HAS(read("bart_gelu", {{"tie_word_embeddings", "false"}}), "tie_word_embeddings false is not supported");
  EXPECT_HAS(read("bart_gelu", {{"activation_function", "\"swish\""}}),
             "activation_function 'swish' is not supported (gelu or relu)");
  EXPECT_HAS(read("bart_gelu", {{"normalize_before", "true"}}), "normalize_before: pre-norm layers");
  EXPECT_HAS(read("bart_gelu", {{"d_model", "0"}}), "expected a positive integer d_model");
  EXPECT_HAS(read("bart_gelu", {{"decoder_start_token_id", ""}, {"bos_token_id", ""}}),
             "expected a decoder_start_token_id or a bos_token_id (the decoder's first input)");
  EXPECT_HAS(read("bart_gelu", {{"decoder_start_token_id", "500"}}),
             "expected decoder_start_token_id to be a token id in [0, vocab_size 211), got 500");
  EXPECT_HAS(read("bart_gelu", {{"eos_token_id", "\"2\""}}),
             "expected eos_token_id to be token ids in [0, vocab_size 211), got \"2\"");
  EXPECT_HAS(read("bart_gelu", {{"model_type", "\"t5\""}}),
             "model_type 't5' is not an encoder-decoder this library runs; supported: llama, qwen2, qwen3, mistral, "
             "gemma2 (decoders); bert (encoders); bart (encoder-decoders)");
  // generation_config.json's errors name it.
  const std::string bad = read("bart_gelu", {}, R"({"decoder_start_token_id": 2, "eos_token_id": [2, null]})");
  EXPECT_HAS(bad,
             "generation_config.json': expected eos_token_id to be token ids in [0, vocab_size 211), got [2,null]");
  // A bart folder given to LanguageModel says where it goes.
  EXPECT_HAS(error_of([] { models::LanguageModel::from_pretrained((reference() / "bart_gelu").string()); }),
             "holds a bart model; LanguageModel runs llama, qwen2, qwen3, mistral and gemma2 (load a bart folder with "
             "Seq2SeqLM and read_bart_config)");
  models::BartConfig c = models::read_bart_config((reference() / "bart_gelu" / "config.json").string());
  c.decoder_layers = 0;
  EXPECT_HAS(error_of([&] { models::Seq2SeqLM m(c); }), "Seq2SeqLM: expected decoder_layers >= 1, got 0");
  c.decoder_layers = 1;
  c.forced_eos_token_id = 211;
  EXPECT_HAS(error_of([&] { models::Seq2SeqLM m(c); }),
             "Seq2SeqLM: expected forced_eos_token_id in [0, vocab_size 211), got 211");
}

// generate's settings as transformers reads them: generation_config.json alone where the
// folder has one (a field it lacks is none), else config.json; the decoder starts with
// bos_token_id where no decoder_start_token_id is given.
TEST(Seq2SeqConfig, GenerationSettingsComeFromGenerationConfigAloneWhereThereIsOne) {
  const auto from_config = models::read_bart_config(EditedConfig("bart_relu_scaled", {}).config());
  EXPECT_EQ(from_config.decoder_start_token_id, 2);
  EXPECT_EQ(from_config.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(from_config.forced_eos_token_id, 2);
  EXPECT_FALSE(from_config.forced_bos_token_id.has_value());  // transformers 5 keeps it in generation_config.json
  const auto from_folder = models::read_bart_config((reference() / "bart_relu_scaled" / "config.json").string());
  EXPECT_EQ(from_folder.forced_bos_token_id, 0);
  const EditedConfig own("bart_relu_scaled", {}, R"({"bos_token_id": 5, "eos_token_id": [3, 4]})");
  const auto from_generation = models::read_bart_config(own.config());
  EXPECT_EQ(from_generation.decoder_start_token_id, 5);
  EXPECT_EQ(from_generation.eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(from_generation.forced_eos_token_id.has_value());
  EXPECT_FALSE(from_generation.forced_bos_token_id.has_value());
  EXPECT_EQ(models::read_bart_config(EditedConfig("bart_gelu", {{"decoder_start_token_id", ""}}).config())
                .decoder_start_token_id,
            0);  // bos_token_id
}

TEST(Seq2SeqErrors, WeightsAndInputsOutsideTheModelAreErrorsNamingThem) {
  const auto dir = reference() / "bart_gelu";
  auto model = load_model(dir);
  auto tensors = torchattn::load_safetensors((dir / "model.safetensors").string());
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const auto& p) {
                                 return p.first == "model.decoder.layers.1.encoder_attn.k_proj.bias";
                               }),
                tensors.end());
  models::Seq2SeqLM fresh(model->config());
  EXPECT_HAS(error_of([&] { models::load_weights(*fresh, tensors, fresh->hf_weights(), "model.safetensors"); }),
             "model.safetensors has no tensor for 'decoder.layers.1.encoder_attn.W_key.bias' (shape [64])");

  const auto gen = [&](const std::vector<std::vector<int64_t>>& prompts, const models::GenerationOptions& o) {
    return error_of([&] { models::generate(*model, prompts, o); });
  };
  const models::GenerationOptions o;
  EXPECT_HAS(gen({}, o), "generate: expected at least one prompt, got none");
  EXPECT_HAS(gen({{5, 6}, {}}, o), "generate: prompt 1 has no tokens");
  EXPECT_HAS(gen({{5, 211}}, o), "generate: prompt 0 has token id 211, outside the vocabulary [0, 211)");
  EXPECT_HAS(gen({std::vector<int64_t>(65, 5)}, o),
             "generate: prompt 0 has 65 tokens; the encoder's max_position_embeddings is 64");
  EXPECT_HAS(gen({{5}}, models::GenerationOptions().max_new_tokens(65)),
             "generate: expected max_new_tokens in [1, 64] (the decoder's max_position_embeddings), got 65");

  c10::InferenceMode inference;
  const auto ids = torch::randint(3, 211, {2, 4});
  const auto context = model->cross_kvs(model->encode(ids));
  EXPECT_HAS(error_of([&] { model->encode(ids.to(torch::kInt)); }),
             "Seq2SeqLM: expected ids as int64 [B, T], got [2, 4] of Int");
  EXPECT_HAS(error_of([&] { model->encode(ids, torch::zeros({2, 5}, torch::kBool)); }),
             "Seq2SeqLM: expected key_padding_mask [2, 4] as ids, got [2, 5]");
  EXPECT_HAS(error_of([&] { model->decode(ids, {context.front()}); }),
             "Seq2SeqLM: expected the cross keys and values of 2 decoder layers (cross_kvs), got 1");
  EXPECT_HAS(error_of([&] { model->decode(ids.narrow(0, 0, 1), context); }),
             "Seq2SeqLM: decoder_ids have 1 rows; the encoder's output has 2");
  auto caches = model->make_kv_caches(2);
  model->decode(torch::randint(3, 211, {2, 62}), context, &caches);
  EXPECT_HAS(error_of([&] { model->decode(ids.narrow(1, 0, 3), context, &caches); }),
             "Seq2SeqLM: decoder_ids reach position 65; the model has positions for 1 to 64 tokens");
}

}  // namespace
