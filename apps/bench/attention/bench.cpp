// torchattn_bench: times every way to compute notebook 003's MultiHeadAttention on
// the same weights, checks each against the Reference before timing it, and writes
// medians, useful GFLOP/s and ratios against the Reference of the same run.
//
//   torchattn_bench [--threads 2] [--json out.json] [--quick]
//   torchattn_bench --device cuda [--json out.json] [--quick]    (the GPU: bench_cuda.cpp)
//
// Sections:
//   main     B=4, T=1024, d=768, 12 heads: forward and forward+backward
//   sweep    B=1, T = 128 .. 16384: forward time and peak RSS growth
//   decode   B=1, a 1024-token prompt then 256 tokens, with and without the KV cache
//   gqa      decoding with 12 query heads over 12 (MHA) or 3 (GQA 4:1) key/value heads:
//            tokens/s and KV cache bytes, interleaved
//   rope     the main forward with and without rotary embeddings, interleaved

#include "bench_cuda.h"
#include "bench_json.h"
#include "cli_checks.h"
#include "fmt.h"

#include <torchattn/torchattn.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using bench::Row;
using torchattn::Backend;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kDim = 768, kHeads = 12;
// The sliding window of the scores section's `window` variant (Mistral's is 4096; 256 of
// T = 1024 keys shows what a window skips).
constexpr int64_t kScoresWindow = 256;

// ---- memory: peak resident set since the last reset (Linux) ----
int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// ---- timing ----
struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

Timing time_it(const std::function<void()>& fn, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), reps};
}

// Useful FLOPs of a causal multi-head attention forward: four projections and the
// lower triangle of q k^T and weights @ v.
double useful_flops(int64_t B, int64_t T) {
  const double proj = 4.0 * 2.0 * B * T * kDim * kDim;
  const double attn = 2.0 * 2.0 * B * kHeads * (T * (T + 1) / 2.0) * (kDim / kHeads);
  return proj + attn;
}

// ---- the variants, all on one set of weights ----
struct Variant {
  std::string name;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

struct Models {
  torchattn::MultiHeadAttention reference{nullptr}, sdpa{nullptr}, autob{nullptr};
  torch::nn::MultiheadAttention libtorch{nullptr};
  torch::Tensor float_mask;  // additive causal mask for LibTorch's module
};

Models make_models(int64_t context_length) {
  Models m;
  torch::manual_seed(0);
  m.reference = torchattn::MultiHeadAttention(
      torchattn::MultiHeadAttentionOptions(kDim, kDim, context_length, kHeads).backend(Backend::Reference));
  auto copy = [&](Backend b) {
    auto c = std::dynamic_pointer_cast<torchattn::MultiHeadAttentionImpl>(m.reference->clone());
    c->options.backend(b);
    return torchattn::MultiHeadAttention(c);
  };
  m.sdpa = copy(Backend::SDPA);
  m.autob = copy(Backend::Auto);
  m.libtorch = torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(kDim, kHeads));
  {
    torch::NoGradGuard g;
    auto& r = *m.reference;
    m.libtorch->in_proj_weight.copy_(torch::cat({r.W_query->weight, r.W_key->weight, r.W_value->weight}));
    m.libtorch->in_proj_bias.zero_();
    m.libtorch->out_proj->weight.copy_(r.out_proj->weight);
    m.libtorch->out_proj->bias.copy_(r.out_proj->bias);
  }
  return m;
}

std::vector<Variant> variants(Models& m, int64_t T, bool with_reference, bool with_libtorch) {
  std::vector<Variant> v;
  if (with_reference) v.push_back({"reference", [&m](const torch::Tensor& x) { return m.reference(x); }});
  v.push_back({"sdpa", [&m](const torch::Tensor& x) { return m.sdpa(x); }});
  v.push_back({"auto", [&m](const torch::Tensor& x) { return m.autob(x); }});
  // Linear projections plus ATen SDPA, assembled by hand: the floor for the fused path.
  v.push_back({"linear+aten_sdpa", [&m](const torch::Tensor& x) {
                 auto& r = *m.reference;
                 const int64_t B = x.size(0), T = x.size(1), hd = kDim / kHeads;
                 auto split = [&](const torch::Tensor& t) { return t.view({B, T, kHeads, hd}).transpose(1, 2); };
                 auto q = split(torch::linear(x, r.W_query->weight));
                 auto k = split(torch::linear(x, r.W_key->weight));
                 auto v = split(torch::linear(x, r.W_value->weight));
                 auto o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
                 return torch::linear(o.transpose(1, 2).reshape({B, T, kDim}), r.out_proj->weight, r.out_proj->bias);
               }});
  if (with_libtorch) {
    m.float_mask = torch::triu(torch::full({T, T}, -std::numeric_limits<float>::infinity()), 1);
    v.push_back({"libtorch_nn_mha", [&m](const torch::Tensor& x) {
                   auto xt = x.transpose(0, 1);  // LibTorch's module is sequence-first
                   auto out = std::get<0>(m.libtorch->forward(xt, xt, xt, {}, /*need_weights=*/false, m.float_mask));
                   return out.transpose(0, 1);
                 }});
  }
  return v;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torchattn benchmarks: every backend against the notebook math and LibTorch's MultiheadAttention"};
  int threads = 2;
  std::string json_path;
  bool quick = false;
  int64_t max_T = 16384;
  std::string device = "cpu";
  app.add_option("--device", device,
                 "cpu (default), or cuda: the GPU benchmark (apps/bench/results/benchmarks-cuda.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "intra-op threads (cpu)")->check(apps::at_least(1));
  app.add_option("--json", json_path, "write the results here as JSON");
  auto* max_T_option = app.add_option("--max-T", max_T, "largest T of the sweep (default: cpu 16384, cuda 32768)")
                           ->check(apps::at_least(1));
  app.add_flag("--quick", quick, "fewer repetitions and a shorter sweep (a smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (device == "cuda") {
    bench::CudaBenchOptions options;
    options.json_path = json_path;
    options.quick = quick;
    if (max_T_option->count() > 0) options.max_T = max_T;
    return bench::run_cuda_bench(options);
  }
  at::set_num_threads(threads);
  const int reps = quick ? 2 : 5;
  std::vector<Row> rows;
  fmt::print("torchattn_bench: {} threads, float32, d={}, {} heads\n", at::get_num_threads(), kDim, kHeads);

  // ---- main: B=4, T=1024 ----
  {
    const int64_t B = quick ? 1 : 4, T = quick ? 256 : 1024;
    Models m = make_models(T);
    torch::manual_seed(1);
    auto x = torch::randn({B, T, kDim});
    auto g = torch::randn({B, T, kDim});
    torch::Tensor ref;
    {
      torch::NoGradGuard ng;
      ref = m.reference(x);
    }
    double ref_fwd = 0, ref_bwd = 0;
    fmt::print("\n[main] B={} T={} forward (ms, median of {})\n", B, T, reps);
    for (auto& v : variants(m, T, true, true)) {
      double err;
      {
        torch::NoGradGuard ng;
        err = max_abs_diff(v.forward(x), ref);  // check before timing
      }
      TORCH_CHECK(err < 1e-4, "bench: ", v.name, " disagrees with the reference by ", err);
      Timing t = time_it(
          [&] {
            torch::NoGradGuard ng;
            v.forward(x);
          },
          reps, 1);
      if (v.name == "reference") ref_fwd = t.median_ms;
      const double gflops = useful_flops(B, T) / (t.median_ms * 1e6);
      fmt::print("  {:<18} {:9.1f} ms  {:6.1f} GFLOP/s  {:5.2f}x vs reference  (max |diff| {:.1e})\n", v.name,
                 t.median_ms, gflops, ref_fwd / t.median_ms, err);
      rows.push_back(Row()
                         .s("section", "forward")
                         .s("variant", v.name)
                         .n("B", B)
                         .n("T", T)
                         .n("median_ms", t.median_ms)
                         .n("min_ms", t.min_ms)
                         .n("reps", t.reps)
                         .n("gflops", gflops)
                         .n("speedup_vs_reference", ref_fwd / t.median_ms)
                         .n("max_abs_diff", err));
    }
    fmt::print("\n[main] B={} T={} forward+backward (ms, median of {})\n", B, T, reps);
    for (auto& v : variants(m, T, true, true)) {
      auto params = v.name == "libtorch_nn_mha" ? m.libtorch->parameters() : m.reference->parameters();
      if (v.name == "sdpa") params = m.sdpa->parameters();
      if (v.name == "auto") params = m.autob->parameters();
      Timing t = time_it(
          [&] {
            auto xi = x.detach().requires_grad_(true);
            v.forward(xi).backward(g);
            for (auto& p : params) p.mutable_grad() = torch::Tensor();
          },
          reps, 1);
      if (v.name == "reference") ref_bwd = t.median_ms;
      const double gflops = 3 * useful_flops(B, T) / (t.median_ms * 1e6);
      fmt::print("  {:<18} {:9.1f} ms  {:6.1f} GFLOP/s  {:5.2f}x vs reference\n", v.name, t.median_ms, gflops,
                 ref_bwd / t.median_ms);
      rows.push_back(Row()
                         .s("section", "forward_backward")
                         .s("variant", v.name)
                         .n("B", B)
                         .n("T", T)
                         .n("median_ms", t.median_ms)
                         .n("min_ms", t.min_ms)
                         .n("reps", t.reps)
                         .n("gflops", gflops)
                         .n("speedup_vs_reference", ref_bwd / t.median_ms));
    }
  }

  // ---- sweep: B=1, T = 128 .. max_T; forward time and peak RSS growth ----
  fmt::print("\n[sweep] B=1 forward: median ms and peak RSS growth (MiB)\n");
  for (int64_t T = 128; T <= (quick ? 1024 : max_T); T *= 2) {
    // The notebook math holds several [12, T, T] float tensors: 4096 is the largest
    // that fits this machine with room to spare.
    const bool with_reference = T <= 4096;
    const bool with_libtorch = T <= 4096;
    Models m = make_models(T);
    torch::manual_seed(2);
    auto x = torch::randn({1, T, kDim});
    torch::NoGradGuard ng;
    torch::Tensor check = m.autob(x);
    const int r = T >= 8192 ? 1 : T >= 2048 ? 2 : reps;
    double ref_ms = 0;
    // Checked against the Reference where it fits, else against Auto.
    const torch::Tensor expected = with_reference ? m.reference(x) : check;
    for (auto& v : variants(m, T, with_reference, with_libtorch)) {
      const double err = max_abs_diff(v.forward(x), expected);
      TORCH_CHECK(err < 1e-4, "bench: ", v.name, " disagrees at T=", T, " by ", err);
      malloc_trim(0);  // return memory freed by earlier variants, so each starts level
      const int64_t rss0 = status_kb("VmRSS:");
      reset_peak_rss();
      Timing t = time_it([&] { v.forward(x); }, r, T >= 8192 ? 0 : 1);
      const double peak_mib = (status_kb("VmHWM:") - rss0) / 1024.0;
      if (v.name == "reference") ref_ms = t.median_ms;
      const double gflops = useful_flops(1, T) / (t.median_ms * 1e6);
      fmt::print("  T={:<6} {:<18} {:10.1f} ms {:7.1f} GFLOP/s {:8.1f} MiB\n", T, v.name, t.median_ms, gflops,
                 peak_mib);
      Row row;
      row.s("section", "sweep")
          .s("variant", v.name)
          .n("B", 1)
          .n("T", T)
          .n("median_ms", t.median_ms)
          .n("min_ms", t.min_ms)
          .n("reps", t.reps)
          .n("gflops", gflops)
          .n("peak_rss_growth_mib", peak_mib)
          .n("max_abs_diff", err);
      if (ref_ms > 0) row.n("speedup_vs_reference", ref_ms / t.median_ms);
      rows.push_back(row);
    }
  }

  // ---- decode: 1024-token prompt, then 256 tokens one at a time ----
  {
    const int64_t prompt = quick ? 128 : 1024, steps = quick ? 16 : 256, C = prompt + steps;
    Models m = make_models(C);
    torch::manual_seed(3);
    auto x = torch::randn({1, C, kDim});
    torch::NoGradGuard ng;
    fmt::print("\n[decode] prompt {}, then {} tokens one at a time (auto backend)\n", prompt, steps);
    auto full = m.autob(x);
    auto cache = m.autob->make_kv_cache(1);
    m.autob->forward_cached(x.narrow(1, 0, prompt), cache);
    std::vector<torch::Tensor> outs;
    auto t0 = Clock::now();
    for (int64_t t = prompt; t < C; ++t) outs.push_back(m.autob->forward_cached(x.narrow(1, t, 1), cache));
    const double cached_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double err_cached = max_abs_diff(torch::cat(outs, 1), full.narrow(1, prompt, steps));
    TORCH_CHECK(err_cached < 1e-4, "bench: cached decode disagrees with the full forward by ", err_cached);

    t0 = Clock::now();
    double err_full = 0;
    for (int64_t t = prompt; t < C; ++t) {
      auto y = m.autob(x.narrow(1, 0, t + 1)).narrow(1, t, 1);
      err_full = std::max(err_full, max_abs_diff(y, full.narrow(1, t, 1)));
    }
    const double full_s = std::chrono::duration<double>(Clock::now() - t0).count();
    fmt::print("  with cache:    {:8.1f} tokens/s\n  without cache: {:8.1f} tokens/s\n  cache speedup: {:.1f}x\n",
               steps / cached_s, steps / full_s, full_s / cached_s);
    rows.push_back(Row()
                       .s("section", "decode")
                       .s("variant", "kv_cache")
                       .n("prompt", prompt)
                       .n("steps", steps)
                       .n("tokens_per_s", steps / cached_s)
                       .n("max_abs_diff", err_cached));
    rows.push_back(Row()
                       .s("section", "decode")
                       .s("variant", "recompute")
                       .n("prompt", prompt)
                       .n("steps", steps)
                       .n("tokens_per_s", steps / full_s)
                       .n("speedup_of_cache", full_s / cached_s)
                       .n("max_abs_diff", err_full));
  }

  // ---- gqa: 12 query heads over 12 or 3 key/value heads, decoding ----
  {
    const int64_t prompt = quick ? 128 : 1024, steps = quick ? 16 : 128, C = prompt + steps;
    torch::manual_seed(4);
    auto make = [&](int64_t kv) {
      torchattn::MultiHeadAttention m(
          torchattn::MultiHeadAttentionOptions(kDim, kDim, C, kHeads).num_kv_heads(kv).mask_buffer(false));
      m->eval();
      return m;
    };
    torchattn::MultiHeadAttention mha = make(kHeads), gqa = make(kHeads / 4);
    auto x = torch::randn({1, C, kDim});
    torch::NoGradGuard ng;
    fmt::print("\n[gqa] prompt {}, then {} tokens one at a time; {} query heads over {} (MHA) or {} (GQA) kv heads\n",
               prompt, steps, kHeads, kHeads, kHeads / 4);
    struct Run {
      std::string name;
      torchattn::MultiHeadAttention* m;
      std::vector<double> tokens_per_s;
      double cache_mib = 0, err = 0;
    };
    std::vector<Run> runs{{"mha", &mha, {}}, {"gqa_4to1", &gqa, {}}};
    for (int rep = 0; rep < (quick ? 1 : 5); ++rep) {
      for (auto& r : runs) {  // interleaved: both see the same machine state
        auto cache = (*r.m)->make_kv_cache(1);
        (*r.m)->forward_cached(x.narrow(1, 0, prompt), cache);
        std::vector<torch::Tensor> outs;
        auto t0 = Clock::now();
        for (int64_t t = prompt; t < C; ++t) outs.push_back((*r.m)->forward_cached(x.narrow(1, t, 1), cache));
        r.tokens_per_s.push_back(steps / std::chrono::duration<double>(Clock::now() - t0).count());
        r.cache_mib = 2.0 * cache.key_storage().numel() * cache.key_storage().element_size() / (1 << 20);
        r.err = max_abs_diff(torch::cat(outs, 1),
                             (*r.m)(x).narrow(1, prompt, steps));  // checked against the full forward
        TORCH_CHECK(r.err < 1e-4, "bench: ", r.name, " cached decode disagrees with its full forward by ", r.err);
      }
    }
    for (auto& r : runs) {
      std::sort(r.tokens_per_s.begin(), r.tokens_per_s.end());
      const double median = r.tokens_per_s[r.tokens_per_s.size() / 2];
      fmt::print("  {:<10} {:8.1f} tokens/s  KV cache {:7.2f} MiB\n", r.name, median, r.cache_mib);
      rows.push_back(Row()
                         .s("section", "gqa")
                         .s("variant", r.name)
                         .n("prompt", prompt)
                         .n("steps", steps)
                         .n("tokens_per_s", median)
                         .n("kv_cache_mib", r.cache_mib)
                         .n("max_abs_diff", r.err));
    }
  }

  // ---- rope: the main forward with and without rotary embeddings ----
  {
    const int64_t B = quick ? 1 : 4, T = quick ? 256 : 1024;
    torch::manual_seed(5);
    torchattn::MultiHeadAttention plain(torchattn::MultiHeadAttentionOptions(kDim, kDim, T, kHeads));
    torchattn::MultiHeadAttention rope(
        torchattn::MultiHeadAttentionOptions(kDim, kDim, T, kHeads).rope(torchattn::RoPEOptions()));
    {
      torch::NoGradGuard g;
      for (auto& p : rope->named_parameters()) p.value().copy_(plain->named_parameters()[p.key()]);
    }
    plain->eval();
    rope->eval();
    auto x = torch::randn({B, T, kDim});
    torch::NoGradGuard ng;
    fmt::print("\n[rope] B={} T={} forward with and without RoPE (ms, median of interleaved runs)\n", B, T);
    std::vector<double> a, b;
    plain(x);
    rope(x);
    for (int rep = 0; rep < (quick ? 2 : 9); ++rep) {
      a.push_back(time_it([&] { plain(x); }, 1, 0).median_ms);
      b.push_back(time_it([&] { rope(x); }, 1, 0).median_ms);
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    const double ma = a[a.size() / 2], mb = b[b.size() / 2];
    fmt::print("  without RoPE {:8.1f} ms\n  with RoPE    {:8.1f} ms  ({:+.1f}%)\n", ma, mb, 100.0 * (mb / ma - 1.0));
    rows.push_back(Row().s("section", "rope").s("variant", "without").n("B", B).n("T", T).n("median_ms", ma));
    rows.push_back(Row()
                       .s("section", "rope")
                       .s("variant", "with")
                       .n("B", B)
                       .n("T", T)
                       .n("median_ms", mb)
                       .n("overhead", mb / ma - 1.0));
  }

  // ---- softcap, sinks, ALiBi and a window: the variants of today's models ----
  // Softcap and sinks take no fused kernel (blocks of queries); on the CPU the softcap,
  // ALiBi and the window run on the library's flex kernels (src/backends/named_flex.cpp).
  {
    const int64_t B = quick ? 1 : 4, T = quick ? 256 : 1024, long_T = quick ? 2048 : 16384;
    auto build = [&](int variant, int64_t context) {
      torch::manual_seed(6);  // the same weights for each
      auto o = torchattn::MultiHeadAttentionOptions(kDim, kDim, context, kHeads).mask_buffer(false);
      if (variant == 1) o.softcap(50.0);
      if (variant == 2) o.sinks(true);
      if (variant == 3) o.alibi(true);
      if (variant == 4) o.window(kScoresWindow);
      torchattn::MultiHeadAttention m(o);
      m->eval();
      return m;
    };
    const char* names[] = {"without", "softcap", "sinks", "alibi", "window"};
    constexpr int kVariants = 5;
    torch::NoGradGuard ng;
    fmt::print(
        "\n[scores] B={} T={} forward without, with softcap(50), sinks, alibi, window({}) (ms, median of interleaved "
        "runs)\n",
        B, T, kScoresWindow);
    std::vector<torchattn::MultiHeadAttention> ms;
    for (int i = 0; i < kVariants; ++i) ms.push_back(build(i, T));
    auto x = torch::randn({B, T, kDim});
    std::vector<std::vector<double>> times(kVariants);
    for (auto& m : ms) m(x);
    for (int rep = 0; rep < (quick ? 2 : 7); ++rep) {
      for (int i = 0; i < kVariants; ++i) times[i].push_back(time_it([&] { ms[i](x); }, 1, 0).median_ms);
    }
    std::vector<double> med(kVariants);
    for (int i = 0; i < kVariants; ++i) {
      std::sort(times[i].begin(), times[i].end());
      med[i] = times[i][times[i].size() / 2];
      fmt::print("  {:<8} {:8.1f} ms ({:.2f}x)\n", names[i], med[i], med[i] / med[0]);
      rows.push_back(Row()
                         .s("section", "scores")
                         .s("variant", names[i])
                         .n("B", B)
                         .n("T", T)
                         .n("median_ms", med[i])
                         .n("ratio", med[i] / med[0]));
    }
    // Peak memory of one forward at B=1 and a long sequence: blocks of queries, never T x T.
    fmt::print("[scores] B=1 T={} forward: peak RSS growth (MiB)\n", long_T);
    auto long_x = torch::randn({1, long_T, kDim});
    for (int i = 0; i < kVariants; ++i) {
      auto m = build(i, long_T);
      malloc_trim(0);
      const int64_t rss0 = status_kb("VmRSS:");
      reset_peak_rss();
      const auto t0 = Clock::now();
      m(long_x);
      const double ms_taken = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      const double peak_mib = (status_kb("VmHWM:") - rss0) / 1024.0;
      fmt::print("  {:<8} {:8.1f} MiB {:10.0f} ms\n", names[i], peak_mib, ms_taken);
      rows.push_back(Row()
                         .s("section", "scores_memory")
                         .s("variant", names[i])
                         .n("B", 1)
                         .n("T", long_T)
                         .n("peak_rss_growth_mib", peak_mib)
                         .n("ms", ms_taken));
    }
  }

  if (!json_path.empty()) {
    std::ostringstream meta;
    meta << "\"tool\": \"torchattn_bench\", \"torchattn\": \"" << TORCHATTN_VERSION << "\", \"threads\": " << threads
         << ", \"quick\": " << (quick ? "true" : "false");
    std::ofstream(json_path) << bench::to_json(rows, meta.str());
    fmt::print("\nwrote {}\n", json_path);
  }
  return 0;
}
