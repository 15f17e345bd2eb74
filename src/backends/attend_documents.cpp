#include "backends/attend_documents.h"

#include "backends/attend.h"
#include "backends/selector.h"

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>


namespace torchattn::backends {

at::Tensor attend_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<int64_t>& lengths, const std::function<MaskSpec(int64_t)>& spec_of,
                            const functional::AttentionOptions& config) {
  TORCH_CHECK(!lengths.empty(), "attend_documents: expected at least one document");
  const MaskSpec first = spec_of(lengths.front());
  const Documents documents{&lengths, &spec_of};
  AttentionCall call{q, k, v, first, config, resolve_backend(config)};
  call.documents = &documents;
  return run_attention(call);
}

at::Tensor attend_each_document(const AttentionCall& call) {
  const std::vector<int64_t>& lengths = *call.documents->lengths;
  // One split each: a narrow per document would give each its own backward writing a
  // gradient of all N tokens, S times over.
  const std::vector<at::Tensor> qs = call.q.split_with_sizes(lengths, -2), ks = call.k.split_with_sizes(lengths, -2),
                                vs = call.v.split_with_sizes(lengths, -2);
  std::vector<at::Tensor> parts;
  parts.reserve(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) {
    parts.push_back(attend(qs[s], ks[s], vs[s], (*call.documents->spec_of)(lengths[s]), call.config));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, -2);
}

}  // namespace torchattn::backends
