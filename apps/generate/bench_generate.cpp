// torchattn_generate_bench: SmolLM2-135M (or any Llama-family folder) with torchattn on
// the CPU: peak RSS of a generation, prefill of a long prompt, decoding tokens/s, and
// the machine's memory read bandwidth measured in the same run (the bound decoding is
// held against). apps/generate/bench_transformers.py measures transformers the same
// way; apps/bench/report_generate.py sets them side by side.
//
//   torchattn_generate_bench --model DIR [--threads 2] [--dtype float32|bfloat16|int8|dynamic-int8]
//                            [--json out.json] [--quick]
//   torchattn_generate_bench --model DIR --decode-only [--threads N] [--dtype ...] [--json out.json]
//   torchattn_generate_bench --model DIR --prefill-only [--threads N] [--dtype ...]
//
// --dtype: the weights' format (torchattn::WeightFormat; float32 activations).
//
// --decode-only measures decoding tokens/s alone (apps/bench/run.sh runs it on an idle
// machine and with one core kept busy by another process, at 2 threads and at 1).
// --prefill-only measures the long prompt's prefill alone, 10 warm runs (for profiling it).

#include "fmt.h"
#include "reuse_memory.h"

#include <torchattn/models.h>
#include <torchattn/torchattn.h>

#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SmolLM2 on torchattn: peak RSS, prefill, decoding and the memory bound"};
  std::string model_dir, json_path, dtype_name = "float32";
  int threads = 2;
  bool quick = false, decode_only = false, prefill_only = false;
  app.add_option("--model", model_dir, "a Hugging Face model folder")->required()->check(CLI::ExistingDirectory);
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--dtype", dtype_name, "the weights' format: float32, bfloat16, int8 or dynamic-int8")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8"}));
  app.add_option("--json", json_path, "write the results here as JSON");
  app.add_flag("--quick", quick, "a smoke run");
  app.add_flag("--decode-only", decode_only, "measure decoding tokens/s only");
  app.add_flag("--prefill-only", prefill_only, "measure the long prompt's prefill only")->excludes("--decode-only");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  const auto dir = std::filesystem::path(model_dir);
  const int64_t prompt_len = 32, new_tokens = quick ? 16 : 128, long_prompt = quick ? 128 : 512;

  // 1. Load and generate, as torchattn_generate does; the process's peak RSS then.
  auto t0 = Clock::now();
  const auto config = torchattn::models::read_decoder_config((dir / "config.json").string());
  // Sized as torchattn_generate sizes it: the prompt plus the new tokens (the KV caches
  // hold that many).
  // As torchattn_generate loads: from the file, whose map goes once no weight uses it;
  // a folder of frozen weights (torchattn_generate --save) as it is.
  torchattn::models::CausalLM model = torchattn::models::load_causal_lm(config, prompt_len + new_tokens, model_dir,
                                                                        torchattn::weight_format_from_string(
                                                                            dtype_name));
  const auto format = model->weight_format();
  dtype_name = std::string(torchattn::to_string(format));
  keep_freed_memory_for_reuse();
  const double load_s = seconds(t0);
  const int64_t weight_bytes = model->weight_bytes();
  // What a decoding step reads: the weights, less an embedding table that the head does
  // not read (an untied head, or a float32 table beside a dynamic-int8 head's own copy;
  // a table freed into the head's frozen copy is in weight_bytes no more).
  const at::Tensor& table = model->embed_tokens->weight;
  const bool table_apart = (model->lm_head || format != torchattn::WeightFormat::Float32) && table.stride(0) != 0;
  const int64_t step_bytes = weight_bytes - (table_apart ? table.numel() * table.element_size() : 0);
  auto ids = at::randint(100, config.vocab_size - 100, {prompt_len}, at::kLong);
  std::vector<int64_t> prompt(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + prompt_len);
  std::vector<double> decode_tps, first_prefill;
  for (int r = 0; r < (quick || prefill_only ? 0 : 3); ++r) {
    // No stop token: always new_tokens tokens.
    const auto options = torchattn::models::GenerationOptions().max_new_tokens(new_tokens).stop_at_eos(false);
    const auto result = torchattn::models::generate(*model, {prompt}, options)[0];
    decode_tps.push_back((result.ids.size() - 1) / result.decode_seconds);
    first_prefill.push_back(result.prefill_seconds);
  }
  if (decode_only) {
    fmt::print("torchattn_generate_bench: decoding {} tokens, {} weights, {} threads: {:.1f} tokens/s (median of {})\n",
               new_tokens, dtype_name, at::get_num_threads(), median(decode_tps), decode_tps.size());
    if (!json_path.empty()) {
      std::string runs;
      for (const double r : decode_tps) runs += fmt::format("{}{:.3f}", runs.empty() ? "" : ", ", r);
      std::ofstream(json_path) << fmt::format("{{\"threads\": {}, \"dtype\": \"{}\", \"new_tokens\": {}, "
                                              "\"decode_tokens_per_s\": {:.3f}, \"runs\": [{}]}}\n",
                                              at::get_num_threads(), dtype_name, new_tokens, median(decode_tps), runs);
    }
    return 0;
  }
  const double peak_rss_mib = status_kb("VmHWM:") / 1024.0, rss_mib = status_kb("VmRSS:") / 1024.0;
  fmt::print("torchattn_generate_bench: {} ({:.0f} MB of {} weights), {} threads\n", dir.filename().string(),
             weight_bytes / 1e6, dtype_name, at::get_num_threads());
  if (!prefill_only) {
    fmt::print(
        "  load {:.2f} s; peak RSS after loading and generating {:.0f} MiB ({:.2f}x the weights), RSS then {:.0f} "
        "MiB\n",
        load_s, peak_rss_mib, peak_rss_mib * (1 << 20) / weight_bytes, rss_mib);
    fmt::print("  decode: {} tokens after a {}-token prompt: {:.1f} tokens/s (median of {})\n", new_tokens, prompt_len,
               median(decode_tps), decode_tps.size());
  }

  // 2. Prefill of a long prompt: the logits of its last token, warm, in a model sized
  // for it (the file mapped again).
  std::vector<double> prefill;
  {
    torchattn::models::CausalLM model = torchattn::models::load_causal_lm(config, long_prompt, model_dir, format);
    c10::InferenceMode inference;
    const auto long_ids = at::randint(100, config.vocab_size - 100, {1, long_prompt}, at::kLong);
    for (int r = 0; r < (quick ? 2 : prefill_only ? 11 : 6); ++r) {
      auto caches = model->make_kv_caches(1);
      const auto t = Clock::now();
      model->forward(long_ids, &caches, {}, /*last_only=*/true);
      if (r > 0) prefill.push_back(seconds(t));  // the first is the warm-up
    }
  }
  fmt::print("  prefill {} tokens: {:.3f} s (median of {})\n", long_prompt, median(prefill), prefill.size());
  if (prefill_only) return 0;

  // 3. Memory read bandwidth: a sum over 512 MiB, on the same threads.
  std::vector<double> bandwidth;
  {
    c10::InferenceMode inference;
    const auto big = at::ones({int64_t{128} << 20}, at::kFloat);
    for (int r = 0; r < 6; ++r) {
      const auto t = Clock::now();
      (void)big.sum().item<float>();
      if (r > 0) bandwidth.push_back(big.numel() * 4.0 / seconds(t) / 1e9);
    }
  }
  const double gbps = median(bandwidth);
  const double bound = gbps * 1e9 / step_bytes;
  fmt::print("  memory read bandwidth {:.1f} GB/s: reading the weights ({:.0f} MB a step) bounds decoding at {:.1f} "
             "tokens/s; decoding runs at {:.0f}% of it\n",
             gbps, step_bytes / 1e6, bound, 100.0 * median(decode_tps) / bound);

  if (!json_path.empty()) {
    std::ofstream(json_path) << fmt::format(
        "{{\"tool\": \"torchattn_generate_bench\", \"model\": \"{}\", \"threads\": {}, \"dtype\": \"{}\", "
        "\"weight_bytes\": {}, \"step_bytes\": {}, \"load_s\": {:.4f}, \"peak_rss_mib\": {:.1f}, \"rss_mib\": {:.1f}, \"prompt\": {}, \"new_tokens\": {}, \"decode_tokens_per_s\": {:.3f}, "
        "\"first_prefill_s\": {:.4f}, \"long_prompt\": {}, \"prefill_s\": {:.4f}, \"bandwidth_gbps\": {:.2f}, "
        "\"decode_bound_tokens_per_s\": {:.2f}}}\n",
        dir.filename().string(), at::get_num_threads(), dtype_name, weight_bytes, step_bytes, load_s, peak_rss_mib,
        rss_mib, prompt_len, new_tokens, median(decode_tps), median(first_prefill), long_prompt, median(prefill), gbps,
        bound);
    fmt::print("wrote {}\n", json_path);
  }
  return 0;
}
