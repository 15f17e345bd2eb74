#pragma once

// train_gpt's documents: a text cut into documents (each fortune one), and a step's
// batch of them either packed end to end in one row (no padding; attention and
// positions restart at each document) or padded to the batch's longest.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace train_gpt {

/// A document: bytes [begin, end) of its text.
struct Document {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

/// The documents of `text`: the pieces between lines that hold only "%" (the fortune
/// files' format), or, in a text without such lines, between blank lines; each cut
/// into pieces of at most max_bytes (a piece becomes a document of its own), and
/// pieces of fewer than 2 bytes (nothing to predict) dropped.
std::vector<Document> split_documents(const std::vector<uint8_t>& text, int64_t max_bytes);

/// "N documents, bytes min / median / mean / 90th percentile / max: ..." (the lengths
/// train_gpt prints).
std::string length_summary(const std::vector<Document>& docs);

/// A step's documents: a document of L bytes gives L - 1 inputs and their next bytes.
/// - Packed: inputs [N] and targets [N] end to end (N the sum of L - 1), positions [N]
///   restarting at 0 in each document, cu_seqlens [S + 1] int64.
/// - Padded: inputs [S, T] (T the longest L - 1; padding 0) and targets [S, T] with
///   -100 (cross_entropy's ignore_index) on the padding.
/// useful: the tokens with a target (N either way).
struct DocumentBatch {
  torch::Tensor inputs, targets, positions, cu_seqlens;
  int64_t useful = 0;
};

/// The documents of the global batch of `step` (`global` of them drawn from the seed
/// and the step alone), the slice [first, first + count) of them packed or padded,
/// with `useful` counting the whole global batch's tokens.
DocumentBatch document_batch(const std::vector<uint8_t>& text, const std::vector<Document>& docs, int64_t global,
                             int64_t first, int64_t count, uint64_t seed, int64_t step, bool packed);

}  // namespace train_gpt
