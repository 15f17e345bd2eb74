#pragma once

// The generation loop: a prompt's ids through the model with KV caches, then one
// token at a time, streaming each new token's text as it comes, with timings.

#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace generate {

struct GenerationResult {
  std::vector<int64_t> ids;       // the new tokens (the stop token included, if one came)
  double prefill_seconds = 0.0;   // the prompt's forward and its first token
  double decode_seconds = 0.0;    // every token after the first
  int64_t prompt_tokens = 0;
};

/// Generates up to `max_new_tokens` after `prompt` (batch of one), stopping after a
/// token in `stop_ids`. `on_token` gets each new id as soon as it is chosen. On CUDA
/// every step after the first is replayed from a CUDA graph (torchattn::DecodeGraph).
GenerationResult generate_ids(CausalLMImpl& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              Sampler& sampler, const std::vector<int64_t>& stop_ids,
                              const std::function<void(int64_t)>& on_token = {});

/// Keeps the C library's allocator from handing large buffers back to the kernel after
/// every operation (a fresh mapping, page faults and zeroing each time a forward
/// allocates an activation): large blocks come from the heap and stay reused. First
/// returns what is free now (the weights the model was built with, replaced by the
/// checkpoint's), so call it once the model is loaded. For the programs' own process
/// (torchattn_generate and its benchmark); the library never calls it. About 10% of a
/// 512-token prefill on the benchmark machine.
void keep_freed_memory_for_reuse();

/// Turns token bytes into complete UTF-8 characters as they arrive: push() returns
/// what can be printed now; a character split across tokens waits for its end.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);
  std::string flush();

 private:
  std::string pending_;
};

} // namespace generate
