#include "generation.h"

#include <torchattn/decode_graph.h>

#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <memory>

namespace generate {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

GenerationResult generate_ids(CausalLMImpl& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              Sampler& sampler, const std::vector<int64_t>& stop_ids,
                              const std::function<void(int64_t)>& on_token) {
  TORCH_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  TORCH_CHECK(static_cast<int64_t>(prompt.size()) + max_new_tokens <= model.context_length(), "generate: ",
              prompt.size(), " prompt tokens and ", max_new_tokens, " new ones pass the context length ",
              model.context_length());
  c10::InferenceMode inference;
  model.eval();
  const auto device = model.embed_tokens->weight.device();
  const bool graphs = device.is_cuda();
  auto caches = model.make_caches(1, /*static_shapes=*/graphs);
  std::vector<torchattn::KVCache*> cache_ptrs;
  for (auto& c : caches) cache_ptrs.push_back(&c);
  std::unique_ptr<torchattn::DecodeGraph> step;

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto ids = at::tensor(prompt, at::kLong).unsqueeze(0).to(device);
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    at::Tensor logits;
    if (graphs && i > 0) {
      if (!step) {
        step = std::make_unique<torchattn::DecodeGraph>(
            [&](const at::Tensor& t) { return model.forward(t, &caches, {}, /*last_only=*/true); }, cache_ptrs);
      }
      logits = (*step)(ids);
    } else {
      logits = model.forward(ids, &caches, {}, /*last_only=*/true);
    }
    const int64_t next = sampler.next(logits.reshape({-1}));
    if (i == 0) {
      result.prefill_seconds = seconds_since(start);
      start = std::chrono::steady_clock::now();
    }
    result.ids.push_back(next);
    if (on_token) on_token(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    ids = at::tensor({next}, at::kLong).unsqueeze(0).to(device);
  }
  result.decode_seconds = result.ids.size() > 1 ? seconds_since(start) : 0.0;
  return result;
}

void keep_freed_memory_for_reuse() {
  malloc_trim(0);
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  // Keep back a trailing sequence that is not complete yet.
  size_t cut = pending_.size();
  for (size_t back = 1; back <= std::min<size_t>(4, pending_.size()); ++back) {
    const auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) cut = pending_.size() - back;
    break;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

} // namespace generate
