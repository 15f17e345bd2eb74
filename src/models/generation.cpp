#include <torchattn/models/generation.h>

#include <torchattn/decode_graph.h>

#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <memory>

namespace torchattn::models {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

SamplingOptions sampling_options(const GenerationOptions& o) {
  SamplingOptions s;
  s.greedy = !o.do_sample();
  s.temperature = o.temperature();
  s.top_k = o.top_k();
  s.top_p = o.top_p();
  s.seed = o.seed();
  return s;
}

std::vector<GenerationResult> generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options) {
  TORCH_CHECK(!prompts.empty(), "generate: expected at least one prompt, got none");
  TORCH_CHECK(options.max_new_tokens() >= 1, "generate: expected max_new_tokens >= 1, got ", options.max_new_tokens());
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    TORCH_CHECK(!prompts[b].empty(), "generate: prompt ", b, " has no tokens");
    for (const int64_t id : prompts[b]) {
      TORCH_CHECK(id >= 0 && id < model.config().vocab_size, "generate: prompt ", b, " has token id ", id,
                  ", outside the vocabulary [0, ", model.config().vocab_size, ")");
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[b].size()));
  }
  TORCH_CHECK(longest + options.max_new_tokens() <= model.context_length(), "generate: ", longest,
              " prompt tokens and ", options.max_new_tokens(), " new ones pass the context length ",
              model.context_length());
  std::vector<int64_t> stop = options.stop_token_ids();
  if (options.stop_at_eos()) stop.insert(stop.end(), model.config().eos_token_ids.begin(), model.config().eos_token_ids.end());
  const SamplingOptions sampling = sampling_options(options);
  std::vector<Sampler> samplers;
  for (int64_t b = 0; b < batch; ++b) samplers.emplace_back(sampling);  // validates the options

  c10::InferenceMode inference;
  model.eval();
  const auto device = model.embed_tokens->weight.device();
  const bool graphs = device.is_cuda() && batch == 1;
  auto caches = model.make_caches(batch, /*static_shapes=*/graphs);
  std::vector<torchattn::KVCache*> cache_ptrs;
  for (auto& c : caches) cache_ptrs.push_back(&c);
  std::unique_ptr<torchattn::DecodeGraph> step;

  // Left-padded prompts: every sequence's last prompt token in the last column.
  std::vector<int64_t> flat(static_cast<size_t>(batch * longest), 0);
  std::vector<uint8_t> pad(flat.size(), 0);
  bool padded = false;
  std::vector<GenerationResult> results(prompts.size());
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t offset = longest - static_cast<int64_t>(p.size());
    for (int64_t t = 0; t < longest; ++t) {
      const size_t at = static_cast<size_t>(b * longest + t);
      if (t < offset) {
        pad[at] = 1;
        padded = true;
      } else {
        flat[at] = p[static_cast<size_t>(t - offset)];
      }
    }
    results[static_cast<size_t>(b)].prompt_tokens = static_cast<int64_t>(p.size());
  }
  at::Tensor ids = at::tensor(flat, at::kLong).view({batch, longest}).to(device);
  at::Tensor mask = padded ? at::tensor(at::ArrayRef<uint8_t>(pad), at::kByte).view({batch, longest}).to(device, at::kBool)
                           : at::Tensor();
  std::vector<bool> done(prompts.size(), false);
  size_t remaining = prompts.size();
  auto start = std::chrono::steady_clock::now();
  double prefill = 0.0;
  for (int64_t i = 0; i < options.max_new_tokens() && remaining > 0; ++i) {
    at::Tensor logits;
    if (graphs && i > 0) {
      if (!step) {
        step = std::make_unique<torchattn::DecodeGraph>(
            [&](const at::Tensor& t) { return model.forward(t, &caches, {}, /*last_only=*/true); }, cache_ptrs);
      }
      logits = (*step)(ids);
    } else {
      logits = model.forward(ids, &caches, i == 0 ? mask : at::Tensor(), /*last_only=*/true);
    }
    const at::Tensor last = logits.select(1, 0);  // [B, vocab]
    std::vector<int64_t> next(prompts.size(), 0);
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (done[b]) continue;
      next[b] = samplers[b].next(last[static_cast<int64_t>(b)]);
      results[b].ids.push_back(next[b]);
      if (options.on_token()) options.on_token()(b, next[b]);
      if (std::find(stop.begin(), stop.end(), next[b]) != stop.end()) {
        results[b].stopped = true;
        done[b] = true;
        --remaining;
      }
    }
    if (i == 0) {
      prefill = seconds_since(start);
      start = std::chrono::steady_clock::now();
    }
    // A finished sequence goes on with token 0, whose outputs nobody reads.
    ids = at::tensor(next, at::kLong).view({batch, 1}).to(device);
  }
  const double decode = seconds_since(start);
  for (auto& r : results) {
    r.prefill_seconds = prefill;
    r.decode_seconds = r.ids.size() > 1 ? decode : 0.0;
  }
  return results;
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

} // namespace torchattn::models
