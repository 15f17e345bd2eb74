#include "backends/mask_spec.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

namespace torchattn::backends {

namespace {

// [B, Tk] or [1, Tk], on q's device.
void check_key_mask(const char* fn, const char* arg, const at::Tensor& m, const at::Tensor& q, int64_t Tk) {
  const int64_t B = q.size(0);
  TORCH_CHECK(m.dim() == 2 && (m.size(0) == B || m.size(0) == 1) && m.size(1) == Tk, fn, ": expected ", arg,
              " of shape [B, Tk] = [", B, ", ", Tk, "] (or [1, ", Tk, "]), got ", m.sizes());
  TORCH_CHECK(m.device() == q.device(), fn, ": expected ", arg, " on ", q.device(), ", got ", m.device());
}

}  // namespace

void check_mask_spec(const char* fn, const MaskSpec& spec, const at::Tensor& q, int64_t Tk) {
  const int64_t Tq = q.size(-2);
  if (spec.buffer != nullptr) {
    const at::Tensor& b = *spec.buffer;
    TORCH_CHECK(b.dim() == 2 && b.size(0) == b.size(1), fn, ": expected a square [C, C] causal_mask, got ", b.sizes());
    TORCH_CHECK(Tk <= b.size(0), fn, ": expected at most context_length=", b.size(0), " key positions, got ", Tk);
  }
  if (spec.has_key_masks()) {
    TORCH_CHECK(q.dim() >= 3, fn, ": a key_padding_mask or key_bias needs batched q [B, ..., Tq, d], got q ",
                q.sizes());
  }
  if (spec.key_padding.defined()) {
    check_key_mask(fn, "key_padding_mask", spec.key_padding, q, Tk);
    TORCH_CHECK(spec.key_padding.scalar_type() == at::kBool, fn,
                ": expected a bool key_padding_mask (true = ignore the key), got ", spec.key_padding.scalar_type(),
                "; pass an additive mask (0 keeps, -inf hides) as key_bias");
  }
  if (spec.key_bias.defined()) {
    check_key_mask(fn, "key_bias", spec.key_bias, q, Tk);
    TORCH_CHECK(spec.key_bias.scalar_type() == q.scalar_type(), fn, ": expected key_bias of q's dtype ",
                q.scalar_type(), " (added to the scores), got ", spec.key_bias.scalar_type());
  }
  if (spec.score_bias.defined()) {
    const at::Tensor& b = spec.score_bias;
    TORCH_CHECK(q.dim() == 4 && b.dim() == 4 && (b.size(0) == 1 || b.size(0) == q.size(0)) &&
                    (b.size(1) == 1 || b.size(1) == q.size(1)) && b.size(2) == Tq && b.size(3) == Tk,
                fn, ": expected a score bias [B or 1, H or 1, Tq, Tk] = [", q.size(0), ", ",
                q.dim() == 4 ? q.size(1) : 1, ", ", Tq, ", ", Tk, "] for q ", q.sizes(), ", got ", b.sizes());
    TORCH_CHECK(b.scalar_type() == q.scalar_type() && b.device() == q.device(), fn,
                ": expected a score bias of q's dtype and device, got ", b.scalar_type(), " on ", b.device());
  }
  TORCH_CHECK(!spec.window || *spec.window >= 1, fn, ": expected window >= 1, got ", spec.window.value_or(0));
  TORCH_CHECK(!spec.window || spec.causal, fn, ": a sliding window needs causal attention");
  if (spec.is_static()) {
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
  if (!spec.causal && !spec.is_static()) {
    return {};
  }
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  // The queries' absolute positions: from the device (static shapes: no host
  // synchronisation) or the host offset.
  const at::Tensor rows = spec.is_static() ? spec.positions.to(device) + at::arange(Tq, long_options)
                                           : at::arange(spec.past, spec.past + Tq, long_options);
  const at::Tensor cols = at::arange(Tk, long_options).unsqueeze(0);
  if (!spec.causal) {
    return cols >= rows.narrow(0, Tq - 1, 1) + 1;  // a static cache's slots not yet written: [1, Tk]
  }
  at::Tensor hide;
  if (spec.buffer != nullptr) {
    hide = spec.is_static() ? spec.buffer->index_select(0, rows).narrow(1, 0, Tk).ne(0)
                            : spec.buffer->slice(0, spec.past, spec.past + Tq).slice(1, 0, Tk).to(at::kBool);
  } else if (spec.is_static()) {
    hide = cols > rows.unsqueeze(1);
  } else {
    // Key j is hidden from query i when j > past + i.
    hide = at::triu(at::ones({Tq, Tk}, at::TensorOptions().dtype(at::kBool).device(device)), spec.past + 1);
  }
  if (spec.window) {
    hide = hide.logical_or(cols <= rows.unsqueeze(1) - *spec.window);
  }
  return hide;
}

}  // namespace torchattn::backends
