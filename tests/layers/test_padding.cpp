// padding_mask_from_attention_mask (layers/padding.cpp): a Hugging Face attention_mask
// to torchattn's key padding mask, and the slip of converting it the wrong way.

#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

// Hugging Face's attention_mask (1 = token) becomes torchattn's key_padding_mask
// (true = ignore) by padding_mask_from_attention_mask, and the module then gives each
// sequence's rows as it gives them alone; the slip (.to(kBool)) is far off, and an
// integer mask passed as it is names the conversion.
TEST(HuggingFaceMask, ConvertsToThePaddingMaskAndTheSlipIsNamed) {
  torch::manual_seed(5);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2).causal(false));
  mha->eval();
  torch::NoGradGuard no_grad;
  const auto attention_mask = torch::tensor({{1, 1, 1, 0, 0}, {1, 1, 1, 1, 0}}, torch::kLong);
  const auto pad = torchattn::padding_mask_from_attention_mask(attention_mask);
  EXPECT_EQ(pad.scalar_type(), torch::kBool);
  EXPECT_TRUE(torch::equal(pad, attention_mask == 0));
  const auto x = torch::randn({2, 5, 8});
  const auto y = mha(x, pad);
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t n = attention_mask[b].sum().item<int64_t>();
    EXPECT_TRUE(tol::close(y[b].narrow(0, 0, n), mha(x[b].narrow(0, 0, n).unsqueeze(0))[0])) << "sequence " << b;
  }
  // Every sequence is padded, so the slip passes the all-hidden check and is silently wrong.
  const auto slip = mha(x, attention_mask.to(torch::kBool));
  EXPECT_GT((slip - y).abs().max().item<double>(), 0.1);
  expect_error([&] { mha(x, attention_mask); }, "pass attention_mask == 0, or "
                                                "torchattn::padding_mask_from_attention_mask(attention_mask)");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::tensor({1, 2, 0})); },
               "padding_mask_from_attention_mask: expected an attention_mask of 0s and 1s, got other values");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::ones({2, 3})); },
               "padding_mask_from_attention_mask: expected an integer or bool attention_mask (1 = token, 0 = padding), "
               "got Float");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::ones({1, 2, 3}, torch::kLong)); },
               "padding_mask_from_attention_mask: expected attention_mask of shape [B, T] or [T], got [1, 2, 3]");
}

}  // namespace
