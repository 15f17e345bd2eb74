#pragma once

// Logits that are not numbers end generation: a model whose weights are damaged (or whose
// activations overflow their dtype) gives NaN or infinite logits, and choosing a token
// from them would go on with garbage. The generate loops, perplexity and the serving
// engine ask here, and say the same words.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchattn::models::generation {

/// Whether each row of logits [R, V] (any device) is finite everywhere: one pass over
/// them on their device, R booleans to the host.
std::vector<bool> finite_rows(const at::Tensor& logits);

/// "<who>: the model produced non-finite logits at step <step> (<what>): ...", the
/// damage named (step: the new token's number, 1 for the first).
std::string non_finite_logits(const std::string& who, int64_t step, const std::string& what);

/// ids [B] int64 of an argmax taken on the device, -1 where that row of logits [B, V]
/// was not finite (so a step inside a CUDA graph returns ids only).
at::Tensor argmax_or_minus_one(const at::Tensor& logits);

}  // namespace torchattn::models::generation
