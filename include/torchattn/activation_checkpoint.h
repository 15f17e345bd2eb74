#pragma once

// Activation checkpointing for LibTorch C++: a block's forward keeps only its inputs,
// and its backward runs the forward again to get the activations back, trading one
// more forward for the memory of everything in between (torch.utils.checkpoint's
// idea; LibTorch's C++ API has none).
//
//   auto y = torchattn::checkpoint([&](const at::Tensor& t) { return block->forward(t); }, x,
//                                  block->parameters());
//
// As torch.utils.checkpoint with use_reentrant=False in what it gives back:
// - the gradients of the inputs and of `params` equal the run without checkpointing
//   (bit for bit on the CPU: the same kernels in the same order);
// - random numbers drawn inside fn (dropout) are the same in the recomputation: the
//   default generators' states of the CPU and of each CUDA device an input is on are
//   saved before fn runs, set again for the recomputation, and put back after it, so
//   the process's random stream goes on as without checkpointing;
// - autocast (CPU and CUDA) is recomputed as it was in the forward;
// - parameters get their gradients even when no input requires one (the pitfall of
//   the reentrant form): that is why they are named in `params`.
// What differs: fn runs twice, so it must be a function of its inputs and params
// alone (no state it changes, such as a KV cache or batch statistics), it is kept
// until the backward (what it captures by reference must live until then), and
// backward through the result works once (no retain_graph). With grad mode off, or nothing in
// inputs or params requiring a gradient, fn simply runs.

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace torchattn {

/// A block's forward: tensors in, tensors out.
using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

/// fn(inputs) with its activations freed after the forward and recomputed in the
/// backward. inputs: fn's tensor arguments (defined; those that require a gradient get
/// one). params: every other tensor fn reads whose gradient is wanted (a module's
/// parameters()); each must be defined. Returns fn's outputs (at least one, each
/// defined); an error otherwise names what came.
std::vector<at::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params);

/// One tensor in and one out: checkpoint([&](const at::Tensor& x) { return layer(x); }, x, layer->parameters()).
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params);

}  // namespace torchattn
