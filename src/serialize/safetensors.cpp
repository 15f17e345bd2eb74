#include <torchattn/safetensors.h>

#include "serialize/file_mapping.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>

namespace torchattn {

namespace {

using json = nlohmann::ordered_json;

// The 8-byte header length is read as little-endian; the tensor bytes are handed to
// ATen as they are, which needs a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors: a little-endian host is required");

// A header larger than this is refused (the format's own readers use 100 MB).
constexpr uint64_t kMaxHeader = 100ull << 20;

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

at::ScalarType dtype_of(const std::string& file, const std::string& tensor, const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      return d.type;
    }
  }
  TORCH_CHECK(false, "safetensors: '", file, "': tensor '", tensor, "' has dtype '", name,
              "', expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
}

const char* name_of(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) {
      return d.name;
    }
  }
  TORCH_CHECK(false, "save_safetensors: dtype ", type, " has no safetensors name");
}

struct Entry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}

// The header's entries, checked against each other and against `data_size` bytes
// of tensor data, in file order (by byte offset).
std::vector<Entry> read_header(const std::string& file, const char* header, size_t length, uint64_t data_size) {
  json h;
  try {
    h = json::parse(header, header + length);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "safetensors: '", file, "': the header is not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(h.is_object(), "safetensors: '", file, "': expected the header to be a JSON object, got ", h.type_name());
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (const auto& [key, value] : h.items()) {
    if (key == "__metadata__") {
      TORCH_CHECK(value.is_object(), "safetensors: '", file, "': expected __metadata__ to be an object of strings");
      for (const auto& [k, v] : value.items()) {
        TORCH_CHECK(v.is_string(), "safetensors: '", file, "': __metadata__ entry '", k, "' is not a string");
      }
      continue;
    }
    TORCH_CHECK(names.insert(key).second, "safetensors: '", file, "': tensor '", key, "' appears twice");
    TORCH_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                    value.contains("data_offsets"),
                "safetensors: '", file, "': tensor '", key, "' needs dtype, shape and data_offsets");
    const auto& dtype = value["dtype"];
    const auto& shape = value["shape"];
    const auto& offsets = value["data_offsets"];
    TORCH_CHECK(dtype.is_string(), "safetensors: '", file, "': tensor '", key, "' has a dtype that is not a string");
    Entry e;
    e.name = key;
    e.dtype = dtype_of(file, key, dtype.get<std::string>());
    TORCH_CHECK(shape.is_array(), "safetensors: '", file, "': tensor '", key, "' has a shape that is not a list");
    uint64_t elements = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      TORCH_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), "safetensors: '", file,
                  "': tensor '", key, "' has a shape entry that is not a non-negative integer: ", d.dump());
      const uint64_t n = d.get<uint64_t>();
      TORCH_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "safetensors: '", file,
                  "': tensor '", key, "' has a dimension too large: ", n);
      overflow = overflow || (n != 0 && elements > std::numeric_limits<uint64_t>::max() / n);
      elements *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    TORCH_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                "safetensors: '", file, "': tensor '", key,
                "' needs data_offsets [begin, end] of non-negative integers");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    TORCH_CHECK(e.begin <= e.end, "safetensors: '", file, "': tensor '", key, "' has data_offsets [", e.begin, ", ",
                e.end, "] that run backwards");
    TORCH_CHECK(e.end <= data_size, "safetensors: '", file, "': tensor '", key, "' has data_offsets [", e.begin, ", ",
                e.end, "] past the ", data_size, " bytes of data");
    const uint64_t item = at::elementSize(e.dtype);
    TORCH_CHECK(!overflow && elements <= std::numeric_limits<uint64_t>::max() / item &&
                    elements * item == e.end - e.begin,
                "safetensors: '", file, "': tensor '", key, "' of shape ", c10::IntArrayRef(e.shape), " and dtype ",
                dtype.get<std::string>(), " needs ", (overflow ? 0 : elements * item), " bytes, its data_offsets hold ",
                e.end - e.begin);
    entries.push_back(std::move(e));
  }
  // The byte ranges tile the data: no overlap, no unindexed bytes (which could hide
  // anything).
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  uint64_t at = 0;
  for (const auto& e : entries) {
    TORCH_CHECK(e.begin >= at, "safetensors: '", file, "': tensor '", e.name, "' at bytes [", e.begin, ", ", e.end,
                ") overlaps the tensor before it, which ends at ", at);
    TORCH_CHECK(e.begin == at, "safetensors: '", file, "': bytes [", at, ", ", e.begin,
                ") of the data belong to no tensor");
    at = e.end;
  }
  TORCH_CHECK(at == data_size, "safetensors: '", file, "': bytes [", at, ", ", data_size,
              ") of the data belong to no tensor");
  return entries;
}

// The tensors of one file's bytes; `owner` keeps the bytes alive (null: the caller does).
NamedTensors tensors_of(const uint8_t* data, size_t size, const std::string& file, const std::shared_ptr<void>& owner) {
  TORCH_CHECK(size >= 8, "safetensors: '", file, "' is truncated: ", size,
              " bytes, less than the 8-byte header length");
  const uint64_t length = read_u64_le(data);
  TORCH_CHECK(length <= kMaxHeader, "safetensors: '", file, "': the header length ", length, " is over the ",
              kMaxHeader, "-byte limit");
  TORCH_CHECK(length <= size - 8, "safetensors: '", file, "': the header length ", length, " runs past the end of the ",
              size, "-byte file");
  const uint8_t* tensor_data = data + 8 + length;
  const uint64_t data_size = size - 8 - length;
  const auto entries = read_header(file, reinterpret_cast<const char*>(data + 8), length, data_size);
  NamedTensors out;
  out.reserve(entries.size());
  for (const auto& e : entries) {
    const uint8_t* p = tensor_data + e.begin;
    const auto options = at::TensorOptions().dtype(e.dtype);
    at::Tensor t;
    if (reinterpret_cast<uintptr_t>(p) % at::elementSize(e.dtype) != 0 || e.begin == e.end) {
      t = at::empty(e.shape, options);  // unaligned (or empty): copied
      if (e.end > e.begin) {
        std::memcpy(t.data_ptr(), p, e.end - e.begin);
      }
    } else if (owner) {
      const size_t n = e.end - e.begin;
      t = at::from_blob(
          const_cast<uint8_t*>(p), e.shape,
          [owner, n](void* data) { serialize::FileMapping::release(static_cast<const uint8_t*>(data), n); }, options);
    } else {
      t = at::from_blob(const_cast<uint8_t*>(p), e.shape, options);
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

NamedTensors load_file(const std::string& path) {
  auto mapping = std::make_shared<serialize::FileMapping>(path, "safetensors");
  return tensors_of(mapping->data(), mapping->size(), path, mapping);
}

NamedTensors load_index(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "safetensors: cannot open '", path, "'");
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "safetensors: '", path, "' is not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "safetensors: '",
              path, "': expected an index with a weight_map object");
  const auto dir = std::filesystem::path(path).parent_path();
  std::vector<std::string> shards;
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, file] : index["weight_map"].items()) {
    TORCH_CHECK(file.is_string(), "safetensors: '", path, "': weight_map entry '", name, "' is not a file name");
    const std::string shard = file.get<std::string>();
    TORCH_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(), "safetensors: '", path,
                "': weight_map entry '", name, "' names '", shard, "', expected a file beside the index");
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) {
      shards.push_back(shard);
    }
    shard_of[name] = shard;
  }
  NamedTensors out;
  std::set<std::string> seen;
  for (const auto& shard : shards) {
    for (auto& [name, t] : load_file((dir / shard).string())) {
      const auto it = shard_of.find(name);
      TORCH_CHECK(it != shard_of.end() && it->second == shard, "safetensors: shard '", shard, "' holds tensor '", name,
                  "', which '", path, "' ", (it == shard_of.end() ? "does not name" : "places in " + it->second));
      seen.insert(name);
      out.emplace_back(name, std::move(t));
    }
  }
  for (const auto& [name, shard] : shard_of) {
    TORCH_CHECK(seen.count(name) != 0, "safetensors: '", path, "' places tensor '", name, "' in '", shard,
                "', which does not hold it");
  }
  return out;
}

}  // namespace

NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name) {
  return tensors_of(data, size, name, nullptr);
}

NamedTensors load_safetensors(const std::string& path) {
  if (path.ends_with(".index.json")) {
    return load_index(path);
  }
  return load_file(path);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = metadata;
  }
  std::vector<at::Tensor> data;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != "__metadata__" && names.insert(name).second, "save_safetensors: tensor name '", name,
                "' is reserved or appears twice");
    TORCH_CHECK(tensor.defined() && tensor.layout() == at::kStrided, "save_safetensors: tensor '", name,
                "' must be a defined, dense tensor");
    at::Tensor t = tensor.detach().cpu().contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", name_of(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // tensor data 8-byte aligned
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(out, "save_safetensors: cannot write '", tmp, "'");
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) {
      length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    }
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : data) {
      out.write(static_cast<const char*>(t.const_data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    out.flush();
    TORCH_CHECK(out.good(), "save_safetensors: writing '", tmp, "' failed");
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: cannot rename '", tmp, "' to '", path,
              "': ", std::strerror(errno));
}

}  // namespace torchattn
