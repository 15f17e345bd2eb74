#include <torchattn/self_attention_v2.h>

#include "block/attention_block.h"
#include "base/checks.h"
#include "modules/held_attention.h"
#include "serialize/checkpoint_options.h"
#include "serialize/strict_load.h"

#include <cmath>
#include <ostream>

namespace torchattn {

namespace {
constexpr const char* kSelfAttentionV2 = "SelfAttentionV2";
}

SelfAttentionV2Impl::SelfAttentionV2Impl(const SelfAttentionV2Options& options_) : options(options_) { reset(); }

void SelfAttentionV2Impl::reset() {
  base::check_reset_unbuilt(kSelfAttentionV2, *this);
  base::check_positive(kSelfAttentionV2, "d_in", options.d_in());
  base::check_positive(kSelfAttentionV2, "d_out", options.d_out());
  base::check_scale(kSelfAttentionV2, options.scale());
  const auto linear = LinearOptions(options.d_in(), options.d_out()).bias(options.qkv_bias());
  W_query = register_module("W_query", Linear(linear));
  W_key = register_module("W_key", Linear(linear));
  W_value = register_module("W_value", Linear(linear));
  // No mask, one head ([B, T, d_out] throughout), held for every call.
  static const at::Tensor kNoMask;
  held_ = std::make_shared<modules::HeldAttention>();
  held_->self.emplace(block::AttentionBlock{.W_query = W_query,
                                            .W_key = W_key,
                                            .W_value = W_value,
                                            .num_heads = 0,
                                            .num_kv_heads = 0,
                                            .causal = false,
                                            .mask = kNoMask});
}

void SelfAttentionV2Impl::save(torch::serialize::OutputArchive& archive) const {
  serialize::save_with_options(*this, archive);
}

void SelfAttentionV2Impl::load(torch::serialize::InputArchive& archive) {
  serialize::strict_load(*this, archive, kSelfAttentionV2, serialize::archive_path(archive));
}

CheckpointOptions SelfAttentionV2Impl::checkpoint_options() const {
  return {{"scale", serialize::option_text(options.scale())}};
}

void SelfAttentionV2Impl::pretty_print(std::ostream& stream) const {
  stream << "torchattn::SelfAttentionV2(d_in=" << options.d_in() << ", d_out=" << options.d_out()
         << ", qkv_bias=" << std::boolalpha << options.qkv_bias() << ", backend=" << options.backend() << ")";
}

at::Tensor SelfAttentionV2Impl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                        const at::Tensor& key_bias) {
  base::check_input(kSelfAttentionV2, x, options.d_in(), /*context_length=*/0, W_query->weight);
  base::check_key_padding_mask(kSelfAttentionV2, key_padding_mask, x);
  base::check_key_bias(kSelfAttentionV2, key_bias, x);
  base::check_some_key_kept(kSelfAttentionV2, key_padding_mask);
  // The notebook divides by torch.sqrt(torch.tensor(d_out)): a float32 square root,
  // even for float64 inputs. Mirror it so float64 matches the Python code too.
  const double default_scale = 1.0 / static_cast<double>(std::sqrt(static_cast<float>(options.d_out())));
  const functional::AttentionOptions& config = modules::refresh(held_->train,
                                                                {.scale = options.scale().value_or(default_scale),
                                                                 .training = is_training(),
                                                                 .backend = options.backend()});
  return block::with_batch_dim(x, key_padding_mask, key_bias,
                               [&](const at::Tensor& xb, const at::Tensor& mb, const at::Tensor& bb) {
                                 return block::attention_block_forward(*held_->self, xb, nullptr, config, mb, bb);
                               });
}

}  // namespace torchattn
