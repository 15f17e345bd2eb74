#include <torchattn/linear.h>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/quantized_linear.h"
#include "layers/linear.h"
#include "layers/placed_together.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace torchattn {

at::Tensor placeholder(at::IntArrayRef sizes) {
  // A plain tensor (not a view) over the storage of one element: set_ as
  // PackedLinear::release does, so that loading's set_data replaces it cleanly.
  at::Tensor t = at::empty({0});
  const at::Tensor zero = at::zeros({1});
  t.set_(zero.storage(), 0, sizes, std::vector<int64_t>(sizes.size(), 0));
  return t;
}

bool is_placeholder(const at::Tensor& t) {
  return t.defined() && t.numel() >= 1 && std::ranges::all_of(t.strides(), [](int64_t s) { return s == 0; });
}

LinearImpl::LinearImpl(const LinearOptions& options_) : options(options_) { reset(); }

void LinearImpl::reset() {
  TORCH_CHECK(options.in_features() >= 1 && options.out_features() >= 1,
              "Linear: expected in_features and out_features >= 1, got in_features=", options.in_features(),
              " and out_features=", options.out_features());
  const std::vector<int64_t> shape{options.out_features(), options.in_features()};
  weight = register_parameter("weight", options.init() ? at::empty(shape) : placeholder(shape));
  if (options.bias()) {
    bias = register_parameter("bias", options.init() ? at::empty({options.out_features()})
                                                     : placeholder({options.out_features()}));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  if (options.init()) reset_parameters();
  engine_ = std::make_shared<PackedLinear>();
  pack_ = {};
}

void LinearImpl::reset_parameters() {
  // nn::Linear's own draws, in its order (tests/layers/test_linear_layer.cpp).
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "torchattn::Linear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << std::boolalpha << options.bias();
  if (frozen() || pack_.on) stream << ", weight_format=" << weight_format();
  if (frozen()) stream << ", frozen=true";
  stream << ")";
}

void LinearImpl::check_weights(const char* fn) const {
  TORCH_CHECK(!is_placeholder(weight) && !is_placeholder(bias), "Linear(in_features=", options.in_features(),
              ", out_features=", options.out_features(), "): ", fn,
              " before its weights were loaded (built with init(false), for a checkpoint to replace them)");
}

at::Tensor LinearImpl::run(const at::Tensor& x, bool fast) {
  if (engine_->frozen() || pack_.routes(engine_.get(), x, {weight}, {bias})) {
    return engine_->forward(x, {weight}, {bias});
  }
  check_weights("forward");
  if (fast) return layers::linear(x, weight, bias);
  return at::linear(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return run(x, /*fast=*/false); }

at::Tensor LinearImpl::forward_fast(const at::Tensor& x) { return run(x, /*fast=*/true); }

void LinearImpl::set_inference(const PackPolicy& pack, WeightFormat format, Int8Inputs int8_inputs) {
  TORCH_CHECK(pack.min_rows >= 1, "Linear: expected a pack policy's min_rows >= 1, got ", pack.min_rows);
  check_weight_format(format, "Linear: set_inference");
  // Only what changes is written: modules call this at every forward, which may run on
  // many threads at once with the same settings.
  if (engine_->frozen()) {
    TORCH_CHECK(format == engine_->format() || format == WeightFormat::Float32, "Linear: the weights are kept in ",
                to_string(engine_->format()), " (frozen); asked for ", to_string(format));
  } else if (engine_->format() != format || engine_->int8_inputs() != int8_inputs) {
    engine_ = std::make_shared<PackedLinear>(format, int8_inputs);
  } else if (!pack.on && engine_->packed_bytes() > 0) {
    engine_->clear();  // packing turned off: the copy goes
  }
  if (pack_.on != pack.on || pack_.min_rows != pack.min_rows) pack_ = pack;
}

void LinearImpl::freeze(WeightFormat format, Int8Inputs int8_inputs) {
  check_weight_format(format, "Linear: freeze");
  TORCH_CHECK(format != WeightFormat::Float32,
              "Linear: freeze keeps bfloat16, int8, int4 or dynamic-int8 weights, got float32");
  if (engine_->frozen()) {
    TORCH_CHECK(engine_->format() == format, "Linear: freeze: the weights are already ", to_string(engine_->format()),
                ", asked for ", to_string(format));
    return;
  }
  check_weights("freeze");
  auto engine = std::make_shared<PackedLinear>(format, int8_inputs);
  engine->freeze({weight}, {bias});
  engine_ = std::move(engine);
  PackedLinear::release(weight);
}

void LinearImpl::bind(WeightFormat format, const at::Tensor& data, const at::Tensor& scale, Int8Inputs int8_inputs,
                      const std::string& name) {
  check_weight_format(format, "Linear: bind");
  TORCH_CHECK(!engine_->frozen(), "Linear: bind: '", name, "' is already frozen (", to_string(engine_->format()), ")");
  TORCH_CHECK(!bias.defined() || !is_placeholder(bias), "Linear: bind '", name,
              "': load the bias before binding the weights (it is still a placeholder)");
  auto engine = std::make_shared<PackedLinear>(format, int8_inputs);
  const std::vector<at::Tensor> scales = format == WeightFormat::Int8 || format == WeightFormat::Int4
                                             ? std::vector<at::Tensor>{scale}
                                             : std::vector<at::Tensor>{};
  check_frozen_weights(format, {{name, data}, {name + kFrozenScaleSuffix, scale}}, "", {name}, {weight}, "Linear");
  engine->freeze_from({data}, scales, {bias});
  engine_ = std::move(engine);
  if (!is_placeholder(weight)) PackedLinear::release(weight);
}

std::pair<at::Tensor, at::Tensor> LinearImpl::frozen_weight() const { return engine_->frozen_weight(0); }

at::Tensor LinearImpl::weight_rows(const at::Tensor& ids) const { return engine_->weight_rows(ids); }

namespace {

// y [..., sum of widths] -> its columns, widths[i] at a time, as views of y.
std::vector<at::Tensor> columns(const at::Tensor& y, const std::vector<int64_t>& widths) {
  std::vector<at::Tensor> out;
  int64_t col = 0;
  for (const int64_t w : widths) {
    out.push_back(y.narrow(-1, col, w));
    col += w;
  }
  return out;
}

std::vector<int64_t> rows_of(const std::vector<at::Tensor>& weights) {
  std::vector<int64_t> rows;
  rows.reserve(weights.size());
  for (const auto& w : weights) rows.push_back(w.size(0));
  return rows;
}

}  // namespace

std::vector<at::Tensor> linear_group(const at::Tensor& x, std::initializer_list<LinearImpl*> layers, bool fast) {
  std::vector<at::Tensor> out;
  out.reserve(layers.size());
  const LinearImpl* first = *layers.begin();
  const WeightFormat format = first->engine_->format();
  bool together = layers.size() > 1 && first->frozen() &&
                  (format == WeightFormat::BFloat16 || format == WeightFormat::Int8 || format == WeightFormat::Int4);
  for (const LinearImpl* l : layers) {
    together = together && l->frozen() && l->engine_->format() == format &&
               l->engine_->int8_inputs() == first->engine_->int8_inputs();
  }
  if (together) {
    std::vector<kernels::cpu::QuantizedWeight> parts;
    for (const LinearImpl* l : layers) {
      auto [data, scale] = l->engine_->frozen_weight(0);
      parts.push_back({std::move(data), std::move(scale), l->bias});
    }
    if (kernels::cpu::quantized_linear_applies(x, parts)) {
      const auto products = first->engine_->int8_inputs() == Int8Inputs::Quantized ? kernels::cpu::Int8Products::Auto
                                                                                   : kernels::cpu::Int8Products::Float;
      std::vector<int64_t> widths;
      widths.reserve(parts.size());
      for (const auto& p : parts) widths.push_back(p.data.size(0));
      return columns(kernels::cpu::quantized_linear(x, parts, products), widths);
    }
  }
  // Float32 layers that decoding's matrix-vector kernel takes (a few rows, no gradient,
  // neither packed nor frozen): one parallel region over all their outputs, each layer's
  // columns the bits of its forward_fast.
  bool small = fast && layers.size() > 1;
  std::vector<at::Tensor> weights, biases;
  for (const LinearImpl* l : layers) {
    small = small && !l->frozen() && !l->pack_.routes(l->engine_.get(), x, {l->weight}, {l->bias}) &&
            !is_placeholder(l->weight) && !is_placeholder(l->bias) &&
            kernels::cpu::small_linear_applies(x, l->weight, l->bias);
    if (!small) break;
    weights.push_back(l->weight);
    biases.push_back(l->bias);
  }
  if (small) return columns(kernels::cpu::small_linear(x, weights, biases), rows_of(weights));
  // Off the CPU (whose kernels keep each layer's bits above): layers placed end to end
  // as one GEMM, without a gradient to compute.
  bool joined = fast && layers.size() > 1 && !x.is_cpu();
  weights.clear();
  biases.clear();
  for (const LinearImpl* l : layers) {
    joined = joined && !l->frozen() && !is_placeholder(l->weight) && !is_placeholder(l->bias) &&
             !(c10::GradMode::is_enabled() &&
               (l->weight.requires_grad() || (l->bias.defined() && l->bias.requires_grad())));
    if (!joined) break;
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  joined = joined && !(c10::GradMode::is_enabled() && x.requires_grad()) && torchattn::layers::end_to_end(weights) &&
           (biases.empty() || (biases.size() == weights.size() && torchattn::layers::end_to_end(biases))) &&
           x.scalar_type() == weights.front().scalar_type() && x.device() == weights.front().device();
  if (joined) return columns(torchattn::layers::joined_linear(x, weights, biases), rows_of(weights));
  for (LinearImpl* l : layers) out.push_back(l->run(x, fast));
  return out;
}

}  // namespace torchattn
