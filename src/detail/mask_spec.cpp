#include "mask_spec.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

namespace torchattn::detail {

void check_mask_spec(const char* fn, const MaskSpec& spec, int64_t Tq, int64_t Tk) {
  if (spec.buffer != nullptr) {
    const at::Tensor& b = *spec.buffer;
    TORCH_CHECK(b.dim() == 2 && b.size(0) == b.size(1), fn, ": expected a square [C, C] causal_mask, got ", b.sizes());
    TORCH_CHECK(Tk <= b.size(0), fn, ": expected at most context_length=", b.size(0), " key positions, got ", Tk);
  }
  if (spec.is_static()) {
    TORCH_CHECK(spec.causal, fn, ": static-shape positions need a causal mask");
    TORCH_CHECK(spec.positions.numel() == 1 && spec.positions.scalar_type() == at::kLong, fn,
                ": expected positions as a [1] int64 tensor, got ", spec.positions.sizes(), " of ",
                spec.positions.scalar_type());
    return;
  }
  if (spec.causal) {
    TORCH_CHECK(spec.past >= 0, fn, ": expected past >= 0, got ", spec.past);
    TORCH_CHECK(Tk == spec.past + Tq, fn, ": expected Tk == past + Tq (", spec.past, " + ", Tq, "), got Tk=", Tk);
  }
}

at::Tensor hidden_keys(const MaskSpec& spec, int64_t Tq, int64_t Tk, const at::Device& device) {
  if (!spec.causal) {
    return {};
  }
  if (spec.is_static()) {
    // Rows start .. start + Tq - 1, computed on the device: no host synchronisation.
    const at::Tensor rows = spec.positions.to(device) + at::arange(Tq, spec.positions.options().device(device));
    if (spec.buffer != nullptr) {
      return spec.buffer->index_select(0, rows).narrow(1, 0, Tk).ne(0);
    }
    return at::arange(Tk, rows.options()).unsqueeze(0) > rows.unsqueeze(1);
  }
  if (spec.buffer != nullptr) {
    return spec.buffer->slice(0, spec.past, spec.past + Tq).slice(1, 0, Tk).to(at::kBool);
  }
  // Key j is hidden from query i when j > past + i.
  return at::triu(at::ones({Tq, Tk}, at::TensorOptions().dtype(at::kBool).device(device)), spec.past + 1);
}

} // namespace torchattn::detail
