#pragma once

// A model folder of frozen weights (bfloat16 or int8; CausalLMImpl::freeze_weights):
// the source folder's config, tokenizer and chat template, model.safetensors holding
// CausalLMImpl::frozen_state, and torchattn_weights.json naming the format, which
// LanguageModel::from_pretrained (and torchattn_generate, torchattn_serve,
// torchattn_perplexity) load as they are, never reading float32 weights.
//
//   auto lm = torchattn::models::LanguageModel::from_pretrained(
//       "SmolLM2-135M-Instruct", torchattn::models::LoadOptions().weight_format(torchattn::WeightFormat::Int8));
//   lm.save_pretrained("SmolLM2-135M-Instruct-int8");  // about a quarter of the float32 file

#include <torchattn/models/causal_lm.h>
#include <torchattn/safetensors.h>
#include <torchattn/weight_format.h>

#include <optional>
#include <string>

namespace torchattn::models {

/// The note beside the weights: {"weight_format": "int8", "int8_group": 64, ...}.
inline constexpr const char* kSavedWeightsFile = "torchattn_weights.json";

/// The format of `folder`'s frozen weights when it is such a folder (it has the note),
/// else none (a Hugging Face folder of float32 weights). A note that names no bfloat16
/// or int8 format, or int8 groups other than kInt8GroupSize, is an error naming it.
std::optional<torchattn::WeightFormat> saved_weight_format(const std::string& folder);

/// The tensors of a saved frozen folder's model.safetensors (mapped, not copied). When
/// `verify`, each is checked against the xxh64 checksum that save_frozen_folder recorded
/// in kSavedWeightsFile: a tensor that differs, or one the note does not name, is an
/// error naming it. A folder saved before checksums were recorded loads unchecked.
/// Verifying reads every byte once (spread over the intra-op threads): its cost against
/// the load is in docs/models.md.
torchattn::NamedTensors load_saved_weights(const std::string& folder, bool verify = true);

/// Loads `folder`'s weights into `model` (as built, float32 on the CPU): a saved frozen
/// folder's as they are (load_saved_weights, then CausalLMImpl::load_frozen_state;
/// `format` must be its format or Float32), else the Hugging Face checkpoint
/// (load_hf_weights), then frozen in `format` unless that is Float32. Returns the format
/// the model ends in.
torchattn::WeightFormat load_folder_weights(CausalLM& model, const std::string& folder, torchattn::WeightFormat format,
                                            bool verify = true);

/// A model of `config` (config.json of `folder`) with `folder`'s weights, as
/// load_folder_weights loads them; for a saved frozen folder the model is built with
/// each float32 linear weight freed as soon as its layer is (CausalLMImpl's frozen
/// constructor), so the process never holds the float32 model.
CausalLM load_causal_lm(const DecoderConfig& config, int64_t context_length, const std::string& folder,
                        torchattn::WeightFormat format, bool verify = true);

/// Writes `model` (frozen: weight_format() bfloat16 or int8), loaded from `source`, as
/// such a folder, with an xxh64 checksum of each tensor in kSavedWeightsFile: `folder` is created, files of the same
/// names in it replaced. An error for a float32 model, and for `folder` being `source`.
void save_frozen_folder(const CausalLM& model, const std::string& source, const std::string& folder);

}  // namespace torchattn::models
