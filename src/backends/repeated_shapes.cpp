#include "backends/repeated_shapes.h"

namespace torchattn::backends {

bool RepeatedShapes::seen_before(const std::vector<int64_t>& shape) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (shapes_.count(shape) > 0) return true;
  if (shapes_.size() < capacity_) shapes_.insert(shape);
  return false;
}

size_t RepeatedShapes::size() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return shapes_.size();
}

RepeatedShapes& cudnn_shapes() {
  static RepeatedShapes shapes(kMaxCudnnShapes);
  return shapes;
}

}  // namespace torchattn::backends
