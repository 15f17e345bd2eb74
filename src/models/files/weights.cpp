#include <torchattn/models/weights.h>

#include "models/files/json_file.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <map>
#include <set>

namespace torchattn::models {

namespace {

// The [begin, end) character ranges of `name` where the dotted parts of `pattern`
// occur as whole parts, leftmost first.
size_t find_parts(const std::string& name, const std::string& pattern, size_t from = 0) {
  for (size_t at = name.find(pattern, from); at != std::string::npos; at = name.find(pattern, at + 1)) {
    const size_t end = at + pattern.size();
    const bool starts = at == 0 || name[at - 1] == '.';
    const bool ends = end == name.size() || name[end] == '.';
    if (starts && ends) return at;
  }
  return std::string::npos;
}

bool ignored(const std::string& name, const WeightsOptions& options) {
  for (const auto& pattern : options.ignore()) {
    if (!pattern.empty() && find_parts(name, pattern) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::string renamed(const std::string& name, const WeightsOptions& options) {
  std::string out = name;
  for (const auto& [from, to] : options.rename()) {
    if (from.empty()) continue;
    for (size_t at = find_parts(out, from); at != std::string::npos; at = find_parts(out, from, at + to.size())) {
      if (!to.empty()) {
        out.replace(at, from.size(), to);
        continue;
      }
      // Drop the parts and one of the dots around them.
      const size_t end = at + from.size();
      if (end < out.size()) {
        out.erase(at, from.size() + 1);
      } else if (at > 0) {
        out.erase(at - 1, from.size() + 1);
      } else {
        out.clear();
      }
      if (out.empty()) break;
    }
  }
  return out;
}

void load_weights(torch::nn::Module& module, const NamedTensors& tensors, const WeightsOptions& options,
                  const std::string& source, c10::ArrayRef<std::string> sources) {
  TORCH_CHECK(sources.empty() || sources.size() == tensors.size(), "load_weights: expected one source per tensor (",
              tensors.size(), "), got ", sources.size());
  auto origin = [&](size_t i) { return sources.empty() ? source : sources[i]; };
  // The module's tensors by name.
  std::map<std::string, at::Tensor> targets;
  for (const auto& p : module.named_parameters()) targets.emplace(p.key(), p.value());
  for (const auto& b : module.named_buffers()) targets.emplace(b.key(), b.value());

  std::map<std::string, size_t> found;  // module name -> index in tensors
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& file_name = tensors[i].first;
    if (ignored(file_name, options)) continue;
    const std::string name = renamed(file_name, options);
    const auto target = targets.find(name);
    TORCH_CHECK(target != targets.end(), "load_weights: ", origin(i), " has tensor '", file_name, "'",
                name != file_name ? " ('" + name + "' after renaming)" : std::string(),
                ", which the module does not have");
    const auto [previous, fresh] = found.emplace(name, i);
    TORCH_CHECK(fresh, "load_weights: tensors '", tensors[previous->second].first, "' (", origin(previous->second),
                ") and '", file_name, "' (", origin(i), ") both load into '", name, "'");
    const at::Tensor& value = tensors[i].second;
    const at::Tensor& param = target->second;
    TORCH_CHECK(value.sizes() == param.sizes(), "load_weights: tensor '", file_name, "' of ", origin(i), " has shape ",
                value.sizes(), ", expected ", param.sizes(), " for '", name, "'");
    TORCH_CHECK(!at::isFloatingType(param.scalar_type()) || at::isFloatingType(value.scalar_type()),
                "load_weights: tensor '", file_name, "' of ", origin(i), " is ", value.scalar_type(),
                ", expected a floating dtype for '", name, "'",
                value.scalar_type() == at::kChar
                    ? std::string(" (int8 weights saved by save_pretrained load with the torchattn_weights.json "
                                  "saved beside them: is it missing?)")
                    : std::string());
  }
  for (const auto& [name, t] : targets) {
    TORCH_CHECK(found.count(name) != 0, "load_weights: ", sources.empty() ? source : "the checkpoint",
                " has no tensor for '", name, "' (shape ", t.sizes(), ")");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, i] : found) {
    const at::Tensor& param = targets.at(name);
    const at::Tensor& value = tensors[i].second;
    if (value.device() == param.device() && value.scalar_type() == param.scalar_type() && value.is_contiguous()) {
      param.set_data(value);  // the file's own memory: no copy
    } else {
      param.set_data(value.to(param.device(), param.scalar_type()).contiguous());
    }
  }
}

std::string checkpoint_file(const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path dir(folder);
  if (fs::exists(dir / "model.safetensors")) return (dir / "model.safetensors").string();
  if (fs::exists(dir / "model.safetensors.index.json")) return (dir / "model.safetensors.index.json").string();
  TORCH_CHECK(false, "'", folder, "' has no model.safetensors nor model.safetensors.index.json");
}

void load_weights(torch::nn::Module& module, const std::string& path_in, const WeightsOptions& options) {
  namespace fs = std::filesystem;
  TORCH_CHECK(fs::exists(path_in), "load_weights: '", path_in,
              "' does not exist (expected a .safetensors file, a "
              "model.safetensors.index.json, or a folder holding either)");
  const std::string path = fs::is_directory(path_in) ? checkpoint_file(path_in) : path_in;
  if (!path.ends_with(".index.json")) {
    load_weights(module, load_safetensors(path), options, path);
    return;
  }
  // A sharded checkpoint: each shard read on its own, so that errors name it.
  const auto index = files::read_json_file(path, "load_weights");
  TORCH_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "load_weights: '",
              path, "' has no weight_map object");
  std::vector<std::string> shards;
  std::set<std::string> seen;
  for (const auto& [name, file] : index["weight_map"].items()) {
    TORCH_CHECK(file.is_string(), "load_weights: '", path, "': the shard of '", name, "' is not a file name");
    if (seen.insert(file.get<std::string>()).second) shards.push_back(file.get<std::string>());
  }
  NamedTensors all;
  std::vector<std::string> sources;
  for (const auto& shard : shards) {
    const std::string shard_path = (fs::path(path).parent_path() / shard).string();
    for (auto& t : load_safetensors(shard_path)) {
      all.push_back(std::move(t));
      sources.push_back(shard_path);
    }
  }
  load_weights(module, all, options, path, sources);
}

}  // namespace torchattn::models
