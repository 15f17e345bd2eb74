#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

namespace torchattn::detail {

// Module::load made strict: every parameter and buffer of `module` (recursively)
// must be in `archive` with the same shape and dtype, and the archive may hold no
// other tensors. All checks run before any value is copied, so a failed load leaves
// the module as it was. Errors are c10::Errors naming `module_name` and the key.
//
// implied_causal_mask > 0: the module has no `mask` buffer (mask_buffer(false)) but
// applies the causal mask of that context length; a `mask` key in the archive is
// accepted when it holds exactly that mask, and is an error naming it otherwise.
void strict_load(torch::nn::Module& module, torch::serialize::InputArchive& archive, const char* module_name,
                 int64_t implied_causal_mask = 0);

} // namespace torchattn::detail
