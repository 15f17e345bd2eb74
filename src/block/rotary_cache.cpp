#include "block/rotary_cache.h"

#include "kernels/cpu/rotary.h"

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/bit_cast.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace torchattn::block {

RotaryCache::RotaryCache(const RoPEOptions& options, int64_t head_dim, int64_t length)
    : options_(options), head_dim_(head_dim), length_(length) {}

std::shared_ptr<const RotaryCache> RotaryCache::shared(const RoPEOptions& options, int64_t head_dim, int64_t length) {
  // Every field of RoPEOptions, and the table's shape: equal keys, equal tables.
  using Key = std::tuple<uint64_t, bool, int64_t, int64_t, int64_t>;
  const Key key{c10::bit_cast<uint64_t>(options.theta()), options.interleaved(), options.rotary_dim().value_or(-1),
                head_dim, length};
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const RotaryCache>> live;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = live.find(key); found != live.end()) {
    if (auto cache = found->second.lock()) return cache;
  }
  std::erase_if(live, [](const auto& entry) { return entry.second.expired(); });
  auto cache = std::make_shared<const RotaryCache>(options, head_dim, length);
  live[key] = cache;
  return cache;
}

std::pair<at::Tensor, at::Tensor> RotaryCache::tables(const at::Device& device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [d, t] : by_device_) {
    if (d == device) {
      return t;
    }
  }
  // Plain tensors whatever mode the first call runs in (not inference tensors, which
  // a later autograd forward could not use), and no graph.
  c10::InferenceMode normal(/*enabled=*/false);
  c10::NoGradGuard no_grad;
  by_device_.emplace_back(device, functional::rotary_tables(options_, head_dim_, length_, device));
  return by_device_.back().second;
}

at::Tensor RotaryCache::apply(const at::Tensor& x, const at::Tensor& positions) const {
  const auto [cos, sin] = tables(x.device());
  if (x.is_cpu() && x.is_contiguous()) {
    return kernels::cpu::rotary(x, positions, cos, sin, options_.rotary_dim().value_or(x.size(3)),
                                options_.interleaved());
  }
  // [B, T, G, hd] -> [B, G, T, hd] (tokens at -2, as apply_rotary takes them) and back.
  return functional::apply_rotary(x.transpose(1, 2), positions, cos, sin, options_).transpose(1, 2);
}

}  // namespace torchattn::block
