#include <torchattn/models/saved_folder.h>

#include <torchattn/checksum.h>
#include <torchattn/safetensors.h>

#include "models/files/json_file.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace torchattn::models {

std::optional<torchattn::WeightFormat> saved_weight_format(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / kSavedWeightsFile).string();
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json note = files::read_json_file(path, "LanguageModel::from_pretrained");
  const auto format = note.find("weight_format");
  TORCH_CHECK(format != note.end() && format->is_string() &&
                  (*format == "bfloat16" || *format == "int8" || *format == "int4"),
              "LanguageModel::from_pretrained: '", path,
              "': expected \"weight_format\": \"bfloat16\", \"int8\" or \"int4\", got ",
              format == note.end() ? std::string("none") : format->dump());
  const torchattn::WeightFormat f = torchattn::weight_format_from_string(format->get<std::string>());
  if (f == torchattn::WeightFormat::Int8) {
    const auto group = note.find("int8_group");
    TORCH_CHECK(group != note.end() && group->is_number_integer() && group->get<int64_t>() == kInt8GroupSize,
                "LanguageModel::from_pretrained: '", path, "': expected \"int8_group\": ", kInt8GroupSize,
                " (inputs per scale), got ", group == note.end() ? std::string("none") : group->dump());
  }
  if (f == torchattn::WeightFormat::Int4) {
    const auto group = note.find("int4_group");
    TORCH_CHECK(group != note.end() && group->is_number_integer() && group->get<int64_t>() == kInt4GroupSize,
                "LanguageModel::from_pretrained: '", path, "': expected \"int4_group\": ", kInt4GroupSize,
                " (inputs per (d, m) pair), got ", group == note.end() ? std::string("none") : group->dump());
  }
  return f;
}

NamedTensors load_saved_weights(const std::string& folder, bool verify) {
  namespace fs = std::filesystem;
  const std::string weights_path = (fs::path(folder) / "model.safetensors").string();
  NamedTensors tensors = load_safetensors(weights_path);
  const std::string note_path = (fs::path(folder) / kSavedWeightsFile).string();
  const nlohmann::json note = files::read_json_file(note_path, "LanguageModel::from_pretrained");
  const std::string where = "LanguageModel::from_pretrained: '" + note_path + "'";
  // The note and the weights of one save: the weights in the note's format (bfloat16,
  // int8 or int4's uint8 tensors), none in another of the three (but an int4 model's
  // int8 head: CausalLM::weight_format).
  const std::string saved = note.value("weight_format", std::string());
  const char* saved_words = saved == "int8" ? "int8" : saved == "int4" ? "int4" : "bfloat16";
  const auto saved_dtype = saved == "int8" ? at::kChar : saved == "int4" ? at::kByte : at::kBFloat16;
  const auto words_of = [](at::ScalarType t) {
    return t == at::kChar ? "int8" : t == at::kByte ? "int4 (uint8)" : "bfloat16";
  };
  const auto other = std::find_if(tensors.begin(), tensors.end(), [&](const auto& named) {
    const at::ScalarType t = named.second.scalar_type();
    return t != saved_dtype && (t == at::kChar || t == at::kByte || t == at::kBFloat16) &&
           !(saved_dtype == at::kByte && t == at::kChar);
  });
  TORCH_CHECK(other == tensors.end(), where, " says \"weight_format\": \"", saved_words, "\", but '", weights_path,
              "' holds '", other->first, "' as ", other == tensors.end() ? "" : words_of(other->second.scalar_type()),
              ": the two files are not from one save_pretrained. Save the folder again");
  // A checkpoint of another kind dropped in (a Hugging Face float32 model.safetensors):
  // none of its tensors are in the note's format.
  const bool any_saved = std::any_of(tensors.begin(), tensors.end(),
                                     [&](const auto& named) { return named.second.scalar_type() == saved_dtype; });
  if (!any_saved && !tensors.empty()) {
    const auto first_float = std::find_if(tensors.begin(), tensors.end(), [](const auto& named) {
      return at::isFloatingType(named.second.scalar_type());
    });
    const auto& example = first_float != tensors.end() ? *first_float : tensors.front();
    const at::ScalarType dtype = example.second.scalar_type();
    const std::string kind = dtype == at::kFloat ? "float32" : dtype == at::kHalf ? "float16" : c10::toString(dtype);
    TORCH_CHECK(false, where, " says \"weight_format\": \"", saved_words, "\", but '", weights_path, "' holds no ",
                saved_words, " tensor: it is a ", kind, " checkpoint ('", example.first, "' is ", kind,
                "; a Hugging Face model.safetensors?), not the weights save_pretrained wrote there. Put the saved "
                "model.safetensors back, or load the Hugging Face folder itself (--dtype ",
                saved_words, " quantizes it at load)");
  }
  if (!verify) return tensors;
  const auto recorded = note.find("checksums");
  if (recorded == note.end()) {
    TORCH_WARN(where, " records no checksums (saved before they were recorded): its weights load unchecked. ",
               "Load the folder and save_pretrained it again to record them");
    return tensors;
  }
  const auto algorithm = recorded->is_object() ? recorded->find("algorithm") : recorded->end();
  const auto listed = recorded->is_object() ? recorded->find("tensors") : recorded->end();
  TORCH_CHECK(algorithm != recorded->end() && *algorithm == "xxh64" && listed != recorded->end() && listed->is_object(),
              where, ": expected \"checksums\": {\"algorithm\": \"xxh64\", \"tensors\": {name: hex, ...}}, got ",
              recorded->dump().substr(0, 200));
  const nlohmann::json& sums = *listed;
  std::vector<at::Tensor> values;
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(sums.contains(name), where, " records no checksum for '", name, "' of '", weights_path,
                "': the weights are not the ones save_pretrained wrote there");
    values.push_back(t);
  }
  TORCH_CHECK(sums.size() == tensors.size(), where, " records ", sums.size(), " checksums, '", weights_path, "' holds ",
              tensors.size(), " tensors: the weights are not the ones save_pretrained wrote there");
  const std::vector<uint64_t> got = tensor_xxh64(values);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    const nlohmann::json& want = *sums.find(name);
    std::string what = where;
    what.append("'s checksum of '").append(name).append("'");
    const uint64_t expected = checksum_from_hex(want.is_string() ? want.get<std::string>() : want.dump(), what);
    TORCH_CHECK(got[i] == expected, "LanguageModel::from_pretrained: tensor '", name, "' of '", weights_path,
                "' does not match its checksum in ", kSavedWeightsFile, " (xxh64 ", checksum_hex(expected),
                ", the file's ", checksum_hex(got[i]),
                "): the file was damaged or changed after save_pretrained wrote it. Save the folder again; "
                "LoadOptions::verify_weights(false) (--no-verify-weights) loads it unchecked");
  }
  return tensors;
}

namespace {

// The head layout a save records: a config with the same tensor shapes but another split
// into heads (4 heads of 16 read as 16 of 4) would load and compute another model.
nlohmann::json head_layout(const DecoderConfig& config) {
  return {{"num_attention_heads", config.num_heads},
          {"num_key_value_heads", config.num_kv_heads},
          {"head_dim", config.head_dim()}};
}

std::string layout_words(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return std::to_string(heads) + " attention heads of " + std::to_string(head_dim) + " over " +
         std::to_string(kv_heads) + " key-value heads";
}

// The config against the head layout the folder's note records (a save from before it
// was recorded: not checked).
void check_head_layout(const DecoderConfig& config, const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / kSavedWeightsFile).string();
  const nlohmann::json note = files::read_json_file(path, "LanguageModel::from_pretrained");
  const auto recorded = note.find("head_layout");
  if (recorded == note.end()) return;
  const auto number = [&](const char* key) -> int64_t {
    const auto it = recorded->is_object() ? recorded->find(key) : recorded->end();
    TORCH_CHECK(it != recorded->end() && it->is_number_integer(), "LanguageModel::from_pretrained: '", path,
                "': expected \"head_layout\": {\"num_attention_heads\", \"num_key_value_heads\", \"head_dim\"} as "
                "integers, got ",
                recorded->dump().substr(0, 200));
    return it->get<int64_t>();
  };
  const int64_t heads = number("num_attention_heads"), kv_heads = number("num_key_value_heads"),
                head_dim = number("head_dim");
  TORCH_CHECK(heads == config.num_heads && kv_heads == config.num_kv_heads && head_dim == config.head_dim(),
              "LanguageModel::from_pretrained: '", (std::filesystem::path(folder) / "config.json").string(), "' says ",
              layout_words(config.num_heads, config.num_kv_heads, config.head_dim()),
              ", but the weights were saved for ", layout_words(heads, kv_heads, head_dim), " (", path,
              "'s head_layout): the same tensor shapes split otherwise would compute another model. Put back the "
              "config.json saved with the weights");
}

}  // namespace

torchattn::WeightFormat load_folder_weights(CausalLM& model, const std::string& folder, torchattn::WeightFormat format,
                                            bool verify) {
  if (const auto saved = saved_weight_format(folder)) {
    check_head_layout(model->config(), folder);
    TORCH_CHECK(format == torchattn::WeightFormat::Float32 || format == *saved, "'", folder, "' holds ",
                torchattn::to_string(*saved), " weights (", kSavedWeightsFile, "), asked for ",
                torchattn::to_string(format));
    model->load_frozen_state(load_saved_weights(folder, verify), *saved);
    return *saved;
  }
  model->load_hf_weights(folder);
  if (format != torchattn::WeightFormat::Float32) model->freeze_weights(format);
  return format;
}

CausalLM load_causal_lm(const DecoderConfig& config, int64_t context_length, const std::string& folder,
                        torchattn::WeightFormat format, bool verify) {
  torchattn::check_weight_format(format, "models::load_causal_lm: format");
  const auto saved = saved_weight_format(folder);
  CausalLM model = saved ? CausalLM(config, context_length, *saved)
                         : CausalLM(config, context_length, Init::ForLoading);
  load_folder_weights(model, folder, format, verify);
  return model;
}

void save_frozen_folder(const CausalLM& model, const std::string& source, const std::string& folder) {
  namespace fs = std::filesystem;
  const torchattn::WeightFormat format = model->weight_format();
  TORCH_CHECK(format == torchattn::WeightFormat::BFloat16 || format == torchattn::WeightFormat::Int8 ||
                  format == torchattn::WeightFormat::Int4,
              "LanguageModel::save_pretrained writes a frozen model's bfloat16, int8 or int4 weights ",
              "(LoadOptions::weight_format); this one's are ", torchattn::to_string(format),
              format == torchattn::WeightFormat::Float32
                  ? ": its folder is '" + source + "'"
                  : " (quantized at load, not saved): load it from '" + source + "' with dynamic-int8 again");
  std::error_code ec;
  const bool same = fs::exists(folder, ec) && fs::weakly_canonical(folder, ec) == fs::weakly_canonical(source, ec);
  TORCH_CHECK(!same, "LanguageModel::save_pretrained: '", folder,
              "' is the folder the model was loaded from; write to another");
  ec.clear();
  fs::create_directories(folder, ec);
  TORCH_CHECK(!ec && fs::is_directory(folder), "LanguageModel::save_pretrained: cannot make the folder '", folder,
              "': ", ec ? ec.message() : std::string("a file of that name is in the way"));
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "chat_template.jinja", "chat_template.json"}) {
    const fs::path from = fs::path(source) / name;
    if (fs::exists(from)) fs::copy_file(from, fs::path(folder) / name, fs::copy_options::overwrite_existing);
  }
  const NamedTensors state = model->frozen_state();
  save_safetensors((fs::path(folder) / "model.safetensors").string(), state,
                   {{"format", "pt"}, {"torchattn.weight_format", std::string(torchattn::to_string(format))}});
  nlohmann::json note{{"weight_format", std::string(torchattn::to_string(format))},
                      {"tensor_names", "torchattn CausalLM parameters (CausalLMImpl::frozen_state)"}};
  // One checksum per tensor, of the bytes as the file holds them: loading finds a
  // damaged or changed file (load_saved_weights).
  std::vector<at::Tensor> values;
  for (const auto& [name, t] : state) values.push_back(t.cpu());
  const std::vector<uint64_t> sums = tensor_xxh64(values);
  nlohmann::json by_name = nlohmann::json::object();
  for (size_t i = 0; i < state.size(); ++i) by_name[state[i].first] = checksum_hex(sums[i]);
  note["checksums"] = {{"algorithm", "xxh64"}, {"tensors", std::move(by_name)}};
  if (format == torchattn::WeightFormat::Int8) note["int8_group"] = kInt8GroupSize;
  if (format == torchattn::WeightFormat::Int4) note["int4_group"] = kInt4GroupSize;
  note["head_layout"] = head_layout(model->config());
  const std::string path = (fs::path(folder) / kSavedWeightsFile).string();
  std::ofstream out(path);
  TORCH_CHECK(out, "LanguageModel::save_pretrained: cannot write '", path, "'");
  out << note.dump(2) << "\n";
  TORCH_CHECK(out.good(), "LanguageModel::save_pretrained: writing '", path, "' failed");
}

}  // namespace torchattn::models
