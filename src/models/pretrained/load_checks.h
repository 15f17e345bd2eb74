#pragma once

// LoadOptions' values, checked before a folder is read: each message names the option,
// what it takes and what came (rather than LibTorch's words from deep inside `to`).

#include <torchattn/models/load_options.h>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace torchattn::models::pretrained {

inline void check_load_options(const LoadOptions& options) {
  const c10::ScalarType dtype = options.dtype();
  TORCH_CHECK(dtype == c10::kFloat || dtype == c10::kBFloat16 || dtype == c10::kHalf,
              "LoadOptions::dtype: expected float32, bfloat16 or float16 (the floating-point type of the weights and "
              "of the computations), got ",
              dtype);
  torchattn::check_weight_format(options.weight_format(), "LoadOptions::weight_format");
  const c10::Device device = options.device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "LoadOptions::device: expected cpu or cuda, got ", device);
  if (device.is_cuda()) {
    const int64_t count = static_cast<int64_t>(at::getNumGPUs());
    TORCH_CHECK(count > 0, "LoadOptions::device: expected cpu, or cuda with a CUDA device, got ", device,
                " while this process sees no CUDA device (a CPU-only LibTorch, or no GPU)");
    TORCH_CHECK(!device.has_index() || device.index() < count,
                "LoadOptions::device: expected a CUDA device index "
                "below ",
                count, " (the CUDA devices this process sees), got ", device);
  }
  if (options.weight_format() != torchattn::WeightFormat::Float32) {
    TORCH_CHECK(device.is_cpu() && dtype == c10::kFloat,
                "LoadOptions::weight_format: ", torchattn::to_string(options.weight_format()),
                " weights run on the CPU with float32 activations (device cpu, dtype float32), got device ", device,
                " and dtype ", dtype, " (on CUDA, load with dtype bfloat16 instead)");
  }
  if (options.context_length()) {
    TORCH_CHECK(*options.context_length() >= 1,
                "LoadOptions::context_length: expected at least 1 token (or unset, "
                "for the config's max_position_embeddings), got ",
                *options.context_length());
  }
}

/// The context a model is made for: LoadOptions::context_length, or the model's own
/// (`model_max`) up to 4096; more than the model's own is an error naming where that
/// came from (`source`: "the max_position_embeddings of 'DIR/config.json'").
inline int64_t context_length_for(const LoadOptions& options, int64_t model_max, std::string_view source) {
  const int64_t context = options.context_length().value_or(std::min<int64_t>(model_max, 4096));
  TORCH_CHECK(context <= model_max, "LoadOptions::context_length: expected at most ", model_max, " (", source,
              "), got ", context);
  return context;
}

}  // namespace torchattn::models::pretrained
