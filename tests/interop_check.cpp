// Python -> C++: loads the notebook modules' state dicts that tools/interop_check.py
// saved, checks torchattn's outputs against Python's (<= 1e-6), then saves the C++
// modules (with other weights) for the reverse check. Also checks that a mismatched
// key or shape is an error naming the key.
//
//   interop_check DIR

#include <torchattn/torchattn.h>

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

namespace {

torch::Tensor read_tensor(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict().at(key).toTensor();
}

void write_tensor(const std::string& path, const std::string& key, const torch::Tensor& t) {
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  dict.insert(key, t);
  auto bytes = torch::pickle_save(dict);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: interop_check DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  int failures = 0;
  try {
    const auto x = read_tensor(dir + "/py_input.pt", "x");
    struct Case {
      std::string name;
      std::function<std::shared_ptr<torch::nn::Module>()> make;
      std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> forward;
    };
    const std::vector<Case> cases{
        {"self_attention_v2", [] { return torchattn::SelfAttentionV2(5, 4, true).ptr(); },
         [](torch::nn::Module& m, const torch::Tensor& x) { return dynamic_cast<torchattn::SelfAttentionV2Impl&>(m).forward(x); }},
        {"causal_attention", [] { return torchattn::CausalAttention(5, 4, 9, 0.0, true).ptr(); },
         [](torch::nn::Module& m, const torch::Tensor& x) { return dynamic_cast<torchattn::CausalAttentionImpl&>(m).forward(x); }},
        {"multi_head_attention", [] { return torchattn::MultiHeadAttention(5, 6, 9, 0.0, 3, true).ptr(); },
         [](torch::nn::Module& m, const torch::Tensor& x) { return dynamic_cast<torchattn::MultiHeadAttentionImpl&>(m).forward(x); }},
    };
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto m = c.make();
      m->eval();
      torchattn::load_state_dict(*m, dir + "/py_" + c.name + ".pt");
      const double err = (c.forward(*m, x) - read_tensor(dir + "/py_" + c.name + "_out.pt", "y")).abs().max().item<double>();
      std::printf("Python -> C++ %-22s max |diff| %.2e\n", c.name.c_str(), err);
      failures += err > 1e-6;

      torch::manual_seed(500 + i);  // fresh weights for the reverse direction
      auto fresh = c.make();
      fresh->eval();
      torchattn::save_state_dict(*fresh, dir + "/cpp_" + c.name + ".pt");
      write_tensor(dir + "/cpp_" + c.name + "_out.pt", "y", c.forward(*fresh, x));
    }
    // safetensors: Python's file read here, and one written here for Python.
    {
      std::ifstream in(dir + "/py_tensors.pt", std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto expected = torch::pickle_load(bytes).toGenericDict();
      const auto loaded = torchattn::load_safetensors(dir + "/py_tensors.safetensors");
      bool same = loaded.size() == expected.size();
      for (const auto& [name, t] : loaded) {
        const auto want = expected.at(name).toTensor();
        same = same && t.scalar_type() == want.scalar_type() && torch::equal(t, want);
      }
      std::printf("%s: %zu safetensors written by Python read in C++\n", same ? "ok" : "FAIL", loaded.size());
      failures += !same;
      torch::manual_seed(7);
      const torchattn::NamedTensors mine{{"w", torch::randn({3, 4})},
                                         {"b", torch::randn({4}).to(torch::kBFloat16)},
                                         {"ids", torch::arange(5)},
                                         {"mask", torch::tensor({true, false, true})}};
      torchattn::save_safetensors(dir + "/cpp_tensors.safetensors", mine, {{"format", "pt"}});
      c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
      for (const auto& [name, t] : mine) dict.insert(name, t);
      auto out = torch::pickle_save(dict);
      std::ofstream(dir + "/cpp_tensors.pt", std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
    }
    // A mismatch is an error naming the key.
    torchattn::MultiHeadAttention wrong(5, 8, 9, 0.0, 2, true);
    try {
      torchattn::load_state_dict(*wrong, dir + "/py_multi_head_attention.pt");
      std::printf("FAIL: a state dict of other shapes loaded\n");
      ++failures;
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      const bool named = what.find("key 'W_query.weight' has shape [6, 5]") != std::string::npos;
      std::printf("%s: mismatch reported as: %s\n", named ? "ok" : "FAIL", what.c_str());
      failures += !named;
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "interop_check: %s\n", e.what_without_backtrace());
    return 1;
  }
  std::printf("%s\n", failures ? "FAIL" : "ok: notebook weights in torchattn give the Python outputs (<= 1e-6)");
  return failures ? 1 : 0;
}
