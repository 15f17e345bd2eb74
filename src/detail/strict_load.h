#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

namespace torchattn::detail {

// Module::load made strict: every parameter and buffer of `module` (recursively)
// must be in `archive` with the same shape and dtype, and the archive may hold no
// other tensors. All checks run before any value is copied, so a failed load leaves
// the module as it was. Errors are c10::Errors naming `module_name` and the key.
void strict_load(torch::nn::Module& module, torch::serialize::InputArchive& archive, const char* module_name);

} // namespace torchattn::detail
