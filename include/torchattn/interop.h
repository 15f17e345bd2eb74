#pragma once

// Checkpoints: strict loading of whole module trees, and weights between Python and
// C++ (state dicts saved with torch.save / torch.load).

#include <torch/nn/module.h>

#include <string>

namespace torchattn {

/// Loads a checkpoint into `module` and everything under it, strictly and all at
/// once: a missing or extra key, or a shape or dtype that differs, is a c10::Error
/// naming the key with its path (`blocks.1.attn.W_query.weight`), and then no tensor
/// of the module has changed. Works on any module tree, torchattn's or not. Reads:
///
/// - a `torch::save(module, path)` archive. torchattn modules in it carry their
///   options (num_heads, scale, ...); one that differs from the module's is an error
///   naming the option and both values;
/// - a file written in Python by `torch.save(dict(module.state_dict()), path)` (a
///   plain dict: LibTorch cannot unpickle the OrderedDict that state_dict() returns),
///   with the notebooks' names (`W_query.weight`, `mask`, ...). It holds no options.
///
/// A `mask` key for a CausalAttention or MultiHeadAttention built with
/// mask_buffer(false) is accepted when it holds exactly the causal mask
/// triu(ones(C, C), 1), and an error naming it otherwise.
///
///   torchattn::MultiHeadAttention mha(768, 768, 1024, 0.0, 12);
///   torchattn::load_state_dict(*mha, "mha_state_dict.pt");
///   torch::save(model, "model.pt");  ...  torchattn::load_state_dict(*model, "model.pt");
void load_state_dict(torch::nn::Module& module, const std::string& path);

/// Writes the module's parameters and buffers as a dict of tensors that Python reads
/// with `module.load_state_dict(torch.load(path))`. Tensors only, as Python's state
/// dicts: no options (a C++ checkpoint that guards them is a torch::save archive).
/// A mask_buffer(false) module writes
/// no `mask`: load it in Python with `load_state_dict(..., strict=False)` (the Python
/// module makes its own mask).
void save_state_dict(const torch::nn::Module& module, const std::string& path);

}  // namespace torchattn
