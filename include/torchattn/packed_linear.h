#pragma once

#include <torchattn/safetensors.h>
#include <torchattn/weight_format.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

/// Linear layers for CPU inference on a oneDNN-packed copy of their weights: x W^T + b,
/// one or more layers that read the same x side by side in one product. When it pays:
/// docs/modules.md (packed weights). Each torchattn::Linear (linear.h) holds one for its
/// own weight; use this class directly for a product of several layers.
///
///   torchattn::PackedLinear qkv;
///   if (torchattn::PackedLinear::applies(x, {Wq->weight, Wk->weight, Wv->weight})) {
///     at::Tensor y = qkv.forward(x, {Wq->weight, Wk->weight, Wv->weight},
///                                {Wq->bias, Wk->bias, Wv->bias});  // [..., out_q + out_k + out_v]
///   }
///
/// Equal to at::linear within float32 rounding, not bit for bit; a row gives the same
/// bits alone or in any batch. The packed copy (the weights' memory once more) is made
/// again when a weight or bias is another tensor or was written in place (its version
/// counter); a write to an inference tensor is not seen: call clear() after one.
/// Thread-safe: one PackedLinear may serve concurrent forwards.
///
/// With a WeightFormat other than Float32 the copy is bfloat16 or int8 (see
/// weight_format.h; kernels/cpu/quantized_linear.h): x and y stay float32, and a row's
/// sums depend on how many rows share its call (16 or fewer: a matrix-vector kernel;
/// more: a GEMM on widened tiles), except with Int8Inputs::Quantized on an x86 CPU with
/// AVX2 or AVX-512 VNNI: int8 products of x quantized per group of 64, each row's own. Such a copy may stand alone
/// (freeze): a model that keeps only its 8-bit weights frees the float32 ones. With
/// DynamicInt8 each layer is LibTorch's quantized engine's own (PyTorch's quantize_dynamic:
/// kernels/cpu/dynamic_int8_linear.h), run apart and its outputs side by side.
class PackedLinear {
 public:
  /// int8_inputs: what Int8 weights multiply (see Int8Inputs); the other formats
  /// ignore it.
  explicit PackedLinear(WeightFormat format = WeightFormat::Float32, Int8Inputs int8_inputs = Int8Inputs::Float);
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

  /// Drops the packed copy; the next forward makes it again. Not once frozen.
  void clear();

  WeightFormat format() const { return format_; }
  Int8Inputs int8_inputs() const { return int8_inputs_; }

  /// Whether forward computes for these operands: applies() for Float32; for the
  /// other formats the same without oneDNN, and once frozen only x (float32 CPU
  /// [..., in], no gradient) counts.
  bool takes(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases = {}) const;

  /// Makes the copy of weights (and biases) now, as forward would, and keeps it as the
  /// layers' weights from then on: forward ignores the tensors it is given, so the
  /// caller may free them. Not Float32 (its copy is oneDNN's own layout, not a store
  /// of the weights). Only inference: a forward with a gradient to
  /// compute is an error.
  void freeze(at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases = {});
  bool frozen() const;

  /// The same from weights already in format(), as frozen_weight gives them (a saved
  /// frozen model; BFloat16 and Int8, whose copies are tensors): weights [out_i, in] bfloat16 or int8; for Int8
  /// `scales` one per weight, float32 [out_i, groups of 64 inputs], finite and >= 0 (BFloat16: none). Anything else is
  /// an error naming the weight and what it expected. One weight (and its scales) is kept
  /// as it comes, not copied (a mapped checkpoint's tensors stay views of the file);
  /// several are joined into one tensor.
  void freeze_from(at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> scales,
                   at::ArrayRef<at::Tensor> biases = {});
  /// How many weights the frozen copy holds (0 before freeze).
  size_t frozen_count() const;
  /// Weight i of the frozen copy (freeze's order) as it is kept: [out_i, in] in
  /// format(), and for Int8 its scales (float32 [out_i, groups]; else undefined).
  std::pair<at::Tensor, at::Tensor> frozen_weight(size_t i) const;

  /// Frees the memory of a weight that a frozen copy replaces, keeping its shape,
  /// dtype and device: `weight` (and every tensor sharing it, such as a module's
  /// parameter) becomes a stride-0 [out, in] view of a single 0 that needs no gradient.
  static void release(const at::Tensor& weight);

  /// The rows `ids` (int64 [...]) of the (frozen or not) bfloat16/int8 copy's weight,
  /// widened to float32 [..., in] and scaled: a tied embedding table's lookup.
  at::Tensor weight_rows(const at::Tensor& ids) const;

  /// Bytes of the packed copy (weights and biases), 0 before the first forward.
  int64_t packed_bytes() const;

 private:
  struct Packed;
  std::shared_ptr<const Packed> copy_of(at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases);
  at::Tensor run(const Packed& packed, const at::Tensor& x) const;

  WeightFormat format_;
  Int8Inputs int8_inputs_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Packed> packed_;
  bool frozen_ = false;
};

/// Frozen weights by name, as a saved frozen model holds them: a weight named N as N
/// (bfloat16, or int8 [out, in]) and, for int8, N + kFrozenScaleSuffix (float32 [out,
/// groups of kInt8GroupSize inputs]). MultiHeadAttention and models::CausalLM save and
/// load their frozen copies (frozen_state, freeze_weights from tensors) through these.
inline constexpr const char* kFrozenScaleSuffix = "_scale";

/// Appends pack's frozen weights to `out` as prefix + names[i] (and their scales);
/// names: one per weight the pack froze, in freeze's order.
void append_frozen_weights(NamedTensors& out, const std::string& prefix, const std::vector<std::string>& names,
                           const PackedLinear& pack);

/// Checks, freezing nothing, that `weights` holds prefix + names[i] in `format`
/// (bfloat16 or int8) with like[i]'s shape (the float32 weight it stands for), and for
/// int8 its scales (float32 [out, groups], finite, >= 0). An error starts with `what`
/// and names the tensor and what it expected.
void check_frozen_weights(WeightFormat format, const std::map<std::string, at::Tensor>& weights,
                          const std::string& prefix, const std::vector<std::string>& names,
                          const std::vector<at::Tensor>& like, const char* what);

/// check_frozen_weights, then pack.freeze_from those tensors with `biases`.
void freeze_from_weights(PackedLinear& pack, const std::map<std::string, at::Tensor>& weights,
                         const std::string& prefix, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& like, const std::vector<at::Tensor>& biases, const char* what);

/// When a layer's products take its PackedLinear: packing on, and at least `min_rows`
/// rows (batch times tokens) in the input. Used alike by the attention modules, the
/// models' decoder layers and their output head.
struct PackPolicy {
  bool on = false;
  int64_t min_rows = 1;

  /// The rows of x [..., in]: x.numel() / in, 0 when in is 0.
  static int64_t rows(const at::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }
  /// Whether x [..., in] takes the packed product (PackedLinear::applies decides the rest).
  bool takes(const at::Tensor& x) const { return on && rows(x) >= min_rows; }
  /// Whether x goes through `packed` (null: no): always once it is frozen (its forward
  /// refuses what it cannot compute), else where this policy takes x and the operands
  /// suit it (PackedLinear::takes).
  bool routes(const PackedLinear* packed, const at::Tensor& x, at::ArrayRef<at::Tensor> weights,
              at::ArrayRef<at::Tensor> biases = {}) const {
    return packed != nullptr && (packed->frozen() || (takes(x) && packed->takes(x, weights, biases)));
  }
};

}  // namespace torchattn
