#pragma once

// Padding masks from other conventions.

#include <ATen/core/Tensor.h>

namespace torchattn {

/// torchattn's key_padding_mask (bool, true = padding to ignore) from a Hugging Face
/// tokenizer's attention_mask (1 = a real token): `attention_mask == 0`, not
/// `.to(torch::kBool)`, which means the opposite. See docs/masks.md.
///
/// attention_mask: [B, T] (or [T]) of an integer or bool dtype holding only 0 and 1
///   (checked on the CPU). Returns a bool tensor of the same shape and device.
at::Tensor padding_mask_from_attention_mask(const at::Tensor& attention_mask);

}  // namespace torchattn
