// torchattn_demo: walks through the five notebooks in order and prints the tensors
// they print, computed by torchattn.
//
//   torchattn_demo [--device cpu|cuda] [--seed N]

#include <torchattn/torchattn.h>

#include "fmt.h"

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>

namespace F = torchattn::functional;

namespace {

int step_no = 0;

void heading(const std::string& notebook, const std::string& title) {
  fmt::print("\n=== {} | step {}: {} ===\n", notebook, ++step_no, title);
}

// Prints like Python's tensor repr, 4 decimals, so the numbers line up with the notebooks.
void print_rows(const torch::Tensor& t, int indent) {
  if (t.dim() == 0) {
    double v = t.item<double>();
    if (std::isinf(v)) {
      fmt::print("{:>7}", v < 0 ? "-inf" : "inf");
    } else {
      // '>': fmt left-aligns nan in a width by default; printf's %7.4f right-aligned it.
      fmt::print("{:>7.4f}", v);
    }
    return;
  }
  fmt::print("[");
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (i > 0) {
      if (t.dim() > 1) {
        fmt::print(",\n{:{}}", "", indent + 1);
      } else {
        fmt::print(", ");
      }
      if (t.dim() > 2) fmt::print("\n{:{}}", "", indent + 1);
    }
    print_rows(t[i], indent + 1);
  }
  fmt::print("]");
}

void show(const std::string& label, const torch::Tensor& t) {
  fmt::print("{}{}tensor(", label, label.empty() ? "" : ":\n");
  print_rows(t.detach().to(torch::kCPU, torch::kFloat64), 7);
  fmt::print(")\n");
}

torch::Tensor notebook_inputs() {
  return torch::tensor({{0.43, 0.15, 0.89},   // Your     (x^1)
                        {0.55, 0.87, 0.66},   // journey  (x^2)
                        {0.57, 0.85, 0.64},   // starts   (x^3)
                        {0.22, 0.58, 0.33},   // with     (x^4)
                        {0.77, 0.25, 0.10},   // one      (x^5)
                        {0.05, 0.80, 0.55}},  // step     (x^6)
                       torch::kFloat32);
}

void notebook000(const torch::Device& device, int64_t seed) {
  const std::string nb = "000 causal attention";
  heading(nb, "lower and upper triangular matrices (tril / triu)");
  show("torch::tril(torch::ones({4, 4}))", torch::tril(torch::ones({4, 4})));
  show("torch::triu(torch::ones({4, 4}))", torch::triu(torch::ones({4, 4})));
  show("the mask: torch::triu(torch::ones({3, 3}), 1) (1 = hidden future token)", F::causal_mask_buffer(3));

  heading(nb, "unscaled causal attention (q k^T, -inf fill, softmax, weights @ v), .scale(1.0)");
  auto inputs = notebook_inputs().to(device);
  torch::manual_seed(seed);
  torchattn::CausalAttention ca(
      torchattn::CausalAttentionOptions(3, 2, 6).scale(1.0).backend(torchattn::Backend::Reference));
  ca->to(device);
  auto q = ca->W_query(inputs), k = ca->W_key(inputs);
  auto scores = q.matmul(k.transpose(-2, -1));
  show("attention_scores after masked_fill_(mask, -inf)",
       scores.masked_fill(F::causal_mask_buffer(6).to(device).to(torch::kBool), -INFINITY));
  show("context_vectors (weights from seed " + std::to_string(seed) + "; the notebook set none)", ca(inputs));
}

void notebook001(const torch::Device& device, std::optional<int64_t> seed) {
  const std::string nb = "001 causal self-attention";
  auto inputs = notebook_inputs().to(device);
  heading(nb, "SelfAttentionV2 with seed " + std::to_string(seed.value_or(789)) + ": scaled softmax weights");
  torch::manual_seed(seed.value_or(789));
  torchattn::SelfAttentionV2 sa(3, 2);
  sa->to(device);
  auto queries = sa->W_query(inputs), keys = sa->W_key(inputs), values = sa->W_value(inputs);
  auto attn_scores = queries.matmul(keys.t());
  auto attn_weights = torch::softmax(attn_scores / std::sqrt(static_cast<double>(keys.size(-1))), -1);
  show("attn_weights", attn_weights);

  heading(nb, "the mask from tril: weights * tril(ones), then renormalise each row");
  const int64_t context_length = attn_weights.size(0);
  auto mask_simple = torch::tril(torch::ones({context_length, context_length}, inputs.options()));
  show("mask_simple", mask_simple);
  auto masked = attn_weights * mask_simple;
  show("masked_attn_weights", masked);
  show("sum_rows", masked.sum(1, true));
  show("masked_attn_weights_norm (functional::softmax_mask_renormalize)",
       F::softmax_mask_renormalize(attn_scores / std::sqrt(2.0), mask_simple));

  heading(nb, "the -inf method: triu mask, masked_fill(-inf), divide by sqrt(d_k), softmax");
  show("attn_scores", attn_scores);
  auto mask = F::causal_mask_buffer(context_length, inputs.options());
  auto attn_scores_masked = attn_scores.masked_fill(mask.to(torch::kBool), -INFINITY);
  show("attn_scores_masked", attn_scores_masked);
  auto scaled = attn_scores_masked / std::sqrt(static_cast<double>(keys.size(-1)));
  show("attn_scores_masked_scaled", scaled);
  auto attn_weights_masked = torch::softmax(scaled, 1);
  show("attn_weights_masked (same as the renormalised weights)", attn_weights_masked);

  heading(nb, "dropout(0.5): kept values are scaled by 1/(1-p) = 2");
  torch::nn::Dropout dropout(0.5);
  show("dropout(ones(6, 6))", dropout(torch::ones({6, 6}, inputs.options())));
  auto attn_weights_do = dropout(attn_weights_masked);
  show("attn_weights_do", attn_weights_do);
  show("context_matrix = attn_weights_do @ values", attn_weights_do.matmul(values));

  heading(nb, "a batch of two inputs, and CausalAttention with seed " + std::to_string(seed.value_or(123)));
  auto batch = torch::stack({inputs, inputs}, 0);
  fmt::print("batch.sizes() = {}\n", fmt::streamed(batch.sizes()));
  torch::manual_seed(seed.value_or(123));
  torchattn::CausalAttention ca(3, 2, 6, 0.0);
  ca->to(device);
  show("context_vecs", ca(batch));
}

void notebook002(const torch::Device& device) {
  const std::string nb = "002 dot product attention";
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto q = torch::tensor({{1, 0, 0}, {0, 1, 0}}, opts);
  auto k = torch::tensor({{1, 2, 3}, {4, 5, 6}}, opts);
  auto v = torch::tensor({{0, 1, 0}, {1, 0, 1}}, opts);
  auto m = torch::tensor({{1, 0}, {1, 0}}, opts);
  heading(nb, "dot_product_attention(q, k, v, mask=m): softmax(q k^T / sqrt(d) + (1 - m) * -1e9) v");
  show("Attention weights", F::dot_product_attention_weights(q, k, m));
  show("output", F::dot_product_attention(q, k, v, m));

  heading(nb, "causal_dot_product_attention(q, k, v): the mask is tril(ones(T, T))");
  auto causal = torch::tril(torch::ones({2, 2}, opts));
  show("Causal mask", causal);
  show("Attention weights", F::dot_product_attention_weights(q, k, causal));
  show("output", F::causal_dot_product_attention(q, k, v));
}

void notebook003(const torch::Device& device, std::optional<int64_t> seed) {
  const std::string nb = "003 causal and multi-head attention";
  heading(nb, "CausalAttention(16, 3, 10, 0.0) on a random batch [4, 10, 16]");
  auto batch = torch::randn({4, 10, 16}, torch::TensorOptions().device(device));
  torch::manual_seed(seed.value_or(123));
  torchattn::CausalAttention ca(16, 3, 10, 0.0);
  ca->to(device);
  fmt::print("context_vecs.shape: {}\n", fmt::streamed(ca(batch).sizes()));

  heading(nb, "heads as a batch dimension: a @ a.transpose(2, 3) for each head");
  auto a = torch::tensor(
      {{{{0.2745, 0.6584, 0.2775, 0.8573}, {0.8993, 0.0390, 0.9268, 0.7388}, {0.7179, 0.7058, 0.9156, 0.4340}},
        {{0.0772, 0.3565, 0.1479, 0.5331}, {0.4066, 0.2318, 0.4545, 0.9737}, {0.4606, 0.5159, 0.4220, 0.5786}}}},
      torch::TensorOptions().dtype(torch::kFloat32).device(device));
  show("a @ a.transpose(2, 3)", a.matmul(a.transpose(2, 3)));
  show("First head", a[0][0].matmul(a[0][0].t()));
  show("Second head", a[0][1].matmul(a[0][1].t()));

  heading(nb, "MultiHeadAttention(3, 2, 6, 0.0, num_heads=2) with seed " + std::to_string(seed.value_or(123)) +
                  ": view/transpose into heads, causal softmax, merge, out_proj");
  auto inputs = notebook_inputs().to(device);
  auto stacked = torch::stack({inputs, inputs}, 0);
  torch::manual_seed(seed.value_or(123));
  torchattn::MultiHeadAttention mha(3, 2, 6, 0.0, 2);
  mha->to(device);
  {
    // The head split the module does inside forward, shown on its own queries.
    auto queries = mha->W_query(stacked);
    auto split = queries.view({2, 6, 2, 1});
    fmt::print("queries {} -> view(b, num_tokens, num_heads, head_dim) {} -> transpose(1, 2) {}\n",
               fmt::streamed(queries.sizes()), fmt::streamed(split.sizes()),
               fmt::streamed(split.transpose(1, 2).sizes()));
    fmt::print("scores per head: queries @ keys.transpose(2, 3) -> [2, 2, 6, 6]; masked_fill(-inf), "
               "softmax(scores / sqrt(head_dim)), @ values, transpose back, view [2, 6, 2], out_proj\n");
  }
  auto y = mha(stacked);
  show("context_vecs", y);
  fmt::print("context_vecs.shape: {}\n{}\n", fmt::streamed(y.sizes()), fmt::streamed(*mha));
}

void notebook004(const torch::Device& device) {
  const std::string nb = "004 causal mask";
  heading(nb, "make_causal_mask(4): 0 where key <= query, -1e9 above the diagonal");
  auto cm = F::make_causal_mask(4, -1e9, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  fmt::print("causal_mask=\n{}\n", fmt::streamed(cm));

  heading(nb, "scores + causal_mask, softmax (max-subtracted), Attn @ V");
  torch::manual_seed(4);
  auto scores = torch::rand({4, 4}, cm.options());
  show("scores", scores);
  auto attn = torch::softmax(scores + cm, -1);
  show("Attn", attn);
  auto V = torch::rand({4, 4}, cm.options());
  show("Output from attention head", attn.matmul(V));

  heading(nb, "many batches and heads: Q, K, V [B=2, H=3, T=4, dh=2], mask broadcast as [1, 1, T, T]");
  auto Q = torch::rand({2, 3, 4, 2}, cm.options()), K = torch::rand({2, 3, 4, 2}, cm.options()),
       Vb = torch::rand({2, 3, 4, 2}, cm.options());
  auto s = Q.matmul(K.transpose(-2, -1)) / std::sqrt(2.0) + cm.unsqueeze(0).unsqueeze(0);
  fmt::print("scores.shape: {}\n", fmt::streamed(s.sizes()));
  auto Ab = torch::softmax(s, -1);
  show("Attn[0][0]", Ab[0][0]);
  fmt::print("output.shape: {}\n", fmt::streamed(Ab.matmul(Vb).sizes()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torchattn demo: the five attention notebooks, step by step, computed by torchattn"};
  std::string device_name = "cpu";
  std::optional<int64_t> seed;
  app.add_option("--device", device_name, "where the modules run")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--seed", seed, "replace the notebooks' seeds (789, 123) by this one");
  CLI11_PARSE(app, argc, argv);

  if (device_name == "cuda" && !torch::cuda::is_available()) {
    fmt::print(stderr, "torchattn_demo: --device cuda was asked for, but CUDA is not available "
                       "(no GPU, or a CPU-only LibTorch). Run with --device cpu.\n");
    return 1;
  }
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  fmt::print("torchattn {} demo on {}{}\n", TORCHATTN_VERSION, device.str(),
             seed ? ", seed " + std::to_string(*seed) : std::string(", the notebooks' seeds"));
  try {
    notebook000(device, seed.value_or(123));
    notebook001(device, seed);
    notebook002(device);
    notebook003(device, seed);
    notebook004(device);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "torchattn_demo: {}\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
