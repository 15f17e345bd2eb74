// torchattn_bench_packed: documents packed end to end against the same documents as a
// padded batch and against one long sequence, one case a process (so that each peak
// resident set is the case's own), for apps/bench/packed/bench_packed.py.
//
//   torchattn_bench_packed --case module-packed|module-batch|core-packed|core-long
//                          [--docs 64] [--len 256] [--reps 5] [--threads 2]
//
// module-packed  MultiHeadAttention(768, 768, context --len, 12 heads).forward_packed on
//                x [docs * len, 768] with cu_seqlens of --docs documents of --len tokens
// module-batch   the same module's forward on x [docs, len, 768]
// core-packed    functional::attention_packed, causal, q k v [1, 12, docs * len, 64]
// core-long      ATen's scaled_dot_product_attention(is_causal) on the same q k v as
//                one sequence of docs * len tokens
// Each: forward, and forward+backward (x or q, k, v and every weight get gradients),
// medians of --reps after one warm-up; the peak RSS of the process and its growth
// over the RSS before the case's tensors were made. One JSON object on stdout.

#include "cli_checks.h"
#include "fmt.h"

#include <torchattn/torchattn.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kPackedDim = 768, kPackedHeads = 12;

int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(key)) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

double median_s(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torchattn_bench_packed: packed documents against a padded batch and one long sequence"};
  std::string which;
  int64_t docs = 64, len = 256;
  int reps = 5, threads = 2;
  app.add_option("--case", which, "what to run")
      ->required()
      ->check(CLI::IsMember({"module-packed", "module-batch", "core-packed", "core-long"}));
  app.add_option("--docs", docs, "documents")->check(apps::at_least(1));
  app.add_option("--len", len, "tokens per document")->check(apps::at_least(1));
  app.add_option("--reps", reps, "timed repetitions (the median is reported)")->check(apps::at_least(1));
  app.add_option("--threads", threads, "intra-op threads")->check(apps::at_least(1));
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const int64_t N = docs * len, head_dim = kPackedDim / kPackedHeads;
  const int64_t rss_before_kib = status_kib("VmRSS:");

  std::function<torch::Tensor()> forward;
  std::vector<torch::Tensor> grads_of;
  torchattn::MultiHeadAttention mha{nullptr};
  torch::Tensor x, q, k, v, cu;
  std::vector<int64_t> offsets;
  for (int64_t s = 0; s <= docs; ++s) offsets.push_back(s * len);
  cu = torch::tensor(offsets, torch::kLong);
  if (which.starts_with("module")) {
    mha = torchattn::MultiHeadAttention(
        torchattn::MultiHeadAttentionOptions(kPackedDim, kPackedDim, len, kPackedHeads).qkv_bias(true));
    x = which == "module-packed" ? torch::randn({N, kPackedDim}) : torch::randn({docs, len, kPackedDim});
    x.requires_grad_(true);
    forward = [&] { return which == "module-packed" ? mha->forward_packed(x, cu) : mha->forward(x); };
    grads_of = mha->parameters();
    grads_of.push_back(x);
  } else {
    const auto opts = torch::TensorOptions().requires_grad(true);
    q = torch::randn({1, kPackedHeads, N, head_dim}, opts);
    k = torch::randn({1, kPackedHeads, N, head_dim}, opts);
    v = torch::randn({1, kPackedHeads, N, head_dim}, opts);
    forward = [&] {
      return which == "core-packed" ? torchattn::functional::attention_packed(q, k, v, cu, /*causal=*/true)
                                    : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    };
    grads_of = {q, k, v};
  }
  const double fwd = median_s(
      [&] {
        torch::NoGradGuard no_grad;
        forward();
      },
      reps);
  const double fwd_bwd = median_s(
      [&] {
        for (auto& t : grads_of) t.mutable_grad() = torch::Tensor();
        forward().sum().backward();
      },
      reps);
  const int64_t peak_kib = status_kib("VmHWM:");
  fmt::print("{{\"case\": \"{}\", \"docs\": {}, \"len\": {}, \"threads\": {}, \"reps\": {}, \"forward_s\": {:.6f}, "
             "\"forward_backward_s\": {:.6f}, \"peak_rss_mib\": {:.1f}, \"peak_rss_growth_mib\": {:.1f}}}\n",
             which, docs, len, threads, reps, fwd, fwd_bwd, peak_kib / 1024.0, (peak_kib - rss_before_kib) / 1024.0);
  return 0;
}
