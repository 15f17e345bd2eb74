#pragma once

// Reading and writing the safetensors format of Hugging Face checkpoints: an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and
// byte range, then the raw bytes.

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
/// Tensors are CPU tensors over a copy-on-write memory map of the file: nothing is
/// read until used, no second copy is made, writing to a tensor copies only the pages
/// it touches, and the file stays mapped while any tensor of it lives. (A tensor whose
/// bytes are not aligned to its element size is copied.) dtypes: F64, F32, F16, BF16,
/// I64, I32, I16, I8, U8, BOOL.
///
/// A damaged or hostile file is a c10::Error naming the file and the problem: a
/// truncated file, a header length past the end, invalid JSON, an unknown dtype, a
/// shape that disagrees with its byte count, byte ranges out of range, overlapping,
/// reversed or leaving bytes unindexed, a duplicate name.
///
///   auto tensors = torchattn::load_safetensors("SmolLM2/model.safetensors");
///   for (const auto& [name, t] : tensors) { ... }
NamedTensors load_safetensors(const std::string& path);

/// The same from bytes in memory (not copied: the tensors view `data`, which must
/// outlive them). `name` is used in errors. For fuzzing, and for callers that already
/// hold a file's bytes.
NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name = "<memory>");

/// Writes `tensors` (any device, dense, of the dtypes above) in that order, with
/// optional string `metadata` (the header's "__metadata__"), readable by the Python
/// `safetensors` package. The file is written beside `path` and renamed into place.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace torchattn
