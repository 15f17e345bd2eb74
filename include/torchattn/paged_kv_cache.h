#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torchattn {

/// One attention layer's keys and values in a PagedKVCache: their heads, head size,
/// dtype and device, and the module they belong to (0: any). MultiHeadAttention's
/// paged_layer() gives it.
struct PagedLayer {
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  at::TensorOptions options;
  uint64_t owner = 0;
};

struct PagedKVCacheOptions {
  explicit PagedKVCacheOptions(int64_t num_blocks) : num_blocks_(num_blocks) {}
  /// Blocks in the pool (each layer has this many, of block_size tokens).
  TORCH_ARG(int64_t, num_blocks);
  /// Tokens per block (>= 1). Default: 16.
  TORCH_ARG(int64_t, block_size) = 16;
};

/// A sequence's place in one step: which sequence, and how many new tokens it brings
/// (a prefill chunk, or one decoding token).
struct StepTokens {
  int64_t sequence = 0;
  int64_t count = 0;
};

/// What the layers of one step read, made once by PagedKVCache::begin_step: the new
/// tokens of each sequence packed one after another, without padding.
///
/// Sequence s of the step brings the tokens query_start[s] .. query_start[s + 1] of the
/// packed rows; after the step it holds context_lengths[s] tokens, the new ones last.
struct PagedStep {
  /// The step's sequences, in order.
  std::vector<int64_t> sequences;
  /// [S + 1] offsets of each sequence's new tokens among the N packed rows.
  std::vector<int64_t> query_start;
  /// [S] tokens each sequence holds after the step (its keys).
  std::vector<int64_t> context_lengths;
  /// [S + 1] offsets of each sequence's keys in key_slots.
  std::vector<int64_t> key_start;
  /// [N] int64 on the cache's device: each new token's position in its sequence.
  at::Tensor positions;
  /// [N] int64 on the cache's device: the block and the offset in it where each new
  /// token's key and value are written.
  at::Tensor write_blocks;
  at::Tensor write_offsets;
  /// [sum of context_lengths] int64 on the cache's device: for each sequence, in order,
  /// the slot (block * block_size + offset) of each of its tokens (its keys, oldest
  /// first).
  at::Tensor key_slots;
  /// The same on the CPU (the CPU kernels read it; the same tensor on a CPU cache).
  at::Tensor key_slots_cpu;

  int64_t num_sequences() const { return static_cast<int64_t>(sequences.size()); }
  int64_t num_tokens() const { return query_start.empty() ? 0 : query_start.back(); }
  /// The largest position of a new token (its sequence's length - 1); -1 when empty.
  int64_t max_position() const { return max_position_; }

 private:
  friend class PagedKVCache;
  uint64_t cache_id_ = 0;
  uint64_t epoch_ = 0;
  int64_t max_position_ = -1;
};

/// Keys and values of many sequences in one pool of fixed-size blocks per layer, as
/// serving engines keep them (vLLM's paged attention): each sequence owns a list of
/// blocks (its block table), taken as its tokens are written and returned when it is
/// removed, so memory in use grows with the tokens held, not with context_length times
/// the sequences. The pool's storage is allocated once, uninitialized: on the CPU its
/// pages become resident as blocks are first written (lowest blocks first).
///
///   auto cache = mha->make_paged_kv_cache(torchattn::PagedKVCacheOptions(/*num_blocks=*/256));
///   int64_t a = cache.add_sequence(), b = cache.add_sequence();
///   auto step = cache.begin_step({{a, 7}, {b, 1}});    // a prefill chunk of 7 tokens, one token of b
///   auto y = mha->forward_paged(x, cache, step);        // x: [8, d_in] -> [8, d_out]
///   int64_t c = cache.fork(a);                          // c shares a's blocks until one of them writes
///   cache.remove(b);                                    // b's blocks go back to the pool
///
/// Each step's sequences attend over their own keys only, and each sequence's rows
/// equal what forward_cached gives it alone with a contiguous KVCache.
///
/// Forks share blocks: a block is copied (in every layer) only when a sequence writes
/// into a partly filled block that another sequence shares (copy on write), so a shared
/// system prompt or a beam search's branches cost no more than their own new tokens.
///
/// A cache is for inference and one thread at a time (a serving engine's step loop).
/// Move-only.
class PagedKVCache {
 public:
  PagedKVCache(std::vector<PagedLayer> layers, const PagedKVCacheOptions& options);
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;
  PagedKVCache(PagedKVCache&&) noexcept;
  PagedKVCache& operator=(PagedKVCache&&) noexcept;
  ~PagedKVCache();

  // ---- sequences ----

  /// A new, empty sequence; returns its id (never reused).
  int64_t add_sequence();
  /// A new sequence for `tokens` that starts with the longest prefix of them whose keys
  /// and values are published (see publish): whole blocks, shared (copy on write), at
  /// most tokens.size() - 1 tokens so that one is left to compute. length() says how
  /// many it holds; the caller writes the rest.
  int64_t add_sequence(const std::vector<int64_t>& tokens);
  /// Prefix caching: publishes the sequence's full blocks (not published yet) as the
  /// keys and values of their token prefix. `tokens`: the sequence's tokens, at least
  /// length(sequence) of them, in order. A published block stays when every sequence
  /// holding it is gone, for a later add_sequence(tokens) to reuse, until the pool
  /// needs it (least recently released first): free_blocks() counts it as free. A block
  /// the pool never used yet is taken only when no kept block can be given back, so
  /// kept blocks take no memory beyond what the sequences held at most.
  void publish(int64_t sequence, const std::vector<int64_t>& tokens);
  /// Published blocks no sequence holds (kept for reuse; part of free_blocks()).
  int64_t reusable_blocks() const;
  /// A new sequence holding `parent`'s tokens, sharing its blocks (copy on write).
  int64_t fork(int64_t parent);
  /// Forgets the sequence; blocks no other sequence shares go back to the pool.
  void remove(int64_t sequence);
  /// Keeps the first `length` tokens of the sequence (0 <= length <= its length).
  void truncate(int64_t sequence, int64_t length);
  bool contains(int64_t sequence) const;
  /// Tokens the sequence holds.
  int64_t length(int64_t sequence) const;
  /// The sequences, in the order they were added.
  std::vector<int64_t> sequences() const;

  // ---- blocks ----

  int64_t num_blocks() const;
  int64_t block_size() const;
  int64_t free_blocks() const;
  int64_t used_blocks() const { return num_blocks() - free_blocks(); }
  /// Bytes of one block in every layer, keys and values.
  int64_t bytes_per_block() const;
  /// The blocks begin_step(tokens) would take from the pool (new blocks and copies on
  /// write); begin_step succeeds when this is at most free_blocks(). Checks `tokens` as
  /// begin_step does.
  int64_t blocks_needed(const std::vector<StepTokens>& tokens) const;
  /// The sequence's blocks, in order.
  std::vector<int64_t> block_table(int64_t sequence) const;

  // ---- steps ----

  /// Reserves room for each sequence's new tokens (taking blocks, copying shared ones
  /// about to be written), advances their lengths, and describes the step for the
  /// layers, which then write the new keys and values. Each sequence at most once, each
  /// count >= 1. All or nothing: when the pool has too few free blocks it is an error
  /// naming both numbers, and nothing changes. The step is valid until the cache
  /// changes again (another begin_step, fork, remove or truncate).
  PagedStep begin_step(const std::vector<StepTokens>& tokens);

  /// True when `step` was made by this cache and nothing changed since.
  bool is_current(const PagedStep& step) const;

  // ---- storage ----

  int64_t num_layers() const;
  const PagedLayer& layer(int64_t index) const;
  /// A layer's storage: keys [num_blocks, num_kv_heads, head_dim, block_size] (each
  /// block's keys transposed, a token per column) and values [num_blocks, num_kv_heads,
  /// block_size, head_dim]. by_token() views either as [num_blocks, block_size,
  /// num_kv_heads, head_dim].
  const at::Tensor& keys(int64_t layer) const;
  const at::Tensor& values(int64_t layer) const;
  /// keys(l) or values(l) (keys: true) as [num_blocks, block_size, num_kv_heads,
  /// head_dim] (a view).
  static at::Tensor by_token(const at::Tensor& storage, bool keys);

  /// Writes the step's new keys and values of a layer ([N, num_kv_heads, head_dim]
  /// each) at step.write_blocks / write_offsets. The step must be current
  /// (is_current): this is where a step is checked, forward_paged's included.
  void write(int64_t layer, const PagedStep& step, const at::Tensor& keys, const at::Tensor& values);

  /// A sequence's keys / values in one layer, oldest first: [num_kv_heads, length,
  /// head_dim] (a copy; for checks and tests).
  at::Tensor sequence_keys(int64_t layer, int64_t sequence) const;
  at::Tensor sequence_values(int64_t layer, int64_t sequence) const;

 private:
  struct State;
  State& state() const;
  at::Tensor gather(const at::Tensor& storage, bool keys, int64_t sequence) const;
  std::unique_ptr<State> state_;
};

}  // namespace torchattn
