#pragma once

// The attention entry behind functional::attention and the modules: one entry that
// takes a MaskSpec, so that a causal buffer, causal-from-positions and static-shape
// caches all go through the same table of paths (selector.h).

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <string>
#include <vector>

namespace torchattn::backends {

/// The backend that `config` runs: Auto becomes SDPA, or Reference in training mode
/// with dropout > 0 (functional::resolve_backend).
Backend resolve_backend(const functional::AttentionOptions& config);

/// q: [B, ..., Tq, d], k: [B, ..., Tk, d], v: [B, ..., Tk, dv]; which keys each
/// query sees and the bias added to their scores: `mask` (see MaskSpec).
/// A query that sees no key outputs zeros (see functional::attention).
/// Returns [B, ..., Tq, dv].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& mask,
                  const functional::AttentionOptions& config);

/// The paths of the table (selector.h) that attend(q, k, v, mask, config) takes, the
/// lowerings first and the path that runs it last; the same checks, no attention.
std::vector<std::string> explain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& mask,
                                 const functional::AttentionOptions& config);

}  // namespace torchattn::backends
