#include <torchattn/packed_linear.h>

#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/quantized_linear.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

namespace torchattn {

namespace {

// A stored weight's dtype in the words of the weight formats (int8, not Char).
std::string dtype_words(at::ScalarType t) {
  switch (t) {
    case at::kChar:
      return "int8";
    case at::kByte:
      return "int4 (uint8)";
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
  const bool int4 = format == WeightFormat::Int4;
  auto get = [&](const std::string& name) -> const at::Tensor& {
    const auto it = weights_by_name.find(name);
    TORCH_CHECK(it != weights_by_name.end(), what, ": the frozen ", to_string(format), " weights have no '", name, "'");
    return it->second;
  };
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name = prefix + names[i];
    const at::Tensor& w = get(name);
    const at::ScalarType want = int8 ? at::kChar : int4 ? at::kByte : at::kBFloat16;
    TORCH_CHECK(w.scalar_type() == want, what, ": expected the frozen '", name, "' ", dtype_words(want),
                " (the weight format asked for), got ", dtype_words(w.scalar_type()),
                " weights (saved in another format?)");
    // int4: two inputs a byte.
    const std::vector<int64_t> shape = int4 && like[i].dim() == 2
                                           ? std::vector<int64_t>{like[i].size(0), like[i].size(1) / 2}
                                           : like[i].sizes().vec();
    TORCH_CHECK(!int4 || (like[i].dim() == 2 && like[i].size(1) % kernels::cpu::kInt4Group == 0), what,
                ": int4 weights take layers whose inputs are a multiple of ", kernels::cpu::kInt4Group, ", got '", name,
                "' ", like[i].sizes());
    TORCH_CHECK(w.sizes() == at::IntArrayRef(shape), what, ": expected the frozen '", name, "' ",
                at::IntArrayRef(shape), int4 ? " (the model's shape, two inputs a byte)" : " (the model's shape)",
                ", got ", w.sizes(), " (weights of another model?)");
    if (int4) {
      const at::Tensor& s = get(name + kFrozenScaleSuffix);
      const int64_t groups = like[i].size(1) / kernels::cpu::kInt4Group;
      TORCH_CHECK(s.scalar_type() == at::kHalf && s.dim() == 3 && s.size(0) == w.size(0) && s.size(1) == groups &&
                      s.size(2) == 2,
                  what, ": expected '", name, kFrozenScaleSuffix, "' float16 [", w.size(0), ", ", groups,
                  ", 2] (d and m per group of ", kernels::cpu::kInt4Group, " inputs), got ", s.sizes(), " of ",
                  dtype_words(s.scalar_type()));
      const int64_t bad = kernels::cpu::first_non_finite_int4_scale(s);
      TORCH_CHECK(bad < 0, what, ": expected finite '", name, kFrozenScaleSuffix, "', got an infinity or NaN at row ",
                  bad / std::max<int64_t>(groups, 1), ", group ", bad % std::max<int64_t>(groups, 1),
                  " (a damaged file?)");
      continue;
    }
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
    if (pack.format() == WeightFormat::Int8 || pack.format() == WeightFormat::Int4)
      scales.push_back(weights_by_name.at(prefix + name + kFrozenScaleSuffix));
  }
  pack.freeze_from(weights, scales, biases);
}

}  // namespace torchattn
