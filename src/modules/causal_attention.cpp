#include <torchattn/causal_attention.h>

#include <torchattn/functional.h>

#include "block/attention_block.h"
#include "base/checks.h"
#include "layers/rope_checks.h"
#include "modules/cache_checks.h"
#include "modules/attention_facts.h"
#include "modules/held_attention.h"
#include "serialize/strict_load.h"

#include <cstdint>
#include <ostream>
#include <vector>

namespace torchattn {

namespace {
constexpr const char* kCausalAttention = "CausalAttention";
}

CausalAttentionImpl::CausalAttentionImpl(const CausalAttentionOptions& options_) : options(options_) { reset(); }

void CausalAttentionImpl::reset() {
  base::check_reset_unbuilt(kCausalAttention, *this);
  base::check_positive(kCausalAttention, "d_in", options.d_in());
  base::check_positive(kCausalAttention, "d_out", options.d_out());
  base::check_positive(kCausalAttention, "context_length", options.context_length());
  base::check_dropout(kCausalAttention, options.dropout());
  base::check_scale(kCausalAttention, options.scale());
  base::check_window(kCausalAttention, options.window(), options.causal());
  if (options.rope()) {
    layers::check_rope(kCausalAttention, *options.rope(), options.d_out());
  }
  const auto linear = LinearOptions(options.d_in(), options.d_out()).bias(options.qkv_bias());
  W_query = register_module("W_query", Linear(linear));
  W_key = register_module("W_key", Linear(linear));
  W_value = register_module("W_value", Linear(linear));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  cache_owner_ = block::new_cache_owner();
  rotary_ = options.rope() ? block::RotaryCache::shared(*options.rope(), options.d_out(), options.context_length())
                           : nullptr;
  if (options.causal() && options.mask_buffer()) {
    mask = register_buffer("mask", functional::causal_mask_buffer(options.context_length()));
  } else {
    mask = at::Tensor();
  }
  hold_attention();
}

void CausalAttentionImpl::hold_attention() {
  auto held = std::make_shared<modules::HeldAttention>();
  // Single-head (num_heads 0): [B, T, d_out] throughout.
  held->self.emplace(block::AttentionBlock{.W_query = W_query,
                                           .W_key = W_key,
                                           .W_value = W_value,
                                           .num_heads = 0,
                                           .num_kv_heads = 0,
                                           .causal = options.causal(),
                                           .mask = mask,
                                           .window = options.window(),
                                           .rope = rotary_.get()});
  held_ = std::move(held);
}

void CausalAttentionImpl::save(torch::serialize::OutputArchive& archive) const {
  serialize::save_with_options(*this, archive);
}

void CausalAttentionImpl::load(torch::serialize::InputArchive& archive) {
  serialize::strict_load(*this, archive, kCausalAttention, serialize::archive_path(archive));
}

CheckpointOptions CausalAttentionImpl::checkpoint_options() const {
  CheckpointOptions out{{"scale", serialize::option_text(options.scale())}};
  modules::add_attention_options(out, options.causal(), options.window(), options.rope());
  return out;
}

int64_t CausalAttentionImpl::implied_causal_mask() const {
  return options.causal() && !options.mask_buffer() ? options.context_length() : 0;
}

void CausalAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "torchattn::CausalAttention(d_in=" << options.d_in() << ", d_out=" << options.d_out()
         << ", context_length=" << options.context_length() << ", dropout=" << options.dropout()
         << ", qkv_bias=" << std::boolalpha << options.qkv_bias() << ", backend=" << options.backend();
  block::print_attention_extras(stream, options.causal(), options.window(), options.rope(),
                                options.mask_buffer() || !options.causal());
  stream << ")";
}

at::Tensor CausalAttentionImpl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                        const at::Tensor& key_bias) {
  base::check_input(kCausalAttention, x, options.d_in(), options.context_length(), W_query->weight);
  base::check_key_padding_mask(kCausalAttention, key_padding_mask, x);
  base::check_key_bias(kCausalAttention, key_bias, x);
  base::check_some_key_kept(kCausalAttention, key_padding_mask);
  return attend(x, key_padding_mask, key_bias, nullptr);
}

KVCache CausalAttentionImpl::make_kv_cache(int64_t batch_size, bool static_shapes, int64_t capacity) const {
  base::check_positive(kCausalAttention, "batch_size", batch_size);
  const int64_t tokens = modules::check_capacity(kCausalAttention, capacity, options.context_length());
  return KVCache({batch_size, tokens, options.d_out()}, W_key->weight.options(), static_shapes, cache_owner_);
}

at::Tensor CausalAttentionImpl::forward_cached(const at::Tensor& x_new, KVCache& cache,
                                               const at::Tensor& key_padding_mask) {
  base::check_input(kCausalAttention, x_new, options.d_in(), options.context_length(), W_query->weight);
  modules::check_causal_for_cache(kCausalAttention, options.causal());
  modules::check_cache(kCausalAttention, cache, x_new, options.context_length(), cache_owner_, is_training(),
                       options.dropout());
  base::check_key_padding_mask(kCausalAttention, key_padding_mask, x_new);
  return attend(x_new, key_padding_mask, at::Tensor(), &cache);
}

at::Tensor CausalAttentionImpl::forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens) {
  base::check_input(kCausalAttention, x, options.d_in(), /*context_length=*/0, W_query->weight);
  TORCH_CHECK(x.dim() == 2, kCausalAttention, ".forward_packed: expected x of shape [N, d_in], got ", x.sizes());
  const std::vector<int64_t> offsets = base::check_cu_seqlens("CausalAttention.forward_packed", cu_seqlens, x,
                                                              options.context_length());
  return block::packed_attention_block_forward(*held_->self, x, offsets, call_options());
}

const functional::AttentionOptions& CausalAttentionImpl::call_options() {
  return modules::refresh(held_->train, {.scale = options.scale(),
                                         .dropout = options.dropout(),
                                         .training = is_training(),
                                         .backend = options.backend()});
}

at::Tensor CausalAttentionImpl::attend(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                       const at::Tensor& key_bias, KVCache* cache) {
  block::AttentionBlock& b = *held_->self;
  const functional::AttentionOptions& config = call_options();
  return block::with_batch_dim(x, key_padding_mask, key_bias,
                               [&](const at::Tensor& xb, const at::Tensor& mb, const at::Tensor& bb) {
                                 return block::attention_block_forward(b, xb, cache, config, mb, bb);
                               });
}

}  // namespace torchattn
