// Cross-attention (block/cross_attention_block.cpp, through MultiHeadAttention's
// cross_kv and forward_cross) against the math in float64.

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace {

// Cross-attention with keys and values of widths of their own (kdim, vdim), a padded
// context, grouped heads and QK-norm, against the math in float64; the cross cache
// (cross_kv once, then a token at a time) gives the rows of the whole forward.
TEST(ModernAttention, CrossAttentionIsTheMathOverItsContext) {
  torch::manual_seed(61);
  const int64_t B = 2, T = 4, S = 6, d_in = 8, kdim = 6, vdim = 5, H = 4, Hkv = 2, hd = 3;
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(d_in, 10, 16, H)
                                      .num_kv_heads(Hkv)
                                      .head_dim(hd)
                                      .kdim(kdim)
                                      .vdim(vdim)
                                      .causal(false)
                                      .qkv_bias(true)
                                      .qk_norm(torchattn::QKNormOptions()));
  EXPECT_EQ(m->W_key->weight.sizes(), (std::vector<int64_t>{Hkv * hd, kdim}));
  EXPECT_EQ(m->W_value->weight.sizes(), (std::vector<int64_t>{Hkv * hd, vdim}));
  m->q_norm->weight.data().uniform_(0.5, 1.5);
  m->k_norm->weight.data().uniform_(0.5, 1.5);
  m->to(torch::kFloat64);
  const auto x = torch::randn({B, T, d_in}, torch::kFloat64), kc = torch::randn({B, S, kdim}, torch::kFloat64);
  const auto vc = torch::randn({B, S, vdim}, torch::kFloat64);
  auto pad = torch::zeros({B, S}, torch::kBool);
  pad[1].narrow(0, 4, 2).fill_(true);
  auto lin = [](const torchattn::Linear& l, const torch::Tensor& in) { return in.matmul(l->weight.t()) + l->bias; };
  auto rms = [](const torch::Tensor& t, const torchattn::RMSNorm& n) {
    const auto h = t.to(torch::kFloat32);
    return n->weight * (h * torch::rsqrt(h.pow(2).mean(-1, true) + n->eps)).to(torch::kFloat64);
  };
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    const auto q = rms(lin(m->W_query, x).view({B, T, H, hd}), m->q_norm).transpose(1, 2);
    const auto k = rms(lin(m->W_key, kc).view({B, S, Hkv, hd}), m->k_norm).transpose(1, 2).repeat_interleave(2, 1);
    const auto v = lin(m->W_value, vc).view({B, S, Hkv, hd}).transpose(1, 2).repeat_interleave(2, 1);
    auto scores = q.matmul(k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(pad.view({B, 1, 1, S}), -INFINITY);
    want = lin(m->out_proj, torch::softmax(scores, -1).matmul(v).transpose(1, 2).reshape({B, T, H * hd}));
  }
  const auto kv = m->cross_kv(kc, pad, vc);
  EXPECT_EQ(kv.keys.sizes(), (std::vector<int64_t>{B, Hkv, S, hd}));
  const auto y = m->forward_cross(x, kv);
  EXPECT_LT((y - want).abs().max().item<double>(), 1e-12);
  torch::NoGradGuard no_grad;
  for (int64_t t = 0; t < T; ++t) {  // the cross cache, a token at a time
    EXPECT_LT((m->forward_cross(x.narrow(1, t, 1), kv) - want.narrow(1, t, 1)).abs().max().item<double>(), 1e-12);
  }
  // Unbatched: [T, d_in] over [S, kdim].
  const auto one = m->forward_cross(x[0], m->cross_kv(kc[0], pad[0], vc[0]));
  EXPECT_LT((one - want[0]).abs().max().item<double>(), 1e-12);
}

}  // namespace
