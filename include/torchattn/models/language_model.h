#pragma once

// A Hugging Face decoder folder (llama, qwen2, qwen3, mistral: config.json, safetensors
// weights, tokenizer.json), or a GGUF file, as one object: text in, text out.
//
//   auto lm = torchattn::models::LanguageModel::from_pretrained("SmolLM2-135M-Instruct");
//   auto out = lm.generate({lm.chat_prompt("What is the capital of France?")},
//                          torchattn::models::GenerationOptions().max_new_tokens(32));
//   std::cout << out[0].text << "\n";

#include <torchattn/models/causal_lm.h>
#include <torchattn/models/chat.h>
#include <torchattn/models/generation.h>
#include <torchattn/models/load_options.h>
#include <torchattn/models/tokenizer.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::models {

struct Completion {
  std::string text;  // what the new tokens add to the prompt's text, the stop token left out (none without a tokenizer)
  std::vector<int64_t> ids;  // the new tokens, the stop token included if one came
  bool stopped = false;      // ended by a stop token (else by max_new_tokens)
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0.0;  // the batch's prompt forward and first token
  double decode_seconds = 0.0;   // every step after the first
};

class LanguageModel {
 public:
  /// Loads `folder`: config.json (model_type llama, qwen2 or mistral; another type is
  /// an error naming the supported ones), model.safetensors or its sharded index
  /// (tied or untied embeddings), tokenizer.json, and the chat template if any. A
  /// folder without tokenizer.json, or with one this library cannot read, loads too:
  /// it generates from token ids (generate_from_ids), and what needs text (generate,
  /// tokenizer()) is an error naming the folder, or what the tokenizer's reader
  /// found. A tokenizer that reads but belongs to another model is an error here.
  /// Weights are checked strictly (a missing, extra or misshapen tensor is an error
  /// naming it and its file), then moved to `options`' device and dtype.
  /// A folder that save_pretrained wrote (torchattn_weights.json beside the weights)
  /// loads its bfloat16 or int8 weights as they are, never reading float32 ones: on
  /// the CPU in float32 activations; options' weight_format must be that format or
  /// float32 (the default), and a tensor that does not fit the config is an error
  /// naming it.
  ///
  /// `folder` may also be a GGUF file (llama.cpp's single file: general.architecture
  /// llama or qwen2, a byte-level BPE tokenizer): its config, tokenizer and chat
  /// template from the metadata, its weights dequantized to float32 (gguf_model.h), the
  /// same model transformers loads from it; then options apply as for a folder.
  static LanguageModel from_pretrained(const std::string& folder, const LoadOptions& options = {});
  /// Writes a frozen model (LoadOptions::weight_format bfloat16 or int8) as a folder
  /// that from_pretrained loads: the source folder's config.json, tokenizer and chat
  /// template files, model.safetensors holding CausalLMImpl::frozen_state (about a
  /// quarter of the float32 file in int8), and torchattn_weights.json naming the
  /// format. `folder` is created; files of those names in it are replaced. A float32
  /// model is an error (its folder is the source's).
  void save_pretrained(const std::string& folder) const;

  /// Generates after each prompt (text, tokenized as is: see chat_prompt), batched.
  /// on_text, if given, gets (prompt index, text) for each piece of text as it
  /// comes (whole UTF-8 characters; the stop token left out).
  std::vector<Completion> generate(const std::vector<std::string>& prompts, const GenerationOptions& options = {},
                                   const std::function<void(size_t, const std::string&)>& on_text = nullptr);
  /// generate() after prompts given as token ids (each in [0, vocab_size)), as a
  /// tokenizer of another program gives them: the same stop tokens and steps. Without
  /// a tokenizer.json the completions have no text and on_text is not called.
  std::vector<Completion> generate_from_ids(const std::vector<std::vector<int64_t>>& prompts,
                                            const GenerationOptions& options = {},
                                            const std::function<void(size_t, const std::string&)>& on_text = nullptr);

  /// `message` as one user turn of the folder's chat template (<|im_start|> formats,
  /// as SmolLM2's and Qwen2's), ready for the assistant's answer. An error when the
  /// folder has no template or one of another format.
  std::string chat_prompt(const std::string& message) const;
  /// A conversation (see models::chat_prompt), ready for the assistant's answer.
  std::string chat_prompt(const std::vector<ChatMessage>& messages) const;
  bool has_chat_template() const { return chat_template_.has_value(); }

  /// The template's end-of-turn token (<|im_end|>) when it has one (and the folder a
  /// tokenizer.json): generate stops at it.
  std::optional<int64_t> end_of_turn() const { return end_of_turn_; }

  CausalLM& model() { return model_; }
  const CausalLM& model() const { return model_; }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  /// The folder's tokenizer; an error naming the folder where it has no tokenizer.json.
  const Tokenizer& tokenizer() const;
  const DecoderConfig& config() const { return model_->config(); }

 private:
  LanguageModel(CausalLM model, std::optional<Tokenizer> tokenizer, std::string tokenizer_error,
                std::optional<std::string> chat_template, std::string folder);
  static LanguageModel from_gguf(const std::string& path, const LoadOptions& options);
  CausalLM model_;
  std::string folder_;  // the folder it was loaded from
  std::optional<Tokenizer> tokenizer_;
  std::string tokenizer_error_;  // why tokenizer.json did not read, where it did not
  std::optional<std::string> chat_template_;
  std::optional<int64_t> end_of_turn_;
};

}  // namespace torchattn::models
