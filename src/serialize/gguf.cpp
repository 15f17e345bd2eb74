#include <torchattn/gguf.h>

#include "serialize/file_mapping.h"
#include "serialize/gguf_blocks.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace torchattn {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gguf: a little-endian host is required");

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kGgufString = 8, kGgufArray = 9;
constexpr int kGgufMaxDepth = 8;      // arrays of arrays, at most
constexpr uint32_t kGgufMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint64_t kGgufAlignment = 32;
// Metadata values a file may hold in all (arrays' elements each one): a vocabulary of
// 256k tokens with its scores, types and merges is about a million.
constexpr uint64_t kGgufMaxValues = uint64_t{1} << 22;

// The bytes of a GGUF file read in order, each read checked against the end.
class GgufCursor {
 public:
  GgufCursor(const uint8_t* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t at() const { return at_; }
  size_t left() const { return size_ - at_; }

  template <class T>
  T read(const char* what) {
    TORCH_CHECK(left() >= sizeof(T), "gguf: '", file_, "' is truncated: ", what, " at byte ", at_, " needs ", sizeof(T),
                " bytes, ", left(), " are left");
    T v;
    std::memcpy(&v, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }

  std::string string(const char* what) {
    const auto n = read<uint64_t>(what);
    TORCH_CHECK(n <= left(), "gguf: '", file_, "': ", what, " at byte ", at_ - 8, " is ", n,
                " bytes long, past the file's end (", left(), " bytes left)");
    std::string s(reinterpret_cast<const char*>(data_ + at_), static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  const std::string& file_;
};

// The fewest bytes a value of `type` takes (arrays and strings: their counts).
uint64_t gguf_least_bytes(uint32_t type) {
  switch (type) {
    case 0:
    case 1:
    case 7:
      return 1;
    case 2:
    case 3:
      return 2;
    case 4:
    case 5:
    case 6:
      return 4;
    case 10:
    case 11:
    case 12:
    case kGgufString:
      return 8;
    case kGgufArray:
      return 12;
    default:
      return 0;
  }
}

const char* gguf_value_type_name(uint32_t type) {
  static const char* names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                "bool",  "string", "array",  "uint64", "int64",  "float64"};
  return type < 13 ? names[type] : "unknown";
}

GgufValue read_gguf_value(GgufCursor& in, uint32_t type, const std::string& key, const std::string& file, int depth,
                          uint64_t& values) {
  TORCH_CHECK(++values <= kGgufMaxValues, "gguf: '", file, "': key '", key, "' takes the metadata past ",
              kGgufMaxValues, " values, more than any model's (a damaged or hostile file?)");
  GgufValue v;
  v.type = type;
  switch (type) {
    case 0:
      v.integer = in.read<uint8_t>("a uint8");
      break;
    case 1: {
      const auto b = in.read<uint8_t>("an int8");  // two's complement, read as a byte
      v.integer = b < 128 ? int64_t{b} : int64_t{b} - 256;
      break;
    }
    case 2:
      v.integer = in.read<uint16_t>("a uint16");
      break;
    case 3:
      v.integer = in.read<int16_t>("an int16");
      break;
    case 4:
      v.integer = in.read<uint32_t>("a uint32");
      break;
    case 5:
      v.integer = in.read<int32_t>("an int32");
      break;
    case 11:
      v.integer = in.read<int64_t>("an int64");
      break;
    case 10: {
      const auto u = in.read<uint64_t>("a uint64");
      TORCH_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "gguf: '", file, "': key '", key,
                  "' holds the uint64 ", u, ", past what torchattn reads (int64)");
      v.integer = static_cast<int64_t>(u);
      break;
    }
    case 6:
      v.kind = GgufValue::Kind::Float;
      v.number = in.read<float>("a float32");
      break;
    case 12:
      v.kind = GgufValue::Kind::Float;
      v.number = in.read<double>("a float64");
      break;
    case 7: {
      v.kind = GgufValue::Kind::Bool;
      const auto b = in.read<uint8_t>("a bool");
      TORCH_CHECK(b <= 1, "gguf: '", file, "': key '", key, "' holds a bool of ", static_cast<int>(b),
                  ", expected 0 or 1");
      v.boolean = b == 1;
      break;
    }
    case kGgufString:
      v.kind = GgufValue::Kind::String;
      v.string = in.string("a string");
      break;
    case kGgufArray: {
      v.kind = GgufValue::Kind::Array;
      TORCH_CHECK(depth < kGgufMaxDepth, "gguf: '", file, "': key '", key, "' nests arrays more than ", kGgufMaxDepth,
                  " deep");
      const auto element = in.read<uint32_t>("an array's type");
      const uint64_t least = gguf_least_bytes(element);
      TORCH_CHECK(least > 0, "gguf: '", file, "': key '", key, "' is an array of the unknown value type ", element);
      const auto count = in.read<uint64_t>("an array's count");
      TORCH_CHECK(count <= in.left() / least, "gguf: '", file, "': key '", key, "' is an array of ", count, " ",
                  gguf_value_type_name(element), " values, past the file's end (", in.left(), " bytes left)");
      TORCH_CHECK(count <= kGgufMaxValues - values, "gguf: '", file, "': key '", key, "' is an array of ", count,
                  " values, past the ", kGgufMaxValues, " metadata values torchattn holds");
      v.array.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i)
        v.array.push_back(read_gguf_value(in, element, key, file, depth + 1, values));
      break;
    }
    default:
      TORCH_CHECK(false, "gguf: '", file, "': key '", key, "' has the unknown value type ", type,
                  " (0 to 12: uint8 ... float64)");
  }
  return v;
}

}  // namespace

const char* gguf_type_name(uint32_t type) {
  const auto* t = serialize::gguf_traits(type);
  return t != nullptr ? t->name : "unknown";
}

GgufFile GgufFile::open(const std::string& path) {
  auto mapping = std::make_shared<serialize::FileMapping>(path, "gguf");
  GgufFile f = parse(mapping->data(), mapping->size(), path);
  f.owner_ = std::move(mapping);
  return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  GgufCursor in(data, size, f.path_);
  const auto magic = in.read<uint32_t>("the magic");
  TORCH_CHECK(magic == kGgufMagic, "gguf: '", name, "' is not a GGUF file (its first bytes are not 'GGUF')");
  f.version_ = in.read<uint32_t>("the version");
  TORCH_CHECK(f.version_ == 2 || f.version_ == 3, "gguf: '", name, "' is GGUF version ", f.version_,
              "; torchattn reads versions 2 and 3 (version 1 files predate 2023's format: convert them again)");
  const auto tensor_count = in.read<uint64_t>("the tensor count");
  const auto key_count = in.read<uint64_t>("the metadata count");
  // Each key at least its length and type, each tensor at least its name's length, a
  // dimension count, a dimension, a type and an offset.
  TORCH_CHECK(key_count <= in.left() / 12 && tensor_count <= in.left() / 32, "gguf: '", name, "' says ", key_count,
              " metadata keys and ", tensor_count, " tensors, more than its ", size, " bytes can hold");
  f.metadata_.reserve(static_cast<size_t>(key_count));
  uint64_t values = 0;
  for (uint64_t i = 0; i < key_count; ++i) {
    std::string key = in.string("a metadata key");
    const auto type = in.read<uint32_t>("a value type");
    GgufValue value = read_gguf_value(in, type, key, name, 0, values);
    TORCH_CHECK(f.by_key_.emplace(key, f.metadata_.size()).second, "gguf: '", name, "': key '", key, "' appears twice");
    f.metadata_.emplace_back(std::move(key), std::move(value));
  }
  uint64_t alignment = kGgufAlignment;
  if (const GgufValue* a = f.find("general.alignment")) {
    TORCH_CHECK(a->kind == GgufValue::Kind::Integer && a->integer >= 1 && a->integer <= (1 << 20) &&
                    (a->integer & (a->integer - 1)) == 0,
                "gguf: '", name, "': general.alignment is ", a->integer, ", expected a power of 2 up to 2^20");
    alignment = static_cast<uint64_t>(a->integer);
  }
  f.tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = in.string("a tensor's name");
    const auto dims = in.read<uint32_t>("a tensor's dimension count");
    TORCH_CHECK(dims >= 1 && dims <= kGgufMaxDims, "gguf: '", name, "': tensor '", t.name, "' has ", dims,
                " dimensions, expected 1 to ", kGgufMaxDims);
    std::vector<int64_t> ne(dims);
    uint64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const auto n = in.read<uint64_t>("a tensor's dimension");
      TORCH_CHECK(n >= 1 && n <= (uint64_t{1} << 40) && elements <= (uint64_t{1} << 62) / n, "gguf: '", name,
                  "': tensor '", t.name, "' has a dimension of ", n, " (its elements past 2^62, or none)");
      elements *= n;
      ne[d] = static_cast<int64_t>(n);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = in.read<uint32_t>("a tensor's type");
    const serialize::GgufTypeTraits* traits = serialize::gguf_traits(t.type);
    TORCH_CHECK(traits != nullptr && traits->read, "gguf: '", name, "': tensor '", t.name, "' has type ",
                traits != nullptr ? traits->name : std::to_string(t.type).c_str(),
                ", which torchattn does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)");
    TORCH_CHECK(ne[0] % traits->block_size == 0, "gguf: '", name, "': tensor '", t.name, "' of ", traits->name,
                " has rows of ", ne[0], " values, not whole blocks of ", traits->block_size);
    t.bytes = elements / static_cast<uint64_t>(traits->block_size) * static_cast<uint64_t>(traits->type_size);
    t.offset = in.read<uint64_t>("a tensor's offset");
    TORCH_CHECK(t.offset % alignment == 0, "gguf: '", name, "': tensor '", t.name, "' lies at offset ", t.offset,
                ", not a multiple of the alignment ", alignment);
    TORCH_CHECK(f.by_name_.emplace(t.name, f.tensors_.size()).second, "gguf: '", name, "': tensor '", t.name,
                "' appears twice");
    f.tensors_.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  const uint64_t start = (in.at() + alignment - 1) / alignment * alignment;
  TORCH_CHECK(f.tensors_.empty() || start <= size, "gguf: '", name, "' ends at byte ", size,
              " before its data section (byte ", start, ")");
  const uint64_t data_size = f.tensors_.empty() ? 0 : size - start;
  std::vector<size_t> order(f.tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  uint64_t end = 0;
  for (const size_t i : order) {
    const GgufTensorInfo& t = f.tensors_[i];
    TORCH_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset, "gguf: '", name, "': tensor '", t.name, "' (",
                t.bytes, " bytes at offset ", t.offset, ") runs past the file's end (", data_size, " bytes of data)");
    TORCH_CHECK(t.offset >= end, "gguf: '", name, "': tensor '", t.name, "' at offset ", t.offset,
                " overlaps the tensor before it, which ends at ", end);
    end = t.offset + t.bytes;
  }
  f.data_ = f.tensors_.empty() ? data : data + start;
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufValue& GgufFile::checked(const std::string& key, GgufValue::Kind kind, const char* what) const {
  const GgufValue* v = find(key);
  TORCH_CHECK(v != nullptr, "gguf: '", path_, "' has no metadata key '", key, "'");
  TORCH_CHECK(v->kind == kind, "gguf: '", path_, "': key '", key, "' is ", gguf_value_type_name(v->type), ", expected ",
              what);
  return *v;
}

int64_t GgufFile::integer(const std::string& key) const {
  return checked(key, GgufValue::Kind::Integer, "an integer").integer;
}

double GgufFile::number(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v != nullptr && v->kind == GgufValue::Kind::Integer) return static_cast<double>(v->integer);
  return checked(key, GgufValue::Kind::Float, "a number").number;
}

bool GgufFile::boolean(const std::string& key) const { return checked(key, GgufValue::Kind::Bool, "a bool").boolean; }

const std::string& GgufFile::string(const std::string& key) const {
  return checked(key, GgufValue::Kind::String, "a string").string;
}

std::vector<std::string> GgufFile::strings(const std::string& key) const {
  const GgufValue& a = checked(key, GgufValue::Kind::Array, "an array of strings");
  std::vector<std::string> out;
  out.reserve(a.array.size());
  for (const auto& v : a.array) {
    TORCH_CHECK(v.kind == GgufValue::Kind::String, "gguf: '", path_, "': key '", key, "' is an array of ",
                gguf_value_type_name(v.type), ", expected strings");
    out.push_back(v.string);
  }
  return out;
}

std::vector<int64_t> GgufFile::integers(const std::string& key) const {
  const GgufValue& a = checked(key, GgufValue::Kind::Array, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(a.array.size());
  for (const auto& v : a.array) {
    TORCH_CHECK(v.kind == GgufValue::Kind::Integer, "gguf: '", path_, "': key '", key, "' is an array of ",
                gguf_value_type_name(v.type), ", expected integers");
    out.push_back(v.integer);
  }
  return out;
}

std::vector<double> GgufFile::numbers(const std::string& key) const {
  const GgufValue& a = checked(key, GgufValue::Kind::Array, "an array of numbers");
  std::vector<double> out;
  out.reserve(a.array.size());
  for (const auto& v : a.array) {
    TORCH_CHECK(v.kind == GgufValue::Kind::Float || v.kind == GgufValue::Kind::Integer, "gguf: '", path_, "': key '",
                key, "' is an array of ", gguf_value_type_name(v.type), ", expected numbers");
    out.push_back(v.kind == GgufValue::Kind::Float ? v.number : static_cast<double>(v.integer));
  }
  return out;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::checked_tensor(const std::string& name) const {
  const GgufTensorInfo* t = tensor(name);
  TORCH_CHECK(t != nullptr, "gguf: '", path_, "' has no tensor '", name, "'");
  return *t;
}

at::Tensor GgufFile::dequantize(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  return dequantize_rows(name, 0, t.shape[0]);  // parse() refuses tensors of no dimensions
}

at::Tensor GgufFile::dequantize_rows(const std::string& name, int64_t first, int64_t count) const {
  const GgufTensorInfo& t = checked_tensor(name);
  const serialize::GgufTypeTraits& traits = *serialize::gguf_traits(t.type);
  std::vector<int64_t> shape = t.shape;
  const int64_t rows = shape[0];
  TORCH_CHECK(first >= 0 && count >= 0 && first <= rows && count <= rows - first, "gguf: '", path_, "': rows [", first,
              ", ", first + count, ") of tensor '", name, "' past its ", rows, " rows");
  int64_t row_elements = 1;
  for (size_t d = 1; d < shape.size(); ++d) row_elements *= shape[d];
  TORCH_CHECK(count == rows || row_elements % traits.block_size == 0, "gguf: '", path_, "': tensor '", name,
              "' has rows of ", row_elements, " values, not whole blocks of ", traits.block_size,
              ": it is dequantized whole only");
  shape[0] = count;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  const int64_t blocks = out.numel() / traits.block_size;
  const uint8_t* src = data_ + t.offset + first * (row_elements / traits.block_size) * traits.type_size;
  float* dst = out.mutable_data_ptr<float>();
  const uint32_t type = t.type;
  const int64_t grain = std::max<int64_t>(1, 65536 / traits.block_size);
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    serialize::dequantize_blocks(type, src + begin * traits.type_size, end - begin, dst + begin * traits.block_size);
  });
  return out;
}

void GgufFile::release(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  // Only open()'s mapping is ours to give back (owner_ null: the caller's bytes).
  if (owner_ != nullptr) serialize::FileMapping::release(data_ + t.offset, t.bytes);
}

at::Tensor GgufFile::raw(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  auto owner = owner_;
  return at::from_blob(
      const_cast<uint8_t*>(data_ + t.offset), {static_cast<int64_t>(t.bytes)}, [owner](void*) {},
      at::TensorOptions().dtype(at::kByte));
}

}  // namespace torchattn
