#include "layers/placed_together.h"

#include <torchattn/linear.h>

#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <optional>
#include <string>

namespace torchattn {

namespace layers {

bool end_to_end(const std::vector<at::Tensor>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const at::Tensor& t = parts[i];
    if (!t.defined() || !t.is_contiguous()) return false;
    if (i == 0) continue;
    const at::Tensor& before = parts[i - 1];
    if (!t.is_alias_of(parts[0]) || t.scalar_type() != before.scalar_type() || t.dim() != parts[0].dim() ||
        t.sizes().slice(1) != parts[0].sizes().slice(1) ||
        t.storage_offset() != before.storage_offset() + before.numel()) {
      return false;
    }
  }
  return !parts.empty();
}

at::Tensor joined_view(const std::vector<at::Tensor>& parts) {
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[0] = 0;
  for (const auto& p : parts) sizes[0] += p.size(0);
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = strides[static_cast<size_t>(d) + 1] * sizes[static_cast<size_t>(d) + 1];
  }
  return parts[0].as_strided(sizes, strides);
}

at::Tensor joined_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<at::Tensor>& biases) {
  const std::optional<at::Tensor> bias = biases.empty() ? std::nullopt : std::optional<at::Tensor>(joined_view(biases));
  return at::linear(x, joined_view(weights), bias);
}

}  // namespace layers

namespace {

std::vector<at::Tensor> weights_of(const std::vector<const LinearImpl*>& layers) {
  std::vector<at::Tensor> out;
  out.reserve(layers.size());
  for (const LinearImpl* l : layers) out.push_back(l->weight);
  return out;
}

std::vector<at::Tensor> biases_of(const std::vector<const LinearImpl*>& layers) {
  std::vector<at::Tensor> out;
  for (const LinearImpl* l : layers) {
    if (l->bias.defined()) out.push_back(l->bias);
  }
  return out;
}

// The parameters `parts` (values kept) as consecutive views of one new storage; each
// handle shares its parameter's TensorImpl, so set_data reaches the parameter.
void join(const std::vector<at::Tensor>& parts) {
  const at::Tensor joined = at::cat(parts, 0);
  int64_t row = 0;
  for (const at::Tensor& p : parts) {
    const int64_t rows = p.size(0);
    p.set_data(joined.narrow(0, row, rows));
    row += rows;
  }
}

bool together(const std::vector<const LinearImpl*>& layers) {
  const auto biases = biases_of(layers);
  return !layers.empty() && layers::end_to_end(weights_of(layers)) &&
         (biases.empty() || (biases.size() == layers.size() && layers::end_to_end(biases)));
}

}  // namespace

bool placed_together(std::initializer_list<const LinearImpl*> layers) {
  return together(std::vector<const LinearImpl*>(layers.begin(), layers.end()));
}

void place_together(std::initializer_list<LinearImpl*> layers) {
  TORCH_CHECK(layers.size() > 0, "place_together: expected at least one layer");
  const LinearImpl* first = *layers.begin();
  size_t i = 0;
  for (const LinearImpl* l : layers) {
    const std::string which = "place_together: layer " + std::to_string(i++);
    TORCH_CHECK(!l->frozen() && !is_placeholder(l->weight) && !is_placeholder(l->bias), which,
                " has no weights of its own (frozen, or built for loading and not loaded)");
    TORCH_CHECK(l->weight.size(1) == first->weight.size(1), which, " takes ", l->weight.size(1),
                " input features, layer 0 ", first->weight.size(1));
    TORCH_CHECK(l->weight.scalar_type() == first->weight.scalar_type() && l->weight.device() == first->weight.device(),
                which, " has ", l->weight.scalar_type(), " weights on ", l->weight.device(), ", layer 0 ",
                first->weight.scalar_type(), " on ", first->weight.device());
    TORCH_CHECK(l->bias.defined() == first->bias.defined(), which, (l->bias.defined() ? " has" : " has no"),
                " bias, layer 0 ", (first->bias.defined() ? "has one" : "none"));
  }
  if (together(std::vector<const LinearImpl*>(layers.begin(), layers.end()))) return;
  // Normal tensors even inside the caller's InferenceMode (parameters must stay usable
  // for autograd), and no graph.
  const c10::InferenceMode normal_tensors(false);
  const torch::NoGradGuard no_grad;
  std::vector<at::Tensor> weights, biases;
  for (LinearImpl* l : layers) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  join(weights);
  if (!biases.empty()) join(biases);
}

}  // namespace torchattn
