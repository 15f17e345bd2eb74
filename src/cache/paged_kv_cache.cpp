// PagedKVCache: the pool's storage (each layer's keys and values), its sequences, and
// the public API, delegating the block allocator (cache/block_allocator.h), the
// prefix-cache policy (cache/prefix_cache.h) and the step's tables (cache/paged_step.h).

#include <torchattn/paged_kv_cache.h>

#include "backends/attend_paged.h"
#include "cache/block_allocator.h"
#include "cache/paged_step.h"
#include "cache/prefix_cache.h"
#include "kernels/cpu/paged_write.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <unordered_set>

namespace torchattn {

namespace {

constexpr const char* kPaged = "PagedKVCache";

uint64_t new_cache_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

struct PagedKVCache::State {
  struct Sequence {
    cache::BlockTable table;
    // The prefix ids of its leading blocks that are published (or match published ones).
    std::vector<uint64_t> prefix_ids;
  };

  State(int64_t num_blocks, int64_t block_size) : blocks(num_blocks, block_size), pool(blocks) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  std::vector<PagedLayer> layers;
  std::vector<at::Tensor> keys, values;   // per layer: see PagedKVCache::keys and values
  cache::BlockAllocator blocks;           // free list and holders
  cache::PrefixCache pool;                // takes and releases blocks (over `blocks`), keeps published ones
  std::map<int64_t, Sequence> sequences;  // ordered: ids grow, so the order they were added
  int64_t next_sequence = 0;
  uint64_t id = new_cache_id();
  uint64_t epoch = 0;

  // Sequence s, or an error naming the caller `what`.
  Sequence& at(int64_t s, const char* what) {
    auto it = sequences.find(s);
    TORCH_CHECK(it != sequences.end(), kPaged, ": ", what, ": no sequence ", s, " in this cache");
    return it->second;
  }
  const Sequence& at(int64_t s, const char* what) const { return const_cast<State*>(this)->at(s, what); }

  // A new sequence id for `q`; the cache changed.
  int64_t add(Sequence q) {
    const int64_t sequence = next_sequence++;
    sequences.emplace(sequence, std::move(q));
    ++epoch;
    return sequence;
  }

  // begin_step's and blocks_needed's `tokens`: at least one, each an existing sequence,
  // once, with count >= 1.
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

  // Blocks the pool gives checked `tokens`: new ones and copies on write.
  int64_t needed(const std::vector<StepTokens>& tokens) const {
    int64_t n = 0;
    for (const auto& t : tokens) n += blocks.needed(at(t.sequence, "begin_step").table, t.count);
    return n;
  }

  // Room for `count` more tokens in `table` (the blocks available): copy on write of a
  // shared, partly filled last block (its keys and values in every layer), then new
  // blocks; advances its length.
  void reserve(cache::BlockTable& table, int64_t count) {
    if (blocks.must_copy(table)) {
      const int64_t shared = table.blocks.back(), own = pool.take();
      for (size_t l = 0; l < keys.size(); ++l) {
        keys[l][own].copy_(keys[l][shared]);
        values[l][own].copy_(values[l][shared]);
      }
      pool.release(shared);
      table.blocks.back() = own;
    }
    while (static_cast<int64_t>(table.blocks.size()) < blocks.blocks_for(table.length + count)) {
      table.blocks.push_back(pool.take());
    }
    table.length += count;
  }
};

// layers: at least one, each with heads and a head size >= 1, a floating dtype, all on
// one device; options: num_blocks >= 1, block_size >= 1. Storage per layer: keys
// [num_blocks, Hkv, head_dim, block_size], values [num_blocks, Hkv, block_size, head_dim].
PagedKVCache::PagedKVCache(std::vector<PagedLayer> layers, const PagedKVCacheOptions& options) {
  TORCH_CHECK(!layers.empty(), kPaged, ": expected at least one layer, got none");
  TORCH_CHECK(options.num_blocks() >= 1, kPaged, ": expected num_blocks >= 1, got ", options.num_blocks());
  TORCH_CHECK(options.block_size() >= 1, kPaged, ": expected block_size >= 1, got ", options.block_size());
  const int64_t num_blocks = options.num_blocks(), block_size = options.block_size();
  auto state = std::make_unique<State>(num_blocks, block_size);
  State& s = *state;
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
    s.keys.push_back(at::empty({num_blocks, l.num_kv_heads, l.head_dim, block_size}, l.options));
    s.values.push_back(at::empty({num_blocks, l.num_kv_heads, block_size, l.head_dim}, l.options));
  }
  s.layers = std::move(layers);
  state_ = std::move(state);
}

PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;
PagedKVCache::~PagedKVCache() = default;

// The state, or an error for a moved-from cache.
PagedKVCache::State& PagedKVCache::state() const {
  TORCH_CHECK(state_ != nullptr, kPaged, ": this cache was moved from");
  return *state_;
}

// An empty sequence: no blocks.
int64_t PagedKVCache::add_sequence() { return state().add(State::Sequence{}); }

// A sequence starting with the published blocks of tokens' longest published prefix
// (whole blocks, at most tokens.size() - 1 tokens), shared.
int64_t PagedKVCache::add_sequence(const std::vector<int64_t>& tokens) {
  State& s = state();
  State::Sequence q;
  s.pool.reuse(tokens, q.table, q.prefix_ids);
  return s.add(std::move(q));
}

// tokens: at least length(sequence) of them. Publishes its full blocks not yet published.
void PagedKVCache::publish(int64_t sequence, const std::vector<int64_t>& tokens) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "publish");
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) >= q.table.length, kPaged,
              ": publish expected the tokens of sequence ", sequence, " (at least its ", q.table.length, "), got ",
              tokens.size());
  s.pool.publish(q.table, tokens, q.prefix_ids);
}

int64_t PagedKVCache::reusable_blocks() const { return state().pool.reusable(); }

// A copy of parent's table and prefix ids; each block one holder more (the parent holds
// them, so none was reusable).
int64_t PagedKVCache::fork(int64_t parent) {
  State& s = state();
  State::Sequence copy = s.at(parent, "fork");
  for (const int64_t b : copy.table.blocks) s.blocks.share(b);
  return s.add(std::move(copy));
}

// Releases the sequence's blocks, last first: a chain's later blocks are given back
// before its first ones (a shared system prompt's blocks stay longest).
void PagedKVCache::remove(int64_t sequence) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "remove");
  // (Indices, not std::views::reverse: clang 14 cannot read libstdc++ 12's views.)
  for (size_t i = q.table.blocks.size(); i-- > 0;) s.pool.release(q.table.blocks[i]);
  s.sequences.erase(sequence);
  ++s.epoch;
}

// length in [0, length(sequence)]: releases the blocks past it, last first.
void PagedKVCache::truncate(int64_t sequence, int64_t length) {
  State& s = state();
  State::Sequence& q = s.at(sequence, "truncate");
  TORCH_CHECK(length >= 0 && length <= q.table.length, kPaged, ": truncate expected a length in [0, ", q.table.length,
              "] for sequence ", sequence, ", got ", length);
  std::vector<int64_t>& blocks = q.table.blocks;
  const auto keep = static_cast<size_t>(s.blocks.blocks_for(length));
  for (size_t i = blocks.size(); i > keep; --i) s.pool.release(blocks[i - 1]);
  blocks.resize(keep);
  q.table.length = length;
  q.prefix_ids.resize(std::min(q.prefix_ids.size(), static_cast<size_t>(length / s.blocks.block_size())));
  ++s.epoch;
}

bool PagedKVCache::contains(int64_t sequence) const { return state().sequences.count(sequence) > 0; }

int64_t PagedKVCache::length(int64_t sequence) const { return state().at(sequence, "length").table.length; }

std::vector<int64_t> PagedKVCache::sequences() const {
  std::vector<int64_t> out;
  for (const auto& [id, q] : state().sequences) out.push_back(id);
  return out;
}

int64_t PagedKVCache::num_blocks() const { return state().blocks.num_blocks(); }
int64_t PagedKVCache::block_size() const { return state().blocks.block_size(); }
int64_t PagedKVCache::free_blocks() const { return state().pool.available(); }

// Keys and values of one block, summed over the layers.
int64_t PagedKVCache::bytes_per_block() const {
  const State& s = state();
  int64_t bytes = 0;
  for (const auto& k : s.keys) {
    bytes += 2 * k[0].numel() * static_cast<int64_t>(k.element_size());
  }
  return bytes;
}

// tokens checked as begin_step checks them.
int64_t PagedKVCache::blocks_needed(const std::vector<StepTokens>& tokens) const {
  const State& s = state();
  s.check_step(tokens);
  return s.needed(tokens);
}

std::vector<int64_t> PagedKVCache::block_table(int64_t sequence) const {
  return state().at(sequence, "block_table").table.blocks;
}

// tokens: checked (check_step), then all or nothing: the blocks needed must be
// available. Reserves each sequence's room in order, then builds the step's tables.
PagedStep PagedKVCache::begin_step(const std::vector<StepTokens>& tokens) {
  State& s = state();
  s.check_step(tokens);
  const int64_t needed = s.needed(tokens);
  TORCH_CHECK(needed <= s.pool.available(), kPaged, ": the step needs ", needed, " free blocks and the pool has ",
              s.pool.available(), " of ", s.blocks.num_blocks(),
              "; finish or remove sequences first (or make a larger cache)");
  std::vector<const cache::BlockTable*> tables;
  for (const auto& t : tokens) {
    cache::BlockTable& table = s.sequences.at(t.sequence).table;
    s.reserve(table, t.count);
    tables.push_back(&table);
  }
  PagedStep step;
  step.max_position_ = cache::fill_step_tables(step, tokens, tables, s.blocks.block_size(),
                                               s.layers.front().options.device());
  ++s.epoch;
  step.cache_id_ = s.id;
  step.epoch_ = s.epoch;
  return step;
}

// Made by this cache (its id), with no change since (its epoch).
bool PagedKVCache::is_current(const PagedStep& step) const {
  const State& s = state();
  return step.cache_id_ == s.id && step.epoch_ == s.epoch;
}

int64_t PagedKVCache::num_layers() const { return static_cast<int64_t>(state().layers.size()); }

// index in [0, num_layers()).
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

// The one place a step is checked before it is used (forward_paged reaches the cache
// through here too): the step current, then k and v [N, num_kv_heads, head_dim] of the
// layer's dtype and device. Writes them at step.write_blocks / write_offsets.
void PagedKVCache::write(int64_t layer_index, const PagedStep& step, const at::Tensor& k, const at::Tensor& v) {
  const PagedLayer& l = layer(layer_index);
  TORCH_CHECK(is_current(step), kPaged,
              ": write: this step is not the cache's current one (made by another cache, "
              "or the cache changed since begin_step); expected the cache's current step, from cache.begin_step "
              "with no fork, remove, truncate or other begin_step since");
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

// The pool's layout is the backends' (attend_paged.h), which read it.
at::Tensor PagedKVCache::by_token(const at::Tensor& storage, bool keys) {
  return backends::paged_by_token(storage, keys);
}

// The sequence's tokens of `storage` (a layer's keys or values), oldest first:
// [Hkv, length, head_dim], a copy.
at::Tensor PagedKVCache::gather(const at::Tensor& storage, bool keys, int64_t sequence) const {
  const State& s = state();
  const auto& q = s.at(sequence, "sequence_keys");
  auto [blocks, offsets] = cache::token_places(q.table, s.blocks.block_size(), storage.device());
  const c10::List<std::optional<at::Tensor>> where({blocks, offsets});
  return by_token(storage, keys).index(where).transpose(0, 1).contiguous();
}

at::Tensor PagedKVCache::sequence_keys(int64_t layer_index, int64_t sequence) const {
  return gather(keys(layer_index), true, sequence);
}

at::Tensor PagedKVCache::sequence_values(int64_t layer_index, int64_t sequence) const {
  return gather(values(layer_index), false, sequence);
}

}  // namespace torchattn
