#include <torchattn/torch_mha_interop.h>

#include <torchattn/multi_head_attention.h>

#include "serialize/pickled_dict.h"

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

// Named as well as anonymous: the unity build puts other files' helpers beside these.
namespace torch_mha {
namespace {

constexpr const char* kLoad = "load_torch_multihead_attention";

// One key of nn.MultiheadAttention's state dict: the module's parameters it holds,
// stacked by rows (in_proj_weight is W_query.weight over W_key.weight over W_value.weight).
struct Slot {
  std::string key;
  std::vector<at::Tensor> parts;
  std::string layout;  // how PyTorch sizes it, for errors: "[3 * embed_dim, embed_dim] with embed_dim=6"

  std::vector<int64_t> shape() const {
    std::vector<int64_t> s = parts.front().sizes().vec();
    for (size_t i = 1; i < parts.size(); ++i) s[0] += parts[i].size(0);
    return s;
  }
};

int64_t embed_dim(const MultiHeadAttentionImpl& mha) { return mha.options.d_in(); }
int64_t kdim(const MultiHeadAttentionImpl& mha) { return mha.options.kdim().value_or(mha.options.d_in()); }
int64_t vdim(const MultiHeadAttentionImpl& mha) { return mha.options.vdim().value_or(mha.options.d_in()); }

// The Python module whose state dict matches `mha`'s, as Python would build it.
std::string torch_module_of(const MultiHeadAttentionImpl& mha) {
  std::ostringstream s;
  s << "nn.MultiheadAttention(" << embed_dim(mha) << ", " << mha.options.num_heads()
    << ", bias=" << (mha.options.qkv_bias() ? "True" : "False");
  if (kdim(mha) != embed_dim(mha) || vdim(mha) != embed_dim(mha)) {
    s << ", kdim=" << kdim(mha) << ", vdim=" << vdim(mha);
  }
  s << ")";
  return s.str();
}

// The options of `mha` that nn.MultiheadAttention(embed_dim, num_heads, dropout, bias,
// kdim=, vdim=) has no way to express, each an error naming it.
void check_expressible(const MultiHeadAttentionImpl& mha, const char* fn) {
  const MultiHeadAttentionOptions& o = mha.options;
  const char* no = ": nn.MultiheadAttention cannot express this MultiHeadAttention: ";
  TORCH_CHECK(o.d_in() == o.d_out(), fn, no, "it maps embed_dim features to embed_dim, so it needs d_in == d_out, ",
              "got d_in=", o.d_in(), " and d_out=", o.d_out());
  TORCH_CHECK(o.d_out() % o.num_heads() == 0 && mha.head_dim() == o.d_out() / o.num_heads(), fn, no,
              "its heads have embed_dim / num_heads = ", o.d_out(), " / ", o.num_heads(),
              " features, got head_dim=", mha.head_dim());
  TORCH_CHECK(mha.num_kv_heads() == o.num_heads(), fn, no, "it has no grouped-query heads (num_kv_heads must equal ",
              "num_heads=", o.num_heads(), "), got num_kv_heads=", mha.num_kv_heads());
  TORCH_CHECK(o.qkv_bias() == o.out_bias(), fn, no, "its bias= gives both in_proj and out_proj biases or neither, ",
              "got qkv_bias=", o.qkv_bias() ? "true" : "false", " and out_bias=", o.out_bias() ? "true" : "false");
  TORCH_CHECK(!o.window(), fn, no, "it has no sliding window, got window=", o.window().value_or(0));
  TORCH_CHECK(!o.rope(), fn, no, "it has no rotary positions, got rope (theta=", o.rope() ? o.rope()->theta() : 0.0,
              ")");
  TORCH_CHECK(!o.qk_norm(), fn, no, "it has no RMSNorm of queries and keys, got qk_norm");
  TORCH_CHECK(!o.alibi(), fn, no, "it has no ALiBi, got alibi=true");
  TORCH_CHECK(!o.softcap(), fn, no, "it has no logit softcapping, got softcap=", o.softcap().value_or(0.0));
  TORCH_CHECK(!o.sinks(), fn, no, "it has no attention sinks, got sinks=true");
  const double scale = 1.0 / std::sqrt(static_cast<double>(mha.head_dim()));
  TORCH_CHECK(!o.scale() || *o.scale() == scale, fn, no,
              "it scales the scores by 1/sqrt(embed_dim / num_heads) = ", scale,
              ", got scale=", o.scale().value_or(0.0));
}

// nn.MultiheadAttention's keys for `mha`, in the order of its state dict.
std::vector<Slot> slots(const MultiHeadAttentionImpl& mha) {
  const std::string e = "embed_dim=" + std::to_string(embed_dim(mha));
  std::vector<Slot> out;
  if (kdim(mha) == embed_dim(mha) && vdim(mha) == embed_dim(mha)) {
    out.push_back({"in_proj_weight",
                   {mha.W_query->weight, mha.W_key->weight, mha.W_value->weight},
                   "[3 * embed_dim, embed_dim] with " + e});
  } else {
    out.push_back({"q_proj_weight", {mha.W_query->weight}, "[embed_dim, embed_dim] with " + e});
    out.push_back(
        {"k_proj_weight", {mha.W_key->weight}, "[embed_dim, kdim] with " + e + ", kdim=" + std::to_string(kdim(mha))});
    out.push_back({"v_proj_weight",
                   {mha.W_value->weight},
                   "[embed_dim, vdim] with " + e + ", vdim=" + std::to_string(vdim(mha))});
  }
  if (mha.options.qkv_bias()) {
    out.push_back(
        {"in_proj_bias", {mha.W_query->bias, mha.W_key->bias, mha.W_value->bias}, "[3 * embed_dim] with " + e});
  }
  out.push_back({"out_proj.weight", {mha.out_proj->weight}, "[embed_dim, embed_dim] with " + e});
  if (mha.options.out_bias()) {
    out.push_back({"out_proj.bias", {mha.out_proj->bias}, "[embed_dim] with " + e});
  }
  return out;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s.empty() ? "no keys" : s;
}

// Why `key` may be missing from `given`: the state dict of a module built otherwise.
std::string missing_hint(const std::string& key, const std::map<std::string, at::Tensor>& given,
                         const MultiHeadAttentionImpl& mha) {
  if (key == "in_proj_weight" && given.count("q_proj_weight") > 0) {
    return " (it has q_proj_weight, k_proj_weight and v_proj_weight instead: its module's kdim or vdim differs from "
           "embed_dim; give this MultiHeadAttention the kdim and vdim of k_proj_weight's and v_proj_weight's widths)";
  }
  if (key.ends_with("_proj_weight") && given.count("in_proj_weight") > 0) {
    return " (it has in_proj_weight instead: its module has kdim = vdim = embed_dim, this MultiHeadAttention kdim=" +
           std::to_string(kdim(mha)) + " and vdim=" + std::to_string(vdim(mha)) + ")";
  }
  if (key == "in_proj_bias" || key == "out_proj.bias") {
    return " (this MultiHeadAttention has qkv_bias(true) and out_bias(true), as bias=True; the state dict of an "
           "nn.MultiheadAttention(..., bias=False) loads into one with qkv_bias(false).out_bias(false))";
  }
  return "";
}

void load(MultiHeadAttentionImpl& mha, const NamedTensors& state_dict, const std::string& source) {
  check_expressible(mha, kLoad);
  std::map<std::string, at::Tensor> given;
  std::vector<std::string> given_keys;
  for (const auto& [key, tensor] : state_dict) {
    TORCH_CHECK(given.emplace(key, tensor).second, kLoad, ": ", source, " holds key '", key, "' twice");
    TORCH_CHECK(tensor.defined(), kLoad, ": key '", key, "' of ", source, " is an undefined tensor");
    given_keys.push_back(key);
  }
  for (const char* key : {"bias_k", "bias_v"}) {
    const auto it = given.find(key);
    TORCH_CHECK(it == given.end(), kLoad, ": ", source, " has key '", key, "' ", it->second.sizes(),
                ": it is of an nn.MultiheadAttention built with add_bias_kv=True, whose learned key and value join ",
                "every sequence; torchattn's MultiHeadAttention has no such parameters, so it cannot be loaded");
  }
  const std::vector<Slot> wanted = slots(mha);
  std::vector<std::string> wanted_keys;
  for (const Slot& slot : wanted) {
    wanted_keys.push_back(slot.key);
    const auto it = given.find(slot.key);
    const std::vector<int64_t> shape = slot.shape();
    TORCH_CHECK(it != given.end(), kLoad, ": ", source, " is missing key '", slot.key, "' ", c10::IntArrayRef(shape),
                " of ", torch_module_of(mha), missing_hint(slot.key, given, mha), "; it has ", key_list(given_keys));
    const at::Tensor& t = it->second;
    TORCH_CHECK(t.sizes() == c10::IntArrayRef(shape), kLoad, ": key '", slot.key, "' has shape ", t.sizes(), " in ",
                source, ", expected ", c10::IntArrayRef(shape), " (", slot.layout, ", ", torch_module_of(mha), ")");
    const auto dtype = slot.parts.front().scalar_type();
    TORCH_CHECK(t.scalar_type() == dtype, kLoad, ": key '", slot.key, "' has dtype ", t.scalar_type(), " in ", source,
                ", expected the module's ", dtype, " (convert the module with ->to(), or the tensors)");
  }
  for (const auto& key : given_keys) {
    if (std::find(wanted_keys.begin(), wanted_keys.end(), key) != wanted_keys.end()) {
      continue;
    }
    const bool bias = key == "in_proj_bias" || key == "out_proj.bias";
    TORCH_CHECK(false, kLoad, ": ", source, " has unexpected key '", key, "' ", given.at(key).sizes(), " for ",
                torch_module_of(mha),
                bias ? " (a bias of nn.MultiheadAttention(..., bias=True): build this MultiHeadAttention with "
                       "qkv_bias(true).out_bias(true))"
                     : "",
                "; expected ", key_list(wanted_keys));
  }
  torch::NoGradGuard no_grad;
  for (const Slot& slot : wanted) {
    const at::Tensor& t = given.at(slot.key);
    int64_t row = 0;
    for (const at::Tensor& part : slot.parts) {
      part.copy_(t.narrow(0, row, part.size(0)));
      row += part.size(0);
    }
  }
}

NamedTensors state_dict_of(const MultiHeadAttentionImpl& mha, const char* fn) {
  check_expressible(mha, fn);
  NamedTensors out;
  for (const Slot& slot : slots(mha)) {
    std::vector<at::Tensor> parts;
    parts.reserve(slot.parts.size());
    for (const at::Tensor& p : slot.parts) parts.push_back(p.detach());
    out.emplace_back(slot.key, parts.size() == 1 ? parts.front().clone() : at::cat(parts, 0));
  }
  return out;
}

// The options nn.MultiheadAttention's state dict lacks, of `mha`, in the options
// file's order.
std::vector<std::pair<std::string, std::string>> recorded_options(const MultiHeadAttentionImpl& mha) {
  return {{"embed_dim", std::to_string(embed_dim(mha))},
          {"num_heads", std::to_string(mha.options.num_heads())},
          {"bias", mha.options.qkv_bias() ? "true" : "false"},
          {"kdim", std::to_string(kdim(mha))},
          {"vdim", std::to_string(vdim(mha))}};
}

constexpr std::streamoff kMostOptionsBytes = 4096;

// The options file beside a state dict (when there is one) against `mha`: each option
// it names must be `mha`'s.
void check_recorded_options(const MultiHeadAttentionImpl& mha, const std::string& path) {
  const std::string file = torch_multihead_attention_options_path(path);
  if (!std::filesystem::exists(file)) return;
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  TORCH_CHECK(in, kLoad, ": cannot open '", file, "'");
  const std::streamoff size = in.tellg();
  TORCH_CHECK(size >= 0 && size <= kMostOptionsBytes, kLoad, ": '", file, "' holds ", size,
              " bytes; an options file is one line of at most ", kMostOptionsBytes, " bytes");
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(text.data(), size);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const auto mine = recorded_options(mha);
  std::map<std::string, std::string> seen;
  std::istringstream pairs(text);
  for (std::string pair; std::getline(pairs, pair, ';');) {
    const size_t eq = pair.find('=');
    const std::string name = pair.substr(0, eq);
    const auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& o) { return o.first == name; });
    const std::string value = eq == std::string::npos ? "" : pair.substr(eq + 1);
    const bool readable = name == "bias" ? value == "true" || value == "false"
                                         : !value.empty() && value.size() <= 18 &&
                                               std::all_of(value.begin(), value.end(),
                                                           [](char c) { return c >= '0' && c <= '9'; });
    TORCH_CHECK(eq != std::string::npos && it != mine.end() && readable, kLoad, ": '", file,
                "': expected name=value pairs joined by ';' with names embed_dim, num_heads, bias, kdim, vdim (bias "
                "true or false, the others whole numbers), got '",
                pair.size() > 64 ? pair.substr(0, 64) + "..." : pair, "'");
    TORCH_CHECK(seen.emplace(name, value).second, kLoad, ": '", file, "' names ", name, " twice");
    TORCH_CHECK(value == it->second, kLoad, ": '", file, "' records ", name, "=", value,
                " (the module the weights were saved from); this MultiHeadAttention has ", name, "=", it->second,
                name == "num_heads"
                    ? ": build it with the recorded value (the weights alone do not tell the head count)"
                    : ": build it with the recorded value");
  }
}

}  // namespace
}  // namespace torch_mha

std::string torch_multihead_attention_options_path(const std::string& path) { return path + ".options"; }

void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const std::string& path) {
  torch_mha::check_recorded_options(mha, path);
  const std::vector<char> bytes = serialize::read_file(path, torch_mha::kLoad);
  torch_mha::load(mha, serialize::unpickle_tensors(bytes, path, torch_mha::kLoad), "'" + path + "'");
}

void load_torch_multihead_attention(MultiHeadAttentionImpl& mha, const NamedTensors& state_dict) {
  torch_mha::load(mha, state_dict, "the state dict");
}

NamedTensors torch_multihead_attention_state_dict(const MultiHeadAttentionImpl& mha) {
  return torch_mha::state_dict_of(mha, "torch_multihead_attention_state_dict");
}

void save_torch_multihead_attention(const MultiHeadAttentionImpl& mha, const std::string& path) {
  constexpr const char* kSave = "save_torch_multihead_attention";
  NamedTensors tensors = torch_mha::state_dict_of(mha, kSave);
  for (auto& [key, tensor] : tensors) tensor = tensor.cpu();
  serialize::pickle_tensors(tensors, path, kSave);
  std::string line;
  for (const auto& [name, value] : torch_mha::recorded_options(mha)) {
    if (!line.empty()) line += ';';
    line.append(name).append("=").append(value);
  }
  const std::string file = torch_multihead_attention_options_path(path);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, kSave, ": cannot write '", file, "'");
  out << line << "\n";
  TORCH_CHECK(out.flush(), kSave, ": cannot write '", file, "'");
}

}  // namespace torchattn
