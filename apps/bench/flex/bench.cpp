// torchattn_bench_flex: torchattn::flex_attention against the library's dedicated paths
// and ATen's SDPA, in one process, on the CPU (issue 51; apps/bench/results/flex.md).
// Each section times its sides in interleaved rounds (every side once a round, the
// order rotating from round to round, so a shared machine's drift falls on every side
// alike), after the sides are checked against each other and called once each to warm
// up; the report takes medians over the rounds and their ratios.
//
//   torchattn_bench_flex [--threads 2] [--T 4096] [--rounds 7] [--docs 16] [--quick] [--json out.json]
//
// q, k, v [B=1, H=12, T, D=64] float32 (ALiBi: x [1, T, 768] through a module's
// projections). Sections (sides; the first is the one the ratios are of):
//   causal_forward            flex causal (its block mask made once) | functional::attention
//                             causal (CPU float32, no grad: flex under flex::Causal, the
//                             block mask made per call) | ATen SDPA is_causal
//   causal_forward_backward   flex causal | ATen SDPA is_causal
//   documents_forward(+_backward)
//                             flex, block mask of `docs` equal documents (same document and
//                             causal) | the same call over every block (VisibleKeys), the
//                             documents and causality applied by score_mod as -inf
//   softcap_forward(+_backward)
//                             flex causal, flex::Softcap(50) | functional::attention
//                             causal with AttentionOptions.softcap = 50 on Backend::SDPA
//                             (the blocked path; Backend::Auto takes flex's kernels)
//   alibi_forward(+_backward) a MultiHeadAttention(768, 12 heads, alibi(true)) on
//                             Backend::SDPA (its bias through ATen's SDPA) | the same
//                             module's weights with flex::Alibi as its flex variant
//                             (MultiHeadAttentionOptions::flex) | its four
//                             projections alone (the cost both share) | flex ALiBi on q, k, v
//                             alone (for bench_python.py's comparison)
//   decoding                  one query row over a cache of --decode-keys keys (default
//                             32768), 32 query heads over 8 key/value heads, D 64: flex over
//                             every key | functional::attention (CPU float32, no grad: flex
//                             by the table's cpu_flex_decode, the path asserted) | the same
//                             with a key padding mask that hides nothing (the decode kernel,
//                             kernels::cpu::decode_attention, asserted) | ATen SDPA enable_gqa
//   decoding_short            a decoding step of SmolLM2's shape (9 query heads over 3, D 64)
//                             over 128, 512, 2048 and 8192 cached keys: functional::attention
//                             (cpu_flex_decode) | ATen SDPA enable_gqa

#include "bench_json.h"
#include "cli_checks.h"
#include "fmt.h"

#include <torchattn/flex_attention.h>
#include <torchattn/torchattn.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using bench::Row;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kB = 1, kH = 12, kD = 64, kDim = kH * kD;
constexpr float kSoftcap = 50.0F;
#if defined(__clang__)
constexpr const char* kCompiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
constexpr const char* kCompiler = "GCC " __VERSION__;
#else
constexpr const char* kCompiler = "unknown";
#endif

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms_of(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Side {
  std::string name;
  std::function<void()> run;
  std::vector<double> ms;
};

// A warm-up call of each side, then every side once a round, round r starting at side
// r % n; then one row per side.
void interleave(const std::string& section, std::vector<Side>& sides, int rounds, int64_t T, std::vector<Row>& rows) {
  const size_t n = sides.size();
  for (Side& s : sides) s.run();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n; ++i) {
      Side& s = sides[(i + static_cast<size_t>(r)) % n];
      s.ms.push_back(ms_of(s.run));
    }
  }
  const double first = median(sides[0].ms);
  fmt::print("  {:<26} {:>10} {:>10} {:>12}\n", "side", "median ms", "min ms", "x first");
  for (size_t i = 0; i < n; ++i) {
    const Side& s = sides[i];
    std::vector<double> per_round;  // this side's time over the first's, round by round
    for (size_t r = 0; r < s.ms.size(); ++r) per_round.push_back(s.ms[r] / sides[0].ms[r]);
    const double med = median(s.ms), mn = *std::min_element(s.ms.begin(), s.ms.end());
    fmt::print("  {:<26} {:10.1f} {:10.1f} {:11.2f}x\n", s.name, med, mn, med / first);
    rows.push_back(Row()
                       .s("section", section)
                       .s("variant", s.name)
                       .n("order", static_cast<double>(i))
                       .n("T", static_cast<double>(T))
                       .n("median_ms", med)
                       .n("min_ms", mn)
                       .n("rounds", rounds)
                       .n("time_vs_first", med / first)
                       .n("round_ratio_median", median(per_round)));
  }
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// |a - b| over max(1, |b|): gradients of a few thousand terms, compared where they are large.
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return max_abs_diff(a, b) / std::max(1.0, b.abs().max().item<double>());
}

void check(std::vector<Row>& rows, const std::string& what, double diff, double tolerance) {
  fmt::print("  check {:<48} {:.2e} (tolerance {:.0e})\n", what, diff, tolerance);
  TORCH_CHECK(diff <= tolerance, "torchattn_bench_flex: ", what, " differs by ", diff, ", more than ", tolerance);
  rows.push_back(Row().s("section", "check").s("variant", what).n("max_diff", diff).n("tolerance", tolerance));
}

// Leaves that require grad, copies of q, k and v.
struct Grads {
  at::Tensor q, k, v;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torchattn_bench_flex: flex_attention against the dedicated kernels and ATen's SDPA (CPU)"};
  int threads = 2;
  int64_t T = 4096, docs = 16;
  int rounds = 7;
  std::string json_path;
  bool quick = false;
  app.add_option("--threads", threads, "intra-op threads (at::set_num_threads)")->check(apps::at_least(1));
  auto* T_option = app.add_option("--T", T, "tokens (default 4096; 1024 with --quick)")->check(apps::at_least(16));
  auto* rounds_option =
      app.add_option("--rounds", rounds, "interleaved rounds (default 7; 2 with --quick)")->check(apps::at_least(1));
  app.add_option("--docs", docs, "equal documents of the documents sections (T a multiple)")->check(apps::at_least(1));
  app.add_option("--json", json_path, "write the results here as JSON (report.py reads it)");
  app.add_flag("--quick", quick, "a smoke run: T 1024 and 2 rounds unless given");
  int64_t decode_keys = 32768;
  auto* decode_option = app.add_option("--decode-keys", decode_keys,
                                       "cached keys of the decoding section (default 32768; 4096 with --quick)")
                            ->check(apps::at_least(1));
  std::vector<std::string> only;
  app.add_option("--only", only,
                 "run these sections alone: causal_forward, causal_forward_backward, documents, softcap, alibi, "
                 "decoding, decoding_short")
      ->check(CLI::IsMember({"causal_forward", "causal_forward_backward", "documents", "softcap", "alibi", "decoding",
                             "decoding_short"}));
  CLI11_PARSE(app, argc, argv);
  if (quick && T_option->count() == 0) T = 1024;
  if (quick && decode_option->count() == 0) decode_keys = 4096;
  if (quick && rounds_option->count() == 0) rounds = 2;
  if (T % docs != 0) {
    fmt::print(stderr, "torchattn_bench_flex: --T {} is not a multiple of --docs {}\n", T, docs);
    return 2;
  }
  at::set_num_threads(threads);
  const auto wanted = [&](const std::string& section) {
    return only.empty() || std::find(only.begin(), only.end(), section) != only.end();
  };
  const int64_t doc_len = T / docs;
  std::vector<Row> rows;
  fmt::print("torchattn_bench_flex: {} threads, float32, B={} H={} T={} D={}, {} rounds\n", at::get_num_threads(), kB,
             kH, T, kD, rounds);

  torch::manual_seed(0);
  const at::Tensor q = torch::randn({kB, kH, T, kD}), k = torch::randn({kB, kH, T, kD}),
                   v = torch::randn({kB, kH, T, kD}), dout = torch::randn({kB, kH, T, kD});
  auto leaves = [&] {
    return Grads{q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()};
  };

  // ---- the mods ----
  // Causal as the ready-made mask (q_idx >= kv_idx), which names each query's run of keys
  // (flex::RangedMask): a partial block is computed up to the last key its rows see.
  const torchattn::flex::Causal causal;
  std::vector<int64_t> doc_of(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) doc_of[static_cast<size_t>(i)] = i / doc_len;
  const int64_t* doc = doc_of.data();
  auto documents = [doc](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
    return doc[q_idx] == doc[kv_idx] && q_idx >= kv_idx;
  };
  // The same pattern as a score: -inf where `documents` is false, on every block.
  auto documents_score = [doc](auto score, int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
    using S = decltype(score);
    return doc[q_idx] == doc[kv_idx] && q_idx >= kv_idx ? score : S(-std::numeric_limits<float>::infinity());
  };
  // The ready-made mods (flex/variants.h), which the float32 forward runs W keys at a
  // time (flex/lanes.h): softcap * tanh(score / softcap), and score + slope_h (kv - q)
  // with BLOOM's slopes (the module's own).
  const torchattn::flex::Softcap softcap(static_cast<double>(kSoftcap));
  const std::vector<double> slopes_of = torchattn::flex::Alibi::bloom_slopes(kH);
  const torchattn::flex::Alibi alibi(slopes_of);

  const auto causal_mask = torchattn::create_block_mask(causal, 1, 1, T, T);
  const auto documents_mask = torchattn::create_block_mask(documents, 1, 1, T, T);
  const auto every_block = torchattn::create_block_mask(torchattn::VisibleKeys{}, 1, 1, T, T);
  const at::Tensor buffer = torchattn::functional::causal_mask_buffer(T);  // the modules' triu(ones, 1)
  torchattn::functional::AttentionOptions plain_options;
  torchattn::functional::AttentionOptions softcap_options;
  softcap_options.softcap = static_cast<double>(kSoftcap);
  // The dedicated path: Backend::Auto runs the softcap on flex's kernels themselves.
  softcap_options.backend = torchattn::Backend::SDPA;

  auto flex_causal = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::flex_attention(q_, k_, v_, causal_mask).output;
  };
  auto ours_causal = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::functional::attention(q_, k_, v_, buffer, 0, plain_options);
  };
  auto aten_causal = [](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return at::scaled_dot_product_attention(q_, k_, v_, {}, 0.0, /*is_causal=*/true);
  };
  auto flex_documents = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::flex_attention(q_, k_, v_, documents_mask).output;
  };
  auto flex_documents_dense = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::flex_attention(q_, k_, v_, documents_score, every_block).output;
  };
  auto flex_softcap = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::flex_attention(q_, k_, v_, softcap, causal_mask).output;
  };
  auto ours_softcap = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::functional::attention(q_, k_, v_, buffer, 0, softcap_options);
  };
  auto flex_alibi = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
    return torchattn::flex_attention(q_, k_, v_, alibi, causal_mask).output;
  };
  using Attention = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

  // A forward side: no grad anywhere.
  auto forward = [&](Attention f) {
    return [f, &q, &k, &v] {
      torch::NoGradGuard ng;
      f(q, k, v);
    };
  };
  // A forward+backward side: fresh leaves, the output's gradient `dout`.
  auto forward_backward = [&](Attention f) {
    return [f, &leaves, &dout] {
      Grads g = leaves();
      f(g.q, g.k, g.v).backward(dout);
    };
  };
  // Outputs (no grad) of two attentions, compared.
  auto check_forward = [&](const std::string& what, const Attention& a, const Attention& b, double tol) {
    torch::NoGradGuard ng;
    check(rows, what, max_abs_diff(a(q, k, v), b(q, k, v)), tol);
  };
  // Gradients of q, k and v of two attentions, compared (relative past 1).
  auto check_backward = [&](const std::string& what, const Attention& a, const Attention& b, double tol) {
    Grads ga = leaves(), gb = leaves();
    a(ga.q, ga.k, ga.v).backward(dout);
    b(gb.q, gb.k, gb.v).backward(dout);
    double d = 0;
    for (auto [x, y] : {std::pair{ga.q, gb.q}, std::pair{ga.k, gb.k}, std::pair{ga.v, gb.v}}) {
      d = std::max(d, rel_diff(x.grad(), y.grad()));
    }
    check(rows, what, d, tol);
  };

  if (wanted("causal_forward")) {
    // ---- a. causal forward: flex against the library's causal path (and ATen's) ----
    fmt::print("\n[causal_forward] flex causal vs functional::attention causal vs ATen SDPA is_causal\n");
    check_forward("causal forward: flex vs functional::attention", flex_causal, ours_causal, 1e-4);
    check_forward("causal forward: flex vs ATen SDPA", flex_causal, aten_causal, 1e-4);
    {
      std::vector<Side> sides{{"flex_causal", forward(flex_causal), {}},
                              {"torchattn_causal", forward(ours_causal), {}},
                              {"aten_sdpa_causal", forward(aten_causal), {}}};
      interleave("causal_forward", sides, rounds, T, rows);
    }
  }

  if (wanted("causal_forward_backward")) {
    // ---- b. causal forward+backward: flex against ATen's SDPA ----
    fmt::print("\n[causal_forward_backward] flex causal vs ATen SDPA is_causal\n");
    check_backward("causal gradients: flex vs ATen SDPA", flex_causal, aten_causal, 1e-4);
    {
      std::vector<Side> sides{{"flex_causal", forward_backward(flex_causal), {}},
                              {"aten_sdpa_causal", forward_backward(aten_causal), {}}};
      interleave("causal_forward_backward", sides, rounds, T, rows);
    }
  }

  if (wanted("documents")) {
    // ---- c. documents: the block mask's skipping against every block computed ----
    fmt::print("\n[documents] {} documents of {} tokens (same document and causal): block mask vs every block\n", docs,
               doc_len);
    check_forward("documents forward: block mask vs every block", flex_documents, flex_documents_dense, 1e-5);
    check_backward("documents gradients: block mask vs every block", flex_documents, flex_documents_dense, 1e-5);
    {
      std::vector<Side> sides{{"flex_documents", forward(flex_documents), {}},
                              {"flex_documents_every_block", forward(flex_documents_dense), {}}};
      interleave("documents_forward", sides, rounds, T, rows);
    }
    {
      std::vector<Side> sides{{"flex_documents", forward_backward(flex_documents), {}},
                              {"flex_documents_every_block", forward_backward(flex_documents_dense), {}}};
      interleave("documents_forward_backward", sides, rounds, T, rows);
    }
  }

  if (wanted("softcap")) {
    // ---- d. softcap: flex's score_mod against the dedicated path ----
    fmt::print("\n[softcap] causal, softcap {}: flex score_mod vs functional::attention AttentionOptions.softcap\n",
               kSoftcap);
    check_forward("softcap forward: flex vs functional::attention", flex_softcap, ours_softcap, 1e-4);
    check_backward("softcap gradients: flex vs functional::attention", flex_softcap, ours_softcap, 1e-4);
    {
      std::vector<Side> sides{{"flex_softcap", forward(flex_softcap), {}},
                              {"torchattn_softcap", forward(ours_softcap), {}}};
      interleave("softcap_forward", sides, rounds, T, rows);
    }
    {
      std::vector<Side> sides{{"flex_softcap", forward_backward(flex_softcap), {}},
                              {"torchattn_softcap", forward_backward(ours_softcap), {}}};
      interleave("softcap_forward_backward", sides, rounds, T, rows);
    }
  }

  if (wanted("alibi")) {
    // ---- d. ALiBi: the module's dedicated path against the module with a flex variant ----
    // ALiBi is public only as MultiHeadAttentionOptions::alibi: both sides run the same
    // four projections; the third side times those alone.
    fmt::print("\n[alibi] MultiHeadAttention(d={}, {} heads, alibi) vs the module with an ALiBi flex variant\n", kDim,
               kH);
    torch::manual_seed(1);
    torchattn::MultiHeadAttention mha(
        torchattn::MultiHeadAttentionOptions(kDim, kDim, T, kH)
            .alibi(true)
            .mask_buffer(false)
            .backend(torchattn::Backend::SDPA));  // the dedicated path: Backend::Auto takes flex's kernels
    mha->eval();                                  // no dropout (there is none) and, with no grad, the inference paths
    const at::Tensor x = torch::randn({kB, T, kDim}), dy = torch::randn({kB, T, kDim});
    auto heads = [T](const at::Tensor& t) { return t.view({kB, T, kH, kD}).transpose(1, 2); };
    // The same module's weights with the ALiBi score_mod as its flex variant
    // (MultiHeadAttentionOptions::flex; the module's causal mask applies).
    torchattn::MultiHeadAttention flex_mha(torchattn::MultiHeadAttentionOptions(kDim, kDim, T, kH)
                                               .mask_buffer(false)
                                               .flex(torchattn::flex_variant(alibi, torchattn::VisibleKeys{})));
    flex_mha->eval();
    {
      torch::NoGradGuard ng;
      const auto from = mha->named_parameters();
      for (auto& item : flex_mha->named_parameters()) item.value().copy_(from[item.key()]);
    }
    auto flex_module = [&](const at::Tensor& x_) { return flex_mha->forward(x_); };
    auto projections = [&](const at::Tensor& x_) {  // the same four products, no attention
      mha->W_query->forward(x_);
      mha->W_key->forward(x_);
      const at::Tensor o = heads(mha->W_value->forward(x_));
      return mha->out_proj->forward(o.transpose(1, 2).reshape({kB, T, kDim}));
    };
    auto ours_module = [&](const at::Tensor& x_) { return mha->forward(x_); };
    using Module = std::function<at::Tensor(const at::Tensor&)>;
    auto params = mha->parameters();
    for (auto& p : flex_mha->parameters()) params.push_back(p);
    auto module_forward = [&](Module f) {
      return [f, &x] {
        torch::NoGradGuard ng;
        f(x);
      };
    };
    auto module_forward_backward = [&](Module f) {
      return [f, &x, &dy, &params] {
        const at::Tensor xi = x.detach().requires_grad_();
        f(xi).backward(dy);
        for (auto& p : params) p.mutable_grad() = at::Tensor();
      };
    };
    {
      torch::NoGradGuard ng;
      check(rows, "alibi forward: flex module vs MultiHeadAttention alibi",
            max_abs_diff(flex_module(x), ours_module(x)), 1e-4);
    }
    {
      const at::Tensor xa = x.detach().requires_grad_(), xb = x.detach().requires_grad_();
      flex_module(xa).backward(dy);
      const at::Tensor wa = flex_mha->W_query->weight.grad().clone();
      for (auto& p : params) p.mutable_grad() = at::Tensor();
      ours_module(xb).backward(dy);
      const at::Tensor wb = mha->W_query->weight.grad().clone();
      for (auto& p : params) p.mutable_grad() = at::Tensor();
      check(rows, "alibi gradients (x, W_query): flex module vs module",
            std::max(rel_diff(xa.grad(), xb.grad()), rel_diff(wa, wb)), 1e-4);
    }
    {
      std::vector<Side> sides{{"flex_alibi_module", module_forward(flex_module), {}},
                              {"torchattn_alibi_module", module_forward(ours_module), {}},
                              {"projections_only", module_forward(projections), {}},
                              {"flex_alibi", forward(flex_alibi), {}}};
      interleave("alibi_forward", sides, rounds, T, rows);
    }
    {
      std::vector<Side> sides{{"flex_alibi_module", module_forward_backward(flex_module), {}},
                              {"torchattn_alibi_module", module_forward_backward(ours_module), {}},
                              {"projections_only", module_forward_backward(projections), {}},
                              {"flex_alibi", forward_backward(flex_alibi), {}}};
      interleave("alibi_forward_backward", sides, rounds, T, rows);
    }
  }

  // A decoding step's sides: functional::attention as it runs by default (flex), and the
  // same call with a key padding mask that hides nothing, which takes the decode kernel.
  auto no_grad = [](std::function<at::Tensor()> f) {
    return [f] {
      torch::NoGradGuard ng;
      f();
    };
  };
  const auto expect_path = [](const std::vector<std::string>& path, const std::string& want) {
    TORCH_CHECK(path.back() == want, "torchattn_bench_flex: expected functional::attention on ", want, ", got ",
                path.back());
    return path.back();
  };
  std::string decode_path, kernel_path;
  if (wanted("decoding")) {
    // ---- f. decoding: one query row over a long cache, flex against the decode kernel ----
    constexpr int64_t kQueryHeads = 32, kKvHeads = 8;
    fmt::print("\n[decoding] one query, {} cached keys, {} query heads over {} key/value heads, D {}\n", decode_keys,
               kQueryHeads, kKvHeads, kD);
    torch::manual_seed(2);
    const at::Tensor qd = torch::randn({kB, kQueryHeads, 1, kD}), kd = torch::randn({kB, kKvHeads, decode_keys, kD}),
                     vd = torch::randn({kB, kKvHeads, decode_keys, kD});
    // One mask for every head: the step sees every cached key.
    const auto every_key = torchattn::create_block_mask(torchattn::VisibleKeys{}, 1, 1, 1, decode_keys);
    auto flex_decode = [&] { return torchattn::flex_attention(qd, kd, vd, every_key).output; };
    auto ours_decode = [&] { return torchattn::functional::attention(qd, kd, vd, {}, 0, plain_options); };
    const at::Tensor no_padding = torch::zeros({kB, decode_keys}, torch::kBool);
    auto kernel_decode = [&] { return torchattn::functional::attention(qd, kd, vd, {}, 0, plain_options, no_padding); };
    auto aten_decode = [&] {
      return at::scaled_dot_product_attention(qd, kd, vd, {}, 0.0, /*is_causal=*/false, std::nullopt,
                                              /*enable_gqa=*/true);
    };
    {
      torch::NoGradGuard ng;
      decode_path = expect_path(torchattn::functional::attention_path(qd, kd, vd, {}, 0, plain_options),
                                "cpu_flex_decode");
      kernel_path = expect_path(torchattn::functional::attention_path(qd, kd, vd, {}, 0, plain_options, no_padding),
                                "cpu_decode_kernel");
      fmt::print("  functional::attention's path: {}; with a key padding mask: {}\n", decode_path, kernel_path);
      check(rows, "decoding: flex vs functional::attention", max_abs_diff(flex_decode(), ours_decode()), 1e-5);
      check(rows, "decoding: flex vs the decode kernel", max_abs_diff(flex_decode(), kernel_decode()), 1e-5);
      check(rows, "decoding: flex vs ATen SDPA", max_abs_diff(flex_decode(), aten_decode()), 1e-5);
    }
    std::vector<Side> sides{{"flex_decode", no_grad(flex_decode), {}},
                            {"torchattn_decode", no_grad(ours_decode), {}},
                            {"decode_kernel", no_grad(kernel_decode), {}},
                            {"aten_sdpa_decode", no_grad(aten_decode), {}}};
    // Steps of a few ms: 5x the rounds, so that each median rests on more samples.
    interleave("decoding", sides, rounds * 5, decode_keys, rows);
  }

  if (wanted("decoding_short")) {
    // ---- g. decoding steps of a small model's shape: the default path against ATen's ----
    constexpr int64_t kQueryHeads = 9, kKvHeads = 3;
    for (const int64_t keys : {int64_t{128}, int64_t{512}, int64_t{2048}, int64_t{8192}}) {
      fmt::print("\n[decoding_short] one query, {} cached keys, {} query heads over {}, D {}\n", keys, kQueryHeads,
                 kKvHeads, kD);
      torch::manual_seed(3);
      const at::Tensor qd = torch::randn({kB, kQueryHeads, 1, kD}), kd = torch::randn({kB, kKvHeads, keys, kD}),
                       vd = torch::randn({kB, kKvHeads, keys, kD});
      auto ours = [&] { return torchattn::functional::attention(qd, kd, vd, {}, 0, plain_options); };
      auto aten = [&] {
        return at::scaled_dot_product_attention(qd, kd, vd, {}, 0.0, /*is_causal=*/false, std::nullopt,
                                                /*enable_gqa=*/true);
      };
      {
        torch::NoGradGuard ng;
        expect_path(torchattn::functional::attention_path(qd, kd, vd, {}, 0, plain_options), "cpu_flex_decode");
        check(rows, fmt::format("decoding {} keys: the default vs ATen SDPA", keys), max_abs_diff(ours(), aten()),
              1e-5);
      }
      // Steps of microseconds: each sample is a batch of calls (about 2^26 multiply-adds).
      const int calls = static_cast<int>(std::max<int64_t>(1, (int64_t{1} << 26) / (kQueryHeads * keys * 2 * kD)));
      auto repeat = [calls](std::function<at::Tensor()> f) {
        return [f, calls] {
          torch::NoGradGuard ng;
          for (int i = 0; i < calls; ++i) f();
        };
      };
      std::vector<Side> sides{{"torchattn_decode", repeat(ours), {}}, {"aten_sdpa_decode", repeat(aten), {}}};
      interleave(fmt::format("decoding_short_{}", keys), sides, rounds * 5, keys, rows);
      rows.push_back(Row().s("section", "decoding_short_calls").s("variant", std::to_string(keys)).n("calls", calls));
    }
  }

  if (!json_path.empty()) {
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr ? v : "");
    };
    std::ostringstream meta;
    meta << "\"tool\": \"torchattn_bench_flex\", \"torchattn\": \"" << TORCHATTN_VERSION << "\", \"libtorch\": \""
         << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH << "\", \"compiler\": \""
         << kCompiler << "\", \"threads\": " << at::get_num_threads() << ", \"B\": " << kB << ", \"H\": " << kH
         << ", \"D\": " << kD << ", \"T\": " << T << ", \"rounds\": " << rounds << ", \"docs\": " << docs
         << ", \"doc_len\": " << doc_len << ", \"block_size\": " << causal_mask.shape.block_size
         << ", \"softcap\": " << kSoftcap << ", \"model_dim\": " << kDim << ", \"alibi_slopes\": [";
    for (size_t i = 0; i < slopes_of.size(); ++i) meta << (i ? ", " : "") << slopes_of[i];
    meta << "], \"env\": {\"TORCHATTN_ISA\": \"" << env("TORCHATTN_ISA") << "\", \"ATEN_CPU_CAPABILITY\": \""
         << env("ATEN_CPU_CAPABILITY") << "\", \"OMP_NUM_THREADS\": \"" << env("OMP_NUM_THREADS") << "\"}"
         << ", \"quick\": " << (quick ? "true" : "false") << ", \"decode_keys\": " << decode_keys
         << ", \"decode_path\": \"" << decode_path << "\", \"kernel_path\": \"" << kernel_path << "\"";
    std::ofstream(json_path) << bench::to_json(rows, meta.str());
    fmt::print("\nwrote {}\n", json_path);
  }
  return 0;
}
