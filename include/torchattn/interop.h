#pragma once

// Weights between Python and C++: state dicts saved with torch.save / torch.load.

#include <torch/nn/module.h>

#include <string>

namespace torchattn {

/// Loads a file written in Python by `torch.save(dict(module.state_dict()), path)` (a
/// plain dict: LibTorch cannot unpickle the OrderedDict that state_dict() returns) into a
/// module whose parameter and buffer names match (the notebooks' `W_query.weight`,
/// `mask`, ...). Strict: a missing or extra key, or a shape or dtype that differs, is
/// a c10::Error naming the key, and the module is left unchanged. A `mask` key for a
/// CausalAttention or MultiHeadAttention built with mask_buffer(false) is accepted when
/// it holds exactly the causal mask triu(ones(C, C), 1), and an error naming it otherwise.
///
///   torchattn::MultiHeadAttention mha(768, 768, 1024, 0.0, 12);
///   torchattn::load_state_dict(*mha, "mha_state_dict.pt");
void load_state_dict(torch::nn::Module& module, const std::string& path);

/// Writes the module's parameters and buffers as a dict of tensors that Python reads
/// with `module.load_state_dict(torch.load(path))`. A mask_buffer(false) module writes
/// no `mask`: load it in Python with `load_state_dict(..., strict=False)` (the Python
/// module makes its own mask).
void save_state_dict(const torch::nn::Module& module, const std::string& path);

} // namespace torchattn
