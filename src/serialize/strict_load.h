#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

#include <string>

namespace torchattn::serialize {

// Module::load made strict, for `module` and every module under it: every parameter
// and buffer must be in `archive` with the same shape and dtype, and the archive
// may hold no other tensors. A torchattn module's saved options (num_heads, scale,
// ...) must equal its own. All checks run before any value is copied, so a failed
// load leaves the modules as they were. Errors are c10::Errors naming `fn` and the
// key with its path: `prefix` is the path of `module` in the saved model
// ("blocks.1.attn.", or "" at the top).
//
// A mask_buffer(false) module has no `mask` buffer but applies the causal mask of
// its context length: a `mask` key in the archive is accepted when it holds exactly
// that mask, and is an error naming it otherwise.
void strict_load(torch::nn::Module& module, torch::serialize::InputArchive& archive, const char* fn,
                 const std::string& prefix = "");

// The path of the module that `archive` belongs to inside a torch::save file, such
// as "blocks.1.attn." ("" at the top level). LibTorch keeps it private, but names it
// in the message for a missing key, which is where it is read from.
std::string archive_path(torch::serialize::InputArchive& archive);

// Module::save, then the module's options (checkpoint_options) under kOptionsKey.
void save_with_options(const torch::nn::Module& module, torch::serialize::OutputArchive& archive);

}  // namespace torchattn::serialize
