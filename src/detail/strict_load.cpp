#include "strict_load.h"

#include "causal_buffer.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace torchattn::detail {

namespace {

struct Staged {
  at::Tensor target;
  at::Tensor value;
};

void stage(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& prefix,
           const char* module_name, std::vector<Staged>& staged, bool implied_mask = false) {
  std::vector<std::string> expected;
  if (implied_mask) {
    expected.push_back("mask");  // checked by strict_load
  }
  auto take = [&](const std::string& key, const at::Tensor& target, bool is_buffer) {
    expected.push_back(key);
    at::Tensor value;
    TORCH_CHECK(archive.try_read(key, value, is_buffer), module_name, ": checkpoint is missing key '", prefix + key,
                "'");
    TORCH_CHECK(value.sizes() == target.sizes(), module_name, ": checkpoint key '", prefix + key, "' has shape ",
                value.sizes(), ", expected ", target.sizes());
    TORCH_CHECK(value.scalar_type() == target.scalar_type(), module_name, ": checkpoint key '", prefix + key,
                "' has dtype ", value.scalar_type(), ", expected ", target.scalar_type());
    staged.push_back({target, value});
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) take(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    expected.push_back(child.key());
    torch::serialize::InputArchive sub;
    const bool has_tensors = !child.value()->parameters().empty() || !child.value()->buffers().empty();
    if (!archive.try_read(child.key(), sub)) {
      TORCH_CHECK(!has_tensors, module_name, ": checkpoint is missing submodule '", prefix + child.key(), "'");
      continue;
    }
    stage(*child.value(), sub, prefix + child.key() + ".", module_name, staged);
  }
  for (const auto& key : archive.keys()) {
    TORCH_CHECK(std::find(expected.begin(), expected.end(), key) != expected.end(), module_name,
                ": checkpoint has unexpected key '", prefix + key, "'");
  }
}

} // namespace

void strict_load(torch::nn::Module& module, torch::serialize::InputArchive& archive, const char* module_name,
                 int64_t implied_causal_mask) {
  if (implied_causal_mask > 0) {
    at::Tensor mask;
    if (archive.try_read("mask", mask, /*is_buffer=*/true)) {
      check_causal_mask(module_name, "mask", mask, implied_causal_mask);
    }
  }
  std::vector<Staged> staged;
  stage(module, archive, "", module_name, staged, implied_causal_mask > 0);
  torch::NoGradGuard no_grad;
  for (auto& s : staged) {
    s.target.copy_(s.value);
  }
}

} // namespace torchattn::detail
