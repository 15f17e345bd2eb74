#include <torchattn/checksum.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

namespace torchattn {

namespace {

// The specification's constants and steps; names as it gives them.
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "xxh64: the lanes are read as little-endian words");

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr uint64_t round(uint64_t acc, uint64_t lane) { return rotl(acc + lane * kPrime2, 31) * kPrime1; }

constexpr uint64_t merge(uint64_t acc, uint64_t lane) { return (acc ^ round(0, lane)) * kPrime1 + kPrime4; }

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  TORCH_CHECK(data != nullptr || size == 0, "xxh64: expected data for ", size, " bytes, got a null pointer");
  const auto* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + size;
  uint64_t acc;
  if (size >= 32) {
    // Four lanes, each fed every fourth 8-byte word of each 32-byte stripe.
    uint64_t v1 = seed + kPrime1 + kPrime2, v2 = seed + kPrime2, v3 = seed, v4 = seed - kPrime1;
    for (const uint8_t* const last = end - 32; p <= last; p += 32) {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
    }
    acc = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    acc = merge(merge(merge(merge(acc, v1), v2), v3), v4);
  } else {
    acc = seed + kPrime5;
  }
  acc += static_cast<uint64_t>(size);
  for (; end - p >= 8; p += 8) acc = rotl(acc ^ round(0, read64(p)), 27) * kPrime1 + kPrime4;
  if (end - p >= 4) {
    acc = rotl(acc ^ (static_cast<uint64_t>(read32(p)) * kPrime1), 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) acc = rotl(acc ^ (static_cast<uint64_t>(*p) * kPrime5), 11) * kPrime1;
  acc ^= acc >> 33;
  acc *= kPrime2;
  acc ^= acc >> 29;
  acc *= kPrime3;
  acc ^= acc >> 32;
  return acc;
}

std::vector<uint64_t> tensor_xxh64(const std::vector<at::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined() && t.is_cpu() && t.layout() == at::kStrided && !t.is_nested(),
                "tensor_xxh64: expected dense CPU tensors, got tensor ", i, " ",
                t.defined() ? t.toString() : std::string("undefined"));
  }
  std::vector<uint64_t> out(tensors.size());
  // The hash of one tensor is a single stream, so the threads share out whole tensors,
  // the largest first, each taking the next when done: a model's embedding table
  // alone can be a quarter of its bytes.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].nbytes() > tensors[b].nbytes(); });
  std::atomic<size_t> next{0};
  const auto workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tensors.size()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (size_t k = next++; k < order.size(); k = next++) {
      const at::Tensor t = tensors[order[k]].contiguous();
      out[order[k]] = xxh64(t.const_data_ptr(), t.nbytes());
    }
  });
  return out;
}

std::string checksum_hex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) s[i] = kDigits[value & 15];
  return s;
}

uint64_t checksum_from_hex(const std::string& hex, const std::string& what) {
  uint64_t v = 0;
  bool ok = hex.size() == 16;
  for (size_t i = 0; ok && i < hex.size(); ++i) {
    const char c = hex[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    ok = d >= 0;
    v = (v << 4) | static_cast<uint64_t>(d < 0 ? 0 : d);
  }
  TORCH_CHECK(ok, what, ": expected 16 lowercase hex digits (an xxh64 checksum), got '",
              hex.size() > 40 ? hex.substr(0, 40) + "..." : hex, "'");
  return v;
}

}  // namespace torchattn
