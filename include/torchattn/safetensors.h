#pragma once

// Reading and writing Hugging Face's safetensors files; see docs/checkpoints.md.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

/// Named tensors in file order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Reads a `.safetensors` file, or every shard a sharded checkpoint's
/// `model.safetensors.index.json` names (shards in the order the index first names
/// them, each in file order).
///
/// Tensors are CPU tensors over a copy-on-write memory map of the file, which stays
/// mapped while any of them lives. dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8,
/// BOOL. A damaged or hostile file (truncated, a bad header, an unknown dtype, byte
/// ranges that disagree with the shapes, a duplicate name) is a c10::Error naming the
/// file and the problem.
///
///   auto tensors = torchattn::load_safetensors("SmolLM2/model.safetensors");
///   for (const auto& [name, t] : tensors) { ... }
NamedTensors load_safetensors(const std::string& path);

/// The same from bytes in memory (not copied: the tensors view `data`, which must
/// outlive them). `name` is used in errors.
NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name = "<memory>");

/// Writes `tensors` (any device, dense, of the dtypes above) in that order, with
/// optional string `metadata` (the header's "__metadata__"); written beside `path` and
/// renamed into place.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace torchattn
