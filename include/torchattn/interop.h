#pragma once

// Checkpoints: strict loading of module trees, and weights between Python and C++
// (docs/checkpoints.md).

#include <torch/nn/module.h>

#include <string>

namespace torchattn {

/// Loads a `torch::save(module, path)` archive, or a Python
/// `torch.save(dict(module.state_dict()), path)` file, into `module` and everything
/// under it (any module tree), strictly and all at once: a missing or extra key, a
/// shape or dtype that differs, or a torchattn option that differs (num_heads, scale,
/// ...) is a c10::Error naming the key with its path (`blocks.1.attn.W_query.weight`)
/// or the option, and then nothing has changed. A `mask` key loads into a
/// mask_buffer(false) module when it holds exactly the causal mask.
///
///   torch::save(model, "model.pt");  ...  torchattn::load_state_dict(*model, "model.pt");
void load_state_dict(torch::nn::Module& module, const std::string& path);

/// Writes the module's parameters and buffers as a plain dict of tensors (no options)
/// that Python reads with `module.load_state_dict(torch.load(path))`. A
/// mask_buffer(false) module writes no `mask`: load it with `strict=False`.
void save_state_dict(const torch::nn::Module& module, const std::string& path);

}  // namespace torchattn
