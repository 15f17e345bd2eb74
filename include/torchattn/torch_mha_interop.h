#pragma once

// Weights between PyTorch's torch.nn.MultiheadAttention (its packed names: in_proj_weight,
// in_proj_bias, out_proj.*) and torchattn::MultiHeadAttention (W_query, W_key, W_value,
// out_proj).

#include <torchattn/safetensors.h>

#include <string>

namespace torchattn {

class MultiHeadAttentionImpl;

// Shape contract of the state dict of `nn.MultiheadAttention(E, H, bias=b, kdim=K,
// vdim=V, batch_first=True)` against a MultiHeadAttention with d_in = d_out = E,
// num_heads = H, kdim = K, vdim = V and qkv_bias = out_bias = b (keys in PyTorch's order):
//
//   in_proj_weight  [3E, E]   W_query.weight | W_key.weight | W_value.weight, by rows  (K == V == E)
//   q_proj_weight   [E, E]    W_query.weight                                        (K != E or V != E)
//   k_proj_weight   [E, K]    W_key.weight                                          (K != E or V != E)
//   v_proj_weight   [E, V]    W_value.weight                                        (K != E or V != E)
//   in_proj_bias    [3E]      W_query.bias | W_key.bias | W_value.bias              (b)
//   out_proj.weight [E, E]    out_proj.weight
//   out_proj.bias   [E]       out_proj.bias                                         (b)
//
// The two modules then compute the same: `mha->forward(x, pad)` is PyTorch's
// `m(x, x, x, key_padding_mask=pad, need_weights=False)[0]` with causal(false), and
// `m(x, x, x, attn_mask=torch.triu(torch.ones(T, T, dtype=torch.bool), 1))` with
// causal(true) (PyTorch's module has no causal option: a mask is given at each call);
// `mha->forward_cross(q, mha->cross_kv(k, pad, v))` is `m(q, k, v, key_padding_mask=pad)`.
// Both scale the scores by 1/sqrt(E / H) and drop attention weights out with
// probability `dropout`. Options PyTorch's module cannot express are errors naming the
// option: d_in != d_out, head_dim other than E / H, num_kv_heads other than H,
// qkv_bias != out_bias, window, rope, qk_norm, alibi, softcap, sinks, and a scale other
// than 1/sqrt(E / H). PyTorch's add_bias_kv (keys `bias_k`, `bias_v`) has no counterpart
// and is refused; add_zero_attn leaves no trace in the state dict and is not detected.
// A query left with no key to see (all padding) outputs out_proj.bias here, NaN in PyTorch.

/// Loads the state dict of a `torch.nn.MultiheadAttention` into `mha`, strictly and all
/// at once: a missing key, an unexpected one (`bias_k` and `bias_v` included), a shape
/// or a dtype other than the module's, or an option of `mha` that PyTorch's module
/// cannot express is a c10::Error naming the key or the option, what was expected and
/// what came; then nothing in `mha` has changed. Reads a file written in Python with
/// `torch.save(dict(m.state_dict()), path)` (a plain dict: LibTorch cannot unpickle the
/// OrderedDict that state_dict() returns).
///
///   # Python: m = torch.nn.MultiheadAttention(768, 12, batch_first=True)
///   torch.save(dict(m.state_dict()), "mha.pt")
///
///   torchattn::MultiHeadAttention mha(
///       torchattn::MultiHeadAttentionOptions(768, 768, 1024, 12).causal(false).qkv_bias(true));
///   torchattn::load_torch_multihead_attention(*mha, "mha.pt");
void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const std::string& path);

/// The same from tensors in memory (a safetensors file's, or a state dict built in
/// C++), on any device; each is copied into the module's parameters.
///
///   torchattn::load_torch_multihead_attention(*mha, torchattn::load_safetensors("mha.safetensors"));
void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const NamedTensors& state_dict);

/// `mha`'s parameters under nn.MultiheadAttention's names, in its order (see above):
/// new tensors of the module's dtype and device, detached. An option PyTorch's module
/// cannot express is a c10::Error naming it.
///
///   torchattn::save_safetensors("mha.safetensors", torchattn::torch_multihead_attention_state_dict(*mha));
NamedTensors torch_multihead_attention_state_dict(const MultiHeadAttentionImpl& mha);

/// Writes torch_multihead_attention_state_dict(mha) (on the CPU) as a plain dict that
/// Python loads with `m.load_state_dict(torch.load(path))` into
/// `nn.MultiheadAttention(E, H, bias=..., kdim=..., vdim=..., batch_first=True)`.
///
///   torchattn::save_torch_multihead_attention(*mha, "from_cpp.pt");
///   # Python: m.load_state_dict(torch.load("from_cpp.pt"))
void save_torch_multihead_attention(const MultiHeadAttentionImpl& mha, const std::string& path);

}  // namespace torchattn
