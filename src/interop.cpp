#include <torchattn/interop.h>

#include <torchattn/causal_attention.h>
#include <torchattn/multi_head_attention.h>

#include "detail/causal_buffer.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

namespace torchattn {

namespace {

// Parameters, then buffers, in the module's order (errors name the first mismatch).
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

// The context length whose causal mask the (sub)module at `path` ("" for `module`)
// applies without a buffer (mask_buffer(false)), or 0.
int64_t implied_causal_mask(const torch::nn::Module& module, const std::string& path) {
  const torch::nn::Module* m = &module;
  if (!path.empty()) {
    m = nullptr;
    for (const auto& child : module.named_modules()) {
      if (child.key() == path) {
        m = child.value().get();
      }
    }
  }
  if (const auto* ca = dynamic_cast<const CausalAttentionImpl*>(m); ca != nullptr && !ca->options.mask_buffer()) {
    return ca->options.context_length();
  }
  if (const auto* mha = dynamic_cast<const MultiHeadAttentionImpl*>(m); mha != nullptr && !mha->options.mask_buffer()) {
    return mha->options.context_length();
  }
  return 0;
}

} // namespace

void load_state_dict(torch::nn::Module& module, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "load_state_dict: cannot open '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    // LibTorch's unpickler cannot read the OrderedDict (with its _metadata) that
    // module.state_dict() returns; a plain dict of the same tensors reads fine.
    const std::string what = e.what();
    TORCH_CHECK(false, "load_state_dict: cannot read '", path, "' as a torch.save file of a plain dict; save it in ",
                "Python with torch.save(dict(module.state_dict()), path) (",
                what.substr(0, what.find('\n')), ")");
  }
  TORCH_CHECK(value.isGenericDict(), "load_state_dict: expected '", path,
              "' to hold a state dict (a dict of name -> tensor), got ", value.tagKind());
  std::map<std::string, at::Tensor> loaded;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), "load_state_dict: expected '", path,
                "' to map names to tensors, got ", item.key().tagKind(), " -> ", item.value().tagKind());
    loaded[item.key().toStringRef()] = item.value().toTensor();
  }
  auto targets = named_tensors(module);
  for (const auto& [key, target] : targets) {
    auto it = loaded.find(key);
    TORCH_CHECK(it != loaded.end(), "load_state_dict: '", path, "' is missing key '", key, "'");
    TORCH_CHECK(it->second.sizes() == target.sizes(), "load_state_dict: key '", key, "' has shape ",
                it->second.sizes(), " in '", path, "', expected ", target.sizes());
    TORCH_CHECK(it->second.scalar_type() == target.scalar_type(), "load_state_dict: key '", key, "' has dtype ",
                it->second.scalar_type(), " in '", path, "', expected ", target.scalar_type());
  }
  for (const auto& [key, tensor] : loaded) {
    const bool known = std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return t.first == key; });
    if (known) {
      continue;
    }
    // A notebook checkpoint's `mask` into a mask_buffer(false) module: accepted
    // when it is the causal mask the module applies anyway.
    const bool is_mask = key == "mask" || key.ends_with(".mask");
    const std::string owner = key == "mask" ? "" : key.substr(0, key.size() - 5);
    const int64_t C = is_mask ? implied_causal_mask(module, owner) : 0;
    TORCH_CHECK(C > 0, "load_state_dict: '", path, "' has unexpected key '", key, "'");
    detail::check_causal_mask("load_state_dict", key, tensor, C);
  }
  torch::NoGradGuard no_grad;
  for (auto& [key, target] : targets) {
    target.copy_(loaded.at(key));
  }
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  // An untyped dict: a typed one is pickled with torch.jit's type tag, which
  // Python's torch.load (weights_only=True by default) refuses.
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  for (const auto& [key, tensor] : named_tensors(module)) {
    dict.insert(key, tensor.detach().cpu());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream out(path, std::ios::binary);
  TORCH_CHECK(out, "save_state_dict: cannot write '", path, "'");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TORCH_CHECK(out.good(), "save_state_dict: writing '", path, "' failed");
}

} // namespace torchattn
