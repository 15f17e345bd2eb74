#pragma once

// The options of a torchattn module that change its numbers without changing any
// tensor's shape (num_heads, scale, ...). Checkpoints record them beside the
// tensors, and loading checks them: a 4-head checkpoint has the tensor shapes of an
// 8-head module, and would otherwise load into it without a word.

#include <torchattn/checkpoint_facts.h>

#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchattn::serialize {

/// The archive key (torch::save) and the state-dict entry (save_state_dict) that
/// hold a module's options, as one string "name=value;name=value".
inline constexpr const char* kOptionsKey = "torchattn_options";
inline constexpr const char* kStateDictOptionsKey = "_torchattn_options";

using OptionValues = CheckpointOptions;

/// An option's value as checkpoints write it: integers in decimal, "none" for an
/// unset optional, doubles with 17 significant digits ("default" when unset).
std::string option_text(int64_t v);
std::string option_text(const std::optional<int64_t>& v);
std::string option_text(bool v);
std::string option_text(double v);
std::string option_text(const std::optional<double>& v);

/// The options of `module` if it says them (CheckpointFacts), else nullopt.
std::optional<OptionValues> checkpoint_options(const torch::nn::Module& module);

std::string encode_options(const OptionValues& options);

/// A c10::Error naming `fn`, the module at `path` and the first option whose saved
/// value differs from the module's, with both values. Options the file does not
/// name (saved by an earlier version) are not checked.
void check_saved_options(const char* fn, const std::string& path, const std::string& saved,
                         const OptionValues& module_options);

/// CheckpointFacts::implied_causal_mask of `module`, or 0.
int64_t implied_causal_mask(const torch::nn::Module& module);

/// CheckpointFacts::shape_hint of `module` for its tensor `key`, or "".
std::string shape_hint(const torch::nn::Module& module, const std::string& key);

}  // namespace torchattn::serialize
