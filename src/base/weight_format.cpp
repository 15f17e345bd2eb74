#include <torchattn/weight_format.h>

#include <c10/util/Exception.h>

#include <ostream>

namespace torchattn {

std::string_view to_string(WeightFormat format) {
  switch (format) {
    case WeightFormat::Float32:
      return "float32";
    case WeightFormat::BFloat16:
      return "bfloat16";
    case WeightFormat::Int8:
      return "int8";
    case WeightFormat::DynamicInt8:
      return "dynamic-int8";
    case WeightFormat::Int4:
      return "int4";
  }
  TORCH_CHECK(false, "torchattn::WeightFormat: unknown value ", static_cast<int>(format));
}

WeightFormat weight_format_from_string(std::string_view name) {
  for (WeightFormat f : {WeightFormat::Float32, WeightFormat::BFloat16, WeightFormat::Int8, WeightFormat::DynamicInt8,
                         WeightFormat::Int4}) {
    if (name == to_string(f)) return f;
  }
  TORCH_CHECK(false, "weight format: expected one of float32, bfloat16, int8, dynamic-int8, int4, got '",
              std::string(name), "'");
}

std::ostream& operator<<(std::ostream& os, WeightFormat format) { return os << to_string(format); }

void check_weight_format(WeightFormat format, std::string_view what) {
  const auto v = static_cast<int>(format);
  TORCH_CHECK(v >= static_cast<int>(WeightFormat::Float32) && v <= static_cast<int>(WeightFormat::Int4), what,
              ": expected WeightFormat::Float32, BFloat16, Int8, DynamicInt8 or Int4, got the value ", v,
              " (an integer cast to WeightFormat?)");
}

}  // namespace torchattn
