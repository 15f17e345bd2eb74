#pragma once

// Which whole-sequence call shapes the SDPA backend has run on CUDA in this process:
// the memory behind Backend::Auto's cuDNN rule (backends/sdpa.h).
//
// ATen's cuDNN kernel is the fastest attention on Hopper at a fixed shape, but it builds
// an execution plan at every new shape (tens of milliseconds) and keeps it for the
// process. Auto takes flash at a shape's first call, so a new length never stalls, and
// ATen's own choice (cuDNN) from its second: a training loop or an encoder at a fixed
// length pays the plan once, at its second step.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

namespace torchattn::backends {

/// A set of call shapes (any list of integers that tells two calls apart), bounded:
/// once it holds `capacity` shapes it records no more, and a shape it never recorded is
/// new at every call (flash: no plan, no stall). Thread-safe.
class RepeatedShapes {
 public:
  explicit RepeatedShapes(size_t capacity) : capacity_(capacity) {}

  /// True where `shape` was recorded by an earlier call; records it (while there is
  /// room) and returns false otherwise.
  bool seen_before(const std::vector<int64_t>& shape);
  /// Shapes recorded.
  size_t size() const;
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::set<std::vector<int64_t>> shapes_;
};

/// The shapes at most for which cuDNN plans are asked: ATen keeps every plan it builds,
/// so this bounds what Auto makes it hold too.
constexpr size_t kMaxCudnnShapes = 1024;

/// The process's memory of the whole-sequence calls Backend::Auto has run on CUDA
/// where ATen would take cuDNN (capacity kMaxCudnnShapes).
RepeatedShapes& cudnn_shapes();

}  // namespace torchattn::backends
