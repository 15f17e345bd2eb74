#include <torchattn/multi_head_attention.h>

#include <torchattn/functional.h>
#include <torchattn/packed_linear.h>

#include "backends/alibi.h"
#include "block/attention_block.h"
#include "base/checks.h"
#include "layers/rope_checks.h"
#include "modules/cache_checks.h"
#include "block/cross_attention_block.h"
#include "modules/attention_facts.h"
#include "modules/held_attention.h"
#include "serialize/strict_load.h"

#include <ATen/ops/zeros.h>

#include <cmath>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

namespace {
constexpr const char* kMultiHeadAttention = "MultiHeadAttention";
}  // namespace

MultiHeadAttentionImpl::MultiHeadAttentionImpl(MultiHeadAttentionOptions options_) : options(std::move(options_)) {
  reset();
}

void MultiHeadAttentionImpl::reset() {
  base::check_reset_unbuilt(kMultiHeadAttention, *this);
  base::check_positive(kMultiHeadAttention, "d_in", options.d_in());
  base::check_positive(kMultiHeadAttention, "d_out", options.d_out());
  base::check_positive(kMultiHeadAttention, "context_length", options.context_length());
  base::check_positive(kMultiHeadAttention, "num_heads", options.num_heads());
  if (options.head_dim()) {
    base::check_positive(kMultiHeadAttention, "head_dim", *options.head_dim());
  } else {
    TORCH_CHECK(options.d_out() % options.num_heads() == 0, kMultiHeadAttention,
                ": expected d_out divisible by num_heads (or head_dim set), got d_out=", options.d_out(),
                " and num_heads=", options.num_heads());
  }
  TORCH_CHECK(num_kv_heads() >= 1 && options.num_heads() % num_kv_heads() == 0, kMultiHeadAttention,
              ": expected num_kv_heads >= 1 dividing num_heads=", options.num_heads(),
              ", got num_kv_heads=", num_kv_heads());
  base::check_positive(kMultiHeadAttention, "projections.pack.min_rows", options.projections().pack.min_rows);
  check_weight_format(options.projections().format, "MultiHeadAttention: projections.format");
  base::check_dropout(kMultiHeadAttention, options.dropout());
  base::check_scale(kMultiHeadAttention, options.scale());
  base::check_window(kMultiHeadAttention, options.window(), options.causal());
  TORCH_CHECK(!options.alibi() || options.causal(), kMultiHeadAttention,
              ": alibi needs causal(true) (its distances are to earlier keys), got causal(false)");
  TORCH_CHECK(!options.alibi() || !options.rope(), kMultiHeadAttention,
              ": alibi and rope both give positions; choose one, got both");
  if (options.rope()) {
    layers::check_rope(kMultiHeadAttention, *options.rope(), head_dim());
  }
  if (options.kdim()) base::check_positive(kMultiHeadAttention, "kdim", *options.kdim());
  if (options.vdim()) base::check_positive(kMultiHeadAttention, "vdim", *options.vdim());
  const auto qkv = [&](int64_t in, int64_t out) {
    return LinearOptions(in, out).bias(options.qkv_bias()).init(options.init());
  };
  const int64_t kv_features = num_kv_heads() * head_dim();
  const int64_t q_features = options.num_heads() * head_dim();  // d_out unless head_dim is set
  W_query = register_module("W_query", Linear(qkv(options.d_in(), q_features)));
  W_key = register_module("W_key", Linear(qkv(options.kdim().value_or(options.d_in()), kv_features)));
  W_value = register_module("W_value", Linear(qkv(options.vdim().value_or(options.d_in()), kv_features)));
  out_proj = register_module(
      "out_proj", Linear(LinearOptions(q_features, options.d_out()).bias(options.out_bias()).init(options.init())));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  if (const auto& qk = options.qk_norm()) {
    TORCH_CHECK(qk->eps() > 0.0 && std::isfinite(qk->eps()), kMultiHeadAttention, ": expected qk_norm eps > 0, got ",
                qk->eps());
    q_norm = register_module("q_norm", RMSNorm(qk->per_head() ? head_dim() : q_features, qk->eps()));
    k_norm = register_module("k_norm", RMSNorm(qk->per_head() ? head_dim() : kv_features, qk->eps()));
  } else {
    q_norm = nullptr;
    k_norm = nullptr;
  }
  cache_owner_ = block::new_cache_owner();
  rotary_ = options.rope() ? block::RotaryCache::shared(*options.rope(), head_dim(), options.context_length())
                           : nullptr;
  alibi_slopes_ = options.alibi() ? backends::alibi_slopes(options.num_heads()) : at::Tensor();
  TORCH_CHECK(!options.softcap() || (*options.softcap() > 0.0 && std::isfinite(*options.softcap())),
              kMultiHeadAttention, ": expected softcap > 0, got ", options.softcap().value_or(0.0));
  sinks = options.sinks() ? register_parameter("sinks", at::zeros({options.num_heads()})) : at::Tensor();
  if (options.causal() && options.mask_buffer()) {
    mask = register_buffer("mask", functional::causal_mask_buffer(options.context_length()));
  } else {
    mask = at::Tensor();
  }
  hold_attention();
}

void MultiHeadAttentionImpl::hold_attention() {
  auto held = std::make_shared<modules::HeldAttention>();
  const bool per_head = !options.qk_norm() || options.qk_norm()->per_head();
  RMSNormImpl* qn = q_norm.is_empty() ? nullptr : q_norm.get();
  RMSNormImpl* kn = k_norm.is_empty() ? nullptr : k_norm.get();
  held->self.emplace(block::AttentionBlock{
      .W_query = W_query,
      .W_key = W_key,
      .W_value = W_value,
      .out_proj = &out_proj,
      .num_heads = options.num_heads(),
      .num_kv_heads = num_kv_heads(),
      .causal = options.causal(),
      .mask = mask,
      .window = options.window(),
      .rope = rotary_.get(),
      .q_norm = qn,
      .k_norm = kn,
      .qk_norm_per_head = per_head,
      .alibi_slopes = alibi_slopes_,
  });
  // Cross-attention: the same projections, heads and norms; no causal mask, positions
  // or ALiBi.
  block::AttentionBlock& cross = held->cross.emplace(*held->self);
  cross.causal = false;
  cross.window = std::nullopt;
  cross.rope = nullptr;
  cross.alibi_slopes = at::Tensor();
  held->train = functional::AttentionOptions{.sinks = sinks, .flex = options.flex()};
  held->inference = held->train;
  held_ = std::move(held);
}

void MultiHeadAttentionImpl::save(torch::serialize::OutputArchive& archive) const {
  check_not_frozen("save");
  serialize::save_with_options(*this, archive);
}

void MultiHeadAttentionImpl::load(torch::serialize::InputArchive& archive) {
  check_not_frozen("load");
  serialize::strict_load(*this, archive, kMultiHeadAttention, serialize::archive_path(archive));
}

CheckpointOptions MultiHeadAttentionImpl::checkpoint_options() const {
  using serialize::option_text;
  const auto& o = options;
  CheckpointOptions out{{"num_heads", option_text(o.num_heads())},
                        {"num_kv_heads", option_text(num_kv_heads())},
                        {"head_dim", option_text(head_dim())},
                        {"qk_norm", !o.qk_norm()              ? "none"
                                    : o.qk_norm()->per_head() ? "per_head"
                                                              : "all_heads"},
                        {"qk_norm_eps", o.qk_norm() ? option_text(o.qk_norm()->eps()) : "none"},
                        {"alibi", option_text(o.alibi())},
                        {"softcap", o.softcap() ? option_text(*o.softcap()) : "none"},
                        {"sinks", option_text(o.sinks())},
                        {"scale", option_text(o.scale())},
                        // The context's widths for cross-attention (d_in where not set).
                        {"kdim", option_text(o.kdim().value_or(o.d_in()))},
                        {"vdim", option_text(o.vdim().value_or(o.d_in()))}};
  modules::add_attention_options(out, o.causal(), o.window(), o.rope());
  return out;
}

int64_t MultiHeadAttentionImpl::implied_causal_mask() const {
  return options.causal() && !options.mask_buffer() ? options.context_length() : 0;
}

std::string MultiHeadAttentionImpl::shape_hint(const std::string& key) const {
  if (!(key.starts_with("W_key.") || key.starts_with("W_value."))) {
    return "";
  }
  return " (" + key.substr(0, key.find('.')) +
         " projects to num_kv_heads * head_dim = " + std::to_string(num_kv_heads()) + " * " +
         std::to_string(head_dim()) + " features)";
}

void MultiHeadAttentionImpl::place_projections() {
  const bool self_attention = options.kdim().value_or(options.d_in()) == options.d_in() &&
                              options.vdim().value_or(options.d_in()) == options.d_in();
  bool own = true;  // weights of its own: loaded, not frozen
  for (const Linear* l : {&W_query, &W_key, &W_value}) {
    own = own && !(*l)->frozen() && !is_placeholder((*l)->weight) && !is_placeholder((*l)->bias);
  }
  if (self_attention && own && !W_query->weight.is_cpu()) {
    place_together({W_query.get(), W_key.get(), W_value.get()});
  }
}

void MultiHeadAttentionImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Cloneable<MultiHeadAttentionImpl>::to(device, dtype, non_blocking);
  place_projections();
}

void MultiHeadAttentionImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Cloneable<MultiHeadAttentionImpl>::to(dtype, non_blocking);
  place_projections();
}

void MultiHeadAttentionImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Cloneable<MultiHeadAttentionImpl>::to(device, non_blocking);
  place_projections();
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "torchattn::MultiHeadAttention(d_in=" << options.d_in() << ", d_out=" << options.d_out()
         << ", context_length=" << options.context_length() << ", num_heads=" << options.num_heads()
         << ", dropout=" << options.dropout() << ", qkv_bias=" << std::boolalpha << options.qkv_bias()
         << ", backend=" << options.backend();
  if (num_kv_heads() != options.num_heads()) {
    stream << ", num_kv_heads=" << num_kv_heads();
  }
  if (options.head_dim()) {
    stream << ", head_dim=" << *options.head_dim();
  }
  if (options.kdim()) {
    stream << ", kdim=" << *options.kdim();
  }
  if (options.vdim()) {
    stream << ", vdim=" << *options.vdim();
  }
  if (options.alibi()) {
    stream << ", alibi=true";
  }
  if (options.softcap()) {
    stream << ", softcap=" << *options.softcap();
  }
  if (options.sinks()) {
    stream << ", sinks=true";
  }
  if (options.qk_norm()) {
    stream << ", qk_norm=(eps=" << options.qk_norm()->eps() << ", per_head=" << std::boolalpha
           << options.qk_norm()->per_head() << ")";
  }
  if (!options.out_bias()) {
    stream << ", out_bias=false";
  }
  block::print_attention_extras(stream, options.causal(), options.window(), options.rope(),
                                options.mask_buffer() || !options.causal());
  const LinearInference& inference = options.projections();
  if (inference.pack.on) {
    stream << ", projections=packed " << to_string(inference.format);
    if (inference.pack.min_rows != 1) {
      stream << " from " << inference.pack.min_rows << " rows";
    }
  }
  stream << ")";
}

void MultiHeadAttentionImpl::check_self_attention(const char* fn) const {
  const int64_t kdim = options.kdim().value_or(options.d_in()), vdim = options.vdim().value_or(options.d_in());
  TORCH_CHECK(kdim == options.d_in() && vdim == options.d_in(), kMultiHeadAttention, ": ", fn,
              " reads keys and values from x, so it needs kdim and vdim equal to d_in=", options.d_in(),
              ", got kdim=", kdim, " and vdim=", vdim, "; attend over a context with forward_cross");
}

at::Tensor MultiHeadAttentionImpl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                           const at::Tensor& key_bias) {
  check_self_attention("forward");
  base::check_input(kMultiHeadAttention, x, options.d_in(), options.context_length(), W_query->weight);
  base::check_key_padding_mask(kMultiHeadAttention, key_padding_mask, x);
  base::check_key_bias(kMultiHeadAttention, key_bias, x);
  base::check_some_key_kept(kMultiHeadAttention, key_padding_mask);
  return attend(x, key_padding_mask, key_bias, nullptr);
}

at::Tensor MultiHeadAttentionImpl::forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens) {
  check_self_attention("forward_packed");
  base::check_input(kMultiHeadAttention, x, options.d_in(), /*context_length=*/0, W_query->weight);
  TORCH_CHECK(x.dim() == 2, kMultiHeadAttention, ".forward_packed: expected x of shape [N, d_in], got ", x.sizes());
  const std::vector<int64_t> offsets = base::check_cu_seqlens("MultiHeadAttention.forward_packed", cu_seqlens, x,
                                                              options.context_length());
  sync_linears();
  return block::packed_attention_block_forward(*held_->self, x, offsets, call_options(/*inference=*/false));
}

KVCache MultiHeadAttentionImpl::make_kv_cache(int64_t batch_size, bool static_shapes, int64_t capacity) const {
  base::check_positive(kMultiHeadAttention, "batch_size", batch_size);
  const int64_t tokens = modules::check_capacity(kMultiHeadAttention, capacity, options.context_length());
  return KVCache({batch_size, num_kv_heads(), tokens, head_dim()}, W_key->weight.options(), static_shapes,
                 cache_owner_);
}

at::Tensor MultiHeadAttentionImpl::forward_cached(const at::Tensor& x_new, KVCache& cache,
                                                  const at::Tensor& key_padding_mask) {
  check_self_attention("forward_cached");
  base::check_input(kMultiHeadAttention, x_new, options.d_in(), options.context_length(), W_query->weight);
  modules::check_causal_for_cache(kMultiHeadAttention, options.causal());
  modules::check_cache(kMultiHeadAttention, cache, x_new, options.context_length(), cache_owner_, is_training(),
                       options.dropout());
  base::check_key_padding_mask(kMultiHeadAttention, key_padding_mask, x_new);
  return attend(x_new, key_padding_mask, at::Tensor(), &cache);
}

PagedLayer MultiHeadAttentionImpl::paged_layer() const {
  return PagedLayer{num_kv_heads(), head_dim(), W_key->weight.options(), cache_owner_};
}

PagedKVCache MultiHeadAttentionImpl::make_paged_kv_cache(const PagedKVCacheOptions& options_in) const {
  return PagedKVCache({paged_layer()}, options_in);
}

at::Tensor MultiHeadAttentionImpl::forward_paged(const at::Tensor& x, PagedKVCache& cache, const PagedStep& step,
                                                 int64_t layer) {
  check_self_attention("forward_paged");
  modules::check_paged(kMultiHeadAttention, x, options.d_in(), options.context_length(), W_query->weight, cache, step,
                       layer, paged_layer(), is_training(), options.dropout());
  modules::check_causal_for_cache(kMultiHeadAttention, options.causal(), "forward_paged");
  sync_linears();
  return block::paged_attention_block_forward(*held_->self, x, cache, step, layer, call_options(/*inference=*/true));
}

void MultiHeadAttentionImpl::check_not_frozen(const char* what) const {
  TORCH_CHECK(!frozen(), kMultiHeadAttention, ": ", what, " needs the float32 weights, which freeze_weights freed (",
              to_string(options.projections().format), " copies kept for inference)");
}

void MultiHeadAttentionImpl::freeze_weights() {
  TORCH_CHECK(options.projections().format != WeightFormat::Float32, kMultiHeadAttention,
              ": freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 copies, got projections.format float32");
  check_self_attention("freeze_weights");
  if (frozen()) return;
  options.projections().pack.on = true;
  for (auto* l : {&W_query, &W_key, &W_value, &out_proj})
    (*l)->freeze(options.projections().format, options.projections().int8_inputs);
}

namespace {

// The projections by their names under the module, in the order frozen_state gives them.
constexpr const char* kProjections[] = {"W_query", "W_key", "W_value", "out_proj"};

}  // namespace

void MultiHeadAttentionImpl::freeze_weights(const std::map<std::string, at::Tensor>& weights,
                                            const std::string& prefix) {
  TORCH_CHECK(options.projections().format != WeightFormat::Float32, kMultiHeadAttention,
              ": freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 copies, got projections.format float32");
  check_self_attention("freeze_weights");
  TORCH_CHECK(!frozen(), kMultiHeadAttention, ": freeze_weights: already frozen");
  Linear layers[] = {W_query, W_key, W_value, out_proj};
  // Every tensor checked before any is bound: one that fails leaves the module as it was.
  for (size_t i = 0; i < 4; ++i) {
    check_frozen_weights(options.projections().format, weights, prefix, {std::string(kProjections[i]) + ".weight"},
                         {layers[i]->weight}, kMultiHeadAttention);
  }
  options.projections().pack.on = true;
  for (size_t i = 0; i < 4; ++i) {
    const std::string name = prefix + kProjections[i] + ".weight";
    const auto scale = weights.find(name + kFrozenScaleSuffix);
    layers[i]->bind(options.projections().format, weights.at(name),
                    scale != weights.end() ? scale->second : at::Tensor(), options.projections().int8_inputs, name);
  }
}

NamedTensors MultiHeadAttentionImpl::frozen_state() const {
  TORCH_CHECK(frozen(), kMultiHeadAttention, ": frozen_state needs freeze_weights first");
  NamedTensors out;
  const Linear layers[] = {W_query, W_key, W_value, out_proj};
  for (size_t i = 0; i < 4; ++i) {
    auto [data, scale] = layers[i]->frozen_weight();
    const std::string name = std::string(kProjections[i]) + ".weight";
    out.emplace_back(name, data);
    if (scale.defined()) out.emplace_back(name + kFrozenScaleSuffix, scale);
  }
  return out;
}

int64_t MultiHeadAttentionImpl::packed_bytes() const {
  return W_query->format_bytes() + W_key->format_bytes() + W_value->format_bytes() + out_proj->format_bytes();
}

void MultiHeadAttentionImpl::sync_linears() {
  if (frozen()) return;
  modules::sync_inference({&W_query, &W_key, &W_value, &out_proj}, options.projections(), held_->synced);
}

void MultiHeadAttentionImpl::check_cross_attention(const char* fn) const {
  check_not_frozen(fn);
  TORCH_CHECK(!options.causal(), kMultiHeadAttention, ": ", fn,
              " attends over the whole context, so it needs causal(false), got causal(true)");
  TORCH_CHECK(!options.rope(), kMultiHeadAttention, ": ", fn,
              " gives the context no positions, so it is not available with rope");
}

CrossKV MultiHeadAttentionImpl::cross_kv(const at::Tensor& context, const at::Tensor& context_padding_mask,
                                         const at::Tensor& value_context) {
  check_cross_attention("cross_kv");
  modules::check_cross_context(kMultiHeadAttention, context, value_context, context_padding_mask,
                               options.kdim().value_or(options.d_in()), options.vdim().value_or(options.d_in()),
                               W_key->weight);
  const bool batched = context.dim() == 3;
  const auto batch = [&](const at::Tensor& t) { return !t.defined() || batched ? t : t.unsqueeze(0); };
  at::Tensor padding = batch(context_padding_mask);
  if (padding.defined() && padding.size(0) == 1 && context.dim() == 3 && context.size(0) > 1) {
    padding = padding.expand({context.size(0), padding.size(1)});
  }
  return block::cross_project(*held_->cross, batch(context), batch(value_context), padding);
}

at::Tensor MultiHeadAttentionImpl::forward_cross(const at::Tensor& x, const CrossKV& kv) {
  check_cross_attention("forward_cross");
  base::check_input(kMultiHeadAttention, x, options.d_in(), options.context_length(), W_query->weight);
  modules::check_cross_kv(kMultiHeadAttention, kv, x, num_kv_heads(), head_dim());
  const at::Tensor xb = x.dim() == 3 ? x : x.unsqueeze(0);
  const at::Tensor y = block::cross_attention_block_forward(*held_->cross, xb, kv, call_options(/*inference=*/false));
  return x.dim() == 3 ? y : y[0];
}

at::Tensor MultiHeadAttentionImpl::forward_cross(const at::Tensor& x, const at::Tensor& context,
                                                 const at::Tensor& context_padding_mask) {
  return forward_cross(x, cross_kv(context, context_padding_mask));
}

at::Tensor MultiHeadAttentionImpl::attend(const at::Tensor& x, const at::Tensor& key_padding_mask,
                                          const at::Tensor& key_bias, KVCache* cache) {
  sync_linears();
  block::AttentionBlock& block = *held_->self;
  const functional::AttentionOptions& config = call_options(/*inference=*/false);
  return block::with_batch_dim(x, key_padding_mask, key_bias,
                               [&](const at::Tensor& xb, const at::Tensor& mb, const at::Tensor& bb) {
                                 return block::attention_block_forward(block, xb, cache, config, mb, bb);
                               });
}

const functional::AttentionOptions& MultiHeadAttentionImpl::call_options(bool inference) {
  return modules::refresh(inference ? held_->inference : held_->train, {.scale = options.scale(),
                                                                        .dropout = inference ? 0.0 : options.dropout(),
                                                                        .training = !inference && is_training(),
                                                                        .backend = options.backend(),
                                                                        .softcap = options.softcap()});
}

}  // namespace torchattn
