// torchattn_generate's decoder on a device against transformers on the same device
// (tests/reference/make_device_reference.py writes the model folder and the reference): `make
// test-gpu`'s generate stage runs it on CUDA with SmolLM2-135M's shape, and ctest -R
// generate_device on the CPU with two of its layers.
//
// - float32: the prompt's logits within 1e-4 of transformers' (relative to the largest),
//   and the greedy tokens through the generation loop (a CUDA graph per step on CUDA)
//   equal to transformers' generate up to the first near tie (top-two margin < 1e-4);
// - bfloat16: the prompt's logits no further from transformers' float32 logits than
//   twice transformers' own bfloat16 logits are (plus 1e-3 of the largest);
// - the paged engine (continuous batching from one pool of KV blocks), in float32 and in
//   bfloat16: four prompts of different lengths submitted at once, greedy; each
//   request's tokens equal generate alone on its prompt, up to the first step where
//   generate's own top two logits were a near tie (float32: within 1e-3; bfloat16:
//   within 0.05), which another batch shape's rounding may flip.
//
//   generate_device_check --model DIR --reference DIR [--device cuda|cpu]
//
// Prints one line `generate_device_check: PASS ...` or `... FAIL ...`; exits 1 on FAIL.

#include <torchattn/models.h>

#include <torchattn/safetensors.h>

#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

c10::impl::GenericDict read_pickle(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path.string() + " (tests/reference/make_device_reference.py writes it)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

at::Tensor get(const c10::impl::GenericDict& d, const std::string& key) { return d.at(key).toTensor(); }

double relative_error(const at::Tensor& a, const at::Tensor& e) {
  return (a.to(at::kDouble).cpu() - e.to(at::kDouble)).abs().max().item<double>() / e.abs().max().item<double>();
}

// The engine's greedy tokens for four prefixes of `prompt`, submitted at once, against
// generate alone on each. Returns "E of N tokens equal[, K near ties]"; a difference
// where generate's top two logits were more than `tie` apart goes into `problems`.
std::string engine_check(torchattn::models::CausalLM& model, const std::vector<int64_t>& prompt, int64_t n_new,
                         double tie, const std::string& what, std::vector<std::string>& problems) {
  namespace tm = torchattn::models;
  const auto n = static_cast<int64_t>(prompt.size());
  std::vector<std::vector<int64_t>> prompts;
  for (const int64_t len : {n, n * 3 / 4, n / 2, std::min<int64_t>(n, 3)}) {
    prompts.emplace_back(prompt.begin(), prompt.begin() + len);
  }
  const auto options = tm::GenerationOptions().max_new_tokens(n_new).stop_at_eos(false);
  std::vector<std::vector<int64_t>> paged(prompts.size());
  {
    tm::Engine engine(model, tm::EngineOptions().kv_tokens(4096).block_size(16));
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine.submit(prompts[i], options, [&paged, i](const tm::TokenEvent& e) {
        if (e.token) paged[i].push_back(*e.token);
      });
    }
    while (engine.step()) {}
  }
  int64_t equal = 0, total = 0, ties = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = tm::generate(*model, {prompts[i]}, options)[0].ids;
    total += static_cast<int64_t>(alone.size());
    for (size_t j = 0; j < alone.size(); ++j) {
      if (j < paged[i].size() && paged[i][j] == alone[j]) {
        ++equal;
        continue;
      }
      // generate's own margin at this step: its logits after the prompt and tokens 0..j-1.
      std::vector<int64_t> ids = prompts[i];
      ids.insert(ids.end(), alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(j));
      const at::Tensor input = torch::tensor(ids, at::kLong).unsqueeze(0).to(model->parameters()[0].device());
      const at::Tensor top = std::get<0>(model->forward(input)[0][-1].to(at::kFloat).topk(2)).cpu();
      const double margin = top[0].item<double>() - top[1].item<double>();
      if (margin < tie) {
        ++ties;
      } else {
        problems.push_back(what + " engine: request " + std::to_string(i) + " token " + std::to_string(j) +
                           " differs from generate alone (its top-two margin " + std::to_string(margin) + ")");
      }
      break;
    }
  }
  return std::to_string(equal) + " of " + std::to_string(total) + " tokens equal" +
         (ties > 0 ? ", " + std::to_string(ties) + " near tie(s)" : "");
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  if (fallback.empty()) throw std::runtime_error("missing " + name);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const fs::path model_dir = arg(argc, argv, "--model", ""), ref_dir = arg(argc, argv, "--reference", "");
    const torch::Device device(arg(argc, argv, "--device", "cpu"));
    if (device.is_cuda() && !torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA device");
    const auto ref = read_pickle(ref_dir / "expected.pt");
    const at::Tensor prompt = get(ref, "prompt");
    const std::vector<int64_t> prompt_ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
    const at::Tensor expected32 = get(ref, "logits.float32"), theirs16 = get(ref, "logits.bfloat16");
    const at::Tensor tokens = get(ref, "tokens"), margins = get(ref, "margins");

    const auto config = torchattn::models::read_decoder_config((model_dir / "config.json").string());
    const int64_t n_tokens = tokens.numel();
    torchattn::models::CausalLM model(config, prompt.numel() + n_tokens);
    model->load_hf_weights((model_dir / "model.safetensors").string());
    model->eval();
    model->to(device, at::kFloat);
    c10::InferenceMode inference;

    std::vector<std::string> problems;
    // float32: the prompt's logits, then greedy tokens through the generation loop.
    const double err32 = relative_error(model->forward(prompt.unsqueeze(0).to(device))[0], expected32);
    if (err32 > 1e-4) problems.push_back("float32 logits error " + std::to_string(err32) + " > 1e-4");
    const auto ours = torchattn::models::generate(
                          *model, {prompt_ids},
                          torchattn::models::GenerationOptions().max_new_tokens(n_tokens).stop_at_eos(false))[0]
                          .ids;
    int64_t equal = 0, compared = 0;
    bool tie = false;
    for (int64_t i = 0; i < n_tokens; ++i) {
      ++compared;
      if (i >= static_cast<int64_t>(ours.size()) || ours[i] != tokens[i].item<int64_t>()) {
        if (margins[i].item<double>() < 1e-4) {
          tie = true;  // transformers' own top two were within 1e-4: either token is right
        } else {
          problems.push_back("greedy token " + std::to_string(i) + " differs (margin " +
                             std::to_string(margins[i].item<double>()) + ")");
        }
        break;
      }
      ++equal;
    }

    const int64_t engine_tokens = std::min<int64_t>(n_tokens, 24);
    const std::string engine32 = engine_check(model, prompt_ids, engine_tokens, 1e-3, "float32", problems);

    // bfloat16: as close to transformers' float32 logits as transformers' bfloat16 are.
    model->to(at::kBFloat16);
    const double err16 = relative_error(model->forward(prompt.unsqueeze(0).to(device))[0], expected32);
    const double theirs_err16 = relative_error(theirs16, expected32);
    if (err16 > 2 * theirs_err16 + 1e-3) {
      problems.push_back("bfloat16 logits error " + std::to_string(err16) + " > 2 x transformers' " +
                         std::to_string(theirs_err16) + " + 1e-3");
    }

    const std::string engine16 = engine_check(model, prompt_ids, engine_tokens, 0.05, "bfloat16", problems);

    std::string status = problems.empty() ? "PASS" : "FAIL";
    std::printf("generate_device_check: %s on %s, %d layers: float32 logits error %.2e (<= 1e-4), greedy %lld of %lld "
                "tokens equal%s; bfloat16 logits error %.2e against float32 (transformers' bfloat16: %.2e)\n",
                status.c_str(), device.str().c_str(), static_cast<int>(config.num_layers), err32,
                static_cast<long long>(equal), static_cast<long long>(compared), tie ? " then a near tie" : "", err16,
                theirs_err16);
    std::printf("generate_device_check: paged engine, 4 prompts at once against generate alone: float32 %s; "
                "bfloat16 %s\n",
                engine32.c_str(), engine16.c_str());
    for (const auto& p : problems) std::printf("generate_device_check:   %s\n", p.c_str());
    return problems.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("generate_device_check: FAIL: %s\n", e.what());
    return 1;
  }
}
