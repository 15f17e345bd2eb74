// torchattn_generate: runs a Hugging Face Llama-family checkpoint folder (llama, qwen2,
// qwen3, mistral, gemma2: config.json, model.safetensors or its sharded index,
// tokenizer.json) through torchattn::models::LanguageModel, streaming the text as it
// is generated.
//
//   torchattn_generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-new-tokens N]
//                      [--greedy | --temperature T --top-k K --top-p P --seed S] [--chat]
//                      [--device cpu|cuda] [--dtype float32|bfloat16|int8|dynamic-int8|int4] [--print-ids]
//
// --dtype on the CPU is the weights' format (torchattn::WeightFormat: bfloat16, int8 or
// int4 weights, float32 activations, int8 products in an int8 prefill on AVX-512 VNNI
// CPUs; dynamic-int8, PyTorch's quantize_dynamic scheme); on cuda the model's dtype
// (int8, int4 and dynamic-int8: an error). This file reads the command line and checks what only
// it knows (which flag a value came from); loading, saving, the chat template, the
// stop tokens and the text stream are LanguageModel's.

#include "cli_checks.h"
#include "fmt.h"
#include "model_source.h"
#include "reuse_memory.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace models = torchattn::models;
using apps::at_least;
using apps::positive_real;

namespace {

// Runs `load`, its c10::Error as the message of the flag it concerns.
template <class F>
auto as_flag_error(const std::string& flag, F&& load) {
  try {
    return load();
  } catch (const c10::Error& e) {
    throw std::runtime_error(flag + ": " + e.what_without_backtrace());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generates text with a Hugging Face Llama/Qwen2/Mistral checkpoint on torchattn"};
  std::string model_dir, prompt, prompt_ids, device_name = "cpu", dtype_name = "float32";
  int64_t max_new_tokens = 64;
  models::GenerationOptions options;
  double temperature_value = 1.0, top_p_value = 1.0;
  int64_t top_k_value = 0;
  bool greedy = false, chat = false, print_ids = false;
  app.add_option("--model", model_dir, "a Hugging Face model folder, or a GGUF file")
      ->required()
      ->check(apps::folder_or_gguf());
  auto* text = app.add_option("--prompt", prompt, "the prompt text");
  auto* ids_opt = app.add_option("--prompt-ids", prompt_ids, "the prompt as token ids, comma-separated");
  text->excludes(ids_opt);
  app.option_defaults()->always_capture_default();
  app.add_option("--max-new-tokens", max_new_tokens, "tokens to generate at most")->check(at_least(1));
  auto* greedy_flag = app.add_flag("--greedy", greedy,
                                   "take the most likely token (the default without sampling options)");
  auto* temperature =
      app.add_option("--temperature", temperature_value, "sample with this temperature")->check(positive_real());
  auto* top_k = app.add_option("--top-k", top_k_value, "sample among the k most likely tokens")
                    ->check(at_least(1))
                    ->default_str("all");
  auto* top_p = app.add_option("--top-p", top_p_value, "sample among the most likely tokens of this total probability")
                    ->check(positive_real(1.0));
  std::string seed_text;
  auto* seed = app.add_option("--seed", seed_text,
                              "the sampling seed (without it: a random seed, printed on stderr "
                              "so that the run can be repeated)")
                   ->check(at_least(0))
                   ->default_str("random");
  greedy_flag->excludes(temperature)->excludes(top_k)->excludes(top_p);
  app.add_flag("--chat", chat, "wrap the prompt in the model's <|im_start|> chat template");
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype_name,
                 "float32, bfloat16, int8, dynamic-int8 or int4: on the CPU the weights' format (float32 activations; "
                 "dynamic-int8: PyTorch's quantize_dynamic scheme), on cuda the "
                 "model's dtype (float32 or bfloat16)")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8", "int4"}));
  app.add_flag("--print-ids", print_ids, "print the generated ids on a line after the text");
  bool no_verify = false;
  app.add_flag(
      "--no-verify-weights", no_verify,
      "skip the check of a saved folder's weights against their recorded checksums (LoadOptions::verify_weights)");
  std::string save_dir;
  app.add_option("--save", save_dir,
                 "write the model with its --dtype bfloat16, int8 or int4 weights to this folder (a folder that "
                 "--model, torchattn_serve and LanguageModel::from_pretrained load as it is) and exit");
  CLI11_PARSE(app, argc, argv);

  try {
    const bool cuda = device_name == "cuda";
    if (cuda && (dtype_name == "int8" || dtype_name == "dynamic-int8" || dtype_name == "int4")) {
      throw std::runtime_error("--dtype " + dtype_name + ": " + (dtype_name == "int4" ? "int4" : "int8") +
                               " weights run on the CPU only; on cuda use --dtype bfloat16");
    }
    if (text->count() == 0 && ids_opt->count() == 0 && save_dir.empty())
      throw std::runtime_error("give --prompt TEXT or --prompt-ids 1,2,3");
    options.max_new_tokens(max_new_tokens).temperature(temperature_value).top_k(top_k_value).top_p(top_p_value);
    options.do_sample(temperature->count() > 0 || top_k->count() > 0 || top_p->count() > 0);
    if (options.do_sample()) {
      // No --seed: a fresh one each run (as llama.cpp does), said so that it can be repeated.
      options.seed(seed->count() > 0 ? std::stoull(seed_text) : std::random_device{}() & 0x7fffffff);
      if (seed->count() == 0)
        fmt::print(stderr, "[sampling with seed {}; pass --seed {} to repeat]\n", options.seed(), options.seed());
    }
    if (cuda && !torch::cuda::is_available()) {
      throw std::runtime_error("--device cuda: this LibTorch sees no CUDA device");
    }
    const std::filesystem::path dir(model_dir);
    const models::DecoderConfig config = as_flag_error("--model", [&] { return apps::decoder_config(model_dir); });
    const auto saved = models::saved_weight_format(model_dir);
    if (saved && cuda) {
      throw std::runtime_error(
          fmt::format("--model: '{}' holds {} weights, which run on the CPU", model_dir, torchattn::to_string(*saved)));
    }
    const auto format = torchattn::weight_format_from_string(dtype_name);
    if (saved && !cuda && format != torchattn::WeightFormat::Float32 && format != *saved) {
      throw std::runtime_error(fmt::format("--dtype {}: '{}' holds {} weights (a folder of --save), which load as "
                                           "they are; leave out --dtype or give --dtype {}",
                                           dtype_name, model_dir, torchattn::to_string(*saved),
                                           torchattn::to_string(*saved)));
    }
    models::LoadOptions load;
    load.verify_weights(!no_verify);
    if (cuda) {
      load.device(torch::Device(torch::kCUDA)).dtype(dtype_name == "bfloat16" ? torch::kBFloat16 : torch::kFloat32);
    } else {
      load.weight_format(format);
    }

    if (!save_dir.empty()) {
      if (cuda) throw std::runtime_error("--save: writes CPU weights; leave out --device cuda");
      if (dtype_name == "float32" && !saved) {
        throw std::runtime_error("--save: writes bfloat16, int8 or int4 weights; give --dtype bfloat16, int8 or int4");
      }
      if (dtype_name == "dynamic-int8") {
        throw std::runtime_error("--save: dynamic-int8 weights are quantized at load, not saved; give --dtype "
                                 "bfloat16 or --dtype int8");
      }
      // The folder made before the model loads: a path that cannot be made is said at once.
      std::error_code made;
      std::filesystem::create_directories(save_dir, made);
      if (made || !std::filesystem::is_directory(save_dir)) {
        throw std::runtime_error(fmt::format("--save: cannot make the folder '{}': {}", save_dir,
                                             made ? made.message() : "a file of that name is in the way"));
      }
      // Saving runs nothing: the smallest context.
      load.context_length(std::min<int64_t>(config.max_position_embeddings, 16));
      const auto lm = as_flag_error("--save", [&] {
        auto loaded = models::LanguageModel::from_pretrained(model_dir, load);
        loaded.save_pretrained(save_dir);
        return loaded;
      });
      fmt::print(stderr, "[saved {} ({} weights, {:.0f} MB) to {}]\n", model_dir,
                 torchattn::to_string(lm.model()->weight_format()), lm.model()->weight_bytes() / 1e6, save_dir);
      return 0;
    }

    std::vector<int64_t> ids;
    if (ids_opt->count() > 0) ids = apps::parse_ids(prompt_ids, config.vocab_size);
    if (text->count() > 0) {
      if (const auto bad = models::find_invalid_utf8(prompt)) {
        throw std::runtime_error(fmt::format("--prompt: expected UTF-8 text, got the byte 0x{:02X} at offset {}, which "
                                             "is not valid UTF-8",
                                             static_cast<unsigned char>(prompt[*bad]), *bad));
      }
    }
    // The model's context is this call's: the prompt and the new tokens, no more (the RoPE
    // tables are that long). A text prompt is counted first, wrapped as
    // LanguageModel::chat_prompt wraps it, with the folder's own tokenizer.
    int64_t prompt_tokens = static_cast<int64_t>(ids.size());
    if (text->count() > 0) {
      const auto counter = as_flag_error("--prompt", [&] { return apps::tokenizer_of(model_dir); });
      std::string wrapped = prompt;
      if (chat) {
        const auto tmpl = apps::chat_template_of(model_dir);
        if (!tmpl) throw std::runtime_error("--chat: '" + model_dir + "' has no chat template");
        wrapped = as_flag_error("--chat", [&] { return models::chat_prompt(*tmpl, prompt); });
      }
      prompt_tokens = static_cast<int64_t>(counter.encode(wrapped).size());
    }
    load.context_length(std::min<int64_t>(config.max_position_embeddings, prompt_tokens + max_new_tokens));
    const auto t0 = std::chrono::steady_clock::now();
    auto lm = as_flag_error("--model", [&] { return models::LanguageModel::from_pretrained(model_dir, load); });
    keep_freed_memory_for_reuse();
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (text->count() > 0) {
      const models::Tokenizer* tokenizer = as_flag_error("--prompt", [&] { return &lm.tokenizer(); });
      if (chat) prompt = as_flag_error("--chat", [&] { return lm.chat_prompt(prompt); });
      ids = tokenizer->encode(prompt);
    }

    // The text as it comes; without a tokenizer, the ids.
    const auto on_text = [](size_t, const std::string& piece) {
      fmt::print("{}", piece);
      std::fflush(stdout);
    };
    if (!lm.has_tokenizer()) {
      options.on_token([](size_t, int64_t id) {
        fmt::print("{} ", id);
        std::fflush(stdout);
      });
    }
    const auto result = lm.generate_from_ids({ids}, options, on_text)[0];
    fmt::print("\n");
    if (print_ids) {
      std::string line;
      for (const int64_t id : result.ids) line += (line.empty() ? "" : " ") + std::to_string(id);
      fmt::print("ids: {}\n", line);
    }
    std::fflush(stdout);  // the text before the statistics, when both go to one file
    const int64_t decoded = static_cast<int64_t>(result.ids.size()) - 1;
    const std::string weights = cuda ? dtype_name : std::string(torchattn::to_string(lm.model()->weight_format()));
    fmt::print(stderr,
               "[{} {} on {} {}, {} threads] loaded in {:.2f} s; prefill {} tokens in {:.3f} s ({:.1f} tokens/s); "
               "decode {} tokens in {:.3f} s ({:.1f} tokens/s)\n",
               config.model_type, dir.filename().string(), device_name, weights, at::get_num_threads(), load_seconds,
               result.prompt_tokens, result.prefill_seconds,
               result.prompt_tokens / std::max(result.prefill_seconds, 1e-9), decoded, result.decode_seconds,
               decoded > 0 ? decoded / std::max(result.decode_seconds, 1e-9) : 0.0);
    return 0;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "torchattn_generate: {}\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fmt::print(stderr, "torchattn_generate: {}\n", e.what());
  }
  return 1;
}
