#pragma once

// One attention call as the selector (selector.h) sees it: the tensors, what each query
// sees, the options, and where the call has been lowered to ATen's mask form, packed
// documents or a paged pool.

#include "backends/attend_paged.h"
#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>
#include <torchattn/backend.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace torchattn::backends {

/// The mask of ATen's scaled_dot_product_attention: bool (true = attend) or additive,
/// broadcastable to [B, H, Tq, Tk] with a head dimension of 1 (or H: ALiBi's
/// distances), or none; is_causal aligned top-left (set only where Tq == Tk).
struct AtenMask {
  std::optional<at::Tensor> mask;
  bool is_causal = false;
};

/// Documents packed end to end: q, k, v [..., N, d], document s of lengths[s] tokens;
/// spec_of(L) the MaskSpec of a document of L tokens alone.
struct Documents {
  const std::vector<int64_t>* lengths = nullptr;
  const std::function<MaskSpec(int64_t)>* spec_of = nullptr;
};

/// q: [B, ..., Tq, d], k: [B, ..., Tk, d], v: [B, ..., Tk, dv] (attend's shapes), or
/// the packed documents' (documents set: spec is the first document's), or the paged
/// step's q [N, H, d] with k and v the pool's keys and values (paged set: spec holds
/// the window and ALiBi's slopes). backend: resolve_backend(config).
struct AttentionCall {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  const MaskSpec& spec;
  const functional::AttentionOptions& config;
  Backend backend = Backend::SDPA;
  /// Set once a lowering has turned the spec into ATen's mask form.
  const AtenMask* aten = nullptr;
  const Documents* documents = nullptr;
  const PagedKeys* paged = nullptr;
};

/// What a lowering makes of a call: another call (the fields it replaces) and what
/// becomes of that call's output.
struct LoweredCall {
  at::Tensor q, k, v;            ///< undefined: the call's own
  std::optional<MaskSpec> spec;  ///< unset: the call's own
  std::optional<AtenMask> aten;  ///< ATen's form of the masks
  at::Tensor zero_rows;          ///< rows that saw no key: zeros in the output
  bool squeeze_heads = false;    ///< the output's dimension 1 dropped ([B, 1, T, d] -> [B, T, d])
};

}  // namespace torchattn::backends
