// torchattn_generate: runs a Hugging Face Llama-family checkpoint folder (llama, qwen2,
// mistral: config.json, model.safetensors or its sharded index, tokenizer.json) with
// torchattn::MultiHeadAttention, streaming the text as it is generated.
//
//   torchattn_generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-new-tokens N]
//                      [--greedy | --temperature T --top-k K --top-p P --seed S] [--chat]
//                      [--device cpu|cuda] [--dtype float32|bfloat16|int8|dynamic-int8] [--print-ids]
//
// --dtype on the CPU is the weights' format (torchattn::WeightFormat: bfloat16 or int8
// weights, float32 activations, int8 products in an int8 prefill on AVX-512 VNNI CPUs;
// dynamic-int8, PyTorch's quantize_dynamic scheme); on cuda the model's dtype (int8
// and dynamic-int8: an error).

#include "cli_checks.h"
#include "fmt.h"
#include "reuse_memory.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace models = torchattn::models;
using apps::at_least;
using apps::positive_real;

int main(int argc, char** argv) {
  CLI::App app{"Generates text with a Hugging Face Llama/Qwen2/Mistral checkpoint on torchattn"};
  std::string model_dir, prompt, prompt_ids, device_name = "cpu", dtype_name = "float32";
  int64_t max_new_tokens = 64;
  models::GenerationOptions options;
  double temperature_value = 1.0, top_p_value = 1.0;
  int64_t top_k_value = 0;
  bool greedy = false, chat = false, print_ids = false;
  app.add_option("--model", model_dir, "a Hugging Face model folder")->required()->check(CLI::ExistingDirectory);
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
                 "float32, bfloat16, int8 or dynamic-int8: on the CPU the weights' format (float32 activations; "
                 "dynamic-int8: PyTorch's quantize_dynamic scheme), on cuda the "
                 "model's dtype (float32 or bfloat16)")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8"}));
  app.add_flag("--print-ids", print_ids, "print the generated ids on a line after the text");
  bool no_verify = false;
  app.add_flag(
      "--no-verify-weights", no_verify,
      "skip the check of a saved folder's weights against their recorded checksums (LoadOptions::verify_weights)");
  std::string save_dir;
  app.add_option("--save", save_dir,
                 "write the model with its --dtype bfloat16 or int8 weights to this folder (a folder that "
                 "--model, torchattn_serve and LanguageModel::from_pretrained load as it is) and exit");
  CLI11_PARSE(app, argc, argv);

  try {
    if (device_name == "cuda" && (dtype_name == "int8" || dtype_name == "dynamic-int8")) {
      throw std::runtime_error("--dtype " + dtype_name +
                               ": int8 weights run on the CPU only; on cuda use --dtype "
                               "bfloat16");
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
    if (device_name == "cuda" && !torch::cuda::is_available()) {
      throw std::runtime_error("--device cuda: this LibTorch sees no CUDA device");
    }
    const std::filesystem::path dir(model_dir);
    const models::DecoderConfig config = models::read_decoder_config((dir / "config.json").string());
    const auto saved = models::saved_weight_format(model_dir);
    if (saved && device_name == "cuda") {
      throw std::runtime_error(
          fmt::format("--model: '{}' holds {} weights, which run on the CPU", model_dir, torchattn::to_string(*saved)));
    }
    if (!save_dir.empty()) {
      if (device_name == "cuda") throw std::runtime_error("--save: writes CPU weights; leave out --device cuda");
      if (dtype_name == "float32" && !saved) {
        throw std::runtime_error("--save: writes bfloat16 or int8 weights; give --dtype bfloat16 or --dtype int8");
      }
      if (dtype_name == "dynamic-int8") {
        throw std::runtime_error("--save: dynamic-int8 weights are quantized at load, not saved; give --dtype "
                                 "bfloat16 or --dtype int8");
      }
      models::CausalLM model{nullptr};
      try {
        model = models::load_causal_lm(config, std::min<int64_t>(config.max_position_embeddings, 16), model_dir,
                                       torchattn::weight_format_from_string(dtype_name), !no_verify);
        models::save_frozen_folder(model, model_dir, save_dir);
      } catch (const c10::Error& e) {
        throw std::runtime_error(std::string("--save: ") + e.what_without_backtrace());
      }
      fmt::print(stderr, "[saved {} ({} weights, {:.0f} MB) to {}]\n", model_dir,
                 torchattn::to_string(model->weight_format()), model->weight_bytes() / 1e6, save_dir);
      return 0;
    }

    // The tokenizer: needed for --prompt and to print text; --prompt-ids works without one.
    std::unique_ptr<models::Tokenizer> tokenizer;
    std::string tokenizer_error;
    try {
      tokenizer = std::make_unique<models::Tokenizer>((dir / "tokenizer.json").string());
    } catch (const c10::Error& e) {
      tokenizer_error = e.what_without_backtrace();
    }
    // One that reads but belongs to another model would turn the ids into garbage text.
    if (tokenizer) {
      try {
        models::check_tokenizer(model_dir, config, *tokenizer);
      } catch (const c10::Error& e) {
        throw std::runtime_error(std::string("--model: ") + e.what_without_backtrace());
      }
    }
    std::vector<int64_t> ids;
    if (ids_opt->count() > 0) {
      ids = apps::parse_ids(prompt_ids, config.vocab_size);
    } else {
      if (!tokenizer) throw std::runtime_error(tokenizer_error);
      if (const auto bad = models::find_invalid_utf8(prompt)) {
        throw std::runtime_error(fmt::format("--prompt: expected UTF-8 text, got the byte 0x{:02X} at offset {}, which "
                                             "is not valid UTF-8",
                                             static_cast<unsigned char>(prompt[*bad]), *bad));
      }
      if (chat) {
        const auto tmpl = models::read_chat_template(model_dir);
        if (!tmpl) throw std::runtime_error("--chat: '" + model_dir + "' has no chat template");
        if (tmpl->find("<|im_start|>") == std::string::npos) {
          throw std::runtime_error("--chat: this model's chat template does not use <|im_start|>; pass the prompt as "
                                   "it should be tokenized instead");
        }
        prompt = models::chat_prompt(*tmpl, prompt);
      }
      ids = tokenizer->encode(prompt);
    }
    std::vector<int64_t> stop = config.eos_token_ids;
    if (tokenizer) {
      if (auto end = tokenizer->id_of("<|im_end|>"); end && chat) stop.push_back(*end);
    }
    options.stop_token_ids(stop);

    const auto t0 = std::chrono::steady_clock::now();
    const int64_t context = std::min<int64_t>(config.max_position_embeddings,
                                              static_cast<int64_t>(ids.size()) + max_new_tokens);
    models::CausalLM model{nullptr};
    try {
      if (device_name == "cuda") {
        model = models::CausalLM(config, context, models::Init::ForLoading);
        model->load_hf_weights(models::checkpoint_file(model_dir));
      } else {
        // A folder of --save loads its frozen weights as they are.
        model = models::load_causal_lm(config, context, model_dir, torchattn::weight_format_from_string(dtype_name),
                                       !no_verify);
        dtype_name = std::string(torchattn::to_string(model->weight_format()));
      }
    } catch (const c10::Error& e) {
      throw std::runtime_error(std::string("--model: ") + e.what_without_backtrace());
    }
    keep_freed_memory_for_reuse();
    if (device_name == "cuda") {
      model->to(torch::Device(device_name), dtype_name == "bfloat16" ? torch::kBFloat16 : torch::kFloat32);
    }
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    models::Utf8Stream stream;
    options.on_token([&](size_t, int64_t id) {
      if (tokenizer) {
        const bool is_stop = std::find(stop.begin(), stop.end(), id) != stop.end();
        if (!is_stop) fmt::print("{}", stream.push(tokenizer->decode({id})));
      } else {
        fmt::print("{} ", id);
      }
      std::fflush(stdout);
    });
    const auto result = models::generate(*model, {ids}, options)[0];
    fmt::print("{}\n", stream.flush());
    if (print_ids) {
      std::string line;
      for (const int64_t id : result.ids) line += (line.empty() ? "" : " ") + std::to_string(id);
      fmt::print("ids: {}\n", line);
    }
    std::fflush(stdout);  // the text before the statistics, when both go to one file
    const int64_t decoded = static_cast<int64_t>(result.ids.size()) - 1;
    fmt::print(stderr,
               "[{} {} on {} {}, {} threads] loaded in {:.2f} s; prefill {} tokens in {:.3f} s ({:.1f} tokens/s); "
               "decode {} tokens in {:.3f} s ({:.1f} tokens/s)\n",
               config.model_type, dir.filename().string(), device_name, dtype_name, at::get_num_threads(), load_seconds,
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
