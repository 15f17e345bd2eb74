#pragma once

// Padding masks from other conventions.

#include <ATen/core/Tensor.h>

namespace torchattn {

/// torchattn's key_padding_mask (bool, true = a padding token to ignore, as in
/// torch.nn.MultiheadAttention) from a Hugging Face tokenizer's attention_mask
/// (1 = a real token, 0 = padding): `attention_mask == 0`. Converting with
/// `.to(torch::kBool)` instead gives the opposite meaning.
///
/// attention_mask: [B, T] (or [T]) of an integer or bool dtype holding only 0 and 1
///   (checked where it costs no synchronisation: on the CPU).
/// Returns a bool tensor of the same shape and device.
at::Tensor padding_mask_from_attention_mask(const at::Tensor& attention_mask);

}  // namespace torchattn
