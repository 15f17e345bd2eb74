#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace torchattn {

/// Which implementation computes softmax(q k^T * scale + mask) v.
///
/// - `Reference`: the notebooks' math step by step: scores, `masked_fill_(-inf)`,
///   division by sqrt(d_k), softmax, `nn::Dropout`, weights @ v. Same seed, same
///   numbers and the same dropout masks as the Python code.
/// - `SDPA`: `at::scaled_dot_product_attention` with ATen's own choice of fused
///   kernel (flash on the CPU; on CUDA cuDNN where it applies, which builds a plan
///   for every new shape, else flash or memory-efficient; single-head inputs get a
///   head dimension for it). Without dropout and masks other than the causal one, it
///   never materialises the T x T weights; with dropout in training, or a key padding
///   mask, ATen may pick its math kernel. Its dropout draws a different random
///   stream from the Reference.
/// - `Auto` (default): the fused kernels as SDPA, except that on CUDA it calls flash
///   or memory-efficient where ATen would pick cuDNN (no per-length plan, and
///   nothing that CUDA-graph capture cannot hold), and in training mode with
///   dropout > 0 it takes the Reference so that dropout masks match Python exactly.
///
/// Example: `CausalAttentionOptions(768, 768, 1024).backend(Backend::SDPA)`.
enum class Backend { Auto, Reference, SDPA };

/// "auto", "reference" or "sdpa".
std::string_view to_string(Backend backend);

/// Parses "auto", "reference" or "sdpa"; anything else is a c10::Error naming it.
Backend backend_from_string(std::string_view name);

std::ostream& operator<<(std::ostream& os, Backend backend);

}  // namespace torchattn
