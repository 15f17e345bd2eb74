// The table of attention paths (src/backends/selector.h), the one place that chooses
// how a call runs: each call here names the paths it must take (explain, and
// functional::attention_path for the public face), and its output from attend() is
// checked against the Reference backend's math in float64, so that every path the CPU
// can take runs here against the notebooks' numbers. The table printed in
// docs/architecture.md is the code's.

#include "backends/attend.h"
#include "backends/attend_documents.h"
#include "backends/attend_paged.h"
#include "backends/selector.h"

#include "common/expect_error.h"
#include "common/golden_dir.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/flex/variant.h>
#include <torchattn/functional.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace selector_test {

using torchattn::Backend;
using torchattn::backends::MaskSpec;
using torchattn::functional::AttentionOptions;
using Path = std::vector<std::string>;

bool avx2() { return torchattn::kernels::cpu::best_isa() >= torchattn::kernels::cpu::Isa::Avx2; }

struct Case {
  std::string name;
  int64_t heads = 4, kv_heads = 2, Tq = 20, past = 0, dim = 16;
  bool three_d = false;
  torch::Dtype dtype = torch::kFloat;
  std::function<void(MaskSpec&, AttentionOptions&, const torch::Tensor& q)> set = {};
  Path path;
  bool compare = true;  // against the Reference backend in float64
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  const bool vec = avx2();
  const Path prefill = vec ? Path{"cpu_flex_causal"} : Path{"masks_as_aten", "aten_sdpa"};
  std::vector<Case> all;
  auto add = [&](Case c) { all.push_back(std::move(c)); };
  add({.name = "prefill", .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; }, .path = prefill});
  add({.name = "chunk_after_cache",
       .past = 6,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; },
       .path = prefill});
  add({.name = "prefill_dropout_in_eval",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.dropout = 0.1; },
       .path = prefill});
  add({.name = "prefill_on_sdpa",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.backend = Backend::SDPA; },
       .path = {"masks_as_aten", "aten_sdpa"}});
  add({.name = "decoding_step",
       .Tq = 1,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; },
       .path = {"cpu_flex_decode"}});
  add({.name = "short_chunk_after_cache",
       .Tq = 5,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; },
       .path = {"cpu_flex_decode"}});
  add({.name = "static_cache_step",  // slots 0 .. 5 of 9 written
       .Tq = 1,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true, s.positions = torch::tensor({5}); },
       .path = {"cpu_flex_decode"}});
  add({.name = "static_cache_chunk_window",
       .Tq = 3,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&,
                 auto&) { s.causal = true, s.window = 2, s.positions = torch::tensor({4}); },
       .path = {"flex_named"}});
  add({.name = "cross_attention_step", .Tq = 2, .past = 9, .set = {}, .path = {"cpu_flex_decode"}});
  add({.name = "decoding_step_on_sdpa",
       .Tq = 1,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.backend = Backend::SDPA; },
       .path = {"masks_as_aten", "aten_grouped_decode"}});
  add({.name = "decoding_step_float64",
       .Tq = 1,
       .past = 8,
       .dtype = torch::kDouble,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; },
       .path = {"masks_as_aten", "aten_grouped_decode"}});
  add({.name = "encoder", .set = {}, .path = {"masks_as_aten", "aten_sdpa"}});
  add({.name = "single_head",
       .three_d = true,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true; },
       .path = vec ? Path{"single_head_as_heads", "cpu_flex_causal"}
                   : Path{"single_head_as_heads", "masks_as_aten", "aten_sdpa"}});
  add({.name = "reference",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.backend = Backend::Reference; },
       .path = {"reference"}});
  add({.name = "training_dropout",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.dropout = 0.1, o.training = true; },
       .path = {"reference"},
       .compare = false});
  add({.name = "window",
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true, s.window = 4; },
       .path = {"flex_named"}});
  add({.name = "window_decoding_step",
       .Tq = 1,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true, s.window = 4; },
       .path = {"flex_named"}});
  add({.name = "softcap",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.softcap = 5.0; },
       .path = {"flex_named"}});
  add({.name = "softcap_short",
       .Tq = 4,
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.softcap = 5.0; },
       .path = {"flex_named"}});
  add({.name = "softcap_on_sdpa",
       .set = [](MaskSpec& s, AttentionOptions& o,
                 auto&) { s.causal = true, o.softcap = 5.0, o.backend = Backend::SDPA; },
       .path = {"blocked"}});
  add({.name = "sinks",
       .set = [](MaskSpec& s, AttentionOptions& o, auto&) { s.causal = true, o.sinks = torch::randn({4}); },
       .path = {"blocked"}});
  add({.name = "alibi",
       .set = [](MaskSpec& s, AttentionOptions&, auto&) { s.causal = true, s.alibi_slopes = torch::rand({4}); },
       .path = {"flex_named"}});
  add({.name = "alibi_key_padding",
       .set =
           [](MaskSpec& s, AttentionOptions&, const torch::Tensor& q) {
             s.causal = true, s.alibi_slopes = torch::rand({4});
             s.key_padding =
                 torch::zeros({q.size(0), q.size(-2)}, torch::kBool).index_fill_(1, torch::tensor({0}), true);
           },
       .path = {"alibi_as_bias", "key_masks_as_aten", "aten_sdpa"}});
  add({.name = "key_padding",
       .set =
           [](MaskSpec& s, AttentionOptions&, const torch::Tensor& q) {
             s.causal = true;
             s.key_padding =
                 torch::zeros({q.size(0), q.size(-2)}, torch::kBool).index_fill_(1, torch::tensor({1}), true);
           },
       .path = {"key_masks_as_aten", "aten_sdpa"}});
  add({.name = "key_bias_decoding_step",
       .Tq = 1,
       .past = 8,
       .set = [](MaskSpec& s, AttentionOptions&, const torch::Tensor& q) { s.key_bias = torch::randn({q.size(0), 9}); },
       .path = {"key_masks_as_aten", "cpu_decode_kernel"}});
  add({.name = "key_padding_reference",
       .set =
           [](MaskSpec& s, AttentionOptions& o, const torch::Tensor& q) {
             s.causal = true, o.backend = Backend::Reference;
             s.key_padding =
                 torch::zeros({q.size(0), q.size(-2)}, torch::kBool).index_fill_(1, torch::tensor({1}), true);
           },
       .path = {"reference_key_masks"}});
  add({.name = "user_flex",
       .set =
           [](MaskSpec& s, AttentionOptions& o, auto&) {
             s.causal = true;
             // A variant that is the causal attention itself: the call reaches it as it is.
             o.flex = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torchattn::FlexCall& call) {
               EXPECT_TRUE(call.causal);
               return at::scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), {}, 0.0,
                                                       true, call.scale);
             };
           },
       .path = {"flex_user"}});
  return all;
}

// One case's call: q [B, H, Tq, d] (or [B, Tq, d]) over past + Tq keys.
struct Call {
  torch::Tensor q, k, v;
  MaskSpec spec;
  AttentionOptions config;
};

Call call_of(const Case& c) {
  torch::manual_seed(11);
  const int64_t B = 2, Tk = c.past + c.Tq;
  const auto opts = torch::TensorOptions().dtype(c.dtype);
  Call call;
  if (c.three_d) {
    call.q = torch::randn({B, c.Tq, c.dim}, opts), call.k = torch::randn({B, Tk, c.dim}, opts);
    call.v = torch::randn({B, Tk, c.dim}, opts);
  } else {
    call.q = torch::randn({B, c.heads, c.Tq, c.dim}, opts), call.k = torch::randn({B, c.kv_heads, Tk, c.dim}, opts);
    call.v = torch::randn({B, c.kv_heads, Tk, c.dim}, opts);
  }
  call.spec.past = c.past;
  if (c.set) c.set(call.spec, call.config, call.q);
  return call;
}

Path path_of(const Call& call) { return torchattn::backends::explain(call.q, call.k, call.v, call.spec, call.config); }

class AttentionPaths : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionPaths, ExplainNamesThePathsAndAttendMatchesTheReference) {
  const Case& c = GetParam();
  const Call call = call_of(c);
  EXPECT_EQ(path_of(call), c.path);
  const torch::NoGradGuard no_grad;
  const torch::Tensor out = torchattn::backends::attend(call.q, call.k, call.v, call.spec, call.config);
  ASSERT_EQ(out.sizes(), call.q.sizes());
  if (!c.compare) return;
  AttentionOptions reference = call.config;
  reference.backend = Backend::Reference;
  MaskSpec spec64 = call.spec;
  if (spec64.key_bias.defined()) spec64.key_bias = spec64.key_bias.to(torch::kDouble);
  const torch::Tensor want = torchattn::backends::attend(call.q.to(torch::kDouble), call.k.to(torch::kDouble),
                                                         call.v.to(torch::kDouble), spec64, reference);
  const double tol = c.dtype == torch::kDouble ? 1e-12 : 2e-5;
  EXPECT_LT((out.to(torch::kDouble) - want).abs().max().item<double>(), tol);
}

INSTANTIATE_TEST_SUITE_P(Calls, AttentionPaths, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A paged pool of one block holding one sequence's 3 tokens, its last row new.
struct OnePagedSequence {
  torch::Tensor keys = torch::randn({1, 2, 16, 4}), values = torch::randn({1, 2, 4, 16});
  torch::Tensor slots = torch::tensor({0, 1, 2}, torch::kLong);
  std::vector<int64_t> query_start{0, 1}, key_start{0, 3};
  torchattn::backends::PagedKeys pool{keys, values, slots, slots, &query_start, &key_start};
};

TEST(AttentionPathsPaged, TheKernelUnderAutoElseGathered) {
  torch::manual_seed(12);
  OnePagedSequence p;
  const torch::Tensor q = torch::randn({1, 4, 16});
  MaskSpec spec;
  spec.causal = true;
  AttentionOptions config;
  torchattn::backends::AttentionCall call{q, p.keys, p.values, spec, config, Backend::SDPA};
  call.paged = &p.pool;
  EXPECT_EQ(torchattn::backends::explain_attention(call), Path{"cpu_paged_kernel"});
  AttentionOptions sdpa;
  sdpa.backend = Backend::SDPA;
  torchattn::backends::AttentionCall gathered{q, p.keys, p.values, spec, sdpa, Backend::SDPA};
  gathered.paged = &p.pool;
  EXPECT_EQ(torchattn::backends::explain_attention(gathered), Path{"paged_gather"});
  const torch::NoGradGuard no_grad;
  const auto kernel = torchattn::backends::attend_paged(q, p.pool, std::nullopt, config);
  const auto gather = torchattn::backends::attend_paged(q, p.pool, std::nullopt, sdpa);
  EXPECT_LT((kernel - gather).abs().max().item<float>(), 2e-6f);
}

TEST(AttentionPathsDocuments, EachDocumentOnTheCpu) {
  torch::manual_seed(13);
  const torch::Tensor q = torch::randn({1, 4, 7, 16}), k = torch::randn({1, 4, 7, 16}), v = torch::randn({1, 4, 7, 16});
  const std::vector<int64_t> lengths{3, 4};
  const std::function<MaskSpec(int64_t)> spec_of = [](int64_t) {
    MaskSpec s;
    s.causal = true;
    return s;
  };
  const torchattn::backends::Documents documents{&lengths, &spec_of};
  const MaskSpec first = spec_of(3);
  const AttentionOptions config;
  torchattn::backends::AttentionCall call{q, k, v, first, config, Backend::SDPA};
  call.documents = &documents;
  EXPECT_EQ(torchattn::backends::explain_attention(call), Path{"documents_each"});
  const auto out = torchattn::backends::attend_documents(q, k, v, lengths, spec_of, config);
  const auto second = torchattn::backends::attend(q.narrow(2, 3, 4), k.narrow(2, 3, 4), v.narrow(2, 3, 4), first,
                                                  config);
  EXPECT_TRUE(torch::equal(out.narrow(2, 3, 4), second));
}

// Every path a CPU can take is taken by a call of this file (the CUDA paths run in the
// CUDA build's tests): a new path gets a call here.
TEST(AttentionPathsTable, EveryCpuPathIsTakenByACallHere) {
  std::set<std::string> taken{"cpu_paged_kernel", "paged_gather", "documents_each"};  // the tests above
  for (const Case& c : cases()) {
    const Path path = path_of(call_of(c));
    taken.insert(path.begin(), path.end());
  }
  std::set<std::string> cpu;
  for (const auto& p : torchattn::backends::attention_paths()) {
    const std::string name(p.name);
    if (name.rfind("cuda_", 0) != 0 && (avx2() || name != "cpu_flex_causal")) cpu.insert(name);
  }
  EXPECT_EQ(taken, cpu);
}

TEST(AttentionPathsTable, EachPathRunsOrLowersUnderItsOwnName) {
  std::set<std::string> names;
  for (const auto& p : torchattn::backends::attention_paths()) {
    EXPECT_TRUE((p.run == nullptr) != (p.lower == nullptr)) << p.name;
    EXPECT_TRUE(names.insert(std::string(p.name)).second) << p.name << " twice";
    EXPECT_FALSE(p.when.empty() || p.does.empty()) << p.name;
  }
}

// docs/architecture.md prints the table; it must be the code's, row for row.
TEST(AttentionPathsTable, DocsArchitectureShowsTheTable) {
  std::ifstream in(std::string(golden::directory()) + "/../../docs/architecture.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(torchattn::backends::attention_paths_markdown()), std::string::npos)
      << "docs/architecture.md lacks the table; it is:\n"
      << torchattn::backends::attention_paths_markdown();
}

// Auto takes flex's causal instance for a prefill only up to the keys where it measured
// faster (per instruction set, backends/selector.cpp): ATen's kernel past them (and
// flex's decoding instance for a sequence of 16 rows or fewer).
TEST(AttentionPathsTable, TheCausalFlexInstanceTakesAtMostTheKeysWhereItPays) {
  namespace kc = torchattn::kernels::cpu;
  EXPECT_EQ(torchattn::backends::causal_flex_max_keys(kc::Isa::Scalar), 0);
  EXPECT_EQ(torchattn::backends::causal_flex_max_keys(kc::Isa::Avx2), 512);
  EXPECT_EQ(torchattn::backends::causal_flex_max_keys(kc::Isa::Avx512), 16384);
  EXPECT_EQ(torchattn::backends::causal_flex_max_keys(kc::Isa::Avx512Vnni), 16384);
  const int64_t most = torchattn::backends::causal_flex_max_keys(kc::best_isa());
  MaskSpec spec;
  spec.causal = true;
  for (const int64_t T : {int64_t{8}, most, most + 1}) {
    if (T < 1) continue;
    const auto q = torch::empty({1, 2, T, 16}), k = torch::empty({1, 1, T, 16});
    const Path path = torchattn::backends::explain(q, k, k, spec, {});
    // A sequence of a decoding step's rows the causal instance does not take is a step's.
    EXPECT_EQ(path.back(), T <= most ? "cpu_flex_causal" : T <= 16 ? "cpu_flex_decode" : "aten_sdpa") << T << " keys";
  }
}

// The public face: functional::attention_path names the same paths as attend takes,
// and checks its arguments as attention() does.
TEST(AttentionPathsPublic, FunctionalAttentionPathNamesThePaths) {
  torch::manual_seed(14);
  const auto q = torch::randn({1, 4, 1, 16}), k = torch::randn({1, 4, 9, 16}), v = torch::randn({1, 4, 9, 16});
  const auto mask = torch::triu(torch::ones({16, 16}), 1);
  AttentionOptions config;
  EXPECT_EQ(torchattn::functional::attention_path(q, k, v, mask, 8, config), Path{"cpu_flex_decode"});
  config.backend = Backend::Reference;
  EXPECT_EQ(torchattn::functional::attention_path(q, k, v, mask, 8, config), Path{"reference"});
  const auto padding = torch::zeros({1, 9}, torch::kBool);
  EXPECT_EQ(torchattn::functional::attention_path(q, k, v, mask, 8, config, padding), Path{"reference_key_masks"});
  expect_error([&] { torchattn::functional::attention_path(q, k.narrow(-1, 0, 8), v, mask, 8, config); }, "attention");
}

}  // namespace selector_test
