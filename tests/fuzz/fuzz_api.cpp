// libFuzzer target: drives the public API with random shapes, options (grouped-query
// heads, RoPE, windows, causal or not included), dtypes, padding masks and key
// biases, cache sequences and cache clones. The only exception it accepts is c10::Error (a checked
// argument); anything else, a sanitizer report or a crash is a finding.

#include <torchattn/torchattn.h>

#include <fuzzer/FuzzedDataProvider.h>
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

torch::Dtype pick_dtype(FuzzedDataProvider& in) {
  const torch::Dtype all[] = {torch::kFloat32, torch::kFloat64, torch::kBFloat16,
                              torch::kFloat16, torch::kInt64,   torch::kBool};
  return all[in.ConsumeIntegralInRange<int>(0, 5)];
}

std::vector<int64_t> pick_shape(FuzzedDataProvider& in, int max_rank) {
  std::vector<int64_t> shape(in.ConsumeIntegralInRange<int>(0, max_rank));
  for (auto& d : shape) d = in.ConsumeIntegralInRange<int64_t>(-1, 7);
  return shape;
}

torch::Tensor make_tensor(FuzzedDataProvider& in, std::vector<int64_t> shape, torch::Dtype dtype) {
  auto t = torch::randn(shape, torch::kFloat64) * in.ConsumeIntegralInRange<int>(0, 4);
  if (in.ConsumeBool()) t = t * 1e4;  // large scores
  return dtype == torch::kBool ? t > 0 : t.to(dtype);
}

std::optional<double> pick_scale(FuzzedDataProvider& in) {
  const double values[] = {
      0.5, 1.0, -1.0, 1e4, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), 0.0};
  if (in.ConsumeBool()) return std::nullopt;
  return values[in.ConsumeIntegralInRange<int>(0, 6)];
}

void run(FuzzedDataProvider& in) {
  torch::manual_seed(in.ConsumeIntegral<uint16_t>());
  const int kind = in.ConsumeIntegralInRange<int>(0, 3);
  const int64_t d_in = in.ConsumeIntegralInRange<int64_t>(-1, 8), d_out = in.ConsumeIntegralInRange<int64_t>(-1, 8),
                C = in.ConsumeIntegralInRange<int64_t>(-1, 10), H = in.ConsumeIntegralInRange<int64_t>(-1, 4);
  const double dropouts[] = {0.0, 0.1, 0.5, 0.99, 1.0, -0.1};
  const double dropout = dropouts[in.ConsumeIntegralInRange<int>(0, 5)];
  const bool bias = in.ConsumeBool();
  const auto scale = pick_scale(in);
  const auto backend = static_cast<torchattn::Backend>(in.ConsumeIntegralInRange<int>(0, 2));
  const auto module_dtype = in.ConsumeBool() ? torch::kFloat32 : pick_dtype(in);
  const bool mask_buffer = in.ConsumeBool(), static_shapes = in.ConsumeBool();
  // The options of today's models, valid or not.
  const bool causal = in.ConsumeIntegralInRange<int>(0, 3) != 0, out_bias = in.ConsumeBool();
  const std::optional<int64_t> kv_heads = in.ConsumeBool()
                                              ? std::optional<int64_t>(in.ConsumeIntegralInRange<int64_t>(-1, 4))
                                              : std::nullopt;
  const std::optional<int64_t> window = in.ConsumeBool()
                                            ? std::optional<int64_t>(in.ConsumeIntegralInRange<int64_t>(-1, 6))
                                            : std::nullopt;
  std::optional<torchattn::RoPEOptions> rope;
  if (in.ConsumeBool()) {
    const double thetas[] = {10000.0, 1e6, 0.0, -1.0, std::numeric_limits<double>::infinity()};
    rope = torchattn::RoPEOptions(thetas[in.ConsumeIntegralInRange<int>(0, 4)]).interleaved(in.ConsumeBool());
    if (in.ConsumeBool()) rope->rotary_dim(in.ConsumeIntegralInRange<int64_t>(-1, 9));
  }

  if (kind == 3) {  // the functional layer
    namespace F = torchattn::functional;
    auto q = make_tensor(in, pick_shape(in, 4), pick_dtype(in));
    auto k = make_tensor(in, pick_shape(in, 4), pick_dtype(in));
    auto v = make_tensor(in, pick_shape(in, 4), pick_dtype(in));
    auto mask = in.ConsumeBool() ? make_tensor(in, pick_shape(in, 3), pick_dtype(in)) : torch::Tensor();
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
        F::dot_product_attention(q, k, v, mask, in.ConsumeBool());
        break;
      case 1:
        F::causal_dot_product_attention(q, k, v, in.ConsumeBool());
        break;
      case 2:
        F::make_causal_mask(in.ConsumeIntegralInRange<int64_t>(-2, 8), scale.value_or(-1e9));
        break;
      case 3:
        F::masked_softmax(q, mask.defined() ? mask : k);
        break;
      default: {
        auto cm = in.ConsumeBool() ? F::causal_mask_buffer(std::max<int64_t>(C, 1)) : torch::Tensor();
        auto bias_mask = in.ConsumeBool() ? make_tensor(in, pick_shape(in, 3), pick_dtype(in)) : torch::Tensor();
        F::attention(q, k, v, cm, in.ConsumeIntegralInRange<int64_t>(-1, 4),
                     {scale, dropout, in.ConsumeBool(), backend}, mask, bias_mask);
      }
    }
    return;
  }

  torch::nn::AnyModule any;
  // forward_cached on the module's cache, or (fork = true) on a clone of it.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, bool)> cached;
  if (kind == 0) {
    torchattn::SelfAttentionV2 m(
        torchattn::SelfAttentionV2Options(d_in, d_out).qkv_bias(bias).scale(scale).backend(backend));
    any = torch::nn::AnyModule(m);
  } else if (kind == 1) {
    torchattn::CausalAttention m(torchattn::CausalAttentionOptions(d_in, d_out, C)
                                     .dropout(dropout)
                                     .qkv_bias(bias)
                                     .scale(scale)
                                     .backend(backend)
                                     .mask_buffer(mask_buffer)
                                     .causal(causal)
                                     .window(window)
                                     .rope(rope));
    any = torch::nn::AnyModule(m);
    auto cache = std::make_shared<torchattn::KVCache>(
        m->make_kv_cache(in.ConsumeIntegralInRange<int64_t>(-1, 3), static_shapes));
    cached = [m, cache](const torch::Tensor& x, const torch::Tensor& pad, bool fork) mutable {
      if (fork) {
        auto branch = cache->clone();
        return m->forward_cached(x, branch, pad);
      }
      return m->forward_cached(x, *cache, pad);
    };
  } else {
    torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(d_in, d_out, C, H)
                                        .dropout(dropout)
                                        .qkv_bias(bias)
                                        .scale(scale)
                                        .backend(backend)
                                        .mask_buffer(mask_buffer)
                                        .num_kv_heads(kv_heads)
                                        .causal(causal)
                                        .window(window)
                                        .rope(rope)
                                        .out_bias(out_bias));
    any = torch::nn::AnyModule(m);
    auto cache = std::make_shared<torchattn::KVCache>(
        m->make_kv_cache(in.ConsumeIntegralInRange<int64_t>(-1, 3), static_shapes));
    cached = [m, cache](const torch::Tensor& x, const torch::Tensor& pad, bool fork) mutable {
      if (fork) {
        auto branch = cache->clone();
        return m->forward_cached(x, branch, pad);
      }
      return m->forward_cached(x, *cache, pad);
    };
  }
  any.ptr()->to(module_dtype);
  any.ptr()->train(in.ConsumeBool());
  const int calls = in.ConsumeIntegralInRange<int>(1, 4);
  for (int i = 0; i < calls && in.remaining_bytes() > 0; ++i) {
    auto x = make_tensor(in, pick_shape(in, 4), in.ConsumeBool() ? module_dtype : pick_dtype(in));
    try {
      if (cached && in.ConsumeBool()) {
        torch::NoGradGuard no_grad;
        auto pad = in.ConsumeBool()
                       ? make_tensor(in, pick_shape(in, 3), in.ConsumeBool() ? torch::kBool : pick_dtype(in))
                       : torch::Tensor();
        cached(x, pad, in.ConsumeBool());
      } else if (in.ConsumeBool()) {
        auto mask = make_tensor(in, pick_shape(in, 3), in.ConsumeBool() ? torch::kBool : pick_dtype(in));
        auto bias_mask = in.ConsumeBool()
                             ? make_tensor(in, pick_shape(in, 3), in.ConsumeBool() ? module_dtype : pick_dtype(in))
                             : torch::Tensor();
        auto y = any.forward(x, mask, bias_mask);
        if (y.requires_grad() && in.ConsumeBool()) y.sum().backward();
      } else {
        auto y = any.forward(x);
        if (y.requires_grad() && in.ConsumeBool()) y.sum().backward();
      }
    } catch (const c10::Error&) {
      // A checked argument: the module stays usable, so go on with the next call.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  FuzzedDataProvider in(data, size);
  try {
    run(in);
  } catch (const c10::Error&) {
    // The only exception the API may throw.
  }
  return 0;
}
