#pragma once

// What a torchattn module tells the checkpoint code (torch::save and load,
// save_state_dict, interop) beside its tensors. See docs/architecture.md.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

/// name -> value as text, in a fixed order (doubles with 17 significant digits: exact).
using CheckpointOptions = std::vector<std::pair<std::string, std::string>>;

/// Implemented by each attention module, so that its options are saved and checked.
class CheckpointFacts {
 public:
  virtual ~CheckpointFacts() = default;

  /// The options saved beside the tensors; loading a checkpoint whose saved value
  /// differs is an error naming the option and both values.
  virtual CheckpointOptions checkpoint_options() const = 0;

  /// The context length whose causal mask the module applies without its `mask`
  /// buffer (mask_buffer(false)), or 0.
  virtual int64_t implied_causal_mask() const { return 0; }

  /// What explains the shape of the module's tensor `key` in errors, e.g.
  /// " (W_key projects to num_kv_heads * head_dim = 3 * 64 features)", or "".
  virtual std::string shape_hint(const std::string& /*key*/) const { return ""; }
};

}  // namespace torchattn
