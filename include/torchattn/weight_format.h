#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace torchattn {

/// How a linear layer's weights are stored for CPU inference (PackedLinear,
/// MultiHeadAttentionOptions::weight_format, models::LoadOptions::weight_format). The
/// input and the output stay float32 in every format; see docs/models.md (weight
/// formats) for what each costs in speed, memory and perplexity.
/// - `Float32` (default): the weights as they are (a oneDNN-packed copy).
/// - `BFloat16`: 2 bytes a weight, each rounded to bfloat16 (to nearest, ties to even).
/// - `Int8`: 1 byte a weight and a float32 scale per 64 inputs of each output
///   feature, symmetric: w[o, i] ~ scale[o, g] * q[o, i], q in [-127, 127],
///   scale[o, g] = max |w[o, i]| over the group g = i / 64, divided by 127. What the
///   weights multiply: Int8Inputs below.
/// - `DynamicInt8`: PyTorch's own scheme, torch.ao.quantization.quantize_dynamic with
///   its default qconfig, run by LibTorch's quantized engine (x86/fbgemm): each layer's
///   weight int8 with one symmetric scale (max |w| / 127.5), each call's input quantized
///   to 8 bits with its own scale and zero point, int32 sums. The reference: the numbers
///   of a model quantize_dynamic'd in Python. Quantized at load from float32 weights
///   (not saved); a row's output depends on the rows of its call.
/// - `Int4`: 4 bits a weight, asymmetric, a float16 step d and offset m per 32 inputs of
///   each output feature (llama.cpp's Q4_1 block, 0.625 bytes a weight):
///   w[o, i] ~ d[o, g] * q[o, i] + m[o, g], q in [0, 15], d = (max - min) / 15 and m =
///   min over the group, each rounded to float16. Layers whose inputs are a multiple of
///   32. Int8Inputs as for Int8, up to 16 rows (decoding): `Quantized` quantizes each
///   group of 32 inputs to int8 and sums int8 products (llama.cpp's q4_1 x q8_1); more
///   rows, and `Float`, multiply the float32 inputs. A GGUF file's Q4_0 and Q4_1
///   tensors load as these without a value changed.
enum class WeightFormat { Float32, BFloat16, Int8, DynamicInt8, Int4 };

/// What `Int8` weights multiply:
/// - `Float` (default): the float32 inputs, each weight widened to float exactly.
/// - `Quantized`: on an x86 CPU with AVX2 (and AVX-512 VNNI where present), each row's
///   inputs quantized as the weights are (a symmetric scale per 64, max |x| / 127) and
///   int8 products summed in int32, each group then scaled in float32 (`vpdpbusd`:
///   four times the products of a float32 FMA; AVX2's `vpmaddubsw`: twice), in
///   decoding (up to 16 rows: the weights read in place) as in a prefill (more rows:
///   panels of repacked weights); on other CPUs, `Float`. A
///   row's outputs stay its own (the same bits in a prefill, a decoding step or any
///   batch) and a NaN or infinity in a row makes its outputs NaN.
/// models::CausalLM takes `Quantized` (SmolLM2-135M's perplexity +0.6% over float32
/// instead of -0.1%); the encoders keep `Float` (all-MiniLM-L6-v2's embeddings fall
/// to cosine 0.997 with quantized inputs, 0.9994 without). docs/models.md.
enum class Int8Inputs { Float, Quantized };

/// Inputs per int8 scale: the group of WeightFormat::Int8.
inline constexpr int64_t kInt8GroupSize = 64;

/// Inputs per (d, m) pair: the group of WeightFormat::Int4.
inline constexpr int64_t kInt4GroupSize = 32;

/// "float32", "bfloat16", "int8", "dynamic-int8" or "int4".
std::string_view to_string(WeightFormat format);

/// Parses "float32", "bfloat16", "int8", "dynamic-int8" or "int4"; anything else is a
/// c10::Error naming it.
WeightFormat weight_format_from_string(std::string_view name);

std::ostream& operator<<(std::ostream& os, WeightFormat format);

/// An error naming `what` (the option or argument it came through, e.g.
/// "LoadOptions::weight_format") unless `format` is one of the enum's five values (an
/// integer cast to WeightFormat is not).
void check_weight_format(WeightFormat format, std::string_view what);

}  // namespace torchattn
