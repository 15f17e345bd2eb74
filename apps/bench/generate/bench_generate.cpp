// torchattn_generate_bench: SmolLM2-135M (or any Llama-family folder) with torchattn on
// the CPU: peak RSS of a generation, prefill of a long prompt, decoding tokens/s, and
// the machine's memory read bandwidth measured in the same run (the bound decoding is
// held against). apps/bench/peers/transformers_generate.py measures transformers the same
// way; apps/bench/generate/report_generate.py sets them side by side.
//
//   torchattn_generate_bench --model DIR [--threads 2] [--dtype float32|bfloat16|int8|dynamic-int8|int4]
//                            [--json out.json] [--quick]
//   torchattn_generate_bench --model DIR --decode-only [--threads N] [--dtype ...] [--json out.json]
//   torchattn_generate_bench --model DIR --prefill-only [--threads N] [--dtype ...] [--json out.json]
//   ... [--new-tokens N (at least 2)] [--long-prompts 512,2048] [--cold-load]
//
// --model: a folder, or a GGUF file (its F32, F16, BF16 and quantized tensors as
// LanguageModel::from_pretrained loads them; --dtype int4 keeps Q4_0 and Q4_1 blocks).
// --dtype: the weights' format (torchattn::WeightFormat; float32 activations).
//
// --decode-only measures decoding tokens/s alone (apps/bench/run.sh runs it on an idle
// machine and with one core kept busy by another process, at 2 threads and at 1).
// --prefill-only measures the long prompt's prefill alone, 10 warm runs (for profiling it).
// --long-prompts: the prefills measured (default 512; each the median of its warm runs).
// --cold-load: the folder's files (or the GGUF file) evicted from the page cache (posix_fadvise DONTNEED)
// and the model loaded once first (load_cold_s); then the peak RSS starts again and the
// measured load is warm (the scale page, apps/bench/results/scale.md).

#include "fmt.h"
#include "model_source.h"
#include "reuse_memory.h"

#include <torchattn/models.h>
#include <torchattn/torchattn.h>

#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(key)) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Drops the page-cache pages of a file (the next read comes from the disk).
void evict_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The same for a GGUF file, or for every file in a folder.
void evict(const std::filesystem::path& model) {
  if (!std::filesystem::is_directory(model)) return evict_file(model);
  for (const auto& entry : std::filesystem::directory_iterator(model)) {
    if (entry.is_regular_file()) evict_file(entry.path());
  }
}

// The peak RSS (VmHWM) starts again from the current RSS (Linux).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::vector<int64_t> lengths_of(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    TORCH_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos && std::stoll(item) >= 1,
                "torchattn_generate_bench: --long-prompts expected lengths like 512,2048, got '", text, "'");
    out.push_back(std::stoll(item));
  }
  TORCH_CHECK(!out.empty(), "torchattn_generate_bench: --long-prompts expected lengths like 512,2048, got '", text,
              "'");
  return out;
}

double median(std::vector<double> v) {
  TORCH_CHECK(!v.empty(), "torchattn_generate_bench: no runs to take the median of");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SmolLM2 on torchattn: peak RSS, prefill, decoding and the memory bound"};
  std::string model_dir, json_path, dtype_name = "float32", long_prompts_text;
  int threads = 2;
  int64_t new_tokens_option = 0;
  bool quick = false, decode_only = false, prefill_only = false, cold_load = false, no_verify = false;
  app.add_option("--model", model_dir, "a Hugging Face model folder, or a GGUF file")
      ->required()
      ->check(apps::folder_or_gguf());
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--dtype", dtype_name, "the weights' format: float32, bfloat16, int8, dynamic-int8 or int4")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8", "int4"}));
  app.add_option("--json", json_path, "write the results here as JSON");
  app.add_flag("--quick", quick, "a smoke run");
  app.add_flag("--decode-only", decode_only, "measure decoding tokens/s only");
  app.add_flag("--prefill-only", prefill_only, "measure the long prompt's prefill only")->excludes("--decode-only");
  // Decoding's rate counts the tokens after the first (which the prefill makes): one new
  // token leaves none to time.
  app.add_option("--new-tokens", new_tokens_option, "tokens decoded per run, at least 2 (default 128; 16 with --quick)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--long-prompts", long_prompts_text, "the prefills measured, e.g. 512,2048 (default 512)");
  app.add_flag("--cold-load", cold_load, "evict the folder's files from the page cache and load once first");
  app.add_flag(
      "--no-verify-weights", no_verify,
      "skip the check of a saved folder's weights against their recorded checksums (LoadOptions::verify_weights)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  const auto dir = std::filesystem::path(model_dir);
  const int64_t prompt_len = 32, new_tokens = new_tokens_option > 0 ? new_tokens_option : quick ? 16 : 128;
  const std::vector<int64_t> long_prompts = lengths_of(long_prompts_text.empty() ? (quick ? "128" : "512")
                                                                                 : long_prompts_text);
  const auto config = apps::decoder_config(model_dir);
  const bool gguf = torchattn::models::is_gguf_file(model_dir);
  const auto load = [&](int64_t context) {
    // As torchattn_generate loads: from the file, mapped; a folder of frozen weights
    // (torchattn_generate --save) as it is; a GGUF file as LanguageModel loads it (with
    // --dtype int4 its Q4_0 and Q4_1 blocks as they are).
    const auto format = torchattn::weight_format_from_string(dtype_name);
    if (gguf) {
      torchattn::models::LoadOptions options;
      options.weight_format(format).context_length(context);
      return torchattn::models::LanguageModel::from_pretrained(model_dir, options).model();
    }
    return torchattn::models::load_causal_lm(config, context, model_dir, format, !no_verify);
  };

  // 0. A cold load: the files from the disk.
  double load_cold_s = -1.0;
  if (cold_load) {
    evict(dir);
    const auto t = Clock::now();
    { torchattn::models::CausalLM cold = load(prompt_len + new_tokens); }
    load_cold_s = seconds(t);
    reset_peak_rss();
  }

  // 1. Load and generate, as torchattn_generate does; the process's peak RSS then.
  // Sized as torchattn_generate sizes it: the prompt plus the new tokens (the KV caches
  // hold that many).
  auto t0 = Clock::now();
  torchattn::models::CausalLM model = load(prompt_len + new_tokens);
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
  // Decoding: 3 runs, 1 with --quick (a smoke run still measures it), none with --prefill-only.
  for (int r = 0; r < (prefill_only ? 0 : quick ? 1 : 3); ++r) {
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
      std::ofstream(json_path) << fmt::format(
          "{{\"threads\": {}, \"dtype\": \"{}\", \"new_tokens\": {}, \"decode_tokens_per_s\": {:.3f}, "
          "\"runs\": [{}], \"load_s\": {:.4f}, \"load_cold_s\": {}, \"peak_rss_mib\": {:.1f}, "
          "\"weight_bytes\": {}}}\n",
          at::get_num_threads(), dtype_name, new_tokens, median(decode_tps), runs, load_s,
          load_cold_s >= 0 ? fmt::format("{:.4f}", load_cold_s) : "null", status_kb("VmHWM:") / 1024.0, weight_bytes);
    }
    return 0;
  }
  const double peak_rss_mib = status_kb("VmHWM:") / 1024.0, rss_mib = status_kb("VmRSS:") / 1024.0;
  fmt::print("torchattn_generate_bench: {} ({:.0f} MB of {} weights), {} threads\n", dir.filename().string(),
             weight_bytes / 1e6, dtype_name, at::get_num_threads());
  if (!prefill_only) {
    fmt::print(
        "  load {:.2f} s{}; peak RSS after loading and generating {:.0f} MiB ({:.2f}x the weights), RSS then {:.0f} "
        "MiB\n",
        load_s, load_cold_s >= 0 ? fmt::format(" (cold {:.2f} s)", load_cold_s) : "", peak_rss_mib,
        peak_rss_mib * (1 << 20) / weight_bytes, rss_mib);
    fmt::print("  decode: {} tokens after a {}-token prompt: {:.1f} tokens/s (median of {})\n", new_tokens, prompt_len,
               median(decode_tps), decode_tps.size());
  }

  // 2. Prefills of long prompts: the logits of the last token, warm, in a model sized for
  // the longest (the file mapped again); the first run of each length is its warm-up.
  std::vector<double> prefills;
  {
    model = torchattn::models::CausalLM(nullptr);  // one model at a time
    torchattn::models::CausalLM long_model = load(*std::max_element(long_prompts.begin(), long_prompts.end()));
    c10::InferenceMode inference;
    for (const int64_t n : long_prompts) {
      const auto long_ids = at::randint(100, config.vocab_size - 100, {1, n}, at::kLong);
      std::vector<double> runs;
      const int reps = quick || n > 1024 ? 2 : prefill_only ? 11 : 6;
      for (int r = 0; r < reps; ++r) {
        auto caches = long_model->make_kv_caches(1);
        const auto t = Clock::now();
        long_model->forward(long_ids, &caches, {}, /*last_only=*/true);
        if (r > 0) runs.push_back(seconds(t));
      }
      prefills.push_back(median(runs));
      fmt::print("  prefill {} tokens: {:.3f} s (median of {})\n", n, prefills.back(), runs.size());
    }
  }
  const int64_t long_prompt = long_prompts.front();
  std::string prefill_json;
  for (size_t i = 0; i < long_prompts.size(); ++i) {
    prefill_json += fmt::format("{}\"{}\": {:.4f}", i ? ", " : "", long_prompts[i], prefills[i]);
  }
  if (prefill_only) {
    if (!json_path.empty()) {
      std::ofstream(json_path) << fmt::format(
          "{{\"tool\": \"torchattn_generate_bench\", \"model\": \"{}\", \"threads\": {}, \"dtype\": \"{}\", "
          "\"weight_bytes\": {}, \"long_prompt\": {}, \"prefill_s\": {:.4f}, \"prefill\": {{{}}}}}\n",
          dir.filename().string(), at::get_num_threads(), dtype_name, weight_bytes, long_prompt, prefills.front(),
          prefill_json);
      fmt::print("wrote {}\n", json_path);
    }
    return 0;
  }

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
        "\"weight_bytes\": {}, \"step_bytes\": {}, \"load_s\": {:.4f}, \"load_cold_s\": {}, \"peak_rss_mib\": {:.1f}, "
        "\"rss_mib\": {:.1f}, \"prompt\": {}, \"new_tokens\": {}, \"decode_tokens_per_s\": {:.3f}, "
        "\"first_prefill_s\": {:.4f}, \"long_prompt\": {}, \"prefill_s\": {:.4f}, \"prefill\": {{{}}}, "
        "\"bandwidth_gbps\": {:.2f}, \"decode_bound_tokens_per_s\": {:.2f}}}\n",
        dir.filename().string(), at::get_num_threads(), dtype_name, weight_bytes, step_bytes, load_s,
        load_cold_s >= 0 ? fmt::format("{:.4f}", load_cold_s) : "null", peak_rss_mib, rss_mib, prompt_len, new_tokens,
        median(decode_tps), median(first_prefill), long_prompt, prefills.front(), prefill_json, gbps, bound);
    fmt::print("wrote {}\n", json_path);
  }
  return 0;
}
