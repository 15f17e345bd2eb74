// torchattn_generate's decoder on a device against transformers on the same device
// (tests/reference/make_device_reference.py writes the model folder and the reference): `make
// test-gpu`'s generate stage runs it on CUDA with SmolLM2-135M's shape, and ctest -R
// generate_device on the CPU with two of its layers.
//
// - float32: the prompt's logits within 1e-4 of transformers' (relative to the largest),
//   and the greedy tokens through the generation loop (a CUDA graph per step on CUDA)
//   equal to transformers' generate up to the first near tie (top-two margin < 1e-4);
// - bfloat16: the prompt's logits no further from transformers' float32 logits than
//   twice transformers' own bfloat16 logits are (plus 1e-3 of the largest).
//
//   generate_device_check --model DIR --reference DIR [--device cuda|cpu]
//
// Prints one line `generate_device_check: PASS ...` or `... FAIL ...`; exits 1 on FAIL.

#include <torchattn/models.h>

#include <torchattn/safetensors.h>

#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/types.h>

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

    // bfloat16: as close to transformers' float32 logits as transformers' bfloat16 are.
    model->to(at::kBFloat16);
    const double err16 = relative_error(model->forward(prompt.unsqueeze(0).to(device))[0], expected32);
    const double theirs_err16 = relative_error(theirs16, expected32);
    if (err16 > 2 * theirs_err16 + 1e-3) {
      problems.push_back("bfloat16 logits error " + std::to_string(err16) + " > 2 x transformers' " +
                         std::to_string(theirs_err16) + " + 1e-3");
    }

    std::string status = problems.empty() ? "PASS" : "FAIL";
    std::printf("generate_device_check: %s on %s, %d layers: float32 logits error %.2e (<= 1e-4), greedy %lld of %lld "
                "tokens equal%s; bfloat16 logits error %.2e against float32 (transformers' bfloat16: %.2e)\n",
                status.c_str(), device.str().c_str(), static_cast<int>(config.num_layers), err32,
                static_cast<long long>(equal), static_cast<long long>(compared), tie ? " then a near tie" : "", err16,
                theirs_err16);
    for (const auto& p : problems) std::printf("generate_device_check:   %s\n", p.c_str());
    return problems.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("generate_device_check: FAIL: %s\n", e.what());
    return 1;
  }
}
