#pragma once

// Where and how a model folder is loaded (LanguageModel, SentenceEncoder).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>

namespace torchattn::models {

struct LoadOptions {
  /// The device of the weights and of every computation. Default: the CPU.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// float32 (default), bfloat16 or float16.
  TORCH_ARG(c10::ScalarType, dtype) = c10::kFloat;
  /// Decoders: the most tokens a sequence may hold (prompt and new tokens), the size
  /// of the KV caches. Default: unset, the config's max_position_embeddings, at most
  /// 4096. Encoders: ignored (their positions bound a text).
  TORCH_ARG(std::optional<int64_t>, context_length) = std::nullopt;
};

} // namespace torchattn::models
