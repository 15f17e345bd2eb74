// The blocked backend (backends/blocked.cpp: softcapping and attention sinks) against
// the layer written out in float64, forward and backward.

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

// Softcapping and sinks take the blocked path: its gradients (each block recomputed in
// backward) against autograd through the layer written out; and a sequence long enough
// for several blocks against the whole-matrix math.
torch::Tensor softcap_sinks_layer(const torch::Tensor& x, const torch::Tensor& wq, const torch::Tensor& wk,
                                  const torch::Tensor& wv, const torch::Tensor& wo, const torch::Tensor& bo,
                                  const torch::Tensor& sinks, int64_t H, int64_t Hkv, double cap) {
  const int64_t B = x.size(0), T = x.size(1), hd = wq.size(0) / H;
  auto q = x.matmul(wq.t()).view({B, T, H, hd}).transpose(1, 2);
  auto k = x.matmul(wk.t()).view({B, T, Hkv, hd}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
  auto v = x.matmul(wv.t()).view({B, T, Hkv, hd}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
  auto s = q.matmul(k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
  s = torch::tanh(s / cap) * cap;
  s = s.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
  auto p = torch::softmax(torch::cat({s, sinks.view({1, H, 1, 1}).expand({B, H, T, 1})}, -1), -1).narrow(-1, 0, T);
  return p.matmul(v).transpose(1, 2).reshape({B, T, H * hd}).matmul(wo.t()) + bo;
}

TEST(ModernAttention, SoftcapAndSinksGradientsAreTheMath) {
  for (const auto& [T, dtype] :
       std::vector<std::pair<int64_t, torch::Dtype>>{{9, torch::kFloat64}, {1100, torch::kFloat32}}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    torch::manual_seed(11);
    const int64_t H = T > 100 ? 2 : 4, Hkv = T > 100 ? 1 : 2;
    torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(12, 16, T, H)
                                        .num_kv_heads(Hkv)
                                        .softcap(2.0)
                                        .sinks(true)
                                        .mask_buffer(false));
    m->to(dtype);
    {
      torch::NoGradGuard no_grad;
      m->sinks.uniform_(-1.0, 1.0);
    }
    const auto x = torch::randn({1, T, 12}, dtype).requires_grad_(true);
    const auto g = torch::randn({1, T, 16}, dtype);
    (m(x) * g).sum().backward();  // two blocks at T = 1100 (2 heads x 1100 keys a row)
    auto leaf = [&](const torch::Tensor& t) { return t.detach().to(torch::kFloat64).requires_grad_(true); };
    const auto x2 = leaf(x), wq = leaf(m->W_query->weight), wk = leaf(m->W_key->weight), wv = leaf(m->W_value->weight),
               wo = leaf(m->out_proj->weight), bo = leaf(m->out_proj->bias), s2 = leaf(m->sinks);
    (softcap_sinks_layer(x2, wq, wk, wv, wo, bo, s2, H, Hkv, 2.0) * g.to(torch::kFloat64)).sum().backward();
    const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-4;
    auto close = [&](const torch::Tensor& a, const torch::Tensor& b, const char* what) {
      const double err = (a.to(torch::kFloat64) - b).abs().max().item<double>() /
                         (b.abs().max().item<double>() + 1e-30);
      EXPECT_LT(err, tol) << what;
    };
    close(x.grad(), x2.grad(), "grad of x");
    close(m->W_query->weight.grad(), wq.grad(), "grad of W_query");
    close(m->W_key->weight.grad(), wk.grad(), "grad of W_key");
    close(m->W_value->weight.grad(), wv.grad(), "grad of W_value");
    close(m->out_proj->weight.grad(), wo.grad(), "grad of out_proj");
    close(m->sinks.grad(), s2.grad(), "grad of sinks");
  }
}

}  // namespace
