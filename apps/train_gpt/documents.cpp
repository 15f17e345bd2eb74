#include "documents.h"

#include "fmt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace train_gpt {

namespace {

// Whether text[begin, end) (a line, without its newline) is exactly `want`.
bool line_is(const std::vector<uint8_t>& text, int64_t begin, int64_t end, const char* want) {
  const int64_t n = static_cast<int64_t>(std::char_traits<char>::length(want));
  if (end - begin != n) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (text[begin + i] != static_cast<uint8_t>(want[i])) return false;
  }
  return true;
}

}  // namespace

std::vector<Document> split_documents(const std::vector<uint8_t>& text, int64_t max_bytes) {
  TORCH_CHECK(max_bytes >= 2, "split_documents: expected max_bytes >= 2, got ", max_bytes);
  const int64_t n = static_cast<int64_t>(text.size());
  // The lines, and whether any holds only "%".
  std::vector<std::pair<int64_t, int64_t>> lines;
  bool fortunes = false;
  for (int64_t b = 0; b < n;) {
    int64_t e = b;
    while (e < n && text[e] != '\n') ++e;
    lines.emplace_back(b, e);
    fortunes = fortunes || line_is(text, b, e, "%");
    b = e + 1;
  }
  const char* separator = fortunes ? "%" : "";
  std::vector<Document> docs;
  auto add = [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; end - b >= 2; b += max_bytes) docs.push_back({b, std::min(end, b + max_bytes)});
  };
  int64_t start = 0;
  for (const auto& [b, e] : lines) {
    if (line_is(text, b, e, separator)) {
      add(start, b);  // the text before the separator line, its last newline included
      start = std::min(n, e + 1);
    }
  }
  add(start, n);
  return docs;
}

std::string length_summary(const std::vector<Document>& docs) {
  if (docs.empty()) return "0 documents";
  std::vector<int64_t> len;
  len.reserve(docs.size());
  for (const auto& d : docs) len.push_back(d.size());
  std::sort(len.begin(), len.end());
  const double mean = static_cast<double>(std::accumulate(len.begin(), len.end(), int64_t{0})) / len.size();
  const auto at = [&](double q) { return len[std::min(len.size() - 1, static_cast<size_t>(q * len.size()))]; };
  return fmt::format("{} documents, bytes min / median / mean / 90th percentile / max: {} / {} / {:.1f} / {} / {}",
                     len.size(), len.front(), at(0.5), mean, at(0.9), len.back());
}

DocumentBatch document_batch(const std::vector<uint8_t>& text, const std::vector<Document>& docs, int64_t global,
                             int64_t first, int64_t count, uint64_t seed, int64_t step, bool packed) {
  TORCH_CHECK(!docs.empty(), "document_batch: no documents");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(step));
  const auto drawn = torch::randint(static_cast<int64_t>(docs.size()), {global}, gen, torch::kLong);
  const int64_t* id = drawn.const_data_ptr<int64_t>();
  DocumentBatch b;
  int64_t n = 0, longest = 0;
  for (int64_t i = 0; i < global; ++i) b.useful += docs[id[i]].size() - 1;
  for (int64_t i = first; i < first + count; ++i) {
    n += docs[id[i]].size() - 1;
    longest = std::max(longest, docs[id[i]].size() - 1);
  }
  if (packed) {
    b.inputs = torch::empty({n}, torch::kLong);
    b.targets = torch::empty({n}, torch::kLong);
    b.positions = torch::empty({n}, torch::kLong);
    b.cu_seqlens = torch::empty({count + 1}, torch::kLong);
    int64_t *x = b.inputs.mutable_data_ptr<int64_t>(), *y = b.targets.mutable_data_ptr<int64_t>();
    int64_t *pos = b.positions.mutable_data_ptr<int64_t>(), *cu = b.cu_seqlens.mutable_data_ptr<int64_t>();
    int64_t at = 0;
    cu[0] = 0;
    for (int64_t i = 0; i < count; ++i) {
      const Document& d = docs[id[first + i]];
      for (int64_t t = 0; t + 1 < d.size(); ++t, ++at) {
        x[at] = text[d.begin + t];
        y[at] = text[d.begin + t + 1];
        pos[at] = t;
      }
      cu[i + 1] = at;
    }
    return b;
  }
  b.inputs = torch::zeros({count, longest}, torch::kLong);
  b.targets = torch::full({count, longest}, -100, torch::kLong);
  auto xa = b.inputs.accessor<int64_t, 2>(), ya = b.targets.accessor<int64_t, 2>();
  for (int64_t i = 0; i < count; ++i) {
    const Document& d = docs[id[first + i]];
    for (int64_t t = 0; t + 1 < d.size(); ++t) {
      xa[i][t] = text[d.begin + t];
      ya[i][t] = text[d.begin + t + 1];
    }
  }
  return b;
}

}  // namespace train_gpt
