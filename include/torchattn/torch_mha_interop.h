#pragma once

// Weights between PyTorch's torch.nn.MultiheadAttention and torchattn::MultiHeadAttention
// (docs/checkpoints.md).

#include <torchattn/safetensors.h>

#include <string>

namespace torchattn {

class MultiHeadAttentionImpl;

// The state dict of `nn.MultiheadAttention(E, H, bias=b, kdim=K, vdim=V, batch_first=True)`
// against a MultiHeadAttention with d_in = d_out = E, num_heads = H, kdim = K, vdim = V and
// qkv_bias = out_bias = b (keys in PyTorch's order):
//
//   in_proj_weight  [3E, E]   W_query.weight | W_key.weight | W_value.weight, by rows  (K == V == E)
//   q_proj_weight   [E, E]    W_query.weight                                        (K != E or V != E)
//   k_proj_weight   [E, K]    W_key.weight                                          (K != E or V != E)
//   v_proj_weight   [E, V]    W_value.weight                                        (K != E or V != E)
//   in_proj_bias    [3E]      W_query.bias | W_key.bias | W_value.bias              (b)
//   out_proj.weight [E, E]    out_proj.weight
//   out_proj.bias   [E]       out_proj.bias                                         (b)
//
// The two modules then compute the same (causal(false): `m(x, x, x, key_padding_mask=pad)`).
// Options PyTorch's module cannot express (window, rope, num_kv_heads other than H, ...)
// and its add_bias_kv are errors naming them.

/// The head count is the caller's: the state dict has no entry for num_heads (nor for
/// dropout or batch_first), and its shapes are the same for every H that divides E, so
/// a file of a module with another head count loads without an error and computes
/// something else. To have it checked, record it beside the file:
/// save_torch_multihead_attention writes torch_multihead_attention_options_path(path),
/// and a Python script can write the same line (docs/checkpoints.md).
///
/// Loads a file written in Python with `torch.save(dict(m.state_dict()), path)` into
/// `mha`, strictly and all at once: a missing or unexpected key, a shape or dtype other
/// than the module's, an option of `mha` that PyTorch's module cannot express, or one
/// that the options file beside `path` (when there is one) records otherwise, is a
/// c10::Error naming the key or the option, what was expected and what came; then
/// nothing in `mha` has changed.
///
///   torchattn::MultiHeadAttention mha(
///       torchattn::MultiHeadAttentionOptions(768, 768, 1024, 12).causal(false).qkv_bias(true));
///   torchattn::load_torch_multihead_attention(*mha, "mha.pt");
void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const std::string& path);

/// The same from tensors in memory (e.g. load_safetensors'), on any device; each is
/// copied into the module's parameters. No options file is read.
void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const NamedTensors& state_dict);

/// `mha`'s parameters under nn.MultiheadAttention's names, in its order (see above):
/// new tensors of the module's dtype and device, detached. An option PyTorch's module
/// cannot express is a c10::Error naming it.
NamedTensors torch_multihead_attention_state_dict(const MultiHeadAttentionImpl& mha);

/// Writes torch_multihead_attention_state_dict(mha) (on the CPU) as a plain dict that
/// Python loads with `m.load_state_dict(torch.load(path))`, and the options the dict
/// lacks to torch_multihead_attention_options_path(path).
void save_torch_multihead_attention(const MultiHeadAttentionImpl& mha, const std::string& path);

/// Where the options of the module a state dict file came from are recorded: `path` +
/// ".options", one line of `name=value` pairs joined by ';', e.g.
/// "embed_dim=768;num_heads=12;bias=true;kdim=768;vdim=768" (any of them, in any
/// order; bias is true or false). At most 4 KiB; another name or a value that is not
/// one is an error naming the file.
std::string torch_multihead_attention_options_path(const std::string& path);

}  // namespace torchattn
