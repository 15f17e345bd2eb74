// The safetensors reader and writer: exact round trips of every dtype, file order,
// metadata, memory-mapped tensors that can be written safely, sharded checkpoints,
// and every kind of damaged file as a c10::Error naming it (plus every truncation of
// a good file). tests/fuzz/fuzz_safetensors.cpp fuzzes the same parser; ctest -R
// interop checks the files against the Python safetensors package.

#include "common/expect_error.h"
#include "common/temp_path.h"

#include <torchattn/safetensors.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file from a header written by hand and `data_bytes` bytes of data.
std::string file_with_header(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

torchattn::NamedTensors parse(const std::string& bytes) {
  return torchattn::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.safetensors");
}

TEST(Safetensors, EveryDtypeRoundTripsExactlyInOrder) {
  torch::manual_seed(1);
  const torchattn::NamedTensors tensors{
      {"z.f64", torch::randn({2, 3}, torch::kFloat64)},
      {"a.f32", torch::randn({4})},
      {"m.f16", torch::randn({3, 1, 2}).to(torch::kHalf)},
      {"b.bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"i64", torch::randint(-1000, 1000, {2, 2}, torch::kLong)},
      {"i32", torch::randint(-1000, 1000, {3}, torch::kInt)},
      {"i16", torch::randint(-1000, 1000, {3}, torch::kShort)},
      {"i8", torch::randint(-100, 100, {7}, torch::kChar)},
      {"u8", torch::randint(0, 255, {5}, torch::kByte)},
      {"bool", torch::rand({6}) < 0.5},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::zeros({0, 4})},
      {"strided", torch::randn({4, 3}).t()},  // written contiguous
  };
  const auto path = temp_path("all.safetensors");
  torchattn::save_safetensors(path, tensors, {{"format", "pt"}, {"by", "torchattn"}});
  const auto loaded = torchattn::load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded[i].first, tensors[i].first);  // file order is the written order
    EXPECT_EQ(loaded[i].second.scalar_type(), tensors[i].second.scalar_type()) << loaded[i].first;
    EXPECT_TRUE(torch::equal(loaded[i].second, tensors[i].second)) << loaded[i].first;
  }
  std::filesystem::remove(path);
}

TEST(Safetensors, LoadedTensorsCanBeWrittenWithoutTouchingTheFile) {
  const auto path = temp_path("cow.safetensors");
  torchattn::save_safetensors(path, {{"w", torch::arange(16, torch::kFloat32)}});
  const std::string before = read_file(path);
  {
    auto loaded = torchattn::load_safetensors(path);
    loaded[0].second.add_(1);  // copy-on-write pages: no crash, file unchanged
    EXPECT_EQ(loaded[0].second[0].item<float>(), 1.0f);
  }
  EXPECT_EQ(read_file(path), before);
  // Tensors keep the mapping alive after the list is gone.
  at::Tensor kept = torchattn::load_safetensors(path)[0].second;
  EXPECT_TRUE(torch::equal(kept, torch::arange(16, torch::kFloat32)));
  std::filesystem::remove(path);
}

#if defined(__linux__) && defined(MADV_HUGEPAGE)
// The VmFlags line of the mapping in /proc/self/smaps that holds address p ("" if none).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    // A mapping's first line: "begin-end perms offset ...", both addresses in hex.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= at && at < end;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Decoding streams every mapped weight once a token: the mapping asks for 2 MiB pages
// (the "hg" of VmFlags), unless this kernel refuses MADV_HUGEPAGE altogether.
TEST(Safetensors, MappedFileAsksForHugePages) {
  const auto path = temp_path("huge.safetensors");
  torchattn::save_safetensors(path, {{"w", torch::arange(1 << 20, torch::kFloat32)}});
  const auto loaded = torchattn::load_safetensors(path);
  const std::string flags = vm_flags_of(loaded[0].second.const_data_ptr());
  ASSERT_NE(flags, "") << "no mapping in /proc/self/smaps holds the tensor's data";
  void* probe = ::mmap(nullptr, 4 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  const bool refused = ::madvise(probe, 4 << 20, MADV_HUGEPAGE) != 0;
  ::munmap(probe, 4 << 20);
  EXPECT_EQ(flags.find(" hg") != std::string::npos, !refused) << flags;
  std::filesystem::remove(path);
}
#endif

TEST(Safetensors, ShardedIndexLoadsEveryShardAndChecksTheMap) {
  const auto dir = temp_path("sharded");
  std::filesystem::create_directories(dir);
  torchattn::save_safetensors(dir + "/model-00001-of-00002.safetensors",
                              {{"a", torch::ones({2})}, {"b", torch::zeros({3})}});
  torchattn::save_safetensors(dir + "/model-00002-of-00002.safetensors", {{"c", torch::full({1}, 7.0)}});
  write_file(dir + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 24}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}})");
  const auto loaded = torchattn::load_safetensors(dir + "/model.safetensors.index.json");
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded[0].first, "a");
  EXPECT_EQ(loaded[1].first, "b");
  EXPECT_EQ(loaded[2].first, "c");
  EXPECT_EQ(loaded[2].second.item<float>(), 7.0f);

  write_file(dir + "/bad.index.json", R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { torchattn::load_safetensors(dir + "/bad.index.json"); },
               "shard 'model-00001-of-00002.safetensors' holds tensor 'b', which '" + dir +
                   "/bad.index.json' does not name");
  write_file(dir + "/missing.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "x": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { torchattn::load_safetensors(dir + "/missing.index.json"); },
               "places tensor 'x' in 'model-00002-of-00002.safetensors', which does not hold it");
  write_file(dir + "/escape.index.json", R"({"weight_map": {"a": "../../etc/passwd"}})");
  expect_error([&] { torchattn::load_safetensors(dir + "/escape.index.json"); }, "expected a file beside the index");
  write_file(dir + "/notjson.index.json", "{weight_map");
  expect_error([&] { torchattn::load_safetensors(dir + "/notjson.index.json"); }, "is not valid JSON");
  std::filesystem::remove_all(dir);
}

struct Damage {
  std::string name;
  std::string bytes;
  std::string message;
};

class DamagedFile : public ::testing::TestWithParam<Damage> {};

TEST_P(DamagedFile, IsAnErrorNamingTheFileAndTheProblem) {
  const auto& d = GetParam();
  expect_error([&] { parse(d.bytes); }, "safetensors: 'test.safetensors'" + d.message);
  // The same through a file on disk.
  const auto path = temp_path(d.name + ".safetensors");
  write_file(path, d.bytes);
  expect_error([&] { torchattn::load_safetensors(path); }, "safetensors: '" + path + "'" + d.message);
  std::filesystem::remove(path);
}

std::vector<Damage> damages() {
  const std::string f32 = R"("t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  return {
      {"Empty", "", " is truncated: 0 bytes, less than the 8-byte header length"},
      {"Seven", std::string(7, '\0'), " is truncated: 7 bytes"},
      {"HeaderPastEnd", file_with_header("{" + f32 + "}", 8).substr(0, 20), ": the header length 61 runs past the end"},
      {"HugeHeader", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}",
       ": the header length 9223372036854775807 is over"},
      {"InvalidJson", file_with_header("{\"t\": [1, 2", 0), ": the header is not valid JSON"},
      {"NotAnObject", file_with_header("[1, 2, 3]", 0), ": expected the header to be a JSON object, got array"},
      {"UnknownDtype", file_with_header(R"({"t": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2),
       ": tensor 't' has dtype 'F8_E4M3', expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL"},
      {"ShapeDisagrees", file_with_header(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       ": tensor 't' of shape [3] and dtype F32 needs 12 bytes, its data_offsets hold 8"},
      {"ShapeOverflows",
       file_with_header(R"({"t": {"dtype": "F64", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 8]}})", 8),
       ": tensor 't' of shape"},
      {"NegativeDim", file_with_header(R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       ": tensor 't' has a shape entry that is not a non-negative integer: -2"},
      {"OffsetsPastData", file_with_header("{" + f32 + "}", 4),
       ": tensor 't' has data_offsets [0, 8] past the 4 bytes of data"},
      {"OffsetsBackwards", file_with_header(R"({"t": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
       ": tensor 't' has data_offsets [8, 0] that run backwards"},
      {"Overlapping",
       file_with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        12),
       ": tensor 'b' at bytes [4, 12) overlaps the tensor before it, which ends at 8"},
      {"Hole",
       file_with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                        12),
       ": bytes [4, 8) of the data belong to no tensor"},
      {"TrailingBytes", file_with_header("{" + f32 + "}", 12), ": bytes [8, 12) of the data belong to no tensor"},
      {"MissingField", file_with_header(R"({"t": {"dtype": "F32", "shape": [2]}})", 8),
       ": tensor 't' needs dtype, shape and data_offsets"},
      {"BadOffsets", file_with_header(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8),
       ": tensor 't' needs data_offsets [begin, end] of non-negative integers"},
      {"BadMetadata", file_with_header(R"({"__metadata__": {"a": 1}})", 0), ": __metadata__ entry 'a' is not a string"},
  };
}

INSTANTIATE_TEST_SUITE_P(Safetensors, DamagedFile, ::testing::ValuesIn(damages()),
                         [](const ::testing::TestParamInfo<Damage>& info) { return info.param.name; });

// Every prefix of a good file, and files with bytes flipped, are errors or loads:
// never a crash (the sanitizer build runs this too).
TEST(Safetensors, EveryTruncationAndCorruptionIsAnErrorNotACrash) {
  const auto path = temp_path("good.safetensors");
  torchattn::save_safetensors(path, {{"a", torch::randn({3, 4})}, {"b", torch::randint(0, 9, {5}, torch::kLong)}},
                              {{"format", "pt"}});
  const std::string good = read_file(path);
  for (size_t n = 0; n < good.size(); ++n) {
    expect_error([&] { parse(good.substr(0, n)); }, "safetensors: 'test.safetensors'");
  }
  EXPECT_EQ(parse(good).size(), 2u);
  std::mt19937 rng(3);
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bad = good;
    for (int j = 0; j < 4; ++j) bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    try {
      for (const auto& [name, t] : parse(bad)) (void)t.sum();  // read what loaded
    } catch (const c10::Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
  std::filesystem::remove(path);
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotHold) {
  const auto path = temp_path("refuse.safetensors");
  expect_error([&] { torchattn::save_safetensors(path, {{"a", torch::ones({1})}, {"a", torch::ones({1})}}); },
               "save_safetensors: tensor name 'a' is reserved or appears twice");
  expect_error([&] { torchattn::save_safetensors(path, {{"__metadata__", torch::ones({1})}}); },
               "save_safetensors: tensor name '__metadata__' is reserved");
  expect_error([&] { torchattn::save_safetensors(path, {{"c", torch::ones({1}, torch::kComplexFloat)}}); },
               "save_safetensors: dtype ComplexFloat has no safetensors name");
  expect_error([&] { torchattn::save_safetensors("/nonexistent-dir/x.safetensors", {{"a", torch::ones({1})}}); },
               "save_safetensors: cannot write '/nonexistent-dir/x.safetensors.tmp-");
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
