#pragma once

// Attention over documents packed end to end (forward_packed, attention_packed): each
// document attends within itself alone, through attend, or on CUDA all at once through
// ATen's variable-length flash attention where it applies (the table's choice,
// selector.h).

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <functional>
#include <vector>

namespace torchattn::backends {

/// q: [B, ..., N, d], k: [B, ..., N, d], v: [B, ..., N, dv], the documents' tokens
/// along -2 in order, document s of lengths[s] tokens (all > 0, summing to N);
/// spec_of(L): the MaskSpec of a document of L tokens alone. Returns [B, ..., N, dv],
/// each document's rows what attend gives for it alone, the documents one after
/// another in order (with dropout: the masks of the documents run alone in that order
/// from the same generator). Nothing of N x N is made. (Documents of equal length run
/// as one batch measured slower on the CPU, forward+backward: 1.63 s against 0.49 s
/// for 64 x 256 tokens, 12 heads.)
at::Tensor attend_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<int64_t>& lengths, const std::function<MaskSpec(int64_t)>& spec_of,
                            const functional::AttentionOptions& config);

struct AttentionCall;

/// The table's `documents_each` path: each document of `call` (call.documents set) on
/// its own through attend, the outputs concatenated along -2.
at::Tensor attend_each_document(const AttentionCall& call);

}  // namespace torchattn::backends
