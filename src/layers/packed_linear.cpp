#include <torchattn/packed_linear.h>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/onednn_linear.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

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
  at::Tensor weight;  // oneDNN's blocked layout, [sum out_i, in]
  at::Tensor bias;    // [sum out_i] or undefined
  int64_t bytes = 0;

  bool same(at::ArrayRef<at::Tensor> w, at::ArrayRef<at::Tensor> b) const {
    if (w.size() != weights.size()) return false;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!weights[i].same(w[i]) || !biases[i].same(bias_at(b, i))) return false;
    }
    return true;
  }
};

PackedLinear::PackedLinear() = default;
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
  TORCH_CHECK(!weights.empty(), "PackedLinear: expected at least one weight, got none");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "PackedLinear: expected no biases or one per weight (",
              weights.size(), "), got ", biases.size());
  TORCH_CHECK(applies(x, weights, biases),
              "PackedLinear: expected float32 CPU x [..., in] and dense float32 CPU "
              "weights [out, in] (biases [out]) with no gradient to compute, on a LibTorch with oneDNN; got x ",
              x.sizes(), " of ", x.scalar_type(), " on ", x.device(), " and a first weight ", weights[0].sizes(),
              " of ", weights[0].scalar_type(), " on ", weights[0].device());
  std::shared_ptr<const Packed> packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!packed_ || !packed_->same(weights, biases)) {
      auto fresh = std::make_shared<Packed>();
      std::vector<at::Tensor> parts_w, parts_b;
      bool any_bias = false;
      for (size_t i = 0; i < weights.size(); ++i) {
        const at::Tensor& b = bias_at(biases, i);
        fresh->weights.emplace_back(weights[i]);
        fresh->biases.emplace_back(b);
        parts_w.push_back(weights[i]);
        parts_b.push_back(b.defined() ? b : at::zeros({weights[i].size(0)}, weights[i].options()));
        any_bias = any_bias || b.defined();
      }
      const at::Tensor dense = parts_w.size() == 1 ? parts_w[0] : at::cat(parts_w, 0);
      fresh->weight = kernels::cpu::onednn_pack_weight(dense);
      fresh->bias = any_bias ? (parts_b.size() == 1 ? parts_b[0].clone() : at::cat(parts_b, 0)) : at::Tensor();
      fresh->bytes = dense.numel() * static_cast<int64_t>(sizeof(float)) +
                     (any_bias ? fresh->bias.numel() * static_cast<int64_t>(sizeof(float)) : 0);
      packed_ = std::move(fresh);
    }
    packed = packed_;
  }
  return kernels::cpu::onednn_linear_packed(x, packed->weight, packed->bias);
}

void PackedLinear::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  packed_.reset();
}

int64_t PackedLinear::packed_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return packed_ ? packed_->bytes : 0;
}

}  // namespace torchattn
