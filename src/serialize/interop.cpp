#include <torchattn/interop.h>

#include "serialize/causal_buffer.h"
#include "serialize/checkpoint_options.h"
#include "serialize/pickled_dict.h"
#include "serialize/strict_load.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <map>
#include <memory>
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

// The submodule at `path` ("" for `module` itself), or null.
const torch::nn::Module* submodule(const torch::nn::Module& module, const std::string& path) {
  if (path.empty()) {
    return &module;
  }
  for (const auto& child : module.named_modules()) {
    if (child.key() == path) {
      return child.value().get();
    }
  }
  return nullptr;
}

// What explains the shape of the tensor at `key` ("blocks.0.attn.W_key.weight"): the
// hint of the module that owns its parent ("blocks.0.attn"), or "".
std::string shape_hint(const torch::nn::Module& module, const std::string& key) {
  const auto leaf = key.rfind('.');
  if (leaf == std::string::npos) {
    return "";
  }
  const auto parent = key.rfind('.', leaf - 1);
  const std::string owner = parent == std::string::npos ? "" : key.substr(0, parent);
  const torch::nn::Module* m = submodule(module, owner);
  return m == nullptr ? "" : serialize::shape_hint(*m, parent == std::string::npos ? key : key.substr(parent + 1));
}

// A torch::save archive (TorchScript's zip with constants.pkl), not a pickled dict.
bool is_torch_save_archive(const std::vector<char>& bytes) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    return reader.hasRecord("constants.pkl");
  } catch (const std::exception&) {
    return false;
  }
}

void load_archive(torch::nn::Module& module, const std::vector<char>& bytes, const std::string& path) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    const std::string what = e.what();
    TORCH_CHECK(false, "load_state_dict: cannot read '", path, "' as a torch::save archive (",
                what.substr(0, what.find('\n')), ")");
  }
  serialize::strict_load(module, archive, "load_state_dict");
}

}  // namespace

void load_state_dict(torch::nn::Module& module, const std::string& path) {
  const std::vector<char> bytes = serialize::read_file(path, "load_state_dict");
  if (is_torch_save_archive(bytes)) {
    load_archive(module, bytes, path);
    return;
  }
  std::map<std::string, at::Tensor> loaded;
  for (auto& [key, tensor] : serialize::unpickle_tensors(bytes, path, "load_state_dict")) {
    loaded[key] = std::move(tensor);
  }
  auto targets = named_tensors(module);
  for (const auto& [key, target] : targets) {
    auto it = loaded.find(key);
    TORCH_CHECK(it != loaded.end(), "load_state_dict: '", path, "' is missing key '", key, "'");
    TORCH_CHECK(it->second.sizes() == target.sizes(), "load_state_dict: key '", key, "' has shape ", it->second.sizes(),
                " in '", path, "', expected ", target.sizes(), shape_hint(module, key));
    TORCH_CHECK(it->second.scalar_type() == target.scalar_type(), "load_state_dict: key '", key, "' has dtype ",
                it->second.scalar_type(), " in '", path, "', expected ", target.scalar_type());
  }
  for (const auto& [key, tensor] : loaded) {
    const std::string& name = key;  // (a structured binding: clang 14 cannot capture one)
    const bool known = std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return t.first == name; });
    if (known) {
      continue;
    }
    // A notebook checkpoint's `mask` into a mask_buffer(false) module: accepted
    // when it is the causal mask the module applies anyway.
    const bool is_mask = key == "mask" || key.ends_with(".mask");
    const std::string owner = key == "mask" ? "" : key.substr(0, key.size() - 5);
    const torch::nn::Module* m = is_mask ? submodule(module, owner) : nullptr;
    const int64_t C = m != nullptr ? serialize::implied_causal_mask(*m) : 0;
    TORCH_CHECK(C > 0, "load_state_dict: '", path, "' has unexpected key '", key, "'");
    serialize::check_causal_mask("load_state_dict", key, tensor, C);
  }
  torch::NoGradGuard no_grad;
  for (auto& [key, target] : targets) {
    target.copy_(loaded.at(key));
  }
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  NamedTensors tensors;
  for (const auto& [key, tensor] : named_tensors(module)) {
    tensors.emplace_back(key, tensor.detach().cpu());
  }
  serialize::pickle_tensors(tensors, path, "save_state_dict");
}

}  // namespace torchattn
