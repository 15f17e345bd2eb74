#pragma once

// The one place that chooses how an attention call runs: an ordered table of paths,
// each with what it applies to and how it runs (vLLM's attention backends and their
// selector are the model). attend, attend_documents and attend_paged hand their call
// to run_attention; the first path whose applies() holds takes it. A path either runs
// the call (a kernel, ATen, the Reference's math, flex) or lowers it (ALiBi's
// distances as a bias, the masks in ATen's form) into another call that the table
// chooses for again. Backend::{Auto, Reference, SDPA} are filters on the table: the
// paths that name a backend in their `when` apply only to it.
//
// The table, printed, is in docs/architecture.md (tests/backends/test_selector.cpp
// compares the two).

#include "backends/attention_call.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace torchattn::backends {

/// One row of the table. Exactly one of run and lower is set.
struct AttentionPath {
  std::string_view name;  ///< stable, as explain() and the docs give it
  std::string_view when;  ///< what applies() checks, in words (the docs' table)
  std::string_view does;  ///< what it runs or lowers to, in words
  bool (*applies)(const AttentionCall&);
  at::Tensor (*run)(const AttentionCall&);
  LoweredCall (*lower)(const AttentionCall&);
};

/// The table, in the order the paths are tried.
std::span<const AttentionPath> attention_paths();

/// The first path of the table that applies to `call` (one always does).
const AttentionPath& select_path(const AttentionCall& call);

/// Runs `call` on the paths the table chooses. Returns what attend documents.
at::Tensor run_attention(const AttentionCall& call);

/// The names of the paths `call` goes through, the lowerings first and the path that
/// runs it last (computes the lowered masks, never the attention).
std::vector<std::string> explain_attention(const AttentionCall& call);

/// The table as a Markdown table (order, name, applies when, does): docs/architecture.md.
std::string attention_paths_markdown();

/// The most keys for which Backend::Auto takes flex's causal instance for a prefill on
/// a CPU with `isa` (where it measured faster than ATen's; the figures in selector.cpp):
/// 512 with AVX2, 16384 with AVX-512, 0 without.
int64_t causal_flex_max_keys(kernels::cpu::Isa isa);

}  // namespace torchattn::backends
