#include <torchattn/paged_kv_cache.h>

#include "cache/prefix_index.h"
#include "kernels/cpu/paged_write.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <queue>
#include <unordered_set>

namespace torchattn {

namespace {

constexpr const char* kPaged = "PagedKVCache";

uint64_t new_cache_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Host int64 values as a tensor on `device`.
at::Tensor long_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  at::Tensor cpu = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), cpu.mutable_data_ptr<int64_t>());
  return device.is_cpu() ? cpu : cpu.to(device, /*non_blocking=*/false);
}

}  // namespace

struct PagedKVCache::State {
  struct Sequence {
    std::vector<int64_t> blocks;
    int64_t length = 0;
    // The prefix ids of its leading blocks that are published (or match published ones).
    std::vector<uint64_t> prefix_ids;
  };

  std::vector<PagedLayer> layers;
  std::vector<at::Tensor> keys, values;  // [num_blocks, block_size, Hkv, d] per layer
  int64_t num_blocks = 0, block_size = 0;
  std::vector<int32_t> refs;  // sequences holding each block, and the prefix index (one) where published
  detail::PrefixIndex prefix;
  int64_t touched = 0;                                                      // blocks ever taken: [0, touched)
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free;  // lowest first
  std::map<int64_t, Sequence> sequences;  // ordered: ids grow, so the order they were added
  int64_t next_sequence = 0;
  uint64_t id = new_cache_id();
  uint64_t epoch = 0;

  Sequence& at(int64_t s, const char* what) {
    auto it = sequences.find(s);
    TORCH_CHECK(it != sequences.end(), kPaged, ": ", what, ": no sequence ", s, " in this cache");
    return it->second;
  }
  const Sequence& at(int64_t s, const char* what) const { return const_cast<State*>(this)->at(s, what); }

  // Free blocks, and published ones no sequence holds (reusable, given back when needed).
  int64_t available() const { return static_cast<int64_t>(free.size()) + prefix.reusable(); }
  // The lowest free block, unless it was never used yet and a reusable one can be given
  // back (least recently released first): kept blocks live in memory the pool already
  // uses, so prefix caching adds no resident memory (blocks are taken lowest first, so
  // the blocks ever used are [0, touched)).
  int64_t take() {
    int64_t b = 0;
    if (!free.empty() && (free.top() < touched || prefix.reusable() == 0)) {
      b = free.top();
      free.pop();
    } else {
      b = prefix.evict();
    }
    touched = std::max(touched, b + 1);
    refs[static_cast<size_t>(b)] = 1;
    return b;
  }
  void release(int64_t b) {
    const int32_t left = --refs[static_cast<size_t>(b)];
    if (left == 0) {
      free.push(b);
    } else if (left == 1 && prefix.id(b) != 0) {
      prefix.unheld(b);  // only the index holds it now: reusable
    }
  }
  // A published block for one more sequence.
  void hold(int64_t b) {
    if (refs[static_cast<size_t>(b)] == 1) prefix.held(b);
    ++refs[static_cast<size_t>(b)];
  }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size - 1) / block_size; }

  // Blocks a sequence needs to write `count` more tokens: new ones past its table, and a
  // copy of its last block when that is partly filled and shared.
  int64_t needed(const Sequence& q, int64_t count) const {
    int64_t n = blocks_for(q.length + count) - static_cast<int64_t>(q.blocks.size());
    if (q.length % block_size != 0 && refs[static_cast<size_t>(q.blocks.back())] > 1) ++n;
    return n;
  }

  void check_step(const std::vector<StepTokens>& tokens) const {
    TORCH_CHECK(!tokens.empty(), kPaged, ": begin_step expected at least one sequence, got none");
    std::unordered_set<int64_t> seen;
    for (const auto& t : tokens) {
      (void)at(t.sequence, "begin_step");
      TORCH_CHECK(t.count >= 1, kPaged, ": begin_step expected at least one new token for sequence ", t.sequence,
                  ", got ", t.count);
      TORCH_CHECK(seen.insert(t.sequence).second, kPaged, ": begin_step got sequence ", t.sequence,
                  " twice; give each sequence's new tokens once");
    }
  }

  int64_t needed(const std::vector<StepTokens>& tokens) const {
    int64_t n = 0;
    for (const auto& t : tokens) n += needed(at(t.sequence, "begin_step"), t.count);
    return n;
  }
};

PagedKVCache::PagedKVCache(std::vector<PagedLayer> layers, const PagedKVCacheOptions& options)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(!layers.empty(), kPaged, ": expected at least one layer, got none");
  TORCH_CHECK(options.num_blocks() >= 1, kPaged, ": expected num_blocks >= 1, got ", options.num_blocks());
  TORCH_CHECK(options.block_size() >= 1, kPaged, ": expected block_size >= 1, got ", options.block_size());
  State& s = *state_;
  s.num_blocks = options.num_blocks();
  s.block_size = options.block_size();
  const at::Device device = layers.front().options.device();
  for (size_t i = 0; i < layers.size(); ++i) {
    const PagedLayer& l = layers[i];
    TORCH_CHECK(l.num_kv_heads >= 1 && l.head_dim >= 1, kPaged, ": layer ", i,
                ": expected num_kv_heads >= 1 and head_dim >= 1, got ", l.num_kv_heads, " and ", l.head_dim);
    TORCH_CHECK(at::isFloatingType(l.options.dtype().toScalarType()), kPaged, ": layer ", i,
                ": expected a floating dtype, got ", l.options.dtype());
    TORCH_CHECK(l.options.device() == device, kPaged, ": expected every layer on one device, got ", device, " and ",
                l.options.device(), " (layer ", i, ")");
    // Uninitialized: pages are touched as blocks are first written. No kernel reads a
    // slot that was not written.
    // Keys transposed within a block ([head_dim, block_size] per head): the CPU kernel
    // computes a block's scores lane by key, with no horizontal sums.
    s.keys.push_back(at::empty({s.num_blocks, l.num_kv_heads, l.head_dim, s.block_size}, l.options));
    s.values.push_back(at::empty({s.num_blocks, l.num_kv_heads, s.block_size, l.head_dim}, l.options));
  }
  s.layers = std::move(layers);
  s.refs.assign(static_cast<size_t>(s.num_blocks), 0);
  for (int64_t b = 0; b < s.num_blocks; ++b) s.free.push(b);
}

PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;
PagedKVCache::~PagedKVCache() = default;

PagedKVCache::State& PagedKVCache::state() const {
  TORCH_CHECK(state_ != nullptr, kPaged, ": this cache was moved from");
  return *state_;
}

int64_t PagedKVCache::add_sequence() {
  State& s = state();
  const int64_t id = s.next_sequence++;
  s.sequences.emplace(id, State::Sequence{});
  ++s.epoch;
  return id;
}

int64_t PagedKVCache::add_sequence(const std::vector<int64_t>& tokens) {
  State& s = state();
  State::Sequence q;
  // Whole published blocks, leaving at least one token to compute.
  const auto reusable = static_cast<int64_t>(tokens.empty() ? 0 : (tokens.size() - 1)) / s.block_size;
  uint64_t parent = 0;
  for (int64_t i = 0; i < reusable; ++i) {
    const std::vector<int64_t> part(tokens.begin() + i * s.block_size, tokens.begin() + (i + 1) * s.block_size);
    const std::optional<int64_t> b = s.prefix.find(parent, part);
    if (!b) break;
    s.hold(*b);
    q.blocks.push_back(*b);
    parent = s.prefix.id(*b);
    q.prefix_ids.push_back(parent);
  }
  q.length = static_cast<int64_t>(q.blocks.size()) * s.block_size;
  const int64_t id = s.next_sequence++;
  s.sequences.emplace(id, std::move(q));
  ++s.epoch;
  return id;
}

void PagedKVCache::publish(int64_t sequence, const std::vector<int64_t>& tokens) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "publish");
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) >= q.length, kPaged, ": publish expected the tokens of sequence ",
              sequence, " (at least its ", q.length, "), got ", tokens.size());
  for (auto i = static_cast<int64_t>(q.prefix_ids.size()); i < q.length / s.block_size; ++i) {
    const int64_t b = q.blocks[static_cast<size_t>(i)];
    if (const uint64_t id = s.prefix.id(b); id != 0) {  // published through a fork sharing it
      q.prefix_ids.push_back(id);
      continue;
    }
    const uint64_t parent = q.prefix_ids.empty() ? 0 : q.prefix_ids.back();
    const uint64_t id = s.prefix.publish(b, parent,
                                         {tokens.begin() + i * s.block_size, tokens.begin() + (i + 1) * s.block_size});
    if (s.prefix.id(b) == id)
      ++s.refs[static_cast<size_t>(b)];  // the index's hold (else another block has these tokens)
    q.prefix_ids.push_back(id);
  }
}

int64_t PagedKVCache::reusable_blocks() const { return state().prefix.reusable(); }

int64_t PagedKVCache::fork(int64_t parent) {
  State& s = state();
  State::Sequence copy = s.at(parent, "fork");
  for (const int64_t b : copy.blocks) ++s.refs[static_cast<size_t>(b)];
  const int64_t id = s.next_sequence++;
  s.sequences.emplace(id, std::move(copy));
  ++s.epoch;
  return id;
}

void PagedKVCache::remove(int64_t sequence) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "remove");
  // Last block first: a chain's later blocks are given back before its first ones (a
  // shared system prompt's blocks stay longest).
  for (auto it = q.blocks.rbegin(); it != q.blocks.rend(); ++it) s.release(*it);
  s.sequences.erase(sequence);
  ++s.epoch;
}

void PagedKVCache::truncate(int64_t sequence, int64_t length) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "truncate");
  TORCH_CHECK(length >= 0 && length <= q.length, kPaged, ": truncate expected a length in [0, ", q.length,
              "] for sequence ", sequence, ", got ", length);
  const auto keep = static_cast<size_t>(s.blocks_for(length));
  for (size_t i = q.blocks.size(); i > keep; --i) s.release(q.blocks[i - 1]);
  q.blocks.resize(keep);
  q.length = length;
  q.prefix_ids.resize(std::min(q.prefix_ids.size(), static_cast<size_t>(length / s.block_size)));
  ++s.epoch;
}

bool PagedKVCache::contains(int64_t sequence) const { return state().sequences.count(sequence) > 0; }

int64_t PagedKVCache::length(int64_t sequence) const { return state().at(sequence, "length").length; }

std::vector<int64_t> PagedKVCache::sequences() const {
  std::vector<int64_t> out;
  for (const auto& [id, q] : state().sequences) out.push_back(id);
  return out;
}

int64_t PagedKVCache::num_blocks() const { return state().num_blocks; }
int64_t PagedKVCache::block_size() const { return state().block_size; }
int64_t PagedKVCache::free_blocks() const { return state().available(); }

int64_t PagedKVCache::bytes_per_block() const {
  const State& s = state();
  int64_t bytes = 0;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    bytes += 2 * s.keys[i][0].numel() * static_cast<int64_t>(s.keys[i].element_size());
  }
  return bytes;
}

int64_t PagedKVCache::blocks_needed(const std::vector<StepTokens>& tokens) const {
  const State& s = state();
  s.check_step(tokens);
  return s.needed(tokens);
}

std::vector<int64_t> PagedKVCache::block_table(int64_t sequence) const {
  return state().at(sequence, "block_table").blocks;
}

PagedStep PagedKVCache::begin_step(const std::vector<StepTokens>& tokens) {
  State& s = state();
  s.check_step(tokens);
  const int64_t needed = s.needed(tokens);
  TORCH_CHECK(needed <= s.available(), kPaged, ": the step needs ", needed, " free blocks and the pool has ",
              s.available(), " of ", s.num_blocks, "; finish or remove sequences first (or make a larger cache)");
  PagedStep step;
  std::vector<int64_t> positions, write_blocks, write_offsets, key_slots;
  step.query_start.push_back(0);
  step.key_start.push_back(0);
  for (const auto& t : tokens) {
    State::Sequence& q = s.sequences.at(t.sequence);
    // Copy on write: the partly filled last block is shared, and about to be written.
    if (q.length % s.block_size != 0 && s.refs[static_cast<size_t>(q.blocks.back())] > 1) {
      const int64_t shared = q.blocks.back(), own = s.take();
      for (size_t l = 0; l < s.keys.size(); ++l) {
        s.keys[l][own].copy_(s.keys[l][shared]);
        s.values[l][own].copy_(s.values[l][shared]);
      }
      s.release(shared);
      q.blocks.back() = own;
    }
    while (static_cast<int64_t>(q.blocks.size()) < s.blocks_for(q.length + t.count)) q.blocks.push_back(s.take());
    for (int64_t i = 0; i < t.count; ++i) {
      const int64_t p = q.length + i;
      positions.push_back(p);
      write_blocks.push_back(q.blocks[static_cast<size_t>(p / s.block_size)]);
      write_offsets.push_back(p % s.block_size);
    }
    q.length += t.count;
    for (int64_t p = 0; p < q.length; ++p) {
      key_slots.push_back(q.blocks[static_cast<size_t>(p / s.block_size)] * s.block_size + p % s.block_size);
    }
    step.sequences.push_back(t.sequence);
    step.query_start.push_back(step.query_start.back() + t.count);
    step.context_lengths.push_back(q.length);
    step.key_start.push_back(static_cast<int64_t>(key_slots.size()));
    step.max_position_ = std::max(step.max_position_, q.length - 1);
  }
  const at::Device device = s.layers.front().options.device();
  step.positions = long_tensor(positions, device);
  step.write_blocks = long_tensor(write_blocks, device);
  step.write_offsets = long_tensor(write_offsets, device);
  step.key_slots_cpu = long_tensor(key_slots, at::kCPU);
  step.key_slots = device.is_cpu() ? step.key_slots_cpu : step.key_slots_cpu.to(device);
  ++s.epoch;
  step.cache_id_ = s.id;
  step.epoch_ = s.epoch;
  return step;
}

bool PagedKVCache::is_current(const PagedStep& step) const {
  const State& s = state();
  return step.cache_id_ == s.id && step.epoch_ == s.epoch;
}

int64_t PagedKVCache::num_layers() const { return static_cast<int64_t>(state().layers.size()); }

const PagedLayer& PagedKVCache::layer(int64_t index) const {
  const State& s = state();
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(s.layers.size()), kPaged, ": expected a layer in [0, ",
              s.layers.size(), "), got ", index);
  return s.layers[static_cast<size_t>(index)];
}

const at::Tensor& PagedKVCache::keys(int64_t layer_index) const {
  (void)layer(layer_index);
  return state_->keys[static_cast<size_t>(layer_index)];
}

const at::Tensor& PagedKVCache::values(int64_t layer_index) const {
  (void)layer(layer_index);
  return state_->values[static_cast<size_t>(layer_index)];
}

void PagedKVCache::write(int64_t layer_index, const PagedStep& step, const at::Tensor& k, const at::Tensor& v) {
  const PagedLayer& l = layer(layer_index);
  TORCH_CHECK(is_current(step), kPaged,
              ": write: this step is not the cache's current one (made by another cache, "
              "or the cache changed since begin_step)");
  const int64_t N = step.num_tokens();
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == N && t->size(1) == l.num_kv_heads && t->size(2) == l.head_dim, kPaged,
                ": write expected keys and values of shape [", N, ", ", l.num_kv_heads, ", ", l.head_dim, "], got ",
                t->sizes());
    TORCH_CHECK(t->scalar_type() == l.options.dtype().toScalarType() && t->device() == l.options.device(), kPaged,
                ": write expected keys and values of dtype ", l.options.dtype(), " on ", l.options.device(), ", got ",
                t->scalar_type(), " on ", t->device());
  }
  at::Tensor key_pool = keys(layer_index), value_pool = values(layer_index);
  if (kernels::cpu::paged_write_applies(k, v, key_pool, value_pool)) {
    kernels::cpu::paged_write(k, v, step.write_blocks.const_data_ptr<int64_t>(),
                              step.write_offsets.const_data_ptr<int64_t>(), key_pool, value_pool);
    return;
  }
  const c10::List<std::optional<at::Tensor>> where({step.write_blocks, step.write_offsets});
  by_token(key_pool, true).index_put_(where, k);
  by_token(value_pool, false).index_put_(where, v);
}

at::Tensor PagedKVCache::by_token(const at::Tensor& storage, bool keys) {
  return keys ? storage.permute({0, 3, 1, 2}) : storage.permute({0, 2, 1, 3});
}

at::Tensor PagedKVCache::gather(const at::Tensor& storage, bool keys, int64_t sequence) const {
  const State& s = state();
  const auto& q = s.at(sequence, "sequence_keys");
  std::vector<int64_t> blocks, offsets;
  for (int64_t p = 0; p < q.length; ++p) {
    blocks.push_back(q.blocks[static_cast<size_t>(p / s.block_size)]);
    offsets.push_back(p % s.block_size);
  }
  const c10::List<std::optional<at::Tensor>> where(
      {long_tensor(blocks, storage.device()), long_tensor(offsets, storage.device())});
  return by_token(storage, keys).index(where).transpose(0, 1).contiguous();
}

at::Tensor PagedKVCache::sequence_keys(int64_t layer_index, int64_t sequence) const {
  return gather(keys(layer_index), true, sequence);
}

at::Tensor PagedKVCache::sequence_values(int64_t layer_index, int64_t sequence) const {
  return gather(values(layer_index), false, sequence);
}

}  // namespace torchattn
