#pragma once

// Loading named tensors (a safetensors file, a sharded checkpoint, or tensors in
// memory) into any module tree, strictly: every parameter and buffer of the module
// must get a tensor of its shape, and every tensor of the file must go somewhere
// (or be listed as ignored). The file's names may differ from the module's: rename
// rules map one to the other. LibTorch's `copy_` would broadcast a wrong shape
// without a word; here a missing, extra or misshapen tensor is a c10::Error naming
// the tensor and the file it came from.
//
//   // A checkpoint of notebook 003's MultiHeadAttention saved with PyTorch's names:
//   torchattn::models::load_weights(*mha, "mha.safetensors",
//       torchattn::models::WeightsOptions().rename({{"q_proj", "W_query"}, {"k_proj", "W_key"}}));

#include <torchattn/safetensors.h>

#include <c10/util/ArrayRef.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace torchattn::models {

/// (file-name parts, module-name parts) pairs; see WeightsOptions::rename.
using Renames = std::vector<std::pair<std::string, std::string>>;

struct WeightsOptions {
  /// Rules from the file's names to the module's, applied in order to each file name.
  /// A rule's `from` is one or more dot-separated parts ("attention.self.query") and
  /// matches whole parts only; `to` replaces them, and an empty `to` drops them
  /// ({"model", ""}: "model.norm.weight" -> "norm.weight"). Default: none.
  TORCH_ARG(Renames, rename) = {};
  /// File tensors the module does not use (a pooler, a rotary table it recomputes):
  /// a pattern matches a name when it is the name or whole dot-separated parts of it
  /// ("rotary_emb.inv_freq" matches "model.layers.0.self_attn.rotary_emb.inv_freq").
  /// Matched before renaming. Default: none; every file tensor must be used.
  TORCH_ARG(std::vector<std::string>, ignore) = {};
};

/// Loads `tensors` into `module`'s parameters and buffers. All checks run before any
/// value changes, so a failed load leaves the module as it was. A tensor of another
/// dtype or device is converted to the module's; a CPU tensor of the same dtype is used
/// in place (a safetensors file's memory map: no copy). A non-floating tensor for a
/// floating parameter is an error. `source` names the tensors' origin in errors; with
/// `sources` (one per tensor, e.g. each tensor's shard), errors name that instead.
void load_weights(torch::nn::Module& module, const NamedTensors& tensors, const WeightsOptions& options = {},
                  const std::string& source = "<tensors>", c10::ArrayRef<std::string> sources = {});

/// The same from `path`: a `.safetensors` file, a sharded checkpoint's
/// `model.safetensors.index.json`, or a model folder holding either. Errors name the
/// file (the shard) a tensor came from.
void load_weights(torch::nn::Module& module, const std::string& path, const WeightsOptions& options = {});

/// `name` after `options`' rename rules (what load_weights looks for in the module).
std::string renamed(const std::string& name, const WeightsOptions& options);

/// The checkpoint file of a model folder: model.safetensors, or
/// model.safetensors.index.json when sharded. An error naming the folder if neither.
std::string checkpoint_file(const std::string& folder);

}  // namespace torchattn::models
