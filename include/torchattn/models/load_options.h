#pragma once

// Where and how a model folder is loaded (LanguageModel, SentenceEncoder). Each value is
// checked when a folder is loaded: another is a c10::Error naming the option
// ("LoadOptions::dtype: expected float32, bfloat16 or float16 (...), got Int").

#include <torchattn/weight_format.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>

namespace torchattn::models {

struct LoadOptions {
  /// The device of the weights and of every computation: cpu, or cuda (a device this
  /// process sees). Default: the CPU.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// float32 (default), bfloat16 or float16.
  TORCH_ARG(c10::ScalarType, dtype) = c10::kFloat;
  /// Decoders: the most tokens a sequence may hold (prompt and new tokens), the size
  /// of the KV caches, in [1, the config's max_position_embeddings]. Default: unset,
  /// the config's max_position_embeddings, at most 4096. Encoders: ignored (their
  /// positions bound a text), but still at least 1.
  TORCH_ARG(std::optional<int64_t>, context_length) = std::nullopt;
  /// On the CPU in float32: run the linear layers on a oneDNN-packed copy of their
  /// weights (torchattn::PackedLinear; a second copy of them in memory, made at the
  /// first call), faster for every product of more than a few rows; equal to the
  /// unpacked products within float32 rounding. Default: unset: SentenceEncoder packs
  /// (each sentence is tens of rows), LanguageModel does not (one sequence's decoding
  /// is a row at a time, and the copy doubles a decoder's memory; the serving engine
  /// packs, see models::Engine).
  TORCH_ARG(std::optional<bool>, pack_weights) = std::nullopt;
  /// How the linear layers keep their weights (see torchattn::WeightFormat; decoders:
  /// the output head and a tied embedding table too; encoders: not the embeddings):
  /// bfloat16 or int8 quantize each after loading and free its float32 copy, for 2x or
  /// 4x less memory and faster decoding (docs/models.md: weight formats). Only
  /// inference then: needs the CPU and dtype float32 (the activations' type).
  /// Default: Float32.
  TORCH_ARG(torchattn::WeightFormat, weight_format) = torchattn::WeightFormat::Float32;
  /// A folder that save_pretrained wrote: check each tensor against the checksum
  /// recorded beside it (torchattn_weights.json), so that a damaged or changed file is
  /// an error naming the tensor, not a model that generates garbage. It reads every
  /// byte of the weights once at load (docs/models.md gives the cost); false skips it.
  /// Other folders have no checksums. Default: true.
  TORCH_ARG(bool, verify_weights) = true;
};

}  // namespace torchattn::models
