#include <torchattn/models/language_model.h>

#include <torchattn/models/chat.h>
#include <torchattn/gguf.h>
#include <torchattn/models/folder_checks.h>
#include <torchattn/models/gguf_model.h>
#include <torchattn/models/saved_folder.h>
#include <torchattn/models/weights.h>
#include <torchattn/safetensors.h>

#include "models/pretrained/load_checks.h"
#include "models/text/utf8_check.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>

namespace torchattn::models {

LanguageModel::LanguageModel(CausalLM model, std::optional<Tokenizer> tokenizer, std::string tokenizer_error,
                             std::optional<std::string> chat_template, std::string folder)
    : model_(std::move(model)), folder_(std::move(folder)), tokenizer_(std::move(tokenizer)),
      tokenizer_error_(std::move(tokenizer_error)), chat_template_(std::move(chat_template)) {
  if (chat_template_ && tokenizer_) end_of_turn_ = tokenizer_->id_of("<|im_end|>");
}

const Tokenizer& LanguageModel::tokenizer() const {
  TORCH_CHECK(tokenizer_.has_value() || !tokenizer_error_.empty(), "LanguageModel: '", folder_,
              "' has no tokenizer.json; give prompts as token ids (generate_from_ids)");
  TORCH_CHECK(tokenizer_.has_value(), "LanguageModel: ", tokenizer_error_,
              " (token ids need no tokenizer: generate_from_ids)");
  return *tokenizer_;
}

LanguageModel LanguageModel::from_gguf(const std::string& path, const LoadOptions& options) {
  const auto file = torchattn::GgufFile::open(path);
  const DecoderConfig config = gguf_decoder_config(file);
  const int64_t context = pretrained::context_length_for(options, config.max_position_embeddings,
                                                         "the context_length of '" + path + "'");
  // One this library cannot read (a pre-tokenizer it does not know) leaves the ids.
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_error;
  try {
    tokenizer.emplace(Tokenizer::from_gguf(file, path));
  } catch (const c10::Error& e) {
    tokenizer_error = e.what_without_backtrace();
  }
  const bool int4 = options.weight_format() == torchattn::WeightFormat::Int4;
  // int4: the file's Q4_0 and Q4_1 blocks kept as they are, never widened (the other
  // types quantized tensor by tensor): gguf_hf_int4_tensors.
  CausalLM model = int4 ? CausalLM(config, context, torchattn::WeightFormat::Int4)
                        : CausalLM(config, context, Init::ForLoading);
  model->pack_weights(options.pack_weights().value_or(false));
  if (int4) {
    const WeightsOptions rules = model->hf_weights();
    torchattn::NamedTensors tensors;
    for (auto& [name, t] : gguf_hf_int4_tensors(file, config)) {
      if (config.tie_word_embeddings && name.starts_with("lm_head.")) continue;  // the table is the head
      tensors.emplace_back(renamed(name, rules), std::move(t));
    }
    model->load_frozen_state(std::move(tensors), torchattn::WeightFormat::Int4);
  } else {
    model->load_hf_tensors(gguf_hf_tensors(file, config), path);
  }
  if (options.device() != model->embed_tokens->weight.device() || options.dtype() != at::kFloat) {
    model->to(options.device(), options.dtype());
  }
  model->eval();
  if (!int4 && options.weight_format() != torchattn::WeightFormat::Float32) {
    model->freeze_weights(options.weight_format());
  }
  std::optional<std::string> chat_template;
  if (file.has("tokenizer.chat_template")) chat_template = file.string("tokenizer.chat_template");
  return LanguageModel(std::move(model), std::move(tokenizer), std::move(tokenizer_error), std::move(chat_template),
                       path);
}

LanguageModel LanguageModel::from_pretrained(const std::string& folder, const LoadOptions& options) {
  namespace fs = std::filesystem;
  pretrained::check_load_options(options);
  if (is_gguf_file(folder)) return from_gguf(folder, options);
  TORCH_CHECK(fs::is_directory(folder), "LanguageModel::from_pretrained: '", folder,
              "' is not a folder (nor a GGUF file)");
  const std::string config_path = (fs::path(folder) / "config.json").string();
  const std::string type = read_model_type(config_path);
  TORCH_CHECK(type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral" || type == "gemma2",
              "LanguageModel::from_pretrained: '", folder, "' holds a ", type,
              " model; LanguageModel runs llama, qwen2, qwen3, mistral and gemma2",
              type == "bert"   ? " (load a bert folder with SentenceEncoder::from_pretrained)"
              : type == "bart" ? " (load a bart folder with Seq2SeqLM and read_bart_config)"
                               : "",
              "; supported: ", supported_model_types());
  const DecoderConfig config = read_decoder_config(config_path);
  const int64_t context = pretrained::context_length_for(options, config.max_position_embeddings,
                                                         "the max_position_embeddings of '" + config_path + "'");
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_error;
  if (const fs::path file = fs::path(folder) / "tokenizer.json"; fs::exists(file)) {
    // One this library cannot read leaves the ids; one of another model is an error.
    try {
      tokenizer.emplace(file.string());
    } catch (const c10::Error& e) {
      tokenizer_error = e.what_without_backtrace();
    }
    if (tokenizer) check_tokenizer(folder, config, *tokenizer);
  }
  const auto saved = saved_weight_format(folder);
  CausalLM model = saved ? CausalLM(config, context, *saved) : CausalLM(config, context, Init::ForLoading);
  model->pack_weights(options.pack_weights().value_or(false));
  if (saved) {
    // A folder of save_pretrained: its frozen weights as they are.
    TORCH_CHECK(options.weight_format() == torchattn::WeightFormat::Float32 || options.weight_format() == *saved,
                "LanguageModel::from_pretrained: '", folder, "' holds ", torchattn::to_string(*saved),
                " weights (torchattn_weights.json); LoadOptions::weight_format asked for ",
                torchattn::to_string(options.weight_format()));
    TORCH_CHECK(options.device().is_cpu() && options.dtype() == at::kFloat, "LanguageModel::from_pretrained: '", folder,
                "' holds ", torchattn::to_string(*saved),
                " weights, which run on the CPU with float32 activations; got LoadOptions device ", options.device(),
                " and dtype ", options.dtype());
    model->load_frozen_state(load_saved_weights(folder, options.verify_weights()), *saved);
    model->eval();
  } else {
    model->load_hf_weights(folder);
    if (options.device() != model->embed_tokens->weight.device() || options.dtype() != at::kFloat) {
      model->to(options.device(), options.dtype());
    }
    model->eval();
    if (options.weight_format() != torchattn::WeightFormat::Float32) model->freeze_weights(options.weight_format());
  }
  return LanguageModel(std::move(model), std::move(tokenizer), std::move(tokenizer_error), read_chat_template(folder),
                       folder);
}

void LanguageModel::save_pretrained(const std::string& folder) const {
  TORCH_CHECK(!is_gguf_file(folder_), "LanguageModel::save_pretrained: the model was loaded from the GGUF file '",
              folder_, "', which has no folder of config and tokenizer files to save beside its weights; load the ",
              "Hugging Face folder to save one");
  save_frozen_folder(model_, folder_, folder);
}

std::string LanguageModel::chat_prompt(const std::string& message) const {
  TORCH_CHECK(chat_template_.has_value(), "LanguageModel::chat_prompt: this model folder has no chat template");
  return models::chat_prompt(*chat_template_, message);
}

std::string LanguageModel::chat_prompt(const std::vector<ChatMessage>& messages) const {
  TORCH_CHECK(chat_template_.has_value(), "LanguageModel::chat_prompt: this model folder has no chat template");
  return models::chat_prompt(*chat_template_, messages);
}

std::vector<Completion> LanguageModel::generate(const std::vector<std::string>& prompts,
                                                const GenerationOptions& options_in,
                                                const std::function<void(size_t, const std::string&)>& on_text) {
  std::vector<std::vector<int64_t>> ids;
  for (const auto& p : prompts) {
    text::check_utf8("LanguageModel::generate", p, "prompt " + std::to_string(ids.size()));
    ids.push_back(tokenizer().encode(p));
    TORCH_CHECK(!ids.back().empty(), "LanguageModel::generate: prompt ", ids.size() - 1, " has no tokens");
  }
  return generate_from_ids(ids, options_in, on_text);
}

std::vector<Completion> LanguageModel::generate_from_ids(
    const std::vector<std::vector<int64_t>>& ids, const GenerationOptions& options_in,
    const std::function<void(size_t, const std::string&)>& on_text) {
  GenerationOptions options = options_in;
  std::vector<int64_t> stop = options.stop_token_ids();
  if (end_of_turn_ && options.stop_at_eos()) stop.push_back(*end_of_turn_);
  const auto& eos = config().eos_token_ids;
  auto is_stop = [&](int64_t id) {
    return std::find(stop.begin(), stop.end(), id) != stop.end() ||
           (options.stop_at_eos() && std::find(eos.begin(), eos.end(), id) != eos.end());
  };
  options.stop_token_ids(stop);
  // Each text is what the new tokens add after the prompt's last token (a SentencePiece
  // token's space kept, as a text completion needs it).
  std::vector<DecodeStream> streams;
  for (size_t b = 0; tokenizer_ && b < ids.size(); ++b) {
    streams.emplace_back(*tokenizer_, false, std::vector<int64_t>{ids[b].back()});
  }
  std::vector<std::string> texts(ids.size());
  const auto user_on_token = options_in.on_token();
  options.on_token([&](size_t b, int64_t id) {
    if (user_on_token) user_on_token(b, id);
    if (is_stop(id) || !tokenizer_) return;
    const std::string piece = streams[b].push(id);
    texts[b] += piece;
    if (on_text && !piece.empty()) on_text(b, piece);
  });
  const auto results = models::generate(*model_, ids, options);
  std::vector<Completion> out(ids.size());
  for (size_t b = 0; b < ids.size(); ++b) {
    const std::string rest = tokenizer_ ? streams[b].finish() : std::string();
    if (on_text && !rest.empty()) on_text(b, rest);
    out[b].text = texts[b] + rest;
    out[b].ids = results[b].ids;
    out[b].stopped = results[b].stopped;
    out[b].prompt_tokens = results[b].prompt_tokens;
    out[b].prefill_seconds = results[b].prefill_seconds;
    out[b].decode_seconds = results[b].decode_seconds;
  }
  return out;
}

}  // namespace torchattn::models
