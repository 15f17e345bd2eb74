#include <torchattn/causal_attention.h>

#include <torchattn/functional.h>

#include "block/attention_block.h"
#include "base/checks.h"
#include "layers/rope_checks.h"
#include "modules/cache_checks.h"
#include "modules/attention_facts.h"
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
  detail::check_reset_unbuilt(kCausalAttention, *this);
  detail::check_positive(kCausalAttention, "d_in", options.d_in());
  detail::check_positive(kCausalAttention, "d_out", options.d_out());
  detail::check_positive(kCausalAttention, "context_length", options.context_length());
  detail::check_dropout(kCausalAttention, options.dropout());
  detail::check_scale(kCausalAttention, options.scale());
  detail::check_window(kCausalAttention, options.window(), options.causal());
  if (options.rope()) {
    detail::check_rope(kCausalAttention, *options.rope(), options.d_out());
  }
  const auto linear = LinearOptions(options.d_in(), options.d_out()).bias(options.qkv_bias());
  W_query = register_module("W_query", Linear(linear));
  W_key = register_module("W_key", Linear(linear));
  W_value = register_module("W_value", Linear(linear));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  cache_owner_ = detail::new_cache_owner();
  rotary_ = options.rope() ? std::make_shared<const detail::RotaryCache>(*options.rope(), options.d_out(),
                                                                         options.context_length())
                           : nullptr;
  if (options.causal() && options.mask_buffer()) {
    mask = register_buffer("mask", functional::causal_mask_buffer(options.context_length()));
  } else {
    mask = at::Tensor();
  }
}

void CausalAttentionImpl::save(torch::serialize::OutputArchive& archive) const {
  detail::save_with_options(*this, archive);
}

void CausalAttentionImpl::load(torch::serialize::InputArchive& archive) {
  detail::strict_load(*this, archive, kCausalAttention, detail::archive_path(archive));
}

CheckpointOptions CausalAttentionImpl::checkpoint_options() const {
  CheckpointOptions out{{"scale", detail::option_text(options.scale())}};
  detail::add_attention_options(out, options.causal(), options.window(), options.rope());
  return out;
}

int64_t CausalAttentionImpl::implied_causal_mask() const {
  return options.causal() && !options.mask_buffer() ? options.context_length() : 0;
}

void CausalAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "torchattn::CausalAttention(d_in=" << options.d_in() << ", d_out=" << options.d_out()
         << ", context_length=" << options.context_length() << ", dropout=" << options.dropout()
         << ", qkv_bias=" << std::boolalpha << options.qkv_bias() << ", backend=" << options.backend();
  detail::print_attention_extras(stream, options.causal(), options.window(), options.rope(),
                                 options.mask_buffer() || !options.causal());
  stream << ")";
}

at::Tensor CausalAttentionImpl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                        const at::Tensor& key_bias) {
  detail::check_input(kCausalAttention, x, options.d_in(), options.context_length(), W_query->weight);
  detail::check_key_padding_mask(kCausalAttention, key_padding_mask, x);
  detail::check_key_bias(kCausalAttention, key_bias, x);
  detail::check_some_key_kept(kCausalAttention, key_padding_mask);
  return attend(x, key_padding_mask, key_bias, nullptr);
}

KVCache CausalAttentionImpl::make_kv_cache(int64_t batch_size, bool static_shapes) const {
  detail::check_positive(kCausalAttention, "batch_size", batch_size);
  return KVCache({batch_size, options.context_length(), options.d_out()}, W_key->weight.options(), static_shapes,
                 cache_owner_);
}

at::Tensor CausalAttentionImpl::forward_cached(const at::Tensor& x_new, KVCache& cache,
                                               const at::Tensor& key_padding_mask) {
  detail::check_input(kCausalAttention, x_new, options.d_in(), options.context_length(), W_query->weight);
  detail::check_causal_for_cache(kCausalAttention, options.causal());
  detail::check_cache(kCausalAttention, cache, x_new, options.context_length(), cache_owner_, is_training(),
                      options.dropout());
  detail::check_key_padding_mask(kCausalAttention, key_padding_mask, x_new);
  return attend(x_new, key_padding_mask, at::Tensor(), &cache);
}

at::Tensor CausalAttentionImpl::forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens) {
  detail::check_input(kCausalAttention, x, options.d_in(), /*context_length=*/0, W_query->weight);
  TORCH_CHECK(x.dim() == 2, kCausalAttention, ".forward_packed: expected x of shape [N, d_in], got ", x.sizes());
  const std::vector<int64_t> offsets = detail::check_cu_seqlens("CausalAttention.forward_packed", cu_seqlens, x,
                                                                options.context_length());
  detail::AttentionBlock b = block();
  return detail::packed_attention_block_forward(b, x, offsets, attention_options());
}

detail::AttentionBlock CausalAttentionImpl::block() {
  // Single-head (num_heads 0): [B, T, d_out] throughout.
  return detail::AttentionBlock{.W_query = W_query,
                                .W_key = W_key,
                                .W_value = W_value,
                                .num_heads = 0,
                                .num_kv_heads = 0,
                                .causal = options.causal(),
                                .mask = mask,
                                .window = options.window(),
                                .rope = rotary_.get()};
}

functional::AttentionOptions CausalAttentionImpl::attention_options() const {
  return functional::AttentionOptions{.scale = options.scale(),
                                      .dropout = options.dropout(),
                                      .training = is_training(),
                                      .backend = options.backend()};
}

at::Tensor CausalAttentionImpl::attend(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                       const at::Tensor& key_bias, KVCache* cache) {
  detail::AttentionBlock b = block();
  const functional::AttentionOptions config = attention_options();
  return detail::with_batch_dim(x, key_padding_mask, key_bias,
                                [&](const at::Tensor& xb, const at::Tensor& mb, const at::Tensor& bb) {
                                  return detail::attention_block_forward(b, xb, cache, config, mb, bb);
                                });
}

}  // namespace torchattn
