#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace torchattn {

/// Linear layers for CPU inference with their weights packed once: x W^T + b through
/// oneDNN with the weights copied into its blocked layout at the first call, and one or
/// more layers that read the same x side by side in one product (a fused projection).
///
///   torchattn::PackedLinear qkv;
///   if (torchattn::PackedLinear::applies(x, {Wq->weight, Wk->weight, Wv->weight})) {
///     at::Tensor y = qkv.forward(x, {Wq->weight, Wk->weight, Wv->weight},
///                                {Wq->bias, Wk->bias, Wv->bias});  // [..., out_q + out_k + out_v]
///   }
///
/// Faster than at::linear for the products of inference (tens to hundreds of rows:
/// an encoder's sentence, a prefill chunk, a batch of decoding steps), and each row's
/// sums run in the same order whatever the number of rows, so a row gives the same
/// bits alone or in a batch. Against at::linear: equal within float32 rounding, not
/// bit for bit.
///
/// The packed copy costs the weights' memory once more. It is made again when a
/// weight or bias is another tensor or has been written in place since (its version
/// counter), so loading new weights or an optimizer step is seen; a write to an
/// inference tensor (made under InferenceMode) is not: call clear() after one.
/// Thread-safe: one PackedLinear may serve concurrent forwards.
class PackedLinear {
 public:
  PackedLinear();
  ~PackedLinear();
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;

  /// Whether forward computes for these operands: a LibTorch with oneDNN (its x86
  /// builds); x a float32 CPU [..., in] with at least one row; weights one or more
  /// dense float32 CPU [out_i, in]; biases none, or one per weight ([out_i] float32
  /// dense, or undefined); and no gradient to compute through any of them (grad mode
  /// with requires_grad, or a forward-mode tangent). Otherwise use at::linear.
  static bool applies(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases = {});

  /// x: [..., in] -> [..., sum of out_i], the layers' outputs side by side in the
  /// order of `weights`. Requires applies(x, weights, biases); an error names what differs.
  at::Tensor forward(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases = {});

  /// Drops the packed copy; the next forward makes it again.
  void clear();

  /// Bytes of the packed copy (weights and biases), 0 before the first forward.
  int64_t packed_bytes() const;

 private:
  struct Packed;
  mutable std::mutex mutex_;
  std::shared_ptr<const Packed> packed_;
};

}  // namespace torchattn
