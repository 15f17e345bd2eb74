#pragma once

// Linear layers whose weights lie end to end in one storage (place_together,
// include/torchattn/linear.h): their product as one GEMM.

#include <ATen/core/Tensor.h>

#include <vector>

namespace torchattn::layers {

/// Whether the tensors (all defined) are contiguous, in one storage, each starting
/// where the one before ends, all of one dtype and of the same sizes but the first.
bool end_to_end(const std::vector<at::Tensor>& parts);

/// The tensors end_to_end joins, as one view along dimension 0 of the first one's
/// storage: [sum of sizes(0), rest of sizes]. No copy; not for autograd (the view is
/// of the first tensor alone).
at::Tensor joined_view(const std::vector<at::Tensor>& parts);

/// x [..., in] -> [..., sum of out_i]: x times the end_to_end weights ([out_i, in]) plus
/// the end_to_end biases (all, or none: an empty list), one at::linear.
at::Tensor joined_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<at::Tensor>& biases);

}  // namespace torchattn::layers
