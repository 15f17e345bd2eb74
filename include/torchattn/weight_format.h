#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace torchattn {

/// How a linear layer's weights are stored for CPU inference (PackedLinear,
/// MultiHeadAttentionOptions::weight_format, models::LoadOptions::weight_format). The
/// input, the sums and the output stay float32 in every format; see docs/models.md
/// (weight formats) for what each costs in speed, memory and perplexity.
/// - `Float32` (default): the weights as they are (a oneDNN-packed copy).
/// - `BFloat16`: 2 bytes a weight, each rounded to bfloat16 (to nearest, ties to even).
/// - `Int8`: 1 byte a weight and a float32 scale per 64 inputs of each output
///   feature, symmetric: w[o, i] ~ scale[o, g] * q[o, i], q in [-127, 127],
///   scale[o, g] = max |w[o, i]| over the group g = i / 64, divided by 127.
enum class WeightFormat { Float32, BFloat16, Int8 };

/// Inputs per int8 scale: the group of WeightFormat::Int8.
inline constexpr int64_t kInt8GroupSize = 64;

/// "float32", "bfloat16" or "int8".
std::string_view to_string(WeightFormat format);

/// Parses "float32", "bfloat16" or "int8"; anything else is a c10::Error naming it.
WeightFormat weight_format_from_string(std::string_view name);

std::ostream& operator<<(std::ostream& os, WeightFormat format);

}  // namespace torchattn
