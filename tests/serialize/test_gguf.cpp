// GgufFile (include/torchattn/gguf.h) on files built here byte by byte: a valid one read
// back (metadata, shapes in PyTorch's order, F32 and Q8_0 values), then every way a
// damaged or hostile file can be wrong, each a c10::Error naming the problem and never a
// crash: every truncation, the magic, the version, counts and lengths past the end, an
// unknown value type, arrays nested too deep or too long, a duplicate key or tensor,
// dimensions (none, too many, zero, overflowing), a type torchattn does not read, rows
// that are not whole blocks, an unaligned, overlapping or out-of-bounds tensor. The
// files of llama.cpp's own writer are gguf_checks.cpp's (ctest -R gguf).

#include "common/expect_error.h"
#include "common/int4_values.h"
#include "common/temp_path.h"

#include <torchattn/gguf.h>
#include <torchattn/packed_linear.h>

#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

// A named namespace: this file shares a unity-build unit with test_safetensors.cpp.
namespace gguf_test {

// The bytes of a GGUF file, little-endian, as gguf's writer lays them out.
class Bytes {
 public:
  template <class T>
  Bytes& put(T v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& v) {
    put<uint64_t>(v.size());
    s_ += v;
    return *this;
  }
  Bytes& raw(const std::string& v) {
    s_ += v;
    return *this;
  }
  Bytes& pad(size_t alignment) {
    while (s_.size() % alignment != 0) s_.push_back('\0');
    return *this;
  }
  const std::string& bytes() const { return s_; }
  size_t size() const { return s_.size(); }

 private:
  std::string s_;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml's order, innermost first
  uint32_t type;
  uint64_t offset;
};

// A file: the header, `kv` (each already encoded: key, type, value), the tensor infos,
// padding to `alignment`, then `data`. Counts as given unless overridden.
std::string file_of(const std::vector<std::string>& kv, const std::vector<TensorInfo>& tensors, const std::string& data,
                    size_t alignment = 32, int64_t kv_count = -1, int64_t tensor_count = -1, uint32_t version = 3) {
  Bytes b;
  b.raw("GGUF").put<uint32_t>(version);
  b.put<uint64_t>(tensor_count >= 0 ? static_cast<uint64_t>(tensor_count) : tensors.size());
  b.put<uint64_t>(kv_count >= 0 ? static_cast<uint64_t>(kv_count) : kv.size());
  for (const auto& e : kv) b.raw(e);
  for (const auto& t : tensors) {
    b.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (const uint64_t n : t.ne) b.put<uint64_t>(n);
    b.put<uint32_t>(t.type).put<uint64_t>(t.offset);
  }
  b.pad(alignment).raw(data);
  return b.bytes();
}

std::string kv_string(const std::string& key, const std::string& value) {
  return Bytes().str(key).put<uint32_t>(8).str(value).bytes();
}
template <class T>
std::string kv_number(const std::string& key, uint32_t type, T value) {
  return Bytes().str(key).put<uint32_t>(type).put<T>(value).bytes();
}

torchattn::GgufFile parse(const std::string& bytes) {
  return torchattn::GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f.gguf");
}

// F32 [2, 3] (ne {3, 2}) of 0..5, then Q8_0 [1, 32] of d = 0.5 and q = -16..15.
std::string tensor_data() {
  Bytes d;
  for (int i = 0; i < 6; ++i) d.put<float>(static_cast<float>(i));
  d.pad(32);
  d.put<uint16_t>(c10::Half(0.5f).x);
  for (int i = 0; i < 32; ++i) d.put<int8_t>(static_cast<int8_t>(i - 16));
  return d.bytes();
}

std::vector<TensorInfo> two_tensors() { return {{"a.weight", {3, 2}, 0, 0}, {"b.weight", {32, 1}, 8, 32}}; }

std::string valid_file() {
  return file_of({kv_string("general.architecture", "llama"), kv_number<uint32_t>("llama.block_count", 4, 30)},
                 two_tensors(), tensor_data());
}

TEST(Gguf, AValidFileReadsBack) {
  const std::string bytes = valid_file();
  const auto f = parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.string("general.architecture"), "llama");
  EXPECT_EQ(f.integer("llama.block_count"), 30);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensor("a.weight")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(torch::equal(f.dequantize("a.weight"), torch::arange(6, torch::kFloat).view({2, 3})));
  EXPECT_TRUE(torch::equal(f.dequantize("b.weight"), (torch::arange(32, torch::kFloat) - 16).mul(0.5).view({1, 32})));
  EXPECT_STREQ(torchattn::gguf_type_name(12), "Q4_K");
  EXPECT_STREQ(torchattn::gguf_type_name(4), "unknown");
}

// Q8_0 [3, 64] (ne {64, 3}): row r's block j has d = r + 1 + j / 4 and q = i - 16 + r;
// then Q8_0 [64] (ne {64}), one row of two blocks.
std::string rows_file() {
  Bytes d;
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < 2; ++j) {
      d.put<uint16_t>(c10::Half(static_cast<float>(r + 1) + static_cast<float>(j) / 4).x);
      for (int i = 0; i < 32; ++i) d.put<int8_t>(static_cast<int8_t>(i - 16 + r));
    }
  }
  d.pad(32);
  for (int j = 0; j < 2; ++j) {
    d.put<uint16_t>(c10::Half(1.0f).x);
    for (int i = 0; i < 32; ++i) d.put<int8_t>(static_cast<int8_t>(i));
  }
  return file_of({}, {{"m.weight", {64, 3}, 8, 0}, {"v.weight", {64}, 8, 224}}, d.bytes());
}

// dequantize_rows is dequantize's rows, to the bit; a range past the tensor, or a part
// of a tensor whose rows are not whole blocks, is an error naming it.
TEST(Gguf, DequantizeRowsIsThoseRowsOfTheWhole) {
  const std::string bytes = rows_file();
  const auto f = parse(bytes);
  const at::Tensor whole = f.dequantize("m.weight");
  ASSERT_EQ(whole.sizes(), (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(whole[2][33].item<float>(), 3.25f * static_cast<float>(1 - 16 + 2));
  for (int64_t first = 0; first <= 3; ++first) {
    for (int64_t count = 0; first + count <= 3; ++count) {
      EXPECT_TRUE(torch::equal(f.dequantize_rows("m.weight", first, count), whole.narrow(0, first, count)))
          << first << " " << count;
    }
  }
  EXPECT_TRUE(torch::equal(f.dequantize_rows("v.weight", 0, 64), f.dequantize("v.weight")));
  expect_error([&] { f.dequantize_rows("m.weight", 2, 2); },
               "gguf: 'f.gguf': rows [2, 4) of tensor 'm.weight' past its 3 rows");
  expect_error([&] { f.dequantize_rows("m.weight", -1, 1); }, "rows [-1, 0) of tensor 'm.weight' past its 3 rows");
  expect_error([&] { f.dequantize_rows("v.weight", 0, 32); },
               "gguf: 'f.gguf': tensor 'v.weight' has rows of 1 values, not whole blocks of 32: it is dequantized "
               "whole only");
  expect_error([&] { f.dequantize_rows("w.weight", 0, 1); }, "gguf: 'f.gguf' has no tensor 'w.weight'");
}

// int8_weights is int8's quantization of dequantize's values, the same bytes and scales
// as a layer frozen to Int8 makes, also past its 2048-row slices (4100 rows: two whole
// slices and a part); a vector is refused by name.
TEST(Gguf, Int8WeightsAreTheValuesAsInt8QuantizesThem) {
  constexpr int64_t kRows = 4100, kIn = 96;
  Bytes d;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kIn; ++i) {
      d.put<float>(static_cast<float>((r * 37 + i * 11) % 255 - 127) * (0.001f + static_cast<float>(r % 7)));
    }
  }
  const std::string bytes = file_of({}, {{"t.weight", {kIn, kRows}, 0, 0}}, d.bytes());
  const auto f = parse(bytes);
  const auto expect_like_a_frozen_layer = [&](const torchattn::GgufFile& file, const std::string& name) {
    torchattn::PackedLinear layer(torchattn::WeightFormat::Int8);
    layer.freeze({file.dequantize(name)});
    const auto [want_q, want_s] = layer.frozen_weight(0);
    const auto [q, s] = file.int8_weights(name);
    EXPECT_EQ(q.scalar_type(), at::kChar);
    EXPECT_EQ(s.scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::equal(q, want_q)) << name;
    EXPECT_TRUE(torch::equal(s, want_s)) << name;
  };
  expect_like_a_frozen_layer(f, "t.weight");
  const std::string rows = rows_file();
  const auto g = parse(rows);
  expect_like_a_frozen_layer(g, "m.weight");  // Q8_0
  expect_error([&] { g.int8_weights("v.weight"); },
               "gguf: 'f.gguf': tensor 'v.weight' has 1 dimensions; int8_weights takes [out, in]");
}

// Bytes from a fixed sequence (a linear congruential generator).
std::string pseudo_bytes(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  for (auto& c : out) {
    seed = seed * 1664525u + 1013904223u;
    c = static_cast<char>(seed >> 24);
  }
  return out;
}

// int4_weights of a type other than Q4_0, Q4_1 and Q4_K is int4's quantization of
// dequantize's values, the same bytes and scales as a layer frozen to Int4 makes, across
// its slices of rows (a Q8_0 [70, 32768]: slices of 32 rows, the last of 6); inputs
// that are not a multiple of 32 are refused by name.
TEST(Gguf, Int4WeightsOfOtherTypesAreTheValuesAsInt4QuantizesThem) {
  constexpr int64_t kRows = 70, kIn = 32768;
  Bytes d;
  for (int64_t b = 0; b < kRows * kIn / 32; ++b) {  // Q8_0: d, 32 int8
    d.put<uint16_t>(c10::Half(0.001f * static_cast<float>(b % 13 + 1)).x);
    d.raw(pseudo_bytes(32, static_cast<uint32_t>(b)));
  }
  d.pad(32);
  const uint64_t odd_at = d.size();
  for (int i = 0; i < 2 * 40; ++i) d.put<float>(static_cast<float>(i));
  const std::string bytes = file_of({}, {{"q8", {kIn, kRows}, 8, 0}, {"odd", {40, 2}, 0, odd_at}}, d.bytes());
  const auto f = parse(bytes);
  torchattn::PackedLinear layer(torchattn::WeightFormat::Int4);
  layer.freeze({f.dequantize("q8")});
  const auto [want_q, want_s] = layer.frozen_weight(0);
  const auto [q, s] = f.int4_weights("q8");
  EXPECT_TRUE(torch::equal(q, want_q));
  EXPECT_TRUE(torch::equal(s, want_s));
  expect_error([&] { f.int4_weights("odd"); },
               "gguf: 'f.gguf': tensor 'odd' of F32 [2, 40] has 40 inputs, not a multiple of 32: int4 cannot hold "
               "it (int8 can)");
}

// Q4_0 [2, 64], Q4_1 [2, 32] and Q4_K [2, 256] as int4 weights: Q4_0's and Q4_1's values
// to the bit, Q4_K's within float16's rounding of each group's d sc and dmin m; a vector
// is refused by name.
TEST(Gguf, Int4WeightsKeepTheFilesFourBitValues) {
  Bytes d;
  for (int b = 0; b < 4; ++b) {  // Q4_0: d, 16 bytes
    d.put<uint16_t>(c10::Half(0.125f * static_cast<float>(b + 1)).x).raw(pseudo_bytes(16, 10 + b));
  }
  d.pad(32);
  const uint64_t q4_1_at = d.size();
  for (int b = 0; b < 2; ++b) {  // Q4_1: d, m, 16 bytes
    d.put<uint16_t>(c10::Half(0.03f * static_cast<float>(b + 1)).x).put<uint16_t>(c10::Half(-0.5f + b).x);
    d.raw(pseudo_bytes(16, 20 + b));
  }
  d.pad(32);
  const uint64_t q4_k_at = d.size();
  for (int b = 0; b < 2; ++b) {  // Q4_K: d, dmin, 12 bytes of scales and mins, 128 of nibbles
    d.put<uint16_t>(c10::Half(0.0123f * static_cast<float>(b + 1)).x).put<uint16_t>(c10::Half(0.0071f).x);
    d.raw(pseudo_bytes(12 + 128, 30 + b));
  }
  d.pad(32);
  const uint64_t f32_at = d.size();
  for (int i = 0; i < 32; ++i) d.put<float>(1.0f);
  const std::string bytes = file_of({},
                                    {{"q4_0", {64, 2}, 2, 0},
                                     {"q4_1", {32, 2}, 3, q4_1_at},
                                     {"q4_k", {256, 2}, 12, q4_k_at},
                                     {"f32", {32}, 0, f32_at},
                                     {"vector", {32}, 2, f32_at + 128}},
                                    d.bytes() + std::string(32, '\0'));
  const auto f = parse(bytes);
  for (const char* name : {"q4_0", "q4_1"}) {
    const auto [data, scale] = f.int4_weights(name);
    EXPECT_TRUE(torch::equal(int4_values(data, scale), f.dequantize(name))) << name;
  }
  const auto [data, scale] = f.int4_weights("q4_k");
  ASSERT_EQ(data.sizes(), (std::vector<int64_t>{2, 128}));
  ASSERT_EQ(scale.sizes(), (std::vector<int64_t>{2, 8, 2}));
  const at::Tensor want = f.dequantize("q4_k"), got = int4_values(data, scale);
  EXPECT_TRUE(((got - want).abs() <= int4_half_rounding_bound(scale)).all().item<bool>()) << (got - want).abs().max();
  EXPECT_GT((got - want).abs().max().item<float>(), 0.0f);  // the scales were rounded
  EXPECT_GT(want.abs().max().item<float>(), 0.1f);
  expect_error([&] { f.int4_weights("vector"); },
               "gguf: 'f.gguf': tensor 'vector' has 1 dimensions; int4_weights takes [out, in]");
}

// A Q4_K block whose d sc passes float16 (60000 x 63) is refused, naming the block.
TEST(Gguf, Int4WeightsRefuseScalesPastFloat16) {
  Bytes d;
  d.put<uint16_t>(c10::Half(60000.0f).x).put<uint16_t>(c10::Half(0.0f).x);
  d.raw(std::string(12, static_cast<char>(63))).raw(std::string(128, '\0'));
  const std::string bytes = file_of({}, {{"big", {256, 1}, 12, 0}}, d.bytes());
  expect_error([&] { parse(bytes).int4_weights("big"); },
               "gguf: 'f.gguf': tensor 'big' block 0: a group's d sc or dmin m is past float16's range");
}

// A mapped file's tensor whose pages were given back reads the same again (from the
// file); release on a parsed file (the caller's bytes) changes nothing.
TEST(Gguf, AReleasedTensorReadsTheSameAgain) {
  Bytes data;  // F32 [8, 2048]: 64 KiB, whole pages to give back
  for (int i = 0; i < 8 * 2048; ++i) data.put<float>(static_cast<float>(i) / 7);
  const std::string bytes = file_of({}, {{"m.weight", {2048, 8}, 0, 0}}, data.bytes());
  const std::string path = temp_path("release.gguf");
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  {
    const auto f = torchattn::GgufFile::open(path);
    const at::Tensor before = f.dequantize("m.weight");
    EXPECT_EQ(before[7][2047].item<float>(), static_cast<float>(8 * 2048 - 1) / 7);
    f.release("m.weight");
    EXPECT_TRUE(torch::equal(f.dequantize("m.weight"), before));
    expect_error([&] { f.release("w.weight"); }, "has no tensor 'w.weight'");
  }
  std::filesystem::remove(path);
  const auto parsed = parse(bytes);
  parsed.release("m.weight");
  EXPECT_TRUE(torch::equal(parsed.dequantize("m.weight"), parse(bytes).dequantize("m.weight")));
}

// Cut anywhere, the file is an error naming it, never a read past its end (make sanitize
// runs this under AddressSanitizer).
TEST(Gguf, EveryTruncationIsAnError) {
  const std::string bytes = valid_file();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string cut = bytes.substr(0, n);
    const std::string error = error_of([&] { parse(cut); });
    EXPECT_HAS(error, "gguf: 'f.gguf'");
  }
}

TEST(Gguf, DamagedHeadersAndMetadataAreErrors) {
  const auto data = tensor_data();
  std::string bad = valid_file();
  bad[0] = 'X';
  expect_error([&] { parse(bad); }, "gguf: 'f.gguf' is not a GGUF file (its first bytes are not 'GGUF')");
  expect_error([&] { parse(file_of({}, {}, "", 32, -1, -1, 1)); },
               "gguf: 'f.gguf' is GGUF version 1; torchattn reads versions 2 and 3");
  EXPECT_NO_THROW(parse(file_of({}, two_tensors(), data, 32, -1, -1, 2)));
  expect_error([&] { parse(file_of({}, {}, "", 32, int64_t{1} << 40, 0)); },
               "gguf: 'f.gguf' says 1099511627776 metadata keys and 0 tensors, more than its");
  // A string longer than the file.
  expect_error([&] { parse(file_of({Bytes().put<uint64_t>(1000).raw("k").bytes()}, {}, "")); },
               "gguf: 'f.gguf': a metadata key at byte 24 is 1000 bytes long, past the file's end");
  expect_error([&] { parse(file_of({Bytes().str("k").put<uint32_t>(13).put<uint32_t>(0).bytes()}, {}, "")); },
               "gguf: 'f.gguf': key 'k' has the unknown value type 13");
  expect_error([&] { parse(file_of({kv_number<uint8_t>("k", 7, 2)}, {}, "")); },
               "gguf: 'f.gguf': key 'k' holds a bool of 2, expected 0 or 1");
  expect_error([&] { parse(file_of({kv_number<uint64_t>("k", 10, ~uint64_t{0})}, {}, "")); },
               "key 'k' holds the uint64 18446744073709551615, past what torchattn reads (int64)");
  expect_error([&] { parse(file_of({kv_string("k", "a"), kv_string("k", "b")}, {}, "")); },
               "gguf: 'f.gguf': key 'k' appears twice");
  // Arrays: nested 9 deep; counts past the file; counts past what the reader holds.
  Bytes deep;
  deep.str("deep").put<uint32_t>(9);
  for (int i = 0; i < 9; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
  deep.put<uint32_t>(4).put<uint64_t>(1).put<uint32_t>(7);
  expect_error([&] { parse(file_of({deep.bytes()}, {}, "")); },
               "gguf: 'f.gguf': key 'deep' nests arrays more than 8 deep");
  expect_error(
      [&] { parse(file_of({Bytes().str("a").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(1000).bytes()}, {}, "")); },
      "gguf: 'f.gguf': key 'a' is an array of 1000 int32 values, past the file's end");
  const std::string many = Bytes().str("a").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(5000000).bytes() +
                           std::string(5000000, '\1');
  expect_error(
      [&] { parse(file_of({many}, {}, "")); },
      "gguf: 'f.gguf': key 'a' is an array of 5000000 values, past the 4194304 metadata values torchattn holds");
  expect_error([&] { parse(file_of({kv_number<uint32_t>("general.alignment", 4, 24)}, two_tensors(), data)); },
               "gguf: 'f.gguf': general.alignment is 24, expected a power of 2 up to 2^20");
}

TEST(Gguf, DamagedTensorInfosAreErrors) {
  const auto data = tensor_data();
  const auto with = [&](TensorInfo t) {
    auto ts = two_tensors();
    ts[1] = std::move(t);
    return file_of({}, ts, data);
  };
  expect_error([&] { parse(with({"b", {}, 8, 32})); }, "tensor 'b' has 0 dimensions, expected 1 to 4");
  expect_error([&] { parse(with({"b", {32, 1, 1, 1, 1}, 8, 32})); }, "tensor 'b' has 5 dimensions, expected 1 to 4");
  expect_error([&] { parse(with({"b", {32, 0}, 8, 32})); }, "tensor 'b' has a dimension of 0");
  expect_error([&] { parse(with({"b", {32, uint64_t{1} << 40, uint64_t{1} << 40}, 8, 32})); },
               "tensor 'b' has a dimension of 1099511627776 (its elements past 2^62, or none)");
  expect_error([&] { parse(with({"b", {32, 1}, 6, 32})); },
               "tensor 'b' has type Q5_0, which torchattn does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, "
               "Q6_K)");
  expect_error([&] { parse(with({"b", {32, 1}, 99, 32})); }, "tensor 'b' has type 99, which torchattn does not read");
  expect_error([&] { parse(with({"b", {33, 1}, 8, 32})); },
               "tensor 'b' of Q8_0 has rows of 33 values, not whole blocks of 32");
  expect_error([&] { parse(with({"b", {32, 1}, 8, 16})); },
               "tensor 'b' lies at offset 16, not a multiple of the alignment 32");
  expect_error([&] { parse(with({"b", {32, 2}, 8, 32})); },
               "tensor 'b' (68 bytes at offset 32) runs past the file's end (66 bytes of data)");
  expect_error([&] { parse(with({"b", {8, 1}, 0, 0})); },
               "tensor 'b' at offset 0 overlaps the tensor before it, which ends at");
  expect_error([&] { parse(with({"a.weight", {32, 1}, 8, 32})); }, "gguf: 'f.gguf': tensor 'a.weight' appears twice");
  expect_error([&] { parse(file_of({}, two_tensors(), data, 32, -1, int64_t{1} << 50)); },
               "metadata keys and 1125899906842624 tensors, more than its");
}

TEST(Gguf, AFileThatIsNotThereIsNamed) {
  expect_error([] { torchattn::GgufFile::open("/no/such/file.gguf"); },
               "gguf: cannot open '/no/such/file.gguf': No such file or directory");
}

}  // namespace gguf_test
