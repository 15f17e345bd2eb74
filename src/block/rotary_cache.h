#pragma once

// A module's RoPE cos/sin tables, computed once per device (at the first forward on
// it) and kept: not state-dict entries, not recomputed on every call.

#include <torchattn/rope.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace torchattn::block {

class RotaryCache {
 public:
  /// Tables for positions 0 .. length - 1 of heads of head_dim features.
  RotaryCache(const RoPEOptions& options, int64_t head_dim, int64_t length);

  /// The one RotaryCache of these options, head_dim and length while any module holds
  /// it: every layer of a model shares one set of tables (a model of 30 layers at a
  /// context of 4096 holds 2 MB of tables, not 60), the same bits as tables of its own.
  /// Thread-safe; the tables go when the last module holding them does.
  static std::shared_ptr<const RotaryCache> shared(const RoPEOptions& options, int64_t head_dim, int64_t length);

  /// x: [B, T, G, head_dim] (G heads, tokens before heads, as a projection gives
  /// them) rotated at positions ([T] or [B, T] int64, < length), with the tables of
  /// x's device: the one-pass CPU kernel for a contiguous CPU x, else
  /// functional::apply_rotary. Thread-safe.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& positions) const;

  const RoPEOptions& options() const { return options_; }

  /// (cos, sin) on `device`, made at the first call for it (functional::rotary_tables:
  /// computed on the CPU, then moved, so every device has the CPU's bits). Thread-safe.
  std::pair<at::Tensor, at::Tensor> tables(const at::Device& device) const;

 private:

  RoPEOptions options_;
  int64_t head_dim_;
  int64_t length_;
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<at::Device, std::pair<at::Tensor, at::Tensor>>> by_device_;
};

}  // namespace torchattn::block
