// How a decoder loads (docs/models.md, loading): built for loading it draws no random
// numbers and holds no weights; a checkpoint's tensors become its weights in place (the
// data pointers lie inside the file's mapping: nothing copied), float32 and frozen int8
// alike; and what a mapped file that changes under the model does to it.

#include "common/expect_error.h"
#include "common/temp_path.h"
#include "models/tiny_decoder.h"

#include <torchattn/models.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

namespace models = torchattn::models;
using torchattn::WeightFormat;

models::DecoderConfig small_config(bool tied) {
  return tiny_decoder_config({.hidden = 64, .heads = 4, .intermediate = 130, .positions = 64, .tied = tied});
}

// The address ranges that map `path` in this process (/proc/self/maps).
std::vector<std::pair<uintptr_t, uintptr_t>> mappings_of(const std::string& path) {
  const std::string file = std::filesystem::canonical(path).string();
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (!line.ends_with(" " + file)) continue;
    std::istringstream in(line);
    std::string range;
    in >> range;
    const size_t dash = range.find('-');
    out.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return out;
}

bool inside(const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges, const at::Tensor& t) {
  const auto p = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  for (const auto& [begin, end] : ranges) {
    if (p >= begin && p + t.numel() * t.element_size() <= end) return true;
  }
  return false;
}

// The model's parameters as a safetensors file at `path` (their names as they are);
// returns them.
torchattn::NamedTensors save_state(const models::CausalLM& model, const std::string& path) {
  torchattn::NamedTensors state;
  for (const auto& p : model->named_parameters()) state.emplace_back(p.key(), p.value().detach());
  torchattn::save_safetensors(path, state);
  return state;
}

// A model built for loading with the parameters of the file at `path`.
models::CausalLM loaded_from(const std::string& path, bool tied) {
  models::CausalLM model(small_config(tied), 64, models::Init::ForLoading);
  models::load_weights(*model, path);
  return model;
}

at::Tensor generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

at::Tensor logits_of(models::CausalLM& model, const at::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return model->forward(ids);
}

TEST(Loading, AModelBuiltForLoadingDrawsNoRandomNumbersAndHoldsNoWeights) {
  for (const bool tied : {true, false}) {
    torch::manual_seed(91);
    const auto before = generator_state();
    models::CausalLM model(small_config(tied), 64, models::Init::ForLoading);
    EXPECT_TRUE(torch::equal(generator_state(), before)) << "random numbers were drawn";
    int64_t placeholders = 0;
    for (const auto& p : model->named_parameters()) {
      const bool is_norm = p.key().find("norm") != std::string::npos;
      EXPECT_EQ(torchattn::is_placeholder(p.value()), !is_norm) << p.key();
      placeholders += torchattn::is_placeholder(p.value()) ? 1 : 0;
    }
    EXPECT_EQ(placeholders, 2 * 7 + 1 + (tied ? 0 : 1));
    EXPECT_EQ(model->weight_bytes(), 5 * 64 * 4) << "only the norms' weights";
    expect_error([&] { logits_of(model, torch::zeros({1, 3}, torch::kLong)); }, "before");
    // Init::Random draws as before: the two-argument constructor's weights.
    torch::manual_seed(91);
    models::CausalLM a(small_config(tied), 64);
    torch::manual_seed(91);
    models::CausalLM b(small_config(tied), 64, models::Init::Random);
    for (size_t i = 0; i < a->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i]));
    }
  }
}

// float32 weights from a safetensors file, and a saved frozen int8 model: every weight
// is the file's own memory.
TEST(Loading, MappedWeightsAreNotCopied) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    torch::manual_seed(92);
    models::CausalLM source(small_config(tied), 64);
    source->eval();
    const auto ids = torch::randint(0, 96, {2, 9}, torch::kLong);
    const std::string path = temp_path(std::string("loading_") + (tied ? "tied" : "untied") + ".safetensors");
    save_state(source, path);
    models::CausalLM loaded = loaded_from(path, tied);
    loaded->eval();
    const auto ranges = mappings_of(path);
    ASSERT_FALSE(ranges.empty()) << path << " is not mapped";
    for (const auto& p : loaded->named_parameters()) EXPECT_TRUE(inside(ranges, p.value())) << p.key() << " copied";
    EXPECT_TRUE(torch::equal(logits_of(loaded, ids), logits_of(source, ids)));

    // A frozen int8 model saved and loaded again: its int8 weights and scales are views.
    source->freeze_weights(WeightFormat::Int8);
    const std::string frozen_path = temp_path(std::string("loading_int8_") + (tied ? "tied" : "untied") + ".st");
    torchattn::save_safetensors(frozen_path, source->frozen_state());
    models::CausalLM frozen(small_config(tied), 64, WeightFormat::Int8);
    frozen->load_frozen_state(torchattn::load_safetensors(frozen_path), WeightFormat::Int8);
    frozen->eval();
    const auto frozen_ranges = mappings_of(frozen_path);
    int64_t viewed = 0;
    for (const auto& layer : *frozen->layers) {
      const auto& l = layer->as<models::DecoderLayerImpl>();
      for (const auto& linear : {l->self_attn->W_query, l->self_attn->W_key, l->self_attn->W_value,
                                 l->self_attn->out_proj, l->gate_proj, l->up_proj, l->down_proj}) {
        auto [data, scale] = linear->frozen_weight();
        EXPECT_TRUE(inside(frozen_ranges, data) && inside(frozen_ranges, scale)) << "a frozen weight was copied";
        viewed += 2;
      }
    }
    EXPECT_EQ(viewed, 2 * 7 * 2);
    EXPECT_TRUE(torch::equal(logits_of(frozen, ids), logits_of(source, ids)));
    std::filesystem::remove(path);
    std::filesystem::remove(frozen_path);
  }
}

// save_safetensors writes a new file and renames it over the old: a model that maps the
// old one keeps its weights (the old inode lives on until the model lets it go).
TEST(Loading, ASaveOverTheMappedFileLeavesTheModelAsItWas) {
  torch::manual_seed(93);
  models::CausalLM source(small_config(true), 64);
  const auto ids = torch::randint(0, 96, {1, 7}, torch::kLong);
  const std::string path = temp_path("loading_replaced.safetensors");
  const torchattn::NamedTensors state = save_state(source, path);
  models::CausalLM loaded = loaded_from(path, true);
  const auto before = logits_of(loaded, ids);
  torchattn::NamedTensors other;
  for (const auto& [name, t] : state) other.emplace_back(name, t * 2 + 1);
  torchattn::save_safetensors(path, other);
  EXPECT_TRUE(torch::equal(logits_of(loaded, ids), before)) << "the replaced file reached the model";
  std::filesystem::remove(path);
}

// A file written in place under the model: the mapping is the file's pages, so the model
// sees the new bytes (docs/models.md: replace files, never write into one in use). A file
// truncated under it: the next read of a page past the new end raises SIGBUS, as for any
// mapped file, which kills the process (a death test: in a child).
TEST(Loading, AFileChangedInPlaceReachesTheModelAndOneTruncatedKillsItWithSigbus) {
  torch::manual_seed(94);
  models::CausalLM source(small_config(true), 64);
  const std::string path = temp_path("loading_in_place.safetensors");
  save_state(source, path);
  models::CausalLM loaded = loaded_from(path, true);
  const at::Tensor norm = loaded->norm->weight;
  ASSERT_TRUE(inside(mappings_of(path), norm));
  {
    // The final norm's weights rewritten in place at their offset in the file.
    const auto base = reinterpret_cast<uintptr_t>(mappings_of(path).front().first);
    const auto offset = static_cast<std::streamoff>(reinterpret_cast<uintptr_t>(norm.const_data_ptr()) - base);
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(offset);
    const std::vector<float> twos(static_cast<size_t>(norm.numel()), 2.0f);
    file.write(reinterpret_cast<const char*>(twos.data()), static_cast<std::streamsize>(twos.size() * sizeof(float)));
  }
  EXPECT_TRUE(torch::equal(norm, torch::full_like(norm, 2.0f))) << "an in-place write did not reach the mapping";

  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        models::CausalLM model = loaded_from(path, true);
        std::filesystem::resize_file(path, 0);
        logits_of(model, torch::zeros({1, 3}, torch::kLong));
      },
      ::testing::KilledBySignal(SIGBUS), "");
  std::filesystem::remove(path);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// `source` frozen in int8 and saved as a folder (save_frozen_folder, from an empty
// source folder) in a fresh temporary folder named after `tag`; returns it.
std::filesystem::path saved_int8_folder(models::CausalLM& source, const std::string& tag) {
  namespace fs = std::filesystem;
  source->freeze_weights(WeightFormat::Int8);
  const fs::path empty = temp_path(tag + "_source"), dir = temp_path(tag + "_int8");
  fs::remove_all(empty);
  fs::remove_all(dir);
  fs::create_directories(empty);
  models::save_frozen_folder(source, empty.string(), dir.string());
  return dir;
}

// A folder without tokenizer.json, or with one this library cannot read, loads and
// generates from token ids: the tokens of models::generate over the same weights, no
// text; what needs text is an error naming the folder, or what the reader found.
TEST(Loading, AFolderWithoutATokenizerGeneratesFromTokenIds) {
  namespace fs = std::filesystem;
  torch::manual_seed(97);
  models::CausalLM source(small_config(false), 64);
  source->eval();
  source->freeze_weights(WeightFormat::Int8);
  const fs::path from = temp_path("no_tokenizer_source"), dir = temp_path("no_tokenizer_int8");
  fs::remove_all(from);
  fs::remove_all(dir);
  fs::create_directories(from);
  write_text(from / "config.json",
             R"({"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 130,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "max_position_embeddings": 64, "rope_theta": 10000.0, "tie_word_embeddings": false})");
  models::save_frozen_folder(source, from.string(), dir.string());
  ASSERT_FALSE(fs::exists(dir / "tokenizer.json"));
  auto lm = models::LanguageModel::from_pretrained(dir.string());
  EXPECT_FALSE(lm.has_tokenizer());
  const auto options = models::GenerationOptions().max_new_tokens(6);
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4, 5}};
  const auto got = lm.generate_from_ids(prompts, options,
                                        [](size_t, const std::string&) { ADD_FAILURE() << "text, no tokenizer"; });
  models::CausalLM again = models::load_causal_lm(lm.config(), 64, dir.string(), WeightFormat::Float32, true);
  const auto want = models::generate(*again, prompts, options);
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(got[b].ids, want[b].ids) << "prompt " << b;
    EXPECT_EQ(got[b].ids.size(), 6u);
    EXPECT_EQ(got[b].text, "");
    EXPECT_EQ(got[b].prompt_tokens, static_cast<int64_t>(prompts[b].size()));
    EXPECT_GT(got[b].prefill_seconds, 0.0);
  }
  const std::string no_tokenizer = "LanguageModel: '" + dir.string() +
                                   "' has no tokenizer.json; give prompts as token ids (generate_from_ids)";
  expect_error([&] { lm.tokenizer(); }, no_tokenizer);
  expect_error([&] { lm.generate({"hello"}); }, no_tokenizer);
  // One this library cannot read: the same for ids, and its reader's words for text.
  write_text(dir / "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  auto unread = models::LanguageModel::from_pretrained(dir.string());
  EXPECT_FALSE(unread.has_tokenizer());
  const auto again_ids = unread.generate_from_ids(prompts, options);
  for (size_t b = 0; b < prompts.size(); ++b) EXPECT_EQ(again_ids[b].ids, want[b].ids) << "prompt " << b;
  expect_error([&] { unread.tokenizer(); }, "LanguageModel: tokenizer: '" + (dir / "tokenizer.json").string() +
                                                "' is a Unigram tokenizer; this library reads BPE");
  expect_error([&] { unread.generate({"hello"}); }, "(token ids need no tokenizer: generate_from_ids)");
  fs::remove_all(dir);
  fs::remove_all(from);
}

// A saved folder of int8 weights handed to load_hf_weights (which loads float32
// checkpoints) is named as such, the folder or its model.safetensors alike, not left to
// the loader's words about its first tensor's dtype.
TEST(Loading, ASavedFolderGivenAsAHuggingFaceCheckpointIsNamed) {
  namespace fs = std::filesystem;
  torch::manual_seed(96);
  models::CausalLM source(small_config(false), 64);
  const fs::path dir = saved_int8_folder(source, "saved_as_hf");
  for (const fs::path& given : {dir, dir / "model.safetensors"}) {
    models::CausalLM model(small_config(false), 64, models::Init::ForLoading);
    expect_error([&] { model->load_hf_weights(given.string()); },
                 "CausalLM: load_hf_weights: '" + given.string() +
                     "' is a folder of frozen weights that torchattn "
                     "saved (" +
                     (dir / models::kSavedWeightsFile).string() +
                     "), not a Hugging Face checkpoint of float32 weights; load it with "
                     "LanguageModel::from_pretrained or models::load_causal_lm");
  }
  fs::remove_all(dir);
  fs::remove_all(temp_path("saved_as_hf_source"));
}

// A saved folder (save_frozen_folder) records an xxh64 checksum of each tensor: a byte
// changed in any tensor's data is an error naming that tensor, unless the check is
// skipped; a note from before checksums loads unchecked; a note that names other
// tensors is an error.
TEST(Loading, ASavedFolderFindsADamagedTensorByItsChecksum) {
  namespace fs = std::filesystem;
  torch::manual_seed(95);
  models::CausalLM source(small_config(false), 64);
  source->eval();
  const fs::path dir = saved_int8_folder(source, "checksum");
  const std::string note = read_text(dir / models::kSavedWeightsFile);
  EXPECT_NE(note.find("\"algorithm\": \"xxh64\""), std::string::npos) << note;
  const auto ids = torch::randint(0, 96, {1, 9}, torch::kLong);
  auto load = [&](bool verify) {
    return models::load_causal_lm(small_config(false), 64, dir.string(), WeightFormat::Int8, verify);
  };
  {
    models::CausalLM loaded = load(true);
    loaded->eval();
    EXPECT_TRUE(torch::equal(logits_of(loaded, ids), logits_of(source, ids)));
  }
  const std::string weights = (dir / "model.safetensors").string();
  const std::string pristine = read_text(weights);
  // One bit flipped in the middle of each tensor in turn (the file rewritten, not the
  // mapped one changed under a model).
  std::vector<std::pair<std::string, size_t>> middles;  // each tensor's middle byte in the file
  {
    const auto tensors = torchattn::load_safetensors(weights);
    const auto ranges = mappings_of(weights);
    ASSERT_FALSE(ranges.empty());
    for (const auto& [name, t] : tensors) {
      middles.emplace_back(name,
                           reinterpret_cast<uintptr_t>(t.const_data_ptr()) - ranges.front().first + t.nbytes() / 2);
    }
  }
  int64_t damaged = 0;
  for (const auto& [name, offset] : middles) {
    std::string bytes = pristine;
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x10);
    write_text(weights + ".damaged", bytes);
    fs::rename(weights + ".damaged", weights);
    const std::string error = error_of([&] { load(true); });
    EXPECT_HAS(error, "LanguageModel::from_pretrained: tensor '" + name + "' of '" + weights +
                          "' does not match its checksum in torchattn_weights.json (xxh64 ");
    EXPECT_HAS(error, "): the file was damaged or changed after save_pretrained wrote it. Save the folder again; "
                      "LoadOptions::verify_weights(false) (--no-verify-weights) loads it unchecked");
    if (name == "layers.0.up_proj.weight") {
      EXPECT_EQ(error_of([&] { load(false); }), "(no error)") << "unchecked, a changed int8 weight loads";
    }
    ++damaged;
  }
  EXPECT_EQ(damaged, static_cast<int64_t>(source->frozen_state().size()));
  EXPECT_GE(damaged, 2 * 7 * 2) << "each layer's 7 weights and their scales, at least";
  write_text(weights, pristine);
  // A note from before checksums: loads unchecked.
  write_text(dir / models::kSavedWeightsFile, R"({"weight_format": "int8", "int8_group": 64})");
  EXPECT_EQ(error_of([&] { load(true); }), "(no error)");
  // A note that names another tensor, or another algorithm.
  std::string other = note;
  other.replace(other.find("\"norm.weight\""), 13, "\"norm.weihgt\"");
  write_text(dir / models::kSavedWeightsFile, other);
  EXPECT_HAS(error_of([&] { load(true); }), "torchattn_weights.json' records no checksum for 'norm.weight' of '" +
                                                weights +
                                                "': the weights are not the ones save_pretrained wrote there");
  other = note;
  other.replace(other.find("xxh64"), 5, "crc32");
  write_text(dir / models::kSavedWeightsFile, other);
  EXPECT_HAS(error_of([&] { load(true); }),
             "torchattn_weights.json': expected \"checksums\": {\"algorithm\": \"xxh64\", \"tensors\": {name: hex, "
             "...}}, got {\"algorithm\":\"crc32\"");
  EXPECT_EQ(error_of([&] { load(false); }), "(no error)") << "unchecked, the note's checksums are not read";
  fs::remove_all(dir);
  fs::remove_all(temp_path("checksum_source"));
}

// A saved folder whose note and weights disagree is named as such: a note that says
// bfloat16 over int8 weights, a note without checksums (a warning: it loads unchecked),
// int8 weights without their note.
TEST(Loading, ASavedFolderWhoseNoteAndWeightsDisagreeIsNamed) {
  namespace fs = std::filesystem;
  torch::manual_seed(94);
  models::CausalLM source(small_config(false), 64);
  const fs::path dir = saved_int8_folder(source, "note");
  const fs::path note = dir / models::kSavedWeightsFile;
  const std::string weights = (dir / "model.safetensors").string();
  auto load = [&] { return models::load_causal_lm(small_config(false), 64, dir.string(), WeightFormat::Float32); };
  const std::string saved = read_text(note);
  std::string bf16 = saved;
  bf16.replace(bf16.find("\"weight_format\": \"int8\""), 23, "\"weight_format\": \"bfloat16\"");
  write_text(note, bf16);
  EXPECT_HAS(error_of(load),
             "torchattn_weights.json' says \"weight_format\": \"bfloat16\", but '" + weights + "' holds '");
  EXPECT_HAS(error_of(load), "' as int8: the two files are not from one save_pretrained. Save the folder again");
  // Without checksums: a warning, once per load.
  struct Warnings : c10::WarningHandler {
    std::vector<std::string> seen;
    void process(const c10::Warning& w) override { seen.push_back(w.msg()); }
  } warnings;
  write_text(note, R"({"weight_format": "int8", "int8_group": 64})");
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    EXPECT_EQ(error_of(load), "(no error)");
  }
  ASSERT_EQ(warnings.seen.size(), 1u);
  EXPECT_HAS(warnings.seen[0], "torchattn_weights.json' records no checksums (saved before they were recorded): its "
                               "weights load unchecked. Load the folder and save_pretrained it again to record them");
  fs::remove(note);
  EXPECT_HAS(error_of(load), " is Char, expected a floating dtype for '");
  EXPECT_HAS(error_of(load), "(int8 weights saved by save_pretrained load with the torchattn_weights.json saved "
                             "beside them: is it missing?)");
  fs::remove_all(dir);
  fs::remove_all(temp_path("note_source"));
}

// A saved folder records its head layout: a config.json with the same tensor shapes but
// another split (4 heads of 16 read as 16 heads of 4) is refused, naming both; a float32
// checkpoint dropped in place of the int8 weights (checks off) is named as one.
TEST(Loading, ASavedFolderRefusesAnotherHeadLayoutAndAFloat32File) {
  namespace fs = std::filesystem;
  torch::manual_seed(93);
  models::CausalLM source(small_config(false), 64);
  const fs::path dir = saved_int8_folder(source, "layout");
  EXPECT_HAS(read_text(dir / models::kSavedWeightsFile), "\"head_layout\"");
  models::DecoderConfig swapped = small_config(false);  // 4 heads of 16 over 2: q [64, 64], k and v [32, 64]
  swapped.num_heads = 16;
  swapped.num_kv_heads = 8;
  swapped.own_head_dim = 4;
  const std::string error = error_of(
      [&] { models::load_causal_lm(swapped, 64, dir.string(), WeightFormat::Int8, /*verify=*/false); });
  EXPECT_HAS(error, "config.json' says 16 attention heads of 4 over 8 key-value heads, but the weights were saved for "
                    "4 attention heads of 16 over 2 key-value heads");
  EXPECT_HAS(error, "the same tensor shapes split otherwise would compute another model");
  EXPECT_EQ(error_of([&] { models::load_causal_lm(small_config(false), 64, dir.string(), WeightFormat::Int8); }),
            "(no error)");
  // A Hugging Face float32 model.safetensors in the int8 folder, checks off and on.
  models::CausalLM plain(small_config(false), 64);
  save_state(plain, (dir / "model.safetensors").string());
  for (const bool verify : {false, true}) {
    const std::string dropped = error_of(
        [&] { models::load_causal_lm(small_config(false), 64, dir.string(), WeightFormat::Int8, verify); });
    EXPECT_HAS(dropped, "torchattn_weights.json' says \"weight_format\": \"int8\", but '" +
                            (dir / "model.safetensors").string() +
                            "' holds no int8 tensor: it is a float32 checkpoint");
  }
  fs::remove_all(dir);
  fs::remove_all(temp_path("layout_source"));
}

}  // namespace
