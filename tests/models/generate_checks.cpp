// torchattn_generate's decoder, tokenizer and chat template against transformers
// (tests/reference/make_generate_reference.py writes the reference into the folder that
// TORCHATTN_GENERATE_REFERENCE names; TORCHATTN_SMOLLM2 names the converted
// SmolLM2 folder; ctest -R generate sets both).
//
// - tiny random Llama (one with heads of their own size), Qwen2, Qwen3, Mistral and Gemma 2 checkpoints: prompt logits
// within 1e-4
//   (relative to the largest), 32 greedy tokens equal, cached decoding equal to
//   recomputing the whole sequence;
// - the tokenizers: every line of the fortunes text, ids and decoded text equal
//   (SmolLM2's, and a Qwen2-style one trained on the text);
// - SmolLM2-135M-Instruct: the chat prompt's ids, its logits within 1e-4, and 48
//   greedy tokens equal to transformers' generate; where transformers' own top two
//   logits differ by less than 1e-4 the comparison stops there, and says so;
// - a missing or misshapen weight is an error naming the key.

#include <torchattn/models.h>

#include <torchattn/gguf.h>
#include <torchattn/safetensors.h>

#include "common/expect_error.h"
#include "common/model_folder_copy.h"
#include "common/reference_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

fs::path reference() { return env("TORCHATTN_GENERATE_REFERENCE"); }
fs::path smollm2() { return env("TORCHATTN_SMOLLM2"); }

c10::impl::GenericDict read_pickle(const fs::path& path) {
  return torchattn::testing::read_pickle(path, "ctest -R generate");
}

using torchattn::testing::relative_error;
using torchattn::testing::to_ids;

// How many of a reference's greedy tokens must match: those before the first step whose
// top two logits are within 1e-4 (a near tie, where float sums may choose either).
size_t before_a_near_tie(const at::Tensor& margins) {
  for (int64_t s = 0; s < margins.size(0); ++s) {
    if (margins[s].item<double>() < 1e-4) return static_cast<size_t>(s);
  }
  return static_cast<size_t>(margins.size(0));
}

namespace models = torchattn::models;

models::CausalLM load_model(const fs::path& dir, int64_t context = 0) {
  const auto config = models::read_decoder_config((dir / "config.json").string());
  models::CausalLM model(config, context > 0 ? context : config.max_position_embeddings);
  model->load_hf_weights((dir / "model.safetensors").string());
  model->eval();
  return model;
}

// Greedy ids of `prompt` through the generation loop (the CLI's), up to n tokens.
std::vector<int64_t> greedy(models::CausalLMImpl& model, const std::vector<int64_t>& prompt, int64_t n,
                            const std::vector<int64_t>& stop) {
  return models::generate(model, {prompt},
                          models::GenerationOptions().max_new_tokens(n).stop_token_ids(stop).stop_at_eos(false))[0]
      .ids;
}

// ---- tiny random models of each type ----

std::vector<std::string> tiny_models() {
  std::vector<std::string> out;
  const auto dir = reference() / "tiny";
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TinyModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyModel, LogitsAndGreedyTokensAreTransformers) {
  const auto dir = reference() / "tiny" / GetParam();
  const auto expected = read_pickle(dir / "expected.pt");
  auto model = load_model(dir);
  const auto prompt = expected.at("prompt").toTensor();
  c10::InferenceMode inference;
  const auto logits = model->forward(prompt.unsqueeze(0))[0];
  const double err = relative_error(logits, expected.at("logits").toTensor());
  std::printf("[generate] %s: prompt logits error %.2e relative to the largest\n", GetParam().c_str(), err);
  EXPECT_LE(err, 1e-4);
  const auto tokens = greedy(*model, to_ids(prompt), 32, {});
  EXPECT_EQ(tokens, to_ids(expected.at("tokens").toTensor()));
}

// Documents packed end to end: logits and next-token loss against transformers'
// padding-free form (position_ids restarting per document, no attention mask), and
// each document's rows against forward on it alone (float32: products of other row
// counts may sum in another order).
TEST_P(TinyModel, PackedDocumentsAreTransformersPaddingFree) {
  const auto dir = reference() / "tiny" / GetParam();
  const auto expected = read_pickle(dir / "expected.pt");
  auto model = load_model(dir);
  const auto ids = expected.at("packed_ids").toTensor();
  const auto cu = expected.at("packed_cu_seqlens").toTensor();
  c10::InferenceMode inference;
  const auto logits = model->forward_packed(ids, cu.to(torch::kInt));
  const double err = relative_error(logits, expected.at("packed_logits").toTensor());
  const auto loss = models::packed_next_token_loss(logits, ids, cu);
  const double want = expected.at("packed_loss").toTensor().item<double>();
  std::printf("[generate] %s: packed logits error %.2e, loss %.6f (transformers %.6f)\n", GetParam().c_str(), err,
              loss.item<double>(), want);
  EXPECT_LE(err, 1e-5);
  EXPECT_NEAR(loss.item<double>(), want, 1e-5 * want);
  for (int64_t s = 0; s + 1 < cu.size(0); ++s) {
    const int64_t a = cu[s].item<int64_t>(), b = cu[s + 1].item<int64_t>();
    const auto alone = model->forward(ids.slice(0, a, b).unsqueeze(0))[0];
    EXPECT_LE(relative_error(logits.slice(0, a, b), alone), 1e-5) << "document " << s;  // float32 sums
  }
}

TEST_P(TinyModel, CachedDecodingEqualsRecomputing) {
  auto model = load_model(reference() / "tiny" / GetParam());
  c10::InferenceMode inference;
  const auto ids = torch::randint(3, model->config().vocab_size, {2, 16});
  const auto full = model->forward(ids);
  auto caches = model->make_kv_caches(2);
  std::vector<torch::Tensor> parts{model->forward(ids.narrow(1, 0, 5), &caches)};
  for (int64_t t = 5; t < 16; ++t) parts.push_back(model->forward(ids.narrow(1, t, 1), &caches));
  EXPECT_LE(relative_error(torch::cat(parts, 1), full), 1e-5);
}

TEST_P(TinyModel, EachPromptOfABatchGetsTheTokensItGetsAlone) {
  auto model = load_model(reference() / "tiny" / GetParam(), 64);
  torch::manual_seed(11);
  std::vector<std::vector<int64_t>> prompts;
  for (const int64_t n : {5, 11, 1, 8}) prompts.push_back(to_ids(torch::randint(3, model->config().vocab_size, {n})));
  const auto greedy_options = models::GenerationOptions().max_new_tokens(12).stop_at_eos(false);
  const auto sampled_options =
      models::GenerationOptions(greedy_options).do_sample(true).temperature(0.9).top_k(20).seed(7);
  for (const auto& options : {greedy_options, sampled_options}) {
    SCOPED_TRACE(options.do_sample() ? "sampled" : "greedy");
    std::vector<std::vector<int64_t>> streamed(prompts.size());
    auto with_stream = options;
    with_stream.on_token([&](size_t b, int64_t id) { streamed.at(b).push_back(id); });
    const auto batch = models::generate(*model, prompts, with_stream);
    ASSERT_EQ(batch.size(), prompts.size());
    for (size_t b = 0; b < prompts.size(); ++b) {
      const auto alone = models::generate(*model, {prompts[b]}, options)[0];
      EXPECT_EQ(batch[b].ids, alone.ids) << "prompt " << b;
      EXPECT_EQ(batch[b].ids, streamed[b]);
      EXPECT_EQ(batch[b].prompt_tokens, static_cast<int64_t>(prompts[b].size()));
      EXPECT_EQ(batch[b].ids.size(), 12u);
    }
  }
}

// WeightFormat::DynamicInt8: the logits of the model quantize_dynamic'd in Python (every
// nn.Linear, the tied head too; the embeddings float32).
TEST_P(TinyModel, DynamicInt8IsTheModelQuantizeDynamicd) {
  const auto dir = reference() / "tiny" / GetParam();
  const auto expected = read_pickle(dir / "expected.pt");
  auto model = load_model(dir);
  model->freeze_weights(torchattn::WeightFormat::DynamicInt8);
  const auto prompt = expected.at("prompt").toTensor();
  c10::InferenceMode inference;
  const auto logits = model->forward(prompt.unsqueeze(0))[0];
  const double err = relative_error(logits, expected.at("dynamic_int8_logits").toTensor());
  const double from_float = relative_error(logits, expected.at("logits").toTensor());
  std::printf("[generate] %s: dynamic-int8 logits error %.2e relative to quantize_dynamic's (%.2e to float32's)\n",
              GetParam().c_str(), err, from_float);
  EXPECT_LE(err, 1e-5);
  EXPECT_GT(from_float, 1e-4);  // the quantization shows: not float32's numbers
}

TEST_P(TinyModel, PackedWeightsGiveTheLogitsAndTokensOfTheLayersOwnProducts) {
  const auto dir = reference() / "tiny" / GetParam();
  const auto expected = read_pickle(dir / "expected.pt");
  auto model = load_model(dir);
  const auto prompt = expected.at("prompt").toTensor();
  c10::InferenceMode inference;
  const auto plain = model->forward(prompt.unsqueeze(0))[0];
  for (const int64_t min_rows : {1, 2}) {
    SCOPED_TRACE("min_rows " + std::to_string(min_rows));
    model->pack_weights(true, min_rows);
    EXPECT_TRUE(model->packs_weights());
    EXPECT_LE(relative_error(model->forward(prompt.unsqueeze(0))[0], plain), 1e-5);
    EXPECT_EQ(greedy(*model, to_ids(prompt), 32, {}), to_ids(expected.at("tokens").toTensor()));
  }
  // With min_rows 1 every product is packed, and the paged attention is torchattn's CPU
  // kernel: a sequence's logits are the same bits alone or beside another one in a step
  // (what the serving engine relies on). The contiguous forward's attention is ATen's,
  // whose kernels are not batch-invariant on every CPU (head_dim 8 on an AMD EPYC
  // differs in the last bit): there, within rounding.
  const auto ids = torch::randint(3, model->config().vocab_size, {2, 9});
  auto paged = [&](const std::vector<int64_t>& rows) {
    auto cache = model->make_paged_kv_cache(torchattn::PagedKVCacheOptions(8).block_size(4));
    std::vector<torchattn::StepTokens> tokens;
    for ([[maybe_unused]] const int64_t row : rows) tokens.push_back({cache.add_sequence(), 9});
    const auto step = cache.begin_step(tokens);
    return model->forward_paged(ids.index_select(0, torch::tensor(rows)).reshape({-1}), cache, step);
  };
  const auto both = paged({0, 1}), alone = paged({1});
  ASSERT_EQ(both.sizes(), (std::vector<int64_t>{18, model->config().vocab_size}));
  EXPECT_TRUE(torch::equal(both.narrow(0, 9, 9), alone));
  EXPECT_LE(relative_error(alone, model->forward(ids.narrow(0, 1, 1))[0]), 1e-5);
  EXPECT_LE(relative_error(model->forward(ids)[1], model->forward(ids.narrow(0, 1, 1))[0]), 1e-6);
  model->pack_weights(false);
  EXPECT_TRUE(torch::equal(model->forward(prompt.unsqueeze(0))[0], plain));
}

// Continuous batching over the paged cache (its CPU kernel: windows, softcap, ...):
// the prompt beside two others, prefilled in chunks of 5 that share steps with the
// others' decoding, gets transformers' greedy tokens.
TEST_P(TinyModel, TheEngineGivesTransformersTokensBesideOtherRequests) {
  const auto dir = reference() / "tiny" / GetParam();
  const auto expected = read_pickle(dir / "expected.pt");
  models::Engine engine(load_model(dir),
                        models::EngineOptions().kv_tokens(512).block_size(4).prefill_chunk(5).max_prefill_tokens(8));
  const auto prompt = to_ids(expected.at("prompt").toTensor());
  const std::vector<int64_t> other_a(prompt.rbegin(), prompt.rend()), other_b(prompt.begin(), prompt.begin() + 3);
  const auto results = engine.generate({other_a, prompt, other_b},
                                       models::GenerationOptions().max_new_tokens(32).stop_at_eos(false));
  EXPECT_EQ(results[1].ids, to_ids(expected.at("tokens").toTensor()));
  EXPECT_GT(engine.stats().steps, 32);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Generate, TinyModel, ::testing::ValuesIn(tiny_models()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(GenerateReference, IsPresent) {
  ASSERT_EQ(tiny_models().size(), 7u) << "no reference in TORCHATTN_GENERATE_REFERENCE='" << reference().string()
                                      << "' (ctest -R generate makes it)";
  ASSERT_TRUE(fs::exists(smollm2() / "model.safetensors"))
      << "no SmolLM2 in TORCHATTN_SMOLLM2='" << smollm2().string() << "'";
}

// ---- weights ----

TEST(GenerateWeights, MissingOrMisshapenWeightsAreErrorsNamingTheKey) {
  const auto dir = reference() / "tiny" / "llama_untied_theta5e5";
  const auto config = models::read_decoder_config((dir / "config.json").string());
  auto tensors = torchattn::load_safetensors((dir / "model.safetensors").string());
  auto expect = [&](const torchattn::NamedTensors& t, const std::string& message) {
    models::CausalLM model(config, 32);
    try {
      models::load_weights(*model, t, model->hf_weights(), "model.safetensors");
      ADD_FAILURE() << "loaded; expected: " << message;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(message), std::string::npos) << e.what_without_backtrace();
    }
  };
  auto without = tensors;
  without.erase(std::remove_if(without.begin(), without.end(),
                               [](const auto& p) { return p.first == "model.layers.1.self_attn.k_proj.weight"; }),
                without.end());
  expect(without,
         "load_weights: model.safetensors has no tensor for 'layers.1.self_attn.W_key.weight' (shape [16, 64])");
  auto misshapen = tensors;
  for (auto& [name, t] : misshapen) {
    if (name == "model.layers.0.mlp.up_proj.weight") t = t.narrow(0, 0, 100);
  }
  expect(misshapen,
         "load_weights: tensor 'model.layers.0.mlp.up_proj.weight' of model.safetensors has shape [100, 64], "
         "expected [128, 64] for 'layers.0.up_proj.weight'");
  auto extra = tensors;
  extra.emplace_back("model.layers.0.self_attn.q_norm.weight", torch::ones({16}));
  expect(extra, "load_weights: model.safetensors has tensor 'model.layers.0.self_attn.q_norm.weight' "
                "('layers.0.self_attn.q_norm.weight' after renaming), which the module does not have");
}

// ---- tokenizers ----

void expect_every_line(const models::Tokenizer& tok, const fs::path& expected_json, const std::string& what) {
  std::ifstream in(expected_json);
  ASSERT_TRUE(in) << expected_json;
  const auto ref = nlohmann::json::parse(in);
  const auto& lines = ref["lines"];
  const auto& ids = ref["ids"];
  size_t wrong = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string line = lines[i].get<std::string>();
    const auto want = ids[i].get<std::vector<int64_t>>();
    const auto got = tok.encode(line);
    if (got != want && ++wrong <= 5) ADD_FAILURE() << what << ": line " << i << " '" << line << "' encodes differently";
    if (tok.decode(got) != line && ++wrong <= 5) ADD_FAILURE() << what << ": line " << i << " decodes differently";
  }
  std::printf("[generate] %s: %zu lines, %zu encode or decode differently\n", what.c_str(), lines.size(), wrong);
  EXPECT_EQ(wrong, 0u);
}

TEST(GenerateTokenizer, SmolLM2EncodesEveryFortuneLineAsTransformers) {
  models::Tokenizer tok((smollm2() / "tokenizer.json").string());
  expect_every_line(tok, reference() / "tokenizer_smollm2.json", "SmolLM2 tokenizer");
}

TEST(GenerateTokenizer, Qwen2StyleEncodesEveryFortuneLineAsTokenizers) {
  models::Tokenizer tok((reference() / "tokenizer_qwen2style" / "tokenizer.json").string());
  expect_every_line(tok, reference() / "tokenizer_qwen2style" / "expected.json", "Qwen2-style tokenizer");
}

// A SentencePiece vocabulary in a GGUF file (tokenizer.ggml.model "llama", no merges: they
// come from the scores) against transformers' tokenizer of the same file with Llama 2's
// normalizer, whose ids the reference script checks against sentencepiece's own: the ids
// of every fortune line and of texts of spaces, tabs, byte fallback and special tokens;
// the text of those ids and of id sequences no text encodes to, with and without the
// special tokens; and the same text a token at a time.
TEST(GenerateTokenizer, SentencePieceGgufEncodesAsSentencepieceAndDecodesAsTransformers) {
  const fs::path dir = reference() / "tokenizer_sentencepiece";
  const auto file = torchattn::GgufFile::open((dir / "vocab.gguf").string());
  const auto tok = models::Tokenizer::from_gguf(file, "vocab.gguf");
  EXPECT_EQ(tok.kind(), "BPE");
  EXPECT_EQ(tok.prefix_ids(), std::vector<int64_t>{1});
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in);
  const auto ref = nlohmann::json::parse(in);
  const auto& texts = ref["texts"];
  size_t wrong = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto text = texts[i].get<std::string>();
    if (tok.encode(text) != ref["ids"][i].get<std::vector<int64_t>>() && ++wrong <= 5) {
      ADD_FAILURE() << "text " << i << " '" << text << "' encodes differently";
    }
  }
  // Each piece's text after another, its space kept (logprobs' token strings); a byte
  // token's byte.
  for (const auto& [id, text] : ref["token_texts"].items()) {
    if (tok.token_text(std::stoll(id)) != text.get<std::string>() && ++wrong <= 5) {
      ADD_FAILURE() << "token " << id << " gives '" << tok.token_text(std::stoll(id)) << "', transformers '"
                    << text.get<std::string>() << "'";
    }
  }
  EXPECT_EQ(ref["token_texts"].size(), 3000u - 256u);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    EXPECT_EQ(tok.token_text(*tok.id_of(name)), std::string(1, static_cast<char>(b))) << name;
  }
  const auto& decode_ids = ref["decode_ids"];
  for (size_t i = 0; i < decode_ids.size(); ++i) {
    const auto ids = decode_ids[i].get<std::vector<int64_t>>();
    for (const bool skip : {false, true}) {
      const auto want = ref[skip ? "decoded_skipping_special" : "decoded"][i].get<std::string>();
      if (tok.decode(ids, skip) != want && ++wrong <= 10) {
        ADD_FAILURE() << "ids " << i << (skip ? " skipping special tokens" : "") << " decode to '"
                      << tok.decode(ids, skip) << "', transformers '" << want << "'";
      }
    }
  }
  // A token at a time: each push gives what tokenizers' DecodeStream gives; with finish,
  // the whole text, where tokenizers' pieces add up to it (not where a run of byte
  // tokens holds a character and then bytes that never make one: decode turns the whole
  // run into U+FFFD, the stream has given the character).
  const auto& streamed_lists = ref["streamed_lists"];
  for (size_t k = 0; k < streamed_lists.size(); ++k) {
    const auto i = streamed_lists[k].get<size_t>();
    const auto ids = decode_ids[i].get<std::vector<int64_t>>();
    for (const bool skip : {false, true}) {
      const auto pieces = ref[skip ? "streamed_skipping_special" : "streamed"][k].get<std::vector<std::string>>();
      const auto whole = ref[skip ? "decoded_skipping_special" : "decoded"][i].get<std::string>();
      models::DecodeStream stream(tok, skip);
      std::string streamed, joined;
      for (size_t t = 0; t < ids.size(); ++t) {
        const std::string piece = stream.push(ids[t]);
        if (piece != pieces[t] && ++wrong <= 15) {
          ADD_FAILURE() << "ids " << i << (skip ? " skipping special tokens" : "") << ": token " << t << " gives '"
                        << piece << "', tokenizers' DecodeStream '" << pieces[t] << "'";
        }
        streamed += piece;
        joined += pieces[t];
      }
      streamed += stream.finish();
      if (whole.starts_with(joined) && streamed != whole && ++wrong <= 15) {
        ADD_FAILURE() << "ids " << i << (skip ? " skipping special tokens" : "") << " stream to '" << streamed
                      << "', decode gives '" << whole << "'";
      }
    }
  }
  std::printf("[generate] SentencePiece GGUF vocabulary: %zu texts, %zu id lists (%zu streamed), %zu differ\n",
              texts.size(), decode_ids.size(), streamed_lists.size(), wrong);
  EXPECT_EQ(wrong, 0u);
}

// A stream that holds more than 8 tokens gives their text then (DecodeStream's bound: a
// character is at most four byte tokens): 40 bytes that never make a character stream
// as U+FFFD, every piece and finish adding up to decode's text; a character and then
// such bytes give the character and one U+FFFD a byte (decode: the whole run's); skipped
// special tokens give nothing, before and after the bound.
TEST(GenerateTokenizer, DecodeStreamHoldsAtMostEightTokens) {
  const fs::path dir = reference() / "tokenizer_sentencepiece";
  const auto tok = models::Tokenizer::from_gguf(torchattn::GgufFile::open((dir / "vocab.gguf").string()), "v");
  const auto byte = [&](const char* token) {
    const auto id = tok.id_of(token);
    EXPECT_TRUE(id.has_value()) << token;
    return id.value_or(0);
  };
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<int64_t> stray(40, byte("<0x80>"));
  models::DecodeStream stream(tok);
  std::string streamed;
  size_t given_at = 0;
  for (size_t t = 0; t < stray.size(); ++t) {
    const std::string piece = stream.push(stray[t]);
    if (!piece.empty() && given_at == 0) given_at = t + 1;
    streamed += piece;
  }
  EXPECT_EQ(given_at, 9u);  // the ninth held token gives the nine
  const std::string rest = stream.finish();
  EXPECT_LE(rest.size(), 8 * fffd.size());
  EXPECT_EQ(streamed + rest, tok.decode(stray));
  std::string forty;
  for (int i = 0; i < 40; ++i) forty += fffd;
  EXPECT_EQ(tok.decode(stray), forty);

  std::vector<int64_t> e_then_stray = {byte("<0xC3>"), byte("<0xA9>")};
  e_then_stray.insert(e_then_stray.end(), 20, byte("<0x80>"));
  models::DecodeStream again(tok);
  std::string text;
  for (const int64_t id : e_then_stray) text += again.push(id);
  text += again.finish();
  EXPECT_EQ(text, "\xC3\xA9" + forty.substr(0, 20 * fffd.size()));

  const int64_t eos = tok.suffix_ids().empty() ? 2 : tok.suffix_ids().back();
  models::DecodeStream skipping(tok, /*skip_special_tokens=*/true);
  std::string skipped;
  for (int i = 0; i < 30; ++i) skipped += skipping.push(eos);
  skipped += skipping.push(byte("<0x41>"));
  EXPECT_EQ(skipped + skipping.finish(), "A");
}

// The file's add_bos_token false, add_eos_token true and add_space_prefix false: EOS after
// the text, no BOS, no "▁" before it nor a space stripped from the decoded text. A file
// with a token that is not UTF-8 (found by fuzz_tokenizer: it was an uncaught JSON
// exception), or without scores (no merges to derive), is refused.
TEST(GenerateTokenizer, SentencePieceGgufTakesItsSpecialTokensFromTheFile) {
  const fs::path dir = reference() / "tokenizer_sentencepiece";
  const auto tok = models::Tokenizer::from_gguf(torchattn::GgufFile::open((dir / "eos_not_bos.gguf").string()), "f");
  EXPECT_TRUE(tok.prefix_ids().empty());
  EXPECT_EQ(tok.suffix_ids(), std::vector<int64_t>{2});
  std::ifstream in(dir / "eos_not_bos_expected.json");
  ASSERT_TRUE(in);
  const auto ref = nlohmann::json::parse(in);
  for (size_t i = 0; i < ref["lines"].size(); ++i) {
    const auto ids = ref["ids"][i].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(ref["lines"][i].get<std::string>()), ids) << i;
    EXPECT_EQ(tok.decode(ids), ref["decoded"][i].get<std::string>()) << i;
  }
  const auto not_utf8 = torchattn::GgufFile::open((dir / "not_utf8.gguf").string());
  const std::string error = error_of([&] { models::Tokenizer::from_gguf(not_utf8, "not_utf8.gguf"); });
  EXPECT_HAS(error, "tokenizer: 'not_utf8.gguf': tokenizer.ggml.tokens[");
  EXPECT_HAS(error, "] is not UTF-8 (the byte at offset 0)");
  const auto no_scores = torchattn::GgufFile::open((dir / "no_scores.gguf").string());
  EXPECT_HAS(error_of([&] { models::Tokenizer::from_gguf(no_scores, "no_scores.gguf"); }),
             "tokenizer: 'no_scores.gguf': a SentencePiece vocabulary (tokenizer.ggml.model 'llama') needs "
             "tokenizer.ggml.scores");
}

// A tiny random Llama with that vocabulary in one GGUF file, loaded as a user loads one:
// the prompts' ids, transformers' greedy tokens (up to a near tie) and their text (what
// they add after the prompt, the first one's space kept), whole and streamed.
TEST(GenerateTokenizer, SentencePieceGgufModelGeneratesTransformersTokensAndText) {
  const fs::path dir = reference() / "tokenizer_sentencepiece";
  const auto ref = read_pickle(dir / "tiny_llama.pt");
  auto lm = models::LanguageModel::from_pretrained((dir / "tiny_llama.gguf").string());
  for (int64_t i = 0; i < ref.at("count").toInt(); ++i) {
    const std::string key = "prompt" + std::to_string(i);
    const std::string prompt = ref.at(key + ".text").toStringRef();
    EXPECT_EQ(lm.tokenizer().encode(prompt), to_ids(ref.at(key + ".ids").toTensor())) << prompt;
    std::string streamed;
    const auto out = lm.generate({prompt}, models::GenerationOptions().max_new_tokens(24).stop_at_eos(false),
                                 [&](size_t, const std::string& piece) { streamed += piece; })[0];
    const auto want = to_ids(ref.at(key + ".tokens").toTensor());
    const auto margins = ref.at(key + ".margins").toTensor();
    const size_t n = before_a_near_tie(margins);
    ASSERT_EQ(out.ids.size(), want.size());
    EXPECT_EQ(std::vector<int64_t>(out.ids.begin(), out.ids.begin() + static_cast<std::ptrdiff_t>(n)),
              std::vector<int64_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
    if (n == want.size()) {
      EXPECT_EQ(out.text, ref.at(key + ".generated").toStringRef());
    }
    EXPECT_EQ(streamed, out.text);
    std::printf("[generate] SentencePiece GGUF tiny Llama, prompt %lld: %zu of %zu tokens as transformers: \"%s\"\n",
                static_cast<long long>(i), n, want.size(), out.text.c_str());
  }
}

// The same vocabulary as a Hugging Face folder's tokenizer.json: transformers'
// LlamaTokenizer (Metaspace, "▁" only at the text's start, the text one word) and an
// older shape (Metaspace with add_prefix_space, split before each "▁").
TEST(GenerateTokenizer, SentencePieceTokenizerJsonShapesEncodeAsTokenizers) {
  for (const std::string shape : {"metaspace_first", "metaspace_split"}) {
    const fs::path dir = reference() / "tokenizer_sentencepiece";
    const models::Tokenizer tok((dir / (shape + ".json")).string());
    std::ifstream in(dir / (shape + "_expected.json"));
    ASSERT_TRUE(in) << shape;
    const auto ref = nlohmann::json::parse(in);
    size_t wrong = 0;
    for (size_t i = 0; i < ref["lines"].size(); ++i) {
      const auto line = ref["lines"][i].get<std::string>();
      if (tok.encode(line) != ref["ids"][i].get<std::vector<int64_t>>() && ++wrong <= 5) {
        ADD_FAILURE() << shape << ": line " << i << " '" << line << "' encodes differently";
      }
    }
    std::printf("[generate] SentencePiece tokenizer.json (%s): %zu lines, %zu encode differently\n", shape.c_str(),
                ref["lines"].size(), wrong);
    EXPECT_EQ(wrong, 0u) << shape;
  }
}

TEST(GenerateTokenizer, OtherKindsAreRefusedNamingWhatTheyAre) {
  const auto path = fs::temp_directory_path() / ("torchattn_unigram_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "pre_tokenizer": null,
                             "normalizer": null, "decoder": null, "post_processor": null, "added_tokens": []})";
  try {
    models::Tokenizer tok(path.string());
    ADD_FAILURE() << "a Unigram tokenizer was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace())
                  .find("is a Unigram tokenizer; this library reads BPE (GPT-2, "
                        "SmolLM2, Qwen2; Llama 2, Mistral) and WordPiece (BERT) tokenizers"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  fs::remove(path);
}

// ---- SmolLM2-135M-Instruct ----

TEST(GenerateSmolLM2, ConversationsAreTheChatTemplatesText) {
  const auto ref = read_pickle(reference() / "smollm2.pt");
  const auto chat_template = models::read_chat_template(smollm2().string());
  ASSERT_TRUE(chat_template.has_value());
  const auto conversations = nlohmann::json::parse(ref.at("conversations").toStringRef());
  ASSERT_EQ(conversations.size(), 2u);
  for (const auto& c : conversations) {
    std::vector<models::ChatMessage> messages;
    for (const auto& m : c["messages"])
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    EXPECT_EQ(models::chat_prompt(*chat_template, messages), c["text"].get<std::string>());
  }
  try {
    models::chat_prompt(*chat_template, std::vector<models::ChatMessage>{{"tool", "{}"}});
    ADD_FAILURE() << "a tool turn was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace())
                  .find("message 0 has role 'tool'; expected system, user or "
                        "assistant"),
              std::string::npos);
  }
}

TEST(GenerateSmolLM2, ChatPromptLogitsAndGreedyTokensAreTransformers) {
  const auto ref = read_pickle(reference() / "smollm2.pt");
  models::Tokenizer tok((smollm2() / "tokenizer.json").string());
  const auto chat_template = models::read_chat_template(smollm2().string());
  ASSERT_TRUE(chat_template.has_value());
  auto model = load_model(smollm2(), 256);
  const auto config = model->config();
  for (int64_t i = 0; i < ref.at("count").toInt(); ++i) {
    const std::string key = "prompt" + std::to_string(i);
    const std::string text = ref.at(key + ".text").toStringRef();
    SCOPED_TRACE(text);
    // The chat template and tokenizer give transformers' ids.
    const auto ids = tok.encode(models::chat_prompt(*chat_template, text));
    ASSERT_EQ(ids, to_ids(ref.at(key + ".ids").toTensor()));
    {
      c10::InferenceMode inference;
      const auto logits = model->forward(torch::tensor(ids).unsqueeze(0))[0];
      const double err = relative_error(logits, ref.at(key + ".logits").toTensor());
      std::printf("[generate] SmolLM2 prompt %lld: logits error %.2e relative to the largest\n",
                  static_cast<long long>(i), err);
      EXPECT_LE(err, 1e-4);
    }
    const auto want = to_ids(ref.at(key + ".tokens").toTensor());
    const auto margins = ref.at(key + ".margins").toTensor();
    const auto got = greedy(*model, ids, 48, config.eos_token_ids);
    // Compare up to the first step where transformers itself nearly tied.
    const size_t n = before_a_near_tie(margins);
    if (n < want.size()) {
      std::printf("[generate] SmolLM2 prompt %lld: transformers' top two logits tie within 1e-4 at step %zu; "
                  "tokens compared up to there\n",
                  static_cast<long long>(i), n);
    }
    ASSERT_GE(got.size(), n);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(n)),
              std::vector<int64_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
    if (n == want.size()) {
      EXPECT_EQ(got.size(), want.size());
    }
    std::printf("[generate] SmolLM2 prompt %lld: %zu greedy tokens equal to transformers' generate: \"%s\"\n",
                static_cast<long long>(i), n,
                tok.decode(std::vector<int64_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(n))).c_str());
  }
}

// SmolLM2 loaded with LoadOptions::weight_format(DynamicInt8): the first chat prompt's
// logits are those of transformers' model quantize_dynamic'd, all 30 layers and the head.
TEST(GenerateSmolLM2, DynamicInt8IsTheModelQuantizeDynamicd) {
  const auto ref = read_pickle(reference() / "smollm2.pt");
  auto lm = models::LanguageModel::from_pretrained(smollm2().string(),
                                                   models::LoadOptions().context_length(256).weight_format(
                                                       torchattn::WeightFormat::DynamicInt8));
  EXPECT_EQ(lm.model()->weight_format(), torchattn::WeightFormat::DynamicInt8);
  c10::InferenceMode inference;
  const auto logits = lm.model()->forward(ref.at("prompt0.ids").toTensor().unsqueeze(0))[0];
  const double err = relative_error(logits, ref.at("prompt0.dynamic_int8_logits").toTensor());
  std::printf("[generate] SmolLM2 dynamic-int8: prompt logits error %.2e relative to quantize_dynamic's\n", err);
  EXPECT_LE(err, 1e-5);
  EXPECT_HAS(
      error_of([&] { lm.save_pretrained(temp_path("smollm2_dynamic")); }),
      "LanguageModel::save_pretrained writes a frozen model's bfloat16, int8 or int4 weights "
      "(LoadOptions::weight_format); this one's are dynamic-int8 (quantized at load, not saved): load it from '" +
          smollm2().string() + "' with dynamic-int8 again");
}

TEST(GenerateSmolLM2, LanguageModelGeneratesTheReferenceTokensForABatchOfPrompts) {
  const auto ref = read_pickle(reference() / "smollm2.pt");
  auto lm = models::LanguageModel::from_pretrained(smollm2().string(), models::LoadOptions().context_length(256));
  std::vector<std::string> prompts;
  for (int64_t i = 0; i < ref.at("count").toInt(); ++i) {
    prompts.push_back(lm.chat_prompt(ref.at("prompt" + std::to_string(i) + ".text").toStringRef()));
  }
  std::vector<std::string> streamed(prompts.size());
  const auto out = lm.generate(prompts, models::GenerationOptions().max_new_tokens(48),
                               [&](size_t b, const std::string& piece) { streamed.at(b) += piece; });
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string key = "prompt" + std::to_string(i);
    EXPECT_EQ(lm.tokenizer().encode(prompts[i]), to_ids(ref.at(key + ".ids").toTensor()));
    const auto want = to_ids(ref.at(key + ".tokens").toTensor());
    const auto margins = ref.at(key + ".margins").toTensor();
    const size_t n = before_a_near_tie(margins);
    ASSERT_GE(out[i].ids.size(), n);
    EXPECT_EQ(std::vector<int64_t>(out[i].ids.begin(), out[i].ids.begin() + static_cast<std::ptrdiff_t>(n)),
              std::vector<int64_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
    // The text: the new tokens decoded, the stop token left out; streamed piece by piece.
    auto ids = out[i].ids;
    if (out[i].stopped) ids.pop_back();
    EXPECT_EQ(out[i].text, lm.tokenizer().decode(ids));
    EXPECT_EQ(streamed[i], out[i].text);
    std::printf("[generate] LanguageModel, batch of %zu, prompt %zu: %zu tokens equal to transformers' generate: "
                "\"%s\"\n",
                prompts.size(), i, n, out[i].text.c_str());
  }
}

// ---- model folders whose files belong together ----

const char* kTinyWordPiece = R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0,
    "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "hello": 4}}, "normalizer": {"type": "BertNormalizer"},
    "pre_tokenizer": {"type": "BertPreTokenizer"}})";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Another model's tokenizer.json generated garbage and exited 0.
TEST(GenerateFolders, AnotherModelsTokenizerIsAnErrorNamingTheFiles) {
  const auto dir = copy_model_folder(smollm2(), "smollm2_swapped");
  const std::string tokenizer = (dir / "tokenizer.json").string(), config = (dir / "config.json").string();
  auto load = [&] { return error_of([&] { models::LanguageModel::from_pretrained(dir.string()); }); };
  write_file(dir / "tokenizer.json", kTinyWordPiece);  // a BERT's
  EXPECT_HAS(load(), "tokenizer: '" + tokenizer + "' is a WordPiece tokenizer; '" + config +
                         "' holds a llama model, "
                         "which expects a BPE tokenizer (byte-level: GPT-2, SmolLM2, Qwen2; SentencePiece: Llama 2, "
                         "Mistral) (is the tokenizer.json another model's?)");
  // Its own without <|im_end|>: chat prompts were plain text, and the answer never ended.
  std::string own = read_text(smollm2() / "tokenizer.json"), renamed = own;
  for (size_t at = renamed.find("<|im_end|>"); at != std::string::npos; at = renamed.find("<|im_end|>", at)) {
    renamed.replace(at, 10, "<|im_stop|>");
  }
  write_file(dir / "tokenizer.json", renamed);
  const auto chat_file = fs::exists(dir / "chat_template.jinja") ? dir / "chat_template.jinja"
                                                                 : dir / "tokenizer_config.json";
  EXPECT_HAS(load(), "tokenizer: the chat template of '" + chat_file.string() +
                         "' uses <|im_end|>, expected a token "
                         "of '" +
                         tokenizer + "', got none of that name");
  // An end token past the tokenizer's ids.
  write_file(dir / "tokenizer.json", own);
  write_file(dir / "generation_config.json", R"({"eos_token_id": [2, 49200]})");
  EXPECT_HAS(load(), "tokenizer: '" + (dir / "generation_config.json").string() +
                         "' has eos_token_id 49200, expected "
                         "an id of '" +
                         tokenizer + "' (0 to 49151): is the tokenizer.json another model's?");
  fs::remove(dir / "generation_config.json");
  EXPECT_EQ(load(), "(no error)");
  fs::remove_all(dir);
  // A tiny Llama (211 tokens) with SmolLM2's tokenizer.json (49,152).
  const auto tiny = copy_model_folder(reference() / "tiny" / "llama_gqa_tied", "tiny_llama_swapped");
  fs::copy_file(smollm2() / "tokenizer.json", tiny / "tokenizer.json");
  EXPECT_HAS(error_of([&] { models::LanguageModel::from_pretrained(tiny.string()); }),
             "tokenizer: '" + (tiny / "tokenizer.json").string() + "' gives ids up to 49151 (49152 tokens); '" +
                 (tiny / "config.json").string() + "' has vocab_size 211, so expected every id below 211");
  fs::remove_all(tiny);
}

// The same in int4 (its head int8): a file under 0.2x the float32 one, and under the
// int8 save's.
TEST(GenerateFolders, ASavedInt4FolderLoadsAsItWas) {
  using models::LoadOptions;
  using torchattn::WeightFormat;
  auto lm = models::LanguageModel::from_pretrained(smollm2().string(), LoadOptions().weight_format(WeightFormat::Int4));
  EXPECT_EQ(lm.model()->weight_format(), WeightFormat::Int4);
  const fs::path dir = temp_path("smollm2_int4");
  fs::remove_all(dir);
  lm.save_pretrained(dir.string());
  EXPECT_LT(fs::file_size(dir / "model.safetensors"), 0.2 * fs::file_size(smollm2() / "model.safetensors"));
  {
    std::ifstream in(dir / "torchattn_weights.json");
    const nlohmann::json note = nlohmann::json::parse(in);
    EXPECT_EQ(note.at("weight_format"), "int4");
    EXPECT_EQ(note.at("int4_group"), 32);
  }
  auto again = models::LanguageModel::from_pretrained(dir.string());
  EXPECT_EQ(again.model()->weight_format(), WeightFormat::Int4);
  EXPECT_EQ(again.model()->weight_bytes(), lm.model()->weight_bytes());
  const auto options = models::GenerationOptions().max_new_tokens(12);
  const std::vector<std::string> prompts{lm.chat_prompt("What is the capital of France?"), "def fibonacci(n):"};
  const auto want = lm.generate(prompts, options), got = again.generate(prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].ids, want[i].ids) << "prompt " << i;
  EXPECT_HAS(error_of([&] {
               models::LanguageModel::from_pretrained(dir.string(), LoadOptions().weight_format(WeightFormat::Int8));
             }),
             "' holds int4 weights (torchattn_weights.json); LoadOptions::weight_format asked for int8");
  fs::remove_all(dir);
}

// LanguageModel::save_pretrained of SmolLM2 in int8, loaded back as it is: the same
// greedy tokens, a file under 0.3x the float32 one; and what a wrong load says.
TEST(GenerateFolders, ASavedInt8FolderLoadsAsItWasAndRefusesAnotherModel) {
  using models::LoadOptions;
  using torchattn::WeightFormat;
  auto lm = models::LanguageModel::from_pretrained(smollm2().string(), LoadOptions().weight_format(WeightFormat::Int8));
  const fs::path dir = temp_path("smollm2_int8");
  fs::remove_all(dir);
  lm.save_pretrained(dir.string());
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors", "torchattn_weights.json"}) {
    EXPECT_TRUE(fs::exists(dir / name)) << name;
  }
  EXPECT_LT(fs::file_size(dir / "model.safetensors"), 0.3 * fs::file_size(smollm2() / "model.safetensors"));
  auto again = models::LanguageModel::from_pretrained(dir.string());
  EXPECT_EQ(again.model()->weight_format(), WeightFormat::Int8);
  EXPECT_EQ(again.model()->weight_bytes(), lm.model()->weight_bytes());
  const auto options = models::GenerationOptions().max_new_tokens(12);
  const std::vector<std::string> prompts{lm.chat_prompt("What is the capital of France?"), "def fibonacci(n):"};
  const auto want = lm.generate(prompts, options), got = again.generate(prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].ids, want[i].ids) << "prompt " << i;

  auto load = [](const fs::path& folder, const LoadOptions& o) {
    return error_of([&] { models::LanguageModel::from_pretrained(folder.string(), o); });
  };
  EXPECT_HAS(load(dir, LoadOptions().weight_format(WeightFormat::BFloat16)),
             "LanguageModel::from_pretrained: '" + dir.string() +
                 "' holds int8 weights (torchattn_weights.json); LoadOptions::weight_format asked for bfloat16");
  EXPECT_HAS(load(dir, LoadOptions().dtype(torch::kBFloat16)),
             "' holds int8 weights, which run on the CPU with float32 activations; got LoadOptions device cpu and "
             "dtype BFloat16");
  // The int8 weights beside another model's config (a narrower MLP).
  const auto other = copy_model_folder(dir, "smollm2_int8_other");
  {
    std::ifstream in(dir / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["intermediate_size"] = 1024;
    write_file(other / "config.json", config.dump());
  }
  EXPECT_HAS(load(other, LoadOptions()),
             "CausalLM: expected the frozen 'layers.0.gate_proj.weight' [1024, 576] (the model's shape), got "
             "[1536, 576] (weights of another model?)");
  write_file(other / "torchattn_weights.json", R"({"weight_format": "int2"})");
  EXPECT_HAS(load(other, LoadOptions()), "torchattn_weights.json': expected \"weight_format\": \"bfloat16\", "
                                         "\"int8\" or \"int4\", got \"int2\"");
  fs::remove_all(other);
  EXPECT_HAS(error_of([&] { again.save_pretrained(dir.string()); }),
             "LanguageModel::save_pretrained: '" + dir.string() +
                 "' is the folder the model was loaded from; write to another");
  auto plain = models::LanguageModel::from_pretrained(smollm2().string());
  EXPECT_HAS(error_of([&] { plain.save_pretrained(dir.string()); }),
             "LanguageModel::save_pretrained writes a frozen model's bfloat16, int8 or int4 weights "
             "(LoadOptions::weight_format); this one's are float32: its folder is '" +
                 smollm2().string() + "'");
  fs::remove_all(dir);
}

TEST(GenerateFolders, LoadOptionsAreCheckedWithTheirNames) {
  using models::LoadOptions;
  auto load = [&](const LoadOptions& o) {
    return error_of([&] { models::LanguageModel::from_pretrained(smollm2().string(), o); });
  };
  EXPECT_HAS(load(LoadOptions().dtype(torch::kInt)),
             "LoadOptions::dtype: expected float32, bfloat16 or float16 (the floating-point type of the weights and of "
             "the computations), got Int");
  EXPECT_HAS(
      load(LoadOptions().weight_format(static_cast<torchattn::WeightFormat>(7))),
      "LoadOptions::weight_format: expected WeightFormat::Float32, BFloat16, Int8, DynamicInt8 or Int4, got the value "
      "7 (an integer cast to WeightFormat?)");
  EXPECT_HAS(load(LoadOptions().context_length(-1)),
             "LoadOptions::context_length: expected at least 1 token (or unset, for the config's "
             "max_position_embeddings), got -1");
  const auto config = models::read_decoder_config((smollm2() / "config.json").string());
  EXPECT_HAS(load(LoadOptions().context_length(config.max_position_embeddings + 1)),
             "LoadOptions::context_length: expected at most " + std::to_string(config.max_position_embeddings) +
                 " (the max_position_embeddings of '" + (smollm2() / "config.json").string() + "'), got " +
                 std::to_string(config.max_position_embeddings + 1));
}

// Bytes that are not UTF-8 were "the piece 'ÿ' is not in the vocabulary" (0xFF) or
// encoded silently (0xE9): Hugging Face tokenizers cannot take them at all.
TEST(GenerateTokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  const models::Tokenizer tok((smollm2() / "tokenizer.json").string());
  EXPECT_HAS(error_of([&] { tok.encode("ab\xFF"); }), "Tokenizer::encode: expected UTF-8 text, got text with the byte "
                                                      "0xFF at offset 2, which is not valid UTF-8 (Hugging Face "
                                                      "tokenizers take only UTF-8 text)");
  EXPECT_HAS(error_of([&] { tok.encode("caf\xE9!"); }), "the byte 0xE9 at offset 3");
  auto lm = models::LanguageModel::from_pretrained(smollm2().string(), models::LoadOptions().context_length(64));
  EXPECT_HAS(error_of([&] { lm.generate({"fine", "also \xC3"}); }),
             "LanguageModel::generate: expected UTF-8 text, got prompt 1 with the byte 0xC3 at offset 5");
}

TEST(GenerateErrors, BadPromptsAndOptionsNameWhatIsWrong) {
  auto model = load_model(reference() / "tiny" / "llama_gqa_tied", 32);
  auto message = [&](const std::vector<std::vector<int64_t>>& prompts, const models::GenerationOptions& o) {
    try {
      models::generate(*model, prompts, o);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  const auto o = models::GenerationOptions().max_new_tokens(4);
  EXPECT_EQ(message({}, o), "generate: expected at least one prompt, got none");
  EXPECT_EQ(message({{1, 2}, {}}, o), "generate: prompt 1 has no tokens");
  EXPECT_EQ(message({{1, 211}}, o), "generate: prompt 0 has token id 211, outside the vocabulary [0, 211)");
  EXPECT_EQ(message({std::vector<int64_t>(30, 1)}, o), "generate: 30 prompt tokens and 4 new ones pass the context "
                                                       "length 32");
  EXPECT_EQ(message({{1}}, models::GenerationOptions().max_new_tokens(0)),
            "generate: expected max_new_tokens >= 1, got 0");
  EXPECT_EQ(message({{1}}, models::GenerationOptions().max_new_tokens(4).do_sample(true).top_p(1.5)),
            "sampling: expected top_p in (0, 1], got 1.5");
}

}  // namespace
