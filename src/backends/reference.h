#pragma once

// The Reference backend: the notebooks' math step by step, so that the same seed
// gives the same numbers and dropout masks as the Python code.

#include <ATen/core/Tensor.h>

#include <optional>

namespace torchattn::backends {

/// The notebooks' scores: q k^T, hidden entries filled with -inf, then divided by
/// sqrt(d) (d = k.size(-1)), or multiplied by `scale` when given.
///
/// q: [..., Tq, d], k: [..., Tk, d]; hide: bool broadcastable to [..., Tq, Tk]
/// (true = hidden), or undefined for none. Returns [..., Tq, Tk].
at::Tensor masked_scaled_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& hide,
                                std::optional<double> scale);

/// softmax(masked_scaled_scores(q, k, hide, scale) + bias), dropout with probability
/// `dropout_p` on the weights (none when 0), then weights @ v.
///
/// q: [..., Tq, d], k: [..., Tk, d], v: [..., Tk, dv]; bias: additive, broadcastable
/// to [..., Tq, Tk], or undefined. Returns [..., Tq, dv].
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& hide,
                               const at::Tensor& bias, std::optional<double> scale, double dropout_p);

}  // namespace torchattn::backends
