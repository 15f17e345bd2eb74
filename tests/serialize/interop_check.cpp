// Python -> C++: loads the notebook modules' state dicts that tests/serialize/interop_check.py
// saved, checks torchattn's outputs against Python's (<= 1e-6), then saves the C++
// modules (with other weights) for the reverse check. Also checks that a mismatched
// key or shape is an error naming the key.
//
// The same with PyTorch's torch.nn.MultiheadAttention (tests/serialize/interop_check.py's
// MHA_CASES, float64): its state dicts into MultiHeadAttention through
// load_torch_multihead_attention, outputs and the gradients of the inputs and of every
// parameter compared (<= 1e-10), then modules with other weights saved with
// save_torch_multihead_attention for Python to load.
//
//   interop_check DIR

#include <torchattn/torchattn.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
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

c10::impl::GenericDict read_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

void write_tensor(const std::string& path, const std::string& key, const torch::Tensor& t) {
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  dict.insert(key, t);
  auto bytes = torch::pickle_save(dict);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

constexpr double kMhaTolerance = 1e-10;  // float64 on both sides: reordered sums only

// One case of interop_check.py's MHA_CASES: Python -> C++ (outputs and gradients), then
// a C++ module with other weights saved for Python. Returns the number of failures.
int check_torch_mha(const std::string& dir, const std::string& name, int64_t seed) {
  torch::AutoGradMode enable_grad(true);  // main's checks run without gradients
  const auto io = read_dict(dir + "/py_mha_" + name + "_io.pt");
  const auto get = [&](const char* key) { return io.at(key).toTensor(); };
  const int64_t E = io.at("embed_dim").toInt();
  const bool bias = io.at("bias").toInt() != 0, cross = io.at("cross").toInt() != 0;
  const auto make = [&] {
    torchattn::MultiHeadAttention m(
        torchattn::MultiHeadAttentionOptions(E, E, /*context_length=*/16, io.at("num_heads").toInt())
            .causal(io.at("causal").toInt() != 0)
            .qkv_bias(bias)
            .out_bias(bias)
            .kdim(io.at("kdim").toInt())
            .vdim(io.at("vdim").toInt()));
    m->to(torch::kFloat64);
    m->eval();
    return m;
  };
  const torch::Tensor pad = io.contains("key_padding_mask") ? get("key_padding_mask") : torch::Tensor();
  // The module as Python's was called: forward(x, pad), or forward_cross over key and value.
  const auto run = [&](torchattn::MultiHeadAttention& m, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) {
    return cross ? m->forward_cross(q, m->cross_kv(k, pad, v)) : m->forward(q, pad);
  };
  const auto diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.sizes() == b.sizes() ? (a - b).abs().max().item<double>() : INFINITY;
  };

  auto m = make();
  torchattn::load_torch_multihead_attention(*m, dir + "/py_mha_" + name + ".pt");
  const auto q = get("query").clone().requires_grad_(true);
  const auto k = cross ? get("key").clone().requires_grad_(true) : torch::Tensor();
  const auto v = cross ? get("value").clone().requires_grad_(true) : torch::Tensor();
  const auto y = run(m, q, k, v);
  y.backward(get("grad_output"));
  const double out_err = diff(y, get("output"));
  double input_err = diff(q.grad(), get("grad.query"));
  if (cross) input_err = std::max({input_err, diff(k.grad(), get("grad.key")), diff(v.grad(), get("grad.value"))});
  // PyTorch's parameter gradients under its names, unpacked into a module of the same
  // shapes by the loader under test, then compared parameter by parameter.
  torchattn::NamedTensors grads;
  for (const auto& item : io) {
    const std::string key = item.key().toStringRef();
    if (key.starts_with("grad.") && key != "grad.query" && key != "grad.key" && key != "grad.value") {
      grads.emplace_back(key.substr(5), item.value().toTensor());
    }
  }
  auto expected_grads = make();
  torchattn::load_torch_multihead_attention(*expected_grads, grads);
  double param_err = 0.0;
  const auto expected = expected_grads->named_parameters();
  for (const auto& p : m->named_parameters()) {
    param_err = std::max(param_err, diff(p.value().grad(), expected[p.key()]));
  }
  std::printf("nn.MultiheadAttention -> C++ %-16s max |diff| output %.2e, input grads %.2e, parameter grads %.2e\n",
              name.c_str(), out_err, input_err, param_err);
  int failures = !(std::max({out_err, input_err, param_err}) <= kMhaTolerance);

  torch::manual_seed(seed);  // other weights for the reverse direction
  auto fresh = make();
  const std::string path = dir + "/cpp_mha_" + name + ".pt";
  torchattn::save_torch_multihead_attention(*fresh, path);
  torch::NoGradGuard no_grad;
  write_tensor(dir + "/cpp_mha_" + name + "_out.pt", "y",
               run(fresh, get("query"), cross ? get("key") : torch::Tensor(), cross ? get("value") : torch::Tensor()));
  auto reloaded = make();  // and back: exactly the same parameters
  torchattn::load_torch_multihead_attention(*reloaded, path);
  const auto fresh_params = fresh->named_parameters();
  for (const auto& p : reloaded->named_parameters()) {
    if (!torch::equal(p.value(), fresh_params[p.key()])) {
      std::printf("FAIL: %s: '%s' changed through save_torch_multihead_attention and back\n", name.c_str(),
                  p.key().c_str());
      ++failures;
    }
  }
  return failures;
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
         [](torch::nn::Module& m, const torch::Tensor& x) {
           return dynamic_cast<torchattn::SelfAttentionV2Impl&>(m).forward(x);
         }},
        {"causal_attention", [] { return torchattn::CausalAttention(5, 4, 9, 0.0, true).ptr(); },
         [](torch::nn::Module& m, const torch::Tensor& x) {
           return dynamic_cast<torchattn::CausalAttentionImpl&>(m).forward(x);
         }},
        {"multi_head_attention", [] { return torchattn::MultiHeadAttention(5, 6, 9, 0.0, 3, true).ptr(); },
         [](torch::nn::Module& m, const torch::Tensor& x) {
           return dynamic_cast<torchattn::MultiHeadAttentionImpl&>(m).forward(x);
         }},
    };
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto m = c.make();
      m->eval();
      torchattn::load_state_dict(*m, dir + "/py_" + c.name + ".pt");
      const double err =
          (c.forward(*m, x) - read_tensor(dir + "/py_" + c.name + "_out.pt", "y")).abs().max().item<double>();
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
      std::ofstream(dir + "/cpp_tensors.pt", std::ios::binary)
          .write(out.data(), static_cast<std::streamsize>(out.size()));
    }
    // PyTorch's nn.MultiheadAttention, both ways.
    const auto mha_cases = read_dict(dir + "/py_mha_cases.pt").at("cases").toList();
    int mha_failures = 0;
    for (size_t i = 0; i < mha_cases.size(); ++i) {
      mha_failures += check_torch_mha(dir, mha_cases.get(i).toStringRef(), 700 + static_cast<int64_t>(i));
    }
    std::printf("%s: %zu nn.MultiheadAttention state dicts in MultiHeadAttention give PyTorch's outputs and "
                "gradients (<= %g)\n",
                mha_failures ? "FAIL" : "ok", mha_cases.size(), kMhaTolerance);
    failures += mha_failures;
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
