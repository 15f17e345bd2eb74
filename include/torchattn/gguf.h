#pragma once

// Reading GGUF files, llama.cpp's single-file format: the metadata (architecture, sizes,
// the tokenizer, the chat template) and the tensors, each in one of ggml's block
// formats. See docs/checkpoints.md.
//
//   auto file = torchattn::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf");
//   std::string arch = file.string("general.architecture");          // "llama"
//   int64_t layers = file.integer(arch + ".block_count");
//   at::Tensor w = file.dequantize("blk.0.attn_q.weight");           // float32 [out, in]

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchattn {

/// ggml's tensor types that torchattn reads: each a block of `block_size` values in
/// `type_size` bytes (gguf_type_traits). Others (Q5_0, Q2_K, the IQ types, ...) are an
/// error naming the type and the tensor when the file is opened.
enum class GgufType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

/// "Q4_K", ...; for a code torchattn does not read, ggml's name where it has one.
const char* gguf_type_name(uint32_t type);

/// One metadata value: an integer (any of GGUF's integer types), a float, a bool, a
/// string, or an array of values of one type.
struct GgufValue {
  enum class Kind { Integer, Float, Bool, String, Array };
  Kind kind = Kind::Integer;
  uint32_t type = 0;  // the file's own code: 0 uint8, ..., 8 string, 9 array, ..., 12 float64
  int64_t integer = 0;
  double number = 0.0;
  bool boolean = false;
  std::string string;
  std::vector<GgufValue> array;
};

/// Where a tensor lies, as the file's tensor infos say (checked against the file).
struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> shape;  // PyTorch's order, outermost first: ggml's ne reversed
  uint64_t offset = 0;         // from the start of the data section
  uint64_t bytes = 0;
};

class GgufFile {
 public:
  /// Maps `path` (copy-on-write, never changed) and checks its header, metadata and
  /// tensor infos against each other and the file's size: a truncated or hostile file
  /// (a bad magic, GGUF version 1, counts or lengths past the file, an unknown value
  /// type, arrays nested too deep, a duplicate key or tensor name, more than 4
  /// dimensions, a shape whose elements overflow or whose rows are not whole blocks, an
  /// unaligned or overlapping tensor, a tensor past the end) is a c10::Error naming the
  /// file, and the key or the tensor.
  static GgufFile open(const std::string& path);
  /// The same over bytes in memory (not copied: `data` must outlive the file and its
  /// raw() tensors). `name` is used in errors.
  static GgufFile parse(const uint8_t* data, size_t size, const std::string& name = "<memory>");

  /// The file's GGUF version (2 or 3).
  uint32_t version() const { return version_; }
  /// The metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// The tensors' infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  /// The value of `key`, or null.
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  /// `key`'s value as that kind: a missing key or one of another kind is an error naming
  /// the key, what was expected and what came.
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;  // a float or an integer
  bool boolean(const std::string& key) const;
  const std::string& string(const std::string& key) const;
  std::vector<std::string> strings(const std::string& key) const;
  std::vector<int64_t> integers(const std::string& key) const;
  std::vector<double> numbers(const std::string& key) const;

  /// The info of tensor `name`, or null.
  const GgufTensorInfo* tensor(const std::string& name) const;
  /// Tensor `name`'s values as float32 [shape]: each block dequantized as ggml's
  /// reference code and the gguf Python package do, to the same float32 bits. An
  /// unknown name is an error naming it.
  at::Tensor dequantize(const std::string& name) const;
  /// Rows [first, first + count) of tensor `name` (its outermost dimension) as float32
  /// [count, ...], the same bits as dequantize's: a reader converting a large tensor
  /// piece by piece holds one piece in float32, not the whole. A range past the tensor
  /// is an error naming it.
  at::Tensor dequantize_rows(const std::string& name, int64_t first, int64_t count) const;
  /// Tensor `name`'s bytes as the file holds them: uint8 [bytes], over the mapping.
  at::Tensor raw(const std::string& name) const;
  /// Tensor `name` [out, in] of any type as int4 weights, WeightFormat::Int4's {data
  /// uint8 [out, in / 2], scale float16 [out, in / 32, 2]} (x = d q + m; see
  /// torchattn::PackedLinear). Q4_0, Q4_1 and Q4_K (int4_type) keep every 4-bit value as
  /// the file holds it: Q4_0's and Q4_1's blocks exactly (Q4_0's m is -8 d); Q4_K's
  /// sub-blocks of 32 with their d sc and -dmin m each rounded to float16 (at most 2^-11
  /// of itself), so a value differs from dequantize's by at most 2^-11 (15 |d sc| +
  /// |dmin m|). The other types are quantized from their dequantize values as
  /// PackedLinear freezes float32 weights to int4 (each group of 32 by its minimum and
  /// range / 15), a slice of rows at a time, so a large tensor is never whole in
  /// float32. A tensor that is not [out, in], whose inputs are not a multiple of 32, or
  /// whose scales float16 cannot hold is an error naming it.
  std::pair<at::Tensor, at::Tensor> int4_weights(const std::string& name) const;
  /// Whether int4_weights keeps the 4-bit values of tensors of type code `type` (Q4_0,
  /// Q4_1, Q4_K).
  static bool int4_type(uint32_t type);
  /// Tensor `name` [out, in] of any type as int8 weights, WeightFormat::Int8's {data int8
  /// [out, in], scale float32 [out, ceil(in / 64)]}: its dequantize values quantized
  /// (each group of 64 inputs by its largest |value| / 127), 2048 rows at a time, so a
  /// large table is never whole in float32. A tensor that is not [out, in] is an error
  /// naming it.
  std::pair<at::Tensor, at::Tensor> int8_weights(const std::string& name) const;
  /// Gives back the memory pages that hold tensor `name`'s bytes, for a reader done with
  /// them: a model converted tensor by tensor does not keep the whole file resident
  /// beside its own copy. The bytes stay readable (read from the file again if touched).
  /// Nothing for a parse()d file: those bytes are the caller's.
  void release(const std::string& name) const;

 private:
  GgufFile() = default;
  const GgufTensorInfo& checked_tensor(const std::string& name) const;
  const GgufValue& checked(const std::string& key, GgufValue::Kind kind, const char* what) const;

  std::string path_;
  std::shared_ptr<const void> owner_;  // keeps the mapping alive (null: the caller's bytes)
  const uint8_t* data_ = nullptr;      // the data section
  uint32_t version_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> by_key_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace torchattn
