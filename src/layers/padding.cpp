#include <torchattn/padding.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/logical_or.h>
#include <c10/util/Exception.h>

namespace torchattn {

at::Tensor padding_mask_from_attention_mask(const at::Tensor& attention_mask) {
  constexpr const char* fn = "padding_mask_from_attention_mask";
  TORCH_CHECK(attention_mask.defined(), fn, ": expected an attention_mask, got an undefined tensor");
  TORCH_CHECK(at::isIntegralType(attention_mask.scalar_type(), /*includeBool=*/true), fn,
              ": expected an integer or bool attention_mask (1 = token, 0 = padding), got ",
              attention_mask.scalar_type());
  TORCH_CHECK(attention_mask.dim() == 1 || attention_mask.dim() == 2, fn,
              ": expected attention_mask of shape [B, T] or [T], got ", attention_mask.sizes());
  const at::Tensor padding = attention_mask == 0;
  if (attention_mask.is_cpu() && attention_mask.numel() > 0) {
    TORCH_CHECK(at::logical_or(padding, attention_mask == 1).all().item<bool>(), fn,
                ": expected an attention_mask of 0s and 1s, got other values");
  }
  return padding;
}

}  // namespace torchattn
