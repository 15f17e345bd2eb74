#include <torchattn/packed_linear.h>

#include "kernels/cpu/quantized_linear.h"

#include <c10/util/Exception.h>

#include <string>

namespace torchattn {

namespace {

// A stored weight's dtype in the words of the weight formats (int8, not Char).
std::string dtype_words(at::ScalarType t) {
  switch (t) {
    case at::kChar:
      return "int8";
    case at::kBFloat16:
      return "bfloat16";
    case at::kFloat:
      return "float32";
    case at::kHalf:
      return "float16";
    default:
      return c10::toString(t);
  }
}

}  // namespace

void append_frozen_weights(NamedTensors& out, const std::string& prefix, const std::vector<std::string>& names,
                           const PackedLinear& pack) {
  TORCH_CHECK(pack.frozen_count() == names.size(), "append_frozen_weights: the copy holds ", pack.frozen_count(),
              " weights, got ", names.size(), " names");
  for (size_t i = 0; i < names.size(); ++i) {
    auto [weight, scale] = pack.frozen_weight(i);
    out.emplace_back(prefix + names[i], weight);
    if (scale.defined()) out.emplace_back(prefix + names[i] + kFrozenScaleSuffix, scale);
  }
}

void check_frozen_weights(WeightFormat format, const std::map<std::string, at::Tensor>& weights_by_name,
                          const std::string& prefix, const std::vector<std::string>& names,
                          const std::vector<at::Tensor>& like, const char* what) {
  const bool int8 = format == WeightFormat::Int8;
  auto get = [&](const std::string& name) -> const at::Tensor& {
    const auto it = weights_by_name.find(name);
    TORCH_CHECK(it != weights_by_name.end(), what, ": the frozen ", to_string(format), " weights have no '", name, "'");
    return it->second;
  };
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name = prefix + names[i];
    const at::Tensor& w = get(name);
    TORCH_CHECK(w.scalar_type() == (int8 ? at::kChar : at::kBFloat16), what, ": expected the frozen '", name, "' ",
                int8 ? "int8" : "bfloat16", " (the weight format asked for), got ", dtype_words(w.scalar_type()),
                " weights (saved in another format?)");
    TORCH_CHECK(w.sizes() == like[i].sizes(), what, ": expected the frozen '", name, "' ", like[i].sizes(),
                " (the model's shape), got ", w.sizes(), " (weights of another model?)");
    if (!int8) continue;
    const at::Tensor& s = get(name + kFrozenScaleSuffix);
    const int64_t groups = kernels::cpu::int8_groups(w.size(1));
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 2 && s.size(0) == w.size(0) && s.size(1) == groups, what,
                ": expected '", name, kFrozenScaleSuffix, "' float32 [", w.size(0), ", ", groups,
                "] (a scale per group of ", kernels::cpu::kInt8Group, " inputs), got ", s.sizes(), " of ",
                s.scalar_type());
    const int64_t bad = kernels::cpu::first_unproducible_scale(w, s);
    TORCH_CHECK(bad < 0, what, ": expected '", name, kFrozenScaleSuffix, "' as int8 quantization makes them (",
                kernels::cpu::kProducibleScales, "), got ", bad < 0 ? 0.0f : s.reshape(-1)[bad].item<float>(),
                " at row ", bad / groups, ", group ", bad % groups, " (a damaged file?)");
  }
}

void freeze_from_weights(PackedLinear& pack, const std::map<std::string, at::Tensor>& weights_by_name,
                         const std::string& prefix, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& like, const std::vector<at::Tensor>& biases, const char* what) {
  check_frozen_weights(pack.format(), weights_by_name, prefix, names, like, what);
  std::vector<at::Tensor> weights, scales;
  for (const auto& name : names) {
    weights.push_back(weights_by_name.at(prefix + name));
    if (pack.format() == WeightFormat::Int8) scales.push_back(weights_by_name.at(prefix + name + kFrozenScaleSuffix));
  }
  pack.freeze_from(weights, scales, biases);
}

}  // namespace torchattn
