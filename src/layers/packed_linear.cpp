#include <torchattn/packed_linear.h>

#include "kernels/cpu/dynamic_int8_linear.h"
#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/quantized_linear.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <vector>

namespace torchattn {

namespace {

const at::Tensor& bias_at(at::ArrayRef<at::Tensor> biases, size_t i) {
  static const at::Tensor none;
  return biases.empty() ? none : biases[i];
}

}  // namespace

struct PackedLinear::Packed {
  // Which tensor a packed copy was made from, and at which write: the same tensor object,
  // the same storage address and, for tensors that count their writes, the same version.
  struct Source {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
    const void* data = nullptr;
    int64_t version = -1;
    bool defined = false;

    explicit Source(const at::Tensor& t)
        : impl(t.defined() ? t.getIntrusivePtr() : c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()) {
      defined = t.defined();
      if (defined) {
        data = t.const_data_ptr();
        version = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
      }
    }

    bool same(const at::Tensor& t) const {
      if (!t.defined() || !defined) return t.defined() == defined;
      return !impl.expired() && impl._unsafe_get_target() == t.unsafeGetTensorImpl() && data == t.const_data_ptr() &&
             version == (t.is_inference() ? -1 : static_cast<int64_t>(t._version()));
    }
  };

  std::vector<Source> weights;
  std::vector<Source> biases;
  at::Tensor weight;  // Float32: oneDNN's blocked layout; else bfloat16 or int8 dense [sum out_i, in],
                      // int4 uint8 [sum out_i, in / 2]
  at::Tensor scale;   // Int8: float32 [sum out_i, groups of 64 inputs]; Int4: float16 [sum out_i, in / 32, 2]
  at::Tensor bias;    // [sum out_i] or undefined
  // DynamicInt8: each layer apart (its own weight scale); weight, scale and bias undefined.
  std::vector<std::shared_ptr<const kernels::cpu::DynamicInt8Weight>> dynamic;
  std::vector<int64_t> rows;  // out_i of each weight, in order
  int64_t in = 0;
  int64_t bytes = 0;

  bool same(at::ArrayRef<at::Tensor> w, at::ArrayRef<at::Tensor> b) const {
    if (w.size() != weights.size()) return false;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!weights[i].same(w[i]) || !biases[i].same(bias_at(b, i))) return false;
    }
    return true;
  }
};

PackedLinear::PackedLinear(WeightFormat format, Int8Inputs int8_inputs) : format_(format), int8_inputs_(int8_inputs) {
  check_weight_format(format, "PackedLinear");
}
PackedLinear::~PackedLinear() = default;

bool PackedLinear::applies(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases) {
  if (!kernels::cpu::onednn_available() || weights.empty() || (!biases.empty() && biases.size() != weights.size())) {
    return false;
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].defined() || kernels::cpu::plain_linear_rows(x, weights[i], bias_at(biases, i)) < 1) return false;
  }
  return true;
}

at::Tensor PackedLinear::forward(const at::Tensor& x, at::ArrayRef<at::Tensor> weights,
                                 at::ArrayRef<at::Tensor> biases) {
  std::shared_ptr<const Packed> packed;
  bool frozen = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    packed = packed_;
    frozen = frozen_;
  }
  if (frozen) {
    TORCH_CHECK(!kernels::cpu::needs_grad(x), "PackedLinear: the layer keeps only its ", to_string(format_),
                " weights, for inference: no gradient flows through them (run under torch::NoGradGuard, or load "
                "float32 weights to train)");
    // Not left to the kernel's words: a part of a frozen model moved with to() is the
    // likely cause (the model's own to() refuses).
    TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat, "PackedLinear: the layer keeps its ", to_string(format_),
                " weights frozen, which take float32 inputs on the CPU; got ", x.scalar_type(), " on ", x.device(),
                " (a part of the model moved with to()? Load the model again to run it otherwise)");
    return run(*packed, x);
  }
  TORCH_CHECK(!weights.empty(), "PackedLinear: expected at least one weight, got none");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "PackedLinear: expected no biases or one per weight (",
              weights.size(), "), got ", biases.size());
  TORCH_CHECK(takes(x, weights, biases),
              "PackedLinear: expected float32 CPU x [..., in] and dense float32 CPU "
              "weights [out, in] (biases [out]) with no gradient to compute",
              format_ == WeightFormat::Float32 ? ", on a LibTorch with oneDNN" : "", "; got x ", x.sizes(), " of ",
              x.scalar_type(), " on ", x.device(), " and a first weight ", weights[0].sizes(), " of ",
              weights[0].scalar_type(), " on ", weights[0].device());
  if (!packed || !packed->same(weights, biases)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!packed_ || !packed_->same(weights, biases)) packed_ = copy_of(weights, biases);
    packed = packed_;
  }
  return run(*packed, x);
}

at::Tensor PackedLinear::run(const Packed& packed, const at::Tensor& x) const {
  switch (format_) {
    case WeightFormat::Float32:
      return kernels::cpu::onednn_linear_packed(x, packed.weight, packed.bias);
    case WeightFormat::BFloat16:
    case WeightFormat::Int8:
    case WeightFormat::Int4:
      return kernels::cpu::quantized_linear(x, packed.weight, packed.scale, packed.bias,
                                            int8_inputs_ == Int8Inputs::Quantized ? kernels::cpu::Int8Products::Auto
                                                                                  : kernels::cpu::Int8Products::Float);
    case WeightFormat::DynamicInt8:
      break;
  }
  if (packed.dynamic.size() == 1) return kernels::cpu::dynamic_int8_linear(x, *packed.dynamic[0]);
  std::vector<at::Tensor> parts;
  parts.reserve(packed.dynamic.size());
  for (const auto& layer : packed.dynamic) parts.push_back(kernels::cpu::dynamic_int8_linear(x, *layer));
  return at::cat(parts, -1);
}

std::shared_ptr<const PackedLinear::Packed> PackedLinear::copy_of(at::ArrayRef<at::Tensor> weights,
                                                                  at::ArrayRef<at::Tensor> biases) {
  auto fresh = std::make_shared<Packed>();
  fresh->in = weights[0].size(1);
  std::vector<at::Tensor> parts_w, parts_b;
  bool any_bias = false;
  const bool dynamic = format_ == WeightFormat::DynamicInt8;  // each layer packed apart, nothing joined
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& b = bias_at(biases, i);
    fresh->weights.emplace_back(weights[i]);
    fresh->biases.emplace_back(b);
    fresh->rows.push_back(weights[i].size(0));
    if (dynamic) {
      fresh->dynamic.push_back(kernels::cpu::dynamic_int8_pack(weights[i], b));
      fresh->bytes += kernels::cpu::dynamic_int8_bytes(*fresh->dynamic.back());
      continue;
    }
    parts_w.push_back(weights[i]);
    parts_b.push_back(b.defined() ? b : at::zeros({weights[i].size(0)}, weights[i].options()));
    any_bias = any_bias || b.defined();
  }
  if (dynamic) return fresh;
  const at::Tensor dense = parts_w.size() == 1 ? parts_w[0] : at::cat(parts_w, 0);
  fresh->bias = any_bias ? (parts_b.size() == 1 ? parts_b[0].clone() : at::cat(parts_b, 0)) : at::Tensor();
  const int64_t bias_bytes = any_bias ? fresh->bias.numel() * static_cast<int64_t>(sizeof(float)) : 0;
  switch (format_) {
    case WeightFormat::Float32:
      fresh->weight = kernels::cpu::onednn_pack_weight(dense);
      fresh->bytes = dense.numel() * static_cast<int64_t>(sizeof(float)) + bias_bytes;
      break;
    case WeightFormat::BFloat16:
      fresh->weight = dense.to(at::kBFloat16).contiguous();
      fresh->bytes = dense.numel() * 2 + bias_bytes;
      break;
    case WeightFormat::Int8: {
      auto [q, scale] = kernels::cpu::quantize_int8_groups(dense);
      fresh->weight = std::move(q);
      fresh->scale = std::move(scale);
      fresh->bytes = dense.numel() + fresh->scale.numel() * static_cast<int64_t>(sizeof(float)) + bias_bytes;
      break;
    }
    case WeightFormat::Int4: {
      auto [q, scale] = kernels::cpu::quantize_int4_groups(dense);
      fresh->weight = std::move(q);
      fresh->scale = std::move(scale);
      fresh->bytes = fresh->weight.numel() + fresh->scale.numel() * 2 + bias_bytes;
      break;
    }
    case WeightFormat::DynamicInt8:
      break;  // packed in the loop above
  }
  return fresh;
}

bool PackedLinear::takes(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases) const {
  if (format_ == WeightFormat::Float32) return applies(x, weights, biases);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (frozen_) {
      return x.defined() && x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) == packed_->in &&
             !kernels::cpu::needs_grad(x);
    }
  }
  if (weights.empty() || (!biases.empty() && biases.size() != weights.size())) return false;
  if (format_ == WeightFormat::DynamicInt8 && !kernels::cpu::dynamic_int8_available()) return false;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].defined() || kernels::cpu::plain_linear_rows(x, weights[i], bias_at(biases, i)) < 1) return false;
  }
  return true;
}

void PackedLinear::freeze(at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases) {
  TORCH_CHECK(format_ != WeightFormat::Float32,
              "PackedLinear: freeze keeps a bfloat16, int8, int4 or dynamic-int8 copy as the weights, got format "
              "float32");
  TORCH_CHECK(!weights.empty(), "PackedLinear: freeze expected at least one weight, got none");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(),
              "PackedLinear: freeze expected no biases or one per weight (", weights.size(), "), got ", biases.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    TORCH_CHECK(w.defined() && w.is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 &&
                    w.size(1) == weights[0].size(1),
                "PackedLinear: freeze expected float32 CPU weights [out, in] of one in, got weight ", i, " ",
                w.defined() ? w.sizes() : at::IntArrayRef{}, " of ", w.defined() ? w.scalar_type() : at::kFloat, " on ",
                w.defined() ? w.device() : at::Device(at::kCPU));
    const at::Tensor& b = bias_at(biases, i);
    TORCH_CHECK(!b.defined() || (b.is_cpu() && b.scalar_type() == at::kFloat && b.dim() == 1 && b.size(0) == w.size(0)),
                "PackedLinear: freeze expected bias ", i, " float32 CPU [", w.size(0), "] or none, got ", b.sizes(),
                " of ", b.scalar_type());
  }
  std::vector<at::Tensor> plain_w, plain_b;
  for (size_t i = 0; i < weights.size(); ++i) {
    plain_w.push_back(weights[i].detach().contiguous());
    const at::Tensor& b = bias_at(biases, i);
    plain_b.push_back(b.defined() ? b.detach().contiguous() : at::Tensor());
  }
  auto copy = copy_of(plain_w, biases.empty() ? at::ArrayRef<at::Tensor>() : at::ArrayRef<at::Tensor>(plain_b));
  std::lock_guard<std::mutex> lock(mutex_);
  packed_ = std::move(copy);
  frozen_ = true;
}

void PackedLinear::freeze_from(at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> scales,
                               at::ArrayRef<at::Tensor> biases) {
  TORCH_CHECK(format_ == WeightFormat::BFloat16 || format_ == WeightFormat::Int8 || format_ == WeightFormat::Int4,
              "PackedLinear: freeze_from takes bfloat16, int8 or int4 weights, got format ", to_string(format_),
              format_ == WeightFormat::DynamicInt8 ? " (its weights are quantized from float32 by freeze, not loaded)"
                                                   : "");
  const bool int8 = format_ == WeightFormat::Int8;
  const bool int4 = format_ == WeightFormat::Int4;
  const bool scaled = int8 || int4;
  const at::ScalarType dtype = int8 ? at::kChar : int4 ? at::kByte : at::kBFloat16;
  TORCH_CHECK(!weights.empty(), "PackedLinear: freeze_from expected at least one weight, got none");
  TORCH_CHECK(scaled ? scales.size() == weights.size() : scales.empty(), "PackedLinear: freeze_from expected ",
              scaled ? "one scale tensor per weight (" + std::to_string(weights.size()) + ")" : "no scales (bfloat16)",
              ", got ", scales.size());
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "PackedLinear: freeze_from expected no biases or one ",
              "per weight (", weights.size(), "), got ", biases.size());
  auto fresh = std::make_shared<Packed>();
  // int4: two inputs a byte.
  const int64_t columns = weights[0].defined() && weights[0].dim() == 2 ? weights[0].size(1) : 0;
  fresh->in = int4 ? 2 * columns : columns;
  std::vector<at::Tensor> parts_w, parts_s, parts_b;
  bool any_bias = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    TORCH_CHECK(w.defined() && w.is_cpu() && w.scalar_type() == dtype && w.dim() == 2 &&
                    w.size(1) == weights[0].size(1),
                "PackedLinear: freeze_from expected weight ", i, " ",
                int4 ? "int4 (uint8, two a byte)" : to_string(format_), " CPU [out, ",
                weights[0].defined() && weights[0].dim() == 2 ? std::to_string(weights[0].size(1)) : "in", "], got ",
                w.defined() ? w.sizes() : at::IntArrayRef{}, " of ", w.defined() ? w.scalar_type() : at::kFloat);
    if (int4) {
      const at::Tensor& s = scales[i];
      const int64_t groups = 2 * w.size(1) / kernels::cpu::kInt4Group;
      TORCH_CHECK((2 * w.size(1)) % kernels::cpu::kInt4Group == 0 && s.defined() && s.is_cpu() &&
                      s.scalar_type() == at::kHalf && s.dim() == 3 && s.size(0) == w.size(0) && s.size(1) == groups &&
                      s.size(2) == 2,
                  "PackedLinear: freeze_from expected the scales of int4 weight ", i, " float16 CPU [", w.size(0), ", ",
                  groups, ", 2] (d and m per group of ", kernels::cpu::kInt4Group, " inputs; ", 2 * w.size(1),
                  " inputs, a multiple of ", kernels::cpu::kInt4Group, "), got ",
                  s.defined() ? s.sizes() : at::IntArrayRef{}, " of ", s.defined() ? s.scalar_type() : at::kFloat);
      const int64_t bad = kernels::cpu::first_non_finite_int4_scale(s);
      TORCH_CHECK(bad < 0, "PackedLinear: freeze_from expected finite int4 scales (d, m) of weight ", i,
                  ", got an infinity or NaN at row ", bad / std::max<int64_t>(groups, 1), ", group ",
                  bad % std::max<int64_t>(groups, 1));
      parts_s.push_back(s.contiguous());
    }
    if (int8) {
      const at::Tensor& s = scales[i];
      const int64_t groups = kernels::cpu::int8_groups(w.size(1));
      TORCH_CHECK(s.defined() && s.is_cpu() && s.scalar_type() == at::kFloat && s.dim() == 2 &&
                      s.size(0) == w.size(0) && s.size(1) == groups,
                  "PackedLinear: freeze_from expected the scales of weight ", i, " float32 CPU [", w.size(0), ", ",
                  groups, "] (one per group of ", kernels::cpu::kInt8Group, " inputs), got ",
                  s.defined() ? s.sizes() : at::IntArrayRef{}, " of ", s.defined() ? s.scalar_type() : at::kFloat);
      const int64_t bad = kernels::cpu::first_unproducible_scale(w, s);
      TORCH_CHECK(bad < 0, "PackedLinear: freeze_from expected the scales of weight ", i,
                  " as int8 quantization makes them (", kernels::cpu::kProducibleScales, "), got ",
                  bad < 0 ? 0.0f : s.reshape(-1)[bad].item<float>(), " at row ", bad / groups, ", group ",
                  bad % groups);
      parts_s.push_back(s.contiguous());
    }
    const at::Tensor& b = bias_at(biases, i);
    TORCH_CHECK(!b.defined() || (b.is_cpu() && b.scalar_type() == at::kFloat && b.dim() == 1 && b.size(0) == w.size(0)),
                "PackedLinear: freeze_from expected bias ", i, " float32 CPU [", w.size(0), "] or none, got ",
                b.sizes(), " of ", b.scalar_type());
    fresh->weights.emplace_back(w);
    fresh->biases.emplace_back(b);
    fresh->rows.push_back(w.size(0));
    parts_w.push_back(w.contiguous());
    parts_b.push_back(b.defined() ? b.detach() : at::zeros({w.size(0)}, at::kFloat));
    any_bias = any_bias || b.defined();
  }
  // One weight is kept as it comes (a view of a mapped checkpoint stays one: nothing
  // copied at load); several are joined into one product.
  fresh->weight = parts_w.size() == 1 ? parts_w[0] : at::cat(parts_w, 0);
  if (scaled) fresh->scale = parts_s.size() == 1 ? parts_s[0] : at::cat(parts_s, 0);
  fresh->bias = any_bias ? (parts_b.size() == 1 ? parts_b[0].clone() : at::cat(parts_b, 0)) : at::Tensor();
  fresh->bytes = fresh->weight.numel() * static_cast<int64_t>(fresh->weight.element_size()) +
                 (scaled ? fresh->scale.numel() * static_cast<int64_t>(fresh->scale.element_size()) : 0) +
                 (any_bias ? fresh->bias.numel() * static_cast<int64_t>(sizeof(float)) : 0);
  std::lock_guard<std::mutex> lock(mutex_);
  packed_ = std::move(fresh);
  frozen_ = true;
}

size_t PackedLinear::frozen_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return frozen_ ? packed_->rows.size() : 0;
}

std::pair<at::Tensor, at::Tensor> PackedLinear::frozen_weight(size_t i) const {
  std::shared_ptr<const Packed> packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(frozen_, "PackedLinear: frozen_weight needs a frozen copy (freeze first)");
    packed = packed_;
  }
  TORCH_CHECK(i < packed->rows.size(), "PackedLinear: frozen_weight(", i, "): the copy holds ", packed->rows.size(),
              " weights");
  TORCH_CHECK(format_ != WeightFormat::DynamicInt8, "PackedLinear: frozen_weight: a dynamic-int8 copy is the ",
              "quantized engine's packed form, not kept as tensors (save bfloat16 or int8 weights instead)");
  int64_t first = 0;
  for (size_t j = 0; j < i; ++j) first += packed->rows[j];
  const int64_t n = packed->rows[i];
  return {packed->weight.narrow(0, first, n),
          packed->scale.defined() ? packed->scale.narrow(0, first, n) : at::Tensor()};
}

bool PackedLinear::frozen() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return frozen_;
}

void PackedLinear::release(const at::Tensor& weight) {
  TORCH_CHECK(weight.defined(), "PackedLinear: release expected a defined tensor");
  // (A weight used in place from a checkpoint's memory map gives its pages back when
  // its storage goes: serialize/safetensors.cpp.)
  c10::AutoGradMode no_grad(false);
  // In place on the TensorImpl: every handle of it (the module's parameter) sees it.
  const at::Tensor zero = at::zeros({1}, weight.options());
  const std::vector<int64_t> sizes = weight.sizes().vec();
  weight.set_(zero.storage(), 0, sizes, std::vector<int64_t>(sizes.size(), 0));
  weight.requires_grad_(false);
}

at::Tensor PackedLinear::weight_rows(const at::Tensor& ids) const {
  std::shared_ptr<const Packed> packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    packed = packed_;
  }
  TORCH_CHECK(packed &&
                  (format_ == WeightFormat::BFloat16 || format_ == WeightFormat::Int8 || format_ == WeightFormat::Int4),
              "PackedLinear: weight_rows reads a bfloat16, int8 or int4 copy, got ",
              !packed ? std::string("no copy yet (freeze or forward first)")
                      : "a " + std::string(to_string(format_)) + " copy (the quantized engine's own form)");
  return kernels::cpu::dequantized_rows(packed->weight, packed->scale, ids);
}

void PackedLinear::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (frozen_) return;  // the copy is the weights now
  packed_.reset();
}

int64_t PackedLinear::packed_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return packed_ ? packed_->bytes : 0;
}

}  // namespace torchattn
