// torchattn_perplexity: the perplexity of a Hugging Face decoder folder over a text
// file, to measure what a weight format costs (as llama.cpp's perplexity tool).
//
//   torchattn_perplexity --model DIR --file TEXT [--dtype float32|bfloat16|int8|dynamic-int8|int4]
//                        [--context 512] [--chunks N] [--save-logits FILE] [--threads N]
//
// The whole file is tokenized with the model's tokenizer (no special tokens), cut into
// consecutive windows of --context tokens (a last partial window dropped; --chunks: the
// first N only, as llama-perplexity's flag), each scored alone (models::perplexity). A
// progress line per window on stderr; the last line on stdout is `perplexity P tokens N`.
//
// --save-logits FILE keeps every scored token's distribution, to compare formats (a KL
// divergence, apps/bench/generate/quant_quality.py): a line
// `torchattn-logits float32 ROWS VOCAB`, then ROWS x VOCAB little-endian float32 logits,
// row r predicting scored token r (window w's tokens 2..context at rows w (context - 1)...).

#include "cli_checks.h"
#include "fmt.h"
#include "model_source.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"Perplexity of a Hugging Face decoder folder over a text file, on torchattn"};
  std::string model_dir, file, dtype_name = "float32";
  int64_t context = 512;
  int threads = 0;
  app.add_option("--model", model_dir, "a Hugging Face Llama-family folder, or a GGUF file")->required();
  app.add_option("--file", file, "the text (UTF-8)")->required();
  app.add_option("--dtype", dtype_name,
                 "the weights' format: float32, bfloat16, int8, dynamic-int8 or int4 (float32 activations)")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8", "int4"}))
      ->capture_default_str();
  app.add_option("--context", context, "tokens per window")->check(apps::at_least(2))->capture_default_str();
  int64_t chunks = 0;
  app.add_option("--chunks", chunks, "score only the first N windows (default: every whole window)")
      ->check(apps::at_least(1));
  std::string logits_path;
  app.add_option("--save-logits", logits_path,
                 "write every scored token's float32 logits to this file (a header line, then rows x vocab)");
  app.add_option("--threads", threads, "intra-op threads (default: LibTorch's)")->check(apps::at_least(1));
  bool no_verify = false;
  app.add_flag(
      "--no-verify-weights", no_verify,
      "skip the check of a saved folder's weights against their recorded checksums (LoadOptions::verify_weights)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (std::filesystem::is_directory(file)) {
      throw std::runtime_error("--file: '" + file + "' is a folder; expected a text file (UTF-8)");
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("--file: cannot read '" + file + "'");
    // --context against the model's positions, named as the flag (LoadOptions would
    // name its own option).
    const auto config_path = std::filesystem::path(model_dir) / "config.json";
    const bool gguf = torchattn::models::is_gguf_file(model_dir);
    if (gguf || std::filesystem::is_regular_file(config_path)) {
      int64_t positions = 0;
      try {
        positions = apps::decoder_config(model_dir).max_position_embeddings;
      } catch (const c10::Error& e) {
        throw std::runtime_error(std::string("--model: ") + e.what_without_backtrace());
      }
      if (context > positions) {
        throw std::runtime_error(fmt::format("--context: expected at most {} tokens (the {} of '{}'), got {}",
                                             positions, gguf ? "context_length" : "max_position_embeddings",
                                             gguf ? model_dir : config_path.string(), context));
      }
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream logits_out;  // opened before the model loads: a bad path fails at once
    if (!logits_path.empty()) {
      logits_out.open(logits_path, std::ios::binary);
      if (!logits_out) throw std::runtime_error("--save-logits: cannot write '" + logits_path + "'");
    }
    const auto t0 = std::chrono::steady_clock::now();
    torchattn::models::LanguageModel lm = [&] {
      try {
        return torchattn::models::LanguageModel::from_pretrained(
            model_dir, torchattn::models::LoadOptions()
                           .context_length(context)
                           .weight_format(torchattn::weight_format_from_string(dtype_name))
                           .verify_weights(!no_verify));
      } catch (const c10::Error& e) {
        throw std::runtime_error(std::string("--model: ") + e.what_without_backtrace());
      }
    }();
    std::vector<int64_t> ids = lm.tokenizer().encode(text, /*add_special_tokens=*/false);
    if (static_cast<int64_t>(ids.size()) < context) {
      throw std::runtime_error(
          fmt::format("--file: {} tokens, fewer than one window of --context {}", ids.size(), context));
    }
    if (chunks > 0 && static_cast<int64_t>(ids.size()) / context > chunks) ids.resize(chunks * context);
    if (logits_out.is_open()) {
      const int64_t rows = static_cast<int64_t>(ids.size()) / context * (context - 1);
      logits_out << fmt::format("torchattn-logits float32 {} {}\n", rows, lm.model()->config().vocab_size);
    }
    const auto result = torchattn::models::perplexity(
        lm.model(), ids, context,
        [&](int64_t done, int64_t total) {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          fmt::print(stderr, "[{}/{}] {:.1f} s\n", done, total, s);
        },
        [&](int64_t, const at::Tensor& logits) {
          if (!logits_out.is_open()) return;
          const at::Tensor rows = logits.to(at::kCPU).contiguous();
          logits_out.write(reinterpret_cast<const char*>(rows.const_data_ptr<float>()),
                           static_cast<std::streamsize>(rows.numel() * sizeof(float)));
          if (!logits_out) throw std::runtime_error("--save-logits: writing '" + logits_path + "' failed");
        });
    if (logits_out.is_open()) {
      logits_out.close();
      if (!logits_out) throw std::runtime_error("--save-logits: writing '" + logits_path + "' failed");
    }
    fmt::print("perplexity {:.4f} tokens {}\n", result.perplexity, result.tokens);
    return 0;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "torchattn_perplexity: {}\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fmt::print(stderr, "torchattn_perplexity: {}\n", e.what());
  }
  return 1;
}
