#pragma once

// A linear layer that owns its weights in every format: float32 parameters to train,
// and for CPU inference a packed float32 copy, or bfloat16, int8 or dynamic-int8
// weights that it quantizes itself (freeze) or binds from a checkpoint as they are
// (bind); it chooses the kernel of each call. See docs/modules.md (weight formats).

#include <torchattn/packed_linear.h>
#include <torchattn/weight_format.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace torchattn {

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  /// A bias [out_features] (parameter `bias`), or none.
  TORCH_ARG(bool, bias) = true;
  /// true: LibTorch's nn::Linear initialisation, draw for draw (kaiming_uniform_ with
  /// a = sqrt(5), then the bias uniform in +-1/sqrt(in_features)). false: built for
  /// loading: no random number is drawn and no memory is allocated; `weight` and `bias`
  /// are placeholders of their shapes (a single element seen at every index) for a
  /// checkpoint to replace (models::load_weights, torch::load) or for bind(). A forward
  /// before that is an error.
  TORCH_ARG(bool, init) = true;
};

/// How a linear layer's CPU inference keeps and multiplies its weights (set_inference):
/// which calls go through an inference copy of the weights (`pack`; default: none), the
/// copy's format, and what int8 weights multiply. An attention module's projections take
/// one (MultiHeadAttentionOptions::projections).
///
///   torchattn::LinearInference{.pack = {.on = true}, .format = torchattn::WeightFormat::Int8}
struct LinearInference {
  PackPolicy pack;
  /// The inference copy's format (see WeightFormat): bfloat16 or int8 read 2 or 1
  /// bytes a weight, for their rounding (docs/models.md). Only CPU inference takes the
  /// copy: with a gradient to compute, or on another device, the float32 weights run
  /// (and train) as without it. Default: Float32 (oneDNN's packed layout).
  WeightFormat format = WeightFormat::Float32;
  /// With format Int8: what the weights multiply (see Int8Inputs). Default: Float.
  Int8Inputs int8_inputs = Int8Inputs::Float;
};

/// y = x W^T + b with parameters `weight` [out_features, in_features] and `bias`
/// [out_features] (an undefined tensor without one): the names, shapes and draws of
/// LibTorch's nn::Linear and the numbers of PyTorch's nn.Linear (at::linear: one addmm
/// for a contiguous input with a bias, where LibTorch's nn::Linear adds the bias
/// apart), so that checkpoints, the notebooks' weights and their outputs carry over. For CPU inference the layer also
/// holds its weights in a WeightFormat (a PackedLinear of its own):
///
///   torchattn::Linear proj(torchattn::LinearOptions(768, 768));
///   proj->set_inference({.on = true, .min_rows = 1}, torchattn::WeightFormat::Int8);
///   auto y = proj(x);          // float32 CPU x without a gradient: int8 weights
///   proj->freeze(torchattn::WeightFormat::Int8);   // keep only those: inference only
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features) : LinearImpl(LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const LinearOptions& options);

  /// Registers `weight` and `bias` anew (init(): drawn as reset_parameters draws them).
  /// The inference copy and any kept format go.
  void reset() override;
  /// Draws the weights again, as nn::Linear::reset_parameters does.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x [..., in_features] -> [..., out_features]:
  /// - frozen (freeze, bind): through the kept weights (no gradient may flow);
  /// - where pack_policy() takes x and the inference copy applies (float32 CPU x, no
  ///   gradient to compute): through that copy, within its format's rounding;
  /// - else at::linear: PyTorch's nn.Linear, bit for bit, in any grad mode.
  at::Tensor forward(const at::Tensor& x);
  /// The same, except that the last case is functional::linear: without a gradient to
  /// compute, the fastest float32 kernel that applies (a few rows on every thread,
  /// oneDNN for more), equal to at::linear within float32 rounding. Decoding takes it.
  at::Tensor forward_fast(const at::Tensor& x);

  /// How inference treats the float32 layer: `pack` picks the calls that go through an
  /// inference copy of the weights in `format` (Float32: oneDNN's packed layout;
  /// BFloat16, Int8 with `int8_inputs`, DynamicInt8: see weight_format.h), made at the
  /// first such call and again after the weights change. pack.on false: no copy (one
  /// made before goes). Once frozen the kept format stays: a different `format` is an
  /// error naming both.
  void set_inference(const PackPolicy& pack, WeightFormat format = WeightFormat::Float32,
                     Int8Inputs int8_inputs = Int8Inputs::Float);
  void set_inference(const LinearInference& inference) {
    set_inference(inference.pack, inference.format, inference.int8_inputs);
  }
  const PackPolicy& pack_policy() const { return pack_; }
  /// The format of the inference copy or of the kept weights.
  WeightFormat weight_format() const { return engine_->format(); }
  Int8Inputs int8_inputs() const { return engine_->int8_inputs(); }

  /// Keeps only the weights in `format` (bfloat16, int8 or dynamic-int8), quantized from
  /// the float32 weight, whose memory is then freed (its parameter a placeholder of its
  /// shape that needs no gradient). Afterwards the layer only infers: forward with a
  /// gradient to compute is an error. Needs float32 CPU weights.
  void freeze(WeightFormat format, Int8Inputs int8_inputs = Int8Inputs::Float);
  /// The same from weights already in `format`: bfloat16 data [out, in], or int8 data
  /// [out, in] with `scale` float32 [out, groups of 64 inputs], finite and >= 0. Kept
  /// as they are, not copied (views of a mapped checkpoint stay views); the float32
  /// weight is a placeholder afterwards. Anything else is an error naming `name` and
  /// what it expected, and leaves the layer as it was.
  void bind(WeightFormat format, const at::Tensor& data, const at::Tensor& scale,
            Int8Inputs int8_inputs = Int8Inputs::Float, const std::string& name = "weight");
  bool frozen() const { return engine_->frozen(); }
  /// The kept weights (frozen, bfloat16 or int8): data [out, in] and, for int8, scale
  /// [out, groups]; as bind takes them.
  std::pair<at::Tensor, at::Tensor> frozen_weight() const;
  /// The rows `ids` (int64 [...]) of the kept bfloat16/int8 weights widened to float32
  /// [..., in]: a tied embedding table's lookup.
  at::Tensor weight_rows(const at::Tensor& ids) const;
  /// Bytes of the inference copy or of the kept weights (0 without).
  int64_t format_bytes() const { return engine_->packed_bytes(); }

  LinearOptions options;
  at::Tensor weight;
  at::Tensor bias;

 private:
  friend std::vector<at::Tensor> linear_group(const at::Tensor& x, std::initializer_list<LinearImpl*> layers,
                                              bool fast);
  at::Tensor run(const at::Tensor& x, bool fast);
  void check_weights(const char* fn) const;

  std::shared_ptr<PackedLinear> engine_;
  PackPolicy pack_;
};
TORCH_MODULE(Linear);

/// x [..., in] through several layers that read it (an attention's q, k and v; an MLP's
/// gate and up) -> their outputs [..., out_i] in order, each as that layer's forward
/// (fast: forward_fast) gives it, bit for bit. Layers frozen to one bfloat16 or int8
/// format (and Int8Inputs) run as one product: x quantized once, and in decoding one
/// parallel region over all their outputs; their outputs are then views of it.
/// Off the CPU, `fast` layers whose weights (and biases) place_together laid out end
/// to end run as one at::linear over them when no gradient is computed: one GEMM
/// instead of one per layer, equal to each layer's within its dtype's rounding (the
/// BLAS picks its kernel by the product's shape).
std::vector<at::Tensor> linear_group(const at::Tensor& x, std::initializer_list<LinearImpl*> layers, bool fast);

/// Moves the layers' weights into one storage, end to end in the order given, and their
/// biases into another: the parameters keep their values, shapes, dtype, device and
/// identity (set_data), so optimizers, checkpoints and hooks see no change; only their
/// memory is shared. Then linear_group computes them as one product on a GPU. Nothing is
/// copied where they are already so. The layers need the same in_features, dtype and
/// device, all or none with a bias, and weights of their own (not frozen, loaded);
/// else an error naming what differs. A later move (to()) gives each its own storage
/// again. The old storages go: place before capturing a CUDA graph that reads them,
/// and not while another thread runs the layers.
void place_together(std::initializer_list<LinearImpl*> layers);

/// Whether place_together's layout holds: the weights (and biases) of `layers`
/// contiguous, in one storage, end to end in order.
bool placed_together(std::initializer_list<const LinearImpl*> layers);

/// A float32 CPU tensor of `sizes` that holds no weights of its own: one element (0)
/// seen at every index (strides 0). What a layer built for loading starts with.
at::Tensor placeholder(at::IntArrayRef sizes);

/// Whether `t` is a placeholder that holds no weights of its own (a Linear built with
/// init(false) before loading, or a weight freed by freeze or bind): a tensor of one
/// or more elements whose strides are all 0.
bool is_placeholder(const at::Tensor& t);

}  // namespace torchattn
