#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace torchattn {

/// Which implementation computes softmax(q k^T * scale + mask) v (docs/modules.md,
/// docs/gpu.md):
/// - `Reference`: the notebooks' math step by step: the same numbers and dropout masks
///   as the Python code.
/// - `SDPA`: `at::scaled_dot_product_attention`, ATen's choice of fused kernel (cuDNN
///   included). Its dropout draws another random stream than the Reference's.
/// - `Auto` (default): as SDPA, but on CUDA flash or memory-efficient where ATen would
///   pick cuDNN, except for a whole-sequence call (as many queries as keys) at a shape
///   it has run before in this process, which takes cuDNN (its plan built once, at the
///   shape's second call; docs/gpu.md); and the Reference in training mode with
///   dropout > 0.
///
/// Example: `CausalAttentionOptions(768, 768, 1024).backend(Backend::SDPA)`.
enum class Backend { Auto, Reference, SDPA };

/// "auto", "reference" or "sdpa".
std::string_view to_string(Backend backend);

/// Parses "auto", "reference" or "sdpa"; anything else is a c10::Error naming it.
Backend backend_from_string(std::string_view name);

std::ostream& operator<<(std::ostream& os, Backend backend);

}  // namespace torchattn
