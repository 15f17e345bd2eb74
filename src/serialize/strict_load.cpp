#include "serialize/strict_load.h"

#include "serialize/causal_buffer.h"
#include "serialize/checkpoint_options.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace torchattn::serialize {

namespace {

struct Staged {
  at::Tensor target;
  at::Tensor value;
};

// `hint` explains this module's tensor shapes in errors (see shape_hint).
void stage(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& prefix,
           const char* fn, std::vector<Staged>& staged, const std::string& hint = "") {
  std::vector<std::string> expected;
  if (const auto options = checkpoint_options(module)) {
    expected.push_back(kOptionsKey);
    c10::IValue saved;
    if (archive.try_read(kOptionsKey, saved)) {
      TORCH_CHECK(saved.isString(), fn, ": checkpoint entry '", prefix, kOptionsKey, "' is not a string");
      check_saved_options(fn, prefix, saved.toStringRef(), *options);
    }
  }
  if (const int64_t C = implied_causal_mask(module); C > 0) {
    expected.push_back("mask");
    at::Tensor mask;
    if (archive.try_read("mask", mask, /*is_buffer=*/true)) {
      check_causal_mask(fn, prefix + "mask", mask, C);
    }
  }
  auto take = [&](const std::string& key, const at::Tensor& target, bool is_buffer) {
    expected.push_back(key);
    at::Tensor value;
    TORCH_CHECK(archive.try_read(key, value, is_buffer), fn, ": checkpoint is missing key '", prefix + key, "'");
    TORCH_CHECK(value.sizes() == target.sizes(), fn, ": checkpoint key '", prefix + key, "' has shape ", value.sizes(),
                ", expected ", target.sizes(), hint);
    TORCH_CHECK(value.scalar_type() == target.scalar_type(), fn, ": checkpoint key '", prefix + key, "' has dtype ",
                value.scalar_type(), ", expected ", target.scalar_type());
    staged.push_back({target, value});
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) take(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    expected.push_back(child.key());
    torch::serialize::InputArchive sub;
    const bool has_tensors = !child.value()->parameters().empty() || !child.value()->buffers().empty();
    if (!archive.try_read(child.key(), sub)) {
      TORCH_CHECK(!has_tensors, fn, ": checkpoint is missing submodule '", prefix + child.key(), "'");
      continue;
    }
    stage(*child.value(), sub, prefix + child.key() + ".", fn, staged, shape_hint(module, child.key() + "."));
  }
  for (const auto& key : archive.keys()) {
    TORCH_CHECK(std::find(expected.begin(), expected.end(), key) != expected.end(), fn,
                ": checkpoint has unexpected key '", prefix + key, "'");
  }
}

}  // namespace

void strict_load(torch::nn::Module& module, torch::serialize::InputArchive& archive, const char* fn,
                 const std::string& prefix) {
  std::vector<Staged> staged;
  stage(module, archive, prefix, fn, staged);
  torch::NoGradGuard no_grad;
  for (auto& s : staged) {
    s.target.copy_(s.value);
  }
}

std::string archive_path(torch::serialize::InputArchive& archive) {
  const std::string probe = "\x01torchattn-path-probe";
  try {
    at::Tensor unused;
    archive.read(probe, unused);
  } catch (const c10::Error& e) {
    // "No such serialized tensor 'blocks.1.attn.<probe>'"
    const std::string what = e.what_without_backtrace();
    const auto end = what.find(probe);
    const auto begin = what.rfind('\'', end);
    if (end != std::string::npos && begin != std::string::npos && begin < end) {
      return what.substr(begin + 1, end - begin - 1);
    }
  }
  return "";
}

void save_with_options(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  module.torch::nn::Module::save(archive);
  if (const auto options = checkpoint_options(module)) {
    archive.write(kOptionsKey, c10::IValue(encode_options(*options)));
  }
}

}  // namespace torchattn::serialize
